//! cera-web: GGUF language models on the GPU through WebGPU, natively (wgpu) and in the browser.
//!
//! Module map (each arrow in the data flow is one module):
//! - [`gguf`]: streaming GGUF parser, bytes -> header and tensor table (no GPU).
//! - [`quant`]: GGUF block formats, CPU dequantization reference.
//! - [`gpu`]: context, limits, preprocessor, pipeline cache, dispatch grid, readback.
//! - [`ops`]: one kernel family per file, each with its CPU reference.
//! - [`loader`]: streaming load, GGUF bytes -> GPU buffers (split at the binding limit).
//! - [`kv`]: the KV cache and its context shift.
//! - [`rope`]: RoPE on the CPU, the reference every GPU rope is tested against.
//! - [`selfcheck`]: the kv_shift check the demo page and `cera selfcheck` run.
//! - `web` (wasm32 only): the JS class and functions.

pub mod error;
pub mod generate;
pub mod gguf;
pub mod gpu;
pub mod kv;
pub mod loader;
pub mod model;
pub mod ops;
pub mod quant;
pub mod rope;
pub mod selfcheck;
pub mod tokenizer;

#[cfg(target_arch = "wasm32")]
pub mod web;

pub use error::{Error, ErrorCode, Result};

// Unit tests marked `wasm_bindgen_test` run in the browser, not in Node.
#[cfg(all(test, target_arch = "wasm32"))]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);
