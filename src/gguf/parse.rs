//! The push parser: feed GGUF bytes in chunks of any size, get the header and tensor bytes as events.
//!
//! The header is parsed as a sequence of small atomic *steps* (the fixed prefix, one metadata
//! key, one scalar or one array element, one tensor record). A step either completes on the
//! bytes at hand or reports how many bytes it needs; only then are the bytes of that one
//! unfinished step copied into `buf`. So the parser holds at most one step's worth of bytes
//! (bounded by `ParseLimits::max_string_len`), never the file, and tensor data is never copied:
//! `Event::TensorData` borrows the caller's chunk.

use std::sync::Arc;

use super::error::{GgufError, Section};
use super::header::GgufHeader;
use super::steps::{Frame, State, Stop};
use super::value::ValueType;

/// The GGUF magic, "GGUF" as the first four bytes.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// Sanity bounds on file-controlled counts; anything beyond is rejected before it can make us
/// allocate or loop. Defaults fit every real model (a 256k vocabulary is 2^18 strings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseLimits {
    pub max_metadata: u64,
    pub max_tensors: u64,
    /// Bytes of one string (a key, a value, a tensor name).
    pub max_string_len: u64,
    pub max_array_len: u64,
    /// Arrays within arrays: a top-level array is depth 1.
    pub max_depth: usize,
    pub max_dims: u32,
}

impl Default for ParseLimits {
    fn default() -> Self {
        ParseLimits {
            max_metadata: 1 << 20,
            max_tensors: 1 << 20,
            max_string_len: 1 << 24,
            max_array_len: 1 << 28,
            max_depth: 4,
            max_dims: 4,
        }
    }
}

/// What the parser hands out, in file order.
#[derive(Debug)]
pub enum Event<'a> {
    /// Once, as soon as the tensor table is complete and validated.
    Header(Arc<GgufHeader>),
    /// A piece of tensor `tensor`'s data (an index into `GgufHeader::tensors`), at byte `offset`
    /// within the tensor; borrows the pushed chunk. Pieces of one tensor are contiguous, and
    /// tensors come in the order of their offsets (which need not be table order).
    TensorData {
        tensor: usize,
        offset: u64,
        bytes: &'a [u8],
    },
    /// All bytes of tensor `tensor` have been delivered.
    TensorDone { tensor: usize },
}

/// A drained `buf` larger than this is freed, so one long string does not pin its memory.
const KEEP_BUF_CAPACITY: usize = 1 << 16;

/// The streaming GGUF v2/v3 parser. See the module doc for how it buffers.
#[derive(Debug)]
pub struct GgufParser {
    pub(super) limits: ParseLimits,
    /// Total input size when known (Content-Length, file size): counts must fit in it.
    pub(super) total: Option<u64>,
    pub(super) state: State,
    /// Bytes of the one unfinished header step.
    pub(super) buf: Vec<u8>,
    /// Absolute offset of the first byte not consumed (`buf[0]` when `buf` is non-empty).
    pub(super) pos: u64,
    pub(super) failed: Option<GgufError>,
    pub(super) n_tensors: u64,
    pub(super) n_kv: u64,
    /// The header being built; moved into an `Arc` when complete.
    pub(super) h: GgufHeader,
    pub(super) cur_key: String,
    pub(super) cur_ty: ValueType,
    pub(super) stack: Vec<Frame>,
    pub(super) header: Option<Arc<GgufHeader>>,
    /// Tensor indices sorted by offset, and the next one whose data is awaited.
    pub(super) order: Vec<usize>,
    pub(super) next: usize,
}

impl Default for GgufParser {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufParser {
    pub fn new() -> Self {
        Self::with_limits(ParseLimits::default())
    }

    pub fn with_limits(limits: ParseLimits) -> Self {
        GgufParser {
            limits,
            total: None,
            state: State::Fixed,
            buf: Vec::new(),
            pos: 0,
            failed: None,
            n_tensors: 0,
            n_kv: 0,
            h: GgufHeader::empty(),
            cur_key: String::new(),
            cur_ty: ValueType::U8,
            stack: Vec::new(),
            header: None,
            order: Vec::new(),
            next: 0,
        }
    }

    /// Declare the total input size: counts and tensor ranges that cannot fit are rejected
    /// early instead of waiting for bytes that will never come.
    pub fn with_total_size(mut self, total: u64) -> Self {
        self.total = Some(total);
        self
    }

    /// The header, once `Event::Header` has been emitted.
    pub fn header(&self) -> Option<&Arc<GgufHeader>> {
        self.header.as_ref()
    }

    /// Bytes consumed so far (the absolute offset of the next byte to parse).
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Memory held for an unfinished header step (capacity of the internal buffer).
    pub fn buffered_bytes(&self) -> usize {
        self.buf.capacity()
    }

    /// True once the header and every tensor's data have arrived.
    pub fn is_complete(&self) -> bool {
        self.state == State::Data && self.next >= self.order.len()
    }

    /// Feed the next chunk. Events go to `on`; an error from `on` stops the parse and is
    /// returned. After any error the parser is spent and returns that error again.
    pub fn push(
        &mut self,
        chunk: &[u8],
        on: &mut dyn FnMut(Event<'_>) -> Result<(), GgufError>,
    ) -> Result<(), GgufError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.push_inner(chunk, on);
        if let Err(e) = &r {
            self.failed = Some(e.clone());
            self.buf = Vec::new();
        }
        r
    }

