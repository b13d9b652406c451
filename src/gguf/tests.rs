//! Parser tests: chunking invariance, one test per malformed case, header getters.

use std::sync::Arc;

use super::*;

/// Deterministic filler bytes for tensor data.
pub(super) fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A file with every metadata type, nested arrays, and tensors of several types whose sizes
/// are not multiples of the alignment (so there is padding between them).
fn rich_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", "llama")
        .meta("general.alignment", 64u32)
        .meta("t.u8", 200u8)
        .meta("t.i8", -5i8)
        .meta("t.u16", 60000u16)
        .meta("t.i16", -30000i16)
        .meta("t.u32", 4_000_000_000u32)
        .meta("t.i32", -2_000_000_000i32)
        .meta("t.f32", 1.5f32)
        .meta("t.bool", true)
        .meta("t.string", "héllo wörld")
        .meta("t.u64", u64::MAX)
        .meta("t.i64", i64::MIN)
        .meta("t.f64", -2.25f64)
        .meta("tokenizer.ggml.tokens", vec!["<s>", "</s>", "a", "", "ü"])
        .meta("t.scores", vec![0.5f32, -1.0, 3.0])
        .meta("t.empty", MetaArray::empty(ValueType::I64))
        .meta(
            "t.nested",
            vec![
                MetaArray::U32(vec![1, 2, 3]),
                MetaArray::empty(ValueType::String),
                MetaArray::Array(vec![
                    MetaArray::String(vec!["deep".into()]),
                    MetaArray::Bool(vec![false, true]),
                ]),
            ],
        );
    w.tensor_f32(
        "a.f32",
        &[5, 3],
        &(0..15).map(|i| i as f32 * 0.25).collect::<Vec<_>>(),
    );
    w.tensor("b.f16", &[7], GgmlType::F16, bytes(14, 1));
    w.tensor("c.q8_0", &[64, 2], GgmlType::Q8_0, bytes(4 * 34, 2));
    w.tensor("d.q4_k", &[256], GgmlType::Q4K, bytes(144, 3));
    w.tensor("e.i8", &[3, 1, 1, 1], GgmlType::I8, bytes(3, 4));
    w
}

#[derive(Debug, PartialEq)]
pub(super) struct Parsed {
    header: Arc<GgufHeader>,
    data: Vec<Vec<u8>>,
    /// Tensor indices in the order their data completed.
    done: Vec<usize>,
}

/// Parse `file` in chunks of `chunk` bytes, checking the event contract along the way.
pub(super) fn parse_chunked(
    file: &[u8],
    chunk: usize,
    total: Option<u64>,
) -> Result<Parsed, GgufError> {
    let mut p = GgufParser::new();
    if let Some(t) = total {
        p = p.with_total_size(t);
    }
    let mut header: Option<Arc<GgufHeader>> = None;
    let mut data: Vec<Vec<u8>> = Vec::new();
    let mut done = Vec::new();
    let mut on = |e: Event<'_>| {
        match e {
            Event::Header(h) => {
                assert!(header.is_none(), "two Header events");
                data = vec![Vec::new(); h.tensors().len()];
                header = Some(h);
            }
            Event::TensorData {
                tensor,
                offset,
                bytes,
            } => {
                assert!(!bytes.is_empty());
                assert_eq!(
                    offset,
                    data[tensor].len() as u64,
                    "pieces must be contiguous"
                );
                data[tensor].extend_from_slice(bytes);
            }
            Event::TensorDone { tensor } => {
                let h = header.as_ref().unwrap();
                assert_eq!(data[tensor].len() as u64, h.tensors()[tensor].size);
                done.push(tensor);
            }
        }
        Ok(())
    };
    for c in file.chunks(chunk.max(1)) {
        p.push(c, &mut on)?;
    }
    p.finish()?;
    assert!(p.is_complete());
    Ok(Parsed {
        header: header.expect("no header"),
        data,
        done,
    })
}

/// The error of parsing `file`, which must not depend on the chunking.
pub(super) fn parse_err(file: &[u8]) -> GgufError {
    let whole = parse_chunked(file, file.len(), None).expect_err("parse should fail");
    let bytewise = parse_chunked(file, 1, None).expect_err("parse should fail");
    assert_eq!(whole, bytewise, "error depends on chunking");
    whole
}

pub(super) fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("needle not in file")
}

