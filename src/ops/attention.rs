//! `attention`: causal (optionally sliding-window, soft-capped) attention of a batch of query
//! tokens over one layer's f32 KV cache, for decode and prefill alike (see
//! `shaders/attention.wgsl`).
//!
//! Token `t` sits at position (== cell) `pos0 + t` and attends to cells `c <= pos0 + t`, and with
//! `window > 0` only to `c > pos0 + t - window`: llama.cpp's `is_masked_swa` for
//! `LLAMA_SWA_TYPE_STANDARD` masks a cell when `pos_token - pos_cell >= n_swa` (Gemma 3's local
//! layers, window 512). Head `h` reads kv head `h / (n_head / n_kv_head)`. Logits are
//! `scale * q.k`, then `softcap * tanh(logit / softcap)` when `softcap > 0` (ggml's flash-attention
//! order: scale first, then the cap).
//!
//! The kernel shape is a decision ([`AttentionConfig`]) recorded in the pipeline key: a
//! thread-per-(token, head) variant with no barrier (for CPU-emulated adapters) or a
//! workgroup-per-(token, head) variant that splits cells and head dims across threads (for real
//! GPUs). Both are tested on every shape.

use std::mem::offset_of;

use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gpu::{buffer_entry, grid_2d, GpuContext, PipelineKey, Recorder};

pub const SHADER: &str = "attention.wgsl";
pub const ENTRY: &str = "attention";

/// The largest head_dim the kernel holds (its query/accumulator arrays are sized for it; the
/// shader gets `HD2_MAX` = this / 2 vec2 slots from [`key`]).
pub const MAX_HEAD_DIM: u32 = 256;

/// Cells the simple (barrier-free) shape scores per chunk into its private array before it
/// rescales its running sums: the shader's `SCHUNK`, defined from here by [`key`].
pub const SCHUNK: u32 = 64;

/// Workgroup memory of the cooperative shape with `wg` threads, in bytes: per thread one f32 in
/// each of `sc`, `pw` and `lpart` and one vec2 in `part` (5 words), plus the query `qv`
/// (`MAX_HEAD_DIM` f32). `tests/shaders.rs` checks it against the compiled shader's
/// workgroup variables.
pub const fn coop_workgroup_bytes(wg: u32) -> u32 {
    coop_group_workgroup_bytes(wg, 1)
}

/// [`coop_workgroup_bytes`] for `group` heads a workgroup (every array per head).
pub const fn coop_group_workgroup_bytes(wg: u32, group: u32) -> u32 {
    (wg * 5 + MAX_HEAD_DIM) * 4 * group
}

/// Uniform of `attention.wgsl`, and the whole description of one attention call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct AttentionParams {
    /// Query tokens (1 for decode).
    pub n_tokens: u32,
    pub n_head: u32,
    /// KV heads; divides `n_head`.
    pub n_kv_head: u32,
    /// Even, at most [`MAX_HEAD_DIM`].
    pub head_dim: u32,
    /// Position (== KV cell) of token 0; the cache holds cells `0 ..= pos0 + n_tokens - 1`.
    pub pos0: u32,
    /// Sliding window in cells (0: attend to every earlier cell).
    pub window: u32,
    /// Multiplies `q . k` (1 when Q is already scaled).
    pub scale: f32,
    /// Logit soft cap (0: off).
    pub softcap: f32,
    /// Element index of `Q[0, 0, 0]` in the `q` buffer (even).
    pub q_offset: u32,
    /// Element index of `out[0, 0, 0]` in the `out` buffer (even).
    pub out_offset: u32,
    pub pad0: u32,
    pub pad1: u32,
}

