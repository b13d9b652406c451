//! `gated_delta`: the gated delta rule of a gated delta-net layer (Qwen3.5), in its recurrent
//! form token by token (exact for any batch; the decode path), with the L2 norms of q and k, the
//! gates from the beta/alpha projections, and the output's RMS norm (see
//! `shaders/gated_delta.wgsl`). Each value head keeps an `S x S` state per layer, advanced by the
//! dispatch; a batch at position 0 starts from zeros. The params, buffers, checks and the CPU
//! reference here serve the chunked form too (`gated_delta_chunked`, prefill).

use std::mem::offset_of;

use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gpu::{buffer_entry, grid_2d, GpuContext, PipelineKey, Recorder};

pub const SHADER: &str = "gated_delta.wgsl";
pub const ENTRY: &str = "gated_delta";
/// Invocations per workgroup wanted (a power of two; fewer where the head is smaller or the
/// device allows fewer).
pub const WORKGROUP_SIZE: u32 = 64;

/// Uniform of `gated_delta.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GatedDeltaParams {
    pub n_tokens: u32,
    pub n_k_heads: u32,
    pub n_v_heads: u32,
    /// `S`: the key and value head size.
    pub head_dim: u32,
    /// Added to the step's `pos0`.
    pub pos0: u32,
    /// Elements between tokens in `qkv`; k's and v's first element (of the first token).
    pub qkv_stride: u32,
    pub k_offset: u32,
    pub v_offset: u32,
    /// The first `b` element and elements between tokens in `ba` (`a_in` follows `b`).
    pub ba_offset: u32,
    pub ba_stride: u32,
    /// The first output element and elements between tokens in `dst`.
    pub out_offset: u32,
    pub out_stride: u32,
    pub eps: f32,
    pub norm_eps: f32,
    /// q's first element in `qkv` (k's and v's offsets also count from the first token).
    pub q_offset: u32,
    pub pad0: u32,
}

/// `GatedDeltaParams` is declared once for both forms, in `shaders/gated_delta_decls.tmpl`.
impl WgslParams for GatedDeltaParams {
    const WGSL_NAME: &'static str = "GatedDeltaParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_tokens", offset_of!(GatedDeltaParams, n_tokens)),
        ("n_k_heads", offset_of!(GatedDeltaParams, n_k_heads)),
        ("n_v_heads", offset_of!(GatedDeltaParams, n_v_heads)),
        ("head_dim", offset_of!(GatedDeltaParams, head_dim)),
        ("pos0", offset_of!(GatedDeltaParams, pos0)),
        ("qkv_stride", offset_of!(GatedDeltaParams, qkv_stride)),
        ("k_offset", offset_of!(GatedDeltaParams, k_offset)),
        ("v_offset", offset_of!(GatedDeltaParams, v_offset)),
        ("ba_offset", offset_of!(GatedDeltaParams, ba_offset)),
        ("ba_stride", offset_of!(GatedDeltaParams, ba_stride)),
        ("out_offset", offset_of!(GatedDeltaParams, out_offset)),
        ("out_stride", offset_of!(GatedDeltaParams, out_stride)),
        ("eps", offset_of!(GatedDeltaParams, eps)),
        ("norm_eps", offset_of!(GatedDeltaParams, norm_eps)),
        ("q_offset", offset_of!(GatedDeltaParams, q_offset)),
        ("pad0", offset_of!(GatedDeltaParams, pad0)),
    ];
}

fn key(wg: u32) -> PipelineKey {
    PipelineKey::new(SHADER, ENTRY).workgroup_size(wg)
}

/// The workgroup size for heads of `head_dim`: a power of two, at most [`WORKGROUP_SIZE`], the
/// device's limit and the head size rounded up.
pub fn workgroup_size(ctx: &GpuContext, head_dim: u32) -> u32 {
    let cap = ctx
        .limits
        .workgroup_size(WORKGROUP_SIZE)
        .min(head_dim.max(1).next_power_of_two());
    1 << (31 - cap.max(1).leading_zeros())
}

pub fn variants() -> Vec<Variant> {
    vec![key(WORKGROUP_SIZE).into()]
}

