//! Elementwise ops on `(n_rows, n_cols)` f32 views with row strides (see
//! `shaders/elementwise.wgsl`): [`add_scaled`] `out = a + b * scale` (residual add, Granite's
//! residual multiplier, and with a broadcast row a bias add: [`bias_add`]), and [`scale`]
//! `x *= s` in place.
//!
//! Inputs may live in the output's buffer (in place) or share one buffer: [`BindingPlan`] binds
//! each distinct buffer once and tells the shader, through defines, which binding each input
//! reads, because WebGPU (Dawn) rejects a buffer bound twice in a dispatch when either binding
//! is writable. Within one buffer, an input's range must equal the output's or not overlap it.

use std::mem::offset_of;

use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gpu::{buffer_entry, grid_2d, GpuContext, GpuTensor, PipelineKey, Recorder};

pub const SHADER: &str = "elementwise.wgsl";
/// Invocations per workgroup (clamped to the device's limits).
pub const WORKGROUP_SIZE: u32 = 256;

/// Uniform of `elementwise.wgsl` (every entry point).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ElementwiseParams {
    pub n_rows: u32,
    pub n_cols: u32,
    /// Element index of `out[0, 0]` and elements between rows; likewise for `a` and `b`.
    pub out_offset: u32,
    pub out_stride: u32,
    pub a_offset: u32,
    pub a_stride: u32,
    pub b_offset: u32,
    /// 0 broadcasts one row of `b` over every row.
    pub b_stride: u32,
    pub scale: f32,
    pub pad0: u32,
    pub pad1: u32,
    pub pad2: u32,
}

impl WgslParams for ElementwiseParams {
    const WGSL_NAME: &'static str = "ElementwiseParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_rows", offset_of!(ElementwiseParams, n_rows)),
        ("n_cols", offset_of!(ElementwiseParams, n_cols)),
        ("out_offset", offset_of!(ElementwiseParams, out_offset)),
        ("out_stride", offset_of!(ElementwiseParams, out_stride)),
        ("a_offset", offset_of!(ElementwiseParams, a_offset)),
        ("a_stride", offset_of!(ElementwiseParams, a_stride)),
        ("b_offset", offset_of!(ElementwiseParams, b_offset)),
        ("b_stride", offset_of!(ElementwiseParams, b_stride)),
        ("scale", offset_of!(ElementwiseParams, scale)),
        ("pad0", offset_of!(ElementwiseParams, pad0)),
        ("pad1", offset_of!(ElementwiseParams, pad1)),
        ("pad2", offset_of!(ElementwiseParams, pad2)),
    ];
}

/// How a kernel that writes one buffer (`dst`, binding 1) and reads up to two others binds
/// them: the binding name each input reads through (`dst`, `src0`, `src1`) and the buffers of
/// the read-only bindings (`src0` at binding 2, `src1` at binding 3). Shared by `glu`.
pub(crate) struct BindingPlan<'a> {
    pub names: Vec<&'static str>,
    pub reads: Vec<&'a wgpu::Buffer>,
}

/// The binding names for inputs with identities `inputs` and an output `out` (any `PartialEq`
/// stands in for buffer identity, so the variant list can enumerate the patterns).
pub(crate) fn alias_names<T: PartialEq>(out: &T, inputs: &[&T]) -> (Vec<&'static str>, Vec<usize>) {
    const SRC: [&str; 2] = ["src0", "src1"];
    let mut names = Vec::with_capacity(inputs.len());
    let mut owners: Vec<usize> = Vec::new(); // input index owning each read binding
    for (i, b) in inputs.iter().enumerate() {
        if *b == out {
            names.push("dst");
        } else if let Some(s) = owners.iter().position(|&o| inputs[o] == *b) {
            names.push(SRC[s]);
        } else {
            names.push(SRC[owners.len()]);
            owners.push(i);
        }
    }
    (names, owners)
}

impl<'a> BindingPlan<'a> {
    pub fn new(out: &'a wgpu::Buffer, inputs: &[&'a wgpu::Buffer]) -> Self {
        assert!(inputs.len() <= 2, "at most two read bindings");
        let (names, owners) = alias_names(out, inputs);
        BindingPlan {
            names,
            reads: owners.iter().map(|&i| inputs[i]).collect(),
        }
    }

    /// The bind group entries after the uniform: `dst` and the read bindings.
    pub fn entries(&self, out: &'a wgpu::Buffer) -> Vec<wgpu::BindGroupEntry<'a>> {
        let mut e = vec![buffer_entry(1, out)];
        for (i, b) in self.reads.iter().enumerate() {
            e.push(buffer_entry(2 + i as u32, b));
        }
        e
    }
}