impl WgslParams for AttentionParams {
    const WGSL_NAME: &'static str = "AttentionParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_tokens", offset_of!(AttentionParams, n_tokens)),
        ("n_head", offset_of!(AttentionParams, n_head)),
        ("n_kv_head", offset_of!(AttentionParams, n_kv_head)),
        ("head_dim", offset_of!(AttentionParams, head_dim)),
        ("pos0", offset_of!(AttentionParams, pos0)),
        ("window", offset_of!(AttentionParams, window)),
        ("scale", offset_of!(AttentionParams, scale)),
        ("softcap", offset_of!(AttentionParams, softcap)),
        ("q_offset", offset_of!(AttentionParams, q_offset)),
        ("out_offset", offset_of!(AttentionParams, out_offset)),
        ("pad0", offset_of!(AttentionParams, pad0)),
        ("pad1", offset_of!(AttentionParams, pad1)),
    ];
}

impl AttentionParams {
    /// Q and out from element 0 of their buffers.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        n_tokens: u32,
        n_head: u32,
        n_kv_head: u32,
        head_dim: u32,
        pos0: u32,
        window: u32,
        scale: f32,
        softcap: f32,
    ) -> Self {
        AttentionParams {
            n_tokens,
            n_head,
            n_kv_head,
            head_dim,
            pos0,
            window,
            scale,
            softcap,
            ..Default::default()
        }
    }

    /// Cells the cache must hold: every position up to the last token's.
    pub fn n_cells(&self) -> u64 {
        self.pos0 as u64 + self.n_tokens as u64
    }

    /// The cells `[lo, hi)` token `t` attends to.
    pub fn cell_range(&self, t: u32) -> (u32, u32) {
        let pos = self.pos0 + t;
        let lo = if self.window > 0 && pos + 1 > self.window {
            pos + 1 - self.window
        } else {
            0
        };
        (lo, pos + 1)
    }

    /// Shape checks shared by [`encode`] and [`reference`].
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::invalid(format!("attention: {m}")));
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) || self.head_dim > MAX_HEAD_DIM {
            return bad(format!(
                "head_dim {} must be even and at most {MAX_HEAD_DIM}",
                self.head_dim
            ));
        }
        if self.n_head == 0 || self.n_kv_head == 0 || !self.n_head.is_multiple_of(self.n_kv_head) {
            return bad(format!(
                "n_head {} must be a positive multiple of n_kv_head {}",
                self.n_head, self.n_kv_head
            ));
        }
        if !self.q_offset.is_multiple_of(2) || !self.out_offset.is_multiple_of(2) {
            return bad(format!(
                "q_offset {} and out_offset {} must be even",
                self.q_offset, self.out_offset
            ));
        }
        if !(self.scale.is_finite() && self.softcap.is_finite() && self.softcap >= 0.0) {
            return bad(format!(
                "scale {} and softcap {} must be finite, softcap >= 0",
                self.scale, self.softcap
            ));
        }
        let big = self.n_cells() * self.n_kv_head as u64 * self.head_dim as u64;
        let rows = self.n_tokens as u64 * self.n_head as u64 * self.head_dim as u64;
        if big > u32::MAX as u64
            || rows + self.q_offset.max(self.out_offset) as u64 > u32::MAX as u64
        {
            return bad("sizes beyond u32 indexing".into());
        }
        Ok(())
    }
}

/// The kernel shape: workgroup size and whether a workgroup cooperates on one (token, head).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionConfig {
    pub workgroup_size: u32,
    /// One workgroup per (token, head), two barriers per chunk of `workgroup_size` cells;
    /// otherwise one invocation per (token, head) and no barrier.
    pub cooperative: bool,
    /// For batches of 2 tokens or more: one workgroup per block of `(queries, cells)` =
    /// `(BQ, BC)` (`TILED`: K and V rows read once per block, not once per query), where the
    /// workgroup memory allows ([`AttentionConfig::fit`]); otherwise the shape above.
    pub tile: Option<(u32, u32)>,
    /// Cooperative shape: heads a workgroup takes that share a kv head (`GQ`), the most that
    /// divides the group and fits ([`AttentionConfig::fit`]); each K and V row read serves them
    /// all.
    pub group: u32,
}

/// Workgroup memory of the tiled shape for blocks of `bq` queries and `bc` cells of `hd2` vec2:
/// the queries, the K/V tile (rows padded by one vec2) and the scores.
pub const fn tiled_workgroup_bytes(bq: u32, bc: u32, hd2: u32) -> u32 {
    (bq * hd2 + bc * (hd2 + 1)) * 8 + bq * bc * 4
}

