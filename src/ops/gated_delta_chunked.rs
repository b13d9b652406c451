//! `gated_delta_chunked`: the gated delta rule in its chunked (WY / UT-transform) form, for
//! prefill batches: the same function as [`gated_delta`](super::gated_delta)'s recurrent form
//! (params, buffers, checks and CPU reference are shared with it), computed `CHUNK` tokens at a
//! time with the decays as cumulative sums of logs inside a chunk and the state carried from
//! chunk to chunk (see `shaders/gated_delta_chunked.wgsl` for the algebra). It reads and leaves
//! the state exactly where the recurrent form does, so decode, checkpoints and restores do not
//! know which form ran.
//!
//! Why: the recurrent form walks the batch token by token with two workgroup reductions per
//! token; here a workgroup synchronises a handful of times per chunk, and the per-token work
//! inside a chunk is independent dot products.

use super::gated_delta::{self, checked_params, DeltaShape, GatedDeltaBuffers};
use super::Variant;
use crate::error::{Error, Result};
use crate::gpu::{grid_2d, GpuContext, PipelineKey, Recorder};

pub const SHADER: &str = "gated_delta_chunked.wgsl";
pub const ENTRY: &str = "gated_delta_chunked";
/// Invocations per workgroup wanted: one value column each at Qwen3.5's head size 128 (fewer
/// where the head is smaller or the device allows fewer).
pub const WORKGROUP_SIZE: u32 = 128;
/// Chunk lengths tried, longest first: the longest whose workgroup arrays fit the device's
/// workgroup memory is taken (at 32 KiB: 16 tokens for heads of 128, 32 for 64, 64 for 16).
pub const CHUNKS: [u32; 4] = [64, 32, 16, 8];
/// Loop iterations one invocation may run on a CPU adapter: lavapipe stops every loop of an
/// invocation after 65535 iterations in total (`shaders/attention.wgsl`, LOOP_NOTE), so there a
/// long batch is split into dispatches of a few chunks each (kept below with a margin).
pub const CPU_MAX_ITERATIONS: u64 = 60_000;

/// The decisions of one variant: what the shader is built with and the dispatch reads back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkedConfig {
    pub workgroup_size: u32,
    /// Tokens per chunk (`CHUNK`).
    pub chunk: u32,
    /// The head size the workgroup arrays are sized for (`HEAD_DIM`).
    pub head_dim: u32,
}

impl ChunkedConfig {
    /// Bytes of workgroup memory: the chunk's keys and queries, the `CHUNK x CHUNK` mixing matrix
    /// and five per-token arrays (`shaders/gated_delta_chunked.wgsl`).
    pub fn workgroup_bytes(chunk: u32, head_dim: u32) -> u64 {
        let c = chunk as u64;
        4 * (2 * c * head_dim as u64 + c * c + 5 * c)
    }

    /// The configuration for heads of `head_dim` on this device: the longest chunk of [`CHUNKS`]
    /// that fits the workgroup memory, or `None` (then only the recurrent form runs).
    pub fn for_device(ctx: &GpuContext, head_dim: u32) -> Option<Self> {
        let mem = ctx.limits.max_compute_workgroup_storage_size as u64;
        let chunk = CHUNKS
            .into_iter()
            .find(|&c| Self::workgroup_bytes(c, head_dim) <= mem)?;
        let workgroup_size = ctx
            .limits
            .workgroup_size(WORKGROUP_SIZE)
            .min(head_dim.max(1));
        Some(ChunkedConfig {
            workgroup_size,
            chunk,
            head_dim,
        })
    }

    /// An upper bound on the loop iterations of one invocation per chunk (every loop of the
    /// shader counted, nested loops at their full product).
    pub fn iterations_per_chunk(&self) -> u64 {
        let (c, n, wg) = (
            self.chunk as u64,
            self.head_dim as u64,
            self.workgroup_size as u64,
        );
        let per_token = c.div_ceil(wg);
        let columns = n.div_ceil(wg);
        per_token * (n + 1) // norms and gates
            + per_token * (c + 1) // cumulative decay
            + (c * n).div_ceil(wg) // keys
            + (c * c).div_ceil(wg) * (n + 1) // A and B
            + columns * (4 * c + 2 * n * (c + 1) + c * (c + 1) + 2) // solve, output, state
            + per_token * (n + 1) // output norm
            + columns * (c + 1) // rescale
            + 1
    }

    /// Chunks one dispatch may cover: all of them on a GPU, a bounded number on a CPU adapter.
    pub fn chunks_per_dispatch(&self, ctx: &GpuContext) -> u32 {
        if crate::ops::matmul::is_cpu_adapter(ctx) {
            let zeroing = (self.head_dim as u64).div_ceil(self.workgroup_size as u64)
                * (self.head_dim as u64 + 1);
            let n = (CPU_MAX_ITERATIONS - zeroing) / self.iterations_per_chunk();
            n.clamp(1, u32::MAX as u64) as u32
        } else {
            u32::MAX
        }
    }

    pub fn key(&self) -> PipelineKey {
        PipelineKey::new(SHADER, ENTRY)
            .workgroup_size(self.workgroup_size)
            .define("CHUNK", format!("{}u", self.chunk))
            .define("HEAD_DIM", format!("{}u", self.head_dim))
    }
}

