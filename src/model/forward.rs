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
//! ```
//! Encoding is synchronous; the caller submits and reads back.

use super::hparams::{Arch, HParams};
use super::kernels as k;
use super::names::{self, LayerTensor as T};
use crate::error::{Error, ErrorCode, Result};
use crate::gpu::{GpuContext, GpuTensor};
use crate::kv::{KvCache, KvCacheConfig};
use crate::loader::LoadedModel;
use crate::ops::rope::RopeTable;
use crate::rope::RopeConfig;

/// Which rows of the batch get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    /// Only the last token (generation).
    Last,
    /// Every token (teacher-forced scoring).
    All,
}

/// The weights of one layer, borrowed by name from the loaded model.
struct Layer {
    attn_norm: String,
    q: String,
    k: String,
    v: String,
    q_bias: Option<String>,
    k_bias: Option<String>,
    v_bias: Option<String>,
    q_norm: Option<String>,
    k_norm: Option<String>,
    o: String,
    post_attn_norm: Option<String>,
    ffn_norm: String,
    gate: String,
    up: String,
    down: String,
    post_ffw_norm: Option<String>,
}

pub struct Model {
    pub hp: HParams,
    pub weights: LoadedModel,
    layers: Vec<Layer>,
    output: String,
    /// The rope of each layer (base, layout, frequency factors), shared with the KV cache shift.
    pub layer_ropes: Vec<RopeConfig>,
    /// Each layer's index into `rope_tables` (layers with the same rope share a table).
    layer_table: Vec<usize>,
    rope_tables: Vec<RopeTable>,
}

/// Activation buffers for batches of up to `max_batch` tokens.
pub struct Workspace {
    pub max_batch: u32,
    /// Rows of logits the buffer holds.
    pub max_logit_rows: u32,
    ids: wgpu::Buffer,
    x: wgpu::Buffer,
    h: wgpu::Buffer,
    q: wgpu::Buffer,
    kk: wgpu::Buffer,
    vv: wgpu::Buffer,
    att: wgpu::Buffer,
    o: wgpu::Buffer,
    gate: wgpu::Buffer,
    up: wgpu::Buffer,
    /// `(rows, n_vocab)` f32.
    pub logits: wgpu::Buffer,
}

impl Model {
    /// Check the tensors an architecture needs and bind them by name.
    pub async fn new(ctx: &GpuContext, weights: LoadedModel) -> Result<Self> {
        let hp = HParams::from_gguf(&weights.header)?;
        let has = |n: &str| weights.tensors.contains_key(n);
        let need = |n: String| -> Result<String> {
            if has(&n) {
                Ok(n)
            } else {
                Err(Error::new(ErrorCode::BadGguf, format!("the {} model lacks tensor {n}", hp.arch.name())))
            }
        };
        let opt = |n: String| if has(&n) { Some(n) } else { None };
        let mut layers = Vec::with_capacity(hp.n_layer as usize);
        for l in 0..hp.n_layer {
            let gemma = hp.arch == Arch::Gemma3;
            layers.push(Layer {
                attn_norm: need(T::AttnNorm.name(l))?,
                q: need(T::AttnQ.name(l))?,
                k: need(T::AttnK.name(l))?,
                v: need(T::AttnV.name(l))?,
                q_bias: opt(T::AttnQBias.name(l)),
                k_bias: opt(T::AttnKBias.name(l)),
                v_bias: opt(T::AttnVBias.name(l)),
                q_norm: if hp.qk_norm { Some(need(T::AttnQNorm.name(l))?) } else { None },
                k_norm: if hp.qk_norm { Some(need(T::AttnKNorm.name(l))?) } else { None },
                o: need(T::AttnOutput.name(l))?,
                post_attn_norm: if gemma { Some(need(T::PostAttentionNorm.name(l))?) } else { None },
                ffn_norm: need(T::FfnNorm.name(l))?,
                gate: need(T::FfnGate.name(l))?,
                up: need(T::FfnUp.name(l))?,
                down: need(T::FfnDown.name(l))?,
                post_ffw_norm: if gemma { Some(need(T::PostFfwNorm.name(l))?) } else { None },
            });
        }
        need(names::TOKEN_EMBD.to_string())?;
        need(names::OUTPUT_NORM.to_string())?;
        let output = if has(names::OUTPUT) { names::OUTPUT.to_string() } else { names::TOKEN_EMBD.to_string() };
        // Frequency factors: also kept on the CPU, because the context shift's cos/sin table
        // needs them.
        let ff = match weights.tensors.get(names::ROPE_FREQS) {
            Some(t) => {
                let v = crate::gpu::readback::read_f32(ctx, &t.parts[0].buffer, 0, (t.rows * t.cols) as usize).await?;
                if v.len() != hp.n_rot as usize / 2 {
                    return Err(Error::new(ErrorCode::BadGguf, format!("rope_freqs has {} factors, {} expected", v.len(), hp.n_rot / 2)));
                }
                Some(v)
            }
            None => None,
        };
        // One rope per layer: base (local or global), layout, frequency factors, and linear
        // scaling folded into the factors (angle * s = angle / (1 / s)).
        let layer_ropes: Vec<RopeConfig> = (0..hp.n_layer)
            .map(|l| {
                let swa = hp.is_swa(l);
                let mut r = RopeConfig::new(hp.head_dim as usize, if swa { hp.rope_base_swa } else { hp.rope_base }, hp.rope_type);
                r.n_rot = hp.n_rot as usize;
                let s = if swa { 1.0 } else { hp.rope_freq_scale };
                r.freq_factors = match (&ff, s != 1.0) {
                    (Some(f), _) => Some(f.iter().map(|x| x / s).collect()),
                    (None, true) => Some(vec![1.0 / s; hp.n_rot as usize / 2]),
                    (None, false) => None,
                };
                r
            })
            .collect();
        let mut rope_tables: Vec<RopeTable> = Vec::new();
        let mut layer_table = Vec::with_capacity(layer_ropes.len());
        for r in &layer_ropes {
            let i = match rope_tables.iter().position(|t| &t.config == r) {
                Some(i) => i,
                None => {
                    rope_tables.push(RopeTable::new(ctx, r)?);
                    rope_tables.len() - 1
                }
            };
            layer_table.push(i);
        }
        Ok(Model { hp, weights, layers, output, layer_ropes, layer_table, rope_tables })
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
        KvCache::new(
            ctx,
            KvCacheConfig {
                n_ctx,
                n_kv_heads: self.hp.n_head_kv,
                head_dim: self.hp.head_dim,
                layer_ropes: self.layer_ropes.clone(),
                shift_workgroup_size: None,
                max_scratch_cells: None,
            },
        )
    }

