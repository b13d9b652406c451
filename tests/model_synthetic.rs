//! Tiny synthetic models of every architecture and weight type, teacher-forced, against
//! llama.cpp's logits (F32 KV cache), from `tests/fixtures/oracle/synthetic.json`; and Phi-3's
//! context shift (LongRoPE factors, attention factor) against fresh K cells. Runs natively
//! and in headless Chrome (there the fixtures come from `npm test`'s server).

mod common;

use cera_web::generate::score::score_logits;
use cera_web::gpu::readback::read_f32;
use cera_web::kv::KvCache;
use cera_web::loader::StreamLoader;
use cera_web::model::{LogitRows, Model};

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

const MANIFEST: &str = include_str!("fixtures/oracle/synthetic.json");

/// Bytes of a file under `tests/fixtures/`.
async fn fixture(path: &str) -> Vec<u8> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(path);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }
    #[cfg(target_arch = "wasm32")]
    {
        let base = option_env!("CERA_TEST_SERVER")
            .expect("build with CERA_TEST_SERVER (npm test sets it)");
        let url = format!("{base}/fixtures/{path}");
        let mut out = Vec::new();
        cera_web::web::fetch::stream(&url, &mut |_| Ok(()), &mut |c| {
            out.extend_from_slice(c);
            Ok(())
        })
        .await
        .unwrap();
        out
    }
}

/// `(max, mean)` |ours - llama.cpp| allowed, as fractions of the logits' standard deviation.
/// F32 weights agree closely (Gemma's looser: llama.cpp's GELU is a lookup table, and this tiny
/// Gemma's post-norm gains of about 8 amplify it). With quantized weights llama.cpp also
/// quantizes the activations (Q8_0/Q8_K dot products) while we multiply in f32, so the two
/// differ by a few percent on average (measured: mean 1.2-2.3 %, max 6.6-14 % of the std).
fn tolerance(arch: &str, ty: &str) -> (f64, f64) {
    match (arch, ty) {
        ("gemma3" | "gemma2", "F32") => (3e-3, 5e-4),
        (_, "F32") => (1e-3, 2e-4),
        // LFM2's gated convolution multiplies two projections (B * x, then C *), so llama.cpp's
        // quantized activations move it more (measured: max 10-15 %, mean 1.7-2.7 % of the std).
        ("lfm2", _) => (0.2, 0.035),
        // Qwen3.5's delta-net normalises the state's output per head, which at the first tokens
        // is about sign(k . q) v: where k . q is near 0, llama.cpp's quantized activations flip
        // whole heads. llama.cpp's own quantized run differs from its run on the same weights
        // dequantized to F32 by what we measure here (Q4_K: max 1.55, mean 0.093 of the std,
        // argmax 18/24; Q8_0: 0.30, 0.037, 21/24), and ours matches the latter (as F32 does).
        ("qwen35", "Q4_K") => (1.6, 0.1),
        ("qwen35", "Q6_K") => (0.8, 0.065),
        ("qwen35", _) => (0.36, 0.045),
        _ => (0.16, 0.03),
    }
}

