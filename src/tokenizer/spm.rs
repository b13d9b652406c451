//! SentencePiece-style tokenization (`tokenizer.ggml.model = "llama"`): llama.cpp's
//! `llm_tokenizer_spm_session`. Start from UTF-8 characters, repeatedly merge the adjacent pair
//! whose concatenation is the highest-scoring token (ties: leftmost), then emit each symbol as its
//! token, or as byte tokens (`<0xXX>`) when it is not one.
//!
//! llama.cpp keeps a `rev_merge` map to re-split an unknown merged symbol, but a merge only happens
//! when the concatenation is a token, so only unmerged single characters can be unknown: they go
//! straight to bytes here.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::Vocab;

#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    n: u32,
    prev: i32,
    next: i32,
}

struct Bigram {
    left: i32,
    right: i32,
    score: f32,
    size: u32,
}

// the max-heap pops the highest score, then the smallest `left` (llama.cpp's comparator; scores
// compare as C++ floats do, so -0.0 == 0.0, which Gemma's scores contain)
impl Ord for Bigram {
    fn cmp(&self, o: &Self) -> Ordering {
        let by_score = self.score.partial_cmp(&o.score).unwrap_or(Ordering::Equal);
        by_score.then_with(|| o.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}

/// Tokenize `text` (spaces already escaped as U+2581) and append the ids to `out`.
pub(super) fn tokenize(
    vocab: &Vocab,
    byte_tokens: &[Option<u32>; 256],
    text: &str,
    out: &mut Vec<u32>,
) {
    let bytes = text.as_bytes();
    let mut symbols: Vec<Symbol> = Vec::with_capacity(bytes.len());
    for (i, (off, c)) in text.char_indices().enumerate() {
        let end = off + c.len_utf8();
        symbols.push(Symbol {
            start: off as u32,
            n: c.len_utf8() as u32,
            prev: i as i32 - 1,
            next: if end == bytes.len() { -1 } else { i as i32 + 1 },
        });
    }
    let mut queue = BinaryHeap::with_capacity(symbols.len());
    let try_add = |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: i32, right: i32| {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (symbols[left as usize], symbols[right as usize]);
        let s = &bytes[l.start as usize..(l.start + l.n + r.n) as usize];
        if let Some(id) = vocab.find(s) {
            queue.push(Bigram {
                left,
                right,
                score: vocab.scores[id as usize],
                size: s.len() as u32,
            });
        }
    };
    for i in 1..symbols.len() as i32 {
        try_add(&symbols, &mut queue, i - 1, i);
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left as usize], symbols[b.right as usize]);
        if l.n == 0 || r.n == 0 || l.n + r.n != b.size {
            continue; // one side was merged away since
        }
        symbols[b.left as usize].n += r.n;
        symbols[b.right as usize].n = 0;
        symbols[b.left as usize].next = r.next;
        if r.next >= 0 {
            symbols[r.next as usize].prev = b.left;
        }
        let lp = symbols[b.left as usize].prev;
        try_add(&symbols, &mut queue, lp, b.left);
        try_add(&symbols, &mut queue, b.left, r.next);
    }
    let mut i = if symbols.is_empty() { -1 } else { 0 };
    while i >= 0 {
        let s = symbols[i as usize];
        let piece = &bytes[s.start as usize..(s.start + s.n) as usize];
        match vocab.find(piece) {
            Some(id) => out.push(id),
            None => {
                // llama.cpp's byte_to_token throws when a byte has no token; we drop it
                out.extend(piece.iter().filter_map(|&b| byte_tokens[b as usize]));
            }
        }
        i = s.next;
    }
}
