//! Tokenizers from the GGUF (docs/architecture.md, decision 10), token ids equal to llama.cpp's.
//!
//! - [`Tokenizer::from_gguf`] reads the vocabulary from the header: SentencePiece-style
//!   (`tokenizer.ggml.model = "llama"`: scores, `<0xXX>` byte fallback, "▁" for spaces) or
//!   byte-level BPE (`"gpt2"`: merges, GPT-2 byte mapping, a [`PreTokenizer`] chosen by
//!   `tokenizer.ggml.pre`).
//! - Special tokens (control, user-defined) are cut out of the text first, longest first, as
//!   llama.cpp's `tokenizer_st_partition` does; control tokens only when `parse_special`.
//! - BOS/EOS/EOT and the end-of-generation set come from the metadata and, where the file does
//!   not say, from the token texts, by llama.cpp's rules (`llama_vocab::impl::load`).
//! - [`Detokenizer`] / [`Utf8Stream`] stream text without ever emitting half a character.
//!
//! Known differences from llama.cpp, none reachable with the shipped vocabularies: llama.cpp
//! orders equal-length special tokens by an unstable `std::sort` and auto-detects EOT/FIM tokens
//! in `unordered_map` order; here both go by ascending id. Per-model LSTRIP/RSTRIP attributes
//! (phi-3, jina, modern-bert) are not applied.

mod bpe;
mod detok;
mod pretok;
mod spm;
mod unicode;
mod unicode_data;
mod vocab;

use std::borrow::Cow;

pub use detok::{Detokenizer, Utf8Stream};
pub use pretok::PreTokenizer;

use crate::error::{Error, ErrorCode, Result};
use crate::gguf::{GgufHeader, MetaArray};
use bpe::{Bpe, Merges};
use vocab::{attr, Vocab};

/// Which algorithm a vocabulary uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// `tokenizer.ggml.model = "llama"`.
    SentencePiece,
    /// `tokenizer.ggml.model = "gpt2"`, with its pre-tokenizer.
    ByteLevelBpe(PreTokenizer),
}

enum Model {
    Spm,
    Bpe {
        merges: Merges,
        pre: PreTokenizer,
        ignore_merges: bool,
    },
}

/// How [`Tokenizer::detokenize`] renders ids, as llama.cpp's
/// `llama_detokenize(ids, remove_special, unparse_special)` (all off: the generated pieces, put
/// together, as the stream shows them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DetokenizeOptions {
    /// Drop a leading BOS and a trailing EOS where the vocabulary adds them.
    pub remove_special: bool,
    /// Render control tokens as their text.
    pub unparse_special: bool,
    /// What `llama_detokenize` also does to a whole sequence, so that it can differ from the
    /// pieces: a SentencePiece vocabulary with `add_space_prefix` takes one leading space off
    /// the first token (unless a BOS was removed before it), undoing the space tokenizing put
    /// there; a byte-level BPE one (but the qwen2, qwen35 and gpt-4o families: llama.cpp's
    /// `clean_spaces`) drops the space before `?`, `!`, `.`, `,`, both spaces around a lone
    /// `'`, and the space before `'s`, `'m`, `'re`, `'ve` (Hugging Face's
    /// `clean_up_tokenization_spaces`). Lossy: `a ? b` comes back as `a? b`.
    pub clean_up: bool,
}

/// A vocabulary and the way to cut text into its tokens.
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    /// SentencePiece byte fallback: byte -> `<0xXX>` token (or the one-byte token).
    byte_tokens: [Option<u32>; 256],
    /// GPT-2 byte -> unicode character.
    byte_chars: [char; 256],
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    /// End-of-generation ids, sorted.
    eog: Vec<u32>,
    /// Control, user-defined and unknown tokens, longest text first: cut out of the text before
    /// tokenizing (llama.cpp `cache_special_tokens`).
    specials: Vec<u32>,
}

/// Token texts llama.cpp treats as end of generation (`special_eog_ids`).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

