//! `embed`: gather token embedding rows, `out[t, :] = E[ids[t], :] * scale` (see
//! `shaders/embed.wgsl`), for a table of any GPU weight type (the decoders are matmul's, shared
//! through `shaders/quant_decls.tmpl`).
//!
//! `scale` is the architecture's embedding multiplier: `sqrt(n_embd)` for Gemma, Granite's
//! `embedding_scale`, 1 otherwise. A table split into row-range parts (the real model's 262144 x
//! 640 Q8_0 table is 178 MB, above a 128 MiB binding) costs one dispatch per part, each writing
//! only the tokens whose row it holds.

use std::mem::offset_of;

use super::matmul::{units_per_row, TYPES};
use super::{Variant, WgslParams};
use crate::error::{Error, ErrorCode, Result};
use crate::gguf::GgmlType;
use crate::gpu::{buffer_entry, grid_2d, GpuContext, GpuTensor, PipelineKey, Recorder};

pub const SHADER: &str = "embed.wgsl";
pub const ENTRY: &str = "embed";
/// Invocations per workgroup (clamped to the device's limits).
pub const WORKGROUP_SIZE: u32 = 64;

/// Uniform of `embed.wgsl` for one dispatch (one part of the table).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct EmbedParams {
    pub n_tokens: u32,
    /// Values per row (`n_embd`).
    pub cols: u32,
    /// u32 words per row in the GPU layout.
    pub row_words: u32,
    /// Decode units per row ([`units_per_row`]).
    pub units: u32,
    /// First table row held by this part, and its row count.
    pub row_start: u32,
    pub rows: u32,
    /// Element index of `ids[0]`.
    pub ids_offset: u32,
    /// Element index of `out[0, 0]`, and elements between consecutive tokens' rows.
    pub out_offset: u32,
    pub out_stride: u32,
    pub scale: f32,
    pub pad0: u32,
    pub pad1: u32,
}

impl WgslParams for EmbedParams {
    const WGSL_NAME: &'static str = "EmbedParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_tokens", offset_of!(EmbedParams, n_tokens)),
        ("cols", offset_of!(EmbedParams, cols)),
        ("row_words", offset_of!(EmbedParams, row_words)),
        ("units", offset_of!(EmbedParams, units)),
        ("row_start", offset_of!(EmbedParams, row_start)),
        ("rows", offset_of!(EmbedParams, rows)),
        ("ids_offset", offset_of!(EmbedParams, ids_offset)),
        ("out_offset", offset_of!(EmbedParams, out_offset)),
        ("out_stride", offset_of!(EmbedParams, out_stride)),
        ("scale", offset_of!(EmbedParams, scale)),
        ("pad0", offset_of!(EmbedParams, pad0)),
        ("pad1", offset_of!(EmbedParams, pad1)),
    ];
}

/// The pipeline key for a table type.
pub fn key(ty: GgmlType, workgroup_size: u32) -> Result<PipelineKey> {
    let define = TYPES
        .iter()
        .find(|(t, _)| *t == ty)
        .map(|(_, d)| *d)
        .ok_or_else(|| {
            Error::new(
                ErrorCode::UnsupportedQuant,
                format!("tensor type {ty} has no GPU embedding kernel"),
            )
        })?;
    Ok(PipelineKey::new(SHADER, ENTRY)
        .define(define, "")
        .workgroup_size(workgroup_size))
}

/// One variant per type (the naga test compiles each).
pub fn variants() -> Vec<Variant> {
    TYPES
        .iter()
        .map(|(ty, _)| {
            key(*ty, WORKGROUP_SIZE)
                .expect("every listed type has a define")
                .into()
        })
        .collect()
}

/// Gather `n_tokens` rows of `table` into `out`, times `scale`.
///
/// - `table`: `(rows = n_vocab, cols = n_embd)`, any GPU type, possibly split into parts
/// - `ids`: `(n_tokens)` u32 from element `ids_offset`; an id `>= n_vocab` leaves its row unwritten
/// - `out`: `(n_tokens, n_embd)` f32 from element `out_offset`
#[allow(clippy::too_many_arguments)]
pub fn encode(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    table: &GpuTensor,
    ids: &wgpu::Buffer,
    ids_offset: u64,
    n_tokens: u32,
    scale: f32,
    out: &wgpu::Buffer,
    out_offset: u64,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare(
        &mut rec, table, ids, ids_offset, n_tokens, scale, out, out_offset,
    )?;
    rec.encode(encoder)
}

/// Prepare the dispatches of [`encode`] (one per part of the table).
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    rec: &mut Recorder,
    table: &GpuTensor,
    ids: &wgpu::Buffer,
    ids_offset: u64,
    n_tokens: u32,
    scale: f32,
    out: &wgpu::Buffer,
    out_offset: u64,
) -> Result<()> {
    if n_tokens == 0 || table.rows == 0 {
        return Ok(());
    }
    let ctx = rec.ctx;
    let pipe = ctx.pipeline(&key(table.ty, ctx.limits.workgroup_size(WORKGROUP_SIZE))?)?;
    let wg = pipe.decisions.workgroup_size as u64;
    let u32_of = |what: &str, v: u64| {
        u32::try_from(v).map_err(|_| {
            Error::invalid(format!(
                "embed {}: {what} = {v} does not fit in u32",
                table.name
            ))
        })
    };
    let units = units_per_row(table.ty, table.cols);
    let label = pipe.key.label();
    for part in table.parts.iter().filter(|p| p.rows > 0) {
        let params = EmbedParams {
            n_tokens,
            cols: u32_of("cols", table.cols)?,
            row_words: u32_of("row words", table.row_bytes / 4)?,
            units: u32_of("units", units)?,
            row_start: u32_of("row start", part.row_start)?,
            rows: u32_of("rows", part.rows)?,
            ids_offset: u32_of("ids offset", ids_offset)?,
            out_offset: u32_of("out offset", out_offset)?,
            out_stride: u32_of("cols", table.cols)?,
            scale,
            pad0: 0,
            pad1: 0,
        };
        let groups = (n_tokens as u64 * units).div_ceil(wg);
        let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
        let ubuf = rec.uniform(&label, &params);
        rec.push(
            "embed",
            &pipe,
            &[
                buffer_entry(0, &ubuf),
                buffer_entry(1, &part.buffer),
                buffer_entry(2, ids),
                buffer_entry(3, out),
            ],
            grid,
        );
    }
    Ok(())
}

/// CPU reference: `out[t, c] = table[ids[t], c] * scale` in f64, from the f32 rows of the table
/// (`(rows, cols)`, e.g. `crate::quant::dequantize_to_vec` of its GGUF bytes).
pub fn reference(table: &[f32], cols: usize, ids: &[u32], scale: f32) -> Vec<f64> {
    ids.iter()
        .flat_map(|&id| {
            table[id as usize * cols..(id as usize + 1) * cols]
                .iter()
                .map(move |&v| v as f64 * scale as f64)
        })
        .collect()
}