/// Every aliasing pattern of two inputs and an output, as `BindingPlan` names and read count.
pub(crate) fn two_input_patterns() -> Vec<(Vec<&'static str>, usize)> {
    let mut v = Vec::new();
    for a in 0..2u8 {
        for b in 0..3u8 {
            let (names, owners) = alias_names(&0u8, &[&a, &b]);
            if !v.iter().any(|(n, _)| *n == names) {
                v.push((names, owners.len()));
            }
        }
    }
    v
}

fn add_key(wg: u32, names: &[&str], reads: usize) -> PipelineKey {
    let mut k = PipelineKey::new(SHADER, "add_scaled")
        .define("ADD_SCALED", "")
        .workgroup_size(wg);
    k = k.define("IN_A", names[0]).define("IN_B", names[1]);
    for i in 0..reads {
        k = k.define(["HAS_SRC0", "HAS_SRC1"][i], "");
    }
    k
}

fn scale_key(wg: u32) -> PipelineKey {
    PipelineKey::new(SHADER, "scale")
        .define("SCALE", "")
        .workgroup_size(wg)
}

/// `add_scaled` in every aliasing pattern, and `scale`, at the default workgroup size.
pub fn variants() -> Vec<Variant> {
    let mut keys: Vec<PipelineKey> = two_input_patterns()
        .iter()
        .map(|(n, r)| add_key(WORKGROUP_SIZE, n, *r))
        .collect();
    keys.push(scale_key(WORKGROUP_SIZE));
    keys.into_iter().map(Variant::from).collect()
}

fn u32_of(what: &str, v: u64) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::invalid(format!("elementwise: {what} = {v} does not fit in u32")))
}

/// A buffer, the element index of `[0, 0]` and the elements between rows.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub offset: u64,
    pub stride: u64,
}

impl<'a> View<'a> {
    /// Rows of `row_len` back to back from element `offset`.
    pub fn rows(buffer: &'a wgpu::Buffer, offset: u64, row_len: u64) -> Self {
        View {
            buffer,
            offset,
            stride: row_len,
        }
    }
}

fn run(
    rec: &mut Recorder,
    key: PipelineKey,
    params: ElementwiseParams,
    entries: Vec<wgpu::BindGroupEntry>,
) -> Result<()> {
    let total = params.n_rows as u64 * params.n_cols as u64;
    u32_of("elements", total)?;
    if total == 0 {
        return Ok(());
    }
    let ctx = rec.ctx;
    let pipe = ctx.pipeline(&key)?;
    let groups = total.div_ceil(pipe.decisions.workgroup_size as u64);
    let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
    let label = pipe.key.label();
    let ubuf = rec.uniform(&label, &params);
    let mut all = vec![buffer_entry(0, &ubuf)];
    all.extend(entries);
    rec.push("elementwise", &pipe, &all, grid);
    Ok(())
}

/// `out[r, i] = a[r, i] + b[r, i] * scale_b` for `(n_rows, n_cols)`.
///
/// - `a`, `b`, `out`: `(n_rows, n_cols)` views (any may share a buffer: the same range, or
///   ranges that do not overlap); `b.stride == 0` broadcasts one row
#[allow(clippy::too_many_arguments)]
pub fn add_scaled(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    a: View,
    b: View,
    scale_b: f32,
    out: View,
    n_rows: u32,
    n_cols: u32,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare_add_scaled(&mut rec, a, b, scale_b, out, n_rows, n_cols)?;
    rec.encode(encoder)
}

