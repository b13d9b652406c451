//! GEMV bandwidth benchmark (`cera bench-gemv`): per weight type and model shape, the GB/s of
//! weight bytes (GPU layout) one decode GEMV streams, beside what a plain copy and a plain read of
//! the same number of bytes reach on the same GPU (`shaders/bench_copy.wgsl`).
//!
//! A decode step is a chain of GEMVs, each depending on the last, so the bench records `iters`
//! GEMVs of one weight back to back in one compute pass, as a forward pass records its
//! dispatches (wgpu orders them with a barrier: each writes `y`), prepared once. The pass's
//! timestamps time it where the adapter has them (GPU time, no submit or readback in it), else
//! the wall clock from submit to the end of a 4-byte readback.
//! Iterations adapt: a short run estimates the time of one GEMV, then one run sized to
//! `target_secs`. Small shapes fit in the GPU's L2 cache, and so does their copy: the ratio
//! compares like with like, the absolute GB/s of small shapes is not DRAM bandwidth.

use std::collections::HashMap;
use std::mem::offset_of;

use super::matmul::{self, MatmulConfig};
use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use crate::gpu::{buffer_entry, grid_2d, read_buffer, GpuContext, PipelineKey};
use crate::quant::gpu::{synthetic_rows, upload_tensor};

pub const SHADER: &str = "bench_copy.wgsl";

/// A weight shape of a real model: `rows x cols` (output features x input features).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub name: &'static str,
    pub rows: u64,
    pub cols: u64,
}

const fn shape(name: &'static str, rows: u64, cols: u64) -> Shape {
    Shape { name, rows, cols }
}

/// Gemma 3 270M: n_embd 640, 4 query heads x 256, 1 KV head x 256, n_ff 2048, vocab 262144.
/// The `+` shapes are the fused weights as the model runs them (Q/K/V and gate/up concatenated
/// at load).
pub const GEMMA3_270M: [Shape; 8] = [
    shape("gemma3-270m attn_q+k+v", 1536, 640),
    shape("gemma3-270m ffn_gate+up", 4096, 640),
    shape("gemma3-270m attn_q", 1024, 640),
    shape("gemma3-270m attn_k/v", 256, 640),
    shape("gemma3-270m attn_output", 640, 1024),
    shape("gemma3-270m ffn_gate/up", 2048, 640),
    shape("gemma3-270m ffn_down", 640, 2048),
    shape("gemma3-270m output", 262144, 640),
];

/// Llama 3 8B: n_embd 4096, 32 query heads x 128, 8 KV heads x 128, n_ff 14336, vocab 128256
/// (the `+` shapes as above).
pub const LLAMA3_8B: [Shape; 7] = [
    shape("llama3-8b attn_q+k+v", 6144, 4096),
    shape("llama3-8b ffn_gate+up", 28672, 4096),
    shape("llama3-8b attn_q/output", 4096, 4096),
    shape("llama3-8b attn_k/v", 1024, 4096),
    shape("llama3-8b ffn_gate/up", 14336, 4096),
    shape("llama3-8b ffn_down", 4096, 14336),
    shape("llama3-8b output", 128256, 4096),
];

/// `--quick` (CPU adapters): the Gemma shapes with the output head cut to 16384 rows.
pub const QUICK: [Shape; 6] = [
    shape("gemma3-270m attn_q", 1024, 640),
    shape("gemma3-270m attn_k/v", 256, 640),
    shape("gemma3-270m attn_output", 640, 1024),
    shape("gemma3-270m ffn_gate/up", 2048, 640),
    shape("gemma3-270m ffn_down", 640, 2048),
    shape("gemma3-270m output/16", 16384, 640),
];

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub types: Vec<GgmlType>,
    pub shapes: Vec<Shape>,
    /// Kernel shapes to time; `None`: the one the engine picks for each weight.
    pub configs: Option<Vec<MatmulConfig>>,
    /// Wall time of the timed run of each entry.
    pub target_secs: f64,
    pub max_iters: u32,
    /// The norm epilogue each GEMV runs with (`matmul::Epilogue`), to time what it adds.
    pub epilogue: BenchEpilogue,
    /// Where the GEMV's X comes from.
    pub x: BenchX,
}

