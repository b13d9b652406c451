//! `gemm`: the tiled matrix product for prefill, `Y[t, r] = sum_c W[r, c] * X[t, c]` (see
//! `shaders/gemm.wgsl`). A workgroup computes a BM x BN tile of `Y` (rows x tokens), walking K
//! in steps of BK: the W tile is decoded once into workgroup memory as f32, the X tile copied
//! beside it, and each thread accumulates TM x TN outputs in registers.
//!
//! The weight is a [`GpuTensor`] in the GPU layout of [`crate::quant::gpu`], every type
//! [`matmul`](super::matmul) reads, possibly split into row-range parts: one dispatch per part,
//! writing its rows of `Y`.
//!
//! The tile is a decision ([`GemmConfig`]) recorded in the pipeline key as defines; the dispatch
//! reads BM and BN back from the key, so shader and grid cannot disagree. [`use_gemm`] says when
//! the tiled kernel beats matmul's tokens-in-registers kernel.

use std::mem::offset_of;
use std::sync::Arc;

use super::matmul::{self, MatmulConfig, TYPES};
use super::{Variant, WgslParams};
use crate::error::{Error, ErrorCode, Result};
use crate::gguf::GgmlType;
use crate::gpu::{
    buffer_entry, grid_2d, CachedPipeline, GpuContext, GpuLimits, GpuTensor, PipelineKey, Recorder,
};

pub const SHADER: &str = "gemm.wgsl";
pub const ENTRY: &str = "gemm";

/// Uniform of `gemm.wgsl` for one dispatch (one part of the weight).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GemmParams {
    /// Rows of W in this part.
    pub rows: u32,
    /// K: values per row.
    pub cols: u32,
    /// u32 words per row in the GPU layout.
    pub row_words: u32,
    pub n_tokens: u32,
    /// Element index of `X[0, 0]`.
    pub x_offset: u32,
    pub x_stride: u32,
    /// Element index of `Y[0, first row of this part]`.
    pub y_offset: u32,
    pub y_stride: u32,
    /// Workgroups along the tokens: `ceil(n_tokens / BN)`.
    pub token_tiles: u32,
    /// `gemm_coop.wgsl`: 1 when X may be read 4 values at a time (offset and stride multiples
    /// of 4, the buffer whole vec4s); `gemm.wgsl` does not read it.
    pub x_vec4: u32,
    pub pad1: u32,
    pub pad2: u32,
}

impl WgslParams for GemmParams {
    const WGSL_NAME: &'static str = "GemmParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("rows", offset_of!(GemmParams, rows)),
        ("cols", offset_of!(GemmParams, cols)),
        ("row_words", offset_of!(GemmParams, row_words)),
        ("n_tokens", offset_of!(GemmParams, n_tokens)),
        ("x_offset", offset_of!(GemmParams, x_offset)),
        ("x_stride", offset_of!(GemmParams, x_stride)),
        ("y_offset", offset_of!(GemmParams, y_offset)),
        ("y_stride", offset_of!(GemmParams, y_stride)),
        ("token_tiles", offset_of!(GemmParams, token_tiles)),
        ("x_vec4", offset_of!(GemmParams, x_vec4)),
        ("pad1", offset_of!(GemmParams, pad1)),
        ("pad2", offset_of!(GemmParams, pad2)),
    ];
}

/// The tile shape: a decision stored in the pipeline key, read back by the dispatch.
///
/// A workgroup computes `bm` rows x `bn` tokens with `(bm / tm) * (bn / tn)` threads, each
/// `tm` x `tn` outputs; K advances `bk` values per step. Workgroup memory: `(bm + bn) * bk * 4`
/// bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmConfig {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    /// Rows per thread: 4 or 8.
    pub tm: u32,
    /// Tokens per thread: 4 or 8.
    pub tn: u32,
    /// Load each K step's words during the step before (`PREFETCH`, registers per thread). On
    /// GPUs it hides a memory round trip per step; CPU-emulated adapters keep every invocation's
    /// registers in memory, where it only costs (SwiftShader's prefill at 32 tokens: 8 % slower).
    pub prefetch: bool,
}

impl GemmConfig {
    pub const fn new(bm: u32, bn: u32, bk: u32, tm: u32, tn: u32) -> Self {
        GemmConfig {
            bm,
            bn,
            bk,
            tm,
            tn,
            prefetch: true,
        }
    }

