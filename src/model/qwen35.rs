//! Qwen3.5's gated delta-net layers (a child of `forward`, whose plan calls it for the layers
//! `full_attention_interval` marks recurrent):
//!
//! ```text
//! h = norm(x);  qkv, b, a = h W_qkv, h W_beta, h W_alpha;  z = h W_gate
//! q | k | v = silu(conv_{d_conv}(qkv))         causal, depthwise; rolling state in the cache
//! o = gated_delta(l2(q), l2(k), v; beta = sigmoid(b), g = softplus(a + dt_bias) * A)
//!                                              per value head, S x S state in the cache
//! x = x + (rmsnorm(o) * silu(z)) W_out;  then the SwiGLU feed-forward (post_attention_norm)
//! ```
//! The attention layers are the shared block with Qwen3.5's two changes: the q projection
//! carries a per-head output gate (attention's output times `sigmoid(gate)`), and the rope is
//! IMROPE, which for text is the partial NeoX rope (see `hparams.rs`).

use super::{kernels, projections, Layer, LoadedModel, Model, Proj, Workspace};
use crate::error::{Error, ErrorCode, Result};
use crate::gguf::GgmlType;
use crate::gpu::{GpuContext, Recorder};
use crate::kv::KvCache;
use crate::model::hparams::HParams;
use crate::model::names::LayerTensor as T;
use crate::ops::gated_delta::{self, DeltaShape, GatedDeltaBuffers};
use crate::ops::gated_delta_chunked;
use crate::ops::glu::Activation;
use crate::ops::ssm_conv::{self, SsmConvBuffers};

/// The weights of a gated delta-net layer.
pub(super) struct DeltaLayer {
    /// Writing qkv | beta | alpha side by side, `(n, conv_dim + 2 n_v_heads)`.
    in_proj: Vec<Proj>,
    /// Writing z into the first half of `(n, 2 value_dim)`.
    z: Vec<Proj>,
    /// `(conv_dim, d_conv)` f32, oldest tap first.
    conv: wgpu::Buffer,
    /// `dt_bias (n_v) | A (n_v) | norm weight (S)` f32, as `gated_delta` binds it.
    head_w: wgpu::Buffer,
    out: String,
}

/// The delta-net activations of a batch (models with recurrent layers only).
pub(super) struct DeltaWorkspace {
    /// `(n, conv_dim + 2 n_v_heads)`: qkv | beta | alpha projections.
    proj: wgpu::Buffer,
    /// `(n, conv_dim)`: the conv's output, q | k | v.
    conv: wgpu::Buffer,
    /// `(n, 2 value_dim)`: z, then the delta rule's normalised output (the GLU's two halves).
    zy: wgpu::Buffer,
}

impl DeltaWorkspace {
    pub(super) fn new(ctx: &GpuContext, hp: &HParams, max_batch: u32) -> Result<Self> {
        let b = max_batch as u64;
        let f = |label: &str, elems: u64| ctx.empty_storage(label, elems * 4);
        let (cd, vd, hv) = (
            hp.ssm_conv_dim() as u64,
            hp.ssm_value_dim() as u64,
            hp.ssm_n_v_heads as u64,
        );
        Ok(DeltaWorkspace {
            proj: f("delta proj", b * (cd + 2 * hv))?,
            conv: f("delta conv", b * cd)?,
            zy: f("delta zy", b * 2 * vd)?,
        })
    }
}

/// Batches of at least this many tokens run the delta rule in its chunked form
/// (`gated_delta_chunked`), smaller ones (decode) in the recurrent form
/// (`Model::delta_chunked_min`). Measured with `cera bench-delta` (16 key and 16 value heads of
/// 128, each form alone) on lavapipe: at 1 token the recurrent form is faster (10.6 against 13.4
/// ms), from 2 tokens the chunked one (2: 19.2 / 12.5 ms, 8: 61 / 31, 32: 241 / 119, 128:
/// 1041 / 472); `docs/benchmarking.md` has the table and the commands for a GPU.
pub const CHUNKED_MIN_TOKENS: u32 = 2;

