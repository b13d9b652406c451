//! Sampling kernels on the GPU against their CPU references (argmax, top-k, penalties), and the
//! GPU sampler end to end. Each body runs natively (lavapipe) and in headless Chrome.

mod common;

use cera_web::generate::sampler::{reference_sample, Sampler, SamplerParams, SamplerRng};
use cera_web::gpu::GpuContext;
use cera_web::ops::argmax::{cpu_argmax, Argmax};
use cera_web::ops::mask::{cpu_mask, TokenMask};
use cera_web::ops::penalty::{count_tokens, cpu_penalties, Penalties};
use cera_web::ops::topk::{cpu_topk, TopK, TOPK};
use common::Rng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

const SIZES: [usize; 4] = [1, 7, 1000, 262144];

/// Logits on a coarse grid (steps of 1/8 in [-8, 8]) so equal values, and ties at the top, are
/// common; the maximum is also planted twice, late then early, so "lowest index" is tested.
fn tied_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut v: Vec<f32> = (0..n).map(|_| (rng.f32() * 64.0).round() / 8.0).collect();
    if n >= 7 {
        v[n - 2] = 9.0;
        v[n / 3] = 9.0;
    }
    v
}

/// The first `n` u32 words of `buf`.
async fn read_u32(ctx: &GpuContext, buf: &wgpu::Buffer, n: u64) -> Vec<u32> {
    let raw = cera_web::gpu::readback::read_buffer(ctx, buf, 0, n * 4)
        .await
        .unwrap();
    bytemuck::pod_collect_to_vec(&raw)
}

fn upload(ctx: &GpuContext, v: &[f32]) -> wgpu::Buffer {
    ctx.storage_buffer("test logits", bytemuck::cast_slice(v))
}

gpu_test!(argmax_matches_cpu_over_awkward_sizes, async {
    let ctx = common::shared_context().await;
    for (s, &n) in SIZES.iter().enumerate() {
        for variant in 0..2u64 {
            let mut v = tied_logits(n, 10 + s as u64 * 2 + variant);
            if variant == 1 {
                // All equal: the answer is index 0; and all negative.
                v.iter_mut().for_each(|x| *x = -1.5);
            }
            let buf = upload(&ctx, &v);
            let op = Argmax::new(&ctx, &buf, n as u32).unwrap();
            let got = op.run(&ctx).await.unwrap();
            let want = cpu_argmax(&v);
            tlog!(
                "argmax n={n} variant={variant}: stages={} gpu={got} cpu={want}",
                op.stages()
            );
            assert_eq!(got, want, "argmax n={n} variant={variant}");
        }
    }
});

// The last stage of a chained step (`Argmax::chained`): each run writes the winner as the
// step's token id and as the next pair of the chain, counts it, and moves the positions on by
// one token; a chain longer than its buffer overwrites the last pair.
gpu_test!(argmax_chained_advances_the_step, async {
    use cera_web::gpu::{Step, StepState};
    let ctx = common::shared_context().await;
    for (s, &n) in SIZES.iter().enumerate() {
        let step = Step::new(&ctx, 1).unwrap();
        step.write(&ctx, 5, &[77]);
        let chain = ctx.empty_storage("test chain", 2 * 8).unwrap();
        let buf = ctx.empty_storage("test logits", n as u64 * 4).unwrap();
        let op = Argmax::chained(&ctx, &buf, n as u32, &step.buffer, &chain).unwrap();
        let mut want = Vec::new();
        for run in 0..3u64 {
            let v = tied_logits(n, 300 + s as u64 * 3 + run);
            ctx.queue.write_buffer(&buf, 0, bytemuck::cast_slice(&v));
            let id = op.run(&ctx).await.unwrap();
            assert_eq!(id, cpu_argmax(&v), "chained argmax n={n} run {run}");
            want.push((v[id as usize].to_bits(), id));
        }
        let words = read_u32(&ctx, &step.buffer, 5).await;
        let state = StepState {
            pos0: 8,
            n_tokens: 1,
            n_past: 9,
            chained: 3,
        };
        let state: [u32; 4] = bytemuck::cast(state);
        assert_eq!(words[..4], state, "n={n}: the step state after 3 runs");
        assert_eq!(words[4], want[2].1, "n={n}: the next step's token");
        let pairs = read_u32(&ctx, &chain, 4).await;
        // Slots 0 and 1; the third run overwrote slot 1 (the chain holds two).
        assert_eq!(
            pairs,
            [want[0].0, want[0].1, want[2].0, want[2].1],
            "n={n}: the chain"
        );
        let short = ctx.empty_storage("short chain", 4).unwrap();
        assert!(Argmax::chained(&ctx, &buf, n as u32, &step.buffer, &short).is_err());
    }
});

