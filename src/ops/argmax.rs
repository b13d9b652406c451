//! `argmax`: the greedy sampler on the GPU (see `shaders/argmax.wgsl`).
//!
//! Logits stay on the GPU (docs/architecture.md, decision 7): a multi-stage reduction leaves one
//! `(value bits, index)` pair in [`Argmax::result`], and the caller reads back the 4-byte index
//! at [`Argmax::INDEX_OFFSET`]. Ties go to the lowest index, like llama.cpp's greedy sampler.
//!
//! [`Argmax::new`] plans the stages and builds every bind group once for a logits buffer; each
//! token then only encodes the dispatches ([`Argmax::encode_pass`]), so the sampler can put them
//! in the same compute pass as the forward pass.

use std::mem::offset_of;

use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gpu::{buffer_entry, entry, grid_2d, CachedPipeline, GpuContext, PipelineKey};

pub const SHADER: &str = "argmax.wgsl";
pub const ENTRY: &str = "argmax";
/// Inputs each invocation reads per stage: a stage shrinks its input by `WG_SIZE * ITEMS`.
pub const ITEMS: u32 = 16;
/// The empty pair's index (fewer inputs than a workgroup's share).
pub const NONE: u32 = u32::MAX;

/// Uniform of `argmax.wgsl`: the input count of one stage.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ArgmaxParams {
    pub n: u32,
    pub _pad0: u32,
    pub _pad1: u32,
    pub _pad2: u32,
}

impl WgslParams for ArgmaxParams {
    const WGSL_NAME: &'static str = "ArgmaxParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n", offset_of!(ArgmaxParams, n)),
        ("_pad0", offset_of!(ArgmaxParams, _pad0)),
        ("_pad1", offset_of!(ArgmaxParams, _pad1)),
        ("_pad2", offset_of!(ArgmaxParams, _pad2)),
    ];
}

/// The pipeline key: the first stage reads f32 logits, later ones `(bits, index)` pairs; the
/// last stage of a chained decode advances the step (`ADVANCE`, [`Argmax::chained`]).
pub fn key(workgroup_size: u32, from_logits: bool, advance: bool) -> PipelineKey {
    let mut k = PipelineKey::new(SHADER, ENTRY)
        .workgroup_size(workgroup_size)
        .define("ITEMS", format!("{ITEMS}u"));
    if from_logits {
        k = k.define("FROM_LOGITS", "");
    }
    if advance {
        k = k.define("ADVANCE", "");
    }
    k
}

pub fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for wg in [64u32, 128, 256] {
        for from_logits in [true, false] {
            for advance in [false, true] {
                v.push(key(wg, from_logits, advance).into());
            }
        }
    }
    v
}

/// The reductions' workgroup size: the largest power of two up to 256 the device allows
/// (tree reductions halve it to 1).
pub fn reduction_workgroup_size(ctx: &GpuContext) -> u32 {
    let wg = ctx.limits.workgroup_size(256);
    1 << (31 - wg.leading_zeros())
}

/// Input counts of each stage for `n` inputs when a workgroup reduces `chunk` inputs to `out`
/// outputs: stage `s` reads `plan[s]` values and dispatches `plan[s].div_ceil(chunk)` workgroups;
/// the last stage has one workgroup. Needs `chunk > out` to shrink.
pub fn plan_stages(n: u64, chunk: u64, out: u64) -> Vec<u64> {
    assert!(chunk > out && n > 0);
    let mut plan = vec![n];
    let mut cur = n;
    while cur > chunk {
        cur = cur.div_ceil(chunk) * out;
        plan.push(cur);
    }
    plan
}

/// The CPU reference: the first index of the largest value (NaN never wins; [`NONE`] when empty).
pub fn cpu_argmax(logits: &[f32]) -> u32 {
    let mut best = NONE;
    for (i, &v) in logits.iter().enumerate() {
        if !v.is_nan() && (best == NONE || v > logits[best as usize]) {
            best = i as u32;
        }
    }
    best
}

/// One dispatch of a multi-stage reduction with its bind group and grid, built once.
pub(crate) struct Stage {
    pub pipe: std::sync::Arc<CachedPipeline>,
    pub bind: wgpu::BindGroup,
    pub grid: [u32; 3],
    // Kept alive for the bind group.
    pub _params: wgpu::Buffer,
}

impl Stage {
    pub fn dispatch(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipe.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(self.grid[0], self.grid[1], self.grid[2]);
    }
}

/// A binding of the first `bytes` bytes of `buf`.
pub(crate) fn head(buf: &wgpu::Buffer, bytes: u64) -> wgpu::BindingResource<'_> {
    wgpu::BindingResource::Buffer(wgpu::BufferBinding {
        buffer: buf,
        offset: 0,
        size: std::num::NonZeroU64::new(bytes.max(4)),
    })
}

/// Check that `n` f32 logits fit the buffer and one binding.
pub(crate) fn check_logits(ctx: &GpuContext, logits: &wgpu::Buffer, n: u32) -> Result<()> {
    let bytes = n as u64 * 4;
    if n == 0 || bytes > logits.size() {
        return Err(Error::internal(format!(
            "{n} logits do not fit a {}-byte buffer",
            logits.size()
        )));
    }
    if bytes > ctx.limits.max_binding() {
        return Err(Error::internal(format!(
            "{n} logits exceed the {}-byte binding limit",
            ctx.limits.max_binding()
        )));
    }
    Ok(())
}

/// Argmax over the first `n` f32s of one logits buffer: stages, scratch and bind groups.
pub struct Argmax {
    pub n: u32,
    stages: Vec<Stage>,
    result: wgpu::Buffer,
    _scratch: Vec<wgpu::Buffer>,
}

