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
    cera_web::gpu::GpuContext::new(&Default::default()).await.expect("a GPU adapter (lavapipe natively, SwiftShader in Chrome)")
}
