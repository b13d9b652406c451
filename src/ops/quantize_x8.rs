//! `quantize_x8`: activations to 8 bits per block of 32 values (see `shaders/quantize_x8.wgsl`),
//! the X operand of the integer-dot-product GEMM ([`super::gemm_q8`]).
//!
//! The output layout is [`super::glu::prepare_q8`]'s, row by row: `n_cols / 4` words of i8
//! quants, then a `(d, d * sum of quants 0..15, d * sum of 16..31, 0)` vec4 of f32 per block of
//! 32; a row takes [`row_words`] words.
//!
//! The rounding is llama.cpp's for the activations of its quantized dot products ([`Style`]):
//! llama.cpp is the specification, and its CPU backend quantizes X so for every quantized
//! weight. Measured on the test model (Gemma 3 270M Q4_K_M), teacher-forced against llama.cpp:
//! X quantized per block of 32 whatever the weight's type (and the mins on X's exact sums)
//! moved the top-1 logits by mean 0.420 on one chat prompt, past the 0.35 the tests allow
//! (llama.cpp's own batched-vs-sequential noise), where the f32 product read 0.302.

use std::mem::offset_of;

use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gpu::{buffer_entry, grid_2d, PipelineKey, Recorder};

pub const SHADER: &str = "quantize_x8.wgsl";
pub const ENTRY: &str = "quantize_x8";
/// Invocations per workgroup (clamped to the device's limits).
pub const WORKGROUP_SIZE: u32 = 128;

/// Uniform of `quantize_x8.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct QuantizeX8Params {
    pub n_rows: u32,
    /// Values per row, a multiple of 32.
    pub n_cols: u32,
    /// Element index of `X[0, 0]` and elements between rows of X.
    pub x_offset: u32,
    pub x_stride: u32,
    /// Word index of row 0's quants and words between rows of the output.
    pub out_offset: u32,
    pub out_stride: u32,
    pub pad0: u32,
    pub pad1: u32,
}

impl WgslParams for QuantizeX8Params {
    const WGSL_NAME: &'static str = "QuantizeX8Params";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_rows", offset_of!(QuantizeX8Params, n_rows)),
        ("n_cols", offset_of!(QuantizeX8Params, n_cols)),
        ("x_offset", offset_of!(QuantizeX8Params, x_offset)),
        ("x_stride", offset_of!(QuantizeX8Params, x_stride)),
        ("out_offset", offset_of!(QuantizeX8Params, out_offset)),
        ("out_stride", offset_of!(QuantizeX8Params, out_stride)),
        ("pad0", offset_of!(QuantizeX8Params, pad0)),
        ("pad1", offset_of!(QuantizeX8Params, pad1)),
    ];
}

/// Words of one quantized row of `n_cols` values (a multiple of 32): a byte a value, then 16
/// bytes a block.
pub const fn row_words(n_cols: u64) -> u64 {
    n_cols / 4 + n_cols / 8
}

/// Bytes of `n_rows` quantized rows of `n_cols` values.
pub const fn bytes(n_rows: u64, n_cols: u64) -> u64 {
    n_rows * row_words(n_cols) * 4
}

/// How X is rounded to 8 bits: as llama.cpp does for the weight type it multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Style {
    /// Weights of 32-value blocks (Q8_0, Q4_0, ...): llama.cpp's Q8_0 activations, a scale
    /// (rounded to f16) per block of 32.
    Q8_0,
    /// The K-quants: llama.cpp's Q8_K activations, one f32 scale per block of 256 from its
    /// value of largest magnitude, signed.
    Q8K,
}

impl Style {
    /// The style llama.cpp quantizes X in for weights of `ty`.
    pub fn for_type(ty: crate::gguf::GgmlType) -> Self {
        use crate::gguf::GgmlType::*;
        match ty {
            Q2K | Q3K | Q4K | Q5K | Q6K => Style::Q8K,
            _ => Style::Q8_0,
        }
    }

    /// Values per scale block.
    pub const fn block(self) -> u32 {
        match self {
            Style::Q8_0 => 32,
            Style::Q8K => 256,
        }
    }
}

pub fn key(style: Style, wg: u32) -> PipelineKey {
    let k = PipelineKey::new(SHADER, ENTRY).workgroup_size(wg);
    match style {
        Style::Q8_0 => k,
        Style::Q8K => k.define("K_STYLE", ""),
    }
}

pub fn variants() -> Vec<Variant> {
    [Style::Q8_0, Style::Q8K]
        .into_iter()
        .flat_map(|s| [key(s, WORKGROUP_SIZE).into(), key(s, 64).into()])
        .collect()
}

fn u32_of(what: &str, v: u64) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::invalid(format!("quantize_x8: {what} = {v} does not fit in u32")))
}

/// Quantize `x (n_rows, n_cols)` (row `r` at element `x_offset + r * x_stride`) in `style` into
/// `out`: row `r` at word `r * row_words(n_cols)`. `out` is a buffer of its own, at least
/// [`bytes`]`(n_rows, n_cols)`; `n_cols` a multiple of the style's block.
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    rec: &mut Recorder,
    style: Style,
    x: &wgpu::Buffer,
    x_offset: u64,
    x_stride: u64,
    out: &wgpu::Buffer,
    n_rows: u32,
    n_cols: u32,
) -> Result<()> {
    if !n_cols.is_multiple_of(style.block()) {
        return Err(Error::invalid(format!(
            "quantize_x8: {n_cols} values a row (not a multiple of {} for {style:?})",
            style.block()
        )));
    }
    if x_stride < n_cols as u64 {
        return Err(Error::invalid(format!(
            "quantize_x8: x stride {x_stride} is below the {n_cols} values a row"
        )));
    }
    if out == x {
        return Err(Error::invalid("quantize_x8: the output in X's buffer"));
    }
    let need = bytes(n_rows as u64, n_cols as u64);
    if out.size() < need {
        return Err(Error::invalid(format!(
            "quantize_x8: {n_rows} x {n_cols} values need {need} bytes, the buffer has {}",
            out.size()
        )));
    }
    // One invocation per output word of quants (4 values).
    let words = n_rows as u64 * (n_cols / 4) as u64;
    if words == 0 {
        return Ok(());
    }
    u32_of("x end", x_offset + n_rows as u64 * x_stride)?;
    u32_of("quant words", words)?;
    let ctx = rec.ctx;
    let pipe = ctx.pipeline(&key(style, ctx.limits.workgroup_size(WORKGROUP_SIZE)))?;
    let wg = pipe.decisions.workgroup_size as u64;
    // A block's invocations work as a team inside one workgroup.
    if !wg.is_multiple_of(style.block() as u64 / 4) {
        return Err(Error::invalid(format!(
            "quantize_x8: workgroups of {wg} invocations cannot hold whole teams of {} for {style:?}",
            style.block() / 4
        )));
    }
    let grid = grid_2d(
        words.div_ceil(wg),
        ctx.limits.max_compute_workgroups_per_dimension,
    )?;
    let params = QuantizeX8Params {
        n_rows,
        n_cols,
        x_offset: u32_of("x offset", x_offset)?,
        x_stride: u32_of("x stride", x_stride)?,
        out_offset: 0,
        out_stride: u32_of("row words", row_words(n_cols as u64))?,
        pad0: 0,
        pad1: 0,
    };
    let label = pipe.key.label();
    let ubuf = rec.uniform(&label, &params);
    let entries = [
        buffer_entry(0, &ubuf),
        buffer_entry(1, x),
        buffer_entry(2, out),
    ];
    rec.push("quantize_x8", &pipe, &entries, grid);
    Ok(())
}
