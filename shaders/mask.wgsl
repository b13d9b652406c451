// Token mask for constrained decoding: logits of tokens the grammar forbids become -inf, in place,
// before penalties and argmax / top-k (src/generate/constraint.rs computes the mask on the CPU).
// The mask is a bitset over the vocabulary: bit (i % 32) of word (i / 32) set = token i allowed.
// One invocation per logit, 2-D grid (get_wid).

#include "common_decls.tmpl"

struct MaskParams {
    n_vocab: u32,
    // -inf, given by the host: Tint rejects -inf as a constant (even `bitcast<f32>(0xff800000u)`
    // is folded and refused as "cannot be represented as 'f32'"), a uniform is not folded.
    masked: f32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: MaskParams;
@group(0) @binding(1) var<storage, read> mask: array<u32>;         // (ceil(n_vocab / 32)) allowed bits
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;  // (n_vocab)

@compute @workgroup_size(WG_SIZE)
fn mask_logits(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let i = get_wid(wid, nwg) * WG_SIZE + lid.x;
    if i >= p.n_vocab {
        return;
    }
    if ((mask[i >> 5u] >> (i & 31u)) & 1u) == 0u {
        logits[i] = p.masked;
    }
}
