//! The forward pass's kernel calls with the shapes it uses (whole rows from element 0), so
//! `forward.rs` reads like the model and the ops keep their general signatures. Each call
//! prepares its dispatches on a [`Recorder`] (once per plan).

use crate::error::Result;
use crate::gpu::{GpuContext, GpuTensor, Recorder};
use crate::kv::KvCache;
use crate::model::HParams;
use crate::model::Workspace;
use crate::ops::elementwise::{self, View};
use crate::ops::rope::RopeTable;
use crate::ops::{
    attention, attention_split, gemm, gemm_coop, gemm_q8, glu, matmul, qk_rope, quantize_x8,
    rmsnorm,
};

/// `out (rows, len) = rmsnorm(x) * w` (in place when `out` is `x`).
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    w: Option<&GpuTensor>,
    out: &wgpu::Buffer,
    rows: u32,
    len: u32,
    eps: f32,
) -> Result<()> {
    rmsnorm::prepare(rec, x, 0, None, w, out, 0, rows, len, eps)
}

/// `x (rows, len) += rmsnorm(add) * post * scale` (or `add * scale` without `post`), then
/// `out = rmsnorm(x) * w`: a post-norm, the residual add and the next pre-norm in one dispatch.
#[allow(clippy::too_many_arguments)]
pub fn residual_norm(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    add: &wgpu::Buffer,
    post: Option<&GpuTensor>,
    scale: f32,
    w: &GpuTensor,
    out: &wgpu::Buffer,
    rows: u32,
    len: u32,
    eps: f32,
) -> Result<()> {
    let residual = rmsnorm::Residual {
        buffer: add,
        offset: 0,
        scale,
        norm: post,
    };
    rmsnorm::prepare_residual(rec, x, 0, Some(residual), Some(w), out, 0, rows, len, eps)
}

/// Whether the product of `w` over a batch of `n` tokens runs on 8-bit X ([`gemm_q8`]): a batch
/// the tiled GEMM takes and a type the 8-bit kernel reads, whatever the weight's size. `force`
/// (the model's `prefill_q8`, or natively `CERA_GEMM_Q8=0/1`) overrides the batch rule:
/// `Some(true)` takes it for any batch of 2 or more tokens whose weight the kernel reads,
/// `Some(false)` never. Without `force`, a device with cooperative matrices multiplies f32 X on
/// them instead ([`gemm_coop::wanted`]).
///
/// Measured on an H100 (prefill of 256 tokens, tok/s, f32 X -> 8-bit X): Llama 3 8B Q4_K 955 ->
/// 1,512, Q8_0 -> 1,603; Gemma 3 270M Q4_K_M 23,600 -> 26,000. (With the first 8-bit kernel,
/// a step of one block and a quantizer of one invocation per block, the 270M's small
/// projections were 10 % slower on it, and weights under 4 M values kept the f32 tile.)
pub fn gemm_q8_wanted(ctx: &GpuContext, w: &GpuTensor, n: u32, force: Option<bool>) -> bool {
    let knob = crate::gpu::knob::knob("CERA_GEMM_Q8");
    let force = match knob.as_deref().map(str::trim) {
        Some("0") => Some(false),
        Some("1") => Some(true),
        _ => force,
    };
    let readable = n > 1 && gemm_q8::supports(w.ty) && w.cols.is_multiple_of(32);
    match force {
        Some(f) => f && readable,
        // Where the device has cooperative matrices, the f32-X product runs on them instead.
        None => readable && gemm::use_gemm(ctx, n) && !gemm_coop::wanted(ctx, w, n),
    }
}

/// X quantized to 8 bits for the products on 8-bit X, in the style of the weights it serves.
#[derive(Clone, Copy)]
pub struct Xq8<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub style: quantize_x8::Style,
    /// The model's override of [`gemm_q8_wanted`]'s rules.
    pub force: Option<bool>,
}

