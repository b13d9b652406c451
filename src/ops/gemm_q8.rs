//! `gemm_q8`: the tiled matrix product for prefill on 8-bit X, `Y[t, r] = sum_c W[r, c] X[t, c]`
//! with X quantized per block of 32 values ([`super::quantize_x8`], or the GLU's 8-bit output)
//! and each block's product an integer dot product of quants (`dot4I8Packed`), scaled once
//! (see `shaders/gemm_q8.wgsl`).
//!
//! Against [`super::gemm`], which decodes W to f32 in workgroup memory, a step moves a quarter
//! of the bytes through workgroup memory and issues a quarter of the multiply instructions:
//! prefill on a big GPU is bound by those, not by the weights' bytes. It serves the types whose
//! blocks have one scale (and min) per 32 values: [`TYPES`]; the others keep the f32 tile.
//! X's rounding to 8 bits is what llama.cpp does to activations for its quantized products.
//!
//! The tile is a [`GemmConfig`] (its `prefetch` is not read: a step is always loaded a step
//! ahead), recorded in the pipeline key; its `bk` is the step's depth in values, whole blocks
//! of 32 ([`blocks_per_step`]: 16 or 32 is one block); the dispatch reads BM and BN back from
//! the key.

use std::mem::offset_of;
use std::sync::Arc;

use super::gemm::GemmConfig;
use super::{quantize_x8, Variant, WgslParams};
use crate::error::{Error, ErrorCode, Result};
use crate::gguf::GgmlType;
use crate::gpu::{
    buffer_entry, grid_2d, CachedPipeline, GpuContext, GpuLimits, GpuTensor, PipelineKey, Recorder,
};

pub const SHADER: &str = "gemm_q8.wgsl";
pub const ENTRY: &str = "gemm_q8";

/// The weight types this kernel reads, with their shader defines.
pub const TYPES: [(GgmlType, &str); 3] = [
    (GgmlType::Q8_0, "TYPE_Q8_0"),
    (GgmlType::Q4_0, "TYPE_Q4_0"),
    (GgmlType::Q4K, "TYPE_Q4_K"),
];

/// Uniform of `gemm_q8.wgsl` for one dispatch (one part of the weight).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GemmQ8Params {
    /// Rows of W in this part.
    pub rows: u32,
    /// K: values per row, a multiple of 32.
    pub cols: u32,
    /// u32 words per row of W in the GPU layout.
    pub row_words: u32,
    pub n_tokens: u32,
    /// Word index of token 0's row of X, and words between tokens' rows.
    pub x_offset: u32,
    pub x_stride: u32,
    /// Element index of `Y[0, first row of this part]`.
    pub y_offset: u32,
    pub y_stride: u32,
    /// Workgroups along the tokens: `ceil(n_tokens / BN)`.
    pub token_tiles: u32,
    pub pad0: u32,
    pub pad1: u32,
    pub pad2: u32,
}

impl WgslParams for GemmQ8Params {
    const WGSL_NAME: &'static str = "GemmQ8Params";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("rows", offset_of!(GemmQ8Params, rows)),
        ("cols", offset_of!(GemmQ8Params, cols)),
        ("row_words", offset_of!(GemmQ8Params, row_words)),
        ("n_tokens", offset_of!(GemmQ8Params, n_tokens)),
        ("x_offset", offset_of!(GemmQ8Params, x_offset)),
        ("x_stride", offset_of!(GemmQ8Params, x_stride)),
        ("y_offset", offset_of!(GemmQ8Params, y_offset)),
        ("y_stride", offset_of!(GemmQ8Params, y_stride)),
        ("token_tiles", offset_of!(GemmQ8Params, token_tiles)),
        ("pad0", offset_of!(GemmQ8Params, pad0)),
        ("pad1", offset_of!(GemmQ8Params, pad1)),
        ("pad2", offset_of!(GemmQ8Params, pad2)),
    ];
}