#[test]
fn same_result_for_every_chunk_size() {
    let w = rich_writer();
    let file = w.to_bytes();
    let reference = parse_chunked(&file, file.len(), Some(file.len() as u64)).unwrap();
    for chunk in [1, 7, 4096, 1 << 20, file.len()] {
        assert_eq!(
            parse_chunked(&file, chunk, None).unwrap(),
            reference,
            "chunk size {chunk}"
        );
    }
    let h = &reference.header;
    assert_eq!(h.version(), 3);
    assert_eq!(h.alignment(), 64);
    assert_eq!(h.data_offset() % 64, 0);
    assert_eq!(h.metadata().len(), 18);
    assert_eq!(h.tensors().len(), 5);
    // Data round-trips and the offsets are the writer's.
    let (_, data) = parse_bytes(&file).unwrap();
    assert_eq!(data, reference.data);
    for (i, (t, o)) in h.tensors().iter().zip(w.offsets()).enumerate() {
        assert_eq!(t.offset, o);
        let r = h.tensor_range(i).unwrap();
        assert_eq!(&file[r.start as usize..r.end as usize], &data[i][..]);
    }
    assert_eq!(reference.done, vec![0, 1, 2, 3, 4]);
}

#[test]
fn metadata_values_round_trip() {
    let w = rich_writer();
    let (h, _) = parse_bytes(&w.to_bytes()).unwrap();
    let written = {
        // The writer's entries, compared through a second parse of a writer-made copy.
        let mut w2 = GgufWriter::new();
        for (k, v) in h.metadata() {
            w2.meta(k.clone(), v.clone());
        }
        parse_bytes(&w2.to_bytes()).unwrap().0
    };
    assert_eq!(h.metadata(), written.metadata());
    assert_eq!(h.get("t.u8"), Some(&MetaValue::U8(200)));
    assert_eq!(h.get("t.i8"), Some(&MetaValue::I8(-5)));
    assert_eq!(h.get("t.i16"), Some(&MetaValue::I16(-30000)));
    assert_eq!(h.get("t.i32"), Some(&MetaValue::I32(-2_000_000_000)));
    assert_eq!(h.get("t.i64"), Some(&MetaValue::I64(i64::MIN)));
    assert_eq!(h.get("t.f64"), Some(&MetaValue::F64(-2.25)));
    assert_eq!(h.get_u32("t.u32"), Some(4_000_000_000));
    assert_eq!(
        h.get_u64("t.u16"),
        Some(60000),
        "get_u64 widens any unsigned type"
    );
    assert_eq!(h.get_u64("t.u64"), Some(u64::MAX));
    assert_eq!(h.get_u32("t.u64"), None, "does not fit in u32");
    assert_eq!(h.get_u64("t.i32"), None, "signed is not coerced");
    assert_eq!(h.get_f32("t.f32"), Some(1.5));
    assert_eq!(h.get_bool("t.bool"), Some(true));
    assert_eq!(h.get_str("t.string"), Some("héllo wörld"));
    assert_eq!(h.architecture(), Some("llama"));
    let toks = h.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(toks, ["<s>", "</s>", "a", "", "ü"]);
    assert_eq!(
        h.get_array("t.scores"),
        Some(&MetaArray::F32(vec![0.5, -1.0, 3.0]))
    );
    assert_eq!(
        h.get_array("t.empty").map(|a| a.elem_type()),
        Some(ValueType::I64)
    );
    let nested = h.get_array("t.nested").unwrap();
    let MetaArray::Array(inner) = nested else {
        panic!("not nested: {nested:?}")
    };
    assert_eq!(inner[1], MetaArray::empty(ValueType::String));
    assert_eq!(
        inner[2],
        MetaArray::Array(vec![
            MetaArray::String(vec!["deep".into()]),
            MetaArray::Bool(vec![false, true])
        ])
    );
    assert_eq!(h.get("missing"), None);
}

#[test]
fn tensor_table_fields() {
    let (h, _) = parse_bytes(&rich_writer().to_bytes()).unwrap();
    let q = h.tensor("c.q8_0").unwrap();
    assert_eq!(
        (q.dims.clone(), q.ty, q.type_id),
        (vec![64, 2], GgmlType::Q8_0, 8)
    );
    assert_eq!((q.n_elements, q.size, q.n_rows()), (128, 136, 2));
    assert_eq!(h.tensor_index("e.i8"), Some(4));
    assert_eq!(h.tensor("a.f32").unwrap().size, 60);
    assert!(h.tensor("nope").is_none());
    assert_eq!(h.data_end(), h.tensor_range(4).unwrap().end);
    check_gpu_supported(&h).expect_err("i8 is not a GPU type");
}