    /// This tile loading each step's words at the step itself (no `PREFETCH`).
    pub const fn without_prefetch(self) -> Self {
        GemmConfig {
            prefetch: false,
            ..self
        }
    }

    /// 128 rows x 128 tokens, 8 x 8 per thread, 256 threads, BK 16: 16 KiB of workgroup memory
    /// (WebGPU's guaranteed minimum). Each k step reads 4 vec4s per thread for 64
    /// multiply-adds. The fastest tile on an H200 when the grid has enough workgroups.
    pub const TILE_128X128: GemmConfig = GemmConfig::new(128, 128, 16, 8, 8);
    /// 128 x 64, 8 x 4 per thread, 256 threads, BK 16: 12 KiB.
    pub const TILE_128X64: GemmConfig = GemmConfig::new(128, 64, 16, 8, 4);
    /// 64 x 64, 4 x 4 per thread, 256 threads, BK 32: 16 KiB. Twice the workgroups of
    /// [`Self::TILE_128X64`], for matrices too small to fill a big GPU with larger tiles.
    pub const TILE_64X64: GemmConfig = GemmConfig::new(64, 64, 32, 4, 4);
    /// 64 x 64 with BK 16: 8 KiB, for adapters below WebGPU's 16 KiB (downlevel limits).
    pub const TILE_64X64_BK16: GemmConfig = GemmConfig::new(64, 64, 16, 4, 4);
    /// 32 x 32 with 4 x 4 per thread: 64 threads, 8 KiB. For CPU-emulated adapters, where a
    /// workgroup runs on one core and a smaller tile keeps the cores busy on small matrices: the
    /// fastest tile on lavapipe from 16 to 64 tokens ([`use_gemm`] has the numbers).
    pub const CPU: GemmConfig = GemmConfig::new(32, 32, 32, 4, 4).without_prefetch();

    /// 64 x 32, 4 x 4 per thread, 128 threads, BK 32: 12 KiB. For small batches (32 to 64
    /// tokens), where a 64-token tile would be half padding and its grid too small.
    pub const TILE_64X32: GemmConfig = GemmConfig::new(64, 32, 32, 4, 4);

    /// The GPU tiles from largest to smallest: what [`Self::for_shape`] chooses from.
    pub const GPU_TILES: [GemmConfig; 4] = [
        Self::TILE_128X128,
        Self::TILE_128X64,
        Self::TILE_64X64,
        Self::TILE_64X32,
    ];

