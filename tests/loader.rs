//! The streaming loader on synthetic GGUF files: every supported type, any chunking, a tiny
//! staging area, tensors forced to split; the GPU holds exactly the repacked file bytes.
//! Runs natively and in headless Chrome.

mod common;

use cera_web::gguf::{GgmlType, GgufWriter};
use cera_web::gpu::readback::read_buffer;
use cera_web::gpu::{GpuContext, GpuTensor};
use cera_web::loader::StreamLoader;
use cera_web::quant::gpu::repack_rows;
use cera_web::quant::legacy::widen_to_q8_0;
use cera_web::ErrorCode;
use common::Rng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// `(name, type, cols, rows)` of the synthetic model: every GPU type, odd row counts.
const TENSORS: &[(&str, GgmlType, u64, u64)] = &[
    ("norm.weight", GgmlType::F32, 37, 1),
    ("a.f32", GgmlType::F32, 40, 9),
    ("a.f16", GgmlType::F16, 33, 7),
    ("a.bf16", GgmlType::BF16, 64, 5),
    ("a.q8_0", GgmlType::Q8_0, 64, 13),
    ("a.q4_0", GgmlType::Q4_0, 96, 11),
    ("a.q4_1", GgmlType::Q4_1, 32, 9),
    ("a.q5_0", GgmlType::Q5_0, 64, 7),
    ("a.q5_1", GgmlType::Q5_1, 32, 5),
    ("a.q4_k", GgmlType::Q4K, 256, 6),
    ("a.q5_k", GgmlType::Q5K, 512, 3),
    ("a.q6_k", GgmlType::Q6K, 256, 5),
    // Projections the loader fuses: q and k (Q8_0) with v (Q4_0, widened to Q8_0: its values
    // unchanged, 5 of 21 rows); gate and up (one type); a layer without k, whose q and v are not
    // neighbours and stay apart; a layer whose widening would add more than half its bytes (q
    // and k fuse as Q5_0, v alone); a layer whose types do not widen (Q4_1 beside Q8_0: apart).
    ("blk.0.attn_q.weight", GgmlType::Q8_0, 64, 11),
    ("blk.0.attn_k.weight", GgmlType::Q8_0, 64, 5),
    ("blk.0.attn_v.weight", GgmlType::Q4_0, 64, 5),
    ("blk.0.ffn_gate.weight", GgmlType::Q4K, 256, 3),
    ("blk.0.ffn_up.weight", GgmlType::Q4K, 256, 4),
    ("blk.1.attn_q.weight", GgmlType::F16, 33, 3),
    ("blk.1.attn_v.weight", GgmlType::F16, 33, 2),
    ("blk.2.attn_q.weight", GgmlType::Q5_0, 64, 20),
    ("blk.2.attn_k.weight", GgmlType::Q5_0, 64, 20),
    ("blk.2.attn_v.weight", GgmlType::Q8_0, 64, 2),
    ("blk.3.attn_q.weight", GgmlType::Q4_1, 32, 3),
    ("blk.3.attn_k.weight", GgmlType::Q8_0, 32, 3),
];

