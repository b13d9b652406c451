//! The sampler: llama.cpp's default chain with the vocabulary-wide work on the GPU.
//!
//! Per token (docs/architecture.md, decision 7: one readback per token, never the logits):
//! 1. GPU: repetition / frequency / presence penalties in place on the logits
//!    ([`crate::ops::penalty`]) from the last `penalty_last_n` accepted tokens.
//! 2. GPU: `temperature <= 0` -> argmax ([`crate::ops::argmax`]), read back 4 bytes, done.
//!    Otherwise top-K ([`crate::ops::topk`], K = [`TOPK`] = 64) plus the full-vocab softmax
//!    normalizer, read back `TOPK * 8 + 8` bytes.
//!
//!    With a constraint ([`Sampler::set_constraint`]), the grammar's token bitset for the step is
//!    computed on the CPU and uploaded, and the logits of forbidden tokens become `-inf` on the
//!    GPU ([`crate::ops::mask`]) before steps 1 and 2, so the readback stays as small.
//! 3. CPU, on the candidates ([`sample_candidates`]): top-k, top-p, min-p, temperature, softmax,
//!    sample: llama.cpp's `common_params_sampling::samplers` order (penalties, dry, top_n_sigma,
//!    top_k, typ_p, top_p, min_p, xtc, temperature, then `dist`), less the samplers we don't have
//!    (dry, top_n_sigma, typ_p, xtc: all off by default in llama.cpp).
//!
//! Where K = 64 changes the result against llama.cpp's full-vocabulary chain:
//! - `top_k` in `1..=64` (llama.cpp's default is 40): none. Top-k leaves llama.cpp at most those
//!   candidates too, and top-p / min-p / temperature only ever see them.
//! - `top_k == 0` (off) or `> 64`: the candidates are cut to 64. Top-p's probabilities still use
//!   the full-vocabulary normalizer the GPU computes (exact for `top_k == 0`; for `top_k > 64`
//!   llama.cpp would normalize over its top_k, a slightly larger probability). If the nucleus
//!   needs more than 64 tokens, it keeps 64. Min-p compares with the top logit: exact except for
//!   the same cut.
//!
//! Other deviations: ties in top-k go to the lower id (llama.cpp's partial sort leaves them in an
//! unspecified order); the RNG is our own xorshift64* (same sequence natively and in wasm,
//! not llama.cpp's mt19937), so a seed reproduces our runs, not llama.cpp's; `seed` defaults to
//! llama.cpp's `LLAMA_DEFAULT_SEED` (0xFFFFFFFF) but is used as is, where llama.cpp draws a
//! random seed for it; `penalty_last_n = -1` means "the whole history" (llama.cpp: the context
//! size; the session resets the history with the context).

use std::collections::VecDeque;

use crate::error::{Error, ErrorCode, Result};
use crate::gpu::readback::map_read;
use crate::gpu::GpuContext;
use crate::ops::argmax::Argmax;
use crate::ops::mask::TokenMask;
use crate::ops::penalty::{count_tokens, is_active, Penalties};
use crate::ops::topk::{TopK, TopKResult, TOPK};

use super::constraint::Constraint;

/// Sampling options, with llama.cpp's defaults (`common_params_sampling`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplerParams {
    /// Default 0.8. `<= 0` is greedy (GPU argmax after penalties).
    pub temperature: f32,
    /// Default 40. `<= 0` is off; exact up to [`TOPK`] (see the module docs beyond).
    pub top_k: i32,
    /// Default 0.95. `>= 1` is off.
    pub top_p: f32,
    /// Default 0.05. `<= 0` is off.
    pub min_p: f32,
    /// llama.cpp `repeat_penalty`, default 1.0 (off).
    pub repeat_penalty: f32,
    /// llama.cpp `frequency_penalty`, default 0.0 (off).
    pub frequency_penalty: f32,
    /// llama.cpp `presence_penalty`, default 0.0 (off).
    pub presence_penalty: f32,
    /// Tokens the penalties look back over, default 64. 0 is off, -1 the whole history.
    pub penalty_last_n: i32,
    /// Default 0xFFFFFFFF (llama.cpp's `LLAMA_DEFAULT_SEED`, used here as a plain seed).
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0xFFFF_FFFF,
        }
    }
}