    /// End of input: `Ok` if the header and all tensor data arrived, else `Truncated` naming
    /// the part that was cut off. Bytes after the last tensor are ignored.
    pub fn finish(&mut self) -> Result<(), GgufError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let section = match self.state {
            State::Fixed => Section::Header,
            State::Key { i } => Section::MetadataKey { index: i },
            State::Value { i } => Section::MetadataValue {
                index: i,
                key: self.cur_key.clone(),
            },
            State::TensorInfo { i } => Section::TensorInfo { index: i },
            State::Data => match (self.order.get(self.next), &self.header) {
                (Some(&t), Some(h)) => Section::TensorData {
                    tensor: h.tensors.get(t).map(|t| t.name.clone()).unwrap_or_default(),
                },
                _ => return Ok(()),
            },
        };
        Err(GgufError::Truncated { section })
    }

    fn push_inner(
        &mut self,
        mut rest: &[u8],
        on: &mut dyn FnMut(Event<'_>) -> Result<(), GgufError>,
    ) -> Result<(), GgufError> {
        while self.state != State::Data {
            // Move buf out so a step can borrow it while mutating the parser.
            let buf = std::mem::take(&mut self.buf);
            let buffered = !buf.is_empty();
            let r = self.step(if buffered { &buf } else { rest }, on);
            self.buf = buf;
            match r {
                Ok(n) => {
                    self.pos = self.pos.saturating_add(n as u64);
                    if buffered {
                        self.buf.drain(..n.min(self.buf.len()));
                        if self.buf.is_empty() && self.buf.capacity() > KEEP_BUF_CAPACITY {
                            self.buf = Vec::new();
                        }
                    } else {
                        rest = rest.get(n..).unwrap_or_default();
                    }
                }
                Err(Stop::Err(e)) => return Err(e),
                Err(Stop::Short(need)) if buffered => {
                    // Top up to exactly what the step asked for, never more.
                    let want = need.saturating_sub(self.buf.len());
                    let take = want.min(rest.len());
                    self.buf.extend_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    if take == 0 || take < want {
                        return Ok(());
                    }
                }
                Err(Stop::Short(_)) => {
                    // `rest` is shorter than the step needs, so this copies less than one step.
                    self.buf.extend_from_slice(rest);
                    return Ok(());
                }
            }
        }
        if !self.buf.is_empty() {
            let leftover = std::mem::take(&mut self.buf);
            self.feed_data(&leftover, on)?;
        }
        self.feed_data(rest, on)
    }

    /// Deliver tensor bytes from `rest`, skipping padding; bytes after the last tensor are ignored.
    fn feed_data(
        &mut self,
        mut rest: &[u8],
        on: &mut dyn FnMut(Event<'_>) -> Result<(), GgufError>,
    ) -> Result<(), GgufError> {
        let Some(h) = self.header.clone() else {
            return Ok(());
        };
        while !rest.is_empty() {
            let Some((ti, t)) = self
                .order
                .get(self.next)
                .and_then(|&i| Some((i, h.tensors.get(i)?)))
            else {
                self.pos = self.pos.saturating_add(rest.len() as u64);
                return Ok(());
            };
            let start = h.data_offset.saturating_add(t.offset);
            let end = start.saturating_add(t.size);
            if self.pos < start {
                let skip = (start - self.pos).min(rest.len() as u64) as usize;
                self.pos += skip as u64;
                rest = &rest[skip..];
                continue;
            }
            let n = end.saturating_sub(self.pos).min(rest.len() as u64) as usize;
            let offset = self.pos - start;
            self.pos += n as u64;
            let (piece, tail) = rest.split_at(n);
            rest = tail;
            if n > 0 {
                on(Event::TensorData {
                    tensor: ti,
                    offset,
                    bytes: piece,
                })?;
            }
            if self.pos >= end {
                self.next += 1;
                on(Event::TensorDone { tensor: ti })?;
            }
        }
        Ok(())
    }
}

/// Parse a whole in-memory file; returns the header and a copy of each tensor's bytes (in
/// table order). For tests and small files; large models should stream through `GgufParser`.
pub fn parse_bytes(bytes: &[u8]) -> Result<(Arc<GgufHeader>, Vec<Vec<u8>>), GgufError> {
    let mut header = None;
    let mut data: Vec<Vec<u8>> = Vec::new();
    let mut p = GgufParser::new().with_total_size(bytes.len() as u64);
    p.push(bytes, &mut |e| {
        match e {
            Event::Header(h) => {
                data = vec![Vec::new(); h.tensors().len()];
                header = Some(h);
            }
            Event::TensorData { tensor, bytes, .. } => {
                if let Some(d) = data.get_mut(tensor) {
                    d.extend_from_slice(bytes);
                }
            }
            Event::TensorDone { .. } => {}
        }
        Ok(())
    })?;
    p.finish()?;
    let header = header.ok_or(GgufError::Truncated {
        section: Section::Header,
    })?;
    Ok((header, data))
}
