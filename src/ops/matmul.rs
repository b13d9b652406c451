//! `matmul`: a quantized weight times activations, `Y[t, r] = sum_c W[r, c] * X[t, c]`
//! (see `shaders/matmul.wgsl`). GEMV (decode: one token) and GEMM (prefill: a batch, `NT`
//! tokens per invocation kept in registers) are one kernel with different defines.
//!
//! The weight is a [`GpuTensor`] in the GPU layout of [`crate::quant::gpu`], possibly split into
//! row-range parts: one dispatch per part, writing its rows of `Y`. A split tensor gives exactly
//! the result of an unsplit one (every row is computed the same way).
//!
//! The kernel shape is a decision ([`MatmulConfig`]) recorded in the pipeline key: workgroup
//! size, threads per row (TPR) and tokens per invocation (NT). Two families: thread-per-row with
//! no barrier (for CPU-emulated adapters, where a workgroup barrier is costly: TOOLCHAIN.md) and
//! cooperative rows with a workgroup reduction (for real GPUs: TPR threads read a row's
//! consecutive words, coalesced). Both are tested on every type.

use std::mem::offset_of;

use super::{Variant, WgslParams};
use crate::error::{Error, ErrorCode, Result};
use crate::gguf::GgmlType;
use crate::gpu::{grid_2d, GpuContext, GpuTensor, PipelineKey};

pub const SHADER: &str = "matmul.wgsl";
pub const ENTRY: &str = "matmul";

/// Every type the kernel reads, with its `TYPE_*` define.
pub const TYPES: [(GgmlType, &str); 11] = [
    (GgmlType::F32, "TYPE_F32"),
    (GgmlType::F16, "TYPE_F16"),
    (GgmlType::BF16, "TYPE_BF16"),
    (GgmlType::Q8_0, "TYPE_Q8_0"),
    (GgmlType::Q4_0, "TYPE_Q4_0"),
    (GgmlType::Q4_1, "TYPE_Q4_1"),
    (GgmlType::Q5_0, "TYPE_Q5_0"),
    (GgmlType::Q5_1, "TYPE_Q5_1"),
    (GgmlType::Q4K, "TYPE_Q4_K"),
    (GgmlType::Q5K, "TYPE_Q5_K"),
    (GgmlType::Q6K, "TYPE_Q6_K"),
];

/// Uniform of `matmul.wgsl` for one dispatch (one part of the weight).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MatmulParams {
    /// Rows of W in this part.
    pub rows: u32,
    /// K: values per row.
    pub cols: u32,
    /// u32 words per row in the GPU layout.
    pub row_words: u32,
    /// Decode units per row ([`units_per_row`]).
    pub units: u32,
    pub n_tokens: u32,
    /// Element index of `X[0, 0]`.
    pub x_offset: u32,
    pub x_stride: u32,
    /// Element index of `Y[0, first row of this part]`.
    pub y_offset: u32,
    pub y_stride: u32,
    /// Workgroups along the rows: `ceil(rows / rows_per_workgroup)`.
    pub row_groups: u32,
    pub pad0: u32,
    pub pad1: u32,
}

impl WgslParams for MatmulParams {
    const WGSL_NAME: &'static str = "MatmulParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("rows", offset_of!(MatmulParams, rows)),
        ("cols", offset_of!(MatmulParams, cols)),
        ("row_words", offset_of!(MatmulParams, row_words)),
        ("units", offset_of!(MatmulParams, units)),
        ("n_tokens", offset_of!(MatmulParams, n_tokens)),
        ("x_offset", offset_of!(MatmulParams, x_offset)),
        ("x_stride", offset_of!(MatmulParams, x_stride)),
        ("y_offset", offset_of!(MatmulParams, y_offset)),
        ("y_stride", offset_of!(MatmulParams, y_stride)),
        ("row_groups", offset_of!(MatmulParams, row_groups)),
        ("pad0", offset_of!(MatmulParams, pad0)),
        ("pad1", offset_of!(MatmulParams, pad1)),
    ];
}

/// Decode units per row: what one loop step of the shader's `unit` covers (4 values for float
/// types, half a Q8_0 block, a legacy block, a 64-value K-quant chunk, 16 values of Q6_K).
pub fn units_per_row(ty: GgmlType, cols: u64) -> u64 {
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 => cols.div_ceil(4),
        Q8_0 => cols / 32 * 2,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 => cols / 32,
        Q4K | Q5K => cols / 256 * 4,
        Q6K => cols / 256 * 16,
        _ => 0,
    }
}

/// The kernel shape: a decision stored in the pipeline key, read back by the dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulConfig {
    pub workgroup_size: u32,
    /// Threads per row (a power of two dividing `workgroup_size`); 1 means no barrier.
    pub threads_per_row: u32,
    /// Tokens per invocation (1 for GEMV).
    pub tokens_per_thread: u32,
}

