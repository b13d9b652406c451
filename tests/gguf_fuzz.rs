//! Mutation fuzzing of the GGUF push parser: random corruptions of valid files, fed in random
//! chunkings, must never panic, never allocate beyond what the bytes seen justify, and must give
//! the same result whatever the chunking.
//!
//! `CERA_FUZZ_ITERS` sets the number of executions (default 20000), `CERA_FUZZ_SEED` the seed.
//! Run with `--nocapture` to see the executions and the error kinds met.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cera_web::gguf::{
    Event, GgmlType, GgufError, GgufHeader, GgufParser, GgufWriter, MetaArray, MetaValue,
    TensorInfo, ValueType,
};

// ---- Per-thread allocation accounting (this test binary only) ----
// In the browser the library's own allocator counts (a wasm module has one thread and one
// global allocator).

#[cfg(not(target_arch = "wasm32"))]
mod heap {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// Counts live heap bytes per thread, so a parse can be checked for absurd allocations while
    /// other test threads run. `const` thread-locals without destructors never allocate themselves.
    struct Counting;

    thread_local! {
        static LIVE: Cell<usize> = const { Cell::new(0) };
        static PEAK: Cell<usize> = const { Cell::new(0) };
    }

    fn add(n: usize) {
        let _ = LIVE.try_with(|l| {
            let v = l.get().saturating_add(n);
            l.set(v);
            let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
        });
    }

    fn sub(n: usize) {
        let _ = LIVE.try_with(|l| l.set(l.get().saturating_sub(n)));
    }

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            add(layout.size());
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            sub(layout.size());
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            add(layout.size());
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            add(new_size);
            sub(layout.size());
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static ALLOC: Counting = Counting;

    /// Reset the peak to the current live bytes; returns the current live bytes.
    pub fn mark() -> usize {
        let live = LIVE.with(Cell::get);
        PEAK.with(|p| p.set(live));
        live
    }

    pub fn peak() -> usize {
        PEAK.with(Cell::get)
    }
}

#[cfg(target_arch = "wasm32")]
mod heap {
    pub use cera_web::web::heap::{mark_peak as mark, peak_bytes as peak};
}

use heap::{mark, peak};

