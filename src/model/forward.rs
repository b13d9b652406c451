//! The forward pass, one architecture-parameterised block that reads like the papers:
//!
//! ```text
//! x = embed(tokens) * embedding_scale
//! per layer:  h = norm(x);  q, k, v = h W_q (+b), h W_k (+b), h W_v (+b)
//!             [qk-norm]  rope(q), rope(k) -> KV cache at the tokens' positions
//!             a = attention(q, cache, window of this layer) W_o   [post-attention norm]
//!             x = x + a * residual_scale
//!             h = norm(x);  f = act(h W_gate) * (h W_up) W_down  [post-FFN norm]
//!             x = x + f * residual_scale
//! logits = norm(x) W_out / logit_scale      (W_out = token_embd when tied)
//!          [cap * tanh(logits / cap)]       (Gemma 2's final soft-capping)
//! ```
//! LFM2's short-convolution layers replace the attention block with a gated convolution
//! (`lfm2.rs`), Qwen3.5's gated delta-net layers with a recurrent one (`qwen35.rs`, which also
//! describes its gated attention); SmolLM3's every fourth layer has no rope (a rope of zero
//! rotary dimensions).
//! Phi-3 stores q, k, v in one tensor and gate, up in one (the same GEMVs as a fusion made at
//! load), and brings two sets of LongRoPE factors, chosen by the cache's context length.
//! Encoding is synchronous; the caller submits and reads back.

use super::hparams::{Arch, HParams};
use super::kernels;
use super::names::{self, LayerTensor as T};
use crate::error::{Error, ErrorCode, Result};
use crate::gpu::{GpuContext, GpuTensor, Prepared, Recorder, Step};
use crate::kv::{KvCache, KvCacheConfig};
use crate::loader::LoadedModel;
use crate::ops::elementwise::View;
use crate::ops::rope::RopeTable;
use crate::ops::{embed, glu, matmul};
use crate::rope::RopeConfig;

#[path = "lfm2.rs"]
mod lfm2;
#[path = "qwen35.rs"]
mod qwen35;

/// Which rows of the batch get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// Only the last token (generation).
    Last,
    /// Every token (teacher-forced scoring).
    All,
}

/// One GPU tensor computing some columns of a projection output: `tensor` (a tensor of the file,
/// or several fused at load) writes columns `col .. col + tensor.rows`.
struct Proj {
    tensor: String,
    col: u64,
}

/// The weights of one layer, borrowed by name from the loaded model.
struct Layer {
    attn_norm: String,
    /// Writing q, k and v side by side, `(n, q_dim + 2 kv_dim)`: one GEMV where the loader fused
    /// them, up to three where their types differ.
    qkv: Vec<Proj>,
    q_bias: Option<String>,
    k_bias: Option<String>,
    v_bias: Option<String>,
    q_norm: Option<String>,
    k_norm: Option<String>,
    o: String,
    post_attn_norm: Option<String>,
    ffn_norm: String,
    /// Writing gate and up side by side, `(n, 2 n_ff)`.
    gate_up: Vec<Proj>,
    down: String,
    post_ffw_norm: Option<String>,
    /// The QK-norm weights side by side, `(2, head_dim)` f32 (q's, then k's), as `qk_rope` binds
    /// them: a copy of 2 x head_dim values made once at load.
    qk_norm: Option<wgpu::Buffer>,
    /// LFM2: a short-convolution layer in place of attention.
    conv: Option<lfm2::ConvLayer>,
    /// Qwen3.5: a gated delta-net layer in place of attention.
    delta: Option<qwen35::DeltaLayer>,
}

pub struct Model {
    pub hp: HParams,
    pub weights: LoadedModel,
    layers: Vec<Layer>,
    output: String,
    /// The final norm (`output_norm`; LFM2 stores it as `token_embd_norm`).
    output_norm: String,
    /// Every layer's rope; LongRoPE models (Phi-3) have a second set, `[short, long]`, and a
    /// cache takes one by its context length ([`HParams::long_rope`]).
    ropes: Vec<LayerRopes>,
    rope_tables: Vec<RopeTable>,
    /// Gated delta-net layers (Qwen3.5): batches of at least this many tokens run the delta
    /// rule's chunked form, smaller ones (decode) the recurrent one
    /// ([`qwen35::CHUNKED_MIN_TOKENS`]; a plan reads it when it is prepared).
    pub delta_chunked_min: u32,
    /// Decode plans' attention: the split (flash-decoding) kernel, which also takes q, k and v
    /// from the projections itself where it fits (`Some(true)`), the one-workgroup-per-head
    /// kernel after `qk_rope` (`Some(false)`), or by adapter (`None`: split on GPUs, not on CPU
    /// adapters; [`kernels::split_attention`]). Tests set it to run the GPU path on a CPU.
    pub split_attention: Option<bool>,
    /// Whether prefill projections run on 8-bit X (`ops::gemm_q8`): `None` by the engine's rule
    /// ([`kernels::gemm_q8_wanted`]: big weights of the types the kernel reads, batches the
    /// tiled GEMM takes), `Some(true)` for every such weight and batch (tests run the path on
    /// the tiny models so), `Some(false)` never.
    pub prefill_q8: Option<bool>,
}

/// The rope of each layer for one context class.
struct LayerRopes {
    /// Base, layout, frequency factors, attention factor; shared with the KV cache shift.
    configs: Vec<RopeConfig>,
    /// Each layer's index into `Model::rope_tables` (layers with the same rope share a table).
    table: Vec<usize>,
}