fn bad(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::BadGguf, msg)
}

fn unsupported(msg: impl Into<String>) -> Error {
    Error::new(ErrorCode::UnsupportedArch, msg)
}

impl Tokenizer {
    /// Build the tokenizer from a GGUF header (no tensor data needed).
    pub fn from_gguf(h: &GgufHeader) -> Result<Tokenizer> {
        let model_name = h.get_str("tokenizer.ggml.model").ok_or_else(|| {
            bad("the GGUF has no tokenizer.ggml.model: it carries no vocabulary to tokenize with")
        })?;
        let pre_name = h.get_str("tokenizer.ggml.pre").unwrap_or("");
        // llama.cpp's per-model defaults, before the file's own keys
        let (mut bos, mut eos, mut unk, mut add_bos, mut add_space_prefix, is_bpe) = match model_name {
            "llama" => (Some(1), Some(2), Some(0), true, true, false),
            "gpt2" => (Some(11), Some(11), None, PreTokenizer::ignore_merges(pre_name), false, true),
            "none" | "no_vocab" => {
                return Err(unsupported(
                    "the GGUF has no vocabulary (tokenizer.ggml.model = \"none\"): pass token ids instead of text",
                ))
            }
            other => {
                return Err(unsupported(format!(
                    "tokenizer.ggml.model \"{other}\" is not supported (supported: \"llama\" = SentencePiece, \"gpt2\" = byte-level BPE)"
                )))
            }
        };
        let mut add_eos = false;
        if let Some(v) = h.get_bool("tokenizer.ggml.add_space_prefix") {
            add_space_prefix = v;
        }
        if is_bpe {
            add_space_prefix = false;
        }

        let tokens = h
            .get_str_array("tokenizer.ggml.tokens")
            .ok_or_else(|| bad("the GGUF has no tokenizer.ggml.tokens (an array of strings): the vocabulary is missing"))?;
        let n = tokens.len();
        let scores: Vec<f32> = match h.get_array("tokenizer.ggml.scores") {
            None => vec![0.0; n],
            Some(MetaArray::F32(v)) if v.len() >= n => v[..n].to_vec(),
            Some(MetaArray::I32(v)) if v.len() >= n => v[..n].iter().map(|&s| s as f32).collect(),
            Some(_) => {
                return Err(bad(format!(
                    "tokenizer.ggml.scores must be f32 or i32 with {n} entries"
                )))
            }
        };
        let attrs: Vec<u8> = match h.get_array("tokenizer.ggml.token_type") {
            None => vec![attr::NORMAL; n],
            Some(MetaArray::I32(v)) if v.len() >= n => {
                v[..n].iter().map(|&t| attr::from_token_type(t)).collect()
            }
            Some(_) => {
                return Err(bad(format!(
                    "tokenizer.ggml.token_type must be i32 with {n} entries"
                )))
            }
        };
        let model = if is_bpe {
            let pre = PreTokenizer::from_name(pre_name).ok_or_else(|| {
                unsupported(format!(
                    "tokenizer.ggml.pre \"{pre_name}\" is not a supported BPE pre-tokenizer (supported: default, gpt-2, llama3/llama-bpe, qwen2, qwen35, gpt-4o and their llama.cpp aliases)"
                ))
            })?;
            Some(pre)
        } else {
            None
        };
        let merges_list = if is_bpe {
            Some(h.get_str_array("tokenizer.ggml.merges").ok_or_else(|| {
                bad("the GGUF has tokenizer.ggml.model = \"gpt2\" but no tokenizer.ggml.merges")
            })?)
        } else {
            None
        };

        let vocab = Vocab::new(tokens, scores, attrs);
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);

