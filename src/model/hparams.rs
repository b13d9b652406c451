//! Hyperparameters from GGUF metadata, with llama.cpp's defaults where the file is silent.

use crate::error::{Error, ErrorCode, Result};
use crate::gguf::GgufHeader;
use crate::rope::RopeType;

/// The architectures cera-web runs. Anything else is `UNSUPPORTED_ARCH`, named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// LLaMA 2/3 (with `rope_freqs`), Mistral.
    Llama,
    /// Qwen2: QKV bias.
    Qwen2,
    /// Qwen3: per-head QK-norm.
    Qwen3,
    /// Granite: embedding, residual, attention and logit scales.
    Granite,
    /// SmolLM3: LLaMA with no rope on every fourth layer.
    Smollm3,
    /// Phi-3 / Phi-4-mini: q, k, v in one `attn_qkv` tensor, gate and up in one `ffn_up`, NeoX
    /// rope (partial where `rope.dimension_count` says so) with LongRoPE factors where present.
    Phi3,
    /// Gemma 2: embedding scale, post-attention/post-FFN norms, GeGLU, alternating sliding
    /// window, attention and final logit soft-capping.
    Gemma2,
    /// Gemma 3: embedding scale, QK-norm, post-attention/post-FFN norms, GeGLU, sliding window.
    Gemma3,
    /// LFM2 (Liquid): a hybrid of gated short-convolution layers and GQA attention layers with
    /// QK-norm, chosen per layer by `head_count_kv` (0 = convolution).
    Lfm2,
    /// Qwen3.5 (dense): a hybrid of gated delta-net layers (a causal conv over q|k|v, then the
    /// gated delta rule with a per-head recurrent state) and gated attention layers (QK-norm,
    /// partial NeoX rope, a per-head sigmoid output gate from the q projection), chosen by
    /// `full_attention_interval`.
    Qwen35,
}

impl Arch {
    pub fn from_name(name: &str) -> Result<Self> {
        Ok(match name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "granite" => Arch::Granite,
            "smollm3" => Arch::Smollm3,
            "phi3" => Arch::Phi3,
            "gemma2" => Arch::Gemma2,
            "gemma3" => Arch::Gemma3,
            "lfm2" => Arch::Lfm2,
            "qwen35" => Arch::Qwen35,
            other => {
                return Err(Error::new(
                    ErrorCode::UnsupportedArch,
                    format!("architecture \"{other}\" is not supported; cera-web runs llama, qwen2, qwen3, granite, smollm3, phi3, gemma2, gemma3, lfm2 and qwen35"),
                ))
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Granite => "granite",
            Arch::Smollm3 => "smollm3",
            Arch::Phi3 => "phi3",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Lfm2 => "lfm2",
            Arch::Qwen35 => "qwen35",
        }
    }
}

/// The feed-forward activation (SwiGLU or GeGLU), as the GLU kernel names it.
pub use crate::ops::glu::Activation;

#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    pub arch: Arch,
    pub n_vocab: u32,
    pub n_embd: u32,
    pub n_layer: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim: u32,
    pub n_ff: u32,
    pub n_ctx_train: u32,
    pub rms_eps: f32,
    pub rope_type: RopeType,
    pub n_rot: u32,
    pub rope_base: f32,
    /// Rope base of sliding-window layers (Gemma 3: 10000, not stored in the file).
    pub rope_base_swa: f32,
    /// Linear rope scaling of global layers (positions are multiplied by this).
    pub rope_freq_scale: f32,
    /// `rope.scaling.attn_factor`: multiplies the rotated pairs of q and k (Phi-3's LongRoPE);
    /// 1 when absent.
    pub rope_attn_factor: f32,
    /// `rope.scaling.original_context_length` (default: the training context): a context past
    /// it takes `rope_factors_long`, otherwise `rope_factors_short` (Phi-3's LongRoPE).
    pub n_ctx_orig: u32,
    /// 0 = no sliding window.
    pub sliding_window: u32,
    /// Layer `l` uses the sliding window when `l % pattern < pattern - 1` (Gemma 3: 6).
    pub swa_pattern: u32,
    pub embedding_scale: f32,
    pub residual_scale: f32,
    /// Multiplies q·k (default 1/sqrt(head_dim)).
    pub attention_scale: f32,
    /// Logits are divided by this (Granite); 1 elsewhere.
    pub logit_scale: f32,
    pub activation: Activation,
    pub qk_norm: bool,
    pub post_norms: bool,
    pub qkv_bias: bool,
    /// Layer `l` has no rope when `(l + 1) % no_rope_step == 0` (SmolLM3: 4); 0 = rope everywhere.
    pub no_rope_step: u32,
    /// Attention logits become `cap * tanh(logit / cap)` (Gemma 2: 50); 0 = none.
    pub attn_softcap: f32,
    /// Output logits become `cap * tanh(logit / cap)` (Gemma 2: 30); 0 = none.
    pub final_softcap: f32,
    /// Width of the short convolution (`shortconv.l_cache`, LFM2: 3); 0 when no layer has one.
    pub conv_l_cache: u32,
    /// Per layer: a short-convolution layer (LFM2, `head_count_kv` 0) instead of attention.
    pub conv_layers: Vec<bool>,
    /// Qwen3.5: the q projection writes each head's q then its output gate (`2 head_dim` rows
    /// per head), and attention's output is multiplied by `sigmoid(gate)`.
    pub attn_gate: bool,
    /// Gated delta-net shape (Qwen3.5; all 0 elsewhere): conv width (`ssm.conv_kernel`), head
    /// size of keys and values (`ssm.state_size`), key heads (`ssm.group_count`), value heads
    /// (`ssm.time_step_rank`).
    pub ssm_d_conv: u32,
    pub ssm_d_state: u32,
    pub ssm_n_k_heads: u32,
    pub ssm_n_v_heads: u32,
    /// Per layer: a gated delta-net layer (recurrent) instead of attention.
    pub recurrent_layers: Vec<bool>,
}

