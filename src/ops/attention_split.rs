//! `attention_split`: flash-decoding, the same attention as [`super::attention`] split over
//! chunks of the KV cache (see `shaders/attention_split.wgsl`).
//!
//! Decode has one query token and few heads (Gemma 3 270M: 4), so one workgroup per (token,
//! head) launches 4 workgroups that each walk the whole cache: on an H200 about 90 us a layer at
//! 256 cells and 230 us at 4000, most of a decode step. Here a `partial` dispatch runs one
//! workgroup per (token, head, chunk of `CHUNK` cells), each writing its chunk's softmax state
//! `(m, l, o)` to a scratch buffer, and a `reduce` dispatch combines the chunks of each (token,
//! head). The K/V rows are read by teams of threads in consecutive words (coalesced).
//!
//! The partial grid is sized for the plan's `max_cells`; workgroups whose chunk holds no cell
//! the step's mask allows return at once, and the reduce reads exactly the chunks that hold one
//! (so a partial left in the scratch by an earlier step is never read). Without an output
//! [`prepare`] records no reduce and returns where the chunks are ([`Partials`]): the decode
//! plans with few chunks leave the reduce to the o projection (`crate::ops::matmul::SplitX`).
//!
//! [`Query::Fresh`] reads the step's q, k and v as the projections left them and does
//! `qk_rope`'s work (QK-norm, rope, the KV write) inside the partial: a decode step then runs
//! two dispatches for a layer's attention instead of three.

use std::mem::offset_of;

use super::attention::AttentionParams;
use super::rope::RopeTable;
use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gpu::{buffer_entry, grid_2d, CachedPipeline, GpuContext, PipelineKey, Recorder};

pub const SHADER: &str = "attention_split.wgsl";
pub const ENTRY_PARTIAL: &str = "partial";
pub const ENTRY_REDUCE: &str = "reduce";

/// Uniform of `attention_split.wgsl`: [`AttentionParams`]' fields and the chunk count.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SplitParams {
    pub n_tokens: u32,
    pub n_head: u32,
    pub n_kv_head: u32,
    pub head_dim: u32,
    /// Added to the step's `pos0`: token `t` sits at position (== cell) `step.pos0 + pos0 + t`.
    pub pos0: u32,
    pub window: u32,
    pub scale: f32,
    pub softcap: f32,
    pub q_offset: u32,
    pub out_offset: u32,
    /// Chunks per (token, head) in the partial grid and the scratch: `ceil(max_cells / CHUNK)`.
    pub n_chunks: u32,
    /// The `FRESH` partial's rope and source layout ([`Fresh`]; `qk_rope`'s meaning), else 0.
    pub n_rot: u32,
    pub rope_type: u32,
    pub eps: f32,
    pub attn_factor: f32,
    pub in_stride: u32,
    pub q_head_stride: u32,
    pub k_offset: u32,
    pub v_offset: u32,
    pub pad0: u32,
}

impl WgslParams for SplitParams {
    const WGSL_NAME: &'static str = "SplitParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_tokens", offset_of!(SplitParams, n_tokens)),
        ("n_head", offset_of!(SplitParams, n_head)),
        ("n_kv_head", offset_of!(SplitParams, n_kv_head)),
        ("head_dim", offset_of!(SplitParams, head_dim)),
        ("pos0", offset_of!(SplitParams, pos0)),
        ("window", offset_of!(SplitParams, window)),
        ("scale", offset_of!(SplitParams, scale)),
        ("softcap", offset_of!(SplitParams, softcap)),
        ("q_offset", offset_of!(SplitParams, q_offset)),
        ("out_offset", offset_of!(SplitParams, out_offset)),
        ("n_chunks", offset_of!(SplitParams, n_chunks)),
        ("n_rot", offset_of!(SplitParams, n_rot)),
        ("rope_type", offset_of!(SplitParams, rope_type)),
        ("eps", offset_of!(SplitParams, eps)),
        ("attn_factor", offset_of!(SplitParams, attn_factor)),
        ("in_stride", offset_of!(SplitParams, in_stride)),
        ("q_head_stride", offset_of!(SplitParams, q_head_stride)),
        ("k_offset", offset_of!(SplitParams, k_offset)),
        ("v_offset", offset_of!(SplitParams, v_offset)),
        ("pad0", offset_of!(SplitParams, pad0)),
    ];
}