/// Activation buffers for batches of up to `max_batch` tokens.
pub struct Workspace {
    pub max_batch: u32,
    /// Rows of logits the buffer holds.
    pub max_logit_rows: u32,
    /// Positions and token ids of the current step.
    pub step: Step,
    x: wgpu::Buffer,
    /// The residual stream's second buffer, `(n_embd)`: decode plans whose projections fold the
    /// norms in ([`Model::plan`]) alternate x and this one.
    x_alt: wgpu::Buffer,
    h: wgpu::Buffer,
    /// q (with its gates where the model has them), k, v projections side by side,
    /// `(n, HParams::qkv_width)`.
    pub(crate) qkv: wgpu::Buffer,
    /// The roped q, `(n, q_dim)`.
    pub(crate) q: wgpu::Buffer,
    att: wgpu::Buffer,
    o: wgpu::Buffer,
    /// gate and up side by side, `(n, 2 n_ff)`.
    gate_up: wgpu::Buffer,
    /// Activations quantized to 8 bits: one token's gated unit (`glu::q8_bytes(1, n_ff)`), where
    /// a decode plan's down projections read it so ([`kernels::glu_down`]), and a prefill batch's
    /// inputs of the projections on 8-bit X ([`kernels::quantize_for`], `max_batch` rows of the
    /// widest activation).
    xq8: wgpu::Buffer,
    /// `(n, 3 n_embd)`: a short-convolution layer's B | C | x (models with conv layers only).
    bcx: Option<wgpu::Buffer>,
    /// The gated delta-net layers' activations (models with them only).
    delta: Option<qwen35::DeltaWorkspace>,
    /// `(rows, n_vocab)` f32.
    pub logits: wgpu::Buffer,
}