// ---- A tiny seeded RNG (xorshift64*) ----

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform-ish in `0..n` (n > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

// ---- Inputs ----

fn base_files() -> Vec<Vec<u8>> {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", "llama")
        .meta("general.alignment", 64u32)
        .meta("llama.context_length", 4096u32)
        .meta("a.u8", 1u8)
        .meta("a.i8", -1i8)
        .meta("a.u16", 2u16)
        .meta("a.i16", -2i16)
        .meta("a.i32", -3i32)
        .meta("a.f32", 0.5f32)
        .meta("a.bool", false)
        .meta("a.u64", 1u64 << 40)
        .meta("a.i64", -4i64)
        .meta("a.f64", 0.25f64)
        .meta(
            "tokenizer.ggml.tokens",
            vec!["<unk>", "<s>", "</s>", "hello", "▁world"],
        )
        .meta(
            "tokenizer.ggml.scores",
            vec![0.0f32, -1.0, -2.0, -3.0, -4.0],
        )
        .meta(
            "a.nested",
            vec![
                MetaArray::I16(vec![1, -1]),
                MetaArray::empty(ValueType::F64),
                MetaArray::Array(vec![MetaArray::String(vec!["x".into()])]),
            ],
        );
    w.tensor_f32("token_embd.weight", &[3, 5], &[0.5; 15]);
    w.tensor(
        "blk.0.attn_q.weight",
        &[32, 3],
        GgmlType::Q8_0,
        vec![7u8; 3 * 34],
    );
    w.tensor("blk.0.ffn_up.weight", &[256], GgmlType::Q6K, vec![9u8; 210]);
    w.tensor("output_norm.weight", &[5], GgmlType::F16, vec![1u8; 10]);
    let mut small = GgufWriter::new().with_version(2);
    small
        .meta("general.name", MetaValue::String("tiny".into()))
        .tensor_f32("x", &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    vec![w.to_bytes(), small.to_bytes()]
}

/// Numbers that stress count and length fields.
const BIG: [u64; 10] = [
    1 << 60,
    u64::MAX,
    u64::MAX - 31,
    1 << 32,
    (1 << 28) + 1,
    (1 << 24) + 1,
    (1 << 20) + 1,
    1 << 27,
    13,
    0,
];

fn mutate(rng: &mut Rng, f: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 if !f.is_empty() => {
                let i = rng.below(f.len());
                f[i] ^= 1 << rng.below(8);
            }
            1 if !f.is_empty() => {
                let i = rng.below(f.len());
                f[i] = rng.next() as u8;
            }
            2 => f.truncate(rng.below(f.len() + 1)),
            3 => {
                let at = rng.below(f.len() + 1);
                let n = 1 + rng.below(16);
                let ins: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                f.splice(at..at, ins);
            }
            4 if !f.is_empty() => {
                let at = rng.below(f.len());
                let n = (1 + rng.below(16)).min(f.len() - at);
                f.drain(at..at + n);
            }
            5 => {
                // A large number over a count: the fixed fields, or anywhere in the header.
                let v = if rng.chance(4) {
                    rng.next()
                } else {
                    BIG[rng.below(BIG.len())]
                };
                let at = match rng.below(3) {
                    0 => 8,
                    1 => 16,
                    _ => rng.below(f.len().min(1024)),
                };
                let bytes = v.to_le_bytes();
                let n = if rng.chance(2) { 8 } else { 4 };
                if at + n <= f.len() {
                    f[at..at + n].copy_from_slice(&bytes[..n]);
                }
            }
            _ => {
                // A u32 field: type ids, dims count.
                let v: u32 = [5, 13, 99, 0xffff_ffff, 4, 0x0300_0000][rng.below(6)];
                let at = rng.below(f.len().min(1024) + 1);
                if at + 4 <= f.len() {
                    f[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}

/// What a parse produced, for comparing chunkings.
#[derive(Debug, PartialEq)]
enum Outcome {
    Ok {
        header: Option<Canon>,
        data: Vec<Vec<u8>>,
    },
    Err(GgufError),
}

/// A header in comparable form: metadata re-encoded to bytes, so NaNs compare bit-exactly.
#[derive(Debug, PartialEq)]
struct Canon {
    version: u32,
    alignment: u64,
    data_offset: u64,
    tensors: Vec<TensorInfo>,
    metadata: Vec<u8>,
}

fn canon(h: &GgufHeader) -> Canon {
    let mut w = GgufWriter::new();
    for (k, v) in h.metadata() {
        w.meta(k.clone(), v.clone());
    }
    Canon {
        version: h.version(),
        alignment: h.alignment(),
        data_offset: h.data_offset(),
        tensors: h.tensors().to_vec(),
        metadata: w.to_bytes(),
    }
}

/// Parse `f` in chunks drawn from `chunks`; checks the event contract and memory on the way.
fn run(f: &[u8], total: Option<u64>, chunk_size: &mut dyn FnMut() -> usize) -> Outcome {
    let base = mark();
    let mut p = GgufParser::new();
    if let Some(t) = total {
        p = p.with_total_size(t);
    }
    let mut header: Option<Arc<GgufHeader>> = None;
    let mut data: Vec<Vec<u8>> = Vec::new();
    let mut fed = 0usize;
    let mut rest = f;
    let r = loop {
        if rest.is_empty() {
            break p.finish();
        }
        let n = chunk_size().clamp(1, rest.len());
        let (c, tail) = rest.split_at(n);
        rest = tail;
        fed += n;
        let r = p.push(c, &mut |e| {
            match e {
                Event::Header(h) => {
                    assert!(header.is_none(), "second Header event");
                    data = vec![Vec::new(); h.tensors().len()];
                    header = Some(h);
                }
                Event::TensorData {
                    tensor,
                    offset,
                    bytes,
                } => {
                    let t = &header.as_ref().expect("data before header").tensors()[tensor];
                    assert_eq!(
                        offset,
                        data[tensor].len() as u64,
                        "pieces of `{}` not contiguous",
                        t.name
                    );
                    assert!(
                        offset + bytes.len() as u64 <= t.size,
                        "data past the end of `{}`",
                        t.name
                    );
                    data[tensor].extend_from_slice(bytes);
                }
                Event::TensorDone { tensor } => {
                    let t = &header.as_ref().expect("done before header").tensors()[tensor];
                    assert_eq!(data[tensor].len() as u64, t.size, "`{}` done early", t.name);
                }
            }
            Ok(())
        });
        // The parser never holds more than it was given, and everything it holds (header and
        // step buffer alike) stays proportional to the bytes seen: a count of 2^60 allocates nothing.
        assert!(
            p.buffered_bytes() <= fed.max(64) * 2,
            "buffered {} after {fed} bytes",
            p.buffered_bytes()
        );
        let grown = peak().saturating_sub(base);
        assert!(
            grown <= 64 * fed + (64 << 10),
            "allocated {grown} bytes after {fed} bytes of input"
        );
        if let Err(e) = r {
            break Err(e);
        }
    };
    match r {
        Ok(()) => Outcome::Ok {
            header: header.as_deref().map(canon),
            data,
        },
        Err(e) => Outcome::Err(e),
    }
}

fn kind(o: &Outcome) -> String {
    match o {
        Outcome::Ok { .. } => "Ok".into(),
        Outcome::Err(e) => {
            let d = format!("{e:?}");
            d.split([' ', '{', '('])
                .next()
                .unwrap_or_default()
                .to_owned()
        }
    }
}

#[test]
fn fuzz_mutated_files() {
    let iters: usize = std::env::var("CERA_FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let seed: u64 = std::env::var("CERA_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_cafe_f00d_d00d);
    let bases = base_files();
    let mut rng = Rng(seed | 1);
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for it in 0..iters {
        let mut f = bases[rng.below(bases.len())].clone();
        if !rng.chance(50) {
            mutate(&mut rng, &mut f);
        }
        let total = rng.chance(2).then_some(f.len() as u64);
        let max_chunk = [1, 7, 64, 4096, f.len().max(1)][rng.below(5)];
        let mut chunk_rng = Rng(rng.next() | 1);
        let result = catch_unwind(AssertUnwindSafe(|| {
            let whole = run(&f, total, &mut || usize::MAX);
            let chunked = run(&f, total, &mut || 1 + chunk_rng.below(max_chunk));
            assert_eq!(whole, chunked, "result depends on chunking");
            whole
        }));
        match result {
            Ok(o) => *kinds.entry(kind(&o)).or_default() += 1,
            Err(panic) => {
                let path = std::env::temp_dir().join(format!("gguf_fuzz_fail_{it}.gguf"));
                let _ = std::fs::write(&path, &f);
                eprintln!("iteration {it} (seed {seed}, total {total:?}, max chunk {max_chunk}) panicked; input in {}", path.display());
                std::panic::resume_unwind(panic);
            }
        }
    }
    println!("gguf fuzz: {iters} executions (x2 chunkings), seed {seed:#x}");
    for (k, n) in &kinds {
        println!("  {k:>24}: {n}");
    }
    assert_eq!(kinds.values().sum::<usize>(), iters);
}
