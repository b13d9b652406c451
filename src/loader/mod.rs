//! Streaming load: GGUF bytes in any chunking -> GPU buffers, with the wasm heap bounded.
//!
//! The loader drives [`crate::gguf::GgufParser`]. On the header it plans every tensor for this
//! device ([`plan`]: GPU layout bytes, parts under the binding limit) and checks each part
//! against the device's buffer size limit. Tensor bytes then pass through one bounded staging
//! area: whole rows are repacked (`crate::quant::gpu::repack_rows`) and written with
//! `queue.write_buffer` at their place. The heap holds the header, at most `staging` bytes of rows
//! and one partial row: never the model.
//!
//! A part's buffer is created when its first row arrives, not at the header: GPU memory follows
//! the bytes received. A header is only a claim (a stream of unknown length can declare a
//! 2^40-element tensor, 32,768 buffers of 128 MiB, then send a few bytes), so nothing is
//! allocated for what has not come.

mod plan;

pub use plan::{fused_name, plan, plan_with, MemoryPlan, PlannedTensor, FUSE_GROUPS};

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{Error, ErrorCode, Result};
use crate::gguf::{Event, GgmlType, GgufError, GgufHeader, GgufParser, TensorInfo};
use crate::gpu::{GpuContext, GpuTensor, TensorPart};
use crate::quant::gpu::repack_rows;
use crate::quant::legacy::widen_to_q8_0;

/// Where a load is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    Header,
    Weights,
    Done,
}

/// Progress of a load, for `onProgress` and the CLI.
#[derive(Clone, Copy, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    pub phase: Phase,
    pub loaded_bytes: u64,
    pub total_bytes: Option<u64>,
    pub tensors_loaded: usize,
    pub tensors_total: usize,
}

/// A model's weights on the GPU, by tensor name, with its header and the plan it was loaded by.
pub struct LoadedModel {
    pub header: Arc<GgufHeader>,
    /// The GPU tensors: the file's, less those fused, plus the fused ones (named by
    /// [`fused_name`]).
    pub tensors: HashMap<String, GpuTensor>,
    /// Each tensor of the file stored as rows of a fused tensor: `(fused tensor, first row)`.
    pub fused: HashMap<String, (String, u64)>,
    pub plan: MemoryPlan,
}

impl LoadedModel {
    /// A GPU tensor by name (a fused tensor by its fused name; see [`LoadedModel::rows_of`]).
    pub fn tensor(&self, name: &str) -> Result<&GpuTensor> {
        self.tensors.get(name).ok_or_else(|| {
            Error::new(
                ErrorCode::BadGguf,
                format!("the model has no tensor {name}"),
            )
        })
    }

    /// Whether the file had tensor `name` (on the GPU alone or fused into another).
    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name) || self.fused.contains_key(name)
    }

    /// Where a tensor of the file lives: the GPU tensor holding it and its first row there (0
    /// unless it was fused).
    pub fn rows_of(&self, name: &str) -> Result<(&GpuTensor, u64)> {
        match self.fused.get(name) {
            Some((f, row)) => Ok((self.tensor(f)?, *row)),
            None => Ok((self.tensor(name)?, 0)),
        }
    }

    /// Destroy every GPU buffer now (dropping does too, later).
    pub fn destroy(&mut self) {
        for t in self.tensors.values() {
            for p in &t.parts {
                p.buffer.destroy();
            }
        }
        self.tensors.clear();
    }
}

/// The default staging area: rows are buffered up to this many bytes before a GPU write.
pub const DEFAULT_STAGING: usize = 4 << 20;

/// Natively, flush queued writes to the GPU every this many bytes, so wgpu's own staging copies
/// stay bounded too.
const SUBMIT_EVERY: u64 = 64 << 20;

/// The tensor currently receiving bytes.
struct Current {
    index: usize,
    /// GGUF bytes of rows not yet written (whole rows plus at most one partial row).
    pending: Vec<u8>,
    /// Next row to write.
    next_row: u64,
}

