//! Structured output on the real Gemma 3 270M: JSON Schema, regex, Lark and GBNF constraints
//! masking the logits on the GPU. Outputs are checked with independent validators (the
//! `jsonschema` crate, the `regex` crate), never with the code under test. The model runs at
//! about a second per decode step on the CPU-emulated GPU, so generations are few and short;
//! each prints its time and the mask's CPU time per token.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use cera_web::generate::chat::{render_for_model, ChatMessage};
use cera_web::generate::constraint::ConstraintSpec;
use cera_web::generate::sampler::SamplerParams;
use cera_web::generate::session::{
    now_s, GenerateOptions, GenerationStats, Session, SessionOptions,
};
use cera_web::model::Model;
use cera_web::tokenizer::Tokenizer;
use serde_json::json;
use std::sync::Arc;

fn model_path() -> std::path::PathBuf {
    std::env::var("CERA_TEST_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gemma-3-270m-q4_k_m.gguf")
        })
}

struct Gemma {
    ctx: Arc<cera_web::gpu::GpuContext>,
    model: Arc<Model>,
    tok: Arc<Tokenizer>,
}

impl Gemma {
    fn load() -> Gemma {
        let ctx = pollster::block_on(common::context());
        let p = model_path();
        assert!(
            p.exists(),
            "{} is missing: run scripts/fetch-model (npm test does)",
            p.display()
        );
        let weights = cera_web::loader::load_file(&ctx, &p).unwrap();
        let tok = Tokenizer::from_gguf(&weights.header).unwrap();
        let model = pollster::block_on(Model::new(&ctx, weights)).unwrap();
        Gemma {
            ctx: Arc::new(ctx),
            model: Arc::new(model),
            tok: Arc::new(tok),
        }
    }

    fn session(&self) -> Session {
        Session::new(
            self.ctx.clone(),
            self.model.clone(),
            self.tok.clone(),
            SessionOptions {
                n_ctx: 256,
                ..Default::default()
            },
        )
        .unwrap()
    }

    fn chat_prompt(&self, user: &str) -> Vec<u32> {
        let text = render_for_model(
            &self.model.weights.header,
            &self.tok,
            &[ChatMessage::user(user)],
            true,
        )
        .unwrap();
        self.tok.encode(&text, true, true)
    }

    /// Generate; returns (ids, text, stats) and logs the time.
    fn run(
        &self,
        session: &mut Session,
        prompt: &[u32],
        opts: &GenerateOptions,
        what: &str,
    ) -> (Vec<u32>, String, GenerationStats) {
        let (mut ids, mut text) = (Vec::new(), String::new());
        let t0 = now_s();
        let stats = pollster::block_on(session.generate(prompt, opts, &mut |id, piece| {
            if let Some(id) = id {
                ids.push(id);
            }
            text.push_str(piece);
            true
        }))
        .unwrap();
        tlog!(
            "{what}: {} tokens in {:.1} s ({}), mask {:.2} ms/token: {text:?}",
            stats.generated_tokens,
            now_s() - t0,
            stats.finish_reason,
            stats.mask_ms_per_token
        );
        (ids, text, stats)
    }
}

fn opts(
    max_tokens: u32,
    sampler: SamplerParams,
    constraint: Option<ConstraintSpec>,
) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        stop: vec![],
        sampler,
        constraint,
    }
}

fn sampled(seed: u64) -> SamplerParams {
    SamplerParams {
        temperature: 1.0,
        seed,
        ..Default::default()
    }
}

/// A nested object with an enum, an array and required fields; strings and arrays are bounded so
/// a sampled answer stays short.
fn person_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 10},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"enum": ["new", "vip"]}, "maxItems": 2},
            "address": {
                "type": "object",
                "properties": {"zip": {"type": "integer", "minimum": 0, "maximum": 99999}},
                "required": ["zip"],
                "additionalProperties": false
            }
        },
        "required": ["name", "role", "tags", "address"],
        "additionalProperties": false,
        "x-guidance": {"whitespace_flexible": false}
    })
}

#[test]
fn gemma3_json_schema_outputs_parse_and_validate() {
    let g = Gemma::load();
    let schema = person_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let prompt =
        g.chat_prompt("Describe a user of a web shop as JSON with name, role, tags and address.");
    // Two seeds by default (a second or more per token on the CPU-emulated GPU);
    // CERA_STRUCTURED_SEEDS=20 for the full sweep.
    let seeds: u64 = std::env::var("CERA_STRUCTURED_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let mut session = g.session();
    for seed in 0..seeds {
        let (_, text, stats) = g.run(
            &mut session,
            &prompt,
            &opts(
                64,
                sampled(seed),
                Some(ConstraintSpec::JsonSchema(schema.clone())),
            ),
            &format!("json schema seed {seed}"),
        );
        assert_eq!(
            stats.finish_reason, "stop",
            "seed {seed}: the object did not close within 64 tokens: {text}"
        );
        let v: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("seed {seed}: not JSON ({e}): {text}"));
        let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
        assert!(
            errors.is_empty(),
            "seed {seed}: {text} does not validate: {errors:?}"
        );
    }
}

