//! Prepared dispatches: build once, record many times.
//!
//! An op does its work in two steps. *Prepare* (once per session and batch shape): pick the
//! pipeline, write the params uniform, build the bind group and compute the grid, pushing a
//! [`Dispatch`] onto a [`Recorder`]. *Record* (every step): `set_pipeline`, `set_bind_group`,
//! `dispatch_workgroups` into a compute pass that the caller owns. Recording creates no GPU
//! object, so a forward pass made of prepared dispatches costs the CPU only those three calls
//! per dispatch, and the whole forward pass fits in one compute pass.
//!
//! What changes from one step to the next (the position of the first token, the number of
//! cells filled) is not baked into any params struct: kernels that need it read a [`Step`]
//! buffer, written once per step (16 bytes).
//!
//! One-off work (tests, a single op) goes through [`Recorder::encode`], which records the
//! prepared dispatches into a fresh pass of an encoder.

use std::sync::Arc;

use super::pipeline::CachedPipeline;
use super::GpuContext;
use crate::error::Result;

/// One compute dispatch with everything it binds, built once.
pub struct Dispatch {
    pub pipe: Arc<CachedPipeline>,
    pub bind: wgpu::BindGroup,
    pub grid: [u32; 3],
    /// The op family, for per-kernel timing and counts (`"matmul"`, `"rmsnorm"`, ...).
    pub kind: &'static str,
}

impl Dispatch {
    /// Record into `pass`; an empty grid records nothing.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        if self.grid.contains(&0) {
            return;
        }
        pass.set_pipeline(&self.pipe.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(self.grid[0], self.grid[1], self.grid[2]);
    }

    pub fn is_empty(&self) -> bool {
        self.grid.contains(&0)
    }
}

/// Collects prepared dispatches (in order) and the uniform buffers they bind.
pub struct Recorder<'c> {
    pub ctx: &'c GpuContext,
    dispatches: Vec<Dispatch>,
    /// Uniform buffers of the prepared params, owned with the dispatches that bind them.
    uniforms: Vec<wgpu::Buffer>,
}

impl<'c> Recorder<'c> {
    pub fn new(ctx: &'c GpuContext) -> Self {
        Recorder {
            ctx,
            dispatches: Vec::new(),
            uniforms: Vec::new(),
        }
    }

    /// A uniform buffer holding `value`, kept as long as the prepared dispatches are.
    pub fn uniform<T: bytemuck::Pod>(&mut self, label: &str, value: &T) -> wgpu::Buffer {
        let buf = self.ctx.uniform_buffer_owned(label, value);
        self.uniforms.push(buf.clone());
        buf
    }

    /// Build the bind group of `pipe` from `(binding, resource)` pairs and push the dispatch.
    pub fn push(
        &mut self,
        kind: &'static str,
        pipe: &Arc<CachedPipeline>,
        entries: &[wgpu::BindGroupEntry<'_>],
        grid: [u32; 3],
    ) {
        if grid.contains(&0) {
            return;
        }
        let label = pipe.key.label();
        let bind = self
            .ctx
            .device
            .create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&label),
                layout: &pipe.layout,
                entries,
            });
        self.dispatches.push(Dispatch {
            pipe: pipe.clone(),
            bind,
            grid,
            kind,
        });
    }

    pub fn len(&self) -> usize {
        self.dispatches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dispatches.is_empty()
    }

    /// The prepared work, to be recorded many times.
    pub fn finish(self) -> Prepared {
        Prepared {
            dispatches: self.dispatches,
            _uniforms: self.uniforms,
        }
    }

    /// Record everything prepared so far into one new compute pass of `enc` (one-off use).
    pub fn encode(self, enc: &mut wgpu::CommandEncoder) -> Result<()> {
        let ctx = self.ctx;
        let prepared = self.finish();
        prepared.encode(ctx, enc);
        Ok(())
    }
}

/// Dispatches prepared once, with the uniforms they bind.
#[derive(Default)]
pub struct Prepared {
    pub dispatches: Vec<Dispatch>,
    _uniforms: Vec<wgpu::Buffer>,
}

impl Prepared {
    /// Record every dispatch, in order, into `pass`.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        for d in &self.dispatches {
            d.record(pass);
        }
    }

    /// Record into one new compute pass of `enc` (counted in `ctx`).
    pub fn encode(&self, ctx: &GpuContext, enc: &mut wgpu::CommandEncoder) {
        if self.dispatches.is_empty() {
            return;
        }
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: None,
        });
        self.record(&mut pass);
        ctx.count_recorded(1, self.count() as u64);
    }

    /// Dispatches that record something.
    pub fn count(&self) -> usize {
        self.dispatches.iter().filter(|d| !d.is_empty()).count()
    }

    pub fn extend(&mut self, other: Prepared) {
        self.dispatches.extend(other.dispatches);
        self._uniforms.extend(other._uniforms);
    }
}

/// What changes from one forward step to the next, in a 16-byte storage buffer that kernels
/// bind read-only (`shaders/common_decls.tmpl`'s `StepState`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct StepState {
    /// Position (== KV cell) of the batch's first token.
    pub pos0: u32,
    /// Tokens in this step's batch.
    pub n_tokens: u32,
    /// Cells filled after this step: `pos0 + n_tokens`.
    pub n_past: u32,
    /// Ids sampled so far by a chained decode, whose last argmax stage advances the state
    /// (`ops::argmax::Argmax::chained`): where it writes the next one.
    pub chained: u32,
}

impl StepState {
    pub fn new(pos0: u32, n_tokens: u32) -> Self {
        StepState {
            pos0,
            n_tokens,
            n_past: pos0 + n_tokens,
            chained: 0,
        }
    }
}

/// The per-step buffer: a [`StepState`] followed by the batch's token ids, written once per
/// step (one small write), bound by every position-dependent kernel and by the embedding.
///
/// Layout (u32 words): `[pos0, n_tokens, n_past, pad, ids[0], ids[1], ...]`.
pub struct Step {
    pub buffer: wgpu::Buffer,
    pub max_tokens: u32,
}

impl Step {
    /// Element index of `ids[0]`.
    pub const IDS_OFFSET: u64 = 4;

    pub fn new(ctx: &GpuContext, max_tokens: u32) -> Result<Self> {
        let buffer = ctx.empty_storage("step", (Self::IDS_OFFSET + max_tokens as u64) * 4)?;
        Ok(Step { buffer, max_tokens })
    }

    /// Queue the step's positions and token ids (lands before the next submission's work).
    pub fn write(&self, ctx: &GpuContext, pos0: u32, tokens: &[u32]) {
        let state = StepState::new(pos0, tokens.len() as u32);
        let mut words: Vec<u32> = Vec::with_capacity(4 + tokens.len());
        words.extend_from_slice(bytemuck::cast_slice(bytemuck::bytes_of(&state)));
        words.extend_from_slice(tokens);
        ctx.queue
            .write_buffer(&self.buffer, 0, bytemuck::cast_slice(&words));
    }
}

/// A bind group entry of `resource` at `binding`: a part of a buffer (the reductions bind the
/// head of a buffer sized for a longer input).
pub fn entry(binding: u32, resource: wgpu::BindingResource<'_>) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry { binding, resource }
}

/// The bind group entry of a whole buffer at `binding` (what almost every dispatch binds).
pub fn buffer_entry(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buffer.as_entire_binding(),
    }
}
