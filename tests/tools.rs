//! Tool-call grammars over the real Gemma 3 vocabulary (262,144 tokens), no GPU: for each call
//! syntax and `tool_choice`, texts are fed token by token through the constraint (each token must
//! be in the mask) and must end accepted; a call whose arguments break the tool's schema, or a
//! call where none may be, is refused at the first token that breaks it. Only the model file's
//! header is read.
#![cfg(not(target_arch = "wasm32"))]

mod common;

use cera_web::generate::constraint::{Constraint, ConstraintEnv};
use cera_web::generate::tools::{parse_tools, Tool, ToolChoice, ToolSyntax};
use cera_web::tokenizer::Tokenizer;
use serde_json::json;
use std::sync::Arc;

fn env() -> (Arc<Tokenizer>, ConstraintEnv) {
    // `npm test` names the fetched model in CERA_TEST_MODEL; by default it is in models/.
    let p = std::env::var("CERA_TEST_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gemma-3-270m-q4_k_m.gguf")
        });
    let (header, _) = cera_web::loader::read_header_file(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch-model)", p.display()));
    let tok = Arc::new(Tokenizer::from_gguf(&header).unwrap());
    let t0 = std::time::Instant::now();
    let env = ConstraintEnv::new(&tok).unwrap();
    tlog!(
        "token trie of {} tokens: {:.2} s",
        tok.n_vocab(),
        t0.elapsed().as_secs_f64()
    );
    (tok, env)
}

fn tools() -> Vec<Tool> {
    parse_tools(&[
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"]
        }}}),
        json!({"type": "function", "function": {"name": "add", "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"]
        }}}),
    ])
    .unwrap()
}

/// Feed `text` through the grammar: Ok when every token is allowed and the end is accepted,
/// else where it broke.
fn walk(
    tok: &Tokenizer,
    env: &ConstraintEnv,
    c: &mut Constraint,
    text: &str,
) -> Result<(), String> {
    for id in tok.encode(text, false, false) {
        c.mask().map_err(|e| e.to_string())?;
        if !c.allows(id) {
            return Err(format!(
                "token {:?} refused",
                String::from_utf8_lossy(&tok.token_bytes(id))
            ));
        }
        c.commit(id).map_err(|e| e.to_string())?;
    }
    let _ = env;
    if c.is_accepting() {
        Ok(())
    } else {
        Err("ended before the grammar accepts".into())
    }
}

#[test]
fn tool_call_grammars_accept_calls_and_refuse_bad_arguments() {
    let (tok, env) = env();
    let special = |_: &str| false;
    let tools = tools();
    // (syntax, a valid call, the same with an argument of the wrong type)
    let cases = [
        (
            ToolSyntax::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": \"one\"",
        ),
        (
            ToolSyntax::Fenced,
            "```tool_call\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n```",
            "```tool_call\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"k",
        ),
        (
            ToolSyntax::Llama3,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
            "{\"name\": \"get_weather\", \"arguments\"",
        ),
        (
            ToolSyntax::Lfm2,
            "<|tool_call_start|>[add(a=1, b=2), get_weather(city=\"Rome\")]<|tool_call_end|>",
            "<|tool_call_start|>[add(b=1",
        ),
    ];
    for (syntax, good, bad) in cases {
        let t0 = std::time::Instant::now();
        let compile = |choice: &ToolChoice| {
            let spec = syntax.grammar(&tools, choice, &special).unwrap().unwrap();
            Constraint::new(&env, &spec).unwrap_or_else(|e| panic!("{syntax:?}: {e}"))
        };
        // auto: a call, or free text; never a call's opening with broken arguments.
        walk(&tok, &env, &mut compile(&ToolChoice::Auto), good)
            .unwrap_or_else(|e| panic!("{syntax:?} auto {good:?}: {e}"));
        walk(
            &tok,
            &env,
            &mut compile(&ToolChoice::Auto),
            "The weather is fine today.",
        )
        .unwrap_or_else(|e| panic!("{syntax:?} auto text: {e}"));
        let e = walk(&tok, &env, &mut compile(&ToolChoice::Auto), bad)
            .expect_err(&format!("{syntax:?} auto passed {bad:?}"));
        assert!(e.contains("refused"), "{syntax:?} {bad:?}: {e}");
        // required: calls only, free text refused at once.
        walk(&tok, &env, &mut compile(&ToolChoice::Required), good).unwrap();
        let e = walk(&tok, &env, &mut compile(&ToolChoice::Required), "Sure!").unwrap_err();
        assert!(e.contains("refused"), "{syntax:?}: {e}");
        // A named function: only that one.
        let named = compile(&ToolChoice::Named("add".into()));
        let mut c = named;
        let add_call = syntax.parse(good).1.iter().any(|c| c.name == "add");
        let r = walk(&tok, &env, &mut c, good);
        // Only the LFM2 and Fenced cases start with `add`; a named choice allows exactly one call.
        match syntax {
            ToolSyntax::Fenced => r.unwrap(),
            _ => assert!(
                r.is_err(),
                "{syntax:?}: {good:?} passed a choice of 'add' only (add first: {add_call})"
            ),
        }
        // What passed parses back to calls.
        let (text, calls) = syntax.parse(good);
        assert!(
            text.is_empty() && !calls.is_empty(),
            "{syntax:?}: {text:?} {calls:?}"
        );
        tlog!("{syntax:?}: 8 walks in {:.2} s", t0.elapsed().as_secs_f64());
    }
}

