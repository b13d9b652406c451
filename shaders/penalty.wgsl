// Repetition, frequency and presence penalties, in place on the logits, before argmax / top-k.
// llama.cpp's llama_sampler_penalties, per token seen in the last penalty_last_n with count c:
//     logit = logit <= 0 ? logit * repeat : logit / repeat
//     logit -= c * frequency + (c > 0 ? presence : 0)
// The host passes each distinct token once (id, count), so no two invocations touch one logit.
// One invocation per pair, 2-D grid (get_wid).

#include "common_decls.tmpl"

struct PenaltyParams {
    n_pairs: u32,
    n_vocab: u32,
    repeat: f32,
    frequency: f32,
    presence: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: PenaltyParams;
@group(0) @binding(1) var<storage, read> pairs: array<vec2<u32>>;   // (n_pairs) (token id, count)
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;  // (n_vocab)

@compute @workgroup_size(WG_SIZE)
fn penalty(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let i = get_wid(wid, nwg) * WG_SIZE + lid.x;
    if i >= p.n_pairs {
        return;
    }
    let id = pairs[i].x;
    let count = pairs[i].y;
    if id >= p.n_vocab || count == 0u {
        return;
    }
    var l = logits[id];
    if l <= 0.0 {
        l = l * p.repeat;
    } else {
        l = l / p.repeat;
    }
    l -= f32(count) * p.frequency + p.presence;
    logits[id] = l;
}
