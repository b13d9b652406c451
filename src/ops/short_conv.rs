//! `short_conv`: LFM2's gated short convolution between its two projections (see
//! `shaders/short_conv.wgsl`): `out = C * conv_L(B * x)`, causal and depthwise over the last `L`
//! positions, with `B * x` of every position kept in the layer's conv rows (one per KV cell, so
//! the state at any prefix is there: rewinds, chat-turn reuse and context shifts move it like
//! K/V cells).

use std::mem::offset_of;

use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gpu::{buffer_entry, grid_2d, GpuContext, PipelineKey, Recorder};

pub const SHADER: &str = "short_conv.wgsl";
pub const ENTRY: &str = "short_conv";
/// Invocations per workgroup (clamped to the device's limits).
pub const WORKGROUP_SIZE: u32 = 256;

/// Uniform of `short_conv.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ShortConvParams {
    pub n_tokens: u32,
    pub n_embd: u32,
    /// Taps of the kernel: the current token and `l_cache - 1` before it.
    pub l_cache: u32,
    /// Added to the step's `pos0` (a plan passes 0; a one-off dispatch its positions).
    pub pos0: u32,
    /// Elements between tokens in `bcx`.
    pub bcx_stride: u32,
    pub pad0: u32,
    pub pad1: u32,
    pub pad2: u32,
}

impl WgslParams for ShortConvParams {
    const WGSL_NAME: &'static str = "ShortConvParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_tokens", offset_of!(ShortConvParams, n_tokens)),
        ("n_embd", offset_of!(ShortConvParams, n_embd)),
        ("l_cache", offset_of!(ShortConvParams, l_cache)),
        ("pos0", offset_of!(ShortConvParams, pos0)),
        ("bcx_stride", offset_of!(ShortConvParams, bcx_stride)),
        ("pad0", offset_of!(ShortConvParams, pad0)),
        ("pad1", offset_of!(ShortConvParams, pad1)),
        ("pad2", offset_of!(ShortConvParams, pad2)),
    ];
}

fn key(wg: u32) -> PipelineKey {
    PipelineKey::new(SHADER, ENTRY).workgroup_size(wg)
}

pub fn variants() -> Vec<Variant> {
    vec![key(WORKGROUP_SIZE).into()]
}

/// The buffers of one short-convolution dispatch.
pub struct ShortConvBuffers<'a> {
    /// `(n_tokens, 3 n_embd)`: B, C and x side by side (the input projection's output).
    pub bcx: &'a wgpu::Buffer,
    /// `(n_embd, l_cache)` f32, oldest tap first (GGUF `shortconv.conv.weight`, ne = [L, n_embd]).
    pub weight: &'a wgpu::Buffer,
    /// `(n_ctx, n_embd)`: `B * x` by position; this dispatch writes its tokens' rows.
    pub rows: &'a wgpu::Buffer,
    /// `(n_tokens, n_embd)`.
    pub out: &'a wgpu::Buffer,
}

/// Prepare the dispatch for `n_tokens` at positions `step.pos0 + pos0 + t`. The bounds check
/// covers `pos0` alone; the caller keeps the step's cells within `rows`.
pub fn prepare(
    rec: &mut Recorder,
    b: &ShortConvBuffers,
    n_tokens: u32,
    n_embd: u32,
    l_cache: u32,
    pos0: u32,
    step: &wgpu::Buffer,
) -> Result<()> {
    let ctx = rec.ctx;
    if n_tokens == 0 {
        return Ok(());
    }
    let e = n_embd as u64;
    let total = n_tokens as u64 * e;
    if l_cache == 0 || total > u32::MAX as u64 {
        return Err(Error::invalid(format!(
            "short_conv: {n_tokens} tokens x {n_embd} channels, width {l_cache}"
        )));
    }
    if b.bcx.size() < total * 3 * 4
        || b.out.size() < total * 4
        || b.weight.size() < e * l_cache as u64 * 4
    {
        return Err(Error::invalid(
            "short_conv: a buffer is smaller than its shape",
        ));
    }
    if (pos0 as u64 + n_tokens as u64) * e * 4 > b.rows.size() {
        return Err(Error::invalid(format!(
            "short_conv: positions {pos0}..{} do not fit the conv rows",
            pos0 + n_tokens
        )));
    }
    let pipe = ctx.pipeline(&key(ctx.limits.workgroup_size(WORKGROUP_SIZE)))?;
    let params = ShortConvParams {
        n_tokens,
        n_embd,
        l_cache,
        pos0,
        bcx_stride: 3 * n_embd,
        ..Default::default()
    };
    let groups = total.div_ceil(pipe.decisions.workgroup_size as u64);
    let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
    let label = pipe.key.label();
    let ubuf = rec.uniform(&label, &params);
    let entries = [
        buffer_entry(0, &ubuf),
        buffer_entry(1, b.bcx),
        buffer_entry(2, b.weight),
        buffer_entry(3, b.rows),
        buffer_entry(4, b.out),
        buffer_entry(5, step),
    ];
    rec.push("short_conv", &pipe, &entries, grid);
    Ok(())
}

/// One-off [`prepare`] at positions `pos0 + t` (tests).
#[allow(clippy::too_many_arguments)]
pub fn encode(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    b: &ShortConvBuffers,
    n_tokens: u32,
    n_embd: u32,
    l_cache: u32,
    pos0: u32,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare(
        &mut rec,
        b,
        n_tokens,
        n_embd,
        l_cache,
        pos0,
        ctx.zero_step(),
    )?;
    rec.encode(encoder)
}

/// CPU reference in f64 over a whole sequence from position 0: `bcx (T, 3 n_embd)`, `weight
/// (n_embd, l_cache)`; returns `out (T, n_embd)` and the rows `B * x (T, n_embd)`.
pub fn reference(
    bcx: &[f32],
    weight: &[f32],
    n_embd: usize,
    l_cache: usize,
) -> (Vec<f64>, Vec<f64>) {
    let n = bcx.len() / (3 * n_embd);
    let bx: Vec<f64> = (0..n * n_embd)
        .map(|i| {
            let (t, c) = (i / n_embd, i % n_embd);
            bcx[t * 3 * n_embd + c] as f64 * bcx[t * 3 * n_embd + 2 * n_embd + c] as f64
        })
        .collect();
    let mut out = vec![0.0; n * n_embd];
    for t in 0..n {
        for c in 0..n_embd {
            let mut acc = 0.0;
            for j in 0..l_cache {
                let back = l_cache - 1 - j;
                if back <= t {
                    acc += weight[c * l_cache + j] as f64 * bx[(t - back) * n_embd + c];
                }
            }
            out[t * n_embd + c] = bcx[t * 3 * n_embd + n_embd + c] as f64 * acc;
        }
    }
    (out, bx)
}
