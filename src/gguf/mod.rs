//! Streaming GGUF parser: bytes in any chunking -> header, tensor table, tensor byte ranges.
//!
//! - [`GgufParser`] takes chunks (from a fetch stream or a file reader) and emits [`Event`]s:
//!   the [`GgufHeader`] once, then each tensor's bytes in file order, borrowed from the chunk.
//! - [`GgufWriter`] builds GGUF v3 files in memory for tests and synthetic models.

mod error;
mod header;
mod parse;
mod steps;
mod types;
mod value;
mod write;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_malformed;

pub use error::{GgufError, Section};
pub use header::{check_gpu_supported, GgufHeader, TensorInfo, DEFAULT_ALIGNMENT};
pub use parse::{parse_bytes, Event, GgufParser, ParseLimits, GGUF_MAGIC};
pub use types::GgmlType;
pub use value::{MetaArray, MetaValue, ValueType};
pub use write::GgufWriter;
