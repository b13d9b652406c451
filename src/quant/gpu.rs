//! The GPU layout of weight rows: GGUF blocks repacked so every field is a whole `u32` word.
//!
//! WGSL has no byte loads and GGUF blocks are not 4-byte aligned (Q4_0 18 bytes, Q5_0 22,
//! Q8_0 34, Q6_K 210), so rows are repacked once, at load time, here and nowhere else (docs/architecture.md,
//! decision 2). The repack is row-local: a loader streams whole rows through [`repack_rows`] in
//! bounded chunks, and [`gpu_row_bytes`] gives the stride [`crate::gpu::tensor::plan_parts`]
//! splits by. Every GPU row is a multiple of 4 bytes. Layout per type, `nb` blocks per row:
//!
//! | type | GPU row |
//! | --- | --- |
//! | F32 | the `cols` f32 values as-is |
//! | F16, BF16 | the `cols` halves as-is, padded with one zero half when `cols` is odd |
//! | Q8_0 | quants `nb x 32 B`, then scales `nb x f16`, the row padded to 16 bytes |
//! | Q4_0 | quants `nb x 16 B`, then scales `nb x f16` (padded to a word) |
//! | Q5_0 | `nb x (qh 4 B, qs 16 B)`, then scales `nb x f16` (padded to a word) |
//! | Q4_1 | quants `nb x 16 B`, then `nb x (d f16, m f16)` |
//! | Q5_1 | `nb x (qh 4 B, qs 16 B)`, then `nb x (d f16, m f16)` |
//! | Q4_K, Q5_K | the GGUF blocks as-is (144 and 176 bytes: every field already word-aligned) |
//! | Q6_K | each 210-byte GGUF block plus 2 zero bytes (212: `d` lands in the low half of word 52) |
//!
//! Why split scales from quants in the legacy types instead of reading the GGUF bytes with an
//! unaligned-u32 helper (two loads and a funnel shift per word): measured on lavapipe (Mesa
//! 22.3 llvmpipe, 2 CPU cores, load average under 1), GEMV Q8_0 262144 x 640 (the real model's
//! output head, 178 MB), 8 GEMVs per sample, 3 samples alternating, GB/s of weights:
//!
//! | kernel shape | raw GGUF, unaligned reads | this split layout |
//! | --- | --- | --- |
//! | thread per row, WG 64 | 0.604, 0.595, 0.602 | 0.643, 0.639, 0.644 |
//! | 4 threads per row, WG 256 | 0.588, 0.573, 0.587 | 0.635, 0.620, 0.627 |
//! | 8 threads per row, WG 256 | 0.533, 0.537, 0.563 | 0.577, 0.585, 0.582 |
//!
//! The split layout is 4-8 % faster in every pair (a run under load average 3-4 showed the same
//! order, 0.21-0.28 vs 0.27-0.30), and on a real GPU it is what allows plain aligned, coalesced
//! word loads. It adds no bytes for Q8_0/Q4_1/Q5_1 (it moves them) and at most 2 bytes per row
//! for the others; padding each block to a word instead would read 6-11 % more bytes. (The raw
//! variant was a `TYPE_Q8_0_RAW` branch of `matmul.wgsl`, removed after the measurement.)

use crate::error::{Error, ErrorCode, Result};
use crate::gguf::GgmlType;
use crate::gpu::tensor::{plan_parts, GpuTensor, TensorPart};
use crate::gpu::GpuContext;

/// How a quantized row is laid out on the GPU (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// One value per element, `bytes` each, the row padded to a word.
    Plain { bytes: u64 },
    /// Legacy types: `quant` bytes per block copied from GGUF offset `qoff` (Q5's `qh` + `qs`
    /// are contiguous in GGUF), then the per-block scale words: one f16 `d` per block
    /// (`dm == false`, two per word) or a `(d, m)` word per block (`dm == true`).
    Split { qoff: usize, quant: usize, dm: bool },
    /// K-quants: each GGUF block copied and padded to `padded` bytes.
    Blocks { padded: usize },
}

