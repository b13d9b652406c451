//! The header half of the parser: the atomic steps that turn bytes into metadata and tensor records.
//!
//! Each step reads everything it needs before changing any parser state, so a step that runs
//! short (`Stop::Short`) can simply be run again from its start once more bytes have arrived.

use std::sync::Arc;

use super::error::{GgufError, Section};
use super::header::{GgufHeader, TensorInfo};
use super::parse::{Event, GgufParser, GGUF_MAGIC};
use super::types::GgmlType;
use super::value::{MetaArray, MetaValue, ValueType};

/// The fewest bytes a metadata entry takes (empty key, type, one u8) and a tensor record
/// (empty name, no dims, type, offset): bounds for counts against a known input size.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
const MIN_TENSOR_BYTES: u64 = 8 + 4 + 4 + 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Magic, version, tensor count, metadata count.
    Fixed,
    Key {
        i: u64,
    },
    /// The value of entry `i`: its key and type are in `cur_key` / `cur_ty`, open arrays in `stack`.
    Value {
        i: u64,
    },
    TensorInfo {
        i: u64,
    },
    /// Padding and tensor data; `next` indexes `order`.
    Data,
}

/// Why a step stopped: it needs this many bytes from its start, or the input is bad.
pub(super) enum Stop {
    Short(usize),
    Err(GgufError),
}

impl From<GgufError> for Stop {
    fn from(e: GgufError) -> Self {
        Stop::Err(e)
    }
}

/// A read position in the bytes available to one step.
struct Cur<'a> {
    b: &'a [u8],
    p: usize,
}

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Stop> {
        let end = self.p.checked_add(n).ok_or(Stop::Short(usize::MAX))?;
        let s = self.b.get(self.p..end).ok_or(Stop::Short(end))?;
        self.p = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Stop> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, Stop> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, Stop> {
        Ok(u64::from_le_bytes(self.array()?))
    }
}

/// An array being filled: its elements so far and the count the file declared.
#[derive(Debug)]
pub(super) struct Frame {
    pub(super) arr: MetaArray,
    pub(super) count: u64,
}