/// The shape of a layer: `n_k_heads` key heads, `n_v_heads` value heads (a multiple; value head
/// `h` reads key head `h % n_k_heads`), heads of `head_dim`.
#[derive(Clone, Copy, Debug)]
pub struct DeltaShape {
    pub n_k_heads: u32,
    pub n_v_heads: u32,
    pub head_dim: u32,
    pub eps: f32,
    pub norm_eps: f32,
}

impl DeltaShape {
    /// Channels of a token's q | k | v row.
    pub fn qkv_dim(&self) -> u64 {
        self.head_dim as u64 * (2 * self.n_k_heads + self.n_v_heads) as u64
    }
    /// Bytes of the state of one layer, `(n_v_heads, S, S)` f32.
    pub fn state_bytes(&self) -> u64 {
        self.n_v_heads as u64 * self.head_dim as u64 * self.head_dim as u64 * 4
    }
}

/// The buffers of one dispatch.
pub struct GatedDeltaBuffers<'a> {
    /// `(n_tokens, qkv_stride)`: q | k | v of each token (the conv's output).
    pub qkv: &'a wgpu::Buffer,
    pub qkv_stride: u64,
    /// `(n_tokens, ba_stride)`: the beta projection (`n_v_heads`), then the alpha one, from
    /// `ba_offset`.
    pub ba: &'a wgpu::Buffer,
    pub ba_offset: u64,
    pub ba_stride: u64,
    /// `dt_bias (n_v_heads) | A (n_v_heads) | norm weight (head_dim)`, f32.
    pub head_w: &'a wgpu::Buffer,
    /// `(n_v_heads, S, S)` f32, read and advanced.
    pub state: &'a wgpu::Buffer,
    /// `(n_tokens, out_stride)`: the normalised outputs `(n_v_heads, S)` from `out_offset`.
    pub out: &'a wgpu::Buffer,
    pub out_offset: u64,
    pub out_stride: u64,
}

pub(crate) fn u32_of(what: &str, v: u64) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::invalid(format!("gated_delta: {what} = {v} does not fit in u32")))
}

/// Check the shape and buffers of a dispatch of `n_tokens` at positions `step.pos0 + pos0 + t`
/// and build its params (both forms).
pub(crate) fn checked_params(
    b: &GatedDeltaBuffers,
    shape: &DeltaShape,
    n_tokens: u32,
    pos0: u32,
) -> Result<GatedDeltaParams> {
    let (s, hk, hv) = (shape.head_dim, shape.n_k_heads, shape.n_v_heads);
    if s == 0 || hk == 0 || hv == 0 || hv % hk != 0 {
        return Err(Error::invalid(format!(
            "gated_delta: {hk} key heads, {hv} value heads (a multiple), head size {s}"
        )));
    }
    let n = n_tokens.max(1) as u64;
    let (s64, hv64) = (s as u64, hv as u64);
    let row = shape.qkv_dim();
    if b.qkv_stride < row || b.ba_stride < 2 * hv64 || b.out_stride < hv64 * s64 {
        return Err(Error::invalid(
            "gated_delta: a row stride is shorter than its row",
        ));
    }
    let qkv_end = (n - 1) * b.qkv_stride + row;
    let ba_end = b.ba_offset + (n - 1) * b.ba_stride + 2 * hv64;
    let out_end = b.out_offset + (n - 1) * b.out_stride + hv64 * s64;
    u32_of("qkv elements", qkv_end)?;
    u32_of("ba elements", ba_end)?;
    u32_of("out elements", out_end)?;
    if b.qkv.size() < qkv_end * 4
        || b.ba.size() < ba_end * 4
        || b.out.size() < out_end * 4
        || b.head_w.size() < (2 * hv64 + s64) * 4
        || b.state.size() < shape.state_bytes()
    {
        return Err(Error::invalid(
            "gated_delta: a buffer is smaller than its shape",
        ));
    }
    Ok(GatedDeltaParams {
        n_tokens,
        n_k_heads: hk,
        n_v_heads: hv,
        head_dim: s,
        pos0,
        qkv_stride: u32_of("qkv stride", b.qkv_stride)?,
        k_offset: hk * s,
        v_offset: 2 * hk * s,
        ba_offset: u32_of("ba offset", b.ba_offset)?,
        ba_stride: u32_of("ba stride", b.ba_stride)?,
        out_offset: u32_of("out offset", b.out_offset)?,
        out_stride: u32_of("out stride", b.out_stride)?,
        eps: shape.eps,
        norm_eps: shape.norm_eps,
        q_offset: 0,
        pad0: 0,
    })
}

