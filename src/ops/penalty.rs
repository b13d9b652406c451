//! `penalty`: llama.cpp's repetition / frequency / presence penalties applied in place on the
//! GPU logits (see `shaders/penalty.wgsl`), before argmax or top-k.
//!
//! [`Penalties`] owns the `(token id, count)` buffer and the uniform; each token the sampler
//! writes the counts of the last `penalty_last_n` tokens ([`Penalties::write`]) and encodes one
//! dispatch into the same pass as the reduction that follows.

use std::mem::offset_of;

use super::{Variant, WgslParams};
use crate::error::Result;
use crate::gpu::{buffer_entry, entry, grid_2d, CachedPipeline, GpuContext, PipelineKey};

pub const SHADER: &str = "penalty.wgsl";
pub const ENTRY: &str = "penalty";

/// Uniform of `penalty.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PenaltyParams {
    pub n_pairs: u32,
    pub n_vocab: u32,
    /// llama.cpp `penalty_repeat` (1.0 = off).
    pub repeat: f32,
    /// llama.cpp `penalty_freq` (0.0 = off).
    pub frequency: f32,
    /// llama.cpp `penalty_present` (0.0 = off).
    pub presence: f32,
    pub _pad0: u32,
    pub _pad1: u32,
    pub _pad2: u32,
}

impl WgslParams for PenaltyParams {
    const WGSL_NAME: &'static str = "PenaltyParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_pairs", offset_of!(PenaltyParams, n_pairs)),
        ("n_vocab", offset_of!(PenaltyParams, n_vocab)),
        ("repeat", offset_of!(PenaltyParams, repeat)),
        ("frequency", offset_of!(PenaltyParams, frequency)),
        ("presence", offset_of!(PenaltyParams, presence)),
        ("_pad0", offset_of!(PenaltyParams, _pad0)),
        ("_pad1", offset_of!(PenaltyParams, _pad1)),
        ("_pad2", offset_of!(PenaltyParams, _pad2)),
    ];
}

pub const WORKGROUP_SIZE: u32 = 64;

pub fn key(workgroup_size: u32) -> PipelineKey {
    PipelineKey::new(SHADER, ENTRY).workgroup_size(workgroup_size)
}

pub fn variants() -> Vec<Variant> {
    [WORKGROUP_SIZE].iter().map(|&wg| key(wg).into()).collect()
}

/// Whether these penalties change anything (llama.cpp skips the sampler otherwise).
pub fn is_active(repeat: f32, frequency: f32, presence: f32) -> bool {
    !(repeat == 1.0 && frequency == 0.0 && presence == 0.0)
}

/// The CPU reference, llama.cpp's `llama_sampler_penalties_apply` on a full logits vector.
/// `pairs` are distinct `(id, count)`; ids beyond the vocabulary are ignored.
pub fn cpu_penalties(
    logits: &mut [f32],
    pairs: &[(u32, u32)],
    repeat: f32,
    frequency: f32,
    presence: f32,
) {
    for &(id, count) in pairs {
        let Some(l) = logits.get_mut(id as usize) else {
            continue;
        };
        if count == 0 {
            continue;
        }
        if *l <= 0.0 {
            *l *= repeat;
        } else {
            *l /= repeat;
        }
        *l -= count as f32 * frequency + presence;
    }
}

/// Distinct `(id, count)` pairs of `tokens` in first-seen order (what the GPU buffer holds).
pub fn count_tokens(tokens: impl IntoIterator<Item = u32>) -> Vec<(u32, u32)> {
    let mut pairs: Vec<(u32, u32)> = Vec::new();
    let mut index: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    for t in tokens {
        match index.get(&t) {
            Some(&i) => pairs[i].1 += 1,
            None => {
                index.insert(t, pairs.len());
                pairs.push((t, 1));
            }
        }
    }
    pairs
}

