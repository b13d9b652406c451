//! The cooperative-matrix GEMM (`ops::gemm_coop`) against a CPU reference, for every type it
//! reads and every tile it may pick: row counts no tile divides (1, 37, 130), token counts no
//! tile divides (2, 7, 65), K tails for float types (5, 33, 4099), offsets on X and Y, a Y row
//! stride wider than the rows (the gap must stay untouched), a tensor split into 3 parts
//! (bit-identical to the unsplit one).
//!
//! The kernel rounds W's decoded values and X to f16 and accumulates in f32, so the reference
//! rounds both to f16 too and sums in f64: what is left is the f32 accumulation.
//!
//! Native only: the kernel exists where wgpu offers cooperative matrices (an experimental native
//! feature; not in browsers). On an adapter without them (the CPU-emulated ones in CI) the tests
//! check the refusal and the routing instead, and say so.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use cera_web::gguf::GgmlType;
use cera_web::gpu::readback::read_f32;
use cera_web::gpu::{GpuContext, GpuTensor, Recorder};
use cera_web::ops::gemm_coop::{self, CoopConfig};
use cera_web::quant::dequantize_to_vec;
use cera_web::quant::gpu::{synthetic_rows, upload_tensor};
use common::Rng;

/// Max |gpu - reference| / sum_c |W[r, c] X[t, c]| over all outputs, for every type: the
/// products of two f16 are exact in f32, so only the accumulation's rounding is left.
const TOLERANCE: f64 = 1e-5;

/// Elements before X[0, 0] and before Y[0, 0]; Y rows are `rows + Y_PAD` apart. X_OFF is a
/// multiple of 4, so rows of a multiple of 4 values 4-aligned apart take the kernel's vec4 loads
/// of X; the 7-token runs (rows `cols + 3` apart) and odd float rows take its scalar ones.
const X_OFF: u64 = 4;
const Y_OFF: u64 = 3;
const Y_PAD: u64 = 3;
/// What Y holds before the product: every element not an output must still hold it after.
const SENTINEL: f32 = -777.0;

fn f16_round(v: f32) -> f64 {
    half::f16::from_f32(v.clamp(-65504.0, 65504.0)).to_f64()
}

fn tiles(ctx: &GpuContext) -> Vec<CoopConfig> {
    CoopConfig::TILES
        .into_iter()
        .chain(CoopConfig::OTHER_TILES)
        .filter(|c| c.check(&ctx.limits).is_ok())
        .collect()
}

/// Run every tile on `w` (X rows `x_stride` apart); per tile, its Y region.
async fn run_tiles(
    ctx: &GpuContext,
    tiles: &[CoopConfig],
    w: &GpuTensor,
    xs: &[f32],
    x_stride: u64,
    n_tokens: u32,
) -> Vec<Vec<f32>> {
    let x = ctx.storage_buffer("x", bytemuck::cast_slice(xs));
    let y_stride = w.rows + Y_PAD;
    let region = (Y_OFF + n_tokens as u64 * y_stride) as usize;
    let y = ctx.storage_buffer(
        "y",
        bytemuck::cast_slice(&vec![SENTINEL; region * tiles.len()]),
    );
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    for (i, cfg) in tiles.iter().enumerate() {
        let y_off = (i * region) as u64 + Y_OFF;
        let mut rec = Recorder::new(ctx);
        gemm_coop::prepare(
            &mut rec,
            *cfg,
            w,
            &x,
            X_OFF,
            Some(x_stride),
            &y,
            y_off,
            Some(y_stride),
            n_tokens,
        )
        .unwrap();
        rec.encode(&mut enc).unwrap();
    }
    ctx.queue.submit([enc.finish()]);
    let all = read_f32(ctx, &y, 0, region * tiles.len()).await.unwrap();
    ctx.check_errors().unwrap();
    all.chunks(region).map(|c| c.to_vec()).collect()
}

/// Compare every tile's Y with the reference and check the gaps; returns the worst error.
#[allow(clippy::too_many_arguments)]
fn check(
    what: &str,
    tiles: &[CoopConfig],
    wf: &[f32],
    xs: &[f32],
    rows: u64,
    cols: u64,
    x_stride: u64,
    n_tokens: u32,
    got: &[Vec<f32>],
) -> f64 {
    let (rows, cols, x_stride) = (rows as usize, cols as usize, x_stride as usize);
    let y_stride = rows + Y_PAD as usize;
    let wh: Vec<f64> = wf.iter().map(|&v| f16_round(v)).collect();
    let reference: Vec<(f64, f64)> = (0..n_tokens as usize)
        .flat_map(|t| {
            let x0 = X_OFF as usize + t * x_stride;
            let xt: Vec<f64> = xs[x0..x0 + cols].iter().map(|&v| f16_round(v)).collect();
            let wh = &wh;
            (0..rows)
                .map(move |r| {
                    let (mut want, mut scale) = (0.0f64, 0.0f64);
                    for (&a, &b) in wh[r * cols..(r + 1) * cols].iter().zip(&xt) {
                        want += a * b;
                        scale += (a * b).abs();
                    }
                    (want, scale.max(1e-30))
                })
                .collect::<Vec<_>>()
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
                    "{what} tile {cfg}: Y[{t}, {r}] = {v}, want {want} (rel err {err:e} > {TOLERANCE:e})"
                );
                worst = worst.max(err);
            }
        }
        for (i, (&v, &out)) in run.iter().zip(&written).enumerate() {
            assert!(
                out || v == SENTINEL,
                "{what} tile {cfg}: element {i} outside Y was written ({v})"
            );
        }
    }
    worst
}