/// The bind group entries of either form (`shaders/gated_delta_decls.tmpl`).
pub(crate) fn entries<'a>(
    ubuf: &'a wgpu::Buffer,
    b: &GatedDeltaBuffers<'a>,
    step: &'a wgpu::Buffer,
) -> [wgpu::BindGroupEntry<'a>; 7] {
    [
        buffer_entry(0, ubuf),
        buffer_entry(1, b.qkv),
        buffer_entry(2, b.ba),
        buffer_entry(3, b.head_w),
        buffer_entry(4, b.state),
        buffer_entry(5, b.out),
        buffer_entry(6, step),
    ]
}

/// The params of tokens `t0 .. t0 + n` of a dispatch whose params are `whole`: every offset
/// moved to token `t0` (a batch split into several dispatches).
pub(crate) fn part_params(whole: &GatedDeltaParams, t0: u32, n: u32) -> Result<GatedDeltaParams> {
    let at = |offset: u32, stride: u32| u32_of("offset", offset as u64 + t0 as u64 * stride as u64);
    Ok(GatedDeltaParams {
        n_tokens: n,
        pos0: whole.pos0 + t0,
        q_offset: at(whole.q_offset, whole.qkv_stride)?,
        k_offset: at(whole.k_offset, whole.qkv_stride)?,
        v_offset: at(whole.v_offset, whole.qkv_stride)?,
        ba_offset: at(whole.ba_offset, whole.ba_stride)?,
        out_offset: at(whole.out_offset, whole.out_stride)?,
        ..*whole
    })
}

/// Tokens one dispatch may walk: all on a GPU; on a CPU adapter as many as stay under
/// lavapipe's limit of 65535 loop iterations per invocation in total (`shaders/attention.wgsl`,
/// LOOP_NOTE; with a margin, as `gated_delta_chunked::CPU_MAX_ITERATIONS`): heads of 128 went
/// wrong from the 120th token of one dispatch. Per token an invocation runs the two reductions
/// (`log2(wg) + 1` each), the norms' loop, and per owned row two loops over the row.
pub fn tokens_per_dispatch(ctx: &GpuContext, head_dim: u32) -> u32 {
    if !crate::ops::matmul::is_cpu_adapter(ctx) {
        return u32::MAX;
    }
    let wg = workgroup_size(ctx, head_dim) as u64;
    let (n, rows) = (head_dim as u64, (head_dim as u64).div_ceil(wg));
    let log2 = 63 - wg.leading_zeros() as u64;
    let per_token = 2 * (log2 + 2) + rows * (2 * n + 4) + rows + 2;
    let budget = super::gated_delta_chunked::CPU_MAX_ITERATIONS - rows * (n + 1);
    (budget / per_token).clamp(1, u32::MAX as u64) as u32
}

/// Prepare the dispatch for `n_tokens` at positions `step.pos0 + pos0 + t` (on a CPU adapter,
/// dispatches of [`tokens_per_dispatch`] tokens in order).
pub fn prepare(
    rec: &mut Recorder,
    b: &GatedDeltaBuffers,
    shape: &DeltaShape,
    n_tokens: u32,
    pos0: u32,
    step: &wgpu::Buffer,
) -> Result<()> {
    let ctx = rec.ctx;
    if n_tokens == 0 {
        return Ok(());
    }
    let params = checked_params(b, shape, n_tokens, pos0)?;
    let pipe = ctx.pipeline(&key(workgroup_size(ctx, shape.head_dim)))?;
    let grid = grid_2d(
        shape.n_v_heads as u64,
        ctx.limits.max_compute_workgroups_per_dimension,
    )?;
    let per_dispatch = tokens_per_dispatch(ctx, shape.head_dim);
    push_parts(
        rec,
        "gated_delta",
        &pipe,
        b,
        step,
        &params,
        per_dispatch,
        grid,
    )
}

