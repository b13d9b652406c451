//! Hand-built blocks with known values, the block layouts against `GgmlType`, and the errors.
//!
//! The quant tests encode values with a small packer written from the layout comments, so they
//! check our reading of the format independently of the oracle fixtures (`fixture_tests`).

use super::*;
use bytemuck::bytes_of;

fn f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits().to_le()
}

fn dq<B: QuantBlock>(block: &B) -> Vec<f32> {
    dequantize_to_vec(B::TYPE, bytes_of(block)).unwrap()
}

macro_rules! wasm_or_native_test {
    ($($(#[$m:meta])* fn $name:ident() $body:block)*) => {$(
        $(#[$m])*
        #[cfg_attr(not(target_arch = "wasm32"), test)]
        #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
        fn $name() $body
    )*};
}

/// Size and values per block of each struct, against the type table in `gguf`.
fn check_geometry<B: QuantBlock>() {
    let (elems, bytes) = B::TYPE.block_geometry();
    assert_eq!(size_of::<B>() as u64, bytes, "{} block size", B::TYPE);
    assert_eq!(B::ELEMS as u64, elems, "{} values per block", B::TYPE);
}

/// Packs 8 six-bit scales and mins the way `scale_min_k4` unpacks them.
fn pack_scale_min_k4(sc: [u8; 8], m: [u8; 8]) -> [u8; K_SCALE_SIZE] {
    let mut out = [0u8; K_SCALE_SIZE];
    for j in 0..4 {
        out[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        out[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        out[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
    }
    out
}

wasm_or_native_test! {
    fn block_structs_match_the_type_table() {
        check_geometry::<BlockF32>();
        check_geometry::<BlockF16>();
        check_geometry::<BlockBF16>();
        check_geometry::<BlockQ8_0>();
        check_geometry::<BlockQ4_0>();
        check_geometry::<BlockQ4_1>();
        check_geometry::<BlockQ5_0>();
        check_geometry::<BlockQ5_1>();
        check_geometry::<BlockQ4K>();
        check_geometry::<BlockQ5K>();
        check_geometry::<BlockQ6K>();
        for ty in SUPPORTED {
            assert!(ty.gpu_supported(), "{ty}: SUPPORTED must equal the GPU's set");
        }
    }

    fn fields_sit_at_their_gguf_offsets() {
        // Q6_K keeps its scale last, at byte 208; Q5_1's qh follows d and m at byte 4.
        let mut raw = [0u8; 210];
        raw[208..210].copy_from_slice(&f16(1.0).to_le_bytes());
        raw[192] = 0xFF;
        let b: BlockQ6K = bytemuck::pod_read_unaligned(&raw);
        assert_eq!((u16::from_le(b.d), b.scales[0]), (0x3C00, -1));
        let mut raw = [0u8; 24];
        raw[4] = 0x5A;
        raw[8] = 0xA5;
        let b: BlockQ5_1 = bytemuck::pod_read_unaligned(&raw);
        assert_eq!((b.qh[0], b.qs[0]), (0x5A, 0xA5));
    }

    fn q8_0_scale_half() {
        let mut qs = [0i8; 32];
        for (i, q) in qs.iter_mut().enumerate() {
            *q = (i as i8 - 16) * 8; // -128 ..= 120
        }
        let out = dq(&BlockQ8_0 { d: f16(0.5), qs });
        for (i, &v) in out.iter().enumerate() {
            assert_eq!(v, qs[i] as f32 * 0.5, "value {i}");
        }
        assert_eq!((out[0], out[31]), (-64.0, 60.0));
    }

    fn q4_0_halves_not_interleaved() {
        // Byte j: low nibble = value j, high nibble = value j + 16.
        let qs: [u8; 16] = std::array::from_fn(|j| j as u8 | ((15 - j as u8) << 4));
        let out = dq(&BlockQ4_0 { d: f16(2.0), qs });
        for j in 0..16 {
            assert_eq!(out[j], 2.0 * (j as f32 - 8.0));
            assert_eq!(out[j + 16], 2.0 * (7.0 - j as f32));
        }
    }

    fn q4_1_scale_and_offset() {
        let qs = [0xF0u8; 16]; // values 0..16 are 0, values 16..32 are 15
        let out = dq(&BlockQ4_1 { d: f16(0.25), m: f16(-1.0), qs });
        assert!(out[..16].iter().all(|&v| v == -1.0));
        assert!(out[16..].iter().all(|&v| v == 0.25 * 15.0 - 1.0));
    }

    fn q5_0_high_bits_from_qh() {
        // 5th bit of value i = bit i of the LE u32 qh: set for values 0, 17 and 31.
        let qh = ((1u32 << 0) | (1 << 17) | (1 << 31)).to_le_bytes();
        let out = dq(&BlockQ5_0 { d: f16(1.0), qh, qs: [0x00; 16] });
        for (i, &v) in out.iter().enumerate() {
            let q = if matches!(i, 0 | 17 | 31) { 16 } else { 0 };
            assert_eq!(v, (q - 16) as f32, "value {i}");
        }
        let out = dq(&BlockQ5_0 { d: f16(1.0), qh: [0xFF; 4], qs: [0xFF; 16] });
        assert!(out.iter().all(|&v| v == 15.0));
    }

    fn q5_1_scale_offset_high_bits() {
        let qh = (1u32 << 16).to_le_bytes(); // value 16 = first high nibble
        let out = dq(&BlockQ5_1 { d: f16(0.5), m: f16(3.0), qh, qs: [0x21; 16] });
        assert_eq!(out[0], 0.5 * 1.0 + 3.0);
        assert_eq!(out[16], 0.5 * (2.0 + 16.0) + 3.0);
        assert_eq!(out[17], 0.5 * 2.0 + 3.0);
    }

    fn scale_min_k4_unpacks_all_64_values() {
        for base in 0..8u8 {
            let sc: [u8; 8] = std::array::from_fn(|j| (base * 8 + j as u8) % 64);
            let m: [u8; 8] = std::array::from_fn(|j| 63 - sc[j]);
            let packed = pack_scale_min_k4(sc, m);
            for j in 0..8 {
                assert_eq!(scale_min_k4(j, &packed), (sc[j], m[j]), "sub-block {j}");
            }
        }
    }

    fn q4_k_sub_block_scales_and_mins() {
        let sc: [u8; 8] = std::array::from_fn(|s| s as u8 + 1);
        let m: [u8; 8] = std::array::from_fn(|s| 63 - s as u8);
        // Value 32s + l has quant (s + l) % 16; chunk c holds sub-blocks 2c (low), 2c+1 (high).
        let q = |s: usize, l: usize| ((s + l) % 16) as u8;
        let qs = std::array::from_fn(|i| {
            let (c, l) = (i / 32, i % 32);
            q(2 * c, l) | (q(2 * c + 1, l) << 4)
        });
        let block = BlockQ4K { d: f16(0.5), dmin: f16(0.25), scales: pack_scale_min_k4(sc, m), qs };
        let out = dq(&block);
        for (i, &v) in out.iter().enumerate() {
            let (s, l) = (i / 32, i % 32);
            let want = 0.5 * sc[s] as f32 * q(s, l) as f32 - 0.25 * m[s] as f32;
            assert_eq!(v, want, "value {i}");
        }
    }

    fn q5_k_fifth_bit_per_sub_block() {
        let sc = [1u8; 8];
        let m = [0u8; 8];
        // Quant of value 32s + l: low 4 bits l % 16, 5th bit set when l == s.
        let qs = std::array::from_fn(|i| (i % 16) as u8 | (((i % 16) as u8) << 4));
        let qh = std::array::from_fn(|l| if l < 8 { 1u8 << l } else { 0 });
        let block =
            BlockQ5K { d: f16(1.0), dmin: f16(0.0), scales: pack_scale_min_k4(sc, m), qh, qs };
        let out = dq(&block);
        for (i, &v) in out.iter().enumerate() {
            let (s, l) = (i / 32, i % 32);
            let want = (l % 16) as f32 + if l == s { 16.0 } else { 0.0 };
            assert_eq!(v, want, "value {i}");
        }
    }

    fn q6_k_six_bit_quants_signed_scales() {
        // Encode quant (i * 7) % 64 for value i with the layout of BlockQ6K's comment.
        let q = |i: usize| ((i * 7) % 64) as u8;
        let mut block = BlockQ6K { d: f16(0.5), ..bytemuck::Zeroable::zeroed() };
        for i in 0..QK_K {
            let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
            let ql = &mut block.ql[64 * h + 32 * (k % 2) + l];
            *ql |= (q(i) & 0x0F) << (4 * (k / 2));
            block.qh[32 * h + l] |= (q(i) >> 4) << (2 * k);
        }
        block.scales = std::array::from_fn(|s| (s as i32 * 16 - 128) as i8);
        let out = dq(&block);
        for (i, &v) in out.iter().enumerate() {
            let want = 0.5 * block.scales[i / 16] as f32 * (q(i) as f32 - 32.0);
            assert_eq!(v, want, "value {i}");
        }
    }

    fn floats_pass_through() {
        let raw: Vec<u8> = [1.5f32, -0.0, f32::INFINITY].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(dequantize_to_vec(GgmlType::F32, &raw).unwrap(), [1.5, -0.0, f32::INFINITY]);
        let raw: Vec<u8> = [f16(-2.5), 0x0001, 0x7C00].iter().flat_map(|x| x.to_le_bytes()).collect();
        let out = dequantize_to_vec(GgmlType::F16, &raw).unwrap();
        assert_eq!(out, [-2.5, 2.0f32.powi(-24), f32::INFINITY]);
        let raw: Vec<u8> = [0x3FC0u16, 0xC120].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(dequantize_to_vec(GgmlType::BF16, &raw).unwrap(), [1.5, -10.0]);
    }

    fn unsupported_type_is_named() {
        let err = dequantize(GgmlType::Q2K, &[0; 84], &mut [0.0; 256]).unwrap_err();
        assert_eq!(err, QuantError::Unsupported(GgmlType::Q2K));
        let msg = err.to_string();
        assert!(msg.contains("q2_K") && msg.contains("id 10"), "{msg}");
        for ty in [GgmlType::Q8_1, GgmlType::Q8K, GgmlType::Iq4Xs, GgmlType::I32, GgmlType::Mxfp4] {
            assert!(!is_supported(ty));
            assert_eq!(dequantize_to_vec(ty, &[]), Err(QuantError::Unsupported(ty)));
            assert_eq!(
                dequantize_row(ty, &[], 256, 0, &mut []),
                Err(QuantError::Unsupported(ty))
            );
        }
    }

    fn wrong_lengths_are_refused_without_writing() {
        let mut out = [7.0f32; 32];
        let err = dequantize(GgmlType::Q4_0, &[0; 17], &mut out).unwrap_err();
        assert_eq!(err, QuantError::PartialBlock { ty: GgmlType::Q4_0, len: 17, block_bytes: 18 });
        assert!(err.to_string().contains("18-byte blocks"), "{err}");
        let err = dequantize(GgmlType::Q4_0, &[0; 18], &mut out[..31]).unwrap_err();
        assert_eq!(err, QuantError::OutputLength { ty: GgmlType::Q4_0, expected: 32, got: 31 });
        assert!(out.iter().all(|&v| v == 7.0));
        // Empty input and output is a valid, empty dequantization.
        assert_eq!(dequantize(GgmlType::Q6K, &[], &mut []), Ok(()));
    }

    fn row_errors() {
        let tensor = [0u8; 3 * 34]; // Q8_0: 3 rows of 32 values
        let mut row = [1.0f32; 32];
        assert_eq!(dequantize_row(GgmlType::Q8_0, &tensor, 32, 2, &mut row), Ok(()));
        assert!(row.iter().all(|&v| v == 0.0));
        let err = dequantize_row(GgmlType::Q8_0, &tensor, 32, 3, &mut row).unwrap_err();
        assert_eq!(
            err,
            QuantError::RowOutOfRange { ty: GgmlType::Q8_0, row: 3, row_bytes: 34, len: 102 }
        );
        let err = dequantize_row(GgmlType::Q8_0, &tensor, 48, 0, &mut [0.0; 48]).unwrap_err();
        assert_eq!(err, QuantError::RowLength { ty: GgmlType::Q8_0, row_len: 48, block_elems: 32 });
        let err = dequantize_row(GgmlType::Q8_0, &tensor, 32, usize::MAX, &mut row).unwrap_err();
        assert!(matches!(err, QuantError::RowOutOfRange { .. }));
        let err = dequantize_row(GgmlType::Q8_0, &tensor, 32, 0, &mut [0.0; 16]).unwrap_err();
        assert_eq!(err, QuantError::OutputLength { ty: GgmlType::Q8_0, expected: 32, got: 16 });
    }

    fn widened_q4_0_and_q5_0_blocks_keep_every_value() {
        // Every quant of Q4_0 (0..16) and Q5_0 (0..32) in some block, several scales, and bytes
        // that are no block at all (Q8_0 passes through as it is).
        let blocks = |ty: GgmlType, seed: u32| -> Vec<u8> {
            let bytes = ty.block_bytes() as usize;
            let mut out = Vec::new();
            for (k, d) in [1.0f32, -0.375, 65504.0, 1.5e-5].iter().enumerate() {
                let mut b: Vec<u8> = (0..bytes)
                    .map(|i| ((i as u32 * 37 + k as u32 * 11 + seed) % 251) as u8)
                    .collect();
                b[..2].copy_from_slice(&f16(*d).to_le_bytes());
                out.extend(b);
            }
            out
        };
        for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
            for seed in [0, 5, 200] {
                let src = blocks(ty, seed);
                let mut q8 = vec![9u8; 3]; // appended after what dst holds
                legacy::widen_to_q8_0(ty, &src, &mut q8).unwrap();
                assert_eq!(q8.len(), 3 + src.len() / ty.block_bytes() as usize * 34, "{ty}");
                let want = dequantize_to_vec(ty, &src).unwrap();
                let got = dequantize_to_vec(GgmlType::Q8_0, &q8[3..]).unwrap();
                assert_eq!(got, want, "{ty}: widened values differ");
            }
        }
        // Every 5-bit quant: qh all ones and all zeros over qs 0..=255.
        for qh in [[0u8; 4], [0xFF; 4]] {
            let qs: [u8; 16] = std::array::from_fn(|j| (j * 17) as u8);
            let b = BlockQ5_0 { d: f16(1.0), qh, qs };
            let mut q8 = Vec::new();
            legacy::widen_to_q8_0(GgmlType::Q5_0, bytes_of(&b), &mut q8).unwrap();
            assert_eq!(dequantize_to_vec(GgmlType::Q8_0, &q8).unwrap(), dq(&b));
        }
        // Types that do not widen, and partial blocks, are refused with nothing written.
        let mut out = Vec::new();
        let e = legacy::widen_to_q8_0(GgmlType::Q4_1, &[0; 20], &mut out).unwrap_err();
        assert!(e.to_string().contains("q4_1 blocks do not widen"), "{e}");
        let e = legacy::widen_to_q8_0(GgmlType::Q5_0, &[0; 23], &mut out).unwrap_err();
        assert!(e.to_string().contains("22-byte blocks"), "{e}");
        assert!(out.is_empty());
        assert!(!legacy::widens_to_q8_0(GgmlType::Q4K));
    }
}
