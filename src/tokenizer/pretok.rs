//! Byte-level BPE pre-tokenizers: text -> words, exactly as llama.cpp's `unicode_regex_split`.
//!
//! The regexes of the Hugging Face tokenizers use lookahead (`\s+(?!\S)`), so llama.cpp hand-codes
//! them over its own codepoint categories (`unicode_regex_split_custom_{gpt2,llama3,qwen2,qwen35}`);
//! these are line-for-line ports. `default` chains four regexes, and `gpt-4o` has one, that
//! llama.cpp runs through `std::regex` on a "collapsed" text (one byte per codepoint, a stand-in
//! byte per category); `default`'s are plain character-class runs, ported as such, and `gpt-4o`'s
//! backtracking is worked out by hand below (`Text::gpt4o`).
//!
//! Every splitter takes the current split (`offsets`: lengths in codepoints, summing to the text)
//! and refines each piece independently, like llama.cpp.

use super::unicode::{Flags, LETTER, NUMBER, PUNCTUATION};

/// The pre-tokenizers we implement, chosen by `tokenizer.ggml.pre` (llama.cpp's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `default` or missing: `[\p{P}\$\+<=>\^~\|]+`, the GPT-2 regex, `\p{N}+`, `[0-9][0-9][0-9]`.
    Default,
    /// `gpt-2` (and llama.cpp's aliases): `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`.
    Gpt2,
    /// `llama3` / `llama-bpe` (...): `(?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    Llama3,
    /// `qwen2` (...): as llama3 but `\p{N}` (single digits).
    Qwen2,
    /// `qwen35`: as qwen2 with combining marks joined to letters: `[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+`
    /// and ` ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*`.
    Qwen35,
    /// `gpt-4o` (`llama4`, `kanana2`, `talkie`): the o200k regex as llama.cpp rewrites it for
    /// `std::regex`, `[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|...)?|`
    /// `[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|...)?|\p{N}{1,3}|`
    /// ` ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`: upper/lower case is ASCII only
    /// (every other letter counts as both).
    Gpt4o,
}

impl PreTokenizer {
    /// llama.cpp's name -> pre-tokenizer, for the names whose only effect is the regex (plus
    /// `ignore_merges` for the llama3 family, see [`PreTokenizer::ignore_merges`]).
    pub fn from_name(name: &str) -> Option<PreTokenizer> {
        Some(match name {
            "" | "default" => PreTokenizer::Default,
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" => PreTokenizer::Gpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" | "dbrx" | "smaug-bpe" => PreTokenizer::Llama3,
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" => PreTokenizer::Qwen2,
            "qwen35" => PreTokenizer::Qwen35,
            "gpt-4o" | "llama4" | "kanana2" | "talkie" => PreTokenizer::Gpt4o,
            _ => return None,
        })
    }

    /// llama.cpp sets `ignore_merges` (a word that is a whole token skips BPE) for the llama3 names
    /// (not for dbrx/smaug, which only share the regex).
    pub(super) fn ignore_merges(name: &str) -> bool {
        matches!(
            name,
            "llama3"
                | "llama-v3"
                | "llama-bpe"
                | "falcon3"
                | "falcon-h1"
                | "pixtral"
                | "midm-2.0"
                | "lfm2"
                | "jina-v5-nano"
        )
    }

    /// Whether llama.cpp cleans up tokenization spaces when it detokenizes a whole sequence
    /// (`clean_spaces`, see [`super::Tokenizer::detokenize`]): on for byte-level BPE, off for the
    /// families whose names turn it off (qwen2, qwen35, gpt-4o and their aliases).
    pub fn clean_spaces(self) -> bool {
        !matches!(
            self,
            PreTokenizer::Qwen2 | PreTokenizer::Qwen35 | PreTokenizer::Gpt4o
        )
    }