pub fn variants() -> Vec<Variant> {
    // Qwen3.5's head size at the 32 KiB both test adapters grant, and the tests' small heads.
    [(128, 16, 128), (16, 64, 16)]
        .into_iter()
        .map(|(workgroup_size, chunk, head_dim)| {
            ChunkedConfig {
                workgroup_size,
                chunk,
                head_dim,
            }
            .key()
            .into()
        })
        .collect()
}

/// Whether the chunked form can run heads of `head_dim` on this device.
pub fn supported(ctx: &GpuContext, head_dim: u32) -> bool {
    ChunkedConfig::for_device(ctx, head_dim).is_some()
}

/// Prepare the chunked form for `n_tokens` at positions `step.pos0 + pos0 + t`: one dispatch,
/// or on a CPU adapter one per [`ChunkedConfig::chunks_per_dispatch`] chunks, in order (each
/// continues from the state the one before left).
pub fn prepare(
    rec: &mut Recorder,
    b: &GatedDeltaBuffers,
    shape: &DeltaShape,
    n_tokens: u32,
    pos0: u32,
    step: &wgpu::Buffer,
) -> Result<()> {
    let ctx = rec.ctx;
    if n_tokens == 0 {
        return Ok(());
    }
    let whole = checked_params(b, shape, n_tokens, pos0)?;
    let cfg = ChunkedConfig::for_device(ctx, shape.head_dim).ok_or_else(|| {
        Error::invalid(format!(
            "gated_delta_chunked: heads of {} do not fit the workgroup memory",
            shape.head_dim
        ))
    })?;
    let pipe = ctx.pipeline(&cfg.key())?;
    let grid = grid_2d(
        shape.n_v_heads as u64,
        ctx.limits.max_compute_workgroups_per_dimension,
    )?;
    let per_dispatch = cfg.chunk.saturating_mul(cfg.chunks_per_dispatch(ctx));
    gated_delta::push_parts(
        rec,
        "gated_delta_chunked",
        &pipe,
        b,
        step,
        &whole,
        per_dispatch,
        grid,
    )
}

/// One-off [`prepare`] at positions `pos0 + t` (tests).
pub fn encode(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    b: &GatedDeltaBuffers,
    shape: &DeltaShape,
    n_tokens: u32,
    pos0: u32,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare(&mut rec, b, shape, n_tokens, pos0, ctx.zero_step())?;
    rec.encode(encoder)
}

/// Milliseconds per dispatch of each form, `(recurrent, chunked)`, for a batch of `n_tokens` at
/// position 0 of heads shaped `shape` (random inputs): `iters` calls recorded into one pass and
/// submitted once, after a warm-up; timed from submit to a readback (`cera bench-delta`).
pub async fn bench_forms(
    ctx: &GpuContext,
    shape: &DeltaShape,
    n_tokens: u32,
    iters: u32,
) -> Result<(f64, f64)> {
    let n = n_tokens.max(1) as u64;
    let (s, hv) = (shape.head_dim as u64, shape.n_v_heads as u64);
    let row = shape.qkv_dim();
    let wave = |len: u64, scale: f32| -> Vec<f32> {
        (0..len)
            .map(|i| ((i.wrapping_mul(2654435761) % 1000) as f32 / 500.0 - 1.0) * scale)
            .collect()
    };
    let qkv = ctx.storage_buffer("bench qkv", bytemuck::cast_slice(&wave(n * row, 1.0)));
    let ba = ctx.storage_buffer("bench ba", bytemuck::cast_slice(&wave(n * 2 * hv, 2.0)));
    let mut head: Vec<f32> = vec![0.5; hv as usize];
    head.extend(vec![-1.0; hv as usize]);
    head.extend(vec![1.0; s as usize]);
    let head_w = ctx.storage_buffer("bench head_w", bytemuck::cast_slice(&head));
    let state = ctx.empty_storage("bench state", shape.state_bytes())?;
    let out = ctx.empty_storage("bench out", n * hv * s * 4)?;
    let b = GatedDeltaBuffers {
        qkv: &qkv,
        qkv_stride: row,
        ba: &ba,
        ba_offset: 0,
        ba_stride: 2 * hv,
        head_w: &head_w,
        state: &state,
        out: &out,
        out_offset: 0,
        out_stride: hv * s,
    };
    let mut times = [0.0f64; 2];
    for (form, time) in times.iter_mut().enumerate() {
        let mut rec = Recorder::new(ctx);
        if form == 0 {
            gated_delta::prepare(&mut rec, &b, shape, n_tokens, 0, ctx.zero_step())?;
        } else {
            prepare(&mut rec, &b, shape, n_tokens, 0, ctx.zero_step())?;
        }
        let prepared = rec.finish();
        let run = |k: u32| {
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for _ in 0..k {
                    prepared.record(&mut pass);
                }
            }
            ctx.submit([enc.finish()]);
        };
        run(1);
        crate::gpu::read_buffer(ctx, &out, 0, 4).await?;
        let t0 = crate::generate::session::now_s();
        run(iters.max(1));
        crate::gpu::read_buffer(ctx, &out, 0, 4).await?;
        *time = (crate::generate::session::now_s() - t0) * 1e3 / iters.max(1) as f64;
    }
    Ok((times[0], times[1]))
}