/// The tiles [`AttentionConfig::fit`] tries, largest first: 16 or 8 queries (4 at the least) by
/// 16 cells, 8 cells where 16 do not fit. Gemma 3's head_dim 256 takes (8, 16) within 32 KiB.
pub const TILES: [(u32, u32); 5] = [(16, 16), (8, 16), (4, 16), (8, 8), (4, 8)];

impl AttentionConfig {
    /// Thread per (token, head), no barrier: the shape for CPU-emulated adapters.
    pub const fn simple() -> Self {
        AttentionConfig {
            workgroup_size: 64,
            cooperative: false,
            tile: None,
            group: 1,
        }
    }

    /// Blocks of `bq` queries by `bc` cells for batches ([`AttentionConfig::tile`]); one token
    /// gets the cooperative shape.
    pub const fn tiled(bq: u32, bc: u32) -> Self {
        AttentionConfig {
            workgroup_size: 256,
            cooperative: true,
            tile: Some((bq, bc)),
            group: 1,
        }
    }

    /// Workgroup per (token, head); needs `workgroup_size >= head_dim / 2`.
    pub const fn cooperative(workgroup_size: u32) -> Self {
        AttentionConfig {
            workgroup_size,
            cooperative: true,
            tile: None,
            group: 1,
        }
    }

    /// Cooperative, `group` heads of one kv head a workgroup (at most; see [`Self::group`]).
    pub const fn grouped(workgroup_size: u32, group: u32) -> Self {
        AttentionConfig {
            group,
            ..Self::cooperative(workgroup_size)
        }
    }

    /// The shape for this device: simple on a CPU adapter, cooperative with 256 threads elsewhere.
    ///
    /// Measured (tests/attention.rs timing log, submit to readback, pipelines warm), simple /
    /// coop128 / coop256 on SwiftShader in Chrome: decode of 4 heads over 700 cells 14 / 13 /
    /// 10 ms; prefill of 33 tokens x 4 heads over ~500 cells (head_dim 256) 139 / 203 / 328 ms;
    /// 70400 (token, head) pairs of one cell 62 ms / 34 s / 107 s. A cooperative workgroup costs
    /// SwiftShader about 0.5-1.5 ms in barriers and scheduling, so CPU adapters get the simple
    /// shape. In the browser wgpu cannot tell SwiftShader from a GPU (blank adapter info, as for
    /// the matmul), so it gets the cooperative shape: right for real GPUs, slower on SwiftShader.
    /// Not yet measured on a real GPU.
    ///
    /// On a GPU the cooperative shape takes up to 4 heads of a kv head a workgroup: on an H200 a
    /// Gemma 3 270M prefill of 512 tokens at depth 4000 (4 heads on 1 kv head) spent 18.3 of its
    /// 33 ms in attention with one head a workgroup, reading every K and V row 4 times per token.
    /// The tiled shape (blocks of queries) measured slower there: 16,195 -> 9,809 tok/s at depth
    /// 4000 (256 workgroups of 128 threads walking their tiles one barrier phase at a time,
    /// nothing overlapping the loads), so it is not the default.
    ///
    /// Native builds read `CERA_ATTN_TILE=BQ,BC` (or `off`) instead when it is set, so that
    /// `cera bench` can compare tiles on a GPU without a rebuild.
    pub fn for_device(ctx: &GpuContext) -> Self {
        if super::matmul::is_cpu_adapter(ctx) {
            return Self::simple();
        }
        if let Some(v) = crate::gpu::knob::knob("CERA_ATTN_TILE") {
            let t: Vec<u32> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
            match t[..] {
                [bq, bc] => return Self::tiled(bq, bc),
                _ if v == "off" => return Self::cooperative(256),
                _ => eprintln!("CERA_ATTN_TILE={v:?} is not BQ,BC or off; using the default"),
            }
        }
        Self::grouped(256, 4)
    }

