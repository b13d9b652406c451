//! The tiled GEMM against the CPU reference (`quant::dequantize`, then f64 dot products), for
//! every GPU quant type and every tile the device allows: row counts no tile divides (1, 37,
//! 130), token counts no tile divides (1, 7, 65), K tails for float types (5, 33, 4099), offsets
//! on X and Y, a Y row stride wider than the rows (the gap must stay untouched), a tensor split
//! into 3 parts (bit-identical to the unsplit one), and a grid of more than 65535 workgroups.
//! Runs natively and in headless Chrome.

mod common;

use cera_web::gguf::GgmlType;
use cera_web::gpu::readback::read_f32;
use cera_web::gpu::{GpuContext, GpuTensor, Recorder};
use cera_web::ops::gemm::{self, GemmConfig};
use cera_web::quant::dequantize_to_vec;
use cera_web::quant::gpu::{synthetic_rows, upload_tensor};
use common::Rng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// Max |gpu - reference| / sum_c |W[r, c] X[t, c]| over all outputs: the bound of the matmul
/// tests (tests/matmul.rs), since both kernels compute the same f32 sums of the same f32 weights.
/// The reference uses the CPU's f32 weights, so this measures only the f32 accumulation (and the
/// GPU's freedom to fuse `d * q + m` into an FMA).
const TOLERANCE: &[(GgmlType, f64)] = &[
    (GgmlType::F32, 1e-6),
    (GgmlType::F16, 1e-6),
    (GgmlType::BF16, 1e-6),
    (GgmlType::Q8_0, 1e-6),
    (GgmlType::Q4_0, 1e-6),
    (GgmlType::Q4_1, 1e-6),
    (GgmlType::Q5_0, 1e-6),
    (GgmlType::Q5_1, 1e-6),
    (GgmlType::Q4K, 1e-6),
    (GgmlType::Q5K, 1e-6),
    (GgmlType::Q6K, 1e-6),
];

fn tolerance(ty: GgmlType) -> f64 {
    TOLERANCE
        .iter()
        .find(|(t, _)| *t == ty)
        .map(|(_, v)| *v)
        .expect("every type has a tolerance")
}

/// Every standard tile (8 x 8, 8 x 4 and 4 x 4 per thread), one with 4 x 8, one with BK 32 and
/// 8 x 4, the 64-row tiles with BK 64 (`GemmConfig::deeper`), and a tiny one (8 threads) so that
/// small shapes still span several tiles; those the device cannot build are skipped.
///
/// In the browser SwiftShader compiles each tile of each type anew (about 2.4 s a tile, 26 s for
/// the list), so there the whole list runs on Q4_K (the real model's type, a super-block loader)
/// and the other types, F32 among them, take the tile this adapter picks, the largest GPU tile
/// (what a real GPU in the browser picks first) and the tiny one: each loader on several tiles,
/// each tile on one loader. The tile code is one WGSL for every type, only the loaders differ;
/// natively every type runs every tile, on the same WGSL and inputs.
fn tiles(ctx: &GpuContext, ty: GgmlType) -> Vec<GemmConfig> {
    let all = [
        GemmConfig::TILE_128X128,
        GemmConfig::TILE_128X64,
        GemmConfig::TILE_64X64,
        GemmConfig::TILE_64X32,
        GemmConfig::TILE_64X64_BK16,
        GemmConfig::new(64, 32, 64, 4, 4),
        GemmConfig::new(64, 64, 64, 4, 4),
        GemmConfig::CPU,
        GemmConfig::new(128, 64, 32, 8, 4),
        GemmConfig::new(64, 128, 16, 4, 8),
        GemmConfig::new(16, 8, 8, 4, 4),
    ];
    let browser_subset = cfg!(target_arch = "wasm32") && ty != GgmlType::Q4K;
    let mut v: Vec<GemmConfig> = all
        .into_iter()
        .filter(|c| c.check(&ctx.limits).is_ok())
        .filter(|c| {
            !browser_subset
                || *c == GemmConfig::for_device(ctx)
                || *c == GemmConfig::for_shape(ctx, 37, 7)
                || *c == GemmConfig::TILE_128X128
                || c.workgroup_size() == 8
        })
        .collect();
    assert!(v.contains(&GemmConfig::for_device(ctx)));
    assert!(v.contains(&GemmConfig::for_shape(ctx, 37, 7)));
    v.dedup();
    v
}

