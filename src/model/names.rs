//! GGUF tensor names, in one table (llama.cpp's `LLM_TENSOR_NAMES`).

pub const TOKEN_EMBD: &str = "token_embd.weight";
pub const OUTPUT_NORM: &str = "output_norm.weight";
pub const OUTPUT: &str = "output.weight";
pub const ROPE_FREQS: &str = "rope_freqs.weight";
/// Phi-3 LongRoPE: per rotary pair frequency divisors for a context past the original one.
pub const ROPE_FACTORS_LONG: &str = "rope_factors_long.weight";
/// Phi-3 LongRoPE: the divisors for a context within the original one.
pub const ROPE_FACTORS_SHORT: &str = "rope_factors_short.weight";
/// LFM2's final norm: llama.cpp's converter writes it under this name (`LLM_TENSOR_OUTPUT_NORM_LFM2`).
pub const OUTPUT_NORM_LFM2: &str = "token_embd_norm.weight";

/// Per-layer tensors: `blk.{l}.{suffix}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerTensor {
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    /// Phi-3: q, k and v in one tensor, `n_embd -> q_dim + 2 kv_dim` (rows in that order).
    AttnQkv,
    AttnQBias,
    AttnKBias,
    AttnVBias,
    AttnQNorm,
    AttnKNorm,
    AttnOutput,
    PostAttentionNorm,
    FfnNorm,
    FfnGate,
    /// `n_embd -> n_ff`; Phi-3's is `n_embd -> 2 n_ff`, gate rows then up rows.
    FfnUp,
    FfnDown,
    PostFfwNorm,
    /// LFM2 short convolution: depthwise kernel `(n_embd, l_cache)`, f32.
    ShortConv,
    /// LFM2 short convolution: input projection `n_embd -> 3 n_embd` (B, C, x).
    ShortConvInProj,
    /// LFM2 short convolution: output projection `n_embd -> n_embd`.
    ShortConvOutProj,
    /// Qwen3.5 delta-net: the output gate projection `n_embd -> value_dim` (z).
    AttnGate,
    /// Qwen3.5 delta-net: depthwise causal conv over q | k | v, `(conv_dim, d_conv)` f32.
    SsmConv1d,
    /// Qwen3.5 delta-net: per value head bias of the decay's softplus.
    SsmDtBias,
    /// Qwen3.5 delta-net: per value head decay rate `A = -exp(A_log)` (negative).
    SsmA,
    /// Qwen3.5 delta-net: `n_embd -> n_v_heads`, the write strength (sigmoid).
    SsmBeta,
    /// Qwen3.5 delta-net: `n_embd -> n_v_heads`, the decay's input.
    SsmAlpha,
    /// Qwen3.5 delta-net: the gated RMS norm's weight, `(head_dim)`.
    SsmNorm,
    /// Qwen3.5 delta-net: output projection `value_dim -> n_embd`.
    SsmOut,
}

impl LayerTensor {
    pub fn suffix(self) -> &'static str {
        use LayerTensor::*;
        match self {
            AttnNorm => "attn_norm.weight",
            AttnQ => "attn_q.weight",
            AttnK => "attn_k.weight",
            AttnV => "attn_v.weight",
            AttnQkv => "attn_qkv.weight",
            AttnQBias => "attn_q.bias",
            AttnKBias => "attn_k.bias",
            AttnVBias => "attn_v.bias",
            AttnQNorm => "attn_q_norm.weight",
            AttnKNorm => "attn_k_norm.weight",
            AttnOutput => "attn_output.weight",
            PostAttentionNorm => "post_attention_norm.weight",
            FfnNorm => "ffn_norm.weight",
            FfnGate => "ffn_gate.weight",
            FfnUp => "ffn_up.weight",
            FfnDown => "ffn_down.weight",
            PostFfwNorm => "post_ffw_norm.weight",
            ShortConv => "shortconv.conv.weight",
            ShortConvInProj => "shortconv.in_proj.weight",
            ShortConvOutProj => "shortconv.out_proj.weight",
            AttnGate => "attn_gate.weight",
            SsmConv1d => "ssm_conv1d.weight",
            SsmDtBias => "ssm_dt.bias",
            SsmA => "ssm_a",
            SsmBeta => "ssm_beta.weight",
            SsmAlpha => "ssm_alpha.weight",
            SsmNorm => "ssm_norm.weight",
            SsmOut => "ssm_out.weight",
        }
    }

    pub fn name(self, layer: u32) -> String {
        format!("blk.{layer}.{}", self.suffix())
    }
}