impl SamplerParams {
    /// Greedy decoding: argmax after penalties.
    pub fn greedy() -> Self {
        SamplerParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    pub fn penalties_active(&self) -> bool {
        self.penalty_last_n != 0
            && is_active(
                self.repeat_penalty,
                self.frequency_penalty,
                self.presence_penalty,
            )
    }
}

/// A seeded xorshift64* generator: the same sequence natively and in wasm, no dependency.
#[derive(Clone, Debug)]
pub struct SamplerRng(u64);

impl SamplerRng {
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed, so nearby seeds diverge and the state is never 0.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        SamplerRng((z ^ (z >> 31)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[0, 1)` with 53 bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The CPU half of the chain on candidates sorted best first (`(logit, id)`, penalties already
/// applied): top-k, top-p, min-p, temperature, softmax, then a draw with the uniform `u`.
/// `norm` is the full-vocabulary `(max, sum exp(logit - max))`, used by top-p when the candidates
/// are not all llama.cpp's top-k set would be (see the module docs). `None` when empty.
pub fn sample_candidates(
    p: &SamplerParams,
    candidates: &[(f32, u32)],
    norm: Option<(f32, f32)>,
    u: f64,
) -> Option<u32> {
    let mut c: Vec<(f32, u32)> = candidates.to_vec();
    if c.is_empty() {
        return None;
    }
    // top_k (llama_sampler_top_k): k <= 0 is off.
    let top_k_exact = p.top_k >= 1 && p.top_k as usize <= TOPK as usize;
    if p.top_k > 0 {
        c.truncate(p.top_k as usize);
    }
    // top_p (llama_sampler_top_p): softmax, keep through the first index where the running sum
    // reaches p.
    if p.top_p < 1.0 {
        let (m, s) = match norm {
            Some(n) if !top_k_exact => n,
            _ => {
                let m = c[0].0;
                (m, c.iter().map(|&(l, _)| (l - m).exp()).sum::<f32>())
            }
        };
        let mut cum = 0.0f32;
        for i in 0..c.len() {
            cum += (c[i].0 - m).exp() / s;
            if cum >= p.top_p {
                c.truncate(i + 1);
                break;
            }
        }
    }
    // min_p (llama_sampler_min_p, sorted path): drop from the first logit below max + ln(p).
    if p.min_p > 0.0 {
        let min_logit = c[0].0 + p.min_p.ln();
        if let Some(i) = (1..c.len()).find(|&i| c[i].0 < min_logit) {
            c.truncate(i);
        }
    }
    // temperature (llama_sampler_temp): <= 0 keeps the top only.
    if p.temperature <= 0.0 {
        c.truncate(1);
    } else {
        for x in c.iter_mut() {
            x.0 /= p.temperature;
        }
    }
    // dist (llama_sampler_dist): f32 exps, f64 running sum against u * total.
    let m = c[0].0;
    let probs: Vec<f32> = c.iter().map(|&(l, _)| (l - m).exp()).collect();
    let total: f64 = probs.iter().map(|&q| q as f64).sum();
    let target = total * u;
    let mut run = 0.0f64;
    for (i, &q) in probs.iter().enumerate() {
        run += q as f64;
        if run >= target {
            return Some(c[i].1);
        }
    }
    Some(c[c.len() - 1].1)
}

/// The whole chain on the CPU over a full logits vector, as llama.cpp runs it (penalties from
/// `recent`, full sort): the reference the GPU path is tested against.
pub fn reference_sample(p: &SamplerParams, logits: &[f32], recent: &[u32], u: f64) -> Option<u32> {
    let mut l = logits.to_vec();
    if p.penalties_active() {
        crate::ops::penalty::cpu_penalties(
            &mut l,
            &count_tokens(recent.iter().copied()),
            p.repeat_penalty,
            p.frequency_penalty,
            p.presence_penalty,
        );
    }
    if p.is_greedy() {
        let i = crate::ops::argmax::cpu_argmax(&l);
        return (i != crate::ops::argmax::NONE).then_some(i);
    }
    let full = crate::ops::topk::cpu_topk(&l, l.len());
    let k = if p.top_k > 0 {
        (p.top_k as usize).min(TOPK as usize)
    } else {
        TOPK as usize
    };
    sample_candidates(
        p,
        &full.candidates[..k.min(full.candidates.len())],
        Some((full.max, full.sum_exp)),
        u,
    )
}

/// GPU objects bound to one logits buffer, rebuilt when the caller passes another.
struct GpuState {
    logits: wgpu::Buffer,
    n_vocab: u32,
    penalties: Option<Penalties>,
    mask: Option<TokenMask>,
    argmax: Option<Argmax>,
    /// The argmax of chained steps, with the step and chain buffers it advances.
    chained: Option<(Argmax, wgpu::Buffer, wgpu::Buffer)>,
    topk: Option<TopK>,
    staging: wgpu::Buffer,
    /// What the pending readback holds.
    pending: Option<Pending>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Pending {
    Argmax,
    TopK,
}

/// A sampler with its history (for penalties), RNG and GPU resources.
///
/// Per token: [`Sampler::sample`] with the encoder that holds the forward pass (so the forward
/// pass, penalties, reduction and the copy to the readback buffer are one command buffer), or
/// [`Sampler::encode`] + submit + [`Sampler::finish`] for a caller that submits itself. The
/// logits buffer is modified in place when penalties are on. The sampled token is accepted into
/// the history; prompt tokens are accepted with [`Sampler::accept`] (as llama.cpp's CLI does).
pub struct Sampler {
    pub params: SamplerParams,
    rng: SamplerRng,
    history: VecDeque<u32>,
    gpu: Option<GpuState>,
    constraint: Option<Constraint>,
    /// CPU time spent computing token masks, seconds, and the masks computed.
    pub mask_time_s: f64,
    pub masks: u32,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Self {
        let rng = SamplerRng::new(params.seed);
        Sampler {
            params,
            rng,
            history: VecDeque::new(),
            gpu: None,
            constraint: None,
            mask_time_s: 0.0,
            masks: 0,
        }
    }

    /// Constrain every token sampled from now on to `constraint`'s grammar.
    pub fn set_constraint(&mut self, constraint: Constraint) {
        self.constraint = Some(constraint);
    }

    /// The tokens the constraint forces next, committed to it and accepted into the history
    /// (empty without a constraint).
    pub fn take_forced(&mut self) -> Vec<u32> {
        let forced = match self.constraint.as_mut() {
            Some(c) => c.take_forced(),
            None => return Vec::new(),
        };
        for &t in &forced {
            self.accept(t);
        }
        forced
    }

    pub fn constraint_mut(&mut self) -> Option<&mut Constraint> {
        self.constraint.as_mut()
    }

    /// Record a token (prompt or generated) for the penalties.
    pub fn accept(&mut self, token: u32) {
        self.history.push_back(token);
        if self.params.penalty_last_n > 0 {
            while self.history.len() > self.params.penalty_last_n as usize {
                self.history.pop_front();
            }
        }
    }

    pub fn accept_all(&mut self, tokens: &[u32]) {
        for &t in tokens {
            self.accept(t);
        }
    }

    /// Forget the history and restart the RNG from the seed.
    pub fn reset(&mut self) {
        self.history.clear();
        self.rng = SamplerRng::new(self.params.seed);
    }

    /// The tokens the penalties look at, oldest first.
    pub fn history(&self) -> Vec<u32> {
        self.history.iter().copied().collect()
    }

    fn state(
        &mut self,
        ctx: &GpuContext,
        logits: &wgpu::Buffer,
        n_vocab: u32,
    ) -> Result<&mut GpuState> {
        let stale = match &self.gpu {
            Some(g) => g.logits != *logits || g.n_vocab != n_vocab,
            None => true,
        };
        if stale {
            self.gpu = Some(GpuState {
                logits: logits.clone(),
                n_vocab,
                penalties: None,
                mask: None,
                argmax: None,
                chained: None,
                topk: None,
                staging: ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("sampler readback"),
                    size: TopK::RESULT_BYTES,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                pending: None,
            });
        }
        Ok(self.gpu.as_mut().expect("just set"))
    }

    /// Record penalties, the reduction and the copy to the readback buffer into `encoder`
    /// (one compute pass). `logits` holds at least `n_vocab` f32 (`STORAGE`).
    pub fn encode(
        &mut self,
        ctx: &GpuContext,
        encoder: &mut wgpu::CommandEncoder,
        logits: &wgpu::Buffer,
        n_vocab: u32,
    ) -> Result<()> {
        self.encode_after(ctx, encoder, logits, n_vocab, |_| {})
    }

    /// [`Sampler::encode`] sharing its compute pass with work recorded first by `before` (the
    /// forward pass that writes `logits`): one pass per token.
    pub fn encode_after(
        &mut self,
        ctx: &GpuContext,
        encoder: &mut wgpu::CommandEncoder,
        logits: &wgpu::Buffer,
        n_vocab: u32,
        before: impl FnOnce(&mut wgpu::ComputePass<'_>),
    ) -> Result<()> {
        let p = self.params.clone();
        let pairs = if p.penalties_active() {
            count_tokens(self.history.iter().copied())
        } else {
            Vec::new()
        };
        let words = match self.constraint.as_mut() {
            Some(c) => {
                let t0 = super::session::now_s();
                let w = c.mask()?.to_vec();
                self.mask_time_s += super::session::now_s() - t0;
                self.masks += 1;
                Some(w)
            }
            None => None,
        };
        let g = self.state(ctx, logits, n_vocab)?;
        if let Some(words) = &words {
            if g.mask.is_none() {
                g.mask = Some(TokenMask::new(ctx, logits, n_vocab)?);
            }
            g.mask.as_ref().expect("built").write(ctx, words);
        }
        if !pairs.is_empty() && g.penalties.is_none() {
            g.penalties = Some(Penalties::new(
                ctx,
                logits,
                n_vocab,
                pairs.len().max(64) as u32,
            )?);
        }
        if let Some(pen) = g.penalties.as_mut() {
            // No pairs: the dispatch is skipped.
            pen.write(
                ctx,
                logits,
                &pairs,
                p.repeat_penalty,
                p.frequency_penalty,
                p.presence_penalty,
            )?;
        }
        let kind = if p.is_greedy() {
            Pending::Argmax
        } else {
            Pending::TopK
        };
        match kind {
            Pending::Argmax if g.argmax.is_none() => {
                g.argmax = Some(Argmax::new(ctx, logits, n_vocab)?)
            }
            Pending::TopK if g.topk.is_none() => g.topk = Some(TopK::new(ctx, logits, n_vocab)?),
            _ => {}
        }
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("forward + sampler"),
                timestamp_writes: None,
            });
            before(&mut pass);
            let mask = g.mask.as_ref().filter(|_| words.is_some());
            if let Some(m) = mask {
                m.record(&mut pass);
            }
            if let Some(pen) = &g.penalties {
                pen.encode_pass(ctx, &mut pass)?;
            }
            let stages = match kind {
                Pending::Argmax => {
                    let a = g.argmax.as_ref().expect("built");
                    a.encode_pass(&mut pass);
                    a.stages()
                }
                Pending::TopK => {
                    let t = g.topk.as_ref().expect("built");
                    t.encode_pass(&mut pass);
                    t.stages()
                }
            };
            ctx.count_recorded(
                1,
                stages as u64
                    + g.penalties.is_some() as u64
                    + mask.map_or(0, |m| m.dispatches() as u64),
            );
        }
        match kind {
            Pending::Argmax => encoder.copy_buffer_to_buffer(
                g.argmax.as_ref().expect("built").result(),
                0,
                &g.staging,
                0,
                8,
            ),
            Pending::TopK => encoder.copy_buffer_to_buffer(
                g.topk.as_ref().expect("built").result(),
                0,
                &g.staging,
                0,
                TopK::RESULT_BYTES,
            ),
        }
        g.pending = Some(kind);
        Ok(())
    }

    /// Whether the next token can be chosen without the CPU: greedy with no penalties (the
    /// argmax needs nothing but the logits), so steps can be chained on the GPU.
    /// A constraint needs the CPU between steps (its mask depends on the token just sampled).
    pub fn chains_on_gpu(&self) -> bool {
        self.params.is_greedy() && !self.params.penalties_active() && self.constraint.is_none()
    }

    /// A greedy step kept on the GPU: after `before` (the forward pass writing `logits`) in the
    /// same compute pass, the argmax, whose last stage advances the step ([`Argmax::chained`]):
    /// the winner becomes `step`'s token id (where the next step's embedding reads it), its
    /// `(value bits, index)` pair goes to `chain` at the step state's `chained` count, and the
    /// positions move on by one token. Nothing is copied, read back or accepted here: the
    /// caller reads `chain` once and accepts the ids it reads.
    #[allow(clippy::too_many_arguments)]
    pub fn encode_chained(
        &mut self,
        ctx: &GpuContext,
        encoder: &mut wgpu::CommandEncoder,
        logits: &wgpu::Buffer,
        n_vocab: u32,
        before: impl FnOnce(&mut wgpu::ComputePass<'_>),
        step: &wgpu::Buffer,
        chain: &wgpu::Buffer,
    ) -> Result<()> {
        if !self.chains_on_gpu() {
            return Err(Error::internal(
                "encode_chained needs greedy sampling without penalties or constraint",
            ));
        }
        let g = self.state(ctx, logits, n_vocab)?;
        let fresh = match &g.chained {
            Some((_, s, c)) => s != step || c != chain,
            None => true,
        };
        if fresh {
            let a = Argmax::chained(ctx, logits, n_vocab, step, chain)?;
            g.chained = Some((a, step.clone(), chain.clone()));
        }
        let a = &g.chained.as_ref().expect("built").0;
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("forward + argmax"),
            timestamp_writes: None,
        });
        before(&mut pass);
        a.encode_pass(&mut pass);
        ctx.count_recorded(1, a.stages() as u64);
        Ok(())
    }

    /// Forget the last `n` accepted tokens (generation rewound past them).
    pub fn unaccept(&mut self, n: usize) {
        for _ in 0..n.min(self.history.len()) {
            self.history.pop_back();
        }
    }

    /// After the encoder from [`Sampler::encode`] was submitted: read back, pick, accept.
    pub async fn finish(&mut self, ctx: &GpuContext) -> Result<u32> {
        let g = self
            .gpu
            .as_mut()
            .ok_or_else(|| Error::internal("Sampler::finish without encode"))?;
        let kind = g
            .pending
            .take()
            .ok_or_else(|| Error::internal("Sampler::finish without encode"))?;
        let len = match kind {
            Pending::Argmax => 8,
            Pending::TopK => TopK::RESULT_BYTES,
        };
        let bytes = map_read(ctx, &g.staging, len).await?;
        let token = match kind {
            Pending::Argmax => Some(u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]))
                .filter(|&t| t != crate::ops::argmax::NONE),
            Pending::TopK => {
                let r = TopKResult::from_bytes(&bytes);
                let u = self.rng.uniform();
                // Masked tokens come back as -inf when fewer than TOPK are allowed: drop them.
                let candidates: Vec<(f32, u32)> = match &self.constraint {
                    Some(c) => r
                        .candidates
                        .iter()
                        .copied()
                        .filter(|&(l, id)| l > f32::NEG_INFINITY && c.allows(id))
                        .collect(),
                    None => r.candidates,
                };
                sample_candidates(&self.params, &candidates, Some((r.max, r.sum_exp)), u)
            }
        };
        let token = token.ok_or_else(|| {
            Error::new(
                ErrorCode::Internal,
                "no token to sample: the logits are all NaN",
            )
        })?;
        if let Some(c) = self.constraint.as_mut() {
            if !c.allows(token) {
                return Err(Error::internal(format!(
                    "the sampler picked token {token}, which the constraint forbids"
                )));
            }
            c.commit(token)?;
        }
        self.accept(token);
        Ok(token)
    }

    /// Append sampling to `encoder` (which may hold the forward pass), submit it, read back once
    /// and return the next token.
    pub async fn sample(
        &mut self,
        ctx: &GpuContext,
        mut encoder: wgpu::CommandEncoder,
        logits: &wgpu::Buffer,
        n_vocab: u32,
    ) -> Result<u32> {
        self.encode(ctx, &mut encoder, logits, n_vocab)?;
        ctx.submit([encoder.finish()]);
        self.finish(ctx).await
    }

    /// [`Sampler::sample`] with a fresh encoder, for logits already computed.
    pub async fn sample_logits(
        &mut self,
        ctx: &GpuContext,
        logits: &wgpu::Buffer,
        n_vocab: u32,
    ) -> Result<u32> {
        let encoder = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("sample"),
            });
        self.sample(ctx, encoder, logits, n_vocab).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> SamplerParams {
        SamplerParams {
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            temperature: 1.0,
            ..Default::default()
        }
    }

    /// Candidates with probabilities 0.5, 0.25, 0.125, 0.125 at temperature 1.
    fn cands() -> Vec<(f32, u32)> {
        let l = |p: f32| p.ln();
        vec![(l(0.5), 10), (l(0.25), 11), (l(0.125), 12), (l(0.125), 13)]
    }

    const PINNED: [u64; 2] = [8921399417293454521, 16765812272522634425];

    #[test]
    fn rng_is_reproducible_and_uniform() {
        let mut a = SamplerRng::new(42);
        let mut b = SamplerRng::new(42);
        let xs: Vec<f64> = (0..1000).map(|_| a.uniform()).collect();
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        assert_eq!(xs, (0..1000).map(|_| b.uniform()).collect::<Vec<_>>());
        let mean = xs.iter().sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
        assert_ne!(SamplerRng::new(1).next_u64(), SamplerRng::new(2).next_u64());
        // Pinned: a seed must give the same tokens on every target and in every version.
        let mut r = SamplerRng::new(0xFFFF_FFFF);
        let pinned = [r.next_u64(), r.next_u64()];
        assert_eq!(pinned, PINNED);
    }

    #[test]
    fn draw_follows_the_cumulative_distribution() {
        let p = params();
        let c = cands();
        assert_eq!(sample_candidates(&p, &c, None, 0.0), Some(10));
        assert_eq!(sample_candidates(&p, &c, None, 0.49), Some(10));
        assert_eq!(sample_candidates(&p, &c, None, 0.51), Some(11));
        assert_eq!(sample_candidates(&p, &c, None, 0.74), Some(11));
        assert_eq!(sample_candidates(&p, &c, None, 0.76), Some(12));
        assert_eq!(sample_candidates(&p, &c, None, 0.99), Some(13));
        assert_eq!(sample_candidates(&p, &[], None, 0.5), None);
    }

    #[test]
    fn top_k_top_p_min_p_temperature() {
        let c = cands();
        // top_k 1 is greedy whatever u.
        assert_eq!(
            sample_candidates(
                &SamplerParams {
                    top_k: 1,
                    ..params()
                },
                &c,
                None,
                0.99
            ),
            Some(10)
        );
        // top_k 2: renormalized 2/3, 1/3.
        assert_eq!(
            sample_candidates(
                &SamplerParams {
                    top_k: 2,
                    ..params()
                },
                &c,
                None,
                0.65
            ),
            Some(10)
        );
        assert_eq!(
            sample_candidates(
                &SamplerParams {
                    top_k: 2,
                    ..params()
                },
                &c,
                None,
                0.99
            ),
            Some(11)
        );
        // top_p 0.7: cumulative 0.5, 0.75 -> keeps 2 (llama.cpp includes the crossing token).
        assert_eq!(
            sample_candidates(
                &SamplerParams {
                    top_p: 0.7,
                    ..params()
                },
                &c,
                None,
                0.99
            ),
            Some(11)
        );
        // top_p 0.5: the first token alone reaches it.
        assert_eq!(
            sample_candidates(
                &SamplerParams {
                    top_p: 0.5,
                    ..params()
                },
                &c,
                None,
                0.99
            ),
            Some(10)
        );
        // top_p with the full-vocab normalizer when top_k is off: these 4 hold half the mass, so
        // 0.3 needs 0.25 + 0.125 -> 2 tokens.
        let norm = Some((c[0].0, 4.0));
        assert_eq!(
            sample_candidates(
                &SamplerParams {
                    top_p: 0.3,
                    ..params()
                },
                &c,
                norm,
                0.99
            ),
            Some(11)
        );
        // min_p 0.3: keeps p >= 0.15 (0.5, 0.25).
        assert_eq!(
            sample_candidates(
                &SamplerParams {
                    min_p: 0.3,
                    ..params()
                },
                &c,
                None,
                0.99
            ),
            Some(11)
        );
        assert_eq!(
            sample_candidates(
                &SamplerParams {
                    min_p: 0.6,
                    ..params()
                },
                &c,
                None,
                0.99
            ),
            Some(10)
        );
        // Low temperature sharpens: at T = 0.1 the top token takes ~all mass.
        assert_eq!(
            sample_candidates(
                &SamplerParams {
                    temperature: 0.1,
                    ..params()
                },
                &c,
                None,
                0.99
            ),
            Some(10)
        );
        // High temperature flattens: at T = 100 the four are near uniform, u = 0.6 -> third.
        assert_eq!(
            sample_candidates(
                &SamplerParams {
                    temperature: 100.0,
                    ..params()
                },
                &c,
                None,
                0.6
            ),
            Some(12)
        );
        // Temperature 0 keeps the top.
        assert_eq!(
            sample_candidates(
                &SamplerParams {
                    temperature: 0.0,
                    ..params()
                },
                &c,
                None,
                0.99
            ),
            Some(10)
        );
    }

    #[test]
    fn history_keeps_the_last_n() {
        let mut s = Sampler::new(SamplerParams {
            penalty_last_n: 3,
            ..Default::default()
        });
        s.accept_all(&[1, 2, 3, 4, 5]);
        assert_eq!(s.history(), vec![3, 4, 5]);
        let mut s = Sampler::new(SamplerParams {
            penalty_last_n: -1,
            ..Default::default()
        });
        s.accept_all(&[1, 2, 3, 4, 5]);
        assert_eq!(s.history().len(), 5);
    }

    #[test]
    fn reference_penalties_lower_a_repeated_token() {
        let logits = vec![2.0f32, 1.9, 0.0, -1.0];
        let p = SamplerParams {
            repeat_penalty: 1.5,
            ..SamplerParams::greedy()
        };
        assert_eq!(reference_sample(&p, &logits, &[], 0.0), Some(0));
        assert_eq!(reference_sample(&p, &logits, &[0], 0.0), Some(1));
    }
}