/// `x (n, cols)` quantized to 8 bits into `xq8` (the workspace's buffer) when any of `weights`
/// multiplies it on 8-bit X ([`gemm_q8_wanted`]), in the first such weight's style, for the
/// products of the weights of that style ([`project_cols`] with `Some`); `None` (X stays f32)
/// when none does or `xq8` cannot hold it.
pub fn quantize_for<'a>(
    rec: &mut Recorder,
    xq8: &'a wgpu::Buffer,
    x: &wgpu::Buffer,
    n: u32,
    cols: u32,
    weights: &[&GpuTensor],
    force: Option<bool>,
) -> Result<Option<Xq8<'a>>> {
    let Some(first) = weights
        .iter()
        .find(|w| gemm_q8_wanted(rec.ctx, w, n, force))
    else {
        return Ok(None);
    };
    let style = quantize_x8::Style::for_type(first.ty);
    if !cols.is_multiple_of(style.block()) || xq8.size() < quantize_x8::bytes(n as u64, cols as u64)
    {
        return Ok(None);
    }
    quantize_x8::prepare(rec, style, x, 0, cols as u64, xq8, n, cols)?;
    Ok(Some(Xq8 {
        buffer: xq8,
        style,
        force,
    }))
}

/// `y (n, w.rows) = x (n, w.cols) W^T`.
pub fn matmul(
    rec: &mut Recorder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    n: u32,
) -> Result<()> {
    matmul::prepare_auto(rec, w, x, 0, y, 0, n)
}

/// [`matmul`] from element `x_off` of `x` into element `y_off` of `y`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_at(
    rec: &mut Recorder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    x_off: u64,
    y: &wgpu::Buffer,
    y_off: u64,
    n: u32,
) -> Result<()> {
    matmul::prepare_auto(rec, w, x, x_off, y, y_off, n)
}

/// Columns `col .. col + w.rows` of `y (n, stride)` = `x (n, w.cols) W^T`: one projection's part
/// of a wider output.
#[allow(clippy::too_many_arguments)]
pub fn matmul_cols(
    rec: &mut Recorder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    col: u64,
    stride: u64,
    n: u32,
) -> Result<()> {
    matmul::prepare_auto_strided(rec, w, x, 0, None, y, col, Some(stride), n)
}

/// One projection into its columns of a wider output: [`matmul_cols`] without `epi`, else one
/// token's [`gemv_epilogue`] into columns `col ..` (one row, so `stride` is not read). With `xq`,
/// x quantized by [`quantize_for`], a weight that wants it multiplies the 8-bit X
/// ([`gemm_q8`]). Returns the sums of squares a [`matmul::ResNorm`] wrote (0 without one).
#[allow(clippy::too_many_arguments)]
pub fn project_cols(
    rec: &mut Recorder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    xq: Option<Xq8>,
    y: &wgpu::Buffer,
    col: u64,
    stride: u64,
    n: u32,
    epi: Option<&matmul::Epilogue>,
) -> Result<u64> {
    match epi {
        Some(epi) => {
            debug_assert_eq!(n, 1, "an epilogue runs the one-token GEMV");
            gemv_epilogue(rec, w, x, y, col, epi)
        }
        None => {
            let style = quantize_x8::Style::for_type(w.ty);
            match xq.filter(|q| q.style == style && gemm_q8_wanted(rec.ctx, w, n, q.force)) {
                Some(xq) => {
                    let cfg = gemm_q8::for_shape(rec.ctx, w.rows, n);
                    let buf = xq.buffer;
                    gemm_q8::prepare(rec, cfg, w, buf, 0, None, y, col, Some(stride), n)?;
                }
                None => matmul_cols(rec, w, x, y, col, stride, n)?,
            }
            Ok(0)
        }
    }
}

/// Columns `col .. col + dim` of `x (n, stride)` += bias.
#[allow(clippy::too_many_arguments)]
pub fn add_bias_cols(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    col: u64,
    stride: u64,
    bias: &GpuTensor,
    n: u32,
    dim: u32,
) -> Result<()> {
    elementwise::prepare_bias_add(
        rec,
        View {
            buffer: x,
            offset: col,
            stride,
        },
        bias,
        n,
        dim,
    )
}