/// The kernel shape, recorded in the pipeline key (`WG_SIZE`, `CHUNK`, `TEAM`) and read back
/// from it for the grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SplitConfig {
    /// Threads per workgroup of both dispatches (a power of two, at least one per vector of a
    /// head: head_dim / 4 or head_dim / 2).
    pub workgroup_size: u32,
    /// Cells per partial workgroup (a multiple of 4). Smaller chunks mean more workgroups on a
    /// short cache and more partials for the reduce (and more empty workgroups on a plan sized
    /// for a long context).
    pub chunk: u32,
    /// Threads sharing one cell's `q . k` (a power of two, at most `workgroup_size`).
    pub team: u32,
}

impl SplitConfig {
    pub const fn new(workgroup_size: u32, chunk: u32, team: u32) -> Self {
        SplitConfig {
            workgroup_size,
            chunk,
            team,
        }
    }

    /// The engine's shape for heads of `head_dim` values. Heads of 256 or more: 256 threads,
    /// chunks of 16 cells, teams of 16. Gemma 3 270M's decode (4 heads, head_dim 256 as 64 vec4)
    /// then runs 64 partial workgroups at 256 cells and 1000 at 4000; a team reads a K row as 16
    /// lanes x 4 vec4, sixteen cells at a time. Measured on an H200 (270M decode tok/s after 256
    /// / 4000 cells): 128,32,16 719 / 684; 128,16,16 756 / 691; 128,8,16 752 / 645; 256,16,16
    /// 796 / 743; 256,8,32 787 / 695; 256,32,32 766 / 737.
    ///
    /// Smaller heads: 128 threads, chunks of 32 cells, teams of 8 (a lane still reads 4 vec4s
    /// of a 128-value K row; twice the cells a chunk halve the partials the reduce combines).
    /// Measured on an H100 (Llama 3 8B's 32 heads of 128, Q4_K, decode tok/s after 256 / 2000
    /// cells): 256,16,16 210.3 / 171.5; 128,32,8 214.2 / 195.3; 128,64,8 211.3 / 196.2;
    /// 256,32,16 214.4 / 187.9; 256,64,16 212.4 / 190.8; 128,16,16 213.7 / 183.4; 256,32,32
    /// 212.3 / 179.8; 64,16,16 210.5 / 177.5.
    ///
    /// Native builds read `CERA_ATTN_SPLIT=WG,CHUNK,TEAM` instead when it is set, so that
    /// `cera bench` can compare shapes on a GPU without a rebuild (docs/benchmarking.md).
    pub fn for_head(_ctx: &GpuContext, head_dim: u32) -> Self {
        if let Some(v) = crate::gpu::knob::knob("CERA_ATTN_SPLIT") {
            match Self::parse(&v) {
                Some(cfg) => return cfg,
                None => eprintln!("CERA_ATTN_SPLIT={v:?} is not WG,CHUNK,TEAM; using the default"),
            }
        }
        if head_dim >= 256 {
            Self::new(256, 16, 16)
        } else {
            Self::new(128, 32, 8)
        }
    }

    /// `WG,CHUNK,TEAM`, three positive integers.
    pub fn parse(s: &str) -> Option<Self> {
        let v: Vec<u32> = s
            .split(',')
            .map(|x| x.trim().parse().ok().filter(|&n| n > 0))
            .collect::<Option<_>>()?;
        match v[..] {
            [wg, chunk, team] => Some(Self::new(wg, chunk, team)),
            _ => None,
        }
    }

