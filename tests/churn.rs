//! Churn: 100 load / generate / drop cycles of a tiny model (made here from a seed), 20 loads cut
//! off at random points of the stream, 20 generations stopped at random steps. Every cycle
//! generates the same ids; a cut load is refused; a stopped generation leaves a session that
//! continues exactly as an uninterrupted one. Natively, after each cycle and abort the live GPU
//! buffers (wgpu's internal counters, the `counters` feature, on for the tests) are back to the
//! count before it; in Chrome the wasm heap does not grow between cycle 10 and cycle 100.

mod common;

use cera_web::generate::sampler::SamplerParams;
use cera_web::generate::session::{now_s, GenerateOptions, Session, SessionOptions};
use cera_web::gpu::GpuContext;
use cera_web::loader::StreamLoader;
use cera_web::model::Model;
use cera_web::tokenizer::Tokenizer;
use common::Rng;
use std::sync::Arc;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// Live GPU buffers now (after letting the device free what was dropped), natively. In the
/// browser wgpu leaves a dropped buffer to the garbage collector (no `GPUBuffer.destroy()` on
/// drop), so a count there says nothing about leaks; the engine frees its GPU memory by
/// destroying its device (`Engine.dispose`, a failed or aborted load), which the end-to-end
/// tests count in the page. `None` there.
fn live_buffers(ctx: &GpuContext) -> Option<isize> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        ctx.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .unwrap();
        Some(ctx.device.get_internal_counters().hal.buffers.read())
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = ctx;
        None
    }
}

/// The wasm heap in bytes (natively: not measured, 0).
fn heap_bytes() -> usize {
    #[cfg(target_arch = "wasm32")]
    {
        use wasm_bindgen::JsCast;
        wasm_bindgen::memory()
            .unchecked_into::<js_sys::WebAssembly::Memory>()
            .buffer()
            .unchecked_into::<js_sys::ArrayBuffer>()
            .byte_length() as usize
    }
    #[cfg(not(target_arch = "wasm32"))]
    0
}

async fn context() -> GpuContext {
    common::context().await
}

fn greedy(max_tokens: u32) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        stop: vec![],
        sampler: SamplerParams::greedy(),
        constraint: None,
        shown_control: Vec::new(),
    }
}

