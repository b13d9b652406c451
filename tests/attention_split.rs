//! attention_split (flash-decoding) on the GPU against the f64 CPU reference of `attention`, in
//! three kernel shapes (the default, 256 threads x 64-cell chunks, 64 threads x 4-cell chunks
//! with one-thread teams), over 1 cell, chunk-sized and ragged ranges, sliding windows that
//! start mid-chunk and mask whole chunks, GQA/MQA, soft cap, prefill batches, vec2 and vec4
//! heads, offsets; one prepared pair of dispatches run at two step positions (no stale partial
//! is read); more than 65535 workgroups. The fused decode partial that takes q, k and v raw
//! from a projection row (`Query::Fresh`: QK-norm, rope and the KV write inside the partial)
//! against `qk_rope`'s reference composed with attention's, over Gemma-, Llama- and Qwen3.5-like
//! heads, partial rotary, windows, soft cap, vec2 and vec4, and three decode steps in a row
//! through one prepared pair. Runs natively and in headless Chrome.

mod common;

use cera_web::gpu::readback::read_f32;
use cera_web::gpu::{GpuContext, Recorder, Step};
use cera_web::ops::attention::{self, AttentionParams};
use cera_web::ops::attention_split::{self, Fresh, Query, SplitConfig};
use cera_web::ops::{qk_rope, rope::RopeTable};
use cera_web::rope::{RopeConfig, RopeType};
use common::Rng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// The attention tests' tolerance (V uniform in [-1, 1), f32 against an f64 reference).
const ATOL: f32 = 1e-5;

/// Cells past the last token's position hold this: a kernel reading them would show it.
const POISON: f32 = 1e3;

const SHAPES: [SplitConfig; 4] = [
    SplitConfig::new(256, 16, 16), // the engine's shape for heads of 256 (SplitConfig::for_head)
    SplitConfig::new(512, 32, 16), // a shape measured at depth (fitted to the device's limits)
    SplitConfig::new(128, 32, 8),  // the engine's shape for smaller heads
    SplitConfig::new(64, 4, 1),
];

fn now_ms() -> f64 {
    #[cfg(target_arch = "wasm32")]
    {
        js_sys::Date::now()
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        use std::sync::OnceLock;
        static T0: OnceLock<std::time::Instant> = OnceLock::new();
        T0.get_or_init(std::time::Instant::now)
            .elapsed()
            .as_secs_f64()
            * 1e3
    }
}

/// Random Q, K and V for `p` on a cache of `n_ctx` cells; cells from `used` on poisoned.
fn inputs(p: &AttentionParams, n_ctx: usize, used: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (nh, nkv, hd) = (p.n_head as usize, p.n_kv_head as usize, p.head_dim as usize);
    let mut rng = Rng::new(
        0x5b1 ^ (p.pos0 as u64) << 8 ^ (p.n_tokens as u64) << 24 ^ (hd as u64) << 40 ^ nh as u64,
    );
    let q = rng.vec(p.n_tokens as usize * nh * hd);
    let mut k = rng.vec(n_ctx * nkv * hd);
    let mut v = rng.vec(n_ctx * nkv * hd);
    for x in k[used * nkv * hd..]
        .iter_mut()
        .chain(v[used * nkv * hd..].iter_mut())
    {
        *x = POISON;
    }
    (q, k, v)
}

/// The worst absolute error and where, or a failure line.
fn compare(label: &str, p: &AttentionParams, got: &[f32], want: &[f32]) -> Option<String> {
    let (nh, hd) = (p.n_head as usize, p.head_dim as usize);
    let mut worst = (0f32, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        let d = if d.is_nan() { f32::INFINITY } else { d };
        if d > worst.0 {
            worst = (d, i);
        }
    }
    tlog!("{label}: worst |err| {:.2e}", worst.0);
    (worst.0 > ATOL).then(|| {
        let i = worst.1;
        format!(
            "{label}: token {} head {} dim {}: gpu {} vs cpu {}",
            i / (nh * hd),
            (i / hd) % nh,
            i % hd,
            got[i],
            want[i]
        )
    })
}