    /// Clamp to the device and the head size: a power-of-two workgroup within the limits and at
    /// least one thread per vector of a head, a power-of-two team dividing it. The chunk is kept
    /// as given (the scratch is sized from it before fitting); a chunk that is not a positive
    /// multiple of 4, or a shape beyond the workgroup memory, is an error.
    pub fn fit(self, ctx: &GpuContext, head_dim: u32, vec4: bool) -> Result<Self> {
        self.fit_for(ctx, head_dim, vec4, false)
    }

    /// [`Self::fit`] for the `FRESH` partial when `fresh` ([`Query::Fresh`]): a thread per rope
    /// pair too (head_dim / 2), and its head arrays in workgroup memory.
    pub fn fit_for(self, ctx: &GpuContext, head_dim: u32, vec4: bool, fresh: bool) -> Result<Self> {
        let bad = |m: String| Err(Error::invalid(format!("attention_split: {m}")));
        if self.chunk == 0 || !self.chunk.is_multiple_of(4) {
            return bad(format!(
                "chunk {} must be a positive multiple of 4",
                self.chunk
            ));
        }
        // Threads a head needs: one per loaded vector, or in the fused variant one per rope pair
        // (head_dim / 2, whatever the vector width of the loads).
        let nv = head_dim / if vec4 && !fresh { 4 } else { 2 };
        let pow2_floor = |n: u32| 1u32 << (31 - n.max(1).leading_zeros());
        let cap = pow2_floor(ctx.limits.workgroup_size(u32::MAX));
        let wg = pow2_floor(self.workgroup_size.max(1))
            .max(nv.next_power_of_two())
            .min(cap);
        if wg < nv {
            return bad(format!(
                "head_dim {head_dim} needs {nv} threads a workgroup, the device allows {cap}"
            ));
        }
        let team = pow2_floor(self.team.max(1)).min(wg);
        let cfg = SplitConfig {
            workgroup_size: wg,
            chunk: self.chunk,
            team,
        };
        let need = cfg.workgroup_bytes(vec4, fresh.then_some(head_dim));
        if need > ctx.limits.max_compute_workgroup_storage_size as u64 {
            return bad(format!(
                "{cfg:?} needs {need} bytes of workgroup memory, the device allows {}",
                ctx.limits.max_compute_workgroup_storage_size
            ));
        }
        Ok(cfg)
    }

    /// Workgroup memory of the partial entry (the larger): the (CHUNK, TEAM + 1) partial dots,
    /// scores and weights of the chunk, and per thread a vector and two floats; the `FRESH`
    /// variant (`fresh_head_dim`) adds three head-sized arrays, two floats a thread and the 16
    /// partial sums of its norm.
    pub fn workgroup_bytes(&self, vec4: bool, fresh_head_dim: Option<u32>) -> u64 {
        let w = if vec4 { 4 } else { 2 };
        let (wg, chunk, team) = (
            self.workgroup_size as u64,
            self.chunk as u64,
            self.team as u64,
        );
        let fresh = fresh_head_dim.map_or(0, |hd| 3 * hd as u64 + 2 * wg + 2 * wg.min(16));
        4 * (chunk * (team + 1) + 2 * chunk + wg * (w + 2) + fresh)
    }
}

/// The pipeline of `entry` ([`ENTRY_PARTIAL`] or [`ENTRY_REDUCE`]) in shape `cfg`.
pub fn key(cfg: SplitConfig, vec4: bool, entry: &'static str) -> PipelineKey {
    key_fresh(cfg, vec4, entry, None)
}

/// [`key`], and for the partial with `fresh = Some((head_dim, norm))` its `FRESH` variant
/// ([`Query::Fresh`]; `NORM` with a QK-norm).
pub fn key_fresh(
    cfg: SplitConfig,
    vec4: bool,
    entry: &'static str,
    fresh: Option<(u32, bool)>,
) -> PipelineKey {
    // Trusted (docs/dispatch.md, "Trusted kernels").
    let mut k = PipelineKey::new(SHADER, entry)
        .trusted()
        .workgroup_size(cfg.workgroup_size)
        .define("CHUNK", format!("{}u", cfg.chunk))
        .define("TEAM", format!("{}u", cfg.team));
    if vec4 {
        k = k.define("VEC4", "");
    }
    if let (ENTRY_PARTIAL, Some((head_dim, norm))) = (entry, fresh) {
        k = k.define("FRESH", "").define("HD", format!("{head_dim}u"));
        if norm {
            k = k.define("NORM", "");
        }
    }
    k
}

