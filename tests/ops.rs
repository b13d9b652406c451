//! The per-token kernels of the forward pass (embed, rmsnorm, rope + KV write, glu, elementwise)
//! against their CPU references (f64), over awkward shapes: one row, odd lengths (37, 641), the
//! real model's shapes (n_embd 640, n_ff 2048, head_dim 256 x 4 heads), split embedding tables
//! with ids on both sides of every boundary, rope at positions up to 32768, and every buffer
//! aliasing pattern (in place, inputs sharing a buffer). Runs natively and in headless Chrome.

mod common;

use cera_web::gguf::GgmlType;
use cera_web::gpu::readback::read_f32;
use cera_web::gpu::GpuContext;
use cera_web::gpu::Recorder;
use cera_web::kv::{KvCache, KvCacheConfig};
use cera_web::ops::elementwise::{self, View};
use cera_web::ops::glu::{self, Activation};
use cera_web::ops::qk_rope::{self, QkvBuffers};
use cera_web::ops::rope::{self, RopeTable};
use cera_web::ops::{embed, rmsnorm};
use cera_web::quant::dequantize_to_vec;
use cera_web::quant::gpu::{synthetic_rows, upload_tensor};
use cera_web::rope::{RopeConfig, RopeType};
use common::Rng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// The one tolerance table: the largest error allowed per op, each measured as its comment says.
const TOLERANCE: &[(&str, f64)] = &[
    // |gpu - ref| / max |ref| of the row: a decode and one multiply by the scale.
    ("embed", 1e-6),
    // |gpu - ref| / max |ref| of the row: an f32 sum of squares over up to 2048 values.
    ("rmsnorm", 1e-6),
    // |gpu - ref| / |pair|: the angle reduced exactly, sin/cos polynomials on a quarter turn
    // (the reference's own f32 rounding is most of it: 1.2e-7 at position 0).
    ("rope", 5e-7),
    // |gpu - ref| / (|up| * max(1, |gate|)): exp/tanh in f32 (GELU's 1 + tanh cancels).
    ("glu", 1e-6),
    // |gpu - ref| / (|a| + |b * scale|): one rounding (or a fused multiply-add).
    ("elementwise", 2e-7),
    // |gpu - ref| / max |ref| of the head: the QK-norm's error and then the rope's.
    ("qk_rope", 1e-6),
];

fn tolerance(op: &str) -> f64 {
    TOLERANCE
        .iter()
        .find(|(o, _)| *o == op)
        .map(|(_, t)| *t)
        .expect("every op has a tolerance")
}

/// Compare `got` with `want` under `denom(i)`; panics past the op's tolerance, returns the worst.
fn check(op: &str, what: &str, got: &[f32], want: &[f64], denom: impl Fn(usize) -> f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{op} {what}: length");
    let tol = tolerance(op);
    let mut worst = 0.0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs() / denom(i).max(1e-30);
        assert!(
            err <= tol,
            "{op} {what}: [{i}] = {g}, want {w} (error {err:.2e} > {tol:.0e})"
        );
        worst = worst.max(err);
    }
    worst
}

/// Per-row max |v|, broadcast back to every element (the denominators of embed and rmsnorm).
fn row_max(v: &[f64], row_len: usize) -> Vec<f64> {
    v.chunks(row_len)
        .flat_map(|r| {
            let m = r.iter().fold(0.0f64, |a, x| a.max(x.abs()));
            std::iter::repeat_n(m, r.len())
        })
        .collect()
}

async fn read(ctx: &GpuContext, buf: &wgpu::Buffer, offset: u64, n: usize) -> Vec<f32> {
    read_f32(ctx, buf, offset * 4, n).await.unwrap()
}

fn submit(ctx: &GpuContext, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    f(&mut enc);
    ctx.queue.submit([enc.finish()]);
}

// ---------------------------------------------------------------------------------------------
// embed

const SENTINEL: f32 = -777.0;

/// A table of 45 rows split into 3 parts of 15 (and unsplit), gathered for ids on both sides of
/// both boundaries, repeated and out of order, at offsets; rows before the output stay untouched.
async fn check_embed(ty: GgmlType) {
    let ctx = common::shared_context().await;
    let be = ty.block_elems();
    let colss: Vec<u64> = match be {
        1 => vec![37, 640],
        256 => vec![256, 512],
        _ => vec![2 * be, 640],
    };
    let ids: Vec<u32> = vec![0, 14, 15, 16, 29, 30, 44, 15, 7, 44, 0];
    let (ids_off, out_off) = (2usize, 3usize);
    let mut id_words = vec![0u32; ids_off];
    id_words.extend(&ids);
    let ids_buf = ctx.storage_buffer("ids", bytemuck::cast_slice(&id_words));
    let scale = 640f32.sqrt();
    let mut worst = 0.0f64;
    for cols in colss {
        let rows = 45u64;
        let bytes = synthetic_rows(ty, cols, rows, 11 + cols);
        let table = dequantize_to_vec(ty, &bytes).unwrap();
        let whole = upload_tensor(
            &ctx,
            "embd",
            ty,
            cols,
            rows,
            &bytes,
            ctx.limits.max_binding(),
        )
        .unwrap();
        let split = upload_tensor(
            &ctx,
            "embd split",
            ty,
            cols,
            rows,
            &bytes,
            15 * whole.row_bytes + 4,
        )
        .unwrap();
        assert_eq!(split.parts.len(), 3, "{ty}: the split plan");
        let n = out_off + ids.len() * cols as usize;
        let want = embed::reference(&table, cols as usize, &ids, scale);
        let denom = row_max(&want, cols as usize);
        let mut results = Vec::new();
        for t in [&whole, &split] {
            let out = ctx.storage_buffer("out", bytemuck::cast_slice(&vec![SENTINEL; n]));
            submit(&ctx, |enc| {
                embed::encode(
                    &ctx,
                    enc,
                    t,
                    &ids_buf,
                    ids_off as u64,
                    ids.len() as u32,
                    scale,
                    &out,
                    out_off as u64,
                )
                .unwrap()
            });
            let got = read(&ctx, &out, 0, n).await;
            assert!(
                got[..out_off].iter().all(|&v| v == SENTINEL),
                "{ty}: wrote before out_offset"
            );
            worst = worst.max(check(
                "embed",
                &format!("{ty} {rows}x{cols} ({} parts)", t.parts.len()),
                &got[out_off..],
                &want,
                |i| denom[i],
            ));
            results.push(got);
        }
        assert_eq!(
            results[0], results[1],
            "{ty}: split and unsplit tables differ"
        );
    }
    tlog!("embed {ty}: worst error {worst:.2e}");
}

