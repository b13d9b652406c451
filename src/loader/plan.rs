//! The GPU memory plan of a model for a device: per tensor its GPU layout and row-range parts.

use std::collections::BTreeMap;

use crate::error::{Error, ErrorCode, Result};
use crate::gguf::{GgmlType, GgufHeader};
use crate::gpu::tensor::plan_parts;
use crate::quant::gpu::gpu_row_bytes;
use crate::quant::legacy::widens_to_q8_0;

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
    /// `(first row, rows)` of each buffer (none for a tensor fused into another).
    pub parts: Vec<(u64, u64)>,
    /// A projection stored as rows of a fused tensor: `(fused tensor, its first row there)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fused_into: Option<(String, u64)>,
    /// A fused tensor: its members in row order (empty for a tensor of the file).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
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

/// Projections that read the same input, in the row order a fused tensor stores them: a layer's
/// query, key and value, and its gate and up. Runs of consecutive members with the same type and
/// width are stored as one tensor, so one GEMV computes them all (fewer dispatches per token).
pub const FUSE_GROUPS: [&[&str]; 2] = [
    &["attn_q.weight", "attn_k.weight", "attn_v.weight"],
    &["ffn_gate.weight", "ffn_up.weight"],
];

/// The name of the tensor fusing `members` (full names, in row order).
pub fn fused_name(members: &[String]) -> String {
    members.join("+")
}

/// Plan every tensor of `header` for bindings of at most `max_binding` bytes, fusing the
/// projections of [`FUSE_GROUPS`].
pub fn plan(header: &GgufHeader, max_binding: u64) -> Result<MemoryPlan> {
    plan_with(header, max_binding, true)
}

/// [`plan`], with fusion on or off.
pub fn plan_with(header: &GgufHeader, max_binding: u64, fuse: bool) -> Result<MemoryPlan> {
    crate::gguf::check_gpu_supported(header).map_err(super::gguf_error)?;
    let mut p = MemoryPlan {
        max_binding,
        ..Default::default()
    };
    for t in header.tensors() {
        let cols = t.dims.first().copied().unwrap_or(1);
        *p.file_bytes_per_type
            .entry(t.ty.name().to_string())
            .or_default() += t.size;
        p.tensors.push(PlannedTensor {
            name: t.name.clone(),
            ty: t.ty,
            cols,
            rows: t.n_rows(),
            file_bytes: t.size,
            row_bytes: gpu_row_bytes(t.ty, cols),
            parts: Vec::new(),
            fused_into: None,
            members: Vec::new(),
        });
    }
    if fuse {
        let fused = fusion_runs(&p.tensors);
        for (members, ty) in fused {
            let idx: Vec<usize> = members
                .iter()
                .map(|m| {
                    p.tensors
                        .iter()
                        .position(|t| &t.name == m)
                        .expect("a planned name")
                })
                .collect();
            let first = &p.tensors[idx[0]];
            let name = fused_name(&members);
            let mut t = PlannedTensor {
                name: name.clone(),
                ty,
                cols: first.cols,
                rows: 0,
                file_bytes: 0,
                row_bytes: gpu_row_bytes(ty, first.cols),
                parts: Vec::new(),
                fused_into: None,
                members,
            };
            for &i in &idx {
                p.tensors[i].fused_into = Some((name.clone(), t.rows));
                t.rows += p.tensors[i].rows;
                t.file_bytes += p.tensors[i].file_bytes;
            }
            p.tensors.push(t);
        }
    }
    for t in p.tensors.iter_mut().filter(|t| t.fused_into.is_none()) {
        t.parts = plan_parts(t.rows, t.row_bytes, max_binding).map_err(|e| {
            Error::new(
                ErrorCode::AdapterTooSmall,
                format!("tensor {}: {e}; this adapter cannot hold the model", t.name),
            )
        })?;
        if t.parts.len() > 1 {
            p.split_tensors += 1;
        }
        p.buffers += t.parts.len();
        let gpu = t.rows * t.row_bytes;
        p.total_gpu_bytes += gpu;
        *p.gpu_bytes_per_type
            .entry(t.ty.name().to_string())
            .or_default() += gpu;
    }
    Ok(p)
}

/// The member lists to fuse and the type each fused tensor is stored in: per layer and group of
/// [`FUSE_GROUPS`], a run of two or more consecutive present members of one width, either of one
/// type, or of types that widen to Q8_0 without changing a value (Q4_0, Q5_0 beside a Q8_0
/// member: Gemma 3 270M Q4_K_M's q and k are Q5_0 and v Q8_0, one GEMV instead of two) where
/// the widening adds at most half the run's bytes. Otherwise the runs of one type fuse.
fn fusion_runs(tensors: &[PlannedTensor]) -> Vec<(Vec<String>, GgmlType)> {
    let find = |name: &str| tensors.iter().find(|t| t.name == name);
    let names = |run: &[&PlannedTensor]| run.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    let mut out = Vec::new();
    for t in tensors {
        for group in FUSE_GROUPS {
            let Some(prefix) = t.name.strip_suffix(group[0]) else {
                continue;
            };
            if !prefix.starts_with("blk.") {
                continue;
            }
            // Runs of present members of one width (any types).
            let mut wide: Vec<Vec<&PlannedTensor>> = vec![Vec::new()];
            for m in group.iter().map(|m| find(&format!("{prefix}{m}"))) {
                let run = wide.last_mut().expect("never empty");
                match m {
                    Some(m) if m.row_bytes > 0 && run.last().is_none_or(|l| l.cols == m.cols) => {
                        run.push(m)
                    }
                    m => wide.push(m.filter(|m| m.row_bytes > 0).into_iter().collect()),
                }
            }
            for run in wide.iter().filter(|r| r.len() > 1) {
                if let Some(ty) = widened_type(run) {
                    out.push((names(run), ty));
                    continue;
                }
                // Sub-runs of one type.
                for same in run.chunk_by(|a, b| a.ty == b.ty).filter(|r| r.len() > 1) {
                    out.push((names(same), same[0].ty));
                }
            }
        }
    }
    out
}

/// The one type a run of members of one width is stored in, if there is one: theirs when they
/// share it, else Q8_0 when every member widens to it losslessly, one is Q8_0 already, and the
/// widening adds at most half the run's file bytes.
fn widened_type(run: &[&PlannedTensor]) -> Option<GgmlType> {
    let ty = run[0].ty;
    if run.iter().all(|m| m.ty == ty) {
        return Some(ty);
    }
    let q8 = GgmlType::Q8_0;
    if !run.iter().all(|m| widens_to_q8_0(m.ty)) || !run.iter().any(|m| m.ty == q8) {
        return None;
    }
    let file: u64 = run.iter().map(|m| m.file_bytes).sum();
    let q8_bytes = |m: &PlannedTensor| m.rows * q8.row_bytes(m.cols).unwrap_or(u64::MAX / 4);
    let added: u64 = run
        .iter()
        .map(|m| q8_bytes(m).saturating_sub(m.file_bytes))
        .sum();
    (2 * added <= file).then_some(q8)
}
