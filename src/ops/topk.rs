//! `topk`: the K largest logits as `(value, id)` pairs, sorted descending, ties by lower id
//! (see `shaders/topk.wgsl`), plus the full-vocabulary softmax normalizer.
//!
//! The decision: **K = [`TOPK`] = 64**, fixed at compile time. It covers llama.cpp's default
//! `top_k = 40` exactly (any `top_k` in `1..=64` is exact), and a readback of 64 * 8 + 8 bytes
//! per token costs the same round trip as 4 bytes. The kernel's cost grows with K (K rounds of a
//! workgroup reduction per stage), which is why it is not 256. Sampling chains that would look
//! beyond 64 candidates (`top_k == 0` or `> 64`) are cut to 64; the normalizer keeps top-p's
//! probabilities the full-vocabulary ones (see `crate::generate::sampler`).
//!
//! Layout of [`TopK::result`]: `TOPK` pairs `(f32 bits, id)` then `(max, sum exp(x - max))` as two
//! f32: `TOPK * 8 + 8` bytes, read back in one copy. Fewer than K inputs leave empty pairs
//! (id [`NONE`]).

use std::mem::offset_of;

use super::argmax::{check_logits, head, plan_stages, reduction_workgroup_size, Stage};
use super::{Variant, WgslParams};
use crate::error::Result;
use crate::gpu::{buffer_entry, entry, grid_2d, GpuContext, PipelineKey};

pub const SHADER: &str = "topk.wgsl";
pub const ENTRY: &str = "topk";
/// Candidates the GPU keeps: the K of top-K (see the module docs for why 64).
pub const TOPK: u32 = 64;
/// Inputs each invocation sorts per stage.
pub const ITEMS: u32 = 16;
pub const NONE: u32 = u32::MAX;

/// Uniform of `topk.wgsl` for one stage.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct TopkParams {
    pub n: u32,
    /// Workgroups of the previous stage; 0 in the first stage.
    pub n_groups_in: u32,
    pub _pad0: u32,
    pub _pad1: u32,
}

impl WgslParams for TopkParams {
    const WGSL_NAME: &'static str = "TopkParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n", offset_of!(TopkParams, n)),
        ("n_groups_in", offset_of!(TopkParams, n_groups_in)),
        ("_pad0", offset_of!(TopkParams, _pad0)),
        ("_pad1", offset_of!(TopkParams, _pad1)),
    ];
}

pub fn key(workgroup_size: u32, from_logits: bool) -> PipelineKey {
    let k = PipelineKey::new(SHADER, ENTRY)
        .workgroup_size(workgroup_size)
        .define("ITEMS", format!("{ITEMS}u"))
        .define("TOPK", format!("{TOPK}u"));
    if from_logits {
        k.define("FROM_LOGITS", "")
    } else {
        k
    }
}

pub fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for wg in [64u32, 128, 256] {
        for from_logits in [true, false] {
            v.push(key(wg, from_logits).into());
        }
    }
    v
}

/// What the GPU leaves: candidates best first (empty pairs dropped) and the normalizer.
#[derive(Clone, Debug, PartialEq)]
pub struct TopKResult {
    /// `(logit, id)`, descending by logit, ties by lower id; at most [`TOPK`].
    pub candidates: Vec<(f32, u32)>,
    /// Largest logit of the whole vocabulary.
    pub max: f32,
    /// `sum exp(logit - max)` over the whole vocabulary.
    pub sum_exp: f32,
}

impl TopKResult {
    /// Parse the `TOPK * 8 + 8` bytes of [`TopK::result`].
    pub fn from_bytes(b: &[u8]) -> Self {
        let w = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
        let k = TOPK as usize;
        let candidates = (0..k)
            .map(|i| (f32::from_bits(w(2 * i)), w(2 * i + 1)))
            .filter(|&(_, id)| id != NONE)
            .collect();
        TopKResult {
            candidates,
            max: f32::from_bits(w(2 * k)),
            sum_exp: f32::from_bits(w(2 * k + 1)),
        }
    }
}

/// The CPU reference: the `k` best `(logit, id)` (descending, ties by lower id), NaN skipped, and
/// `(max, sum exp(x - max))` in f64.
pub fn cpu_topk(logits: &[f32], k: usize) -> TopKResult {
    let mut all: Vec<(f32, u32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .map(|(i, &v)| (v, i as u32))
        .collect();
    all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    all.truncate(k);
    let max = all.first().map(|c| c.0).unwrap_or(f32::MIN);
    let sum: f64 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| {
            if v == max {
                1.0
            } else {
                ((v - max) as f64).exp()
            }
        })
        .sum();
    TopKResult {
        candidates: all,
        max,
        sum_exp: sum as f32,
    }
}

