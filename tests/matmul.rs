//! GEMV and GEMM on the GPU against the CPU reference (`quant::dequantize`, then f64 dot
//! products), for every GPU quant type, every kernel shape and awkward sizes: one row, row
//! counts that no workgroup divides, the smallest K (one block) and a large one, 1, 3 and 17
//! tokens, X at an odd and at a 4-aligned offset (the vec4 X path), and a tensor split into 3
//! parts. Runs natively and in headless Chrome.

mod common;

use cera_web::gguf::GgmlType;
use cera_web::gpu::readback::read_f32;
use cera_web::gpu::{GpuContext, GpuTensor};
use cera_web::ops::matmul::{self, MatmulConfig};
use cera_web::quant::dequantize_to_vec;
use cera_web::quant::gpu::{synthetic_rows, upload_tensor};
use common::Rng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// The one tolerance table: max |gpu - reference| / sum_c |W[r, c] X[t, c]| over all outputs.
/// The reference uses the CPU's f32 weights, so this only measures the f32 accumulation (and
/// the GPU's freedom to fuse `d * q + m` into an FMA).
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

/// Every kernel shape tested on every adapter: thread-per-row (the CPU-adapter decision),
/// cooperative units, and row teams (the GPU decision: interleaved items, subgroup shuffles
/// where the adapter has them and the team fits a subgroup, workgroup memory otherwise), GEMV
/// and GEMM, plus small odd ones (3 tokens per thread, 4 rows per workgroup).
const SHAPES: [MatmulConfig; 17] = [
    MatmulConfig::simple(1),
    MatmulConfig::simple(8),
    MatmulConfig::cooperative(256, 8, 1),
    MatmulConfig::cooperative(256, 8, 8),
    MatmulConfig::cooperative(64, 4, 3),
    MatmulConfig::team(256, 8, 1),
    MatmulConfig::team(256, 32, 1),
    MatmulConfig::team(64, 16, 3),
    MatmulConfig::team(256, 16, 8),
    MatmulConfig {
        subgroup: false,
        ..MatmulConfig::team(64, 4, 1)
    },
    // Several rows per team (only where 16-byte items exist, one row elsewhere; teams of 8 so
    // that adapters with 8-lane subgroups, as lavapipe, run them with subgroups).
    MatmulConfig {
        rows_per_team: 4,
        ..MatmulConfig::team(256, 8, 1)
    },
    MatmulConfig {
        rows_per_team: 2,
        ..MatmulConfig::team(64, 8, 1)
    },
    // A row a lane: the CPU adapters' decode shape where they have 8-lane subgroups.
    MatmulConfig::CPU_TEAMS,
    // Teams sharing rows (KS): 4 teams on each of 8 row teams of 2 rows, and all 8 teams of a
    // workgroup on one row (same conditions as several rows a team).
    MatmulConfig {
        rows_per_team: 2,
        k_split: 4,
        ..MatmulConfig::team(256, 8, 1)
    },
    MatmulConfig {
        k_split: 8,
        ..MatmulConfig::team(64, 8, 1)
    },
    // The same without subgroups (the browser's case): the teams' sums through workgroup
    // memory.
    MatmulConfig {
        subgroup: false,
        rows_per_team: 2,
        k_split: 4,
        ..MatmulConfig::team(256, 8, 1)
    },
    MatmulConfig {
        subgroup: false,
        rows_per_team: 4,
        ..MatmulConfig::team(64, 16, 1)
    },
];

/// The shapes [`check_type`] runs on `ty`. In the browser SwiftShader compiles every kernel
/// of every type anew (a device's pipeline cache is all it keeps), and the shapes are one WGSL
/// for every type (only the loaders differ, `quant_decls`), so there every shape runs on Q4_K
/// (the real model's type, a super-block loader) and the other types, F32 among them, take one
/// shape of each kernel family: a thread a row (also SwiftShader's own GEMV), cooperative units
/// (a GPU's GEMM, and 3 tokens a thread), interleaved row teams, and the teams without subgroups
/// sharing rows (what a GPU in the browser runs for a GEMV). The public `gemv`/`gemm` entry
/// points (the adapter's own picks) run on every type. Natively every type runs every shape, on
/// the same WGSL and inputs.
fn shapes(ty: GgmlType) -> Vec<MatmulConfig> {
    let browser_subset = cfg!(target_arch = "wasm32") && ty != GgmlType::Q4K;
    let families = [
        SHAPES[0],  // MatmulConfig::simple(1)
        SHAPES[3],  // MatmulConfig::cooperative(256, 8, 8)
        SHAPES[4],  // MatmulConfig::cooperative(64, 4, 3)
        SHAPES[5],  // MatmulConfig::team(256, 8, 1)
        SHAPES[15], // no subgroups, 2 rows a team, 4 teams a row group
        SHAPES[16], // no subgroups, 4 rows a team
    ];
    SHAPES
        .into_iter()
        .filter(|c| !browser_subset || families.contains(c))
        .collect()
}

/// What a prepared product runs: each dispatch's pipeline and grid.
type Signature = Vec<(String, [u32; 3])>;

/// Elements between Y regions, so offsets are exercised.
const Y_GAP: u64 = 3;

/// Run every shape (and the public `gemv`/`gemm` entry points) on `w` and return, per run,
/// `Y` as `(n_tokens, rows)`.
async fn run_all(
    ctx: &GpuContext,
    shapes: &[MatmulConfig],
    w: &GpuTensor,
    xs: &[f32],
    x_off: u64,
    n_tokens: u32,
) -> Vec<Vec<f32>> {
    let x = ctx.storage_buffer("x", bytemuck::cast_slice(xs));
    let region = n_tokens as u64 * w.rows + Y_GAP;
    let runs = shapes.len() as u64 + 1;
    let y = ctx.empty_storage("y", region * runs * 4).unwrap();
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    // A shape that the adapter turns into the same kernel and grid as an earlier one (`fit`
    // clears subgroups in the browser; types without 16-byte items take one row a team) is not
    // run again: its result is the earlier one's (`same[i]`).
    let mut seen: Vec<(usize, Signature)> = Vec::new();
    let mut same: Vec<usize> = Vec::new();
    for (i, cfg) in shapes.iter().enumerate() {
        let mut rec = cera_web::gpu::Recorder::new(ctx);
        matmul::prepare(
            &mut rec,
            *cfg,
            w,
            &x,
            x_off,
            &y,
            Y_GAP + i as u64 * region,
            n_tokens,
        )
        .unwrap();
        let prepared = rec.finish();
        let sig: Signature = prepared
            .dispatches
            .iter()
            .map(|d| (d.pipe.key.label(), d.grid))
            .collect();
        match seen.iter().find(|(_, s)| *s == sig) {
            Some(&(j, _)) => same.push(j),
            None => {
                same.push(i);
                seen.push((i, sig));
                prepared.encode(ctx, &mut enc);
            }
        }
    }
    let last = Y_GAP + shapes.len() as u64 * region;
    if n_tokens == 1 {
        matmul::gemv(ctx, &mut enc, w, &x, x_off, &y, last).unwrap();
    } else {
        matmul::gemm(ctx, &mut enc, w, &x, x_off, &y, last, n_tokens).unwrap();
    }
    ctx.queue.submit([enc.finish()]);
    let all = read_f32(ctx, &y, 0, (region * runs) as usize)
        .await
        .unwrap();
    (0..runs as usize)
        .map(|i| {
            let from = same.get(i).copied().unwrap_or(i);
            let s = Y_GAP as usize + from * region as usize;
            all[s..s + (n_tokens as u64 * w.rows) as usize].to_vec()
        })
        .collect()
}

