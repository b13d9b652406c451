//! One test per malformed-file case: each asserts the specific `GgufError` variant and what it names.

use super::tests::{bytes, find, parse_chunked, parse_err};
use super::*;

fn small_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", "llama")
        .meta("k.arr", vec![1u32, 2, 3]);
    w.tensor_f32("tok_embd", &[4, 2], &[0.5; 8])
        .tensor_f32("out", &[3], &[1.0; 3]);
    w
}

#[test]
fn bad_magic() {
    let mut file = small_writer().to_bytes();
    file[..4].copy_from_slice(b"GGML");
    assert_eq!(parse_err(&file), GgufError::BadMagic { found: *b"GGML" });
}

#[test]
fn unsupported_version() {
    for v in [1, 4, 0x0300_0000] {
        let file = small_writer().with_version(v).to_bytes();
        assert_eq!(
            parse_err(&file),
            GgufError::UnsupportedVersion { version: v }
        );
    }
}

#[test]
fn truncated_names_the_section() {
    let file = small_writer().to_bytes();
    let cut = |n: usize| parse_err(&file[..n]);
    let sec = |section| GgufError::Truncated { section };
    assert_eq!(cut(0), sec(Section::Header));
    assert_eq!(cut(10), sec(Section::Header));
    assert_eq!(cut(24 + 5), sec(Section::MetadataKey { index: 0 }));
    let second_key = find(&file, b"k.arr") - 8;
    assert_eq!(cut(second_key + 3), sec(Section::MetadataKey { index: 1 }));
    let arr_value = second_key + 8 + 5 + 4;
    assert_eq!(
        cut(arr_value + 20),
        sec(Section::MetadataValue {
            index: 1,
            key: "k.arr".into()
        })
    );
    let t1 = find(&file, b"out") - 8;
    assert_eq!(cut(t1 + 12), sec(Section::TensorInfo { index: 1 }));
    let (h, _) = parse_bytes(&file).unwrap();
    let r = h.tensor_range(1).unwrap();
    assert_eq!(
        cut(r.start as usize + 2),
        sec(Section::TensorData {
            tensor: "out".into()
        })
    );
    // The padding before a tensor counts as that tensor's part.
    assert_eq!(
        cut(h.data_offset() as usize - 1),
        sec(Section::TensorData {
            tensor: "tok_embd".into()
        })
    );
}

fn limit_err(e: GgufError) -> (&'static str, u64) {
    match e {
        GgufError::LimitExceeded { what, value, .. } => (what, value),
        e => panic!("expected LimitExceeded, got {e:?}"),
    }
}