/// The shape `gated_delta` runs with.
pub(super) fn delta_shape(hp: &HParams) -> DeltaShape {
    DeltaShape {
        n_k_heads: hp.ssm_n_k_heads,
        n_v_heads: hp.ssm_n_v_heads,
        head_dim: hp.ssm_d_state,
        eps: hp.rms_eps,
        norm_eps: hp.rms_eps,
    }
}

/// Bytes of one layer's conv state and delta state.
pub(super) fn state_bytes(hp: &HParams) -> (u64, u64) {
    (
        ssm_conv::state_bytes(hp.ssm_conv_dim(), hp.ssm_d_conv),
        delta_shape(hp).state_bytes(),
    )
}

/// The layer `l` of a Qwen3.5 file that is a gated delta-net.
pub(super) fn delta_layer(
    ctx: &GpuContext,
    weights: &LoadedModel,
    hp: &HParams,
    l: u32,
) -> Result<Layer> {
    let need = |t: T| -> Result<String> {
        let n = t.name(l);
        if weights.has(&n) {
            Ok(n)
        } else {
            Err(Error::new(
                ErrorCode::BadGguf,
                format!("the qwen35 model lacks tensor {n}"),
            ))
        }
    };
    let (cd, vd, hv, s) = (
        hp.ssm_conv_dim() as u64,
        hp.ssm_value_dim() as u64,
        hp.ssm_n_v_heads as u64,
        hp.ssm_d_state as u64,
    );
    // An f32 tensor of `elems` values in one part (the small per-layer vectors and the conv
    // kernel, which llama.cpp's quantizer keeps in f32).
    let f32_tensor = |name: &str, elems: u64| -> Result<&wgpu::Buffer> {
        let t = &weights.tensors[name];
        if t.ty != GgmlType::F32 || t.parts.len() != 1 || t.rows * t.cols != elems {
            return Err(Error::new(
                ErrorCode::BadGguf,
                format!(
                    "{name} is {} x {} {}, expected {elems} f32 values",
                    t.rows, t.cols, t.ty
                ),
            ));
        }
        Ok(&t.parts[0].buffer)
    };
    let kname = need(T::SsmConv1d)?;
    let k = &weights.tensors[&kname];
    if k.cols != hp.ssm_d_conv as u64 || k.rows != cd {
        return Err(Error::new(
            ErrorCode::BadGguf,
            format!(
                "{kname} is {} x {}, expected {} x {cd}",
                k.cols, k.rows, hp.ssm_d_conv
            ),
        ));
    }
    let taps = cd * hp.ssm_d_conv as u64;
    let conv = ctx.empty_storage("ssm_conv kernel", taps * 4)?;
    let head_w = ctx.empty_storage("gated_delta head weights", (2 * hv + s) * 4)?;
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(f32_tensor(&kname, taps)?, 0, &conv, 0, taps * 4);
    for (t, off, elems) in [
        (T::SsmDtBias, 0, hv),
        (T::SsmA, hv, hv),
        (T::SsmNorm, 2 * hv, s),
    ] {
        let name = need(t)?;
        enc.copy_buffer_to_buffer(f32_tensor(&name, elems)?, 0, &head_w, off * 4, elems * 4);
    }
    ctx.submit([enc.finish()]);
    let out = need(T::SsmOut)?;
    if weights.tensors[&out].cols != vd {
        return Err(Error::new(
            ErrorCode::BadGguf,
            format!(
                "{out} reads {} values, expected {vd}",
                weights.tensors[&out].cols
            ),
        ));
    }
    Ok(Layer {
        attn_norm: need(T::AttnNorm)?,
        qkv: Vec::new(),
        q_bias: None,
        k_bias: None,
        v_bias: None,
        q_norm: None,
        k_norm: None,
        o: String::new(),
        post_attn_norm: None,
        // Qwen3.5's feed-forward pre-norm is stored as `post_attention_norm`.
        ffn_norm: need(T::PostAttentionNorm)?,
        gate_up: projections(
            weights,
            &[need(T::FfnGate)?, need(T::FfnUp)?],
            &[hp.n_ff as u64, hp.n_ff as u64],
        )?,
        down: need(T::FfnDown)?,
        post_ffw_norm: None,
        qk_norm: None,
        conv: None,
        delta: Some(DeltaLayer {
            in_proj: projections(
                weights,
                &[need(T::AttnQkv)?, need(T::SsmBeta)?, need(T::SsmAlpha)?],
                &[cd, hv, hv],
            )?,
            z: projections(weights, &[need(T::AttnGate)?], &[vd])?,
            conv,
            head_w,
            out,
        }),
    })
}

