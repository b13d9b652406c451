//! Soak: 20,000 generated tokens (4,000 in Chrome) through hundreds of automatic context shifts on
//! a tiny one-layer model (made here from a seed; `common::tiny_llama_gguf`), natively and in
//! headless Chrome.
//!
//! With one layer every K/V cell is a function of its token and position only, so however many
//! shifts the session went through, the logits after its last token must equal a fresh
//! evaluation of the tokens it holds, at positions 0.. (re-rotated K against K computed at the
//! new position: f32 rounding only). Checked after every `generate` call (the checkpoints), with
//! the tokens and positions the session holds and its shift counter against a replay of the
//! shift rule, and no NaN anywhere. Calls alternate greedy decoding (chained on the GPU) and
//! sampling (top-k/top-p/min-p, and with penalties every fourth call).

mod common;

use cera_web::generate::sampler::SamplerParams;
use cera_web::generate::score::score_logits;
use cera_web::generate::session::{now_s, GenerateOptions, Session, SessionOptions};
use cera_web::model::Model;
use cera_web::tokenizer::Tokenizer;
use std::sync::Arc;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// Tokens generated: 20,000 natively (about 100 s on lavapipe, 2 busy cores); in Chrome, where
/// SwiftShader runs a greedy step at about a tenth of that speed and a sampled one (a readback
/// per token) slower still, 4,000 (about 160 shifts).
const TOTAL: u32 = if cfg!(target_arch = "wasm32") {
    4_000
} else {
    20_000
};
const N_CTX: u32 = 64;
const N_KEEP: u32 = 4;
const N_DISCARD: u32 = 24;
/// |shifted - fresh| allowed on logits of size ~3: rounding of a re-rotated K, nothing more.
const TOL: f32 = 2e-3;

/// The session's tokens as the shift rule predicts them: before a token is fed into a full
/// context, the `N_DISCARD` after the first `N_KEEP` are dropped.
struct Replay {
    tokens: Vec<u32>,
    shifts: u32,
}

impl Replay {
    fn feed(&mut self, chunk: &[u32]) {
        while self.tokens.len() as u32 + chunk.len() as u32 > N_CTX {
            self.tokens
                .drain(N_KEEP as usize..(N_KEEP + N_DISCARD) as usize);
            self.shifts += 1;
        }
        self.tokens.extend_from_slice(chunk);
    }
}