    /// Threads per workgroup.
    pub const fn workgroup_size(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// Runs of W (8 values) and of X (4 values) each thread loads per K step, rounded up. A
    /// thread holds the next step's runs in registers while the current step multiplies, so
    /// the shader has a slot for each: at most [`Self::MAX_RUNS`].
    pub const fn runs_per_thread(&self) -> (u32, u32) {
        let wg = self.workgroup_size();
        (
            (self.bm * self.bk / 8).div_ceil(wg),
            (self.bn * self.bk / 4).div_ceil(wg),
        )
    }

    /// The most runs of W or X a thread may carry between K steps (the shader's slots).
    pub const MAX_RUNS: u32 = 4;

    /// Bytes of workgroup memory (the two f32 tiles).
    pub const fn storage_bytes(&self) -> u32 {
        (self.bm + self.bn) * self.bk * 4
    }

    /// The largest of the standard tiles this device's limits allow (the CPU tile on a CPU
    /// adapter). [`Self::for_shape`] is the better choice when the shape is known.
    pub fn for_device(ctx: &GpuContext) -> Self {
        if matmul::is_cpu_adapter(ctx) {
            return Self::CPU;
        }
        Self::GPU_TILES
            .into_iter()
            .find(|c| c.check(&ctx.limits).is_ok())
            .unwrap_or(Self::TILE_64X64_BK16)
    }

    /// The tile for a product of `rows` weight rows and `n_tokens` tokens: the largest GPU tile
    /// whose grid still has [`Self::MIN_WORKGROUPS`] workgroups (else the one with the most). A
    /// larger tile reuses each load more, but a grid of fewer workgroups than the GPU has cores
    /// leaves cores idle. Measured on an H200 (132 SMs), GFLOP/s, Q8_0 (workgroups in brackets):
    ///
    /// | rows x K, tokens | 128x128x16:8x8 | 128x64x16:8x4 | 64x64x32:4x4 | 64x32x32:4x4 | matmul NT = 8 |
    /// | --- | --- | --- | --- | --- | --- |
    /// | 4096 x 4096, 512 | **16,298** (128) | 14,862 (256) | 10,687 (512) | | 3,529 |
    /// | 14336 x 4096, 512 | 16,887 (448) | **17,644** (896) | 12,772 (1792) | | 3,652 |
    /// | 4096 x 14336, 512 | **16,505** (128) | 15,392 (256) | 11,585 (512) | | 3,646 |
    /// | 1024 x 4096, 512 | 4,120 (32) | 5,731 (64) | **7,889** (128) | | 3,228 |
    /// | 2048 x 640, 256 | 4,086 (32) | 5,674 (64) | **7,769** (128) | | 2,486 |
    /// | 1024 x 640, 256 | 2,095 (16) | 2,953 (32) | **4,072** (64) | | 1,689 |
    /// | 4096 x 4096, 48 | | | 3,374 (64) | **3,788** (128) | 2,589 |
    /// | 4096 x 4096, 32 | | | 2,362 (64) | **2,559** (128) | 2,336 |
    ///
    /// Q4_K at 512 tokens is within 10 % of Q8_0 (14,459 with 128x128 on 4096 x 4096; matmul's
    /// register kernel 1,941).
    ///
    /// Where the workgroup memory allows, the 64-row tiles walk K in steps of 64
    /// ([`Self::deeper`]): half the steps, each a barrier pair and a memory round trip, which
    /// bound the small matrices (Gemma 3 270M's q projection, 1024 x 640 at 256 tokens: 73 ->
    /// 68 us on an H200).
    pub fn for_shape(ctx: &GpuContext, rows: u64, n_tokens: u32) -> Self {
        Self::for_shape_base(ctx, rows, n_tokens).deeper(ctx)
    }

    /// This tile with BK 64 instead of 32 for the 64-row tiles, where the device allows it
    /// (and, on native builds, unless `CERA_GEMM_BK64=0`: a bench knob).
    pub fn deeper(self, ctx: &GpuContext) -> Self {
        if crate::gpu::knob::knob_off("CERA_GEMM_BK64") {
            return self;
        }
        if self.bm != 64 || self.bk != 32 {
            return self;
        }
        let d = GemmConfig { bk: 64, ..self };
        if d.check(&ctx.limits).is_ok() {
            d
        } else {
            self
        }
    }

    fn for_shape_base(ctx: &GpuContext, rows: u64, n_tokens: u32) -> Self {
        if matmul::is_cpu_adapter(ctx) {
            return Self::CPU;
        }
        let fits: Vec<GemmConfig> = Self::GPU_TILES
            .into_iter()
            .filter(|c| c.check(&ctx.limits).is_ok())
            .collect();
        Self::filling(&fits, rows, n_tokens, Self::MIN_WORKGROUPS).unwrap_or(Self::TILE_64X64_BK16)
    }

    /// The first of `tiles` (largest first) whose grid over `rows` x `n_tokens` has at least
    /// `min_workgroups` workgroups, else the one with the most; `None` when `tiles` is empty.
    pub fn filling(
        tiles: &[GemmConfig],
        rows: u64,
        n_tokens: u32,
        min_workgroups: u64,
    ) -> Option<GemmConfig> {
        let groups =
            |c: &GemmConfig| rows.div_ceil(c.bm as u64) * (n_tokens as u64).div_ceil(c.bn as u64);
        tiles
            .iter()
            .copied()
            .find(|c| groups(c) >= min_workgroups)
            .or_else(|| tiles.iter().copied().max_by_key(groups))
    }

    /// The grid [`Self::for_shape`] wants at least: about one workgroup per core of a big GPU.
    pub const MIN_WORKGROUPS: u64 = 128;

    /// Whether the shader can be built with this shape on a device with `limits`, and why not.
    pub fn check(&self, limits: &GpuLimits) -> Result<()> {
        let bad = |why: String| Err(Error::invalid(format!("gemm tile {self:?}: {why}")));
        if !matches!(self.tm, 4 | 8) || !matches!(self.tn, 4 | 8) {
            return bad("rows and tokens per thread must be 4 or 8".into());
        }
        // Thread (tx, ty) owns row slots tx + i * (bm / tm) for i < tm / 4: bm / tm threads of
        // tm / 4 vec4 slots cover bm / 4 slots when tm divides bm.
        if !self.bm.is_multiple_of(self.tm)
            || !self.bn.is_multiple_of(self.tn)
            || self.bm == 0
            || self.bn == 0
        {
            return bad("bm must be a multiple of tm, bn of tn".into());
        }
        if self.bk == 0 || !self.bk.is_multiple_of(8) {
            return bad("bk must be a positive multiple of 8 (the decode run)".into());
        }
        let (w_runs, x_runs) = self.runs_per_thread();
        if w_runs.max(x_runs) > Self::MAX_RUNS {
            return bad(format!(
                "each thread would load {w_runs} runs of W and {x_runs} of X per step; the shader carries at most {}",
                Self::MAX_RUNS
            ));
        }
        let wg = self.workgroup_size();
        match limits.workgroup_misfit(wg, self.storage_bytes()) {
            Some(why) => bad(why),
            None => Ok(()),
        }
    }
}

/// `BMxBNxBK:TMxTN`, e.g. `128x64x32:8x4`, with `/np` when the tile does not prefetch (how the
/// bench prints and parses tiles).
impl std::fmt::Display for GemmConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}x{}x{}:{}x{}{}",
            self.bm,
            self.bn,
            self.bk,
            self.tm,
            self.tn,
            if self.prefetch { "" } else { "/np" }
        )
    }
}