    /// Activation buffers for up to `max_batch` tokens and `max_logit_rows` rows of logits.
    pub fn workspace(&self, ctx: &GpuContext, max_batch: u32, max_logit_rows: u32) -> Result<Workspace> {
        let hp = &self.hp;
        let f = |label: &str, elems: u64| ctx.empty_storage(label, elems * 4);
        let b = max_batch as u64;
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
            ids: f("ids", b)?,
            x: f("x", b * hp.n_embd as u64)?,
            h: f("h", b * hp.n_embd as u64)?,
            q: f("q", b * hp.q_dim() as u64)?,
            kk: f("k", b * hp.kv_dim() as u64)?,
            vv: f("v", b * hp.kv_dim() as u64)?,
            att: f("attn", b * hp.q_dim() as u64)?,
            o: f("o", b * hp.n_embd as u64)?,
            gate: f("gate", b * hp.n_ff as u64)?,
            up: f("up", b * hp.n_ff as u64)?,
            logits: f("logits", max_logit_rows as u64 * hp.n_vocab as u64)?,
        })
    }

    /// Encode the forward pass of `tokens` at positions `pos0..`, writing their K/V into `kv`
    /// and logits into `ws.logits` (one row for `Last`, `tokens.len()` rows for `All`).
    /// The caller advances the cache (`kv.advance`) after submitting.
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
        let hp = &self.hp;
        let n = tokens.len() as u32;
        if n == 0 || n > ws.max_batch {
            return Err(Error::invalid(format!("a batch of {n} tokens (workspace holds {})", ws.max_batch)));
        }
        if rows == LogitRows::All && n > ws.max_logit_rows {
            return Err(Error::invalid(format!("{n} rows of logits (workspace holds {})", ws.max_logit_rows)));
        }
        if pos0 + n > kv.n_ctx() {
            return Err(Error::new(ErrorCode::ContextFull, format!("positions {pos0}..{} exceed the context of {}", pos0 + n, kv.n_ctx())));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t >= hp.n_vocab) {
            return Err(Error::invalid(format!("token id {bad} is outside the vocabulary of {}", hp.n_vocab)));
        }
        ctx.queue.write_buffer(&ws.ids, 0, bytemuck::cast_slice(tokens));
        // Params of this pass's ~300 dispatches share one arena, written at `ctx.submit`.
        ctx.begin_frame();
        let (e, qd, kvd, ff) = (hp.n_embd, hp.q_dim(), hp.kv_dim(), hp.n_ff);

        // x = embed(tokens) * embedding_scale                                   (n, n_embd)
        k::embed(ctx, enc, self.w(names::TOKEN_EMBD), &ws.ids, n, &ws.x, hp.embedding_scale)?;

        for (l, ly) in self.layers.iter().enumerate() {
            let rope = &self.rope_tables[self.layer_table[l]];
            // h = norm(x)
            k::rmsnorm(ctx, enc, &ws.x, Some(self.w(&ly.attn_norm)), &ws.h, n, e, hp.rms_eps)?;
            // q, k, v projections (+ bias)                              (n, q_dim), (n, kv_dim)
            k::matmul(ctx, enc, self.w(&ly.q), &ws.h, &ws.q, n)?;
            k::matmul(ctx, enc, self.w(&ly.k), &ws.h, &ws.kk, n)?;
            k::matmul(ctx, enc, self.w(&ly.v), &ws.h, &ws.vv, n)?;
            for (bias, buf, dim) in [(&ly.q_bias, &ws.q, qd), (&ly.k_bias, &ws.kk, kvd), (&ly.v_bias, &ws.vv, kvd)] {
                if let Some(b) = bias {
                    k::add_bias(ctx, enc, buf, self.w(b), n, dim)?;
                }
            }
            // Per-head QK-norm (Qwen3, Gemma 3).
            if let (Some(qn), Some(kn)) = (&ly.q_norm, &ly.k_norm) {
                k::rmsnorm(ctx, enc, &ws.q, Some(self.w(qn)), &ws.q, n * hp.n_head, hp.head_dim, hp.rms_eps)?;
                k::rmsnorm(ctx, enc, &ws.kk, Some(self.w(kn)), &ws.kk, n * hp.n_head_kv, hp.head_dim, hp.rms_eps)?;
            }
            // Rope q in place; rope k and write k, v into the cache at pos0..pos0+n.
            k::rope_q(ctx, enc, rope, &ws.q, n, hp.n_head, pos0)?;
            k::rope_kv_write(ctx, enc, rope, &ws.kk, &ws.vv, kv.k(l), kv.v(l), n, hp.n_head_kv, pos0)?;
            // Attention over the cache (causal, sliding window on SWA layers).     (n, q_dim)
            let window = if hp.is_swa(l as u32) { hp.sliding_window } else { 0 };
            k::attention(ctx, enc, hp, &ws.q, kv.k(l), kv.v(l), &ws.att, n, pos0, window)?;
            k::matmul(ctx, enc, self.w(&ly.o), &ws.att, &ws.o, n)?;
            if let Some(pn) = &ly.post_attn_norm {
                k::rmsnorm(ctx, enc, &ws.o, Some(self.w(pn)), &ws.o, n, e, hp.rms_eps)?;
            }
            k::add_scaled(ctx, enc, &ws.x, &ws.o, hp.residual_scale, n * e)?;
            // Feed-forward.
            k::rmsnorm(ctx, enc, &ws.x, Some(self.w(&ly.ffn_norm)), &ws.h, n, e, hp.rms_eps)?;
            k::matmul(ctx, enc, self.w(&ly.gate), &ws.h, &ws.gate, n)?;
            k::matmul(ctx, enc, self.w(&ly.up), &ws.h, &ws.up, n)?;
            k::glu(ctx, enc, &ws.gate, &ws.up, n * ff, hp.activation)?;
            k::matmul(ctx, enc, self.w(&ly.down), &ws.gate, &ws.o, n)?;
            if let Some(pn) = &ly.post_ffw_norm {
                k::rmsnorm(ctx, enc, &ws.o, Some(self.w(pn)), &ws.o, n, e, hp.rms_eps)?;
            }
            k::add_scaled(ctx, enc, &ws.x, &ws.o, hp.residual_scale, n * e)?;
        }

        // Final norm, then the output head on the rows that need logits.
        k::rmsnorm(ctx, enc, &ws.x, Some(self.w(names::OUTPUT_NORM)), &ws.h, n, e, hp.rms_eps)?;
        let out = self.w(&self.output);
        match rows {
            LogitRows::Last => k::matmul_at(ctx, enc, out, &ws.h, (n as u64 - 1) * e as u64, &ws.logits, 0, 1)?,
            LogitRows::All => k::matmul_at(ctx, enc, out, &ws.h, 0, &ws.logits, 0, n)?,
        }
        if hp.logit_scale != 1.0 {
            let r = if rows == LogitRows::Last { 1 } else { n };
            k::scale(ctx, enc, &ws.logits, 1.0 / hp.logit_scale, r * hp.n_vocab)?;
        }
        Ok(())
    }
}