/// Elements before X[0, 0] and before Y[0, 0]; Y rows are `rows + Y_PAD` apart.
const X_OFF: u64 = 5;
const Y_OFF: u64 = 3;
const Y_PAD: u64 = 3;
/// What Y holds before the product: every element not an output must still hold it after.
const SENTINEL: f32 = -777.0;

/// Run every tile on `w` (X rows `x_stride` apart) and return, per tile, its Y region
/// `(Y_OFF + n_tokens * y_stride)`.
async fn run_tiles(
    ctx: &GpuContext,
    tiles: &[GemmConfig],
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
        gemm::prepare_strided(
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
    all.chunks(region).map(|c| c.to_vec()).collect()
}

/// Compare every tile's Y with the f64 reference and check the gaps; returns the worst error.
#[allow(clippy::too_many_arguments)]
fn check(
    ty: GgmlType,
    what: &str,
    tiles: &[GemmConfig],
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
    // The reference and its scale per output, once for every tile (an unoptimized test build
    // spent much of its time recomputing them per tile).
    let reference: Vec<(f64, f64)> = (0..n_tokens as usize)
        .flat_map(|t| {
            let xt = &xs[X_OFF as usize + t * x_stride..X_OFF as usize + t * x_stride + cols];
            (0..rows).map(move |r| {
                let wr = &wf[r * cols..(r + 1) * cols];
                let (mut want, mut scale) = (0.0f64, 0.0f64);
                for (&a, &b) in wr.iter().zip(xt) {
                    let p = a as f64 * b as f64;
                    want += p;
                    scale += p.abs();
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
                    err <= tolerance(ty),
                    "{ty} {what} tile {cfg:?}: Y[{t}, {r}] = {v}, want {want} (rel err {err:e} > {:e})",
                    tolerance(ty)
                );
                worst = worst.max(err);
            }
        }
        for (i, (&v, &out)) in run.iter().zip(&written).enumerate() {
            assert!(
                out || v == SENTINEL,
                "{ty} {what} tile {cfg:?}: element {i} outside Y was written ({v})"
            );
        }
    }
    worst
}

async fn check_type(ty: GgmlType) {
    let ctx = common::shared_context().await;
    let tiles = tiles(&ctx, ty);
    let be = ty.block_elems();
    let float = be == 1;
    // (rows, cols): one row of one block (or of 5 values); rows no tile divides with K tails for
    // floats; more rows than the largest tile's 128.
    let cases: [(u64, u64); 3] = if float {
        [(1, 5), (37, 4099), (130, 33)]
    } else {
        [(1, be), (37, 4096), (130, 2 * be)]
    };
    let mut rng = Rng::new(ty.id() as u64 + 7);
    let mut worst = 0.0f64;
    for (ci, &(rows, cols)) in cases.iter().enumerate() {
        let bytes = synthetic_rows(ty, cols, rows, 200 + ci as u64);
        let wf = dequantize_to_vec(ty, &bytes).unwrap();
        let w = upload_tensor(&ctx, "w", ty, cols, rows, &bytes, ctx.limits.max_binding()).unwrap();
        // 7 tokens read X rows with 3 spare elements between them (a wider activation's columns).
        for n_tokens in [1u32, 7, 65] {
            let x_stride = if n_tokens == 7 { cols + 3 } else { cols };
            let xs = rng.vec((X_OFF + n_tokens as u64 * x_stride) as usize);
            let got = run_tiles(&ctx, &tiles, &w, &xs, x_stride, n_tokens).await;
            let what = format!("{rows}x{cols} tokens {n_tokens} x stride {x_stride}");
            worst = worst.max(check(
                ty, &what, &tiles, &wf, &xs, rows, cols, x_stride, n_tokens, &got,
            ));
        }
    }

    // A tensor split into 3 parts (15 rows each, so every part ends inside a tile) equals the
    // unsplit one bit for bit: every output sums the same products in the same order.
    let (rows, cols) = (45u64, if float { 10 } else { 2 * be });
    let bytes = synthetic_rows(ty, cols, rows, 999);
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
    assert_eq!(whole.parts.len(), 1);
    assert_eq!(split.parts.len(), 3, "{ty}: the split plan");
    for n_tokens in [7u32, 65] {
        let xs = rng.vec((X_OFF + n_tokens as u64 * cols) as usize);
        let a = run_tiles(&ctx, &tiles, &whole, &xs, cols, n_tokens).await;
        let b = run_tiles(&ctx, &tiles, &split, &xs, cols, n_tokens).await;
        assert_eq!(a, b, "{ty}: split and unsplit differ ({n_tokens} tokens)");
        worst = worst.max(check(
            ty, "split", &tiles, &wf, &xs, rows, cols, cols, n_tokens, &b,
        ));
    }
    tlog!(
        "gemm {ty}: worst relative error {worst:.2e} (tolerance {:.0e}), {} tiles, adapter {:?}",
        tolerance(ty),
        tiles.len(),
        ctx.adapter.name
    );
}

gpu_test!(gemm_f32, check_type(GgmlType::F32));
gpu_test!(gemm_f16, check_type(GgmlType::F16));
gpu_test!(gemm_bf16, check_type(GgmlType::BF16));
gpu_test!(gemm_q8_0, check_type(GgmlType::Q8_0));
gpu_test!(gemm_q4_0, check_type(GgmlType::Q4_0));
gpu_test!(gemm_q4_1, check_type(GgmlType::Q4_1));
gpu_test!(gemm_q5_0, check_type(GgmlType::Q5_0));
gpu_test!(gemm_q5_1, check_type(GgmlType::Q5_1));
gpu_test!(gemm_q4_k, check_type(GgmlType::Q4K));
gpu_test!(gemm_q5_k, check_type(GgmlType::Q5K));
gpu_test!(gemm_q6_k, check_type(GgmlType::Q6K));

// More than 65535 workgroups: the 2-D grid, with the tiny 16 x 8 tile (2 token tiles x 32769 row
// tiles of a 524,304-row Q4_0 tensor). Every output is checked.
gpu_test!(gemm_grid_beyond_65535_workgroups, async {
    let ctx = common::shared_context().await;
    let cfg = GemmConfig::new(16, 8, 8, 4, 4);
    let (ty, rows, cols, n_tokens) = (GgmlType::Q4_0, 16 * 32769u64, 32u64, 9u32);
    let groups = rows.div_ceil(16) * (n_tokens as u64).div_ceil(8);
    assert!(groups > ctx.limits.max_compute_workgroups_per_dimension as u64);
    let bytes = synthetic_rows(ty, cols, rows, 5);
    let wf = dequantize_to_vec(ty, &bytes).unwrap();
    let w = upload_tensor(&ctx, "w", ty, cols, rows, &bytes, ctx.limits.max_binding()).unwrap();
    let xs = Rng::new(3).vec((X_OFF + n_tokens as u64 * cols) as usize);
    let got = run_tiles(&ctx, &[cfg], &w, &xs, cols, n_tokens).await;
    let worst = check(
        ty,
        "grid",
        &[cfg],
        &wf,
        &xs,
        rows,
        cols,
        cols,
        n_tokens,
        &got,
    );
    tlog!("gemm grid: {groups} workgroups, worst relative error {worst:.2e}");
});

// An unsupported type, a tile above the device's limits and a Y stride narrower than the rows
// are refused with a code, not a panic.
gpu_test!(gemm_refuses_bad_arguments, async {
    let ctx = common::shared_context().await;
    let ty = GgmlType::Q8_0;
    let w = upload_tensor(
        &ctx,
        "w",
        ty,
        32,
        4,
        &synthetic_rows(ty, 32, 4, 1),
        ctx.limits.max_binding(),
    )
    .unwrap();
    let x = ctx.empty_storage("x", 32 * 4).unwrap();
    let y = ctx.empty_storage("y", 16 * 4).unwrap();
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let huge = GemmConfig::new(256, 256, 64, 8, 8);
    let e = gemm::encode(&ctx, &mut enc, huge, &w, &x, 0, &y, 0, None, 1).unwrap_err();
    assert_eq!(e.code, cera_web::ErrorCode::InvalidArgument);
    let e = gemm::encode(
        &ctx,
        &mut enc,
        GemmConfig::for_device(&ctx),
        &w,
        &x,
        0,
        &y,
        0,
        Some(3),
        1,
    )
    .unwrap_err();
    assert_eq!(e.code, cera_web::ErrorCode::InvalidArgument);
    assert!(gemm::key(GgmlType::Q2K, GemmConfig::TILE_64X64).is_err());
});
