//! GGUF quant block formats and the CPU dequantization reference every GPU kernel is tested against.
//!
//! Each supported [`GgmlType`] has a `#[repr(C)]` block struct that mirrors its GGUF bytes exactly
//! (f16 fields kept as raw `u16` bits, size checked at compile time) and a dequantizer with the
//! same arithmetic as ggml's reference `dequantize_row_*`, checked bit for bit against the `gguf`
//! Python package by the fixtures in `tests/fixtures/quant/`.
//!
//! GGUF blocks are not aligned (Q4_0 is 18 bytes, Q5_0 22, Q8_0 34, Q6_K 210), so blocks are
//! never borrowed from the tensor bytes: each one is copied out with
//! [`bytemuck::pod_read_unaligned`], which works on any byte offset on every target.
//!
//! Families: [`float`] (F32, F16, BF16), [`legacy`] (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; 32 values per
//! block), [`kquants`] (Q4_K, Q5_K, Q6_K; 256 values per super-block).

pub mod float;
pub mod gpu;
pub mod kquants;
pub mod legacy;

#[cfg(test)]
mod fixture_tests;
#[cfg(test)]
mod tests;

use crate::gguf::GgmlType;
use bytemuck::Pod;

pub use float::{BlockBF16, BlockF16, BlockF32};
pub use kquants::{scale_min_k4, BlockQ4K, BlockQ5K, BlockQ6K, K_SCALE_SIZE, QK_K};
pub use legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, QK};

/// The types [`dequantize`] handles: exactly the ones the GPU runs (docs/architecture.md, decision 6).
pub const SUPPORTED: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// Why a dequantization was refused. Nothing is written to the output when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error(
        "ggml type {0} (id {id}) has no CPU dequantizer; supported: \
         f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K",
        id = .0.id()
    )]
    Unsupported(GgmlType),
    #[error("{ty} data of {len} bytes is not a whole number of {block_bytes}-byte blocks")]
    PartialBlock {
        ty: GgmlType,
        len: usize,
        block_bytes: usize,
    },
    #[error("{ty} data holds {expected} values but the output slice has room for {got}")]
    OutputLength {
        ty: GgmlType,
        expected: usize,
        got: usize,
    },
    #[error("a {ty} row of {row_len} values is not a whole number of {block_elems}-value blocks")]
    RowLength {
        ty: GgmlType,
        row_len: usize,
        block_elems: usize,
    },
    #[error(
        "{ty} row {row} ({row_bytes} bytes per row) is past the end of {len} bytes of tensor data"
    )]
    RowOutOfRange {
        ty: GgmlType,
        row: usize,
        row_bytes: usize,
        len: usize,
    },
}

/// One GGUF block: its bytes as a plain struct, and how to expand it to `f32`.
pub trait QuantBlock: Pod {
    /// The ggml type whose blocks this struct mirrors.
    const TYPE: GgmlType;
    /// Values per block (ggml's `blck_size`); the struct's size is ggml's `type_size`.
    const ELEMS: usize;
    /// Writes this block's `ELEMS` values to `out`, which must have exactly that length.
    fn dequantize(&self, out: &mut [f32]);
}

/// Whether [`dequantize`] handles `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    SUPPORTED.contains(&ty)
}

/// Dequantizes whole blocks of `ty` from `bytes` (any alignment) into `out`.
///
/// `bytes.len()` must be a whole number of blocks and `out.len()` exactly the number of values
/// they hold; otherwise an error says which, and `out` is left untouched.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let kernel = kernel(ty).ok_or(QuantError::Unsupported(ty))?;
    let (block_elems, block_bytes) = geometry(ty);
    if !bytes.len().is_multiple_of(block_bytes) {
        return Err(QuantError::PartialBlock {
            ty,
            len: bytes.len(),
            block_bytes,
        });
    }
    let expected = bytes.len() / block_bytes * block_elems;
    if out.len() != expected {
        return Err(QuantError::OutputLength {
            ty,
            expected,
            got: out.len(),
        });
    }
    kernel(bytes, out);
    Ok(())
}

