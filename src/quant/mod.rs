//! GGUF quant block formats and CPU dequantization (see issue 3).