gpu_test!(embed_f32, check_embed(GgmlType::F32));
gpu_test!(embed_f16, check_embed(GgmlType::F16));
gpu_test!(embed_bf16, check_embed(GgmlType::BF16));
gpu_test!(embed_q8_0, check_embed(GgmlType::Q8_0));
gpu_test!(embed_q4_0, check_embed(GgmlType::Q4_0));
gpu_test!(embed_q4_1, check_embed(GgmlType::Q4_1));
gpu_test!(embed_q5_0, check_embed(GgmlType::Q5_0));
gpu_test!(embed_q5_1, check_embed(GgmlType::Q5_1));
gpu_test!(embed_q4_k, check_embed(GgmlType::Q4K));
gpu_test!(embed_q5_k, check_embed(GgmlType::Q5K));
gpu_test!(embed_q6_k, check_embed(GgmlType::Q6K));

// ---------------------------------------------------------------------------------------------
// rmsnorm

fn f32_tensor(ctx: &GpuContext, name: &str, v: &[f32]) -> cera_web::gpu::GpuTensor {
    upload_tensor(
        ctx,
        name,
        GgmlType::F32,
        v.len() as u64,
        1,
        bytemuck::cast_slice(v),
        ctx.limits.max_binding(),
    )
    .unwrap()
}

/// Every case at every element offset triple (x, out, addend): the norm tests run each shape off
/// and on whole vec4s.
fn at_offsets<'a, C>(
    cases: &'a [C],
    offsets: &'a [(usize, usize, usize)],
) -> impl Iterator<Item = (&'a C, &'a (usize, usize, usize))> {
    cases
        .iter()
        .flat_map(move |c| offsets.iter().map(move |o| (c, o)))
}

gpu_test!(rmsnorm_shapes_weights_in_place_and_fused_add, async {
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(5);
    let eps = 1e-6f32;
    let mut worst = 0.0f64;
    // (rows, row_len, weight, add, in place): 1 row; odd lengths; n_embd 640 and n_ff 2048;
    // QK-norm (T = 3 tokens x 4 heads of 256, one weight); a row past what threads keep in
    // registers.
    let cases: &[(u32, u32, bool, bool, bool)] = &[
        (1, 37, true, false, false),
        (3, 641, true, false, false),
        (5, 640, true, false, false),
        (3, 2048, false, false, false),
        (12, 256, true, false, false),
        (3, 640, true, false, true),
        (1, 37, false, false, true),
        (3, 640, true, true, false),
        (2, 641, false, true, true),
        // Past 32 values a thread at 256 threads: the strided loop instead of registers.
        (2, 8200, true, true, false),
    ];
    // Offsets off and on whole vec4s: the kernel reads vec4s when the row and every offset
    // allow it (a row of 8200 then keeps its values in registers too).
    for (&(rows, len, weight, add, in_place), &(xo, oo, ao)) in
        at_offsets(cases, &[(3, 5, 1), (4, 8, 0)])
    {
        let what = format!(
            "{rows}x{len} weight {weight} add {add} in place {in_place} offsets {xo}/{oo}/{ao}"
        );
        let n = (rows * len) as usize;
        // Values of mixed magnitude, so the norm is not near 1.
        let x: Vec<f32> = rng.vec(xo + n).iter().map(|v| v * 4.0 + 0.5).collect();
        let a: Vec<f32> = rng.vec(ao + n);
        let w: Vec<f32> = rng.vec(len as usize).iter().map(|v| 1.0 + v).collect();
        let xb = ctx.storage_buffer("x", bytemuck::cast_slice(&x));
        let ab = ctx.storage_buffer("add", bytemuck::cast_slice(&a));
        let ob = ctx.empty_storage("out", ((oo + n) * 4) as u64).unwrap();
        let wt = f32_tensor(&ctx, "w", &w);
        let (out, out_off) = if in_place { (&xb, xo) } else { (&ob, oo) };
        submit(&ctx, |enc| {
            let add_arg = if add { Some((&ab, ao as u64)) } else { None };
            let w_arg = if weight { Some(&wt) } else { None };
            rmsnorm::encode(
                &ctx,
                enc,
                &xb,
                xo as u64,
                add_arg,
                w_arg,
                out,
                out_off as u64,
                rows,
                len,
                eps,
            )
            .unwrap()
        });
        let (want, sum) = rmsnorm::reference(
            &x[xo..],
            if add { Some(&a[ao..]) } else { None },
            if weight { Some(&w) } else { None },
            len as usize,
            eps,
        );
        let got = read(&ctx, out, out_off as u64, n).await;
        let denom = row_max(&want, len as usize);
        worst = worst.max(check("rmsnorm", &what, &got, &want, |i| denom[i]));
        if add && !in_place {
            let xs = read(&ctx, &xb, xo as u64, n).await;
            check(
                "elementwise",
                &format!("rmsnorm {what}: x + add written back"),
                &xs,
                &sum,
                |i| (x[xo + i].abs() + a[ao + i].abs()) as f64,
            );
        }
    }
    // A fused add into a buffer other than x and out is required.
    let b = ctx.empty_storage("b", 64).unwrap();
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    assert!(rmsnorm::encode(&ctx, &mut enc, &b, 0, Some((&b, 0)), None, &b, 0, 1, 4, eps).is_err());
    tlog!(
        "rmsnorm: worst error {worst:.2e} (tolerance {:.0e})",
        tolerance("rmsnorm")
    );
});

gpu_test!(rmsnorm_post_norm_residual_and_pre_norm_fused, async {
    // x += rmsnorm(add) * w_add * scale, then out = rmsnorm(x) * w: a block's post-norm, residual
    // add and the next pre-norm in one dispatch (also the scaled add alone, Granite's residual).
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(17);
    let eps = 1e-6f32;
    let mut worst = 0.0f64;
    // (rows, row_len, addend norm, scale, in place)
    let cases: &[(u32, u32, bool, f32, bool)] = &[
        (1, 37, true, 1.0, false),
        (3, 641, true, 1.0, false),
        (5, 640, true, 0.22, true),
        (2, 2048, false, 0.22, false),
        (1, 1, true, 1.0, false),
        (7, 640, false, 1.0, true),
        (1, 8200, true, 0.5, false),
    ];
    for (&(rows, len, norm, scale, in_place), &(xo, oo, ao)) in
        at_offsets(cases, &[(2, 3, 5), (8, 4, 12)])
    {
        let what = format!(
            "{rows}x{len} addend norm {norm} scale {scale} in place {in_place} offsets {xo}/{oo}/{ao}"
        );
        let n = (rows * len) as usize;
        let x: Vec<f32> = rng.vec(xo + n).iter().map(|v| v * 4.0 + 0.5).collect();
        let a: Vec<f32> = rng.vec(ao + n).iter().map(|v| v * 30.0).collect();
        let w: Vec<f32> = rng.vec(len as usize).iter().map(|v| 1.0 + v).collect();
        let wa: Vec<f32> = rng.vec(len as usize).iter().map(|v| 0.5 + v).collect();
        let xb = ctx.storage_buffer("x", bytemuck::cast_slice(&x));
        let ab = ctx.storage_buffer("add", bytemuck::cast_slice(&a));
        let ob = ctx.empty_storage("out", ((oo + n) * 4) as u64).unwrap();
        let (wt, wat) = (f32_tensor(&ctx, "w", &w), f32_tensor(&ctx, "w_add", &wa));
        let (out, out_off) = if in_place { (&xb, xo) } else { (&ob, oo) };
        let residual = rmsnorm::Residual {
            buffer: &ab,
            offset: ao as u64,
            scale,
            norm: if norm { Some(&wat) } else { None },
        };
        let mut rec = cera_web::gpu::Recorder::new(&ctx);
        rmsnorm::prepare_residual(
            &mut rec,
            &xb,
            xo as u64,
            Some(residual),
            Some(&wt),
            out,
            out_off as u64,
            rows,
            len,
            eps,
        )
        .unwrap();
        submit(&ctx, |enc| rec.encode(enc).unwrap());
        let (want, sum) = rmsnorm::reference_residual(
            &x[xo..],
            &a[ao..],
            if norm { Some(&wa) } else { None },
            scale,
            Some(&w),
            len as usize,
            eps,
        );
        let got = read(&ctx, out, out_off as u64, n).await;
        let denom = row_max(&want, len as usize);
        worst = worst.max(check("rmsnorm", &what, &got, &want, |i| denom[i]));
        if !in_place {
            let xs = read(&ctx, &xb, xo as u64, n).await;
            let sum_denom = row_max(&sum, len as usize);
            worst = worst.max(check(
                "rmsnorm",
                &format!("{what}: the sum written back"),
                &xs,
                &sum,
                |i| sum_denom[i],
            ));
        }
    }
    tlog!(
        "rmsnorm residual: worst error {worst:.2e} (tolerance {:.0e})",
        tolerance("rmsnorm")
    );
});

