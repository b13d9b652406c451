//! Every shader variant through naga (parse + validate), and every params struct against the
//! WGSL struct of the same name. Native only: naga needs no GPU.
#![cfg(not(target_arch = "wasm32"))]

use cera_web::gpu::shaders;

fn parse(src: &cera_web::gpu::preprocess::Preprocessed, label: &str) -> naga::Module {
    naga::front::wgsl::parse_str(&src.source).unwrap_or_else(|e| {
        let loc = e
            .location(&src.source)
            .map(|l| src.origin(l.line_number as usize))
            .unwrap_or_default();
        panic!(
            "{label}: WGSL parse error at {loc}:\n{}",
            e.emit_to_string(&src.source)
        )
    })
}

#[test]
fn every_shader_variant_validates() {
    let variants = cera_web::ops::all_variants();
    assert!(!variants.is_empty());
    for v in &variants {
        let src = v.expand().unwrap();
        let label = v.label();
        let module = parse(&src, &label);
        // unpack2x16float is core WGSL, but naga files it under SHADER_FLOAT16_IN_FLOAT32 (for GLSL
        // ES targets); wgpu grants it on every Vulkan/Metal/DX12 device and the browser needs none.
        // SUBGROUP: the matmul variants that use subgroup shuffles (built only where the device
        // has the feature).
        // COOPERATIVE_MATRIX and SHADER_FLOAT16: gemm_coop.wgsl (built only where the device has
        // both).
        let caps = naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32
            | naga::valid::Capabilities::SUBGROUP
            | naga::valid::Capabilities::COOPERATIVE_MATRIX
            | naga::valid::Capabilities::SHADER_FLOAT16;
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| {
                panic!(
                    "{label}: validation failed:\n{}",
                    e.emit_to_string(&src.source)
                )
            });
        assert!(
            module.entry_points.iter().any(|e| e.name == v.entry),
            "{label}: no entry {}",
            v.entry
        );
    }
    eprintln!("validated {} shader variants", variants.len());
}

#[test]
fn every_shader_file_is_used_by_a_variant_or_included() {
    let variants = cera_web::ops::all_variants();
    for (name, _) in shaders::FILES {
        let used = name.ends_with(".tmpl") || variants.iter().any(|v| v.shader == *name);
        assert!(used, "{name} has no variant in ops::all_variants()");
    }
}

#[test]
fn params_structs_match_their_wgsl_layout() {
    for (name, fields, size, shader) in cera_web::ops::all_params() {
        let v = cera_web::ops::all_variants()
            .into_iter()
            .find(|v| v.shader == shader)
            .unwrap();
        let src = v.expand().unwrap();
        let module = parse(&src, shader);
        let ty = module
            .types
            .iter()
            .find(|(_, t)| t.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("{shader} declares no struct {name}"))
            .1;
        let naga::TypeInner::Struct { members, span } = &ty.inner else {
            panic!("{name} is not a struct")
        };
        let wgsl: Vec<(String, usize)> = members
            .iter()
            .map(|m| (m.name.clone().unwrap_or_default(), m.offset as usize))
            .collect();
        let rust: Vec<(String, usize)> = fields.iter().map(|(n, o)| (n.to_string(), *o)).collect();
        assert_eq!(
            wgsl, rust,
            "{name}: field names/offsets differ between Rust and {shader}"
        );
        assert_eq!(
            *span as usize, size,
            "{name}: size differs between Rust and {shader}"
        );
    }
}

/// The attention shapes' workgroup memory, as the host budgets it
/// (`attention::coop_group_workgroup_bytes` and `tiled_workgroup_bytes`, checked against the
/// adapter's limit before a shape is chosen), equals what the compiled shader declares, for
/// every workgroup size, head group and tile it is built with.
#[test]
fn attention_workgroup_memory_matches_the_host_formula() {
    use cera_web::ops::attention::{
        coop_group_workgroup_bytes, key, tiled_workgroup_bytes, AttentionConfig,
    };
    let mut cases: Vec<(AttentionConfig, u32, u32)> = Vec::new();
    for wg in [64u32, 128, 256, 512] {
        for group in [1u32, 2, 4] {
            let cfg = AttentionConfig::grouped(wg, group);
            cases.push((cfg, 128, coop_group_workgroup_bytes(wg, group)));
        }
    }
    for (bq, bc, hd) in [(16u32, 16u32, 128u32), (8, 16, 256), (4, 8, 80)] {
        let cfg = AttentionConfig {
            workgroup_size: bq * bc,
            ..AttentionConfig::tiled(bq, bc)
        };
        cases.push((cfg, hd, tiled_workgroup_bytes(bq, bc, hd / 2)));
    }
    for (cfg, hd, want) in cases {
        let k = key(cfg, hd);
        let src = shaders::expand(k.shader, &k.defines).unwrap();
        let module = parse(&src, "attention.wgsl COOP");
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).unwrap();
        let bytes: u32 = module
            .global_variables
            .iter()
            .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
            .map(|(_, g)| layouter[g.ty].size)
            .sum();
        assert_eq!(bytes, want, "{cfg:?} head_dim {hd}");
    }
}
