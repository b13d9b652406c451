//! Dequantization checked against the `gguf` Python package (`gguf.quants.dequantize`).
//!
//! The fixtures in `tests/fixtures/quant/` are written by `scripts/gen-quant-fixtures`:
//! `<type>.bin` holds raw GGUF blocks, `<type>.f32` the oracle's values as little-endian f32.
//! They are compiled in with `include_bytes!`, so the same tests run natively and in a browser.
//!
//! The comparison is bit-exact: both sides do the same f32 operations in the same order. The one
//! allowance is NaN: any NaN matches any NaN, because converting an f16 signalling NaN may set
//! the quiet bit or not (numpy keeps the payload as is; the F16C instruction, which `half` uses
//! when the CPU has it, quiets it). Only the exhaustive F16 fixture contains such NaNs.

use super::{dequantize, dequantize_row, dequantize_to_vec, SUPPORTED};
use crate::gguf::GgmlType;

macro_rules! fixture {
    ($ty:ident, $stem:literal) => {
        Fixture {
            ty: GgmlType::$ty,
            blocks: include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/quant/",
                $stem,
                ".bin"
            )),
            expected: include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/quant/",
                $stem,
                ".f32"
            )),
        }
    };
}

struct Fixture {
    ty: GgmlType,
    blocks: &'static [u8],
    /// Little-endian f32 values; not reinterpreted in place since `include_bytes!` is 1-aligned.
    expected: &'static [u8],
}

const FIXTURES: [Fixture; 11] = [
    fixture!(F32, "f32"),
    fixture!(F16, "f16"),
    fixture!(BF16, "bf16"),
    fixture!(Q8_0, "q8_0"),
    fixture!(Q4_0, "q4_0"),
    fixture!(Q4_1, "q4_1"),
    fixture!(Q5_0, "q5_0"),
    fixture!(Q5_1, "q5_1"),
    fixture!(Q4K, "q4_k"),
    fixture!(Q5K, "q5_k"),
    fixture!(Q6K, "q6_k"),
];

impl Fixture {
    fn expected(&self) -> Vec<f32> {
        self.expected
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// The first mismatches (index, got, expected) of `got` against `want`, at most 5.
fn mismatches(got: &[f32], want: &[f32]) -> Vec<(usize, f32, f32)> {
    let bad = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| !same(**g, **w));
    bad.map(|(i, (g, w))| (i, *g, *w)).take(5).collect()
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn every_supported_type_has_a_fixture() {
    for ty in SUPPORTED {
        assert!(FIXTURES.iter().any(|f| f.ty == ty), "no fixture for {ty}");
    }
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn fixtures_match_gguf_python_bit_exact() {
    for f in &FIXTURES {
        let want = f.expected();
        let got = dequantize_to_vec(f.ty, f.blocks).unwrap();
        assert_eq!(got.len(), want.len(), "{}: value count", f.ty);
        let bad = mismatches(&got, &want);
        assert!(bad.is_empty(), "{}: (index, got, expected) {bad:?}", f.ty);
    }
}

/// The fixtures again, starting at an odd byte offset: GGUF tensors need not be aligned.
#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn fixtures_match_at_odd_byte_offset() {
    for f in &FIXTURES {
        let mut shifted = vec![0xAAu8; f.blocks.len() + 1];
        shifted[1..].copy_from_slice(f.blocks);
        let want = f.expected();
        let mut got = vec![0.0; want.len()];
        dequantize(f.ty, &shifted[1..], &mut got).unwrap();
        let bad = mismatches(&got, &want);
        assert!(bad.is_empty(), "{} at offset 1: {bad:?}", f.ty);
    }
}

/// Rows of 2 blocks each, taken one at a time, give the same values as the whole tensor.
#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn fixtures_match_row_by_row() {
    for f in &FIXTURES {
        let row_len = 2 * f.ty.block_elems() as usize;
        let want = f.expected();
        let mut row = vec![0.0; row_len];
        for (r, want_row) in want.chunks_exact(row_len).enumerate() {
            dequantize_row(f.ty, f.blocks, row_len, r, &mut row).unwrap();
            let bad = mismatches(&row, want_row);
            assert!(bad.is_empty(), "{} row {r}: {bad:?}", f.ty);
        }
    }
}