/// LFM2's markers are control tokens in its vocabulary: the grammar names them as tokens.
#[test]
fn lfm2_grammar_names_control_markers() {
    let g = ToolSyntax::Lfm2
        .grammar(&tools(), &ToolChoice::Required, &|s: &str| {
            s.starts_with("<|")
        })
        .unwrap()
        .unwrap();
    let cera_web::generate::constraint::ConstraintSpec::Lark(g) = g else {
        panic!()
    };
    assert!(g.contains("start: <|tool_call_start|> call_body\n"), "{g}");
    assert!(g.contains("call_body: \"[\""), "{g}");
    assert!(g.contains("<|tool_call_end|>\n"), "{g}");
}

/// A text that opens with some words, then the calls.
const LEAD: &str = "Let me look that up.\n";

/// `auto`: free text may come before the calls. The marker opens the calls wherever it comes,
/// and from there they are held to the tools' schemas as at the start; the parse returns the
/// text as the content and the calls. `required` and a named function still refuse the text.
#[test]
fn auto_takes_text_then_calls() {
    let (tok, env) = env();
    let special = |_: &str| false;
    let tools = tools();
    let paris = |name: &str| (name.to_string(), json!({"city": "Paris"}));
    // (syntax, text then calls, the calls, text then a call whose arguments break the schema)
    let cases = [
        (
            ToolSyntax::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
            vec![paris("get_weather"), ("add".into(), json!({"a": 1, "b": 2}))],
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 3",
        ),
        (
            ToolSyntax::Fenced,
            "```tool_call\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
            vec![paris("get_weather")],
            "```tool_call\n{\"name\": \"weather\"",
        ),
        (
            ToolSyntax::Llama3,
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
            vec![paris("get_weather")],
            "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1.5",
        ),
        (
            ToolSyntax::Lfm2,
            "<|tool_call_start|>[get_weather(city=\"Paris\"), add(a=1, b=2)]<|tool_call_end|>",
            vec![paris("get_weather"), ("add".into(), json!({"a": 1, "b": 2}))],
            "<|tool_call_start|>[get_weather(town=",
        ),
    ];
    for (syntax, calls, want, bad) in cases {
        let compile = |choice: &ToolChoice| {
            let spec = syntax.grammar(&tools, choice, &special).unwrap().unwrap();
            Constraint::new(&env, &spec).unwrap_or_else(|e| panic!("{syntax:?}: {e}"))
        };
        let answer = format!("{LEAD}{calls}");
        walk(&tok, &env, &mut compile(&ToolChoice::Auto), &answer)
            .unwrap_or_else(|e| panic!("{syntax:?} auto {answer:?}: {e}"));
        let (content, parsed) = syntax.parse(&answer);
        assert_eq!(content, LEAD.trim(), "{syntax:?}");
        let parsed: Vec<_> = parsed.into_iter().map(|c| (c.name, c.arguments)).collect();
        assert_eq!(parsed, want, "{syntax:?}");
        // After text the call is still held to its schema (not taken as more free text).
        let bad = format!("{LEAD}{bad}");
        let e = walk(&tok, &env, &mut compile(&ToolChoice::Auto), &bad)
            .expect_err(&format!("{syntax:?} auto passed {bad:?}"));
        assert!(e.contains("refused"), "{syntax:?} {bad:?}: {e}");
        // The marker always opens a call: text cannot write it and go on as text.
        let marker = calls.split(['\n', '[', '{']).next().unwrap();
        let prose = format!("Calls open with {marker} and then the JSON.");
        let e = walk(&tok, &env, &mut compile(&ToolChoice::Auto), &prose)
            .expect_err(&format!("{syntax:?} auto passed {prose:?}"));
        assert!(e.contains("refused"), "{syntax:?} {prose:?}: {e}");
        // Text alone, also with a code block for the fenced syntax: still an answer.
        for text in ["Paris is sunny.", "Try:\n```python\nprint(1)\n```\nDone."] {
            walk(&tok, &env, &mut compile(&ToolChoice::Auto), text)
                .unwrap_or_else(|e| panic!("{syntax:?} auto {text:?}: {e}"));
            assert_eq!(syntax.parse(text), (text.to_string(), vec![]), "{syntax:?}");
        }
        // required and a named function: calls only, the text is refused.
        for choice in [
            ToolChoice::Required,
            ToolChoice::Named("get_weather".into()),
        ] {
            let e = walk(&tok, &env, &mut compile(&choice), &answer)
                .expect_err(&format!("{syntax:?} {choice:?} passed text"));
            assert!(e.contains("refused"), "{syntax:?} {choice:?}: {e}");
        }
    }
}