fn layout(ty: GgmlType) -> Option<Layout> {
    use GgmlType::*;
    Some(match ty {
        F32 => Layout::Plain { bytes: 4 },
        F16 | BF16 => Layout::Plain { bytes: 2 },
        Q8_0 => Layout::Split {
            qoff: 2,
            quant: 32,
            dm: false,
        },
        Q4_0 => Layout::Split {
            qoff: 2,
            quant: 16,
            dm: false,
        },
        Q5_0 => Layout::Split {
            qoff: 2,
            quant: 20,
            dm: false,
        },
        Q4_1 => Layout::Split {
            qoff: 4,
            quant: 16,
            dm: true,
        },
        Q5_1 => Layout::Split {
            qoff: 4,
            quant: 20,
            dm: true,
        },
        Q4K => Layout::Blocks { padded: 144 },
        Q5K => Layout::Blocks { padded: 176 },
        Q6K => Layout::Blocks { padded: 212 },
        _ => return None,
    })
}

fn unsupported(ty: GgmlType) -> Error {
    Error::new(
        ErrorCode::UnsupportedQuant,
        format!("tensor type {ty} has no GPU kernel; supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K"),
    )
}

/// Bytes of one row of `cols` values of `ty` in the GPU layout (a multiple of 4).
///
/// `cols` must be a whole number of `ty`'s blocks (as in any GGUF tensor); panics for a type
/// without a GPU layout (check [`GgmlType::gpu_supported`] first).
pub fn gpu_row_bytes(ty: GgmlType, cols: u64) -> u64 {
    let nb = cols / ty.block_elems();
    debug_assert_eq!(
        cols % ty.block_elems(),
        0,
        "{ty}: {cols} columns is not whole blocks"
    );
    match layout(ty).unwrap_or_else(|| panic!("{ty} has no GPU layout")) {
        Layout::Plain { bytes } => (cols * bytes).div_ceil(4) * 4,
        // Q8_0 rows are padded to 16 bytes so the GEMV can read them in 16-byte items
        // (matmul `W_VEC4`); that adds at most 12 bytes to a row of 34 per 32 values
        // (+1.2 % on Gemma 3 270M's 640-wide output head, nothing on 4096-wide rows).
        Layout::Split {
            quant, dm: false, ..
        } if ty == GgmlType::Q8_0 => (nb * quant as u64 + nb.div_ceil(2) * 4).div_ceil(16) * 16,
        Layout::Split {
            quant, dm: false, ..
        } => nb * quant as u64 + nb.div_ceil(2) * 4,
        Layout::Split {
            quant, dm: true, ..
        } => nb * quant as u64 + nb * 4,
        Layout::Blocks { padded } => nb * padded as u64,
    }
}

/// Repack whole GGUF rows (`src`, rows of `cols` values of `ty` back to back) into the GPU
/// layout, appended to `dst`. Row-local: any whole-row chunk of a tensor can be repacked alone.
pub fn repack_rows(ty: GgmlType, cols: u64, src: &[u8], dst: &mut Vec<u8>) -> Result<()> {
    let lay = layout(ty).ok_or_else(|| unsupported(ty))?;
    let gguf_row = ty.row_bytes(cols).filter(|&b| b > 0).ok_or_else(|| {
        Error::invalid(format!(
            "a {ty} row of {cols} values is not a whole number of blocks"
        ))
    })? as usize;
    if !src.len().is_multiple_of(gguf_row) {
        return Err(Error::invalid(format!(
            "{} bytes of {ty} data is not a whole number of {gguf_row}-byte rows",
            src.len()
        )));
    }
    let (elems, bb) = (ty.block_elems() as usize, ty.block_bytes() as usize);
    let nb = cols as usize / elems;
    let out_row = gpu_row_bytes(ty, cols) as usize;
    dst.reserve(src.len() / gguf_row * out_row);
    for row in src.chunks_exact(gguf_row) {
        let start = dst.len();
        match lay {
            Layout::Plain { .. } => dst.extend_from_slice(row),
            Layout::Split { qoff, quant, dm } => {
                for b in row.chunks_exact(bb) {
                    dst.extend_from_slice(&b[qoff..qoff + quant]);
                }
                for b in row.chunks_exact(bb) {
                    // `d` (and `m`) lead every legacy block.
                    dst.extend_from_slice(&b[..if dm { 4 } else { 2 }]);
                }
            }
            Layout::Blocks { padded } => {
                for b in row.chunks_exact(bb) {
                    dst.extend_from_slice(b);
                    dst.resize(dst.len() + padded - bb, 0);
                }
            }
        }
        // Padding: to a word (odd-length halves, odd block counts), Q8_0's to 16 bytes.
        dst.resize(start + out_row, 0);
        debug_assert!(nb == 0 || dst.len() == start + out_row);
    }
    Ok(())
}

