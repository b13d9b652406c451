//! `cera bench`: prefill and decode speed on the current adapter (medians of several runs),
//! and the share of a decode step spent in the output-head GEMV.

use std::sync::Arc;

use super::sampler::{Sampler, SamplerParams};
use super::session::{now_s, Session, SessionOptions};
use crate::error::Result;
use crate::gpu::GpuContext;
use crate::model::Model;
use crate::tokenizer::Tokenizer;

#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchReport {
    pub adapter: String,
    pub backend: String,
    pub model: String,
    pub prompt_tokens: u32,
    pub gen_tokens: u32,
    pub runs: u32,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub prefill_tok_s_runs: Vec<f64>,
    pub decode_tok_s_runs: Vec<f64>,
    /// Decode with one readback per token (the path of sampled decoding, and of greedy decoding
    /// with `chain` off): `decode_tok_s` chains greedy steps on the GPU as `generate` does.
    pub decode_step_tok_s: f64,
    pub decode_step_tok_s_runs: Vec<f64>,
    /// CPU milliseconds per chained decode token spent recording and submitting it (median
    /// run): the floor on the time per token that the CPU sets.
    pub cpu_record_ms_per_token: f64,
    /// Milliseconds of one output-head GEMV (timed alone, many in one submission).
    pub head_gemv_ms: f64,
    /// `head_gemv_ms` over the median decode step.
    pub head_share_of_decode: f64,
    /// Compute dispatches recorded per decode token (forward pass and sampler).
    pub dispatches_per_token: f64,
    /// Compute passes per decode token.
    pub passes_per_token: f64,
    /// Queue submissions per decode token.
    pub submits_per_token: f64,
    /// Dispatches of the prepared decode forward pass, by op kind.
    pub decode_plan: Vec<(String, usize)>,
    /// With `--profile`: GPU time per op kind of one decode step after the bench (timestamp
    /// queries: inside the one pass where the adapter offers it, else a pass per dispatch), and
    /// its total.
    pub profile: Option<Vec<crate::gpu::profile::KindTime>>,
    pub profile_total_us: Option<f64>,
    /// With `--profile`: every dispatch of that step, in order.
    pub profile_dispatches: Option<Vec<crate::gpu::profile::DispatchTime>>,
    /// With `--profile`: whether the profile was timed inside one pass.
    pub profile_in_pass: Option<bool>,
    /// With `--profile`: microseconds per near-empty dispatch in one pass, each waiting on the
    /// one before (chained) and each independent: the floor under a forward's dispatch count.
    pub dispatch_floor_chained_us: Option<f64>,
    pub dispatch_floor_independent_us: Option<f64>,
    /// With `--profile`: the same for one prefill chunk of the prompt's length (at most the
    /// workspace's batch), fed again at the position after the bench.
    pub prefill_profile: Option<Vec<crate::gpu::profile::KindTime>>,
    pub prefill_profile_total_us: Option<f64>,
    pub prefill_profile_dispatches: Option<Vec<crate::gpu::profile::DispatchTime>>,
}

const TEXT: &str =
    "The history of the printing press begins in the fifteenth century, when movable type \
changed how books were made, how ideas travelled and who could read them. Within fifty years \
presses were running in more than two hundred cities across Europe, and the number of books grew \
from thousands to millions. ";

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