/// Run `p` in each shape on a cache of `pos0 + n_tokens + 3` cells (the last 3 poisoned).
async fn check(ctx: &GpuContext, name: &str, shapes: &[SplitConfig], p: AttentionParams) {
    let n_ctx = p.n_cells() as usize + 3;
    let (q, k, v) = inputs(&p, n_ctx, p.n_cells() as usize);
    let want = attention::reference(&p, &q, &k, &v);
    let mut qbuf = vec![0f32; p.q_offset as usize];
    qbuf.extend_from_slice(&q);
    let qb = ctx.storage_buffer("split q", bytemuck::cast_slice(&qbuf));
    let kb = ctx.storage_buffer("split k", bytemuck::cast_slice(&k));
    let vb = ctx.storage_buffer("split v", bytemuck::cast_slice(&v));
    let out = ctx
        .empty_storage("split out", (p.out_offset as u64 + q.len() as u64) * 4)
        .unwrap();
    let mut failures = Vec::new();
    let mut times = Vec::new();
    for &cfg in shapes {
        let t0 = now_ms();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        attention_split::encode(ctx, &mut enc, cfg, &p, &qb, &kb, &vb, &out).unwrap();
        ctx.queue.submit([enc.finish()]);
        let got = read_f32(ctx, &out, p.out_offset as u64 * 4, want.len())
            .await
            .unwrap();
        times.push(format!("{:.0}", now_ms() - t0));
        let label = format!(
            "{name} wg {} chunk {} team {}",
            cfg.workgroup_size, cfg.chunk, cfg.team
        );
        failures.extend(compare(&label, &p, &got, &want));
    }
    assert!(
        failures.is_empty(),
        "{name} ({p:?}):\n{}",
        failures.join("\n")
    );
    tlog!(
        "{name}: ms per shape (submit to readback) {}",
        times.join(" / ")
    );
}

/// A scale of 1/sqrt(head_dim), no window, no cap.
fn params(n_tokens: u32, n_head: u32, n_kv_head: u32, head_dim: u32, pos0: u32) -> AttentionParams {
    AttentionParams::new(
        n_tokens,
        n_head,
        n_kv_head,
        head_dim,
        pos0,
        0,
        1.0 / (head_dim as f32).sqrt(),
        0.0,
    )
}

async fn run(name: &str, p: AttentionParams) {
    let ctx = common::shared_context().await;
    check(&ctx, name, &SHAPES, p).await;
}

// One cell: the whole range is one partial chunk (vec4 head of 256, and head_dim 2 as one vec2).
gpu_test!(
    decode_1_cell_mqa_hd256,
    run("decode_1_cell_mqa_hd256", params(1, 4, 1, 256, 0))
);
gpu_test!(
    decode_1_cell_hd2,
    run("decode_1_cell_hd2", params(1, 2, 1, 2, 0))
);
// Exactly one chunk of the default (32) and of the 256-thread shape (64); one past it.
gpu_test!(
    decode_32_cells,
    run("decode_32_cells", params(1, 4, 1, 256, 31))
);
gpu_test!(
    decode_64_cells,
    run("decode_64_cells", params(1, 8, 2, 64, 63))
);
gpu_test!(
    decode_65_cells,
    run("decode_65_cells", params(1, 8, 2, 64, 64))
);
// Ragged ranges: not a multiple of any chunk; odd vector counts (head_dim 66: 33 vec2; 80: 20
// vec4).
gpu_test!(
    decode_70_cells_gqa_hd64,
    run("decode_70_cells_gqa_hd64", params(1, 8, 2, 64, 69))
);
gpu_test!(
    decode_301_cells_gqa_hd256,
    run("decode_301_cells_gqa_hd256", params(1, 8, 2, 256, 300))
);
gpu_test!(
    decode_150_cells_hd66_gqa3,
    run("decode_150_cells_hd66_gqa3", params(1, 6, 2, 66, 149))
);
gpu_test!(
    decode_99_cells_mha_hd80,
    run("decode_99_cells_mha_hd80", params(1, 4, 4, 80, 98))
);
// Sliding windows starting mid-chunk: window 40 at 300 cells keeps 260..299 (chunks before 8 of
// the default masked whole, chunk 8 masked in part); window 5 over 4-cell chunks.
gpu_test!(
    window40_decode_300_cells,
    run(
        "window40_decode_300_cells",
        AttentionParams {
            window: 40,
            ..params(1, 4, 1, 128, 299)
        }
    )
);
gpu_test!(
    window5_decode_23_cells,
    run(
        "window5_decode_23_cells",
        AttentionParams {
            window: 5,
            ..params(1, 4, 2, 64, 22)
        }
    )
);
// Gemma 3 (4 heads, 1 KV head, head_dim 256, Q pre-scaled): local layer (window 512) and global.
fn gemma(n_tokens: u32, pos0: u32, window: u32) -> AttentionParams {
    AttentionParams::new(n_tokens, 4, 1, 256, pos0, window, 1.0 / 16.0, 0.0)
}
gpu_test!(
    gemma_window512_decode_700_cells,
    run("gemma_window512_decode_700_cells", gemma(1, 699, 512))
);
gpu_test!(
    gemma_global_decode_700_cells,
    run("gemma_global_decode_700_cells", gemma(1, 699, 0))
);
// Soft cap (logits ~5 against a cap of 3), with and without a window.
gpu_test!(
    softcap_decode,
    run(
        "softcap_decode",
        AttentionParams {
            softcap: 3.0,
            scale: 1.0,
            ..params(1, 4, 2, 128, 50)
        }
    )
);
gpu_test!(
    softcap_prefill_window,
    run(
        "softcap_prefill_window",
        AttentionParams {
            softcap: 3.0,
            scale: 1.0,
            window: 6,
            ..params(9, 4, 1, 64, 4)
        }
    )
);
// Prefill batches through the split kernel: each token its own range and chunk count.
gpu_test!(
    prefill_t5_pos0_gqa_hd64,
    run("prefill_t5_pos0_gqa_hd64", params(5, 8, 2, 64, 0))
);
gpu_test!(
    prefill_t33_pos40_gqa_hd256,
    run("prefill_t33_pos40_gqa_hd256", params(33, 8, 2, 256, 40))
);
gpu_test!(
    prefill_t17_window512_crossing,
    run("prefill_t17_window512_crossing", gemma(17, 500, 512))
);
gpu_test!(
    prefill_t20_window4,
    run(
        "prefill_t20_window4",
        AttentionParams {
            window: 4,
            ..params(20, 4, 2, 64, 0)
        }
    )
);
// Q and out at element offsets: even (vec2 path) and multiples of 4 (vec4 path).
gpu_test!(
    offsets_even,
    run(
        "offsets_even",
        AttentionParams {
            q_offset: 6,
            out_offset: 10,
            ..params(3, 4, 2, 64, 40)
        }
    )
);
gpu_test!(
    offsets_vec4,
    run(
        "offsets_vec4",
        AttentionParams {
            q_offset: 8,
            out_offset: 4,
            ..params(3, 4, 2, 64, 40)
        }
    )
);