// ---------------------------------------------------------------------------------------------
// rope

/// Positions tested: each pos0 rotates 2 tokens (pos0, pos0 + 1), so 32767 covers 32768 too.
const POSITIONS: [u32; 5] = [0, 1, 511, 4097, 32767];

fn rope_configs() -> Vec<(String, RopeConfig)> {
    let mut v = Vec::new();
    for rt in [RopeType::Neox, RopeType::Norm] {
        // The last: Phi-4-mini's form (partial rotary, LongRoPE factors, attention factor).
        for (base, n_rot, ff, attn_factor) in [
            (1e6f32, 256usize, false, 1.0f32),
            (1e4, 256, true, 1.0),
            (1e4, 128, false, 1.0),
            (5e5, 128, true, 1.0),
            (1e4, 192, true, 1.19),
        ] {
            let mut c = RopeConfig::new(256, base, rt);
            c.n_rot = n_rot;
            c.attn_factor = attn_factor;
            if ff {
                c.freq_factors = Some((0..n_rot / 2).map(|j| 1.0 + (j % 7) as f32 * 1.3).collect());
            }
            v.push((
                format!("{rt:?} base {base} n_rot {n_rot} ff {ff} attn_factor {attn_factor}"),
                c,
            ));
        }
    }
    v
}

/// |rotation error| / |pair| for each pair of `got` vs `want` (rows of head_dim), and the check
/// that dimensions past n_rot are untouched.
fn rope_errors(c: &RopeConfig, x: &[f32], got: &[f32], want: &[f32], what: &str) -> f64 {
    let tol = tolerance("rope");
    let mut worst = 0.0f64;
    for (h, ((xh, gh), wh)) in x
        .chunks(c.head_dim)
        .zip(got.chunks(c.head_dim))
        .zip(want.chunks(c.head_dim))
        .enumerate()
    {
        for j in 0..c.n_rot / 2 {
            let (a, b) = c.pair(j);
            let norm = (xh[a] as f64).hypot(xh[b] as f64).max(1e-3);
            let err = (gh[a] as f64 - wh[a] as f64).hypot(gh[b] as f64 - wh[b] as f64) / norm;
            assert!(
                err <= tol,
                "rope {what}: head {h} pair {j}: error {err:.2e} > {tol:.0e}"
            );
            worst = worst.max(err);
        }
        let rotated: Vec<usize> = (0..c.n_rot / 2)
            .flat_map(|j| [c.pair(j).0, c.pair(j).1])
            .collect();
        for d in (0..c.head_dim).filter(|d| !rotated.contains(d)) {
            assert_eq!(
                gh[d], xh[d],
                "rope {what}: head {h} dim {d} (past n_rot) changed"
            );
        }
    }
    worst
}

/// The error an f32 angle would give (`pos as f32 * theta as f32`, f32 sin/cos), for the log.
fn naive_f32_error(c: &RopeConfig, pos: u32) -> f64 {
    (0..c.n_rot / 2)
        .map(|j| {
            let a32 = pos as f32 * c.theta(j) as f32;
            let a64 = pos as f64 * c.theta(j);
            (a32.cos() as f64 - a64.cos()).hypot(a32.sin() as f64 - a64.sin())
        })
        .fold(0.0, f64::max)
}

gpu_test!(rope_positions_layouts_freq_factors_partial_rotary, async {
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(9);
    let (n_heads, t) = (4u32, 2u32);
    let per = (t * n_heads * 256) as usize;
    let mut by_pos = [0.0f64; POSITIONS.len()];
    let mut naive = [0.0f64; POSITIONS.len()];
    for (name, c) in rope_configs() {
        let table = RopeTable::new(&ctx, &c).unwrap();
        let off = 7usize;
        let x = rng.vec(off + per * POSITIONS.len());
        let xb = ctx.storage_buffer("q", bytemuck::cast_slice(&x));
        submit(&ctx, |enc| {
            for (i, &p0) in POSITIONS.iter().enumerate() {
                rope::encode(
                    &ctx,
                    enc,
                    &table,
                    &xb,
                    (off + i * per) as u64,
                    t,
                    n_heads,
                    p0,
                )
                .unwrap();
            }
        });
        let got = read(&ctx, &xb, 0, x.len()).await;
        assert_eq!(&got[..off], &x[..off], "{name}: wrote before the offset");
        for (i, &p0) in POSITIONS.iter().enumerate() {
            let src = &x[off + i * per..off + (i + 1) * per];
            let want = rope::reference(&c, src, n_heads as usize, p0);
            let e = rope_errors(
                &c,
                src,
                &got[off + i * per..off + (i + 1) * per],
                &want,
                &format!("{name} pos {p0}"),
            );
            by_pos[i] = by_pos[i].max(e);
            naive[i] = naive[i].max(naive_f32_error(&c, p0 + 1));
        }
    }
    for (i, p) in POSITIONS.iter().enumerate() {
        tlog!(
            "rope pos {p}..{}: worst error {:.2e} (an f32 angle with f32 sin/cos: {:.2e})",
            p + 1,
            by_pos[i],
            naive[i]
        );
    }
});

