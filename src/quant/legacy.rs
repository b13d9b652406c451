//! The original ggml quants: 32 values per block, one f16 scale `d` (and for the `_1` types an
//! f16 offset `m`), 4, 5 or 8 bits per value.
//!
//! Value `i` of a block (0..32) is, with `q` its unsigned quant:
//! - Q4_0: `d * (q - 8)`,  q in 0..16
//! - Q4_1: `d * q + m`,    q in 0..16
//! - Q5_0: `d * (q - 16)`, q in 0..32
//! - Q5_1: `d * q + m`,    q in 0..32
//! - Q8_0: `d * q`,        q an i8
//!
//! 4-bit quants are split into halves, not interleaved: byte `j` of `qs` holds value `j` in its
//! low nibble and value `j + 16` in its high nibble. The 5th bit of value `i` is bit `i` of the
//! little-endian u32 `qh`.

use super::{f16_le, QuantBlock};
use crate::gguf::GgmlType;
use bytemuck::{Pod, Zeroable};

/// Values per block of every legacy quant type (ggml's `QK4_0`, `QK5_0`, `QK8_0`, ...).
pub const QK: usize = 32;

/// Q4_0, 18 bytes: `d` f16 @0 | `qs` 16 x u8 @2 (two 4-bit quants per byte).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: u16,
    pub qs: [u8; QK / 2],
}

/// Q4_1, 20 bytes: `d` f16 @0 | `m` f16 @2 | `qs` 16 x u8 @4.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; QK / 2],
}

/// Q5_0, 22 bytes: `d` f16 @0 | `qh` u32 LE @2 (5th bits) | `qs` 16 x u8 @6 (low 4 bits).
/// `qh` is kept as bytes: as a `u32` field it would force 4-byte alignment and padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    pub d: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q5_1, 24 bytes: `d` f16 @0 | `m` f16 @2 | `qh` u32 LE @4 | `qs` 16 x u8 @8.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    pub d: u16,
    pub m: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// Q8_0, 34 bytes: `d` f16 @0 | `qs` 32 x i8 @2.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; QK],
}

const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ5_0>() == 22);
const _: () = assert!(size_of::<BlockQ5_1>() == 24);
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// The 4-bit quants of a block in value order: `(q[j], q[j + 16])` for byte `j`.
#[inline]
fn nibbles(byte: u8) -> (u8, u8) {
    (byte & 0x0F, byte >> 4)
}

/// The 5th bits of values `j` and `j + 16`, already shifted to bit 4.
#[inline]
fn high_bits(qh: [u8; 4], j: usize) -> (u8, u8) {
    let qh = u32::from_le_bytes(qh);
    (
        (((qh >> j) & 1) << 4) as u8,
        (((qh >> (j + 16)) & 1) << 4) as u8,
    )
}

impl QuantBlock for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        for (j, &byte) in self.qs.iter().enumerate() {
            let (lo, hi) = nibbles(byte);
            out[j] = d * (lo as i32 - 8) as f32;
            out[j + QK / 2] = d * (hi as i32 - 8) as f32;
        }
    }
}

impl QuantBlock for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (f16_le(self.d), f16_le(self.m));
        for (j, &byte) in self.qs.iter().enumerate() {
            let (lo, hi) = nibbles(byte);
            out[j] = d * lo as f32 + m;
            out[j + QK / 2] = d * hi as f32 + m;
        }
    }
}

impl QuantBlock for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        for (j, &byte) in self.qs.iter().enumerate() {
            let (lo, hi) = nibbles(byte);
            let (h0, h1) = high_bits(self.qh, j);
            out[j] = d * ((lo | h0) as i32 - 16) as f32;
            out[j + QK / 2] = d * ((hi | h1) as i32 - 16) as f32;
        }
    }
}

impl QuantBlock for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (f16_le(self.d), f16_le(self.m));
        for (j, &byte) in self.qs.iter().enumerate() {
            let (lo, hi) = nibbles(byte);
            let (h0, h1) = high_bits(self.qh, j);
            out[j] = d * (lo | h0) as f32 + m;
            out[j + QK / 2] = d * (hi | h1) as f32 + m;
        }
    }
}

impl QuantBlock for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const ELEMS: usize = QK;
    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * q as f32;
        }
    }
}

/// Whether `ty`'s blocks convert to Q8_0 blocks with the same values: Q4_0 and Q5_0 hold
/// `d * (q - offset)` with the quant in -16..16, which an i8 holds under the same f16 `d`
/// (Q8_0 itself trivially). The `_1` types add an offset `m`, which Q8_0 has no field for.
pub fn widens_to_q8_0(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0)
}

/// Rewrite whole blocks of `ty` (`src`, GGUF bytes; [`widens_to_q8_0`]) as Q8_0 blocks with
/// exactly the same values, appended to `dst`: the loader stores a fused projection whose
/// members mix Q4_0 / Q5_0 with Q8_0 (Gemma 3 270M Q4_K_M: q and k Q5_0, v Q8_0) as one Q8_0
/// tensor, so one GEMV computes all of them. 22 or 18 bytes a block become 34.
pub fn widen_to_q8_0(ty: GgmlType, src: &[u8], dst: &mut Vec<u8>) -> crate::error::Result<()> {
    let bytes = ty.block_bytes() as usize;
    if !widens_to_q8_0(ty) {
        return Err(crate::error::Error::invalid(format!(
            "{ty} blocks do not widen to q8_0 (only q4_0, q5_0 and q8_0 do)"
        )));
    }
    if !src.len().is_multiple_of(bytes) {
        return Err(crate::error::Error::invalid(format!(
            "{} bytes of {ty} data is not a whole number of {bytes}-byte blocks",
            src.len()
        )));
    }
    dst.reserve(src.len() / bytes * size_of::<BlockQ8_0>());
    for b in src.chunks_exact(bytes) {
        // Every block widened starts with its f16 scale, which the Q8_0 block keeps.
        let d = u16::from_le_bytes([b[0], b[1]]);
        let mut qs = [0i8; QK];
        match ty {
            GgmlType::Q8_0 => qs = bytemuck::from_bytes::<BlockQ8_0>(b).qs,
            GgmlType::Q4_0 => {
                let blk: &BlockQ4_0 = bytemuck::from_bytes(b);
                for (j, &byte) in blk.qs.iter().enumerate() {
                    let (lo, hi) = nibbles(byte);
                    qs[j] = lo as i8 - 8;
                    qs[j + QK / 2] = hi as i8 - 8;
                }
            }
            _ => {
                let blk: &BlockQ5_0 = bytemuck::from_bytes(b);
                for (j, &byte) in blk.qs.iter().enumerate() {
                    let (lo, hi) = nibbles(byte);
                    let (hlo, hhi) = high_bits(blk.qh, j);
                    qs[j] = (lo | hlo) as i8 - 16;
                    qs[j + QK / 2] = (hi | hhi) as i8 - 16;
                }
            }
        }
        dst.extend_from_slice(bytemuck::bytes_of(&BlockQ8_0 { d, qs }));
    }
    Ok(())
}
