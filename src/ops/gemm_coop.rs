//! `gemm_coop`: the tiled matrix product for prefill on cooperative matrices (tensor cores),
//! `Y[t, r] = sum_c W[r, c] X[t, c]`, where the device offers them (natively: wgpu's
//! experimental cooperative matrices, 16 x 16 x 16 fragments of f16 into f32 on subgroups of
//! 32; [`available`]). See `shaders/gemm_coop.wgsl`.
//!
//! It reads every weight type [`super::gemm`] reads, with the same decoders and the same
//! uniform ([`GemmParams`]) and bindings, so it is a drop-in for the f32 tile; W's decoded
//! values and X are rounded to f16 for the products, which accumulate in f32.

use super::gemm::{self, TiledIo};
use super::matmul::TYPES;
use super::Variant;
use crate::error::{Error, ErrorCode, Result};
use crate::gguf::GgmlType;
use crate::gpu::{GpuContext, GpuLimits, GpuTensor, PipelineKey, Recorder};

pub const SHADER: &str = "gemm_coop.wgsl";
pub const ENTRY: &str = "gemm_coop";

/// Threads of a subgroup the kernel is written for.
pub const SUBGROUP: u32 = 32;

/// A tile: `sg_m x sg_n` subgroups, each computing `16 fm` rows x 32 tokens (`fm` x 2
/// fragments of 16 x 16), over steps of `bk` values of K.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopConfig {
    pub sg_m: u32,
    pub sg_n: u32,
    pub fm: u32,
    pub bk: u32,
}

impl CoopConfig {
    pub const fn new(sg_m: u32, sg_n: u32, fm: u32, bk: u32) -> Self {
        CoopConfig { sg_m, sg_n, fm, bk }
    }
    pub const fn bm(&self) -> u32 {
        16 * self.fm * self.sg_m
    }
    pub const fn bn(&self) -> u32 {
        32 * self.sg_n
    }
    pub const fn workgroup_size(&self) -> u32 {
        SUBGROUP * self.sg_m * self.sg_n
    }
    /// Runs of W (8 values) and of X (4 values) each thread loads per step.
    pub const fn runs_per_thread(&self) -> (u32, u32) {
        let wg = self.workgroup_size();
        (self.bm() * self.bk / 8 / wg, self.bn() * self.bk / 4 / wg)
    }
    /// Bytes of workgroup memory: both tiles in f16 with rows padded by 8 values, and one f32
    /// fragment per subgroup.
    pub const fn storage_bytes(&self) -> u32 {
        (self.bm() + self.bn()) * (self.bk + 8) * 2 + self.sg_m * self.sg_n * 256 * 4
    }

    /// Whether the shader can be built with this tile on a device with `limits`, and why not.
    pub fn check(&self, limits: &GpuLimits) -> Result<()> {
        let bad = |why: String| Err(Error::invalid(format!("gemm_coop tile {self}: {why}")));
        if !matches!(self.bk, 32 | 64) {
            return bad("a step is 32 or 64 values of K".into());
        }
        if !matches!(self.fm, 2 | 4) {
            return bad("a subgroup takes 2 or 4 fragments of 16 rows".into());
        }
        if self.sg_m == 0 || self.sg_n == 0 {
            return bad("at least one subgroup along rows and tokens".into());
        }
        let wg = self.workgroup_size();
        let (w_runs, x_runs) = self.runs_per_thread();
        if !(self.bm() * self.bk / 8).is_multiple_of(wg)
            || !(self.bn() * self.bk / 4).is_multiple_of(wg)
            || w_runs == 0
            || x_runs == 0
            || w_runs > 4
            || x_runs > 4
        {
            return bad(format!(
                "{wg} threads cannot share the tile's runs evenly (1 to 4 of each a thread)"
            ));
        }
        match limits.workgroup_misfit(wg, self.storage_bytes()) {
            Some(why) => bad(why),
            None => Ok(()),
        }
    }