impl HParams {
    pub fn from_gguf(h: &GgufHeader) -> Result<Self> {
        let arch_name = h.architecture().ok_or_else(|| {
            Error::new(ErrorCode::BadGguf, "the GGUF has no general.architecture")
        })?;
        let arch = Arch::from_name(arch_name)?;
        let a = arch.name();
        let key = |k: &str| format!("{a}.{k}");
        let need = |k: &str| {
            h.get_u32(&key(k)).ok_or_else(|| {
                Error::new(
                    ErrorCode::BadGguf,
                    format!("the GGUF lacks {} (needed for {a})", key(k)),
                )
            })
        };
        let n_embd = need("embedding_length")?;
        let n_head = need("attention.head_count")?;
        let n_layer = need("block_count")?;
        let n_ff = need("feed_forward_length")?;
        // LFM2 writes head_count_kv per layer (0 on its convolution layers).
        let per_layer_kv =
            u32_array(h, &key("attention.head_count_kv")).filter(|v| v.len() == n_layer as usize);
        let n_head_kv = match &per_layer_kv {
            Some(v) => v.iter().copied().max().unwrap_or(0),
            None => h.get_u32(&key("attention.head_count_kv")).unwrap_or(n_head),
        };
        if let Some(v) = &per_layer_kv {
            if v.iter().any(|&k| k != 0 && k != n_head_kv) {
                return Err(Error::new(
                    ErrorCode::BadGguf,
                    format!(
                        "attention layers with different KV head counts ({v:?}) are not supported"
                    ),
                ));
            }
        }
        let head_dim = h
            .get_u32(&key("attention.key_length"))
            .unwrap_or(n_embd / n_head.max(1));
        if n_head == 0
            || n_head_kv == 0
            || n_head % n_head_kv != 0
            || head_dim == 0
            || !head_dim.is_multiple_of(2)
        {
            return Err(Error::new(
                ErrorCode::BadGguf,
                format!("inconsistent attention shape: {n_head} heads, {n_head_kv} KV heads, head_dim {head_dim}"),
            ));
        }
        let n_vocab = h
            .get_u32(&key("vocab_size"))
            .or_else(|| {
                h.get_str_array("tokenizer.ggml.tokens")
                    .map(|t| t.len() as u32)
            })
            .or_else(|| {
                h.tensor("token_embd.weight")
                    .and_then(|t| t.dims.get(1).map(|&d| d as u32))
            })
            .ok_or_else(|| Error::new(ErrorCode::BadGguf, "cannot tell the vocabulary size"))?;
        let rms_eps = h
            .get_f32(&key("attention.layer_norm_rms_epsilon"))
            .unwrap_or(1e-5);
        let rope_type = match arch {
            Arch::Llama | Arch::Granite | Arch::Smollm3 => RopeType::Norm,
            Arch::Qwen2
            | Arch::Qwen3
            | Arch::Phi3
            | Arch::Gemma2
            | Arch::Gemma3
            | Arch::Lfm2
            | Arch::Qwen35 => RopeType::Neox,
        };
        let n_rot = h.get_u32(&key("rope.dimension_count")).unwrap_or(head_dim);
        let rope_base = h.get_f32(&key("rope.freq_base")).unwrap_or(10000.0);
        let scaling = h.get_str(&key("rope.scaling.type")).unwrap_or("none");
        let factor = h.get_f32(&key("rope.scaling.factor")).unwrap_or(1.0);
        let rope_freq_scale = match scaling {
            "linear" if factor > 0.0 => 1.0 / factor,
            _ => 1.0,
        };
        let n_ctx_train = h.get_u32(&key("context_length")).unwrap_or(4096);
        let rope_attn_factor = h.get_f32(&key("rope.scaling.attn_factor")).unwrap_or(1.0);
        if !(rope_attn_factor.is_finite() && rope_attn_factor > 0.0) {
            return Err(Error::new(
                ErrorCode::BadGguf,
                format!(
                    "{} is {rope_attn_factor} (must be finite and positive)",
                    key("rope.scaling.attn_factor")
                ),
            ));
        }
        if n_rot > head_dim || !n_rot.is_multiple_of(2) {
            return Err(Error::new(
                ErrorCode::BadGguf,
                format!(
                    "{} is {n_rot} (must be even and at most head_dim {head_dim})",
                    key("rope.dimension_count")
                ),
            ));
        }
        let mut hp = HParams {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_ctx_train,
            rms_eps,
            rope_type,
            n_rot,
            rope_base,
            rope_base_swa: rope_base,
            rope_freq_scale,
            rope_attn_factor,
            n_ctx_orig: h
                .get_u32(&key("rope.scaling.original_context_length"))
                .unwrap_or(n_ctx_train),
            sliding_window: 0,
            swa_pattern: 1,
            embedding_scale: 1.0,
            residual_scale: 1.0,
            attention_scale: 1.0 / (head_dim as f32).sqrt(),
            logit_scale: 1.0,
            activation: Activation::Silu,
            qk_norm: false,
            post_norms: false,
            qkv_bias: false,
            no_rope_step: 0,
            attn_softcap: 0.0,
            final_softcap: 0.0,
            conv_l_cache: 0,
            conv_layers: vec![false; n_layer as usize],
            attn_gate: false,
            ssm_d_conv: 0,
            ssm_d_state: 0,
            ssm_n_k_heads: 0,
            ssm_n_v_heads: 0,
            recurrent_layers: vec![false; n_layer as usize],
        };
        match arch {
            Arch::Llama => {}
            // llama.cpp fixes the step at 4 (no GGUF key).
            Arch::Smollm3 => hp.no_rope_step = 4,
            Arch::Qwen2 => hp.qkv_bias = true,
            // llama.cpp ignores Phi-3's `attention.sliding_window` (every layer attends to the
            // whole context), and so do we: the file's window is left unread.
            Arch::Phi3 => {}
            Arch::Qwen3 => hp.qk_norm = true,
            Arch::Granite => {
                hp.embedding_scale = h.get_f32(&key("embedding_scale")).unwrap_or(1.0);
                hp.residual_scale = h.get_f32(&key("residual_scale")).unwrap_or(1.0);
                hp.attention_scale = h
                    .get_f32(&key("attention.scale"))
                    .unwrap_or(hp.attention_scale);
                hp.logit_scale = h.get_f32(&key("logit_scale")).unwrap_or(1.0);
            }
            Arch::Gemma3 => {
                hp.embedding_scale = (n_embd as f32).sqrt();
                hp.activation = Activation::GeluTanh;
                hp.qk_norm = true;
                hp.post_norms = true;
                hp.sliding_window = h.get_u32(&key("attention.sliding_window")).unwrap_or(0);
                // llama.cpp: 5 sliding-window layers then 1 global; local rope base 10000.
                hp.swa_pattern = h
                    .get_u32(&key("attention.sliding_window_pattern"))
                    .unwrap_or(6);
                hp.rope_base_swa = h.get_f32(&key("rope.freq_base_swa")).unwrap_or(10000.0);
                // llama.cpp scales Q by 1/sqrt(head_dim) for every size but 27B, whose
                // query_pre_attn_scalar is n_embd / n_head.
                if n_layer == 62 {
                    hp.attention_scale = 1.0 / ((n_embd / n_head) as f32).sqrt();
                }
            }
            Arch::Gemma2 => {
                hp.embedding_scale = (n_embd as f32).sqrt();
                hp.activation = Activation::GeluTanh;
                hp.post_norms = true;
                // llama.cpp: window 4096 and every other layer sliding (pattern 2) unless the
                // file says otherwise; the local rope base is the global one.
                hp.sliding_window = h.get_u32(&key("attention.sliding_window")).unwrap_or(4096);
                hp.swa_pattern = h
                    .get_u32(&key("attention.sliding_window_pattern"))
                    .unwrap_or(2);
                hp.rope_base_swa = h.get_f32(&key("rope.freq_base_swa")).unwrap_or(rope_base);
                hp.attn_softcap = h.get_f32(&key("attn_logit_softcapping")).unwrap_or(50.0);
                hp.final_softcap = h.get_f32(&key("final_logit_softcapping")).unwrap_or(30.0);
                // 27B (46 layers) scales by n_embd / n_head, the others by head_dim.
                if n_layer == 46 {
                    hp.attention_scale = 1.0 / ((n_embd / n_head) as f32).sqrt();
                }
            }
            Arch::Lfm2 => {
                hp.qk_norm = true;
                hp.rms_eps = h
                    .get_f32(&key("attention.layer_norm_rms_epsilon"))
                    .ok_or_else(|| {
                        Error::new(
                            ErrorCode::BadGguf,
                            format!(
                                "the GGUF lacks {} (needed for lfm2)",
                                key("attention.layer_norm_rms_epsilon")
                            ),
                        )
                    })?;
                hp.conv_l_cache = need("shortconv.l_cache")?;
                hp.conv_layers = match &per_layer_kv {
                    Some(v) => v.iter().map(|&k| k == 0).collect(),
                    None => vec![false; n_layer as usize],
                };
                // Optional (LFM2.5-style files): every attention layer slides.
                hp.sliding_window = h.get_u32(&key("attention.sliding_window")).unwrap_or(0);
                // The conv block's input projection gives (B, C, x) of n_embd each, and attention
                // projects back from n_head * head_dim = n_embd (llama.cpp checks both shapes).
                if hp.conv_l_cache < 2 || hp.q_dim() != n_embd {
                    return Err(Error::new(
                        ErrorCode::BadGguf,
                        format!("lfm2: shortconv.l_cache {} (at least 2) and n_head * head_dim {} (must equal n_embd {n_embd})", hp.conv_l_cache, hp.q_dim()),
                    ));
                }
            }
            Arch::Qwen35 => {
                hp.qk_norm = true;
                hp.attn_gate = true;
                hp.ssm_d_conv = need("ssm.conv_kernel")?;
                hp.ssm_d_state = need("ssm.state_size")?;
                hp.ssm_n_k_heads = need("ssm.group_count")?;
                hp.ssm_n_v_heads = need("ssm.time_step_rank")?;
                let d_inner = need("ssm.inner_size")?;
                // llama.cpp: 4 when the key is absent; layer l is recurrent unless
                // (l + 1) % interval == 0.
                let interval = h.get_u32(&key("full_attention_interval")).unwrap_or(4);
                let (s, hk, hv) = (hp.ssm_d_state, hp.ssm_n_k_heads, hp.ssm_n_v_heads);
                // Keys and values share the head size (the state is S x S per value head), and
                // value heads take key heads in turn (h % n_k_heads), so n_v is a multiple.
                if interval == 0
                    || hp.ssm_d_conv == 0
                    || s == 0
                    || hk == 0
                    || hv == 0
                    || hv % hk != 0
                    || d_inner != s * hv
                {
                    return Err(Error::new(
                        ErrorCode::BadGguf,
                        format!("qwen35: inconsistent delta-net shape (conv_kernel {}, state_size {s}, group_count {hk}, time_step_rank {hv}, inner_size {d_inner}, full_attention_interval {interval})", hp.ssm_d_conv),
                    ));
                }
                // Multi-token-prediction blocks (`nextn_predict_layers`) follow the trunk's
                // layers in the file; llama.cpp runs them only for drafting, and so they are
                // left unread here.
                let nextn = h.get_u32(&key("nextn_predict_layers")).unwrap_or(0);
                if nextn >= n_layer {
                    return Err(Error::new(
                        ErrorCode::BadGguf,
                        format!("qwen35: {nextn} prediction layers of {n_layer} blocks"),
                    ));
                }
                hp.n_layer = n_layer - nextn;
                hp.conv_layers.truncate(hp.n_layer as usize);
                // `attention.recurrent_layers` (per block) when present, else the interval.
                hp.recurrent_layers = match h.get_array(&key("attention.recurrent_layers")) {
                    Some(crate::gguf::MetaArray::Bool(v)) if v.len() >= hp.n_layer as usize => {
                        v[..hp.n_layer as usize].to_vec()
                    }
                    Some(_) => {
                        return Err(Error::new(
                            ErrorCode::BadGguf,
                            format!(
                                "{} must be one bool per block",
                                key("attention.recurrent_layers")
                            ),
                        ))
                    }
                    None => (0..hp.n_layer).map(|l| (l + 1) % interval != 0).collect(),
                };
                check_text_imrope(h, &key("rope.dimension_sections"), n_rot)?;
            }
        }
        Ok(hp)
    }