/// Top-K over the first `n` f32s of one logits buffer: stages, scratch and bind groups.
pub struct TopK {
    pub n: u32,
    stages: Vec<Stage>,
    result: wgpu::Buffer,
    _scratch: Vec<(wgpu::Buffer, wgpu::Buffer)>,
}

impl TopK {
    /// Bytes of [`TopK::result`]: the pairs, then the normalizer.
    pub const RESULT_BYTES: u64 = TOPK as u64 * 8 + 8;

    pub fn new(ctx: &GpuContext, logits: &wgpu::Buffer, n: u32) -> Result<Self> {
        check_logits(ctx, logits, n)?;
        // A stage must shrink its input: CHUNK > TOPK and a multiple of it (powers of two).
        let wg = reduction_workgroup_size(ctx).max(TOPK.div_ceil(ITEMS) * 2);
        let chunk = (wg * ITEMS) as u64;
        assert!(chunk.is_multiple_of(TOPK as u64) && chunk > TOPK as u64);
        let plan = plan_stages(n as u64, chunk, TOPK as u64);
        // One buffer for pairs + stats, so the result is a single copy: pairs at 0, stats after.
        let result = ctx.empty_storage("topk result", Self::RESULT_BYTES)?;
        let mut scratch: Vec<(wgpu::Buffer, wgpu::Buffer)> = Vec::new();
        let mut stages = Vec::new();
        let mut groups_in = 0u64;
        for (s, &n_in) in plan.iter().enumerate() {
            let groups = n_in.div_ceil(chunk);
            let last = s + 1 == plan.len();
            if !last {
                scratch.push((
                    ctx.empty_storage("topk scratch pairs", groups * TOPK as u64 * 8)?,
                    ctx.empty_storage("topk scratch stats", groups * 8)?,
                ));
            }
            let pipe = ctx.pipeline(&key(wg, s == 0))?;
            let params = ctx.uniform_buffer_owned(
                "topk params",
                &TopkParams {
                    n: n_in as u32,
                    n_groups_in: groups_in as u32,
                    ..Default::default()
                },
            );
            let (dst, dst_stats) = if last {
                (head(&result, TOPK as u64 * 8), stats_binding(&result))
            } else {
                (
                    head(&scratch[s].0, groups * TOPK as u64 * 8),
                    head(&scratch[s].1, groups * 8),
                )
            };
            let mut entries = vec![buffer_entry(0, &params), entry(3, dst), entry(4, dst_stats)];
            if s == 0 {
                entries.push(entry(1, head(logits, n_in * 4)));
            } else {
                entries.push(entry(1, head(&scratch[s - 1].0, n_in * 8)));
                entries.push(entry(2, head(&scratch[s - 1].1, groups_in * 8)));
            }
            let bind = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&pipe.key.label()),
                layout: &pipe.layout,
                entries: &entries,
            });
            let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
            stages.push(Stage {
                pipe,
                bind,
                grid,
                _params: params,
            });
            groups_in = groups;
        }
        Ok(TopK {
            n,
            stages,
            result,
            _scratch: scratch,
        })
    }

    /// The `RESULT_BYTES` the last stage writes (`COPY_SRC`); parse with [`TopKResult::from_bytes`].
    pub fn result(&self) -> &wgpu::Buffer {
        &self.result
    }

    pub fn stages(&self) -> usize {
        self.stages.len()
    }

    /// Dispatches in a compute pass the caller owns (one pass per token).
    pub fn encode_pass(&self, pass: &mut wgpu::ComputePass<'_>) {
        for s in &self.stages {
            s.dispatch(pass);
        }
    }

    pub fn encode(&self, encoder: &mut wgpu::CommandEncoder) {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("topk"),
            timestamp_writes: None,
        });
        self.encode_pass(&mut pass);
    }

    /// Encode, submit and read back the result (tests and one-off use).
    pub async fn run(&self, ctx: &GpuContext) -> Result<TopKResult> {
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("topk"),
            });
        self.encode(&mut enc);
        ctx.submit([enc.finish()]);
        let b = crate::gpu::read_buffer(ctx, &self.result, 0, Self::RESULT_BYTES).await?;
        Ok(TopKResult::from_bytes(&b))
    }
}

/// The stats slot of the result buffer (after the pairs).
fn stats_binding(result: &wgpu::Buffer) -> wgpu::BindingResource<'_> {
    wgpu::BindingResource::Buffer(wgpu::BufferBinding {
        buffer: result,
        offset: TOPK as u64 * 8,
        size: std::num::NonZeroU64::new(8),
    })
}