/// Upload a `rows x cols` tensor from its GGUF bytes: repack, split into parts of at most
/// `max_binding` bytes (usually `ctx.limits.max_binding()`), one buffer per part. Repacks one
/// part at a time, so the extra host memory is one part.
pub fn upload_tensor(
    ctx: &GpuContext,
    name: &str,
    ty: GgmlType,
    cols: u64,
    rows: u64,
    gguf_bytes: &[u8],
    max_binding: u64,
) -> Result<GpuTensor> {
    layout(ty).ok_or_else(|| unsupported(ty))?;
    let gguf_row = ty.row_bytes(cols).ok_or_else(|| {
        Error::invalid(format!("{name}: {cols} columns is not whole {ty} blocks"))
    })?;
    if gguf_bytes.len() as u64 != gguf_row * rows {
        return Err(Error::invalid(format!(
            "{name}: {} bytes given for {rows} rows of {gguf_row} bytes ({ty}, {cols} columns)",
            gguf_bytes.len()
        )));
    }
    let row_bytes = gpu_row_bytes(ty, cols);
    let max = max_binding.min(ctx.limits.max_binding());
    let plan = plan_parts(rows, row_bytes, max)
        .map_err(|e| Error::new(ErrorCode::AdapterTooSmall, format!("{name}: {e}")))?;
    let mut parts = Vec::with_capacity(plan.len());
    let mut buf = Vec::new();
    for (i, &(row_start, n)) in plan.iter().enumerate() {
        buf.clear();
        let src =
            &gguf_bytes[(row_start * gguf_row) as usize..((row_start + n) * gguf_row) as usize];
        repack_rows(ty, cols, src, &mut buf)?;
        let label = if plan.len() == 1 {
            name.to_string()
        } else {
            format!("{name} part {i}")
        };
        parts.push(TensorPart {
            buffer: ctx.storage_buffer(&label, &buf),
            row_start,
            rows: n,
        });
    }
    Ok(GpuTensor {
        name: name.to_string(),
        ty,
        cols,
        rows,
        row_bytes,
        parts,
    })
}

