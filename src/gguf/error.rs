//! Everything that can be wrong with a GGUF stream, one variant per case, each naming the culprit.

use super::types::GgmlType;
use super::value::ValueType;

/// Where in the file something went wrong; used by truncation, UTF-8 and limit errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Section {
    /// The fixed part: magic, version, tensor and metadata counts.
    Header,
    /// The key (or value type) of metadata entry `index` (0-based).
    MetadataKey { index: u64 },
    /// The value of metadata entry `index`, whose key is known.
    MetadataValue { index: u64, key: String },
    /// The record of tensor `index` in the tensor table.
    TensorInfo { index: u64 },
    /// The bytes of one tensor (or the padding in front of them).
    TensorData { tensor: String },
}

impl std::fmt::Display for Section {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Section::Header => write!(f, "header"),
            Section::MetadataKey { index } => write!(f, "metadata key {index}"),
            Section::MetadataValue { index, key } => write!(f, "metadata value {index} (`{key}`)"),
            Section::TensorInfo { index } => write!(f, "tensor info {index}"),
            Section::TensorData { tensor } => write!(f, "tensor data of tensor `{tensor}`"),
        }
    }
}

/// Errors of the GGUF parser and of [`check_gpu_supported`](super::check_gpu_supported).
///
/// `Clone` so that a failed parser can hand the same error back on every later call.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GgufError {
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },

    #[error("unsupported GGUF version {version} (cera-web reads versions 2 and 3)")]
    UnsupportedVersion { version: u32 },

    #[error("GGUF input ended early, in the {section}")]
    Truncated { section: Section },

    #[error("{section}: {what} {value} exceeds the limit {limit}")]
    LimitExceeded {
        section: Section,
        what: &'static str,
        value: u64,
        limit: u64,
    },

    /// A count or length that cannot fit in what is left of an input of known total size.
    #[error("{section}: {what} {value} needs at least {needed} bytes but only {remaining} remain in the input")]
    ExceedsInput {
        section: Section,
        what: &'static str,
        value: u64,
        needed: u64,
        remaining: u64,
    },

    #[error("{section}: unknown metadata value type {ty}")]
    UnknownValueType { section: Section, ty: u32 },

    #[error("tensor `{tensor}` has unknown ggml type id {id}")]
    UnknownTensorType { tensor: String, id: u32 },

    #[error("tensor `{tensor}` has invalid dims {dims:?}: {reason}")]
    InvalidDims {
        tensor: String,
        dims: Vec<u64>,
        reason: &'static str,
    },

    #[error("tensor `{tensor}` of type {ty}: row length {row} is not a multiple of the block size {block}")]
    RowNotBlockMultiple {
        tensor: String,
        ty: GgmlType,
        row: u64,
        block: u64,
    },

    #[error("tensor `{tensor}`: data at file bytes {start}..{end} lies beyond the input of {total} bytes")]
    TensorOutOfRange {
        tensor: String,
        start: u64,
        end: u64,
        total: u64,
    },

    #[error("tensor `{tensor}`: offset {offset} plus size {size} overflows u64")]
    TensorOffsetOverflow {
        tensor: String,
        offset: u64,
        size: u64,
    },

    #[error("tensor `{tensor}` (data offset {offset}) overlaps tensor `{other}` (ending at {other_end})")]
    TensorOverlap {
        tensor: String,
        offset: u64,
        other: String,
        other_end: u64,
    },

    #[error(
        "tensor `{tensor}`: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    TensorMisaligned {
        tensor: String,
        offset: u64,
        alignment: u64,
    },

    #[error("duplicate tensor name `{name}`")]
    DuplicateTensor { name: String },

    #[error("duplicate metadata key `{key}`")]
    DuplicateKey { key: String },

    #[error("{section}: string is not valid UTF-8")]
    BadUtf8 { section: Section },

    #[error("general.alignment is {value}, which is not a power of two")]
    BadAlignment { value: u64 },

    #[error("metadata `{key}` has type {found}, expected {expected}")]
    WrongMetaType {
        key: String,
        expected: &'static str,
        found: ValueType,
    },

    #[error("tensor `{tensor}` has type {ty} (id {}), which cera-web cannot run on the GPU", ty.id())]
    UnsupportedTensorType { tensor: String, ty: GgmlType },

    /// The event consumer stopped the parse (e.g. a GPU upload failed); the message is theirs.
    #[error("GGUF parse aborted by the consumer: {0}")]
    Aborted(String),
}