impl GgufParser {
    /// Run the step for the current state on `input`; returns the bytes it consumed.
    pub(super) fn step(
        &mut self,
        input: &[u8],
        on: &mut dyn FnMut(Event<'_>) -> Result<(), GgufError>,
    ) -> Result<usize, Stop> {
        let mut c = Cur { b: input, p: 0 };
        match self.state {
            State::Fixed => self.step_fixed(&mut c, on)?,
            State::Key { i } => self.step_key(&mut c, i)?,
            State::Value { i } => self.step_value(&mut c, i, on)?,
            State::TensorInfo { i } => self.step_tensor(&mut c, i, on)?,
            State::Data => {}
        }
        Ok(c.p)
    }

    /// Reject `count` items of at least `min_each` bytes each when they exceed `limit` or
    /// cannot fit in what is left of a known-size input (at absolute offset `at`).
    fn check_count(
        &self,
        section: impl Fn() -> Section,
        what: &'static str,
        count: u64,
        limit: u64,
        min_each: u64,
        at: u64,
    ) -> Result<(), GgufError> {
        if count > limit {
            return Err(GgufError::LimitExceeded {
                section: section(),
                what,
                value: count,
                limit,
            });
        }
        if let Some(total) = self.total {
            let remaining = total.saturating_sub(at);
            let needed = count.saturating_mul(min_each);
            if needed > remaining {
                return Err(GgufError::ExceedsInput {
                    section: section(),
                    what,
                    value: count,
                    needed,
                    remaining,
                });
            }
        }
        Ok(())
    }

    fn read_string(
        &self,
        c: &mut Cur<'_>,
        section: impl Fn() -> Section,
        what: &'static str,
    ) -> Result<String, Stop> {
        let len = c.u64()?;
        let at = self.pos.saturating_add(c.p as u64);
        self.check_count(&section, what, len, self.limits.max_string_len, 1, at)?;
        let n = usize::try_from(len).map_err(|_| GgufError::LimitExceeded {
            section: section(),
            what,
            value: len,
            limit: usize::MAX as u64,
        })?;
        let bytes = c.take(n)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::BadUtf8 { section: section() }.into()),
        }
    }

    fn step_fixed(
        &mut self,
        c: &mut Cur<'_>,
        on: &mut dyn FnMut(Event<'_>) -> Result<(), GgufError>,
    ) -> Result<(), Stop> {
        let magic: [u8; 4] = c.array()?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic { found: magic }.into());
        }
        let version = c.u32()?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion { version }.into());
        }
        let n_tensors = c.u64()?;
        let n_kv = c.u64()?;
        let at = self.pos.saturating_add(c.p as u64);
        let l = self.limits;
        self.check_count(
            || Section::Header,
            "tensor count",
            n_tensors,
            l.max_tensors,
            MIN_TENSOR_BYTES,
            at,
        )?;
        self.check_count(
            || Section::Header,
            "metadata entry count",
            n_kv,
            l.max_metadata,
            MIN_KV_BYTES,
            at,
        )?;
        self.h.version = version;
        self.n_tensors = n_tensors;
        self.n_kv = n_kv;
        if n_kv > 0 {
            self.state = State::Key { i: 0 };
            Ok(())
        } else {
            self.end_metadata(at, on)
        }
    }

    fn step_key(&mut self, c: &mut Cur<'_>, i: u64) -> Result<(), Stop> {
        let key = self.read_string(c, || Section::MetadataKey { index: i }, "key length")?;
        let ty = c.u32()?;
        let Some(ty) = ValueType::from_id(ty) else {
            let section = Section::MetadataValue { index: i, key };
            return Err(GgufError::UnknownValueType { section, ty }.into());
        };
        if self.h.meta_index.contains_key(&key) {
            return Err(GgufError::DuplicateKey { key }.into());
        }
        self.cur_key = key;
        self.cur_ty = ty;
        self.state = State::Value { i };
        Ok(())
    }

    /// One piece of a value: a whole scalar or string, or one element (or inner array header)
    /// of the innermost open array. Arrays grow as elements arrive; their declared count only
    /// bounds the loop, it is never used to reserve memory.
    fn step_value(
        &mut self,
        c: &mut Cur<'_>,
        i: u64,
        on: &mut dyn FnMut(Event<'_>) -> Result<(), GgufError>,
    ) -> Result<(), Stop> {
        let section = || Section::MetadataValue {
            index: i,
            key: self.cur_key.clone(),
        };
        let ty = self.stack.last().map_or(self.cur_ty, |f| f.arr.elem_type());
        let mut value = match ty {
            ValueType::Array => {
                let elem = c.u32()?;
                let count = c.u64()?;
                let Some(elem) = ValueType::from_id(elem) else {
                    return Err(GgufError::UnknownValueType {
                        section: section(),
                        ty: elem,
                    }
                    .into());
                };
                let depth = self.stack.len() + 1;
                if depth > self.limits.max_depth {
                    return Err(GgufError::LimitExceeded {
                        section: section(),
                        what: "array nesting depth",
                        value: depth as u64,
                        limit: self.limits.max_depth as u64,
                    }
                    .into());
                }
                let at = self.pos.saturating_add(c.p as u64);
                let max = self.limits.max_array_len;
                self.check_count(section, "array length", count, max, elem.min_size(), at)?;
                self.stack.push(Frame {
                    arr: MetaArray::empty(elem),
                    count,
                });
                None
            }
            ValueType::String => Some(MetaValue::String(self.read_string(
                c,
                section,
                "string length",
            )?)),
            fixed => {
                let b = c.take(fixed.fixed_size().unwrap_or(0))?;
                // from_le cannot fail here (the size matches the type); the error is a formality.
                let v = MetaValue::from_le(fixed, b);
                Some(v.ok_or_else(|| GgufError::UnknownValueType {
                    section: section(),
                    ty: fixed.id(),
                })?)
            }
        };
        // Hand the value up, closing every array it completes; the outermost one ends the entry.
        loop {
            if let Some(v) = value.take() {
                match self.stack.last_mut() {
                    Some(f) => {
                        f.arr.push(v);
                    }
                    None => {
                        let at = self.pos.saturating_add(c.p as u64);
                        return self.finish_entry(i, v, at, on);
                    }
                }
            }
            match self.stack.last() {
                Some(f) if f.arr.len() as u64 >= f.count => {
                    value = self.stack.pop().map(|f| MetaValue::Array(f.arr));
                }
                _ => return Ok(()),
            }
        }
    }

    fn finish_entry(
        &mut self,
        i: u64,
        value: MetaValue,
        at: u64,
        on: &mut dyn FnMut(Event<'_>) -> Result<(), GgufError>,
    ) -> Result<(), Stop> {
        let key = std::mem::take(&mut self.cur_key);
        self.h.meta_index.insert(key.clone(), self.h.metadata.len());
        self.h.metadata.push((key, value));
        let next = i.saturating_add(1);
        if next < self.n_kv {
            self.state = State::Key { i: next };
            Ok(())
        } else {
            self.end_metadata(at, on)
        }
    }

    /// Metadata complete: settle the alignment (tensor records are checked against it).
    fn end_metadata(
        &mut self,
        at: u64,
        on: &mut dyn FnMut(Event<'_>) -> Result<(), GgufError>,
    ) -> Result<(), Stop> {
        const KEY: &str = "general.alignment";
        if let Some(v) = self.h.get(KEY) {
            let Some(a) = v.as_u64() else {
                let found = v.value_type();
                return Err(GgufError::WrongMetaType {
                    key: KEY.into(),
                    expected: "unsigned integer",
                    found,
                }
                .into());
            };
            if !a.is_power_of_two() {
                return Err(GgufError::BadAlignment { value: a }.into());
            }
            self.h.alignment = a;
        }
        if self.n_tensors > 0 {
            self.state = State::TensorInfo { i: 0 };
            Ok(())
        } else {
            self.end_header(at, on)
        }
    }

    fn step_tensor(
        &mut self,
        c: &mut Cur<'_>,
        i: u64,
        on: &mut dyn FnMut(Event<'_>) -> Result<(), GgufError>,
    ) -> Result<(), Stop> {
        let section = || Section::TensorInfo { index: i };
        let name = self.read_string(c, section, "name length")?;
        let n_dims = c.u32()?;
        if n_dims > self.limits.max_dims {
            let limit = self.limits.max_dims.into();
            let e = GgufError::LimitExceeded {
                section: section(),
                what: "dimension count",
                value: n_dims.into(),
                limit,
            };
            return Err(e.into());
        }
        let mut dims = Vec::new();
        for _ in 0..n_dims {
            dims.push(c.u64()?);
        }
        let type_id = c.u32()?;
        let offset = c.u64()?;
        // All bytes of the record are in; validate it.
        if self.h.tensor_index.contains_key(&name) {
            return Err(GgufError::DuplicateTensor { name }.into());
        }
        let invalid = |name: String, dims: Vec<u64>, reason| GgufError::InvalidDims {
            tensor: name,
            dims,
            reason,
        };
        if dims.is_empty() {
            return Err(invalid(name, dims, "no dimensions").into());
        }
        if dims.contains(&0) {
            return Err(invalid(name, dims, "a dimension is zero").into());
        }
        let Some(n_elements) = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)) else {
            return Err(invalid(name, dims, "element count overflows u64").into());
        };
        let Some(ty) = GgmlType::from_id(type_id) else {
            return Err(GgufError::UnknownTensorType {
                tensor: name,
                id: type_id,
            }
            .into());
        };
        let row = dims[0];
        let block = ty.block_elems();
        if row % block != 0 {
            return Err(GgufError::RowNotBlockMultiple {
                tensor: name,
                ty,
                row,
                block,
            }
            .into());
        }
        // n_elements did not overflow, so neither does the product of the other dims.
        let n_rows = n_elements / row;
        let Some(size) = ty.row_bytes(row).and_then(|r| r.checked_mul(n_rows)) else {
            return Err(invalid(name, dims, "byte size overflows u64").into());
        };
        let alignment = self.h.alignment;
        if offset % alignment != 0 {
            return Err(GgufError::TensorMisaligned {
                tensor: name,
                offset,
                alignment,
            }
            .into());
        }
        if offset.checked_add(size).is_none() {
            return Err(GgufError::TensorOffsetOverflow {
                tensor: name,
                offset,
                size,
            }
            .into());
        }
        self.h
            .tensor_index
            .insert(name.clone(), self.h.tensors.len());
        self.h.tensors.push(TensorInfo {
            name,
            dims,
            type_id,
            ty,
            offset,
            size,
            n_elements,
        });
        let next = i.saturating_add(1);
        if next < self.n_tensors {
            self.state = State::TensorInfo { i: next };
            Ok(())
        } else {
            self.end_header(self.pos.saturating_add(c.p as u64), on)
        }
    }

    /// Tensor table complete (`at` is the header's end): place the data section, check that
    /// tensors neither overlap nor run past the input, and publish the header.
    fn end_header(
        &mut self,
        at: u64,
        on: &mut dyn FnMut(Event<'_>) -> Result<(), GgufError>,
    ) -> Result<(), Stop> {
        let alignment = self.h.alignment;
        let Some(data_offset) = at.checked_next_multiple_of(alignment) else {
            return Err(GgufError::BadAlignment { value: alignment }.into());
        };
        let tensors = &self.h.tensors;
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        order.sort_by_key(|&t| (tensors[t].offset, t));
        let mut prev: Option<&TensorInfo> = None;
        for &t in &order {
            let t = &tensors[t];
            // offset + size fits (checked per record); the absolute end may not.
            let end = t.offset + t.size;
            let Some(abs_end) = data_offset.checked_add(end) else {
                let e = GgufError::TensorOffsetOverflow {
                    tensor: t.name.clone(),
                    offset: t.offset,
                    size: t.size,
                };
                return Err(e.into());
            };
            if let Some(total) = self.total.filter(|&total| abs_end > total) {
                let start = data_offset + t.offset;
                let e = GgufError::TensorOutOfRange {
                    tensor: t.name.clone(),
                    start,
                    end: abs_end,
                    total,
                };
                return Err(e.into());
            }
            if let Some(p) = prev.filter(|p| p.offset + p.size > t.offset) {
                let e = GgufError::TensorOverlap {
                    tensor: t.name.clone(),
                    offset: t.offset,
                    other: p.name.clone(),
                    other_end: p.offset + p.size,
                };
                return Err(e.into());
            }
            prev = Some(t);
        }
        self.h.data_offset = data_offset;
        let header = Arc::new(std::mem::replace(&mut self.h, GgufHeader::empty()));
        self.header = Some(header.clone());
        self.order = order;
        self.next = 0;
        self.state = State::Data;
        on(Event::Header(header))?;
        Ok(())
    }
}
