//! `cera bench-attention`: decode attention on Gemma 3's head shape (4 query heads of 256, one KV
//! head) over a cache of N cells, the one-workgroup-per-head kernel (in the shape the device
//! gets) against the split (flash-decoding) kernel: milliseconds from submit to readback, the
//! best of `--iters` after a warm-up run, one JSON line per cache size. These figures decide
//! which kernel an adapter gets for decode (`model::kernels::split_attention`).
//!
//! `cera bench-attention [--cells 700,4000] [--iters 5]`

use cera_web::gpu::readback::read_f32;
use cera_web::gpu::GpuContext;
use cera_web::ops::attention::{self, AttentionConfig, AttentionParams};
use cera_web::ops::attention_split::{self, SplitConfig};
use cera_web::Result;

pub const USAGE: &str = "cera bench-attention [--cells 700,4000] [--iters 5]";

pub fn run(ctx: &GpuContext, args: &[String]) -> Result<()> {
    let (mut cells, mut iters) = (vec![700u32, 4000], 5u32);
    for f in crate::flags::pairs(args, USAGE)? {
        match f.flag {
            "--cells" => cells = f.nums()?,
            "--iters" => iters = f.num()?.max(1),
            _ => return Err(f.unknown(USAGE)),
        }
    }
    for &n in &cells {
        let n = n.max(1);
        // One decode token at position n - 1 of Gemma 3's global layers (no window).
        let p = AttentionParams::new(1, 4, 1, 256, n - 1, 0, 1.0 / 16.0, 0.0);
        let q = ramp(4 * 256, 1);
        let kv = ramp(n as usize * 256, 2);
        let qb = ctx.storage_buffer("bench q", bytemuck::cast_slice(&q));
        let kb = ctx.storage_buffer("bench k", bytemuck::cast_slice(&kv));
        let vb = ctx.storage_buffer("bench v", bytemuck::cast_slice(&kv));
        let out = ctx.empty_storage("bench out", q.len() as u64 * 4)?;
        let head_cfg = AttentionConfig::for_device(ctx).fit(ctx, &p);
        let split_cfg = SplitConfig::for_head(ctx, p.head_dim);
        let mut best = [f64::INFINITY; 2];
        for run in 0..=iters {
            for (which, slot) in best.iter_mut().enumerate() {
                let t0 = std::time::Instant::now();
                let mut enc = ctx.device.create_command_encoder(&Default::default());
                if which == 0 {
                    attention::encode_with(ctx, &mut enc, head_cfg, &p, &qb, &kb, &vb, &out)?;
                } else {
                    attention_split::encode(ctx, &mut enc, split_cfg, &p, &qb, &kb, &vb, &out)?;
                }
                ctx.queue.submit([enc.finish()]);
                pollster::block_on(read_f32(ctx, &out, 0, q.len()))?;
                // Run 0 warms up (pipeline compile, first upload).
                if run > 0 {
                    *slot = slot.min(t0.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
        println!(
            "{{\"cells\": {n}, \"heads\": 4, \"kv_heads\": 1, \"head_dim\": 256, \"attention_ms\": {:.3}, \"attention_config\": {:?}, \"split_ms\": {:.3}, \"split_config\": {:?}, \"adapter\": {:?}}}",
            best[0],
            format!("{head_cfg:?}"),
            best[1],
            format!("{split_cfg:?}"),
            ctx.adapter.name
        );
    }
    Ok(())
}

/// Deterministic values in [-1, 1): the timing does not depend on them.
fn ramp(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7919 + seed * 104_729) % 2000) as f32) / 1000.0 - 1.0)
        .collect()
}