impl std::str::FromStr for GemmConfig {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::invalid(format!(
                "tile {s:?}: want BMxBNxBK:TMxTN, e.g. 128x64x32:8x4"
            ))
        };
        let (text, prefetch) = match s.trim().strip_suffix("/np") {
            Some(t) => (t, false),
            None => (s.trim(), true),
        };
        let (tile, thread) = text.split_once(':').ok_or_else(bad)?;
        let nums = |t: &str| {
            t.split('x')
                .map(|n| n.parse::<u32>().map_err(|_| bad()))
                .collect::<Result<Vec<u32>>>()
        };
        match (nums(tile)?.as_slice(), nums(thread)?.as_slice()) {
            (&[bm, bn, bk], &[tm, tn]) => Ok(GemmConfig {
                prefetch,
                ..GemmConfig::new(bm, bn, bk, tm, tn)
            }),
            _ => Err(bad()),
        }
    }
}

/// Whether the tiled kernel is the faster choice for a batch of `n_tokens` (else matmul's
/// kernel: GEMV for one token, tokens in registers for a few).
///
/// Measured on an H200, Q8_0, GFLOP/s; gemm is the best of 64x64, 64x32 and 32x32 at 16 to 48
/// tokens, 64x64 alone at 8 and 64:
///
/// | tokens | 4096 x 4096: gemm | matmul NT = 8 | 2048 x 640: gemm | matmul NT = 8 |
/// | --- | --- | --- | --- | --- |
/// | 8 | 649 | **1,051** | | |
/// | 16 | 1,370 | **1,739** | **629** | 469 |
/// | 32 | **2,559** | 2,336 | **1,178** | 836 |
/// | 48 | **3,788** | 2,589 | **1,698** | 1,143 |
/// | 64 | **4,095** | 2,966 | | |
///
/// On a CPU-emulated adapter the crossover is about the same: measured on lavapipe (Mesa 22.3,
/// 2 cores, under a load average of 3-4 from other builds, so best of 3 alternating samples),
/// Q4_K 640 x 2048, GFLOP/s:
///
/// | tokens | matmul NT = 8, thread per row | gemm 32x32x32:4x4 | gemm 64x64x32:4x4 | gemm 128x64x16:8x4 |
/// | --- | --- | --- | --- | --- |
/// | 8 | **1.75** | 0.35 | 0.24 | 0.46 |
/// | 16 | 1.77 | **1.83** | 1.21 | 1.31 |
/// | 64 | 1.01 | **3.52** | 3.30 | 3.19 |
/// | 256 | 0.75 | 1.71 | 2.17 | **2.55** |
/// The crossover measured on both is the same, so the adapter is not consulted yet; it is a
/// parameter so a device whose crossover differs can get its own without changing callers.
pub fn use_gemm(_ctx: &GpuContext, n_tokens: u32) -> bool {
    n_tokens >= 32
}

/// The shader define of a weight type the tiled GEMMs read (`gemm.wgsl`, `gemm_coop.wgsl`).
pub(super) fn type_define(ty: GgmlType) -> Result<&'static str> {
    TYPES
        .iter()
        .find(|(t, _)| *t == ty)
        .map(|(_, d)| *d)
        .ok_or_else(|| {
            Error::new(
                ErrorCode::UnsupportedQuant,
                format!("tensor type {ty} has no GPU gemm kernel"),
            )
        })
}