impl Model {
    /// Check the tensors an architecture needs and bind them by name.
    pub async fn new(ctx: &GpuContext, weights: LoadedModel) -> Result<Self> {
        let hp = HParams::from_gguf(&weights.header)?;
        let has = |n: &str| weights.has(n);
        let need = |n: String| -> Result<String> {
            if has(&n) {
                Ok(n)
            } else {
                Err(Error::new(
                    ErrorCode::BadGguf,
                    format!("the {} model lacks tensor {n}", hp.arch.name()),
                ))
            }
        };
        let opt = |n: String| if has(&n) { Some(n) } else { None };
        let mut layers = Vec::with_capacity(hp.n_layer as usize);
        for l in 0..hp.n_layer {
            if hp.is_conv(l) {
                layers.push(lfm2::conv_layer(ctx, &weights, &hp, l).await?);
                continue;
            }
            if hp.is_recurrent(l) {
                layers.push(qwen35::delta_layer(ctx, &weights, &hp, l)?);
                continue;
            }
            let gemma = hp.post_norms;
            let (qd, kvd, ff) = (hp.q_proj_dim() as u64, hp.kv_dim() as u64, hp.n_ff as u64);
            // Phi-3's files hold q, k, v as one tensor (rows in that order), which is the layout
            // a fusion at load gives the separate ones.
            let (qkv, qkv_widths) = match opt(T::AttnQkv.name(l)) {
                Some(fused) => (vec![fused], vec![qd + 2 * kvd]),
                None => (
                    vec![
                        need(T::AttnQ.name(l))?,
                        need(T::AttnK.name(l))?,
                        need(T::AttnV.name(l))?,
                    ],
                    vec![qd, kvd, kvd],
                ),
            };
            // Phi-3's `ffn_up` is gate and up in one, `(2 n_ff, n_embd)`, gate rows first (the
            // GLU kernel's layout: act(first half) * second half).
            let (gate_up, gate_up_widths) = if hp.arch == Arch::Phi3 {
                (vec![need(T::FfnUp.name(l))?], vec![2 * ff])
            } else {
                (
                    vec![need(T::FfnGate.name(l))?, need(T::FfnUp.name(l))?],
                    vec![ff, ff],
                )
            };
            layers.push(Layer {
                attn_norm: need(T::AttnNorm.name(l))?,
                qkv: projections(&weights, &qkv, &qkv_widths)?,
                q_bias: opt(T::AttnQBias.name(l)),
                k_bias: opt(T::AttnKBias.name(l)),
                v_bias: opt(T::AttnVBias.name(l)),
                q_norm: if hp.qk_norm {
                    Some(need(T::AttnQNorm.name(l))?)
                } else {
                    None
                },
                k_norm: if hp.qk_norm {
                    Some(need(T::AttnKNorm.name(l))?)
                } else {
                    None
                },
                o: need(T::AttnOutput.name(l))?,
                post_attn_norm: if gemma {
                    Some(need(T::PostAttentionNorm.name(l))?)
                } else {
                    None
                },
                // Qwen3.5's feed-forward pre-norm is stored as `post_attention_norm`.
                ffn_norm: need(if hp.arch == Arch::Qwen35 {
                    T::PostAttentionNorm.name(l)
                } else {
                    T::FfnNorm.name(l)
                })?,
                gate_up: projections(&weights, &gate_up, &gate_up_widths)?,
                down: need(T::FfnDown.name(l))?,
                post_ffw_norm: if gemma {
                    Some(need(T::PostFfwNorm.name(l))?)
                } else {
                    None
                },
                qk_norm: None,
                conv: None,
                delta: None,
            });
        }
        // The QK-norm weights of each layer side by side in one small buffer (copied on the GPU).
        let norm_bytes = hp.head_dim as u64 * 4;
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        for layer in layers.iter_mut() {
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                let buf = ctx.empty_storage("qk norm", 2 * norm_bytes)?;
                for (i, name) in [qn, kn].into_iter().enumerate() {
                    let t = &weights.tensors[name];
                    if !t.is_f32_vector(hp.head_dim as u64) {
                        return Err(Error::new(
                            ErrorCode::BadGguf,
                            format!("{name} is not an f32 vector of head_dim {}", hp.head_dim),
                        ));
                    }
                    enc.copy_buffer_to_buffer(
                        &t.parts[0].buffer,
                        0,
                        &buf,
                        i as u64 * norm_bytes,
                        norm_bytes,
                    );
                }
                layer.qk_norm = Some(buf);
            }
        }
        ctx.submit([enc.finish()]);
        need(names::TOKEN_EMBD.to_string())?;
        let output_norm = need(
            if hp.arch == Arch::Lfm2 {
                names::OUTPUT_NORM_LFM2
            } else {
                names::OUTPUT_NORM
            }
            .to_string(),
        )?;
        let output = if has(names::OUTPUT) {
            names::OUTPUT.to_string()
        } else {
            names::TOKEN_EMBD.to_string()
        };
        // Frequency factors: also kept on the CPU, because the context shift's cos/sin table
        // needs them. As in llama.cpp, `rope_freqs` (Llama 3) serves every context; otherwise
        // LongRoPE's short factors serve a context within the original one and its long factors
        // one past it.
        let half_rot = hp.n_rot as usize / 2;
        let freqs = rope_factors(ctx, &weights, names::ROPE_FREQS, half_rot).await?;
        let short = rope_factors(ctx, &weights, names::ROPE_FACTORS_SHORT, half_rot).await?;
        let long = rope_factors(ctx, &weights, names::ROPE_FACTORS_LONG, half_rot).await?;
        let factor_sets = match (freqs, long) {
            (Some(f), _) => vec![Some(f)],
            (None, Some(long)) => vec![short, Some(long)],
            (None, None) => vec![short],
        };
        let mut rope_tables: Vec<RopeTable> = Vec::new();
        let mut ropes = Vec::with_capacity(factor_sets.len());
        for ff in &factor_sets {
            let configs = ropes_of_layers(&hp, ff.as_deref());
            let mut table = Vec::with_capacity(configs.len());
            for r in &configs {
                let i = match rope_tables.iter().position(|t| &t.config == r) {
                    Some(i) => i,
                    None => {
                        rope_tables.push(RopeTable::new(ctx, r)?);
                        rope_tables.len() - 1
                    }
                };
                table.push(i);
            }
            ropes.push(LayerRopes { configs, table });
        }
        let qwen35_q8 = (hp.arch == Arch::Qwen35).then_some(false);
        Ok(Model {
            hp,
            weights,
            layers,
            output,
            output_norm,
            ropes,
            rope_tables,
            delta_chunked_min: qwen35::CHUNKED_MIN_TOKENS,
            split_attention: None,
            // Qwen3.5's delta-net layers amplify X's rounding: on the tiny Q4_K model, 8-bit X
            // moved the logits by 1.74 of their std from llama.cpp's (the tests allow 1.6 for
            // this architecture), so its prefill keeps f32 X.
            prefill_q8: qwen35_q8,
        })
    }

    /// The layers' ropes for a cache of `n_ctx` cells (LongRoPE: short or long factors).
    fn ropes_for(&self, n_ctx: u32) -> &LayerRopes {
        match &self.ropes[..] {
            [_, long] if self.hp.long_rope(n_ctx) => long,
            _ => &self.ropes[0],
        }
    }

    /// Every layer's rope (base, layout, factors) for a cache of `n_ctx` cells.
    pub fn layer_ropes(&self, n_ctx: u32) -> &[RopeConfig] {
        &self.ropes_for(n_ctx).configs
    }

    /// The output head (`token_embd` when tied).
    pub fn output_head(&self) -> &GpuTensor {
        self.w(&self.output)
    }

    fn w(&self, name: &str) -> &GpuTensor {
        &self.weights.tensors[name]
    }

    /// A KV cache of `n_ctx` cells for this model.
    pub fn new_kv_cache(&self, ctx: &GpuContext, n_ctx: u32) -> Result<KvCache> {
        // Short-convolution layers keep B * x of every position instead of K and V; gated
        // delta-net layers a recurrent state.
        let kv = KvCache::with_conv_rows(
            ctx,
            KvCacheConfig {
                n_ctx,
                n_kv_heads: self.hp.n_head_kv,
                head_dim: self.hp.head_dim,
                layer_ropes: self.layer_ropes(n_ctx).to_vec(),
                shift_workgroup_size: None,
                max_scratch_cells: None,
            },
            if self.hp.conv_l_cache > 0 {
                &self.hp.conv_layers
            } else {
                &[]
            },
            self.hp.n_embd,
        )?;
        if self.hp.recurrent_layers.iter().any(|&r| r) {
            let (conv, delta) = qwen35::state_bytes(&self.hp);
            return kv.with_recurrent(ctx, &self.hp.recurrent_layers, conv, delta);
        }
        Ok(kv)
    }

    /// Activation buffers for up to `max_batch` tokens and `max_logit_rows` rows of logits.
    pub fn workspace(
        &self,
        ctx: &GpuContext,
        max_batch: u32,
        max_logit_rows: u32,
    ) -> Result<Workspace> {
        let hp = &self.hp;
        let f = |label: &str, elems: u64| ctx.empty_storage(label, elems * 4);
        let b = max_batch as u64;
        // One token's gated unit for the decode GEMV on 8-bit X, and for batches the tiled GEMM
        // takes, the widest activation a prefill projection quantizes (kernels::quantize_for).
        let widest = (hp.n_ff.max(hp.n_embd).max(hp.q_dim())) as u64;
        let mut xq8_bytes = glu::q8_bytes(1, hp.n_ff as u64).max(16);
        let batches = crate::ops::gemm::use_gemm(ctx, max_batch) || self.prefill_q8 == Some(true);
        if max_batch > 1 && batches && widest.is_multiple_of(32) {
            xq8_bytes = xq8_bytes.max(crate::ops::quantize_x8::bytes(b, widest));
        }
        let logits_bytes = max_logit_rows as u64 * hp.n_vocab as u64 * 4;
        if logits_bytes > ctx.limits.max_binding() {
            return Err(Error::invalid(format!(
                "{max_logit_rows} rows of {} logits exceed the binding limit; score in smaller batches",
                hp.n_vocab
            )));
        }
        Ok(Workspace {
            max_batch,
            max_logit_rows,
            step: Step::new(ctx, max_batch)?,
            x: f("x", b * hp.n_embd as u64)?,
            x_alt: f("x alt", hp.n_embd as u64)?,
            h: f("h", b * hp.n_embd as u64)?,
            qkv: f("qkv", b * hp.qkv_width() as u64)?,
            q: f("q", b * hp.q_dim() as u64)?,
            att: f("attn", b * hp.q_dim() as u64)?,
            o: f("o", b * hp.n_embd as u64)?,
            gate_up: f("gate_up", b * 2 * hp.n_ff as u64)?,
            xq8: ctx.empty_storage("activations, 8-bit", xq8_bytes)?,
            bcx: if hp.conv_l_cache > 0 {
                Some(f("bcx", b * 3 * hp.n_embd as u64)?)
            } else {
                None
            },
            delta: if hp.recurrent_layers.iter().any(|&r| r) {
                Some(qwen35::DeltaWorkspace::new(ctx, hp, max_batch)?)
            } else {
                None
            },
            logits: f("logits", max_logit_rows as u64 * hp.n_vocab as u64)?,
        })
    }

    /// Encode the forward pass of `tokens` at positions `pos0..`, writing their K/V into `kv`
    /// and logits into `ws.logits` (one row for `Last`, `tokens.len()` rows for `All`).
    /// The caller advances the cache (`kv.advance`) after submitting.
    ///
    /// One-off: this prepares a plan for the call and drops it. Loops keep a [`ForwardPlan`]
    /// ([`Model::plan`]) and call [`Model::run`].
    #[allow(clippy::too_many_arguments)]
    pub fn encode(
        &self,
        ctx: &GpuContext,
        enc: &mut wgpu::CommandEncoder,
        ws: &Workspace,
        kv: &KvCache,
        tokens: &[u32],
        pos0: u32,
        rows: LogitRows,
    ) -> Result<()> {
        let plan = self.plan(
            ctx,
            ws,
            kv,
            tokens.len() as u32,
            rows,
            pos0 + tokens.len() as u32,
        )?;
        self.run(ctx, enc, ws, kv, &plan, tokens, pos0)
    }

    /// Record a prepared forward pass of `tokens` at positions `pos0..` into one compute pass.
    /// The only write is the step buffer's (positions and token ids).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        ctx: &GpuContext,
        enc: &mut wgpu::CommandEncoder,
        ws: &Workspace,
        kv: &KvCache,
        plan: &ForwardPlan,
        tokens: &[u32],
        pos0: u32,
    ) -> Result<()> {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("forward"),
            timestamp_writes: None,
        });
        self.record(ctx, &mut pass, ws, kv, plan, tokens, pos0)?;
        ctx.count_recorded(1, 0);
        Ok(())
    }

    /// [`Model::run`] into a compute pass the caller owns (the sampler records after it).
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        ctx: &GpuContext,
        pass: &mut wgpu::ComputePass<'_>,
        ws: &Workspace,
        kv: &KvCache,
        plan: &ForwardPlan,
        tokens: &[u32],
        pos0: u32,
    ) -> Result<()> {
        let n = tokens.len() as u32;
        if n != plan.n_tokens {
            return Err(Error::internal(format!(
                "a plan for {} tokens run with {n}",
                plan.n_tokens
            )));
        }
        if pos0 + n > kv.n_ctx() {
            return Err(Error::new(
                ErrorCode::ContextFull,
                format!(
                    "positions {pos0}..{} exceed the context of {}",
                    pos0 + n,
                    kv.n_ctx()
                ),
            ));
        }
        if pos0 + n > plan.max_cells {
            return Err(Error::internal(format!(
                "positions up to {} past the plan's {} cells",
                pos0 + n,
                plan.max_cells
            )));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t >= self.hp.n_vocab) {
            return Err(Error::invalid(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.hp.n_vocab
            )));
        }
        if !kv.can_continue_at(pos0) {
            return Err(Error::invalid(format!(
                "the recurrent layers' state is at position {}, not {pos0}: after a rewind, evaluate the tokens again from position 0",
                kv.recurrent_at()
            )));
        }
        ws.step.write(ctx, pos0, tokens);
        self.record_plan(ctx, pass, plan);
        Ok(())
    }

    /// Record a prepared forward pass whose step buffer is already set (positions written,
    /// token ids written by the CPU or by the previous step on the GPU).
    pub fn record_plan(
        &self,
        ctx: &GpuContext,
        pass: &mut wgpu::ComputePass<'_>,
        plan: &ForwardPlan,
    ) {
        plan.prepared.record(pass);
        ctx.count_recorded(0, plan.dispatches() as u64);
    }

    /// Whether a decode plan folds each block's norms into the projections that read them:
    /// `(attention, ffn)`, for the q/k/v and the gate/up projections. Each needs every layer an
    /// attention layer, every norm one f32 vector of n_embd, and every one of its weights
    /// [`matmul::prenorm_worth`] (it fits the workgroup memory, and its workgroups repeating
    /// the norm cost less than a dispatch).
    fn fold_norms(&self, ctx: &GpuContext) -> (bool, bool) {
        let e = self.hp.n_embd as u64;
        let vector = |n: &String| self.w(n).is_f32_vector(e);
        let base = self.layers.iter().all(|layer| {
            layer.conv.is_none()
                && layer.delta.is_none()
                && [Some(&layer.attn_norm), Some(&layer.ffn_norm)]
                    .into_iter()
                    .chain([layer.post_attn_norm.as_ref(), layer.post_ffw_norm.as_ref()])
                    .flatten()
                    .all(vector)
        });
        let worth = |projs: &dyn Fn(&Layer) -> &Vec<Proj>| {
            base && self.layers.iter().all(|layer| {
                projs(layer).iter().all(|p| {
                    let w = self.w(&p.tensor);
                    w.cols == e && matmul::prenorm_worth(ctx, w)
                })
            })
        };
        (worth(&|l: &Layer| &l.qkv), worth(&|l: &Layer| &l.gate_up))
    }

    /// Whether a decode plan carries each block's norms in its projections' epilogues
    /// ([`matmul::Epilogue`]): the block's last projection (o, down) adds its output to the
    /// residual stream and writes `x * w_norm` with its workgroups' sums of `x^2`, the next ones
    /// (q/k/v, gate/up, the head) scale their outputs by the norm. No dispatch of its own, and
    /// no workgroup repeating the norm ([`Model::fold_norms`]' cost on wide models). Needs every
    /// layer an attention layer without post-norms (the epilogue sees one row of the addend,
    /// a post-norm needs all of it) and every norm one f32 vector of n_embd. The bench knob
    /// `CERA_NORM_LINK=0` turns it off (native builds).
    fn link_norms(&self, ctx: &GpuContext) -> bool {
        let e = self.hp.n_embd as u64;
        let vector = |n: &String| self.w(n).is_f32_vector(e);
        !crate::gpu::knob::knob_off("CERA_NORM_LINK")
            && matmul::epilogue_fits(ctx)
            && vector(&self.output_norm)
            && self.layers.iter().all(|layer| {
                layer.conv.is_none()
                    && layer.delta.is_none()
                    && layer.post_attn_norm.is_none()
                    && layer.post_ffw_norm.is_none()
                    && vector(&layer.attn_norm)
                    && vector(&layer.ffn_norm)
            })
    }

    /// Prepare the forward pass of a batch of `n` tokens once: every dispatch with its bind group,
    /// for the workspace and cache given (which do not move). Positions come from the workspace's
    /// step buffer at run time; `max_cells` bounds `pos0 + n` over the plan's life.
    /// Cells of the short decode plan a session makes for its first positions (0: none): a plan
    /// of at most this many cells has its o projections do the split attention's reduce
    /// ([`kernels::split_x_cells`]), one dispatch a layer fewer than the plan for the whole
    /// context.
    pub fn short_plan_cells(&self, ctx: &GpuContext) -> u32 {
        if self.split_attention == Some(false) {
            return 0;
        }
        kernels::split_x_cells(ctx, &self.hp)
    }

    pub fn plan(
        &self,
        ctx: &GpuContext,
        ws: &Workspace,
        kv: &KvCache,
        n: u32,
        rows: LogitRows,
        max_cells: u32,
    ) -> Result<ForwardPlan> {
        let hp = &self.hp;
        if n == 0 || n > ws.max_batch {
            return Err(Error::invalid(format!(
                "a batch of {n} tokens (workspace holds {})",
                ws.max_batch
            )));
        }
        if rows == LogitRows::All && n > ws.max_logit_rows {
            return Err(Error::invalid(format!(
                "{n} rows of logits (workspace holds {})",
                ws.max_logit_rows
            )));
        }
        let max_cells = max_cells.clamp(n, kv.n_ctx());
        let step = &ws.step.buffer;
        // The split attention kernel's scratch, sized for this plan's cells (at most the cache's
        // n_ctx): allocated here, not in the workspace, because only a plan knows its cells, and
        // held by the plan whose dispatches bind it.
        let split = kernels::split_attention(ctx, hp, n, max_cells, self.split_attention)?;
        let mut rec = Recorder::new(ctx);
        let (e, qd, kvd) = (hp.n_embd, hp.q_dim(), hp.kv_dim());
        let ropes = self.ropes_for(kv.n_ctx());

        // x = embed(tokens) * embedding_scale                                   (n, n_embd)
        embed::prepare(
            &mut rec,
            self.w(names::TOKEN_EMBD),
            step,
            Step::IDS_OFFSET,
            n,
            hp.embedding_scale,
            &ws.x,
            0,
        )?;

        // Decode: a pre-norm model carries each norm in the epilogues of the projections around
        // it (`link`, see Model::link_norms: the residual stream x is updated in place). Else
        // each pre-norm, with the residual add and post-norm before it, is computed by the
        // projections that read it (matmul X_PRENORM): the residual stream alternates between
        // two buffers (`x`, `x_alt`), since every workgroup of a projection reads the old one
        // while one of them writes the new one. Elsewhere (prefill, conv layers, a device
        // whose workgroup memory cannot hold the row) a norm dispatch writes h first.
        let link = n == 1 && self.link_norms(ctx);
        let (fold_attn, fold_ffn) = if n == 1 && !link {
            self.fold_norms(ctx)
        } else {
            (false, false)
        };
        // The producers' sums of squares (one buffer: each consumer reads the last producer's).
        let norm_ss = if link {
            let most = self
                .layers
                .iter()
                .flat_map(|l| [self.w(&l.o), self.w(&l.down)])
                .map(|w| matmul::resnorm_partials_gemv(ctx, w))
                .max()
                .unwrap_or(1)
                .max(1);
            Some(ctx.empty_storage("norm sums of squares", most * 4)?)
        } else {
            None
        };
        // Sums the last producer wrote (the consumers' count).
        let mut ss_count = 0u64;
        let eps = hp.rms_eps;
        let norm_scale = |count: u64| -> Result<matmul::Epilogue> {
            Ok(matmul::Epilogue::NormScale(matmul::NormScale {
                ss: norm_ss.as_ref().expect("linked plans have the sums"),
                count: u32::try_from(count)
                    .map_err(|_| Error::invalid(format!("{count} sums of squares")))?,
                eps,
            }))
        };
        let res_norm = |w| {
            let ss = norm_ss.as_ref().expect("linked plans have the sums");
            kernels::res_norm(w, &ws.h, ss, hp.residual_scale)
        };
        let xs = [&ws.x, &ws.x_alt];
        let mut cur = 0usize;
        if !fold_attn {
            // h = norm(x) for the first layer; every later pre-norm is fused with the residual
            // add before it.
            kernels::rmsnorm(
                &mut rec,
                &ws.x,
                Some(self.w(&self.layers[0].attn_norm)),
                &ws.h,
                n,
                e,
                hp.rms_eps,
            )?;
        }
        for (l, layer) in self.layers.iter().enumerate() {
            if layer.conv.is_some() {
                // LFM2: a short-convolution block in place of attention, then the same FFN.
                self.plan_conv_layer(&mut rec, ws, kv, l, n)?;
                continue;
            }
            if layer.delta.is_some() {
                // Qwen3.5: a gated delta-net block in place of attention, then the same FFN.
                self.plan_delta_layer(&mut rec, ws, kv, l, n)?;
                continue;
            }
            let rope_table = &self.rope_tables[ropes.table[l]];
            // q, k, v projections of h (+ bias), side by side         (n, q_dim + 2 kv_dim)
            let qkv_w = hp.qkv_width() as u64;
            let qpd = hp.q_proj_dim();
            if fold_attn {
                // h = norm(x (+ post_norm(f) * residual_scale, f the last layer's FFN output))
                let post = (l > 0).then(|| {
                    let prev = &self.layers[l - 1];
                    prev.post_ffw_norm.as_ref().map(|w| self.w(w))
                });
                let pre = matmul::PreNorm {
                    x: xs[cur],
                    add: post.map(|post| matmul::PreAdd {
                        add: &ws.o,
                        add_norm: post,
                        scale: hp.residual_scale,
                        out: xs[1 - cur],
                    }),
                    w: self.w(&layer.attn_norm),
                    eps,
                };
                for p in &layer.qkv {
                    matmul::prepare_prenorm(&mut rec, self.w(&p.tensor), &pre, &ws.qkv, p.col)?;
                }
                if l > 0 {
                    cur = 1 - cur;
                }
            } else {
                // (linked, after the first layer: h = norm(x), its scale from the last block's
                // sums of squares in the projections' epilogues)
                let epi = (link && l > 0).then(|| norm_scale(ss_count)).transpose()?;
                // (a prefill batch: h quantized to 8 bits once for the projections that want it)
                let ws_qkv: Vec<&GpuTensor> = layer.qkv.iter().map(|p| self.w(&p.tensor)).collect();
                let hq = kernels::quantize_for(
                    &mut rec,
                    &ws.xq8,
                    &ws.h,
                    n,
                    e,
                    &ws_qkv,
                    self.prefill_q8,
                )?;
                for p in &layer.qkv {
                    kernels::project_cols(
                        &mut rec,
                        self.w(&p.tensor),
                        &ws.h,
                        hq,
                        &ws.qkv,
                        p.col,
                        qkv_w,
                        n,
                        epi.as_ref(),
                    )?;
                }
            }
            for (bias, col, dim) in [
                (&layer.q_bias, 0, qd),
                (&layer.k_bias, qpd, kvd),
                (&layer.v_bias, qpd + kvd, kvd),
            ] {
                if let Some(b) = bias {
                    kernels::add_bias_cols(
                        &mut rec,
                        &ws.qkv,
                        col as u64,
                        qkv_w,
                        self.w(b),
                        n,
                        dim,
                    )?;
                }
            }
            // [QK-norm (Qwen3, Gemma 3)], rope q in place, rope k and write k, v into the cache at
            // the step's positions                                                one dispatch
            // Attention over the cache (causal, sliding window on SWA layers).     (n, q_dim)
            // Decode on the split kernel does the line above in its first dispatch.
            // (Few chunks: the o projection does the reduce, below.)
            let qk_norm = layer.qk_norm.as_ref().map(|w| (w, hp.rms_eps));
            let window = if hp.is_swa(l as u32) {
                hp.sliding_window
            } else {
                0
            };
            let o_w = self.w(&layer.o);
            let fused = split
                .as_ref()
                .filter(|s| s.fresh && s.fused_reduce && kernels::split_x_fits(ctx, o_w, link));
            let mut split_x = None;
            match split.as_ref().filter(|s| s.fresh) {
                Some(s) => {
                    let out = fused.is_none().then_some(&ws.att);
                    let partials = kernels::attention_fresh(
                        &mut rec, rope_table, hp, ws, kv, l, qk_norm, out, window, step, max_cells,
                        s,
                    )?;
                    split_x = fused.map(|s| matmul::SplitX {
                        scratch: &s.scratch,
                        step,
                        partials,
                    });
                }
                None => {
                    kernels::qk_rope(&mut rec, rope_table, hp, ws, kv, l, n, qk_norm, step)?;
                    kernels::attention(
                        &mut rec,
                        hp,
                        &ws.q,
                        kv.k(l),
                        kv.v(l),
                        &ws.att,
                        n,
                        window,
                        step,
                        max_cells,
                        split.as_ref(),
                    )?;
                }
            }
            if hp.attn_gate {
                // Qwen3.5: attention's output times sigmoid(gate), each head's gate beside its q
                // in the projection output: rows (token, head), heads 2 head_dim apart, tokens
                // a projection row apart.                                          (n, q_dim)
                let hd = hp.head_dim as u64;
                let gate = View {
                    buffer: &ws.qkv,
                    offset: hd,
                    stride: 2 * hd,
                };
                let att = View {
                    buffer: &ws.att,
                    offset: 0,
                    stride: hd,
                };
                glu::prepare_grouped(
                    &mut rec,
                    glu::Activation::Sigmoid,
                    gate,
                    (hp.n_head, qkv_w),
                    att,
                    att,
                    n * hp.n_head,
                    hp.head_dim,
                )?;
            }
            if !link {
                // o = att W_o (a linked plan adds it to x in the projection's epilogue, below)
                match &split_x {
                    Some(sx) => {
                        kernels::gemv_split_x(&mut rec, o_w, sx, &ws.o, None)?;
                    }
                    None => {
                        let q8 = self.prefill_q8;
                        let aq =
                            kernels::quantize_for(&mut rec, &ws.xq8, &ws.att, n, qd, &[o_w], q8)?;
                        kernels::project_cols(
                            &mut rec, o_w, &ws.att, aq, &ws.o, 0, o_w.rows, n, None,
                        )?;
                    }
                }
            }
            let post = layer.post_attn_norm.as_ref().map(|w| self.w(w));
            if link {
                // x += o W_o * residual_scale;  h = norm(x) (its scale in gate/up)
                let epi = res_norm(self.w(&layer.ffn_norm));
                ss_count = match &split_x {
                    Some(sx) => kernels::gemv_split_x(&mut rec, o_w, sx, &ws.x, Some(&epi))?,
                    None => kernels::gemv_epilogue(&mut rec, o_w, &ws.att, &ws.x, 0, &epi)?,
                };
            } else if fold_ffn {
                // x += post_norm(o) * residual_scale;  h = norm(x), in the gate/up projections
                let pre = matmul::PreNorm {
                    x: xs[cur],
                    add: Some(matmul::PreAdd {
                        add: &ws.o,
                        add_norm: post,
                        scale: hp.residual_scale,
                        out: xs[1 - cur],
                    }),
                    w: self.w(&layer.ffn_norm),
                    eps,
                };
                for p in &layer.gate_up {
                    matmul::prepare_prenorm(&mut rec, self.w(&p.tensor), &pre, &ws.gate_up, p.col)?;
                }
                cur = 1 - cur;
            } else {
                // x += post_norm(o) * residual_scale;  h = norm(x)                   one dispatch
                kernels::residual_norm(
                    &mut rec,
                    &ws.x,
                    &ws.o,
                    post,
                    hp.residual_scale,
                    self.w(&layer.ffn_norm),
                    &ws.h,
                    n,
                    e,
                    hp.rms_eps,
                )?;
            }
            if !fold_ffn {
                // Feed-forward: f = act(h W_gate) * (h W_up) W_down                  (n, n_embd)
                // (linked: h's norm scale, from the sums just written, in the epilogues)
                let epi = link.then(|| norm_scale(ss_count)).transpose()?;
                let ws_gu: Vec<&GpuTensor> =
                    layer.gate_up.iter().map(|p| self.w(&p.tensor)).collect();
                let hq =
                    kernels::quantize_for(&mut rec, &ws.xq8, &ws.h, n, e, &ws_gu, self.prefill_q8)?;
                for p in &layer.gate_up {
                    kernels::project_cols(
                        &mut rec,
                        self.w(&p.tensor),
                        &ws.h,
                        hq,
                        &ws.gate_up,
                        p.col,
                        2 * hp.n_ff as u64,
                        n,
                        epi.as_ref(),
                    )?;
                }
            }
            let next_norm = match self.layers.get(l + 1) {
                Some(next) => self.w(&next.attn_norm),
                None => self.w(&self.output_norm),
            };
            if link {
                // f = act(h W_gate) * (h W_up) W_down;  x += f * residual_scale;  h = norm(x)
                // with the next pre-norm (its scale in the next projections)
                let epi = res_norm(next_norm);
                ss_count = kernels::glu_down(
                    &mut rec,
                    self.w(&layer.down),
                    &ws.gate_up,
                    Some(&ws.xq8),
                    &ws.x,
                    n,
                    hp.activation,
                    Some(&epi),
                    self.prefill_q8,
                )?;
                continue;
            }
            kernels::glu_down(
                &mut rec,
                self.w(&layer.down),
                &ws.gate_up,
                Some(&ws.xq8),
                &ws.o,
                n,
                hp.activation,
                None,
                self.prefill_q8,
            )?;
            // x += post_norm(f) * residual_scale;  h = norm(x) with the next layer's pre-norm
            // (the final norm after the last layer)                               one dispatch
            // (folded: the next layer's q/k/v projections do it, and this dispatch only after
            // the last layer)
            let last = l + 1 == self.layers.len();
            if !fold_attn || last {
                let post = layer.post_ffw_norm.as_ref().map(|w| self.w(w));
                kernels::residual_norm(
                    &mut rec,
                    xs[cur],
                    &ws.o,
                    post,
                    hp.residual_scale,
                    next_norm,
                    &ws.h,
                    n,
                    e,
                    hp.rms_eps,
                )?;
            }
        }

        // The output head on the rows that need logits (h is the final norm of x).
        let out = self.w(&self.output);
        match rows {
            _ if link => {
                // (one token: the final norm's scale from the last block's sums)
                kernels::gemv_epilogue(
                    &mut rec,
                    out,
                    &ws.h,
                    &ws.logits,
                    0,
                    &norm_scale(ss_count)?,
                )?;
            }
            LogitRows::Last => kernels::matmul_at(
                &mut rec,
                out,
                &ws.h,
                (n as u64 - 1) * e as u64,
                &ws.logits,
                0,
                1,
            )?,
            LogitRows::All => kernels::matmul_at(&mut rec, out, &ws.h, 0, &ws.logits, 0, n)?,
        }
        if hp.logit_scale != 1.0 {
            let lr = if rows == LogitRows::Last { 1 } else { n };
            kernels::scale(&mut rec, &ws.logits, 1.0 / hp.logit_scale, lr * hp.n_vocab)?;
        }
        // Gemma 2: logits = cap * tanh(logits / cap).
        if hp.final_softcap > 0.0 {
            let lr = if rows == LogitRows::Last { 1 } else { n };
            crate::ops::softcap::prepare(
                &mut rec,
                &ws.logits,
                0,
                lr * hp.n_vocab,
                hp.final_softcap,
            )?;
        }
        Ok(ForwardPlan {
            n_tokens: n,
            rows,
            max_cells,
            prepared: rec.finish(),
            _split: split,
            _norm_ss: norm_ss,
        })
    }
}