    /// Whether layer `l` is a gated delta-net (recurrent) layer (Qwen3.5) rather than attention.
    pub fn is_recurrent(&self, l: u32) -> bool {
        self.recurrent_layers
            .get(l as usize)
            .copied()
            .unwrap_or(false)
    }

    /// Rows of the q projection: `q_dim`, or twice that where each head carries its output gate.
    pub fn q_proj_dim(&self) -> u32 {
        if self.attn_gate {
            2 * self.q_dim()
        } else {
            self.q_dim()
        }
    }

    /// Columns of the fused q|k|v projection output.
    pub fn qkv_width(&self) -> u32 {
        self.q_proj_dim() + 2 * self.kv_dim()
    }

    /// Gated delta-net: key (and value head) size, channels of the conv (q | k | v), value
    /// channels.
    pub fn ssm_conv_dim(&self) -> u32 {
        self.ssm_d_state * (2 * self.ssm_n_k_heads + self.ssm_n_v_heads)
    }
    pub fn ssm_value_dim(&self) -> u32 {
        self.ssm_d_state * self.ssm_n_v_heads
    }

    /// Whether layer `l` attends through the sliding window.
    pub fn is_swa(&self, l: u32) -> bool {
        if self.arch == Arch::Lfm2 {
            return self.sliding_window > 0 && !self.is_conv(l);
        }
        self.sliding_window > 0
            && self.swa_pattern > 1
            && l % self.swa_pattern < self.swa_pattern - 1
    }