async fn check_type(ty: GgmlType) {
    let ctx = common::shared_context().await;
    if !gemm_coop::available(&ctx) {
        // Nothing to multiply here: the op must say why, with a code.
        let w = upload_tensor(
            &ctx,
            "w",
            ty,
            ty.block_elems().max(32),
            4,
            &synthetic_rows(ty, ty.block_elems().max(32), 4, 1),
            ctx.limits.max_binding(),
        )
        .unwrap();
        let x = ctx.empty_storage("x", 4 * 256 * 4).unwrap();
        let y = ctx.empty_storage("y", 4 * 64 * 4).unwrap();
        let mut rec = Recorder::new(&ctx);
        let e = gemm_coop::prepare(
            &mut rec,
            CoopConfig::TILES[0],
            &w,
            &x,
            0,
            None,
            &y,
            0,
            None,
            64,
        )
        .unwrap_err();
        assert_eq!(e.code, cera_web::ErrorCode::AdapterTooSmall);
        assert!(e.message.contains(&ctx.adapter.name), "{}", e.message);
        tlog!(
            "gemm_coop {ty}: adapter {:?} has no cooperative matrices; the refusal checked, no product run",
            ctx.adapter.name
        );
        return;
    }
    let tiles = tiles(&ctx);
    assert!(!tiles.is_empty(), "no cooperative tile fits this device");
    let be = ty.block_elems();
    let float = be == 1;
    let cases: [(u64, u64); 3] = if float {
        [(1, 5), (37, 4099), (130, 33)]
    } else {
        [(1, be), (37, 4096), (130, 2 * be)]
    };
    let mut rng = Rng::new(ty.id() as u64 + 11);
    let mut worst = 0.0f64;
    for (ci, &(rows, cols)) in cases.iter().enumerate() {
        let bytes = synthetic_rows(ty, cols, rows, 300 + ci as u64);
        let wf = dequantize_to_vec(ty, &bytes).unwrap();
        let w = upload_tensor(&ctx, "w", ty, cols, rows, &bytes, ctx.limits.max_binding()).unwrap();
        for n_tokens in [2u32, 7, 65] {
            let x_stride = if n_tokens == 7 { cols + 3 } else { cols };
            let xs = rng.vec((X_OFF + n_tokens as u64 * x_stride) as usize);
            let got = run_tiles(&ctx, &tiles, &w, &xs, x_stride, n_tokens).await;
            let what = format!("{ty} {rows}x{cols} tokens {n_tokens} x stride {x_stride}");
            worst = worst.max(check(
                &what, &tiles, &wf, &xs, rows, cols, x_stride, n_tokens, &got,
            ));
        }
    }
    // A tensor split into 3 parts (15 rows each, every part ending inside a tile) equals the
    // unsplit one bit for bit.
    let (rows, cols) = (45u64, if float { 10 } else { 2 * be });
    let bytes = synthetic_rows(ty, cols, rows, 998);
    let wf = dequantize_to_vec(ty, &bytes).unwrap();
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
    let xs = rng.vec((X_OFF + 33 * cols) as usize);
    let a = run_tiles(&ctx, &tiles, &whole, &xs, cols, 33).await;
    let b = run_tiles(&ctx, &tiles, &split, &xs, cols, 33).await;
    assert_eq!(a, b, "{ty}: split and unsplit differ");
    worst = worst.max(check("split", &tiles, &wf, &xs, rows, cols, cols, 33, &b));
    tlog!(
        "gemm_coop {ty}: worst relative error {worst:.2e} (tolerance {TOLERANCE:.0e}), tiles {}, adapter {:?}",
        tiles.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(" "),
        ctx.adapter.name
    );
}

gpu_test!(gemm_coop_f32, check_type(GgmlType::F32));
gpu_test!(gemm_coop_f16, check_type(GgmlType::F16));
gpu_test!(gemm_coop_bf16, check_type(GgmlType::BF16));
gpu_test!(gemm_coop_q8_0, check_type(GgmlType::Q8_0));
gpu_test!(gemm_coop_q4_0, check_type(GgmlType::Q4_0));
gpu_test!(gemm_coop_q4_1, check_type(GgmlType::Q4_1));
gpu_test!(gemm_coop_q5_0, check_type(GgmlType::Q5_0));
gpu_test!(gemm_coop_q5_1, check_type(GgmlType::Q5_1));
gpu_test!(gemm_coop_q4_k, check_type(GgmlType::Q4K));
gpu_test!(gemm_coop_q5_k, check_type(GgmlType::Q5K));
gpu_test!(gemm_coop_q6_k, check_type(GgmlType::Q6K));

// The tile list and the parser: every tile fits the 32 KiB of workgroup memory the engine asks
// a device for, each name round-trips, and bad names are refused.
#[test]
fn coop_tiles_parse_and_check() {
    for c in CoopConfig::TILES.into_iter().chain(CoopConfig::OTHER_TILES) {
        let s = c.to_string();
        assert_eq!(s.parse::<CoopConfig>().unwrap(), c, "{s}");
        assert!(
            c.storage_bytes() <= 32 << 10,
            "{c}: {} bytes",
            c.storage_bytes()
        );
    }
    for bad in [
        "128x48x32:2",
        "128x64x32",
        "96x64x32:4",
        "abc",
        "128x64x32:x",
    ] {
        assert!(bad.parse::<CoopConfig>().is_err(), "{bad}");
    }
    let c: CoopConfig = "128x64x32:4".parse().unwrap();
    assert_eq!(c, CoopConfig::new(2, 2, 4, 32));
    assert_eq!(c.workgroup_size(), 128);
    assert_eq!(c.runs_per_thread(), (4, 4));
}
