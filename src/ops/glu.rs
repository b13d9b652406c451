//! `glu`: gated linear units `out = act(gate) * up` (see `shaders/glu.wgsl`): SwiGLU (SiLU) for
//! LLaMA/Qwen/Granite, GeGLU (llama.cpp's tanh-approximated GELU) for Gemma.
//!
//! Views are `(n_rows, n_cols)` with row strides, so `gate` and `up` may be the halves of one
//! fused matmul output, and `out` may be `gate`'s buffer (in place). Buffer aliasing is bound as
//! in [`super::elementwise`] (each distinct buffer once).

use std::mem::offset_of;

use super::elementwise::{two_input_patterns, BindingPlan, View};
use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gpu::{buffer_entry, grid_2d, GpuContext, PipelineKey, Recorder};

pub const SHADER: &str = "glu.wgsl";
pub const ENTRY: &str = "glu";
/// Invocations per workgroup (clamped to the device's limits).
pub const WORKGROUP_SIZE: u32 = 256;

/// The gate's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU).
    Silu,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (GeGLU, as llama.cpp).
    GeluTanh,
    /// `sigmoid(x)`: a gate rather than a GLU (Qwen3.5's attention output gate).
    Sigmoid,
}

impl Activation {
    pub(crate) fn define(self) -> &'static str {
        match self {
            Activation::Silu => "SILU",
            Activation::GeluTanh => "GELU",
            Activation::Sigmoid => "SIGMOID",
        }
    }

    /// The activation in f64 (the CPU reference).
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Activation::GeluTanh => {
                0.5 * x
                    * (1.0
                        + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
            }
        }
    }
}

/// Uniform of `glu.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GluParams {
    pub n_rows: u32,
    pub n_cols: u32,
    /// Element index of `[0, 0]` and elements between rows, of out, gate and up.
    pub out_offset: u32,
    pub out_stride: u32,
    pub gate_offset: u32,
    pub gate_stride: u32,
    pub up_offset: u32,
    pub up_stride: u32,
    /// Rows of gate per group and elements between groups: row `r`'s gate starts at
    /// `gate_offset + (r / gate_group) * gate_group_stride + (r % gate_group) * gate_stride`
    /// (per-head gates interleaved in a projection's rows); a plain view is one group.
    pub gate_group: u32,
    pub gate_group_stride: u32,
    pub pad0: u32,
    pub pad1: u32,
}

impl WgslParams for GluParams {
    const WGSL_NAME: &'static str = "GluParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_rows", offset_of!(GluParams, n_rows)),
        ("n_cols", offset_of!(GluParams, n_cols)),
        ("out_offset", offset_of!(GluParams, out_offset)),
        ("out_stride", offset_of!(GluParams, out_stride)),
        ("gate_offset", offset_of!(GluParams, gate_offset)),
        ("gate_stride", offset_of!(GluParams, gate_stride)),
        ("up_offset", offset_of!(GluParams, up_offset)),
        ("up_stride", offset_of!(GluParams, up_stride)),
        ("gate_group", offset_of!(GluParams, gate_group)),
        (
            "gate_group_stride",
            offset_of!(GluParams, gate_group_stride),
        ),
        ("pad0", offset_of!(GluParams, pad0)),
        ("pad1", offset_of!(GluParams, pad1)),
    ];
}

fn key(act: Activation, wg: u32, names: &[&str], reads: usize) -> PipelineKey {
    let mut k = PipelineKey::new(SHADER, ENTRY)
        .define(act.define(), "")
        .workgroup_size(wg);
    k = k.define("IN_GATE", names[0]).define("IN_UP", names[1]);
    for i in 0..reads {
        k = k.define(["HAS_SRC0", "HAS_SRC1"][i], "");
    }
    k
}

/// [`key`] of the quantized output ([`prepare_q8`]): its inputs never share out's buffer.
fn q8_key(act: Activation, wg: u32, names: &[&str], reads: usize) -> PipelineKey {
    key(act, wg, names, reads).define("Q8_OUT", "")
}

