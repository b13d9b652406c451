//! Every file in `shaders/`, embedded at compile time so the wasm build reads no files.
//!
//! Adding a shader: put it in `shaders/`, add a line here, and list its variants in its op's
//! `VARIANTS` so the naga test compiles every one.

/// `(file name, source)` for each shader and template.
pub const FILES: &[(&str, &str)] = &[
    (
        "common_decls.tmpl",
        include_str!("../../shaders/common_decls.tmpl"),
    ),
    (
        "quant_words.tmpl",
        include_str!("../../shaders/quant_words.tmpl"),
    ),
    (
        "quant_decls.tmpl",
        include_str!("../../shaders/quant_decls.tmpl"),
    ),
    (
        "rope_decls.tmpl",
        include_str!("../../shaders/rope_decls.tmpl"),
    ),
    (
        "split_decls.tmpl",
        include_str!("../../shaders/split_decls.tmpl"),
    ),
    (
        "wg_sum_decls.tmpl",
        include_str!("../../shaders/wg_sum_decls.tmpl"),
    ),
    (
        "gemm_decls.tmpl",
        include_str!("../../shaders/gemm_decls.tmpl"),
    ),
    (
        "act_decls.tmpl",
        include_str!("../../shaders/act_decls.tmpl"),
    ),
    ("argmax.wgsl", include_str!("../../shaders/argmax.wgsl")),
    ("kv_shift.wgsl", include_str!("../../shaders/kv_shift.wgsl")),
    ("matmul.wgsl", include_str!("../../shaders/matmul.wgsl")),
    ("gemm.wgsl", include_str!("../../shaders/gemm.wgsl")),
    ("gemm_q8.wgsl", include_str!("../../shaders/gemm_q8.wgsl")),
    (
        "gemm_coop.wgsl",
        include_str!("../../shaders/gemm_coop.wgsl"),
    ),
    (
        "quantize_x8.wgsl",
        include_str!("../../shaders/quantize_x8.wgsl"),
    ),
    ("penalty.wgsl", include_str!("../../shaders/penalty.wgsl")),
    ("mask.wgsl", include_str!("../../shaders/mask.wgsl")),
    ("topk.wgsl", include_str!("../../shaders/topk.wgsl")),
    ("embed.wgsl", include_str!("../../shaders/embed.wgsl")),
    ("rmsnorm.wgsl", include_str!("../../shaders/rmsnorm.wgsl")),
    ("rope.wgsl", include_str!("../../shaders/rope.wgsl")),
    ("qk_rope.wgsl", include_str!("../../shaders/qk_rope.wgsl")),
    ("glu.wgsl", include_str!("../../shaders/glu.wgsl")),
    (
        "short_conv.wgsl",
        include_str!("../../shaders/short_conv.wgsl"),
    ),
    ("ssm_conv.wgsl", include_str!("../../shaders/ssm_conv.wgsl")),
    (
        "gated_delta_decls.tmpl",
        include_str!("../../shaders/gated_delta_decls.tmpl"),
    ),
    (
        "gated_delta.wgsl",
        include_str!("../../shaders/gated_delta.wgsl"),
    ),
    (
        "gated_delta_chunked.wgsl",
        include_str!("../../shaders/gated_delta_chunked.wgsl"),
    ),
    ("softcap.wgsl", include_str!("../../shaders/softcap.wgsl")),
    (
        "elementwise.wgsl",
        include_str!("../../shaders/elementwise.wgsl"),
    ),
    (
        "attention.wgsl",
        include_str!("../../shaders/attention.wgsl"),
    ),
    (
        "attention_split.wgsl",
        include_str!("../../shaders/attention_split.wgsl"),
    ),
    (
        "bench_copy.wgsl",
        include_str!("../../shaders/bench_copy.wgsl"),
    ),
];

/// The source of a shader or template by file name.
pub fn source(name: &str) -> Option<&'static str> {
    FILES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// Preprocess a shader from the embedded set under `(name, value)` defines, owned as pipeline
/// keys and variants hold them.
pub fn expand(
    name: &str,
    defines: &[(String, String)],
) -> crate::error::Result<super::preprocess::Preprocessed> {
    let pairs: Vec<(&str, &str)> = defines
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    super::preprocess::preprocess(name, &pairs, &source)
}
