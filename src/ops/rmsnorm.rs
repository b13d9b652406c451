//! `rmsnorm`: `out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w` over `n_rows` rows (see
//! `shaders/rmsnorm.wgsl`), optionally after a fused residual add `x += add`.
//!
//! Also the per-head QK-norm: rows = `T * n_heads`, `row_len = head_dim`, one weight for every
//! head. `out` may be `x` itself (in place): the kernel then binds the buffer once, since WebGPU
//! (Dawn) rejects a buffer bound twice when either binding is writable.

use std::mem::offset_of;

use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use crate::gpu::{buffer_entry, grid_2d, GpuContext, GpuTensor, PipelineKey, Recorder};

pub const SHADER: &str = "rmsnorm.wgsl";
pub const ENTRY: &str = "rmsnorm";

/// Uniform of `rmsnorm.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RmsNormParams {
    pub n_rows: u32,
    pub row_len: u32,
    pub eps: f32,
    /// Element indices of `x[0, 0]`, `out[0, 0]`, `add[0, 0]` and `w[0]`.
    pub x_offset: u32,
    pub out_offset: u32,
    pub add_offset: u32,
    pub w_offset: u32,
    /// Residual scale of the addend (with `add`).
    pub add_scale: f32,
}

impl WgslParams for RmsNormParams {
    const WGSL_NAME: &'static str = "RmsNormParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_rows", offset_of!(RmsNormParams, n_rows)),
        ("row_len", offset_of!(RmsNormParams, row_len)),
        ("eps", offset_of!(RmsNormParams, eps)),
        ("x_offset", offset_of!(RmsNormParams, x_offset)),
        ("out_offset", offset_of!(RmsNormParams, out_offset)),
        ("add_offset", offset_of!(RmsNormParams, add_offset)),
        ("w_offset", offset_of!(RmsNormParams, w_offset)),
        ("add_scale", offset_of!(RmsNormParams, add_scale)),
    ];
}

/// What the kernel is built for: the variant flags and the workgroup size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RmsNormVariant {
    pub weight: bool,
    pub add: bool,
    /// The addend is normed (with its own weight) before it is added.
    pub add_norm: bool,
    pub out_is_x: bool,
    pub workgroup_size: u32,
    /// Elements each thread keeps in registers (`KEEP`, see the shader); 0 for the strided loop.
    pub keep: u32,
    /// With `keep`: read and write every binding as vec4s (`VEC4`): the row length and every
    /// offset are multiples of 4.
    pub vec4: bool,
}

/// The most values a thread keeps in registers ([`RmsNormVariant::keep`]).
pub const MAX_KEEP: u32 = 32;

/// [`RmsNormVariant::keep`] for rows of `row_len` at `workgroup_size`, each thread's elements
/// `width` values wide (4 with [`RmsNormVariant::vec4`], else 1).
pub fn keep_for(row_len: u32, workgroup_size: u32, width: u32) -> u32 {
    let keep = row_len.div_ceil(workgroup_size.max(1) * width.max(1));
    if keep <= MAX_KEEP {
        keep
    } else {
        0
    }
}

pub fn key(v: RmsNormVariant) -> PipelineKey {
    let mut k = PipelineKey::new(SHADER, ENTRY).workgroup_size(v.workgroup_size);
    k = k.define(
        "X_ACCESS",
        if v.add || v.out_is_x {
            "read_write"
        } else {
            "read"
        },
    );
    if v.keep > 0 {
        k = k.define("KEEP", format!("{}u", v.keep));
    }
    let vec4 = v.keep > 0 && v.vec4;
    k = k
        .define("VT", if vec4 { "vec4<f32>" } else { "f32" })
        .define("VW", if vec4 { "4u" } else { "1u" });
    if vec4 {
        k = k.define("VEC4", "");
    }
    for (on, name) in [
        (v.weight, "WEIGHT"),
        (v.add, "ADD"),
        (v.add && v.add_norm, "ADD_NORM"),
        (v.out_is_x, "OUT_IS_X"),
    ] {
        if on {
            k = k.define(name, "");
        }
    }
    k
}

/// Whether the vec4 form may be chosen: always, but on native builds `CERA_RMSNORM_VEC4=0` (a
/// bench knob) keeps the scalar one, for comparison.
fn vec4_enabled() -> bool {
    !crate::gpu::knob::knob_off("CERA_RMSNORM_VEC4")
}