/// Every activation in every aliasing pattern, and the quantized output in those without out's
/// buffer among the inputs.
pub fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for act in [Activation::Silu, Activation::GeluTanh, Activation::Sigmoid] {
        for (names, reads) in two_input_patterns() {
            v.push(key(act, WORKGROUP_SIZE, &names, reads).into());
            if !names.contains(&"dst") {
                v.push(q8_key(act, WORKGROUP_SIZE, &names, reads).into());
            }
        }
    }
    v
}

fn u32_of(what: &str, v: u64) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::invalid(format!("glu: {what} = {v} does not fit in u32")))
}

/// `out[r, i] = act(gate[r, i]) * up[r, i]` for `(n_rows, n_cols)` (rows = tokens, cols = n_ff).
///
/// - `gate`, `up`: `(n_rows, n_cols)` views (may share a buffer, e.g. `(T, 2 n_ff)` halves)
/// - `out`: `(n_rows, n_cols)` view; may be in `gate`'s or `up`'s buffer (the same range, or a
///   range that does not overlap them)
#[allow(clippy::too_many_arguments)]
pub fn encode(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    act: Activation,
    gate: View,
    up: View,
    out: View,
    n_rows: u32,
    n_cols: u32,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare(&mut rec, act, gate, up, out, n_rows, n_cols)?;
    rec.encode(encoder)
}

/// Prepare the dispatch of [`encode`].
pub fn prepare(
    rec: &mut Recorder,
    act: Activation,
    gate: View,
    up: View,
    out: View,
    n_rows: u32,
    n_cols: u32,
) -> Result<()> {
    prepare_grouped(rec, act, gate, (n_rows.max(1), 0), up, out, n_rows, n_cols)
}

/// [`prepare`] with the gate's rows in groups: `group = (rows per group, elements between
/// groups)`, `gate.stride` between rows within a group. Qwen3.5's attention gate: rows are
/// (token, head), a token's heads `2 head_dim` apart, tokens a projection row apart.
#[allow(clippy::too_many_arguments)]
pub fn prepare_grouped(
    rec: &mut Recorder,
    act: Activation,
    gate: View,
    group: (u32, u64),
    up: View,
    out: View,
    n_rows: u32,
    n_cols: u32,
) -> Result<()> {
    if group.0 == 0 {
        return Err(Error::invalid("glu: a gate group of 0 rows"));
    }
    let total = n_rows as u64 * n_cols as u64;
    u32_of("elements", total)?;
    if total == 0 {
        return Ok(());
    }
    let params = GluParams {
        out_offset: u32_of("out offset", out.offset)?,
        out_stride: u32_of("out stride", out.stride)?,
        gate_group: group.0,
        gate_group_stride: u32_of("gate group stride", group.1)?,
        ..io_params(gate, up, n_rows, n_cols)?
    };
    push(rec, act, false, gate, up, out.buffer, &params, total)
}

/// The uniform's sizes and input views (the rest zero, a plain gate).
fn io_params(gate: View, up: View, n_rows: u32, n_cols: u32) -> Result<GluParams> {
    Ok(GluParams {
        n_rows,
        n_cols,
        gate_offset: u32_of("gate offset", gate.offset)?,
        gate_stride: u32_of("gate stride", gate.stride)?,
        up_offset: u32_of("up offset", up.offset)?,
        up_stride: u32_of("up stride", up.stride)?,
        gate_group: n_rows.max(1),
        ..Default::default()
    })
}