gpu_test!(rope_small_heads_norm_and_neox, async {
    // head_dim 64 with n_rot 32, 3 heads, 5 tokens: odd counts for the dispatch.
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(10);
    for rt in [RopeType::Neox, RopeType::Norm] {
        let mut c = RopeConfig::new(64, 10000.0, rt);
        c.n_rot = 32;
        let table = RopeTable::new(&ctx, &c).unwrap();
        let x = rng.vec(5 * 3 * 64);
        let xb = ctx.storage_buffer("q", bytemuck::cast_slice(&x));
        submit(&ctx, |enc| {
            rope::encode(&ctx, enc, &table, &xb, 0, 5, 3, 4095).unwrap()
        });
        let got = read(&ctx, &xb, 0, x.len()).await;
        rope_errors(
            &c,
            &x,
            &got,
            &rope::reference(&c, &x, 3, 4095),
            &format!("{rt:?} 64/32"),
        );
    }
});

/// The rope table and a one-layer KV cache of `n_ctx` cells for a qk_rope case.
fn qk_rope_setup(
    ctx: &GpuContext,
    n_kv: u32,
    hd: usize,
    n_rot: usize,
    rt: RopeType,
    attn_factor: f32,
    n_ctx: u32,
) -> (RopeTable, KvCache) {
    let mut c = RopeConfig::new(hd, 10000.0, rt);
    c.n_rot = n_rot;
    c.attn_factor = attn_factor;
    let cache = KvCache::new(
        ctx,
        KvCacheConfig {
            n_ctx,
            n_kv_heads: n_kv,
            head_dim: hd as u32,
            layer_ropes: vec![c.clone()],
            shift_workgroup_size: None,
            max_scratch_cells: None,
        },
    )
    .unwrap();
    (RopeTable::new(ctx, &c).unwrap(), cache)
}

/// qk_rope's q and the K cache against the references (errors relative to each head's largest
/// value); K outside `cells` must still be 0. Returns the worst error.
fn qk_rope_check(
    what: &str,
    got_q: &[f32],
    want_q: &[f32],
    kc: &[f32],
    cells: std::ops::Range<usize>,
    want_k: &[f32],
    hd: usize,
) -> f64 {
    let to64 = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    let (wq, wk) = (to64(want_q), to64(want_k));
    let (dq, dk) = (row_max(&wq, hd), row_max(&wk, hd));
    let worst = check("qk_rope", &format!("{what}: q"), got_q, &wq, |i| dq[i]);
    let worst = worst.max(check(
        "qk_rope",
        &format!("{what}: k cells"),
        &kc[cells.clone()],
        &wk,
        |i| dk[i],
    ));
    assert!(
        kc[..cells.start]
            .iter()
            .chain(&kc[cells.end..])
            .all(|&v| v == 0.0),
        "{what}: K written outside its cells"
    );
    worst
}

gpu_test!(qk_rope_norms_ropes_and_writes_the_cache, async {
    // QK-norm (or none) + rope of q in place and of k into the cache, v copied, in one dispatch,
    // against the norm and rope references: the real model's 4 x 256 heads over 1 KV head
    // (NeoX), GQA 6 over 2 heads of 64 NORM with partial rotary, one token and several, and
    // heads of more pairs than a workgroup has threads.
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(23);
    let eps = 1e-6f32;
    let mut worst = 0.0f64;
    // The last: Phi-4-mini's form (partial rotary NeoX scaled by LongRoPE's attention factor).
    let cases = [
        (
            4u32,
            1u32,
            256usize,
            256usize,
            RopeType::Neox,
            1u32,
            true,
            1.0f32,
        ),
        (6, 2, 64, 32, RopeType::Norm, 3, true, 1.0),
        (6, 2, 64, 64, RopeType::Neox, 5, false, 1.0),
        (1, 1, 2, 2, RopeType::Norm, 1, true, 1.0),
        (3, 1, 96, 72, RopeType::Neox, 2, false, 1.19),
        // 160 pairs a head: two a thread of a 128-thread workgroup (PPT 2), the second masked
        // on most threads.
        (2, 1, 320, 320, RopeType::Neox, 2, true, 1.0),
    ];
    for (n_head, n_kv, hd, n_rot, rt, t, norm, attn_factor) in cases {
        let what = format!(
            "{n_head}/{n_kv} heads of {hd} n_rot {n_rot} {rt:?} {t} tokens norm {norm} attn_factor {attn_factor}"
        );
        let n_ctx = 20u32;
        let (table, cache) = qk_rope_setup(&ctx, n_kv, hd, n_rot, rt, attn_factor, n_ctx);
        let pos0 = 7u32;
        let (qn, kn) = ((t * n_head) as usize * hd, (t * n_kv) as usize * hd);
        // Mixed magnitudes, so the norm is not near 1.
        let q: Vec<f32> = rng.vec(3 + qn).iter().map(|v| v * 5.0 + 0.3).collect();
        let kv: Vec<f32> = rng.vec(1 + 2 * kn).iter().map(|v| v * 3.0).collect();
        let w: Vec<f32> = rng.vec(2 * hd).iter().map(|v| 1.0 + v).collect();
        let qb = ctx.storage_buffer("q", bytemuck::cast_slice(&q));
        let kvb = ctx.storage_buffer("kv", bytemuck::cast_slice(&kv));
        let wb = ctx.storage_buffer("qk norm", bytemuck::cast_slice(&w));
        let b = QkvBuffers {
            q: &qb,
            q_offset: 3,
            k: &kvb,
            k_offset: 1,
            v: &kvb,
            v_offset: 1 + kn as u64,
            k_cache: cache.k(0),
            v_cache: cache.v(0),
        };
        let norm_arg = if norm { Some((&wb, eps)) } else { None };
        submit(&ctx, |enc| {
            qk_rope::encode(&ctx, enc, &table, &b, t, n_head, n_kv, norm_arg, pos0).unwrap()
        });
        let (want_q, want_k) = qk_rope::reference(
            &table,
            &q[3..],
            &kv[1..1 + kn],
            n_head as usize,
            n_kv as usize,
            if norm { Some((&w, eps)) } else { None },
            pos0,
        );
        let got_q = read(&ctx, &qb, 3, qn).await;
        let row = n_kv as usize * hd;
        let kc = read(&ctx, cache.k(0), 0, n_ctx as usize * row).await;
        let vc = read(&ctx, cache.v(0), 0, n_ctx as usize * row).await;
        let cells = pos0 as usize * row..(pos0 + t) as usize * row;
        worst = worst.max(qk_rope_check(
            &what,
            &got_q,
            &want_q,
            &kc,
            cells.clone(),
            &want_k,
            hd,
        ));
        assert_eq!(
            &vc[cells.clone()],
            &kv[1 + kn..1 + 2 * kn],
            "{what}: V cells"
        );
        assert!(
            vc[..cells.start]
                .iter()
                .chain(&vc[cells.end..])
                .all(|&v| v == 0.0),
            "{what}: V written outside its cells"
        );
        // Past the cache's end, and q sharing k's buffer, are refused.
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        assert!(
            qk_rope::encode(&ctx, &mut enc, &table, &b, t, n_head, n_kv, norm_arg, n_ctx).is_err()
        );
        let shared = QkvBuffers { q: &kvb, ..b };
        assert!(
            qk_rope::encode(&ctx, &mut enc, &table, &shared, t, n_head, n_kv, norm_arg, 0).is_err()
        );
    }
    tlog!(
        "qk_rope: worst error {worst:.2e} (tolerance {:.0e})",
        tolerance("qk_rope")
    );
});