/// The X a benchmarked GEMV reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchX {
    /// f32 X from memory (quantized by each workgroup where the shape has `XQ8`).
    F32,
    /// X quantized to 8 bits once, before the timed run, read from memory by every GEMV
    /// (`matmul::prepare_q8_x`): the GEMV without its workgroups' quantization.
    Q8Mem,
    /// As `Q8Mem`, with a quantizing dispatch (`glu::prepare_q8`) before every GEMV: what a
    /// step pays to quantize each GEMV's X once.
    Q8Quantize,
}

/// Which norm epilogue a benchmarked GEMV carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchEpilogue {
    None,
    /// The block's last projection: residual add, `x * w`, the workgroups' sums of squares.
    ResNorm,
    /// The next projection: the output scaled by the norm of [`BENCH_NORM_SUMS`] sums.
    NormScale,
}

/// Sums of squares a benchmarked [`BenchEpilogue::NormScale`] adds: what Llama 3 8B's down
/// projection writes in the engine's shape on a GPU with subgroups (512 workgroups).
pub const BENCH_NORM_SUMS: u32 = 512;

impl BenchOptions {
    /// Every type on the Gemma 3 270M and Llama 3 8B shapes, ~0.2 s per entry.
    pub fn full() -> Self {
        BenchOptions {
            types: matmul::TYPES.iter().map(|(t, _)| *t).collect(),
            shapes: GEMMA3_270M
                .iter()
                .chain(LLAMA3_8B.iter())
                .copied()
                .collect(),
            configs: None,
            target_secs: 0.2,
            max_iters: 2000,
            epilogue: BenchEpilogue::None,
            x: BenchX::F32,
        }
    }

    /// Small shapes and short runs: the whole table in a minute or two on lavapipe.
    pub fn quick() -> Self {
        BenchOptions {
            shapes: QUICK.to_vec(),
            target_secs: 0.02,
            max_iters: 200,
            ..Self::full()
        }
    }
}

/// One line of the table.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchRow {
    pub ty: String,
    pub shape: String,
    pub rows: u64,
    pub cols: u64,
    /// The kernel shape, as [`MatmulConfig`]'s `Display` writes it.
    pub config: String,
    /// Weight bytes one GEMV reads (GPU layout).
    pub weight_bytes: u64,
    pub iters: u32,
    pub us_per_gemv: f64,
    /// Weight bytes per second, GB/s.
    pub gemv_gb_s: f64,
    /// A vec4 copy of as many bytes: (read + written) bytes per second, GB/s.
    pub copy_gb_s: f64,
    /// A vec4 read of as many bytes, GB/s.
    pub read_gb_s: f64,
    /// `gemv_gb_s / copy_gb_s`.
    pub ratio: f64,
}

/// Uniform of `bench_copy.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BenchCopyParams {
    pub n: u32,
    pub per_thread: u32,
    pub threads: u32,
    pub pad0: u32,
}

impl WgslParams for BenchCopyParams {
    const WGSL_NAME: &'static str = "BenchCopyParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n", offset_of!(BenchCopyParams, n)),
        ("per_thread", offset_of!(BenchCopyParams, per_thread)),
        ("threads", offset_of!(BenchCopyParams, threads)),
        ("pad0", offset_of!(BenchCopyParams, pad0)),
    ];
}

/// Workgroup size of the copy kernels (clamped to the device).
const COPY_WG: u32 = 256;
/// Elements each `stream` invocation folds: enough loads in flight per thread, few threads.
const READ_PER_THREAD: u32 = 16;

fn copy_key(ctx: &GpuContext, entry: &'static str) -> PipelineKey {
    PipelineKey::new(SHADER, entry).workgroup_size(ctx.limits.workgroup_size(COPY_WG))
}

/// The copy shader's variants (the naga test compiles each).
pub fn variants() -> Vec<Variant> {
    ["copy", "stream"]
        .into_iter()
        .map(|entry| {
            PipelineKey::new(SHADER, entry)
                .workgroup_size(COPY_WG)
                .into()
        })
        .collect()
}