impl Model {
    /// The feed-forward block after a layer's mixer (short conv, delta-net) left its output in
    /// `ws.o`: `x += o;  h = norm(x);  x += act(h W_gate) * (h W_up) W_down;  h = norm(x)` with
    /// the next layer's pre-norm (the final norm after the last layer).
    fn plan_ffn_block(&self, rec: &mut Recorder, ws: &Workspace, l: usize, n: u32) -> Result<()> {
        let hp = &self.hp;
        let layer = &self.layers[l];
        let e = hp.n_embd;
        // x += y;  h = norm(x)                                                     one dispatch
        kernels::residual_norm(
            rec,
            &ws.x,
            &ws.o,
            None,
            hp.residual_scale,
            self.w(&layer.ffn_norm),
            &ws.h,
            n,
            e,
            hp.rms_eps,
        )?;
        // f = act(h W_gate) * (h W_up) W_down;  x += f;  h = norm(x) with the next pre-norm
        for p in &layer.gate_up {
            kernels::matmul_cols(
                rec,
                self.w(&p.tensor),
                &ws.h,
                &ws.gate_up,
                p.col,
                2 * hp.n_ff as u64,
                n,
            )?;
        }
        kernels::glu_down(
            rec,
            self.w(&layer.down),
            &ws.gate_up,
            Some(&ws.xq8),
            &ws.o,
            n,
            hp.activation,
            None,
            self.prefill_q8,
        )?;
        let next_norm = match self.layers.get(l + 1) {
            Some(next) => self.w(&next.attn_norm),
            None => self.w(&self.output_norm),
        };
        kernels::residual_norm(
            rec,
            &ws.x,
            &ws.o,
            None,
            hp.residual_scale,
            next_norm,
            &ws.h,
            n,
            e,
            hp.rms_eps,
        )
    }
}