/// The GPU side of a prepared split attention over `max_cells` cells with positions from a
/// step buffer: q, k, v uploaded, a scratch and a step buffer, and the roped partial (with the
/// reduce into `out` when given) recorded into `rec`. Returns the step buffer, the scratch and
/// where the partials are.
#[allow(clippy::too_many_arguments)]
fn prepare_roped(
    ctx: &GpuContext,
    rec: &mut Recorder,
    cfg: SplitConfig,
    p0: &AttentionParams,
    (q, k, v): (&[f32], &[f32], &[f32]),
    out: Option<&wgpu::Buffer>,
    max_cells: u64,
) -> (Step, wgpu::Buffer, attention_split::Partials) {
    let qb = ctx.storage_buffer("split q", bytemuck::cast_slice(q));
    let kb = ctx.storage_buffer("split k", bytemuck::cast_slice(k));
    let vb = ctx.storage_buffer("split v", bytemuck::cast_slice(v));
    let scratch = ctx
        .empty_storage(
            "split scratch",
            attention_split::scratch_bytes(p0, cfg, max_cells),
        )
        .unwrap();
    let step = Step::new(ctx, p0.n_tokens).unwrap();
    let partials = attention_split::prepare(
        rec,
        cfg,
        p0,
        Query::Roped(&qb),
        &kb,
        &vb,
        out,
        &scratch,
        &step.buffer,
        max_cells,
    )
    .unwrap();
    (step, scratch, partials)
}

/// One prepared pair of dispatches (grid for 300 cells) run at several step positions through a
/// step buffer, as a decode plan runs: a long range first (partials in every chunk), then a
/// short one (chunks past it hold the long run's partials), then a windowed run past the first
/// chunks (which hold partials of earlier runs). Each output must match the reference at its
/// own position.
async fn prepared_at_two_positions(name: &str, p0: AttentionParams, cfg: SplitConfig) {
    let ctx = common::shared_context().await;
    let max_cells = 300u64;
    let (q, k, v) = inputs(&p0, max_cells as usize, max_cells as usize);
    let out = ctx.empty_storage("split out", q.len() as u64 * 4).unwrap();
    let mut rec = Recorder::new(&ctx);
    // p0.pos0 is 0: positions come from the step buffer alone.
    let qkv = (&q[..], &k[..], &v[..]);
    let (step, _scratch, _) = prepare_roped(&ctx, &mut rec, cfg, &p0, qkv, Some(&out), max_cells);
    let prepared = rec.finish();
    let mut failures = Vec::new();
    for pos0 in [max_cells as u32 - p0.n_tokens, 37, 250] {
        step.write(&ctx, pos0, &vec![0; p0.n_tokens as usize]);
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        prepared.encode(&ctx, &mut enc);
        ctx.queue.submit([enc.finish()]);
        let got = read_f32(&ctx, &out, 0, q.len()).await.unwrap();
        let p = AttentionParams { pos0, ..p0 };
        let want = attention::reference(&p, &q, &k, &v);
        failures.extend(compare(&format!("{name} at pos0 {pos0}"), &p, &got, &want));
    }
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}
gpu_test!(
    prepared_decode_at_three_positions,
    prepared_at_two_positions(
        "prepared_decode",
        gemma(1, 0, 0),
        SplitConfig::new(128, 32, 16)
    )
);
gpu_test!(
    prepared_windowed_prefill_at_three_positions,
    prepared_at_two_positions(
        "prepared_windowed_prefill",
        AttentionParams {
            window: 30,
            ..params(3, 8, 2, 64, 0)
        },
        SplitConfig::new(64, 4, 1)
    )
);