/// Milliseconds from an arbitrary origin, on both targets.
fn now_ms() -> f64 {
    #[cfg(target_arch = "wasm32")]
    {
        js_sys::Date::now()
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        use std::sync::OnceLock;
        static T0: OnceLock<std::time::Instant> = OnceLock::new();
        T0.get_or_init(std::time::Instant::now)
            .elapsed()
            .as_secs_f64()
            * 1e3
    }
}

/// Time `iters` repetitions of the dispatches `record` records, in one compute pass (as a
/// forward pass records its dispatches: each repetition waits on the barrier before it), in one
/// submission. Where the adapter has timestamp queries the pass's own begin and end timestamps
/// time it (GPU time); elsewhere the wall clock from submit to the end of a 4-byte readback of
/// `sync` (which the work writes). Returns seconds for all of them.
async fn time_batch(
    ctx: &GpuContext,
    sync: &wgpu::Buffer,
    iters: u32,
    record: &dyn Fn(&mut wgpu::ComputePass<'_>),
) -> Result<f64> {
    let gpu_clock = ctx.features.contains(wgpu::Features::TIMESTAMP_QUERY);
    let set = gpu_clock.then(|| {
        ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("bench"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        })
    });
    let mut enc = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("bench"),
        });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("bench"),
            timestamp_writes: set.as_ref().map(|set| wgpu::ComputePassTimestampWrites {
                query_set: set,
                beginning_of_pass_write_index: Some(0),
                end_of_pass_write_index: Some(1),
            }),
        });
        for _ in 0..iters {
            record(&mut pass);
        }
    }
    match set {
        Some(set) => {
            let ticks = crate::gpu::profile::resolve(ctx, enc, &set, 2).await?;
            let span = ticks[1].saturating_sub(ticks[0]);
            Ok(span as f64 * ctx.queue.get_timestamp_period() as f64 / 1e9)
        }
        None => {
            let cmd = enc.finish();
            let t0 = now_ms();
            ctx.submit([cmd]);
            read_buffer(ctx, sync, 0, 4).await?;
            Ok((now_ms() - t0) / 1e3)
        }
    }
}

/// Adaptive timing: a warm-up, a short run to estimate one repetition, then one run sized to
/// `target_secs` (at least the short run's count, at most `max_iters`). Returns (iters, secs).
async fn time_adaptive(
    ctx: &GpuContext,
    sync: &wgpu::Buffer,
    target_secs: f64,
    max_iters: u32,
    record: &dyn Fn(&mut wgpu::ComputePass<'_>),
) -> Result<(u32, f64)> {
    time_batch(ctx, sync, 1, record).await?;
    let probe = 4.min(max_iters.max(1));
    let secs = time_batch(ctx, sync, probe, record).await?;
    let per = secs / probe as f64;
    let iters = ((target_secs / per.max(1e-9)).ceil() as u64)
        .clamp(probe as u64, max_iters.max(1) as u64) as u32;
    if iters == probe {
        return Ok((probe, secs));
    }
    Ok((iters, time_batch(ctx, sync, iters, record).await?))
}

/// A copy and a read of `bytes` (rounded down to 16, capped at the largest binding): GB/s of
/// (read + written) bytes for the copy and of read bytes for the read.
pub async fn bench_copy(
    ctx: &GpuContext,
    bytes: u64,
    target_secs: f64,
    max_iters: u32,
) -> Result<(f64, f64)> {
    let bytes = (bytes.min(ctx.limits.max_binding()) / 16 * 16).max(16);
    let n = u32::try_from(bytes / 16)
        .map_err(|_| Error::invalid(format!("bench copy of {bytes} bytes is too large")))?;
    // Non-zero data (a GPU may compress zeros): a 256 KiB pattern copied over the source.
    let src = ctx.empty_storage("bench copy src", bytes)?;
    let dst = ctx.empty_storage("bench copy dst", bytes)?;
    let pattern: Vec<u32> = (0..(1u32 << 16))
        .map(|i| i.wrapping_mul(0x9E37_79B9) ^ (i >> 3) | 1)
        .collect();
    let seed = ctx.storage_buffer("bench copy pattern", bytemuck::cast_slice(&pattern));
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let mut at = 0u64;
    while at < bytes {
        let len = (bytes - at).min(1 << 18);
        enc.copy_buffer_to_buffer(&seed, 0, &src, at, len);
        at += len;
    }
    ctx.submit([enc.finish()]);

    let wg = ctx.limits.workgroup_size(COPY_WG);
    let mut result = [0.0; 2];
    for (i, entry) in ["copy", "stream"].into_iter().enumerate() {
        let pipe = ctx.pipeline(&copy_key(ctx, entry))?;
        let threads = if entry == "copy" {
            n
        } else {
            n.div_ceil(READ_PER_THREAD)
        };
        let params = BenchCopyParams {
            n,
            per_thread: READ_PER_THREAD,
            threads,
            pad0: 0,
        };
        let ubuf = ctx.uniform_buffer_owned("bench copy params", &params);
        let bind = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(entry),
            layout: &pipe.layout,
            entries: &[
                buffer_entry(0, &ubuf),
                buffer_entry(1, &src),
                buffer_entry(2, &dst),
            ],
        });
        let grid = grid_2d(
            (threads as u64).div_ceil(wg as u64),
            ctx.limits.max_compute_workgroups_per_dimension,
        )?;
        let record = |pass: &mut wgpu::ComputePass<'_>| {
            pass.set_pipeline(&pipe.pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        };
        let (iters, secs) = time_adaptive(ctx, &dst, target_secs, max_iters, &record).await?;
        let moved = if entry == "copy" { 2 * bytes } else { bytes };
        result[i] = moved as f64 * iters as f64 / secs / 1e9;
    }
    Ok((result[0], result[1]))
}