/// A vector of rope frequency factors (`n_rot / 2` f32), read back to the CPU; `None` when the
/// file lacks the tensor.
async fn rope_factors(
    ctx: &GpuContext,
    weights: &LoadedModel,
    name: &str,
    half_rot: usize,
) -> Result<Option<Vec<f32>>> {
    let Some(t) = weights.tensors.get(name) else {
        return Ok(None);
    };
    if t.ty != crate::gguf::GgmlType::F32 || t.parts.len() != 1 {
        return Err(Error::new(
            ErrorCode::BadGguf,
            format!("{name} must be one f32 vector"),
        ));
    }
    let v = crate::gpu::readback::read_f32(ctx, &t.parts[0].buffer, 0, (t.rows * t.cols) as usize)
        .await?;
    if v.len() != half_rot {
        return Err(Error::new(
            ErrorCode::BadGguf,
            format!("{name} has {} factors, {half_rot} expected", v.len()),
        ));
    }
    if let Some(bad) = v.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
        return Err(Error::new(
            ErrorCode::BadGguf,
            format!("{name} holds the factor {bad} (factors divide angles: finite and positive)"),
        ));
    }
    Ok(Some(v))
}

/// One rope per layer: base (local or global), layout, rotary width, frequency factors `ff`,
/// linear scaling folded into the factors (angle * s = angle / (1 / s)), attention factor.
fn ropes_of_layers(hp: &HParams, ff: Option<&[f32]>) -> Vec<RopeConfig> {
    (0..hp.n_layer)
        .map(|l| {
            let swa = hp.is_swa(l);
            let mut r = RopeConfig::new(
                hp.head_dim as usize,
                if swa { hp.rope_base_swa } else { hp.rope_base },
                hp.rope_type,
            );
            r.n_rot = hp.n_rot as usize;
            // SmolLM3's no-rope layers: no dimension rotates (K cells then shift unrotated).
            if !hp.uses_rope(l) {
                r.n_rot = 0;
                return r;
            }
            r.attn_factor = hp.rope_attn_factor;
            let s = if swa { 1.0 } else { hp.rope_freq_scale };
            r.freq_factors = match (ff, s != 1.0) {
                (Some(f), _) => Some(f.iter().map(|x| x / s).collect()),
                (None, true) => Some(vec![1.0 / s; hp.n_rot as usize / 2]),
                (None, false) => None,
            };
            r
        })
        .collect()
}

