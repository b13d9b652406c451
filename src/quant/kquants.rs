//! K-quants: 256-value super-blocks split into sub-blocks that each carry a small integer scale
//! (and for Q4_K/Q5_K a min), themselves scaled by the super-block's f16 `d` (and `dmin`).
//!
//! - Q4_K, Q5_K: 8 sub-blocks of 32. Value = `d * sc[s] * q - dmin * m[s]`, q in 0..16 (Q4_K)
//!   or 0..32 (Q5_K); `sc`, `m` are 6-bit, packed into 12 bytes (see [`scale_min_k4`]).
//! - Q6_K: 16 sub-blocks of 16. Value = `d * sc[s] * (q - 32)`, q in 0..64, `sc` an i8.
//!
//! The quants are laid out in 64-value (Q4_K/Q5_K) or 128-value (Q6_K) chunks whose bytes carry
//! several sub-blocks at once in different bit positions; the per-type comments give the map.
//! The products are computed in the same order as ggml (`(d * sc) * q - (dmin * m)`), so results
//! match ggml's reference bit for bit.

use super::{f16_le, QuantBlock};
use crate::gguf::GgmlType;
use bytemuck::{Pod, Zeroable};

/// Values per K-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K and Q5_K (ggml's `K_SCALE_SIZE`).
pub const K_SCALE_SIZE: usize = 12;

/// Q4_K, 144 bytes: `d` f16 @0 | `dmin` f16 @2 | `scales` 12 B @4 | `qs` 128 B @16.
///
/// `qs` is 4 chunks of 32 bytes; chunk `c` holds sub-block `2c` in the low nibbles and
/// sub-block `2c + 1` in the high nibbles (value `64c + l` and `64c + 32 + l` in byte `32c + l`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// Q5_K, 176 bytes: `d` f16 @0 | `dmin` f16 @2 | `scales` 12 B @4 | `qh` 32 B @16 | `qs` 128 B @48.
///
/// `qs` is laid out as in Q4_K. The 5th bit of value `32s + l` (sub-block `s`) is bit `s` of
/// `qh[l]`: the 8 bits of each `qh` byte serve the 8 sub-blocks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// Q6_K, 210 bytes: `ql` 128 B @0 (low 4 bits) | `qh` 64 B @128 (high 2 bits) |
/// `scales` 16 x i8 @192 | `d` f16 @208.
///
/// Two 128-value halves, each using 64 bytes of `ql` and 32 of `qh`. Within half `h`, for
/// `l` in 0..32, value `128h + 32k + l` (k = 0..4) takes its low nibble from
/// `ql[64h + l]` (k = 0: low, k = 2: high nibble) or `ql[64h + 32 + l]` (k = 1: low, k = 3: high),
/// and its high 2 bits from bits `2k..2k+2` of `qh[32h + l]`. Its scale is `scales[value / 16]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: u16,
}

const _: () = assert!(size_of::<BlockQ4K>() == 144);
const _: () = assert!(size_of::<BlockQ5K>() == 176);
const _: () = assert!(size_of::<BlockQ6K>() == 210);

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block (ggml's `get_scale_min_k4`).
///
/// The 12 bytes hold 8 scales `S` and 8 mins `M`, for j in 0..4:
/// ```text
/// byte j      = S[j+4] bits 4..6 << 6 | S[j]      (6 bits)
/// byte j + 4  = M[j+4] bits 4..6 << 6 | M[j]      (6 bits)
/// byte j + 8  = M[j+4] bits 0..4 << 4 | S[j+4] bits 0..4
/// ```
#[inline]
pub fn scale_min_k4(j: usize, scales: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 0x3F, scales[j + 4] & 0x3F)
    } else {
        let sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
        let m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        (sc, m)
    }
}

/// `(d * sc, dmin * m)` for sub-block `j`, the two factors every value of it uses.
#[inline]
fn sub_block_factors(d: f32, dmin: f32, scales: &[u8; K_SCALE_SIZE], j: usize) -> (f32, f32) {
    let (sc, m) = scale_min_k4(j, scales);
    (d * sc as f32, dmin * m as f32)
}

impl QuantBlock for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4K;
    const ELEMS: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (f16_le(self.d), f16_le(self.dmin));
        // One 64-value chunk per 32 bytes of qs: sub-blocks 2c (low nibbles), 2c + 1 (high).
        let chunks = self.qs.chunks_exact(32).zip(out.chunks_exact_mut(64));
        for (c, (qs, out)) in chunks.enumerate() {
            let (d_lo, m_lo) = sub_block_factors(d, dmin, &self.scales, 2 * c);
            let (d_hi, m_hi) = sub_block_factors(d, dmin, &self.scales, 2 * c + 1);
            let (out_lo, out_hi) = out.split_at_mut(32);
            for l in 0..32 {
                out_lo[l] = d_lo * (qs[l] & 0x0F) as f32 - m_lo;
                out_hi[l] = d_hi * (qs[l] >> 4) as f32 - m_hi;
            }
        }
    }
}

impl QuantBlock for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5K;
    const ELEMS: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (f16_le(self.d), f16_le(self.dmin));
        let chunks = self.qs.chunks_exact(32).zip(out.chunks_exact_mut(64));
        for (c, (qs, out)) in chunks.enumerate() {
            let (s_lo, s_hi) = (2 * c, 2 * c + 1);
            let (d_lo, m_lo) = sub_block_factors(d, dmin, &self.scales, s_lo);
            let (d_hi, m_hi) = sub_block_factors(d, dmin, &self.scales, s_hi);
            let (out_lo, out_hi) = out.split_at_mut(32);
            for l in 0..32 {
                // Bit s of qh[l] is the 5th bit of sub-block s's value l.
                let h_lo = ((self.qh[l] >> s_lo) & 1) << 4;
                let h_hi = ((self.qh[l] >> s_hi) & 1) << 4;
                out_lo[l] = d_lo * ((qs[l] & 0x0F) | h_lo) as f32 - m_lo;
                out_hi[l] = d_hi * ((qs[l] >> 4) | h_hi) as f32 - m_hi;
            }
        }
    }
}

impl QuantBlock for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6K;
    const ELEMS: usize = QK_K;
    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_le(self.d);
        for h in 0..2 {
            let ql = &self.ql[64 * h..64 * h + 64];
            let qh = &self.qh[32 * h..32 * h + 32];
            let out = &mut out[128 * h..128 * h + 128];
            for l in 0..32 {
                // k = 0..4 selects the 32-value quarter of this half.
                let low = [ql[l] & 0x0F, ql[l + 32] & 0x0F, ql[l] >> 4, ql[l + 32] >> 4];
                for (k, low) in low.into_iter().enumerate() {
                    let q = (low | (((qh[l] >> (2 * k)) & 3) << 4)) as i32 - 32;
                    let i = 32 * k + l;
                    let sc = self.scales[(128 * h + i) / 16];
                    out[i] = d * sc as f32 * q as f32;
                }
            }
        }
    }
}