/// The GPU cost of a dispatch that does almost nothing (one workgroup copying 16 bytes per
/// invocation), in microseconds: `n` of them in one pass timed by the pass's timestamps.
/// Returns `(chained, independent)`: each dispatch writing the buffer the previous one wrote (so
/// it waits on a barrier, as the ops of a forward pass do), and each writing a buffer of its own
/// (nothing to wait on). `None` without timestamp queries.
pub async fn dispatch_floor_us(ctx: &GpuContext, n: u32) -> Result<Option<(f64, f64)>> {
    if !ctx.features.contains(wgpu::Features::TIMESTAMP_QUERY) || n == 0 {
        return Ok(None);
    }
    let wg = ctx.limits.workgroup_size(COPY_WG);
    let elems = wg; // one workgroup
    let bytes = elems as u64 * 16;
    let src = ctx.empty_storage("floor src", bytes)?;
    let dsts: Vec<wgpu::Buffer> = (0..n)
        .map(|_| ctx.empty_storage("floor dst", bytes))
        .collect::<Result<_>>()?;
    let pipe = ctx.pipeline(&copy_key(ctx, "copy"))?;
    let params = BenchCopyParams {
        n: elems,
        per_thread: 1,
        threads: elems,
        pad0: 0,
    };
    let ubuf = ctx.uniform_buffer_owned("floor params", &params);
    let bind = |dst: &wgpu::Buffer| {
        ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("floor"),
            layout: &pipe.layout,
            entries: &[
                buffer_entry(0, &ubuf),
                buffer_entry(1, &src),
                buffer_entry(2, dst),
            ],
        })
    };
    let chained = vec![bind(&dsts[0]); n as usize];
    let independent: Vec<wgpu::BindGroup> = dsts.iter().map(bind).collect();
    let period = ctx.queue.get_timestamp_period() as f64;
    let mut result = [0.0; 2];
    for (i, binds) in [&chained, &independent].into_iter().enumerate() {
        let mut best = f64::INFINITY;
        // The best of a few runs: the first pays for warming the pipeline.
        for _ in 0..5 {
            let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("floor"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            });
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("floor"),
                    timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                        query_set: &set,
                        beginning_of_pass_write_index: Some(0),
                        end_of_pass_write_index: Some(1),
                    }),
                });
                pass.set_pipeline(&pipe.pipeline);
                for b in binds.iter() {
                    pass.set_bind_group(0, b, &[]);
                    pass.dispatch_workgroups(1, 1, 1);
                }
            }
            let ticks = crate::gpu::profile::resolve(ctx, enc, &set, 2).await?;
            let (t0, t1) = (ticks[0], ticks[1]);
            best = best.min(t1.saturating_sub(t0) as f64 * period / 1e3 / n as f64);
        }
        result[i] = best;
    }
    Ok(Some((result[0], result[1])))
}

