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