        let mut ids = [
            bos, eos, None, None, unk, None, None, None, None, None, None, None,
        ]; // bos eos eot eom unk pad fim_pre fim_suf fim_mid fim_pad fim_rep fim_sep
        let keys: [&[&str]; 12] = [
            &["tokenizer.ggml.bos_token_id"],
            &["tokenizer.ggml.eos_token_id"],
            &["tokenizer.ggml.eot_token_id"],
            &["tokenizer.ggml.eom_token_id"],
            &["tokenizer.ggml.unknown_token_id"],
            &["tokenizer.ggml.padding_token_id"],
            &[
                "tokenizer.ggml.fim_pre_token_id",
                "tokenizer.ggml.prefix_token_id",
            ],
            &[
                "tokenizer.ggml.fim_suf_token_id",
                "tokenizer.ggml.suffix_token_id",
            ],
            &[
                "tokenizer.ggml.fim_mid_token_id",
                "tokenizer.ggml.middle_token_id",
            ],
            &["tokenizer.ggml.fim_pad_token_id"],
            &["tokenizer.ggml.fim_rep_token_id"],
            &["tokenizer.ggml.fim_sep_token_id"],
        ];
        for (id, keys) in ids.iter_mut().zip(keys) {
            *id = in_range(*id);
            for key in keys {
                if let Some(v) = h.get_u32(key) {
                    if (v as usize) < n {
                        *id = Some(v);
                    }
                }
            }
        }
        let [b, e, mut eot, mut eom, u, pad, _fim_pre, _fim_suf, _fim_mid, mut fim_pad, mut fim_rep, mut fim_sep] =
            ids;
        (bos, eos, unk) = (b, e, u);
        if let Some(v) = h.get_bool("tokenizer.ggml.add_bos_token") {
            add_bos = v;
        }
        if let Some(v) = h.get_bool("tokenizer.ggml.add_eos_token") {
            add_eos = v;
        }

        let mut tok = Tokenizer {
            vocab,
            model: Model::Spm,
            byte_tokens: [None; 256],
            byte_chars: unicode::byte_to_char_table(),
            bos,
            eos,
            eot: None,
            unk,
            pad,
            add_bos,
            add_eos,
            add_space_prefix,
            eog: Vec::new(),
            specials: Vec::new(),
        };