pub struct StreamLoader<'a> {
    ctx: &'a GpuContext,
    parser: GgufParser,
    staging: usize,
    max_binding: u64,
    total: Option<u64>,
    header: Option<Arc<GgufHeader>>,
    plan: Option<MemoryPlan>,
    tensors: HashMap<String, GpuTensor>,
    fused: HashMap<String, (String, u64)>,
    fuse: bool,
    current: Option<Current>,
    repacked: Vec<u8>,
    /// A widened member's rows before their repack (see `flush`).
    widened: Vec<u8>,
    loaded_bytes: u64,
    tensors_loaded: usize,
    since_submit: u64,
    peak_buffered: usize,
    /// Run on the header before any tensor is planned or written (see
    /// [`StreamLoader::with_header_check`]).
    header_check: Option<HeaderCheck<'a>>,
}

/// A check of the header ([`StreamLoader::with_header_check`]).
pub type HeaderCheck<'a> = Box<dyn FnMut(&GgufHeader) -> Result<()> + 'a>;

impl<'a> StreamLoader<'a> {
    /// A loader onto `ctx`; `total_size` (from Content-Length or the file) enables the range checks.
    pub fn new(ctx: &'a GpuContext, total_size: Option<u64>) -> Self {
        let mut parser = GgufParser::new();
        if let Some(t) = total_size {
            parser = parser.with_total_size(t);
        }
        StreamLoader {
            ctx,
            parser,
            staging: DEFAULT_STAGING,
            max_binding: ctx.limits.max_binding(),
            total: total_size,
            header: None,
            plan: None,
            tensors: HashMap::new(),
            fused: HashMap::new(),
            fuse: true,
            current: None,
            repacked: Vec::new(),
            widened: Vec::new(),
            loaded_bytes: 0,
            tensors_loaded: 0,
            since_submit: 0,
            peak_buffered: 0,
            header_check: None,
        }
    }

    /// Check the header as soon as it is parsed, before any tensor is planned or written: an
    /// error (an unknown architecture, a tokenizer we cannot build) stops the load with nothing
    /// uploaded, even when the chunk that completes the header also carries tensor bytes.
    pub fn with_header_check(mut self, check: impl FnMut(&GgufHeader) -> Result<()> + 'a) -> Self {
        self.header_check = Some(Box::new(check));
        self
    }

    /// Staging area size (at least one row is always held).
    pub fn with_staging(mut self, bytes: usize) -> Self {
        self.staging = bytes.max(1);
        self
    }

    /// Split tensors at `bytes` instead of the device's binding limit (tests of the split path).
    /// Store the projections of [`FUSE_GROUPS`] fused (the default) or each on its own.
    pub fn with_fusion(mut self, fuse: bool) -> Self {
        self.fuse = fuse;
        self
    }

    pub fn with_max_binding(mut self, bytes: u64) -> Self {
        self.max_binding = bytes.min(self.ctx.limits.max_binding()).max(4);
        self
    }

    pub fn progress(&self) -> Progress {
        Progress {
            phase: if self.header.is_none() {
                Phase::Header
            } else if self.parser.is_complete() {
                Phase::Done
            } else {
                Phase::Weights
            },
            loaded_bytes: self.loaded_bytes,
            total_bytes: self.total,
            tensors_loaded: self.tensors_loaded,
            tensors_total: self.header.as_ref().map_or(0, |h| h.tensors().len()),
        }
    }

    /// The most bytes the staging area held at once (for the bounded-heap checks).
    pub fn peak_staging(&self) -> usize {
        self.peak_buffered
    }

    pub fn header(&self) -> Option<&Arc<GgufHeader>> {
        self.header.as_ref()
    }

