// Logit soft-capping, in place: x = cap * tanh(x / cap) over `count` values (Gemma 2's final
// logits, as llama.cpp's scale, tanh, scale). tanh is written with exp so that large |x| (where
// WGSL's tanh may be computed as a ratio of overflowing exps on some backends) saturates to +-1.
//
// Defines (src/ops/softcap.rs): WG_SIZE. One invocation per value, in a 2-D grid.

#include "common_decls.tmpl"

struct SoftcapParams {
    count: u32,
    offset: u32, // element index of the first value
    cap: f32,
    pad0: u32,
}

@group(0) @binding(0) var<uniform> p: SoftcapParams;
@group(0) @binding(1) var<storage, read_write> x: array<f32>; // (count) from offset

@compute @workgroup_size(WG_SIZE)
fn softcap(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let idx = get_wid(wid, nwg) * WG_SIZE + lid;
    if idx >= p.count {
        return;
    }
    let v = x[p.offset + idx] / p.cap;
    // tanh(v) = sign(v) (1 - e) / (1 + e) with e = exp(-2 |v|) in (0, 1]: no overflow.
    let e = exp(-2.0 * abs(v));
    x[p.offset + idx] = p.cap * sign(v) * (1.0 - e) / (1.0 + e);
}