/// Compare every run with the f64 reference; returns the worst relative error seen.
#[allow(clippy::too_many_arguments)]
fn check(
    ty: GgmlType,
    shapes: &[MatmulConfig],
    what: &str,
    wf: &[f32],
    xs: &[f32],
    x_off: u64,
    rows: u64,
    cols: u64,
    n_tokens: u32,
    got: &[Vec<f32>],
) -> f64 {
    let (rows, cols) = (rows as usize, cols as usize);
    let mut worst = 0.0f64;
    for t in 0..n_tokens as usize {
        let xt = &xs[x_off as usize + t * cols..x_off as usize + (t + 1) * cols];
        for r in 0..rows {
            let wr = &wf[r * cols..(r + 1) * cols];
            let want: f64 = wr.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
            let scale: f64 = wr
                .iter()
                .zip(xt)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum::<f64>()
                .max(1e-30);
            for (i, run) in got.iter().enumerate() {
                let v = run[t * rows + r] as f64;
                let err = (v - want).abs() / scale;
                assert!(
                    err <= tolerance(ty),
                    "{ty} {what} run {i} ({:?}): Y[{t}, {r}] = {v}, want {want} (rel err {err:e} > {:e})",
                    shapes.get(i),
                    tolerance(ty)
                );
                worst = worst.max(err);
            }
        }
    }
    worst
}

async fn check_type(ty: GgmlType) {
    let ctx = common::shared_context().await;
    let be = ty.block_elems();
    let float = be == 1;
    // (rows, cols, X offset): one row of one block; a large K with rows no workgroup divides;
    // more rows. Odd offsets read X as scalars, 4-aligned ones (with cols a multiple of 4) as vec4.
    let cases: [(u64, u64, u64); 4] = if float {
        [(1, 1, 5), (37, 4099, 5), (67, 13, 5), (131, 12, 4)]
    } else {
        [(1, be, 5), (37, 4096, 4), (67, 3 * be, 5), (131, be, 4)]
    };
    let mut rng = Rng::new(ty.id() as u64 + 1);
    let mut worst = 0.0f64;
    let shapes = shapes(ty);
    for (ci, &(rows, cols, x_off)) in cases.iter().enumerate() {
        let bytes = synthetic_rows(ty, cols, rows, 100 + ci as u64);
        let wf = dequantize_to_vec(ty, &bytes).unwrap();
        let w = upload_tensor(&ctx, "w", ty, cols, rows, &bytes, ctx.limits.max_binding()).unwrap();
        for n_tokens in [1u32, 3, 17] {
            let xs = rng.vec((x_off + n_tokens as u64 * cols) as usize);
            let got = run_all(&ctx, &shapes, &w, &xs, x_off, n_tokens).await;
            let what = format!("{rows}x{cols} x at {x_off} tokens {n_tokens}");
            worst = worst.max(check(
                ty, &shapes, &what, &wf, &xs, x_off, rows, cols, n_tokens, &got,
            ));
        }
    }

    // A tensor split into 3 parts by a small binding limit equals the unsplit one bit for bit.
    let (rows, cols) = (45u64, if float { 12 } else { 2 * be });
    let bytes = synthetic_rows(ty, cols, rows, 999);
    let wf = dequantize_to_vec(ty, &bytes).unwrap();
    let whole = upload_tensor(&ctx, "w", ty, cols, rows, &bytes, ctx.limits.max_binding()).unwrap();
    let row_bytes = whole.row_bytes;
    let split = upload_tensor(&ctx, "w split", ty, cols, rows, &bytes, 15 * row_bytes + 4).unwrap();
    assert_eq!(whole.parts.len(), 1);
    assert_eq!(split.parts.len(), 3, "{ty}: the split plan");
    for (n_tokens, x_off) in [(1u32, 4u64), (17, 5)] {
        let xs = rng.vec((x_off + n_tokens as u64 * cols) as usize);
        let a = run_all(&ctx, &shapes, &whole, &xs, x_off, n_tokens).await;
        let b = run_all(&ctx, &shapes, &split, &xs, x_off, n_tokens).await;
        assert_eq!(a, b, "{ty}: split and unsplit differ ({n_tokens} tokens)");
        worst = worst.max(check(
            ty, &shapes, "split", &wf, &xs, x_off, rows, cols, n_tokens, &b,
        ));
    }
    tlog!(
        "{ty}: {} shapes and the entry points, worst relative error {worst:.2e} (tolerance {:.0e}), adapter {:?}",
        shapes.len(),
        tolerance(ty),
        ctx.adapter.name
    );
}

gpu_test!(matmul_f32, check_type(GgmlType::F32));
gpu_test!(matmul_f16, check_type(GgmlType::F16));
gpu_test!(matmul_bf16, check_type(GgmlType::BF16));
gpu_test!(matmul_q8_0, check_type(GgmlType::Q8_0));
gpu_test!(matmul_q4_0, check_type(GgmlType::Q4_0));
gpu_test!(matmul_q4_1, check_type(GgmlType::Q4_1));
gpu_test!(matmul_q5_0, check_type(GgmlType::Q5_0));
gpu_test!(matmul_q5_1, check_type(GgmlType::Q5_1));
gpu_test!(matmul_q4_k, check_type(GgmlType::Q4K));
gpu_test!(matmul_q5_k, check_type(GgmlType::Q5K));
gpu_test!(matmul_q6_k, check_type(GgmlType::Q6K));

// An unsupported type is refused with a code, not a panic.
gpu_test!(matmul_rejects_unsupported_types, async {
    let ctx = common::context().await;
    let Err(e) = upload_tensor(
        &ctx,
        "w",
        GgmlType::Q2K,
        256,
        1,
        &[0u8; 84],
        ctx.limits.max_binding(),
    ) else {
        panic!("q2_K was accepted")
    };
    assert_eq!(e.code, cera_web::ErrorCode::UnsupportedQuant);
});