/// Push `params`' tokens as dispatches of at most `per_dispatch` tokens, in order (each
/// continues from the state the one before left): shared by both forms of the rule.
#[allow(clippy::too_many_arguments)]
pub(crate) fn push_parts(
    rec: &mut Recorder,
    kind: &'static str,
    pipe: &std::sync::Arc<crate::gpu::CachedPipeline>,
    b: &GatedDeltaBuffers,
    step: &wgpu::Buffer,
    params: &GatedDeltaParams,
    per_dispatch: u32,
    grid: [u32; 3],
) -> Result<()> {
    let label = pipe.key.label();
    let mut t0 = 0u32;
    while t0 < params.n_tokens {
        let part = per_dispatch.max(1).min(params.n_tokens - t0);
        let ubuf = rec.uniform(&label, &part_params(params, t0, part)?);
        rec.push(kind, pipe, &entries(&ubuf, b, step), grid);
        t0 += part;
    }
    Ok(())
}

/// One-off [`prepare`] at positions `pos0 + t` (tests).
pub fn encode(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    b: &GatedDeltaBuffers,
    shape: &DeltaShape,
    n_tokens: u32,
    pos0: u32,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare(&mut rec, b, shape, n_tokens, pos0, ctx.zero_step())?;
    rec.encode(encoder)
}

/// CPU reference in f64 over a whole sequence from a zero state: `qkv (T, qkv_dim)`, `ba (T, 2
/// n_v_heads)`, `head_w` as bound; returns the outputs `(T, n_v_heads, S)` and the final state
/// `(n_v_heads, S, S)` (row j = column j of S).
pub fn reference(
    shape: &DeltaShape,
    qkv: &[f32],
    ba: &[f32],
    head_w: &[f32],
) -> (Vec<f64>, Vec<f64>) {
    let (s, hk, hv) = (
        shape.head_dim as usize,
        shape.n_k_heads as usize,
        shape.n_v_heads as usize,
    );
    let row = shape.qkv_dim() as usize;
    let n = qkv.len() / row;
    let mut state = vec![0.0f64; hv * s * s];
    let mut out = vec![0.0f64; n * hv * s];
    for t in 0..n {
        let r = &qkv[t * row..(t + 1) * row];
        for h in 0..hv {
            let g = h % hk;
            let l2 = |x: &[f32]| -> Vec<f64> {
                let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
                let inv = 1.0 / (ss + shape.eps as f64).sqrt();
                x.iter().map(|&v| v as f64 * inv).collect()
            };
            let q = l2(&r[g * s..(g + 1) * s]);
            let k = l2(&r[(hk + g) * s..(hk + g + 1) * s]);
            let v = &r[(2 * hk + h) * s..(2 * hk + h + 1) * s];
            let beta = 1.0 / (1.0 + (-(ba[t * 2 * hv + h] as f64)).exp());
            let x = ba[t * 2 * hv + hv + h] as f64 + head_w[h] as f64;
            let sp = if x > 20.0 { x } else { x.exp().ln_1p() };
            let decay = (sp * head_w[hv + h] as f64).exp();
            let st = &mut state[h * s * s..(h + 1) * s * s];
            st.iter_mut().for_each(|e| *e *= decay);
            let mut o = vec![0.0; s];
            for j in 0..s {
                let m = &mut st[j * s..(j + 1) * s];
                let sk: f64 = m.iter().zip(&k).map(|(a, b)| a * b).sum();
                let d = (v[j] as f64 - sk) * beta;
                m.iter_mut().zip(&k).for_each(|(a, b)| *a += b * d);
                o[j] = m.iter().zip(&q).map(|(a, b)| a * b).sum::<f64>() / (s as f64).sqrt();
            }
            let ms = o.iter().map(|x| x * x).sum::<f64>() / s as f64;
            let inv = 1.0 / (ms + shape.norm_eps as f64).sqrt();
            for j in 0..s {
                out[(t * hv + h) * s + j] = o[j] * inv * head_w[2 * hv + j] as f64;
            }
        }
    }
    (out, state)
}