/// Push the dispatch of `params` (the f32 or, with `q8`, the quantized output) over
/// `invocations` invocations.
#[allow(clippy::too_many_arguments)]
fn push(
    rec: &mut Recorder,
    act: Activation,
    q8: bool,
    gate: View,
    up: View,
    out: &wgpu::Buffer,
    params: &GluParams,
    invocations: u64,
) -> Result<()> {
    let ctx = rec.ctx;
    let plan = BindingPlan::new(out, &[gate.buffer, up.buffer]);
    let wg = ctx.limits.workgroup_size(WORKGROUP_SIZE);
    let make = if q8 { q8_key } else { key };
    let pipe = ctx.pipeline(&make(act, wg, &plan.names, plan.reads.len()))?;
    let wg = pipe.decisions.workgroup_size;
    if q8 && !wg.is_multiple_of(8) {
        // (A block's eight invocations share a workgroup.)
        return Err(Error::invalid(format!(
            "glu: a quantized output in workgroups of {wg} (not a multiple of 8)"
        )));
    }
    let grid = grid_2d(
        invocations.div_ceil(wg as u64),
        ctx.limits.max_compute_workgroups_per_dimension,
    )?;
    let label = pipe.key.label();
    let ubuf = rec.uniform(&label, params);
    let mut entries = vec![buffer_entry(0, &ubuf)];
    entries.extend(plan.entries(out));
    rec.push("glu", &pipe, &entries, grid);
    Ok(())
}

/// Bytes of [`prepare_q8`]'s output for `n_rows` rows of `n_cols` values: a byte a value and 16
/// bytes a block of 32.
pub fn q8_bytes(n_rows: u64, n_cols: u64) -> u64 {
    n_rows * n_cols / 32 * (32 + 16)
}

/// `act(gate) * up` quantized to 8 bits per block of 32 values, into `out` (a buffer of its
/// own, at least [`q8_bytes`]): per row, the values as i8 (four a word, in order), then each
/// block's `(d, sum of values 0..15, sum of 16..31, 0)` as f32, where `d = max |v| / 127` and a
/// value is `round(v / d)` (Q8_OUT in `shaders/glu.wgsl`). This is X as a GEMV with 8-bit items
/// reads it ([`crate::ops::matmul::prepare_q8_x`]); `n_cols` is a multiple of 32.
#[allow(clippy::too_many_arguments)]
pub fn prepare_q8(
    rec: &mut Recorder,
    act: Activation,
    gate: View,
    up: View,
    out: &wgpu::Buffer,
    n_rows: u32,
    n_cols: u32,
) -> Result<()> {
    if !n_cols.is_multiple_of(32) {
        return Err(Error::invalid(format!(
            "glu: a quantized output of {n_cols} values a row (not a multiple of 32)"
        )));
    }
    if out == gate.buffer || out == up.buffer {
        return Err(Error::invalid(
            "glu: a quantized output in an input's buffer",
        ));
    }
    let need = q8_bytes(n_rows as u64, n_cols as u64);
    if out.size() < need {
        return Err(Error::invalid(format!(
            "glu: a quantized output of {n_rows} x {n_cols} values needs {need} bytes, the \
             buffer has {}",
            out.size()
        )));
    }
    // One invocation a word of quants (four values).
    let words = u32_of("words", n_rows as u64 * (n_cols / 4) as u64)?;
    if words == 0 {
        return Ok(());
    }
    let params = io_params(gate, up, n_rows, n_cols)?;
    push(rec, act, true, gate, up, out, &params, words as u64)
}

/// CPU reference of [`prepare_q8`]: `values` (a row, a multiple of 32) as the kernel quantizes
/// it, each block's `(quants, d, sum of 0..15, sum of 16..31)`.
pub fn reference_q8(values: &[f32]) -> Vec<([i8; 32], f32, f32, f32)> {
    values
        .chunks(32)
        .map(|blk| {
            let m = blk.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let inv = if m > 1e-30 { 127.0 / m } else { 0.0 };
            let mut q = [0i8; 32];
            for (qi, &v) in q.iter_mut().zip(blk) {
                *qi = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
            }
            let s0: f32 = blk[..16].iter().sum();
            let s1: f32 = blk[16..].iter().sum();
            (q, m / 127.0, s0, s1)
        })
        .collect()
}

/// CPU reference in f64 on plain slices of equal length.
pub fn reference(act: Activation, gate: &[f32], up: &[f32]) -> Vec<f64> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| act.apply(g as f64) * u as f64)
        .collect()
}