/// Whether this kernel reads weights of `ty`.
pub fn supports(ty: GgmlType) -> bool {
    TYPES.iter().any(|(t, _)| *t == ty)
}

fn type_define(ty: GgmlType) -> Result<&'static str> {
    TYPES
        .iter()
        .find(|(t, _)| *t == ty)
        .map(|(_, d)| *d)
        .ok_or_else(|| {
            Error::new(
                ErrorCode::UnsupportedQuant,
                format!("tensor type {ty} has no 8-bit GEMM kernel"),
            )
        })
}

/// Blocks of 32 values a step of K takes: `bk / 32`, at least one (the f32 tiles' `bk` of 16
/// is one block here).
pub const fn blocks_per_step(cfg: GemmConfig) -> u32 {
    if cfg.bk <= 32 {
        1
    } else {
        cfg.bk / 32
    }
}

/// Quant words of a row (token) each thread loads per step: `8 * kb * bm / threads` for W,
/// `8 * kb * bn / threads` for X.
pub const fn words_per_thread(cfg: GemmConfig) -> (u32, u32) {
    let wg = cfg.workgroup_size();
    let kb = blocks_per_step(cfg);
    (8 * kb * cfg.bm / wg, 8 * kb * cfg.bn / wg)
}

/// Bytes of workgroup memory: each row's and token's 8 quant words and two scales per block.
pub const fn storage_bytes(cfg: GemmConfig) -> u32 {
    (cfg.bm + cfg.bn) * 10 * 4 * blocks_per_step(cfg)
}

/// Whether the shader can be built with this tile on a device with `limits`, and why not.
pub fn check(cfg: GemmConfig, limits: &GpuLimits) -> Result<()> {
    check_shape(cfg)?;
    let bad = |why: String| Err(Error::invalid(format!("gemm_q8 tile {cfg}: {why}")));
    match limits.workgroup_misfit(cfg.workgroup_size(), storage_bytes(cfg)) {
        Some(why) => bad(why),
        None => Ok(()),
    }
}

/// Whether the shader can be built with this tile at all (whatever the device), and why not.
fn check_shape(cfg: GemmConfig) -> Result<()> {
    let bad = |why: String| Err(Error::invalid(format!("gemm_q8 tile {cfg}: {why}")));
    if !matches!(cfg.tm, 4 | 8) || !matches!(cfg.tn, 4 | 8) {
        return bad("rows and tokens per thread must be 4 or 8".into());
    }
    if cfg.bm == 0
        || cfg.bn == 0
        || !cfg.bm.is_multiple_of(cfg.tm)
        || !cfg.bn.is_multiple_of(cfg.tn)
    {
        return bad("bm must be a multiple of tm, bn of tn".into());
    }
    let kb = blocks_per_step(cfg);
    if cfg.bk > 32 && (!matches!(kb, 2 | 4) || cfg.bk != 32 * kb) {
        return bad("a step is 1, 2 or 4 blocks of 32 values (bk 32, 64 or 128)".into());
    }
    let wg = cfg.workgroup_size();
    // Each thread loads 1, 2, 4 or 8 words of one block of a row (token): the step's 8 kb
    // words of all rows shared evenly.
    for (what, n) in [("rows", cfg.bm), ("tokens", cfg.bn)] {
        let words = 8 * kb * n;
        if !words.is_multiple_of(wg) || !matches!(words / wg, 1 | 2 | 4 | 8) {
            return bad(format!(
                "{wg} threads cannot share the {} words of {n} {what} evenly, 8 at most each",
                8 * kb
            ));
        }
    }
    Ok(())
}