/// The down projection reading a gated unit on the fly, `Y = W (act(G) * U)`, equals the matmul
/// of the separately computed GLU: both activations, several types (float, legacy, K-quant),
/// the CPU and GPU decode shapes, scalar and vec4 X, 1 and 3 tokens.
async fn check_glu(ty: GgmlType) {
    use cera_web::ops::glu::Activation;
    let ctx = common::shared_context().await;
    let be = ty.block_elems();
    let cols = if be == 1 { 36 } else { 2 * be };
    let rows = 37u64;
    let bytes = synthetic_rows(ty, cols, rows, 77);
    let wf = dequantize_to_vec(ty, &bytes).unwrap();
    let w = upload_tensor(&ctx, "w", ty, cols, rows, &bytes, ctx.limits.max_binding()).unwrap();
    let mut rng = Rng::new(ty.id() as u64 + 500);
    let mut worst = 0.0f64;
    let shapes = [
        MatmulConfig::simple(1),
        MatmulConfig::team(256, 16, 1),
        MatmulConfig::cooperative(64, 4, 3),
        MatmulConfig {
            rows_per_team: 4,
            ..MatmulConfig::team(256, 8, 1)
        },
        MatmulConfig {
            k_split: 2,
            ..MatmulConfig::team(256, 8, 1)
        },
        // The gated unit per row instead of once per workgroup (the fallback for wide X).
        MatmulConfig {
            glu_prologue: false,
            ..MatmulConfig::team(256, 16, 1)
        },
        MatmulConfig::CPU_TEAMS,
    ];
    for act in [Activation::Silu, Activation::GeluTanh] {
        for (n_tokens, x_off) in [(1u32, 4u64), (3, 5)] {
            let n = (x_off + n_tokens as u64 * cols) as usize;
            let g: Vec<f32> = rng.vec(n).iter().map(|v| v * 6.0).collect();
            let u = rng.vec(n);
            // The GLU's values, as the separate GLU dispatch computes them (f32), are the X of
            // the reference; the tolerance covers the f32 activation against f64.
            let xs: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(&a, &b)| (act.apply(a as f64) * b as f64) as f32)
                .collect();
            let (gb, ub) = (
                ctx.storage_buffer("g", bytemuck::cast_slice(&g)),
                ctx.storage_buffer("u", bytemuck::cast_slice(&u)),
            );
            let region = n_tokens as u64 * rows;
            let y = ctx
                .empty_storage("y", region * shapes.len() as u64 * 4)
                .unwrap();
            let mut rec = cera_web::gpu::Recorder::new(&ctx);
            for (i, cfg) in shapes.iter().enumerate() {
                matmul::prepare_glu(
                    &mut rec,
                    *cfg,
                    act,
                    &w,
                    &gb,
                    &ub,
                    x_off,
                    &y,
                    i as u64 * region,
                    n_tokens,
                )
                .unwrap();
            }
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            rec.encode(&mut enc).unwrap();
            ctx.queue.submit([enc.finish()]);
            let all = read_f32(&ctx, &y, 0, (region * shapes.len() as u64) as usize)
                .await
                .unwrap();
            let got: Vec<Vec<f32>> = all.chunks(region as usize).map(|c| c.to_vec()).collect();
            let what = format!("glu {act:?} {n_tokens} tokens x at {x_off}");
            worst = worst.max(check(
                ty, &shapes, &what, &wf, &xs, x_off, rows, cols, n_tokens, &got,
            ));

            // Gate and up as the two halves of one fused output (n_tokens, stride): gate from
            // x_off, up `delta` further, 4 spare columns between and after (vec4-aligned when
            // x_off is).
            let (delta, stride) = (cols + 4, 2 * cols + 8);
            let mut gu = vec![0f32; (x_off + n_tokens as u64 * stride) as usize];
            for t in 0..n_tokens as u64 {
                for c in 0..cols {
                    let (i, j) = (
                        (x_off + t * cols + c) as usize,
                        (x_off + t * stride + c) as usize,
                    );
                    gu[j] = g[i];
                    gu[j + delta as usize] = u[i];
                }
            }
            let gub = ctx.storage_buffer("gate|up", bytemuck::cast_slice(&gu));
            let y = ctx
                .empty_storage("y", region * shapes.len() as u64 * 4)
                .unwrap();
            let mut rec = cera_web::gpu::Recorder::new(&ctx);
            for (i, cfg) in shapes.iter().enumerate() {
                matmul::prepare_glu_fused(
                    &mut rec,
                    *cfg,
                    act,
                    &w,
                    &gub,
                    x_off,
                    delta,
                    stride,
                    &y,
                    i as u64 * region,
                    n_tokens,
                )
                .unwrap();
            }
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            rec.encode(&mut enc).unwrap();
            ctx.queue.submit([enc.finish()]);
            let all = read_f32(&ctx, &y, 0, (region * shapes.len() as u64) as usize)
                .await
                .unwrap();
            let got: Vec<Vec<f32>> = all.chunks(region as usize).map(|c| c.to_vec()).collect();
            worst = worst.max(check(
                ty,
                &shapes,
                &format!("{what}, fused gate|up"),
                &wf,
                &xs,
                x_off,
                rows,
                cols,
                n_tokens,
                &got,
            ));
            // Halves that overlap are refused.
            let mut rec = cera_web::gpu::Recorder::new(&ctx);
            assert!(matmul::prepare_glu_fused(
                &mut rec,
                MatmulConfig::simple(1),
                act,
                &w,
                &gub,
                x_off,
                cols - 1,
                stride,
                &y,
                0,
                n_tokens
            )
            .is_err());
        }
    }
    // One buffer for two of gate, up and y is refused (one is written, or both are bound twice).
    let b = ctx.empty_storage("b", 4096).unwrap();
    let mut rec = cera_web::gpu::Recorder::new(&ctx);
    assert!(matmul::prepare_glu(
        &mut rec,
        MatmulConfig::simple(1),
        Activation::Silu,
        &w,
        &b,
        &b,
        0,
        &b,
        0,
        1
    )
    .is_err());
    tlog!(
        "{ty} glu: worst relative error {worst:.2e} (tolerance {:.0e})",
        tolerance(ty)
    );
}

// The fused variants from here on (a gated unit, a folded norm, a norm carried between two
// GEMVs, 8-bit X) run in Chrome on Q4_K (the real model's main type, a super-block loader), on
// F32 where the variant takes it, and for 8-bit X also on Q8_0 and Q4_0 (the legacy types' word
// items); natively on every type. Each is one WGSL template whose type-specific part is the
// loader, and every type's loader compiles and runs in Chrome in `check_type` above; the real
// model in Chrome (tests/model_gemma.rs) runs the variants the engine picks there on its Q4_K,
// Q6_K and Q8_0 weights. Each variant left out cost 4-30 s in Chrome (a SwiftShader compile for
// every pipeline): 170 s of this file's 407 s there, measured.
gpu_test!(matmul_glu_input_f32, check_glu(GgmlType::F32));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_glu_input_q8_0, check_glu(GgmlType::Q8_0));
gpu_test!(matmul_glu_input_q4_k, check_glu(GgmlType::Q4K));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_glu_input_q6_k, check_glu(GgmlType::Q6K));

/// The decode shapes a norm folded into a GEMV is tested in (`None` is the engine's own choice):
/// thread-per-row, row teams with and without subgroups, several rows a team, teams sharing rows.
const DECODE_NORM_SHAPES: [Option<MatmulConfig>; 6] = [
    None,
    Some(MatmulConfig::simple(1)),
    Some(MatmulConfig::team(256, 32, 1)),
    Some(MatmulConfig {
        subgroup: false,
        ..MatmulConfig::team(64, 8, 1)
    }),
    Some(MatmulConfig {
        rows_per_team: 2,
        ..MatmulConfig::team(256, 8, 1)
    }),
    Some(MatmulConfig {
        rows_per_team: 2,
        k_split: 4,
        ..MatmulConfig::team(256, 8, 1)
    }),
];