/// The GPU tensors computing projections `members` (tensors of the file, in output column order,
/// `widths` columns each): one per fused run, each with its first output column.
fn projections(weights: &LoadedModel, members: &[String], widths: &[u64]) -> Result<Vec<Proj>> {
    let mut out: Vec<Proj> = Vec::new();
    let mut col = 0;
    for (m, &width) in members.iter().zip(widths) {
        let (t, first_row) = weights.rows_of(m)?;
        // The plan lists every tensor of the file (of every part of a split GGUF, whose header
        // is only the first part's), fused or not.
        let rows = weights
            .plan
            .tensors
            .iter()
            .find(|p| &p.name == m)
            .map(|p| p.rows)
            .ok_or_else(|| {
                Error::new(ErrorCode::BadGguf, format!("{m} is not in the memory plan"))
            })?;
        if rows != width {
            return Err(Error::new(
                ErrorCode::BadGguf,
                format!("{m} has {rows} rows, {width} expected"),
            ));
        }
        // A member fused behind the previous one is computed by the same GEMV.
        match out.last() {
            Some(last) if first_row > 0 && last.tensor == t.name => {}
            _ if first_row > 0 => {
                return Err(Error::internal(format!(
                    "{m} is fused behind a tensor this layer does not use"
                )))
            }
            _ => out.push(Proj {
                tensor: t.name.clone(),
                col,
            }),
        }
        col += width;
    }
    Ok(out)
}

