//! `short_conv` (LFM2's gated short convolution) against its CPU reference (f64): widths 2-4,
//! channel counts 1, 37, 64 and 641 (odd, past one workgroup), a sequence fed as prefill chunks
//! of awkward sizes and single decode tokens, so every tap reads both the batch and the conv
//! rows of earlier positions, and position 0's zero padding. Then the conv rows in a KV cache:
//! a context shift moves them with their tokens. Runs natively and in headless Chrome.

mod common;

use cera_web::gpu::readback::read_f32;
use cera_web::kv::{KvCache, KvCacheConfig};
use cera_web::ops::short_conv::{self, ShortConvBuffers};
use cera_web::rope::{RopeConfig, RopeType};
use common::Rng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// |gpu - ref| / (|C| * sum_j |w_j| |bx_j| + 1e-30): f32 products and a sum of at most 4 terms.
const TOLERANCE: f64 = 1e-6;

gpu_test!(short_conv_chunks_widths_and_channels, async {
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(31);
    let mut worst = 0.0f64;
    for (n_embd, l_cache, chunks) in [
        (37usize, 3usize, vec![5usize, 1, 1, 7, 1]),
        (1, 2, vec![1, 1, 3]),
        (64, 4, vec![2, 9, 1]),
        (641, 3, vec![1, 1, 1, 4]),
    ] {
        let n: usize = chunks.iter().sum();
        let bcx: Vec<f32> = rng.vec(n * 3 * n_embd).iter().map(|v| v * 3.0).collect();
        let weight = rng.vec(n_embd * l_cache);
        let (want, want_rows) = short_conv::reference(&bcx, &weight, n_embd, l_cache);
        let wbuf = ctx.storage_buffer("w", bytemuck::cast_slice(&weight));
        let rows = ctx
            .empty_storage("rows", (n + 2) as u64 * n_embd as u64 * 4)
            .unwrap();
        let mut got = Vec::new();
        let mut pos = 0usize;
        for &c in &chunks {
            let chunk = &bcx[pos * 3 * n_embd..(pos + c) * 3 * n_embd];
            let bbuf = ctx.storage_buffer("bcx", bytemuck::cast_slice(chunk));
            let out = ctx.empty_storage("out", (c * n_embd * 4) as u64).unwrap();
            let b = ShortConvBuffers {
                bcx: &bbuf,
                weight: &wbuf,
                rows: &rows,
                out: &out,
            };
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            short_conv::encode(
                &ctx,
                &mut enc,
                &b,
                c as u32,
                n_embd as u32,
                l_cache as u32,
                pos as u32,
            )
            .unwrap();
            ctx.queue.submit([enc.finish()]);
            got.extend(read_f32(&ctx, &out, 0, c * n_embd).await.unwrap());
            pos += c;
        }
        let got_rows = read_f32(&ctx, &rows, 0, n * n_embd).await.unwrap();
        for i in 0..n * n_embd {
            let (t, ch) = (i / n_embd, i % n_embd);
            let cgate = bcx[t * 3 * n_embd + n_embd + ch].abs() as f64;
            let mut scale = 0.0;
            for j in 0..l_cache {
                let back = l_cache - 1 - j;
                if back <= t {
                    scale += (weight[ch * l_cache + j] as f64
                        * want_rows[(t - back) * n_embd + ch])
                        .abs();
                }
            }
            let err = (got[i] as f64 - want[i]).abs() / (cgate * scale).max(1e-30);
            assert!(
                err <= TOLERANCE,
                "short_conv {n_embd}x{l_cache} [{t}, {ch}] = {}, want {} (error {err:.2e})",
                got[i],
                want[i]
            );
            worst = worst.max(err);
            let row_err = (got_rows[i] as f64 - want_rows[i]).abs() / want_rows[i].abs().max(1e-30);
            assert!(
                row_err <= 1e-7,
                "conv row [{t}, {ch}] = {}, want {}",
                got_rows[i],
                want_rows[i]
            );
        }
        // A chunk past the rows is refused.
        let out = ctx.empty_storage("out", 4 * n_embd as u64 * 4).unwrap();
        let bbuf = ctx.empty_storage("bcx", 4 * 3 * n_embd as u64 * 4).unwrap();
        let b = ShortConvBuffers {
            bcx: &bbuf,
            weight: &wbuf,
            rows: &rows,
            out: &out,
        };
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        assert!(short_conv::encode(
            &ctx,
            &mut enc,
            &b,
            4,
            n_embd as u32,
            l_cache as u32,
            (n - 1) as u32
        )
        .is_err());
    }
    tlog!("short_conv: worst error {worst:.2e}");
});

gpu_test!(conv_rows_move_with_their_tokens_in_a_shift, async {
    // Layers: attention, conv, conv (width 40 > the 2 x 8 K cell, so the scratch grows).
    let ctx = common::shared_context().await;
    let (n_ctx, width) = (12u32, 40u32);
    let rope = RopeConfig::new(8, 10000.0, RopeType::Neox);
    let cfg = KvCacheConfig {
        n_ctx,
        n_kv_heads: 2,
        head_dim: 8,
        layer_ropes: vec![rope; 3],
        shift_workgroup_size: None,
        max_scratch_cells: Some(3),
    };
    let mut kv = KvCache::with_conv_rows(&ctx, cfg, &[false, true, true], width).unwrap();
    assert!(kv.conv_rows(0).is_none() && kv.conv_rows(1).is_some());
    let rows: Vec<f32> = (0..n_ctx * width).map(|i| i as f32).collect();
    for l in [1, 2] {
        ctx.queue
            .write_buffer(kv.conv_rows(l).unwrap(), 0, bytemuck::cast_slice(&rows));
    }
    kv.advance(10).unwrap();
    // Keep 2, drop 3: rows 5..10 move to 2..7 (in chunks of 3 cells).
    kv.shift(&ctx, 2, 3).unwrap();
    assert_eq!(kv.n_past(), 7);
    for l in [1, 2] {
        let got = read_f32(&ctx, kv.conv_rows(l).unwrap(), 0, (7 * width) as usize)
            .await
            .unwrap();
        let w = width as usize;
        assert_eq!(&got[..2 * w], &rows[..2 * w], "kept head");
        assert_eq!(
            &got[2 * w..7 * w],
            &rows[5 * w..10 * w],
            "retained rows moved"
        );
    }
});