/// The `CHUNK` a pipeline was built with.
fn chunk_of(pipe: &CachedPipeline) -> Result<u32> {
    pipe.key
        .defines
        .iter()
        .find(|(k, _)| k == "CHUNK")
        .and_then(|(_, v)| v.trim_end_matches('u').parse().ok())
        .ok_or_else(|| Error::internal(format!("{} has no CHUNK", pipe.key.label())))
}

/// The shapes the engine may pick (the naga test compiles each).
pub fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for cfg in [
        SplitConfig::new(128, 32, 16),
        SplitConfig::new(128, 32, 8),
        SplitConfig::new(256, 64, 8),
        SplitConfig::new(64, 4, 1),
    ] {
        for vec4 in [false, true] {
            for entry in [ENTRY_PARTIAL, ENTRY_REDUCE] {
                v.push(key(cfg, vec4, entry).into());
            }
        }
    }
    // FRESH partials: Gemma 3's heads (256, QK-norm) and Llama's (128), vec4 and vec2.
    for (cfg, head_dim, norm) in [
        (SplitConfig::new(256, 16, 16), 256, true),
        (SplitConfig::new(256, 16, 16), 128, false),
        (SplitConfig::new(128, 32, 8), 128, false),
        (SplitConfig::new(64, 4, 1), 12, true),
    ] {
        for vec4 in [false, true] {
            v.push(key_fresh(cfg, vec4, ENTRY_PARTIAL, Some((head_dim, norm))).into());
        }
    }
    v
}

/// Whether the call reads vec4: head_dim and both offsets multiples of 4 (and with `fresh`, its
/// source's columns and strides).
fn use_vec4(p: &AttentionParams, fresh: Option<&Fresh>) -> bool {
    let cols = fresh.map_or(0, |f| f.stride | f.q_head_stride | f.k_col | f.v_col);
    p.head_dim.is_multiple_of(4)
        && p.q_offset.is_multiple_of(4)
        && p.out_offset.is_multiple_of(4)
        && cols.is_multiple_of(4)
}

/// The attention's query: roped q heads in a buffer `(n_tokens, n_head, head_dim)` from
/// `p.q_offset`, or (`Fresh`, one token) q, k and v still as the projections left them: then the
/// partial norms (QK-norm) and ropes them at the step's position, takes the token's own cell
/// from its k and v, and writes them to the caches (`qk_rope`'s work, in the same dispatch);
/// `p.q_offset` is q's column in the source, and `p.n_tokens` must be 1 (a token's cell is read
/// by no other workgroup of the step only then).
#[derive(Clone, Copy)]
pub enum Query<'a> {
    Roped(&'a wgpu::Buffer),
    Fresh(&'a Fresh<'a>),
}

/// The step's q, k and v as the projections wrote them ([`Query::Fresh`]): row `t` of
/// `src (n_tokens, stride)` holds q's head `h` from column `p.q_offset + h * q_head_stride`, kv
/// head `j`'s k from `k_col + j * head_dim` and its v from `v_col + j * head_dim`.
pub struct Fresh<'a> {
    pub src: &'a wgpu::Buffer,
    pub stride: u64,
    /// `head_dim`, or `2 head_dim` where each head's output gate follows it (Qwen3.5).
    pub q_head_stride: u64,
    pub k_col: u64,
    pub v_col: u64,
    /// The layer's rope (its frequencies, rotated dimensions, layout and factor).
    pub rope: &'a RopeTable,
    /// The QK-norm's weights, `(2, head_dim)` f32 (q's, then k's), and its epsilon.
    pub norm: Option<(&'a wgpu::Buffer, f32)>,
}

