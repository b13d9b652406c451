//! `rope`: rotary position embedding of q in place, and `rope_kv_write`: rotate k and write k and
//! v into a layer's KV cache (see `shaders/rope.wgsl`). Positions are `pos0 + t`.
//!
//! The convention is [`RopeConfig`]'s (llama.cpp's): pair `j` turns by `pos * base^(-2j/n_rot) /
//! ff[j]`, NeoX or NORM pairs, `n_rot <= head_dim`. The frequencies (frequency factors included)
//! are computed once per rope on the host in f64 and uploaded as a [`RopeTable`] of 64-bit
//! fixed-point turns per position, so the GPU never forms an f32 angle of thousands of radians:
//! the kernel reduces `pos * freq` modulo one turn in exact integer arithmetic and evaluates its
//! own sin/cos polynomials on a quarter turn. Measured up to position 32768 (`tests/ops.rs`):
//! worst error 1.7e-7 of the pair's norm on lavapipe and SwiftShader, flat in the position, where
//! an f32 angle would give 9.7e-4 at 32767 (details in the shader's header).
//!
//! Frequency factors (Llama 3 `rope_freqs`) are part of the [`RopeConfig`] (host values, as the
//! context shift's `delta_table` needs them too), not a GPU buffer: dividing on the GPU would
//! put an f32 rounding back into the angle.

use std::mem::offset_of;

use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gpu::{buffer_entry, grid_2d, GpuContext, PipelineKey, Recorder};
use crate::rope::RopeConfig;

pub const SHADER: &str = "rope.wgsl";
pub const ENTRY: &str = "rope";
pub const ENTRY_KV_WRITE: &str = "rope_kv_write";
/// Invocations per workgroup (clamped to the device's limits).
pub const WORKGROUP_SIZE: u32 = 64;

/// Uniform of `rope.wgsl` (both entry points).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RopeParams {
    pub n_tokens: u32,
    /// Heads of x (`rope`) or KV heads (`rope_kv_write`).
    pub n_heads: u32,
    pub head_dim: u32,
    pub n_rot: u32,
    /// 0 NeoX, 1 NORM ([`crate::rope::RopeType`] as u32).
    pub rope_type: u32,
    /// Position of token 0; for `rope_kv_write` also its cache cell.
    pub pos0: u32,
    /// Element index of `x[0, 0, 0]` (`rope`) or `k[0, 0, 0]` (`rope_kv_write`).
    pub x_offset: u32,
    /// Element index of `v[0, 0, 0]` (`rope_kv_write`).
    pub v_offset: u32,
    /// Multiplies the rotated pairs ([`RopeConfig::attn_factor`]).
    pub attn_factor: f32,
    pub _pad0: u32,
    pub _pad1: u32,
    pub _pad2: u32,
}

impl WgslParams for RopeParams {
    const WGSL_NAME: &'static str = "RopeParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_tokens", offset_of!(RopeParams, n_tokens)),
        ("n_heads", offset_of!(RopeParams, n_heads)),
        ("head_dim", offset_of!(RopeParams, head_dim)),
        ("n_rot", offset_of!(RopeParams, n_rot)),
        ("rope_type", offset_of!(RopeParams, rope_type)),
        ("pos0", offset_of!(RopeParams, pos0)),
        ("x_offset", offset_of!(RopeParams, x_offset)),
        ("v_offset", offset_of!(RopeParams, v_offset)),
        ("attn_factor", offset_of!(RopeParams, attn_factor)),
        ("_pad0", offset_of!(RopeParams, _pad0)),
        ("_pad1", offset_of!(RopeParams, _pad1)),
        ("_pad2", offset_of!(RopeParams, _pad2)),
    ];
}

/// One rope's frequencies on the GPU: `(n_rot / 2)` pairs of u32 `(hi, lo)`, the fraction
/// `frac(theta_j / 2pi)` of a turn per position as a 64-bit fixed-point number. Build one per
/// distinct [`RopeConfig`] (Gemma 3: one for the local layers, one for the global ones).
pub struct RopeTable {
    pub config: RopeConfig,
    pub buffer: wgpu::Buffer,
}

