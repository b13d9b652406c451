//! The parsed GGUF header: metadata in file order, the tensor table, alignment and data offset.

use std::collections::HashMap;
use std::ops::Range;

use super::error::GgufError;
use super::types::GgmlType;
use super::value::{MetaArray, MetaValue};

/// Alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// One record of the tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// `dims[0]` (ggml's `ne[0]`) is the row length, the fastest-varying dimension.
    pub dims: Vec<u64>,
    /// The type id as stored in the file (always one [`GgmlType::from_id`] knows).
    pub type_id: u32,
    pub ty: GgmlType,
    /// Offset of the first byte, relative to the start of the tensor data section.
    pub offset: u64,
    /// Bytes of data, from `dims` and the type's block geometry.
    pub size: u64,
    pub n_elements: u64,
}

impl TensorInfo {
    /// Rows of `dims[0]` elements (the product of the other dims).
    pub fn n_rows(&self) -> u64 {
        // Cannot overflow: n_elements (the full product) was checked when parsing.
        self.dims.iter().skip(1).product()
    }
}

/// Everything before the tensor data. Built once by the parser and shared as `Arc<GgufHeader>`.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufHeader {
    pub(crate) version: u32,
    pub(crate) metadata: Vec<(String, MetaValue)>,
    pub(crate) meta_index: HashMap<String, usize>,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) tensor_index: HashMap<String, usize>,
    pub(crate) alignment: u64,
    pub(crate) data_offset: u64,
}

impl GgufHeader {
    /// A header with nothing in it yet, for the parser to fill.
    pub(crate) fn empty() -> Self {
        GgufHeader {
            version: 0,
            metadata: Vec::new(),
            meta_index: HashMap::new(),
            tensors: Vec::new(),
            tensor_index: HashMap::new(),
            alignment: DEFAULT_ALIGNMENT,
            data_offset: 0,
        }
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Metadata entries in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The tensor table in file order (indices match `Event::TensorData::tensor`).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Alignment of the data section and of every tensor offset (a power of two).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Absolute file byte range of tensor `index` (what a file reader would seek to).
    pub fn tensor_range(&self, index: usize) -> Option<Range<u64>> {
        let t = self.tensors.get(index)?;
        // Checked to fit in u64 when the header was validated.
        let start = self.data_offset + t.offset;
        Some(start..start + t.size)
    }

    /// Absolute end of the last tensor's data: the least file size that holds every tensor.
    pub fn data_end(&self) -> u64 {
        (0..self.tensors.len())
            .filter_map(|i| self.tensor_range(i))
            .map(|r| r.end)
            .max()
            .unwrap_or(self.data_offset)
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        let i = *self.meta_index.get(key)?;
        self.metadata.get(i).map(|(_, v)| v)
    }

    /// Any unsigned integer type, widened.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// Any unsigned integer type whose value fits in u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get_u64(key)?.try_into().ok()
    }

    /// An f32, or an f64 narrowed to f32.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        match *self.get(key)? {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match *self.get(key)? {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    pub fn get_array(&self, key: &str) -> Option<&MetaArray> {
        self.get(key)?.as_array()
    }

    pub fn get_str_array(&self, key: &str) -> Option<&[String]> {
        match self.get_array(key)? {
            MetaArray::String(v) => Some(v),
            _ => None,
        }
    }

    /// `general.architecture` (`llama`, `qwen2`, ...), the prefix of the model's own keys.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(self.tensor_index(name)?)
    }

    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        self.tensor_index.get(name).copied()
    }
}

/// Fail on the first tensor (in table order) whose type the GPU path cannot run.
pub fn check_gpu_supported(header: &GgufHeader) -> Result<(), GgufError> {
    match header.tensors.iter().find(|t| !t.ty.gpu_supported()) {
        Some(t) => Err(GgufError::UnsupportedTensorType {
            tensor: t.name.clone(),
            ty: t.ty,
        }),
        None => Ok(()),
    }
}
