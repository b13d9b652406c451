//! The model commands: `generate`, `tokenize`, `score`, `bench` (the interface later checks use;
//! keep it stable). Flags are `--name value`; see `usage()`.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use cera_web::generate::chat::{render_for_model, ChatMessage};
use cera_web::generate::constraint::ConstraintSpec;
use cera_web::generate::sampler::SamplerParams;
use cera_web::generate::score::score;
use cera_web::generate::session::{GenerateOptions, Session, SessionOptions};
use cera_web::gpu::GpuContext;
use cera_web::model::Model;
use cera_web::tokenizer::Tokenizer;
use cera_web::{Error, Result};

pub fn usage() -> &'static str {
    "cera generate --model M.gguf --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]\n\
     \x20             [--repeat-penalty R] [--seed S] [--ctx N] [--n-keep N] [--chat] [--json]\n\
     \x20             [--json-schema FILE | --json-object | --grammar FILE.gbnf|FILE.lark | --regex R]\n\
     cera tokenize --model M.gguf --text TEXT\n\
     cera score    --model M.gguf --tokens 2,818,5279,...\n\
     cera bench    --model M.gguf [--prompt-tokens 256] [--gen-tokens 128] [--runs 3] [--profile]"
}

/// `--name value` pairs and bare `--flag`s.
pub struct Flags(HashMap<String, String>);

impl Flags {
    pub fn parse(args: &[String]) -> Result<Flags> {
        let mut m = HashMap::new();
        let mut i = 0;
        while i < args.len() {
            let a = &args[i];
            let Some(name) = a.strip_prefix("--") else {
                return Err(Error::invalid(format!(
                    "unexpected argument {a:?}\n{}",
                    usage()
                )));
            };
            let bare = matches!(name, "chat" | "json" | "profile" | "json-object");
            if bare {
                m.insert(name.to_string(), String::new());
                i += 1;
            } else {
                let v = args
                    .get(i + 1)
                    .ok_or_else(|| Error::invalid(format!("--{name} needs a value")))?;
                m.insert(name.to_string(), v.clone());
                i += 2;
            }
        }
        Ok(Flags(m))
    }
    fn has(&self, k: &str) -> bool {
        self.0.contains_key(k)
    }
    fn str(&self, k: &str) -> Result<&str> {
        self.0
            .get(k)
            .map(String::as_str)
            .ok_or_else(|| Error::invalid(format!("--{k} is required\n{}", usage())))
    }
    fn num<T: std::str::FromStr>(&self, k: &str, default: T) -> Result<T> {
        match self.0.get(k) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| Error::invalid(format!("--{k}: {v:?} is not a valid number"))),
        }
    }
}

fn open_model(path: &str) -> Result<(Arc<GpuContext>, Arc<Model>, Arc<Tokenizer>)> {
    let ctx = GpuContext::new_blocking(&Default::default())?;
    // An unknown architecture is refused from the header, before any weight is uploaded.
    let weights = cera_web::loader::load_file_with(&ctx, Path::new(path), |h| {
        cera_web::model::HParams::from_gguf(h).map(|_| ())
    })?;
    let tok = Tokenizer::from_gguf(&weights.header)?;
    let model = pollster::block_on(Model::new(&ctx, weights))?;
    Ok((Arc::new(ctx), Arc::new(model), Arc::new(tok)))
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

pub fn generate(f: &Flags) -> Result<()> {
    let (ctx, model, tok) = open_model(f.str("model")?)?;
    let prompt = f.str("prompt")?;
    let text = if f.has("chat") {
        render_for_model(
            &model.weights.header,
            &tok,
            &[ChatMessage::user(prompt)],
            true,
        )?
    } else {
        prompt.to_string()
    };
    let ids = tok.encode(&text, true, f.has("chat"));
    let n_ctx = f.num("ctx", 2048u32)?.min(model.hp.n_ctx_train.max(16));
    let opts = SessionOptions {
        n_ctx,
        n_keep: f.num("n-keep", 0u32)?,
        ..Default::default()
    };
    let mut session = Session::new(ctx.clone(), model.clone(), tok.clone(), opts)?;
    let defaults = SamplerParams::default();
    let sampler = SamplerParams {
        temperature: f.num("temperature", defaults.temperature)?,
        top_k: f.num("top-k", defaults.top_k)?,
        top_p: f.num("top-p", defaults.top_p)?,
        min_p: f.num("min-p", defaults.min_p)?,
        repeat_penalty: f.num("repeat-penalty", defaults.repeat_penalty)?,
        seed: f.num("seed", defaults.seed)?,
        ..defaults
    };
    let gen = GenerateOptions {
        max_tokens: f.num("max-tokens", 128u32)?,
        stop: Vec::new(),
        sampler,
        constraint: constraint_flags(f)?,
    };
    let json = f.has("json");
    let mut out = std::io::stdout().lock();
    let stats = pollster::block_on(session.generate(&ids, &gen, &mut |id, piece| {
        if json {
            if id != u32::MAX {
                let _ = writeln!(out, "{{\"id\": {id}, \"text\": {}}}", json_str(piece));
            }
        } else {
            let _ = write!(out, "{piece}");
        }
        let _ = out.flush();
        true
    }))?;
    if json {
        println!("{}", serde_json::to_string(&stats).unwrap_or_default());
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens, {} generated, prefill {:.1} tok/s, decode {:.1} tok/s, {}, {} context shifts]",
            stats.prompt_tokens, stats.generated_tokens, stats.prefill_tok_s, stats.decode_tok_s, stats.finish_reason, stats.context_shifts
        );
    }
    Ok(())
}