/// The pipeline key of a type and tile.
pub fn key(ty: GgmlType, cfg: GemmConfig) -> Result<PipelineKey> {
    let (ww, xw) = words_per_thread(cfg);
    // Trusted (docs/dispatch.md, "Trusted kernels").
    let mut k = PipelineKey::new(SHADER, ENTRY)
        .trusted()
        .define(type_define(ty)?, "")
        .workgroup_size(cfg.workgroup_size())
        .define("BM", format!("{}u", cfg.bm))
        .define("BN", format!("{}u", cfg.bn))
        .define("TM", format!("{}u", cfg.tm))
        .define("TN", format!("{}u", cfg.tn))
        .define("KB", format!("{}u", blocks_per_step(cfg)))
        .define("W_WORDS", format!("{ww}u"))
        .define("X_WORDS", format!("{xw}u"));
    if cfg.tm == 8 {
        k = k.define("TM8", "");
    }
    if cfg.tn == 8 {
        k = k.define("TN8", "");
    }
    Ok(k)
}

/// The tiles the engine may pick and the odd ones the tests use, for every type.
pub fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for (ty, _) in TYPES {
        for cfg in tiles() {
            v.push(key(ty, cfg).expect("every listed type has a define").into());
        }
    }
    v
}

/// Every tile this kernel is built with: the GPU tiles at each step depth, the CPU tile and a
/// few odd shapes (8 words a thread, one word a thread, a step of 4 blocks).
pub fn tiles() -> Vec<GemmConfig> {
    let mut t = Vec::new();
    for base in GemmConfig::GPU_TILES {
        for bk in [32, 64, 128] {
            t.push(GemmConfig { bk, ..base });
        }
    }
    t.extend([
        GemmConfig::CPU,
        GemmConfig::new(64, 128, 32, 4, 8),
        GemmConfig::new(16, 16, 32, 4, 4),
        GemmConfig::new(64, 64, 32, 8, 8),
        GemmConfig::new(32, 32, 64, 4, 4),
    ]);
    // Only the shapes the kernel can be built with (a step of 4 blocks is too many words a
    // thread for the 128-row tiles).
    t.retain(|c| check_shape(*c).is_ok());
    t
}

/// The deepest step [`for_shape`] takes, in blocks of 32 (`CERA_GEMM_Q8_KB` natively: a bench
/// knob).
pub const MAX_BLOCKS_PER_STEP: u32 = 4;

/// The grid [`for_shape`] wants at least (`CERA_GEMM_Q8_MINWG` natively: a bench knob): about
/// two workgroups per core of a big GPU. Twice the f32 tile's ([`GemmConfig::MIN_WORKGROUPS`]):
/// a step here is a quarter of the f32 tile's work per barrier, so a core needs a second
/// workgroup to hide the first's barriers and loads.
pub const MIN_WORKGROUPS: u64 = 256;

/// The tile for `rows` weight rows and `n_tokens` tokens: the largest GPU tile whose grid has
/// [`MIN_WORKGROUPS`] workgroups (else the one with the most), at the deepest step up to
/// [`MAX_BLOCKS_PER_STEP`] the tile and the device's limits allow; the CPU tile on a CPU
/// adapter. Measured on an H100 (`cera bench-gemm --int8 --tiles ...`, 256 tokens, Q4_K,
/// GFLOP/s), against the f32 tile's grid rule and one block a step:
///
/// | rows x K | this rule | f32 rule, one block a step | best of 10 tiles |
/// | --- | --- | --- | --- |
/// | 6144 x 4096 (q+k+v) | 64x64x128: 19,573 | 128x64x32: 16,989 | 128x128x64: 20,331 |
/// | 4096 x 4096 (q, o) | 64x64x128: 20,258 | 128x64x32: 17,134 | the same |
/// | 1024 x 4096 (k) | 64x32x64: 8,056 | 64x32x32: 6,464 | the same |
/// | 28672 x 4096 (gate+up) | 128x128x64: 15,859 | 128x128x32: 14,646 | 128x64x64: 15,911 |
/// | 14336 x 4096 (up) | 128x64x64: 10,858 | 128x128x32: 10,323 | 128x128x64: 11,678 |
/// | 4096 x 14336 (down) | 64x64x128: 10,359 | 128x64x32: 8,685 | the same |
pub fn for_shape(ctx: &GpuContext, rows: u64, n_tokens: u32) -> GemmConfig {
    if super::matmul::is_cpu_adapter(ctx) {
        return GemmConfig::CPU;
    }
    let knob = crate::gpu::knob::knob_u64;
    let max_kb = knob("CERA_GEMM_Q8_KB").map_or(MAX_BLOCKS_PER_STEP, |k| k.clamp(1, 4) as u32);
    let min_wg = knob("CERA_GEMM_Q8_MINWG").unwrap_or(MIN_WORKGROUPS);
    // Each tile at its deepest step that builds here.
    let deepest = |base: GemmConfig| {
        [4, 2, 1]
            .into_iter()
            .filter(|&kb| kb <= max_kb)
            .map(|kb| GemmConfig {
                bk: 32 * kb,
                ..base
            })
            .find(|c| check(*c, &ctx.limits).is_ok())
    };
    let fits: Vec<GemmConfig> = GemmConfig::GPU_TILES
        .into_iter()
        .filter_map(deepest)
        .collect();
    GemmConfig::filling(&fits, rows, n_tokens, min_wg).unwrap_or(GemmConfig::CPU)
}

