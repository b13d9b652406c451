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
//     out = sum o_i exp(m_i - M) / L. (A decode step with few chunks runs no reduce: the o
//     projection's workgroups combine them themselves, matmul.wgsl's X_SPLIT; the loop over the
//     chunks is split_decls.tmpl's, shared.)
//
// Defines (chosen in src/ops/attention_split.rs, which reads CHUNK and WG_SIZE back for the grid
// and the scratch size):
//   WG_SIZE: invocations per workgroup (a power of two, >= NV: one thread per vector of V).
//   CHUNK: cells per partial workgroup (a multiple of 4).
//   TEAM: threads that share one cell's q . k (a power of two dividing WG_SIZE): lane r of a team
//     reads vectors r, r + TEAM, ... of the K row, so a team's loads are consecutive words
//     (coalesced); the TEAM partial dots meet in workgroup memory.
//   VEC4: Q, K, V, out and scratch are read as vec4 (head_dim % 4 == 0 and 4-aligned offsets),
//     otherwise as vec2 (head_dim is even, offsets even).
//   FRESH (partial only; one token): the step's q, k and v arrive raw, as columns of the
//     projection output bound as `q` (row stride in_stride; q head h at q_offset + h *
//     q_head_stride, kv head j's k at k_offset + j * HD, its v at v_offset + j * HD), and this
//     dispatch does qk_rope.wgsl's work as well: each workgroup norms (NORM: per-head RMS norm
//     with the weights in norm_w, q's then k's) and ropes its q head into workgroup memory; the
//     workgroups of the chunk holding the step's cell `pos` also norm and rope k of their kv
//     head and take its v, use both for that cell from workgroup memory, and the one whose head
//     is first of its kv group writes them to the caches. No workgroup of the dispatch reads
//     cell pos from the caches, so that write races nothing. It saves a dispatch a layer.
//     HD: head_dim (the workgroup arrays' size); WG_SIZE >= HD / 2 (a thread a rope pair).
// The workgroup index is linear in a 2-D grid (get_wid), so the grid may pass 65535 workgroups.
//
// Loads and loops: a loop iteration that loads from memory waits for its loads before the next
// iteration issues any (measured on an H200 with naga's SPIR-V: docs/dispatch.md), and a decode
// step runs these two dispatches once a layer. So the partial reads Q beside K (not through
// workgroup memory), loads its first V rows before the scores, and its loops over a K row and
// over a chunk's V rows take four a step; the reduce makes one pass over its chunks, four a
// step, with a running max. The four are explicit variables (an array indexed in a loop may be
// placed in local memory), their indices clamped and the terms past the end dropped.
//
// Loop iterations per invocation (lavapipe stops every loop of an invocation after 65535 in
// total: attention.wgsl, LOOP_NOTE): the partial runs O(CHUNK + NV) iterations; the reduce
// O(chunks / WG_SIZE + chunks / groups), a few thousand for a 128k-cell cache.
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
    // FRESH only (qk_rope.wgsl's meaning):
    n_rot: u32,
    rope_type: u32,     // 0 NeoX, 1 NORM
    eps: f32,           // NORM
    attn_factor: f32,   // multiplies the rotated pairs
    in_stride: u32,     // elements between one token's projection row and the next
    q_head_stride: u32, // elements between q heads in the row
    k_offset: u32,      // element index of token 0's k, kv head 0
    v_offset: u32,      // element index of token 0's v, kv head 0
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
#ifdef FRESH
#include "rope_decls.tmpl"
@group(0) @binding(2) var<storage, read_write> k_cache: array<VecN>;   // (n_ctx, n_kv_head, NV)
@group(0) @binding(3) var<storage, read_write> v_cache: array<VecN>;   // (n_ctx, n_kv_head, NV)
@group(0) @binding(7) var<storage, read> freq: array<vec2<u32>>;       // (n_rot / 2): rope turns
#ifdef NORM
@group(0) @binding(8) var<storage, read> norm_w: array<f32>;           // (2, HD): q's, then k's
#endif
#else
@group(0) @binding(2) var<storage, read> k_cache: array<VecN>;         // (n_ctx, n_kv_head, NV)
@group(0) @binding(3) var<storage, read> v_cache: array<VecN>;         // (n_ctx, n_kv_head, NV)
#endif
@group(0) @binding(4) var<storage, read_write> scratch: array<VecN>;   // o then ml (layout above)
@group(0) @binding(5) var<storage, read_write> out: array<VecN>;       // (n_tokens, n_head, NV) from out_offset / W
@group(0) @binding(6) var<storage, read> step: StepState;              // this step's positions
#include "split_decls.tmpl"