    /// Feed the next chunk of the file.
    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        self.loaded_bytes += chunk.len() as u64;
        let mut parser = std::mem::take(&mut self.parser);
        let mut failure: Option<Error> = None;
        let r = parser.push(chunk, &mut |ev| {
            let step = match ev {
                Event::Header(h) => self.on_header(h),
                Event::TensorData { tensor, bytes, .. } => self.on_data(tensor, bytes),
                Event::TensorDone { tensor } => self.on_done(tensor),
            };
            step.map_err(|e| {
                let msg = e.message.clone();
                failure = Some(e);
                GgufError::Aborted(msg)
            })
        });
        self.parser = parser;
        match (r, failure) {
            (_, Some(e)) => Err(e),
            (Err(e), None) => Err(gguf_error(e)),
            (Ok(()), None) => Ok(()),
        }
    }

    /// End of input: every tensor must have arrived.
    pub fn finish(mut self) -> Result<LoadedModel> {
        self.parser.finish().map_err(gguf_error)?;
        self.ctx.queue.submit([]);
        self.ctx.check_errors()?;
        let header = self
            .header
            .take()
            .ok_or_else(|| Error::new(ErrorCode::BadGguf, "no GGUF header in the input"))?;
        Ok(LoadedModel {
            header,
            tensors: std::mem::take(&mut self.tensors),
            fused: std::mem::take(&mut self.fused),
            plan: self.plan.take().unwrap_or_default(),
        })
    }

    fn on_header(&mut self, h: Arc<GgufHeader>) -> Result<()> {
        if let Some(check) = self.header_check.as_mut() {
            check(&h)?;
        }
        let plan = plan_with(&h, self.max_binding, self.fuse)?;
        let max = self.ctx.limits.max_buffer_size;
        for pt in &plan.tensors {
            if let Some(into) = &pt.fused_into {
                self.fused.insert(pt.name.clone(), into.clone());
                continue;
            }
            // Refuse now what no buffer of this device can hold (the buffers come with the rows).
            if let Some(&(_, rows)) = pt
                .parts
                .iter()
                .find(|&&(_, rows)| rows * pt.row_bytes > max)
            {
                return Err(Error::new(
                    ErrorCode::AdapterTooSmall,
                    format!(
                        "{} needs {} bytes, above this device's maxBufferSize {max}",
                        pt.name,
                        rows * pt.row_bytes
                    ),
                ));
            }
            let parts = Vec::with_capacity(pt.parts.len());
            self.tensors.insert(
                pt.name.clone(),
                GpuTensor {
                    name: pt.name.clone(),
                    ty: pt.ty,
                    cols: pt.cols,
                    rows: pt.rows,
                    row_bytes: pt.row_bytes,
                    parts,
                },
            );
        }
        self.plan = Some(plan);
        self.header = Some(h);
        Ok(())
    }

    fn info(&self, index: usize) -> Result<&TensorInfo> {
        self.header
            .as_ref()
            .and_then(|h| h.tensors().get(index))
            .ok_or_else(|| Error::internal("tensor data before header"))
    }

    fn on_data(&mut self, index: usize, mut bytes: &[u8]) -> Result<()> {
        if self.current.as_ref().map(|c| c.index) != Some(index) {
            self.current = Some(Current {
                index,
                pending: Vec::new(),
                next_row: 0,
            });
        }
        let info = self.info(index)?.clone();
        let src_row = info
            .ty
            .row_bytes(info.dims[0])
            .ok_or_else(|| Error::internal("row size"))? as usize;
        let batch_rows = (self.staging / src_row.max(1)).max(1);
        let batch = batch_rows * src_row;
        while !bytes.is_empty() {
            let cur = self.current.as_mut().expect("set above");
            let take = (batch - cur.pending.len()).min(bytes.len());
            cur.pending.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            self.peak_buffered = self.peak_buffered.max(cur.pending.len());
            if cur.pending.len() >= batch {
                self.flush(&info, src_row)?;
            }
        }
        Ok(())
    }

    fn on_done(&mut self, index: usize) -> Result<()> {
        let info = self.info(index)?.clone();
        let src_row = info
            .ty
            .row_bytes(info.dims[0])
            .ok_or_else(|| Error::internal("row size"))? as usize;
        if self.current.as_ref().map(|c| c.index) == Some(index) {
            self.flush(&info, src_row)?;
            let cur = self.current.take().expect("checked");
            if !cur.pending.is_empty() || cur.next_row != info.n_rows() {
                return Err(Error::new(
                    ErrorCode::BadGguf,
                    format!("tensor {} ended mid-row", info.name),
                ));
            }
        }
        // A tensor of no rows received none: its (empty) part is made now.
        if info.n_rows() == 0 {
            let (target, _) = self.target(&info.name);
            self.ensure_part(&target, 0)?;
        }
        self.tensors_loaded += 1;
        Ok(())
    }

    /// The GPU tensor that stores a tensor of the file, and the row its rows start at there.
    fn target(&self, name: &str) -> (String, u64) {
        match self.fused.get(name) {
            Some((f, first)) => (f.clone(), *first),
            None => (name.to_string(), 0),
        }
    }

    /// Make the part buffer of GPU tensor `name` that holds `row`, if it does not exist yet. Rows
    /// of one file tensor arrive in order, but a fused tensor's members may come in any order,
    /// so parts are kept sorted by their first row.
    fn ensure_part(&mut self, name: &str, row: u64) -> Result<()> {
        let tensor = self
            .tensors
            .get_mut(name)
            .ok_or_else(|| Error::internal("tensor not planned"))?;
        if tensor.locate(row).is_some()
            || (row == 0 && tensor.rows == 0 && !tensor.parts.is_empty())
        {
            return Ok(());
        }
        let pt = self
            .plan
            .as_ref()
            .and_then(|p| p.tensors.iter().find(|t| t.name == name))
            .ok_or_else(|| Error::internal("tensor not planned"))?;
        let i = pt
            .parts
            .iter()
            .position(|&(start, rows)| {
                (row >= start && row < start + rows) || (rows == 0 && row == start)
            })
            .ok_or_else(|| Error::internal("row outside the tensor"))?;
        let (row_start, rows) = pt.parts[i];
        let label = if pt.parts.len() > 1 {
            format!("{}[{i}]", pt.name)
        } else {
            pt.name.clone()
        };
        let buffer = self.ctx.empty_storage(&label, rows * pt.row_bytes)?;
        let at = tensor.parts.partition_point(|p| p.row_start < row_start);
        tensor.parts.insert(
            at,
            TensorPart {
                buffer,
                row_start,
                rows,
            },
        );
        Ok(())
    }

    /// Repack and write every whole row in `pending`.
    fn flush(&mut self, info: &TensorInfo, src_row: usize) -> Result<()> {
        // A fused member's rows go to its place in the fused tensor.
        let (target, base) = self.target(&info.name);
        let cur = self.current.as_mut().expect("flush with a current tensor");
        let whole = cur.pending.len() / src_row.max(1);
        if whole == 0 {
            return Ok(());
        }
        let mut row = cur.next_row;
        let mut done = 0usize;
        while done < whole {
            self.ensure_part(&target, base + row)?;
            let cur = self.current.as_mut().expect("flush with a current tensor");
            let tensor = self
                .tensors
                .get(&target)
                .ok_or_else(|| Error::internal("tensor not planned"))?;
            let (part, local) = tensor
                .locate(base + row)
                .ok_or_else(|| Error::internal("row outside the tensor"))?;
            let n = ((part.rows - local) as usize).min(whole - done);
            let rows = &cur.pending[done * src_row..(done + n) * src_row];
            self.repacked.clear();
            if tensor.ty == info.ty {
                repack_rows(info.ty, info.dims[0], rows, &mut self.repacked)?;
            } else {
                // A member of a fused tensor stored wider (Q5_0 rows in a Q8_0 tensor: the
                // memory plan's `fusion_runs`), the same values in the fused tensor's type.
                self.widened.clear();
                widen_to_q8_0(info.ty, rows, &mut self.widened)?;
                debug_assert_eq!(tensor.ty, GgmlType::Q8_0, "members widen to q8_0 alone");
                repack_rows(
                    GgmlType::Q8_0,
                    info.dims[0],
                    &self.widened,
                    &mut self.repacked,
                )?;
            }
            self.ctx
                .queue
                .write_buffer(&part.buffer, local * tensor.row_bytes, &self.repacked);
            self.since_submit += self.repacked.len() as u64;
            done += n;
            row += n as u64;
        }
        let cur = self.current.as_mut().expect("flush with a current tensor");
        cur.pending.drain(..whole * src_row);
        cur.next_row = row;
        if self.since_submit >= SUBMIT_EVERY {
            self.ctx.queue.submit([]);
            self.since_submit = 0;
        }
        Ok(())
    }
}