    /// The tiles [`for_shape`] chooses among, largest first: 8 subgroups of 32 x 32 over 128
    /// rows, then smaller grids' tiles.
    pub const TILES: [CoopConfig; 3] = [
        CoopConfig::new(4, 2, 2, 32),
        CoopConfig::new(2, 2, 2, 32),
        CoopConfig::new(2, 1, 2, 64),
    ];

    /// Tiles the tests and the bench build besides [`CoopConfig::TILES`] (4 fragments a
    /// subgroup, 128 tokens): measured slower on an H100, kept buildable for sweeps. Every tile
    /// here fits the 32 KiB of workgroup memory the engine asks a device for (128 x 64 at 64
    /// values a step, or 128 x 128 with two fragments a subgroup, would need 36).
    pub const OTHER_TILES: [CoopConfig; 4] = [
        CoopConfig::new(2, 4, 4, 32),
        CoopConfig::new(2, 2, 4, 32),
        CoopConfig::new(2, 2, 4, 64),
        CoopConfig::new(2, 4, 2, 32),
    ];
}

impl std::fmt::Display for CoopConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}x{}:{}", self.bm(), self.bn(), self.bk, self.fm)
    }
}

impl std::str::FromStr for CoopConfig {
    type Err = Error;
    /// `BMxBNxBK:FM`: BM a multiple of 16 FM, BN of 32.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::invalid(format!(
                "gemm_coop tile \"{s}\": expected BMxBNxBK:FM, e.g. 128x64x32:4"
            ))
        };
        let (dims, fm) = s.split_once(':').ok_or_else(bad)?;
        let fm: u32 = fm.trim().parse().map_err(|_| bad())?;
        let v: Vec<u32> = dims
            .split('x')
            .map(|p| p.trim().parse::<u32>().map_err(|_| bad()))
            .collect::<Result<_>>()?;
        match v[..] {
            [bm, bn, bk] if fm > 0 && bm > 0 && bn > 0 && bm % (16 * fm) == 0 && bn % 32 == 0 => {
                Ok(CoopConfig::new(bm / (16 * fm), bn / 32, fm, bk))
            }
            _ => Err(bad()),
        }
    }
}

/// Whether this device runs the kernel (cooperative matrices of the kernel's shape).
pub fn available(ctx: &GpuContext) -> bool {
    ctx.coop_f16
}

/// Whether the product of `w` over a batch of `n` tokens runs here: the device has it, the
/// batch is one the tiled GEMMs take ([`gemm::use_gemm`]), the type is one they read, and the
/// first (128-row) tile fills the GPU ([`MIN_WORKGROUPS`]). Smaller products stay on the other
/// kernels (the 8-bit one where it reads the type), measured faster there on an H100 (256
/// tokens, tok/s): Gemma 3 270M 25,700 here against 27,900 on 8-bit X; Llama 3 8B Q4_K 1,856
/// here against 1,515.
pub fn wanted(ctx: &GpuContext, w: &GpuTensor, n: u32) -> bool {
    available(ctx)
        && n > 1
        && gemm::use_gemm(ctx, n)
        && TYPES.iter().any(|(t, _)| *t == w.ty)
        && CoopConfig::TILES[0].check(&ctx.limits).is_ok()
        && grid(&CoopConfig::TILES[0], w.rows, n) >= MIN_WORKGROUPS
}

/// The grid [`for_shape`] wants at least: about one workgroup of 8 subgroups per core of a big
/// GPU.
pub const MIN_WORKGROUPS: u64 = 128;

fn grid(c: &CoopConfig, rows: u64, n_tokens: u32) -> u64 {
    rows.div_ceil(c.bm() as u64) * (n_tokens as u64).div_ceil(c.bn() as u64)
}