const TEAMS: u32 = WG_SIZE / TEAM;
// Row stride of `red`: one pad word so the lanes of a team and the cells of a column fall in
// different banks.
const RED_STRIDE: u32 = TEAM + 1u;

var<workgroup> red: array<f32, CHUNK * RED_STRIDE>;    // (CHUNK, TEAM) partial dots
var<workgroup> sc: array<vec4<f32>, CHUNK / 4u>;       // the chunk's scores, four per entry
var<workgroup> pw: array<f32, CHUNK>;                  // exp(score - chunk max)
var<workgroup> part: array<VecN, WG_SIZE>;             // (groups, NV) partial V sums
var<workgroup> lpart: array<f32, WG_SIZE>;             // (groups, NV) partial softmax sums
var<workgroup> mred: array<f32, WG_SIZE>;              // (groups, NV) the reduce's running maxima
#ifdef FRESH
var<workgroup> qv: array<VecN, HD / W>;                // the roped q head
var<workgroup> kn: array<VecN, HD / W>;                // cell pos's k, roped
var<workgroup> vn: array<VecN, HD / W>;                // cell pos's v
// NORM: q's and k's sums of squares, a pair a thread, then SQ_PARTS partial sums (two barriers
// where a tree over the workgroup takes log2(WG_SIZE)).
const SQ_PARTS: u32 = min(16u, WG_SIZE);
var<workgroup> nsum: array<vec2<f32>, WG_SIZE>;
var<workgroup> nsq: array<vec2<f32>, SQ_PARTS>;

// Element i of the projection output.
fn raw(i: u32) -> f32 {
    return q[i / W][i % W];
}

// Vector j of the query (roped in workgroup memory).
fn q_vec(qb: u32, j: u32) -> VecN {
    return qv[j];
}

// V vector j of chunk cell i: the fresh cell's, or the cache's (vb: vector j of the chunk's
// first cell; cells rs vectors apart).
fn v_vec(i: u32, fresh: u32, vb: u32, rs: u32, j: u32) -> VecN {
    if i == fresh {
        return vn[j];
    }
    return v_cache[vb + i * rs];
}
#else
fn q_vec(qb: u32, j: u32) -> VecN {
    return q[qb + j];
}

fn v_vec(i: u32, fresh: u32, vb: u32, rs: u32, j: u32) -> VecN {
    return v_cache[vb + i * rs];
}
#endif

// A cell index no chunk has: the chunk holds no fresh cell.
const NO_CELL: u32 = 0xffffffffu;

// First cell token `pos` sees: the window start, or 0.
fn first_cell(pos: u32) -> u32 {
    return split_first_cell(pos, p.window);
}

// Scale, then the soft cap (attention.wgsl's order and clamp).
fn logit(d: f32) -> f32 {
    var s = d * p.scale;
    if p.softcap > 0.0 {
        s = p.softcap * tanh(clamp(s / p.softcap, -15.0, 15.0));
    }
    return s;
}

