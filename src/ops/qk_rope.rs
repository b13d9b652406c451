//! `qk_rope`: the attention inputs of a step in one dispatch (see `shaders/qk_rope.wgsl`):
//! optional per-head RMS norm of q and k (QK-norm), rope of both at the step's positions, q in
//! place, k into the K cache and v copied into the V cache. Four dispatches of a layer (q-norm,
//! k-norm, rope, rope + KV write) become one.
//!
//! The rope is [`RopeTable`]'s (exact angle reduction, `ops::rope`); the norm is `ops::rmsnorm`'s
//! (f32 sum of squares, tree reduction). The CPU reference composes theirs.

use std::mem::offset_of;

use super::rope::RopeTable;
use super::{Variant, WgslParams};
use crate::error::{Error, Result};
use crate::gpu::{buffer_entry, grid_2d, GpuContext, PipelineKey, Recorder};

pub const SHADER: &str = "qk_rope.wgsl";
pub const ENTRY: &str = "qk_rope";

/// Uniform of `qk_rope.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct QkRopeParams {
    pub n_tokens: u32,
    pub n_head: u32,
    pub n_kv_head: u32,
    pub head_dim: u32,
    pub n_rot: u32,
    /// 0 NeoX, 1 NORM ([`crate::rope::RopeType`] as u32).
    pub rope_type: u32,
    /// Added to the step's `pos0`: token `t` sits at position (== cell) `step.pos0 + pos0 + t`.
    pub pos0: u32,
    pub eps: f32,
    /// Element indices of `q[0, 0, 0]`, `k[0, 0, 0]` and `v[0, 0, 0]`.
    pub q_offset: u32,
    pub k_offset: u32,
    pub v_offset: u32,
    pub in_stride: u32,
    /// Multiplies the rotated pairs ([`crate::rope::RopeConfig::attn_factor`]).
    pub attn_factor: f32,
    /// `SRC`: elements between q heads in a token's row (`head_dim`; Qwen3.5's q projection
    /// interleaves each head's gate: `2 head_dim`).
    pub q_head_stride: u32,
    pub _pad1: u32,
    pub _pad2: u32,
}

impl WgslParams for QkRopeParams {
    const WGSL_NAME: &'static str = "QkRopeParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("n_tokens", offset_of!(QkRopeParams, n_tokens)),
        ("n_head", offset_of!(QkRopeParams, n_head)),
        ("n_kv_head", offset_of!(QkRopeParams, n_kv_head)),
        ("head_dim", offset_of!(QkRopeParams, head_dim)),
        ("n_rot", offset_of!(QkRopeParams, n_rot)),
        ("rope_type", offset_of!(QkRopeParams, rope_type)),
        ("pos0", offset_of!(QkRopeParams, pos0)),
        ("eps", offset_of!(QkRopeParams, eps)),
        ("q_offset", offset_of!(QkRopeParams, q_offset)),
        ("k_offset", offset_of!(QkRopeParams, k_offset)),
        ("v_offset", offset_of!(QkRopeParams, v_offset)),
        ("in_stride", offset_of!(QkRopeParams, in_stride)),
        ("attn_factor", offset_of!(QkRopeParams, attn_factor)),
        ("q_head_stride", offset_of!(QkRopeParams, q_head_stride)),
        ("_pad1", offset_of!(QkRopeParams, _pad1)),
        ("_pad2", offset_of!(QkRopeParams, _pad2)),
    ];
}

pub fn key(norm: bool, workgroup_size: u32, head_dim: u32) -> PipelineKey {
    key_src(norm, false, workgroup_size, head_dim)
}

/// The key with `SRC` (q, k and v read from one fused projection output) when `src`, for heads
/// of `head_dim` values (`PPT`: the rope pairs each invocation takes).
pub fn key_src(norm: bool, src: bool, workgroup_size: u32, head_dim: u32) -> PipelineKey {
    let ppt = (head_dim / 2).div_ceil(workgroup_size.max(1)).max(1);
    let mut k = PipelineKey::new(SHADER, ENTRY)
        .workgroup_size(workgroup_size)
        .define("PPT", format!("{ppt}u"));
    if norm {
        k = k.define("NORM", "");
    }
    if src {
        k = k.define("SRC", "");
    }
    k
}

pub fn variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for norm in [false, true] {
        for src in [false, true] {
            for (wg, head_dim) in [(32u32, 64), (64, 128), (128, 256), (32, 256)] {
                v.push(key_src(norm, src, wg, head_dim).into());
            }
        }
    }
    v
}

/// The workgroup size: a power of two covering a head's pairs (head_dim / 2) where the device
/// allows, at least 32.
pub fn workgroup_size(ctx: &GpuContext, head_dim: u32) -> u32 {
    let want = (head_dim / 2).clamp(32, 128).next_power_of_two();
    let wg = ctx.limits.workgroup_size(want);
    1 << (31 - wg.leading_zeros())
}

