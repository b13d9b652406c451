// Flash-decoding: attention split over chunks of the KV cache, for decode (one token, few heads,
// a long cache), where one workgroup per (token, head) leaves most of a GPU idle.
// Same math and mask as attention.wgsl: out[t, h, :] = softmax_c(s(t, h, c)) . V[c, kvh, :] with
//   s = scale * dot(Q[t, h, :], K[c, kvh, :]), then s = softcap * tanh(s / softcap) if softcap > 0,
//   kvh = h / (n_head / n_kv_head), cells lo <= c <= pos, pos = step.pos0 + pos0 + t,
//   lo = pos - window + 1 when window > 0 (and pos + 1 > window), else 0.
//
// Two entry points, dispatched one after the other:
//   partial: one workgroup per (token, head, chunk of CHUNK cells). It scores the cells of its
//     chunk that the mask allows and writes, for the chunk, m = max score, l = sum exp(s - m) and
//     o = sum exp(s - m) V (unnormalised) to the scratch buffer. A chunk with no allowed cell
//     (past pos, or before the window) writes nothing: the reduce never reads it.
//   reduce: one workgroup per (token, head). It combines the chunks that hold an allowed cell,
//     [lo / CHUNK, pos / CHUNK], which are exactly the chunks the partial wrote in this step (so
//     a stale partial of an earlier step is never read): M = max m_i, L = sum l_i exp(m_i - M),
//     out = sum o_i exp(m_i - M) / L.
//
// Defines (chosen in src/ops/attention_split.rs, which reads CHUNK and WG_SIZE back for the grid
// and the scratch size):
//   WG_SIZE: invocations per workgroup (a power of two, >= NV: one thread per vector of V).
//   NV: vectors of width W in a head (head_dim / W), so every loop below has a constant trip
//     count.
//   CHUNK: cells per partial workgroup (a multiple of 4).
//   TEAM: threads that share one cell's q . k (a power of two dividing WG_SIZE): lane r of a team
//     reads vectors r, r + TEAM, ... of the K row, so a team's loads are consecutive words
//     (coalesced); the TEAM partial dots meet in workgroup memory.
//   VEC4: Q, K, V, out and scratch are read as vec4 (head_dim % 4 == 0 and 4-aligned offsets),
//     otherwise as vec2 (head_dim is even, offsets even).
// The workgroup index is linear in a 2-D grid (get_wid), so the grid may pass 65535 workgroups.
//
// Loads and loops: a loop iteration that loads from memory waits for its loads before the next
// iteration issues any (on an H200 with naga's SPIR-V, measured on the RMS norm: docs/dispatch.md),
// and a decode step runs these two dispatches once a layer, each a chain of such waits. So the
// partial issues all its loads (its lanes' share of Q, the chunk's K rows and V rows) before any
// arithmetic, in loops of constant trip count over clamped indices (cells past the chunk's
// allowed end re-read its last cell, their results dropped); the reduce walks its chunks RU at a
// time the same way, with a running max so that the maxima and the sums come in one pass.
//
// Loop iterations per invocation (lavapipe stops every loop of an invocation after 65535 in
// total: attention.wgsl, LOOP_NOTE): the partial runs O(CHUNK + NV) iterations; the reduce
// O(chunks / (groups * RU) + WG_SIZE / NV), a few thousand for a 128k-cell cache.
//
// Scratch layout, in vectors of the variant's width W:
//   o:  (n_tokens * n_head, n_chunks, NV) from vector 0
//   ml: (n_tokens * n_head, n_chunks) one vector each, (m, l) in .x and .y, after o.

#include "common_decls.tmpl"

struct SplitParams {
    n_tokens: u32,
    n_head: u32,
    n_kv_head: u32,
    head_dim: u32,
    pos0: u32,       // added to step.pos0: token t sits at position (== cell) step.pos0 + pos0 + t
    window: u32,     // sliding window in cells; 0 = none
    scale: f32,      // applied to q . k
    softcap: f32,    // 0 = off
    q_offset: u32,   // element index of Q[0, 0, 0] (a multiple of W)
    out_offset: u32, // element index of out[0, 0, 0] (a multiple of W)
    n_chunks: u32,   // chunks per (token, head) in the grid and the scratch: ceil(max_cells / CHUNK)
    pad0: u32,
}

#ifdef VEC4
alias VecN = vec4<f32>;
const W: u32 = 4u;
fn pack_ml(m: f32, l: f32) -> VecN {
    return vec4<f32>(m, l, 0.0, 0.0);
}
#else
alias VecN = vec2<f32>;
const W: u32 = 2u;
fn pack_ml(m: f32, l: f32) -> VecN {
    return vec2<f32>(m, l);
}
#endif