gpu_test!(qk_rope_reads_q_k_v_from_one_fused_output, async {
    // The forward pass's form: q, k and v are columns of one projection output (T, stride) with
    // columns before, between and after them; the roped q goes to its own buffer. Same cases and
    // references as the separate form.
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(29);
    let eps = 1e-6f32;
    let mut worst = 0.0f64;
    let cases = [
        (
            4u32,
            1u32,
            256usize,
            256usize,
            RopeType::Neox,
            1u32,
            true,
            1.0f32,
        ),
        (6, 2, 64, 32, RopeType::Norm, 3, true, 1.0),
        (6, 2, 64, 64, RopeType::Neox, 5, false, 1.0),
        (3, 1, 96, 72, RopeType::Neox, 2, false, 1.19),
        // 160 pairs a head: two a thread of a 128-thread workgroup (PPT 2), the second masked
        // on most threads.
        (2, 1, 320, 320, RopeType::Neox, 2, true, 1.0),
    ];
    // Each case also with every q head followed by its output gate (Qwen3.5's q projection).
    let cases = cases.into_iter().flat_map(|c| [(c, false), (c, true)]);
    for ((n_head, n_kv, hd, n_rot, rt, t, norm, attn_factor), gated) in cases {
        let what = format!(
            "fused {n_head}/{n_kv} heads of {hd} n_rot {n_rot} {rt:?} {t} tokens norm {norm} attn_factor {attn_factor} gated {gated}"
        );
        let n_ctx = 20u32;
        let (table, cache) = qk_rope_setup(&ctx, n_kv, hd, n_rot, rt, attn_factor, n_ctx);
        let pos0 = 4u32;
        let (qw, kw) = (n_head as usize * hd, n_kv as usize * hd);
        // Row of a token: 5 columns of padding, q (heads qhs apart), 3, k, v, 2.
        let qhs = if gated { 2 * hd } else { hd };
        let (q_col, k_col) = (5usize, 5 + n_head as usize * qhs + 3);
        let v_col = k_col + kw;
        let stride = v_col + kw + 2;
        let src: Vec<f32> = rng
            .vec(t as usize * stride)
            .iter()
            .map(|v| v * 4.0 + 0.2)
            .collect();
        let cols = |c0: usize, w: usize| -> Vec<f32> {
            (0..t as usize)
                .flat_map(|i| src[i * stride + c0..i * stride + c0 + w].to_vec())
                .collect()
        };
        let q: Vec<f32> = (0..t as usize * n_head as usize)
            .flat_map(|r| {
                let b = r / n_head as usize * stride + q_col + r % n_head as usize * qhs;
                src[b..b + hd].to_vec()
            })
            .collect();
        let (k, v) = (cols(k_col, kw), cols(v_col, kw));
        let w: Vec<f32> = rng.vec(2 * hd).iter().map(|v| 1.0 + v).collect();
        let sb = ctx.storage_buffer("qkv", bytemuck::cast_slice(&src));
        let qo = ctx
            .empty_storage("q out", (t as usize * qw * 4) as u64)
            .unwrap();
        let wb = ctx.storage_buffer("qk norm", bytemuck::cast_slice(&w));
        let f = qk_rope::FusedQkv {
            src: &sb,
            stride: stride as u64,
            q_col: q_col as u64,
            q_head_stride: qhs as u64,
            k_col: k_col as u64,
            v_col: v_col as u64,
            q_out: &qo,
            k_cache: cache.k(0),
            v_cache: cache.v(0),
        };
        let norm_arg = if norm { Some((&wb, eps)) } else { None };
        submit(&ctx, |enc| {
            let mut rec = Recorder::new(&ctx);
            qk_rope::prepare_fused(
                &mut rec,
                &table,
                &f,
                t,
                n_head,
                n_kv,
                norm_arg,
                pos0,
                ctx.zero_step(),
            )
            .unwrap();
            rec.encode(enc).unwrap();
        });
        let (want_q, want_k) = qk_rope::reference(
            &table,
            &q,
            &k,
            n_head as usize,
            n_kv as usize,
            if norm { Some((&w, eps)) } else { None },
            pos0,
        );
        let got_q = read(&ctx, &qo, 0, q.len()).await;
        let kc = read(&ctx, cache.k(0), 0, n_ctx as usize * kw).await;
        let vc = read(&ctx, cache.v(0), 0, n_ctx as usize * kw).await;
        let cells = pos0 as usize * kw..(pos0 + t) as usize * kw;
        worst = worst.max(qk_rope_check(
            &what,
            &got_q,
            &want_q,
            &kc,
            cells.clone(),
            &want_k,
            hd,
        ));
        assert_eq!(&vc[cells.clone()], &v[..], "{what}: V cells");
        assert_eq!(
            read(&ctx, &sb, 0, src.len()).await,
            src,
            "{what}: the source is read only"
        );
        // Columns past the row, and the roped q written over the source, are refused.
        let mut rec = Recorder::new(&ctx);
        let past = qk_rope::FusedQkv {
            v_col: (stride - kw + 1) as u64,
            ..f
        };
        assert!(qk_rope::prepare_fused(
            &mut rec,
            &table,
            &past,
            t,
            n_head,
            n_kv,
            norm_arg,
            pos0,
            ctx.zero_step()
        )
        .is_err());
        let over = qk_rope::FusedQkv { q_out: &sb, ..f };
        assert!(qk_rope::prepare_fused(
            &mut rec,
            &table,
            &over,
            t,
            n_head,
            n_kv,
            norm_arg,
            pos0,
            ctx.zero_step()
        )
        .is_err());
    }
    tlog!(
        "qk_rope fused: worst error {worst:.2e} (tolerance {:.0e})",
        tolerance("qk_rope")
    );
});