/// A load dropped before [`StreamLoader::finish`] (aborted, failed, or cut off) lets its GPU
/// buffers go at once. Natively the rows written so far wait in wgpu's queue until the next
/// submission, and those pending writes hold the tensors' buffers: without a submission here an
/// aborted load kept its buffers (up to the whole model's size) until the device next ran work.
/// (In the browser the engine destroys the device of a failed load, which frees them all.)
impl Drop for StreamLoader<'_> {
    fn drop(&mut self) {
        if !self.tensors.is_empty() {
            self.tensors.clear();
            self.ctx.queue.submit([]);
        }
    }
}

/// GGUF errors as engine errors: an unsupported tensor type is `UNSUPPORTED_QUANT`, the rest
/// `BAD_GGUF`.
pub fn gguf_error(e: GgufError) -> Error {
    match e {
        GgufError::UnsupportedTensorType { .. } => {
            Error::new(ErrorCode::UnsupportedQuant, e.to_string())
        }
        other => Error::new(ErrorCode::BadGguf, format!("malformed GGUF: {other}")),
    }
}

/// Natively: load a file from disk in 1 MiB reads.
#[cfg(not(target_arch = "wasm32"))]
pub fn load_file(ctx: &GpuContext, path: &std::path::Path) -> Result<LoadedModel> {
    load_file_with(ctx, path, |_| Ok(()))
}

