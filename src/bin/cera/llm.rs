//! The model commands: `generate`, `tokenize`, `score`, `bench` (the interface later checks use;
//! keep it stable). Flags are `--name value`; see `usage()`.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use cera_web::generate::chat::ChatMessage;
use cera_web::generate::constraint::ConstraintSpec;
use cera_web::generate::open::{OpenedModel, DEFAULT_MAX_TOKENS};
use cera_web::generate::sampler::SamplerParams;
use cera_web::generate::score::score;
use cera_web::generate::session::{GenerateOptions, SessionOptions};
use cera_web::gpu::GpuContext;
use cera_web::tokenizer::Tokenizer;
use cera_web::{Error, Result};

pub fn usage() -> &'static str {
    "cera generate --model M.gguf --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]\n\
     \x20             [--repeat-penalty R] [--seed S] [--ctx N] [--n-keep N] [--chat] [--json]\n\
     \x20             [--json-schema FILE | --json-object | --grammar FILE.gbnf|FILE.lark | --regex R]\n\
     cera tokenize --model M.gguf --text TEXT [--no-parse-special]\n\
     cera score    --model M.gguf --tokens 2,818,5279,... [--batch N]\n\
     cera bench    --model M.gguf [--prompt-tokens 256] [--gen-tokens 128] [--runs 3] [--profile]\n\
                   [--delta-chunked-min N]   (Qwen3.5: batches of N tokens or more run the chunked\n\
                                              delta rule; a huge N keeps every batch recurrent)"
}

/// The flags each command accepts: `(name, takes a value)`. Anything else is refused with the
/// usage, so a misspelt flag (`--temprature 0`) never runs with the default silently.
fn accepted(cmd: &str) -> &'static [(&'static str, bool)] {
    match cmd {
        "generate" => &[
            ("model", true),
            ("prompt", true),
            ("max-tokens", true),
            ("temperature", true),
            ("top-k", true),
            ("top-p", true),
            ("min-p", true),
            ("repeat-penalty", true),
            ("seed", true),
            ("ctx", true),
            ("n-keep", true),
            ("chat", false),
            ("json", false),
            ("json-schema", true),
            ("json-object", false),
            ("grammar", true),
            ("regex", true),
        ],
        "tokenize" => &[("model", true), ("text", true), ("no-parse-special", false)],
        "score" => &[("model", true), ("tokens", true), ("batch", true)],
        "bench" => &[
            ("model", true),
            ("prompt-tokens", true),
            ("gen-tokens", true),
            ("runs", true),
            ("profile", false),
            ("delta-chunked-min", true),
        ],
        _ => &[],
    }
}

/// Edit distance, for the "did you mean" of an unknown flag.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// `--name value` pairs and bare `--flag`s, checked against what `cmd` accepts.
pub struct Flags(HashMap<String, String>);

impl Flags {
    pub fn parse(cmd: &str, args: &[String]) -> Result<Flags> {
        let known = accepted(cmd);
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
            let Some(&(_, takes_value)) = known.iter().find(|(k, _)| *k == name) else {
                let near = known
                    .iter()
                    .map(|(k, _)| (distance(name, k), *k))
                    .min()
                    .filter(|(d, _)| *d <= 2)
                    .map(|(_, k)| format!(" (did you mean --{k}?)"))
                    .unwrap_or_default();
                return Err(Error::invalid(format!(
                    "cera {cmd} has no flag --{name}{near}\n{}",
                    usage()
                )));
            };
            if m.contains_key(name) {
                return Err(Error::invalid(format!("--{name} is given twice")));
            }
            if takes_value {
                let v = args
                    .get(i + 1)
                    .ok_or_else(|| Error::invalid(format!("--{name} needs a value")))?;
                m.insert(name.to_string(), v.clone());
                i += 2;
            } else {
                m.insert(name.to_string(), String::new());
                i += 1;
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
        Ok(self.num_opt(k)?.unwrap_or(default))
    }
    fn num_opt<T: std::str::FromStr>(&self, k: &str) -> Result<Option<T>> {
        match self.0.get(k) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| Error::invalid(format!("--{k}: {v:?} is not a valid number"))),
        }
    }
}