impl RopeTable {
    pub fn new(ctx: &GpuContext, config: &RopeConfig) -> Result<Self> {
        config.validate()?;
        let mut words = Self::words(config);
        if words.is_empty() {
            // n_rot 0 (a layer without rope): a binding cannot be empty; nothing reads it.
            words.push([0, 0]);
        }
        let buffer = ctx.storage_buffer("rope freq table", bytemuck::cast_slice(&words));
        Ok(RopeTable {
            config: config.clone(),
            buffer,
        })
    }

    /// The table's words: for each pair, `frac(theta_j / 2pi) * 2^64` as `[hi, lo]` (f64 gives
    /// 53 significant bits; the error is below 2^-53 turn per position).
    pub fn words(config: &RopeConfig) -> Vec<[u32; 2]> {
        (0..config.n_rot / 2)
            .map(|j| {
                let turns = config.theta(j) / std::f64::consts::TAU;
                let f = turns - turns.floor();
                let hi = (f * 4294967296.0).floor();
                let lo = ((f * 4294967296.0 - hi) * 4294967296.0).floor();
                [hi as u32, lo as u32]
            })
            .collect()
    }
}

fn u32_of(what: &str, v: u64) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::invalid(format!("rope: {what} = {v} does not fit in u32")))
}

pub fn key(kv_write: bool, workgroup_size: u32) -> PipelineKey {
    if kv_write {
        PipelineKey::new(SHADER, ENTRY_KV_WRITE)
            .define("KV_WRITE", "")
            .workgroup_size(workgroup_size)
    } else {
        PipelineKey::new(SHADER, ENTRY).workgroup_size(workgroup_size)
    }
}

pub fn variants() -> Vec<Variant> {
    [false, true]
        .iter()
        .flat_map(|&kv| [64u32, 256].map(move |wg| key(kv, wg)))
        .map(Variant::from)
        .collect()
}

fn dispatch(
    rec: &mut Recorder,
    kv_write: bool,
    params: &RopeParams,
    invocations: u64,
    buffers: &[(u32, &wgpu::Buffer)],
) -> Result<()> {
    if invocations == 0 {
        return Ok(());
    }
    let ctx = rec.ctx;
    let pipe = ctx.pipeline(&key(kv_write, ctx.limits.workgroup_size(WORKGROUP_SIZE)))?;
    let groups = invocations.div_ceil(pipe.decisions.workgroup_size as u64);
    let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
    let label = pipe.key.label();
    let ubuf = rec.uniform(&label, params);
    let mut entries = vec![buffer_entry(0, &ubuf)];
    entries.extend(buffers.iter().map(|(b, buf)| buffer_entry(*b, buf)));
    rec.push(
        if kv_write { "rope_kv_write" } else { "rope" },
        &pipe,
        &entries,
        grid,
    );
    Ok(())
}

fn params(
    table: &RopeTable,
    n_tokens: u32,
    n_heads: u32,
    pos0: u32,
    x_offset: u64,
    v_offset: u64,
) -> Result<RopeParams> {
    let c = &table.config;
    u32_of("last position", pos0 as u64 + n_tokens as u64)?;
    Ok(RopeParams {
        n_tokens,
        n_heads,
        head_dim: u32_of("head_dim", c.head_dim as u64)?,
        n_rot: u32_of("n_rot", c.n_rot as u64)?,
        rope_type: c.rope_type as u32,
        pos0,
        x_offset: u32_of("x offset", x_offset)?,
        v_offset: u32_of("v offset", v_offset)?,
        attn_factor: c.attn_factor,
        ..Default::default()
    })
}

/// Rotate `x` in place: token `t` to position `pos0 + t`.
///
/// - `x`: `(n_tokens, n_heads, head_dim)` f32 from element `x_offset` (head_dim, n_rot and the
///   layout are the table's)
#[allow(clippy::too_many_arguments)]
pub fn encode(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    table: &RopeTable,
    x: &wgpu::Buffer,
    x_offset: u64,
    n_tokens: u32,
    n_heads: u32,
    pos0: u32,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare(
        &mut rec,
        table,
        x,
        x_offset,
        n_tokens,
        n_heads,
        pos0,
        ctx.zero_step(),
    )?;
    rec.encode(encoder)
}