/// The shape [`Query::Fresh`] runs for `cfg` and a head of `head_dim`, or why it cannot (the
/// device's workgroup size or memory). Callers that get an error run `qk_rope` and
/// [`prepare`] instead.
pub fn fresh_config(ctx: &GpuContext, cfg: SplitConfig, head_dim: u32) -> Result<SplitConfig> {
    cfg.fit_for(ctx, head_dim, head_dim.is_multiple_of(4), true)
}

/// Bytes of scratch a call of `p` needs for runs of up to `max_cells` cells: per (token, head,
/// chunk) a head of `o` and one vector holding `(m, l)` (counted as a vec4, the wider variant).
pub fn scratch_bytes(p: &AttentionParams, cfg: SplitConfig, max_cells: u64) -> u64 {
    let chunks = max_cells.max(p.n_cells()).div_ceil(cfg.chunk.max(1) as u64);
    p.n_tokens as u64 * p.n_head as u64 * chunks * (p.head_dim as u64 + 4) * 4
}

/// One-off split attention (tests): allocates its own scratch, positions from `p.pos0`.
///
/// - `q`: `(n_tokens, n_head, head_dim)` f32 from element `p.q_offset`
/// - `k_cache`, `v_cache`: `(n_ctx, n_kv_head, head_dim)` f32, cells `0 .. pos0 + n_tokens` filled
/// - `out`: `(n_tokens, n_head, head_dim)` f32 from element `p.out_offset` (a buffer other than `q`)
#[allow(clippy::too_many_arguments)]
pub fn encode(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    cfg: SplitConfig,
    p: &AttentionParams,
    q: &wgpu::Buffer,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    out: &wgpu::Buffer,
) -> Result<()> {
    p.validate()?;
    let scratch = ctx.empty_storage(
        "attention_split scratch",
        scratch_bytes(p, cfg, p.n_cells()),
    )?;
    let mut rec = Recorder::new(ctx);
    prepare(
        &mut rec,
        cfg,
        p,
        Query::Roped(q),
        k_cache,
        v_cache,
        Some(out),
        &scratch,
        ctx.zero_step(),
        p.n_cells(),
    )?;
    rec.encode(encoder)
}

/// Where the partial left its chunks for a consumer that does the reduce itself (`matmul.wgsl`'s
/// `X_SPLIT`, [`crate::ops::matmul::SplitX`]): the scratch layout above and the numbers that
/// say which chunks a step wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partials {
    pub n_tokens: u32,
    pub n_head: u32,
    pub head_dim: u32,
    /// Cells a chunk (`CHUNK`) and chunks a (token, head) in the scratch.
    pub chunk: u32,
    pub n_chunks: u32,
    pub window: u32,
    /// Added to the step's `pos0`: the position of token 0.
    pub pos0: u32,
    /// The scratch holds vec4s (else vec2s).
    pub vec4: bool,
}