gpu_test!(topk_matches_cpu_over_awkward_sizes, async {
    let ctx = common::shared_context().await;
    for (s, &n) in SIZES.iter().enumerate() {
        let v = tied_logits(n, 100 + s as u64);
        let buf = upload(&ctx, &v);
        let op = TopK::new(&ctx, &buf, n as u32).unwrap();
        let got = op.run(&ctx).await.unwrap();
        let want = cpu_topk(&v, TOPK as usize);
        tlog!(
            "topk n={n}: stages={} kept={} max={} sum_exp={} (cpu {})",
            op.stages(),
            got.candidates.len(),
            got.max,
            got.sum_exp,
            want.sum_exp
        );
        assert_eq!(got.candidates, want.candidates, "topk n={n}");
        assert_eq!(got.max, want.max, "topk max n={n}");
        let rel = ((got.sum_exp - want.sum_exp) / want.sum_exp).abs();
        assert!(
            rel < 1e-4,
            "topk sum_exp n={n}: gpu {} cpu {}",
            got.sum_exp,
            want.sum_exp
        );
    }
});

gpu_test!(penalties_match_cpu, async {
    let ctx = common::shared_context().await;
    for &n in &SIZES {
        let mut v = tied_logits(n, 200 + n as u64);
        let mut rng = Rng::new(n as u64);
        // Recent tokens with repeats, a zero logit and an id past the vocabulary.
        let history: Vec<u32> = (0..70)
            .map(|_| (rng.next_u64() % (n as u64 + 2)) as u32)
            .chain([0, 0, n as u32 + 5])
            .collect();
        if n > 3 {
            v[3] = 0.0;
        }
        let pairs = count_tokens(history.iter().copied());
        let buf = upload(&ctx, &v);
        let mut pen = Penalties::new(&ctx, &buf, n as u32, 8).unwrap();
        pen.write(&ctx, &buf, &pairs, 1.3, 0.25, 0.5).unwrap();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        pen.encode(&ctx, &mut enc).unwrap();
        ctx.queue.submit([enc.finish()]);
        let got = cera_web::gpu::readback::read_f32(&ctx, &buf, 0, n)
            .await
            .unwrap();
        cpu_penalties(&mut v, &pairs, 1.3, 0.25, 0.5);
        for (i, (g, w)) in got.iter().zip(&v).enumerate() {
            // One rounding apart at most (the GPU may fuse count * f + presence).
            assert!(
                (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                "penalties n={n} at {i}: gpu {g} cpu {w}"
            );
        }
    }
});

/// Continuous logits (no ties), scaled so a few dozen tokens carry the mass.
fn smooth_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.f32() * 6.0).collect()
}

/// Sample `steps` tokens, re-uploading `logits` each step (penalties edit them in place), with
/// the sampled tokens fed back into the history.
async fn run_sampler(
    ctx: &GpuContext,
    params: SamplerParams,
    logits: &[f32],
    prompt: &[u32],
    steps: usize,
) -> Vec<u32> {
    let buf = upload(ctx, logits);
    let mut s = Sampler::new(params);
    s.accept_all(prompt);
    let mut out = Vec::new();
    for _ in 0..steps {
        ctx.queue
            .write_buffer(&buf, 0, bytemuck::cast_slice(logits));
        out.push(
            s.sample_logits(ctx, &buf, logits.len() as u32)
                .await
                .unwrap(),
        );
    }
    out
}

gpu_test!(sampler_matches_full_vocab_cpu_chain, async {
    let ctx = common::shared_context().await;
    for (n, steps) in [(1000usize, 12usize), (262144, 4)] {
        let logits = smooth_logits(n, 7 + n as u64);
        let params = SamplerParams {
            seed: 1234,
            repeat_penalty: 1.2,
            frequency_penalty: 0.1,
            presence_penalty: 0.2,
            penalty_last_n: 16,
            ..Default::default()
        };
        let top: Vec<u32> = cpu_topk(&logits, 5)
            .candidates
            .iter()
            .map(|c| c.1)
            .collect();
        let got = run_sampler(&ctx, params.clone(), &logits, &top, steps).await;
        // The same chain on the CPU over the whole vocabulary, with the same uniforms.
        let mut rng = SamplerRng::new(params.seed);
        let mut history = top.clone();
        let mut want = Vec::new();
        for _ in 0..steps {
            let recent = &history[history.len().saturating_sub(16)..];
            let t = reference_sample(&params, &logits, recent, rng.uniform()).unwrap();
            history.push(t);
            want.push(t);
        }
        tlog!("sampler n={n}: gpu {got:?} cpu {want:?}");
        assert_eq!(got, want, "n={n}");
    }
});

