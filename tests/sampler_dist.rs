//! The sampler's distribution against llama.cpp's sampler chain, statistically.
//!
//! `tests/fixtures/oracle/sampler-dist.json` (from `scripts/oracle/sampler_dist.py`) holds, per
//! configuration, 512 seeded logits, a token history, the sampler settings, the ids llama.cpp's
//! chain keeps before its final draw, and how often its chain (penalties, top-k, top-p, min-p,
//! temperature, dist) picked each token in 100,000 draws. Here the same logits go through our
//! sampler as a token does: penalties and top-64 on the GPU once, then the CPU half
//! ([`sample_candidates`]) for 100,000 draws from our RNG. The two count vectors are compared:
//! - every token we draw is one llama.cpp keeps;
//! - a two-sample chi-square test: the p-value must be above 1e-6;
//! - the total-variation distance between the two empirical distributions must be within the
//!   bound that holds with probability 1 - 1e-6 when both come from one distribution
//!   (Bretagnolle-Huber-Carol: P(|p_hat - p|_1 >= e) <= 2^k exp(-N e^2 / 2) for k categories and
//!   N draws, for each side).
//!
//! To show 100,000 draws are enough to tell two chains apart, the same test must reject (p below
//! 1e-6) our sampler run with the temperature 10% higher, and, for the penalized configuration,
//! with the penalties off. Both sides use fixed seeds, so the outcome is deterministic.
//!
//! Before drawing, the GPU's candidates are checked against the whole chain on the CPU over the
//! full vocabulary for 200 uniforms per configuration; in Chrome that is all this test does (the
//! draws themselves are target-independent CPU code).

mod common;

use cera_web::generate::sampler::{reference_sample, sample_candidates, SamplerParams, SamplerRng};
use cera_web::generate::session::now_s;
use cera_web::gpu::GpuContext;
use cera_web::ops::penalty::{count_tokens, Penalties};
use cera_web::ops::topk::{TopK, TopKResult};

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

const FIXTURE: &str = include_str!("fixtures/oracle/sampler-dist.json");
/// The false-alarm probability each statistical assertion allows.
const ALPHA: f64 = 1e-6;

#[derive(serde::Deserialize)]
struct Fixture {
    n_vocab: usize,
    draws: u64,
    configs: Vec<Config>,
}

#[derive(serde::Deserialize)]
struct Config {
    name: String,
    params: SamplerParams,
    history: Vec<u32>,
    logits: Vec<f32>,
    support: Vec<u32>,
    counts: std::collections::BTreeMap<u32, u64>,
}

/// `ln Gamma(x)` for x > 0 (Lanczos, g = 7, 9 terms: about 15 significant digits).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, &g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The upper regularized incomplete gamma function Q(s, x): the series below s + 1, a
/// continued fraction (modified Lentz) above.
fn gamma_q(s: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let prefix = (-x + s * x.ln() - ln_gamma(s)).exp();
    if x < s + 1.0 {
        let (mut term, mut sum, mut a) = (1.0 / s, 1.0 / s, s);
        for _ in 0..10_000 {
            a += 1.0;
            term *= x / a;
            sum += term;
            if term < sum * 1e-16 {
                break;
            }
        }
        1.0 - prefix * sum
    } else {
        let tiny = 1e-300;
        let mut b = x + 1.0 - s;
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - s);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let delta = d * c;
            h *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        prefix * h
    }
}

/// Two-sample chi-square test of two count vectors (over the same ids) drawn `na` and `nb`
/// times. Ids whose pooled count is below 10 are merged into one bin so the chi-square
/// approximation holds. Returns (statistic, degrees of freedom, p-value).
fn chi_square_two_sample(a: &[u64], b: &[u64]) -> (f64, usize, f64) {
    let (na, nb) = (a.iter().sum::<u64>() as f64, b.iter().sum::<u64>() as f64);
    let (ka, kb) = ((nb / na).sqrt(), (na / nb).sqrt());
    let mut bins: Vec<(f64, f64)> = Vec::new();
    let mut rare = (0.0, 0.0);
    for (&x, &y) in a.iter().zip(b) {
        if x + y == 0 {
            continue;
        }
        if x + y < 10 {
            rare.0 += x as f64;
            rare.1 += y as f64;
        } else {
            bins.push((x as f64, y as f64));
        }
    }
    if rare.0 + rare.1 > 0.0 {
        bins.push(rare);
    }
    let stat: f64 = bins
        .iter()
        .map(|&(x, y)| (ka * x - kb * y).powi(2) / (x + y))
        .sum();
    let df = bins.len().saturating_sub(1).max(1);
    (stat, df, gamma_q(df as f64 / 2.0, stat / 2.0))
}

