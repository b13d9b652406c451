//! GPU time per dispatch, from timestamp queries at pass boundaries (`cera bench --profile`).
//!
//! Each prepared dispatch is recorded in a compute pass of its own whose beginning and end write
//! timestamps, so this works wherever the adapter offers `TIMESTAMP_QUERY` (WebGPU included: it
//! has no timestamps inside a pass). A pass per dispatch adds its own small cost, so the profile
//! tells where GPU time goes, not the exact time of the one-pass forward.

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
}

/// Whether the device can profile.
pub fn available(ctx: &GpuContext) -> bool {
    ctx.features.contains(wgpu::Features::TIMESTAMP_QUERY)
}

/// Record `prepared` one dispatch per timed pass, submit, and return the GPU time per dispatch
/// in microseconds (in order). The caller queues whatever the dispatches read first.
pub async fn time_dispatches(ctx: &GpuContext, prepared: &Prepared) -> Result<Vec<f64>> {
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
        let bytes = 2 * count as u64 * 8;
        let resolve = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("profile resolve"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
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
        enc.resolve_query_set(&set, 0..2 * count, &resolve, 0);
        ctx.submit([enc.finish()]);
        let raw = super::readback::read_buffer(ctx, &resolve, 0, bytes).await?;
        let ticks: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        for i in 0..count as usize {
            out.push(ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period / 1e3);
        }
    }
    Ok(out)
}

/// Sum per-dispatch times by op kind, in the order kinds first appear.
pub fn by_kind(prepared: &Prepared, us: &[f64]) -> Vec<KindTime> {
    let mut v: Vec<KindTime> = Vec::new();
    for (d, &t) in prepared.dispatches.iter().zip(us) {
        match v.iter_mut().find(|k| k.kind == d.kind) {
            Some(k) => {
                k.dispatches += 1;
                k.us += t;
            }
            None => v.push(KindTime {
                kind: d.kind.to_string(),
                dispatches: 1,
                us: t,
            }),
        }
    }
    v
}
