//! Every shader variant the browser may build, compiled by the browser's own WGSL front end
//! (Tint in Chrome). It is stricter than naga in places that `tests/shaders.rs` (naga, native)
//! cannot see: a matmul mask that mixed `<` and `&` without parentheses passed naga and every
//! native test, and failed to compile in Chrome and in Dawn. Each variant's module is created
//! inside an error scope and its compilation messages are read; an error or a warning fails
//! the test (a warning is what the next browser version may turn into an error). Variants with
//! subgroup operations and the cooperative-matrix GEMM are left out: the browser build never
//! asks for them. Browser only.
#![cfg(target_arch = "wasm32")]

mod common;

wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

#[wasm_bindgen_test::wasm_bindgen_test]
async fn every_browser_shader_variant_compiles_in_the_browser() {
    let ctx = common::context().await;
    let variants: Vec<_> = cera_web::ops::all_variants()
        .into_iter()
        .filter(|v| {
            !v.defines.iter().any(|(k, _)| k == "SUBGROUP")
                && v.shader != cera_web::ops::gemm_coop::SHADER
        })
        .collect();
    assert!(!variants.is_empty());
    let mut problems = Vec::new();
    for v in &variants {
        let src = v.expand().unwrap();
        let label = v.label();
        let scope = ctx.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&label),
                source: wgpu::ShaderSource::Wgsl(src.source.clone().into()),
            });
        if let Some(e) = scope.pop().await {
            problems.push(format!("{label}: {e}"));
        }
        for m in module.get_compilation_info().await.messages {
            if m.message_type != wgpu::CompilationMessageType::Info {
                let at = m
                    .location
                    .map(|l| src.origin(l.line_number as usize))
                    .unwrap_or_default();
                problems.push(format!(
                    "{label}: {:?} at {at}: {}",
                    m.message_type, m.message
                ));
            }
        }
    }
    tlog!(
        "{} shader variants compiled by the browser, {} problems",
        variants.len(),
        problems.len()
    );
    assert!(
        problems.is_empty(),
        "{} of {} variants:\n{}",
        problems.len(),
        variants.len(),
        problems.join("\n")
    );
}
