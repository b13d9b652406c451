//! `gated_delta` (the gated delta rule with its L2 norms, gates and output RMS norm) against its
//! CPU reference (f64): Qwen3.5's grouping of value heads over key heads, head sizes 5 (below a
//! power of two), 16 and 130 (past one workgroup: several rows per invocation), strided inputs
//! and outputs with offsets, a sequence fed as chunks of awkward sizes and single tokens (the
//! state carries across them), the final state, and a restart at position 0 over the state left
//! behind. Runs natively and in headless Chrome.

mod common;

use cera_web::gpu::readback::read_f32;
use cera_web::ops::gated_delta::{self, DeltaShape, GatedDeltaBuffers};
use common::{Rng, Strided};

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// |gpu - ref| / (|ref| + 1): the outputs are RMS-normalised (of order the norm weight, 1 here),
/// after sums of S products per token in f32, over a few tokens of state (measured: below 2e-6).
const TOLERANCE: f64 = 2e-5;

gpu_test!(gated_delta_chunks_heads_and_sizes, async {
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(43);
    let mut worst = 0.0f64;
    for (s, hk, hv, chunks) in [
        (16u32, 2u32, 4u32, vec![3usize, 1, 1, 4]),
        (5, 1, 3, vec![1, 2, 1]),
        (130, 1, 2, vec![2, 1, 2]),
        (16, 3, 3, vec![6]),
    ] {
        let shape = DeltaShape {
            n_k_heads: hk,
            n_v_heads: hv,
            head_dim: s,
            eps: 1e-6,
            norm_eps: 1e-6,
        };
        let (su, hvu) = (s as usize, hv as usize);
        let row = shape.qkv_dim() as usize;
        let n: usize = chunks.iter().sum();
        let qkv: Vec<f32> = rng.vec(n * row).iter().map(|v| v * 2.0).collect();
        let ba: Vec<f32> = rng.vec(n * 2 * hvu).iter().map(|v| v * 3.0).collect();
        let mut head_w: Vec<f32> = rng.vec(hvu); // dt_bias
        head_w.extend(rng.vec(hvu).iter().map(|u| -(u.exp()))); // A = -exp(u) < 0
        head_w.extend(rng.vec(su).iter().map(|v| 1.0 + 0.5 * v)); // norm weight
        let (want, want_state) = gated_delta::reference(&shape, &qkv, &ba, &head_w);
        let hbuf = ctx.storage_buffer("head_w", bytemuck::cast_slice(&head_w));
        let state = ctx.storage_buffer("state", bytemuck::cast_slice(&vec![3.0f32; hvu * su * su]));
        // qkv rows padded by 1; ba from element 3 in rows of 2 hv + 2; out from element 1 in rows
        // of hv s + 5 (a projection's other columns around them).
        let q_at = Strided {
            offset: 0,
            stride: row + 1,
            len: row,
        };
        let ba_at = Strided {
            offset: 3,
            stride: 2 * hvu + 2,
            len: 2 * hvu,
        };
        let out_at = Strided {
            offset: 1,
            stride: hvu * su + 5,
            len: hvu * su,
        };
        for run in 0..2 {
            let mut got = Vec::new();
            let mut pos = 0usize;
            for &c in &chunks {
                let q = q_at.scatter(&qkv, pos, c);
                let b = ba_at.scatter(&ba, pos, c);
                let qbuf = ctx.storage_buffer("qkv", bytemuck::cast_slice(&q));
                let bbuf = ctx.storage_buffer("ba", bytemuck::cast_slice(&b));
                let out = ctx
                    .empty_storage("out", (out_at.span(c) * 4) as u64)
                    .unwrap();
                let buffers = GatedDeltaBuffers {
                    qkv: &qbuf,
                    qkv_stride: q_at.stride as u64,
                    ba: &bbuf,
                    ba_offset: ba_at.offset as u64,
                    ba_stride: ba_at.stride as u64,
                    head_w: &hbuf,
                    state: &state,
                    out: &out,
                    out_offset: out_at.offset as u64,
                    out_stride: out_at.stride as u64,
                };
                let mut enc = ctx.device.create_command_encoder(&Default::default());
                gated_delta::encode(&ctx, &mut enc, &buffers, &shape, c as u32, pos as u32)
                    .unwrap();
                ctx.queue.submit([enc.finish()]);
                let o = read_f32(&ctx, &out, 0, out_at.span(c)).await.unwrap();
                got.extend(out_at.gather(&o, c));
                pos += c;
            }
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let err = (g as f64 - w).abs() / (w.abs() + 1.0);
                assert!(
                    err <= TOLERANCE,
                    "gated_delta S {s} heads {hk}/{hv} run {run} [{}, {}, {}] = {g}, want {w} (error {err:.2e})",
                    i / (hvu * su),
                    i / su % hvu,
                    i % su
                );
                worst = worst.max(err);
            }
            let st = read_f32(&ctx, &state, 0, hvu * su * su).await.unwrap();
            for (i, (&g, &w)) in st.iter().zip(&want_state).enumerate() {
                let err = (g as f64 - w).abs() / (w.abs() + 1.0);
                assert!(err <= TOLERANCE, "state [{i}] = {g}, want {w}");
            }
        }
        // Value heads that are not a multiple of the key heads are refused.
        let bad = DeltaShape {
            n_v_heads: hv + 1,
            ..shape
        };
        let out = ctx.empty_storage("out", 4096 * 4).unwrap();
        let b = GatedDeltaBuffers {
            qkv: &out,
            qkv_stride: 1024,
            ba: &out,
            ba_offset: 0,
            ba_stride: 64,
            head_w: &hbuf,
            state: &state,
            out: &out,
            out_offset: 0,
            out_stride: 1024,
        };
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        if hk > 1 {
            assert!(gated_delta::encode(&ctx, &mut enc, &b, &bad, 1, 0).is_err());
        }
    }
    tlog!("gated_delta: worst error {worst:.2e}");
});