/// A forward pass prepared once for a batch shape ([`Model::plan`]), recorded every step.
pub struct ForwardPlan {
    pub n_tokens: u32,
    pub rows: LogitRows,
    /// The plan serves steps with `pos0 + n_tokens <= max_cells`.
    pub max_cells: u32,
    prepared: Prepared,
    /// Bound by the split attention dispatches (decode on GPUs), kept as long as they are.
    _split: Option<kernels::SplitAttention>,
    /// The sums of squares of a decode plan whose projections carry the norms, bound by them.
    _norm_ss: Option<wgpu::Buffer>,
}

impl ForwardPlan {
    /// The prepared dispatches (for profiling).
    pub fn prepared(&self) -> &Prepared {
        &self.prepared
    }

    /// Dispatches one run records.
    pub fn dispatches(&self) -> usize {
        self.prepared.count()
    }

    /// Dispatch counts by op kind, for `cera bench`.
    pub fn kinds(&self) -> Vec<(&'static str, usize)> {
        let mut v: Vec<(&'static str, usize)> = Vec::new();
        for d in &self.prepared.dispatches {
            match v.iter_mut().find(|(k, _)| *k == d.kind) {
                Some(e) => e.1 += 1,
                None => v.push((d.kind, 1)),
            }
        }
        v
    }
}
