//! Shared by the integration tests: a test body is written once and runs natively (lavapipe)
//! and in headless Chrome (`wasm-pack test --headless --chrome`, WebGPU on SwiftShader).
#![allow(dead_code)]

/// `gpu_test!(name, async { ... })`: a native `#[test]` (blocking on the future) and a
/// `#[wasm_bindgen_test]` with the same body.
#[macro_export]
macro_rules! gpu_test {
    ($name:ident, $body:expr) => {
        #[cfg(not(target_arch = "wasm32"))]
        #[test]
        fn $name() {
            pollster::block_on($body)
        }
        #[cfg(target_arch = "wasm32")]
        #[wasm_bindgen_test::wasm_bindgen_test]
        async fn $name() {
            $body.await
        }
    };
}

/// Log a line natively (stderr) or to the browser console (the wasm test runner shows it).
#[macro_export]
macro_rules! tlog {
    ($($t:tt)*) => {{
        let s = format!($($t)*);
        #[cfg(not(target_arch = "wasm32"))]
        eprintln!("{s}");
        #[cfg(target_arch = "wasm32")]
        wasm_bindgen_test::console_log!("{}", s);
    }};
}

/// A small deterministic RNG (xorshift64*) so tests need no dependency and no seed files.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

pub async fn context() -> cera_web::gpu::GpuContext {
    cera_web::gpu::GpuContext::new(&Default::default())
        .await
        .expect("a GPU adapter (lavapipe natively, SwiftShader in Chrome)")
}

#[cfg(target_arch = "wasm32")]
thread_local! {
    static SHARED: std::cell::RefCell<Option<std::sync::Arc<cera_web::gpu::GpuContext>>> =
        const { std::cell::RefCell::new(None) };
}

/// A GPU context a test may share with the other tests of its file. In Chrome they run one after
/// another in one page, and SwiftShader compiles every pipeline anew on each device (about 2.4 s
/// for one GEMM tile, measured), so one device for the file compiles each kernel variant once
/// (the context's pipeline cache) instead of once per test. Natively the tests run in parallel
/// threads and lavapipe compiles in milliseconds: each gets its own context there. Tests that
/// count the context's buffers, lose its device or provoke its errors take [`context`] instead.
pub async fn shared_context() -> std::sync::Arc<cera_web::gpu::GpuContext> {
    #[cfg(target_arch = "wasm32")]
    if let Some(ctx) = SHARED.with(|s| s.borrow().clone()) {
        return ctx;
    }
    let ctx = std::sync::Arc::new(context().await);
    #[cfg(target_arch = "wasm32")]
    SHARED.with(|s| *s.borrow_mut() = Some(ctx.clone()));
    ctx
}