gpu_test!(rope_kv_write_lands_in_cells_pos0_on, async {
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(12);
    // (n_kv_heads, head_dim, n_rot, layout): the real model's 1 x 256 NeoX; 2 x 64 NORM, n_rot 32.
    for (n_kv, hd, n_rot, rt) in [
        (1u32, 256usize, 256usize, RopeType::Neox),
        (2, 64, 32, RopeType::Norm),
    ] {
        let mut c = RopeConfig::new(hd, 10000.0, rt);
        c.n_rot = n_rot;
        let n_ctx = 16u32;
        let cache = KvCache::new(
            &ctx,
            KvCacheConfig {
                n_ctx,
                n_kv_heads: n_kv,
                head_dim: hd as u32,
                layer_ropes: vec![c.clone(), c.clone()],
                shift_workgroup_size: None,
                max_scratch_cells: None,
            },
        )
        .unwrap();
        let table = RopeTable::new(&ctx, &c).unwrap();
        let (t, pos0) = (3u32, 5u32);
        let row = n_kv as usize * hd;
        // k and v in one buffer (as a fused K|V output would be): k at 2, v after it.
        let kv = rng.vec(2 + 2 * t as usize * row);
        let (k_off, v_off) = (2usize, 2 + t as usize * row);
        let kvb = ctx.storage_buffer("kv", bytemuck::cast_slice(&kv));
        submit(&ctx, |enc| {
            rope::encode_kv_write(
                &ctx,
                enc,
                &table,
                &kvb,
                k_off as u64,
                &kvb,
                v_off as u64,
                t,
                n_kv,
                pos0,
                cache.k(1),
                cache.v(1),
            )
            .unwrap()
        });
        let kc = read(&ctx, cache.k(1), 0, n_ctx as usize * row).await;
        let vc = read(&ctx, cache.v(1), 0, n_ctx as usize * row).await;
        let k = &kv[k_off..v_off];
        let want = rope::reference(&c, k, n_kv as usize, pos0);
        let cells = pos0 as usize * row..(pos0 + t) as usize * row;
        rope_errors(
            &c,
            k,
            &kc[cells.clone()],
            &want,
            &format!("kv_write {rt:?} {n_kv}x{hd}"),
        );
        assert_eq!(
            &vc[cells.clone()],
            &kv[v_off..v_off + t as usize * row],
            "V cells"
        );
        assert!(
            kc[..cells.start]
                .iter()
                .chain(&kc[cells.end..])
                .all(|&v| v == 0.0),
            "K written outside cells {pos0}.."
        );
        assert!(
            vc[..cells.start]
                .iter()
                .chain(&vc[cells.end..])
                .all(|&v| v == 0.0),
            "V written outside cells {pos0}.."
        );
        let k0 = read(&ctx, cache.k(0), 0, n_ctx as usize * row).await;
        assert!(k0.iter().all(|&v| v == 0.0), "another layer was written");
        // Past the cache's end is refused.
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        assert!(rope::encode_kv_write(
            &ctx,
            &mut enc,
            &table,
            &kvb,
            0,
            &kvb,
            0,
            t,
            n_kv,
            n_ctx - 2,
            cache.k(1),
            cache.v(1)
        )
        .is_err());
    }
});

// ---------------------------------------------------------------------------------------------
// glu

// Qwen3.5's attention output gate: out (T, heads, hd) *= sigmoid(gate), each head's gate after
// its q in a projection row of `row` elements (heads 2 hd apart): rows (token, head) in groups of
// `heads`. Head sizes 16 and 7 (odd), 1 and 3 tokens, in place in out's buffer.
gpu_test!(glu_sigmoid_gate_grouped_by_head, async {
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(17);
    for (t, heads, hd) in [(3usize, 4usize, 16usize), (1, 3, 7), (3, 1, 7)] {
        let row = 2 * heads * hd + 5; // q|gate per head, then k, v, ... (5 here)
        let proj: Vec<f32> = rng.vec(t * row).iter().map(|v| v * 12.0).collect();
        let att = rng.vec(t * heads * hd);
        let gate: Vec<f32> = (0..t * heads)
            .flat_map(|r| {
                let b = r / heads * row + r % heads * 2 * hd + hd;
                proj[b..b + hd].to_vec()
            })
            .collect();
        let want = glu::reference(Activation::Sigmoid, &gate, &att);
        let pb = ctx.storage_buffer("proj", bytemuck::cast_slice(&proj));
        let ab = ctx.storage_buffer("att", bytemuck::cast_slice(&att));
        let a = View {
            buffer: &ab,
            offset: 0,
            stride: hd as u64,
        };
        let g = View {
            buffer: &pb,
            offset: hd as u64,
            stride: 2 * hd as u64,
        };
        submit(&ctx, |enc| {
            let mut rec = Recorder::new(&ctx);
            glu::prepare_grouped(
                &mut rec,
                Activation::Sigmoid,
                g,
                (heads as u32, row as u64),
                a,
                a,
                (t * heads) as u32,
                hd as u32,
            )
            .unwrap();
            rec.encode(enc).unwrap();
        });
        check(
            "glu",
            &format!("sigmoid gate {t} tokens x {heads} heads of {hd}"),
            &read(&ctx, &ab, 0, t * heads * hd).await,
            &want,
            |i| att[i].abs() as f64,
        );
        // A group of no rows is refused.
        let mut rec = Recorder::new(&ctx);
        assert!(
            glu::prepare_grouped(&mut rec, Activation::Sigmoid, g, (0, 0), a, a, 1, 1).is_err()
        );
    }
});