/// The o projection doing the reduce itself (`matmul::SplitX`, `X_SPLIT` in matmul.wgsl): one
/// prepared partial without its reduce, then GEMVs of `rows x (n_head * head_dim)` whose every
/// workgroup combines the chunks, in several GEMV shapes (thread-per-row, row teams with and
/// without subgroups, several rows a team shared by teams, the engine's own) and weight types
/// (those whose blocks divide the row),
/// run at several step positions through a step buffer (chunks past a shorter run, and with a
/// window chunks before a later one, hold stale partials of earlier runs), against W times the
/// reference attention in f64. Misuse
/// (heads that are not the GEMV's columns) is refused.
async fn split_x(name: &str, p0: AttentionParams, cfg: SplitConfig, positions: &[u32], rows: u64) {
    use cera_web::gguf::GgmlType;
    use cera_web::ops::matmul::{self, MatmulConfig, SplitX};
    use cera_web::quant::dequantize_to_vec;
    use cera_web::quant::gpu::{synthetic_rows, upload_tensor};
    let ctx = common::shared_context().await;
    let max_cells = *positions.iter().max().unwrap() as u64 + 1;
    let (q, k, v) = inputs(&p0, max_cells as usize + 3, max_cells as usize);
    let mut rec = Recorder::new(&ctx);
    let qkv = (&q[..], &k[..], &v[..]);
    let (step, scratch, partials) = prepare_roped(&ctx, &mut rec, cfg, &p0, qkv, None, max_cells);
    let sx = SplitX {
        scratch: &scratch,
        step: &step.buffer,
        partials,
    };
    let cols = (p0.n_head * p0.head_dim) as u64;
    let teams = |tpr, nr, ks, subgroup| MatmulConfig {
        w_vec4: nr > 1,
        rows_per_team: nr,
        k_split: ks,
        subgroup,
        ..MatmulConfig::team(256, tpr, 1)
    };
    let cases = [
        (GgmlType::F32, Some(MatmulConfig::simple(1))),
        (GgmlType::Q8_0, Some(teams(32, 1, 1, true))),
        (GgmlType::Q4K, Some(teams(8, 2, 4, true))),
        (GgmlType::Q6K, Some(teams(16, 1, 1, false))),
        (GgmlType::Q5_0, None), // the engine's decode shape
        (GgmlType::F16, Some(teams(8, 1, 1, false))),
        (GgmlType::F32, None),
    ];
    let mut runs = Vec::new();
    // (The types whose blocks divide a row.)
    let whole = cases
        .iter()
        .filter(|(ty, _)| cols.is_multiple_of(ty.block_elems()));
    for (i, &(ty, mcfg)) in whole.enumerate() {
        let bytes = synthetic_rows(ty, cols, rows, 70 + i as u64);
        let wf = dequantize_to_vec(ty, &bytes).unwrap();
        let w =
            upload_tensor(&ctx, "wo", ty, cols, rows, &bytes, ctx.limits.max_binding()).unwrap();
        let y = ctx.empty_storage("y", (rows + 3) * 4).unwrap();
        let mcfg = mcfg.unwrap_or(MatmulConfig::gemv_for(&ctx, ty, rows, cols));
        matmul::prepare_split_x(&mut rec, mcfg, &w, &sx, &y, 3, None).unwrap();
        runs.push((ty, mcfg, wf, y));
    }
    let prepared = rec.finish();
    let mut worst = 0f64;
    for &pos in positions {
        step.write(&ctx, pos, &[0]);
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        prepared.encode(&ctx, &mut enc);
        ctx.queue.submit([enc.finish()]);
        let att = attention::reference(&AttentionParams { pos0: pos, ..p0 }, &q, &k, &v);
        for (ty, mcfg, wf, y) in &runs {
            let got = read_f32(&ctx, y, 12, rows as usize).await.unwrap();
            for (r, &g) in got.iter().enumerate() {
                let wr = &wf[r * cols as usize..][..cols as usize];
                let want: f64 = wr
                    .iter()
                    .zip(&att)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum();
                // The attention's own tolerance carried through |W|, plus the product's rounding.
                let tol: f64 = wr
                    .iter()
                    .zip(&att)
                    .map(|(&a, &b)| a.abs() as f64 * (ATOL as f64 + 1e-6 * (b as f64).abs()))
                    .sum();
                let err = (g as f64 - want).abs();
                assert!(
                    err <= tol,
                    "{name} {ty} {mcfg} at position {pos}: y[{r}] = {g}, want {want} (|err| {err:e} > {tol:e})"
                );
                worst = worst.max(err / tol.max(1e-30));
            }
        }
    }
    tlog!("{name}: worst error {worst:.1e} of the tolerance");
    // Heads that are not the GEMV's columns.
    let w = upload_tensor(
        &ctx,
        "wrong",
        GgmlType::F32,
        cols + 4,
        2,
        &vec![0; (cols as usize + 4) * 8],
        ctx.limits.max_binding(),
    )
    .unwrap();
    let y = ctx.empty_storage("y", 64).unwrap();
    let mut rec = Recorder::new(&ctx);
    let e = matmul::prepare_split_x(&mut rec, MatmulConfig::simple(1), &w, &sx, &y, 0, None)
        .unwrap_err()
        .message;
    assert!(e.contains("are not the"), "{e}");
}
// Gemma 3's heads (4 x 256, one KV head) in the engine's shape: 19 chunks, then 3, then 16.
gpu_test!(
    split_x_gemma_heads,
    split_x(
        "split_x_gemma_heads",
        gemma(1, 0, 0),
        SplitConfig::new(256, 16, 16),
        &[299, 37, 250],
        37
    )
);
// Heads of 12 (3 vec4s), 3 of them; a window of 40 that masks whole chunks and starts
// mid-chunk (at 299 chunks 0-2 hold the run at 45's partials; at 100 chunks 16-18 hold 299's);
// position 0 (one cell).
gpu_test!(
    split_x_window_hd12,
    split_x(
        "split_x_window_hd12",
        AttentionParams {
            window: 40,
            ..params(1, 3, 1, 12, 0)
        },
        SplitConfig::new(64, 16, 4),
        &[45, 299, 100, 0],
        50
    )
);
// Many small chunks (4 cells: 38 chunks a head, not a multiple of the four a step), heads of
// 80 (20 vec4s), GQA.
gpu_test!(
    split_x_many_chunks_hd80,
    split_x(
        "split_x_many_chunks_hd80",
        params(1, 4, 2, 80, 0),
        SplitConfig::new(64, 4, 1),
        &[150, 3, 77],
        5
    )
);

