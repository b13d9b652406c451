//! `mask`: constrained decoding's token mask applied to the GPU logits (see `shaders/mask.wgsl`).
//!
//! The grammar's allowed tokens for a step come as a bitset over the vocabulary (bit `i % 32` of
//! word `i / 32`), the layout llguidance's `SimpleVob` already has, so the host uploads its words
//! unchanged (32 KiB for Gemma 3's 262,144 tokens). Forbidden logits become `-inf` in place,
//! before penalties and the argmax / top-k reduction, so constrained decoding keeps the sampler's
//! one small readback per token (docs/architecture.md, decision 7).
//!
//! [`TokenMask::new`] prepares the dispatch once for a logits buffer; each step writes the words
//! ([`TokenMask::write`]) and records the prepared dispatch into the token's compute pass.

use std::mem::offset_of;

use super::{Variant, WgslParams};
use crate::error::Result;
use crate::gpu::{buffer_entry, entry, grid_2d, GpuContext, PipelineKey, Prepared, Recorder};

pub const SHADER: &str = "mask.wgsl";
pub const ENTRY: &str = "mask_logits";
/// Invocations per workgroup (clamped to the device's limits).
pub const WORKGROUP_SIZE: u32 = 256;

/// Uniform of `mask.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MaskParams {
    pub n_vocab: u32,
    /// What forbidden logits become: `-inf` (passed in, not written in WGSL: see the shader).
    pub masked: f32,
    pub _pad1: u32,
    pub _pad2: u32,
}

impl WgslParams for MaskParams {
    const WGSL_NAME: &'static str = "MaskParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_vocab", offset_of!(MaskParams, n_vocab)),
        ("masked", offset_of!(MaskParams, masked)),
        ("_pad1", offset_of!(MaskParams, _pad1)),
        ("_pad2", offset_of!(MaskParams, _pad2)),
    ];
}

pub fn key(workgroup_size: u32) -> PipelineKey {
    PipelineKey::new(SHADER, ENTRY).workgroup_size(workgroup_size)
}

pub fn variants() -> Vec<Variant> {
    vec![key(WORKGROUP_SIZE).into()]
}

/// Words of the bitset for `n_vocab` tokens.
pub fn mask_words(n_vocab: u32) -> u32 {
    n_vocab.div_ceil(32)
}

/// The CPU reference: `-inf` where the bit of the token is clear.
pub fn cpu_mask(logits: &mut [f32], mask: &[u32]) {
    for (i, l) in logits.iter_mut().enumerate() {
        if (mask[i / 32] >> (i % 32)) & 1 == 0 {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// Prepare the masking of the first `n_vocab` f32 of `logits` by the bitset in `mask`
/// (`mask_words(n_vocab)` u32).
///
/// - `mask`: `(ceil(n_vocab / 32))` u32, bit set = allowed
/// - `logits`: `(n_vocab)` f32, written in place
pub fn prepare(
    rec: &mut Recorder,
    logits: &wgpu::Buffer,
    mask: &wgpu::Buffer,
    n_vocab: u32,
) -> Result<()> {
    let ctx = rec.ctx;
    super::argmax::check_logits(ctx, logits, n_vocab)?;
    let pipe = ctx.pipeline(&key(ctx.limits.workgroup_size(WORKGROUP_SIZE)))?;
    let groups = (n_vocab as u64).div_ceil(pipe.decisions.workgroup_size as u64);
    let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
    let ubuf = rec.uniform(
        &pipe.key.label(),
        &MaskParams {
            n_vocab,
            masked: f32::NEG_INFINITY,
            ..Default::default()
        },
    );
    let entries = [
        buffer_entry(0, &ubuf),
        entry(1, super::argmax::head(mask, mask_words(n_vocab) as u64 * 4)),
        entry(2, super::argmax::head(logits, n_vocab as u64 * 4)),
    ];
    rec.push("mask", &pipe, &entries, grid);
    Ok(())
}

/// The mask of one logits buffer: the bitset buffer and the dispatch, prepared once.
pub struct TokenMask {
    pub n_vocab: u32,
    mask: wgpu::Buffer,
    prepared: Prepared,
}

impl TokenMask {
    pub fn new(ctx: &GpuContext, logits: &wgpu::Buffer, n_vocab: u32) -> Result<Self> {
        let mask = ctx.empty_storage("token mask", mask_words(n_vocab) as u64 * 4)?;
        let mut rec = Recorder::new(ctx);
        prepare(&mut rec, logits, &mask, n_vocab)?;
        Ok(TokenMask {
            n_vocab,
            mask,
            prepared: rec.finish(),
        })
    }

    /// Queue this step's bitset (`mask_words(n_vocab)` words; lands before the next submit).
    pub fn write(&self, ctx: &GpuContext, words: &[u32]) {
        let n = (mask_words(self.n_vocab) as usize).min(words.len());
        ctx.queue
            .write_buffer(&self.mask, 0, bytemuck::cast_slice(&words[..n]));
    }

    /// Record the prepared dispatch into the token's pass.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        self.prepared.record(pass);
    }

    pub fn dispatches(&self) -> usize {
        self.prepared.count()
    }

    /// Mask `logits` once with `words` in a pass of its own (tests, one-off use).
    pub fn encode(&self, ctx: &GpuContext, encoder: &mut wgpu::CommandEncoder, words: &[u32]) {
        self.write(ctx, words);
        self.prepared.encode(ctx, encoder);
    }
}
