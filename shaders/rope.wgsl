// Rotary position embedding at positions pos0 + t (llama.cpp's convention, src/rope.rs):
// pair j < n_rot / 2 turns by pos * theta_j, theta_j = base^(-2j / n_rot) / ff[j].
// NeoX (rope_type 0) pairs (j, j + n_rot/2); NORM (1) pairs (2j, 2j + 1). Dimensions at and
// beyond n_rot are not rotated.
//
// Entry points:
//   rope:          rotate x (T, n_heads, head_dim) in place (q, or k kept outside the cache).
//   rope_kv_write: rotate k (T, n_heads, head_dim) into the K cache and copy v into the V cache,
//                  at cells pos0 + t (cell index == position); the cache rows are
//                  (n_ctx, n_heads, head_dim) with n_heads = the KV heads.
//
// Precision. The angle reaches tens of thousands of radians (position 32767 turns pair 0 by
// 32767 rad), where an f32 angle has an ulp of 0.002-0.004 rad and the GPU's sin/cos may be
// looser still (WGSL allows 2^-11 absolute even inside [-pi, pi]). So the angle is never an f32:
// the host (src/ops/rope.rs, RopeTable) computes each pair's frequency in turns per position,
// frac(theta_j / 2pi), in f64 and uploads it as a 64-bit fixed-point fraction (hi, lo words).
// Position times frequency, modulo one turn, is then exact integer arithmetic: the top 32 bits
// of pos * F (mod 2^64) are the angle's fraction of a turn. Rounded to the nearest quarter turn
// q, the rest is |a| <= pi/4, whose sin and cos come from short Taylor polynomials (truncation
// below 3e-9), and the quadrant swaps and negates them. Measured (tests/ops.rs, head_dim 256,
// NeoX and NORM, base 1e4..1e6, with and without frequency factors, n_rot 256 and 128), worst
// |error| / |pair| against the f64 reference rounded to f32: 1.2e-7 at positions 0-2, 1.4e-7 at
// 511-512, 1.6e-7 at 4097-4098, 1.5e-7 at 32767-32768, on lavapipe and SwiftShader alike; an f32
// angle with f32 sin/cos gives 1.5e-5, 2.2e-4 and 9.7e-4 at those positions.
//
// One invocation per pair: rope T * n_heads * (n_rot / 2); rope_kv_write T * n_heads *
// (head_dim / 2) (it also copies the unrotated pairs and V).

#include "common_decls.tmpl"
#include "rope_decls.tmpl"

struct RopeParams {
    n_tokens: u32,
    n_heads: u32,
    head_dim: u32,
    n_rot: u32,
    rope_type: u32, // 0 NeoX, 1 NORM
    pos0: u32,      // added to step.pos0: token t sits at step.pos0 + pos0 + t (rope_kv_write: also its cell)
    x_offset: u32,  // element index of x[0, 0, 0] (rope) or k[0, 0, 0] (rope_kv_write)
    v_offset: u32,  // element index of v[0, 0, 0] (rope_kv_write)
    attn_factor: f32, // multiplies the rotated pairs (LongRoPE's attention factor; 1 elsewhere)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: RopeParams;
@group(0) @binding(6) var<storage, read> step: StepState;          // this step's positions
@group(0) @binding(2) var<storage, read> freq: array<vec2<u32>>; // (n_rot / 2): frac(theta_j / 2pi) * 2^64 as (hi, lo)
#ifdef KV_WRITE
@group(0) @binding(1) var<storage, read> x: array<f32>;              // k: (T, n_heads, head_dim) from x_offset
@group(0) @binding(3) var<storage, read> v: array<f32>;              // (T, n_heads, head_dim) from v_offset
@group(0) @binding(4) var<storage, read_write> k_cache: array<f32>;  // (n_ctx, n_heads, head_dim)
@group(0) @binding(5) var<storage, read_write> v_cache: array<f32>;  // (n_ctx, n_heads, head_dim)
#else
@group(0) @binding(1) var<storage, read_write> x: array<f32>;        // (T, n_heads, head_dim) from x_offset
#endif

// Element indices (within a head) of pair j: rotary pairs by the layout, the rest adjacent.
fn pair_of(j: u32) -> vec2<u32> {
    return rope_pair(j, p.n_rot, p.rope_type);
}

#ifndef KV_WRITE
@compute @workgroup_size(WG_SIZE)
fn rope(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let idx = get_wid(wid, nwg) * WG_SIZE + lid;
    let half_rot = p.n_rot / 2u;
    let per_token = p.n_heads * half_rot;
    if idx >= p.n_tokens * per_token {
        return;
    }
    let t = idx / per_token;
    let h = (idx % per_token) / half_rot;
    let j = idx % half_rot;
    let base = p.x_offset + (t * p.n_heads + h) * p.head_dim;
    let e = base + pair_of(j);
    let cs = rope_cos_sin(step.pos0 + p.pos0 + t, freq[j]) * p.attn_factor;
    let r = rotate_rope(x[e.x], x[e.y], cs.x, cs.y);
    x[e.x] = r.x;
    x[e.y] = r.y;
}
#else
@compute @workgroup_size(WG_SIZE)
fn rope_kv_write(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let idx = get_wid(wid, nwg) * WG_SIZE + lid;
    let half_dim = p.head_dim / 2u;
    let per_token = p.n_heads * half_dim;
    if idx >= p.n_tokens * per_token {
        return;
    }
    let t = idx / per_token;
    let h = (idx % per_token) / half_dim;
    let j = idx % half_dim;
    let row = (t * p.n_heads + h) * p.head_dim;
    let cell = ((step.pos0 + p.pos0 + t) * p.n_heads + h) * p.head_dim;
    let e = pair_of(j);
    var k0 = x[p.x_offset + row + e.x];
    var k1 = x[p.x_offset + row + e.y];
    if j < p.n_rot / 2u {
        let cs = rope_cos_sin(step.pos0 + p.pos0 + t, freq[j]) * p.attn_factor;
        let r = rotate_rope(k0, k1, cs.x, cs.y);
        k0 = r.x;
        k1 = r.y;
    }
    k_cache[cell + e.x] = k0;
    k_cache[cell + e.y] = k1;
    v_cache[cell + 2u * j] = v[p.v_offset + row + 2u * j];
    v_cache[cell + 2u * j + 1u] = v[p.v_offset + row + 2u * j + 1u];
}
#endif
