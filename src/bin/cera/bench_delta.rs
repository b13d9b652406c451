//! `cera bench-delta`: the gated delta rule's two forms (recurrent, chunked) timed alone on
//! Qwen3.5-shaped heads, one JSON line per batch size: what `qwen35::CHUNKED_MIN_TOKENS` is
//! chosen from.
//!
//! `cera bench-delta [--tokens 1,2,4,8,16,32,64,128,256,512] [--k-heads 16] [--v-heads 16]
//! [--state 128] [--iters N]`

use cera_web::gpu::GpuContext;
use cera_web::ops::gated_delta::DeltaShape;
use cera_web::ops::gated_delta_chunked::{self, ChunkedConfig};
use cera_web::{Error, Result};

pub const USAGE: &str = "cera bench-delta [--tokens 1,2,4,...] [--k-heads 16] [--v-heads 16] \
                         [--state 128] [--iters N]";

pub fn run(ctx: &GpuContext, args: &[String]) -> Result<()> {
    let mut tokens: Vec<u32> = vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512];
    let (mut hk, mut hv, mut s, mut iters) = (16u32, 16u32, 128u32, 0u32);
    for f in crate::flags::pairs(args, USAGE)? {
        match f.flag {
            "--tokens" => tokens = f.nums()?,
            "--k-heads" => hk = f.num()?,
            "--v-heads" => hv = f.num()?,
            "--state" => s = f.num()?,
            "--iters" => iters = f.num()?,
            _ => return Err(f.unknown(USAGE)),
        }
    }
    let shape = DeltaShape {
        n_k_heads: hk,
        n_v_heads: hv,
        head_dim: s,
        eps: 1e-6,
        norm_eps: 1e-6,
    };
    let cfg = ChunkedConfig::for_device(ctx, s)
        .ok_or_else(|| Error::invalid(format!("heads of {s} do not fit a chunk here")))?;
    for &n in &tokens {
        // About a second of the slower form on a fast GPU, a few calls on a CPU adapter.
        let k = if iters > 0 {
            iters
        } else if cera_web::ops::matmul::is_cpu_adapter(ctx) {
            2
        } else {
            20
        };
        let (rec_ms, chunk_ms) =
            pollster::block_on(gated_delta_chunked::bench_forms(ctx, &shape, n, k))?;
        println!(
            "{{\"tokens\": {n}, \"k_heads\": {hk}, \"v_heads\": {hv}, \"state\": {s}, \"chunk\": {}, \"dispatches\": {}, \"recurrent_ms\": {rec_ms:.3}, \"chunked_ms\": {chunk_ms:.3}, \"speedup\": {:.2}, \"adapter\": {:?}}}",
            cfg.chunk,
            n.div_ceil(cfg.chunk.saturating_mul(cfg.chunks_per_dispatch(ctx))),
            rec_ms / chunk_ms,
            ctx.adapter.name
        );
    }
    Ok(())
}