/// Prepare the dispatch of [`add_scaled`].
#[allow(clippy::too_many_arguments)]
pub fn prepare_add_scaled(
    rec: &mut Recorder,
    a: View,
    b: View,
    scale_b: f32,
    out: View,
    n_rows: u32,
    n_cols: u32,
) -> Result<()> {
    let ctx = rec.ctx;
    let plan = BindingPlan::new(out.buffer, &[a.buffer, b.buffer]);
    let key = add_key(
        ctx.limits.workgroup_size(WORKGROUP_SIZE),
        &plan.names,
        plan.reads.len(),
    );
    let params = ElementwiseParams {
        n_rows,
        n_cols,
        out_offset: u32_of("out offset", out.offset)?,
        out_stride: u32_of("out stride", out.stride)?,
        a_offset: u32_of("a offset", a.offset)?,
        a_stride: u32_of("a stride", a.stride)?,
        b_offset: u32_of("b offset", b.offset)?,
        b_stride: u32_of("b stride", b.stride)?,
        scale: scale_b,
        ..Default::default()
    };
    run(rec, key, params, plan.entries(out.buffer))
}

/// `x[r, i] += bias[i]` for `(n_rows, n_cols)` in place (Qwen2's Q/K/V biases).
///
/// - `x`: `(n_rows, n_cols)` view (rows `x.stride` apart)
/// - `bias`: `(n_cols)` f32 tensor in one part
pub fn bias_add(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    x: View,
    bias: &GpuTensor,
    n_rows: u32,
    n_cols: u32,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare_bias_add(&mut rec, x, bias, n_rows, n_cols)?;
    rec.encode(encoder)
}

/// Prepare the dispatch of [`bias_add`].
pub fn prepare_bias_add(
    rec: &mut Recorder,
    x: View,
    bias: &GpuTensor,
    n_rows: u32,
    n_cols: u32,
) -> Result<()> {
    if bias.ty != crate::gguf::GgmlType::F32
        || bias.rows * bias.cols != n_cols as u64
        || bias.parts.len() != 1
    {
        return Err(Error::invalid(format!(
            "bias_add: bias {} is not an f32 vector of {n_cols} in one part",
            bias.name
        )));
    }
    let b = View {
        buffer: &bias.parts[0].buffer,
        offset: 0,
        stride: 0,
    };
    prepare_add_scaled(rec, x, b, 1.0, x, n_rows, n_cols)
}

/// `x[r, i] *= s` for `(n_rows, n_cols)` in place.
///
/// - `x`: `(n_rows, n_cols)` view
pub fn scale(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    x: View,
    s: f32,
    n_rows: u32,
    n_cols: u32,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare_scale(&mut rec, x, s, n_rows, n_cols)?;
    rec.encode(encoder)
}

/// Prepare the dispatch of [`scale`].
pub fn prepare_scale(rec: &mut Recorder, x: View, s: f32, n_rows: u32, n_cols: u32) -> Result<()> {
    let params = ElementwiseParams {
        n_rows,
        n_cols,
        out_offset: u32_of("x offset", x.offset)?,
        out_stride: u32_of("x stride", x.stride)?,
        scale: s,
        ..Default::default()
    };
    let entries = vec![buffer_entry(1, x.buffer)];
    let wg = rec.ctx.limits.workgroup_size(WORKGROUP_SIZE);
    run(rec, scale_key(wg), params, entries)
}

/// CPU reference of [`add_scaled`] on plain `(n_rows, n_cols)` slices (`b` of one row broadcasts).
pub fn reference_add_scaled(a: &[f32], b: &[f32], scale_b: f32, n_cols: usize) -> Vec<f64> {
    a.iter()
        .enumerate()
        .map(|(i, &x)| {
            let y = if b.len() == n_cols {
                b[i % n_cols]
            } else {
                b[i]
            };
            x as f64 + y as f64 * scale_b as f64
        })
        .collect()
}

/// CPU reference of [`scale`].
pub fn reference_scale(x: &[f32], s: f32) -> Vec<f64> {
    x.iter().map(|&v| v as f64 * s as f64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliasing_patterns_bind_each_buffer_once() {
        // out, a, b as buffer identities.
        assert_eq!(
            alias_names(&0, &[&1, &2]),
            (vec!["src0", "src1"], vec![0, 1])
        );
        assert_eq!(alias_names(&0, &[&0, &2]), (vec!["dst", "src0"], vec![1]));
        assert_eq!(alias_names(&0, &[&1, &1]), (vec!["src0", "src0"], vec![0]));
        assert_eq!(alias_names(&0, &[&1, &0]), (vec!["src0", "dst"], vec![0]));
        assert_eq!(alias_names(&0, &[&0, &0]), (vec!["dst", "dst"], vec![]));
        assert_eq!(two_input_patterns().len(), 5);
    }
}
