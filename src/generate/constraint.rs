//! Constrained decoding: JSON Schema, JSON object, Lark grammars, regular expressions and GBNF,
//! through llguidance.
//!
//! [`ConstraintEnv`] is llguidance's view of our tokenizer (a token trie over each id's bytes),
//! built once per tokenizer. A [`Constraint`] follows one generation: before each step it
//! computes the bitset of tokens the grammar allows next ([`Constraint::mask`]); the sampler
//! uploads it and masks the logits on the GPU ([`crate::ops::mask`]) before the argmax / top-k, so
//! the one small readback per token stays. After the step the sampled token is committed.
//!
//! End of generation: llguidance allows its EOS tokens exactly when the grammar accepts; every
//! end-of-generation id of the vocabulary (Gemma's `<eos>` and `<end_of_turn>`, ...) is one of
//! them. Once the grammar can take nothing more, only they are allowed.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use crate::error::{Error, ErrorCode, Result};
use crate::tokenizer::Tokenizer;

/// What the output must match.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstraintSpec {
    /// A JSON value valid against this JSON Schema.
    JsonSchema(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// A grammar in llguidance's Lark dialect (`start` is the start rule).
    Lark(String),
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
    /// A llama.cpp GBNF grammar (`root` is the start rule), translated to Lark.
    Gbnf(String),
}

impl ConstraintSpec {
    /// OpenAI's `response_format`: `{type: "text"}` (none), `{type: "json_object"}`,
    /// `{type: "json_schema", schema}` or OpenAI's `{type: "json_schema", json_schema: {schema}}`.
    pub fn from_response_format(v: &serde_json::Value) -> Result<Option<Self>> {
        let ty = v
            .get("type")
            .and_then(|t| t.as_str())
            .ok_or_else(|| Error::invalid("responseFormat needs a string 'type'"))?;
        match ty {
            "text" => Ok(None),
            "json_object" => Ok(Some(ConstraintSpec::JsonObject)),
            "json_schema" => {
                let schema = v
                    .get("schema")
                    .or_else(|| v.get("json_schema").and_then(|j| j.get("schema")))
                    .ok_or_else(|| Error::invalid("responseFormat {type: 'json_schema'} needs 'schema' (or OpenAI's json_schema.schema)"))?;
                Ok(Some(ConstraintSpec::JsonSchema(schema.clone())))
            }
            other => Err(Error::invalid(format!(
                "responseFormat type '{other}' is not one of 'text', 'json_object', 'json_schema'"
            ))),
        }
    }

    /// A `grammar` option: exactly one of `lark`, `gbnf`, `regex` set.
    pub fn from_grammar(
        lark: Option<&str>,
        gbnf: Option<&str>,
        regex: Option<&str>,
    ) -> Result<Self> {
        match (lark, gbnf, regex) {
            (Some(g), None, None) => Ok(ConstraintSpec::Lark(g.to_string())),
            (None, Some(g), None) => Ok(ConstraintSpec::Gbnf(g.to_string())),
            (None, None, Some(r)) => Ok(ConstraintSpec::Regex(r.to_string())),
            _ => Err(Error::invalid(
                "grammar takes exactly one of 'lark', 'gbnf' or 'regex'",
            )),
        }
    }

    fn grammar(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            ConstraintSpec::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(Error::invalid("the JSON schema must be an object"));
                }
                TopLevelGrammar::from_json_schema(schema.clone())
            }
            ConstraintSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(serde_json::json!({ "type": "object" }))
            }
            ConstraintSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            ConstraintSpec::Regex(r) => TopLevelGrammar::from_regex(r),
            ConstraintSpec::Gbnf(g) => {
                let lark = super::gbnf::gbnf_to_lark(g)
                    .map_err(|e| Error::invalid(format!("invalid grammar: {e}")))?;
                TopLevelGrammar::from_lark(lark)
            }
        })
    }

    fn kind(&self) -> &'static str {
        match self {
            ConstraintSpec::JsonSchema(_) => "JSON schema",
            ConstraintSpec::JsonObject => "JSON object",
            ConstraintSpec::Lark(_) => "Lark grammar",
            ConstraintSpec::Regex(_) => "regex",
            ConstraintSpec::Gbnf(_) => "GBNF grammar",
        }
    }
}

/// Our tokenizer as llguidance sees it.
struct TokenizerBridge {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for TokenizerBridge {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        // Grammar-forced text is tokenized like a prompt's text (no BOS, no special tokens).
        self.tok.encode(&String::from_utf8_lossy(s), false, false)
    }
}

