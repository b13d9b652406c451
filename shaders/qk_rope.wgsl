// The attention inputs of one step in one dispatch: per-head RMS norm of q and k (QK-norm, when
// NORM is defined), rotary embedding of both, q in place, k into the K cache, and v copied into
// the V cache. It replaces q-norm, k-norm, rope and rope_kv_write (four dispatches per layer).
//
// One workgroup per head row (the 2-D grid of get_wid):
//   rows [0, T * n_head)                      q heads: token t = row / n_head
//   rows [T * n_head, T * (n_head + n_kv))    k heads: token t, kv head h; v head (t, h) too
// Token t sits at position (== KV cell) step.pos0 + pos0 + t. The norm weights are one buffer,
// q's head_dim values then k's. The rope convention and its precision are rope.wgsl's.
//
// Defines (chosen in src/ops/qk_rope.rs):
//   WG_SIZE: invocations per workgroup, a power of two (the norm's tree reduction halves it).
//   PPT: rope pairs per invocation, ceil(head_dim / 2 / WG_SIZE) (a constant trip count: the
//     loads of all of them are issued together).
//   SRC: q, k and v are read from one source, the fused projection output `k` (T, in_stride):
//     q head j of token t at q_offset + t * in_stride + j * q_head_stride, k and v heads at
//     k_offset (v_offset) + t * in_stride + j * head_dim; the roped q is written to `q` (T, n_head, head_dim) from element 0.
//     Without SRC, q is roped in place and k and v come from their own (T, n_kv_head, head_dim).
//   NORM: normalise each head first (sum of squares: a strided partial sum per thread, then a tree
//     in workgroup memory). Threads read other threads' elements for the sum, so a barrier
//     separates those reads from the in-place writes of q. Without NORM there is no barrier.

#include "common_decls.tmpl"
#include "rope_decls.tmpl"