/// The workgroup size for this device: a power of two (the tree reduction halves it), 64 on a
/// CPU adapter (fewer idle lanes per barrier), 256 elsewhere, within the limits.
pub fn workgroup_size(ctx: &GpuContext) -> u32 {
    let want = if super::matmul::is_cpu_adapter(ctx) {
        64
    } else {
        256
    };
    let wg = ctx.limits.workgroup_size(want);
    1 << (31 - wg.leading_zeros())
}

/// Every flag combination at the two workgroup sizes the engine picks.
pub fn variants() -> Vec<Variant> {
    let mut out = Vec::new();
    for wg in [64u32, 256] {
        for bits in 0..16u32 {
            let (add, add_norm) = (bits & 2 != 0, bits & 8 != 0);
            if add_norm && !add {
                continue;
            }
            let v = RmsNormVariant {
                weight: bits & 1 != 0,
                add,
                add_norm,
                out_is_x: bits & 4 != 0,
                workgroup_size: wg,
                keep: 0,
                vec4: false,
            };
            for (keep, vec4) in [
                (0, false),
                (1, false),
                (5, false),
                (MAX_KEEP, false),
                (1, true),
                (4, true),
            ] {
                out.push(key(RmsNormVariant { keep, vec4, ..v }).into());
            }
        }
    }
    out
}

fn u32_of(what: &str, v: u64) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::invalid(format!("rmsnorm: {what} = {v} does not fit in u32")))
}

/// RMSNorm of `n_rows` rows of `row_len`, optionally after `x += add`.
///
/// - `x`: `(n_rows, row_len)` f32 from element `x_offset`; written back (`x + add`) with `add`
/// - `add`: `(n_rows, row_len)` f32 (buffer, element offset); a buffer other than `x` and `out`
/// - `w`: `(row_len)` f32 weight (one part), or none for an unweighted norm
/// - `out`: `(n_rows, row_len)` f32 from element `out_offset`; may be `x`'s buffer (in place when
///   the offsets are equal; otherwise the two ranges must not overlap)
#[allow(clippy::too_many_arguments)]
pub fn encode(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    x: &wgpu::Buffer,
    x_offset: u64,
    add: Option<(&wgpu::Buffer, u64)>,
    w: Option<&GpuTensor>,
    out: &wgpu::Buffer,
    out_offset: u64,
    n_rows: u32,
    row_len: u32,
    eps: f32,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare(
        &mut rec, x, x_offset, add, w, out, out_offset, n_rows, row_len, eps,
    )?;
    rec.encode(encoder)
}

/// Prepare the dispatch of [`encode`].
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    x_offset: u64,
    add: Option<(&wgpu::Buffer, u64)>,
    w: Option<&GpuTensor>,
    out: &wgpu::Buffer,
    out_offset: u64,
    n_rows: u32,
    row_len: u32,
    eps: f32,
) -> Result<()> {
    let add = add.map(|(buffer, offset)| Residual {
        buffer,
        offset,
        scale: 1.0,
        norm: None,
    });
    prepare_residual(
        rec, x, x_offset, add, w, out, out_offset, n_rows, row_len, eps,
    )
}

/// The addend of a fused residual add: `x += rmsnorm(add) * norm * scale` (with a norm weight,
/// a post-norm), or `x += add * scale`.
#[derive(Clone, Copy)]
pub struct Residual<'a> {
    /// `(n_rows, row_len)` f32 from element `offset`; a buffer other than `x` and `out`.
    pub buffer: &'a wgpu::Buffer,
    pub offset: u64,
    pub scale: f32,
    /// `(row_len)` f32 weight of the addend's own norm.
    pub norm: Option<&'a GpuTensor>,
}