        // auto-detect EOT/EOM/FIM by text where the file does not say; such a token that is not
        // marked control becomes control (llama.cpp does the same, with a warning). Texts are
        // unique in the index, so each candidate text names one id; where several candidates
        // exist (Qwen has <|im_end|> and <|endoftext|>) the first in the list is the EOT here,
        // llama.cpp takes the first in its hash-map order. Both end generation either way.
        let set_control =
            |tok: &mut Tokenizer, id: u32| tok.vocab.attrs[id as usize] |= attr::CONTROL;
        for (slot, texts) in [
            (&mut eot, EOT_TEXTS),
            (&mut eom, EOM_TEXTS),
            (&mut fim_pad, FIM_PAD_TEXTS),
            (&mut fim_rep, FIM_REP_TEXTS),
            (&mut fim_sep, FIM_SEP_TEXTS),
        ] {
            if slot.is_none() {
                if let Some(id) = texts.iter().find_map(|t| tok.vocab.find_str(t)) {
                    *slot = Some(id);
                    set_control(&mut tok, id);
                }
            }
        }
        for id in 0..n as u32 {
            if tok.vocab.has_attr(id, attr::CONTROL) && contains(tok.vocab.text(id), b"unused") {
                tok.vocab.attrs[id as usize] |= attr::UNUSED;
            }
        }
        let mut eog: Vec<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
        let found: Vec<u32> = EOG_TEXTS
            .iter()
            .filter_map(|t| tok.vocab.find_str(t))
            .collect();
        for id in found {
            eog.push(id);
            set_control(&mut tok, id);
        }
        let found: Vec<u32> = ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"]
            .iter()
            .filter_map(|t| tok.vocab.find_str(t))
            .collect();
        for id in found {
            tok.vocab.attrs[id as usize] = attr::USER_DEFINED; // llama.cpp's gpt-oss rule
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();
        let text_of = |tok: &Tokenizer, id: u32| tok.vocab.text(id).to_vec();
        let has = |tok: &Tokenizer, eog: &[u32], t: &str| {
            eog.iter().any(|&id| text_of(tok, id) == t.as_bytes())
        };
        // o200k_harmony / solar-open: "<|end|>" is not end of generation there
        if (has(&tok, &eog, "<|return|>")
            && has(&tok, &eog, "<|call|>")
            && has(&tok, &eog, "<|end|>"))
            || (has(&tok, &eog, "<|calls|>")
                && has(&tok, &eog, "<|flush|>")
                && has(&tok, &eog, "<|end|>"))
        {
            if let Some(pos) = eog.iter().position(|&id| text_of(&tok, id) == b"<|end|>") {
                let id = eog.remove(pos);
                tok.vocab.attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        // gemma4 / plamo: "</s>" is a normal token there
        if has(&tok, &eog, "<|tool_response>") || has(&tok, &eog, "<|plamo:eos|>") {
            if let Some(pos) = eog.iter().position(|&id| text_of(&tok, id) == b"</s>") {
                let id = eog.remove(pos);
                tok.vocab.attrs[id as usize] = attr::NORMAL;
            }
        }
        tok.eog = eog;
        tok.eot = eot;

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                tok.vocab
                    .has_attr(id, attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN)
            })
            .collect();
        specials.sort_by_key(|&id| std::cmp::Reverse(tok.vocab.text(id).len()));
        tok.specials = specials;

        match (model, merges_list) {
            (Some(pre), Some(list)) => {
                let merges = Merges::new(&tok.vocab, list);
                tok.model = Model::Bpe {
                    merges,
                    pre,
                    ignore_merges: PreTokenizer::ignore_merges(pre_name),
                };
            }
            _ => {
                for b in 0..256usize {
                    let hex = format!("<0x{b:02X}>");
                    tok.byte_tokens[b] = tok
                        .vocab
                        .find_str(&hex)
                        .or_else(|| tok.vocab.find(&[b as u8]));
                }
            }
        }
        Ok(tok)
    }