#[test]
fn gemma3_regex_lark_and_gbnf_outputs_match() {
    let g = Gemma::load();
    let mut session = g.session();
    let prompt = g.chat_prompt("Is the sky blue? Answer yes or no and give a short reason.");
    let rx = "(yes|no), because [a-z ]{3,30}\\.";
    let (_, text, _) = g.run(
        &mut session,
        &prompt,
        &opts(24, sampled(1), Some(ConstraintSpec::Regex(rx.into()))),
        "regex",
    );
    assert!(
        regex::Regex::new(&format!("^(?:{rx})$"))
            .unwrap()
            .is_match(&text),
        "{text:?} does not match {rx}"
    );

    let lark = "start: \"The answer is \" NUMBER \".\"\nNUMBER: /[0-9]{1,3}/\n";
    let prompt = g.chat_prompt("What is 6 times 7?");
    let (_, text, _) = g.run(
        &mut session,
        &prompt,
        &opts(12, sampled(2), Some(ConstraintSpec::Lark(lark.into()))),
        "lark",
    );
    assert!(
        regex::Regex::new("^The answer is [0-9]{1,3}\\.$")
            .unwrap()
            .is_match(&text),
        "{text:?}"
    );

    let gbnf = "root ::= answer \" \" color\nanswer ::= \"Yes\" | \"No\"\ncolor ::= (\"red\" | \"green\" | \"blue\") \".\"\n";
    let prompt = g.chat_prompt("Is the sky blue, and what color is it?");
    let (_, text, _) = g.run(
        &mut session,
        &prompt,
        &opts(12, sampled(3), Some(ConstraintSpec::Gbnf(gbnf.into()))),
        "gbnf",
    );
    assert!(
        regex::Regex::new("^(Yes|No) (red|green|blue)\\.$")
            .unwrap()
            .is_match(&text),
        "{text:?}"
    );
}

/// Greedy decoding under a JSON schema that admits the unconstrained greedy answer picks the same
/// tokens (the mask removes nothing the argmax would choose) and ends where the object closes.
/// The model may write a few characters before the object (the 270M wrote `1, ` here), so the
/// schema sits in a Lark grammar that allows text without braces before it.
#[test]
fn gemma3_greedy_with_an_admitting_schema_is_unchanged() {
    let g = Gemma::load();
    // A raw prompt the model continues with one more object of the list.
    let prompt = g.tok.encode("[{\"city\": \"Paris\", \"country\": \"France\"}, {\"city\": \"Berlin\", \"country\": \"Germany\"},", true, false);
    let mut session = g.session();
    let (free, text, _) = g.run(
        &mut session,
        &prompt,
        &opts(16, SamplerParams::greedy(), None),
        "greedy unconstrained",
    );
    let (start, end) = match (text.find('{'), text.find('}')) {
        (Some(a), Some(b)) if a < b => (a, b + 1),
        _ => panic!("the greedy answer holds no object in 16 tokens: {text:?}"),
    };
    let schema = json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
        "additionalProperties": false
    });
    let v: serde_json::Value = serde_json::from_str(&text[start..end])
        .unwrap_or_else(|e| panic!("{:?} is not JSON: {e}", &text[start..end]));
    assert!(
        jsonschema::is_valid(&schema, &v),
        "the schema must admit the greedy answer {text:?}"
    );
    let lark = format!("start: (/[^{{}}]+/)? %json {schema}\n");
    let mut session = g.session();
    let (constrained, text2, stats) = g.run(
        &mut session,
        &prompt,
        &opts(
            16,
            SamplerParams::greedy(),
            Some(ConstraintSpec::Lark(lark)),
        ),
        "greedy constrained",
    );
    assert_eq!(stats.finish_reason, "stop", "{text2:?}");
    assert_eq!(text2, &text[..end]);
    // Every token the same, except that the last may end at the object's `}` where the free
    // answer's token ran on past it (`"}` against `"},`).
    let n = constrained.len();
    assert_eq!(constrained[..n - 1], free[..n - 1], "{text2:?} vs {text:?}");
    let (last, free_last) = (
        g.tok.token_bytes(constrained[n - 1]),
        g.tok.token_bytes(free[n - 1]),
    );
    assert!(
        free_last.starts_with(&last),
        "last token {:?} vs {:?}",
        String::from_utf8_lossy(&last),
        String::from_utf8_lossy(&free_last)
    );
}

/// An invalid schema, a grammar that does not parse and GBNF with what Lark cannot say are clear
/// errors; a constraint that cannot finish within max_tokens ends with "length".
#[test]
fn gemma3_bad_constraints_are_clear_errors() {
    let g = Gemma::load();
    let mut session = g.session();
    let prompt = g.chat_prompt("Hi");
    let err = |spec: ConstraintSpec| {
        let mut s = g.session();
        pollster::block_on(s.generate(
            &prompt,
            &opts(4, SamplerParams::greedy(), Some(spec)),
            &mut |_, _| true,
        ))
        .unwrap_err()
    };
    let e = err(ConstraintSpec::JsonSchema(
        json!({"type": "object", "properties": {"a": {"type": "no-such-type"}}}),
    ));
    tlog!("invalid schema: {e}");
    assert_eq!(e.code, cera_web::ErrorCode::InvalidArgument, "{e}");
    let e = err(ConstraintSpec::Lark("start: ( \"a\"\n".into()));
    tlog!("bad lark: {e}");
    assert_eq!(e.code, cera_web::ErrorCode::InvalidArgument, "{e}");
    let e = err(ConstraintSpec::Gbnf("root ::= x\nx ::= <[42]>\n".into()));
    tlog!("bad gbnf: {e}");
    assert!(e.to_string().contains("line 2"), "{e}");
    let e = err(ConstraintSpec::Regex("(unclosed".into()));
    tlog!("bad regex: {e}");
    assert_eq!(e.code, cera_web::ErrorCode::InvalidArgument, "{e}");
    // A string of at least 50 letters cannot fit in 5 tokens.
    let (_, text, stats) = g.run(
        &mut session,
        &prompt,
        &opts(
            5,
            SamplerParams::greedy(),
            Some(ConstraintSpec::Regex("[a-z]{50,60}".into())),
        ),
        "too long for max_tokens",
    );
    assert_eq!(stats.finish_reason, "length", "{text:?}");
}