/// How `ours` (rows of `n_vocab` logits from position `first_row` on) compares with llama.cpp:
/// asserts the max and mean difference and the argmax at clear positions.
fn compare(
    name: &str,
    how: &str,
    m: &serde_json::Value,
    ours: &[f32],
    want: &[f32],
    n_vocab: usize,
    first_row: usize,
) {
    let (arch, ty) = (m["arch"].as_str().unwrap(), m["type"].as_str().unwrap());
    let std = m["logit_std"].as_f64().unwrap();
    let (tol_max, tol_mean) = tolerance(arch, ty);
    let (mut max_diff, mut sum_diff, mut flips, mut agree) = (0f64, 0f64, 0, 0);
    assert_eq!(ours.len() % n_vocab, 0);
    for (i, a) in ours.chunks_exact(n_vocab).enumerate() {
        let pos = first_row + i;
        let b = &want[pos * n_vocab..(pos + 1) * n_vocab];
        for (x, y) in a.iter().zip(b) {
            let d = (*x as f64 - *y as f64).abs();
            // NaN fails here (a comparison with NaN is false).
            assert!(
                d.is_finite(),
                "{name} ({how}) pos {pos}: logit {x} vs llama.cpp {y}"
            );
            max_diff = max_diff.max(d);
            sum_diff += d;
        }
        let am = |r: &[f32]| {
            r.iter()
                .enumerate()
                .fold(0, |best, (i, v)| if *v > r[best] { i } else { best })
        };
        let mut sorted: Vec<f32> = b.to_vec();
        sorted.sort_by(|p, q| q.partial_cmp(p).unwrap());
        agree += (am(a) == am(b)) as usize;
        // A "clear" position: the reference margin exceeds twice the largest allowed difference.
        if am(a) != am(b) && (sorted[0] - sorted[1]) as f64 > 2.0 * tol_max * std {
            flips += 1;
            tlog!(
                "{name} ({how}) pos {pos}: argmax {} vs llama.cpp {} (margin {})",
                am(a),
                am(b),
                sorted[0] - sorted[1]
            );
        }
    }
    let (rel, mean_rel) = (max_diff / std, sum_diff / ours.len() as f64 / std);
    tlog!(
        "{name} ({how}): max |diff| {max_diff:.2e} ({rel:.2e} of std), mean {mean_rel:.2e} of std, argmax agrees at {agree}/{} positions",
        ours.len() / n_vocab
    );
    assert!(
        rel <= tol_max,
        "{name} ({how}): max |diff| {max_diff} is {rel:.3e} of the logit std (allowed {tol_max})"
    );
    assert!(
        mean_rel <= tol_mean,
        "{name} ({how}): mean |diff| is {mean_rel:.3e} of the logit std (allowed {tol_mean})"
    );
    assert_eq!(
        flips, 0,
        "{name} ({how}): argmax differs at clear positions"
    );
}

/// A GPU context and the synthetic model of manifest entry `m`.
async fn load(m: &serde_json::Value) -> (std::sync::Arc<cera_web::gpu::GpuContext>, Model) {
    let ctx = common::shared_context().await;
    let bytes = fixture(m["model"].as_str().unwrap()).await;
    let mut loader = StreamLoader::new(&ctx, Some(bytes.len() as u64));
    loader.push(&bytes).unwrap();
    let model = Model::new(&ctx, loader.finish().unwrap()).await.unwrap();
    (ctx, model)
}

