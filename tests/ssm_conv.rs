//! `ssm_conv` (the gated delta-net's causal conv over q | k | v, then SiLU) against its CPU
//! reference (f64): widths 1-4, channel counts 1, 37, 130 and 641 (odd, past one workgroup), a
//! strided input with an offset, a sequence fed as prefill chunks of awkward sizes and single
//! decode tokens (the rolling state carries the inputs across chunks), and a restart at position
//! 0 over a state left dirty (a new sequence starts from zeros). Runs natively and in headless
//! Chrome.

mod common;

use cera_web::gpu::readback::read_f32;
use cera_web::ops::ssm_conv::{self, SsmConvBuffers};
use common::Rng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// |gpu - ref| / (sum_j |w_j x_j| + 1e-30): f32 products and a sum of at most 4 terms, then SiLU
/// (whose slope is at most 1.1).
const TOLERANCE: f64 = 2e-6;

gpu_test!(ssm_conv_chunks_widths_and_channels, async {
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(41);
    let mut worst = 0.0f64;
    for (channels, d_conv, chunks) in [
        (37usize, 4usize, vec![5usize, 1, 1, 7, 1]),
        (1, 2, vec![1, 1, 3]),
        (130, 1, vec![2, 3]),
        (641, 3, vec![1, 1, 1, 4]),
    ] {
        let n: usize = chunks.iter().sum();
        // Rows of `channels + 3` with the inputs from element 2 (the projection's other columns
        // around them).
        let (offset, stride) = (2usize, channels + 3);
        let x: Vec<f32> = rng.vec(n * channels).iter().map(|v| v * 3.0).collect();
        let weight = rng.vec(channels * d_conv);
        let want = ssm_conv::reference(&x, &weight, channels, d_conv);
        let wbuf = ctx.storage_buffer("w", bytemuck::cast_slice(&weight));
        // A dirty state: the first chunk starts at position 0, so it must not be read.
        let dirty = vec![7.0f32; channels * d_conv.max(2)];
        let state = ctx.storage_buffer("state", bytemuck::cast_slice(&dirty));
        for run in 0..2 {
            let mut got = Vec::new();
            let mut pos = 0usize;
            for &c in &chunks {
                let mut src = vec![0.0f32; offset + c * stride];
                for t in 0..c {
                    src[offset + t * stride..offset + t * stride + channels]
                        .copy_from_slice(&x[(pos + t) * channels..(pos + t + 1) * channels]);
                }
                let sbuf = ctx.storage_buffer("src", bytemuck::cast_slice(&src));
                let out = ctx.empty_storage("out", (c * channels * 4) as u64).unwrap();
                let b = SsmConvBuffers {
                    src: &sbuf,
                    in_offset: offset as u64,
                    in_stride: stride as u64,
                    weight: &wbuf,
                    state: &state,
                    out: &out,
                };
                let mut enc = ctx.device.create_command_encoder(&Default::default());
                ssm_conv::encode(
                    &ctx,
                    &mut enc,
                    &b,
                    c as u32,
                    channels as u32,
                    d_conv as u32,
                    pos as u32,
                )
                .unwrap();
                ctx.queue.submit([enc.finish()]);
                got.extend(read_f32(&ctx, &out, 0, c * channels).await.unwrap());
                pos += c;
            }
            // The second run starts over at 0 over the state the first left.
            for i in 0..n * channels {
                let (t, ch) = (i / channels, i % channels);
                let mut scale = 0.0;
                for j in 0..d_conv {
                    let back = d_conv - 1 - j;
                    if back <= t {
                        scale +=
                            (weight[ch * d_conv + j] * x[(t - back) * channels + ch]).abs() as f64;
                    }
                }
                let err = (got[i] as f64 - want[i]).abs() / scale.max(1e-30);
                assert!(
                    err <= TOLERANCE,
                    "ssm_conv {channels}x{d_conv} run {run} [{t}, {ch}] = {}, want {} (error {err:.2e})",
                    got[i],
                    want[i]
                );
                worst = worst.max(err);
            }
        }
        // An input stride shorter than the channels is refused.
        let out = ctx.empty_storage("out", (channels * 4) as u64).unwrap();
        let b = SsmConvBuffers {
            src: &out,
            in_offset: 0,
            in_stride: channels as u64 - 1,
            weight: &wbuf,
            state: &state,
            out: &out,
        };
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        assert!(
            ssm_conv::encode(&ctx, &mut enc, &b, 1, channels as u32, d_conv as u32, 0).is_err()
        );
    }
    tlog!("ssm_conv: worst error {worst:.2e}");
});