    /// Clamp to the device and the call: a cooperative workgroup is a power of two within the
    /// limits and at least `head_dim / 2` (one thread per vec2 of V), else the simple shape; the
    /// simple shape is kept to cell ranges of at most [`SIMPLE_MAX_ITERATIONS`] loop iterations per
    /// invocation, else the cooperative one (lavapipe's loop limiter: `shaders/attention.wgsl`,
    /// LOOP_NOTE).
    pub fn fit(self, ctx: &GpuContext, p: &AttentionParams) -> Self {
        // The tiled shape: the first tile from the one asked for down that divides the head's
        // vec2 dims and fits the workgroup memory and invocations.
        if let (Some((bq, bc)), true) = (self.tile, p.n_tokens > 1) {
            let hd2 = p.head_dim / 2;
            let fits = |&(q, c): &(u32, u32)| {
                q <= bq
                    && c <= bc
                    && hd2.is_multiple_of(c)
                    && hd2.is_multiple_of(q)
                    && q * c <= ctx.limits.workgroup_size(q * c)
                    && tiled_workgroup_bytes(q, c, hd2)
                        <= ctx.limits.max_compute_workgroup_storage_size
            };
            if let Some(&(q, c)) = TILES.iter().find(|t| fits(t)) {
                return AttentionConfig {
                    workgroup_size: q * c,
                    cooperative: true,
                    tile: Some((q, c)),
                    group: 1,
                };
            }
        }
        let this = AttentionConfig { tile: None, ..self };
        let mut fitted = this.fit_untiled(ctx, p);
        // Heads a cooperative workgroup takes: a power of two at most `group`, dividing the
        // heads per kv head, within the workgroup memory.
        if fitted.cooperative {
            let per_kv = p.n_head / p.n_kv_head.max(1);
            let mut g = self.group.max(1).next_power_of_two();
            while g > 1
                && (!per_kv.is_multiple_of(g)
                    || coop_group_workgroup_bytes(fitted.workgroup_size, g)
                        > ctx.limits.max_compute_workgroup_storage_size)
            {
                g /= 2;
            }
            fitted.group = g;
        }
        fitted
    }

    fn fit_untiled(self, ctx: &GpuContext, p: &AttentionParams) -> Self {
        let pow2 = |n: u32| 1u32 << (31 - ctx.limits.workgroup_size(n).leading_zeros());
        // A cooperative shape needs WG >= head_dim / 2 and its workgroup memory.
        let coop_fits = |wg: u32| {
            wg >= p.head_dim / 2
                && coop_workgroup_bytes(wg) <= ctx.limits.max_compute_workgroup_storage_size
        };
        let simple = AttentionConfig {
            workgroup_size: ctx.limits.workgroup_size(if self.cooperative {
                64
            } else {
                self.workgroup_size
            }),
            cooperative: false,
            tile: None,
            group: 1,
        };
        let coop = AttentionConfig {
            workgroup_size: pow2(if self.cooperative {
                self.workgroup_size
            } else {
                256
            }),
            cooperative: true,
            tile: None,
            group: 1,
        };
        let simple_ok = simple_iterations(p) <= SIMPLE_MAX_ITERATIONS;
        if coop_fits(coop.workgroup_size) && (self.cooperative || !simple_ok) {
            coop
        } else {
            simple
        }
    }
}

/// Loop iterations one invocation of the simple shape may run (lavapipe stops every loop of an
/// invocation after 65535 in total; kept below with a margin).
pub const SIMPLE_MAX_ITERATIONS: u64 = 60_000;

/// Loop iterations of the simple shape's longest (token, head): per cell, the unrolled score and
/// V loops (`ceil(head_dim / 8)` each) and the two cell loops; per [`SCHUNK`]-cell chunk the
/// rescale.
pub fn simple_iterations(p: &AttentionParams) -> u64 {
    let hd2 = p.head_dim as u64 / 2;
    let cells = if p.window > 0 {
        p.n_cells().min(p.window as u64)
    } else {
        p.n_cells()
    };
    let per_cell = 2 * (hd2 / 4 + hd2 % 4) + 2;
    cells * per_cell + cells.div_ceil(SCHUNK as u64) * hd2 + 2 * hd2
}

