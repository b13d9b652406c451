//! Unquantized element types: F32, F16 and BF16, as one-value "blocks" so they share the block
//! machinery of the quant types. Every bit pattern (NaN, infinity, subnormal) passes through.

use super::{f16_le, QuantBlock};
use crate::gguf::GgmlType;
use bytemuck::{Pod, Zeroable};

/// F32: one IEEE-754 binary32, little-endian. 4 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockF32 {
    pub bits: u32,
}

/// F16: one IEEE-754 binary16, little-endian. 2 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockF16 {
    pub bits: u16,
}

/// BF16: the top 16 bits of an f32 (sign, 8-bit exponent, 7-bit mantissa), little-endian. 2 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockBF16 {
    pub bits: u16,
}

const _: () = assert!(size_of::<BlockF32>() == 4);
const _: () = assert!(size_of::<BlockF16>() == 2);
const _: () = assert!(size_of::<BlockBF16>() == 2);

impl QuantBlock for BlockF32 {
    const TYPE: GgmlType = GgmlType::F32;
    const ELEMS: usize = 1;
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = f32::from_bits(u32::from_le(self.bits));
    }
}

impl QuantBlock for BlockF16 {
    const TYPE: GgmlType = GgmlType::F16;
    const ELEMS: usize = 1;
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = f16_le(self.bits);
    }
}

impl QuantBlock for BlockBF16 {
    const TYPE: GgmlType = GgmlType::BF16;
    const ELEMS: usize = 1;
    fn dequantize(&self, out: &mut [f32]) {
        // Widening is exact: the 16 bits become the high half, the low mantissa bits are zero.
        out[0] = f32::from_bits((u16::from_le(self.bits) as u32) << 16);
    }
}