/// The decode GEMV whose workgroups compute X themselves (`X_PRENORM`): X = rmsnorm(r) * w_n
/// with r = x, r = x + a * scale, or r = x + rmsnorm(a) * w_a * scale (a post-norm), against an
/// f64 reference of the norm and the product; r written once to the residual output. Shapes:
/// rows that fill no workgroup evenly, the thread-per-row and row-team kernels (with and without
/// subgroups), the engine's own choice, columns of a wider output.
async fn check_prenorm(ty: GgmlType) {
    use cera_web::ops::matmul::{PreAdd, PreNorm};
    let ctx = common::shared_context().await;
    let be = ty.block_elems();
    let mut rng = Rng::new(ty.id() as u64 + 900);
    let mut worst = 0.0f64;
    for (rows, cols) in [
        (37u64, if be == 1 { 36 } else { be }),
        (300, 2 * be.max(128)),
    ] {
        let bytes = synthetic_rows(ty, cols, rows, 91);
        let wf = dequantize_to_vec(ty, &bytes).unwrap();
        let w = upload_tensor(&ctx, "w", ty, cols, rows, &bytes, ctx.limits.max_binding()).unwrap();
        let c = cols as usize;
        let x: Vec<f32> = rng.vec(c).iter().map(|v| v * 3.0).collect();
        let a: Vec<f32> = rng.vec(c).iter().map(|v| v * 40.0).collect();
        let wn: Vec<f32> = rng.vec(c).iter().map(|v| 1.0 + v).collect();
        let wa: Vec<f32> = rng.vec(c).iter().map(|v| 0.5 + v).collect();
        let vec_tensor = |name: &str, v: &[f32]| {
            upload_tensor(
                &ctx,
                name,
                GgmlType::F32,
                cols,
                1,
                bytemuck::cast_slice(v),
                ctx.limits.max_binding(),
            )
            .unwrap()
        };
        let (wn_t, wa_t) = (vec_tensor("wn", &wn), vec_tensor("wa", &wa));
        let xb = ctx.storage_buffer("x", bytemuck::cast_slice(&x));
        let ab = ctx.storage_buffer("a", bytemuck::cast_slice(&a));
        let (eps, scale) = (1e-6f32, 0.75f32);
        let rms =
            |v: &[f64]| 1.0 / (v.iter().map(|e| e * e).sum::<f64>() / c as f64 + eps as f64).sqrt();
        let shapes = DECODE_NORM_SHAPES;
        for mode in 0..3 {
            // The reference residual r and X, in f64.
            let a64: Vec<f64> = match mode {
                0 => vec![0.0; c],
                1 => a.iter().map(|&v| v as f64 * scale as f64).collect(),
                _ => {
                    let a0: Vec<f64> = a.iter().map(|&v| v as f64).collect();
                    let inv = rms(&a0);
                    a0.iter()
                        .zip(&wa)
                        .map(|(v, &g)| v * inv * g as f64 * scale as f64)
                        .collect()
                }
            };
            let r: Vec<f64> = x.iter().zip(&a64).map(|(&v, d)| v as f64 + d).collect();
            let inv = rms(&r);
            let h: Vec<f64> = r
                .iter()
                .zip(&wn)
                .map(|(v, &g)| v * inv * g as f64)
                .collect();
            // y: each shape's rows side by side in a wider output (stride = rows, offset per shape).
            let y = ctx
                .empty_storage("y", rows * shapes.len() as u64 * 4 + 12)
                .unwrap();
            let out = ctx.empty_storage("r", cols * 4).unwrap();
            let mut rec = cera_web::gpu::Recorder::new(&ctx);
            for (i, cfg) in shapes.iter().enumerate() {
                let pre = PreNorm {
                    x: &xb,
                    add: (mode > 0).then(|| PreAdd {
                        add: &ab,
                        add_norm: (mode == 2).then_some(&wa_t),
                        scale,
                        out: &out,
                    }),
                    w: &wn_t,
                    eps,
                };
                let y_off = 3 + i as u64 * rows;
                match cfg {
                    None => matmul::prepare_prenorm(&mut rec, &w, &pre, &y, y_off).unwrap(),
                    Some(cfg) => {
                        matmul::prepare_prenorm_as(&mut rec, *cfg, &w, &pre, &y, y_off).unwrap()
                    }
                }
            }
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            rec.encode(&mut enc).unwrap();
            ctx.queue.submit([enc.finish()]);
            let got = read_f32(&ctx, &y, 12, (rows * shapes.len() as u64) as usize)
                .await
                .unwrap();
            for (i, cfg) in shapes.iter().enumerate() {
                for rr in 0..rows as usize {
                    let wr = &wf[rr * c..(rr + 1) * c];
                    let want: f64 = wr.iter().zip(&h).map(|(&q, v)| q as f64 * v).sum();
                    let sc: f64 = wr
                        .iter()
                        .zip(&h)
                        .map(|(&q, v)| (q as f64 * v).abs())
                        .sum::<f64>()
                        .max(1e-30);
                    let v = got[i * rows as usize + rr] as f64;
                    let err = (v - want).abs() / sc;
                    // X itself is f32 (the norm's rounding): 1e-5 of the sum of |terms|.
                    assert!(
                        err <= 1e-5,
                        "{ty} prenorm mode {mode} {rows}x{cols} shape {cfg:?}: y[{rr}] = {v}, want {want} (rel {err:e})"
                    );
                    worst = worst.max(err);
                }
            }
            if mode > 0 {
                let got_r = read_f32(&ctx, &out, 0, c).await.unwrap();
                for (i, (&g, &want)) in got_r.iter().zip(&r).enumerate() {
                    assert!(
                        (g as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "{ty} prenorm mode {mode}: residual[{i}] = {g}, want {want}"
                    );
                }
            }
        }
        // The residual output may not alias what the dispatch reads.
        let mut rec = cera_web::gpu::Recorder::new(&ctx);
        let y = ctx.empty_storage("y", rows * 4).unwrap();
        let bad = PreNorm {
            x: &xb,
            add: Some(PreAdd {
                add: &ab,
                add_norm: None,
                scale,
                out: &xb,
            }),
            w: &wn_t,
            eps,
        };
        assert!(matmul::prepare_prenorm(&mut rec, &w, &bad, &y, 0).is_err());
    }
    tlog!("{ty} prenorm: worst relative error {worst:.2e}");
}

#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_prenorm_q8_0, check_prenorm(GgmlType::Q8_0));
gpu_test!(matmul_prenorm_q4_k, check_prenorm(GgmlType::Q4K));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_prenorm_q6_k, check_prenorm(GgmlType::Q6K));