/// [QK-norm], rope q (into `ws.q`) and k (into the cache of layer `l`), v into the cache, at the
/// step's positions, reading q, k, v from the projections' output `ws.qkv`.
#[allow(clippy::too_many_arguments)]
pub fn qk_rope(
    rec: &mut Recorder,
    table: &RopeTable,
    hp: &HParams,
    ws: &Workspace,
    kv: &KvCache,
    layer: usize,
    n: u32,
    norm: Option<(&wgpu::Buffer, f32)>,
    step: &wgpu::Buffer,
) -> Result<()> {
    // q (each head followed by its output gate where the model has one), k, v.
    let (qd, kvd) = (hp.q_proj_dim() as u64, hp.kv_dim() as u64);
    let f = qk_rope::FusedQkv {
        src: &ws.qkv,
        stride: qd + 2 * kvd,
        q_col: 0,
        q_head_stride: qd / hp.n_head as u64,
        k_col: qd,
        v_col: qd + kvd,
        q_out: &ws.q,
        k_cache: kv.k(layer),
        v_cache: kv.v(layer),
    };
    qk_rope::prepare_fused(rec, table, &f, n, hp.n_head, hp.n_head_kv, norm, 0, step)
}

/// [`qk_rope`] and the split [`attention`] of one token in the attention's dispatches: the
/// partial norms and ropes q and k from the projections' output `ws.qkv` and writes k and v into
/// the cache of layer `l` itself (`attention_split::Query::Fresh`). With `out (1, n_head,
/// head_dim)` the reduce writes it; without, the chunks stay in the scratch for the o
/// projection ([`matmul::SplitX`], where `split.fused_reduce`). `split` as [`split_attention`]
/// made it, with `fresh` set. Returns where the partials are.
#[allow(clippy::too_many_arguments)]
pub fn attention_fresh(
    rec: &mut Recorder,
    table: &RopeTable,
    hp: &HParams,
    ws: &Workspace,
    kv: &KvCache,
    layer: usize,
    norm: Option<(&wgpu::Buffer, f32)>,
    out: Option<&wgpu::Buffer>,
    window: u32,
    step: &wgpu::Buffer,
    max_cells: u32,
    split: &SplitAttention,
) -> Result<attention_split::Partials> {
    let (qd, kvd) = (hp.q_proj_dim() as u64, hp.kv_dim() as u64);
    let f = attention_split::Fresh {
        src: &ws.qkv,
        stride: qd + 2 * kvd,
        q_head_stride: qd / hp.n_head as u64,
        k_col: qd,
        v_col: qd + kvd,
        rope: table,
        norm,
    };
    attention_split::prepare(
        rec,
        split.cfg,
        &attention_params(hp, 1, window),
        attention_split::Query::Fresh(&f),
        kv.k(layer),
        kv.v(layer),
        out,
        &split.scratch,
        step,
        max_cells as u64,
    )
}

/// `out (n, n_head, head_dim) = softmax(q K^T * scale + mask) V` over the cache, at the step's
/// positions, for runs attending to at most `max_cells` cells. With `split` (see
/// [`split_attention`]) the split (flash-decoding) kernel, else the one-workgroup-per-head one.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    rec: &mut Recorder,
    hp: &HParams,
    q: &wgpu::Buffer,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: u32,
    window: u32,
    step: &wgpu::Buffer,
    max_cells: u32,
    split: Option<&SplitAttention>,
) -> Result<()> {
    let p = attention_params(hp, n, window);
    match split {
        Some(s) => attention_split::prepare(
            rec,
            s.cfg,
            &p,
            attention_split::Query::Roped(q),
            k_cache,
            v_cache,
            Some(out),
            &s.scratch,
            step,
            max_cells as u64,
        )
        .map(|_| ()),
        None => {
            let cfg = attention::AttentionConfig::for_device(rec.ctx);
            attention::prepare(
                rec,
                cfg,
                &p,
                q,
                k_cache,
                v_cache,
                out,
                step,
                max_cells as u64,
            )
        }
    }
}

fn attention_params(hp: &HParams, n: u32, window: u32) -> attention::AttentionParams {
    attention::AttentionParams::new(
        n,
        hp.n_head,
        hp.n_head_kv,
        hp.head_dim,
        0,
        window,
        hp.attention_scale,
        hp.attn_softcap,
    )
}

