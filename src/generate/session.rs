//! A generation session: positions, the KV cache and its automatic context shift, prefill in
//! batches, the decode loop, stop tokens and strings, and a UTF-8-safe text stream.
//!
//! The loop is written once as `async fn`s (readback is the only await) and runs natively
//! (`pollster::block_on`) and in the browser.

use std::sync::Arc;

use crate::error::{Error, ErrorCode, Result};
use crate::gpu::GpuContext;
use crate::kv::{KvCache, RecurrentCheckpoint};
use crate::model::{ForwardPlan, LogitRows, Model, Workspace};
use crate::tokenizer::{Detokenizer, Tokenizer};

use super::constraint::{Constraint, ConstraintEnv, ConstraintSpec};
use super::sampler::{Sampler, SamplerParams};

/// Prepared forward passes a session keeps (decode, the prefill batch, a few tails).
const MAX_PLANS: usize = 8;
/// Recurrent-state checkpoints a session keeps (the ends of the latest prompt chunks): each is a
/// copy of every recurrent layer's state (18 delta-net layers of 16 value heads of 128: about
/// 19 MiB).
const CHECKPOINTS: usize = 2;

/// Greedy steps chained on the GPU before one readback in a session's first chain, before the
/// device's time per step is known. Each step's token goes from its argmax straight into the
/// next step's embedding, so the CPU encodes and submits ahead of the GPU and reads the ids of
/// the whole chain at once; a stop found among them rewinds the extra steps (their cache cells
/// are simply reused). Later chains take as many steps as fit in [`CHAIN_TARGET_S`]
/// ([`Session::chain_target`]). Four, and fewer where the prompt's own step already took more
/// than a quarter of that a token: on a CPU-emulated adapter (0.3 s a decode step and more)
/// chains of 16 handed the streamed ids out in bursts about 5 s apart; one step a chain there
/// streams each id as it comes, at the same decode speed (lavapipe, measured).
pub const CHAIN: u32 = 4;

/// The longest chain [`Session::decode_chained`] takes (the readback ring's slots).
pub const CHAIN_MAX: u32 = 64;

/// The time a chain of greedy steps may take before its ids are read back and handed out: the
/// delay streaming adds on top of the GPU's own, and how late a Stop can be seen. Each readback
/// leaves the GPU idle while the ids come back and the next chain's first step is submitted, so
/// a fast GPU gains from longer chains: measured on an H100 (Gemma 3 270M twin, 128 tokens,
/// tok/s): 16 steps a readback 1,315, 32 1,335, 64 1,349. There a step takes about 0.75 ms, so
/// chains grow to 64 steps (48 ms); a device at 4 ms a step takes 12, and one slower than 50 ms
/// a step (a CPU-emulated adapter) one step a readback, which costs it nothing measurable
/// against its step.
pub const CHAIN_TARGET_S: f64 = 0.05;

/// [`Session::chain_target`]'s rule: the steps a chain takes after chains ran at `chained_s`
/// seconds a step, or before any did, after the last step outside a chain (a prompt's) took
/// `plain_s` a token. A prompt's tokens cost a GPU less each than decode steps, so that bound
/// only shortens the first chain where even they are slow.
fn chain_for(chained_s: Option<f64>, plain_s: Option<f64>) -> u32 {
    let fit = |s: f64| (CHAIN_TARGET_S / s).clamp(1.0, CHAIN_MAX as f64) as u32;
    match (chained_s, plain_s) {
        (Some(s), _) if s > 0.0 => fit(s),
        (_, Some(s)) if s > 0.0 => fit(s).min(CHAIN),
        _ => CHAIN,
    }
}

/// How a session uses its context.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Context size in tokens (cells of the KV cache).
    pub n_ctx: u32,
    /// Tokens kept at the start when the context shifts (the prompt's head, e.g. BOS + system).
    pub n_keep: u32,
    /// Tokens dropped per shift after `n_keep`; `None`: half of what is not kept (llama.cpp's).
    pub n_discard: Option<u32>,
    /// Shift automatically when the context fills (else `CONTEXT_FULL`).
    pub context_shift: bool,
    /// Prefill batch size.
    pub batch: u32,
    /// Chain greedy decode steps on the GPU ([`CHAIN`]); off: one readback per token.
    pub chain: bool,
    /// Steps a chain takes, fixed (tests, benchmarks); `None`: as many as fit in
    /// [`CHAIN_TARGET_S`] ([`Session::chain_target`]).
    pub chain_steps: Option<u32>,
    /// Context shift by recomputation: after dropping tokens, evaluate the kept ones again from
    /// scratch (exact: equal to a fresh prefill of them) instead of re-rotating the kept K cells
    /// and keeping the recurrent (conv) state, which is cheap but drifts. See the README.
    pub shift_recompute: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            n_ctx: 2048,
            n_keep: 0,
            n_discard: None,
            context_shift: true,
            batch: 64,
            chain: true,
            chain_steps: None,
            shift_recompute: false,
        }
    }
}