fn read_text(path: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::invalid(format!("cannot read {path}: {e}")))
}

/// `--json-schema FILE`, `--json-object`, `--grammar FILE` (GBNF when it ends in `.gbnf` or
/// defines rules with `::=`, else llguidance Lark), `--regex R`: at most one.
fn constraint_flags(f: &Flags) -> Result<Option<ConstraintSpec>> {
    let given = ["json-schema", "json-object", "grammar", "regex"]
        .iter()
        .filter(|k| f.has(k))
        .count();
    if given > 1 {
        return Err(Error::invalid(
            "give at most one of --json-schema, --json-object, --grammar and --regex",
        ));
    }
    if f.has("json-schema") {
        let path = f.str("json-schema")?;
        let schema = serde_json::from_str(&read_text(path)?)
            .map_err(|e| Error::invalid(format!("{path} is not JSON: {e}")))?;
        return Ok(Some(ConstraintSpec::JsonSchema(schema)));
    }
    if f.has("json-object") {
        return Ok(Some(ConstraintSpec::JsonObject));
    }
    if f.has("grammar") {
        let path = f.str("grammar")?;
        let text = read_text(path)?;
        let gbnf = path.ends_with(".gbnf") || (!path.ends_with(".lark") && text.contains("::="));
        return Ok(Some(if gbnf {
            ConstraintSpec::Gbnf(text)
        } else {
            ConstraintSpec::Lark(text)
        }));
    }
    if f.has("regex") {
        return Ok(Some(ConstraintSpec::Regex(f.str("regex")?.to_string())));
    }
    Ok(None)
}

pub fn tokenize(f: &Flags) -> Result<()> {
    let (h, _) = cera_web::loader::read_header_file(Path::new(f.str("model")?))?;
    let tok = Tokenizer::from_gguf(&h)?;
    let ids = tok.encode(f.str("text")?, true, true);
    println!("{}", serde_json::to_string(&ids).unwrap_or_default());
    Ok(())
}

pub fn score_cmd(f: &Flags) -> Result<()> {
    let ids: Vec<u32> = f
        .str("tokens")?
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|_| Error::invalid(format!("--tokens: {s:?} is not a token id")))
        })
        .collect::<Result<_>>()?;
    if ids.is_empty() {
        return Err(Error::invalid("--tokens is empty"));
    }
    let (ctx, model, _tok) = open_model(f.str("model")?)?;
    let tops = pollster::block_on(score(&ctx, &model, &ids, 0, 5, f.num("batch", 32u32)?))?;
    for (pos, top) in tops.iter().enumerate() {
        let t: Vec<String> = top.iter().map(|(id, l)| format!("[{id}, {l}]")).collect();
        println!("{{\"pos\": {pos}, \"top\": [{}]}}", t.join(", "));
    }
    Ok(())
}

pub fn bench(f: &Flags) -> Result<()> {
    let (ctx, model, tok) = open_model(f.str("model")?)?;
    let n_prompt = f.num("prompt-tokens", 256u32)?;
    let n_gen = f.num("gen-tokens", 128u32)?;
    let runs = f.num("runs", 3u32)?.max(1);
    let profile = f.has("profile");
    let report = pollster::block_on(cera_web::generate::bench::run(
        &ctx, &model, &tok, n_prompt, n_gen, runs, profile,
    ))?;
    println!(
        "{}",
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
    Ok(())
}