/// Every model three ways, each against llama.cpp's rows: all 24 tokens in one batch; a prefill
/// in chunks of 5 (so later chunks attend to cells written by earlier passes, past gemma3's
/// 8-token window); and one token per pass, the decode path (GEMV kernels, a plan for 1 token).
/// The F32 models a fourth: the decode path with a real GPU's attention (the split kernel that
/// norms, ropes and caches q, k and v itself), which a CPU adapter does not choose. Qwen3.5 a
/// fifth: one batch with the delta rule's recurrent form.
async fn check(name: &str) {
    let manifest: serde_json::Value = serde_json::from_str(MANIFEST).unwrap();
    let m = &manifest["models"][name];
    let tokens: Vec<u32> = manifest["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let (ctx, mut model) = load(m).await;
    let want: Vec<f32> = fixture(&format!("oracle/{}", m["logits"].as_str().unwrap()))
        .await
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let n_vocab = want.len() / tokens.len();
    assert_eq!(n_vocab, model.hp.n_vocab as usize);
    for (how, batch) in [
        ("one batch", tokens.len() as u32),
        ("chunks of 5", 5),
        ("batch 1", 1),
    ] {
        let ours = score_logits(&ctx, &model, &tokens, batch).await.unwrap();
        assert_eq!(ours.len(), want.len(), "{how}");
        compare(name, how, m, &ours, &want, n_vocab, 0);
    }
    // The prefill projections on 8-bit X (ops::gemm_q8), which the engine takes by itself only
    // for big weights in batches of 32 or more: forced here for the whole 24-token batch, on the
    // types the kernel reads. The plan must run it: at least every layer's feed-forward (gate/up
    // and down, with their quantizers; attention layers add q/k/v and o).
    // (Qwen3.5 keeps f32 X: Model::new turns the path off for it.)
    let q8_type = ["-Q4_0", "-Q4_K", "-Q8_0"]
        .iter()
        .any(|t| name.ends_with(t));
    if q8_type && m["arch"] != "qwen35" {
        model.prefill_q8 = Some(true);
        let n = tokens.len() as u32;
        let ws = model.workspace(&ctx, n, n).unwrap();
        let kv = model.new_kv_cache(&ctx, n).unwrap();
        let plan = model.plan(&ctx, &ws, &kv, n, LogitRows::All, n).unwrap();
        let count = |k: &str| {
            plan.kinds()
                .iter()
                .find(|(x, _)| *x == k)
                .map_or(0, |e| e.1)
        };
        let layers = model.hp.n_layer as usize;
        assert!(
            count("gemm_q8") >= 2 * layers && count("quantize_x8") >= 2 * layers,
            "{name}: the plan's kinds {:?}",
            plan.kinds()
        );
        let how = "one batch, 8-bit X";
        let ours = score_logits(&ctx, &model, &tokens, n).await.unwrap();
        compare(name, how, m, &ours, &want, n_vocab, 0);
        model.prefill_q8 = None;
    }
    if name.ends_with("-F32") {
        model.split_attention = Some(true);
        let how = "batch 1, split attention";
        let ours = score_logits(&ctx, &model, &tokens, 1).await.unwrap();
        compare(name, how, m, &ours, &want, n_vocab, 0);
        model.split_attention = None;
    }
    // Qwen3.5: the batches above run the delta rule's chunked form (batch 1 the recurrent one);
    // the recurrent form over a whole batch, as a device without room for a chunk runs it.
    if m["arch"] == "qwen35" {
        model.delta_chunked_min = u32::MAX;
        let how = "one batch, recurrent";
        let ours = score_logits(&ctx, &model, &tokens, tokens.len() as u32)
            .await
            .unwrap();
        compare(name, how, m, &ours, &want, n_vocab, 0);
    }
}

/// A long context on the decode attention's split kernel (which a CPU adapter does not choose by
/// itself): a prefill of 2080 cells (130 chunks of 16 cells a head for the reduce to combine),
/// then decode steps through the split kernel against the
/// one-workgroup-per-head kernel over the same cache contents. llama.cpp's fixture rows are 24
/// tokens, so the reference is the kernel those rows check.
async fn long_split(name: &str) {
    let manifest: serde_json::Value = serde_json::from_str(MANIFEST).unwrap();
    let m = &manifest["models"][name];
    let (ctx, mut model) = load(m).await;
    let n_vocab = model.hp.n_vocab;
    let n = 2085;
    let tokens: Vec<u32> = (0..n).map(|i| (i * 7919 + 13) % n_vocab).collect();
    let (prefill, steps) = tokens.split_at(n as usize - 5);
    // One prefill for both kernels (a batch never takes the split kernel: `split_attention`
    // only chooses the decode attention); each then decodes the same steps from it, the second
    // after rewinding the first one's cells, which its steps write again.
    let mut kv = model.new_kv_cache(&ctx, n).unwrap();
    let ws = model.workspace(&ctx, 512, 1).unwrap();
    let mut pos = 0u32;
    let run = |model: &Model, kv: &mut KvCache, chunk: &[u32], pos: &mut u32| {
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        model
            .encode(&ctx, &mut enc, &ws, kv, chunk, *pos, LogitRows::Last)
            .unwrap();
        ctx.submit([enc.finish()]);
        kv.advance(chunk.len() as u32).unwrap();
        *pos += chunk.len() as u32;
    };
    for chunk in prefill.chunks(512) {
        run(&model, &mut kv, chunk, &mut pos);
    }
    let mut rows = Vec::new();
    for split in [false, true] {
        model.split_attention = Some(split);
        kv.rewind(pos - prefill.len() as u32).unwrap();
        pos = prefill.len() as u32;
        let mut got = Vec::new();
        for chunk in steps.chunks(1) {
            run(&model, &mut kv, chunk, &mut pos);
            got.extend(
                read_f32(&ctx, &ws.logits, 0, n_vocab as usize)
                    .await
                    .unwrap(),
            );
        }
        rows.push(got);
    }
    assert_eq!(rows[1].len(), steps.len() * n_vocab as usize);
    compare(
        name,
        "decode past 2080 cells, split attention",
        m,
        &rows[1],
        &rows[0],
        n_vocab as usize,
        0,
    );
}

// Llama's smaller heads take the split kernel's other shape (chunks of 32 cells, teams of 8);
// natively only: in Chrome, where the same WGSL runs on the same inputs and each of these costs
// about 30 s of SwiftShader, that shape is checked by `check`'s split case (up to 24 cells), and
// the long reduce by gemma3's run (heads of 256, the real model's).
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn llama_f32_long_split_attention() {
    pollster::block_on(long_split("llama-F32"))
}
gpu_test!(gemma3_f32_long_split_attention, long_split("gemma3-F32"));

/// A decode plan whose split attention has few chunks leaves the reduce to the o projections
/// (`matmul::SplitX`: one dispatch a layer fewer), a long one keeps the reduce dispatch. Their
/// logits are checked above: `check`'s split case runs plans of at most 24 cells, `long_split`
/// plans past 2080 (more chunks than an o projection combines).
async fn fused_reduce_plans(name: &str) {
    let manifest: serde_json::Value = serde_json::from_str(MANIFEST).unwrap();
    let (ctx, mut model) = load(&manifest["models"][name]).await;
    model.split_attention = Some(true);
    let kv = model.new_kv_cache(&ctx, 4096).unwrap();
    let ws = model.workspace(&ctx, 1, 1).unwrap();
    let count = |cells| {
        model
            .plan(&ctx, &ws, &kv, 1, LogitRows::Last, cells)
            .unwrap()
            .dispatches()
    };
    let (short, long) = (count(24), count(4096));
    assert_eq!(
        long - short,
        model.hp.n_layer as usize,
        "{name}: {short} dispatches at 24 cells, {long} at 4096"
    );
}
gpu_test!(
    llama_f32_fused_reduce_plans,
    fused_reduce_plans("llama-F32")
);
gpu_test!(
    gemma3_f32_fused_reduce_plans,
    fused_reduce_plans("gemma3-F32")
);

macro_rules! synthetic {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(gpu_test!($test, check($name));)*
    };
}