/// Half the L1 distance between two empirical distributions.
fn total_variation(a: &[u64], b: &[u64]) -> f64 {
    let (na, nb) = (a.iter().sum::<u64>() as f64, b.iter().sum::<u64>() as f64);
    0.5 * a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 / na - y as f64 / nb).abs())
        .sum::<f64>()
}

/// The L1 radius that `n` draws over `k` categories stay within with probability 1 - `delta`
/// (Bretagnolle-Huber-Carol).
fn l1_radius(k: usize, n: f64, delta: f64) -> f64 {
    (2.0 * (k as f64 * std::f64::consts::LN_2 + (1.0 / delta).ln()) / n).sqrt()
}

/// The GPU half of our sampler for these logits and this history: penalties in place, then the
/// top-64 candidates and the full-vocabulary normalizer, read back once.
async fn gpu_candidates(
    ctx: &GpuContext,
    p: &SamplerParams,
    logits: &[f32],
    history: &[u32],
) -> TopKResult {
    let n = logits.len() as u32;
    let buf = ctx.storage_buffer("sampler-dist logits", bytemuck::cast_slice(logits));
    if p.penalties_active() && !history.is_empty() {
        let pairs = count_tokens(history.iter().copied());
        let mut pens = Penalties::new(ctx, &buf, n, pairs.len() as u32).unwrap();
        pens.write(
            ctx,
            &buf,
            &pairs,
            p.repeat_penalty,
            p.frequency_penalty,
            p.presence_penalty,
        )
        .unwrap();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        pens.encode(ctx, &mut enc).unwrap();
        ctx.queue.submit([enc.finish()]);
    }
    TopK::new(ctx, &buf, n).unwrap().run(ctx).await.unwrap()
}

/// `draws` tokens from the CPU half of our chain over the GPU's candidates, as
/// `Sampler::finish` draws them, counted per id.
fn draw(p: &SamplerParams, r: &TopKResult, n_vocab: usize, draws: u64, seed: u64) -> Vec<u64> {
    let mut rng = SamplerRng::new(seed);
    let mut counts = vec![0u64; n_vocab];
    for _ in 0..draws {
        let t = sample_candidates(p, &r.candidates, Some((r.max, r.sum_exp)), rng.uniform())
            .expect("a candidate");
        counts[t as usize] += 1;
    }
    counts
}