/// The split attention kernel of a decode plan: its shape on this device, its scratch, and
/// whether its partial takes q, k and v raw from the projections ([`attention_fresh`]). Fitted
/// once when the plan is made; every layer's attention dispatches use it.
pub struct SplitAttention {
    pub cfg: attention_split::SplitConfig,
    /// Partials of every chunk: one scratch serves every layer of a plan (the layers' attention
    /// dispatches run one after the other in the pass, and the window does not change its size).
    pub scratch: wgpu::Buffer,
    /// The partial does `qk_rope`'s work itself: where the device fits the fused partial's shape.
    /// `CERA_FRESH_ATTN=0` (native) keeps `qk_rope` and the plain partial, to compare.
    pub fresh: bool,
    /// (With `fresh`.) No reduce dispatch: the o projection combines the chunks itself
    /// ([`matmul::SplitX`]), which every one of its workgroups repeats, so only where the plan's
    /// chunks are few ([`split_x_cells`]) and heads are vec4s.
    pub fused_reduce: bool,
}

/// The most (head, chunk) pairs a decode step's o projection combines itself
/// ([`SplitAttention::fused_reduce`]): each of its workgroups reads that many heads of
/// partials. Measured on an H200 (docs/benchmarking.md, twelfth session): Gemma 3 270M (4
/// heads in chunks of 16 cells, fused up to 512 cells) decodes 3.2 % faster after 256 tokens
/// and 1.8 % at 900 with a cap of 256; the 8B's 32 heads forced to fuse at 320 cells (640
/// pairs) lost 3.6 %. Native builds read `CERA_SPLIT_X_MAX` instead when it is set (0: never).
pub const SPLIT_X_MAX_CHUNKS: u64 = 128;

fn split_x_max_chunks() -> u64 {
    crate::gpu::knob::knob_u64("CERA_SPLIT_X_MAX").unwrap_or(SPLIT_X_MAX_CHUNKS)
}

/// The most cells a decode plan on this device may span for its o projections to do the
/// attention's reduce ([`SplitAttention::fused_reduce`]), or 0 where they never do (CPU adapters,
/// which keep the one-workgroup-per-head attention, heads not vec4s, gated attention).
/// Sessions size their first decode plan to it, so short contexts run without the reduces.
pub fn split_x_cells(ctx: &GpuContext, hp: &HParams) -> u32 {
    if matmul::is_cpu_adapter(ctx) || hp.attn_gate || !hp.head_dim.is_multiple_of(4) {
        return 0;
    }
    let chunk = attention_split::SplitConfig::for_head(ctx, hp.head_dim).chunk as u64;
    let cells = split_x_max_chunks() / (hp.n_head as u64).max(1) * chunk;
    cells.min(u32::MAX as u64) as u32
}

/// The split attention kernel for a plan of `n` tokens over at most `max_cells` cells, or `None`
/// where the plan uses the one-workgroup-per-head kernel.
///
/// The split kernel serves decode (`n == 1`), where a workgroup per head leaves a GPU idle
/// (Gemma 3 270M: 4 workgroups walking the whole cache), on GPUs. Prefill batches already have
/// `n * n_head` workgroups. CPU adapters keep the one-workgroup-per-head kernel: on lavapipe
/// the split one measured about even at 700 cells and faster only at 4000 (`cera
/// bench-attention --cells 700,4000`), and it adds a dispatch per layer. `split` overrides the choice by
/// adapter for decode ([`crate::model::Model::split_attention`]).
pub fn split_attention(
    ctx: &GpuContext,
    hp: &HParams,
    n: u32,
    max_cells: u32,
    split: Option<bool>,
) -> Result<Option<SplitAttention>> {
    if n != 1 || !split.unwrap_or(!matmul::is_cpu_adapter(ctx)) {
        return Ok(None);
    }
    let cfg = attention_split::SplitConfig::for_head(ctx, hp.head_dim);
    let bytes = attention_split::scratch_bytes(&attention_params(hp, n, 0), cfg, max_cells as u64);
    let fresh = crate::gpu::knob::knob("CERA_FRESH_ATTN").as_deref() != Some("0")
        && attention_split::fresh_config(ctx, cfg, hp.head_dim).is_ok();
    let chunks = hp.n_head as u64 * (max_cells as u64).div_ceil(cfg.chunk.max(1) as u64);
    Ok(Some(SplitAttention {
        cfg,
        scratch: ctx.empty_storage("attention split scratch", bytes)?,
        fresh,
        fused_reduce: fresh
            && !hp.attn_gate
            && hp.head_dim.is_multiple_of(4)
            && chunks <= split_x_max_chunks(),
    }))
}