/// What one `generate` call produced.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct GenerationStats {
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub finish_reason: String,
    pub context_shifts: u32,
    /// CPU time computing constraint masks, milliseconds per token (0 without a constraint).
    pub mask_ms_per_token: f64,
    /// GPU work of the decode steps (after the first token), per generated token: compute
    /// dispatches, compute passes and queue submissions (0 when nothing was decoded). Steps a
    /// chained run took past a stop count too: the GPU ran them. Counted on the session's GPU
    /// context: another session decoding on the same context at the same time adds its work.
    pub dispatches_per_token: f64,
    pub passes_per_token: f64,
    pub submits_per_token: f64,
}

/// Options of one `generate` call.
#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    pub max_tokens: u32,
    pub stop: Vec<String>,
    pub sampler: SamplerParams,
    /// Structured output: every token is masked to what this grammar allows next.
    pub constraint: Option<ConstraintSpec>,
    /// Control tokens streamed as their text instead of as nothing: a tool call's markers where
    /// the vocabulary makes them control tokens (LFM2's `<|tool_call_start|>`), so the text
    /// shows where a call begins and ends.
    pub shown_control: Vec<u32>,
}

/// Owns shared handles (`Arc`) so a JS class can hold one without borrowing.
pub struct Session {
    ctx: Arc<GpuContext>,
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
    opts: SessionOptions,
    kv: KvCache,
    ws: Workspace,
    /// The token at every position in the cache.
    tokens: Vec<u32>,
    /// Whether `ws.logits` row 0 holds the logits after the last token.
    have_logits: bool,
    /// Forward passes prepared for this session's workspace and cache ([`Session::plan_for`]).
    plans: Vec<ForwardPlan>,
    /// Readback ring of chained greedy steps: `(value bits, index)` per step ([`CHAIN`] slots),
    /// copied from `chain`, where each step's argmax writes its pair, once a chain.
    ring: Option<wgpu::Buffer>,
    chain: Option<wgpu::Buffer>,
    /// llguidance's view of the tokenizer, built on the first constrained generation.
    constraint_env: Option<Arc<ConstraintEnv>>,
    pub shifts: u32,
    /// Models with recurrent layers (Qwen3.5): their states at the ends of the latest prompt
    /// chunks (at most [`CHECKPOINTS`]), so a rewind (a stop string, a chat turn reusing the
    /// prefix) evaluates again only the tokens after one ([`Session::sync_recurrent`]).
    checkpoints: Vec<RecurrentCheckpoint>,
    /// Tokens evaluated again to bring recurrent states to the cache's position after rewinds.
    pub replayed_tokens: u64,
    /// CPU seconds spent recording and submitting chained decode steps (`cera bench` divides
    /// by the steps: when it is close to the time per token, decoding is bound by the CPU).
    pub record_s: f64,
    /// Chained steps a command buffer (`decode_chained`): 1, unless the bench knob
    /// `CERA_CHAIN_SUBMIT=N` asks for more; read once here, not per chain.
    chain_submit: u32,
    /// Seconds per step of the last chained run (`decode_chained`, from submit to readback): what
    /// [`Session::chain_target`] sizes the next chain by. `None` until one ran.
    chain_step_s: Option<f64>,
    /// Seconds a token of the last step outside a chain (`generate`'s prompt step): what the
    /// first chain is sized by.
    plain_step_s: Option<f64>,
}

impl Session {
    pub fn new(
        ctx: Arc<GpuContext>,
        model: Arc<Model>,
        tok: Arc<Tokenizer>,
        opts: SessionOptions,
    ) -> Result<Self> {
        if opts.n_ctx < 2 || opts.n_keep >= opts.n_ctx {
            return Err(Error::invalid(format!(
                "context {} with n_keep {}: n_keep must be below the context",
                opts.n_ctx, opts.n_keep
            )));
        }
        let kv = model.new_kv_cache(&ctx, opts.n_ctx)?;
        let batch = opts.batch.clamp(1, opts.n_ctx);
        let ws = model.workspace(&ctx, batch, 1)?;
        Ok(Session {
            ctx,
            model,
            tok,
            opts,
            kv,
            ws,
            tokens: Vec::new(),
            have_logits: false,
            plans: Vec::new(),
            ring: None,
            chain: None,
            constraint_env: None,
            shifts: 0,
            checkpoints: Vec::new(),
            replayed_tokens: 0,
            record_s: 0.0,
            chain_submit: crate::gpu::knob::knob_u64("CERA_CHAIN_SUBMIT")
                .map_or(1, |n| n.max(1) as u32),
            chain_step_s: None,
            plain_step_s: None,
        })
    }