/// The tile for `rows` weight rows and `n_tokens` tokens: the first of [`CoopConfig::TILES`]
/// that builds here and whose grid has [`MIN_WORKGROUPS`] workgroups, else the one with the
/// most. `CERA_GEMM_COOP_TILE=BMxBNxBK:FM` natively forces one (a bench knob). Measured on an
/// H100, Llama 3 8B Q4_K prefill of 256 tokens with every product on one tile (tok/s):
/// 128x64x32:2 1,856; 64x32x64:2 1,572; 128x64x64:4 1,576; 64x64x32:2 1,467; 128x128x32:4
/// 1,497; 128x64x32:4 1,303 (the 8-bit kernel: 1,515).
pub fn for_shape(ctx: &GpuContext, rows: u64, n_tokens: u32) -> CoopConfig {
    if let Some(t) = crate::gpu::knob::knob("CERA_GEMM_COOP_TILE") {
        if let Ok(c) = t.parse::<CoopConfig>() {
            if c.check(&ctx.limits).is_ok() {
                return c;
            }
        }
    }
    let fits: Vec<CoopConfig> = CoopConfig::TILES
        .into_iter()
        .filter(|c| c.check(&ctx.limits).is_ok())
        .collect();
    fits.iter()
        .find(|c| grid(c, rows, n_tokens) >= MIN_WORKGROUPS)
        .or_else(|| fits.iter().max_by_key(|c| grid(c, rows, n_tokens)))
        .copied()
        .unwrap_or(CoopConfig::new(2, 2, 2, 32))
}

/// The pipeline key of a type and tile.
pub fn key(ty: GgmlType, cfg: CoopConfig) -> Result<PipelineKey> {
    let (w_runs, x_runs) = cfg.runs_per_thread();
    // Trusted (docs/dispatch.md, "Trusted kernels").
    let k = PipelineKey::new(SHADER, ENTRY)
        .trusted()
        .define(gemm::type_define(ty)?, "")
        .workgroup_size(cfg.workgroup_size())
        .define("BM", format!("{}u", cfg.bm()))
        .define("BN", format!("{}u", cfg.bn()))
        .define("BK", format!("{}u", cfg.bk))
        .define("SG_M", format!("{}u", cfg.sg_m))
        .define("SG_N", format!("{}u", cfg.sg_n))
        .define("FM", format!("{}u", cfg.fm))
        .define("W_RUNS", format!("{w_runs}u"))
        .define("X_RUNS", format!("{x_runs}u"));
    let k = if cfg.fm == 4 { k.define("FM4", "") } else { k };
    // Q4_K and Q8_0 decode without integer-to-float conversions (the shader's FAST_W).
    Ok(if matches!(ty, GgmlType::Q4K | GgmlType::Q8_0) {
        k.define("FAST_W", "")
    } else {
        k
    })
}

/// The tiles the engine may pick and the tests use, for every type (the naga test validates
/// each; they are built only on devices that have the feature).
pub fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for (ty, _) in TYPES {
        for cfg in CoopConfig::TILES.into_iter().chain(CoopConfig::OTHER_TILES) {
            v.push(key(ty, cfg).expect("every listed type has a define").into());
        }
    }
    v
}

/// Prepare `Y[t, r] = sum_c W[r, c] * X[t, c]` for `n_tokens` tokens, as
/// [`gemm::prepare_strided`]: one dispatch per part of `w`. Fails on a device without the
/// feature ([`available`]).
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    rec: &mut Recorder,
    cfg: CoopConfig,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    x_offset: u64,
    x_stride: Option<u64>,
    y: &wgpu::Buffer,
    y_offset: u64,
    y_stride: Option<u64>,
    n_tokens: u32,
) -> Result<()> {
    if !available(rec.ctx) {
        return Err(Error::new(
            ErrorCode::AdapterTooSmall,
            format!(
                "gemm_coop {}: adapter \"{}\" has no cooperative matrices of 16 x 16 f16 on subgroups of 32",
                w.name, rec.ctx.adapter.name
            ),
        ));
    }
    cfg.check(&rec.ctx.limits)?;
    let io = TiledIo {
        x,
        x_offset,
        x_stride,
        y,
        y_offset,
        y_stride,
        w_vec4: w.ty == GgmlType::Q4K,
        x_vec4: true,
    };
    gemm::prepare_tiled(rec, &key(w.ty, cfg)?, w, &io, n_tokens)
}