/// A real vocabulary where the markers are control tokens: Llama 3's, with three of its reserved
/// control tokens renamed to Llama 3.1's `<|python_tag|>` and LFM2's two markers (the committed
/// Llama 3.0 vocabulary has none of them). The grammar names them as tokens; text before them
/// is free, and the stream shows them (`shown_control`) so the parse finds the calls.
#[test]
fn auto_text_then_calls_with_control_markers() {
    use cera_web::gguf::{parse_bytes, GgufWriter, MetaArray, MetaValue};
    use cera_web::tokenizer::Detokenizer;
    let (h, _) = parse_bytes(include_bytes!("fixtures/tokenizer/llama3.gguf")).unwrap();
    let Some(MetaValue::Array(MetaArray::String(texts))) = h.get("tokenizer.ggml.tokens") else {
        panic!("no tokens")
    };
    let mut texts = texts.clone();
    let markers = ["<|python_tag|>", "<|tool_call_start|>", "<|tool_call_end|>"];
    for (i, m) in markers.iter().enumerate() {
        let from = format!("<|reserved_special_token_{}|>", i + 2);
        let at = texts.iter().position(|t| *t == from).unwrap();
        texts[at] = m.to_string();
    }
    let mut w = GgufWriter::new();
    for (k, v) in h.metadata() {
        match k.as_str() {
            "tokenizer.ggml.tokens" => w.meta(
                k.clone(),
                MetaValue::Array(MetaArray::String(texts.clone())),
            ),
            _ => w.meta(k.clone(), v.clone()),
        };
    }
    let (h, _) = parse_bytes(&w.to_bytes()).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&h).unwrap());
    for m in markers {
        let id = tok.token_id(m).unwrap();
        assert!(tok.is_control(id) && tok.token_bytes(id).is_empty(), "{m}");
    }
    let env = ConstraintEnv::new(&tok).unwrap();
    // What the engine asks: is the marker a token that renders as no text?
    let special = |s: &str| {
        tok.token_id(s)
            .is_some_and(|id| tok.token_bytes(id).is_empty())
    };
    let tools = tools();
    let cases = [
        (
            ToolSyntax::Llama3,
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
            "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": \"one\"",
        ),
        (
            ToolSyntax::Lfm2,
            "<|tool_call_start|>[get_weather(city=\"Paris\")]<|tool_call_end|>",
            "<|tool_call_start|>[add(a=\"one\"",
        ),
    ];
    for (syntax, call, bad) in cases {
        let compile = |choice: &ToolChoice| {
            let spec = syntax.grammar(&tools, choice, &special).unwrap().unwrap();
            Constraint::new(&env, &spec).unwrap_or_else(|e| panic!("{syntax:?}: {e}"))
        };
        let shown: Vec<u32> = syntax
            .markers()
            .iter()
            .filter(|m| special(m))
            .filter_map(|m| tok.token_id(m))
            .collect();
        assert!(!shown.is_empty(), "{syntax:?}");
        // Generate (by forcing the ids) text, then the call; render it as a generation does.
        let ids = tok.encode(&format!("{LEAD}{call}"), false, true);
        assert!(
            ids.iter().any(|id| shown.contains(id)),
            "{syntax:?}: the marker is one token"
        );
        let mut c = compile(&ToolChoice::Auto);
        let mut detok = Detokenizer::new(&tok);
        let mut text = String::new();
        for &id in &ids {
            c.mask().unwrap();
            assert!(
                c.allows(id),
                "{syntax:?}: {:?} refused after {text:?}",
                tok.token_text(id)
            );
            c.commit(id).unwrap();
            text.push_str(&detok.push_with(id, shown.contains(&id)));
        }
        assert!(c.is_accepting(), "{syntax:?}: {text:?}");
        assert_eq!(
            text,
            format!("{LEAD}{call}"),
            "{syntax:?}: the markers show"
        );
        let (content, calls) = syntax.parse(&text);
        assert_eq!(content, LEAD.trim(), "{syntax:?}");
        assert_eq!(calls.len(), 1, "{syntax:?}");
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, json!({"city": "Paris"}));
        // The call after text is held to its schema.
        let mut c = compile(&ToolChoice::Auto);
        let mut refused = false;
        for id in tok.encode(&format!("{LEAD}{bad}"), false, true) {
            c.mask().unwrap();
            if !c.allows(id) {
                refused = true;
                break;
            }
            c.commit(id).unwrap();
        }
        assert!(refused, "{syntax:?}: {bad:?} passed");
        // required: the text is refused at its first token.
        let mut c = compile(&ToolChoice::Required);
        c.mask().unwrap();
        assert!(!c.allows(ids[0]), "{syntax:?}");
    }
}