/// One GEMV entry: `ty` weights of `shape` (a prefix of `gguf`, valid blocks of `ty`) in kernel
/// shape `cfg` (or the engine's choice). Returns the row without the copy columns.
async fn bench_one(
    ctx: &GpuContext,
    ty: GgmlType,
    shape: Shape,
    gguf: &[u8],
    cfg: Option<MatmulConfig>,
    opts: &BenchOptions,
) -> Result<BenchRow> {
    let row_bytes = ty.row_bytes(shape.cols).unwrap_or(0) as usize;
    let w = upload_tensor(
        ctx,
        shape.name,
        ty,
        shape.cols,
        shape.rows,
        &gguf[..row_bytes * shape.rows as usize],
        ctx.limits.max_binding(),
    )?;
    let cfg = cfg
        .unwrap_or_else(|| MatmulConfig::gemv_for(ctx, ty, shape.rows, shape.cols))
        .fit(ctx);
    let xs: Vec<f32> = (0..shape.cols)
        .map(|i| ((i % 17) as f32 - 8.0) / 8.0)
        .collect();
    let x = ctx.storage_buffer("bench x", bytemuck::cast_slice(&xs));
    let y = ctx.empty_storage("bench y", shape.rows * 4)?;
    // Prepared once (pipeline, bind group, uniform), recorded `iters` times into one pass.
    let mut rec = crate::gpu::Recorder::new(ctx);
    let ones = vec![1.0f32; shape.rows.max(BENCH_NORM_SUMS as u64) as usize];
    let norm_w = upload_tensor(
        ctx,
        "bench norm",
        GgmlType::F32,
        shape.rows,
        1,
        bytemuck::cast_slice(&ones[..shape.rows as usize]),
        ctx.limits.max_binding(),
    )?;
    let h = ctx.empty_storage("bench h", shape.rows * 4)?;
    let ss = ctx.storage_buffer("bench sums", bytemuck::cast_slice(&ones));
    // 8-bit X from memory, as a GLU dispatch writes it (`glu::prepare_q8` with gate = up = the
    // bench X; the values do not matter for the timing): quantized once here for `Q8Mem`, by a
    // dispatch before every GEMV for `Q8Quantize`.
    let q8 = if opts.x == BenchX::F32 {
        None
    } else {
        if opts.epilogue != BenchEpilogue::None || !matmul::q8_x_fits(ctx, cfg, &w) {
            return Err(Error::invalid(format!(
                "bench-gemv: {ty} {} in {cfg} cannot read 8-bit X from memory (or with an epilogue)",
                shape.name
            )));
        }
        Some(ctx.empty_storage("bench x q8", super::glu::q8_bytes(1, shape.cols))?)
    };
    let quantize = |rec: &mut crate::gpu::Recorder, xq: &wgpu::Buffer| {
        let gate = super::elementwise::View::rows(&x, 0, shape.cols);
        let act = super::glu::Activation::Silu;
        super::glu::prepare_q8(rec, act, gate, gate, xq, 1, shape.cols as u32)
    };
    let config = match (opts.epilogue, &q8) {
        (_, Some(xq)) => {
            let what = if opts.x == BenchX::Q8Quantize {
                quantize(&mut rec, xq)?;
                "quantized"
            } else {
                let mut pre = crate::gpu::Recorder::new(ctx);
                quantize(&mut pre, xq)?;
                let mut enc = ctx.device.create_command_encoder(&Default::default());
                pre.finish().encode(ctx, &mut enc);
                ctx.queue.submit([enc.finish()]);
                "mem"
            };
            matmul::prepare_q8_x(&mut rec, cfg, &w, xq, &y, 0, None)?;
            format!("{cfg} +x8 {what}")
        }
        (BenchEpilogue::None, None) => {
            matmul::prepare(&mut rec, cfg, &w, &x, 0, &y, 0, 1)?;
            cfg.to_string()
        }
        (BenchEpilogue::ResNorm, None) => {
            let epi = matmul::Epilogue::ResNorm(matmul::ResNorm {
                w: &norm_w,
                h: &h,
                ss: &ss,
                scale: 1.0,
            });
            matmul::prepare_epilogue(&mut rec, cfg, &w, &x, 0, None, &y, 0, &epi)?;
            format!("{cfg} +resnorm")
        }
        (BenchEpilogue::NormScale, None) => {
            let epi = matmul::Epilogue::NormScale(matmul::NormScale {
                ss: &ss,
                count: BENCH_NORM_SUMS,
                eps: 1e-5,
            });
            matmul::prepare_epilogue(&mut rec, cfg, &w, &x, 0, None, &y, 0, &epi)?;
            format!("{cfg} +normscale")
        }
    };
    let prepared = rec.finish();
    let record = |pass: &mut wgpu::ComputePass<'_>| prepared.record(pass);
    let (iters, secs) = time_adaptive(ctx, &y, opts.target_secs, opts.max_iters, &record).await?;
    let bytes = w.gpu_bytes();
    Ok(BenchRow {
        ty: ty.name().to_string(),
        shape: shape.name.to_string(),
        rows: shape.rows,
        cols: shape.cols,
        config,
        weight_bytes: bytes,
        iters,
        us_per_gemv: secs / iters as f64 * 1e6,
        gemv_gb_s: bytes as f64 * iters as f64 / secs / 1e9,
        copy_gb_s: 0.0,
        read_gb_s: 0.0,
        ratio: 0.0,
    })
}