async fn soak() {
    let ctx = Arc::new(common::context().await);
    let weights = common::load_bytes(&ctx, &common::tiny_llama_gguf(7, 1, true)).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&weights.header).unwrap());
    let model = Arc::new(Model::new(&ctx, weights).await.unwrap());
    let n_vocab = model.hp.n_vocab as usize;
    let opts = SessionOptions {
        n_ctx: N_CTX,
        n_keep: N_KEEP,
        n_discard: Some(N_DISCARD),
        ..Default::default()
    };
    let mut session = Session::new(ctx.clone(), model.clone(), tok.clone(), opts).unwrap();
    let mut replay = Replay {
        tokens: Vec::new(),
        shifts: 0,
    };
    let t0 = now_s();
    let (mut generated, mut calls, mut checkpoints, mut worst, mut eog_stops) =
        (0u32, 0u32, 0u32, 0f32, 0u32);
    let mut input = vec![1u32, 17, 42, 99, 3, 200, 150, 7];
    let mut per_kind = [(0u32, 0f64); 2];
    while generated < TOTAL {
        let sampler = match calls % 4 {
            0 | 2 => SamplerParams::greedy(),
            1 => SamplerParams {
                temperature: 0.9,
                seed: calls as u64,
                ..Default::default()
            },
            _ => SamplerParams {
                temperature: 0.9,
                repeat_penalty: 1.1,
                penalty_last_n: 32,
                seed: calls as u64,
                ..Default::default()
            },
        };
        // Penalties are applied to the logits buffer in place, so after such a call the
        // session's logits are the penalized ones: no checkpoint then.
        let penalized = sampler.penalties_active();
        // Mostly greedy (chained on the GPU, one readback per 16 tokens); sampled calls are short.
        let max_tokens = (TOTAL - generated).min(if sampler.is_greedy() {
            499 + calls % 7
        } else {
            45 + calls % 11
        });
        let gen = GenerateOptions {
            max_tokens,
            stop: vec![],
            sampler,
            constraint: None,
            shown_control: Vec::new(),
        };
        let mut ids = Vec::new();
        let t_call = now_s();
        let stats = session
            .generate(&input, &gen, &mut |id, _| {
                if let Some(id) = id {
                    ids.push(id);
                }
                true
            })
            .await
            .unwrap();
        calls += 1;
        let kind = if gen.sampler.is_greedy() { 0 } else { 1 };
        per_kind[kind].0 += stats.generated_tokens;
        per_kind[kind].1 += now_s() - t_call;
        assert_eq!(stats.generated_tokens as usize, ids.len());
        assert!(
            ids.iter()
                .all(|&id| (id as usize) < n_vocab && !tok.is_eog(id)),
            "call {calls}: {ids:?}"
        );
        generated += stats.generated_tokens;
        // What the session fed: the input, then every id handed out but the last one (sampled
        // from the last logits, not fed yet), or all of them when an end-of-generation token
        // (not handed out, not fed) ended the call.
        replay.feed(&input);
        let fed_ids = if stats.finish_reason == "stop" {
            ids.len()
        } else {
            ids.len().saturating_sub(1)
        };
        for &id in &ids[..fed_ids] {
            replay.feed(&[id]);
        }
        assert_eq!(
            session.tokens(),
            &replay.tokens[..],
            "call {calls}: the tokens held"
        );
        assert_eq!(session.n_past() as usize, replay.tokens.len());
        assert_eq!(session.shifts, replay.shifts, "call {calls}: shift counter");
        assert!(session.n_past() <= N_CTX);
        input = match stats.finish_reason.as_str() {
            "length" => vec![*ids.last().expect("a length finish hands out tokens")],
            "stop" => {
                eog_stops += 1;
                vec![3 + calls % 200]
            }
            other => panic!("call {calls}: finish {other}"),
        };
        // Checkpoint: the logits after the last token fed against a fresh evaluation.
        if penalized {
            continue;
        }
        let Ok(ours) = session.logits().await else {
            continue;
        };
        let fresh = score_logits(&ctx, &model, session.tokens(), N_CTX)
            .await
            .unwrap();
        let want = &fresh[fresh.len() - n_vocab..];
        let d = ours
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, |m, d| if d > m || d.is_nan() { d } else { m });
        assert!(
            d <= TOL,
            "call {calls}, after {generated} tokens and {} shifts: |shifted - fresh| = {d}",
            session.shifts
        );
        worst = worst.max(d);
        checkpoints += 1;
    }
    let secs = now_s() - t0;
    tlog!(
        "soak: {generated} tokens in {calls} calls, {} context shifts, {eog_stops} end-of-generation stops, {checkpoints} checkpoints, max |shifted - fresh| {worst:.2e}, {secs:.1} s ({:.0} tok/s)",
        session.shifts,
        generated as f64 / secs
    );
    tlog!(
        "soak: greedy {} tokens in {:.1} s, sampled {} in {:.1} s",
        per_kind[0].0,
        per_kind[0].1,
        per_kind[1].0,
        per_kind[1].1
    );
    assert!(generated >= TOTAL);
    assert!(
        session.shifts as u64 >= (TOTAL / N_DISCARD) as u64 - 1,
        "{} shifts",
        session.shifts
    );
    assert!(
        checkpoints * 2 >= calls,
        "{checkpoints} checkpoints in {calls} calls"
    );
}
gpu_test!(
    soak_20000_tokens_through_context_shifts_equal_fresh_evaluation,
    soak()
);
