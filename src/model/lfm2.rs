//! LFM2's short-convolution layers (a child of `forward`, whose plan calls it for the layers
//! the GGUF marks with `head_count_kv` 0):
//!
//! ```text
//! h = norm(x);  B, C, x' = thirds of h W_in              (n, 3 n_embd)
//! y = C * conv_L(B * x')   causal, depthwise, width L = shortconv.l_cache, state in the cache
//! x = x + y W_out;  then the same SwiGLU feed-forward as the attention layers
//! ```
//! The attention layers are the shared block (QK-norm, NeoX rope, no bias).

use super::{kernels, projections, Layer, LoadedModel, Model, Workspace};
use crate::error::{Error, ErrorCode, Result};
use crate::gguf::GgmlType;
use crate::gpu::{GpuContext, Recorder};
use crate::kv::KvCache;
use crate::model::hparams::HParams;
use crate::model::names::LayerTensor as T;
use crate::ops::short_conv::{self, ShortConvBuffers};

/// The weights of a short-convolution layer.
pub(super) struct ConvLayer {
    /// `(n_embd, l_cache)` f32, oldest tap first.
    kernel: wgpu::Buffer,
    in_proj: String,
    out_proj: String,
}

/// The layer `l` of an LFM2 file that is a short convolution. It has no attention tensors: the
/// attention names stay empty and are never looked up (the plan takes the conv branch first).
pub(super) async fn conv_layer(
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
                format!("the lfm2 model lacks tensor {n}"),
            ))
        }
    };
    let kname = need(T::ShortConv)?;
    let k = &weights.tensors[&kname];
    let (e, taps) = (hp.n_embd as u64, hp.conv_l_cache as u64);
    if k.cols != taps || k.rows != e {
        return Err(Error::new(
            ErrorCode::BadGguf,
            format!("{kname} is {} x {}, expected {taps} x {e}", k.cols, k.rows),
        ));
    }
    let kernel = match (k.ty, k.parts.len()) {
        // Rows of 4-byte values are stored back to back: bind a copy of the buffer as it is.
        (GgmlType::F32, 1) => {
            let buf = ctx.empty_storage("shortconv kernel", e * taps * 4)?;
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(&k.parts[0].buffer, 0, &buf, 0, e * taps * 4);
            ctx.submit([enc.finish()]);
            buf
        }
        // Any other type: dequantize the tiny kernel once on the CPU (rows padded to 4 bytes).
        _ => {
            let mut out = Vec::with_capacity((e * taps) as usize);
            for part in &k.parts {
                let raw = crate::gpu::readback::read_buffer(
                    ctx,
                    &part.buffer,
                    0,
                    part.rows * k.row_bytes,
                )
                .await?;
                let gguf_row =
                    k.ty.row_bytes(taps).ok_or_else(|| {
                        Error::new(ErrorCode::BadGguf, format!("{kname}: bad row"))
                    })? as usize;
                if !matches!(k.ty, GgmlType::F16 | GgmlType::BF16 | GgmlType::F32) {
                    return Err(Error::new(
                        ErrorCode::UnsupportedQuant,
                        format!(
                            "{kname} is {}: the conv kernel must be f32, f16 or bf16",
                            k.ty
                        ),
                    ));
                }
                for r in raw.chunks_exact(k.row_bytes as usize) {
                    let v = crate::quant::dequantize_to_vec(k.ty, &r[..gguf_row])
                        .map_err(|e| Error::new(ErrorCode::BadGguf, format!("{kname}: {e}")))?;
                    out.extend(v);
                }
            }
            ctx.storage_buffer("shortconv kernel", bytemuck::cast_slice(&out))
        }
    };
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
        ffn_norm: need(T::FfnNorm)?,
        gate_up: projections(
            weights,
            &[need(T::FfnGate)?, need(T::FfnUp)?],
            &[hp.n_ff as u64, hp.n_ff as u64],
        )?,
        down: need(T::FfnDown)?,
        post_ffw_norm: None,
        qk_norm: None,
        delta: None,
        conv: Some(ConvLayer {
            kernel,
            in_proj: need(T::ShortConvInProj)?,
            out_proj: need(T::ShortConvOutProj)?,
        }),
    })
}

impl Model {
    /// Prepare short-convolution layer `l` of a batch of `n` (`ws.h` holds its pre-norm), its
    /// feed-forward block, and the next layer's pre-norm (or the final norm) into `ws.h`.
    pub(super) fn plan_conv_layer(
        &self,
        rec: &mut Recorder,
        ws: &Workspace,
        kv: &KvCache,
        l: usize,
        n: u32,
    ) -> Result<()> {
        let hp = &self.hp;
        let layer = &self.layers[l];
        let conv = layer.conv.as_ref().expect("a conv layer");
        let e = hp.n_embd;
        let bcx = ws
            .bcx
            .as_ref()
            .ok_or_else(|| Error::internal("a workspace without the conv buffer"))?;
        let rows = kv
            .conv_rows(l)
            .ok_or_else(|| Error::internal(format!("layer {l} has no conv rows in the cache")))?;
        // B | C | x = h W_in                                                         (n, 3 n_embd)
        kernels::matmul(rec, self.w(&conv.in_proj), &ws.h, bcx, n)?;
        // y = C * conv(B * x), writing B * x of these positions into the cache      (n, n_embd)
        let b = ShortConvBuffers {
            bcx,
            weight: &conv.kernel,
            rows,
            out: &ws.att,
        };
        short_conv::prepare(rec, &b, n, e, hp.conv_l_cache, 0, &ws.step.buffer)?;
        kernels::matmul(rec, self.w(&conv.out_proj), &ws.att, &ws.o, n)?;
        self.plan_ffn_block(rec, ws, l, n)
    }
}