gpu_test!(sampler_distribution_matches_llama_cpp, async {
    let ctx = common::context().await;
    let fixture: Fixture = serde_json::from_str(FIXTURE).unwrap();
    let t_all = now_s();
    for (i, c) in fixture.configs.iter().enumerate() {
        let n = fixture.n_vocab;
        assert_eq!(c.logits.len(), n, "{}: logits", c.name);
        let mut theirs = vec![0u64; n];
        for (&id, &k) in &c.counts {
            theirs[id as usize] = k;
        }
        assert_eq!(
            theirs.iter().sum::<u64>(),
            fixture.draws,
            "{}: fixture draws",
            c.name
        );
        let p = SamplerParams {
            seed: 1000 + i as u64,
            ..c.params.clone()
        };
        let r = gpu_candidates(&ctx, &p, &c.logits, &c.history).await;

        // The GPU half agrees with the whole chain on the CPU over the full vocabulary
        // (penalties, full sort) for the same uniforms.
        let mut rng = SamplerRng::new(7);
        for _ in 0..200 {
            let u = rng.uniform();
            assert_eq!(
                sample_candidates(&p, &r.candidates, Some((r.max, r.sum_exp)), u),
                reference_sample(&p, &c.logits, &c.history, u),
                "{}: GPU candidates vs the CPU chain at u = {u}",
                c.name
            );
        }

        // The draws are CPU code and our RNG gives the same sequence on every target, so the
        // 1.3 million of them (9 s natively in a debug build) run natively only; in Chrome this
        // test checks the GPU half above on SwiftShader.
        if cfg!(target_arch = "wasm32") {
            continue;
        }
        let ours = draw(&p, &r, n, fixture.draws, p.seed);
        let support: std::collections::HashSet<u32> = c.support.iter().copied().collect();
        let outside: Vec<usize> = (0..n)
            .filter(|&id| ours[id] > 0 && !support.contains(&(id as u32)))
            .collect();
        assert!(
            outside.is_empty(),
            "{}: we drew {outside:?}, which llama.cpp's chain drops",
            c.name
        );
        let drawn = ours.iter().filter(|&&k| k > 0).count();

        let (stat, df, pv) = chi_square_two_sample(&ours, &theirs);
        let tv = total_variation(&ours, &theirs);
        let nd = fixture.draws as f64;
        let k = c.support.len();
        let tv_bound = 0.5 * 2.0 * l1_radius(k, nd, ALPHA / 2.0);

        // Controls: the same test must tell a different chain apart at this draw count.
        let hot = SamplerParams {
            temperature: p.temperature * 1.1,
            ..p.clone()
        };
        let (_, _, pv_hot) =
            chi_square_two_sample(&draw(&hot, &r, n, fixture.draws, p.seed), &theirs);
        let pv_nopen = if p.penalties_active() {
            let plain = SamplerParams {
                repeat_penalty: 1.0,
                frequency_penalty: 0.0,
                presence_penalty: 0.0,
                ..p.clone()
            };
            let r0 = gpu_candidates(&ctx, &plain, &c.logits, &[]).await;
            let (_, _, pv) =
                chi_square_two_sample(&draw(&plain, &r0, n, fixture.draws, p.seed), &theirs);
            Some(pv)
        } else {
            None
        };
        tlog!(
            "{}: support {k}, we drew {drawn} ids; chi2 {stat:.1} (df {df}) p = {pv:.3e}; TV {tv:.4} (bound {tv_bound:.4}); controls: temperature x1.1 p = {pv_hot:.1e}{}",
            c.name,
            pv_nopen.map(|v| format!(", penalties off p = {v:.1e}")).unwrap_or_default()
        );
        assert!(
            pv > ALPHA,
            "{}: our distribution differs from llama.cpp's: chi2 {stat:.1}, df {df}, p = {pv:e}",
            c.name
        );
        assert!(tv <= tv_bound, "{}: TV {tv} > {tv_bound}", c.name);
        assert!(
            pv_hot < ALPHA,
            "{}: a 10% hotter chain passed (p = {pv_hot:e}): too few draws to tell",
            c.name
        );
        if let Some(v) = pv_nopen {
            assert!(
                v < ALPHA,
                "{}: the chain without penalties passed (p = {v:e})",
                c.name
            );
        }
    }
    let what = if cfg!(target_arch = "wasm32") {
        "GPU candidates vs the CPU chain at 200 uniforms each (the draws run natively)".to_string()
    } else {
        format!("{} draws per side", fixture.draws)
    };
    tlog!(
        "{} configurations, {what}, in {:.1} s",
        fixture.configs.len(),
        now_s() - t_all
    );
});

#[cfg(not(target_arch = "wasm32"))]
#[test]
fn chi_square_tail_matches_known_values() {
    // Chi-square quantiles from tables (5 significant digits): df 1 at 3.8415 is 0.05, df 10 at
    // 23.209 is 0.01, df 40 at 73.402 is 0.001.
    for (df, x, want) in [
        (1.0, 3.841_459, 0.05),
        (10.0, 23.209_25, 0.01),
        (40.0, 73.402, 0.001),
    ] {
        let got = gamma_q(df / 2.0, x / 2.0);
        assert!(
            (got - want).abs() < want * 1e-4,
            "df {df} x {x}: {got} != {want}"
        );
    }
    // Integer s has a closed form, Q(n, x) = exp(-x) sum_{k<n} x^k / k!, on both sides of s + 1.
    for n in [1u32, 2, 5, 20, 32] {
        for x in [0.1, 1.0, 5.0, 19.0, 30.0, 60.0] {
            let (mut term, mut sum) = (1.0f64, 0.0f64);
            for k in 0..n {
                if k > 0 {
                    term *= x / k as f64;
                }
                sum += term;
            }
            let want = (-x).exp() * sum;
            let got = gamma_q(n as f64, x);
            assert!(
                (got - want).abs() <= 1e-12 + want * 1e-10,
                "Q({n}, {x}): {got} != {want}"
            );
        }
    }
}