/// A norm carried between two decode GEMVs by their epilogues: the producer
/// (`Epilogue::ResNorm`) adds `scale * W_p a` (or its gated unit's product) to the residual
/// stream in place, writes `r * w_n` and its teams' sums of `r^2`; the consumer
/// (`Epilogue::NormScale`) computes `W_c rmsnorm(r) * w_n` from them. Against the f64 reference
/// of the residual add, the norm and both products, for producer/consumer pairs over the
/// thread-per-row and row-team kernels (with and without subgroups, several rows a team, teams
/// sharing rows, the engine's own shape), a residual stream no workgroup divides evenly, a
/// producer weight split into 3 parts and one reading a fused gated unit; misuse is refused.
async fn check_norm_link(ty: GgmlType) {
    use cera_web::ops::glu::Activation;
    use cera_web::ops::matmul::{Epilogue, NormScale, ResNorm};
    let ctx = common::shared_context().await;
    let be = ty.block_elems();
    let mut rng = Rng::new(ty.id() as u64 + 1300);
    // Each shape's producer hands its sums to the next shape's consumer, so where a shape sits in
    // the list chooses the pairs tested.
    let mut shapes = DECODE_NORM_SHAPES.to_vec();
    // A row a workgroup: 256 or 512 sums for the next (64 invocations, four sums each in its
    // first loads, the K-quants' rest in its loop).
    shapes.insert(3, Some(MatmulConfig::team(64, 64, 1)));
    shapes.extend([
        Some(MatmulConfig {
            subgroup: false,
            rows_per_team: 4,
            k_split: 2,
            ..MatmulConfig::team(64, 8, 1)
        }),
        Some(MatmulConfig {
            subgroup: false,
            rows_per_team: 4,
            ..MatmulConfig::team(64, 16, 1)
        }),
    ]);
    let mut worst = 0.0f64;
    // (residual width e = producer rows = consumer cols, producer cols, consumer rows)
    let e = 2 * be.max(128);
    for (kp, rc, split, glu) in [
        (if be == 1 { 36 } else { be }, 37u64, false, false),
        (3 * be.max(4), 300, true, false),
        (2 * be.max(4), 45, false, true),
    ] {
        let (ec, kpc) = (e as usize, kp as usize);
        let pb = synthetic_rows(ty, kp, e, 31);
        let cb = synthetic_rows(ty, e, rc, 32);
        let (wpf, wcf) = (
            dequantize_to_vec(ty, &pb).unwrap(),
            dequantize_to_vec(ty, &cb).unwrap(),
        );
        // Split: parts of 100 rows (no workgroup of the shapes above divides them evenly).
        let limit = if split {
            100 * (pb.len() as u64 / e) + 4
        } else {
            ctx.limits.max_binding()
        };
        let wp = upload_tensor(&ctx, "wp", ty, kp, e, &pb, limit).unwrap();
        assert_eq!(wp.parts.len() > 1, split);
        let wc = upload_tensor(&ctx, "wc", ty, e, rc, &cb, ctx.limits.max_binding()).unwrap();
        let x: Vec<f32> = rng.vec(ec).iter().map(|v| v * 3.0).collect();
        // The producer's input: a, or gate | up halves for the gated unit.
        let a: Vec<f32> = rng.vec(if glu { 2 * kpc } else { kpc });
        let wn: Vec<f32> = rng.vec(ec).iter().map(|v| 1.0 + v).collect();
        let wn_t = upload_tensor(
            &ctx,
            "wn",
            GgmlType::F32,
            e,
            1,
            bytemuck::cast_slice(&wn),
            ctx.limits.max_binding(),
        )
        .unwrap();
        let (eps, scale) = (1e-5f32, 0.75f32);
        // The reference, in f64.
        let silu = |v: f64| v / (1.0 + (-v).exp());
        let a64: Vec<f64> = if glu {
            (0..kpc)
                .map(|c| silu(a[c] as f64) * a[kpc + c] as f64)
                .collect()
        } else {
            a.iter().map(|&v| v as f64).collect()
        };
        let r: Vec<f64> = (0..ec)
            .map(|i| {
                let d: f64 = (0..kpc).map(|c| wpf[i * kpc + c] as f64 * a64[c]).sum();
                x[i] as f64 + scale as f64 * d
            })
            .collect();
        // Each residual's sum of |terms| (its f32 accumulation error scales with it).
        let r_abs: Vec<f64> = (0..ec)
            .map(|i| {
                let d: f64 = (0..kpc)
                    .map(|c| (wpf[i * kpc + c] as f64 * a64[c]).abs())
                    .sum();
                (x[i] as f64).abs() + scale as f64 * d
            })
            .collect();
        let inv = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / e as f64 + eps as f64).sqrt();
        let h: Vec<f64> = r
            .iter()
            .zip(&wn)
            .map(|(v, &g)| v * inv * g as f64)
            .collect();

        let ab = ctx.storage_buffer("a", bytemuck::cast_slice(&a));
        let mut bufs = Vec::new();
        let mut rec = cera_web::gpu::Recorder::new(&ctx);
        for (i, pcfg) in shapes.iter().enumerate() {
            let ccfg = shapes[(i + 1) % shapes.len()];
            let resid = ctx.storage_buffer("resid", bytemuck::cast_slice(&x));
            let hb = ctx.empty_storage("h", e * 4).unwrap();
            let pcfg = pcfg.unwrap_or(MatmulConfig::gemv_for(&ctx, ty, e, kp));
            let ccfg = ccfg.unwrap_or(MatmulConfig::gemv_for(&ctx, ty, rc, e));
            let n_ss = matmul::resnorm_partials(&ctx, pcfg, &wp);
            let ss = ctx.empty_storage("ss", n_ss * 4).unwrap();
            let y = ctx.empty_storage("y", (rc + 3) * 4).unwrap();
            let rn = ResNorm {
                w: &wn_t,
                h: &hb,
                ss: &ss,
                scale,
            };
            let act = glu.then_some((kp, Activation::Silu));
            let wrote = matmul::prepare_epilogue(
                &mut rec,
                pcfg,
                &wp,
                &ab,
                0,
                act,
                &resid,
                0,
                &Epilogue::ResNorm(rn),
            )
            .unwrap();
            assert_eq!(wrote, n_ss, "{ty}: sums of squares written");
            let ns = NormScale {
                ss: &ss,
                count: wrote as u32,
                eps,
            };
            matmul::prepare_epilogue(
                &mut rec,
                ccfg,
                &wc,
                &hb,
                0,
                None,
                &y,
                3,
                &Epilogue::NormScale(ns),
            )
            .unwrap();
            bufs.push((pcfg, ccfg, resid, y));
        }
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        rec.encode(&mut enc).unwrap();
        ctx.queue.submit([enc.finish()]);
        for (pcfg, ccfg, resid, y) in &bufs {
            let what = format!("{ty} norm link kp {kp} rows {rc} split {split} glu {glu} producer {pcfg} consumer {ccfg}");
            let got_r = read_f32(&ctx, resid, 0, ec).await.unwrap();
            for (i, (&g, &want)) in got_r.iter().zip(&r).enumerate() {
                assert!(
                    (g as f64 - want).abs() <= 1e-6 * r_abs[i].max(1e-30),
                    "{what}: residual[{i}] = {g}, want {want}"
                );
            }
            let got = read_f32(&ctx, y, 12, rc as usize).await.unwrap();
            for (rr, &v) in got.iter().enumerate() {
                let wr = &wcf[rr * ec..(rr + 1) * ec];
                let want: f64 = wr.iter().zip(&h).map(|(&q, v)| q as f64 * v).sum();
                let sc: f64 = wr
                    .iter()
                    .zip(&h)
                    .map(|(&q, v)| (q as f64 * v).abs())
                    .sum::<f64>()
                    .max(1e-30);
                let err = (v as f64 - want).abs() / sc;
                assert!(
                    err <= 1e-5,
                    "{what}: y[{rr}] = {v}, want {want} (rel {err:e})"
                );
                worst = worst.max(err);
            }
        }
        // Misuse: the residual stream as its own input, a consumer counting more sums than its
        // buffer holds, a producer's sums buffer too small.
        let mut rec = cera_web::gpu::Recorder::new(&ctx);
        let resid = ctx.storage_buffer("resid", bytemuck::cast_slice(&x));
        let hb = ctx.empty_storage("h", e * 4).unwrap();
        let small = ctx.empty_storage("ss", 4).unwrap();
        let cfg = MatmulConfig::gemv_for(&ctx, ty, e, kp);
        let rn = |ss| {
            Epilogue::ResNorm(ResNorm {
                w: &wn_t,
                h: &hb,
                ss,
                scale,
            })
        };
        let big = ctx.empty_storage("ss", e * 16).unwrap();
        assert!(matmul::prepare_epilogue(
            &mut rec,
            cfg,
            &wp,
            &resid,
            0,
            None,
            &resid,
            0,
            &rn(&big)
        )
        .is_err());
        assert!(
            matmul::prepare_epilogue(&mut rec, cfg, &wp, &ab, 0, None, &resid, 0, &rn(&small))
                .is_err()
        );
        let ns = Epilogue::NormScale(NormScale {
            ss: &small,
            count: 2,
            eps,
        });
        let y = ctx.empty_storage("y", rc * 4).unwrap();
        assert!(matmul::prepare_epilogue(&mut rec, cfg, &wc, &hb, 0, None, &y, 0, &ns).is_err());
    }
    tlog!("{ty} norm link: worst relative error {worst:.2e}");
}