gpu_test!(seeded_sampling_repeats_and_top_k_1_is_greedy, async {
    let ctx = common::shared_context().await;
    let logits = smooth_logits(1000, 99);
    let p = SamplerParams {
        seed: 5,
        temperature: 1.5,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..Default::default()
    };
    let a = run_sampler(&ctx, p.clone(), &logits, &[], 10).await;
    let b = run_sampler(&ctx, p.clone(), &logits, &[], 10).await;
    assert_eq!(a, b, "same seed, same tokens");
    let c = run_sampler(
        &ctx,
        SamplerParams {
            seed: 6,
            ..p.clone()
        },
        &logits,
        &[],
        10,
    )
    .await;
    assert_ne!(
        a, c,
        "another seed, other tokens (10 draws from a flat distribution)"
    );
    assert!(
        a.iter().collect::<std::collections::HashSet<_>>().len() > 1,
        "temperature 1.5 should vary: {a:?}"
    );

    // top_k 1 (through top-k and the CPU chain) equals greedy (through argmax), ties included.
    let tied = tied_logits(1000, 3);
    let greedy = run_sampler(&ctx, SamplerParams::greedy(), &tied, &[], 3).await;
    let top1 = run_sampler(
        &ctx,
        SamplerParams {
            top_k: 1,
            seed: 77,
            ..Default::default()
        },
        &tied,
        &[],
        3,
    )
    .await;
    assert_eq!(greedy, vec![cpu_argmax(&tied); 3]);
    assert_eq!(top1, greedy);
});

gpu_test!(penalties_lower_a_repeated_token, async {
    let ctx = common::shared_context().await;
    let n = 1000;
    let mut logits = smooth_logits(n, 4);
    let a = cpu_argmax(&logits);
    // Greedy without history picks a; with a in the history and a repeat penalty it must not.
    let base = SamplerParams {
        repeat_penalty: 1.5,
        ..SamplerParams::greedy()
    };
    assert_eq!(
        run_sampler(&ctx, base.clone(), &logits, &[], 1).await,
        vec![a]
    );
    let penalized = run_sampler(&ctx, base.clone(), &logits, &[a, a], 1).await;
    assert_ne!(penalized, vec![a]);
    let mut pen = logits.clone();
    cpu_penalties(&mut pen, &[(a, 2)], 1.5, 0.0, 0.0);
    assert_eq!(penalized, vec![cpu_argmax(&pen)]);
    // Temperature 0 with penalties off ignores the history.
    let off = run_sampler(&ctx, SamplerParams::greedy(), &logits, &[a, a, a], 1).await;
    assert_eq!(off, vec![a]);

    // Probability of the repeated token (from the GPU's candidates and normalizer) drops under
    // each penalty, and more with a higher count for the frequency penalty.
    logits[a as usize] = 7.0;
    let buf = upload(&ctx, &logits);
    let topk = TopK::new(&ctx, &buf, n as u32).unwrap();
    let mut pens = Penalties::new(&ctx, &buf, n as u32, 4).unwrap();
    let prob = |r: cera_web::ops::topk::TopKResult| {
        let l = r
            .candidates
            .iter()
            .find(|c| c.1 == a)
            .map(|c| c.0)
            .unwrap_or(f32::NEG_INFINITY);
        ((l - r.max).exp() / r.sum_exp) as f64
    };
    let p0 = prob(topk.run(&ctx).await.unwrap());
    let mut probs = Vec::new();
    for (count, rep, freq, pres) in [
        (1u32, 1.3f32, 0.0f32, 0.0f32),
        (1, 1.0, 0.5, 0.0),
        (3, 1.0, 0.5, 0.0),
        (1, 1.0, 0.0, 1.0),
    ] {
        ctx.queue
            .write_buffer(&buf, 0, bytemuck::cast_slice(&logits));
        pens.write(&ctx, &buf, &[(a, count)], rep, freq, pres)
            .unwrap();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        pens.encode(&ctx, &mut enc).unwrap();
        ctx.queue.submit([enc.finish()]);
        probs.push(prob(topk.run(&ctx).await.unwrap()));
    }
    tlog!(
        "p(repeated) = {p0:.4} -> repeat {:.4}, freq x1 {:.4}, freq x3 {:.4}, presence {:.4}",
        probs[0],
        probs[1],
        probs[2],
        probs[3]
    );
    assert!(probs.iter().all(|&p| p < p0));
    assert!(probs[2] < probs[1]);
});

