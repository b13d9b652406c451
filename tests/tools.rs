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
    assert!(g.contains("calls: <|tool_call_start|> \"[\""), "{g}");
    assert!(g.contains("<|tool_call_end|>\n"), "{g}");
}