/// Prepare the partial and, with `out`, the reduce into it; without, the chunks stay in
/// `scratch` for a consumer that combines them ([`Partials`], which is returned either way).
/// Token `t` sits at position `step.pos0 + p.pos0 + t`, with `step` a [`crate::gpu::Step`]
/// buffer read when the dispatches run; `max_cells` bounds the cells any run attends to (the
/// partial grid covers it, and the caches and `scratch` must hold it: [`scratch_bytes`]).
///
/// - `scratch`: at least [`scratch_bytes`]`(p, cfg, max_cells)` bytes, bound to nothing else
/// - `q`: roped, or fresh from the projections ([`Query`]).
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    rec: &mut Recorder,
    cfg: SplitConfig,
    p: &AttentionParams,
    q: Query,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    out: Option<&wgpu::Buffer>,
    scratch: &wgpu::Buffer,
    step: &wgpu::Buffer,
    max_cells: u64,
) -> Result<Partials> {
    let (q, fresh) = match q {
        Query::Roped(q) => (q, None),
        Query::Fresh(f) => (f.src, Some(f)),
    };
    let ctx = rec.ctx;
    p.validate()?;
    let bad = |m: String| Err(Error::invalid(format!("attention_split: {m}")));
    if out == Some(q) {
        return bad("out must be a buffer other than q".into());
    }
    // Dawn rejects a buffer bound twice in one dispatch when either binding is writable.
    if [q, k_cache, v_cache].contains(&scratch) || out == Some(scratch) {
        return bad("scratch must be a buffer of its own".into());
    }
    let max_cells = max_cells.max(p.n_cells());
    let rows = p.n_tokens as u64 * p.n_head as u64 * p.head_dim as u64 * 4;
    let cache = max_cells * p.n_kv_head as u64 * p.head_dim as u64 * 4;
    let need_scratch = scratch_bytes(p, cfg, max_cells);
    let q_need = match fresh {
        Some(f) => {
            check_fresh(p, f, [Some(k_cache), Some(v_cache), out])?;
            p.n_tokens as u64 * f.stride * 4
        }
        None => rows + p.q_offset as u64 * 4,
    };
    for (what, buf, need) in [
        ("q", Some(q), q_need),
        ("out", out, rows + p.out_offset as u64 * 4),
        ("k_cache", Some(k_cache), cache),
        ("v_cache", Some(v_cache), cache),
        ("scratch", Some(scratch), need_scratch),
    ] {
        let Some(buf) = buf else { continue };
        if buf.size() < need {
            return bad(format!(
                "{what} holds {} bytes, {need} are needed ({max_cells} cells, {} tokens)",
                buf.size(),
                p.n_tokens
            ));
        }
    }
    if need_scratch > ctx.limits.max_binding() {
        return bad(format!(
            "a scratch of {need_scratch} bytes for {max_cells} cells passes the binding limit {}",
            ctx.limits.max_binding()
        ));
    }
    let vec4 = use_vec4(p, fresh);
    let cfg = cfg.fit_for(ctx, p.head_dim, vec4, fresh.is_some())?;
    let fresh_key = fresh.map(|f| (p.head_dim, f.norm.is_some()));
    let partial = ctx.pipeline(&key_fresh(cfg, vec4, ENTRY_PARTIAL, fresh_key))?;
    let chunk = chunk_of(&partial)? as u64;
    let n_chunks = max_cells.div_ceil(chunk);
    let pairs = p.n_tokens as u64 * p.n_head as u64;
    // Every scratch vector index (and the grid) must fit the shader's u32 arithmetic.
    let vectors = pairs * n_chunks * (p.head_dim as u64 / 2 + 1);
    if vectors > u32::MAX as u64 || max_cells + chunk > u32::MAX as u64 {
        return bad(format!(
            "{pairs} (token, head) pairs over {max_cells} cells pass u32 indexing"
        ));
    }
    let partials = Partials {
        n_tokens: p.n_tokens,
        n_head: p.n_head,
        head_dim: p.head_dim,
        chunk: chunk as u32,
        n_chunks: n_chunks as u32,
        window: p.window,
        pos0: p.pos0,
        vec4,
    };
    if p.n_tokens == 0 {
        return Ok(partials);
    }
    let params = SplitParams {
        n_tokens: p.n_tokens,
        n_head: p.n_head,
        n_kv_head: p.n_kv_head,
        head_dim: p.head_dim,
        pos0: p.pos0,
        window: p.window,
        scale: p.scale,
        softcap: p.softcap,
        q_offset: p.q_offset,
        out_offset: p.out_offset,
        n_chunks: n_chunks as u32,
        ..Default::default()
    };
    let params = match fresh {
        Some(f) => {
            let c = &f.rope.config;
            let u = |v: u64| u32::try_from(v).ok();
            let cols = [f.stride, f.q_head_stride, f.k_col, f.v_col].map(u);
            let [Some(in_stride), Some(q_head_stride), Some(k_offset), Some(v_offset)] = cols
            else {
                return bad(format!("fresh columns {cols:?} pass u32 indexing"));
            };
            SplitParams {
                n_rot: c.n_rot as u32,
                rope_type: c.rope_type as u32,
                eps: f.norm.map_or(0.0, |n| n.1),
                attn_factor: c.attn_factor,
                in_stride,
                q_head_stride,
                k_offset,
                v_offset,
                ..params
            }
        }
        None => params,
    };
    let max_dim = ctx.limits.max_compute_workgroups_per_dimension;
    let ubuf = rec.uniform(&partial.key.label(), &params);
    let mut entries = vec![
        buffer_entry(0, &ubuf),
        buffer_entry(1, q),
        buffer_entry(2, k_cache),
        buffer_entry(3, v_cache),
        buffer_entry(4, scratch),
        buffer_entry(6, step),
    ];
    if let Some(f) = fresh {
        entries.push(buffer_entry(7, &f.rope.buffer));
        if let Some((w, _)) = f.norm {
            entries.push(buffer_entry(8, w));
        }
    }
    rec.push(
        "attention",
        &partial,
        &entries,
        grid_2d(pairs * n_chunks, max_dim)?,
    );
    if let Some(out) = out {
        let reduce = ctx.pipeline(&key(cfg, vec4, ENTRY_REDUCE))?;
        rec.push(
            "attention",
            &reduce,
            &[
                buffer_entry(0, &ubuf),
                buffer_entry(4, scratch),
                buffer_entry(5, out),
                buffer_entry(6, step),
            ],
            grid_2d(pairs, max_dim)?,
        );
    }
    Ok(partials)
}