    pub fn n_past(&self) -> u32 {
        self.kv.n_past()
    }
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    pub fn options(&self) -> &SessionOptions {
        &self.opts
    }
    pub fn workspace(&self) -> &Workspace {
        &self.ws
    }
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tok
    }
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// The constraint environment of this session's tokenizer (built once).
    pub fn constraint_env(&mut self) -> Result<Arc<ConstraintEnv>> {
        if self.constraint_env.is_none() {
            self.constraint_env = Some(Arc::new(ConstraintEnv::new(&self.tok)?));
        }
        Ok(self.constraint_env.clone().expect("just set"))
    }

    /// Share a constraint environment built elsewhere for the same tokenizer.
    pub fn set_constraint_env(&mut self, env: Arc<ConstraintEnv>) {
        self.constraint_env = Some(env);
    }

    /// Forget everything.
    pub fn reset(&mut self) {
        self.kv.clear();
        self.checkpoints.clear();
        self.tokens.clear();
        self.have_logits = false;
    }

    /// Shift explicitly: drop `n_discard` cells after the first `n_keep`.
    ///
    /// By default the kept K cells are re-rotated and a short-convolution layer's rows move with
    /// their tokens (its state after the last token is kept as it was); with
    /// [`SessionOptions::shift_recompute`] the kept tokens are evaluated again from scratch.
    pub fn shift(&mut self, n_keep: u32, n_discard: u32) -> Result<()> {
        self.kv.shift(&self.ctx, n_keep, n_discard)?;
        self.tokens
            .drain(n_keep as usize..(n_keep + n_discard) as usize);
        // The kept recurrent state drifts on; checkpoints describe positions that moved.
        self.checkpoints.clear();
        self.shifts += 1;
        if self.opts.shift_recompute && self.kv.n_past() > n_keep {
            let kept = std::mem::take(&mut self.tokens);
            self.kv.clear();
            self.feed(&kept)?;
        }
        Ok(())
    }

    /// Keep only the first `n` tokens (the common prefix of a new prompt): the cache after them
    /// is forgotten, and every layer's state is what it was after token `n` (conv rows are kept
    /// per cell; recurrent states are restored from a checkpoint and brought forward when the
    /// next tokens are fed), so continuing is exactly a fresh evaluation of the prefix and what
    /// follows.
    pub fn truncate(&mut self, n: u32) -> Result<()> {
        let held = self.kv.n_past();
        if n > held {
            return Err(Error::invalid(format!("truncate to {n} tokens of {held}")));
        }
        self.rewind(held - n)
    }

    /// Make room for `n` more tokens: shift if allowed, else `CONTEXT_FULL`.
    fn ensure_room(&mut self, n: u32) -> Result<()> {
        let n_ctx = self.opts.n_ctx;
        while self.kv.n_past() + n > n_ctx {
            if !self.opts.context_shift {
                return Err(Error::new(
                    ErrorCode::ContextFull,
                    format!("the context of {n_ctx} tokens is full; enable context shift or use a larger context"),
                ));
            }
            let n_keep = self.opts.n_keep.min(self.kv.n_past());
            let free = self.kv.n_past() - n_keep;
            let want = self.opts.n_discard.unwrap_or((free / 2).max(1));
            let n_discard = want.max(n + self.kv.n_past() - n_ctx).min(free);
            if n_discard == 0 {
                return Err(Error::new(
                    ErrorCode::ContextFull,
                    format!("n_keep {n_keep} leaves no room in the context of {n_ctx}"),
                ));
            }
            self.shift(n_keep, n_discard)?;
        }
        Ok(())
    }

    /// Encode one chunk's forward pass (making room first) and mark its cells used.
    fn encode_chunk(&mut self, enc: &mut wgpu::CommandEncoder, chunk: &[u32]) -> Result<()> {
        let (plan, pos0) = self.begin_chunk(chunk)?;
        self.model.run(
            &self.ctx,
            enc,
            &self.ws,
            &self.kv,
            &self.plans[plan],
            chunk,
            pos0,
        )?;
        self.end_chunk(chunk)
    }

    /// Make room for a chunk and pick its plan: `(plan index, pos0)`.
    fn begin_chunk(&mut self, chunk: &[u32]) -> Result<(usize, u32)> {
        self.sync_recurrent()?;
        self.ensure_room(chunk.len() as u32)?;
        let pos0 = self.kv.n_past();
        let n = chunk.len() as u32;
        Ok((self.plan_for(n, pos0 + n)?, pos0))
    }

    /// Mark a recorded chunk's cells used.
    fn end_chunk(&mut self, chunk: &[u32]) -> Result<()> {
        self.kv.advance(chunk.len() as u32)?;
        self.tokens.extend_from_slice(chunk);
        Ok(())
    }

    /// After a chunk of a prompt (more than one token) is submitted: checkpoint the recurrent
    /// states, replacing the oldest checkpoint beyond [`CHECKPOINTS`].
    fn checkpoint_prompt(&mut self, chunk_len: usize) -> Result<()> {
        if chunk_len < 2 || !self.kv.has_recurrent() {
            return Ok(());
        }
        let reuse = if self.checkpoints.len() >= CHECKPOINTS {
            Some(self.checkpoints.remove(0))
        } else {
            None
        };
        let cp = self.kv.checkpoint(&self.ctx, reuse)?;
        self.checkpoints.push(cp);
        Ok(())
    }

    /// Models with recurrent layers: when their states are not at the cache's position (after a
    /// rewind), restore the latest checkpoint at or before it (or start at 0) and evaluate the
    /// tokens from there again, so continuing is exactly a fresh evaluation.
    fn sync_recurrent(&mut self) -> Result<()> {
        let target = self.kv.n_past();
        if self.kv.can_continue_at(target) {
            return Ok(());
        }
        let from = match self
            .checkpoints
            .iter()
            .filter(|c| c.pos <= target)
            .max_by_key(|c| c.pos)
        {
            Some(cp) => {
                self.kv.restore(&self.ctx, cp)?;
                cp.pos
            }
            None => 0,
        };
        let replay = self.tokens[from as usize..target as usize].to_vec();
        self.kv.rewind(target - from)?;
        self.tokens.truncate(from as usize);
        self.replayed_tokens += replay.len() as u64;
        self.feed(&replay)
    }

    /// Drop the checkpoints past the cache's position (the tokens after it may change).
    fn forget_checkpoints_past(&mut self) {
        let n = self.kv.n_past();
        self.checkpoints.retain(|c| c.pos <= n);
    }

    /// The index of a prepared forward pass for `n` tokens ending at cell `end`, built on first
    /// use. Workspace and cache never move, so a plan lives as long as the session.
    ///
    /// On a CPU-emulated adapter the attention kernel's shape depends on how many cells it walks
    /// (lavapipe's loop limit, `ops::attention`), so plans there cover powers of two of cells;
    /// elsewhere one plan per batch size covers the whole context, and decode also has a short
    /// plan for its first cells, which needs no attention reduce ([`Model::short_plan_cells`]).
    fn plan_for(&mut self, n: u32, end: u32) -> Result<usize> {
        let cells = plan_cells(
            crate::ops::matmul::is_cpu_adapter(&self.ctx),
            n,
            end,
            self.kv.n_ctx(),
            self.model.short_plan_cells(&self.ctx),
        );
        if let Some(i) = self
            .plans
            .iter()
            .position(|p| p.n_tokens == n && p.max_cells == cells)
        {
            return Ok(i);
        }
        // Prefill tails come in many sizes: keep the cache small.
        if self.plans.len() >= MAX_PLANS {
            self.plans.remove(0);
        }
        let plan = self
            .model
            .plan(&self.ctx, &self.ws, &self.kv, n, LogitRows::Last, cells)?;
        self.plans.push(plan);
        Ok(self.plans.len() - 1)
    }

    /// GPU time of each op kind in one decode step at the current position (timestamp queries,
    /// one pass per dispatch): feeds the last token again without keeping its cell.
    pub async fn profile_decode(
        &mut self,
    ) -> Result<(
        Vec<crate::gpu::profile::KindTime>,
        Vec<crate::gpu::profile::DispatchTime>,
    )> {
        self.profile_batch(1).await
    }

    /// [`Session::profile_decode`] for a batch of `n` tokens (a prefill chunk, at most the
    /// workspace's batch): the last token fed, `n` times, at the current position, without
    /// keeping their cells.
    pub async fn profile_batch(
        &mut self,
        n: u32,
    ) -> Result<(
        Vec<crate::gpu::profile::KindTime>,
        Vec<crate::gpu::profile::DispatchTime>,
    )> {
        let last = *self
            .tokens
            .last()
            .ok_or_else(|| Error::invalid("profile: feed tokens first"))?;
        let n = n.clamp(1, self.ws.max_batch);
        self.ensure_room(n)?;
        let pos0 = self.kv.n_past();
        let i = self.plan_for(n, pos0 + n)?;
        self.ws.step.write(&self.ctx, pos0, &vec![last; n as usize]);
        let prepared = self.plans[i].prepared();
        let us = crate::gpu::profile::time_dispatches(&self.ctx, prepared).await?;
        // The timed pass advanced the recurrent states by a token the cache does not keep.
        self.kv.invalidate_recurrent();
        Ok((
            crate::gpu::profile::by_kind(prepared, &us),
            crate::gpu::profile::each(prepared, &us),
        ))
    }

    /// Dispatches of the prepared one-token (decode) forward pass, by op kind.
    pub fn decode_plan_kinds(&mut self) -> Result<Vec<(&'static str, usize)>> {
        let end = self.kv.n_past().max(1).min(self.kv.n_ctx());
        let i = self.plan_for(1, end)?;
        Ok(self.plans[i].kinds())
    }

    /// Refuse token ids outside the vocabulary before anything runs: checked per chunk, a bad id
    /// in a later chunk would leave the earlier chunks fed (and a full context shifted).
    fn check_ids(&self, tokens: &[u32]) -> Result<()> {
        let n_vocab = self.model.hp.n_vocab;
        match tokens.iter().find(|&&t| t >= n_vocab) {
            Some(bad) => Err(Error::invalid(format!(
                "token id {bad} is outside the vocabulary of {n_vocab}"
            ))),
            None => Ok(()),
        }
    }

    /// Run `tokens` through the model (in batches), leaving the last one's logits ready.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<()> {
        self.check_ids(tokens)?;
        for chunk in tokens.chunks(self.ws.max_batch as usize) {
            let mut enc = self.ctx.device.create_command_encoder(&Default::default());
            self.encode_chunk(&mut enc, chunk)?;
            self.ctx.submit([enc.finish()]);
            self.have_logits = true;
            self.checkpoint_prompt(chunk.len())?;
        }
        Ok(())
    }

    /// Feed `tokens` and sample the next one: the last chunk's forward pass and the sampling
    /// share one command buffer, and the only readback is the sampler's (4 bytes when greedy).
    pub async fn step(&mut self, tokens: &[u32], sampler: &mut Sampler) -> Result<u32> {
        if tokens.is_empty() {
            return self.sample(sampler).await;
        }
        self.check_ids(tokens)?;
        let batch = self.ws.max_batch as usize;
        let split = (tokens.len() - 1) / batch * batch;
        self.feed(&tokens[..split])?;
        // The last chunk's forward pass and the sampler share one compute pass.
        let chunk = &tokens[split..];
        let (plan, pos0) = self.begin_chunk(chunk)?;
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        let mut recorded = Ok(());
        let (model, ctx, ws, kv, plan) = (
            &self.model,
            &self.ctx,
            &self.ws,
            &self.kv,
            &self.plans[plan],
        );
        sampler.encode_after(ctx, &mut enc, &ws.logits, model.hp.n_vocab, |pass| {
            recorded = model.record(ctx, pass, ws, kv, plan, chunk, pos0);
        })?;
        recorded?;
        self.end_chunk(chunk)?;
        self.have_logits = true;
        self.ctx.submit([enc.finish()]);
        self.checkpoint_prompt(chunk.len())?;
        sampler.finish(&self.ctx).await
    }

    /// Forget the last `n` tokens fed (their cells are reused); the logits no longer match.
    pub fn rewind(&mut self, n: u32) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.kv.rewind(n)?;
        self.tokens.truncate(self.tokens.len() - n as usize);
        self.have_logits = false;
        self.forget_checkpoints_past();
        Ok(())
    }

    /// Steps [`Session::decode_chained`] may take now: at most `want`, the cells left before the
    /// context would shift (a shift needs the tokens on the CPU), and [`Session::chain_target`].
    fn chain_len(&self, want: u32) -> u32 {
        want.min(self.chain_target())
            .min(self.opts.n_ctx - self.kv.n_past())
    }

    /// The chain length this device affords: [`CHAIN`] at first (fewer where the prompt's step
    /// was slow a token), then as many steps as the last chained run's time per step fits in
    /// [`CHAIN_TARGET_S`], from 1 to [`CHAIN_MAX`] (`chain_for`); [`SessionOptions::chain_steps`]
    /// fixes it. A chain of one step is still a chained run (its time is measured), so a first
    /// chain slowed by building its pipelines does not keep a fast device at one step.
    pub fn chain_target(&self) -> u32 {
        match self.opts.chain_steps {
            Some(n) => n.clamp(1, CHAIN_MAX),
            None => chain_for(self.chain_step_s, self.plain_step_s),
        }
    }

    /// Greedy decoding of `k` steps kept on the GPU, from `first` (a token not yet fed): each
    /// step's argmax is the next step's input, every step is submitted without waiting, and the
    /// `k` ids are read back once. Returns the sampled ids in order (accepted into `sampler`);
    /// the session has then fed `first` and all but the last of them.
    pub async fn decode_chained(
        &mut self,
        first: u32,
        k: u32,
        sampler: &mut Sampler,
    ) -> Result<Vec<u32>> {
        if k == 0 || k > CHAIN_MAX || self.kv.n_past() + k > self.opts.n_ctx {
            return Err(Error::internal(format!(
                "decode_chained: {k} steps at {} of {}",
                self.kv.n_past(),
                self.opts.n_ctx
            )));
        }
        if first >= self.model.hp.n_vocab {
            return Err(Error::invalid(format!(
                "token id {first} is outside the vocabulary of {}",
                self.model.hp.n_vocab
            )));
        }
        if self.ring.is_none() {
            self.ring = Some(self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("chained ids readback"),
                size: CHAIN_MAX as u64 * 8,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
            self.chain = Some(self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("chained ids"),
                size: CHAIN_MAX as u64 * 8,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }));
        }
        // A rewind before: bring the recurrent states to the cache's position first.
        self.sync_recurrent()?;
        if self.kv.n_past() + k > self.opts.n_ctx {
            return Err(Error::internal("decode_chained: no room after the replay"));
        }
        let n_vocab = self.model.hp.n_vocab;
        let t0 = now_s();
        // The first step's state and token are written here; each step's last argmax stage
        // writes the next one's (and its id into `chain`), so later steps need no write.
        self.ws.step.write(&self.ctx, self.kv.n_past(), &[first]);
        // Steps a command buffer: one submit a step lets the GPU start on the first step while
        // the CPU records the next (`chain_submit` steps in each with the bench knob).
        let per_submit = self.chain_submit;
        let mut open = None;
        for i in 0..k {
            let pos0 = self.kv.n_past();
            let plan = self.plan_for(1, pos0 + 1)?;
            let (model, ctx, plan) = (&self.model, &self.ctx, &self.plans[plan]);
            let chain = self.chain.as_ref().expect("made above");
            let enc =
                open.get_or_insert_with(|| ctx.device.create_command_encoder(&Default::default()));
            sampler.encode_chained(
                ctx,
                enc,
                &self.ws.logits,
                n_vocab,
                |pass| model.record_plan(ctx, pass, plan),
                &self.ws.step.buffer,
                chain,
            )?;
            if i + 1 == k {
                let ring = self.ring.as_ref().expect("made above");
                enc.copy_buffer_to_buffer(chain, 0, ring, 0, k as u64 * 8);
            }
            if i + 1 == k || (i + 1) % per_submit == 0 {
                let done = open.take().expect("opened above");
                self.ctx.submit([done.finish()]);
            }
            self.kv.advance(1)?;
        }
        self.record_s += now_s() - t0;
        let bytes = crate::gpu::readback::map_read(
            &self.ctx,
            self.ring.as_ref().expect("made above"),
            k as u64 * 8,
        )
        .await?;
        self.chain_step_s = Some((now_s() - t0) / k as f64);
        let ids: Vec<u32> = bytes
            .chunks_exact(8)
            .map(|c| u32::from_le_bytes([c[4], c[5], c[6], c[7]]))
            .collect();
        if let Some(pos) = ids.iter().position(|&t| t >= n_vocab) {
            return Err(Error::new(
                ErrorCode::Internal,
                format!("no token to sample at chained step {pos}: the logits are all NaN"),
            ));
        }
        // The inputs fed: `first`, then every id but the last.
        self.tokens.push(first);
        self.tokens.extend_from_slice(&ids[..ids.len() - 1]);
        self.have_logits = true;
        sampler.accept_all(&ids);
        Ok(ids)
    }

    /// The logits after the last token (reads back the whole vocabulary: tests and `score`).
    /// After a sampler with penalties has run on them they are the penalized logits: penalties
    /// are applied to the logits buffer in place.
    pub async fn logits(&self) -> Result<Vec<f32>> {
        if !self.have_logits {
            return Err(Error::invalid("no logits yet: feed tokens first"));
        }
        crate::gpu::readback::read_f32(
            &self.ctx,
            &self.ws.logits,
            0,
            self.model.hp.n_vocab as usize,
        )
        .await
    }

    /// Sample the next token from the current logits.
    pub async fn sample(&mut self, sampler: &mut Sampler) -> Result<u32> {
        if !self.have_logits {
            // A rewind left the logits of a later step: feed the last token again.
            if let Some(last) = self.tokens.pop() {
                self.kv.rewind(1)?;
                self.forget_checkpoints_past();
                return Box::pin(self.step(&[last], sampler)).await;
            }
            return Err(Error::invalid("no logits yet: feed tokens first"));
        }
        sampler
            .sample_logits(&self.ctx, &self.ws.logits, self.model.hp.n_vocab)
            .await
    }

    /// Generate from `prompt` (token ids, appended to what the session holds): streams
    /// `(Some(id), text)` per generated token to `on_token` (return `false` to stop), then
    /// `(None, text)` once for text held back until the end (an incomplete UTF-8 sequence or a
    /// possible stop string that never completed), and returns the stats.
    pub async fn generate(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(Option<u32>, &str) -> bool,
    ) -> Result<GenerationStats> {
        self.check_ids(prompt)?;
        let room = self.opts.n_ctx.saturating_sub(if self.opts.context_shift {
            self.opts.n_keep
        } else {
            self.kv.n_past()
        });
        if prompt.len() as u32 >= room {
            return Err(Error::new(
                ErrorCode::ContextFull,
                format!(
                    "the prompt has {} tokens; it does not fit the context of {} tokens (n_keep {}); shorten it or raise the context size",
                    prompt.len(),
                    self.opts.n_ctx,
                    self.opts.n_keep
                ),
            ));
        }
        let mut stats = GenerationStats {
            prompt_tokens: prompt.len() as u32,
            ..Default::default()
        };
        let shifts0 = self.shifts;
        let mut sampler = Sampler::new(opts.sampler.clone());
        if let Some(spec) = &opts.constraint {
            let env = self.constraint_env()?;
            sampler.set_constraint(Constraint::new(&env, spec)?);
        }
        sampler.accept_all(&self.tokens);
        sampler.accept_all(prompt);
        let t0 = now_s();
        let tok = self.tok.clone();
        let mut detok = Detokenizer::new(&tok);
        let mut stop = StopScanner::new(&opts.stop);
        let mut t_first = None;
        let mut c_first = self.ctx.counts();
        let mut input: Vec<u32> = prompt.to_vec();
        // Ids sampled ahead by a chained greedy run, not yet handed out.
        let mut ahead: std::collections::VecDeque<u32> = std::collections::VecDeque::new();
        // Ids a constraint forces (fixed text such as a JSON key): handed out without a step
        // each, then fed to the model in one batch with the token before them, the way a prompt
        // is. Never together with `ahead` (a constraint does not chain on the GPU).
        let mut forced: std::collections::VecDeque<u32> = sampler.take_forced().into();
        let finish;
        loop {
            let from_forced = !forced.is_empty();
            let id = match forced.pop_front().or_else(|| ahead.pop_front()) {
                Some(id) => id,
                None => {
                    let left = if opts.max_tokens > 0 {
                        opts.max_tokens - stats.generated_tokens
                    } else {
                        CHAIN_MAX
                    };
                    let k = if self.opts.chain && sampler.chains_on_gpu() && input.len() == 1 {
                        self.chain_len(left)
                    } else {
                        0
                    };
                    // One step is chained too where that is the device's chain length (slow
                    // steps), so its time keeps being measured; the last step of `max_tokens`
                    // is a plain step.
                    if k > 1 || (k == 1 && self.chain_target() == 1) {
                        let ids = self.decode_chained(input[0], k, &mut sampler).await?;
                        ahead.extend(&ids[1..]);
                        ids[0]
                    } else {
                        // The sampler accepts what it samples into its penalty history.
                        let t = now_s();
                        let id = self.step(&input, &mut sampler).await?;
                        self.plain_step_s = Some((now_s() - t) / input.len() as f64);
                        id
                    }
                }
            };
            if t_first.is_none() {
                t_first = Some(now_s());
                c_first = self.ctx.counts();
            }
            let stop_reason = if self.tok.is_eog(id) {
                Some("stop")
            } else {
                stats.generated_tokens += 1;
                let piece = detok.push_with(id, opts.shown_control.contains(&id));
                let (text, hit) = stop.push(&piece);
                if !on_token(Some(id), &text) {
                    Some("aborted")
                } else if hit {
                    Some("stop")
                } else if forced.is_empty()
                    && sampler.constraint_mut().is_some_and(|c| c.is_stopped())
                {
                    // The grammar can take nothing more: only end of generation is left. Forced
                    // tokens are committed to the grammar before they are handed out, so it
                    // reports stopped while the last of them are still to come.
                    Some("stop")
                } else if opts.max_tokens > 0 && stats.generated_tokens >= opts.max_tokens {
                    Some("length")
                } else {
                    None
                }
            };
            if let Some(reason) = stop_reason {
                finish = reason;
                // Steps run ahead of the stop fed tokens that were never handed out: forget them.
                let extra = ahead.len() as u32;
                sampler.unaccept(ahead.len());
                self.rewind(extra)?;
                break;
            }
            if from_forced {
                input.push(id);
            } else {
                input = vec![id];
                forced.extend(sampler.take_forced());
            }
        }
        let tail = stop.flush(&detok.flush());
        if !tail.is_empty() {
            on_token(None, &tail);
        }
        let t_end = now_s();
        let t_first = t_first.unwrap_or(t_end);
        stats.prefill_tok_s = prompt.len() as f64 / (t_first - t0).max(1e-9);
        let decoded = stats.generated_tokens.saturating_sub(1) as f64;
        stats.decode_tok_s = if decoded > 0.0 {
            decoded / (t_end - t_first).max(1e-9)
        } else {
            0.0
        };
        if decoded > 0.0 {
            let c = self.ctx.counts().since(&c_first);
            stats.dispatches_per_token = c.dispatches as f64 / decoded;
            stats.passes_per_token = c.passes as f64 / decoded;
            stats.submits_per_token = c.submits as f64 / decoded;
        }
        stats.finish_reason = finish.to_string();
        stats.context_shifts = self.shifts - shifts0;
        if sampler.masks > 0 {
            stats.mask_ms_per_token = sampler.mask_time_s * 1000.0 / sampler.masks as f64;
        }
        Ok(stats)
    }
}