#[test]
fn version_2_parses() {
    let mut w = GgufWriter::new().with_version(2);
    w.meta("general.architecture", "qwen2")
        .tensor_f32("x", &[2], &[1.0, 2.0]);
    let (h, data) = parse_bytes(&w.to_bytes()).unwrap();
    assert_eq!(h.version(), 2);
    assert_eq!(h.alignment(), DEFAULT_ALIGNMENT);
    assert_eq!(
        data[0],
        [1.0f32.to_le_bytes(), 2.0f32.to_le_bytes()].concat()
    );
}

#[test]
fn empty_model_has_header_only() {
    let file = GgufWriter::new().to_bytes();
    let p = parse_chunked(&file, 1, None).unwrap();
    assert!(p.header.tensors().is_empty() && p.header.metadata().is_empty());
}

#[test]
fn data_arrives_in_offset_order_not_table_order() {
    // Two equal-size tensors whose records point at each other's data.
    let mut w = GgufWriter::new();
    w.tensor("first", &[32], GgmlType::I8, bytes(32, 7)).tensor(
        "second",
        &[32],
        GgmlType::I8,
        bytes(32, 9),
    );
    let off = w.offsets();
    w.override_offset(0, off[1]).override_offset(1, off[0]);
    let file = w.to_bytes();
    for chunk in [1, 5, file.len()] {
        let p = parse_chunked(&file, chunk, None).unwrap();
        assert_eq!(p.done, vec![1, 0]);
        assert_eq!(
            p.data[1],
            bytes(32, 7),
            "tensor 1 reads the bytes at offset 0"
        );
    }
}

#[test]
fn gpu_support_check_names_the_tensor() {
    let mut w = GgufWriter::new();
    w.tensor_f32("ok", &[1], &[0.0]).tensor(
        "blk.0.ffn_up.weight",
        &[256],
        GgmlType::Iq2Xs,
        bytes(74, 0),
    );
    let (h, _) = parse_bytes(&w.to_bytes()).unwrap();
    let e = check_gpu_supported(&h).unwrap_err();
    assert_eq!(
        e,
        GgufError::UnsupportedTensorType {
            tensor: "blk.0.ffn_up.weight".into(),
            ty: GgmlType::Iq2Xs
        }
    );
    let msg = e.to_string();
    assert!(
        msg.contains("blk.0.ffn_up.weight") && msg.contains("iq2_xs"),
        "{msg}"
    );
}

#[test]
fn consumer_error_stops_the_parser() {
    let file = rich_writer().to_bytes();
    let mut p = GgufParser::new();
    let mut fail = |e: Event<'_>| match e {
        Event::TensorData { .. } => Err(GgufError::Aborted("gpu upload failed".into())),
        _ => Ok(()),
    };
    let e = p.push(&file, &mut fail).unwrap_err();
    assert_eq!(e, GgufError::Aborted("gpu upload failed".into()));
    assert_eq!(
        p.push(&[], &mut |_| Ok(())),
        Err(e.clone()),
        "a failed parser stays failed"
    );
    assert_eq!(p.finish(), Err(e));
}

#[test]
fn large_vocabulary_bytewise() {
    // A realistic tokenizer-sized header fed one byte at a time: steps stay small, so this is
    // linear in the input, and the step buffer never holds more than one token.
    let n = 50_000;
    let tokens: Vec<String> = (0..n).map(|i| format!("tok{i}")).collect();
    let mut w = GgufWriter::new();
    w.meta("tokenizer.ggml.tokens", tokens.clone())
        .meta("tokenizer.ggml.scores", vec![0.5f32; n]);
    let file = w.to_bytes();
    let mut p = GgufParser::new();
    let mut header = None;
    for b in file.chunks(1) {
        p.push(b, &mut |e| {
            if let Event::Header(h) = e {
                header = Some(h);
            }
            Ok(())
        })
        .unwrap();
        assert!(p.buffered_bytes() <= 64, "buffered {}", p.buffered_bytes());
    }
    p.finish().unwrap();
    let h = header.unwrap();
    assert_eq!(
        h.get_str_array("tokenizer.ggml.tokens").unwrap(),
        &tokens[..]
    );
    assert_eq!(
        h.get_array("tokenizer.ggml.scores").map(MetaArray::len),
        Some(n)
    );
}