/// A fused tensor: its name, its type, and `(member, first row)` of each member.
type Fused = (&'static str, GgmlType, &'static [(&'static str, u64)]);

/// What the loader fuses from `TENSORS`.
const FUSED: &[Fused] = &[
    (
        "blk.0.attn_q.weight+blk.0.attn_k.weight+blk.0.attn_v.weight",
        GgmlType::Q8_0,
        &[
            ("blk.0.attn_q.weight", 0),
            ("blk.0.attn_k.weight", 11),
            ("blk.0.attn_v.weight", 16),
        ],
    ),
    (
        "blk.0.ffn_gate.weight+blk.0.ffn_up.weight",
        GgmlType::Q4K,
        &[("blk.0.ffn_gate.weight", 0), ("blk.0.ffn_up.weight", 3)],
    ),
    (
        "blk.2.attn_q.weight+blk.2.attn_k.weight",
        GgmlType::Q5_0,
        &[("blk.2.attn_q.weight", 0), ("blk.2.attn_k.weight", 20)],
    ),
];

/// Random block bytes with every f16 field a sane small value (so no NaN patterns matter).
fn tensor_bytes(rng: &mut Rng, ty: GgmlType, cols: u64, rows: u64) -> Vec<u8> {
    let n = (ty.row_bytes(cols).unwrap() * rows) as usize;
    (0..n).map(|_| (rng.next_u64() >> 56) as u8).collect()
}

fn model(seed: u64) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut rng = Rng::new(seed);
    let mut w = GgufWriter::new();
    w.meta("general.architecture", "test");
    let mut datas = Vec::new();
    for &(name, ty, cols, rows) in TENSORS {
        let d = tensor_bytes(&mut rng, ty, cols, rows);
        let dims: Vec<u64> = if rows == 1 {
            vec![cols]
        } else {
            vec![cols, rows]
        };
        w.tensor(name, &dims, ty, d.clone());
        datas.push(d);
    }
    (w.to_bytes(), datas)
}

/// Bytes of rows `first .. first + rows` of `t`, across its parts.
async fn read_rows(ctx: &GpuContext, t: &GpuTensor, first: u64, rows: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for part in &t.parts {
        let (a, b) = (
            first.max(part.row_start),
            (first + rows).min(part.row_start + part.rows),
        );
        if a < b {
            out.extend(
                read_buffer(
                    ctx,
                    &part.buffer,
                    (a - part.row_start) * t.row_bytes,
                    (b - a) * t.row_bytes,
                )
                .await
                .unwrap(),
            );
        }
    }
    out
}

async fn load_and_check(chunk: usize, staging: usize, max_binding: Option<u64>, fuse: bool) {
    let ctx = common::shared_context().await;
    let (file, datas) = model(7);
    let mut loader = StreamLoader::new(&ctx, Some(file.len() as u64))
        .with_staging(staging)
        .with_fusion(fuse);
    if let Some(b) = max_binding {
        loader = loader.with_max_binding(b);
    }
    for c in file.chunks(chunk) {
        loader.push(c).unwrap();
    }
    let peak = loader.peak_staging();
    let p = loader.progress();
    assert_eq!(
        (p.tensors_loaded, p.tensors_total, p.loaded_bytes),
        (TENSORS.len(), TENSORS.len(), file.len() as u64)
    );
    let model = loader.finish().unwrap();
    let max_row = TENSORS
        .iter()
        .map(|t| t.1.row_bytes(t.2).unwrap())
        .max()
        .unwrap() as usize;
    assert!(
        peak <= staging.max(max_row) + max_row,
        "staging held {peak} bytes (cap {staging})"
    );
    // Every tensor of the file, on its own or as rows of a fused one, holds its repacked bytes.
    for (&(name, ty, cols, rows), data) in TENSORS.iter().zip(&datas) {
        assert!(model.has(name), "{name} missing");
        let (t, first) = model.rows_of(name).unwrap();
        let fused = FUSED
            .iter()
            .find(|(_, _, m)| m.iter().any(|&(n, _)| n == name));
        // The type the GPU stores the rows in: the fused tensor's where the member is fused.
        let stored = match (fuse, fused) {
            (true, Some((f, fty, members))) => {
                assert_eq!(t.name, *f, "{name} fused into");
                assert_eq!(
                    first,
                    members.iter().find(|&&(n, _)| n == name).unwrap().1,
                    "{name}: first row"
                );
                assert!(model.tensor(name).is_err(), "{name} also stands alone");
                *fty
            }
            _ => {
                assert_eq!(
                    (t.name.as_str(), first, t.rows),
                    (name, 0, rows),
                    "{name} stands alone"
                );
                ty
            }
        };
        assert_eq!((t.ty, t.cols), (stored, cols), "{name}");
        let mut want = Vec::new();
        if stored == ty {
            repack_rows(ty, cols, data, &mut want).unwrap();
        } else {
            // Widened: the same values as Q8_0 blocks (quant::tests checks the values).
            let mut q8 = Vec::new();
            widen_to_q8_0(ty, data, &mut q8).unwrap();
            repack_rows(stored, cols, &q8, &mut want).unwrap();
        }
        assert_eq!(
            read_rows(&ctx, t, first, rows).await,
            want,
            "{name}: GPU bytes differ from the repacked file bytes"
        );
    }
    if fuse {
        assert_eq!(
            model.fused.len(),
            FUSED.iter().map(|f| f.2.len()).sum::<usize>()
        );
        for (f, _, members) in FUSED {
            let rows: u64 = members
                .iter()
                .map(|&(n, _)| TENSORS.iter().find(|t| t.0 == n).unwrap().3)
                .sum();
            assert_eq!(model.tensor(f).unwrap().rows, rows, "{f}: rows");
        }
    } else {
        assert!(model.fused.is_empty());
    }
    // The plan counts each buffer once, fused or not.
    let gpu: u64 = model.tensors.values().map(|t| t.rows * t.row_bytes).sum();
    assert_eq!(model.plan.total_gpu_bytes, gpu);
    assert_eq!(
        model.plan.buffers,
        model.tensors.values().map(|t| t.parts.len()).sum::<usize>()
    );
    let splits = model.tensors.values().filter(|t| t.parts.len() > 1).count();
    assert_eq!(model.plan.split_tensors, splits);
    if let Some(cap) = max_binding {
        for t in model.tensors.values() {
            assert!(
                t.parts.iter().all(|p| p.rows * t.row_bytes <= cap),
                "{}: part above the binding cap",
                t.name
            );
        }
        assert!(splits >= 3, "the cap should force several splits");
    }
}

gpu_test!(
    whole_file_one_chunk,
    load_and_check(usize::MAX, 4 << 20, None, true)
);
gpu_test!(
    whole_file_without_fusion,
    load_and_check(usize::MAX, 4 << 20, None, false)
);
gpu_test!(
    chunks_of_7_bytes_staging_of_100,
    load_and_check(7, 100, None, true)
);
gpu_test!(
    chunks_of_4096_forced_splits,
    load_and_check(4096, 1000, Some(512), true)
);
gpu_test!(
    chunks_of_1_byte_splits,
    load_and_check(1, 64, Some(1024), true)
);

async fn errors() {
    let ctx = common::shared_context().await;
    let (file, _) = model(9);
    // Truncated in the middle of the tensor data.
    let mut l = StreamLoader::new(&ctx, None);
    l.push(&file[..file.len() - 100]).unwrap();
    let e = l.finish().err().expect("truncated file must fail");
    assert_eq!(e.code, ErrorCode::BadGguf, "{e}");
    let last = TENSORS.last().unwrap().0;
    assert!(e.message.contains(last), "names the tensor {last}: {e}");
    // Not a GGUF at all.
    let mut l = StreamLoader::new(&ctx, None);
    let e = l
        .push(b"PK\x03\x04 this is a zip file, not a model.......")
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::BadGguf, "{e}");
    // A quant type the GPU path does not run, named with its tensor.
    let mut w = GgufWriter::new();
    w.tensor(
        "blk.0.ffn_up.weight",
        &[256, 2],
        GgmlType::Q2K,
        vec![0u8; 84 * 2],
    );
    let mut l = StreamLoader::new(&ctx, None);
    let e = l.push(&w.to_bytes()).unwrap_err();
    assert_eq!(e.code, ErrorCode::UnsupportedQuant, "{e}");
    assert!(
        e.message.contains("blk.0.ffn_up.weight") && e.message.contains("q2_K"),
        "{e}"
    );
    // An architecture we do not run, in one chunk with its weights: the header check refuses it
    // before any tensor is written (without the check, the same chunk loads its tensor).
    let mut w = GgufWriter::new();
    w.meta("general.architecture", "qwen3next");
    w.tensor_f32("blk.0.attn_norm.weight", &[64], &[1.0; 64]);
    let bytes = w.to_bytes();
    let mut l = StreamLoader::new(&ctx, Some(bytes.len() as u64))
        .with_header_check(|h| cera_web::model::HParams::from_gguf(h).map(|_| ()));
    let e = l.push(&bytes).unwrap_err();
    assert_eq!(e.code, ErrorCode::UnsupportedArch, "{e}");
    assert!(e.message.contains("\"qwen3next\""), "{e}");
    assert_eq!(
        l.progress().tensors_loaded,
        0,
        "a tensor was written before the check"
    );
    let mut l = StreamLoader::new(&ctx, Some(bytes.len() as u64));
    l.push(&bytes).unwrap();
    assert_eq!(l.progress().tensors_loaded, 1);
    // A row larger than the binding limit: the adapter is too small.
    let mut w = GgufWriter::new();
    w.tensor_f32("wide", &[1024, 2], &vec![0.5; 2048]);
    let mut l = StreamLoader::new(&ctx, None).with_max_binding(1024);
    let e = l.push(&w.to_bytes()).unwrap_err();
    assert_eq!(e.code, ErrorCode::AdapterTooSmall, "{e}");
    assert!(e.message.contains("wide"), "{e}");
}
gpu_test!(bad_input_gets_clear_errors, errors());

/// In the browser, `Engine.load` of bytes whose header names an architecture we do not run
/// rejects with `UNSUPPORTED_ARCH` naming it, here with the header and the weights in one chunk
/// (the engine's header check; `bad_input_gets_clear_errors` shows that check writes nothing).
#[cfg(target_arch = "wasm32")]
#[wasm_bindgen_test::wasm_bindgen_test]
async fn engine_refuses_an_unknown_architecture_from_its_header() {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", "qwen3next");
    w.tensor_f32("blk.0.attn_norm.weight", &[64], &[1.0; 64]);
    let bytes = js_sys::Uint8Array::from(&w.to_bytes()[..]);
    let r = wasm_bindgen_futures::JsFuture::from(cera_web::web::engine::Engine::load(
        bytes.into(),
        wasm_bindgen::JsValue::UNDEFINED,
    ))
    .await;
    let e = r.expect_err("a qwen3next header must be refused");
    let get = |k: &str| {
        js_sys::Reflect::get(&e, &k.into())
            .ok()
            .and_then(|v| v.as_string())
            .unwrap_or_default()
    };
    assert_eq!(get("code"), "UNSUPPORTED_ARCH", "{}", get("message"));
    assert!(
        get("message").contains("\"qwen3next\""),
        "{}",
        get("message")
    );
}