/// [`prepare`] with a [`Residual`] addend: a block's post-norm, its residual add and the next
/// pre-norm in one dispatch.
#[allow(clippy::too_many_arguments)]
pub fn prepare_residual(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    x_offset: u64,
    add: Option<Residual>,
    w: Option<&GpuTensor>,
    out: &wgpu::Buffer,
    out_offset: u64,
    n_rows: u32,
    row_len: u32,
    eps: f32,
) -> Result<()> {
    let ctx = rec.ctx;
    if n_rows == 0 || row_len == 0 {
        return Ok(());
    }
    for w in [w, add.and_then(|a| a.norm)].into_iter().flatten() {
        if w.ty != GgmlType::F32 || w.rows * w.cols != row_len as u64 || w.parts.len() != 1 {
            return Err(Error::invalid(format!(
                "rmsnorm: weight {} is {} {}x{} in {} parts; an f32 vector of {row_len} in one part is needed",
                w.name,
                w.ty,
                w.rows,
                w.cols,
                w.parts.len()
            )));
        }
    }
    if let Some(a) = add {
        if a.buffer == x || a.buffer == out {
            return Err(Error::invalid(
                "rmsnorm: the residual `add` must be a buffer other than x and out",
            ));
        }
    }
    let v = RmsNormVariant {
        weight: w.is_some(),
        add: add.is_some(),
        add_norm: add.is_some_and(|a| a.norm.is_some()),
        out_is_x: out == x,
        workgroup_size: workgroup_size(ctx),
        keep: 0,
        vec4: false,
    };
    // vec4 elements where every row and offset is whole vec4s (the weights start at 0).
    let vec4 = [
        row_len as u64,
        x_offset,
        out_offset,
        add.map_or(0, |a| a.offset),
    ]
    .iter()
    .all(|n| n % 4 == 0)
        && keep_for(row_len, v.workgroup_size, 4) > 0
        && vec4_enabled();
    let v = if vec4 {
        RmsNormVariant {
            keep: keep_for(row_len, v.workgroup_size, 4),
            vec4,
            ..v
        }
    } else {
        RmsNormVariant {
            keep: keep_for(row_len, v.workgroup_size, 1),
            ..v
        }
    };
    let pipe = ctx.pipeline(&key(v))?;
    let params = RmsNormParams {
        n_rows,
        row_len,
        eps,
        x_offset: u32_of("x offset", x_offset)?,
        out_offset: u32_of("out offset", out_offset)?,
        add_offset: u32_of("add offset", add.map_or(0, |a| a.offset))?,
        w_offset: 0,
        add_scale: add.map_or(1.0, |a| a.scale),
    };
    let label = pipe.key.label();
    let ubuf = rec.uniform(&label, &params);
    let mut entries = vec![buffer_entry(0, &ubuf), buffer_entry(1, x)];
    if !v.out_is_x {
        entries.push(buffer_entry(2, out));
    }
    if let Some(a) = add {
        entries.push(buffer_entry(3, a.buffer));
        if let Some(n) = a.norm {
            entries.push(buffer_entry(5, &n.parts[0].buffer));
        }
    }
    if let Some(w) = w {
        entries.push(buffer_entry(4, &w.parts[0].buffer));
    }
    let grid = grid_2d(
        n_rows as u64,
        ctx.limits.max_compute_workgroups_per_dimension,
    )?;
    rec.push("rmsnorm", &pipe, &entries, grid);
    Ok(())
}

/// CPU reference in f64: the norm of `x` (after `+ add` when given) times `w` (when given), and
/// the sum `x + add`. Rows are `row_len` long.
pub fn reference(
    x: &[f32],
    add: Option<&[f32]>,
    w: Option<&[f32]>,
    row_len: usize,
    eps: f32,
) -> (Vec<f64>, Vec<f64>) {
    let sum: Vec<f64> = match add {
        Some(a) => x
            .iter()
            .zip(a)
            .map(|(&p, &q)| p as f64 + q as f64)
            .collect(),
        None => x.iter().map(|&p| p as f64).collect(),
    };
    let mut out = Vec::with_capacity(sum.len());
    for row in sum.chunks(row_len) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / row_len as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        out.extend(
            row.iter()
                .enumerate()
                .map(|(i, v)| v * inv * w.map_or(1.0, |w| w[i] as f64)),
        );
    }
    (out, sum)
}

/// CPU reference of [`prepare_residual`] in f64: `x + rmsnorm(add) * add_w * scale` (or
/// `x + add * scale` without `add_w`), then its norm times `w`. Returns `(out, sum)`.
pub fn reference_residual(
    x: &[f32],
    add: &[f32],
    add_w: Option<&[f32]>,
    scale: f32,
    w: Option<&[f32]>,
    row_len: usize,
    eps: f32,
) -> (Vec<f64>, Vec<f64>) {
    let mut addend: Vec<f32> = Vec::with_capacity(add.len());
    for row in add.chunks(row_len) {
        let inv = match add_w {
            Some(_) => {
                1.0 / (row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / row_len as f64
                    + eps as f64)
                    .sqrt()
            }
            None => 1.0,
        };
        addend.extend(row.iter().enumerate().map(|(i, &v)| {
            (v as f64 * inv * add_w.map_or(1.0, |a| a[i] as f64) * scale as f64) as f32
        }));
    }
    reference(x, Some(&addend), w, row_len, eps)
}
