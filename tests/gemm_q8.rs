//! The 8-bit GEMM (`ops::gemm_q8`) and its X quantizer (`ops::quantize_x8`) against CPU
//! references, natively and in headless Chrome.
//!
//! - `quantize_x8` in both styles (llama.cpp's Q8_0 and Q8_K activations) against a CPU
//!   transcription of llama.cpp's rounding: rows with offsets and strides, a zero block, a block
//!   of tiny values, a block whose largest value is negative.
//! - `gemm_q8` for every type it reads and every tile the device allows, on the X the GPU
//!   quantized (read back): row counts no tile divides (1, 37, 130), token counts no tile
//!   divides (1, 7, 65), X rows at a word offset with spare words between them, a Y row stride
//!   wider than the rows (the gap must stay untouched), a tensor split into 3 parts
//!   (bit-identical to the unsplit one), and a grid of more than 65535 workgroups.
//!
//! The reference is the kernel's arithmetic in f64: per block, the dequantized W times the
//! dequantized 8-bit X, plus the min's term on the sum X's layout carries, `mw (dx sum qx - sx)`
//! (zero when the sum is `dx sum qx`, as the quantizer writes it). Everything the kernel
//! computes is an f32 sum of exact integer dot products, so the bound is f32 rounding.

mod common;

use cera_web::gguf::GgmlType;
use cera_web::gpu::readback::{read_buffer, read_f32};
use cera_web::gpu::{GpuContext, GpuTensor, Recorder};
use cera_web::ops::gemm::GemmConfig;
use cera_web::ops::quantize_x8::Style;
use cera_web::ops::{gemm_q8, quantize_x8};
use cera_web::quant::dequantize_to_vec;
use cera_web::quant::gpu::{synthetic_rows, upload_tensor};
use common::Rng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// Max |gpu - reference| / (sum_c |W_c X^_c| + sum_b |mw_b sx_b|).
const TOLERANCE: f64 = 2e-6;

/// Words before token 0's row of 8-bit X, spare words after each row, and elements before
/// Y[0, 0] and after each Y row.
const X_OFF: u64 = 3;
const X_PAD: u64 = 5;
const Y_OFF: u64 = 3;
const Y_PAD: u64 = 3;
/// What Y holds before the product: every element not an output must still hold it after.
const SENTINEL: f32 = -777.0;

fn f16(b: &[u8]) -> f64 {
    half_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64
}

fn half_to_f32(h: u16) -> f32 {
    let sign = if h >> 15 == 1 { -1.0f32 } else { 1.0 };
    let e = ((h >> 10) & 31) as i32;
    let m = (h & 1023) as f32;
    match e {
        0 => sign * m * 2f32.powi(-24),
        31 => sign * f32::INFINITY,
        _ => sign * (1.0 + m / 1024.0) * 2f32.powi(e - 15),
    }
}

