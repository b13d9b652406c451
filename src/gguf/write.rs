//! A small GGUF v3 writer, for tests and synthetic models: metadata + tensors -> file bytes.
//!
//! It writes what it is given without judging it (a raw type id, data of the wrong length, an
//! odd alignment), so tests can also build the malformed files the parser must reject.

use super::header::DEFAULT_ALIGNMENT;
use super::parse::GGUF_MAGIC;
use super::types::GgmlType;
use super::value::{MetaArray, MetaValue};

struct WTensor {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    data: Vec<u8>,
    /// Replaces the computed offset in the tensor record (the data is still placed normally).
    offset_override: Option<u64>,
}

/// Builds a GGUF file in memory.
///
/// ```
/// use cera_web::gguf::{GgmlType, GgufWriter};
/// let mut w = GgufWriter::new();
/// w.meta("general.architecture", "llama");
/// w.tensor_f32("output_norm.weight", &[4], &[1.0, 1.0, 1.0, 1.0]);
/// let bytes = w.to_bytes();
/// # let _ = GgmlType::F32;
/// ```
pub struct GgufWriter {
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<WTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// A GGUF v3 writer.
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Write another version number (v2 has the same layout; others are for negative tests).
    pub fn with_version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// Append a metadata entry (in order; a repeated key is written twice).
    /// `general.alignment` (an unsigned int, power of two) also sets the data alignment.
    pub fn meta(&mut self, key: impl Into<String>, value: impl Into<MetaValue>) -> &mut Self {
        self.metadata.push((key.into(), value.into()));
        self
    }

    /// Append a tensor; `data` is its raw bytes in the type's block format.
    pub fn tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: impl Into<Vec<u8>>,
    ) -> &mut Self {
        self.tensor_raw(name, dims, ty.id(), data)
    }

    /// Append an f32 tensor from values.
    pub fn tensor_f32(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        values: &[f32],
    ) -> &mut Self {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor_raw(name, dims, GgmlType::F32.id(), data)
    }

    /// Append a tensor with any type id, known to ggml or not.
    pub fn tensor_raw(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        type_id: u32,
        data: impl Into<Vec<u8>>,
    ) -> &mut Self {
        self.tensors.push(WTensor {
            name: name.into(),
            dims: dims.to_vec(),
            type_id,
            data: data.into(),
            offset_override: None,
        });
        self
    }

    /// Record `offset` for tensor `index` instead of where its data really goes (negative tests).
    pub fn override_offset(&mut self, index: usize, offset: u64) -> &mut Self {
        if let Some(t) = self.tensors.get_mut(index) {
            t.offset_override = Some(offset);
        }
        self
    }

    /// The alignment the file will use: a valid `general.alignment`, else 32.
    pub fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .filter(|a| a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Data offsets (relative to the data section) the tensors are placed at, each aligned.
    pub fn offsets(&self) -> Vec<u64> {
        let align = self.alignment();
        let mut at = 0u64;
        self.tensors
            .iter()
            .map(|t| {
                let o = at;
                at = (o + t.data.len() as u64).next_multiple_of(align);
                o
            })
            .collect()
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&v.value_type().id().to_le_bytes());
            put_value(&mut out, v);
        }
        let offsets = self.offsets();
        for (t, &o) in self.tensors.iter().zip(&offsets) {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.type_id.to_le_bytes());
            out.extend_from_slice(&t.offset_override.unwrap_or(o).to_le_bytes());
        }
        let align = self.alignment() as usize;
        out.resize(out.len().next_multiple_of(align), 0);
        let data_start = out.len();
        for (t, &o) in self.tensors.iter().zip(&offsets) {
            out.resize(data_start + o as usize, 0);
            out.extend_from_slice(&t.data);
        }
        // Pad the end like llama.cpp does, so a reader may map whole aligned blocks.
        out.resize(out.len().next_multiple_of(align), 0);
        out
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The value's payload, without its type id (arrays carry their element type inside).
fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::Array(a) => put_array(out, a),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &MetaArray) {
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    for i in 0..a.len() {
        if let Some(v) = a.get(i) {
            put_value(out, &v);
        }
    }
}