fn u32_of(what: &str, v: u64) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::invalid(format!("qk_rope: {what} = {v} does not fit in u32")))
}

/// Where q, k and v are, and where k and v go.
///
/// - `q`: `(n_tokens, n_head, head_dim)` f32 from element `q_offset`, roped (and normed) in place
/// - `k`, `v`: `(n_tokens, n_kv_head, head_dim)` f32 from their offsets (read only)
/// - `k_cache`, `v_cache`: `(n_ctx, n_kv_head, head_dim)` f32 of one layer
///
/// Separate q (roped in place), k and v inputs, each `(T, heads, head_dim)` from its offset.
pub struct QkvBuffers<'a> {
    pub q: &'a wgpu::Buffer,
    pub q_offset: u64,
    pub k: &'a wgpu::Buffer,
    pub k_offset: u64,
    pub v: &'a wgpu::Buffer,
    pub v_offset: u64,
    pub k_cache: &'a wgpu::Buffer,
    pub v_cache: &'a wgpu::Buffer,
}

/// Prepare the dispatch. `norm`: the QK-norm's weights as one buffer, `(2, head_dim)` f32 (q's,
/// then k's), and its epsilon. Positions are `step.pos0 + pos0 + t` ([`crate::gpu::Step`]); the
/// bounds check covers `pos0` alone, the caller keeps the step's cells within the cache.
/// q, k and v as columns of one projection output `src (T, stride)` (the Q/K/V GEMVs, fused or
/// not, write there): q's heads from column `q_col`, k's from `k_col`, v's from `v_col`. The roped
/// q goes to `q_out (T, n_head, head_dim)`, k and v to the caches.
pub struct FusedQkv<'a> {
    pub src: &'a wgpu::Buffer,
    pub stride: u64,
    pub q_col: u64,
    /// Elements between q heads from `q_col`: `head_dim`, or `2 head_dim` where each head's
    /// output gate follows it (Qwen3.5).
    pub q_head_stride: u64,
    pub k_col: u64,
    pub v_col: u64,
    pub q_out: &'a wgpu::Buffer,
    pub k_cache: &'a wgpu::Buffer,
    pub v_cache: &'a wgpu::Buffer,
}

/// [`prepare`] reading q, k and v from one fused output ([`FusedQkv`]).
#[allow(clippy::too_many_arguments)]
pub fn prepare_fused(
    rec: &mut Recorder,
    table: &RopeTable,
    f: &FusedQkv,
    n_tokens: u32,
    n_head: u32,
    n_kv_head: u32,
    norm: Option<(&wgpu::Buffer, f32)>,
    pos0: u32,
    step: &wgpu::Buffer,
) -> Result<()> {
    let hd = table.config.head_dim as u64;
    if f.src == f.q_out {
        return Err(Error::invalid(
            "qk_rope: the roped q must go to a buffer other than the source",
        ));
    }
    let cols = [
        (f.q_col, n_head as u64, f.q_head_stride),
        (f.k_col, n_kv_head as u64, hd),
        (f.v_col, n_kv_head as u64, hd),
    ];
    if f.q_head_stride < hd
        || cols
            .iter()
            .any(|&(c, heads, step)| c + heads.saturating_sub(1) * step + hd > f.stride)
    {
        return Err(Error::invalid(format!(
            "qk_rope: q, k, v columns {cols:?} do not fit rows of {}",
            f.stride
        )));
    }
    let b = QkvBuffers {
        q: f.q_out,
        q_offset: f.q_col,
        k: f.src,
        k_offset: f.k_col,
        v: f.src,
        v_offset: f.v_col,
        k_cache: f.k_cache,
        v_cache: f.v_cache,
    };
    prepare_inner(
        rec,
        table,
        &b,
        Some((f.stride, f.q_head_stride)),
        n_tokens,
        n_head,
        n_kv_head,
        norm,
        pos0,
        step,
    )
}

#[allow(clippy::too_many_arguments)]
pub fn prepare(
    rec: &mut Recorder,
    table: &RopeTable,
    b: &QkvBuffers,
    n_tokens: u32,
    n_head: u32,
    n_kv_head: u32,
    norm: Option<(&wgpu::Buffer, f32)>,
    pos0: u32,
    step: &wgpu::Buffer,
) -> Result<()> {
    if b.q == b.k || b.q == b.v {
        return Err(Error::invalid(
            "qk_rope: q is written in place, so k and v must be other buffers",
        ));
    }
    prepare_inner(
        rec, table, b, None, n_tokens, n_head, n_kv_head, norm, pos0, step,
    )
}

