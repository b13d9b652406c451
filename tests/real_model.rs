//! The real test model (Gemma 3 270M Q4_K_M, from `scripts/fetch-model`) loads onto the GPU,
//! natively from disk and in headless Chrome through a streaming fetch, and rows of one tensor
//! of every quant type in it, multiplied on the GPU, equal the CPU dequantization of the same
//! file bytes. Natively lavapipe's 128 MiB binding limit splits the 178 MB `token_embd`.
//!
//! Natively the model path is `CERA_TEST_MODEL` (default `models/gemma-3-270m-q4_k_m.gguf`);
//! in the browser the URL is `CERA_TEST_MODEL_URL` at compile time (`npm test` serves it).

mod common;

use cera_web::gguf::GgmlType;
use cera_web::gpu::readback::read_f32;
use cera_web::loader::LoadedModel;
use cera_web::ops::matmul;
use cera_web::quant::dequantize;
use common::Rng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

#[cfg(not(target_arch = "wasm32"))]
fn model_path() -> std::path::PathBuf {
    let p = std::env::var("CERA_TEST_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gemma-3-270m-q4_k_m.gguf")
        });
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-model (npm test does)",
        p.display()
    );
    p
}

#[cfg(target_arch = "wasm32")]
fn model_url() -> &'static str {
    option_env!("CERA_TEST_MODEL_URL")
        .expect("build with CERA_TEST_MODEL_URL set to the served model (npm test does)")
}

fn now_s() -> f64 {
    #[cfg(target_arch = "wasm32")]
    {
        js_sys::Date::now() / 1000.0
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    }
}

async fn load(ctx: &cera_web::gpu::GpuContext) -> LoadedModel {
    #[cfg(not(target_arch = "wasm32"))]
    {
        cera_web::loader::load_file(ctx, &model_path()).expect("load")
    }
    #[cfg(target_arch = "wasm32")]
    {
        let mut last = None;
        let m = cera_web::web::fetch::load_url(ctx, model_url(), &mut |p| last = Some(p))
            .await
            .expect("load");
        let p = last.expect("progress reported");
        assert_eq!(Some(p.loaded_bytes), p.total_bytes);
        assert_eq!(p.tensors_loaded, p.tensors_total);
        m
    }
}

/// File bytes `[start, end)` of the model.
async fn file_bytes(start: u64, end: u64) -> Vec<u8> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(model_path()).unwrap();
        f.seek(SeekFrom::Start(start)).unwrap();
        let mut b = vec![0u8; (end - start) as usize];
        f.read_exact(&mut b).unwrap();
        b
    }
    #[cfg(target_arch = "wasm32")]
    {
        cera_web::web::fetch::range(model_url(), start, end)
            .await
            .unwrap()
    }
}

async fn real_model_loads_and_matches_cpu() {
    check_on(common::context().await).await
}

/// On a device with exactly the WebGPU default limits (128 MiB bindings), as many pages get.
async fn real_model_under_default_limits() {
    let ctx = cera_web::gpu::GpuContext::new(&cera_web::gpu::LimitRequest::webgpu_defaults())
        .await
        .unwrap();
    assert_eq!(ctx.limits.max_storage_buffer_binding_size, 128 << 20);
    check_on(ctx).await
}