/// The feed-forward block's output `y (n, down.rows) = (act(gate) * up) W_down^T`, from gate and
/// up side by side in `gate_up (n, 2 n_ff)`: in one dispatch (the GLU computed as the down
/// projection reads its input) where the down projection runs the matmul kernel and its GEMV
/// computes the unit once per workgroup ([`matmul::glu_fused_worth`]); otherwise a GLU dispatch
/// (into the gate half), then the tiled GEMM for prefill batches or the GEMV for one token.
///
/// With `epi`, for one token (`n` = 1), the GEMV ends in that epilogue (see
/// [`matmul::Epilogue`]; `y` is then what it says). Returns the sums of squares a
/// [`matmul::ResNorm`] wrote (0 without one).
///
/// Where one token's GLU is its own dispatch and the GEMV has 8-bit items
/// ([`matmul::q8_glu_wanted`]), the GLU writes its output quantized into `xq8` (at least
/// [`glu::q8_bytes`]`(1, n_ff)`; `None`: never) and the GEMV multiplies it with integer dot
/// products. Measured on an H100, Llama 3 8B's Q4_K down projection (4096 x 14336): 45.3 us on
/// f32 X -> 36.2 on the 8-bit unit, the GLU 9.6 -> 10.6 us; decode of the all-Q4_K 8B file
/// 202.0 -> 207.9 tok/s.
#[allow(clippy::too_many_arguments)]
pub fn glu_down(
    rec: &mut Recorder,
    down: &GpuTensor,
    gate_up: &wgpu::Buffer,
    xq8: Option<&wgpu::Buffer>,
    y: &wgpu::Buffer,
    n: u32,
    act: glu::Activation,
    epi: Option<&matmul::Epilogue>,
    prefill_q8: Option<bool>,
) -> Result<u64> {
    let n_ff = down.cols;
    let unfused_gemv = n == 1 && !matmul::glu_fused_worth(rec.ctx, down);
    let gemv = matmul::MatmulConfig::gemv_for(rec.ctx, down.ty, down.rows, down.cols);
    let batch_q8 = n > 1 && gemm_q8_wanted(rec.ctx, down, n, prefill_q8);
    if crate::ops::gemm::use_gemm(rec.ctx, n) || unfused_gemv || batch_q8 {
        // act(gate) * up into the gate half, then a plain product of it.
        let g = View {
            buffer: gate_up,
            offset: 0,
            stride: 2 * n_ff,
        };
        let u = View {
            buffer: gate_up,
            offset: n_ff,
            stride: 2 * n_ff,
        };
        let q8 = xq8.filter(|b| {
            unfused_gemv
                && n_ff.is_multiple_of(32)
                && b.size() >= glu::q8_bytes(1, n_ff)
                && matmul::q8_glu_wanted(rec.ctx, down)
        });
        if let Some(xq) = q8 {
            // act(gate) * up quantized into xq8, then the product on 8-bit X.
            glu::prepare_q8(rec, act, g, u, xq, 1, n_ff as u32)?;
            return matmul::prepare_q8_x(rec, gemv, down, xq, y, 0, epi);
        }
        let style = quantize_x8::Style::for_type(down.ty);
        let batch_q8 = xq8.filter(|b| {
            batch_q8
                && epi.is_none()
                && gemm_q8_wanted(rec.ctx, down, n, prefill_q8)
                && n_ff.is_multiple_of(style.block() as u64)
                && b.size() >= quantize_x8::bytes(n as u64, n_ff)
        });
        if let Some(xq) = batch_q8 {
            // A batch: act(gate) * up into the gate half, quantized into xq8 in llama.cpp's
            // style for the weight, then the 8-bit GEMM on it.
            glu::prepare(rec, act, g, u, g, n, n_ff as u32)?;
            quantize_x8::prepare(rec, style, gate_up, 0, 2 * n_ff, xq, n, n_ff as u32)?;
            let cfg = gemm_q8::for_shape(rec.ctx, down.rows, n);
            gemm_q8::prepare(rec, cfg, down, xq, 0, None, y, 0, None, n)?;
            return Ok(0);
        }
        glu::prepare(rec, act, g, u, g, n, n_ff as u32)?;
        return match epi {
            Some(epi) => matmul::prepare_epilogue(rec, gemv, down, gate_up, 0, None, y, 0, epi),
            None => {
                let stride = Some(2 * n_ff);
                matmul::prepare_auto_strided(rec, down, gate_up, 0, stride, y, 0, None, n)?;
                Ok(0)
            }
        };
    }
    if let Some(epi) = epi {
        let glu = Some((n_ff, act));
        return matmul::prepare_epilogue(rec, gemv, down, gate_up, 0, glu, y, 0, epi);
    }
    let cfg = if n == 1 {
        gemv
    } else {
        matmul::MatmulConfig::gemm(rec.ctx, n)
    };
    matmul::prepare_glu_fused(rec, cfg, act, down, gate_up, 0, n_ff, 2 * n_ff, y, 0, n)?;
    Ok(0)
}