    /// Split `text` into words; returns byte ranges into `text`.
    pub fn split(self, text: &str) -> Vec<std::ops::Range<usize>> {
        let cpts: Vec<u32> = text.chars().map(|c| c as u32).collect();
        let flags: Vec<Flags> = cpts.iter().map(|&c| Flags::of(c)).collect();
        let mut offsets = vec![cpts.len()];
        let s = Text {
            cpts: &cpts,
            flags: &flags,
        };
        match self {
            PreTokenizer::Gpt2 => offsets = s.gpt2(&offsets),
            PreTokenizer::Llama3 => offsets = s.llama3_qwen2(&offsets, Some(3), false),
            PreTokenizer::Qwen2 => offsets = s.llama3_qwen2(&offsets, None, false),
            PreTokenizer::Qwen35 => offsets = s.llama3_qwen2(&offsets, None, true),
            PreTokenizer::Gpt4o => offsets = s.gpt4o(&offsets),
            PreTokenizer::Default => {
                offsets = s.class_runs(&offsets, default_punct);
                offsets = s.gpt2(&offsets);
                offsets = s.class_runs(&offsets, default_number);
                offsets = s.ascii_digit_triples(&offsets);
            }
        }
        // codepoint lengths -> byte ranges
        let mut out = Vec::with_capacity(offsets.len());
        let mut chars = text
            .char_indices()
            .map(|(i, _)| i)
            .chain(std::iter::once(text.len()));
        let mut start = chars.next().unwrap_or(0);
        for len in offsets {
            if len == 0 {
                continue;
            }
            let end = chars.nth(len - 1).unwrap_or(text.len());
            out.push(start..end);
            start = end;
        }
        out
    }
}

const OUT_OF_RANGE: u32 = 0xFFFF_FFFF;

struct Text<'a> {
    cpts: &'a [u32],
    flags: &'a [Flags],
}

/// One fragment's cursor helpers (llama.cpp's `_get_cpt`, `_get_flags`, `_add_token`).
struct Piece<'a> {
    t: &'a Text<'a>,
    ini: usize,
    end: usize,
    prev_end: usize,
    out: &'a mut Vec<usize>,
}

impl Piece<'_> {
    fn cpt(&self, pos: usize) -> u32 {
        if self.ini <= pos && pos < self.end {
            self.t.cpts[pos]
        } else {
            OUT_OF_RANGE
        }
    }
    fn flags(&self, pos: usize) -> Flags {
        if self.ini <= pos && pos < self.end {
            self.t.flags[pos]
        } else {
            Flags::NONE
        }
    }
    /// The codepoint at `pos` as the `gpt-4o` regex sees it.
    fn o200k(&self, pos: usize) -> O200k {
        O200k::of(self.cpt(pos), self.flags(pos))
    }
    fn add(&mut self, end: usize) -> usize {
        debug_assert!(self.prev_end <= end && end <= self.end);
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }
}

