//! Streaming GGUF parser (see issue 3).