/// The penalty dispatch for one logits buffer: pairs buffer (grown on demand), uniform, bind group.
pub struct Penalties {
    n_vocab: u32,
    pipe: std::sync::Arc<CachedPipeline>,
    params: wgpu::Buffer,
    pairs: wgpu::Buffer,
    capacity: u32,
    bind: wgpu::BindGroup,
    n_pairs: u32,
}

impl Penalties {
    /// For the first `n_vocab` f32 of `logits`, with room for `capacity` pairs to start with.
    pub fn new(
        ctx: &GpuContext,
        logits: &wgpu::Buffer,
        n_vocab: u32,
        capacity: u32,
    ) -> Result<Self> {
        super::argmax::check_logits(ctx, logits, n_vocab)?;
        let pipe = ctx.pipeline(&key(WORKGROUP_SIZE))?;
        let params = ctx.uniform_buffer_owned(
            "penalty params",
            &PenaltyParams {
                n_vocab,
                repeat: 1.0,
                ..Default::default()
            },
        );
        let capacity = capacity.max(16);
        let pairs = ctx.empty_storage("penalty pairs", capacity as u64 * 8)?;
        let bind = Self::bind(ctx, &pipe, &params, &pairs, logits, n_vocab);
        Ok(Penalties {
            n_vocab,
            pipe,
            params,
            pairs,
            capacity,
            bind,
            n_pairs: 0,
        })
    }

    fn bind(
        ctx: &GpuContext,
        pipe: &CachedPipeline,
        params: &wgpu::Buffer,
        pairs: &wgpu::Buffer,
        logits: &wgpu::Buffer,
        n_vocab: u32,
    ) -> wgpu::BindGroup {
        ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&pipe.key.label()),
            layout: &pipe.layout,
            entries: &[
                buffer_entry(0, params),
                buffer_entry(1, pairs),
                entry(2, super::argmax::head(logits, n_vocab as u64 * 4)),
            ],
        })
    }

    /// Upload this token's pairs and penalties (queued before the next submit). `logits` must be
    /// the buffer given to [`Penalties::new`]; it is rebound when the pairs buffer grows.
    pub fn write(
        &mut self,
        ctx: &GpuContext,
        logits: &wgpu::Buffer,
        pairs: &[(u32, u32)],
        repeat: f32,
        frequency: f32,
        presence: f32,
    ) -> Result<()> {
        if pairs.len() as u32 > self.capacity {
            self.capacity = (pairs.len() as u32).next_power_of_two();
            self.pairs = ctx.empty_storage("penalty pairs", self.capacity as u64 * 8)?;
            self.bind = Self::bind(
                ctx,
                &self.pipe,
                &self.params,
                &self.pairs,
                logits,
                self.n_vocab,
            );
        }
        self.n_pairs = pairs.len() as u32;
        if !pairs.is_empty() {
            let flat: Vec<u32> = pairs.iter().flat_map(|&(id, c)| [id, c]).collect();
            ctx.queue
                .write_buffer(&self.pairs, 0, bytemuck::cast_slice(&flat));
        }
        let p = PenaltyParams {
            n_pairs: self.n_pairs,
            n_vocab: self.n_vocab,
            repeat,
            frequency,
            presence,
            ..Default::default()
        };
        ctx.queue
            .write_buffer(&self.params, 0, bytemuck::bytes_of(&p));
        Ok(())
    }

    /// The dispatch (nothing when no pairs were written).
    pub fn encode_pass(&self, ctx: &GpuContext, pass: &mut wgpu::ComputePass<'_>) -> Result<()> {
        if self.n_pairs == 0 {
            return Ok(());
        }
        let groups = (self.n_pairs as u64).div_ceil(self.pipe.decisions.workgroup_size as u64);
        let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
        pass.set_pipeline(&self.pipe.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
        Ok(())
    }

    pub fn encode(&self, ctx: &GpuContext, encoder: &mut wgpu::CommandEncoder) -> Result<()> {
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("penalty"),
            timestamp_writes: None,
        });
        self.encode_pass(ctx, &mut pass)
    }
}