/// The pipeline key of a fitted shape; `head_dim` sizes the tiled shape's arrays and the
/// cooperative shape's loops (`HD2`).
pub fn key(cfg: AttentionConfig, head_dim: u32) -> PipelineKey {
    // Trusted (docs/dispatch.md, "Trusted kernels").
    let k = PipelineKey::new(SHADER, ENTRY)
        .trusted()
        .workgroup_size(cfg.workgroup_size)
        .define("HD2_MAX", format!("{}u", MAX_HEAD_DIM / 2))
        .define("SCHUNK", format!("{SCHUNK}u"));
    if let Some((bq, bc)) = cfg.tile {
        return k
            .define("TILED", "")
            .define("BQ", format!("{bq}u"))
            .define("BC", format!("{bc}u"))
            .define("HD2", format!("{}u", head_dim / 2));
    }
    if cfg.cooperative {
        k.define("COOP", "")
            .define("GQ", format!("{}u", cfg.group.max(1)))
            .define("HD2", format!("{}u", head_dim / 2))
    } else {
        k
    }
}

/// The shapes the engine may pick (the naga test compiles each).
pub fn variants() -> Vec<Variant> {
    [
        (AttentionConfig::simple(), 128),
        (AttentionConfig::cooperative(128), 128),
        (AttentionConfig::cooperative(256), 128),
        (AttentionConfig::grouped(256, 4), 128),
        (AttentionConfig::grouped(128, 2), 128),
        (
            AttentionConfig {
                workgroup_size: 128,
                ..AttentionConfig::tiled(8, 16)
            },
            256,
        ),
        (
            AttentionConfig {
                workgroup_size: 256,
                ..AttentionConfig::tiled(16, 16)
            },
            128,
        ),
        (
            AttentionConfig {
                workgroup_size: 32,
                ..AttentionConfig::tiled(4, 8)
            },
            80,
        ),
    ]
    .iter()
    .map(|&(c, hd)| key(c, hd).into())
    .collect()
}

/// Attention in the device's shape ([`AttentionConfig::for_device`]).
///
/// - `q`: `(n_tokens, n_head, head_dim)` f32 from element `p.q_offset`
/// - `k_cache`, `v_cache`: `(n_ctx, n_kv_head, head_dim)` f32, cells `0 .. pos0 + n_tokens` filled
/// - `out`: `(n_tokens, n_head, head_dim)` f32 from element `p.out_offset` (a buffer other than `q`)
pub fn encode(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    p: &AttentionParams,
    q: &wgpu::Buffer,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    out: &wgpu::Buffer,
) -> Result<()> {
    encode_with(
        ctx,
        encoder,
        AttentionConfig::for_device(ctx),
        p,
        q,
        k_cache,
        v_cache,
        out,
    )
}

/// [`encode`] with an explicit shape (tests run every shape on every adapter).
#[allow(clippy::too_many_arguments)]
pub fn encode_with(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    cfg: AttentionConfig,
    p: &AttentionParams,
    q: &wgpu::Buffer,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    out: &wgpu::Buffer,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare(
        &mut rec,
        cfg,
        p,
        q,
        k_cache,
        v_cache,
        out,
        ctx.zero_step(),
        p.n_cells(),
    )?;
    rec.encode(encoder)
}

