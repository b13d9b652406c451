//! `kv_shift`: re-rotate retained K cells after a context shift (see `shaders/kv_shift.wgsl`).
//!
//! This file holds the params struct (the single source of truth for the WGSL struct), the
//! pipeline key and the encode function for one layer and one chunk of cells. The whole shift
//! (every layer, V moves, chunking) is `crate::kv::KvCache::shift`.

use std::mem::offset_of;

use super::{Variant, WgslParams};
use crate::error::Result;
use crate::gpu::{buffer_entry, entry, grid_2d, GpuContext, PipelineKey};

pub const SHADER: &str = "kv_shift.wgsl";
pub const ENTRY: &str = "kv_shift";

/// Uniform of `kv_shift.wgsl`. Cells are counted in whole `(n_kv_heads, head_dim)` rows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct KvShiftParams {
    pub n_keep: u32,
    /// Cells dropped after `n_keep`: the distance every retained cell moves.
    pub shift: u32,
    /// First retained cell of this chunk, counted from the start of the retained range.
    pub t_begin: u32,
    /// Cells in this chunk (the scratch buffer holds at least this many).
    pub count: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub n_rot: u32,
    /// 0 NeoX, 1 NORM ([`crate::rope::RopeType`] as u32).
    pub rope_type: u32,
}

impl WgslParams for KvShiftParams {
    const WGSL_NAME: &'static str = "KvShiftParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_keep", offset_of!(KvShiftParams, n_keep)),
        ("shift", offset_of!(KvShiftParams, shift)),
        ("t_begin", offset_of!(KvShiftParams, t_begin)),
        ("count", offset_of!(KvShiftParams, count)),
        ("n_kv_heads", offset_of!(KvShiftParams, n_kv_heads)),
        ("head_dim", offset_of!(KvShiftParams, head_dim)),
        ("n_rot", offset_of!(KvShiftParams, n_rot)),
        ("rope_type", offset_of!(KvShiftParams, rope_type)),
    ];
}

impl KvShiftParams {
    /// Invocations the dispatch needs: one per pair of every head of every cell in the chunk.
    pub fn invocations(&self) -> u64 {
        self.count as u64 * self.n_kv_heads as u64 * (self.head_dim as u64 / 2)
    }
}

/// The pipeline key for a workgroup size (clamped to the device's limits by the caller).
pub fn key(workgroup_size: u32) -> PipelineKey {
    PipelineKey::new(SHADER, ENTRY).workgroup_size(workgroup_size)
}

/// Workgroup sizes the engine may pick (64 on small adapters and in tests, 256 by default).
pub fn variants() -> Vec<Variant> {
    [64u32, 128, 256].iter().map(|&wg| key(wg).into()).collect()
}

/// Encode one chunk: rotate `params.count` cells of `k_cache` into `scratch`.
/// Returns the number of workgroups dispatched (tests report it).
///
/// - `k_cache`: `(n_ctx, n_kv_heads, head_dim)` f32 of one layer
/// - `scratch`: at least `(count, n_kv_heads, head_dim)` f32
/// - `cos_sin`: `(n_rot / 2, 2)` f32 from [`crate::rope::RopeConfig::delta_table`] of `-shift`
#[allow(clippy::too_many_arguments)] // the op's buffers and shapes, each named at the call
pub fn encode(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    workgroup_size: u32,
    params_buf: &crate::gpu::context::Uniform,
    params: &KvShiftParams,
    k_cache: &wgpu::Buffer,
    scratch: &wgpu::Buffer,
    cos_sin: &wgpu::Buffer,
) -> Result<u64> {
    let pipe = ctx.pipeline(&key(workgroup_size))?;
    let wg = pipe.decisions.workgroup_size as u64;
    let groups = params.invocations().div_ceil(wg);
    let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
    if groups == 0 {
        return Ok(0);
    }
    let bind = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(&pipe.key.label()),
        layout: &pipe.layout,
        entries: &[
            entry(0, params_buf.as_entire_binding()),
            buffer_entry(1, k_cache),
            buffer_entry(2, scratch),
            buffer_entry(3, cos_sin),
        ],
    });
    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
        label: Some("kv_shift"),
        timestamp_writes: None,
    });
    pass.set_pipeline(&pipe.pipeline);
    pass.set_bind_group(0, &bind, &[]);
    pass.dispatch_workgroups(grid[0], grid[1], grid[2]);
    Ok(groups)
}