synthetic! {
    llama_f32 => "llama-F32", llama_q8_0 => "llama-Q8_0", llama_q4_0 => "llama-Q4_0", llama_q5_0 => "llama-Q5_0",
    llama_q4_k => "llama-Q4_K", llama_q6_k => "llama-Q6_K",
    llama_rope_freqs_f32 => "llama-rope-freqs-F32", llama_rope_freqs_q4_k => "llama-rope-freqs-Q4_K",
    qwen2_f32 => "qwen2-F32", qwen2_q8_0 => "qwen2-Q8_0", qwen2_q4_0 => "qwen2-Q4_0", qwen2_q5_0 => "qwen2-Q5_0",
    qwen2_q4_k => "qwen2-Q4_K", qwen2_q6_k => "qwen2-Q6_K",
    qwen3_f32 => "qwen3-F32", qwen3_q8_0 => "qwen3-Q8_0", qwen3_q4_0 => "qwen3-Q4_0", qwen3_q5_0 => "qwen3-Q5_0",
    qwen3_q4_k => "qwen3-Q4_K", qwen3_q6_k => "qwen3-Q6_K",
    granite_f32 => "granite-F32", granite_q8_0 => "granite-Q8_0", granite_q4_0 => "granite-Q4_0", granite_q5_0 => "granite-Q5_0",
    granite_q4_k => "granite-Q4_K", granite_q6_k => "granite-Q6_K",
    gemma3_f32 => "gemma3-F32", gemma3_q8_0 => "gemma3-Q8_0", gemma3_q4_0 => "gemma3-Q4_0", gemma3_q5_0 => "gemma3-Q5_0",
    gemma3_q4_k => "gemma3-Q4_K", gemma3_q6_k => "gemma3-Q6_K",
    gemma2_f32 => "gemma2-F32", gemma2_q8_0 => "gemma2-Q8_0", gemma2_q4_0 => "gemma2-Q4_0", gemma2_q5_0 => "gemma2-Q5_0",
    gemma2_q4_k => "gemma2-Q4_K", gemma2_q6_k => "gemma2-Q6_K",
    smollm3_f32 => "smollm3-F32", smollm3_q8_0 => "smollm3-Q8_0", smollm3_q4_0 => "smollm3-Q4_0", smollm3_q5_0 => "smollm3-Q5_0",
    smollm3_q4_k => "smollm3-Q4_K", smollm3_q6_k => "smollm3-Q6_K",
}