    /// Whether layer `l` applies rope to q and k (SmolLM3 leaves it out on every fourth layer).
    pub fn uses_rope(&self, l: u32) -> bool {
        self.no_rope_step == 0 || !(l + 1).is_multiple_of(self.no_rope_step)
    }

    /// Whether layer `l` is a short-convolution layer (LFM2) rather than attention.
    pub fn is_conv(&self, l: u32) -> bool {
        self.conv_layers.get(l as usize).copied().unwrap_or(false)
    }

    pub fn kv_dim(&self) -> u32 {
        self.n_head_kv * self.head_dim
    }

    pub fn q_dim(&self) -> u32 {
        self.n_head * self.head_dim
    }

    /// Whether a context of `n_ctx` cells takes LongRoPE's long factors: llama.cpp rounds the
    /// context up to a multiple of 256, then compares it with the original context length.
    pub fn long_rope(&self, n_ctx: u32) -> bool {
        n_ctx.checked_next_multiple_of(256).unwrap_or(u32::MAX) > self.n_ctx_orig
    }
}

/// Qwen3.5's interleaved multi-section rope (llama.cpp's IMROPE) for text: the position of a
/// text token is given to the first three sections and 0 to the fourth, and rotary pair `i`
/// takes section `s = i % sum(sections)` by `s % 3` (0: first, 1: second, 2: third) while
/// `s < 3 * that section's size`, the fourth otherwise. When no pair falls to the fourth, every
/// pair turns by the token's position: the NeoX rope over `n_rot` dimensions, which is how it
/// runs here. Files whose sections send a pair to the fourth (none known) are refused.
fn check_text_imrope(h: &GgufHeader, key: &str, n_rot: u32) -> Result<()> {
    let Some(sec) = u32_array(h, key) else {
        return Ok(());
    };
    let sec: Vec<u32> = sec
        .into_iter()
        .chain(std::iter::repeat(0))
        .take(4)
        .collect();
    let total: u32 = sec.iter().sum();
    if total == 0 {
        return Err(Error::new(ErrorCode::BadGguf, format!("{key} is all zero")));
    }
    for i in 0..n_rot / 2 {
        let s = i % total;
        let section = (s % 3) as usize;
        if s >= 3 * sec[section] {
            return Err(Error::new(
                ErrorCode::UnsupportedArch,
                format!("{key} {sec:?}: rotary pair {i} would take the fourth (image) position; only text sections are supported"),
            ));
        }
    }
    Ok(())
}