/// The pipeline key of a type and tile.
pub fn key(ty: GgmlType, cfg: GemmConfig) -> Result<PipelineKey> {
    // Trusted: indices in range by construction, loops bounded by the params (docs/dispatch.md,
    // "Trusted kernels").
    let mut k = PipelineKey::new(SHADER, ENTRY)
        .trusted()
        .define(type_define(ty)?, "")
        .workgroup_size(cfg.workgroup_size())
        .define("BM", format!("{}u", cfg.bm))
        .define("BN", format!("{}u", cfg.bn))
        .define("BK", format!("{}u", cfg.bk))
        .define("TM", format!("{}u", cfg.tm))
        .define("TN", format!("{}u", cfg.tn));
    if cfg.tm == 8 {
        k = k.define("TM8", "");
    }
    if cfg.tn == 8 {
        k = k.define("TN8", "");
    }
    if cfg.prefetch {
        k = k.define("PREFETCH", "");
    }
    let (w_runs, x_runs) = cfg.runs_per_thread();
    for n in 2..=4 {
        if w_runs >= n {
            k = k.define(&format!("W_R{n}"), "");
        }
        if x_runs >= n {
            k = k.define(&format!("X_R{n}"), "");
        }
    }
    Ok(k)
}

/// The tiles the engine may pick, plus odd ones the tests use, for every type (the naga test
/// compiles each).
pub fn variants() -> Vec<Variant> {
    let shapes = [
        GemmConfig::TILE_128X128,
        GemmConfig::TILE_128X64,
        GemmConfig::TILE_64X64,
        GemmConfig::TILE_64X32,
        GemmConfig::TILE_64X64_BK16,
        GemmConfig::new(64, 32, 64, 4, 4),
        GemmConfig::new(64, 64, 64, 4, 4),
        GemmConfig::CPU,
        GemmConfig::new(128, 64, 32, 8, 4),
        GemmConfig::new(64, 128, 16, 4, 8),
        GemmConfig::new(16, 8, 8, 4, 4),
    ];
    let mut v = Vec::new();
    for (ty, _) in TYPES {
        for cfg in shapes {
            v.push(key(ty, cfg).expect("every listed type has a define").into());
        }
    }
    v
}

/// Prepare `Y[t, r] = sum_c W[r, c] * X[t, c]` for `n_tokens` tokens: one dispatch per part of
/// `w`, pushed onto `rec`.
///
/// - `x`: `(n_tokens, cols)` f32 from element `x_offset`
/// - `y`: `(n_tokens, y_stride)` f32 from element `y_offset`; `y_stride` defaults to `w.rows`.
///   Only the `w.rows` columns of each token's row are written.
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    rec: &mut Recorder,
    cfg: GemmConfig,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    x_offset: u64,
    y: &wgpu::Buffer,
    y_offset: u64,
    y_stride: Option<u64>,
    n_tokens: u32,
) -> Result<()> {
    prepare_strided(
        rec, cfg, w, x, x_offset, None, y, y_offset, y_stride, n_tokens,
    )
}

/// [`prepare`] with X's rows `x_stride` elements apart (default `w.cols`): the columns of a
/// wider activation.
#[allow(clippy::too_many_arguments)]
pub fn prepare_strided(
    rec: &mut Recorder,
    cfg: GemmConfig,
    w: &GpuTensor,
    x: &wgpu::Buffer,
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
    cfg.check(&rec.ctx.limits)?;
    let io = TiledIo {
        x,
        x_offset,
        x_stride,
        y,
        y_offset,
        y_stride,
        w_vec4: false,
        x_vec4: false,
    };
    prepare_tiled(rec, &key(w.ty, cfg)?, w, &io, n_tokens)
}

/// Where a tiled GEMM reads X and writes Y: `x` is `(n_tokens, x_stride)` f32 from element
/// `x_offset` (`x_stride` defaults to `w.cols`), `y` `(n_tokens, y_stride)` from `y_offset`
/// (`y_stride` defaults to `w.rows`).
pub(super) struct TiledIo<'a> {
    pub x: &'a wgpu::Buffer,
    pub x_offset: u64,
    pub x_stride: Option<u64>,
    pub y: &'a wgpu::Buffer,
    pub y_offset: u64,
    pub y_stride: Option<u64>,
    /// Whether the shader also reads W as vec4s (binding 4), and X (binding 5): `gemm_coop.wgsl`
    /// (W only for the types it reads so: Q4_K).
    pub w_vec4: bool,
    pub x_vec4: bool,
}