/// [`Query::Fresh`]'s own checks: one token, the rope's head size, the columns within a row
/// and even (vec2 loads), the norm's weights, and buffers it writes other than its source.
fn check_fresh(p: &AttentionParams, f: &Fresh, written: [Option<&wgpu::Buffer>; 3]) -> Result<()> {
    let bad = |m: String| {
        Err(Error::invalid(format!(
            "attention_split (fresh q/k/v): {m}"
        )))
    };
    let hd = p.head_dim as u64;
    if p.n_tokens != 1 {
        return bad(format!("{} tokens: one a step only", p.n_tokens));
    }
    if f.rope.config.head_dim as u64 != hd {
        return bad(format!(
            "the rope is for heads of {}, the attention's are {hd}",
            f.rope.config.head_dim
        ));
    }
    let cols = [
        (p.q_offset as u64, p.n_head as u64, f.q_head_stride),
        (f.k_col, p.n_kv_head as u64, hd),
        (f.v_col, p.n_kv_head as u64, hd),
    ];
    if f.q_head_stride < hd
        || cols
            .iter()
            .any(|&(c, heads, step)| c + (heads - 1) * step + hd > f.stride)
    {
        return bad(format!(
            "q, k, v columns {cols:?} do not fit rows of {}",
            f.stride
        ));
    }
    if !(f.stride | f.q_head_stride | f.k_col | f.v_col | p.q_offset as u64).is_multiple_of(2) {
        return bad("the columns and strides must be even".into());
    }
    if let Some((w, _)) = f.norm {
        if w.size() < 2 * hd * 4 {
            return bad(format!(
                "the norm weights hold {} bytes, {} needed",
                w.size(),
                2 * hd * 4
            ));
        }
    }
    if written.contains(&Some(f.src)) {
        return bad("the source must be a buffer the dispatch does not write".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::SplitConfig;

    #[test]
    fn parse_reads_three_positive_numbers() {
        assert_eq!(
            SplitConfig::parse("256, 8,32"),
            Some(SplitConfig::new(256, 8, 32))
        );
        for bad in [
            "",
            "128,32",
            "128,32,16,4",
            "128,0,16",
            "a,b,c",
            "128,-1,16",
        ] {
            assert_eq!(SplitConfig::parse(bad), None, "{bad:?}");
        }
    }
}