    pub fn kind(&self) -> TokenizerKind {
        match &self.model {
            Model::Spm => TokenizerKind::SentencePiece,
            Model::Bpe { pre, .. } => TokenizerKind::ByteLevelBpe(*pre),
        }
    }

    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }
    /// End of turn (`<end_of_turn>`, `<|eot_id|>`, `<|im_end|>`...), from the metadata or the texts.
    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }
    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }
    /// Every id that ends generation, sorted (EOS, EOT, EOM and the texts llama.cpp lists).
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }
    /// Whether `encode(.., add_special = true, ..)` starts with BOS / ends with EOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    /// A token's text as stored in the vocabulary ("▁the", "Ġthe", "<0x0A>", "<end_of_turn>").
    pub fn token_text(&self, id: u32) -> Option<&str> {
        ((id as usize) < self.vocab.len())
            .then(|| std::str::from_utf8(self.vocab.text(id)).unwrap_or(""))
    }
    /// The id of a token text, exactly as stored.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.find_str(text)
    }
    /// Whether a token is a control token (rendered only with `special`, ends nothing by itself).
    pub fn is_control(&self, id: u32) -> bool {
        (id as usize) < self.vocab.len() && self.vocab.has_attr(id, attr::CONTROL)
    }

    /// Text -> ids, as llama.cpp's `llama_tokenize(text, add_special, parse_special)`:
    /// `add_special` adds BOS/EOS when the vocabulary asks for them; `parse_special` turns
    /// control-token texts in `text` ("<start_of_turn>") into their ids (user-defined tokens are
    /// always matched).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let fragments = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.model {
            Model::Spm => {
                let mut prev_special = true; // a leading fragment gets the space prefix
                let mut buf = String::new();
                for f in &fragments {
                    match *f {
                        Fragment::Text(ref r) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push('\u{2581}');
                            }
                            for c in text[r.clone()].chars() {
                                if c == ' ' {
                                    buf.push('\u{2581}');
                                } else {
                                    buf.push(c);
                                }
                            }
                            spm::tokenize(&self.vocab, &self.byte_tokens, &buf, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Model::Bpe {
                merges,
                pre,
                ignore_merges,
            } => {
                let bpe = Bpe {
                    vocab: &self.vocab,
                    merges,
                    pre: *pre,
                    ignore_merges: *ignore_merges,
                    byte_chars: &self.byte_chars,
                };
                for f in &fragments {
                    match *f {
                        Fragment::Text(ref r) => bpe.tokenize(&text[r.clone()], &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Cut special tokens out of `text`, longest first (llama.cpp `tokenizer_st_partition`).
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(0..text.len()));
        let mut next = Vec::new();
        for &id in &self.specials {
            if !parse_special && self.vocab.has_attr(id, attr::CONTROL | attr::UNKNOWN) {
                continue;
            }
            let Ok(needle) = std::str::from_utf8(self.vocab.text(id)) else {
                continue;
            };
            let mut changed = false;
            next.clear();
            for f in &frags {
                let Fragment::Text(r) = f else {
                    next.push(f.clone());
                    continue;
                };
                let mut start = r.start;
                while let Some(i) = text[start..r.end].find(needle) {
                    let m = start + i;
                    if m > start {
                        next.push(Fragment::Text(start..m));
                    }
                    next.push(Fragment::Token(id));
                    start = m + needle.len();
                    changed = true;
                }
                if start < r.end {
                    next.push(Fragment::Text(start..r.end));
                }
            }
            if changed {
                std::mem::swap(&mut frags, &mut next);
            }
        }
        frags
    }

    /// The bytes one token renders as (llama.cpp `token_to_piece(id, lstrip = 0, special)`):
    /// control and unknown tokens are empty unless `special`; byte tokens are their byte; spaces
    /// come back from "▁" (SentencePiece) or from the GPT-2 byte mapping (BPE).
    pub fn token_piece(&self, id: u32, special: bool) -> Cow<'_, [u8]> {
        if id as usize >= self.vocab.len() {
            return Cow::Borrowed(&[]);
        }
        let a = self.vocab.attrs[id as usize];
        let text = self.vocab.text(id);
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return Cow::Borrowed(&[]);
        }
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            return Cow::Borrowed(text);
        }
        if a & attr::NORMAL != 0 {
            return match self.model {
                Model::Spm => {
                    if contains(text, "\u{2581}".as_bytes()) {
                        Cow::Owned(
                            std::str::from_utf8(text)
                                .unwrap_or("")
                                .replace('\u{2581}', " ")
                                .into_bytes(),
                        )
                    } else {
                        Cow::Borrowed(text)
                    }
                }
                Model::Bpe { .. } => Cow::Owned(self.bpe_decode_text(text)),
            };
        }
        if a & attr::BYTE != 0 {
            // "<0xXX>" -> the byte (llama.cpp parses text[3..5] as hex)
            let b = text
                .get(3..5)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            return Cow::Owned(b.into_iter().collect());
        }
        Cow::Borrowed(&[])
    }

    /// [`Tokenizer::token_piece`] without control tokens: the bytes generated text shows.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.token_piece(id, false).into_owned()
    }

    /// Ids -> text (control tokens dropped; invalid UTF-8 becomes U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, false)
    }

    /// Ids -> text, rendering control tokens too when `special`.
    pub fn decode_with(&self, ids: &[u32], special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(&self.token_piece(id, special));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Ids -> text, with the options of llama.cpp's `llama_detokenize` (see
    /// [`DetokenizeOptions`]). With the defaults it is [`Tokenizer::decode`]: the pieces
    /// generation streams, put together.
    pub fn detokenize(&self, ids: &[u32], o: DetokenizeOptions) -> String {
        let mut ids = ids;
        // llama.cpp strips the prefix space from the first token unless a BOS was removed.
        let mut strip_space = o.clean_up && self.add_space_prefix;
        if o.remove_special && self.add_bos && ids.first().is_some_and(|&id| Some(id) == self.bos) {
            strip_space = false;
            ids = &ids[1..];
        }
        if o.remove_special && self.add_eos && ids.last().is_some_and(|&id| Some(id) == self.eos) {
            ids = &ids[..ids.len() - 1];
        }
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let piece = self.token_piece(id, o.unparse_special);
            let piece = match piece.strip_prefix(b" ") {
                Some(rest) if i == 0 && strip_space => rest,
                _ => &piece[..],
            };
            bytes.extend_from_slice(piece);
        }
        if o.clean_up && matches!(self.model, Model::Bpe { pre, .. } if pre.clean_spaces()) {
            clean_up_spaces(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// A streaming decoder over this vocabulary.
    pub fn detokenizer(&self) -> Detokenizer<'_> {
        Detokenizer::new(self)
    }

    /// GPT-2 characters -> bytes (llama.cpp `llama_decode_text`, with its marker for characters
    /// outside the mapping).
    fn bpe_decode_text(&self, text: &[u8]) -> Vec<u8> {
        let s = std::str::from_utf8(text).unwrap_or("");
        let mut out = Vec::with_capacity(s.len());
        for c in s.chars() {
            match self.byte_chars.iter().position(|&m| m == c) {
                Some(b) => out.push(b as u8),
                None => {
                    out.extend_from_slice(b"[UNK_BYTE_0x");
                    let mut u = [0u8; 4];
                    for b in c.encode_utf8(&mut u).bytes() {
                        out.extend_from_slice(format!("{b:02x}").as_bytes());
                    }
                    out.extend_from_slice(text);
                    out.push(b']');
                }
            }
        }
        out
    }
}

#[derive(Clone, Debug)]
enum Fragment {
    Text(std::ops::Range<usize>),
    Token(u32),
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// llama.cpp's three clean-up passes over a detokenized text, in place and byte by byte as it
/// runs them (each pass compares a byte with the one before it in the pass's input):
/// 1. `" ?"`, `" !"`, `" ."`, `" ,"` lose the space;
/// 2. a `'` with a space on both sides loses both spaces;
/// 3. `" 's"`, `" 'm"`, `" 're"`, `" 've"` lose the space (`" 't"`, `" 'd"`, `" 'll"` keep it).
fn clean_up_spaces(text: &mut Vec<u8>) {
    // Pass 1.
    let mut len = usize::from(!text.is_empty());
    for i in 1..text.len() {
        let c = text[i];
        if text[i - 1] == b' ' && matches!(c, b'?' | b'!' | b'.' | b',') {
            len -= 1;
        }
        text[len] = c;
        len += 1;
    }
    text.truncate(len);
    // Pass 2. The space after the `'` is overwritten by a NUL that is skipped, so the byte after
    // it compares with that NUL, as in llama.cpp.
    let n = text.len();
    let mut len = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let c = text[i];
        if c == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            len -= 1;
            i += 1;
            text[i] = 0;
        }
        text[len] = c;
        len += 1;
        i += 1;
    }
    text.truncate(len);
    // Pass 3.
    let n = text.len();
    let mut len = usize::from(n > 0);
    for i in 1..n {
        let c = text[i];
        if text[i - 1] == b' ' && c == b'\'' && i + 1 < n {
            let next = text[i + 1];
            let next2 = text.get(i + 2).copied();
            let drop = match next {
                b's' | b'm' => true,
                b't' | b'd' => false,
                _ => i + 2 < n && matches!((next, next2), (b'r' | b'v', Some(b'e'))),
            };
            if drop {
                len -= 1;
            }
        }
        text[len] = c;
        len += 1;
    }
    text.truncate(len);
}