impl Model {
    /// Prepare gated delta-net layer `l` of a batch of `n` (`ws.h` holds its pre-norm), its
    /// feed-forward block, and the next layer's pre-norm (or the final norm) into `ws.h`.
    pub(super) fn plan_delta_layer(
        &self,
        rec: &mut Recorder,
        ws: &Workspace,
        kv: &KvCache,
        l: usize,
        n: u32,
    ) -> Result<()> {
        let hp = &self.hp;
        let layer = &self.layers[l];
        let delta = layer.delta.as_ref().expect("a delta-net layer");
        let dws = ws
            .delta
            .as_ref()
            .ok_or_else(|| Error::internal("a workspace without the delta-net buffers"))?;
        let state = kv.recurrent(l).ok_or_else(|| {
            Error::internal(format!("layer {l} has no recurrent state in the cache"))
        })?;
        let (cd, vd, hv) = (
            hp.ssm_conv_dim() as u64,
            hp.ssm_value_dim() as u64,
            hp.ssm_n_v_heads as u64,
        );
        let step = &ws.step.buffer;
        // qkv | beta | alpha = h W, z = h W_gate                 (n, cd + 2 hv), (n, vd) of 2 vd
        for p in &delta.in_proj {
            kernels::matmul_cols(
                rec,
                self.w(&p.tensor),
                &ws.h,
                &dws.proj,
                p.col,
                cd + 2 * hv,
                n,
            )?;
        }
        for p in &delta.z {
            kernels::matmul_cols(rec, self.w(&p.tensor), &ws.h, &dws.zy, p.col, 2 * vd, n)?;
        }
        // q | k | v = silu(conv(qkv)), advancing the conv state                    (n, cd)
        let cb = SsmConvBuffers {
            src: &dws.proj,
            in_offset: 0,
            in_stride: cd + 2 * hv,
            weight: &delta.conv,
            state: &state.conv,
            out: &dws.conv,
        };
        ssm_conv::prepare(rec, &cb, n, cd as u32, hp.ssm_d_conv, 0, step)?;
        // o = rmsnorm(delta rule), into the second half of zy                       (n, vd)
        let db = GatedDeltaBuffers {
            qkv: &dws.conv,
            qkv_stride: cd,
            ba: &dws.proj,
            ba_offset: cd,
            ba_stride: cd + 2 * hv,
            head_w: &delta.head_w,
            state: &state.delta,
            out: &dws.zy,
            out_offset: vd,
            out_stride: 2 * vd,
        };
        let shape = delta_shape(hp);
        if n >= self.delta_chunked_min && gated_delta_chunked::supported(rec.ctx, shape.head_dim) {
            gated_delta_chunked::prepare(rec, &db, &shape, n, 0, step)?;
        } else {
            gated_delta::prepare(rec, &db, &shape, n, 0, step)?;
        }
        // y = (silu(z) * o) W_out                                                  (n, n_embd)
        kernels::glu_down(
            rec,
            self.w(&delta.out),
            &dws.zy,
            None,
            &ws.o,
            n,
            Activation::Silu,
            None,
            self.prefill_q8,
        )?;
        self.plan_ffn_block(rec, ws, l, n)
    }
}