/// The dispatches of a tiled GEMM whose shader reads [`GemmParams`] and the bindings of
/// `gemm_decls.tmpl` (`gemm.wgsl`, `gemm_coop.wgsl`) on the pipeline of `key`, whose BM and BN
/// it reads back: one per part of `w`.
pub(super) fn prepare_tiled(
    rec: &mut Recorder,
    key: &PipelineKey,
    w: &GpuTensor,
    io: &TiledIo,
    n_tokens: u32,
) -> Result<()> {
    if n_tokens == 0 || w.rows == 0 {
        return Ok(());
    }
    let ctx = rec.ctx;
    let kind = key.entry;
    // The kernels step over K in u32 (`k0 += BK`): a row must end a step below its top.
    if w.cols > (u32::MAX - 64) as u64 {
        return Err(Error::invalid(format!(
            "{kind} {}: {} values a row is beyond the tiled kernels' u32 index",
            w.name, w.cols
        )));
    }
    let y_stride = io.y_stride.unwrap_or(w.rows);
    if y_stride < w.rows {
        return Err(Error::invalid(format!(
            "{kind} {}: y stride {y_stride} is below the {} rows",
            w.name, w.rows
        )));
    }
    let x_stride = io.x_stride.unwrap_or(w.cols);
    if x_stride < w.cols {
        return Err(Error::invalid(format!(
            "{kind} {}: x stride {x_stride} is below the {} cols",
            w.name, w.cols
        )));
    }
    let pipe: Arc<CachedPipeline> = ctx.pipeline(key)?;
    let (bm, bn) = (
        pipe.key.require_u32("BM")? as u64,
        pipe.key.require_u32("BN")? as u64,
    );
    let u32_of = |what: &str, v: u64| {
        u32::try_from(v).map_err(|_| {
            Error::invalid(format!(
                "{kind} {}: {what} = {v} does not fit in u32",
                w.name
            ))
        })
    };
    let token_tiles = (n_tokens as u64).div_ceil(bn);
    // The last element each binding is indexed at must fit the shader's u32 arithmetic.
    u32_of("x end", io.x_offset + n_tokens as u64 * x_stride)?;
    u32_of("y end", io.y_offset + n_tokens as u64 * y_stride)?;
    let x_vec4 = io.x_vec4
        && io.x_offset.is_multiple_of(4)
        && x_stride.is_multiple_of(4)
        && io.x.size().is_multiple_of(16);
    if io.x_vec4 && io.x.size() < 16 {
        return Err(Error::invalid(format!(
            "{kind} {}: X's buffer of {} bytes is below one vec4",
            w.name,
            io.x.size()
        )));
    }
    let label = pipe.key.label();
    for part in &w.parts {
        if part.rows == 0 {
            continue;
        }
        let groups = part.rows.div_ceil(bm) * token_tiles;
        let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
        let params = GemmParams {
            rows: u32_of("rows", part.rows)?,
            cols: u32_of("cols", w.cols)?,
            row_words: u32_of("row words", w.row_bytes / 4)?,
            n_tokens,
            x_offset: u32_of("x offset", io.x_offset)?,
            x_stride: u32_of("x stride", x_stride)?,
            y_offset: u32_of("y offset", io.y_offset + part.row_start)?,
            y_stride: u32_of("y stride", y_stride)?,
            token_tiles: u32_of("token tiles", token_tiles)?,
            x_vec4: x_vec4 as u32,
            pad1: 0,
            pad2: 0,
        };
        let ubuf = rec.uniform(&label, &params);
        let mut entries = vec![
            buffer_entry(0, &ubuf),
            buffer_entry(1, &part.buffer),
            buffer_entry(2, io.x),
            buffer_entry(3, io.y),
        ];
        if io.w_vec4 {
            entries.push(buffer_entry(4, &part.buffer));
        }
        if io.x_vec4 {
            entries.push(buffer_entry(5, io.x));
        }
        rec.push(kind, &pipe, &entries, grid);
    }
    Ok(())
}