/// `src_stride`: `Some((row stride, q head stride))` for the `SRC` variant (`b.k` is the source
/// of q, k and v; `b.q` the roped q's output).
#[allow(clippy::too_many_arguments)]
fn prepare_inner(
    rec: &mut Recorder,
    table: &RopeTable,
    b: &QkvBuffers,
    src_stride: Option<(u64, u64)>,
    n_tokens: u32,
    n_head: u32,
    n_kv_head: u32,
    norm: Option<(&wgpu::Buffer, f32)>,
    pos0: u32,
    step: &wgpu::Buffer,
) -> Result<()> {
    let ctx = rec.ctx;
    let c = &table.config;
    let head_dim = c.head_dim as u64;
    if n_tokens == 0 {
        return Ok(());
    }
    let cell_bytes = n_kv_head as u64 * head_dim * 4;
    let end = (pos0 as u64 + n_tokens as u64) * cell_bytes;
    if end > b.k_cache.size() || end > b.v_cache.size() {
        return Err(Error::invalid(format!(
            "qk_rope: cells {pos0}..{} do not fit a cache of {} cells",
            pos0 as u64 + n_tokens as u64,
            b.k_cache.size().min(b.v_cache.size()) / cell_bytes.max(1)
        )));
    }
    if let Some((w, _)) = norm {
        if w.size() < 2 * head_dim * 4 {
            return Err(Error::invalid(format!(
                "qk_rope: the norm weights hold {} bytes, {} needed",
                w.size(),
                2 * head_dim * 4
            )));
        }
    }
    let pipe = ctx.pipeline(&key_src(
        norm.is_some(),
        src_stride.is_some(),
        workgroup_size(ctx, c.head_dim as u32),
        c.head_dim as u32,
    ))?;
    let params = QkRopeParams {
        n_tokens,
        n_head,
        n_kv_head,
        head_dim: u32_of("head_dim", head_dim)?,
        n_rot: u32_of("n_rot", c.n_rot as u64)?,
        rope_type: c.rope_type as u32,
        pos0,
        eps: norm.map_or(0.0, |n| n.1),
        q_offset: u32_of("q offset", b.q_offset)?,
        k_offset: u32_of("k offset", b.k_offset)?,
        v_offset: u32_of("v offset", b.v_offset)?,
        in_stride: u32_of("source stride", src_stride.map_or(0, |s| s.0))?,
        attn_factor: c.attn_factor,
        q_head_stride: u32_of("q head stride", src_stride.map_or(head_dim, |s| s.1))?,
        ..Default::default()
    };
    if let Some((stride, _)) = src_stride {
        u32_of("source end", n_tokens as u64 * stride)?;
    }
    let rows = n_tokens as u64 * (n_head as u64 + n_kv_head as u64);
    let grid = grid_2d(rows, ctx.limits.max_compute_workgroups_per_dimension)?;
    let label = pipe.key.label();
    let ubuf = rec.uniform(&label, &params);
    let mut entries = vec![
        buffer_entry(0, &ubuf),
        buffer_entry(1, b.q),
        buffer_entry(2, &table.buffer),
        buffer_entry(3, b.k),
        buffer_entry(5, b.k_cache),
        buffer_entry(6, b.v_cache),
        buffer_entry(7, step),
    ];
    if src_stride.is_none() {
        entries.push(buffer_entry(4, b.v));
    }
    if let Some((w, _)) = norm {
        entries.push(buffer_entry(8, w));
    }
    rec.push("qk_rope", &pipe, &entries, grid);
    Ok(())
}

/// One-off [`prepare`] at positions `pos0 + t` (tests).
#[allow(clippy::too_many_arguments)]
pub fn encode(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    table: &RopeTable,
    b: &QkvBuffers,
    n_tokens: u32,
    n_head: u32,
    n_kv_head: u32,
    norm: Option<(&wgpu::Buffer, f32)>,
    pos0: u32,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare(
        &mut rec,
        table,
        b,
        n_tokens,
        n_head,
        n_kv_head,
        norm,
        pos0,
        ctx.zero_step(),
    )?;
    rec.encode(encoder)
}

/// CPU reference: `(q out, k rows as cached)` for `q (T, n_head, head_dim)`, `k (T, n_kv_head,
/// head_dim)`, norm weights `(2, head_dim)` when given; positions `pos0 + t`.
pub fn reference(
    table: &RopeTable,
    q: &[f32],
    k: &[f32],
    n_head: usize,
    n_kv_head: usize,
    norm: Option<(&[f32], f32)>,
    pos0: u32,
) -> (Vec<f32>, Vec<f32>) {
    let hd = table.config.head_dim;
    let normed = |x: &[f32], w: Option<&[f32]>, eps: f32| -> Vec<f32> {
        match w {
            None => x.to_vec(),
            Some(w) => super::rmsnorm::reference(x, None, Some(w), hd, eps)
                .0
                .iter()
                .map(|&v| v as f32)
                .collect(),
        }
    };
    let (wq, wk, eps) = match norm {
        Some((w, eps)) => (Some(&w[..hd]), Some(&w[hd..2 * hd]), eps),
        None => (None, None, 0.0),
    };
    let q = super::rope::reference(&table.config, &normed(q, wq, eps), n_head, pos0);
    let k = super::rope::reference(&table.config, &normed(k, wk, eps), n_kv_head, pos0);
    (q, k)
}