/// Prepare [`encode`]: token `t` goes to position `step.pos0 + pos0 + t`, with `step` a
/// [`crate::gpu::Step`] buffer read when the dispatch runs.
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    rec: &mut Recorder,
    table: &RopeTable,
    x: &wgpu::Buffer,
    x_offset: u64,
    n_tokens: u32,
    n_heads: u32,
    pos0: u32,
    step: &wgpu::Buffer,
) -> Result<()> {
    let p = params(table, n_tokens, n_heads, pos0, x_offset, 0)?;
    let inv = n_tokens as u64 * n_heads as u64 * (p.n_rot / 2) as u64;
    dispatch(
        rec,
        false,
        &p,
        inv,
        &[(1, x), (2, &table.buffer), (6, step)],
    )
}

/// Rotate `k` to positions `pos0 + t` and write it, and `v` as is, into cells `pos0 + t` of one
/// layer's cache (`k` itself is left unrotated).
///
/// - `k`: `(n_tokens, n_kv_heads, head_dim)` f32 from element `k_offset`
/// - `v`: `(n_tokens, n_kv_heads, head_dim)` f32 from element `v_offset` (may share k's buffer)
/// - `k_cache`, `v_cache`: `(n_ctx, n_kv_heads, head_dim)` f32 ([`crate::kv::KvCache::k`] / `v`);
///   `pos0 + n_tokens <= n_ctx`
#[allow(clippy::too_many_arguments)]
pub fn encode_kv_write(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    table: &RopeTable,
    k: &wgpu::Buffer,
    k_offset: u64,
    v: &wgpu::Buffer,
    v_offset: u64,
    n_tokens: u32,
    n_kv_heads: u32,
    pos0: u32,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare_kv_write(
        &mut rec,
        table,
        k,
        k_offset,
        v,
        v_offset,
        n_tokens,
        n_kv_heads,
        pos0,
        k_cache,
        v_cache,
        ctx.zero_step(),
    )?;
    rec.encode(encoder)
}

/// Prepare [`encode_kv_write`]: token `t` goes to position (== cell) `step.pos0 + pos0 + t`,
/// with `step` a [`crate::gpu::Step`] buffer read when the dispatch runs. The bounds check here
/// covers `pos0` alone; whoever moves `step.pos0` keeps the cells within the cache.
#[allow(clippy::too_many_arguments)]
pub fn prepare_kv_write(
    rec: &mut Recorder,
    table: &RopeTable,
    k: &wgpu::Buffer,
    k_offset: u64,
    v: &wgpu::Buffer,
    v_offset: u64,
    n_tokens: u32,
    n_kv_heads: u32,
    pos0: u32,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    step: &wgpu::Buffer,
) -> Result<()> {
    let p = params(table, n_tokens, n_kv_heads, pos0, k_offset, v_offset)?;
    let cell_bytes = n_kv_heads as u64 * p.head_dim as u64 * 4;
    let end = (pos0 as u64 + n_tokens as u64) * cell_bytes;
    if end > k_cache.size() || end > v_cache.size() {
        return Err(Error::invalid(format!(
            "rope_kv_write: cells {pos0}..{} do not fit a cache of {} cells",
            pos0 as u64 + n_tokens as u64,
            k_cache.size().min(v_cache.size()) / cell_bytes.max(1)
        )));
    }
    let inv = n_tokens as u64 * n_kv_heads as u64 * (p.head_dim / 2) as u64;
    dispatch(
        rec,
        true,
        &p,
        inv,
        &[
            (1, k),
            (2, &table.buffer),
            (3, v),
            (4, k_cache),
            (5, v_cache),
            (6, step),
        ],
    )
}

/// CPU reference: [`RopeConfig::apply_heads`] (f64 angles) on each token's row of `x`
/// (`(T, n_heads, head_dim)`), token `t` at position `pos0 + t`.
pub fn reference(config: &RopeConfig, x: &[f32], n_heads: usize, pos0: u32) -> Vec<f32> {
    let mut out = x.to_vec();
    for (t, row) in out.chunks_mut(n_heads * config.head_dim).enumerate() {
        config.apply_heads(row, pos0 as f64 + t as f64);
    }
    out
}
