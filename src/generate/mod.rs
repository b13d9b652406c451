//! Generation: what turns logits into tokens and messages into prompts.
//!
//! - [`sampler`]: llama.cpp's sampler chain, with the GPU doing the vocabulary-wide work.
//! - [`session`]: positions, KV cache + automatic context shift, prefill, the decode loop.
//! - [`bench`]: prefill/decode speed and the output head's share.
//! - [`score`]: teacher-forced scoring (top tokens per position).
//! - [`constraint`]: structured output (JSON Schema, Lark, regex, GBNF) as a per-step token mask.
//! - [`chat`]: chat templates (the GGUF's Jinja template, or a built-in one per architecture).
//! - [`open`]: one way to open a model (template, context clamp, defaults) for the CLI and JS.
//! - [`tools`]: tool calls: the call syntax per family, its grammar and its parser.

pub mod bench;
pub mod chat;
pub mod constraint;
pub mod gbnf;
pub mod open;
pub mod sampler;
pub mod score;
pub mod session;
mod template_bounds;
pub mod tools;
