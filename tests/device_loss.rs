//! Device loss: the test destroys the GPU device (as a driver reset or a tab in the background
//! would lose it) while a generation is running and while a model is streaming in. Each in-flight
//! call must end with `DEVICE_LOST` (no panic, no hang, no wrong token), later calls on the lost
//! device too, and a fresh context must load the same model again and generate the same ids as
//! before the loss. The live GPU buffers (wgpu's internal counters) are counted: the lost
//! device keeps none of the model's (only the context's own, 3 here), and the fresh one is back to
//! its count after the model is dropped.
//!
//! Native only for now: in the browser a lost device hands out mapped buffers and accepts
//! writes, so where a load meets the loss differs; that run is not written yet.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use cera_web::error::ErrorCode;
use cera_web::generate::sampler::SamplerParams;
use cera_web::generate::session::{now_s, GenerateOptions, Session, SessionOptions};
use cera_web::gpu::GpuContext;
use cera_web::loader::StreamLoader;
use cera_web::model::Model;
use cera_web::tokenizer::Tokenizer;
use std::sync::Arc;

/// Live GPU buffers of `ctx`'s device after letting it free what was dropped (wgpu's internal
/// counters; a lost device's poll fails, which is ignored here: the count is what matters).
fn live_buffers(ctx: &GpuContext) -> Option<isize> {
    let _ = ctx.device.poll(wgpu::PollType::Wait {
        submission_index: None,
        timeout: None,
    });
    Some(ctx.device.get_internal_counters().hal.buffers.read())
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

const PROMPT: [u32; 4] = [1, 5, 9, 77];

async fn session(ctx: &Arc<GpuContext>, bytes: &[u8]) -> cera_web::error::Result<Session> {
    let weights = common::load_bytes(ctx, bytes)?;
    let tok = Arc::new(Tokenizer::from_gguf(&weights.header)?);
    let model = Arc::new(Model::new(ctx, weights).await?);
    Session::new(
        ctx.clone(),
        model,
        tok,
        SessionOptions {
            n_ctx: 32,
            n_keep: 2,
            ..Default::default()
        },
    )
}

/// Greedy ids, or the error that ended the generation; `lose_after`: destroy the device from the
/// token callback once that many tokens came out.
async fn generate(
    ctx: &Arc<GpuContext>,
    s: &mut Session,
    n: u32,
    lose_after: Option<usize>,
) -> (Vec<u32>, Option<ErrorCode>) {
    let mut ids = Vec::new();
    let r = s
        .generate(&PROMPT, &greedy(n), &mut |id, _| {
            ids.extend(id);
            if Some(ids.len()) == lose_after {
                ctx.device.destroy();
            }
            true
        })
        .await;
    (ids, r.err().map(|e| e.code))
}

gpu_test!(
    a_lost_device_fails_in_flight_calls_and_a_fresh_one_works,
    async {
        let t0 = now_s();
        let bytes = common::tiny_llama_gguf(11, 2, false);
        let mut faults = 0;

        // The reference run, on a device that stays.
        let ctx = Arc::new(common::context().await);
        let base = live_buffers(&ctx);
        let mut s = session(&ctx, &bytes).await.unwrap();
        let (want, err) = generate(&ctx, &mut s, 40, None).await;
        assert_eq!((want.len(), err), (40, None));
        drop(s);
        // The context keeps what it shares with every model (its zero-step buffer, made once).
        let kept = live_buffers(&ctx);
        if let (Some(base), Some(kept)) = (base, kept) {
            assert!(
                kept - base <= 2,
                "the reference run left {} buffers",
                kept - base
            );
        }

        // Lost in the middle of a generation, at several steps (the first decode step, mid-way, and
        // the step before a context shift: 4 + 27 = 31 of 32 cells).
        for lose_after in [1usize, 6, 27] {
            let ctx = Arc::new(common::context().await);
            let mut s = session(&ctx, &bytes).await.unwrap();
            let loaded = live_buffers(&ctx);
            let (ids, err) = generate(&ctx, &mut s, 40, Some(lose_after)).await;
            faults += 1;
            assert_eq!(
                err,
                Some(ErrorCode::DeviceLost),
                "lost after {lose_after} tokens: {} ids came out",
                ids.len()
            );
            // Greedy decoding computes a chain of tokens in one submission: the ones computed
            // before the loss may still come out after it. Every token that came out is right,
            // and the generation stopped short of its 40.
            assert!(
                ids.len() >= lose_after && ids.len() < 40,
                "lost after {lose_after}: {} tokens came out",
                ids.len()
            );
            assert_eq!(ids[..], want[..ids.len().min(want.len())], "a wrong token");
            // Every later call on the lost device says so too.
            let (_, again) = generate(&ctx, &mut s, 4, None).await;
            assert_eq!(again, Some(ErrorCode::DeviceLost), "a second generate");
            let reload = session(&ctx, &bytes).await.err().map(|e| e.code);
            assert_eq!(
                reload,
                Some(ErrorCode::DeviceLost),
                "a load on the lost device"
            );
            drop(s);
            tlog!(
            "lost after {lose_after} tokens: DEVICE_LOST; buffers {loaded:?} while loaded, {:?} after the loss",
            live_buffers(&ctx)
        );
            if let (Some(n), Some(kept)) = (live_buffers(&ctx), kept) {
                assert!(n <= kept, "{n} buffers live on the lost device");
            }
        }

        // Lost while the model streams in: the push that meets it, or the finish, says DEVICE_LOST.
        for cut in [bytes.len() / 4, bytes.len() * 3 / 4] {
            let ctx = Arc::new(common::context().await);
            let mut loader = StreamLoader::new(&ctx, Some(bytes.len() as u64));
            let mut result = Ok(());
            for (i, chunk) in bytes.chunks(16 << 10).enumerate() {
                if i * (16 << 10) >= cut && i * (16 << 10) < cut + (16 << 10) {
                    ctx.device.destroy();
                }
                result = loader.push(chunk);
                if result.is_err() {
                    break;
                }
            }
            faults += 1;
            let code = match result {
                Err(e) => Some(e.code),
                Ok(()) => match loader.finish() {
                    Err(e) => Some(e.code),
                    Ok(weights) => Model::new(&ctx, weights).await.err().map(|e| e.code),
                },
            };
            assert_eq!(code, Some(ErrorCode::DeviceLost), "lost at byte {cut}");
        }

        // A fresh context loads the same bytes and generates the same ids; dropping the model frees
        // every buffer it made.
        let ctx = Arc::new(common::context().await);
        let mut s = session(&ctx, &bytes).await.unwrap();
        let loaded = live_buffers(&ctx);
        let (ids, err) = generate(&ctx, &mut s, 40, None).await;
        assert_eq!((ids.clone(), err), (want, None), "after the losses");
        drop(s);
        assert_eq!(
            live_buffers(&ctx),
            kept,
            "the fresh context left buffers ({loaded:?} while loaded)"
        );
        tlog!(
        "device loss: {faults} losses injected (3 mid-generation, 2 mid-load), each DEVICE_LOST; a fresh context then generated the same 40 ids; {:.1} s",
        now_s() - t0
    );
    }
);