/// Prepare [`encode_with`]. Token `t` sits at position `step.pos0 + p.pos0 + t`, with `step` a
/// [`crate::gpu::Step`] buffer read when the dispatch runs; `max_cells` bounds the cells any run
/// will attend to (the kernel shape is fitted to it, and the caches must hold it).
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    rec: &mut Recorder,
    cfg: AttentionConfig,
    p: &AttentionParams,
    q: &wgpu::Buffer,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    out: &wgpu::Buffer,
    step: &wgpu::Buffer,
    max_cells: u64,
) -> Result<()> {
    let ctx = rec.ctx;
    p.validate()?;
    if p.n_tokens == 0 {
        return Ok(());
    }
    if q == out {
        return Err(Error::invalid(
            "attention: out must be a buffer other than q",
        ));
    }
    let rows = p.n_tokens as u64 * p.n_head as u64 * p.head_dim as u64 * 4;
    let max_cells = max_cells.max(p.n_cells());
    let cache = max_cells * p.n_kv_head as u64 * p.head_dim as u64 * 4;
    let short = |what: &str, have: u64, need: u64| {
        Error::invalid(format!(
            "attention: {what} holds {have} bytes, {need} are needed (pos0 {}, {} tokens)",
            p.pos0, p.n_tokens
        ))
    };
    for (what, buf, need) in [
        ("q", q, rows + p.q_offset as u64 * 4),
        ("out", out, rows + p.out_offset as u64 * 4),
        ("k_cache", k_cache, cache),
        ("v_cache", v_cache, cache),
    ] {
        if buf.size() < need {
            return Err(short(what, buf.size(), need));
        }
    }
    // Fit the shape to the longest range a run may walk (lavapipe's loop limit).
    let worst = AttentionParams {
        pos0: (max_cells - p.n_tokens as u64) as u32,
        ..*p
    };
    let cfg = cfg.fit(ctx, &worst);
    let pipe = ctx.pipeline(&key(cfg, p.head_dim))?;
    let wg = pipe.decisions.workgroup_size as u64;
    let coop = pipe.key.defines.iter().any(|(k, _)| k == "COOP");
    let pairs = p.n_tokens as u64 * p.n_head as u64;
    let groups = match cfg.tile {
        Some((bq, _)) => (p.n_tokens as u64).div_ceil(bq as u64) * p.n_head as u64,
        None if coop => pairs / cfg.group.max(1) as u64,
        None => pairs.div_ceil(wg),
    };
    let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
    let label = pipe.key.label();
    let ubuf = rec.uniform(&label, p);
    rec.push(
        "attention",
        &pipe,
        &[
            buffer_entry(0, &ubuf),
            buffer_entry(1, q),
            buffer_entry(2, k_cache),
            buffer_entry(3, v_cache),
            buffer_entry(4, out),
            buffer_entry(5, step),
        ],
        grid,
    );
    Ok(())
}

/// CPU reference in f64 (softmax with max subtraction over exactly the cells the mask allows).
///
/// - `q`: `(n_tokens, n_head, head_dim)` from element 0 (the GPU offsets are binding details)
/// - `k`, `v`: `(>= pos0 + n_tokens, n_kv_head, head_dim)`
///
/// Returns `(n_tokens, n_head, head_dim)`. Panics on shapes [`AttentionParams::validate`] rejects.
pub fn reference(p: &AttentionParams, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
    p.validate().expect("attention reference: invalid params");
    let (nh, nkv, hd) = (p.n_head as usize, p.n_kv_head as usize, p.head_dim as usize);
    let group = nh / nkv;
    let mut out = vec![0f32; p.n_tokens as usize * nh * hd];
    let mut scores = Vec::new();
    for t in 0..p.n_tokens {
        let (lo, hi) = p.cell_range(t);
        for h in 0..nh {
            let kvh = h / group;
            let qrow = &q[(t as usize * nh + h) * hd..][..hd];
            scores.clear();
            for c in lo..hi {
                let krow = &k[(c as usize * nkv + kvh) * hd..][..hd];
                let mut s = qrow
                    .iter()
                    .zip(krow)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
                    * p.scale as f64;
                if p.softcap > 0.0 {
                    let cap = p.softcap as f64;
                    s = cap * (s / cap).tanh();
                }
                scores.push(s);
            }
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let mut sum = 0f64;
            let mut acc = vec![0f64; hd];
            for (i, c) in (lo..hi).enumerate() {
                let w = (scores[i] - m).exp();
                sum += w;
                let vrow = &v[(c as usize * nkv + kvh) * hd..][..hd];
                for (a, &x) in acc.iter_mut().zip(vrow) {
                    *a += w * x as f64;
                }
            }
            let o = &mut out[(t as usize * nh + h) * hd..][..hd];
            for (d, a) in o.iter_mut().zip(&acc) {
                *d = (a / sum) as f32;
            }
        }
    }
    out
}
