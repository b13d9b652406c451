//! `ssm_conv`: the causal depthwise convolution of a gated delta-net layer (Qwen3.5) over its
//! q | k | v projection output, then SiLU (see `shaders/ssm_conv.wgsl`). The inputs before the
//! batch come from a rolling conv state of `d_conv - 1` rows per layer, which the dispatch
//! advances; a batch at position 0 starts from zeros.

use std::mem::offset_of;

use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gpu::{buffer_entry, grid_2d, GpuContext, PipelineKey, Recorder};

pub const SHADER: &str = "ssm_conv.wgsl";
pub const ENTRY: &str = "ssm_conv";
/// Invocations per workgroup (clamped to the device's limits).
pub const WORKGROUP_SIZE: u32 = 64;

/// Uniform of `ssm_conv.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SsmConvParams {
    pub n_tokens: u32,
    pub channels: u32,
    /// Taps of the kernel: the current token and `d_conv - 1` before it.
    pub d_conv: u32,
    /// Added to the step's `pos0` (a plan passes 0; a one-off dispatch its positions).
    pub pos0: u32,
    /// Element index of the first input and elements between tokens in `src`.
    pub in_offset: u32,
    pub in_stride: u32,
    pub pad0: u32,
    pub pad1: u32,
}

impl WgslParams for SsmConvParams {
    const WGSL_NAME: &'static str = "SsmConvParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_tokens", offset_of!(SsmConvParams, n_tokens)),
        ("channels", offset_of!(SsmConvParams, channels)),
        ("d_conv", offset_of!(SsmConvParams, d_conv)),
        ("pos0", offset_of!(SsmConvParams, pos0)),
        ("in_offset", offset_of!(SsmConvParams, in_offset)),
        ("in_stride", offset_of!(SsmConvParams, in_stride)),
        ("pad0", offset_of!(SsmConvParams, pad0)),
        ("pad1", offset_of!(SsmConvParams, pad1)),
    ];
}

fn key(wg: u32) -> PipelineKey {
    PipelineKey::new(SHADER, ENTRY).workgroup_size(wg)
}

pub fn variants() -> Vec<Variant> {
    vec![key(WORKGROUP_SIZE).into()]
}

/// The buffers of one conv dispatch.
pub struct SsmConvBuffers<'a> {
    /// `(n_tokens, in_stride)`: the inputs from element `in_offset` (`channels` per token).
    pub src: &'a wgpu::Buffer,
    pub in_offset: u64,
    pub in_stride: u64,
    /// `(channels, d_conv)` f32, oldest tap first (GGUF `ssm_conv1d.weight`,
    /// ne = [d_conv, channels]).
    pub weight: &'a wgpu::Buffer,
    /// `(d_conv - 1, channels)` f32: the last inputs, oldest first; read and advanced.
    pub state: &'a wgpu::Buffer,
    /// `(n_tokens, channels)`.
    pub out: &'a wgpu::Buffer,
}

/// The bytes of a conv state of `channels` and width `d_conv` (at least 4: a binding cannot be
/// empty).
pub fn state_bytes(channels: u32, d_conv: u32) -> u64 {
    (channels as u64 * d_conv.saturating_sub(1) as u64 * 4).max(4)
}

/// Prepare the dispatch for `n_tokens` at positions `step.pos0 + pos0 + t`.
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    rec: &mut Recorder,
    b: &SsmConvBuffers,
    n_tokens: u32,
    channels: u32,
    d_conv: u32,
    pos0: u32,
    step: &wgpu::Buffer,
) -> Result<()> {
    let ctx = rec.ctx;
    if n_tokens == 0 {
        return Ok(());
    }
    let (c, n) = (channels as u64, n_tokens as u64);
    if d_conv == 0 || channels == 0 || b.in_stride < c {
        return Err(Error::invalid(format!(
            "ssm_conv: {channels} channels, width {d_conv}, input stride {}",
            b.in_stride
        )));
    }
    let last_in = b.in_offset + (n - 1) * b.in_stride + c;
    if last_in > u32::MAX as u64
        || b.src.size() < last_in * 4
        || b.out.size() < n * c * 4
        || b.weight.size() < c * d_conv as u64 * 4
        || b.state.size() < state_bytes(channels, d_conv)
    {
        return Err(Error::invalid(
            "ssm_conv: a buffer is smaller than its shape",
        ));
    }
    let pipe = ctx.pipeline(&key(ctx.limits.workgroup_size(WORKGROUP_SIZE)))?;
    let params = SsmConvParams {
        n_tokens,
        channels,
        d_conv,
        pos0,
        in_offset: b.in_offset as u32,
        in_stride: b.in_stride as u32,
        ..Default::default()
    };
    let groups = c.div_ceil(pipe.decisions.workgroup_size as u64);
    let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
    let label = pipe.key.label();
    let ubuf = rec.uniform(&label, &params);
    let entries = [
        buffer_entry(0, &ubuf),
        buffer_entry(1, b.src),
        buffer_entry(2, b.weight),
        buffer_entry(3, b.state),
        buffer_entry(4, b.out),
        buffer_entry(5, step),
    ];
    rec.push("ssm_conv", &pipe, &entries, grid);
    Ok(())
}

/// One-off [`prepare`] at positions `pos0 + t` (tests).
#[allow(clippy::too_many_arguments)]
pub fn encode(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    b: &SsmConvBuffers,
    n_tokens: u32,
    channels: u32,
    d_conv: u32,
    pos0: u32,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare(
        &mut rec,
        b,
        n_tokens,
        channels,
        d_conv,
        pos0,
        ctx.zero_step(),
    )?;
    rec.encode(encoder)
}

/// CPU reference in f64 over a whole sequence from position 0: `x (T, channels)`, `weight
/// (channels, d_conv)`; returns `silu(conv(x)) (T, channels)`.
pub fn reference(x: &[f32], weight: &[f32], channels: usize, d_conv: usize) -> Vec<f64> {
    let n = x.len() / channels;
    let mut out = vec![0.0; n * channels];
    for t in 0..n {
        for c in 0..channels {
            let mut acc = 0.0;
            for j in 0..d_conv {
                let back = d_conv - 1 - j;
                if back <= t {
                    acc += weight[c * d_conv + j] as f64 * x[(t - back) * channels + c] as f64;
                }
            }
            out[t * channels + c] = acc / (1.0 + (-acc).exp());
        }
    }
    out
}