/// More than 65535 partial workgroups (64 heads x 1250 four-cell chunks): the 2-D grid. Window 1
/// and head_dim 2 keep the work tiny (one live chunk a head, the rest return at once). Native
/// only: SwiftShader spends about a millisecond on each barrier-using workgroup.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn more_than_65535_workgroups() {
    pollster::block_on(async {
        let ctx = common::shared_context().await;
        let p = AttentionParams {
            window: 1,
            ..params(1, 64, 1, 2, 4999)
        };
        assert!(64 * 1250 > ctx.limits.max_compute_workgroups_per_dimension);
        check(
            &ctx,
            "more_than_65535_workgroups",
            &[SplitConfig::new(64, 4, 1)],
            p,
        )
        .await;
    });
}

/// Bad shapes get clear errors before anything is encoded.
async fn bad_arguments() {
    let ctx = common::shared_context().await;
    let buf = ctx.empty_storage("split small", 4096).unwrap();
    let out = ctx.empty_storage("split out", 4096).unwrap();
    let scratch = ctx.empty_storage("split scratch", 64).unwrap();
    let cfg = SplitConfig::for_head(&ctx, 256);
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let mut err = |c: SplitConfig, p: AttentionParams, o: &wgpu::Buffer| {
        attention_split::encode(&ctx, &mut enc, c, &p, &buf, &buf, &buf, o)
            .unwrap_err()
            .message
    };
    assert!(err(cfg, params(1, 4, 1, 7, 0), &out).contains("even"));
    assert!(err(cfg, params(1, 4, 1, 258, 0), &out).contains("at most 256"));
    assert!(err(cfg, params(1, 6, 4, 64, 0), &out).contains("multiple of n_kv_head"));
    assert!(err(cfg, params(1, 4, 1, 64, 100), &out).contains("k_cache holds 4096 bytes"));
    assert!(err(cfg, params(1, 4, 1, 64, 0), &buf).contains("other than q"));
    assert!(err(
        SplitConfig { chunk: 6, ..cfg },
        params(1, 4, 1, 64, 0),
        &out
    )
    .contains("multiple of 4"));
    // A scratch too small for max_cells, and one bound elsewhere too.
    let mut rec = Recorder::new(&ctx);
    let p = params(1, 4, 1, 64, 0);
    let e = attention_split::prepare(
        &mut rec,
        cfg,
        &p,
        Query::Roped(&buf),
        &buf,
        &buf,
        Some(&out),
        &scratch,
        ctx.zero_step(),
        4,
    )
    .unwrap_err()
    .message;
    assert!(e.contains("scratch holds 64 bytes"), "{e}");
    let e = attention_split::prepare(
        &mut rec,
        cfg,
        &p,
        Query::Roped(&buf),
        &buf,
        &buf,
        Some(&out),
        &out,
        ctx.zero_step(),
        4,
    )
    .unwrap_err()
    .message;
    assert!(e.contains("of its own"), "{e}");
    // Zero tokens is a no-op.
    attention_split::encode(
        &ctx,
        &mut enc,
        cfg,
        &params(0, 4, 1, 64, 0),
        &buf,
        &buf,
        &buf,
        &out,
    )
    .unwrap();
}
gpu_test!(bad_arguments_are_clear_errors, bad_arguments());