@group(0) @binding(0) var<uniform> p: SplitParams;
@group(0) @binding(1) var<storage, read> q: array<VecN>;               // (n_tokens, n_head, NV) from q_offset / W
@group(0) @binding(2) var<storage, read> k_cache: array<VecN>;         // (n_ctx, n_kv_head, NV)
@group(0) @binding(3) var<storage, read> v_cache: array<VecN>;         // (n_ctx, n_kv_head, NV)
@group(0) @binding(4) var<storage, read_write> scratch: array<VecN>;   // o then ml (layout above)
@group(0) @binding(5) var<storage, read_write> out: array<VecN>;       // (n_tokens, n_head, NV) from out_offset / W
@group(0) @binding(6) var<storage, read> step: StepState;              // this step's positions

const TEAMS: u32 = WG_SIZE / TEAM;
const NVT: u32 = (NV + TEAM - 1u) / TEAM;       // vectors of a K row each lane of a team reads
const CPT: u32 = (CHUNK + TEAMS - 1u) / TEAMS;  // cells each team scores
const GROUPS: u32 = WG_SIZE / NV;               // thread groups of the V sum (NV threads each)
const VPT: u32 = (CHUNK + GROUPS - 1u) / GROUPS; // V rows each thread adds
const RU: u32 = 4u;                             // chunks a reduce thread loads per loop step
// Row stride of `red`: one pad word so the lanes of a team and the cells of a column fall in
// different banks.
const RED_STRIDE: u32 = TEAM + 1u;
// A "minus infinity" that stays finite: exp(NEG_BIG - s) is exactly 0 for any real score, and no
// inf - inf NaN can arise.
const NEG_BIG: f32 = -1e30;

var<workgroup> red: array<f32, CHUNK * RED_STRIDE>;    // (CHUNK, TEAM) partial dots
var<workgroup> sc: array<vec4<f32>, CHUNK / 4u>;       // the chunk's scores, four per entry
var<workgroup> pw: array<f32, CHUNK>;                  // exp(score - chunk max)
var<workgroup> part: array<VecN, WG_SIZE>;             // (GROUPS, NV) partial V sums
var<workgroup> lpart: array<f32, WG_SIZE>;             // (GROUPS, NV) partial softmax sums
var<workgroup> mpart: array<f32, WG_SIZE>;             // (GROUPS, NV) the reduce's partial maxima

// First cell token `pos` sees: the window start, or 0.
fn first_cell(pos: u32) -> u32 {
    if p.window > 0u && pos + 1u > p.window {
        return pos + 1u - p.window;
    }
    return 0u;
}

// Scale, then the soft cap (attention.wgsl's order and clamp).
fn logit(d: f32) -> f32 {
    var s = d * p.scale;
    if p.softcap > 0.0 {
        s = p.softcap * tanh(clamp(s / p.softcap, -15.0, 15.0));
    }
    return s;
}

