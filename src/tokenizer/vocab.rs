//! The vocabulary: token texts in one arena, a text -> id hash index, scores and attributes.
//!
//! 262,144 Gemma tokens would be 262,144 `String`s and as many hash-map keys; one byte arena and
//! an open-addressing table of ids (compared against the arena) build in a few milliseconds.

/// Token attributes, llama.cpp's `llama_token_attr` bits.
pub(super) mod attr {
    pub const UNKNOWN: u8 = 1 << 0;
    pub const UNUSED: u8 = 1 << 1;
    pub const NORMAL: u8 = 1 << 2;
    pub const CONTROL: u8 = 1 << 3;
    pub const USER_DEFINED: u8 = 1 << 4;
    pub const BYTE: u8 = 1 << 5;

    /// GGUF `tokenizer.ggml.token_type` -> attribute (llama.cpp `llama_vocab::impl::load`).
    pub fn from_token_type(t: i32) -> u8 {
        match t {
            2 => UNKNOWN,
            5 => UNUSED,
            1 => NORMAL,
            3 => CONTROL,
            4 => USER_DEFINED,
            6 => BYTE,
            _ => 0, // UNDEFINED
        }
    }
}

const EMPTY: u32 = u32::MAX;

pub(super) struct Vocab {
    arena: Vec<u8>,
    /// `ends[i]`: end of token i's text in `arena` (its start is `ends[i - 1]`, or 0).
    ends: Vec<u32>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u8>,
    slots: Vec<u32>,
}

/// FxHash-style multiply-rotate over 8-byte words; good enough for token texts.
fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h: u64 = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        h = (h.rotate_left(5) ^ u64::from_le_bytes(c.try_into().unwrap())).wrapping_mul(K);
    }
    let mut tail = [0u8; 8];
    let rest = chunks.remainder();
    tail[..rest.len()].copy_from_slice(rest);
    h = (h.rotate_left(5) ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    h ^ (h >> 29)
}

impl Vocab {
    /// `texts` in id order. An empty text becomes `[EMPTY_{id}]` and a repeated text maps to its
    /// last id, as in llama.cpp.
    pub fn new(texts: &[String], scores: Vec<f32>, attrs: Vec<u8>) -> Vocab {
        let n = texts.len();
        let total: usize = texts.iter().map(|t| t.len().max(16)).sum();
        let mut arena = Vec::with_capacity(total);
        let mut ends = Vec::with_capacity(n);
        for (i, t) in texts.iter().enumerate() {
            if t.is_empty() {
                arena.extend_from_slice(format!("[EMPTY_{i}]").as_bytes());
            } else {
                arena.extend_from_slice(t.as_bytes());
            }
            ends.push(arena.len() as u32);
        }
        let cap = (n * 2).next_power_of_two().max(16);
        let mut v = Vocab {
            arena,
            ends,
            scores,
            attrs,
            slots: vec![EMPTY; cap],
        };
        for id in 0..n as u32 {
            v.insert(id);
        }
        v
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn text(&self, id: u32) -> &[u8] {
        let i = id as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.arena[start..self.ends[i] as usize]
    }

    pub fn has_attr(&self, id: u32, a: u8) -> bool {
        self.attrs[id as usize] & a != 0
    }

    fn insert(&mut self, id: u32) {
        let mask = self.slots.len() - 1;
        let mut i = hash(self.text(id)) as usize & mask;
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                self.slots[i] = id;
                return;
            }
            if self.text(s) == self.text(id) {
                self.slots[i] = id; // the later id wins (llama.cpp: token_to_id[word] = i)
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Text -> id (llama.cpp `text_to_token`).
    pub fn find(&self, text: &[u8]) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut i = hash(text) as usize & mask;
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if self.text(s) == text {
                return Some(s);
            }
            i = (i + 1) & mask;
        }
    }

    pub fn find_str(&self, text: &str) -> Option<u32> {
        self.find(text.as_bytes())
    }
}