/// The GPU and the model at `path`, opened as the JS Engine opens one.
fn open_model(path: &str) -> Result<(Arc<GpuContext>, OpenedModel)> {
    let ctx = GpuContext::new_blocking(&Default::default())?;
    // An unknown architecture is refused from the header, before any weight is uploaded.
    let weights = cera_web::loader::load_file_with(&ctx, Path::new(path), |h| {
        cera_web::model::HParams::from_gguf(h).map(|_| ())
    })?;
    let opened = pollster::block_on(OpenedModel::new(&ctx, weights))?;
    Ok((Arc::new(ctx), opened))
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

pub fn generate(f: &Flags) -> Result<()> {
    let (ctx, opened) = open_model(f.str("model")?)?;
    let prompt = f.str("prompt")?;
    let ids = if f.has("chat") {
        opened.chat_tokens(&[ChatMessage::user(prompt)])?
    } else {
        opened.tok.encode(prompt, true, true)
    };
    let opts = SessionOptions {
        n_ctx: opened.context_size(f.num_opt("ctx")?),
        n_keep: f.num("n-keep", 0u32)?,
        ..Default::default()
    };
    let mut session = opened.session(&ctx, opts)?;
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
        max_tokens: f.num("max-tokens", DEFAULT_MAX_TOKENS)?,
        stop: Vec::new(),
        sampler,
        constraint: constraint_flags(f)?,
        shown_control: Vec::new(),
    };
    let json = f.has("json");
    let mut out = std::io::stdout().lock();
    let stats = pollster::block_on(session.generate(&ids, &gen, &mut |id, piece| {
        if json {
            if let Some(id) = id {
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
    // Like llama-tokenize: special-token texts (`<start_of_turn>`) are parsed as the special
    // token unless `--no-parse-special`, which tokenizes them as plain text.
    let ids = tok.encode(f.str("text")?, true, !f.has("no-parse-special"));
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
    let (ctx, opened) = open_model(f.str("model")?)?;
    let tops = pollster::block_on(score(
        &ctx,
        &opened.model,
        &ids,
        0,
        5,
        f.num("batch", 32u32)?,
    ))?;
    for (pos, top) in tops.iter().enumerate() {
        let t: Vec<String> = top.iter().map(|(id, l)| format!("[{id}, {l}]")).collect();
        println!("{{\"pos\": {pos}, \"top\": [{}]}}", t.join(", "));
    }
    Ok(())
}

pub fn bench(f: &Flags) -> Result<()> {
    let (ctx, mut opened) = open_model(f.str("model")?)?;
    if let Some(min) = f.num_opt::<u32>("delta-chunked-min")? {
        Arc::get_mut(&mut opened.model)
            .ok_or_else(|| Error::internal("the model is shared before the bench"))?
            .delta_chunked_min = min;
    }
    let (model, tok) = (&opened.model, &opened.tok);
    let n_prompt = f.num("prompt-tokens", 256u32)?;
    let n_gen = f.num("gen-tokens", 128u32)?;
    let runs = f.num("runs", 3u32)?.max(1);
    let profile = f.has("profile");
    let report = pollster::block_on(cera_web::generate::bench::run(
        &ctx, model, tok, n_prompt, n_gen, runs, profile,
    ))?;
    println!(
        "{}",
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(cmd: &str, args: &[&str]) -> Result<Flags> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        Flags::parse(cmd, &args)
    }

    #[test]
    fn unknown_flags_are_refused_with_the_usage() {
        let e = parse("generate", &["--model", "m.gguf", "--temprature", "0"])
            .err()
            .expect("refused");
        assert_eq!(e.code, cera_web::ErrorCode::InvalidArgument);
        assert!(
            e.message
                .starts_with("cera generate has no flag --temprature (did you mean --temperature?)\ncera generate --model"),
            "{e}"
        );
        // A flag of another command is refused too, without a guess when nothing is close.
        let e = parse("tokenize", &["--model", "m", "--prompt-tokens", "4"])
            .err()
            .expect("refused");
        assert!(
            e.message
                .starts_with("cera tokenize has no flag --prompt-tokens\n"),
            "{e}"
        );
        for bad in [&["--chat", "--chat"][..], &["--seed"], &["model.gguf"]] {
            assert!(parse("generate", bad).is_err(), "{bad:?}");
        }
        let f = parse(
            "generate",
            &[
                "--model",
                "m.gguf",
                "--temperature",
                "0",
                "--chat",
                "--max-tokens",
                "3",
            ],
        )
        .unwrap();
        assert!(f.has("chat") && !f.has("json"));
        assert_eq!(f.num("temperature", 1.0f32).unwrap(), 0.0);
        assert_eq!(f.num("max-tokens", 128u32).unwrap(), 3);
        assert!(parse(
            "tokenize",
            &["--model", "m", "--text", "a", "--no-parse-special"]
        )
        .unwrap()
        .has("no-parse-special"));
    }
}
