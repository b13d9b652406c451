//! The forward pass's kernel calls with the shapes it uses (whole rows from element 0), so
//! `forward.rs` reads like the model and the ops keep their general signatures.

use crate::error::Result;
use crate::gpu::{GpuContext, GpuTensor};
use crate::model::HParams;
use crate::ops::elementwise::{self, View};
use crate::ops::rope::RopeTable;
use crate::ops::{attention, embed, glu, matmul, rmsnorm, rope};

type Enc = wgpu::CommandEncoder;

/// `out (n, n_embd) = table[ids] * scale`.
pub fn embed(ctx: &GpuContext, enc: &mut Enc, table: &GpuTensor, ids: &wgpu::Buffer, n: u32, out: &wgpu::Buffer, scale: f32) -> Result<()> {
    embed::encode(ctx, enc, table, ids, 0, n, scale, out, 0)
}

/// `out (rows, len) = rmsnorm(x) * w` (in place when `out` is `x`).
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm(ctx: &GpuContext, enc: &mut Enc, x: &wgpu::Buffer, w: Option<&GpuTensor>, out: &wgpu::Buffer, rows: u32, len: u32, eps: f32) -> Result<()> {
    rmsnorm::encode(ctx, enc, x, 0, None, w, out, 0, rows, len, eps)
}

/// `y (n, w.rows) = x (n, w.cols) W^T`.
pub fn matmul(ctx: &GpuContext, enc: &mut Enc, w: &GpuTensor, x: &wgpu::Buffer, y: &wgpu::Buffer, n: u32) -> Result<()> {
    matmul::gemm(ctx, enc, w, x, 0, y, 0, n)
}

/// [`matmul`] from element `x_off` of `x` into element `y_off` of `y`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_at(ctx: &GpuContext, enc: &mut Enc, w: &GpuTensor, x: &wgpu::Buffer, x_off: u64, y: &wgpu::Buffer, y_off: u64, n: u32) -> Result<()> {
    matmul::gemm(ctx, enc, w, x, x_off, y, y_off, n)
}

/// `x (n, dim) += bias`.
pub fn add_bias(ctx: &GpuContext, enc: &mut Enc, x: &wgpu::Buffer, bias: &GpuTensor, n: u32, dim: u32) -> Result<()> {
    elementwise::bias_add(ctx, enc, View::rows(x, 0, dim as u64), bias, n, dim)
}

/// Rope `q (n, heads, head_dim)` in place at positions `pos0..`.
pub fn rope_q(ctx: &GpuContext, enc: &mut Enc, table: &RopeTable, q: &wgpu::Buffer, n: u32, heads: u32, pos0: u32) -> Result<()> {
    rope::encode(ctx, enc, table, q, 0, n, heads, pos0)
}

/// Rope `k` and write `k`, `v` `(n, kv_heads, head_dim)` into cache cells `pos0..`.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_write(
    ctx: &GpuContext,
    enc: &mut Enc,
    table: &RopeTable,
    k: &wgpu::Buffer,
    v: &wgpu::Buffer,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    n: u32,
    kv_heads: u32,
    pos0: u32,
) -> Result<()> {
    rope::encode_kv_write(ctx, enc, table, k, 0, v, 0, n, kv_heads, pos0, k_cache, v_cache)
}

/// `out (n, n_head, head_dim) = softmax(q K^T * scale + mask) V` over the cache.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    ctx: &GpuContext,
    enc: &mut Enc,
    hp: &HParams,
    q: &wgpu::Buffer,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: u32,
    pos0: u32,
    window: u32,
) -> Result<()> {
    let p = attention::AttentionParams::new(n, hp.n_head, hp.n_head_kv, hp.head_dim, pos0, window, hp.attention_scale, 0.0);
    attention::encode(ctx, enc, &p, q, k_cache, v_cache, out)
}

/// `gate (count) = act(gate) * up`.
pub fn glu(ctx: &GpuContext, enc: &mut Enc, gate: &wgpu::Buffer, up: &wgpu::Buffer, count: u32, act: glu::Activation) -> Result<()> {
    let (g, u) = (View::rows(gate, 0, count as u64), View::rows(up, 0, count as u64));
    glu::encode(ctx, enc, act, g, u, g, 1, count)
}

/// `x (count) += b * scale`.
pub fn add_scaled(ctx: &GpuContext, enc: &mut Enc, x: &wgpu::Buffer, b: &wgpu::Buffer, scale: f32, count: u32) -> Result<()> {
    let (xv, bv) = (View::rows(x, 0, count as u64), View::rows(b, 0, count as u64));
    elementwise::add_scaled(ctx, enc, xv, bv, scale, xv, 1, count)
}

/// `x (count) *= s`.
pub fn scale(ctx: &GpuContext, enc: &mut Enc, x: &wgpu::Buffer, s: f32, count: u32) -> Result<()> {
    elementwise::scale(ctx, enc, View::rows(x, 0, count as u64), s, 1, count)
}
