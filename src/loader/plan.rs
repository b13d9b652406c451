//! The GPU memory plan of a model for a device: per tensor its GPU layout and row-range parts.

use std::collections::BTreeMap;

use crate::error::{Error, ErrorCode, Result};
use crate::gguf::{GgmlType, GgufHeader};
use crate::gpu::tensor::plan_parts;
use crate::quant::gpu::gpu_row_bytes;

#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedTensor {
    pub name: String,
    #[serde(serialize_with = "ser_ty")]
    pub ty: GgmlType,
    pub cols: u64,
    pub rows: u64,
    /// Bytes in the file.
    pub file_bytes: u64,
    /// Bytes of one row in the GPU layout.
    pub row_bytes: u64,
    /// `(first row, rows)` of each buffer.
    pub parts: Vec<(u64, u64)>,
}

fn ser_ty<S: serde::Serializer>(t: &GgmlType, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(t.name())
}

#[derive(Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryPlan {
    pub max_binding: u64,
    pub tensors: Vec<PlannedTensor>,
    /// File bytes per quant type name (`q8_0`, ...).
    pub file_bytes_per_type: BTreeMap<String, u64>,
    /// GPU bytes per quant type name.
    pub gpu_bytes_per_type: BTreeMap<String, u64>,
    pub buffers: usize,
    pub split_tensors: usize,
    pub total_gpu_bytes: u64,
}

/// Plan every tensor of `header` for bindings of at most `max_binding` bytes.
pub fn plan(header: &GgufHeader, max_binding: u64) -> Result<MemoryPlan> {
    crate::gguf::check_gpu_supported(header).map_err(super::gguf_error)?;
    let mut p = MemoryPlan { max_binding, ..Default::default() };
    for t in header.tensors() {
        let cols = t.dims.first().copied().unwrap_or(1);
        let rows = t.n_rows();
        let row_bytes = gpu_row_bytes(t.ty, cols);
        let parts = plan_parts(rows, row_bytes, max_binding).map_err(|e| {
            Error::new(ErrorCode::AdapterTooSmall, format!("tensor {}: {e}; this adapter cannot hold the model", t.name))
        })?;
        if parts.len() > 1 {
            p.split_tensors += 1;
        }
        p.buffers += parts.len();
        let gpu = rows * row_bytes;
        p.total_gpu_bytes += gpu;
        *p.file_bytes_per_type.entry(t.ty.name().to_string()).or_default() += t.size;
        *p.gpu_bytes_per_type.entry(t.ty.name().to_string()).or_default() += gpu;
        p.tensors.push(PlannedTensor {
            name: t.name.clone(),
            ty: t.ty,
            cols,
            rows,
            file_bytes: t.size,
            row_bytes,
            parts,
        });
    }
    Ok(p)
}