#ifdef FRESH
// qk_rope.wgsl's work for this workgroup (FRESH above): its q head, normed and roped, into qv;
// where `last` (the chunk holds cell pos), k of kv head kvh likewise into kn and its v into vn,
// and both into the caches from the first head of the kv group. Every thread of the workgroup
// calls it (barriers). Thread lid takes rope pair lid of q and of k; the loads are issued
// together, before the norm's barriers.
fn fresh_qkv(t: u32, h: u32, kvh: u32, pos: u32, last: bool, lid: u32) {
    let half = HD / 2u;
    let nv = HD / W;
    let row = t * p.in_stride;
    let qs = p.q_offset + row + h * p.q_head_stride;
    // Outside the last chunk k is not needed: its loads re-read q's and are dropped.
    let ks = select(qs, p.k_offset + row + kvh * HD, last);
    let vs = (p.v_offset + row + kvh * HD) / W;
    // Threads past the pairs take the last pair and drop it.
    let jp = min(lid, half - 1u);
    let e = rope_pair(jp, p.n_rot, p.rope_type);
    let fr = freq[min(jp, max(p.n_rot / 2u, 1u) - 1u)];
    var q0 = raw(qs + e.x);
    var q1 = raw(qs + e.y);
    var k0 = raw(ks + e.x);
    var k1 = raw(ks + e.y);
    let v = q[vs + min(lid, nv - 1u)];
#ifdef NORM
    let wq = vec2<f32>(norm_w[e.x], norm_w[e.y]);
    let wk = vec2<f32>(norm_w[HD + e.x], norm_w[HD + e.y]);
    nsum[lid] = select(vec2<f32>(0.0), vec2<f32>(q0 * q0 + q1 * q1, k0 * k0 + k1 * k1), lid < half);
    workgroupBarrier();
    let span = WG_SIZE / SQ_PARTS;
    if lid < SQ_PARTS {
        var a = vec2<f32>(0.0);
        for (var i = 0u; i < span; i++) {
            a += nsum[lid * span + i];
        }
        nsq[lid] = a;
    }
    workgroupBarrier();
    var ss = vec2<f32>(0.0);
    for (var i = 0u; i < SQ_PARTS; i++) {
        ss += nsq[i];
    }
    let inv = 1.0 / sqrt(ss / f32(HD) + p.eps);
    q0 = q0 * inv.x * wq.x;
    q1 = q1 * inv.x * wq.y;
    k0 = k0 * inv.y * wk.x;
    k1 = k1 * inv.y * wk.y;
#endif
    if lid < half {
        if jp < p.n_rot / 2u {
            let cs = rope_cos_sin(pos, fr) * p.attn_factor;
            let rq = rotate_rope(q0, q1, cs.x, cs.y);
            let rk = rotate_rope(k0, k1, cs.x, cs.y);
            q0 = rq.x;
            q1 = rq.y;
            k0 = rk.x;
            k1 = rk.y;
        }
        qv[e.x / W][e.x % W] = q0;
        qv[e.y / W][e.y % W] = q1;
        kn[e.x / W][e.x % W] = k0;
        kn[e.y / W][e.y % W] = k1;
    }
    if lid < nv {
        vn[lid] = v;
    }
    workgroupBarrier();
    if last && lid < nv && h % (p.n_head / p.n_kv_head) == 0u {
        let cell = (pos * p.n_kv_head + kvh) * nv + lid;
        k_cache[cell] = kn[lid];
        v_cache[cell] = v;
    }
}
#endif

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
    let nv = p.head_dim / W;
    let qb = p.q_offset / W + pair * nv;
    let rs = p.n_kv_head * nv; // vectors from K[c, kvh, j] to K[c + 1, kvh, j]
    let kb = (c0 * p.n_kv_head + kvh) * nv;
    // The chunk index of cell pos in the chunk that holds it (FRESH), else NO_CELL.
#ifdef FRESH
    let fresh = select(NO_CELL, n - 1u, c1 == pos + 1u);
    fresh_qkv(t, h, kvh, pos, fresh != NO_CELL, lid);
#else
    let fresh = NO_CELL;