/// Prepare `Y[t, r] = sum_c W[r, c] X[t, c]` for `n_tokens` tokens on X quantized in `xq`
/// (token `t`'s row at word `x_offset + t * x_stride`, [`quantize_x8::row_words`] by default):
/// one dispatch per part of `w`. `y` is `(n_tokens, y_stride)` f32 from element `y_offset`
/// (`y_stride` defaults to `w.rows`); only the `w.rows` columns of each token's row are written.
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    rec: &mut Recorder,
    cfg: GemmConfig,
    w: &GpuTensor,
    xq: &wgpu::Buffer,
    x_offset: u64,
    x_stride: Option<u64>,
    y: &wgpu::Buffer,
    y_offset: u64,
    y_stride: Option<u64>,
    n_tokens: u32,
) -> Result<()> {
    if n_tokens == 0 || w.rows == 0 {
        return Ok(());
    }
    let ctx = rec.ctx;
    check(cfg, &ctx.limits)?;
    if !w.cols.is_multiple_of(32) {
        return Err(Error::invalid(format!(
            "gemm_q8 {}: {} values a row (not whole blocks of 32)",
            w.name, w.cols
        )));
    }
    let y_stride = y_stride.unwrap_or(w.rows);
    if y_stride < w.rows {
        return Err(Error::invalid(format!(
            "gemm_q8 {}: y stride {y_stride} is below the {} rows",
            w.name, w.rows
        )));
    }
    let row_words = quantize_x8::row_words(w.cols);
    let x_stride = x_stride.unwrap_or(row_words);
    if x_stride < row_words {
        return Err(Error::invalid(format!(
            "gemm_q8 {}: x stride {x_stride} words is below a row's {row_words}",
            w.name
        )));
    }
    let x_end = x_offset + (n_tokens as u64 - 1) * x_stride + row_words;
    if xq.size() < x_end * 4 {
        return Err(Error::invalid(format!(
            "gemm_q8 {}: {n_tokens} tokens of 8-bit X need {} bytes, the buffer has {}",
            w.name,
            x_end * 4,
            xq.size()
        )));
    }
    let pipe: Arc<CachedPipeline> = ctx.pipeline(&key(w.ty, cfg)?)?;
    let (bm, bn) = (
        pipe.key.require_u32("BM")? as u64,
        pipe.key.require_u32("BN")? as u64,
    );
    let u32_of = |what: &str, v: u64| {
        u32::try_from(v).map_err(|_| {
            Error::invalid(format!(
                "gemm_q8 {}: {what} = {v} does not fit in u32",
                w.name
            ))
        })
    };
    let token_tiles = (n_tokens as u64).div_ceil(bn);
    u32_of("x end", x_end)?;
    u32_of("y end", y_offset + n_tokens as u64 * y_stride)?;
    let label = pipe.key.label();
    for part in &w.parts {
        if part.rows == 0 {
            continue;
        }
        let groups = part.rows.div_ceil(bm) * token_tiles;
        let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
        let params = GemmQ8Params {
            rows: u32_of("rows", part.rows)?,
            cols: u32_of("cols", w.cols)?,
            row_words: u32_of("row words", w.row_bytes / 4)?,
            n_tokens,
            x_offset: u32_of("x offset", x_offset)?,
            x_stride: u32_of("x stride", x_stride)?,
            y_offset: u32_of("y offset", y_offset + part.row_start)?,
            y_stride: u32_of("y stride", y_stride)?,
            token_tiles: u32_of("token tiles", token_tiles)?,
            pad0: 0,
            pad1: 0,
            pad2: 0,
        };
        let ubuf = rec.uniform(&label, &params);
        let entries = [
            buffer_entry(0, &ubuf),
            buffer_entry(1, &part.buffer),
            buffer_entry(2, xq),
            buffer_entry(3, y),
        ];
        rec.push("gemm_q8", &pipe, &entries, grid);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_tiles_fit_webgpu_minimums() {
        let min = GpuLimits {
            max_storage_buffer_binding_size: 128 << 20,
            max_buffer_size: 256 << 20,
            max_compute_workgroups_per_dimension: 65535,
            max_compute_invocations_per_workgroup: 256,
            max_compute_workgroup_size_x: 256,
            max_compute_workgroup_storage_size: 16 << 10,
            max_storage_buffers_per_shader_stage: 8,
            min_storage_buffer_offset_alignment: 256,
            max_uniform_buffer_binding_size: 64 << 10,
        };
        // Every tile with a one-block step fits WebGPU's minimums; deeper steps need more
        // workgroup memory (128 x 128 in steps of 64 values: 20 KiB), which for_shape checks.
        for c in tiles().into_iter().filter(|c| blocks_per_step(*c) == 1) {
            assert!(check(c, &min).is_ok(), "{c}: {:?}", check(c, &min));
        }
        let deep = GemmConfig {
            bk: 64,
            ..GemmConfig::TILE_128X128
        };
        assert!(check(deep, &min).is_err());
        assert_eq!(storage_bytes(deep), 20 << 10);
        assert_eq!(words_per_thread(deep), (8, 8));
        assert!(check(GemmConfig { bk: 128, ..deep }, &min).is_err());
        assert!(check(
            GemmConfig {
                bk: 96,
                ..GemmConfig::TILE_64X64
            },
            &min
        )
        .is_err());
        assert_eq!(blocks_per_step(GemmConfig::TILE_64X64_BK16), 1);
        assert_eq!(
            blocks_per_step(GemmConfig {
                bk: 128,
                ..GemmConfig::TILE_64X64
            }),
            4
        );
        assert!(check(
            GemmConfig {
                bk: 64,
                ..GemmConfig::TILE_64X64
            },
            &min
        )
        .is_ok());
        assert_eq!(words_per_thread(GemmConfig::TILE_128X128), (4, 4));
        assert_eq!(words_per_thread(GemmConfig::CPU), (4, 4));
        // 16 threads over 32 rows would load 16 words a row each; 512 threads are too many.
        assert!(check(GemmConfig::new(32, 8, 32, 4, 4), &min).is_err());
        assert!(check(GemmConfig::new(128, 128, 32, 4, 8), &min).is_err());
    }

    #[test]
    fn key_carries_the_tile() {
        let k = key(GgmlType::Q4K, GemmConfig::TILE_128X64).unwrap();
        assert_eq!(k.define_u32("BM").unwrap(), 128);
        assert_eq!(k.define_u32("BN").unwrap(), 64);
        assert_eq!(k.define_u32("W_WORDS").unwrap(), 4);
        assert_eq!(k.define_u32("X_WORDS").unwrap(), 2);
        assert!(key(GgmlType::Q6K, GemmConfig::TILE_128X64).is_err());
    }
}
