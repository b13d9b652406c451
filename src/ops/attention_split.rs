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
//! (so a partial left in the scratch by an earlier step is never read).

use std::mem::offset_of;

use super::attention::AttentionParams;
use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gpu::{grid_2d, CachedPipeline, GpuContext, PipelineKey, Recorder};

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

    /// 256 threads, chunks of 16 cells, teams of 16. Gemma 3 270M's decode (4 heads, head_dim
    /// 256 as 64 vec4) then runs 64 partial workgroups at 256 cells and 1000 at 4000; a team
    /// reads a K row as 16 lanes x 4 vec4, sixteen cells at a time. Measured on an H200 (270M
    /// decode tok/s after 256 / 4000 cells): 128,32,16 719 / 684; 128,16,16 756 / 691;
    /// 128,8,16 752 / 645; 256,16,16 796 / 743; 256,8,32 787 / 695; 256,32,32 766 / 737.
    ///
    /// Native builds read `CERA_ATTN_SPLIT=WG,CHUNK,TEAM` instead when it is set, so that
    /// `cera bench` can compare shapes on a GPU without a rebuild (docs/benchmarking.md).
    pub fn for_device(_ctx: &GpuContext) -> Self {
        if let Some(v) = crate::gpu::knob::knob("CERA_ATTN_SPLIT") {
            match Self::parse(&v) {
                Some(cfg) => return cfg,
                None => eprintln!("CERA_ATTN_SPLIT={v:?} is not WG,CHUNK,TEAM; using the default"),
            }
        }
        Self::new(256, 16, 16)
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
        let bad = |m: String| Err(Error::invalid(format!("attention_split: {m}")));
        if self.chunk == 0 || !self.chunk.is_multiple_of(4) {
            return bad(format!(
                "chunk {} must be a positive multiple of 4",
                self.chunk
            ));
        }
        let nv = head_dim / if vec4 { 4 } else { 2 };
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
        let need = cfg.workgroup_bytes(vec4);
        if need > ctx.limits.max_compute_workgroup_storage_size as u64 {
            return bad(format!(
                "{cfg:?} needs {need} bytes of workgroup memory, the device allows {}",
                ctx.limits.max_compute_workgroup_storage_size
            ));
        }
        Ok(cfg)
    }

    /// Workgroup memory of the partial entry (the larger): the (CHUNK, TEAM + 1) partial dots,
    /// scores and weights of the chunk, and per thread a vector and a float.
    pub fn workgroup_bytes(&self, vec4: bool) -> u64 {
        let w = if vec4 { 4 } else { 2 };
        let (wg, chunk, team) = (
            self.workgroup_size as u64,
            self.chunk as u64,
            self.team as u64,
        );
        4 * (chunk * (team + 1) + 2 * chunk + wg * (w + 1))
    }
}

/// The pipeline of `entry` ([`ENTRY_PARTIAL`] or [`ENTRY_REDUCE`]) in shape `cfg`.
pub fn key(cfg: SplitConfig, vec4: bool, entry: &'static str) -> PipelineKey {
    let k = PipelineKey::new(SHADER, entry)
        .workgroup_size(cfg.workgroup_size)
        .define("CHUNK", format!("{}u", cfg.chunk))
        .define("TEAM", format!("{}u", cfg.team));
    if vec4 {
        k.define("VEC4", "")
    } else {
        k
    }
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
        SplitConfig::new(256, 64, 8),
        SplitConfig::new(64, 4, 1),
    ] {
        for vec4 in [false, true] {
            for entry in [ENTRY_PARTIAL, ENTRY_REDUCE] {
                let k = key(cfg, vec4, entry);
                v.push(Variant {
                    shader: k.shader,
                    entry: k.entry,
                    defines: k.defines,
                });
            }
        }
    }
    v
}

/// Whether the call reads vec4: head_dim and both offsets multiples of 4.
fn use_vec4(p: &AttentionParams) -> bool {
    p.head_dim.is_multiple_of(4) && p.q_offset.is_multiple_of(4) && p.out_offset.is_multiple_of(4)
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
        q,
        k_cache,
        v_cache,
        out,
        &scratch,
        ctx.zero_step(),
        p.n_cells(),
    )?;
    rec.encode(encoder)
}

/// Prepare the two dispatches (partial, then reduce). Token `t` sits at position
/// `step.pos0 + p.pos0 + t`, with `step` a [`crate::gpu::Step`] buffer read when the dispatches
/// run; `max_cells` bounds the cells any run attends to (the partial grid covers it, and the
/// caches and `scratch` must hold it: [`scratch_bytes`]).
///
/// - `scratch`: at least [`scratch_bytes`]`(p, cfg, max_cells)` bytes, bound to nothing else
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    rec: &mut Recorder,
    cfg: SplitConfig,
    p: &AttentionParams,
    q: &wgpu::Buffer,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    out: &wgpu::Buffer,
    scratch: &wgpu::Buffer,
    step: &wgpu::Buffer,
    max_cells: u64,
) -> Result<()> {
    let ctx = rec.ctx;
    p.validate()?;
    if p.n_tokens == 0 {
        return Ok(());
    }
    let bad = |m: String| Err(Error::invalid(format!("attention_split: {m}")));
    if q == out {
        return bad("out must be a buffer other than q".into());
    }
    // Dawn rejects a buffer bound twice in one dispatch when either binding is writable.
    if [q, k_cache, v_cache, out].contains(&scratch) {
        return bad("scratch must be a buffer of its own".into());
    }
    let max_cells = max_cells.max(p.n_cells());
    let rows = p.n_tokens as u64 * p.n_head as u64 * p.head_dim as u64 * 4;
    let cache = max_cells * p.n_kv_head as u64 * p.head_dim as u64 * 4;
    let need_scratch = scratch_bytes(p, cfg, max_cells);
    for (what, buf, need) in [
        ("q", q, rows + p.q_offset as u64 * 4),
        ("out", out, rows + p.out_offset as u64 * 4),
        ("k_cache", k_cache, cache),
        ("v_cache", v_cache, cache),
        ("scratch", scratch, need_scratch),
    ] {
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
    let vec4 = use_vec4(p);
    let cfg = cfg.fit(ctx, p.head_dim, vec4)?;
    let partial = ctx.pipeline(&key(cfg, vec4, ENTRY_PARTIAL))?;
    let reduce = ctx.pipeline(&key(cfg, vec4, ENTRY_REDUCE))?;
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
        pad0: 0,
    };
    let max_dim = ctx.limits.max_compute_workgroups_per_dimension;
    let ubuf = rec.uniform(&partial.key.label(), &params);
    rec.push(
        "attention",
        &partial,
        &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: ubuf.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: q.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: k_cache.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 3,
                resource: v_cache.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 4,
                resource: scratch.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 6,
                resource: step.as_entire_binding(),
            },
        ],
        grid_2d(pairs * n_chunks, max_dim)?,
    );
    rec.push(
        "attention",
        &reduce,
        &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: ubuf.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 4,
                resource: scratch.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 5,
                resource: out.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 6,
                resource: step.as_entire_binding(),
            },
        ],
        grid_2d(pairs, max_dim)?,
    );
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
