//! `softcap`: `x = cap * tanh(x / cap)` in place (see `shaders/softcap.wgsl`), Gemma 2's final
//! logit soft-capping. (Its attention-logit capping is a parameter of the attention kernels.)

use std::mem::offset_of;

use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gpu::{buffer_entry, grid_2d, GpuContext, PipelineKey, Recorder};

pub const SHADER: &str = "softcap.wgsl";
pub const ENTRY: &str = "softcap";
/// Invocations per workgroup (clamped to the device's limits).
pub const WORKGROUP_SIZE: u32 = 256;

/// Uniform of `softcap.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct SoftcapParams {
    pub count: u32,
    /// Element index of the first value.
    pub offset: u32,
    pub cap: f32,
    pub pad0: u32,
}

impl WgslParams for SoftcapParams {
    const WGSL_NAME: &'static str = "SoftcapParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("count", offset_of!(SoftcapParams, count)),
        ("offset", offset_of!(SoftcapParams, offset)),
        ("cap", offset_of!(SoftcapParams, cap)),
        ("pad0", offset_of!(SoftcapParams, pad0)),
    ];
}

fn key(wg: u32) -> PipelineKey {
    PipelineKey::new(SHADER, ENTRY).workgroup_size(wg)
}

pub fn variants() -> Vec<Variant> {
    vec![key(WORKGROUP_SIZE).into()]
}

/// Prepare `x[offset..offset + count] = cap * tanh(x / cap)`.
pub fn prepare(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    offset: u32,
    count: u32,
    cap: f32,
) -> Result<()> {
    let ctx = rec.ctx;
    if !(cap.is_finite() && cap > 0.0) {
        return Err(Error::invalid(format!(
            "softcap: cap {cap} must be finite and positive"
        )));
    }
    if (offset as u64 + count as u64) * 4 > x.size() {
        return Err(Error::invalid("softcap: the range passes the buffer's end"));
    }
    if count == 0 {
        return Ok(());
    }
    let pipe = ctx.pipeline(&key(ctx.limits.workgroup_size(WORKGROUP_SIZE)))?;
    let params = SoftcapParams {
        count,
        offset,
        cap,
        pad0: 0,
    };
    let groups = (count as u64).div_ceil(pipe.decisions.workgroup_size as u64);
    let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
    let label = pipe.key.label();
    let ubuf = rec.uniform(&label, &params);
    let entries = [buffer_entry(0, &ubuf), buffer_entry(1, x)];
    rec.push("softcap", &pipe, &entries, grid);
    Ok(())
}

/// One-off [`prepare`] (tests).
pub fn encode(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    x: &wgpu::Buffer,
    offset: u32,
    count: u32,
    cap: f32,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare(&mut rec, x, offset, count, cap)?;
    rec.encode(encoder)
}

/// CPU reference in f64.
pub fn reference(x: &[f32], cap: f32) -> Vec<f64> {
    x.iter()
        .map(|&v| cap as f64 * (v as f64 / cap as f64).tanh())
        .collect()
}