// The gated unit quantized to 8 bits per block of 32 (`glu::prepare_q8`, what a GEMV with
// 8-bit items reads): one row of 96 from separate buffers with a block of zeros and one of
// tiny values, and three rows of the fused gate|up halves (2048 a row, at an odd offset) for
// each activation, against `glu::reference_q8` of the f64 unit. A quant may differ by one where
// the unit sits at a rounding tie within the GLU's own error (`glu` tolerance); the scale and
// the half-block sums within that error; and inputs it cannot take are refused.
gpu_test!(glu_q8_output, async {
    use cera_web::gpu::readback::read_buffer;
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(29);
    let tol = tolerance("glu");
    let (mut worst_scale, mut worst_sum, mut off_by_one) = (0.0f64, 0.0f64, 0usize);
    let mut values = 0usize;
    for act in [Activation::Silu, Activation::GeluTanh, Activation::Sigmoid] {
        for (t, nff, off) in [(1usize, 96usize, 0usize), (3, 2048, 1)] {
            let mut fused: Vec<f32> = rng.vec(off + t * 2 * nff).iter().map(|v| v * 6.0).collect();
            if nff == 96 {
                // Gate 0 gives a unit of 0 (SiLU, GELU) in block 0; block 1 is tiny.
                fused[..32].fill(0.0);
                for v in &mut fused[off + nff + 32..off + nff + 64] {
                    *v *= 1e-20;
                }
            }
            let row = |r: usize, half: usize| {
                let a = off + r * 2 * nff + half * nff;
                fused[a..a + nff].to_vec()
            };
            let gate: Vec<f32> = (0..t).flat_map(|r| row(r, 0)).collect();
            let up: Vec<f32> = (0..t).flat_map(|r| row(r, 1)).collect();
            let unit: Vec<f32> = glu::reference(act, &gate, &up)
                .iter()
                .map(|&v| v as f32)
                .collect();
            let fb = ctx.storage_buffer("fused", bytemuck::cast_slice(&fused));
            let gv = View {
                buffer: &fb,
                offset: off as u64,
                stride: 2 * nff as u64,
            };
            let uv = View {
                offset: (off + nff) as u64,
                ..gv
            };
            let bytes = glu::q8_bytes(t as u64, nff as u64);
            let ob = ctx.empty_storage("q8", bytes).unwrap();
            let mut rec = Recorder::new(&ctx);
            glu::prepare_q8(&mut rec, act, gv, uv, &ob, t as u32, nff as u32).unwrap();
            // Refused: a row not of whole blocks, out in an input's buffer, out too small.
            assert!(glu::prepare_q8(&mut rec, act, gv, uv, &ob, t as u32, 40).is_err());
            assert!(glu::prepare_q8(&mut rec, act, gv, uv, &fb, t as u32, nff as u32).is_err());
            let small = ctx.empty_storage("small", bytes - 4).unwrap();
            assert!(glu::prepare_q8(&mut rec, act, gv, uv, &small, t as u32, nff as u32).is_err());
            submit(&ctx, |enc| rec.encode(enc).unwrap());
            let got = read_buffer(&ctx, &ob, 0, bytes).await.unwrap();
            let words: &[u32] = bytemuck::cast_slice(&got);
            for r in 0..t {
                let base = r * 3 * nff / 8;
                let vals = &unit[r * nff..(r + 1) * nff];
                for (b, (q, d, s0, s1)) in glu::reference_q8(vals).into_iter().enumerate() {
                    let blk = &vals[32 * b..32 * b + 32];
                    let sum_abs: f64 = blk.iter().map(|v| v.abs() as f64).sum();
                    let sb = base + nff / 4 + 4 * b;
                    let gd = f32::from_bits(words[sb]) as f64;
                    let (g0, g1) = (
                        f32::from_bits(words[sb + 1]) as f64,
                        f32::from_bits(words[sb + 2]) as f64,
                    );
                    let what = format!("{act:?} {t}x{nff} row {r} block {b}");
                    let e = (gd - d as f64).abs() / (d as f64).max(1e-37);
                    assert!(
                        d == 0.0 && gd == 0.0 || e <= 4.0 * tol,
                        "{what}: d {gd} want {d}"
                    );
                    worst_scale = worst_scale.max(if d == 0.0 { 0.0 } else { e });
                    for (g, w) in [(g0, s0), (g1, s1)] {
                        let e = (g - w as f64).abs() / sum_abs.max(1e-37);
                        assert!(e <= 4.0 * tol, "{what}: half sum {g} want {w}");
                        worst_sum = worst_sum.max(e);
                    }
                    assert_eq!(words[sb + 3], 0, "{what}: the fourth word");
                    for k in 0..32 {
                        let gq = (words[base + 8 * b + k / 4] >> (8 * (k % 4))) as u8 as i8;
                        let diff = (gq as i32 - q[k] as i32).abs();
                        // A tie: the unit times 127 / max within the GLU's error of n + 0.5.
                        let scaled = blk[k] as f64 / d as f64;
                        let near_tie = (scaled.abs().fract() - 0.5).abs() <= 200.0 * tol;
                        assert!(
                            diff == 0 || diff == 1 && near_tie,
                            "{what}: value {k} quantized to {gq}, want {} ({scaled})",
                            q[k]
                        );
                        off_by_one += diff as usize;
                        values += 1;
                    }
                }
            }
        }
    }
    tlog!(
        "glu q8: worst scale error {worst_scale:.2e}, half sums {worst_sum:.2e}, {off_by_one} of \
         {values} quants one off at a tie"
    );
});

gpu_test!(glu_silu_gelu_shapes_and_aliasing, async {
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(13);
    let mut worst = 0.0f64;
    for act in [Activation::Silu, Activation::GeluTanh] {
        // One row of 37: three separate buffers.
        let g: Vec<f32> = rng.vec(37).iter().map(|v| v * 12.0).collect();
        let u = rng.vec(37);
        let (gb, ub) = (
            ctx.storage_buffer("g", bytemuck::cast_slice(&g)),
            ctx.storage_buffer("u", bytemuck::cast_slice(&u)),
        );
        let ob = ctx.empty_storage("o", 37 * 4).unwrap();
        submit(&ctx, |enc| {
            glu::encode(
                &ctx,
                enc,
                act,
                View::rows(&gb, 0, 37),
                View::rows(&ub, 0, 37),
                View::rows(&ob, 0, 37),
                1,
                37,
            )
            .unwrap()
        });
        let want = glu::reference(act, &g, &u);
        let denom = |i: usize| (u[i].abs() * g[i].abs().max(1.0)) as f64;
        worst = worst.max(check(
            "glu",
            &format!("{act:?} 1x37"),
            &read(&ctx, &ob, 0, 37).await,
            &want,
            denom,
        ));

        // The real model's FFN: (3, 2 * 2048) fused gate|up in one buffer, out elsewhere, then
        // in place into the gate half of the same buffer (gate, up and out all one buffer).
        let (t, nff) = (3usize, 2048usize);
        let fused: Vec<f32> = rng.vec(1 + t * 2 * nff).iter().map(|v| v * 6.0).collect();
        let gate: Vec<f32> = (0..t)
            .flat_map(|r| fused[1 + r * 2 * nff..1 + r * 2 * nff + nff].to_vec())
            .collect();
        let up: Vec<f32> = (0..t)
            .flat_map(|r| fused[1 + r * 2 * nff + nff..1 + (r + 1) * 2 * nff].to_vec())
            .collect();
        let want = glu::reference(act, &gate, &up);
        let denom = |i: usize| (up[i].abs() * gate[i].abs().max(1.0)) as f64;
        let fb = ctx.storage_buffer("fused", bytemuck::cast_slice(&fused));
        let ob = ctx.empty_storage("o", (t * nff * 4) as u64).unwrap();
        let gv = View {
            buffer: &fb,
            offset: 1,
            stride: 2 * nff as u64,
        };
        let uv = View {
            buffer: &fb,
            offset: 1 + nff as u64,
            stride: 2 * nff as u64,
        };
        submit(&ctx, |enc| {
            glu::encode(
                &ctx,
                enc,
                act,
                gv,
                uv,
                View::rows(&ob, 0, nff as u64),
                t as u32,
                nff as u32,
            )
            .unwrap();
            glu::encode(&ctx, enc, act, gv, uv, gv, t as u32, nff as u32).unwrap();
        });
        worst = worst.max(check(
            "glu",
            &format!("{act:?} {t}x{nff} fused halves"),
            &read(&ctx, &ob, 0, t * nff).await,
            &want,
            denom,
        ));
        let inplace = read(&ctx, &fb, 0, fused.len()).await;
        let got: Vec<f32> = (0..t)
            .flat_map(|r| inplace[1 + r * 2 * nff..1 + r * 2 * nff + nff].to_vec())
            .collect();
        worst = worst.max(check(
            "glu",
            &format!("{act:?} in place into the gate half"),
            &got,
            &want,
            denom,
        ));

        // Out in up's buffer (in place over up), gate separate.
        let ub2 = ctx.storage_buffer("u2", bytemuck::cast_slice(&up));
        let gb2 = ctx.storage_buffer("g2", bytemuck::cast_slice(&gate));
        let n = (t * nff) as u64;
        submit(&ctx, |enc| {
            glu::encode(
                &ctx,
                enc,
                act,
                View::rows(&gb2, 0, n),
                View::rows(&ub2, 0, n),
                View::rows(&ub2, 0, n),
                1,
                n as u32,
            )
            .unwrap()
        });
        worst = worst.max(check(
            "glu",
            &format!("{act:?} in place over up"),
            &read(&ctx, &ub2, 0, n as usize).await,
            &want,
            denom,
        ));
    }
    // Saturation: large |gate| gives finite values.
    let g = [-100.0f32, -30.0, 30.0, 100.0, 0.0];
    let u = [1.0f32; 5];
    for act in [Activation::Silu, Activation::GeluTanh] {
        let (gb, ub) = (
            ctx.storage_buffer("g", bytemuck::cast_slice(&g)),
            ctx.storage_buffer("u", bytemuck::cast_slice(&u)),
        );
        let ob = ctx.empty_storage("o", 20).unwrap();
        submit(&ctx, |enc| {
            glu::encode(
                &ctx,
                enc,
                act,
                View::rows(&gb, 0, 5),
                View::rows(&ub, 0, 5),
                View::rows(&ob, 0, 5),
                1,
                5,
            )
            .unwrap()
        });
        let got = read(&ctx, &ob, 0, 5).await;
        check(
            "glu",
            &format!("{act:?} saturation"),
            &got,
            &glu::reference(act, &g, &u),
            |i| g[i].abs().max(1.0) as f64,
        );
    }
    tlog!(
        "glu: worst error {worst:.2e} (tolerance {:.0e})",
        tolerance("glu")
    );
});