gpu_test!(matmul_norm_link_f32, check_norm_link(GgmlType::F32));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_norm_link_q8_0, check_norm_link(GgmlType::Q8_0));
gpu_test!(matmul_norm_link_q4_k, check_norm_link(GgmlType::Q4K));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_norm_link_q6_k, check_norm_link(GgmlType::Q6K));

/// The integer part of a weight for the 8-bit X references: Q4_K / Q5_K blocks with dmin (bytes
/// 2..4) zeroed, Q4_1 / Q5_1 blocks with m (bytes 2..4 too) zeroed, dequantized; Q8_0, Q6_K,
/// Q4_0 and Q5_0 have no mins (`wf`, the whole weight, as it is).
fn int_part(ty: GgmlType, bytes: &[u8], wf: &[f32]) -> Vec<f32> {
    use GgmlType::*;
    if matches!(ty, Q8_0 | Q6K | Q4_0 | Q5_0) {
        return wf.to_vec();
    }
    let mut b = bytes.to_vec();
    for blk in b.chunks_mut(ty.block_bytes() as usize) {
        blk[2] = 0;
        blk[3] = 0;
    }
    dequantize_to_vec(ty, &b).unwrap()
}

/// The team shapes with 8-bit X items the XQ8 checks run: row teams with and without subgroups,
/// with rows shared by teams, and the CPU adapters' teams (2 rows a team of 8 lanes unshared:
/// a GPU's short-row Q8_0 output head).
const XQ8_TEAMS: [MatmulConfig; 5] = [
    MatmulConfig {
        rows_per_team: 4,
        ..MatmulConfig::team(256, 8, 1)
    },
    MatmulConfig {
        rows_per_team: 2,
        ..MatmulConfig::team(256, 8, 1)
    },
    MatmulConfig {
        rows_per_team: 2,
        k_split: 4,
        ..MatmulConfig::team(256, 8, 1)
    },
    MatmulConfig {
        subgroup: false,
        rows_per_team: 2,
        k_split: 4,
        ..MatmulConfig::team(256, 8, 1)
    },
    MatmulConfig::CPU_TEAMS,
];

/// X quantized to 8 bits per block of 32 (`x_q8`, the integer-dot items of Q8_0, Q4_K, Q5_K, the legacy types
/// and Q6_K): every team shape that can take it, X from memory as
/// scalars and as vec4, against a reference that quantizes X the same way: `d = max |x| /
/// 127`, `q = round(x / d)`. The K-quants' mins multiply the exact sums of X, so the reference
/// splits W into its integer part
/// `d * scale * q` (the block's `dmin` zeroed, then dequantized) and its mins (`W` minus that):
/// `y = sum A * Xq + sum M * X`. The tolerance allows a few values rounded the other way at a
/// near-tie (the GPU's `127 / max` may be a few ulps off). Each shape is checked to have run
/// the quantized kernel (its pipeline's label).
async fn check_xq8(ty: GgmlType) {
    let ctx = common::shared_context().await;
    let shapes = XQ8_TEAMS.map(|cfg| MatmulConfig { x_q8: true, ..cfg });
    const TOL: f64 = 2e-4;
    let mut rng = Rng::new(ty.id() as u64 + 900);
    let mut worst = 0.0f64;
    let mut worst_f32 = 0.0f64;
    for (ci, &(rows, cols, x_off)) in [
        (1u64, 256u64, 4u64),
        (37, 4096, 4),
        (67, 768, 5),
        (131, 256, 0),
    ]
    .iter()
    .enumerate()
    {
        let bytes = synthetic_rows(ty, cols, rows, 300 + ci as u64);
        let wf = dequantize_to_vec(ty, &bytes).unwrap();
        let int_part = int_part(ty, &bytes, &wf);
        let w = upload_tensor(&ctx, "w", ty, cols, rows, &bytes, ctx.limits.max_binding()).unwrap();
        // Values over several magnitudes, a block of zeros and one of a single value.
        let mut xs: Vec<f32> = rng
            .vec((x_off + cols) as usize)
            .iter()
            .enumerate()
            .map(|(i, v)| v * [0.01f32, 1.0, 30.0][i / 64 % 3])
            .collect();
        xs[x_off as usize..x_off as usize + 32].fill(0.0);
        xs[x_off as usize + 64] = 5.0;
        let x = &xs[x_off as usize..];
        let xq: Vec<f64> = cera_web::ops::glu::reference_q8(x)
            .iter()
            .flat_map(|(q, d, _, _)| q.map(|v| v as f64 * *d as f64))
            .collect();
        let xb = ctx.storage_buffer("x", bytemuck::cast_slice(&xs));
        let y = ctx
            .empty_storage("y", rows * shapes.len() as u64 * 4)
            .unwrap();
        let mut rec = cera_web::gpu::Recorder::new(&ctx);
        for (i, cfg) in shapes.iter().enumerate() {
            matmul::prepare(&mut rec, *cfg, &w, &xb, x_off, &y, i as u64 * rows, 1).unwrap();
        }
        let prepared = rec.finish();
        for (d, cfg) in prepared.dispatches.iter().zip(&shapes) {
            let label = d.pipe.key.label();
            assert!(label.contains("XQ8"), "{ty} {cfg}: ran {label}");
        }
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        prepared.encode(&ctx, &mut enc);
        ctx.queue.submit([enc.finish()]);
        let got = read_f32(&ctx, &y, 0, (rows as usize) * shapes.len())
            .await
            .unwrap();
        let c = cols as usize;
        for r in 0..rows as usize {
            let (wr, ar) = (&wf[r * c..(r + 1) * c], &int_part[r * c..(r + 1) * c]);
            let mut want = 0.0f64;
            let mut exact = 0.0f64;
            let mut scale = 0.0f64;
            for k in 0..c {
                let (wv, av, xv) = (wr[k] as f64, ar[k] as f64, x[k] as f64);
                want += av * xq[k] + (wv - av) * xv;
                exact += wv * xv;
                scale += (wv * xv).abs();
            }
            let scale = scale.max(1e-30);
            for (i, cfg) in shapes.iter().enumerate() {
                let v = got[i * rows as usize + r] as f64;
                let err = (v - want).abs() / scale;
                assert!(
                    err <= TOL,
                    "{ty} {rows}x{cols} x at {x_off}, {cfg}: Y[{r}] = {v}, want {want} (rel err {err:e})"
                );
                worst = worst.max(err);
                worst_f32 = worst_f32.max((v - exact).abs() / scale);
            }
        }
    }
    tlog!(
        "{ty} xq8: worst relative error {worst:.2e} against the quantized reference (tolerance \
         {TOL:.0e}), {worst_f32:.2e} against f32 X, adapter {:?}",
        ctx.adapter.name
    );
}

