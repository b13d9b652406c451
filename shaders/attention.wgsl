// Causal attention over one layer's KV cache, for decode (one token, a long cache) and prefill
// (a batch of tokens): out[t, h, :] = softmax_c(s(t, h, c)) . V[c, kvh, :], with
//   s = scale * dot(Q[t, h, :], K[c, kvh, :]), then s = softcap * tanh(s / softcap) if softcap > 0,
//   kvh = h / (n_head / n_kv_head)  (GQA / MQA / MHA),
//   cells c <= pos0 + t, and with window > 0 also c > pos0 + t - window (llama.cpp's
//   LLAMA_SWA_TYPE_STANDARD: a cell is masked when pos_token - pos_cell >= window).
// The mask is a contiguous range [lo, pos0 + t], so the kernel walks exactly that range: no
// masked cell is ever read, and every (t, h) has at least one cell (its own).
// The softmax is online (flash-attention style) in f32: running max m, running sum l and the
// running V sum are rescaled by exp(m_old - m_new) once per chunk of cells.
//
// Defines (chosen in src/ops/attention.rs, which reads them back for the dispatch):
//   WG_SIZE: invocations per workgroup.
//   HD2_MAX: vec2 slots of the query / accumulator arrays (MAX_HEAD_DIM / 2 there).
//   SCHUNK: cells per chunk of the simple variant's private score array (SCHUNK there, which
//     also counts its loop iterations for LOOP_NOTE).
//   COOP: one workgroup per token and GQ heads that share a kv head (GQ = 1: per (t, h) pair;
//     the host picks GQ dividing n_head / n_kv_head). Each K and V row read serves GQ heads: with
//     GQ = 1 a Gemma 3 270M prefill at depth 4000 (4 heads on 1 kv head) read every row 4 times
//     per token and was bound by it. Below, "thread i scores cell i" means for each of the GQ
//     heads, and the sums are kept per head.
//     In detail, per (t, h) pair: Per chunk of WG_SIZE cells: thread i scores cell i
//     (writes it to workgroup memory), barrier, every thread takes the chunk max (broadcast
//     reads) and its own cell's weight, barrier, then the threads split V: thread (g, j) sums
//     dims j (as vec2) over cells g, g + G, ... (G = WG_SIZE / (head_dim / 2) groups). The G
//     partial sums are added once at the end. Two barriers per chunk of WG_SIZE cells.
//     Needs WG_SIZE >= head_dim / 2 (the host checks).
//   TILED (prefill): one workgroup per block of BQ query tokens and one head, WG_SIZE = BQ * BC.
//     The block's cells are walked in tiles of BC: the tile's K rows are copied to workgroup
//     memory, thread (i, c) scores query i against cell c, then the V rows replace the K rows
//     and the BC threads of query i rescale its running sums and add its BC weighted V rows for
//     HD2 / BC vec2 dims each. So each K and V row is read from memory once per BQ queries
//     instead of once per query (with COOP a 4000-token prefill read every row 4000 times).
//     HD2 = head_dim / 2 exactly (the host compiles one shape per head size). The K/V tile's
//     rows are HD2 + 1 vec2 apart so that the BC threads scoring one query against BC cells do
//     not all read one memory bank.
//   without COOP: one invocation per (t, h) pair, WG_SIZE pairs per workgroup, no barrier at all
//     (the variant for CPU-emulated adapters, where a barrier is costly). Scores of SCHUNK cells
//     are kept in a private array.
// Q, K, V and out are read as vec2 (head_dim is even; the host checks offsets are even).
// The workgroup index is linear in a 2-D grid (get_wid), so T * n_head may pass 65535.
//
// LOOP_NOTE: Mesa's llvmpipe/lavapipe (22.3, our native test adapter) bounds the *total* loop
// iterations of one shader invocation (every loop together) by LP_MAX_TGSI_LOOP_ITERATIONS =
// 65535, then silently leaves the loops: measured here as a wrong, mostly unwritten output once a
// thread of the simple variant ran about 65k iterations (300 cells x head_dim 256). So the
// inner loops are unrolled (four vec2 of a row, two cells of the V sum, four scores of the
// chunk max per iteration) and the host keeps the simple variant to ranges that fit
// (src/ops/attention.rs, `AttentionConfig::fit`).

#include "common_decls.tmpl"