#[test]
fn counts_beyond_limits() {
    let file = small_writer().to_bytes();
    let mut f = file.clone();
    f[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert_eq!(limit_err(parse_err(&f)), ("tensor count", 1 << 60));
    let mut f = file.clone();
    f[16..24].copy_from_slice(&(1u64 << 21).to_le_bytes());
    assert_eq!(limit_err(parse_err(&f)), ("metadata entry count", 1 << 21));
}

#[test]
fn string_length_beyond_limit() {
    let mut f = small_writer().to_bytes();
    f[24..32].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert_eq!(limit_err(parse_err(&f)), ("key length", 1 << 60));
    let mut f = small_writer().to_bytes();
    let at = find(&f, b"llama") - 8;
    f[at..at + 8].copy_from_slice(&((1u64 << 24) + 1).to_le_bytes());
    assert_eq!(limit_err(parse_err(&f)), ("string length", (1 << 24) + 1));
    let mut f = small_writer().to_bytes();
    let at = find(&f, b"tok_embd") - 8;
    f[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_eq!(limit_err(parse_err(&f)), ("name length", u64::MAX));
}

#[test]
fn array_length_beyond_limit() {
    let mut f = small_writer().to_bytes();
    let at = find(&f, b"k.arr") + 5 + 4 + 4;
    f[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert_eq!(limit_err(parse_err(&f)), ("array length", 1 << 60));
}

#[test]
fn array_count_beyond_known_input() {
    // Under the limit, but more elements than bytes left in a file of known size.
    let mut f = small_writer().to_bytes();
    let at = find(&f, b"k.arr") + 5 + 4 + 4;
    f[at..at + 8].copy_from_slice(&(1u64 << 27).to_le_bytes());
    let e = parse_chunked(&f, 3, Some(f.len() as u64)).unwrap_err();
    assert!(
        matches!(e, GgufError::ExceedsInput { what: "array length", value, .. } if value == 1 << 27),
        "{e:?}"
    );
}

#[test]
fn nesting_too_deep() {
    let mut a = MetaArray::U8(vec![1]);
    for _ in 0..4 {
        a = MetaArray::Array(vec![a]);
    }
    let mut w = GgufWriter::new();
    w.meta("deep", a);
    assert_eq!(
        limit_err(parse_err(&w.to_bytes())),
        ("array nesting depth", 5)
    );
}

#[test]
fn too_many_dims() {
    let mut w = GgufWriter::new();
    w.tensor_f32("t5", &[1, 1, 1, 1, 1], &[0.0]);
    assert_eq!(limit_err(parse_err(&w.to_bytes())), ("dimension count", 5));
}

#[test]
fn unknown_value_type() {
    let mut f = small_writer().to_bytes();
    let at = find(&f, b"k.arr") + 5;
    f[at..at + 4].copy_from_slice(&13u32.to_le_bytes());
    let section = Section::MetadataValue {
        index: 1,
        key: "k.arr".into(),
    };
    assert_eq!(
        parse_err(&f),
        GgufError::UnknownValueType {
            section: section.clone(),
            ty: 13
        }
    );
    // And as an array element type.
    let mut f = small_writer().to_bytes();
    f[at + 4..at + 8].copy_from_slice(&99u32.to_le_bytes());
    assert_eq!(
        parse_err(&f),
        GgufError::UnknownValueType { section, ty: 99 }
    );
}

#[test]
fn unknown_tensor_type() {
    let mut w = GgufWriter::new();
    w.tensor_raw("weird", &[4], 4, bytes(16, 0)); // id 4 was Q4_2, retired
    assert_eq!(
        parse_err(&w.to_bytes()),
        GgufError::UnknownTensorType {
            tensor: "weird".into(),
            id: 4
        }
    );
}

#[test]
fn invalid_dims() {
    let reason = |dims: &[u64]| {
        let mut w = GgufWriter::new();
        w.tensor_f32("t", dims, &[0.0]);
        match parse_err(&w.to_bytes()) {
            GgufError::InvalidDims {
                tensor,
                dims: d,
                reason,
            } => {
                assert_eq!((tensor.as_str(), &d[..]), ("t", dims));
                reason
            }
            e => panic!("expected InvalidDims, got {e:?}"),
        }
    };
    assert_eq!(reason(&[]), "no dimensions");
    assert_eq!(reason(&[4, 0]), "a dimension is zero");
    assert_eq!(
        reason(&[1 << 32, 1 << 32, 2]),
        "element count overflows u64"
    );
    assert_eq!(reason(&[1 << 62]), "byte size overflows u64");
}

#[test]
fn row_not_block_multiple() {
    let mut w = GgufWriter::new();
    w.tensor(
        "blk.0.attn_q.weight",
        &[33, 2],
        GgmlType::Q8_0,
        bytes(68, 0),
    );
    let e = parse_err(&w.to_bytes());
    let expect = GgufError::RowNotBlockMultiple {
        tensor: "blk.0.attn_q.weight".into(),
        ty: GgmlType::Q8_0,
        row: 33,
        block: 32,
    };
    assert_eq!(e, expect);
    assert!(e.to_string().contains("q8_0"), "{e}");
}

#[test]
fn tensor_out_of_range() {
    let file = small_writer().to_bytes();
    let (h, _) = parse_bytes(&file).unwrap();
    let cut = &file[..h.tensor_range(1).unwrap().end as usize - 1];
    let e = parse_chunked(cut, 7, Some(cut.len() as u64)).unwrap_err();
    assert!(
        matches!(&e, GgufError::TensorOutOfRange { tensor, total, .. } if tensor == "out" && *total == cut.len() as u64),
        "{e:?}"
    );
    assert_eq!(parse_bytes(cut).unwrap_err(), e);
    // An offset whose end overflows u64.
    let mut w = small_writer();
    w.override_offset(0, u64::MAX - 31);
    assert!(
        matches!(parse_err(&w.to_bytes()), GgufError::TensorOffsetOverflow { tensor, .. } if tensor == "tok_embd")
    );
}

#[test]
fn tensor_overlap() {
    let mut w = small_writer();
    w.override_offset(1, 0);
    let e = parse_err(&w.to_bytes());
    assert!(
        matches!(&e, GgufError::TensorOverlap { tensor, other, .. } if tensor == "out" && other == "tok_embd"),
        "{e:?}"
    );
}

#[test]
fn tensor_misaligned() {
    let mut w = small_writer();
    w.override_offset(1, 40);
    let e = parse_err(&w.to_bytes());
    assert_eq!(
        e,
        GgufError::TensorMisaligned {
            tensor: "out".into(),
            offset: 40,
            alignment: 32
        }
    );
}

#[test]
fn duplicate_names() {
    let mut w = GgufWriter::new();
    w.tensor_f32("x", &[1], &[0.0])
        .tensor_f32("x", &[1], &[1.0]);
    assert_eq!(
        parse_err(&w.to_bytes()),
        GgufError::DuplicateTensor { name: "x".into() }
    );
    let mut w = GgufWriter::new();
    w.meta("general.name", "a").meta("general.name", "b");
    assert_eq!(
        parse_err(&w.to_bytes()),
        GgufError::DuplicateKey {
            key: "general.name".into()
        }
    );
}

#[test]
fn bad_utf8() {
    let mut w = GgufWriter::new();
    w.meta("KEY", "VALUE").tensor_f32("NAME", &[1], &[0.0]);
    let file = w.to_bytes();
    let corrupt = |needle: &[u8]| {
        let mut f = file.clone();
        let at = find(&f, needle);
        f[at + 1] = 0xff;
        parse_err(&f)
    };
    let bad = |section| GgufError::BadUtf8 { section };
    assert_eq!(corrupt(b"KEY"), bad(Section::MetadataKey { index: 0 }));
    assert_eq!(
        corrupt(b"VALUE"),
        bad(Section::MetadataValue {
            index: 0,
            key: "KEY".into()
        })
    );
    assert_eq!(corrupt(b"NAME"), bad(Section::TensorInfo { index: 0 }));
}

#[test]
fn alignment_must_be_power_of_two() {
    for (v, expect) in [
        (MetaValue::U32(48), GgufError::BadAlignment { value: 48 }),
        (MetaValue::U32(0), GgufError::BadAlignment { value: 0 }),
        (
            MetaValue::F32(32.0),
            GgufError::WrongMetaType {
                key: "general.alignment".into(),
                expected: "unsigned integer",
                found: ValueType::F32,
            },
        ),
    ] {
        let mut w = GgufWriter::new();
        w.meta("general.alignment", v).tensor_f32("x", &[1], &[0.0]);
        assert_eq!(parse_err(&w.to_bytes()), expect);
    }
}

#[test]
fn error_messages_name_the_culprit() {
    let e = GgufError::Truncated {
        section: Section::TensorData {
            tensor: "blk.3.ffn_down.weight".into(),
        },
    };
    assert_eq!(
        e.to_string(),
        "GGUF input ended early, in the tensor data of tensor `blk.3.ffn_down.weight`"
    );
    let e = GgufError::LimitExceeded {
        section: Section::MetadataValue {
            index: 7,
            key: "k".into(),
        },
        what: "array length",
        value: 9,
        limit: 8,
    };
    assert_eq!(
        e.to_string(),
        "metadata value 7 (`k`): array length 9 exceeds the limit 8"
    );
}

#[test]
fn custom_limits_apply() {
    let file = small_writer().to_bytes();
    let limits = ParseLimits {
        max_string_len: 8,
        max_array_len: 2,
        ..ParseLimits::default()
    };
    let mut p = GgufParser::with_limits(limits);
    let e = p.push(&file, &mut |_| Ok(())).unwrap_err();
    // "general.architecture" is the first string longer than 8 bytes.
    assert_eq!(limit_err(e), ("key length", 20));
    let limits = ParseLimits {
        max_array_len: 2,
        ..ParseLimits::default()
    };
    let e = GgufParser::with_limits(limits)
        .push(&file, &mut |_| Ok(()))
        .unwrap_err();
    assert_eq!(limit_err(e), ("array length", 3));
}