/// Holds back text that may be the start of a stop string; reports when one completes.
struct StopScanner<'s> {
    stops: &'s [String],
    pending: String,
}

impl<'s> StopScanner<'s> {
    fn new(stops: &'s [String]) -> Self {
        StopScanner {
            stops,
            pending: String::new(),
        }
    }

    /// Add text; returns what can be emitted and whether a stop string was hit.
    fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let mut keep = 0;
        for s in self.stops {
            for (i, _) in self.pending.char_indices() {
                let suffix = &self.pending[i..];
                if s.starts_with(suffix) {
                    keep = keep.max(suffix.len());
                    break;
                }
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    fn flush(&mut self, tail: &str) -> String {
        self.pending.push_str(tail);
        std::mem::take(&mut self.pending)
    }
}

/// Seconds since some fixed point, on both targets.
pub fn now_s() -> f64 {
    #[cfg(target_arch = "wasm32")]
    {
        // performance.now() (sub-millisecond, in pages and workers alike): per-token figures
        // such as the constraint mask's CPU time are below Date.now()'s millisecond.
        use wasm_bindgen::JsCast;
        thread_local! {
            static PERF: Option<web_sys::Performance> = js_sys::Reflect::get(&js_sys::global(), &"performance".into())
                .ok()
                .and_then(|p| p.dyn_into::<web_sys::Performance>().ok());
        }
        PERF.with(|p| match p {
            Some(p) => p.now() / 1000.0,
            None => js_sys::Date::now() / 1000.0,
        })
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        use std::sync::OnceLock;
        static T0: OnceLock<std::time::Instant> = OnceLock::new();
        T0.get_or_init(std::time::Instant::now)
            .elapsed()
            .as_secs_f64()
    }
}

/// The cells a plan for `n` tokens ending at cell `end` covers ([`Session::plan_for`]): on a
/// CPU adapter a power of two (at least 256) that holds `end`; elsewhere the context's `n_ctx`,
/// or for one token (decode) while `end` is at most `short` ([`Model::short_plan_cells`], 0 for
/// none) the short plan's `short` cells.
fn plan_cells(cpu: bool, n: u32, end: u32, n_ctx: u32, short: u32) -> u32 {
    if cpu {
        end.next_power_of_two().max(256).min(n_ctx)
    } else if n == 1 && end <= short {
        short.min(n_ctx)
    } else {
        n_ctx
    }
}

#[cfg(test)]
mod tests {
    use super::{chain_for, plan_cells, StopScanner, CHAIN, CHAIN_MAX};

    #[test]
    fn chains_fit_the_target_time_from_one_step_to_the_ring() {
        assert_eq!(chain_for(None, None), CHAIN, "before any step ran");
        assert_eq!(
            chain_for(Some(0.0), None),
            CHAIN,
            "a clock too coarse to time a chain"
        );
        let h100 = Some(0.00075);
        assert_eq!(
            chain_for(h100, None),
            CHAIN_MAX,
            "an H100's 0.75 ms a step: 66 fit"
        );
        assert_eq!(chain_for(Some(0.004), None), 12, "4 ms a step");
        let cpu = Some(0.35);
        assert_eq!(
            chain_for(cpu, None),
            1,
            "a CPU-emulated adapter: one step a readback"
        );
        assert_eq!(chain_for(Some(1e9), None), 1);
        // Before a chain: the prompt's step, a token at a time of it. An H100's 43,000 prompt
        // tokens a second leave the first chain at CHAIN; lavapipe's 14.5 take it to one step.
        assert_eq!(chain_for(None, Some(1.0 / 43_000.0)), CHAIN);
        assert_eq!(chain_for(None, Some(1.0 / 14.5)), 1);
        assert_eq!(chain_for(None, Some(0.025)), 2, "25 ms a prompt token");
        // Once a chain ran, its time decides.
        assert_eq!(chain_for(h100, Some(1.0 / 14.5)), CHAIN_MAX);
        assert_eq!(chain_for(cpu, Some(1.0 / 43_000.0)), 1);
    }

    #[test]
    fn plans_cover_their_cells() {
        // GPU, a short decode plan of 512 cells: decode up to cell 512 on it, past it and every
        // batch on the context's plan; a context shorter than the short plan caps it.
        assert_eq!(plan_cells(false, 1, 1, 4096, 512), 512);
        assert_eq!(plan_cells(false, 1, 512, 4096, 512), 512);
        assert_eq!(plan_cells(false, 1, 513, 4096, 512), 4096);
        assert_eq!(plan_cells(false, 5, 20, 4096, 512), 4096);
        assert_eq!(plan_cells(false, 1, 100, 392, 512), 392);
        assert_eq!(plan_cells(false, 1, 100, 4096, 0), 4096);
        // CPU adapters: powers of two from 256, capped by the context.
        assert_eq!(plan_cells(true, 1, 3, 4096, 512), 256);
        assert_eq!(plan_cells(true, 7, 300, 4096, 0), 512);
        assert_eq!(plan_cells(true, 1, 3000, 3000, 0), 3000);
    }

    #[test]
    fn stop_strings_are_held_back_and_cut() {
        let stops = vec!["</s>".to_string(), "\n\n".to_string()];
        let mut s = StopScanner::new(&stops);
        assert_eq!(s.push("Hello"), ("Hello".to_string(), false));
        assert_eq!(s.push(" wor<"), (" wor".to_string(), false));
        assert_eq!(s.push("/"), ("".to_string(), false));
        assert_eq!(s.push("x"), ("</x".to_string(), false));
        assert_eq!(s.push("ld\n"), ("ld".to_string(), false));
        assert_eq!(s.push("\nmore"), ("".to_string(), true));
    }
}