/// A tiny llama-architecture GGUF made here from a seed, with a SentencePiece vocabulary so a
/// `Session` (which detokenizes) can run it: F32 weights, `n_vocab` 256, `n_embd` 64, 4 heads (2 KV
/// heads) of 16, `n_ff` 128, `n_layer` layers. With one layer every K/V cell depends only on its
/// token and position, so after any number of context shifts the logits must equal a fresh
/// evaluation of the kept tokens (up to f32 rounding): the reference the soak test needs.
/// Token 2 (`</s>`) is the end-of-generation token; with `eog` false its output row is zero, so
/// its logit (0) stays far below the best ones (about +5) and generation runs to its length.
pub fn tiny_llama_gguf(seed: u64, n_layer: u32, eog: bool) -> Vec<u8> {
    use cera_web::gguf::GgufWriter;
    let (n_vocab, n_embd, n_head, n_head_kv, head_dim, n_ff) =
        (256u64, 64u64, 4u64, 2u64, 16u64, 128u64);
    let mut rng = Rng::new(seed);
    let mut w = GgufWriter::new();
    w.meta("general.architecture", "llama");
    w.meta("llama.context_length", 4096u32);
    w.meta("llama.embedding_length", n_embd as u32);
    w.meta("llama.block_count", n_layer);
    w.meta("llama.feed_forward_length", n_ff as u32);
    w.meta("llama.attention.head_count", n_head as u32);
    w.meta("llama.attention.head_count_kv", n_head_kv as u32);
    w.meta("llama.rope.freq_base", 10000f32);
    w.meta("llama.attention.layer_norm_rms_epsilon", 1e-5f32);
    w.meta("tokenizer.ggml.model", "llama");
    let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    tokens.extend((3..n_vocab).map(|i| format!("\u{2581}w{i}")));
    w.meta("tokenizer.ggml.tokens", tokens);
    w.meta(
        "tokenizer.ggml.scores",
        (0..n_vocab).map(|i| -(i as f32)).collect::<Vec<f32>>(),
    );
    w.meta(
        "tokenizer.ggml.token_type",
        (0..n_vocab)
            .map(|i| if i < 3 { 3i32 } else { 1 })
            .collect::<Vec<i32>>(),
    );
    // Matrices N(0, 1/n_in)-sized (uniform of the same scale), so activations stay O(1).
    let mut mat = |w: &mut GgufWriter, name: String, n_in: u64, n_out: u64, scale: f32| {
        let s = scale * (3.0 / n_in as f32).sqrt();
        let v: Vec<f32> = rng
            .vec((n_in * n_out) as usize)
            .into_iter()
            .map(|x| x * s)
            .collect();
        w.tensor_f32(name, &[n_in, n_out], &v);
    };
    mat(&mut w, "token_embd.weight".into(), n_embd, n_vocab, 8.0);
    for l in 0..n_layer {
        w.tensor_f32(
            format!("blk.{l}.attn_norm.weight"),
            &[n_embd],
            &vec![1.0; n_embd as usize],
        );
        mat(
            &mut w,
            format!("blk.{l}.attn_q.weight"),
            n_embd,
            n_head * head_dim,
            1.0,
        );
        mat(
            &mut w,
            format!("blk.{l}.attn_k.weight"),
            n_embd,
            n_head_kv * head_dim,
            1.0,
        );
        mat(
            &mut w,
            format!("blk.{l}.attn_v.weight"),
            n_embd,
            n_head_kv * head_dim,
            1.0,
        );
        mat(
            &mut w,
            format!("blk.{l}.attn_output.weight"),
            n_head * head_dim,
            n_embd,
            1.0,
        );
        w.tensor_f32(
            format!("blk.{l}.ffn_norm.weight"),
            &[n_embd],
            &vec![1.0; n_embd as usize],
        );
        mat(
            &mut w,
            format!("blk.{l}.ffn_gate.weight"),
            n_embd,
            n_ff,
            1.0,
        );
        mat(&mut w, format!("blk.{l}.ffn_up.weight"), n_embd, n_ff, 1.0);
        mat(
            &mut w,
            format!("blk.{l}.ffn_down.weight"),
            n_ff,
            n_embd,
            1.0,
        );
    }
    w.tensor_f32("output_norm.weight", &[n_embd], &vec![1.0; n_embd as usize]);
    let s = 2.0 * (3.0 / n_embd as f32).sqrt();
    let mut out: Vec<f32> = rng
        .vec((n_embd * n_vocab) as usize)
        .into_iter()
        .map(|x| x * s)
        .collect();
    if !eog {
        out[2 * n_embd as usize..3 * n_embd as usize].fill(0.0);
    }
    w.tensor_f32("output.weight", &[n_embd, n_vocab], &out);
    w.to_bytes()
}

/// Load GGUF bytes onto the GPU as the engine does (streamed in 64 KiB pieces).
pub fn load_bytes(
    ctx: &cera_web::gpu::GpuContext,
    bytes: &[u8],
) -> cera_web::error::Result<cera_web::loader::LoadedModel> {
    let mut loader = cera_web::loader::StreamLoader::new(ctx, Some(bytes.len() as u64));
    for chunk in bytes.chunks(64 << 10) {
        loader.push(chunk)?;
    }
    loader.finish()
}

/// Rows of `len` values laid out `stride` apart from element `offset`: where a kernel's test puts
/// a strided input or reads a strided output, as if among a projection's other columns.
#[derive(Clone, Copy, Debug)]
pub struct Strided {
    pub offset: usize,
    pub stride: usize,
    pub len: usize,
}

impl Strided {
    /// Elements from 0 that `rows` rows in this layout span (the buffer to allocate or read).
    pub fn span(self, rows: usize) -> usize {
        self.offset + rows * self.stride
    }

    /// Rows `first .. first + rows` of `packed` (rows of `len`, back to back) in this layout,
    /// zeros around them.
    pub fn scatter(self, packed: &[f32], first: usize, rows: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; self.span(rows)];
        for t in 0..rows {
            let at = self.offset + t * self.stride;
            out[at..at + self.len]
                .copy_from_slice(&packed[(first + t) * self.len..(first + t + 1) * self.len]);
        }
        out
    }

    /// Rows `0 .. rows` of `buf` in this layout, back to back.
    pub fn gather(self, buf: &[f32], rows: usize) -> Vec<f32> {
        (0..rows)
            .flat_map(|t| {
                let at = self.offset + t * self.stride;
                buf[at..at + self.len].iter().copied()
            })
            .collect()
    }
}