/// [`prepare`] and record at once into a new compute pass of `enc` (one-off use, tests).
#[allow(clippy::too_many_arguments)]
pub fn encode(
    ctx: &GpuContext,
    enc: &mut wgpu::CommandEncoder,
    cfg: GemmConfig,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    x_offset: u64,
    y: &wgpu::Buffer,
    y_offset: u64,
    y_stride: Option<u64>,
    n_tokens: u32,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare(
        &mut rec, cfg, w, x, x_offset, y, y_offset, y_stride, n_tokens,
    )?;
    rec.encode(enc)
}

/// Milliseconds from an arbitrary origin, on both targets.
fn now_ms() -> f64 {
    #[cfg(target_arch = "wasm32")]
    {
        js_sys::Date::now()
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        use std::sync::OnceLock;
        static T0: OnceLock<std::time::Instant> = OnceLock::new();
        T0.get_or_init(std::time::Instant::now)
            .elapsed()
            .as_secs_f64()
            * 1e3
    }
}

/// A kernel to benchmark: the tiled GEMM with a tile, the 8-bit GEMM ([`super::gemm_q8`]) with
/// a tile (X quantized once before the timed products, as the down projection gets it from the
/// GLU), or matmul's register kernel with a shape.
#[derive(Clone, Copy, Debug)]
pub enum Kernel {
    Tiled(GemmConfig),
    Int8(GemmConfig),
    Registers(MatmulConfig),
}

/// Tiled GEMM throughput on synthetic weights of `ty` (`rows x cols`) and `n_tokens` tokens, in
/// GFLOP/s (`2 * rows * cols * n_tokens` per product), with the tile [`GemmConfig::for_shape`]
/// picks.
pub async fn bench_gemm(
    ctx: &GpuContext,
    ty: GgmlType,
    rows: u64,
    cols: u64,
    n_tokens: u32,
    iters: u32,
) -> Result<f64> {
    bench_kernel(
        ctx,
        Kernel::Tiled(GemmConfig::for_shape(ctx, rows, n_tokens)),
        ty,
        rows,
        cols,
        n_tokens,
        iters,
    )
    .await
}

