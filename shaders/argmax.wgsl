// Argmax over logits: the greedy sampler, reading back 4 bytes per token (docs/architecture.md, decision 7).
//
// One stage reduces CHUNK = WG_SIZE * ITEMS inputs per workgroup to one (value, index) pair. The
// first stage (FROM_LOGITS) reads f32 logits; later stages read the previous stage's pairs, until
// one pair is left. The host (src/ops/argmax.rs) plans the stages; the grid is 2-D (get_wid).
//
// Ties go to the lowest index, as llama.cpp's greedy sampler keeps the first maximum. The empty
// pair has index NONE and loses to everything. WG_SIZE must be a power of two (tree reduction).

#include "common_decls.tmpl"

struct ArgmaxParams {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

const NONE: u32 = 0xffffffffu;
const CHUNK: u32 = WG_SIZE * ITEMS;

@group(0) @binding(0) var<uniform> p: ArgmaxParams;
#ifdef FROM_LOGITS
@group(0) @binding(1) var<storage, read> src: array<f32>;        // (n) logits
#else
@group(0) @binding(1) var<storage, read> src: array<vec2<u32>>;  // (n) (f32 bits, index) of the previous stage
#endif
@group(0) @binding(2) var<storage, read_write> dst: array<vec2<u32>>; // (ceil(n / CHUNK)) (f32 bits, index)
#ifdef ADVANCE
// The last stage of a chained greedy decode (src/generate/session.rs, decode_chained): the
// winner is the next step's input and joins the chain's ids, and the step's positions move on
// by one token, so the CPU writes nothing between steps.
@group(0) @binding(3) var<storage, read_write> step: array<u32>;        // StepState, then ids
@group(0) @binding(4) var<storage, read_write> chain: array<vec2<u32>>; // (CHAIN) the ids so far
#endif

var<workgroup> sv: array<f32, WG_SIZE>;
var<workgroup> si: array<u32, WG_SIZE>;

// Is (av, ai) a better pick than (bv, bi)? Larger value, then lower index; NONE never wins.
fn better(av: f32, ai: u32, bv: f32, bi: u32) -> bool {
    return ai != NONE && (bi == NONE || av > bv || (av == bv && ai < bi));
}

@compute @workgroup_size(WG_SIZE)
fn argmax(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let g = get_wid(wid, nwg);
    if g * CHUNK >= p.n {
        return; // the tail of the 2-D grid's last row: uniform across the workgroup
    }
    let base = g * CHUNK;
    var bv = 0.0;
    var bi = NONE;
    for (var j = 0u; j < ITEMS; j++) {
        let i = base + j * WG_SIZE + lid.x;
        if i < p.n {
#ifdef FROM_LOGITS
            let v = src[i];
            let id = i;
#else
            let v = bitcast<f32>(src[i].x);
            let id = src[i].y;
#endif
            if better(v, id, bv, bi) {
                bv = v;
                bi = id;
            }
        }
    }
    sv[lid.x] = bv;
    si[lid.x] = bi;
    workgroupBarrier();
    for (var s = WG_SIZE / 2u; s > 0u; s >>= 1u) {
        if lid.x < s {
            let ov = sv[lid.x + s];
            let oi = si[lid.x + s];
            if better(ov, oi, sv[lid.x], si[lid.x]) {
                sv[lid.x] = ov;
                si[lid.x] = oi;
            }
        }
        workgroupBarrier();
    }
    if lid.x == 0u {
        let pair = vec2<u32>(bitcast<u32>(sv[0]), si[0]);
        dst[g] = pair;
#ifdef ADVANCE
        // One workgroup (the last stage). StepState words: pos0, n_tokens, n_past, chained;
        // the ids from word 4. A decode step has one token: pos0 = n_past, n_past + 1.
        let i = step[3];
        chain[min(i, arrayLength(&chain) - 1u)] = pair;
        step[3] = i + 1u;
        step[0] = step[2];
        step[2] = step[2] + 1u;
        step[4] = si[0];
#endif
    }
}