// Phi-3: fused attn_qkv and gate/up tensors, LongRoPE. "phi3" (Phi-4-mini's partial rotary) is
// scored past its original context (long factors), "phi3-short" (whole heads) within it.
synthetic! {
    phi3_f32 => "phi3-F32", phi3_q8_0 => "phi3-Q8_0", phi3_q4_0 => "phi3-Q4_0", phi3_q5_0 => "phi3-Q5_0",
    phi3_q4_k => "phi3-Q4_K", phi3_q6_k => "phi3-Q6_K",
    phi3_short_f32 => "phi3-short-F32", phi3_short_q4_k => "phi3-short-Q4_K",
}

// LFM2 (short-convolution hybrid): the conv state carried token to token (batch 1) and across
// chunk boundaries (chunks of 5), as `check` scores every model.
synthetic! {
    lfm2_f32 => "lfm2-F32", lfm2_q8_0 => "lfm2-Q8_0", lfm2_q4_0 => "lfm2-Q4_0", lfm2_q5_0 => "lfm2-Q5_0", lfm2_q4_k => "lfm2-Q4_K", lfm2_q6_k => "lfm2-Q6_K",
}

// Qwen3.5 (gated delta-net hybrid): the conv and delta-rule states carried token to token
// (batch 1, the recurrent form) and across chunk boundaries (chunks of 5, the chunked form), the
// gated attention layers between them; one batch in each form of the delta rule.
synthetic! {
    qwen35_f32 => "qwen35-F32", qwen35_q8_0 => "qwen35-Q8_0", qwen35_q4_0 => "qwen35-Q4_0", qwen35_q5_0 => "qwen35-Q5_0", qwen35_q4_k => "qwen35-Q4_K", qwen35_q6_k => "qwen35-Q6_K",
}

// Phi-3 (long factors, partial rotary, attention factor 1.18): a context shift re-rotates the
// kept K cells by a pure rotation, so the first layer's K cells (which depend on the token and
// its position alone) equal those of a fresh evaluation of the kept tokens at their new
// positions. llama.cpp's own shift applies the attention factor again to cells that already carry
// it (they would be 18 % too large). 30 tokens, n_keep 4, n_discard 12.
gpu_test!(phi3_context_shift_equals_a_fresh_first_layer, async {
    let ctx = common::shared_context().await;
    let bytes = fixture("models/phi3-F32.gguf").await;
    let mut loader = StreamLoader::new(&ctx, Some(bytes.len() as u64));
    loader.push(&bytes).unwrap();
    let model = Model::new(&ctx, loader.finish().unwrap()).await.unwrap();
    let n_ctx = 64;
    assert!(model.hp.rope_attn_factor > 1.1 && model.hp.long_rope(n_ctx));
    let mut rng = common::Rng::new(31);
    let prompt: Vec<u32> = (0..30).map(|_| (rng.next_u64() % 512) as u32).collect();
    let (n_keep, n_discard) = (4u32, 12u32);
    let ws = model.workspace(&ctx, 30, 1).unwrap();
    // The first layer's K cells after feeding `tokens` (and shifting, when asked).
    let k_cells = |tokens: Vec<u32>, shift: bool| {
        let (ctx, model, ws) = (&ctx, &model, &ws);
        async move {
            let mut kv = model.new_kv_cache(ctx, n_ctx).unwrap();
            let mut enc = ctx.device.create_command_encoder(&Default::default());
            model
                .encode(ctx, &mut enc, ws, &kv, &tokens, 0, LogitRows::Last)
                .unwrap();
            ctx.submit([enc.finish()]);
            kv.advance(tokens.len() as u32).unwrap();
            if shift {
                kv.shift(ctx, n_keep, n_discard).unwrap();
            }
            let row = (model.hp.kv_dim()) as usize;
            read_f32(ctx, kv.k(0), 0, kv.n_past() as usize * row)
                .await
                .unwrap()
        }
    };
    let shifted = k_cells(prompt.clone(), true).await;
    let kept: Vec<u32> = prompt[..4].iter().chain(&prompt[16..]).copied().collect();
    let fresh = k_cells(kept, false).await;
    assert_eq!(shifted.len(), fresh.len());
    let scale = fresh.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = shifted
        .iter()
        .zip(&fresh)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    tlog!("phi3 shift: first layer K cells |shifted - fresh| max {worst:.2e} (values up to {scale:.2})");
    assert!(
        worst < 1e-5 * scale.max(1.0),
        "shifted K cells differ from fresh ones by {worst}"
    );
});