/// One case of the fused decode partial ([`attention_split::Query::Fresh`]).
#[derive(Clone, Copy, Debug)]
struct FreshCase {
    n_head: u32,
    n_kv: u32,
    hd: u32,
    n_rot: u32,
    rope: RopeType,
    norm: bool,
    /// Each q head followed by its output gate in the row (Qwen3.5).
    gated: bool,
    /// Columns before q in the row (a multiple of 4 keeps vec4 loads; 2 forces vec2).
    lead: u32,
    window: u32,
    softcap: f32,
    attn_factor: f32,
}

impl FreshCase {
    fn qhs(&self) -> u64 {
        self.hd as u64 * if self.gated { 2 } else { 1 }
    }
    /// Row layout: `lead` columns, q heads `qhs` apart, 2 columns, k, v, 2 columns.
    fn cols(&self) -> (u64, u64, u64, u64) {
        let q_col = self.lead as u64;
        let k_col = q_col + self.n_head as u64 * self.qhs() + 2;
        let v_col = k_col + (self.n_kv * self.hd) as u64;
        (
            q_col,
            k_col,
            v_col,
            v_col + (self.n_kv * self.hd) as u64 + 2,
        )
    }
    fn params(&self, pos: u32) -> AttentionParams {
        AttentionParams {
            q_offset: self.lead,
            ..AttentionParams::new(
                1,
                self.n_head,
                self.n_kv,
                self.hd,
                pos,
                self.window,
                1.0 / (self.hd as f32).sqrt(),
                self.softcap,
            )
        }
    }
    fn rope(&self) -> RopeConfig {
        let mut c = RopeConfig::new(self.hd as usize, 10000.0, self.rope);
        c.n_rot = self.n_rot as usize;
        c.attn_factor = self.attn_factor;
        c
    }
}

/// The expected output and the caches after a step at `pos` from projection row `src`:
/// `qk_rope`'s reference (norm, rope) puts k and v into cell `pos`, then attention's.
fn fresh_reference(
    c: &FreshCase,
    table: &RopeTable,
    w: &[f32],
    src: &[f32],
    k: &mut [f32],
    v: &mut [f32],
    pos: u32,
) -> Vec<f32> {
    let (hd, kvd) = (c.hd as usize, (c.n_kv * c.hd) as usize);
    let (q_col, k_col, v_col, _) = c.cols();
    let q: Vec<f32> = (0..c.n_head as usize)
        .flat_map(|h| src[q_col as usize + h * c.qhs() as usize..][..hd].to_vec())
        .collect();
    let kraw = &src[k_col as usize..][..kvd];
    let norm = c.norm.then_some((w, 1e-6f32));
    let (wq, wk) = qk_rope::reference(
        table,
        &q,
        kraw,
        c.n_head as usize,
        c.n_kv as usize,
        norm,
        pos,
    );
    let cell = pos as usize * kvd;
    k[cell..cell + kvd].copy_from_slice(&wk);
    v[cell..cell + kvd].copy_from_slice(&src[v_col as usize..][..kvd]);
    let p = AttentionParams {
        q_offset: 0,
        ..c.params(pos)
    };
    attention::reference(&p, &wq, k, v)
}

/// Cells `0 .. pos` random, from `pos` on poisoned; a projection row; the norm weights.
fn fresh_inputs(c: &FreshCase, n_ctx: usize, pos: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let kvd = (c.n_kv * c.hd) as usize;
    let mut rng = Rng::new(0xf7e5 ^ (pos as u64) << 8 ^ (c.hd as u64) << 24 ^ c.n_head as u64);
    let mut k = rng.vec(n_ctx * kvd);
    let mut v = rng.vec(n_ctx * kvd);
    for x in k[pos * kvd..].iter_mut().chain(v[pos * kvd..].iter_mut()) {
        *x = POISON;
    }
    let w: Vec<f32> = rng.vec(2 * c.hd as usize).iter().map(|x| 1.0 + x).collect();
    (k, v, w)
}