/// Qwen's own vocabulary, where `<tool_call>` is one (user-defined, text) token: the lead ends
/// at that token and the call after it is held to the schema.
#[test]
fn auto_text_then_call_with_qwen_vocabulary() {
    use cera_web::gguf::parse_bytes;
    let (h, _) = parse_bytes(include_bytes!("fixtures/tokenizer/qwen2.gguf")).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&h).unwrap());
    let env = ConstraintEnv::new(&tok).unwrap();
    let marker = tok.token_id("<tool_call>").unwrap();
    assert!(!tok.is_control(marker) && !tok.token_bytes(marker).is_empty());
    let special = |s: &str| {
        tok.token_id(s)
            .is_some_and(|id| tok.token_bytes(id).is_empty())
    };
    let syntax = ToolSyntax::Hermes;
    let compile = |choice: &ToolChoice| {
        let spec = syntax.grammar(&tools(), choice, &special).unwrap().unwrap();
        Constraint::new(&env, &spec).unwrap()
    };
    let answer = format!("{LEAD}<tool_call>\n{{\"name\": \"add\", \"arguments\": {{\"a\": 1, \"b\": 2}}}}\n</tool_call>");
    assert!(tok.encode(&answer, false, false).contains(&marker));
    walk(&tok, &env, &mut compile(&ToolChoice::Auto), &answer).unwrap();
    let (content, calls) = syntax.parse(&answer);
    assert_eq!(content, LEAD.trim());
    assert_eq!(calls[0].name, "add");
    assert_eq!(calls[0].arguments, json!({"a": 1, "b": 2}));
    let bad = format!("{LEAD}<tool_call>\n{{\"name\": \"add\", \"arguments\": {{\"a\": true");
    let e = walk(&tok, &env, &mut compile(&ToolChoice::Auto), &bad).unwrap_err();
    assert!(e.contains("refused"), "{e}");
}