// ---------------------------------------------------------------------------------------------
// elementwise

gpu_test!(elementwise_add_scaled_bias_scale_and_aliasing, async {
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(14);
    let mut worst = 0.0f64;
    let denom = |a: &[f32], b: &[f32], s: f32, bl: usize| -> Vec<f64> {
        a.iter()
            .enumerate()
            .map(|(i, &x)| x.abs() as f64 + (b[i % bl] * s).abs() as f64)
            .collect()
    };
    for (n_rows, n_cols) in [(1u32, 1u32), (1, 641), (3, 640), (2, 2048)] {
        let n = (n_rows * n_cols) as usize;
        let a = rng.vec(2 + n);
        let b = rng.vec(3 + n);
        let s = 0.22f32;
        let want = elementwise::reference_add_scaled(&a[2..], &b[3..], s, n_cols as usize);
        let d = denom(&a[2..], &b[3..], s, n);
        let what = format!("{n_rows}x{n_cols}");
        let ab = ctx.storage_buffer("a", bytemuck::cast_slice(&a));
        let bb = ctx.storage_buffer("b", bytemuck::cast_slice(&b));
        let ob = ctx.empty_storage("o", (n * 4 + 4) as u64).unwrap();
        let nc = n_cols as u64;
        // Three buffers, then in place (out = a: the residual add).
        submit(&ctx, |enc| {
            elementwise::add_scaled(
                &ctx,
                enc,
                View::rows(&ab, 2, nc),
                View::rows(&bb, 3, nc),
                s,
                View::rows(&ob, 1, nc),
                n_rows,
                n_cols,
            )
            .unwrap();
            elementwise::add_scaled(
                &ctx,
                enc,
                View::rows(&ab, 2, nc),
                View::rows(&bb, 3, nc),
                s,
                View::rows(&ab, 2, nc),
                n_rows,
                n_cols,
            )
            .unwrap();
        });
        worst = worst.max(check(
            "elementwise",
            &format!("add {what}"),
            &read(&ctx, &ob, 1, n).await,
            &want,
            |i| d[i],
        ));
        worst = worst.max(check(
            "elementwise",
            &format!("add in place {what}"),
            &read(&ctx, &ab, 2, n).await,
            &want,
            |i| d[i],
        ));
        // a and b in one buffer, out in another; then all three in one buffer (out = b's range).
        let mut ab2 = a[2..].to_vec();
        ab2.extend(&b[3..]);
        let one = ctx.storage_buffer("a|b", bytemuck::cast_slice(&ab2));
        submit(&ctx, |enc| {
            let (av, bv) = (View::rows(&one, 0, nc), View::rows(&one, n as u64, nc));
            elementwise::add_scaled(&ctx, enc, av, bv, s, View::rows(&ob, 1, nc), n_rows, n_cols)
                .unwrap();
            elementwise::add_scaled(&ctx, enc, av, bv, s, bv, n_rows, n_cols).unwrap();
        });
        worst = worst.max(check(
            "elementwise",
            &format!("add a|b {what}"),
            &read(&ctx, &ob, 1, n).await,
            &want,
            |i| d[i],
        ));
        worst = worst.max(check(
            "elementwise",
            &format!("add all in one {what}"),
            &read(&ctx, &one, n as u64, n).await,
            &want,
            |i| d[i],
        ));
        // Scale in place.
        let xb = ctx.storage_buffer("x", bytemuck::cast_slice(&b));
        submit(&ctx, |enc| {
            elementwise::scale(
                &ctx,
                enc,
                View::rows(&xb, 3, nc),
                1.0 / 16.0,
                n_rows,
                n_cols,
            )
            .unwrap()
        });
        let got = read(&ctx, &xb, 0, 3 + n).await;
        assert_eq!(&got[..3], &b[..3]);
        worst = worst.max(check(
            "elementwise",
            &format!("scale {what}"),
            &got[3..],
            &elementwise::reference_scale(&b[3..], 1.0 / 16.0),
            |i| b[3 + i].abs() as f64,
        ));
    }
    // Bias (37) added to 3 rows 40 apart (a strided view), leaving the gaps alone.
    let (rows, cols, stride) = (3usize, 37usize, 40usize);
    let x = rng.vec(rows * stride);
    let bias = rng.vec(cols);
    let xb = ctx.storage_buffer("x", bytemuck::cast_slice(&x));
    let bt = f32_tensor(&ctx, "bias", &bias);
    submit(&ctx, |enc| {
        elementwise::bias_add(
            &ctx,
            enc,
            View {
                buffer: &xb,
                offset: 0,
                stride: stride as u64,
            },
            &bt,
            rows as u32,
            cols as u32,
        )
        .unwrap()
    });
    let got = read(&ctx, &xb, 0, x.len()).await;
    for r in 0..rows {
        let row: Vec<f32> = x[r * stride..r * stride + cols].to_vec();
        let want = elementwise::reference_add_scaled(&row, &bias, 1.0, cols);
        let d = denom(&row, &bias, 1.0, cols);
        worst = worst.max(check(
            "elementwise",
            &format!("bias row {r}"),
            &got[r * stride..r * stride + cols],
            &want,
            |i| d[i],
        ));
        assert_eq!(
            &got[r * stride + cols..(r + 1) * stride],
            &x[r * stride + cols..(r + 1) * stride],
            "bias: gap of row {r}"
        );
    }
    tlog!(
        "elementwise: worst error {worst:.2e} (tolerance {:.0e})",
        tolerance("elementwise")
    );
});