@compute @workgroup_size(WG_SIZE)
fn partial(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // Everything that decides a return is uniform across the workgroup (barriers below).
    let w = get_wid(wid, nwg);
    if w >= p.n_tokens * p.n_head * p.n_chunks {
        return;
    }
    let pair = w / p.n_chunks;
    let chunk = w % p.n_chunks;
    let t = pair / p.n_head;
    let h = pair % p.n_head;
    let kvh = h / (p.n_head / p.n_kv_head);
    let pos = step.pos0 + p.pos0 + t;
    // The allowed cells of this chunk: [c0, c1).
    let c0 = max(chunk * CHUNK, first_cell(pos));
    let c1 = min(chunk * CHUNK + CHUNK, pos + 1u);
    if c0 >= c1 {
        return;
    }
    let n = c1 - c0;
    let qb = p.q_offset / W + pair * NV;
    let rs = p.n_kv_head * NV; // vectors from K[c, kvh, j] to K[c + 1, kvh, j]
    let kb = (c0 * p.n_kv_head + kvh) * NV;

    // Every load first. Scores: team g takes cells g + TEAMS * i (i < CPT); its lane r reads
    // vectors r + TEAM * u (u < NVT) of Q and of each K row (a team's loads are consecutive
    // words). The V sum: thread (vg, j) adds vector j of cells vg + GROUPS * u (u < VPT).
    let g = lid / TEAM;
    let r = lid % TEAM;
    var qr: array<VecN, NVT>;
    var kr: array<VecN, NVT * CPT>;
    for (var u = 0u; u < NVT; u++) {
        qr[u] = q[qb + min(r + TEAM * u, NV - 1u)];
    }
    for (var i = 0u; i < CPT; i++) {
        let row = kb + min(g + TEAMS * i, n - 1u) * rs;
        for (var u = 0u; u < NVT; u++) {
            kr[i * NVT + u] = k_cache[row + min(r + TEAM * u, NV - 1u)];
        }
    }
    let vg = lid / NV;
    let j = lid % NV;
    var vr: array<VecN, VPT>;
    for (var u = 0u; u < VPT; u++) {
        vr[u] = v_cache[kb + j + min(vg + GROUPS * u, n - 1u) * rs];
    }

    for (var i = 0u; i < CPT; i++) {
        let c = g + TEAMS * i;
        var d = 0.0;
        for (var u = 0u; u < NVT; u++) {
            d += select(0.0, dot(qr[u], kr[i * NVT + u]), r + TEAM * u < NV);
        }
        if c < n {
            red[c * RED_STRIDE + r] = d;
        }
    }
    workgroupBarrier();
    for (var i = lid; i < CHUNK; i += WG_SIZE) {
        var s = NEG_BIG; // cells past n: whole vec4s of sc can be read below
        if i < n {
            var d = 0.0;
            for (var lane = 0u; lane < TEAM; lane++) {
                d += red[i * RED_STRIDE + lane];
            }
            s = logit(d);
        }
        sc[i / 4u][i % 4u] = s;
    }
    workgroupBarrier();
    // The chunk max: every thread reads every score (broadcast reads of workgroup memory).
    var mv = vec4<f32>(NEG_BIG);
    for (var i = 0u; i < CHUNK / 4u; i++) {
        mv = max(mv, sc[i]);
    }
    let m = max(max(mv.x, mv.y), max(mv.z, mv.w));
    for (var i = lid; i < CHUNK; i += WG_SIZE) {
        pw[i] = select(0.0, exp(sc[i / 4u][i % 4u] - m), i < n);
    }
    workgroupBarrier();

    var acc = VecN(0.0);
    var l = 0.0;
    if vg < GROUPS {
        for (var u = 0u; u < VPT; u++) {
            let c = vg + GROUPS * u;
            let wc = select(0.0, pw[min(c, CHUNK - 1u)], c < n);
            l += wc;
            acc += wc * vr[u];
        }
    }
    part[lid] = acc;
    lpart[lid] = l;
    workgroupBarrier();
    if lid < NV {
        var a = VecN(0.0);
        var ls = 0.0;
        for (var gg = 0u; gg < GROUPS; gg++) {
            a += part[gg * NV + lid];
            ls += lpart[gg * NV + lid];
        }
        let slot = pair * p.n_chunks + chunk;
        scratch[slot * NV + lid] = a;
        if lid == 0u {
            scratch[p.n_tokens * p.n_head * p.n_chunks * NV + slot] = pack_ml(m, ls);
        }
    }
}

@compute @workgroup_size(WG_SIZE)
fn reduce(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let pair = get_wid(wid, nwg);
    let n_pairs = p.n_tokens * p.n_head;
    if pair >= n_pairs {
        return;
    }
    let t = pair / p.n_head;
    let pos = step.pos0 + p.pos0 + t;
    // The chunks the partial wrote this step: those holding an allowed cell.
    let k0 = first_cell(pos) / CHUNK;
    let k1 = pos / CHUNK + 1u;
    let slot0 = pair * p.n_chunks;
    let mlb = n_pairs * p.n_chunks * NV + slot0;

    // Thread (vg, j) takes vector j of chunks k0 + vg, k0 + vg + GROUPS, ..., RU a step (loads
    // first, clamped to the last chunk), and keeps a running max mt: acc and l are sums scaled
    // by exp(-mt).
    let vg = lid / NV;
    let j = lid % NV;
    var acc = VecN(0.0);
    var l = 0.0;
    var mt = NEG_BIG;
    if vg < GROUPS {
        for (var i = k0 + vg; i < k1; i += RU * GROUPS) {
            var ml: array<VecN, RU>;
            var o: array<VecN, RU>;
            for (var u = 0u; u < RU; u++) {
                let c = min(i + GROUPS * u, k1 - 1u);
                ml[u] = scratch[mlb + c];
                o[u] = scratch[(slot0 + c) * NV + j];
            }
            for (var u = 0u; u < RU; u++) {
                if i + GROUPS * u < k1 {
                    let mn = max(mt, ml[u].x);
                    let keep = exp(mt - mn);
                    let e = exp(ml[u].x - mn);
                    acc = acc * keep + e * o[u];
                    l = l * keep + e * ml[u].y;
                    mt = mn;
                }
            }
        }
    }
    part[lid] = acc;
    lpart[lid] = l;
    mpart[lid] = mt;
    workgroupBarrier();
    if lid < NV {
        var big_m = NEG_BIG;
        for (var gg = 0u; gg < GROUPS; gg++) {
            big_m = max(big_m, mpart[gg * NV + lid]);
        }
        var a = VecN(0.0);
        var ls = 0.0;
        for (var gg = 0u; gg < GROUPS; gg++) {
            let e = exp(mpart[gg * NV + lid] - big_m);
            a += e * part[gg * NV + lid];
            ls += e * lpart[gg * NV + lid];
        }
        out[p.out_offset / W + pair * NV + lid] = a / ls;
    }
}