/// [`dequantize`] into a new vector sized from `bytes`.
pub fn dequantize_to_vec(ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>, QuantError> {
    if !is_supported(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    let (block_elems, block_bytes) = geometry(ty);
    let mut out = vec![0.0; bytes.len() / block_bytes * block_elems];
    dequantize(ty, bytes, &mut out)?;
    Ok(out)
}

/// Dequantizes row `row` of a 2-D tensor whose rows hold `row_len` values each.
///
/// `tensor` is the tensor's whole data (rows back to back, as in GGUF: a row is always a whole
/// number of blocks), and `out.len()` must equal `row_len`.
pub fn dequantize_row(
    ty: GgmlType,
    tensor: &[u8],
    row_len: usize,
    row: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    if !is_supported(ty) {
        return Err(QuantError::Unsupported(ty));
    }
    let (block_elems, block_bytes) = geometry(ty);
    if !row_len.is_multiple_of(block_elems) {
        return Err(QuantError::RowLength {
            ty,
            row_len,
            block_elems,
        });
    }
    let row_bytes = row_len / block_elems * block_bytes;
    let out_of_range = QuantError::RowOutOfRange {
        ty,
        row,
        row_bytes,
        len: tensor.len(),
    };
    let start = row
        .checked_mul(row_bytes)
        .ok_or_else(|| out_of_range.clone())?;
    let end = start
        .checked_add(row_bytes)
        .filter(|&e| e <= tensor.len())
        .ok_or(out_of_range)?;
    dequantize(ty, &tensor[start..end], out)
}

/// `(values, bytes)` per block as `usize`. Only called for supported types, whose geometry is small.
fn geometry(ty: GgmlType) -> (usize, usize) {
    let (elems, bytes) = ty.block_geometry();
    (elems as usize, bytes as usize)
}

/// A block loop: whole blocks in, `ELEMS` values per block out (lengths checked by the caller).
type Kernel = fn(&[u8], &mut [f32]);

/// The block loop for `ty`, or `None` when there is no dequantizer for it.
fn kernel(ty: GgmlType) -> Option<Kernel> {
    use GgmlType::*;
    Some(match ty {
        F32 => dequantize_blocks::<BlockF32>,
        F16 => dequantize_blocks::<BlockF16>,
        BF16 => dequantize_blocks::<BlockBF16>,
        Q8_0 => dequantize_blocks::<BlockQ8_0>,
        Q4_0 => dequantize_blocks::<BlockQ4_0>,
        Q4_1 => dequantize_blocks::<BlockQ4_1>,
        Q5_0 => dequantize_blocks::<BlockQ5_0>,
        Q5_1 => dequantize_blocks::<BlockQ5_1>,
        Q4K => dequantize_blocks::<BlockQ4K>,
        Q5K => dequantize_blocks::<BlockQ5K>,
        Q6K => dequantize_blocks::<BlockQ6K>,
        _ => return None,
    })
}

/// Expands every block in `bytes` into consecutive `B::ELEMS`-value runs of `out`.
/// Lengths were checked by the caller; a trailing partial block would be ignored.
fn dequantize_blocks<B: QuantBlock>(bytes: &[u8], out: &mut [f32]) {
    let blocks = bytes.chunks_exact(size_of::<B>());
    for (raw, dst) in blocks.zip(out.chunks_exact_mut(B::ELEMS)) {
        // A copy, not a cast: `raw` may start at any byte offset.
        let block: B = bytemuck::pod_read_unaligned(raw);
        block.dequantize(dst);
    }
}

/// An f16 stored as little-endian bits in a block (GGUF is little-endian on every platform).
#[inline]
fn f16_le(bits: u16) -> f32 {
    half::f16::from_bits(u16::from_le(bits)).to_f32()
}