/// The min each value of block `b` (32 values) of each row subtracts, `mw`, from the GGUF bytes:
/// 0 for Q8_0, 8 d for Q4_0, dmin * m_j for Q4_K (ggml's get_scale_min_k4).
fn mins(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Vec<f64> {
    let nb = cols / 32;
    let mut out = vec![0.0; rows * nb];
    match ty {
        GgmlType::Q8_0 => {}
        GgmlType::Q4_0 => {
            for (i, blk) in bytes.chunks_exact(18).enumerate() {
                out[i] = 8.0 * f16(&blk[0..2]);
            }
        }
        GgmlType::Q4K => {
            for (i, blk) in bytes.chunks_exact(144).enumerate() {
                let dmin = f16(&blk[2..4]);
                let q = &blk[4..16];
                for j in 0..8 {
                    let m = if j < 4 {
                        q[j + 4] & 63
                    } else {
                        (q[j + 4] >> 4) | ((q[j] >> 6) << 4)
                    };
                    out[8 * i + j] = dmin * m as f64;
                }
            }
        }
        other => panic!("no min rule for {other}"),
    }
    out
}

/// X quantized by the GPU in `style`: `n_tokens` rows of `cols` values, each row's words.
async fn quantize(
    ctx: &GpuContext,
    style: Style,
    xs: &[f32],
    n_tokens: u32,
    cols: u64,
) -> Vec<u32> {
    let x = ctx.storage_buffer("x", bytemuck::cast_slice(xs));
    let bytes = quantize_x8::bytes(n_tokens as u64, cols);
    let out = ctx.empty_storage("xq", bytes).unwrap();
    let mut rec = Recorder::new(ctx);
    quantize_x8::prepare(&mut rec, style, &x, 0, cols, &out, n_tokens, cols as u32).unwrap();
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    rec.encode(&mut enc).unwrap();
    ctx.queue.submit([enc.finish()]);
    let raw = read_buffer(ctx, &out, 0, bytes).await.unwrap();
    bytemuck::cast_slice(&raw).to_vec()
}

/// Token t's (quants, dx, sx) of block b, from quantized rows of `cols` values.
fn x_block(words: &[u32], cols: usize, t: usize, b: usize) -> ([i8; 32], f64, f64) {
    let rw = quantize_x8::row_words(cols as u64) as usize;
    let row = &words[t * rw..(t + 1) * rw];
    let mut q = [0i8; 32];
    for (k, v) in q.iter_mut().enumerate() {
        *v = (row[8 * b + k / 4] >> (8 * (k % 4))) as u8 as i8;
    }
    let s = &row[cols / 4 + 4 * b..];
    let d = f32::from_bits(s[0]) as f64;
    let sx = f32::from_bits(s[1]) as f64 + f32::from_bits(s[2]) as f64;
    (q, d, sx)
}

/// Run every tile on `w` with the quantized rows `xq` (laid out at X_OFF with X_PAD spare words
/// a row) and return, per tile, its Y region `(Y_OFF + n_tokens * y_stride)`.
async fn run_tiles(
    ctx: &GpuContext,
    tiles: &[GemmConfig],
    w: &GpuTensor,
    xq: &[u32],
    n_tokens: u32,
) -> Vec<Vec<f32>> {
    let rw = quantize_x8::row_words(w.cols) as usize;
    let stride = rw + X_PAD as usize;
    let mut padded = vec![0x5a5a_5a5au32; X_OFF as usize + n_tokens as usize * stride];
    for t in 0..n_tokens as usize {
        let at = X_OFF as usize + t * stride;
        padded[at..at + rw].copy_from_slice(&xq[t * rw..(t + 1) * rw]);
    }
    let x = ctx.storage_buffer("xq", bytemuck::cast_slice(&padded));
    let y_stride = w.rows + Y_PAD;
    let region = (Y_OFF + n_tokens as u64 * y_stride) as usize;
    let y = ctx.storage_buffer(
        "y",
        bytemuck::cast_slice(&vec![SENTINEL; region * tiles.len()]),
    );
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    for (i, cfg) in tiles.iter().enumerate() {
        let mut rec = Recorder::new(ctx);
        gemm_q8::prepare(
            &mut rec,
            *cfg,
            w,
            &x,
            X_OFF,
            Some(stride as u64),
            &y,
            (i * region) as u64 + Y_OFF,
            Some(y_stride),
            n_tokens,
        )
        .unwrap();
        rec.encode(&mut enc).unwrap();
    }
    ctx.queue.submit([enc.finish()]);
    let all = read_f32(ctx, &y, 0, region * tiles.len()).await.unwrap();
    all.chunks(region).map(|c| c.to_vec()).collect()
}

/// Compare every tile's Y with the reference and check the gaps; returns the worst error.
#[allow(clippy::too_many_arguments)]
fn check(
    ty: GgmlType,
    what: &str,
    tiles: &[GemmConfig],
    wf: &[f32],
    mw: &[f64],
    xq: &[u32],
    rows: usize,
    cols: usize,
    n_tokens: u32,
    got: &[Vec<f32>],
) -> f64 {
    let nb = cols / 32;
    let y_stride = rows + Y_PAD as usize;
    let blocks: Vec<([i8; 32], f64, f64)> = (0..n_tokens as usize)
        .flat_map(|t| (0..nb).map(move |b| (t, b)))
        .map(|(t, b)| x_block(xq, cols, t, b))
        .collect();
    let reference: Vec<(f64, f64)> = (0..n_tokens as usize)
        .flat_map(|t| {
            let blocks = &blocks;
            (0..rows).map(move |r| {
                let (mut want, mut scale) = (0.0f64, 0.0f64);
                for (b, (q, dx, sx)) in blocks[t * nb..(t + 1) * nb].iter().enumerate() {
                    let wr = &wf[r * cols + 32 * b..r * cols + 32 * b + 32];
                    let mut qsum = 0.0;
                    for (&a, &qx) in wr.iter().zip(q) {
                        let p = a as f64 * dx * qx as f64;
                        want += p;
                        scale += p.abs();
                        qsum += qx as f64;
                    }
                    let m = mw[r * nb + b];
                    want += m * (dx * qsum - sx);
                    scale += (m * sx).abs();
                }
                (want, scale.max(1e-30))
            })
        })
        .collect();
    let mut worst = 0.0f64;
    for (run, cfg) in got.iter().zip(tiles) {
        let mut written = vec![false; run.len()];
        for t in 0..n_tokens as usize {
            for r in 0..rows {
                let (want, scale) = reference[t * rows + r];
                let i = Y_OFF as usize + t * y_stride + r;
                written[i] = true;
                let v = run[i] as f64;
                let err = (v - want).abs() / scale;
                assert!(
                    err <= TOLERANCE,
                    "{ty} {what} tile {cfg}: Y[{t}, {r}] = {v}, want {want} (rel err {err:e} > {TOLERANCE:e})"
                );
                worst = worst.max(err);
            }
        }
        for (i, (&v, &out)) in run.iter().zip(&written).enumerate() {
            assert!(
                out || v == SENTINEL,
                "{ty} {what} tile {cfg}: element {i} outside Y was written ({v})"
            );
        }
    }
    worst
}

/// The tiles the device can build; in the browser (SwiftShader compiles each anew, seconds a
/// tile) the largest GPU tile, the CPU tile, the smallest and one with a step of two blocks,
/// which cover 8 x 8, 4 x 4, 4 and 8 words a thread, and the deeper step.
fn tiles(ctx: &GpuContext) -> Vec<GemmConfig> {
    let all = gemm_q8::tiles();
    let browser = cfg!(target_arch = "wasm32");
    all.into_iter()
        .filter(|c| gemm_q8::check(*c, &ctx.limits).is_ok())
        .filter(|c| {
            !browser
                || *c
                    == GemmConfig {
                        bk: 32,
                        ..GemmConfig::TILE_128X128
                    }
                || *c == GemmConfig::CPU
                || *c == GemmConfig::new(32, 32, 64, 4, 4)
                || *c == GemmConfig::new(16, 16, 32, 4, 4)
        })
        .collect()
}

async fn check_type(ty: GgmlType) {
    let ctx = common::shared_context().await;
    let tiles = tiles(&ctx);
    assert!(tiles.len() >= 3, "{tiles:?}");
    let be = ty.block_elems();
    let mut rng = Rng::new(ty.id() as u64 + 11);
    let mut worst = 0.0f64;
    // The 8-bit X's own error against the f32 product (informative: X rounded to 8 bits).
    let mut x_error = 0.0f64;
    // Three blocks of 32 (Q8_0, Q4_0): a step of 2 or 4 blocks ends past K.
    for (ci, &(rows, cols)) in [(1u64, be), (37, 2 * be.max(256)), (130, 3 * be)]
        .iter()
        .enumerate()
    {
        let bytes = synthetic_rows(ty, cols, rows, 300 + ci as u64);
        let wf = dequantize_to_vec(ty, &bytes).unwrap();
        let mw = mins(ty, &bytes, rows as usize, cols as usize);
        let w = upload_tensor(&ctx, "w", ty, cols, rows, &bytes, ctx.limits.max_binding()).unwrap();
        for n_tokens in [1u32, 7, 65] {
            let xs = rng.vec((n_tokens as u64 * cols) as usize);
            let xq = quantize(&ctx, Style::for_type(ty), &xs, n_tokens, cols).await;
            let got = run_tiles(&ctx, &tiles, &w, &xq, n_tokens).await;
            let what = format!("{rows}x{cols} tokens {n_tokens}");
            worst = worst.max(check(
                ty,
                &what,
                &tiles,
                &wf,
                &mw,
                &xq,
                rows as usize,
                cols as usize,
                n_tokens,
                &got,
            ));
            let (t, r) = (n_tokens as usize - 1, rows as usize - 1);
            let exact: f64 = (0..cols as usize)
                .map(|c| wf[r * cols as usize + c] as f64 * xs[t * cols as usize + c] as f64)
                .sum();
            let scale: f64 = (0..cols as usize)
                .map(|c| {
                    (wf[r * cols as usize + c] as f64 * xs[t * cols as usize + c] as f64).abs()
                })
                .sum();
            let y_stride = rows + Y_PAD;
            let v = got[0][(Y_OFF + t as u64 * y_stride) as usize + r] as f64;
            x_error = x_error.max((v - exact).abs() / scale.max(1e-30));
        }
    }
    // The 8-bit X moves a product by well under 1 % of its scale.
    assert!(x_error < 1e-2, "{ty}: 8-bit X error {x_error:e}");

    // A tensor split into 3 parts (15 rows each, every part ends inside a tile) equals the
    // unsplit one bit for bit.
    let (rows, cols) = (45u64, 2 * be);
    let bytes = synthetic_rows(ty, cols, rows, 999);
    let wf = dequantize_to_vec(ty, &bytes).unwrap();
    let mw = mins(ty, &bytes, rows as usize, cols as usize);
    let whole = upload_tensor(&ctx, "w", ty, cols, rows, &bytes, ctx.limits.max_binding()).unwrap();
    let split = upload_tensor(
        &ctx,
        "w split",
        ty,
        cols,
        rows,
        &bytes,
        15 * whole.row_bytes + 4,
    )
    .unwrap();
    assert_eq!(split.parts.len(), 3, "{ty}: the split plan");
    let n_tokens = 65u32;
    let xs = rng.vec((n_tokens as u64 * cols) as usize);
    let xq = quantize(&ctx, Style::for_type(ty), &xs, n_tokens, cols).await;
    let a = run_tiles(&ctx, &tiles, &whole, &xq, n_tokens).await;
    let b = run_tiles(&ctx, &tiles, &split, &xq, n_tokens).await;
    assert_eq!(a, b, "{ty}: split and unsplit differ");
    worst = worst.max(check(
        ty,
        "split",
        &tiles,
        &wf,
        &mw,
        &xq,
        rows as usize,
        cols as usize,
        n_tokens,
        &b,
    ));
    tlog!(
        "gemm_q8 {ty}: worst relative error {worst:.2e} (tolerance {TOLERANCE:.0e}), 8-bit X against f32 {x_error:.2e}, {} tiles, adapter {:?}",
        tiles.len(),
        ctx.adapter.name
    );
}

gpu_test!(gemm_q8_q8_0, check_type(GgmlType::Q8_0));
gpu_test!(gemm_q8_q4_0, check_type(GgmlType::Q4_0));
gpu_test!(gemm_q8_q4_k, check_type(GgmlType::Q4K));

/// llama.cpp's activation quantization (x86) of one block, `(quants, d)`: Q8_0 style
/// (quantize_row_q8_0: d = max |x| / 127 stored as f16, quant = round(x * 127 / max |x|), ties to
/// even) over 32 values, Q8_K style (quantize_row_q8_K_ref: s = -127 / the value of largest
/// magnitude, quant = min(127, round(s x)), d = 1 / s) over 256.
fn llama_quantize(style: Style, blk: &[f32]) -> (Vec<i8>, f32) {
    let (mut amax, mut mx) = (0.0f32, 0.0f32);
    for &v in blk {
        if v.abs() > amax {
            amax = v.abs();
            mx = v;
        }
    }
    if amax == 0.0 {
        return (vec![0; blk.len()], 0.0);
    }
    match style {
        Style::Q8_0 => {
            let d = half_to_f32(f32_to_half(amax / 127.0));
            let id = 127.0 / amax;
            let q = blk
                .iter()
                .map(|&v| (v * id).round_ties_even() as i8)
                .collect();
            (q, d)
        }
        Style::Q8K => {
            let s = -127.0 / mx;
            let q = blk
                .iter()
                .map(|&v| ((s * v).round_ties_even() as i32).min(127) as i8)
                .collect();
            (q, 1.0 / s)
        }
    }
}

/// f32 to f16 bits, rounding to nearest even (the normal range; values far below it flush to
/// zero, as f16 cannot hold them: what the tests need).
fn f32_to_half(v: f32) -> u16 {
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let e = ((b >> 23) & 0xff) as i32 - 127 + 15;
    if v == 0.0 || e < -10 {
        return sign;
    }
    assert!((1..31).contains(&e), "{v} is outside f16's normal range");
    let m = b & 0x7f_ffff;
    let mut h = ((e as u32) << 10) | (m >> 13);
    let rest = m & 0x1fff;
    if rest > 0x1000 || rest == 0x1000 && (h & 1) == 1 {
        h += 1;
    }
    sign | h as u16
}

// quantize_x8 in both styles against llama.cpp's rounding: rows from an offset with a wider
// stride, a block of zeros, a block of tiny values, blocks whose largest value is negative
// (Q8_K's scale is signed) and one with its largest magnitude twice. A quant may differ by one where the scaled value sits at a rounding
// tie within f32 division's error; d and the sums (d times the quants' sum) are exact up to that.
gpu_test!(quantize_x8_matches_llama_cpp, async {
    let ctx = common::shared_context().await;
    let mut rng = Rng::new(41);
    for style in [Style::Q8_0, Style::Q8K] {
        // 5 rows of 768: 960 words of quants, the last workgroup part empty.
        let (n_rows, cols, stride, off) = (5usize, 768usize, 771usize, 7usize);
        let mut xs: Vec<f32> = rng
            .vec(off + n_rows * stride)
            .iter()
            .map(|v| v * 4.0)
            .collect();
        xs[off..off + 256].fill(0.0);
        for v in &mut xs[off + stride + 256..off + stride + 512] {
            *v *= 1e-20;
        }
        xs[off + 2 * stride + 3] = -9.0;
        xs[off + 2 * stride + 300] = -9.5;
        // Two values of the largest magnitude, the first positive: Q8_K takes the first.
        xs[off + 3 * stride + 10] = 9.5;
        xs[off + 3 * stride + 200] = -9.5;
        let x = ctx.storage_buffer("x", bytemuck::cast_slice(&xs));
        let bytes = quantize_x8::bytes(n_rows as u64, cols as u64);
        let out = ctx.empty_storage("xq", bytes).unwrap();
        let mut rec = Recorder::new(&ctx);
        let (n, c) = (n_rows as u32, cols as u32);
        quantize_x8::prepare(&mut rec, style, &x, off as u64, stride as u64, &out, n, c).unwrap();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        rec.encode(&mut enc).unwrap();
        ctx.queue.submit([enc.finish()]);
        let raw = read_buffer(&ctx, &out, 0, bytes).await.unwrap();
        let words: &[u32] = bytemuck::cast_slice(&raw);
        let mut off_by_one = 0;
        let sb = style.block() as usize;
        for r in 0..n_rows {
            let vals = &xs[off + r * stride..off + r * stride + cols];
            for (big, blk) in vals.chunks(sb).enumerate() {
                let (q, d) = llama_quantize(style, blk);
                for sub in 0..sb / 32 {
                    let b = big * sb / 32 + sub;
                    let (gq, gd, gs) = x_block(words, cols, r, b);
                    let what = format!("{style:?} row {r} block {b}");
                    assert!(
                        (gd - d as f64).abs() <= 1e-6 * d.abs() as f64,
                        "{what}: d {gd} want {d}"
                    );
                    let mut qsum = 0i32;
                    for k in 0..32 {
                        let want = q[32 * sub + k];
                        let diff = (gq[k] as i32 - want as i32).abs();
                        let scaled = blk[32 * sub + k] as f64 / d as f64;
                        let near_tie = (scaled.abs().fract() - 0.5).abs() <= 1e-4;
                        assert!(
                            diff == 0 || diff == 1 && near_tie,
                            "{what}: value {k} quantized to {}, want {want} ({scaled})",
                            gq[k]
                        );
                        off_by_one += diff;
                        qsum += gq[k] as i32;
                    }
                    let want_sum = gd * qsum as f64;
                    assert!(
                        (gs - want_sum).abs() <= 1e-6 * (gd.abs() * 32.0 * 127.0),
                        "{what}: sum {gs} want {want_sum}"
                    );
                }
            }
        }
        let (_, d0, _) = x_block(words, cols, 0, 0);
        assert_eq!(d0, 0.0, "{style:?}: a block of zeros has d = 0");
        // Row 2's first block peaks at -9: the largest magnitude quantizes to -127 in both
        // styles (Q8_K's d is minus that value over 127, so its sign follows the block's peak).
        let (q2, d2, _) = x_block(words, cols, 2, 0);
        assert_eq!(q2[3], -127, "{style:?}");
        assert!(d2 > 0.0, "{style:?}: d {d2}");
        tlog!("quantize_x8 {style:?}: {off_by_one} quants off by one at ties");
    }
});

// More than 65535 workgroups: the 2-D grid, with the 16 x 16 tile (2 token tiles x 32769 row
// tiles of a 524,304-row Q4_0 tensor). Every output is checked.
gpu_test!(gemm_q8_grid_beyond_65535_workgroups, async {
    let ctx = common::shared_context().await;
    let cfg = GemmConfig::new(16, 16, 32, 4, 4);
    let (ty, rows, cols, n_tokens) = (GgmlType::Q4_0, 16 * 32769u64, 32u64, 17u32);
    let groups = rows.div_ceil(16) * (n_tokens as u64).div_ceil(16);
    assert!(groups > ctx.limits.max_compute_workgroups_per_dimension as u64);
    let bytes = synthetic_rows(ty, cols, rows, 5);
    let wf = dequantize_to_vec(ty, &bytes).unwrap();
    let mw = mins(ty, &bytes, rows as usize, cols as usize);
    let w = upload_tensor(&ctx, "w", ty, cols, rows, &bytes, ctx.limits.max_binding()).unwrap();
    let xs = Rng::new(3).vec((n_tokens as u64 * cols) as usize);
    let xq = quantize(&ctx, Style::Q8_0, &xs, n_tokens, cols).await;
    let got = run_tiles(&ctx, &[cfg], &w, &xq, n_tokens).await;
    let worst = check(
        ty,
        "grid",
        &[cfg],
        &wf,
        &mw,
        &xq,
        rows as usize,
        cols as usize,
        n_tokens,
        &got,
    );
    tlog!("gemm_q8 grid: {groups} workgroups, worst relative error {worst:.2e}");
});

// A type without the kernel, a tile above the device's limits, X too short for the tokens and
// a Y stride narrower than the rows are refused with a code, not a panic.
gpu_test!(gemm_q8_refuses_bad_arguments, async {
    let ctx = common::shared_context().await;
    let upload = |ty: GgmlType, cols: u64| {
        let bytes = synthetic_rows(ty, cols, 4, 1);
        upload_tensor(&ctx, "w", ty, cols, 4, &bytes, ctx.limits.max_binding()).unwrap()
    };
    let w = upload(GgmlType::Q8_0, 64);
    let xq = ctx.empty_storage("xq", quantize_x8::bytes(2, 64)).unwrap();
    let y = ctx.empty_storage("y", 64).unwrap();
    let cfg = gemm_q8::for_shape(&ctx, 4, 2);
    let mut rec = Recorder::new(&ctx);
    let invalid = cera_web::ErrorCode::InvalidArgument;
    // 4096 threads: above every device's limit.
    let huge = GemmConfig::new(512, 512, 32, 8, 8);
    let e = gemm_q8::prepare(&mut rec, huge, &w, &xq, 0, None, &y, 0, None, 2).unwrap_err();
    assert_eq!(e.code, invalid);
    let e = gemm_q8::prepare(&mut rec, cfg, &w, &xq, 0, None, &y, 0, None, 3).unwrap_err();
    assert_eq!(e.code, invalid, "{e}");
    let e = gemm_q8::prepare(&mut rec, cfg, &w, &xq, 0, None, &y, 0, Some(3), 2).unwrap_err();
    assert_eq!(e.code, invalid, "{e}");
    let q6 = upload(GgmlType::Q6K, 256);
    let xq6 = ctx
        .empty_storage("xq6", quantize_x8::bytes(2, 256))
        .unwrap();
    let e = gemm_q8::prepare(&mut rec, cfg, &q6, &xq6, 0, None, &y, 0, None, 2).unwrap_err();
    assert_eq!(e.code, cera_web::ErrorCode::UnsupportedQuant);
    // And the quantizer: a row not whole blocks, an output too small, the output in X's buffer.
    let x = ctx.empty_storage("x", 4 * 64 * 2).unwrap();
    let s = Style::Q8_0;
    let e = quantize_x8::prepare(&mut rec, s, &x, 0, 48, &xq, 2, 48).unwrap_err();
    assert_eq!(e.code, invalid);
    let e = quantize_x8::prepare(&mut rec, Style::Q8K, &x, 0, 64, &xq, 2, 64).unwrap_err();
    assert_eq!(e.code, invalid, "Q8_K's blocks are 256 values");
    let e = quantize_x8::prepare(&mut rec, s, &x, 0, 64, &y, 2, 64).unwrap_err();
    assert_eq!(e.code, invalid);
    let e = quantize_x8::prepare(&mut rec, s, &x, 0, 64, &x, 2, 64).unwrap_err();
    assert_eq!(e.code, invalid);
    assert_eq!(rec.len(), 0, "nothing refused was prepared");
});