/// [`load_file`] with a check of the header before any tensor is written
/// ([`StreamLoader::with_header_check`]).
#[cfg(not(target_arch = "wasm32"))]
pub fn load_file_with(
    ctx: &GpuContext,
    path: &std::path::Path,
    check: impl FnMut(&GgufHeader) -> Result<()>,
) -> Result<LoadedModel> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)
        .map_err(|e| Error::invalid(format!("cannot open {}: {e}", path.display())))?;
    let size = f.metadata().map(|m| m.len()).ok();
    let mut loader = StreamLoader::new(ctx, size).with_header_check(check);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| Error::invalid(format!("reading {}: {e}", path.display())))?;
        if n == 0 {
            break;
        }
        loader.push(&buf[..n])?;
    }
    loader.finish()
}

/// Natively: read only the header of a GGUF file (the parser stops at the first tensor byte).
/// Returns the header and the file size.
#[cfg(not(target_arch = "wasm32"))]
pub fn read_header_file(path: &std::path::Path) -> Result<(Arc<GgufHeader>, u64)> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)
        .map_err(|e| Error::invalid(format!("cannot open {}: {e}", path.display())))?;
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut parser = GgufParser::new().with_total_size(size);
    let mut buf = vec![0u8; 1 << 20];
    let mut header = None;
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| Error::invalid(format!("reading {}: {e}", path.display())))?;
        if n == 0 {
            parser.finish().map_err(gguf_error)?;
            break;
        }
        let r = parser.push(&buf[..n], &mut |ev| match ev {
            Event::Header(h) => {
                header = Some(h);
                Err(GgufError::Aborted("header read".into()))
            }
            _ => Ok(()),
        });
        if header.is_some() {
            break;
        }
        r.map_err(gguf_error)?;
    }
    let h = header.ok_or_else(|| {
        Error::new(
            ErrorCode::BadGguf,
            format!("{}: no GGUF header", path.display()),
        )
    })?;
    Ok((h, size))
}