impl Argmax {
    /// Byte offset of the winning index in [`Argmax::result`] (`(value bits, index)`).
    pub const INDEX_OFFSET: u64 = 4;

    /// Plan the reduction for `logits` (at least `n` f32, `COPY_SRC` not needed).
    pub fn new(ctx: &GpuContext, logits: &wgpu::Buffer, n: u32) -> Result<Self> {
        Self::build(ctx, logits, n, None)
    }

    /// The reduction whose last stage also advances a chained greedy decode: the winner goes
    /// to `step`'s first token id (the next step's input, [`crate::gpu::Step`]) and to
    /// `chain[state.chained]` as its `(value bits, index)` pair, then `chained` counts it and
    /// the positions move on by one token (`pos0 = n_past`, `n_past + 1`). So the steps of a
    /// chain need no write or copy from the CPU between them; `chain` is read back once.
    /// `step` must hold a decode step's state (one token); `chain` holds `chain.size() / 8`
    /// pairs, and a step past them overwrites the last.
    pub fn chained(
        ctx: &GpuContext,
        logits: &wgpu::Buffer,
        n: u32,
        step: &wgpu::Buffer,
        chain: &wgpu::Buffer,
    ) -> Result<Self> {
        let step_bytes = (crate::gpu::Step::IDS_OFFSET + 1) * 4;
        if step.size() < step_bytes || chain.size() < 8 {
            return Err(Error::internal(format!(
                "argmax: a chained step needs a {step_bytes}-byte step buffer (has {}) and room \
                 for one id pair in the chain (has {} bytes)",
                step.size(),
                chain.size()
            )));
        }
        Self::build(ctx, logits, n, Some((step, chain)))
    }

    fn build(
        ctx: &GpuContext,
        logits: &wgpu::Buffer,
        n: u32,
        advance: Option<(&wgpu::Buffer, &wgpu::Buffer)>,
    ) -> Result<Self> {
        check_logits(ctx, logits, n)?;
        let wg = reduction_workgroup_size(ctx);
        let chunk = (wg * ITEMS) as u64;
        let plan = plan_stages(n as u64, chunk, 1);
        let result = ctx.empty_storage("argmax result", 8)?;
        let mut scratch = Vec::new();
        let mut stages = Vec::new();
        for (s, &n_in) in plan.iter().enumerate() {
            let groups = n_in.div_ceil(chunk);
            let last = s + 1 == plan.len();
            if !last {
                scratch.push(ctx.empty_storage("argmax scratch", groups * 8)?);
            }
            let advance = advance.filter(|_| last);
            let pipe = ctx.pipeline(&key(wg, s == 0, advance.is_some()))?;
            let params = ctx.uniform_buffer_owned(
                "argmax params",
                &ArgmaxParams {
                    n: n_in as u32,
                    ..Default::default()
                },
            );
            let src = if s == 0 {
                head(logits, n_in * 4)
            } else {
                head(&scratch[s - 1], n_in * 8)
            };
            let dst = if last {
                head(&result, 8)
            } else {
                head(&scratch[s], groups * 8)
            };
            let mut entries = vec![buffer_entry(0, &params), entry(1, src), entry(2, dst)];
            if let Some((step, chain)) = advance {
                entries.push(buffer_entry(3, step));
                entries.push(buffer_entry(4, chain));
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
        }
        Ok(Argmax {
            n,
            stages,
            result,
            _scratch: scratch,
        })
    }

    /// `(value bits, index)` of the maximum after [`Argmax::encode_pass`] ran (8 bytes, `COPY_SRC`).
    pub fn result(&self) -> &wgpu::Buffer {
        &self.result
    }

    /// Dispatches in a compute pass the caller owns (one pass per token).
    pub fn encode_pass(&self, pass: &mut wgpu::ComputePass<'_>) {
        for s in &self.stages {
            s.dispatch(pass);
        }
    }

    /// The dispatches in a compute pass of their own.
    pub fn encode(&self, encoder: &mut wgpu::CommandEncoder) {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("argmax"),
            timestamp_writes: None,
        });
        self.encode_pass(&mut pass);
    }

    /// Number of dispatches per token.
    pub fn stages(&self) -> usize {
        self.stages.len()
    }

    /// Encode, submit and read back the 4-byte index (tests and one-off use).
    pub async fn run(&self, ctx: &GpuContext) -> Result<u32> {
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("argmax"),
            });
        self.encode(&mut enc);
        ctx.submit([enc.finish()]);
        let b = crate::gpu::read_buffer(ctx, &self.result, Self::INDEX_OFFSET, 4).await?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_shrink_to_one_workgroup() {
        assert_eq!(plan_stages(1, 4096, 1), vec![1]);
        assert_eq!(plan_stages(4096, 4096, 1), vec![4096]);
        assert_eq!(plan_stages(4097, 4096, 1), vec![4097, 2]);
        assert_eq!(plan_stages(262144, 4096, 1), vec![262144, 64]);
        assert_eq!(plan_stages(262144, 1024, 64), vec![262144, 16384, 1024]);
        assert_eq!(plan_stages(1 << 30, 1024, 1), vec![1 << 30, 1 << 20, 1024]);
    }

    #[test]
    fn cpu_argmax_takes_the_first_maximum() {
        assert_eq!(cpu_argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(cpu_argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
        assert_eq!(cpu_argmax(&[f32::NAN, 1.0]), 1);
        assert_eq!(cpu_argmax(&[]), NONE);
    }
}