/// Valid GGUF bytes for `rows x cols` of `ty` from a seed, for tests and benches: random quants
/// and sub-block scales, f16 super-scales of moderate size (finite, normal), float values in
/// [-1, 1). Not a quantizer: the values mean nothing, only their dequantization does.
pub fn synthetic_rows(ty: GgmlType, cols: u64, rows: u64, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        s.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let n_bytes = ty.row_bytes(cols).unwrap_or(0) * rows;
    let mut out = vec![0u8; n_bytes as usize];
    let unit = |r: u64| (r >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
    let f16b = |v: f32| half::f16::from_f32(v).to_bits().to_le_bytes();
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 => {
            let size = ty.block_bytes() as usize;
            for c in out.chunks_exact_mut(size) {
                let v = unit(next()) * 2.0 - 1.0;
                match ty {
                    F32 => c.copy_from_slice(&v.to_le_bytes()),
                    F16 => c.copy_from_slice(&f16b(v)),
                    _ => c.copy_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes()),
                }
            }
        }
        _ => {
            for chunk in out.chunks_mut(8) {
                let r = next().to_le_bytes();
                chunk.copy_from_slice(&r[..chunk.len()]);
            }
            let bb = ty.block_bytes() as usize;
            // Scales: 2^-6 .. 2^-4 (d), signs random for the legacy `m`.
            for b in out.chunks_exact_mut(bb) {
                let r = next();
                let d = f16b((1.0 + unit(r)) / 64.0);
                let m = f16b((unit(r << 20) - 0.5) / 8.0);
                match ty {
                    Q6K => b[208..210].copy_from_slice(&d),
                    _ => b[0..2].copy_from_slice(&d),
                }
                if matches!(ty, Q4_1 | Q5_1 | Q4K | Q5K) {
                    let m = if matches!(ty, Q4K | Q5K) {
                        f16b((1.0 + unit(r << 20)) / 256.0)
                    } else {
                        m
                    };
                    b[2..4].copy_from_slice(&m);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_to_vec, SUPPORTED};

    /// Decode a GPU row back to f32 with a tiny CPU model of the shader's reads.
    fn unpack_row(ty: GgmlType, cols: u64, row: &[u8]) -> Vec<f32> {
        // Rebuild the GGUF row from the GPU row, then use the reference dequantizer.
        let (elems, bb) = (ty.block_elems() as usize, ty.block_bytes() as usize);
        let nb = cols as usize / elems;
        let mut gguf = vec![0u8; nb * bb];
        match layout(ty).unwrap() {
            Layout::Plain { bytes } => gguf.copy_from_slice(&row[..cols as usize * bytes as usize]),
            Layout::Split { qoff, quant, dm } => {
                let sw = if dm { 4 } else { 2 };
                for b in 0..nb {
                    let g = &mut gguf[b * bb..(b + 1) * bb];
                    g[qoff..qoff + quant].copy_from_slice(&row[b * quant..(b + 1) * quant]);
                    g[..sw].copy_from_slice(&row[nb * quant + b * sw..nb * quant + (b + 1) * sw]);
                }
            }
            Layout::Blocks { padded } => {
                for b in 0..nb {
                    gguf[b * bb..(b + 1) * bb].copy_from_slice(&row[b * padded..b * padded + bb]);
                }
            }
        }
        dequantize_to_vec(ty, &gguf).unwrap()
    }

    #[test]
    fn repack_round_trips_and_is_row_local() {
        for ty in SUPPORTED {
            let be = ty.block_elems();
            for cols in [be, 3 * be, if be == 1 { 7 } else { 5 * be }] {
                let rows = 3;
                let src = synthetic_rows(ty, cols, rows, 7);
                let reference = dequantize_to_vec(ty, &src).unwrap();
                assert!(
                    reference.iter().all(|v| v.is_finite()),
                    "{ty}: synthetic data not finite"
                );
                let mut whole = Vec::new();
                repack_rows(ty, cols, &src, &mut whole).unwrap();
                let rb = gpu_row_bytes(ty, cols) as usize;
                assert_eq!(rb % 4, 0);
                assert_eq!(whole.len(), rows as usize * rb, "{ty} cols {cols}");
                // Row by row gives the same bytes.
                let gr = ty.row_bytes(cols).unwrap() as usize;
                let mut pieces = Vec::new();
                for r in src.chunks(gr) {
                    repack_rows(ty, cols, r, &mut pieces).unwrap();
                }
                assert_eq!(pieces, whole);
                for r in 0..rows as usize {
                    let got = unpack_row(ty, cols, &whole[r * rb..(r + 1) * rb]);
                    let want = &reference[r * cols as usize..(r + 1) * cols as usize];
                    assert_eq!(got, want, "{ty} cols {cols} row {r}");
                }
            }
        }
    }

    #[test]
    fn row_bytes_of_the_real_model() {
        // 640 quants + 20 scales = 680 bytes, padded to 16.
        assert_eq!(gpu_row_bytes(GgmlType::Q8_0, 640), 688);
        assert_eq!(gpu_row_bytes(GgmlType::Q8_0, 4096), 4352);
        assert_eq!(gpu_row_bytes(GgmlType::Q5_0, 640), 20 * 20 + 40);
        assert_eq!(gpu_row_bytes(GgmlType::Q6K, 2048), 8 * 212);
        assert_eq!(gpu_row_bytes(GgmlType::F16, 3), 8);
        assert!(repack_rows(GgmlType::Q2K, 256, &[0; 84], &mut Vec::new()).is_err());
    }
}
