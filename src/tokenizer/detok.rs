//! Streaming detokenization that never emits half a character.
//!
//! A token's bytes need not be whole UTF-8 characters: byte-fallback tokens (`<0xF0>`) and
//! byte-level BPE tokens split a character across tokens. [`Utf8Stream`] holds back an
//! incomplete trailing sequence until the bytes that complete it arrive; bytes that can never
//! become valid UTF-8 are emitted as U+FFFD exactly as `String::from_utf8_lossy` would, so the
//! concatenated stream equals [`Tokenizer::decode`](super::Tokenizer::decode) of all the ids.

use super::Tokenizer;

/// Bytes in, complete UTF-8 text out. Owns nothing but its pending bytes, so a generation session
/// can keep one next to an `Arc<Tokenizer>`.
#[derive(Clone, Debug, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Append `bytes`; return the text that is now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&rest[..valid]).unwrap());
                    match e.error_len() {
                        // a sequence that no later byte can complete
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &rest[valid + bad..];
                        }
                        // an incomplete sequence at the end: wait for more bytes
                        None => {
                            rest = &rest[valid..];
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        out
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// End of stream: an incomplete sequence left over becomes U+FFFD.
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// Token ids in, complete UTF-8 text out (control tokens render as nothing, like
/// [`Tokenizer::decode`](super::Tokenizer::decode)).
pub struct Detokenizer<'a> {
    tok: &'a Tokenizer,
    special: bool,
    utf8: Utf8Stream,
}

impl<'a> Detokenizer<'a> {
    pub fn new(tok: &'a Tokenizer) -> Self {
        Detokenizer {
            tok,
            special: false,
            utf8: Utf8Stream::new(),
        }
    }

    /// Render control tokens' text too (llama.cpp `token_to_piece(..., special = true)`).
    pub fn with_special(mut self, special: bool) -> Self {
        self.special = special;
        self
    }

    /// Feed one token; return the text completed by it (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.push_with(id, false)
    }

    /// [`Detokenizer::push`], rendering this token's text even when it is a control token and
    /// the stream does not render them.
    pub fn push_with(&mut self, id: u32, special: bool) -> String {
        let piece = self.tok.token_piece(id, self.special || special);
        self.utf8.push(&piece)
    }

    pub fn flush(&mut self) -> String {
        self.utf8.flush()
    }
}