impl MatmulConfig {
    /// Thread per row, no barrier: the shape for CPU-emulated adapters (lavapipe, SwiftShader).
    pub const fn simple(tokens_per_thread: u32) -> Self {
        MatmulConfig { workgroup_size: 64, threads_per_row: 1, tokens_per_thread }
    }

    /// Cooperative rows: `threads_per_row` threads split a row and reduce in workgroup memory.
    pub const fn cooperative(workgroup_size: u32, threads_per_row: u32, tokens_per_thread: u32) -> Self {
        MatmulConfig { workgroup_size, threads_per_row, tokens_per_thread }
    }

    /// The GEMV shape for this device: simple on a CPU adapter, cooperative otherwise.
    pub fn gemv(ctx: &GpuContext) -> Self {
        if is_cpu_adapter(ctx) {
            Self::simple(1)
        } else {
            Self::cooperative(ctx.limits.workgroup_size(256), 8, 1).fit(ctx)
        }
    }

    /// The GEMM shape for this device (8 tokens per invocation).
    pub fn gemm(ctx: &GpuContext) -> Self {
        if is_cpu_adapter(ctx) {
            Self::simple(8)
        } else {
            Self::cooperative(ctx.limits.workgroup_size(256), 8, 8).fit(ctx)
        }
    }

    /// Clamp to the device: workgroup size within limits, TPR a power of two dividing it, the
    /// reduction buffer within workgroup storage.
    pub fn fit(mut self, ctx: &GpuContext) -> Self {
        self.workgroup_size = ctx.limits.workgroup_size(self.workgroup_size);
        let mut tpr = self.threads_per_row.max(1).next_power_of_two().min(self.workgroup_size);
        while self.workgroup_size % tpr != 0 {
            tpr /= 2;
        }
        self.threads_per_row = tpr;
        self.tokens_per_thread = self.tokens_per_thread.max(1);
        while tpr > 1
            && self.workgroup_size * self.tokens_per_thread * 4 > ctx.limits.max_compute_workgroup_storage_size
            && self.tokens_per_thread > 1
        {
            self.tokens_per_thread /= 2;
        }
        self
    }

    pub fn rows_per_workgroup(&self) -> u32 {
        self.workgroup_size / self.threads_per_row
    }

    /// The GEMV shape for a weight of `ty` with `cols` values per row on this device.
    pub fn gemv_for(ctx: &GpuContext, _ty: GgmlType, _cols: u64) -> Self {
        Self::gemv(ctx)
    }
}

/// `wg256 tpr8 nt1`: what the bench prints and `--configs` parses.
impl std::fmt::Display for MatmulConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "wg{} tpr{} nt{}", self.workgroup_size, self.threads_per_row, self.tokens_per_thread)
    }
}

impl std::str::FromStr for MatmulConfig {
    type Err = Error;

    /// Parse what `Display` writes (fields separated by spaces or commas, any order).
    fn from_str(s: &str) -> Result<Self> {
        let mut cfg = MatmulConfig::simple(1);
        for part in s.split([' ', ',']).filter(|p| !p.is_empty()) {
            let num = |prefix: &str| part.strip_prefix(prefix).and_then(|v| v.parse::<u32>().ok());
            if let Some(v) = num("wg") {
                cfg.workgroup_size = v;
            } else if let Some(v) = num("tpr") {
                cfg.threads_per_row = v;
            } else if let Some(v) = num("nt") {
                cfg.tokens_per_thread = v;
            } else {
                return Err(Error::invalid(format!("matmul config {s:?}: unknown field {part:?} (want e.g. \"wg256 tpr8 nt1\")")));
            }
        }
        Ok(cfg)
    }
}

/// Whether the adapter is a CPU (lavapipe, SwiftShader through Vulkan). In the browser wgpu's
/// adapter info is mostly blank, so this is false there and the cooperative shape is used.
pub fn is_cpu_adapter(ctx: &GpuContext) -> bool {
    ctx.adapter.device_type == "Cpu"
}

fn type_define(ty: GgmlType) -> Result<&'static str> {
    TYPES.iter().find(|(t, _)| *t == ty).map(|(_, d)| *d).ok_or_else(|| {
        Error::new(ErrorCode::UnsupportedQuant, format!("tensor type {ty} has no GPU matmul kernel"))
    })
}

/// The pipeline key of a type and shape.
pub fn key(ty: GgmlType, cfg: MatmulConfig) -> Result<PipelineKey> {
    let mut k = PipelineKey::new(SHADER, ENTRY)
        .define(type_define(ty)?, "")
        .workgroup_size(cfg.workgroup_size)
        .define("TPR", format!("{}u", cfg.threads_per_row))
        .define("NT", format!("{}u", cfg.tokens_per_thread));
    if cfg.threads_per_row > 1 {
        k = k.define("COOP", "");
    }
    Ok(k)
}