fn lower_ascii(c: u32) -> u32 {
    if (b'A' as u32..=b'Z' as u32).contains(&c) {
        c + 32
    } else {
        c
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d` at `pos` (case-insensitive when `fold`): the match end.
fn contraction(p: &Piece, pos: usize, fold: bool) -> Option<usize> {
    let f = |c: u32| if fold { lower_ascii(c) } else { c };
    if p.cpt(pos) != '\'' as u32 || pos + 1 >= p.end {
        return None;
    }
    let next = f(p.cpt(pos + 1));
    if [b's', b't', b'm', b'd'].iter().any(|&c| next == c as u32) {
        return Some(pos + 2);
    }
    if pos + 2 < p.end {
        let nn = f(p.cpt(pos + 2));
        let pair = |a: u8, b: u8| next == a as u32 && nn == b as u32;
        if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
            return Some(pos + 3);
        }
    }
    None
}

impl Text<'_> {
    fn pieces(&self, offsets: &[usize], mut each: impl FnMut(&mut Piece)) -> Vec<usize> {
        let mut out = Vec::with_capacity(offsets.len());
        let mut start = 0;
        for &len in offsets {
            let mut p = Piece {
                t: self,
                ini: start,
                end: start + len,
                prev_end: start,
                out: &mut out,
            };
            each(&mut p);
            start += len;
        }
        out
    }

    /// `unicode_regex_split_custom_gpt2`.
    fn gpt2(&self, offsets: &[usize]) -> Vec<usize> {
        self.pieces(offsets, |p| {
            let mut pos = p.ini;
            while pos < p.end {
                let cpt = p.cpt(pos);
                let flags = p.flags(pos);
                if let Some(end) = contraction(p, pos, false) {
                    pos += p.add(end);
                    continue;
                }
                let space = cpt == ' ' as u32;
                let mut flags2 = if space { p.flags(pos + 1) } else { flags };
                // <space>?\p{L}+
                if flags2.is_letter() {
                    pos += space as usize;
                    while flags2.is_letter() {
                        pos += 1;
                        flags2 = p.flags(pos);
                    }
                    p.add(pos);
                    continue;
                }
                // <space>?\p{N}+
                if flags2.is_number() {
                    pos += space as usize;
                    while flags2.is_number() {
                        pos += 1;
                        flags2 = p.flags(pos);
                    }
                    p.add(pos);
                    continue;
                }
                // <space>?[^\s\p{L}\p{N}]+
                let other = |f: Flags| !(f.ws || f.is_letter() || f.is_number()) && f.any();
                if other(flags2) {
                    pos += space as usize;
                    while other(flags2) {
                        pos += 1;
                        flags2 = p.flags(pos);
                    }
                    p.add(pos);
                    continue;
                }
                let mut n_ws = 0;
                while p.flags(pos + n_ws).ws {
                    n_ws += 1;
                }
                // \s+(?!\S)
                if n_ws > 1 && p.cpt(pos + n_ws) != OUT_OF_RANGE {
                    pos += n_ws - 1;
                    p.add(pos);
                    continue;
                }
                // \s+
                if n_ws > 0 {
                    pos += n_ws;
                    p.add(pos);
                    continue;
                }
                pos += 1;
                p.add(pos);
            }
        })
    }

    /// `unicode_regex_split_custom_llama3` (`max_digits` Some(3): `\p{N}{1,3}`),
    /// `unicode_regex_split_custom_qwen2` (None: `\p{N}`) and `unicode_regex_split_custom_qwen35`
    /// (None, `marks`: a word is `[\p{L}\p{M}]+` and the symbol run excludes `\p{M}` too).
    fn llama3_qwen2(
        &self,
        offsets: &[usize],
        max_digits: Option<usize>,
        marks: bool,
    ) -> Vec<usize> {
        let word = |f: Flags| f.is_letter() || (marks && f.is_mark());
        self.pieces(offsets, |p| {
            let mut pos = p.ini;
            while pos < p.end {
                let cpt = p.cpt(pos);
                let flags = p.flags(pos);
                if let Some(end) = contraction(p, pos, true) {
                    pos += p.add(end);
                    continue;
                }
                let is_rn = |c: u32| c == '\r' as u32 || c == '\n' as u32;
                // [^\r\n\p{L}\p{N}]?\p{L}+   (qwen35: [\p{L}\p{M}]+)
                if !(is_rn(cpt) || flags.is_number()) && (word(flags) || word(p.flags(pos + 1))) {
                    pos += 1;
                    while word(p.flags(pos)) {
                        pos += 1;
                    }
                    p.add(pos);
                    continue;
                }
                // \p{N}{1,3} | \p{N}
                if flags.is_number() {
                    match max_digits {
                        Some(max) => {
                            let mut ini = pos;
                            while p.flags(pos).is_number() {
                                pos += 1;
                                if pos - ini >= max {
                                    p.add(pos);
                                    ini = pos;
                                }
                            }
                            p.add(pos);
                        }
                        None => {
                            pos += 1;
                            p.add(pos);
                        }
                    }
                    continue;
                }
                // <space>?[^\s\p{L}\p{N}]+[\r\n]*   (note: llama.cpp tests `flags`, not `flags2`, for any())
                let space = cpt == ' ' as u32;
                let mut flags2 = if space { p.flags(pos + 1) } else { flags };
                let other = |f: Flags| !(f.ws || word(f) || f.is_number());
                if other(flags2) && flags.any() {
                    pos += space as usize;
                    while other(flags2) && flags2.any() {
                        pos += 1;
                        flags2 = p.flags(pos);
                    }
                    let mut c2 = p.cpt(pos);
                    while is_rn(c2) {
                        pos += 1;
                        c2 = p.cpt(pos);
                    }
                    p.add(pos);
                    continue;
                }
                let mut n_ws = 0;
                let mut last_rn_end = 0;
                while p.flags(pos + n_ws).ws {
                    if is_rn(p.cpt(pos + n_ws)) {
                        last_rn_end = pos + n_ws + 1;
                    }
                    n_ws += 1;
                }
                // \s*[\r\n]+
                if last_rn_end > 0 {
                    pos = last_rn_end;
                    p.add(pos);
                    continue;
                }
                // \s+(?!\S)
                if n_ws > 1 && p.cpt(pos + n_ws) != OUT_OF_RANGE {
                    pos += n_ws - 1;
                    p.add(pos);
                    continue;
                }
                // \s+
                if n_ws > 0 {
                    pos += n_ws;
                    p.add(pos);
                    continue;
                }
                pos += 1;
                p.add(pos);
            }
        })
    }

    /// The `gpt-4o` regex as `std::regex` (ECMAScript: ordered alternatives, greedy with
    /// backtracking) runs it on the collapsed text, worked out per alternative. Every codepoint
    /// starts a match of some alternative, so no piece is ever a gap between matches.
    ///
    /// With U = `[A-Z]` or a non-ASCII letter and L = `[a-z]` or a non-ASCII letter (the
    /// collapsed letter byte passes both `[^a-z]` and `[^A-Z]`), the two word alternatives are
    /// `P? U* L+ C?` and `P? U+ L* C?` (P = `[^\r\n\p{L}\p{N}]`, C = a contraction). From the
    /// word start q with its maximal U run q..u: if u is `[a-z]`, the first wins with the L run
    /// from u; otherwise U* backtracks to the last non-ASCII letter k in q..u and L+ is that one
    /// codepoint (k + 1: what follows is `[A-Z]` or not a letter); with none, the second wins
    /// with U+ = q..u (L* is empty there, else the first would have matched).
    fn gpt4o(&self, offsets: &[usize]) -> Vec<usize> {
        self.pieces(offsets, |p| {
            let mut pos = p.ini;
            while pos < p.end {
                let c = p.o200k(pos);
                // [^\r\n\p{L}\p{N}]? before a word: taken whenever a letter follows
                let q = if c.prefix() && p.o200k(pos + 1).letter() {
                    pos + 1
                } else {
                    pos
                };
                if p.o200k(q).letter() {
                    let mut u = q;
                    while matches!(p.o200k(u), O200k::Upper | O200k::Letter) {
                        u += 1;
                    }
                    let mut end = if p.o200k(u) == O200k::Lower {
                        let mut e = u;
                        while matches!(p.o200k(e), O200k::Lower | O200k::Letter) {
                            e += 1;
                        }
                        e
                    } else {
                        match (q..u).rev().find(|&k| p.o200k(k) == O200k::Letter) {
                            Some(k) => k + 1,
                            None => u,
                        }
                    };
                    // (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?
                    if let Some(e) = contraction(p, end, true) {
                        end = e;
                    }
                    pos = end;
                    p.add(pos);
                    continue;
                }
                // \p{N}{1,3}
                if c == O200k::Number {
                    let ini = pos;
                    while p.o200k(pos) == O200k::Number && pos - ini < 3 {
                        pos += 1;
                    }
                    p.add(pos);
                    continue;
                }
                // <space>?[^\s\p{L}\p{N}]+[\r\n/]*
                let start = if p.cpt(pos) == ' ' as u32 && p.o200k(pos + 1) == O200k::Other {
                    pos + 1
                } else {
                    pos
                };
                if p.o200k(start) == O200k::Other {
                    pos = start;
                    while p.o200k(pos) == O200k::Other {
                        pos += 1;
                    }
                    while p.o200k(pos) == O200k::Newline || p.cpt(pos) == '/' as u32 {
                        pos += 1;
                    }
                    p.add(pos);
                    continue;
                }
                // what is left is whitespace (`\s`): \s*[\r\n]+ | \s+(?!\S) | \s+
                debug_assert!(c.space());
                let mut n_ws = 0;
                let mut last_rn_end = 0;
                while p.o200k(pos + n_ws).space() {
                    if p.o200k(pos + n_ws) == O200k::Newline {
                        last_rn_end = pos + n_ws + 1;
                    }
                    n_ws += 1;
                }
                pos = if last_rn_end > 0 {
                    last_rn_end
                } else if n_ws > 1 && p.cpt(pos + n_ws) != OUT_OF_RANGE {
                    pos + n_ws - 1
                } else {
                    pos + n_ws
                };
                p.add(pos);
            }
        })
    }

    /// `std::regex_iterator` over a `[class]+` regex: maximal runs of the class and the gaps
    /// between them each become a piece.
    fn class_runs(&self, offsets: &[usize], class: fn(u32, Flags) -> bool) -> Vec<usize> {
        self.pieces(offsets, |p| {
            let mut pos = p.ini;
            while pos < p.end {
                let inside = class(self.cpts[pos], self.flags[pos]);
                let start = pos;
                while pos < p.end && class(self.cpts[pos], self.flags[pos]) == inside {
                    pos += 1;
                }
                debug_assert!(pos > start);
                p.add(pos);
            }
        })
    }

    /// `[0-9][0-9][0-9]` through `std::wregex`: each run of ASCII digits gives triples from its
    /// start; the rest (fewer than three digits, other text) stays in the gap pieces.
    fn ascii_digit_triples(&self, offsets: &[usize]) -> Vec<usize> {
        let digit = |c: u32| (b'0' as u32..=b'9' as u32).contains(&c);
        self.pieces(offsets, |p| {
            let mut pos = p.ini;
            while pos + 3 <= p.end {
                if digit(self.cpts[pos]) && digit(self.cpts[pos + 1]) && digit(self.cpts[pos + 2]) {
                    p.add(pos);
                    pos += 3;
                    p.add(pos);
                } else {
                    pos += 1;
                }
            }
            p.add(p.end);
        })
    }
}

/// The collapsed-text view of `[\p{P}\$\+<=>\^~\|]`: ASCII by llama.cpp's table (all ASCII
/// punctuation and `$+<=>^~|`, not the backquote), other codepoints whose only category is
/// punctuation and that are not whitespace.
fn default_punct(c: u32, f: Flags) -> bool {
    if c < 128 {
        return b"!\"#%&'()*,-./:;?@[\\]_{}$+<=>^~|".contains(&(c as u8));
    }
    !f.ws && f.cat == PUNCTUATION
}

/// The collapsed-text view of `\p{N}`: ASCII digits and non-whitespace codepoints whose only
/// category is number.
fn default_number(c: u32, f: Flags) -> bool {
    if c < 128 {
        return (b'0' as u32..=b'9' as u32).contains(&c);
    }
    !f.ws && f.cat == NUMBER
}

/// A codepoint as the `gpt-4o` regex sees it in llama.cpp's collapsed text: ASCII as itself,
/// `std::regex`'s `\s` being the C locale's (tab, LF, VT, FF, CR, space); above ASCII a
/// whitespace codepoint becomes a vertical tab, a letter or number its category byte, and
/// everything else a byte no class of the regex names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum O200k {
    /// `A-Z`: passes `[^a-z]` only.
    Upper,
    /// `a-z`: passes `[^A-Z]` only.
    Lower,
    /// A non-ASCII letter: one byte for all of them, which passes both.
    Letter,
    /// `\p{N}`.
    Number,
    /// `\r`, `\n`.
    Newline,
    /// The rest of `\s`.
    Space,
    /// `[^\s\p{L}\p{N}]`.
    Other,
    /// Past the fragment.
    End,
}

impl O200k {
    fn of(c: u32, f: Flags) -> O200k {
        if c == OUT_OF_RANGE {
            return O200k::End;
        }
        if c < 128 {
            return match c as u8 {
                b'A'..=b'Z' => O200k::Upper,
                b'a'..=b'z' => O200k::Lower,
                b'0'..=b'9' => O200k::Number,
                b'\r' | b'\n' => O200k::Newline,
                b'\t' | 0x0B | 0x0C | b' ' => O200k::Space,
                _ => O200k::Other,
            };
        }
        if f.ws {
            O200k::Space
        } else if f.cat == LETTER {
            O200k::Letter
        } else if f.cat == NUMBER {
            O200k::Number
        } else {
            O200k::Other
        }
    }
    fn letter(self) -> bool {
        matches!(self, O200k::Upper | O200k::Lower | O200k::Letter)
    }
    fn space(self) -> bool {
        matches!(self, O200k::Newline | O200k::Space)
    }
    /// `[^\r\n\p{L}\p{N}]`
    fn prefix(self) -> bool {
        matches!(self, O200k::Space | O200k::Other)
    }
}