fn fresh_row(c: &FreshCase, seed: u64) -> Vec<f32> {
    // q and k of magnitude a few units (the norm matters), v in [-1, 1).
    let stride = c.cols().3 as usize;
    let mut rng = Rng::new(seed);
    let mut row: Vec<f32> = rng.vec(stride).iter().map(|x| 3.0 * x + 0.2).collect();
    let (_, _, v_col, _) = c.cols();
    for x in row[v_col as usize..][..(c.n_kv * c.hd) as usize].iter_mut() {
        *x /= 3.2;
    }
    row
}

/// The worst |difference| of the caches against the expected ones (every cell, so a write to a
/// wrong cell shows).
fn cache_error(got: &[f32], want: &[f32]) -> f32 {
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            let d = (g - w).abs();
            if d.is_nan() {
                f32::INFINITY
            } else {
                d
            }
        })
        .fold(0.0, f32::max)
}

/// `c` at positions `positions` (consecutive decode steps, each a new projection row) through
/// one prepared pair and a step buffer, in each shape of `shapes`: the output of every step and
/// the caches after the last against the references.
async fn check_fresh(name: &str, shapes: &[SplitConfig], c: FreshCase, positions: &[u32]) {
    let ctx = common::shared_context().await;
    let n_ctx = *positions.iter().max().unwrap() as usize + 4;
    let first = positions[0] as usize;
    let (k0, v0, w) = fresh_inputs(&c, n_ctx, first);
    let table = RopeTable::new(&ctx, &c.rope()).unwrap();
    let wb = ctx.storage_buffer("fresh norm", bytemuck::cast_slice(&w));
    let (q_col, k_col, v_col, stride) = c.cols();
    let p0 = AttentionParams {
        pos0: 0,
        ..c.params(0)
    };
    let out_len = (c.n_head * c.hd) as usize;
    let mut failures = Vec::new();
    for &cfg in shapes {
        let label = format!(
            "{name} wg {} chunk {} team {}",
            cfg.workgroup_size, cfg.chunk, cfg.team
        );
        let (mut k, mut v) = (k0.clone(), v0.clone());
        let kb = ctx.storage_buffer("fresh k", bytemuck::cast_slice(&k));
        let vb = ctx.storage_buffer("fresh v", bytemuck::cast_slice(&v));
        let srcb = ctx.empty_storage("fresh src", stride * 4).unwrap();
        let out = ctx.empty_storage("fresh out", out_len as u64 * 4).unwrap();
        let scratch = ctx
            .empty_storage(
                "fresh scratch",
                attention_split::scratch_bytes(&p0, cfg, n_ctx as u64),
            )
            .unwrap();
        let step = Step::new(&ctx, 1).unwrap();
        let f = Fresh {
            src: &srcb,
            stride,
            q_head_stride: c.qhs(),
            k_col,
            v_col,
            rope: &table,
            norm: c.norm.then_some((&wb, 1e-6)),
        };
        assert_eq!(p0.q_offset as u64, q_col);
        let mut rec = Recorder::new(&ctx);
        attention_split::prepare(
            &mut rec,
            cfg,
            &p0,
            Query::Fresh(&f),
            &kb,
            &vb,
            Some(&out),
            &scratch,
            &step.buffer,
            n_ctx as u64,
        )
        .unwrap();
        let prepared = rec.finish();
        for &pos in positions {
            let row = fresh_row(&c, 0x51 ^ pos as u64);
            ctx.queue.write_buffer(&srcb, 0, bytemuck::cast_slice(&row));
            step.write(&ctx, pos, &[0]);
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            prepared.encode(&ctx, &mut enc);
            ctx.queue.submit([enc.finish()]);
            let got = read_f32(&ctx, &out, 0, out_len).await.unwrap();
            let want = fresh_reference(&c, &table, &w, &row, &mut k, &mut v, pos);
            let p = c.params(pos);
            failures.extend(compare(&format!("{label} at {pos}"), &p, &got, &want));
        }
        let gk = read_f32(&ctx, &kb, 0, k.len()).await.unwrap();
        let gv = read_f32(&ctx, &vb, 0, v.len()).await.unwrap();
        let (ek, ev) = (cache_error(&gk, &k), cache_error(&gv, &v));
        tlog!("{label}: caches' worst |err| k {ek:.2e} v {ev:.2e}");
        if ek > 1e-5 || ev != 0.0 {
            failures.push(format!("{label}: caches differ: k {ek:.2e}, v {ev:.2e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name} ({c:?}):\n{}",
        failures.join("\n")
    );
}

/// Gemma 3 270M's attention: 4 heads of 256 on one kv head, QK-norm, NeoX rope.
const GEMMA_FRESH: FreshCase = FreshCase {
    n_head: 4,
    n_kv: 1,
    hd: 256,
    n_rot: 256,
    rope: RopeType::Neox,
    norm: true,
    gated: false,
    lead: 0,
    window: 0,
    softcap: 0.0,
    attn_factor: 1.0,
};

// Steps from cell 0 (the fresh cell alone) and across a chunk border.
gpu_test!(
    fresh_gemma_first_steps,
    check_fresh("fresh_gemma_first_steps", &SHAPES, GEMMA_FRESH, &[0, 1, 2])
);
gpu_test!(
    fresh_gemma_long_windowed,
    check_fresh(
        "fresh_gemma_long_windowed",
        &SHAPES[..2],
        FreshCase {
            window: 40,
            ..GEMMA_FRESH
        },
        &[63, 64, 65]
    )
);
// Llama's shape: 8 heads of 128 on 2 kv heads (GQA: one writer a kv group), NORM rope, no
// QK-norm, q after a lead of 4 columns.
gpu_test!(
    fresh_llama_gqa,
    check_fresh(
        "fresh_llama_gqa",
        &SHAPES,
        FreshCase {
            n_head: 8,
            n_kv: 2,
            hd: 128,
            n_rot: 128,
            rope: RopeType::Norm,
            norm: false,
            lead: 4,
            ..GEMMA_FRESH
        },
        &[30, 31, 32]
    )
);
// Qwen3.5's: gates between q heads, partial rotary, QK-norm; a lead of 2 columns (vec2 loads).
gpu_test!(
    fresh_gated_partial_rotary_vec2,
    check_fresh(
        "fresh_gated_partial_rotary_vec2",
        &SHAPES,
        FreshCase {
            n_head: 4,
            n_kv: 2,
            hd: 64,
            n_rot: 16,
            gated: true,
            lead: 2,
            ..GEMMA_FRESH
        },
        &[15, 16, 17]
    )
);
// Small heads (12: 6 pairs), soft cap and an attention factor, one thread a team.
gpu_test!(
    fresh_small_heads_softcap,
    check_fresh(
        "fresh_small_heads_softcap",
        &SHAPES,
        FreshCase {
            n_head: 3,
            n_kv: 3,
            hd: 12,
            n_rot: 12,
            rope: RopeType::Norm,
            softcap: 2.0,
            attn_factor: 1.19,
            ..GEMMA_FRESH
        },
        &[5, 6, 7]
    )
);

gpu_test!(fresh_refuses_what_it_cannot_run, async {
    let ctx = common::shared_context().await;
    let c = GEMMA_FRESH;
    let table = RopeTable::new(&ctx, &c.rope()).unwrap();
    let (_, k_col, v_col, stride) = c.cols();
    let buf = |n: u64| ctx.empty_storage("fresh refusal", n * 4).unwrap();
    let (src, kc, vc, out, scratch) = (buf(stride), buf(4096), buf(4096), buf(1024), buf(1 << 16));
    let small = buf(8);
    let cfg = SHAPES[0];
    let f = Fresh {
        src: &src,
        stride,
        q_head_stride: c.qhs(),
        k_col,
        v_col,
        rope: &table,
        norm: Some((&small, 1e-6)),
    };
    let p = c.params(0);
    let run = |p: &AttentionParams, f: &Fresh, out: &wgpu::Buffer| {
        let mut rec = Recorder::new(&ctx);
        attention_split::prepare(
            &mut rec,
            cfg,
            p,
            Query::Fresh(f),
            &kc,
            &vc,
            Some(out),
            &scratch,
            ctx.zero_step(),
            4,
        )
        .map_err(|e| e.to_string())
    };
    let norm_short = run(&p, &f, &out).unwrap_err();
    assert!(norm_short.contains("norm weights"), "{norm_short}");
    let f = Fresh { norm: None, ..f };
    run(&p, &f, &out).unwrap();
    let two = run(&AttentionParams { n_tokens: 2, ..p }, &f, &out).unwrap_err();
    assert!(two.contains("one a step"), "{two}");
    let odd = run(
        &p,
        &Fresh {
            k_col: k_col + 1,
            ..f
        },
        &out,
    )
    .unwrap_err();
    assert!(odd.contains("even"), "{odd}");
    let narrow = run(
        &p,
        &Fresh {
            stride: stride - 3,
            ..f
        },
        &out,
    )
    .unwrap_err();
    assert!(narrow.contains("do not fit"), "{narrow}");
    let onto_src = run(&p, &f, &src).unwrap_err();
    assert!(
        onto_src.contains("other than q") || onto_src.contains("source"),
        "{onto_src}"
    );
});