gpu_test!(matmul_xq8_q8_0, check_xq8(GgmlType::Q8_0));
gpu_test!(matmul_xq8_q4_k, check_xq8(GgmlType::Q4K));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_xq8_q5_k, check_xq8(GgmlType::Q5K));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_xq8_q6_k, check_xq8(GgmlType::Q6K));
// The legacy types' word items in row teams (no 16-byte items).
gpu_test!(matmul_xq8_q4_0, check_xq8(GgmlType::Q4_0));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_xq8_q4_1, check_xq8(GgmlType::Q4_1));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_xq8_q5_0, check_xq8(GgmlType::Q5_0));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_xq8_q5_1, check_xq8(GgmlType::Q5_1));

/// X quantized to 8 bits from every source a decode GEMV reads X from: memory (scalars and
/// vec4), a gated unit (fused gate|up halves, computed once per workgroup), and a prologue's
/// norm with a post-normed residual add. Each quantized run is compared with the same shape
/// on f32 X (so the source, not the items, is under test here): within the quantization's
/// error, 1e-2 of the sum of |terms| (an X read from the wrong place is off by about 1), and
/// its pipeline must be the quantized one.
async fn check_xq8_sources(ty: GgmlType) {
    use cera_web::ops::glu::Activation;
    use cera_web::ops::matmul::{PreAdd, PreNorm};
    let ctx = common::shared_context().await;
    let (rows, cols) = (300u64, 512u64);
    let c = cols as usize;
    let bytes = synthetic_rows(ty, cols, rows, 61);
    let wf = dequantize_to_vec(ty, &bytes).unwrap();
    let w = upload_tensor(&ctx, "w", ty, cols, rows, &bytes, ctx.limits.max_binding()).unwrap();
    let mut rng = Rng::new(ty.id() as u64 + 1300);
    let shape = |x_q8| MatmulConfig {
        rows_per_team: 4,
        x_q8,
        ..MatmulConfig::team(256, 8, 1)
    };
    let vec_tensor = |name: &str, v: &[f32]| {
        upload_tensor(
            &ctx,
            name,
            GgmlType::F32,
            cols,
            1,
            bytemuck::cast_slice(v),
            ctx.limits.max_binding(),
        )
        .unwrap()
    };
    let data = rng.vec(3 * c + 8);
    let xb = ctx.storage_buffer("x", bytemuck::cast_slice(&data));
    let wn = vec_tensor(
        "wn",
        &rng.vec(c).iter().map(|v| 1.0 + v).collect::<Vec<_>>(),
    );
    let wa = vec_tensor(
        "wa",
        &rng.vec(c).iter().map(|v| 0.5 + v).collect::<Vec<_>>(),
    );
    let out = ctx.empty_storage("r", cols * 4).unwrap();
    let y = ctx.empty_storage("y", rows * 2 * 4).unwrap();
    let mut worst = 0.0f64;
    for source in ["x at 5", "x at 4 (vec4)", "gate|up", "prenorm"] {
        let mut rec = cera_web::gpu::Recorder::new(&ctx);
        for (i, x_q8) in [false, true].into_iter().enumerate() {
            let y_off = i as u64 * rows;
            match source {
                "x at 5" => matmul::prepare(&mut rec, shape(x_q8), &w, &xb, 5, &y, y_off, 1),
                "x at 4 (vec4)" => matmul::prepare(&mut rec, shape(x_q8), &w, &xb, 4, &y, y_off, 1),
                "gate|up" => matmul::prepare_glu_fused(
                    &mut rec,
                    shape(x_q8),
                    Activation::Silu,
                    &w,
                    &xb,
                    4,
                    cols + 4,
                    2 * cols + 4,
                    &y,
                    y_off,
                    1,
                ),
                _ => {
                    let pre = PreNorm {
                        x: &xb,
                        add: Some(PreAdd {
                            add: &xb,
                            add_norm: Some(&wa),
                            scale: 0.75,
                            out: &out,
                        }),
                        w: &wn,
                        eps: 1e-6,
                    };
                    matmul::prepare_prenorm_as(&mut rec, shape(x_q8), &w, &pre, &y, y_off)
                }
            }
            .unwrap();
        }
        let prepared = rec.finish();
        let labels: Vec<String> = prepared
            .dispatches
            .iter()
            .map(|d| d.pipe.key.label())
            .collect();
        assert!(
            !labels[0].contains("XQ8") && labels[1].contains("XQ8"),
            "{ty} {source}: ran {labels:?}"
        );
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        prepared.encode(&ctx, &mut enc);
        ctx.queue.submit([enc.finish()]);
        let got = read_f32(&ctx, &y, 0, 2 * rows as usize).await.unwrap();
        let (plain, quant) = got.split_at(rows as usize);
        for r in 0..rows as usize {
            // The scale: the sum of |W| times 4, about the largest |X| of these sources (the
            // X of a norm or a GLU is not at hand here to weigh each term).
            let scale: f64 = wf[r * c..(r + 1) * c]
                .iter()
                .map(|v| v.abs() as f64)
                .sum::<f64>()
                * 4.0;
            let err = (quant[r] as f64 - plain[r] as f64).abs() / scale.max(1e-30);
            assert!(
                err <= 1e-2,
                "{ty} xq8 {source}: y[{r}] = {} against {} on f32 X (rel {err:e})",
                quant[r],
                plain[r]
            );
            worst = worst.max(err);
        }
    }
    tlog!("{ty} xq8 sources: worst difference from f32 X {worst:.2e}");
}

gpu_test!(matmul_xq8_sources_q4_k, check_xq8_sources(GgmlType::Q4K));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_xq8_sources_q6_k, check_xq8_sources(GgmlType::Q6K));