struct AttentionParams {
    n_tokens: u32,
    n_head: u32,
    n_kv_head: u32,
    head_dim: u32,
    pos0: u32,       // added to step.pos0: token t sits at position (== cell) step.pos0 + pos0 + t
    window: u32,     // sliding window in cells; 0 = none
    scale: f32,      // applied to q . k
    softcap: f32,    // 0 = off
    q_offset: u32,   // element index of Q[0, 0, 0] (even)
    out_offset: u32, // element index of out[0, 0, 0] (even)
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> p: AttentionParams;
@group(0) @binding(1) var<storage, read> q: array<vec2<f32>>;         // (n_tokens, n_head, head_dim / 2) from q_offset
@group(0) @binding(2) var<storage, read> k_cache: array<vec2<f32>>;   // (n_ctx, n_kv_head, head_dim / 2)
@group(0) @binding(3) var<storage, read> v_cache: array<vec2<f32>>;   // (n_ctx, n_kv_head, head_dim / 2)
@group(0) @binding(4) var<storage, read_write> out: array<vec2<f32>>; // (n_tokens, n_head, head_dim / 2) from out_offset
@group(0) @binding(5) var<storage, read> step: StepState;             // this step's positions

// A "minus infinity" that stays finite: exp(NEG_BIG - s) is exactly 0 for any real score, and no
// inf - inf NaN can arise.
const NEG_BIG: f32 = -1e30;

#ifdef TILED
const KV_STRIDE: u32 = HD2 + 1u; // vec2 between rows of the K/V tile (see TILED above)
const OPT: u32 = HD2 / BC;       // vec2 dims per thread in the V sum (the host makes BC divide HD2)
var<workgroup> qt: array<vec2<f32>, BQ * HD2>;       // (BQ, HD2) the block's queries
var<workgroup> kvt: array<vec2<f32>, BC * KV_STRIDE>; // (BC, HD2 + 1) K rows, then V rows
var<workgroup> st: array<f32, BQ * BC>;              // (BQ, BC) the tile's scores
#else
#ifdef COOP
var<workgroup> qv: array<vec2<f32>, GQ * HD2_MAX>;   // (GQ, HD2_MAX) the heads' queries
var<workgroup> sc: array<vec4<f32>, GQ * WG_SIZE / 4u>; // (GQ, WG_SIZE) scores of the chunk
var<workgroup> pw: array<f32, GQ * WG_SIZE>;         // (GQ, WG_SIZE) exp(score - chunk max)
var<workgroup> part: array<vec2<f32>, GQ * WG_SIZE>; // (GQ, G, head_dim / 2) partial V sums
var<workgroup> lpart: array<f32, GQ * WG_SIZE>;      // (GQ, G, head_dim / 2) partial sums
#else
var<private> qv: array<vec2<f32>, HD2_MAX>;
var<private> acc: array<vec2<f32>, HD2_MAX>;
var<private> sc: array<f32, SCHUNK>;
#endif
#endif

#ifndef TILED
// The logit of cell `c` for kv head `kvh`, from the query in `qv`. Unrolled by four vec2: see
// LOOP_NOTE below.
fn score(c: u32, kvh: u32, hd2: u32) -> f32 {
    let kb = (c * p.n_kv_head + kvh) * hd2;
    var d = 0.0;
    var j = 0u;
    for (; j + 4u <= hd2; j += 4u) {
        d += dot(qv[j], k_cache[kb + j]) + dot(qv[j + 1u], k_cache[kb + j + 1u])
            + dot(qv[j + 2u], k_cache[kb + j + 2u]) + dot(qv[j + 3u], k_cache[kb + j + 3u]);
    }
    for (; j < hd2; j++) {
        d += dot(qv[j], k_cache[kb + j]);
    }
    return cap(d * p.scale);
}
#endif

// The soft cap of a scaled logit (none when softcap is 0).
fn cap(s: f32) -> f32 {
    if p.softcap > 0.0 {
        // The clamp keeps tanh away from exp overflow in implementations that build it from exp;
        // tanh(15) is 1 in f32 already.
        return p.softcap * tanh(clamp(s / p.softcap, -15.0, 15.0));
    }
    return s;
}

// First cell token `pos` sees: the window start, or 0.
fn first_cell(pos: u32) -> u32 {
    if p.window > 0u && pos + 1u > p.window {
        return pos + 1u - p.window;
    }
    return 0u;
}

#ifdef TILED
@compute @workgroup_size(WG_SIZE)
fn attention(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // Workgroup g takes query block g / n_head of head g % n_head. Everything the barriers
    // depend on is uniform across the workgroup.
    let g = get_wid(wid, nwg);
    let n_blocks = (p.n_tokens + BQ - 1u) / BQ;
    if g >= n_blocks * p.n_head {
        return;
    }
    let h = g % p.n_head;
    let t0 = (g / p.n_head) * BQ;
    let nq = min(BQ, p.n_tokens - t0);
    let kvh = h / (p.n_head / p.n_kv_head);
    let pos_first = step.pos0 + p.pos0 + t0;
    let lo = first_cell(pos_first);
    let hi = pos_first + nq; // exclusive: one past the last query's own cell
    // Copies run a constant number of rounds (HD2 / BC for the queries, HD2 / BQ for a tile:
    // the host makes BQ and BC divide HD2) with no branch around the loads, so the compiler can issue them all before the
    // first one returns; with a runtime bound each load waited for the last (on an H200 a tile
    // took ~40 us so). Rows past the block's end read a clamped real row and are never used.
    for (var r = 0u; r < HD2 / BC; r++) {
        let i = lid + r * WG_SIZE;
        let qi = min(i / HD2, nq - 1u);
        qt[i] = q[p.q_offset / 2u + ((t0 + qi) * p.n_head + h) * HD2 + i % HD2];
    }
    // Scoring: thread (sq, sc) = query sq, cell sc of the tile.
    let sq = lid / BC;
    let scell = lid % BC;
    let s_pos = pos_first + sq;
    let s_lo = first_cell(s_pos);
    // Summing: the same split, read as (query oq, lane ol), dims ol + BC * k.
    let oq = sq;
    let ol = scell;
    var o: array<vec2<f32>, OPT>;
    for (var k = 0u; k < OPT; k++) {
        o[k] = vec2<f32>(0.0);
    }
    var m = NEG_BIG;
    var l = 0.0;
    let row = p.n_kv_head * HD2; // vec2 between one cell's K (or V) row and the next
    for (var c0 = lo; c0 < hi; c0 += BC) {
        let n = min(BC, hi - c0);
        workgroupBarrier(); // the last tile's V rows and scores are read
        for (var r = 0u; r < HD2 / BQ; r++) {
            let i = lid + r * WG_SIZE;
            let ci = i / HD2;
            kvt[ci * KV_STRIDE + i % HD2] = k_cache[(c0 + min(ci, n - 1u)) * row + kvh * HD2 + i % HD2];
        }
        workgroupBarrier();
        let c = c0 + scell;
        var s = NEG_BIG;
        if sq < nq && scell < n && c >= s_lo && c <= s_pos {
            let qb = sq * HD2;
            let kb = scell * KV_STRIDE;
            var d = 0.0;
            var j = 0u;
            for (; j + 4u <= HD2; j += 4u) {
                d += dot(qt[qb + j], kvt[kb + j]) + dot(qt[qb + j + 1u], kvt[kb + j + 1u])
                    + dot(qt[qb + j + 2u], kvt[kb + j + 2u]) + dot(qt[qb + j + 3u], kvt[kb + j + 3u]);
            }
            for (; j < HD2; j++) {
                d += dot(qt[qb + j], kvt[kb + j]);
            }
            s = cap(d * p.scale);
        }
        st[lid] = s;
        workgroupBarrier(); // scores written, K rows read
        for (var r = 0u; r < HD2 / BQ; r++) {
            let i = lid + r * WG_SIZE;
            let ci = i / HD2;
            // Rows past n hold a real cell's V (finite) and weigh exactly 0.
            kvt[ci * KV_STRIDE + i % HD2] = v_cache[(c0 + min(ci, n - 1u)) * row + kvh * HD2 + i % HD2];
        }
        workgroupBarrier();
        // Query oq's running max, sum and V sum; a masked cell (score NEG_BIG) weighs 0 even
        // while every cell so far was masked (m still NEG_BIG).
        var mc = m;
        for (var i = 0u; i < BC; i++) {
            mc = max(mc, st[oq * BC + i]);
        }
        let f = exp(m - mc);
        l *= f;
        for (var k = 0u; k < OPT; k++) {
            o[k] *= f;
        }
        for (var i = 0u; i < BC; i++) {
            let si = st[oq * BC + i];
            let w = select(0.0, exp(si - mc), si > 0.5 * NEG_BIG);
            l += w;
            let vb = i * KV_STRIDE + ol;
            for (var k = 0u; k < OPT; k++) {
                o[k] += w * kvt[vb + k * BC];
            }
        }
        m = mc;
    }
    if oq < nq {
        let ob = p.out_offset / 2u + ((t0 + oq) * p.n_head + h) * HD2 + ol;
        let inv = 1.0 / l;
        for (var k = 0u; k < OPT; k++) {
            out[ob + k * BC] = o[k] * inv;
        }
    }
}
#else
#ifdef COOP
// The logits of cell `c` for kv head `kvh` against the GQ queries in `qv` (one K row read).
// HD2 is a constant (one pipeline per head size): with the head size from the uniform, the
// loop's loads were issued one iteration at a time, each waiting for the last, and an H200
// spent ~150 us per chunk of 256 cells.
fn score_g(c: u32, kvh: u32) -> array<f32, GQ> {
    const hd2 = HD2;
    let kb = (c * p.n_kv_head + kvh) * hd2;
    var d: array<f32, GQ>;
    for (var g = 0u; g < GQ; g++) {
        d[g] = 0.0;
    }
    var j = 0u;
    for (; j + 2u <= hd2; j += 2u) {
        let k0 = k_cache[kb + j];
        let k1 = k_cache[kb + j + 1u];
        for (var g = 0u; g < GQ; g++) {
            d[g] += dot(qv[g * HD2_MAX + j], k0) + dot(qv[g * HD2_MAX + j + 1u], k1);
        }
    }
    for (; j < hd2; j++) {
        let k0 = k_cache[kb + j];
        for (var g = 0u; g < GQ; g++) {
            d[g] += dot(qv[g * HD2_MAX + j], k0);
        }
    }
    for (var g = 0u; g < GQ; g++) {
        d[g] = cap(d[g] * p.scale);
    }
    return d;
}

@compute @workgroup_size(WG_SIZE)
fn attention(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // Everything up to the V split is uniform across the workgroup (barriers below).
    // Workgroup w: token w / (n_head / GQ), heads h0 .. h0 + GQ - 1.
    let w = get_wid(wid, nwg);
    let hg = p.n_head / GQ;
    if w >= p.n_tokens * hg {
        return;
    }
    let t = w / hg;
    let h0 = (w % hg) * GQ;
    let kvh = h0 / (p.n_head / p.n_kv_head);
    const hd2 = HD2;
    let pos = step.pos0 + p.pos0 + t;
    let lo = first_cell(pos);
    let hi = pos + 1u; // exclusive
    let qb = p.q_offset / 2u + (t * p.n_head + h0) * hd2;
    for (var i = lid; i < GQ * hd2; i += WG_SIZE) {
        qv[(i / hd2) * HD2_MAX + i % hd2] = q[qb + i];
    }
    workgroupBarrier();

    let groups = WG_SIZE / hd2;
    let g = lid / hd2;
    let j = lid % hd2;
    var acc: array<vec2<f32>, GQ>;
    var m: array<f32, GQ>;
    var l: array<f32, GQ>;
    for (var e = 0u; e < GQ; e++) {
        acc[e] = vec2<f32>(0.0);
        m[e] = NEG_BIG;
        l[e] = 0.0;
    }
    for (var c0 = lo; c0 < hi; c0 += WG_SIZE) {
        let n = min(WG_SIZE, hi - c0);
        var s: array<f32, GQ>;
        for (var e = 0u; e < GQ; e++) {
            s[e] = NEG_BIG;
        }
        if lid < n {
            s = score_g(c0 + lid, kvh);
        }
        for (var e = 0u; e < GQ; e++) {
            // lanes past n write NEG_BIG: whole vec4s can be read
            sc[e * (WG_SIZE / 4u) + lid / 4u][lid % 4u] = s[e];
        }
        workgroupBarrier();
        var f: array<f32, GQ>;
        for (var e = 0u; e < GQ; e++) {
            var mv = vec4<f32>(m[e]);
            for (var i = 0u; i < (n + 3u) / 4u; i++) {
                mv = max(mv, sc[e * (WG_SIZE / 4u) + i]);
            }
            let mc = max(max(mv.x, mv.y), max(mv.z, mv.w));
            pw[e * WG_SIZE + lid] = select(0.0, exp(s[e] - mc), lid < n);
            f[e] = exp(m[e] - mc);
            m[e] = mc;
        }
        workgroupBarrier();
        for (var e = 0u; e < GQ; e++) {
            acc[e] *= f[e];
            l[e] *= f[e];
        }
        if g < groups {
            let vs = p.n_kv_head * hd2; // vec2 between V[c, kvh, j] and V[c + 1, kvh, j]
            let vb = (c0 * p.n_kv_head + kvh) * hd2 + j;
            // Four cells a step, their loads issued together (see score_g).
            var i = g;
            for (; i + 3u * groups < n; i += 4u * groups) {
                let v0 = v_cache[vb + i * vs];
                let v1 = v_cache[vb + (i + groups) * vs];
                let v2 = v_cache[vb + (i + 2u * groups) * vs];
                let v3 = v_cache[vb + (i + 3u * groups) * vs];
                for (var e = 0u; e < GQ; e++) {
                    let pb = e * WG_SIZE + i;
                    let w0 = pw[pb];
                    let w1 = pw[pb + groups];
                    let w2 = pw[pb + 2u * groups];
                    let w3 = pw[pb + 3u * groups];
                    l[e] += (w0 + w1) + (w2 + w3);
                    acc[e] += (w0 * v0 + w1 * v1) + (w2 * v2 + w3 * v3);
                }
            }
            for (; i < n; i += groups) {
                let vv = v_cache[vb + i * vs];
                for (var e = 0u; e < GQ; e++) {
                    let we = pw[e * WG_SIZE + i];
                    l[e] += we;
                    acc[e] += we * vv;
                }
            }
        }
        // The next chunk's writes of sc and pw come after its first barrier, which every
        // thread reaches only after finishing this chunk's reads: no third barrier needed.
    }
    for (var e = 0u; e < GQ; e++) {
        part[e * WG_SIZE + lid] = acc[e];
        lpart[e * WG_SIZE + lid] = l[e];
    }
    workgroupBarrier();
    if lid < hd2 {
        for (var e = 0u; e < GQ; e++) {
            var a = vec2<f32>(0.0);
            var ls = 0.0;
            for (var gg = 0u; gg < groups; gg++) {
                a += part[e * WG_SIZE + gg * hd2 + lid];
                ls += lpart[e * WG_SIZE + gg * hd2 + lid];
            }
            out[p.out_offset / 2u + (t * p.n_head + h0 + e) * hd2 + lid] = a / ls;
        }
    }
}
#else
@compute @workgroup_size(WG_SIZE)
fn attention(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let pair = get_wid(wid, nwg) * WG_SIZE + lid;
    if pair >= p.n_tokens * p.n_head {
        return;
    }
    let t = pair / p.n_head;
    let h = pair % p.n_head;
    let kvh = h / (p.n_head / p.n_kv_head);
    let hd2 = p.head_dim / 2u;
    let pos = step.pos0 + p.pos0 + t;
    let lo = first_cell(pos);
    let hi = pos + 1u; // exclusive
    let qb = p.q_offset / 2u + pair * hd2;
    for (var j = 0u; j < hd2; j++) {
        qv[j] = q[qb + j];
        acc[j] = vec2<f32>(0.0);
    }
    var m = NEG_BIG;
    var l = 0.0;
    for (var c0 = lo; c0 < hi; c0 += SCHUNK) {
        let n = min(SCHUNK, hi - c0);
        var mc = m;
        for (var i = 0u; i < n; i++) {
            let s = score(c0 + i, kvh, hd2);
            sc[i] = s;
            mc = max(mc, s);
        }
        let f = exp(m - mc);
        l *= f;
        for (var j = 0u; j < hd2; j++) {
            acc[j] *= f;
        }
        for (var i = 0u; i < n; i++) {
            let w = exp(sc[i] - mc);
            l += w;
            let vb = ((c0 + i) * p.n_kv_head + kvh) * hd2;
            var j = 0u;
            for (; j + 4u <= hd2; j += 4u) {
                acc[j] += w * v_cache[vb + j];
                acc[j + 1u] += w * v_cache[vb + j + 1u];
                acc[j + 2u] += w * v_cache[vb + j + 2u];
                acc[j + 3u] += w * v_cache[vb + j + 3u];
            }
            for (; j < hd2; j++) {
                acc[j] += w * v_cache[vb + j];
            }
        }
        m = mc;
    }
    let ob = p.out_offset / 2u + pair * hd2;
    let inv = 1.0 / l;
    for (var j = 0u; j < hd2; j++) {
        out[ob + j] = acc[j] * inv;
    }
}
#endif
#endif
