//! attention_split (flash-decoding) on the GPU against the f64 CPU reference of `attention`, in
//! three kernel shapes (the default, 256 threads x 64-cell chunks, 64 threads x 4-cell chunks
//! with one-thread teams), over 1 cell, chunk-sized and ragged ranges, sliding windows that
//! start mid-chunk and mask whole chunks, GQA/MQA, soft cap, prefill batches, vec2 and vec4
//! heads, offsets; one prepared pair of dispatches run at two step positions (no stale partial
//! is read); more than 65535 workgroups. Runs natively and in headless Chrome.

mod common;

use cera_web::gpu::readback::read_f32;
use cera_web::gpu::{GpuContext, Recorder, Step};
use cera_web::ops::attention::{self, AttentionConfig, AttentionParams};
use cera_web::ops::attention_split::{self, SplitConfig};
use common::Rng;
use std::cell::RefCell;
use std::rc::Rc;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// The attention tests' tolerance (V uniform in [-1, 1), f32 against an f64 reference).
const ATOL: f32 = 1e-5;

/// Cells past the last token's position hold this: a kernel reading them would show it.
const POISON: f32 = 1e3;

const SHAPES: [SplitConfig; 4] = [
    SplitConfig::new(256, 16, 16), // the engine's default (SplitConfig::for_device)
    SplitConfig::new(128, 32, 16),
    SplitConfig::new(256, 64, 8),
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

/// One context for every test in Chrome (one page thread; pipelines compile once), one per
/// test natively (each test has its own thread).
async fn context() -> Rc<GpuContext> {
    if cfg!(not(target_arch = "wasm32")) {
        return Rc::new(common::context().await);
    }
    thread_local!(static CTX: RefCell<Option<Rc<GpuContext>>> = const { RefCell::new(None) });
    if let Some(c) = CTX.with(|c| c.borrow().clone()) {
        return c;
    }
    let c = Rc::new(common::context().await);
    CTX.with(|slot| *slot.borrow_mut() = Some(c.clone()));
    c
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
    let ctx = context().await;
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

/// One prepared pair of dispatches (grid for 300 cells) run at several step positions through a
/// step buffer, as a decode plan runs: a long range first (partials in every chunk), then a
/// short one (chunks past it hold the long run's partials), then a windowed run past the first
/// chunks (which hold partials of earlier runs). Each output must match the reference at its
/// own position.
async fn prepared_at_two_positions(name: &str, p0: AttentionParams, cfg: SplitConfig) {
    let ctx = context().await;
    let max_cells = 300u64;
    let (q, k, v) = inputs(&p0, max_cells as usize, max_cells as usize);
    let qb = ctx.storage_buffer("split q", bytemuck::cast_slice(&q));
    let kb = ctx.storage_buffer("split k", bytemuck::cast_slice(&k));
    let vb = ctx.storage_buffer("split v", bytemuck::cast_slice(&v));
    let out = ctx.empty_storage("split out", q.len() as u64 * 4).unwrap();
    let scratch = ctx
        .empty_storage(
            "split scratch",
            attention_split::scratch_bytes(&p0, cfg, max_cells),
        )
        .unwrap();
    let step = Step::new(&ctx, p0.n_tokens).unwrap();
    let mut rec = Recorder::new(&ctx);
    // p0.pos0 is 0: positions come from the step buffer alone.
    attention_split::prepare(
        &mut rec,
        cfg,
        &p0,
        &qb,
        &kb,
        &vb,
        &out,
        &scratch,
        &step.buffer,
        max_cells,
    )
    .unwrap();
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

/// More than 65535 partial workgroups (64 heads x 1250 four-cell chunks): the 2-D grid. Window 1
/// and head_dim 2 keep the work tiny (one live chunk a head, the rest return at once). Native
/// only: SwiftShader spends about a millisecond on each barrier-using workgroup.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn more_than_65535_workgroups() {
    pollster::block_on(async {
        let ctx = context().await;
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
    let ctx = context().await;
    let buf = ctx.empty_storage("split small", 4096).unwrap();
    let out = ctx.empty_storage("split out", 4096).unwrap();
    let scratch = ctx.empty_storage("split scratch", 64).unwrap();
    let cfg = SplitConfig::for_device(&ctx);
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
        &buf,
        &buf,
        &buf,
        &out,
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
        &buf,
        &buf,
        &buf,
        &out,
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

/// Decode of Gemma 3's shape (4 heads x 256, 1 KV head) over 700 and 4000 cells, the attention
/// kernel in the device's shape against the split one: milliseconds from submit to readback,
/// the best of 5 after a warm-up run. Logged, not asserted (the numbers decide which kernel a
/// CPU adapter gets).
async fn timing() {
    let ctx = context().await;
    for cells in [700u32, 4000] {
        let p = gemma(1, cells - 1, 0);
        let (q, k, v) = inputs(&p, cells as usize, cells as usize);
        let qb = ctx.storage_buffer("split q", bytemuck::cast_slice(&q));
        let kb = ctx.storage_buffer("split k", bytemuck::cast_slice(&k));
        let vb = ctx.storage_buffer("split v", bytemuck::cast_slice(&v));
        let out = ctx.empty_storage("split out", q.len() as u64 * 4).unwrap();
        let old_cfg = AttentionConfig::for_device(&ctx).fit(&ctx, &p);
        let mut best = [f64::INFINITY; 2];
        for run in 0..6 {
            for (which, slot) in best.iter_mut().enumerate() {
                let t0 = now_ms();
                let mut enc = ctx.device.create_command_encoder(&Default::default());
                if which == 0 {
                    attention::encode_with(&ctx, &mut enc, old_cfg, &p, &qb, &kb, &vb, &out)
                        .unwrap();
                } else {
                    attention_split::encode(
                        &ctx,
                        &mut enc,
                        SplitConfig::for_device(&ctx),
                        &p,
                        &qb,
                        &kb,
                        &vb,
                        &out,
                    )
                    .unwrap();
                }
                ctx.queue.submit([enc.finish()]);
                read_f32(&ctx, &out, 0, q.len()).await.unwrap();
                if run > 0 {
                    *slot = slot.min(now_ms() - t0);
                }
            }
        }
        tlog!(
            "decode 4 x 256 over {cells} cells: attention ({old_cfg:?}) {:.2} ms, split {:.2} ms",
            best[0],
            best[1]
        );
    }
}
gpu_test!(timing_old_vs_split, timing());
