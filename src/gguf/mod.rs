//! Streaming GGUF parser: bytes in any chunking -> header, tensor table, tensor byte ranges (issue 3).

mod types;
pub use types::GgmlType;