async fn check_on(ctx: cera_web::gpu::GpuContext) {
    let t0 = now_s();
    let model = load(&ctx).await;
    let load_s = now_s() - t0;
    #[cfg(target_arch = "wasm32")]
    tlog!(
        "real model: loaded in {load_s:.2} s; wasm memory after load {} MiB",
        cera_web::web::fetch::wasm_memory_bytes() >> 20
    );
    #[cfg(not(target_arch = "wasm32"))]
    tlog!("real model: loaded in {load_s:.2} s");
    let h = model.header.clone();
    assert_eq!(h.architecture(), Some("gemma3"));
    // 236 tensors in the file. Per layer gate and up (Q5_0) are fused into one GPU tensor, and
    // q, k and v into another: Q5_0, or Q8_0 in the layers where Q4_K_M gives v more bits (q and
    // k widened losslessly; blk.0 is one, so its attn_q below is read through the widened rows).
    assert_eq!(h.tensors().len(), 236);
    let ty = |n: String| h.tensor(&n).unwrap().ty;
    let v_wide = (0..18)
        .filter(|l| ty(format!("blk.{l}.attn_v.weight")) == GgmlType::Q8_0)
        .count();
    assert!(v_wide > 0 && v_wide < 18, "{v_wide} layers with a Q8_0 v");
    assert_eq!(ty("blk.0.attn_v.weight".into()), GgmlType::Q8_0);
    for l in 0..18 {
        let (t, _) = model.rows_of(&format!("blk.{l}.attn_q.weight")).unwrap();
        assert_eq!(
            t.ty,
            ty(format!("blk.{l}.attn_v.weight")),
            "layer {l}'s q/k/v"
        );
        assert_eq!(
            t.rows,
            1024 + 256 + 256,
            "layer {l}: q, k and v in one tensor"
        );
    }
    assert_eq!(model.fused.len(), 5 * 18);
    assert_eq!(model.tensors.len(), 236 - 3 * 18);
    tlog!(
        "plan: {:?}, {} buffers, {} split",
        model.plan.gpu_bytes_per_type,
        model.plan.buffers,
        model.plan.split_tensors
    );
    if ctx.limits.max_binding() < 262_144 * 688 {
        assert!(
            model.tensor("token_embd.weight").unwrap().parts.len() >= 2,
            "token_embd must split under this binding limit"
        );
    }

    // One tensor of each type in the file (token_embd is the Q8_0 one), plus attn_q of layer 0.
    let mut names: Vec<String> = vec!["token_embd.weight".into(), "blk.0.attn_q.weight".into()];
    for ty in [GgmlType::Q5_0, GgmlType::Q4K, GgmlType::Q6K, GgmlType::F32] {
        let t = h
            .tensors()
            .iter()
            .find(|t| t.ty == ty)
            .unwrap_or_else(|| panic!("no {ty} tensor"));
        names.push(t.name.clone());
    }
    let mut rng = Rng::new(2024);
    for name in &names {
        let info = h.tensor(name).unwrap().clone();
        // A fused tensor's GEMV computes its members' rows from `first` on.
        let (t, first) = model.rows_of(name).unwrap();
        let x = rng.vec(t.cols as usize);
        let xb = ctx.storage_buffer("x", bytemuck::cast_slice(&x));
        let y = ctx.empty_storage("y", t.rows * 4).unwrap();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        matmul::gemv(&ctx, &mut enc, t, &xb, 0, &y, 0).unwrap();
        ctx.queue.submit([enc.finish()]);
        let got = read_f32(&ctx, &y, 0, t.rows as usize).await.unwrap();
        // Rows at the start, middle and end, and on both sides of every part boundary.
        let n_rows = info.n_rows();
        let mut rows = vec![0, n_rows / 2, n_rows - 1];
        for p in t.parts.iter().skip(1) {
            if p.row_start > first && p.row_start < first + n_rows {
                rows.extend([p.row_start - 1 - first, p.row_start - first]);
            }
        }
        let src_row = info.ty.row_bytes(t.cols).unwrap();
        for r in rows {
            let start = h.data_offset() + info.offset + r * src_row;
            let bytes = file_bytes(start, start + src_row).await;
            let mut w = vec![0f32; t.cols as usize];
            dequantize(info.ty, &bytes, &mut w).unwrap();
            let want: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let scale: f64 = w
                .iter()
                .zip(&x)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum::<f64>()
                .max(1e-6);
            let g = got[(first + r) as usize] as f64;
            let err = (g - want).abs() / scale;
            assert!(
                err < 1e-5,
                "{name} ({}) row {r}: gpu {g} vs cpu {want} (rel {err:e})",
                info.ty
            );
        }
        tlog!("{name} ({}, {n_rows} x {}, rows {first}.. of {}, {} parts): GPU rows match the CPU dequantization", info.ty, t.cols, t.name, t.parts.len());
    }
}
gpu_test!(
    real_model_loads_and_rows_match_cpu_dequant,
    real_model_loads_and_matches_cpu()
);
gpu_test!(
    real_model_under_webgpu_default_limits_splits_token_embd,
    real_model_under_default_limits()
);
