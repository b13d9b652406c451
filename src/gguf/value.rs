//! GGUF metadata values: the 13 value types, scalars, and typed (possibly nested) arrays.

/// A metadata value type id as stored in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// Bytes of a fixed-size value, `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The fewest bytes one value of this type can take: used to reject counts that cannot fit
    /// in what is left of an input of known size (a string is at least its u64 length, an
    /// array at least its u32 type and u64 count).
    pub fn min_size(self) -> u64 {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1) as u64,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array, stored typed: a vocabulary of 150k tokens is a `Vec<String>` and its
/// scores a `Vec<f32>`, not 150k enum values. Nested arrays keep each inner array's own type
/// (so an empty inner array still round-trips with its element type).
#[derive(Clone, Debug, PartialEq)]
pub enum MetaArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<MetaArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl MetaValue {
    pub fn value_type(&self) -> ValueType {
        use MetaValue as V;
        match self {
            V::U8(_) => ValueType::U8,
            V::I8(_) => ValueType::I8,
            V::U16(_) => ValueType::U16,
            V::I16(_) => ValueType::I16,
            V::U32(_) => ValueType::U32,
            V::I32(_) => ValueType::I32,
            V::F32(_) => ValueType::F32,
            V::Bool(_) => ValueType::Bool,
            V::String(_) => ValueType::String,
            V::Array(_) => ValueType::Array,
            V::U64(_) => ValueType::U64,
            V::I64(_) => ValueType::I64,
            V::F64(_) => ValueType::F64,
        }
    }

    /// Any unsigned integer type widened to u64 (converters differ on u32 vs u64 for counts).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&MetaArray> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Decode one fixed-size scalar from exactly `ty.fixed_size()` little-endian bytes.
    /// Returns `None` for strings, arrays or a wrong byte count.
    pub(crate) fn from_le(ty: ValueType, b: &[u8]) -> Option<MetaValue> {
        use MetaValue as V;
        if ty.fixed_size() != Some(b.len()) {
            return None;
        }
        Some(match ty {
            ValueType::U8 => V::U8(b[0]),
            ValueType::I8 => V::I8(b[0] as i8),
            // Any nonzero byte reads as true, like ggml's own reader.
            ValueType::Bool => V::Bool(b[0] != 0),
            ValueType::U16 => V::U16(u16::from_le_bytes(b.try_into().ok()?)),
            ValueType::I16 => V::I16(i16::from_le_bytes(b.try_into().ok()?)),
            ValueType::U32 => V::U32(u32::from_le_bytes(b.try_into().ok()?)),
            ValueType::I32 => V::I32(i32::from_le_bytes(b.try_into().ok()?)),
            ValueType::F32 => V::F32(f32::from_le_bytes(b.try_into().ok()?)),
            ValueType::U64 => V::U64(u64::from_le_bytes(b.try_into().ok()?)),
            ValueType::I64 => V::I64(i64::from_le_bytes(b.try_into().ok()?)),
            ValueType::F64 => V::F64(f64::from_le_bytes(b.try_into().ok()?)),
            ValueType::String | ValueType::Array => return None,
        })
    }
}

/// Apply `$body` to the inner vec of every variant of a `MetaArray`.
macro_rules! each_array {
    ($a:expr, $v:ident => $body:expr) => {
        match $a {
            MetaArray::U8($v) => $body,
            MetaArray::I8($v) => $body,
            MetaArray::U16($v) => $body,
            MetaArray::I16($v) => $body,
            MetaArray::U32($v) => $body,
            MetaArray::I32($v) => $body,
            MetaArray::F32($v) => $body,
            MetaArray::Bool($v) => $body,
            MetaArray::String($v) => $body,
            MetaArray::Array($v) => $body,
            MetaArray::U64($v) => $body,
            MetaArray::I64($v) => $body,
            MetaArray::F64($v) => $body,
        }
    };
}

impl MetaArray {
    /// An empty array of element type `ty`.
    pub fn empty(ty: ValueType) -> Self {
        use MetaArray as A;
        match ty {
            ValueType::U8 => A::U8(Vec::new()),
            ValueType::I8 => A::I8(Vec::new()),
            ValueType::U16 => A::U16(Vec::new()),
            ValueType::I16 => A::I16(Vec::new()),
            ValueType::U32 => A::U32(Vec::new()),
            ValueType::I32 => A::I32(Vec::new()),
            ValueType::F32 => A::F32(Vec::new()),
            ValueType::Bool => A::Bool(Vec::new()),
            ValueType::String => A::String(Vec::new()),
            ValueType::Array => A::Array(Vec::new()),
            ValueType::U64 => A::U64(Vec::new()),
            ValueType::I64 => A::I64(Vec::new()),
            ValueType::F64 => A::F64(Vec::new()),
        }
    }