/// [`bench_gemm`] for any kernel: `iters` products recorded into one compute pass after one
/// warm-up, timed to the end of a 4-byte readback.
#[allow(clippy::too_many_arguments)]
pub async fn bench_kernel(
    ctx: &GpuContext,
    kernel: Kernel,
    ty: GgmlType,
    rows: u64,
    cols: u64,
    n_tokens: u32,
    iters: u32,
) -> Result<f64> {
    let bytes = crate::quant::gpu::synthetic_rows(ty, cols, rows, 1);
    let w = crate::quant::gpu::upload_tensor(
        ctx,
        "bench weight",
        ty,
        cols,
        rows,
        &bytes,
        ctx.limits.max_binding(),
    )?;
    drop(bytes);
    let xs: Vec<f32> = (0..cols * n_tokens as u64)
        .map(|i| ((i % 17) as f32 - 8.0) / 8.0)
        .collect();
    let x = ctx.storage_buffer("bench x", bytemuck::cast_slice(&xs));
    let y = ctx.empty_storage("bench y", rows * n_tokens as u64 * 4)?;
    let iters = iters.max(1);
    let xq = match kernel {
        Kernel::Int8(_) => {
            let xq =
                ctx.empty_storage("bench xq", super::quantize_x8::bytes(n_tokens as u64, cols))?;
            let mut rec = Recorder::new(ctx);
            let style = super::quantize_x8::Style::for_type(ty);
            super::quantize_x8::prepare(&mut rec, style, &x, 0, cols, &xq, n_tokens, cols as u32)?;
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            rec.encode(&mut enc)?;
            ctx.submit([enc.finish()]);
            Some(xq)
        }
        _ => None,
    };
    let prepared = match kernel {
        Kernel::Tiled(cfg) => {
            let mut rec = Recorder::new(ctx);
            prepare(&mut rec, cfg, &w, &x, 0, &y, 0, None, n_tokens)?;
            Some(rec.finish())
        }
        Kernel::Int8(cfg) => {
            let mut rec = Recorder::new(ctx);
            let xq = xq.as_ref().expect("quantized above");
            super::gemm_q8::prepare(&mut rec, cfg, &w, xq, 0, None, &y, 0, None, n_tokens)?;
            Some(rec.finish())
        }
        Kernel::Registers(_) => None,
    };
    let run = |n: u32| -> Result<()> {
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("bench gemm"),
            });
        match (&prepared, kernel) {
            (Some(p), _) => {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: None,
                });
                for _ in 0..n {
                    p.record(&mut pass);
                }
            }
            (None, Kernel::Registers(cfg)) => {
                for _ in 0..n {
                    matmul::matmul(ctx, &mut enc, cfg, &w, &x, 0, &y, 0, n_tokens)?;
                }
            }
            (None, _) => unreachable!("a tiled kernel is always prepared"),
        }
        ctx.submit([enc.finish()]);
        Ok(())
    };
    run(1)?;
    crate::gpu::read_buffer(ctx, &y, 0, 4).await?;
    let t0 = now_ms();
    run(iters)?;
    crate::gpu::read_buffer(ctx, &y, 0, 4).await?;
    let secs = (now_ms() - t0) / 1e3;
    Ok(2.0 * rows as f64 * cols as f64 * n_tokens as f64 * iters as f64 / secs / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn webgpu_min() -> GpuLimits {
        GpuLimits {
            max_storage_buffer_binding_size: 128 << 20,
            max_buffer_size: 256 << 20,
            max_compute_workgroups_per_dimension: 65535,
            max_compute_invocations_per_workgroup: 256,
            max_compute_workgroup_size_x: 256,
            max_compute_workgroup_storage_size: 16 << 10,
            max_storage_buffers_per_shader_stage: 8,
            min_storage_buffer_offset_alignment: 256,
            max_uniform_buffer_binding_size: 64 << 10,
        }
    }

    #[test]
    fn standard_tiles_fit_their_limits() {
        let min = webgpu_min();
        for c in GemmConfig::GPU_TILES
            .into_iter()
            .chain([GemmConfig::TILE_64X64_BK16, GemmConfig::CPU])
        {
            assert!(
                c.check(&min).is_ok(),
                "{c} must fit WebGPU's minimum limits"
            );
        }
        assert_eq!(GemmConfig::TILE_128X128.workgroup_size(), 256);
        assert_eq!(GemmConfig::TILE_128X128.storage_bytes(), 16 << 10);
        let downlevel = GpuLimits {
            max_compute_workgroup_storage_size: 8 << 10,
            ..min
        };
        assert!(GemmConfig::TILE_64X64_BK16.check(&downlevel).is_ok());
        assert!(GemmConfig::TILE_64X64.check(&downlevel).is_err());
    }

    #[test]
    fn bad_tiles_are_refused() {
        let min = webgpu_min();
        for c in [
            GemmConfig::new(64, 64, 32, 2, 4),  // tm not 4 or 8
            GemmConfig::new(60, 64, 32, 8, 4),  // bm not a multiple of tm
            GemmConfig::new(64, 64, 12, 4, 4),  // bk not a multiple of 8
            GemmConfig::new(128, 128, 8, 4, 4), // 1024 threads
        ] {
            assert!(c.check(&min).is_err(), "{c:?} was accepted");
        }
    }

    #[test]
    fn key_carries_the_tile() {
        let k = key(GgmlType::Q4K, GemmConfig::TILE_128X64).unwrap();
        assert_eq!(k.decisions().workgroup_size, 256);
        assert_eq!(k.define_u32("BM").unwrap(), 128);
        assert_eq!(k.define_u32("BN").unwrap(), 64);
        assert!(k.defines.iter().any(|(d, _)| d == "TM8"));
        assert!(!k.defines.iter().any(|(d, _)| d == "TN8"));
        assert!(key(GgmlType::Q2K, GemmConfig::TILE_128X64).is_err());
    }

    #[test]
    fn tile_text_round_trips() {
        for c in [
            GemmConfig::TILE_128X128,
            GemmConfig::TILE_64X64,
            GemmConfig::new(16, 8, 8, 4, 4),
            GemmConfig::CPU,
        ] {
            assert_eq!(c.to_string().parse::<GemmConfig>().unwrap(), c);
        }
        assert_eq!(GemmConfig::CPU.to_string(), "32x32x32:4x4/np");
        assert_eq!(
            "128x64x16:8x4".parse::<GemmConfig>().unwrap(),
            GemmConfig::TILE_128X64
        );
        for bad in ["128x64:8x4", "128x64x32", "axbxc:dxe", "1x2x3:4x5x6"] {
            assert!(bad.parse::<GemmConfig>().is_err(), "{bad} parsed");
        }
    }
}