/// Run the table, handing each row to `on_row` as it is measured (the CLI prints as it goes).
pub async fn run(
    ctx: &GpuContext,
    opts: &BenchOptions,
    on_row: &mut dyn FnMut(&BenchRow),
) -> Result<Vec<BenchRow>> {
    let mut rows = Vec::new();
    // Copy references by byte count (rounded to 1 KiB: the same size class measures the same).
    let mut copies: HashMap<u64, (f64, f64)> = HashMap::new();
    for &ty in &opts.types {
        // One pool of valid blocks per type, as large as the largest shape: every shape's GGUF
        // bytes are a prefix of it (blocks do not depend on the row length).
        let most = opts
            .shapes
            .iter()
            .filter(|s| s.cols % ty.block_elems() == 0)
            .map(|s| ty.row_bytes(s.cols).unwrap_or(0) * s.rows)
            .max()
            .unwrap_or(0);
        let values = most / ty.block_bytes().max(1) * ty.block_elems();
        let gguf = synthetic_rows(ty, values, 1, ty.id() as u64 + 7);
        // A shape whose rows are not whole blocks of `ty` cannot hold it (Gemma's 640 columns
        // and the 256-value K-quant blocks): models store such tensors in another type.
        for &shape in opts
            .shapes
            .iter()
            .filter(|s| s.cols % ty.block_elems() == 0)
        {
            let configs: Vec<Option<MatmulConfig>> = match &opts.configs {
                Some(c) => c.iter().copied().map(Some).collect(),
                None => vec![None],
            };
            for cfg in configs {
                let mut row = bench_one(ctx, ty, shape, &gguf, cfg, opts).await?;
                let key = row.weight_bytes.div_ceil(1024);
                let (copy, read) = match copies.get(&key) {
                    Some(&c) => c,
                    None => {
                        let c = bench_copy(ctx, row.weight_bytes, opts.target_secs, opts.max_iters)
                            .await?;
                        copies.insert(key, c);
                        c
                    }
                };
                row.copy_gb_s = copy;
                row.read_gb_s = read;
                row.ratio = row.gemv_gb_s / copy;
                on_row(&row);
                rows.push(row);
            }
        }
    }
    Ok(rows)
}