#endif

    // The V sum's thread (vg, j) adds vector j of cells vg, vg + groups, ... (consecutive threads
    // read consecutive vectors of a V row). Its first step's four V rows are loaded here, with
    // the K rows below: they do not depend on the scores (threads past groups * nv, and cells
    // past the chunk's end, load clamped indices and use nothing).
    let groups = WG_SIZE / nv;
    let vg = lid / nv;
    let j = lid % nv;
    let vb = kb + j;
    let il = n - 1u;
    let i0 = min(vg, il);
    let i1 = min(vg + groups, il);
    let i2 = min(vg + 2u * groups, il);
    let i3 = min(vg + 3u * groups, il);
    var v0 = v_vec(i0, fresh, vb, rs, j);
    var v1 = v_vec(i1, fresh, vb, rs, j);
    var v2 = v_vec(i2, fresh, vb, rs, j);
    var v3 = v_vec(i3, fresh, vb, rs, j);

    // Scores: team g takes cells g, g + TEAMS, ...; its lane r sums vectors r, r + TEAM, ... of Q
    // and the K row, four a step, loaded together (see "Loads and loops" above); past the row's
    // end a lane re-reads its last vector and drops the product.
    let g = lid / TEAM;
    let r = lid % TEAM;
    let jl = nv - 1u;
    for (var i = g; i < n; i += TEAMS) {
        let row = kb + i * rs;
        var d = 0.0;
#ifdef FRESH
        // The fresh cell's k is in workgroup memory (the whole team takes this branch).
        if i == fresh {
            for (var jj = r; jj < nv; jj += TEAM) {
                d += dot(qv[jj], kn[jj]);
            }
            red[i * RED_STRIDE + r] = d;
            continue;
        }
#endif
        for (var jj = r; jj < nv; jj += 4u * TEAM) {
            let j1 = min(jj + TEAM, jl);
            let j2 = min(jj + 2u * TEAM, jl);
            let j3 = min(jj + 3u * TEAM, jl);
            let q0 = q_vec(qb, jj);
            let q1 = q_vec(qb, j1);
            let q2 = q_vec(qb, j2);
            let q3 = q_vec(qb, j3);
            let k0 = k_cache[row + jj];
            let k1 = k_cache[row + j1];
            let k2 = k_cache[row + j2];
            let k3 = k_cache[row + j3];
            d += dot(q0, k0);
            d += select(0.0, dot(q1, k1), jj + TEAM < nv);
            d += select(0.0, dot(q2, k2), jj + 2u * TEAM < nv);
            d += select(0.0, dot(q3, k3), jj + 3u * TEAM < nv);
        }
        red[i * RED_STRIDE + r] = d;
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
    for (var i = 0u; i < (n + 3u) / 4u; i++) {
        mv = max(mv, sc[i]);
    }
    let m = max(max(mv.x, mv.y), max(mv.z, mv.w));
    for (var i = lid; i < n; i += WG_SIZE) {
        pw[i] = exp(sc[i / 4u][i % 4u] - m);
    }
    workgroupBarrier();

    // The V sum, four cells a step (the first step's loaded above); past the chunk's end the
    // weight is 0.
    var acc = VecN(0.0);
    var l = 0.0;
    if vg < groups {
        for (var i = vg; i < n; i += 4u * groups) {
            let i1 = i + groups;
            let i2 = i + 2u * groups;
            let i3 = i + 3u * groups;
            if i != vg {
                let e1 = min(i1, il);
                let e2 = min(i2, il);
                let e3 = min(i3, il);
                v0 = v_vec(i, fresh, vb, rs, j);
                v1 = v_vec(e1, fresh, vb, rs, j);
                v2 = v_vec(e2, fresh, vb, rs, j);
                v3 = v_vec(e3, fresh, vb, rs, j);
            }
            let w0 = pw[i];
            let w1 = select(0.0, pw[min(i1, il)], i1 < n);
            let w2 = select(0.0, pw[min(i2, il)], i2 < n);
            let w3 = select(0.0, pw[min(i3, il)], i3 < n);
            l += w0 + w1;
            acc += w0 * v0 + w1 * v1;
            l += w2 + w3;
            acc += w2 * v2 + w3 * v3;
        }
    }
    part[lid] = acc;
    lpart[lid] = l;
    workgroupBarrier();
    if lid < nv {
        var a = VecN(0.0);
        var ls = 0.0;
        for (var gg = 0u; gg < groups; gg++) {
            a += part[gg * nv + lid];
            ls += lpart[gg * nv + lid];
        }
        let slot = pair * p.n_chunks + chunk;
        scratch[slot * nv + lid] = a;
        if lid == 0u {
            scratch[p.n_tokens * p.n_head * p.n_chunks * nv + slot] = pack_ml(m, ls);
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
    let nv = p.head_dim / W;
    let slot0 = pair * p.n_chunks;
    let mlb = n_pairs * p.n_chunks * nv + slot0;

    // Thread (vg, j) takes vector j of chunks k0 + vg, k0 + vg + groups, ... (split_sum); the
    // groups' sums meet at the end, each rescaled to the largest max.
    let groups = WG_SIZE / nv;
    let vg = lid / nv;
    let j = lid % nv;
    var sum = SplitSum(VecN(0.0), 0.0, NEG_BIG);
    if vg < groups {
        sum = split_sum(slot0, mlb, k0 + vg, k1, groups, j, nv);
    }
    part[lid] = sum.acc;
    lpart[lid] = sum.l;
    mred[lid] = sum.m;
    workgroupBarrier();
    if lid < nv {
        var big_m = NEG_BIG;
        for (var gg = 0u; gg < groups; gg++) {
            big_m = max(big_m, mred[gg * nv + lid]);
        }
        var a = VecN(0.0);
        var ls = 0.0;
        for (var gg = 0u; gg < groups; gg++) {
            let e = exp(mred[gg * nv + lid] - big_m);
            a += e * part[gg * nv + lid];
            ls += e * lpart[gg * nv + lid];
        }
        out[p.out_offset / W + pair * nv + lid] = a / ls;
    }
}
