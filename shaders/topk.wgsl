// Top-K candidates over logits: the GPU half of sampling (docs/architecture.md, decision 7). The CPU samples
// among the K pairs this leaves, reading back K * 8 + 8 bytes per token instead of the logits.
//
// One stage reduces CHUNK = WG_SIZE * ITEMS inputs per workgroup to its K (= TOPK) best (value, id) pairs,
// sorted descending, ties by lower id. The first stage (FROM_LOGITS) reads f32 logits; later
// stages read the previous stage's pairs (K per workgroup) until one workgroup is left.
//
// How a workgroup finds its top K: each invocation sorts its ITEMS inputs in private memory
// (insertion sort), then K rounds of a tree reduction over the invocations' heads pick the best
// head; its owner advances. K rounds of log2(WG_SIZE) steps, no global sort.
//
// Beside the pairs, each workgroup also writes (max, sum of exp(x - max)) over all its inputs:
// the full-vocabulary softmax normalizer, so top-p can use llama.cpp's full-vocab probabilities
// even though only K candidates come back. Later stages combine these per input workgroup.
//
// Empty pairs (fewer than K inputs) have id NONE and value LOWEST. WG_SIZE must be a power of
// two and CHUNK a multiple of K, larger than K (the host checks).

#include "common_decls.tmpl"

struct TopkParams {
    n: u32,
    // Workgroups of the previous stage (entries of src_stats); 0 in the first stage.
    n_groups_in: u32,
    _pad0: u32,
    _pad1: u32,
}

const NONE: u32 = 0xffffffffu;
// The lowest finite f32, as a hex literal (Tint rejects the rounded decimal -3.40282347e38 as out of range).
const LOWEST: f32 = -0x1.fffffep+127f;
const CHUNK: u32 = WG_SIZE * ITEMS;

@group(0) @binding(0) var<uniform> p: TopkParams;
#ifdef FROM_LOGITS
@group(0) @binding(1) var<storage, read> src: array<f32>;                // (n) logits
#else
@group(0) @binding(1) var<storage, read> src: array<vec2<u32>>;          // (n) (f32 bits, id), TOPK per previous workgroup
@group(0) @binding(2) var<storage, read> src_stats: array<vec2<f32>>;    // (n_groups_in) (max, sum exp)
#endif
@group(0) @binding(3) var<storage, read_write> dst: array<vec2<u32>>;      // (groups, TOPK) (f32 bits, id)
@group(0) @binding(4) var<storage, read_write> dst_stats: array<vec2<f32>>; // (groups) (max, sum exp)

var<workgroup> sv: array<f32, WG_SIZE>;
var<workgroup> si: array<u32, WG_SIZE>;
var<workgroup> so: array<u32, WG_SIZE>; // owner invocation of the pair (top-K rounds) / unused for stats

fn better(av: f32, ai: u32, bv: f32, bi: u32) -> bool {
    return ai != NONE && (bi == NONE || av > bv || (av == bv && ai < bi));
}

// exp(x - m), exactly 1 when x == m (also when both are -inf).
fn rel_exp(x: f32, m: f32) -> f32 {
    return select(exp(x - m), 1.0, x == m);
}

// (max, sum) of two (max, sum exp(x - max)) pairs.
fn combine(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let m = max(a.x, b.x);
    return vec2<f32>(m, a.y * rel_exp(a.x, m) + b.y * rel_exp(b.x, m));
}

@compute @workgroup_size(WG_SIZE)
fn topk(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let g = get_wid(wid, nwg);
    if g * CHUNK >= p.n {
        return; // the tail of the 2-D grid's last row: uniform across the workgroup
    }
    let base = g * CHUNK;

    // This invocation's inputs, sorted best first.
    var lv: array<f32, ITEMS>;
    var li: array<u32, ITEMS>;
    var cnt = 0u;
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
            if id != NONE {
                var k = cnt;
                while k > 0u && better(v, id, lv[k - 1u], li[k - 1u]) {
                    lv[k] = lv[k - 1u];
                    li[k] = li[k - 1u];
                    k -= 1u;
                }
                lv[k] = v;
                li[k] = id;
                cnt += 1u;
            }
        }
    }

    // Stats: (max, sum exp) of this workgroup's inputs.
    var st = vec2<f32>(LOWEST, 0.0);
#ifdef FROM_LOGITS
    if cnt > 0u {
        var s = 0.0;
        for (var j = 0u; j < cnt; j++) {
            s += rel_exp(lv[j], lv[0]);
        }
        st = vec2<f32>(lv[0], s);
    }
#else
    // The previous stage's workgroups whose pairs this workgroup reads.
    let per_chunk = CHUNK / TOPK;
    for (var q = lid.x; q < per_chunk; q += WG_SIZE) {
        let gi = g * per_chunk + q;
        if gi < p.n_groups_in {
            st = combine(st, src_stats[gi]);
        }
    }
#endif
    sv[lid.x] = st.x;
    si[lid.x] = bitcast<u32>(st.y);
    workgroupBarrier();
    for (var s = WG_SIZE / 2u; s > 0u; s >>= 1u) {
        if lid.x < s {
            let c = combine(vec2<f32>(sv[lid.x], bitcast<f32>(si[lid.x])), vec2<f32>(sv[lid.x + s], bitcast<f32>(si[lid.x + s])));
            sv[lid.x] = c.x;
            si[lid.x] = bitcast<u32>(c.y);
        }
        workgroupBarrier();
    }
    if lid.x == 0u {
        dst_stats[g] = vec2<f32>(sv[0], bitcast<f32>(si[0]));
    }
    workgroupBarrier();

    // K rounds: the best head wins, its owner moves on.
    var h = 0u;
    for (var r = 0u; r < TOPK; r++) {
        if h < cnt {
            sv[lid.x] = lv[h];
            si[lid.x] = li[h];
        } else {
            sv[lid.x] = LOWEST;
            si[lid.x] = NONE;
        }
        so[lid.x] = lid.x;
        workgroupBarrier();
        for (var s = WG_SIZE / 2u; s > 0u; s >>= 1u) {
            if lid.x < s && better(sv[lid.x + s], si[lid.x + s], sv[lid.x], si[lid.x]) {
                sv[lid.x] = sv[lid.x + s];
                si[lid.x] = si[lid.x + s];
                so[lid.x] = so[lid.x + s];
            }
            workgroupBarrier();
        }
        let wi = si[0];
        if lid.x == 0u {
            dst[g * TOPK + r] = vec2<u32>(bitcast<u32>(sv[0]), wi);
        }
        if wi != NONE && so[0] == lid.x {
            h += 1u;
        }
        workgroupBarrier();
    }
}
