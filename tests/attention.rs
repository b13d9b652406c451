//! attention on the GPU against the f64 CPU reference, in every kernel shape (no-barrier simple,
//! cooperative 128 and 256), over decode and prefill, GQA/MQA/MHA, head sizes 64/80/128/256,
//! sliding windows (Gemma 3's 512 included) and a logit soft cap. Runs natively and in headless
//! Chrome.

mod common;

use cera_web::gpu::readback::read_f32;
use cera_web::gpu::GpuContext;
use cera_web::ops::attention::{self, AttentionConfig, AttentionParams};
use common::Rng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// Absolute tolerance relative to the V scale (V is uniform in [-1, 1)): f32 dot products of up
/// to 256 terms and f32 exp against an f64 reference. The worst error seen is logged per case.
const ATOL: f32 = 1e-5;

/// Cells past the last token's position hold this: a kernel reading them would show it.
const POISON: f32 = 1e3;

const SHAPES: [AttentionConfig; 8] = [
    AttentionConfig::simple(),
    AttentionConfig::cooperative(128),
    AttentionConfig::cooperative(256),
    // Several heads of a kv head per workgroup (as many as divide the test's group, up to 4).
    AttentionConfig::grouped(256, 4),
    AttentionConfig::grouped(128, 2),
    // Blocks of queries (batches only; one token runs the cooperative shape): the engine's
    // choice, and smaller tiles, so that blocks with fewer real queries than the tile and tiles
    // with masked cells on both ends are exercised.
    AttentionConfig::tiled(16, 16),
    AttentionConfig::tiled(4, 16),
    AttentionConfig::tiled(4, 8),
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

/// Run `p` in every shape on a cache of `pos0 + n_tokens + 3` cells (the last 3 poisoned) and
/// compare with the reference. `q_offset`/`out_offset` of `p` are honoured (Q and out then start
/// that many elements into their buffers).
async fn check(ctx: &GpuContext, name: &str, shapes: &[AttentionConfig], p: AttentionParams) {
    let (nh, nkv, hd) = (p.n_head as usize, p.n_kv_head as usize, p.head_dim as usize);
    let n_ctx = p.pos0 as usize + p.n_tokens as usize + 3;
    let used = p.n_cells() as usize * nkv * hd;
    let mut rng = Rng::new(
        0xa77e ^ (p.pos0 as u64) << 8 ^ (p.n_tokens as u64) << 24 ^ (hd as u64) << 40 ^ nh as u64,
    );
    let q = rng.vec(p.n_tokens as usize * nh * hd);
    let mut k = rng.vec(n_ctx * nkv * hd);
    let mut v = rng.vec(n_ctx * nkv * hd);
    for x in k[used..].iter_mut().chain(v[used..].iter_mut()) {
        *x = POISON;
    }
    let want = attention::reference(&p, &q, &k, &v);

    let mut qbuf = vec![0f32; p.q_offset as usize];
    qbuf.extend_from_slice(&q);
    let qb = ctx.storage_buffer("attn q", bytemuck::cast_slice(&qbuf));
    let kb = ctx.storage_buffer("attn k", bytemuck::cast_slice(&k));
    let vb = ctx.storage_buffer("attn v", bytemuck::cast_slice(&v));
    let out = ctx
        .empty_storage("attn out", (p.out_offset as u64 + q.len() as u64) * 4)
        .unwrap();
    let mut times = Vec::new();
    let mut failures = Vec::new();
    for &cfg in shapes {
        let t0 = now_ms();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        attention::encode_with(ctx, &mut enc, cfg, &p, &qb, &kb, &vb, &out).unwrap();
        ctx.queue.submit([enc.finish()]);
        let got = read_f32(ctx, &out, p.out_offset as u64 * 4, want.len())
            .await
            .unwrap();
        times.push(now_ms() - t0);
        let mut worst = (0f32, 0usize);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let d = (g - w).abs();
            let d = if d.is_nan() { f32::INFINITY } else { d };
            if d > worst.0 {
                worst = (d, i);
            }
        }
        let ran = cfg.fit(ctx, &p);
        let shape = match ran.tile {
            Some((bq, bc)) => format!("tiled {bq}x{bc}"),
            None => format!(
                "{} wg {} heads {}",
                if ran.cooperative { "coop" } else { "simple" },
                ran.workgroup_size,
                ran.group
            ),
        };
        tlog!("{name} {shape}: worst |err| {:.2e}", worst.0);
        if worst.0 > ATOL {
            let i = worst.1;
            failures.push(format!(
                "{shape}: token {} head {} dim {}: gpu {} vs cpu {}",
                i / (nh * hd),
                (i / hd) % nh,
                i % hd,
                got[i],
                want[i]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{name} ({p:?}):\n{}",
        failures.join("\n")
    );
    let times: Vec<String> = times.iter().map(|t| format!("{t:.0}")).collect();
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

// Decode (one token) over 1, 7 and 300 cells.
gpu_test!(
    decode_1_cell_mha_hd80,
    run("decode_1_cell_mha_hd80", params(1, 4, 4, 80, 0))
);
gpu_test!(
    decode_7_cells_gqa_hd64,
    run("decode_7_cells_gqa_hd64", params(1, 8, 2, 64, 6))
);
gpu_test!(
    decode_300_cells_mqa_hd128,
    run("decode_300_cells_mqa_hd128", params(1, 4, 1, 128, 299))
);
gpu_test!(
    decode_300_cells_gqa_hd256,
    run("decode_300_cells_gqa_hd256", params(1, 8, 2, 256, 299))
);
// Prefill from an empty cache (pos0 = 0) and continuing one (pos0 > 0).
gpu_test!(
    prefill_t1_pos0_mqa_hd256,
    run("prefill_t1_pos0_mqa_hd256", params(1, 4, 1, 256, 0))
);
gpu_test!(
    prefill_t5_pos0_gqa_hd64,
    run("prefill_t5_pos0_gqa_hd64", params(5, 8, 2, 64, 0))
);
gpu_test!(
    prefill_t33_pos0_mha_hd128,
    run("prefill_t33_pos0_mha_hd128", params(33, 4, 4, 128, 0))
);
gpu_test!(
    prefill_t5_pos12_mqa_hd80,
    run("prefill_t5_pos12_mqa_hd80", params(5, 4, 1, 80, 12))
);
gpu_test!(
    prefill_t33_pos40_gqa_hd256,
    run("prefill_t33_pos40_gqa_hd256", params(33, 8, 2, 256, 40))
);
gpu_test!(
    prefill_t33_pos100_mha_hd64,
    run("prefill_t33_pos100_mha_hd64", params(33, 4, 4, 64, 100))
);
// Small and odd head sizes: head_dim 2 and 6 (below a vec4), 66 (odd number of vec2).
gpu_test!(
    prefill_t3_pos2_hd2,
    run("prefill_t3_pos2_hd2", params(3, 2, 1, 2, 2))
);
gpu_test!(
    prefill_t4_pos9_hd66_gqa3,
    run("prefill_t4_pos9_hd66_gqa3", params(4, 6, 2, 66, 9))
);
// Sliding window smaller than the context: window 4 over 20 cells, decode and prefill.
gpu_test!(
    window4_decode_20_cells,
    run(
        "window4_decode_20_cells",
        AttentionParams {
            window: 4,
            ..params(1, 4, 2, 64, 19)
        }
    )
);
gpu_test!(
    window4_prefill_from_0,
    run(
        "window4_prefill_from_0",
        AttentionParams {
            window: 4,
            ..params(20, 4, 2, 64, 0)
        }
    )
);
gpu_test!(
    window4_prefill_continuing,
    run(
        "window4_prefill_continuing",
        AttentionParams {
            window: 4,
            ..params(7, 4, 1, 80, 13)
        }
    )
);
// Window 1: each token sees only its own cell.
gpu_test!(
    window1_prefill,
    run(
        "window1_prefill",
        AttentionParams {
            window: 1,
            ..params(9, 4, 2, 64, 3)
        }
    )
);
// Gemma 3's local layers: 4 heads, 1 KV head, head_dim 256, window 512, Q already scaled by 1/16
// (scale 1 here, 1/16 folded in). Decode at 700 cells; a prefill whose tokens cross the window
// (tokens 490..522: the first see all cells, the last drop the oldest); one past it entirely.
fn gemma(n_tokens: u32, pos0: u32) -> AttentionParams {
    AttentionParams::new(n_tokens, 4, 1, 256, pos0, 512, 1.0 / 16.0, 0.0)
}
gpu_test!(
    gemma_window512_decode_700_cells,
    run("gemma_window512_decode_700_cells", gemma(1, 699))
);
gpu_test!(
    gemma_window512_prefill_crossing,
    run("gemma_window512_prefill_crossing", gemma(33, 490))
);
gpu_test!(
    gemma_window512_prefill_past,
    run("gemma_window512_prefill_past", gemma(17, 683))
);
// Gemma 3's global layers: the same shape without a window, 700 cells.
gpu_test!(
    gemma_global_decode_700_cells,
    run(
        "gemma_global_decode_700_cells",
        AttentionParams {
            window: 0,
            ..gemma(1, 699)
        }
    )
);
// A range too long for the simple shape on lavapipe (its loop limiter): fit() runs it
// cooperatively (the log shows the shape that ran).
gpu_test!(
    long_decode_2000_cells_hd256,
    run("long_decode_2000_cells_hd256", params(1, 4, 1, 256, 1999))
);
// Logit soft cap (Gemma 2 style: scale first, then cap): logits of size ~5 against a cap of 3.
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
// Q and out at element offsets into larger buffers.
gpu_test!(
    offsets,
    run(
        "offsets",
        AttentionParams {
            q_offset: 6,
            out_offset: 10,
            ..params(3, 4, 2, 64, 5)
        }
    )
);

/// More than 65535 (token, head) pairs: the cooperative shape needs the 2-D grid. Window 1 and
/// head_dim 2 keep the work tiny (each pair reads one cell). In Chrome only the simple shape:
/// SwiftShader spends about 0.5 ms (128 threads) to 1.5 ms (256) per cooperative workgroup,
/// 35-107 s for these 70400; the 2-D grid of the cooperative shape is proven natively.
async fn many_pairs() {
    let ctx = common::shared_context().await;
    let p = AttentionParams {
        window: 1,
        ..params(1100, 64, 1, 2, 0)
    };
    assert!(
        p.n_tokens as u64 * p.n_head as u64
            > ctx.limits.max_compute_workgroups_per_dimension as u64
    );
    let shapes: &[AttentionConfig] = if cfg!(target_arch = "wasm32") {
        &SHAPES[..1]
    } else {
        &SHAPES
    };
    check(&ctx, "more_than_65535_pairs", shapes, p).await;
}
gpu_test!(more_than_65535_pairs, many_pairs());

/// Bad shapes get clear errors before anything is encoded.
async fn bad_arguments() {
    let ctx = common::shared_context().await;
    let buf = ctx.empty_storage("attn small", 4096).unwrap();
    let out = ctx.empty_storage("attn out", 4096).unwrap();
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    let mut err = |p: AttentionParams, o: &wgpu::Buffer| {
        attention::encode(&ctx, &mut enc, &p, &buf, &buf, &buf, o)
            .unwrap_err()
            .message
    };
    assert!(err(params(1, 4, 1, 7, 0), &out).contains("even"));
    assert!(err(params(1, 4, 1, 258, 0), &out).contains("at most 256"));
    assert!(err(params(1, 6, 4, 64, 0), &out).contains("multiple of n_kv_head"));
    assert!(err(params(1, 4, 1, 64, 100), &out).contains("k_cache holds 4096 bytes"));
    assert!(err(params(1, 4, 1, 64, 0), &buf).contains("other than q"));
    assert!(err(
        AttentionParams {
            q_offset: 1,
            ..params(1, 4, 1, 64, 0)
        },
        &out
    )
    .contains("even"));
    assert!(err(
        AttentionParams {
            softcap: -1.0,
            ..params(1, 4, 1, 64, 0)
        },
        &out
    )
    .contains("softcap"));
    // Zero tokens is a no-op.
    attention::encode(
        &ctx,
        &mut enc,
        &params(0, 4, 1, 64, 0),
        &buf,
        &buf,
        &buf,
        &out,
    )
    .unwrap();
}
gpu_test!(bad_arguments_are_clear_errors, bad_arguments());

/// The reference itself on a case worked by hand: one head, head_dim 2, equal logits average V;
/// the window drops the first cell.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn reference_by_hand() {
    let q = [0.0f32, 0.0];
    let k = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let v = [1.0f32, 10.0, 3.0, 30.0, 5.0, 50.0];
    let p = AttentionParams::new(1, 1, 1, 2, 2, 0, 1.0, 0.0);
    assert_eq!(attention::reference(&p, &q, &k, &v), vec![3.0, 30.0]);
    let p = AttentionParams { window: 2, ..p };
    assert_eq!(attention::reference(&p, &q, &k, &v), vec![4.0, 40.0]);
    // llama.cpp masks pos_token - pos_cell >= window: window 2 at position 2 keeps cells 1 and 2.
    assert_eq!(p.cell_range(0), (1, 3));
}
