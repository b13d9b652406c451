//! GPU kernels: one file per kernel family, each holding its params struct, pipeline key,
//! encode function and the list of variants the naga test compiles.

pub mod argmax;
pub mod attention;
pub mod attention_split;
pub mod elementwise;
pub mod embed;
pub mod gated_delta;
pub mod gated_delta_chunked;
pub mod gemm;
pub mod gemm_coop;
pub mod gemm_q8;
pub mod glu;
pub mod kv_shift;
pub mod mask;
pub mod matmul;
pub mod matmul_bench;
pub mod penalty;
pub mod qk_rope;
pub mod quantize_x8;
pub mod rmsnorm;
pub mod rope;
pub mod short_conv;
pub mod softcap;
pub mod ssm_conv;
pub mod topk;

/// A `#[repr(C)]` params struct that a WGSL struct of the same name mirrors.
///
/// `FIELDS` lists `(name, byte offset)` in order; a test compares it, and `size_of`, with the
/// struct naga parses from the shader, so the Rust struct is the single source of truth.
pub trait WgslParams: bytemuck::Pod {
    const WGSL_NAME: &'static str;
    const FIELDS: &'static [(&'static str, usize)];
    /// The shader that declares the struct.
    const SHADER: &'static str;
}

/// One shader variant: file, entry point and defines.
pub struct Variant {
    pub shader: &'static str,
    pub entry: &'static str,
    pub defines: Vec<(String, String)>,
}

impl Variant {
    /// The shader's WGSL under this variant's defines.
    pub fn expand(&self) -> crate::error::Result<crate::gpu::preprocess::Preprocessed> {
        crate::gpu::shaders::expand(self.shader, &self.defines)
    }

    /// The variant's name in a test's messages: shader file and defines.
    pub fn label(&self) -> String {
        format!("{} {:?}", self.shader, self.defines)
    }
}

/// The variant a pipeline key builds. `unbounded_loops` is left behind: it only changes the
/// runtime checks the module is compiled with, not the WGSL the validation test parses.
impl From<crate::gpu::pipeline::PipelineKey> for Variant {
    fn from(key: crate::gpu::pipeline::PipelineKey) -> Self {
        Variant {
            shader: key.shader,
            entry: key.entry,
            defines: key.defines,
        }
    }
}

/// Every shader variant any op can build, for the naga validation test.
pub fn all_variants() -> Vec<Variant> {
    let mut v = Vec::new();
    v.extend(kv_shift::variants());
    v.extend(matmul::variants());
    v.extend(gemm::variants());
    v.extend(gemm_q8::variants());
    v.extend(gemm_coop::variants());
    v.extend(quantize_x8::variants());
    v.extend(matmul_bench::variants());
    v.extend(argmax::variants());
    v.extend(topk::variants());
    v.extend(penalty::variants());
    v.extend(mask::variants());
    v.extend(embed::variants());
    v.extend(rmsnorm::variants());
    v.extend(rope::variants());
    v.extend(qk_rope::variants());
    v.extend(glu::variants());
    v.extend(elementwise::variants());
    v.extend(attention::variants());
    v.extend(attention_split::variants());
    v.extend(short_conv::variants());
    v.extend(ssm_conv::variants());
    v.extend(gated_delta::variants());
    v.extend(gated_delta_chunked::variants());
    v.extend(softcap::variants());
    v
}

/// `(wgsl name, fields, size, shader)` of one params struct.
pub type ParamsLayout = (
    &'static str,
    &'static [(&'static str, usize)],
    usize,
    &'static str,
);

/// The layout of every params struct, for the layout test.
pub fn all_params() -> Vec<ParamsLayout> {
    fn entry<T: WgslParams>() -> ParamsLayout {
        (T::WGSL_NAME, T::FIELDS, std::mem::size_of::<T>(), T::SHADER)
    }
    let mut v = vec![
        entry::<kv_shift::KvShiftParams>(),
        entry::<matmul::MatmulParams>(),
    ];
    v.extend([
        entry::<argmax::ArgmaxParams>(),
        entry::<topk::TopkParams>(),
        entry::<penalty::PenaltyParams>(),
    ]);
    v.push(entry::<mask::MaskParams>());
    v.extend([
        entry::<embed::EmbedParams>(),
        entry::<rmsnorm::RmsNormParams>(),
        entry::<rope::RopeParams>(),
        entry::<qk_rope::QkRopeParams>(),
        entry::<glu::GluParams>(),
        entry::<elementwise::ElementwiseParams>(),
    ]);
    v.push(entry::<attention::AttentionParams>());
    v.push(entry::<attention_split::SplitParams>());
    v.push(entry::<gemm::GemmParams>());
    v.push(entry::<gemm_q8::GemmQ8Params>());
    v.push(entry::<quantize_x8::QuantizeX8Params>());
    v.push(entry::<matmul_bench::BenchCopyParams>());
    v.push(entry::<short_conv::ShortConvParams>());
    v.push(entry::<ssm_conv::SsmConvParams>());
    v.push(entry::<gated_delta::GatedDeltaParams>());
    v.push(entry::<softcap::SoftcapParams>());
    v
}