    pub fn elem_type(&self) -> ValueType {
        use MetaArray as A;
        match self {
            A::U8(_) => ValueType::U8,
            A::I8(_) => ValueType::I8,
            A::U16(_) => ValueType::U16,
            A::I16(_) => ValueType::I16,
            A::U32(_) => ValueType::U32,
            A::I32(_) => ValueType::I32,
            A::F32(_) => ValueType::F32,
            A::Bool(_) => ValueType::Bool,
            A::String(_) => ValueType::String,
            A::Array(_) => ValueType::Array,
            A::U64(_) => ValueType::U64,
            A::I64(_) => ValueType::I64,
            A::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        each_array!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Append one element; `false` (and nothing appended) if its type is not the element type.
    pub fn push(&mut self, value: MetaValue) -> bool {
        use MetaArray as A;
        use MetaValue as V;
        match (self, value) {
            (A::U8(a), V::U8(x)) => a.push(x),
            (A::I8(a), V::I8(x)) => a.push(x),
            (A::U16(a), V::U16(x)) => a.push(x),
            (A::I16(a), V::I16(x)) => a.push(x),
            (A::U32(a), V::U32(x)) => a.push(x),
            (A::I32(a), V::I32(x)) => a.push(x),
            (A::F32(a), V::F32(x)) => a.push(x),
            (A::Bool(a), V::Bool(x)) => a.push(x),
            (A::String(a), V::String(x)) => a.push(x),
            (A::Array(a), V::Array(x)) => a.push(x),
            (A::U64(a), V::U64(x)) => a.push(x),
            (A::I64(a), V::I64(x)) => a.push(x),
            (A::F64(a), V::F64(x)) => a.push(x),
            _ => return false,
        }
        true
    }

    /// Element `i` as a value (copies it; strings and inner arrays are cloned).
    pub fn get(&self, i: usize) -> Option<MetaValue> {
        use MetaArray as A;
        use MetaValue as V;
        Some(match self {
            A::U8(a) => V::U8(*a.get(i)?),
            A::I8(a) => V::I8(*a.get(i)?),
            A::U16(a) => V::U16(*a.get(i)?),
            A::I16(a) => V::I16(*a.get(i)?),
            A::U32(a) => V::U32(*a.get(i)?),
            A::I32(a) => V::I32(*a.get(i)?),
            A::F32(a) => V::F32(*a.get(i)?),
            A::Bool(a) => V::Bool(*a.get(i)?),
            A::String(a) => V::String(a.get(i)?.clone()),
            A::Array(a) => V::Array(a.get(i)?.clone()),
            A::U64(a) => V::U64(*a.get(i)?),
            A::I64(a) => V::I64(*a.get(i)?),
            A::F64(a) => V::F64(*a.get(i)?),
        })
    }
}

macro_rules! from_scalar {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for MetaValue {
            fn from(x: $t) -> Self { MetaValue::$v(x) }
        }
        impl From<Vec<$t>> for MetaArray {
            fn from(x: Vec<$t>) -> Self { MetaArray::$v(x) }
        }
        impl From<Vec<$t>> for MetaValue {
            fn from(x: Vec<$t>) -> Self { MetaValue::Array(MetaArray::$v(x)) }
        }
    )*};
}
from_scalar!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for MetaValue {
    fn from(s: &str) -> Self {
        MetaValue::String(s.to_owned())
    }
}

impl From<MetaArray> for MetaValue {
    fn from(a: MetaArray) -> Self {
        MetaValue::Array(a)
    }
}

impl From<Vec<MetaArray>> for MetaValue {
    fn from(a: Vec<MetaArray>) -> Self {
        MetaValue::Array(MetaArray::Array(a))
    }
}

impl From<Vec<&str>> for MetaValue {
    fn from(a: Vec<&str>) -> Self {
        MetaValue::Array(MetaArray::String(
            a.into_iter().map(str::to_owned).collect(),
        ))
    }
}
