//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): llama.cpp's `llm_tokenizer_bpe_session`.
//! Each pre-tokenized word is byte-encoded (GPT-2's byte -> unicode map), split into characters,
//! and the adjacent pair with the lowest merge rank (ties: leftmost) is merged until none is left.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::pretok::PreTokenizer;
use super::vocab::Vocab;

/// A merge `(left, right)` by text.
type TextPair = (Box<[u8]>, Box<[u8]>);

/// Merge ranks. Both halves of a merge are nearly always tokens, so the pair is keyed by their
/// ids; the rare merge with a half that is not a token is kept by text.
pub(super) struct Merges {
    by_id: HashMap<(u32, u32), u32>,
    by_text: HashMap<TextPair, u32>,
}

impl Merges {
    /// `merges[i]` is `"left right"`, rank i; the first of repeated pairs wins (llama.cpp emplaces).
    pub fn new(vocab: &Vocab, merges: &[String]) -> Merges {
        let mut by_id = HashMap::with_capacity(merges.len());
        let mut by_text = HashMap::new();
        for (rank, m) in merges.iter().enumerate() {
            // llama.cpp: word.find(' ', 1); a merge without a space is the pair ("", ""), which
            // no symbol pair can match
            let Some(pos) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (a, b) = (&m.as_bytes()[..pos], &m.as_bytes()[pos + 1..]);
            match (vocab.find(a), vocab.find(b)) {
                (Some(x), Some(y)) => {
                    by_id.entry((x, y)).or_insert(rank as u32);
                }
                _ => {
                    by_text.entry((a.into(), b.into())).or_insert(rank as u32);
                }
            }
        }
        Merges { by_id, by_text }
    }

    fn rank(&self, vocab: &Vocab, a: &[u8], b: &[u8]) -> Option<u32> {
        if let (Some(x), Some(y)) = (vocab.find(a), vocab.find(b)) {
            if let Some(&r) = self.by_id.get(&(x, y)) {
                return Some(r);
            }
        }
        if self.by_text.is_empty() {
            return None;
        }
        self.by_text
            .get(&(Box::<[u8]>::from(a), Box::<[u8]>::from(b)))
            .copied()
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    n: u32,
    next: i32,
    prev: i32,
}

pub(super) struct Bpe<'a> {
    pub vocab: &'a Vocab,
    pub merges: &'a Merges,
    pub pre: PreTokenizer,
    pub ignore_merges: bool,
    pub byte_chars: &'a [char; 256],
}

impl Bpe<'_> {
    /// Tokenize one text fragment (no special tokens in it) and append the ids to `out`.
    pub fn tokenize(&self, text: &str, out: &mut Vec<u32>) {
        let mut word = String::new();
        let mut symbols: Vec<Symbol> = Vec::new();
        let mut queue: BinaryHeap<Reverse<(u32, i32, i32, u32)>> = BinaryHeap::new();
        for range in self.pre.split(text) {
            word.clear();
            for &b in &text.as_bytes()[range] {
                word.push(self.byte_chars[b as usize]);
            }
            let w = word.as_bytes();
            if self.ignore_merges {
                if let Some(id) = self.vocab.find(w) {
                    out.push(id);
                    continue;
                }
            }
            symbols.clear();
            queue.clear();
            for (i, (off, c)) in word.char_indices().enumerate() {
                let end = off + c.len_utf8();
                symbols.push(Symbol {
                    start: off as u32,
                    n: c.len_utf8() as u32,
                    prev: i as i32 - 1,
                    next: if end == w.len() { -1 } else { i as i32 + 1 },
                });
            }
            let add = |symbols: &[Symbol],
                       queue: &mut BinaryHeap<Reverse<(u32, i32, i32, u32)>>,
                       l: i32,
                       r: i32| {
                if l < 0 || r < 0 {
                    return;
                }
                let (ls, rs) = (symbols[l as usize], symbols[r as usize]);
                let a = &w[ls.start as usize..(ls.start + ls.n) as usize];
                let b = &w[rs.start as usize..(rs.start + rs.n) as usize];
                if let Some(rank) = self.merges.rank(self.vocab, a, b) {
                    queue.push(Reverse((rank, l, r, ls.n + rs.n)));
                }
            };
            for i in 1..symbols.len() as i32 {
                add(&symbols, &mut queue, i - 1, i);
            }
            while let Some(Reverse((_, l, r, size))) = queue.pop() {
                let (ls, rs) = (symbols[l as usize], symbols[r as usize]);
                // a stale pair: one side merged away, or grew (llama.cpp compares the texts)
                if ls.n == 0 || rs.n == 0 || ls.n + rs.n != size {
                    continue;
                }
                symbols[l as usize].n += rs.n;
                symbols[r as usize].n = 0;
                symbols[l as usize].next = rs.next;
                if rs.next >= 0 {
                    symbols[rs.next as usize].prev = l;
                }
                add(&symbols, &mut queue, ls.prev, l);
                add(&symbols, &mut queue, l, rs.next);
            }
            for s in symbols.iter().filter(|s| s.n > 0) {
                let piece = &w[s.start as usize..(s.start + s.n) as usize];
                match self.vocab.find(piece) {
                    Some(id) => out.push(id),
                    // llama.cpp looks up each byte of the (encoded) piece as a one-byte token and
                    // skips the bytes that are none
                    None => out.extend(
                        piece
                            .iter()
                            .filter_map(|b| self.vocab.find(std::slice::from_ref(b))),
                    ),
                }
            }
        }
    }
}
