//! GPU time per dispatch, from timestamp queries (`cera bench --profile`).
//!
//! Where the adapter offers timestamps inside a pass (`TIMESTAMP_QUERY_INSIDE_PASSES`, native
//! Vulkan/Metal/DX12), the dispatches are recorded as the forward records them, in one pass, with
//! a timestamp before each and one after the last: dispatch i's time is the gap to the next
//! timestamp, so it includes the barrier the next dispatch waits on, and the times add up to the
//! pass. Elsewhere (WebGPU has timestamps only at pass boundaries) each dispatch gets a pass of
//! its own whose beginning and end write timestamps; that adds a pass's cost to every dispatch,
//! so it tells where GPU time goes, not the exact time of the one-pass forward.

use super::plan::Prepared;
use super::GpuContext;
use crate::error::{Error, ErrorCode, Result};

/// GPU time of one op kind over a profiled run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct KindTime {
    pub kind: String,
    pub dispatches: usize,
    /// Microseconds, summed over the kind's dispatches.
    pub us: f64,
    /// The longest of them.
    pub max_us: f64,
}

/// Whether the device can profile.
pub fn available(ctx: &GpuContext) -> bool {
    ctx.features.contains(wgpu::Features::TIMESTAMP_QUERY)
}

/// Whether [`time_dispatches`] times the dispatches inside one pass (else a pass each).
pub fn in_pass(ctx: &GpuContext) -> bool {
    ctx.features
        .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
}

/// Submit `enc` with the `count` timestamps of `set` resolved after its work, and read them back
/// as ticks.
pub(crate) async fn resolve(
    ctx: &GpuContext,
    mut enc: wgpu::CommandEncoder,
    set: &wgpu::QuerySet,
    count: u32,
) -> Result<Vec<u64>> {
    let bytes = count as u64 * 8;
    let buf = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("profile resolve"),
        size: bytes,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    enc.resolve_query_set(set, 0..count, &buf, 0);
    ctx.submit([enc.finish()]);
    let raw = super::readback::read_buffer(ctx, &buf, 0, bytes).await?;
    Ok(raw
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

/// Record `prepared` in one pass with a timestamp before every dispatch and after the last.
async fn time_in_pass(ctx: &GpuContext, prepared: &Prepared) -> Result<Vec<f64>> {
    // A query set holds at most 4096 queries (WebGPU's limit): time in chunks of dispatches,
    // each chunk its own pass.
    const MAX_PER_SET: usize = 4095;
    let period = ctx.queue.get_timestamp_period() as f64;
    let mut out = Vec::with_capacity(prepared.dispatches.len());
    for chunk in prepared.dispatches.chunks(MAX_PER_SET) {
        let count = chunk.len() as u32 + 1;
        let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profile"),
            ty: wgpu::QueryType::Timestamp,
            count,
        });
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("profile"),
            });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("profile"),
                timestamp_writes: None,
            });
            for (i, d) in chunk.iter().enumerate() {
                pass.write_timestamp(&set, i as u32);
                d.record(&mut pass);
            }
            pass.write_timestamp(&set, count - 1);
        }
        let ticks = resolve(ctx, enc, &set, count).await?;
        for w in ticks.windows(2) {
            out.push(w[1].saturating_sub(w[0]) as f64 * period / 1e3);
        }
    }
    Ok(out)
}

/// The GPU time per dispatch of `prepared`, in microseconds (in order): inside one pass where
/// the adapter can, else a timed pass each (see the module comment). The caller queues whatever
/// the dispatches read first.
pub async fn time_dispatches(ctx: &GpuContext, prepared: &Prepared) -> Result<Vec<f64>> {
    if available(ctx) && in_pass(ctx) {
        return time_in_pass(ctx, prepared).await;
    }
    if !available(ctx) {
        return Err(Error::new(
            ErrorCode::InvalidArgument,
            "this adapter offers no timestamp queries: --profile is unavailable",
        ));
    }
    let n = prepared.dispatches.len() as u32;
    if n == 0 {
        return Ok(Vec::new());
    }
    // A query set holds at most 4096 queries (WebGPU's limit): time in chunks.
    const MAX_PER_SET: u32 = 2048;
    let mut out = Vec::with_capacity(n as usize);
    let period = ctx.queue.get_timestamp_period() as f64;
    for start in (0..n).step_by(MAX_PER_SET as usize) {
        let count = (n - start).min(MAX_PER_SET);
        let set = ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profile"),
            ty: wgpu::QueryType::Timestamp,
            count: 2 * count,
        });
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("profile"),
            });
        for i in 0..count {
            let d = &prepared.dispatches[(start + i) as usize];
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(d.kind),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &set,
                    beginning_of_pass_write_index: Some(2 * i),
                    end_of_pass_write_index: Some(2 * i + 1),
                }),
            });
            d.record(&mut pass);
        }
        let ticks = resolve(ctx, enc, &set, 2 * count).await?;
        for i in 0..count as usize {
            out.push(ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period / 1e3);
        }
    }
    Ok(out)
}

/// One dispatch of a profiled run: its pipeline (shader, entry and defines), grid and time.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DispatchTime {
    pub pipeline: String,
    pub grid: [u32; 3],
    pub us: f64,
}

/// Every dispatch's time, in order.
pub fn each(prepared: &Prepared, us: &[f64]) -> Vec<DispatchTime> {
    prepared
        .dispatches
        .iter()
        .zip(us)
        .map(|(d, &t)| DispatchTime {
            pipeline: d.pipe.key.label(),
            grid: d.grid,
            us: t,
        })
        .collect()
}

/// Sum per-dispatch times by op kind, in the order kinds first appear.
pub fn by_kind(prepared: &Prepared, us: &[f64]) -> Vec<KindTime> {
    let mut v: Vec<KindTime> = Vec::new();
    for (d, &t) in prepared.dispatches.iter().zip(us) {
        match v.iter_mut().find(|k| k.kind == d.kind) {
            Some(k) => {
                k.dispatches += 1;
                k.us += t;
                k.max_us = k.max_us.max(t);
            }
            None => v.push(KindTime {
                kind: d.kind.to_string(),
                dispatches: 1,
                us: t,
                max_us: t,
            }),
        }
    }
    v
}
