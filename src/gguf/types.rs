//! The ggml tensor type table: ids as stored in GGUF, block geometry, and which ones the GPU runs.

/// A ggml tensor type id as stored in a GGUF tensor record.
///
/// Every id a GGUF file may carry is listed so an unsupported one can be named in an error;
/// [`GgmlType::gpu_supported`] says which ones cera-web runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    Iq2Xxs = 16,
    Iq2Xs = 17,
    Iq3Xxs = 18,
    Iq1S = 19,
    Iq4Nl = 20,
    Iq3S = 21,
    Iq2S = 22,
    Iq4Xs = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    Iq1M = 29,
    BF16 = 30,
    Tq1_0 = 34,
    Tq2_0 = 35,
    Mxfp4 = 39,
}

impl GgmlType {
    /// The type for a raw id, or `None` for an id ggml does not define (or has retired).
    pub fn from_id(id: u32) -> Option<Self> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2K,
            11 => Q3K,
            12 => Q4K,
            13 => Q5K,
            14 => Q6K,
            15 => Q8K,
            16 => Iq2Xxs,
            17 => Iq2Xs,
            18 => Iq3Xxs,
            19 => Iq1S,
            20 => Iq4Nl,
            21 => Iq3S,
            22 => Iq2S,
            23 => Iq4Xs,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => Iq1M,
            30 => BF16,
            34 => Tq1_0,
            35 => Tq2_0,
            39 => Mxfp4,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// `(elements per block, bytes per block)`, as in ggml's type traits.
    pub fn block_geometry(self) -> (u64, u64) {
        use GgmlType::*;
        match self {
            F32 => (1, 4),
            F16 => (1, 2),
            BF16 => (1, 2),
            F64 => (1, 8),
            I8 => (1, 1),
            I16 => (1, 2),
            I32 => (1, 4),
            I64 => (1, 8),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            Iq4Nl => (32, 18),
            Mxfp4 => (32, 17),
            Q2K => (256, 84),
            Q3K => (256, 110),
            Q4K => (256, 144),
            Q5K => (256, 176),
            Q6K => (256, 210),
            Q8K => (256, 292),
            Iq2Xxs => (256, 66),
            Iq2Xs => (256, 74),
            Iq3Xxs => (256, 98),
            Iq1S => (256, 50),
            Iq3S => (256, 110),
            Iq2S => (256, 82),
            Iq4Xs => (256, 136),
            Iq1M => (256, 56),
            Tq1_0 => (256, 54),
            Tq2_0 => (256, 66),
        }
    }

    pub fn block_elems(self) -> u64 {
        self.block_geometry().0
    }

    pub fn block_bytes(self) -> u64 {
        self.block_geometry().1
    }

    /// Bytes of a row of `n` elements, or `None` if `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let (be, bb) = self.block_geometry();
        if !n.is_multiple_of(be) {
            return None;
        }
        (n / be).checked_mul(bb)
    }

    /// The types cera-web dequantizes on the CPU and multiplies on the GPU (docs/architecture.md, decision 6).
    pub fn gpu_supported(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q4K | Q5K | Q6K
        )
    }

    /// ggml's own name for the type (`q4_K`, `f16`, ...), as users see it in tools.
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q8_1 => "q8_1",
            Q2K => "q2_K",
            Q3K => "q3_K",
            Q4K => "q4_K",
            Q5K => "q5_K",
            Q6K => "q6_K",
            Q8K => "q8_K",
            Iq2Xxs => "iq2_xxs",
            Iq2Xs => "iq2_xs",
            Iq3Xxs => "iq3_xxs",
            Iq1S => "iq1_s",
            Iq4Nl => "iq4_nl",
            Iq3S => "iq3_s",
            Iq2S => "iq2_s",
            Iq4Xs => "iq4_xs",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F64 => "f64",
            Iq1M => "iq1_m",
            BF16 => "bf16",
            Tq1_0 => "tq1_0",
            Tq2_0 => "tq2_0",
            Mxfp4 => "mxfp4",
        }
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