/// An integer array key as u32s (gguf-py writes Python ints as INT32, other writers UINT32).
fn u32_array(h: &GgufHeader, key: &str) -> Option<Vec<u32>> {
    use crate::gguf::MetaArray as A;
    let v: Vec<u32> = match h.get_array(key)? {
        A::U8(v) => v.iter().map(|&x| x as u32).collect(),
        A::U16(v) => v.iter().map(|&x| x as u32).collect(),
        A::U32(v) => v.clone(),
        A::U64(v) => v
            .iter()
            .map(|&x| u32::try_from(x).ok())
            .collect::<Option<_>>()?,
        A::I8(v) => v
            .iter()
            .map(|&x| u32::try_from(x).ok())
            .collect::<Option<_>>()?,
        A::I16(v) => v
            .iter()
            .map(|&x| u32::try_from(x).ok())
            .collect::<Option<_>>()?,
        A::I32(v) => v
            .iter()
            .map(|&x| u32::try_from(x).ok())
            .collect::<Option<_>>()?,
        A::I64(v) => v
            .iter()
            .map(|&x| u32::try_from(x).ok())
            .collect::<Option<_>>()?,
        _ => return None,
    };
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phi3_reads_longrope_keys_and_ignores_the_window() {
        let bytes = include_bytes!("../../tests/fixtures/models/phi3-F32.gguf");
        let (h, _) = crate::gguf::parse_bytes(bytes).unwrap();
        let hp = HParams::from_gguf(&h).unwrap();
        assert_eq!(hp.arch, Arch::Phi3);
        assert_eq!((hp.head_dim, hp.n_rot, hp.n_ctx_orig), (16, 12, 32));
        assert!(
            (hp.rope_attn_factor - 1.1832).abs() < 1e-4,
            "{}",
            hp.rope_attn_factor
        );
        // The file says 8; llama.cpp attends to the whole context on Phi-3.
        assert_eq!(hp.sliding_window, 0);
        assert!(!hp.is_swa(0));
        // llama.cpp rounds the context up to 256 before comparing with the original length.
        let mut hp = hp;
        hp.n_ctx_orig = 4096;
        for (n_ctx, long) in [(1, false), (4096, false), (4097, true), (u32::MAX, true)] {
            assert_eq!(hp.long_rope(n_ctx), long, "{n_ctx}");
        }
        hp.n_ctx_orig = 300;
        assert!(!hp.long_rope(256) && hp.long_rope(257));
    }

    #[test]
    fn qwen35_reads_the_delta_net_shape() {
        let bytes = include_bytes!("../../tests/fixtures/models/qwen35-F32.gguf");
        let (h, _) = crate::gguf::parse_bytes(bytes).unwrap();
        let hp = HParams::from_gguf(&h).unwrap();
        assert_eq!(hp.arch, Arch::Qwen35);
        assert_eq!(
            (
                hp.ssm_d_conv,
                hp.ssm_d_state,
                hp.ssm_n_k_heads,
                hp.ssm_n_v_heads
            ),
            (4, 16, 2, 4)
        );
        assert_eq!(hp.recurrent_layers, [true, false, true, false]);
        assert_eq!((hp.ssm_conv_dim(), hp.ssm_value_dim()), (128, 64));
        assert!(hp.attn_gate && hp.qk_norm && hp.rope_type == RopeType::Neox);
        assert_eq!((hp.n_rot, hp.q_proj_dim(), hp.qkv_width()), (8, 128, 192));
    }

    /// A Qwen3.5 header with `nextn_predict_layers` (a multi-token-prediction block after the
    /// trunk) and, optionally, `attention.recurrent_layers`.
    fn qwen35_header(recurrent: Option<Vec<bool>>) -> Vec<u8> {
        let mut w = crate::gguf::GgufWriter::new();
        w.meta("general.architecture", "qwen35");
        for (k, v) in [
            ("embedding_length", 64u32),
            ("block_count", 5),
            ("feed_forward_length", 128),
            ("attention.head_count", 4),
            ("attention.head_count_kv", 2),
            ("attention.key_length", 16),
            ("vocab_size", 512),
            ("ssm.conv_kernel", 4),
            ("ssm.state_size", 16),
            ("ssm.group_count", 2),
            ("ssm.time_step_rank", 4),
            ("ssm.inner_size", 64),
            ("nextn_predict_layers", 1),
        ] {
            w.meta(format!("qwen35.{k}"), v);
        }
        if let Some(r) = recurrent {
            w.meta(
                "qwen35.attention.recurrent_layers",
                crate::gguf::MetaArray::Bool(r),
            );
        }
        w.to_bytes()
    }

    #[test]
    fn qwen35_trunk_layers_and_recurrent_flags() {
        // No interval key: llama.cpp's default of 4; the prediction block is not a layer.
        let bytes = qwen35_header(None);
        let hp = HParams::from_gguf(&crate::gguf::parse_bytes(&bytes).unwrap().0).unwrap();
        assert_eq!(hp.n_layer, 4);
        assert_eq!(hp.recurrent_layers, [true, true, true, false]);
        // The per-block flags win (the prediction block's is dropped).
        let bytes = qwen35_header(Some(vec![false, true, false, true, false]));
        let hp = HParams::from_gguf(&crate::gguf::parse_bytes(&bytes).unwrap().0).unwrap();
        assert_eq!(hp.recurrent_layers, [false, true, false, true]);
        // Too few flags are refused, named.
        let bytes = qwen35_header(Some(vec![true; 3]));
        let e = HParams::from_gguf(&crate::gguf::parse_bytes(&bytes).unwrap().0).unwrap_err();
        assert!(e.message.contains("recurrent_layers"), "{e}");
    }

    #[test]
    fn unsupported_architectures_are_named() {
        for name in ["qwen3next", "phi2", "lfm2moe"] {
            let e = Arch::from_name(name).unwrap_err();
            assert_eq!(e.code, ErrorCode::UnsupportedArch);
            assert!(e.message.contains(&format!("\"{name}\"")), "{e}");
        }
        for name in [
            "llama", "qwen2", "qwen3", "granite", "smollm3", "phi3", "gemma2", "gemma3", "lfm2",
            "qwen35",
        ] {
            assert_eq!(Arch::from_name(name).unwrap().name(), name);
        }
    }
}