pub async fn run(
    ctx: &Arc<GpuContext>,
    model: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    n_prompt: u32,
    n_gen: u32,
    runs: u32,
    profile: bool,
) -> Result<BenchReport> {
    let mut prompt = tok.encode(TEXT, true, false);
    let body: Vec<u32> = prompt[1..].to_vec();
    while prompt.len() < n_prompt as usize {
        prompt.extend_from_slice(&body);
    }
    prompt.truncate(n_prompt.max(1) as usize);
    // Greedy steps a readback: what `generate` chains (`Session::chain_target`, from the last
    // chain's time), unless the bench knob `CERA_CHAIN=N` fixes the length (`chain_steps`).
    let opts = SessionOptions {
        n_ctx: n_prompt + n_gen + 8,
        batch: n_prompt.clamp(1, 512),
        chain_steps: crate::gpu::knob::knob_u64("CERA_CHAIN")
            .map(|n| n.min(u32::MAX as u64) as u32),
        ..Default::default()
    };
    let mut session = Session::new(ctx.clone(), model.clone(), tok.clone(), opts)?;
    let (mut pre, mut dec, mut dec_step, mut rec_ms) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut per_token = crate::gpu::context::Counts::default();
    let n_dec = n_gen.max(2) - 1;
    // One warm-up run (pipelines compile, buffers settle), then the timed ones. Each run decodes
    // twice from the same prompt: chained greedy steps (what `generate` runs for greedy
    // decoding), then one readback per token.
    for run in 0..=runs {
        session.reset();
        let mut sampler = Sampler::new(SamplerParams::greedy());
        let t0 = now_s();
        let first = session.step(&prompt, &mut sampler).await?;
        let t1 = now_s();
        let c0 = ctx.counts();
        let r0 = session.record_s;
        let mut id = first;
        let mut left = n_dec;
        while left > 0 {
            let k = left.min(session.chain_target());
            let ids = session.decode_chained(id, k, &mut sampler).await?;
            id = *ids.last().expect("k > 0 steps");
            left -= k;
        }
        let t2 = now_s();
        per_token = ctx.counts().since(&c0);
        let recorded = session.record_s - r0;
        session.rewind(n_dec)?;
        let mut id = first;
        let t3 = now_s();
        for _ in 0..n_dec {
            id = session.step(&[id], &mut sampler).await?;
        }
        let t4 = now_s();
        if run > 0 {
            pre.push(prompt.len() as f64 / (t1 - t0));
            dec.push(n_dec as f64 / (t2 - t1).max(1e-9));
            dec_step.push(n_dec as f64 / (t4 - t3).max(1e-9));
            rec_ms.push(recorded * 1e3 / n_dec as f64);
        }
    }
    let prefill = median(&mut pre.clone());
    let decode = median(&mut dec.clone());
    let decode_step = median(&mut dec_step.clone());
    let head_ms = head_gemv_ms(ctx, model).await?;
    let steps = n_dec as f64;
    let plan = session.decode_plan_kinds()?;
    let (profile, profile_dispatches) = if profile {
        let (kinds, each) = session.profile_decode().await?;
        (Some(kinds), Some(each))
    } else {
        (None, None)
    };
    let (prefill_profile, prefill_profile_dispatches) = if profile.is_some() {
        let (kinds, each) = session.profile_batch(prompt.len() as u32).await?;
        (Some(kinds), Some(each))
    } else {
        (None, None)
    };
    let prefill_profile_total_us = prefill_profile
        .as_ref()
        .map(|p| p.iter().map(|k| k.us).sum());
    let profile_total_us = profile.as_ref().map(|p| p.iter().map(|k| k.us).sum());
    let floor = if profile.is_some() {
        crate::ops::matmul_bench::dispatch_floor_us(ctx, 256).await?
    } else {
        None
    };
    let profile_in_pass = profile.as_ref().map(|_| crate::gpu::profile::in_pass(ctx));
    Ok(BenchReport {
        adapter: ctx.adapter.name.clone(),
        backend: ctx.adapter.backend.clone(),
        model: model
            .weights
            .header
            .get_str("general.name")
            .unwrap_or("?")
            .to_string(),
        prompt_tokens: prompt.len() as u32,
        gen_tokens: n_gen,
        runs,
        prefill_tok_s: prefill,
        decode_tok_s: decode,
        prefill_tok_s_runs: pre,
        decode_tok_s_runs: dec,
        decode_step_tok_s: decode_step,
        decode_step_tok_s_runs: dec_step,
        cpu_record_ms_per_token: median(&mut rec_ms),
        head_gemv_ms: head_ms,
        head_share_of_decode: head_ms / (1000.0 / decode.max(1e-9)),
        dispatches_per_token: per_token.dispatches as f64 / steps,
        passes_per_token: per_token.passes as f64 / steps,
        submits_per_token: per_token.submits as f64 / steps,
        decode_plan: plan.into_iter().map(|(k, n)| (k.to_string(), n)).collect(),
        profile,
        profile_total_us,
        profile_in_pass,
        profile_dispatches,
        dispatch_floor_chained_us: floor.map(|f| f.0),
        dispatch_floor_independent_us: floor.map(|f| f.1),
        prefill_profile,
        prefill_profile_total_us,
        prefill_profile_dispatches,
    })
}

/// Time the output head alone: 20 GEMVs in one submission, after a warm-up.
async fn head_gemv_ms(ctx: &GpuContext, model: &Model) -> Result<f64> {
    let head = model.output_head();
    let x = ctx.storage_buffer(
        "bench x",
        bytemuck::cast_slice(&vec![0.01f32; head.cols as usize]),
    );
    let y = ctx.empty_storage("bench y", head.rows * 4)?;
    let iters = 20;
    let mut rec = crate::gpu::Recorder::new(ctx);
    crate::ops::matmul::prepare_auto(&mut rec, head, &x, 0, &y, 0, 1)?;
    let prepared = rec.finish();
    let mut times = Vec::new();
    for _ in 0..3 {
        let t0 = now_s();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for _ in 0..iters {
                prepared.record(&mut pass);
            }
        }
        ctx.submit([enc.finish()]);
        crate::gpu::readback::read_buffer(ctx, &y, 0, 4).await?;
        times.push((now_s() - t0) * 1000.0 / iters as f64);
    }
    Ok(median(&mut times[1..].to_vec()))
}