struct QkRopeParams {
    n_tokens: u32,
    n_head: u32,
    n_kv_head: u32,
    head_dim: u32,
    n_rot: u32,
    rope_type: u32, // 0 NeoX, 1 NORM
    pos0: u32,      // added to step.pos0
    eps: f32,       // NORM
    q_offset: u32,  // element index of q[0, 0, 0]
    k_offset: u32,  // element index of k[0, 0, 0]
    v_offset: u32,  // element index of v[0, 0, 0]
    in_stride: u32, // SRC: elements between one token's q, k, v and the next token's
    attn_factor: f32, // multiplies the rotated pairs (LongRoPE's attention factor; 1 elsewhere)
    q_head_stride: u32, // SRC: elements between q heads (head_dim; 2 head_dim where gates interleave)
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: QkRopeParams;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;       // (T, n_head, head_dim) from q_offset (SRC: from 0)
@group(0) @binding(2) var<storage, read> freq: array<vec2<u32>>;    // (n_rot / 2): rope turns, fixed point
@group(0) @binding(3) var<storage, read> k: array<f32>;             // (T, n_kv_head, head_dim) from k_offset (SRC: (T, in_stride))
#ifndef SRC
@group(0) @binding(4) var<storage, read> v: array<f32>;             // (T, n_kv_head, head_dim) from v_offset
#endif
@group(0) @binding(5) var<storage, read_write> k_cache: array<f32>; // (n_ctx, n_kv_head, head_dim)
@group(0) @binding(6) var<storage, read_write> v_cache: array<f32>; // (n_ctx, n_kv_head, head_dim)
@group(0) @binding(7) var<storage, read> step: StepState;           // this step's positions
#ifdef NORM
@group(0) @binding(8) var<storage, read> norm_w: array<f32>;        // (2, head_dim): q's weight, k's weight

var<workgroup> red: array<f32, WG_SIZE>;
#endif

fn load(is_q: bool, i: u32) -> f32 {
#ifdef SRC
    return k[i];
#else
    if is_q {
        return q[i];
    }
    return k[i];
#endif
}

fn load_v(i: u32) -> f32 {
#ifdef SRC
    return k[i];
#else
    return v[i];
#endif
}

@compute @workgroup_size(WG_SIZE)
fn qk_rope(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = get_wid(wid, nwg);
    let nq = p.n_tokens * p.n_head;
    // Workgroups past the last row skip the work but not the barriers (uniform control flow).
    let live = row < nq + p.n_tokens * p.n_kv_head;
    let is_q = row < nq;
    var t = 0u;
    var h = 0u;
    var base = 0u;  // this head's first input element
    var vb = 0u;    // k heads: the v head's first input element
    var qout = 0u;  // q heads: the roped head's first output element
    if is_q {
        t = row / p.n_head;
#ifdef SRC
        base = p.q_offset + t * p.in_stride + (row % p.n_head) * p.q_head_stride;
        qout = row * p.head_dim;
#else
        base = p.q_offset + row * p.head_dim;
        qout = base;
#endif
    } else {
        let r = row - nq;
        t = r / p.n_kv_head;
        h = r % p.n_kv_head;
#ifdef SRC
        base = p.k_offset + t * p.in_stride + h * p.head_dim;
        vb = p.v_offset + t * p.in_stride + h * p.head_dim;
#else
        base = p.k_offset + r * p.head_dim;
        vb = p.v_offset + r * p.head_dim;
#endif
    }
    // Every load first, before the norm's barriers: this thread's pairs j = lid + WG_SIZE * u
    // (u < PPT; indices clamped to the last pair), their weights, rope turns and V values. A
    // loop iteration that loads waits for its loads before the next issues any, so loads spread
    // over the norm's loop and the rope's loop cost a memory round trip each.
    let half = p.head_dim / 2u;
    var a0: array<f32, PPT>;
    var a1: array<f32, PPT>;
    var fr: array<vec2<u32>, PPT>;
    var v0: array<f32, PPT>;
    var v1: array<f32, PPT>;
#ifdef NORM
    let wb = select(p.head_dim, 0u, is_q);
    var w0: array<f32, PPT>;
    var w1: array<f32, PPT>;
#endif
    for (var u = 0u; u < PPT; u++) {
        let j = min(lid + WG_SIZE * u, half - 1u);
        let e = rope_pair(j, p.n_rot, p.rope_type);
        a0[u] = load(is_q, base + e.x);
        a1[u] = load(is_q, base + e.y);
        fr[u] = freq[min(j, max(p.n_rot / 2u, 1u) - 1u)];
        // (q rows read V values too, from the start of the buffer, and drop them.)
        v0[u] = load_v(vb + 2u * j);
        v1[u] = load_v(vb + 2u * j + 1u);
#ifdef NORM
        w0[u] = norm_w[wb + e.x];
        w1[u] = norm_w[wb + e.y];
#endif
    }
#ifdef NORM
    // The pairs cover the head once: the sum of squares is over them.
    var ss = 0.0;
    if live {
        for (var u = 0u; u < PPT; u++) {
            if lid + WG_SIZE * u < half {
                ss += a0[u] * a0[u] + a1[u] * a1[u];
            }
        }
    }
    red[lid] = ss;
    workgroupBarrier();
    for (var s = WG_SIZE / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(p.head_dim) + p.eps);
#endif
    if !live {
        return;
    }
    let pos = step.pos0 + p.pos0 + t;
    let cell = (pos * p.n_kv_head + h) * p.head_dim;
    for (var u = 0u; u < PPT; u++) {
        let j = lid + WG_SIZE * u;
        if j >= half {
            break;
        }
        let e = rope_pair(j, p.n_rot, p.rope_type);
        var x0 = a0[u];
        var x1 = a1[u];
#ifdef NORM
        x0 = x0 * inv * w0[u];
        x1 = x1 * inv * w1[u];
#endif
        if j < p.n_rot / 2u {
            let cs = rope_cos_sin(pos, fr[u]) * p.attn_factor;
            let r = rotate_rope(x0, x1, cs.x, cs.y);
            x0 = r.x;
            x1 = r.y;
        }
        if is_q {
            q[qout + e.x] = x0;
            q[qout + e.y] = x1;
        } else {
            k_cache[cell + e.x] = x0;
            k_cache[cell + e.y] = x1;
            v_cache[cell + 2u * j] = v0[u];
            v_cache[cell + 2u * j + 1u] = v1[u];
        }
    }
}