/// Bitsets with every word shape: all allowed, none, alternating bits, a random sparse set, and
/// a tail word that is partly past the vocabulary.
/// How many values differ bit for bit.
fn bit_diffs(got: &[f32], want: &[f32]) -> usize {
    got.iter()
        .zip(want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count()
}

fn masks(n: usize, seed: u64) -> Vec<Vec<u32>> {
    let words = n.div_ceil(32);
    let mut rng = Rng::new(seed);
    vec![
        vec![u32::MAX; words],
        vec![0; words],
        vec![0xAAAA_AAAA; words],
        (0..words)
            .map(|_| {
                if rng.f32() < 0.3 {
                    (rng.next_u64() as u32) & (rng.next_u64() as u32)
                } else {
                    0
                }
            })
            .collect(),
    ]
}

gpu_test!(mask_matches_cpu_over_awkward_sizes, async {
    let ctx = common::shared_context().await;
    for (s, &n) in SIZES.iter().chain(&[33usize, 262145]).enumerate() {
        let logits = tied_logits(n, 300 + s as u64);
        for (m, bits) in masks(n, 400 + s as u64).iter().enumerate() {
            let buf = upload(&ctx, &logits);
            let op = TokenMask::new(&ctx, &buf, n as u32).unwrap();
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            op.encode(&ctx, &mut enc, bits);
            ctx.submit([enc.finish()]);
            let got = cera_web::gpu::readback::read_f32(&ctx, &buf, 0, n)
                .await
                .unwrap();
            let mut want = logits.clone();
            cpu_mask(&mut want, bits);
            let bad = bit_diffs(&got, &want);
            tlog!(
                "mask n={n} mask {m}: {bad} differ, {} allowed",
                want.iter().filter(|x| x.is_finite()).count()
            );
            assert_eq!(bad, 0, "mask n={n} mask {m}");
        }
    }
});

// The GPU mask then the argmax / top-k equals the CPU chain on masked logits, greedy and sampled.
gpu_test!(masked_logits_sample_only_allowed_tokens, async {
    let ctx = common::shared_context().await;
    let n = 262144usize;
    let logits = smooth_logits(n, 77);
    let bits = &masks(n, 78)[3];
    let mut masked = logits.clone();
    cpu_mask(&mut masked, bits);
    let buf = upload(&ctx, &logits);
    let op = TokenMask::new(&ctx, &buf, n as u32).unwrap();
    for params in [
        SamplerParams::greedy(),
        SamplerParams {
            seed: 9,
            temperature: 1.0,
            ..Default::default()
        },
    ] {
        let mut s = Sampler::new(params.clone());
        let mut rng = SamplerRng::new(params.seed);
        for step in 0..4 {
            ctx.queue
                .write_buffer(&buf, 0, bytemuck::cast_slice(&logits));
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            op.encode(&ctx, &mut enc, bits);
            ctx.submit([enc.finish()]);
            let got = s.sample_logits(&ctx, &buf, n as u32).await.unwrap();
            let want = reference_sample(&params, &masked, &[], rng.uniform()).unwrap();
            assert!(
                (bits[got as usize / 32] >> (got % 32)) & 1 == 1,
                "token {got} is masked"
            );
            assert_eq!(got, want, "step {step}, {params:?}");
        }
    }
});

// The mask submitted many times over the same logits on the Gemma 3 vocabulary (as one op is
// recorded once and reused every step): the result is the mask applied once, bit for bit. The
// time per step (the upload of the bitset plus the dispatch) is logged; the CPU side,
// llguidance's mask, is timed in the model tests.
gpu_test!(mask_repeated_equals_mask_once, async {
    let ctx = common::shared_context().await;
    let n = 262144usize;
    let logits = smooth_logits(n, 5);
    let buf = upload(&ctx, &logits);
    let op = TokenMask::new(&ctx, &buf, n as u32).unwrap();
    let bits = &masks(n, 6)[2];
    let runs = 20;
    let t0 = cera_web::generate::session::now_s();
    for _ in 0..runs {
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        op.encode(&ctx, &mut enc, bits);
        ctx.submit([enc.finish()]);
    }
    let got = cera_web::gpu::readback::read_f32(&ctx, &buf, 0, n)
        .await
        .unwrap();
    let ms = (cera_web::generate::session::now_s() - t0) * 1000.0 / runs as f64;
    tlog!("mask upload + dispatch over {n} tokens: {ms:.3} ms per step (with one readback)");
    let mut want = logits;
    cpu_mask(&mut want, bits);
    let bad = bit_diffs(&got, &want);
    assert_eq!(bad, 0, "{runs} masks in a row differ from one");
});