/// One token's `y = W x` (x from element 0, y from `y_off`) in the engine's GEMV shape with
/// `epi`; returns the sums of squares a [`matmul::ResNorm`] wrote.
pub fn gemv_epilogue(
    rec: &mut Recorder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    y_off: u64,
    epi: &matmul::Epilogue,
) -> Result<u64> {
    let cfg = matmul::MatmulConfig::gemv_for(rec.ctx, w.ty, w.rows, w.cols);
    matmul::prepare_epilogue(rec, cfg, w, x, 0, None, y, y_off, epi)
}

/// Whether a decode o projection `w` can take the attention's chunks itself
/// ([`matmul::SplitX`]) in the engine's GEMV shape, with an epilogue (`epilogue`) or not.
pub fn split_x_fits(ctx: &GpuContext, w: &GpuTensor, epilogue: bool) -> bool {
    let cfg = matmul::MatmulConfig::gemv_for(ctx, w.ty, w.rows, w.cols);
    matmul::split_x_fits(ctx, cfg, w.cols, epilogue)
}

/// One token's `y = W x` in the engine's GEMV shape with x the attention output a split
/// attention left as chunks (`sx`), with an optional epilogue; returns the sums of squares a
/// [`matmul::ResNorm`] wrote.
pub fn gemv_split_x(
    rec: &mut Recorder,
    w: &GpuTensor,
    sx: &matmul::SplitX,
    y: &wgpu::Buffer,
    epi: Option<&matmul::Epilogue>,
) -> Result<u64> {
    let cfg = matmul::MatmulConfig::gemv_for(rec.ctx, w.ty, w.rows, w.cols);
    matmul::prepare_split_x(rec, cfg, w, sx, y, 0, epi)
}

/// The producer's epilogue of a linked plan ([`matmul::ResNorm`]): the projection adds
/// `scale * (W x)` to the residual stream it writes, puts that times `w` (the next norm's
/// weight) in `h` and its sums of squares in `ss`.
pub fn res_norm<'a>(
    w: &'a GpuTensor,
    h: &'a wgpu::Buffer,
    ss: &'a wgpu::Buffer,
    scale: f32,
) -> matmul::Epilogue<'a> {
    matmul::Epilogue::ResNorm(matmul::ResNorm { w, h, ss, scale })
}

/// `x (count) *= s`.
pub fn scale(rec: &mut Recorder, x: &wgpu::Buffer, s: f32, count: u32) -> Result<()> {
    elementwise::prepare_scale(rec, View::rows(x, 0, count as u64), s, 1, count)
}