/// llguidance's parser factory over one tokenizer (a token trie of its whole vocabulary).
pub struct ConstraintEnv {
    factory: ParserFactory,
    n_vocab: u32,
}

impl ConstraintEnv {
    /// Build the token trie of `tok` (once per session: the whole vocabulary is walked).
    pub fn new(tok: &Arc<Tokenizer>) -> Result<Self> {
        let n_vocab = tok.n_vocab() as u32;
        let eog: Vec<u32> = tok.eog_ids().to_vec();
        let eos = tok.eos_id().or(eog.first().copied()).ok_or_else(|| {
            Error::invalid(
                "constrained decoding needs an end-of-generation token; the vocabulary has none",
            )
        })?;
        // Each id's bytes as generated text shows them; control and other tokens that render as
        // nothing get llguidance's special-token form (0xFF + their text), so no grammar over
        // text matches them.
        let words: Vec<Vec<u8>> = (0..n_vocab)
            .map(|id| {
                let b = tok.token_bytes(id);
                if b.is_empty() {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tok.token_text(id).unwrap_or("").as_bytes());
                    w
                } else {
                    b
                }
            })
            .collect();
        let mut info = TokRxInfo::new(n_vocab, eos);
        info.tok_bos = tok.bos_id();
        info.tok_eos = eos;
        info.tok_end_of_turn = tok.eot_id();
        let mut trie = TokTrie::from(&info, &words);
        let mut eos_all = vec![eos];
        eos_all.extend(eog.iter().copied().filter(|&t| t != eos));
        trie = trie.with_eos_tokens(&eos_all);
        let env: TokEnv = Arc::new(TokenizerBridge {
            trie,
            tok: tok.clone(),
        });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| {
            Error::new(
                ErrorCode::Internal,
                format!("constrained decoding setup failed: {e}"),
            )
        })?;
        factory.set_stderr_log_level(0);
        Ok(ConstraintEnv { factory, n_vocab })
    }

    pub fn n_vocab(&self) -> u32 {
        self.n_vocab
    }
}

/// One generation's grammar state and the bitset of its next allowed tokens.
pub struct Constraint {
    matcher: Matcher,
    words: Vec<u32>,
    kind: &'static str,
}

impl Constraint {
    /// Compile `spec` (an invalid schema or grammar is `INVALID_ARGUMENT` with llguidance's reason).
    pub fn new(env: &ConstraintEnv, spec: &ConstraintSpec) -> Result<Self> {
        let grammar = spec.grammar()?;
        let kind = spec.kind();
        let parser = env
            .factory
            .create_parser(grammar)
            .map_err(|e| Error::invalid(format!("invalid {kind}: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::invalid(format!("invalid {kind}: {e}")));
        }
        Ok(Constraint {
            matcher,
            words: vec![0; crate::ops::mask::mask_words(env.n_vocab) as usize],
            kind,
        })
    }

    /// The allowed tokens for the next step: bit `i % 32` of word `i / 32` (the GPU mask layout).
    pub fn mask(&mut self) -> Result<&[u32]> {
        let v = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| self.error(e))?;
        let src = v.as_slice();
        let n = self.words.len().min(src.len());
        self.words[..n].copy_from_slice(&src[..n]);
        self.words[n..].fill(0);
        if self.words.iter().all(|&w| w == 0) {
            return Err(Error::invalid(format!(
                "the {} allows no token here",
                self.kind
            )));
        }
        Ok(&self.words)
    }

    /// Whether `token` is allowed by the last mask computed.
    pub fn allows(&self, token: u32) -> bool {
        self.words
            .get(token as usize / 32)
            .is_some_and(|w| (w >> (token % 32)) & 1 == 1)
    }

    /// Advance the grammar by a sampled token.
    pub fn commit(&mut self, token: u32) -> Result<()> {
        self.matcher.consume_token(token).map_err(|e| self.error(e))
    }

    /// The tokens the grammar forces next (the only continuation it allows, e.g. a JSON key or a
    /// tool call's `{"name": "`), committed already; empty when the next token is a choice.
    pub fn take_forced(&mut self) -> Vec<u32> {
        self.matcher.consume_ff_tokens()
    }

    /// Whether the output so far is complete for the grammar (end of generation allowed).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Whether the grammar can take no more text.
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }

    fn error(&self, e: impl std::fmt::Display) -> Error {
        Error::new(
            ErrorCode::Internal,
            format!("the {} failed: {e}", self.kind),
        )
    }
}