/// Read a `u32` define back from a key (the dispatch reads the shape the shader was built with).
fn key_u32(key: &PipelineKey, name: &str) -> u32 {
    key.defines.iter().find(|(k, _)| k == name).and_then(|(_, v)| v.trim_end_matches('u').parse().ok()).unwrap_or(1)
}

/// The shapes the engine may pick, for every type (the naga test compiles each).
pub fn variants() -> Vec<Variant> {
    let shapes = [
        MatmulConfig::simple(1),
        MatmulConfig::simple(8),
        MatmulConfig::cooperative(256, 8, 1),
        MatmulConfig::cooperative(256, 8, 8),
        MatmulConfig::cooperative(64, 4, 3),
    ];
    let mut v = Vec::new();
    for (ty, _) in TYPES {
        for cfg in shapes {
            let k = key(ty, cfg).expect("every listed type has a define");
            v.push(Variant { shader: k.shader, entry: k.entry, defines: k.defines });
        }
    }
    v
}

/// `y[r] = sum_c W[r, c] * x[c]` for one token (decode), in the device's GEMV shape.
///
/// - `x`: `(cols)` f32 from element `x_offset`
/// - `y`: `(rows)` f32 from element `y_offset`
pub fn gemv(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    x_offset: u64,
    y: &wgpu::Buffer,
    y_offset: u64,
) -> Result<()> {
    matmul(ctx, encoder, MatmulConfig::gemv(ctx), w, x, x_offset, y, y_offset, 1)
}

/// `Y[t, r] = sum_c W[r, c] * X[t, c]` for `n_tokens` tokens (prefill), in the device's GEMM
/// shape (its GEMV shape for one token).
///
/// - `x`: `(n_tokens, cols)` f32 from element `x_offset`
/// - `y`: `(n_tokens, rows)` f32 from element `y_offset`
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    x_offset: u64,
    y: &wgpu::Buffer,
    y_offset: u64,
    n_tokens: u32,
) -> Result<()> {
    let cfg = if n_tokens == 1 { MatmulConfig::gemv(ctx) } else { MatmulConfig::gemm(ctx) };
    matmul(ctx, encoder, cfg, w, x, x_offset, y, y_offset, n_tokens)
}

/// [`gemm`] with an explicit shape (tests run every shape on every adapter).
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    cfg: MatmulConfig,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    x_offset: u64,
    y: &wgpu::Buffer,
    y_offset: u64,
    n_tokens: u32,
) -> Result<()> {
    if n_tokens == 0 || w.rows == 0 {
        return Ok(());
    }
    let cfg = cfg.fit(ctx);
    let pipe = ctx.pipeline(&key(w.ty, cfg)?)?;
    let wg = pipe.decisions.workgroup_size;
    let rpw = wg / key_u32(&pipe.key, "TPR");
    let nt = key_u32(&pipe.key, "NT");
    let too_big = |what: &str, v: u64| Error::invalid(format!("matmul {}: {what} = {v} does not fit in u32", w.name));
    let u32_of = |what: &str, v: u64| u32::try_from(v).map_err(|_| too_big(what, v));
    let label = pipe.key.label();
    let mut binds = Vec::with_capacity(w.parts.len());
    for part in &w.parts {
        if part.rows == 0 {
            continue;
        }
        let row_groups = part.rows.div_ceil(rpw as u64);
        let groups = row_groups * (n_tokens as u64).div_ceil(nt as u64);
        let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
        let params = MatmulParams {
            rows: u32_of("rows", part.rows)?,
            cols: u32_of("cols", w.cols)?,
            row_words: u32_of("row words", w.row_bytes / 4)?,
            units: u32_of("units", units_per_row(w.ty, w.cols))?,
            n_tokens,
            x_offset: u32_of("x offset", x_offset)?,
            x_stride: u32_of("cols", w.cols)?,
            y_offset: u32_of("y offset", y_offset + part.row_start)?,
            y_stride: u32_of("rows", w.rows)?,
            row_groups: u32_of("row groups", row_groups)?,
            pad0: 0,
            pad1: 0,
        };
        let ubuf = ctx.uniform_buffer(&label, &params);
        let bind = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&label),
            layout: &pipe.layout,
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: ubuf.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: part.buffer.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: x.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 3, resource: y.as_entire_binding() },
            ],
        });
        binds.push((bind, grid));
    }
    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(&label), timestamp_writes: None });
    pass.set_pipeline(&pipe.pipeline);
    for (bind, grid) in &binds {
        pass.set_bind_group(0, bind, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
    }
    Ok(())
}