/// X read quantized from memory (`matmul::prepare_q8_x`, `XQ8_MEM`), as a GLU of its own
/// dispatch writes it (`glu::prepare_q8`): the decode path of a down projection too wide for
/// the gated unit in workgroup memory. Every team shape with 8-bit items, against the
/// reference of `check_xq8` on the CPU's quantization of the CPU's unit (tolerance: a few
/// quants rounded the other way at a near-tie); then the producer's epilogue (the residual
/// add, the next norm's weight, the sums of squares) against the plain product; and the
/// refusals: a shape without 8-bit items, a type without them, a buffer too small.
async fn check_q8_x(ty: GgmlType) {
    use cera_web::gpu::Recorder;
    use cera_web::ops::glu::{self, Activation};
    use cera_web::ops::matmul::{Epilogue, ResNorm};
    let ctx = common::shared_context().await;
    let shapes = XQ8_TEAMS;
    const TOL: f64 = 2e-4;
    let mut rng = Rng::new(ty.id() as u64 + 1700);
    let mut worst = 0.0f64;
    for (ci, &(rows, cols)) in [(37u64, 1024u64), (300, 512)].iter().enumerate() {
        let c = cols as usize;
        let bytes = synthetic_rows(ty, cols, rows, 700 + ci as u64);
        let wf = dequantize_to_vec(ty, &bytes).unwrap();
        let int_part = int_part(ty, &bytes, &wf);
        let w = upload_tensor(&ctx, "w", ty, cols, rows, &bytes, ctx.limits.max_binding()).unwrap();
        // gate at 4, up at cols + 4, over several magnitudes.
        let data: Vec<f32> = rng
            .vec(2 * c + 4)
            .iter()
            .enumerate()
            .map(|(i, v)| v * [0.3f32, 3.0, 12.0][i / 96 % 3])
            .collect();
        let (gate, up) = (&data[4..4 + c], &data[4 + c..4 + 2 * c]);
        let unit: Vec<f32> = glu::reference(Activation::Silu, gate, up)
            .iter()
            .map(|&v| v as f32)
            .collect();
        let xq: Vec<f64> = glu::reference_q8(&unit)
            .iter()
            .flat_map(|(q, d, _, _)| q.map(|v| v as f64 * *d as f64))
            .collect();
        let gu = ctx.storage_buffer("gate|up", bytemuck::cast_slice(&data));
        let gv = cera_web::ops::elementwise::View {
            buffer: &gu,
            offset: 4,
            stride: 2 * cols,
        };
        let uv = cera_web::ops::elementwise::View {
            offset: 4 + cols,
            ..gv
        };
        let qb = ctx.empty_storage("x q8", glu::q8_bytes(1, cols)).unwrap();
        let y = ctx
            .empty_storage("y", rows * shapes.len() as u64 * 4)
            .unwrap();
        let mut rec = Recorder::new(&ctx);
        glu::prepare_q8(&mut rec, Activation::Silu, gv, uv, &qb, 1, cols as u32).unwrap();
        for (i, cfg) in shapes.iter().enumerate() {
            matmul::prepare_q8_x(&mut rec, *cfg, &w, &qb, &y, i as u64 * rows, None).unwrap();
        }
        // Refused: no 8-bit items in a thread-a-row shape; a buffer short of a block.
        assert!(
            matmul::prepare_q8_x(&mut rec, MatmulConfig::simple(1), &w, &qb, &y, 0, None).is_err()
        );
        let short = ctx
            .empty_storage("short", glu::q8_bytes(1, cols) - 16)
            .unwrap();
        assert!(matmul::prepare_q8_x(&mut rec, shapes[0], &w, &short, &y, 0, None).is_err());
        let prepared = rec.finish();
        for (d, cfg) in prepared.dispatches[1..].iter().zip(&shapes) {
            let label = d.pipe.key.label();
            assert!(label.contains("XQ8_MEM"), "{ty} {cfg}: ran {label}");
        }
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        prepared.encode(&ctx, &mut enc);
        ctx.queue.submit([enc.finish()]);
        let got = read_f32(&ctx, &y, 0, rows as usize * shapes.len())
            .await
            .unwrap();
        for r in 0..rows as usize {
            let (wr, ar) = (&wf[r * c..(r + 1) * c], &int_part[r * c..(r + 1) * c]);
            let (mut want, mut scale) = (0.0f64, 0.0f64);
            for k in 0..c {
                let (wv, av, xv) = (wr[k] as f64, ar[k] as f64, unit[k] as f64);
                want += av * xq[k] + (wv - av) * xv;
                scale += (wv * xv).abs();
            }
            for (i, cfg) in shapes.iter().enumerate() {
                let v = got[i * rows as usize + r] as f64;
                let err = (v - want).abs() / scale.max(1e-30);
                assert!(
                    err <= TOL,
                    "{ty} {rows}x{cols} q8 X, {cfg}: y[{r}] = {v}, want {want} (rel {err:e})"
                );
                worst = worst.max(err);
            }
        }

        // The producer's epilogue in the engine's shape: resid += 0.5 * (W x), h = resid * en_w,
        // and the workgroups' sums of resid^2.
        let cfg = MatmulConfig::gemv_for(&ctx, ty, rows, cols);
        if !matmul::q8_x_fits(&ctx, cfg, &w) {
            continue; // (an adapter whose GEMV shape for this type has no 8-bit items)
        }
        let plain = ctx.empty_storage("plain", rows * 4).unwrap();
        let r0: Vec<f32> = rng.vec(rows as usize);
        let en: Vec<f32> = rng.vec(rows as usize).iter().map(|v| 1.0 + v).collect();
        let resid = ctx.storage_buffer("resid", bytemuck::cast_slice(&r0));
        let en_t = upload_tensor(
            &ctx,
            "en",
            GgmlType::F32,
            rows,
            1,
            bytemuck::cast_slice(&en),
            ctx.limits.max_binding(),
        )
        .unwrap();
        let hb = ctx.empty_storage("h", rows * 4).unwrap();
        let n_ss = matmul::resnorm_partials(&ctx, cfg, &w);
        let ss = ctx.empty_storage("ss", n_ss * 4).unwrap();
        let epi = Epilogue::ResNorm(ResNorm {
            w: &en_t,
            h: &hb,
            ss: &ss,
            scale: 0.5,
        });
        let mut rec = Recorder::new(&ctx);
        matmul::prepare_q8_x(&mut rec, cfg, &w, &qb, &plain, 0, None).unwrap();
        let count = matmul::prepare_q8_x(&mut rec, cfg, &w, &qb, &resid, 0, Some(&epi)).unwrap();
        assert_eq!(count, n_ss, "{ty}: sums of squares written");
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        rec.encode(&mut enc).unwrap();
        ctx.queue.submit([enc.finish()]);
        let p = read_f32(&ctx, &plain, 0, rows as usize).await.unwrap();
        let ra = read_f32(&ctx, &resid, 0, rows as usize).await.unwrap();
        let h = read_f32(&ctx, &hb, 0, rows as usize).await.unwrap();
        let sums = read_f32(&ctx, &ss, 0, n_ss as usize).await.unwrap();
        let mut sq = 0.0f64;
        for r in 0..rows as usize {
            let want = r0[r] as f64 + 0.5 * p[r] as f64;
            let tol = 1e-5 * (r0[r].abs() as f64 + p[r].abs() as f64).max(1.0);
            assert!(
                (ra[r] as f64 - want).abs() <= tol,
                "{ty} epilogue: resid[{r}] = {}, want {want}",
                ra[r]
            );
            let hw = ra[r] as f64 * en[r] as f64;
            assert!(
                (h[r] as f64 - hw).abs() <= 1e-5 * hw.abs().max(1.0),
                "{ty}: h[{r}]"
            );
            sq += ra[r] as f64 * ra[r] as f64;
        }
        let got_sq: f64 = sums.iter().map(|&v| v as f64).sum();
        assert!(
            (got_sq - sq).abs() <= 1e-5 * sq,
            "{ty}: sum of squares {got_sq}, want {sq}"
        );
    }
    // A type without 8-bit items.
    let bytes = synthetic_rows(GgmlType::F16, 256, 8, 5);
    let w = upload_tensor(
        &ctx,
        "w",
        GgmlType::F16,
        256,
        8,
        &bytes,
        ctx.limits.max_binding(),
    )
    .unwrap();
    let qb = ctx.empty_storage("x q8", glu::q8_bytes(1, 256)).unwrap();
    let y = ctx.empty_storage("y", 32).unwrap();
    let mut rec = Recorder::new(&ctx);
    assert!(matmul::prepare_q8_x(&mut rec, shapes[0], &w, &qb, &y, 0, None).is_err());
    tlog!(
        "{ty} q8 X from memory: worst relative error {worst:.2e} (tolerance {TOL:.0e}), adapter {:?}",
        ctx.adapter.name
    );
}

gpu_test!(matmul_q8_x_q8_0, check_q8_x(GgmlType::Q8_0));
gpu_test!(matmul_q8_x_q4_k, check_q8_x(GgmlType::Q4K));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_q8_x_q6_k, check_q8_x(GgmlType::Q6K));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_q8_x_q4_0, check_q8_x(GgmlType::Q4_0));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_q8_x_q5_0, check_q8_x(GgmlType::Q5_0));
#[cfg(not(target_arch = "wasm32"))]
gpu_test!(matmul_q8_x_q5_1, check_q8_x(GgmlType::Q5_1));