/// One cycle: load, generate `n` greedy tokens, drop everything. Returns the ids and the live
/// buffers while loaded.
async fn cycle(ctx: &Arc<GpuContext>, bytes: &[u8], n: u32) -> (Vec<u32>, Option<isize>) {
    let weights = common::load_bytes(ctx, bytes).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&weights.header).unwrap());
    let model = Arc::new(Model::new(ctx, weights).await.unwrap());
    let mut session = Session::new(
        ctx.clone(),
        model,
        tok,
        SessionOptions {
            n_ctx: 32,
            n_keep: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let mut ids = Vec::new();
    session
        .generate(&[1, 5, 9, 77], &greedy(n), &mut |id, _| {
            ids.extend(id);
            true
        })
        .await
        .unwrap();
    (ids, live_buffers(ctx))
}

async fn churn() {
    let ctx = Arc::new(context().await);
    let bytes = common::tiny_llama_gguf(11, 2, false);
    let mut rng = Rng::new(2026);
    let t0 = now_s();
    let base = live_buffers(&ctx);
    // The first cycle may leave buffers the context keeps for good (shared by every model).
    let (first, loaded) = cycle(&ctx, &bytes, 8).await;
    assert_eq!(first.len(), 8);
    let kept = live_buffers(&ctx);
    if let (Some(base), Some(loaded), Some(kept)) = (base, loaded, kept) {
        assert!(
            loaded > kept + 10,
            "{loaded} buffers while loaded, {kept} after"
        );
        assert!(
            kept - base <= 2,
            "the first cycle left {} buffers",
            kept - base
        );
    }
    let mut heap_after_10 = 0;
    for i in 1..100 {
        let (ids, live) = cycle(&ctx, &bytes, 8).await;
        assert_eq!(ids, first, "cycle {i}: a fresh load generates the same ids");
        assert_eq!(live, loaded, "cycle {i}: buffers while loaded");
        assert_eq!(
            live_buffers(&ctx),
            kept,
            "cycle {i}: live GPU buffers after dropping everything"
        );
        if i == 10 {
            heap_after_10 = heap_bytes();
        }
    }
    let heap = heap_bytes();
    tlog!(
        "churn: 100 load/generate/drop cycles, {loaded:?} buffers while loaded, back to {kept:?} after each; wasm heap {} KiB after 10, {} KiB after 100; {:.1} s",
        heap_after_10 >> 10,
        heap >> 10,
        now_s() - t0
    );
    assert_eq!(
        heap, heap_after_10,
        "the wasm heap grew between cycle 10 and 100"
    );

    // Loads cut off at random points of the stream (as an abort or a dropped connection would),
    // then dropped: nothing stays on the GPU.
    let t1 = now_s();
    for i in 0..20 {
        let cut = 1 + (rng.next_u64() % (bytes.len() as u64 - 1)) as usize;
        let mut loader = StreamLoader::new(&ctx, Some(bytes.len() as u64));
        let mut at = 0;
        while at < cut {
            let n = (1 + rng.next_u64() % 70_000) as usize;
            let end = (at + n).min(cut);
            loader.push(&bytes[at..end]).unwrap();
            at = end;
        }
        let during = live_buffers(&ctx);
        drop(loader);
        assert_eq!(
            live_buffers(&ctx),
            kept,
            "abort {i} at byte {cut} of {} ({during:?} buffers live at the abort)",
            bytes.len()
        );
    }
    // A cut stream that is finished anyway is refused, and leaves nothing either.
    let mut loader = StreamLoader::new(&ctx, Some(bytes.len() as u64));
    loader.push(&bytes[..bytes.len() / 2]).unwrap();
    assert!(loader.finish().is_err(), "a truncated model must not load");
    assert_eq!(live_buffers(&ctx), kept);

    // Generations stopped at random steps: the session holds exactly the tokens handed out and
    // continues as an uninterrupted run; dropping it leaves nothing.
    let weights = common::load_bytes(&ctx, &bytes).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&weights.header).unwrap());
    let model = Arc::new(Model::new(&ctx, weights).await.unwrap());
    let prompt = [1u32, 5, 9, 77];
    let opts = SessionOptions {
        n_ctx: 32,
        n_keep: 2,
        ..Default::default()
    };
    let mut want = Vec::new();
    let mut session = Session::new(ctx.clone(), model.clone(), tok.clone(), opts.clone()).unwrap();
    let stats = session
        .generate(&prompt, &greedy(40), &mut |id, _| {
            want.extend(id);
            true
        })
        .await
        .unwrap();
    drop(session);
    // 4 + 40 tokens in a context of 32: the uninterrupted run shifts too.
    assert_eq!((want.len(), stats.context_shifts), (40, 1), "{stats:?}");
    assert_eq!(want[..8], first[..]);
    for i in 0..20 {
        let stop_after = 1 + (rng.next_u64() % 30) as usize;
        let mut session =
            Session::new(ctx.clone(), model.clone(), tok.clone(), opts.clone()).unwrap();
        let mut ids = Vec::new();
        let stats = session
            .generate(&prompt, &greedy(40), &mut |id, _| {
                ids.extend(id);
                ids.len() < stop_after
            })
            .await
            .unwrap();
        assert_eq!(
            (stats.finish_reason.as_str(), ids.len()),
            ("aborted", stop_after),
            "stop {i}"
        );
        // The last id handed out was not fed: it is the next call's prompt.
        // (A shift drops 15 cells: half of the 30 after n_keep.)
        assert_eq!(
            session.tokens().len() + 15 * session.shifts as usize,
            prompt.len() + stop_after - 1
        );
        let last = *ids.last().unwrap();
        session
            .generate(&[last], &greedy(40 - stop_after as u32), &mut |id, _| {
                ids.extend(id);
                true
            })
            .await
            .unwrap();
        assert_eq!(
            ids, want,
            "stop {i} after {stop_after}: the continuation differs from an uninterrupted run"
        );
    }
    drop(model);
    assert_eq!(live_buffers(&ctx), kept, "after the stopped generations");
    tlog!(
        "churn: 20 loads cut at random bytes, 20 generations stopped at random steps, {:.1} s",
        now_s() - t1
    );
}
gpu_test!(churn_cycles_aborts_and_stops_leave_no_gpu_buffers, churn());
