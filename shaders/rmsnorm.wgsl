// RMSNorm over rows: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w.
// Also the per-head QK-norm (rows = T * n_heads, row_len = head_dim, one w for every head).
//
// Defines (chosen in src/ops/rmsnorm.rs from the arguments):
//   WG_SIZE: invocations per workgroup, a power of two; one workgroup per row.
//   WEIGHT: multiply by w (row_len f32); without it the norm is unweighted.
//   ADD: fused residual add: x += add * add_scale first (x is written back), then the norm of
//     the sum.
//   ADD_NORM (with ADD): the addend is itself normed first, x += rmsnorm(add) * w_add * add_scale
//     (a post-norm, the residual add and the next pre-norm in one dispatch: Gemma's blocks).
//   OUT_IS_X: out is x's own buffer (in place, or out elsewhere in it): x is bound read_write
//     once and out writes through it (WebGPU forbids binding one buffer as two writable
//     bindings, and as read-only plus writable, in one dispatch).
//   X_ACCESS: read or read_write (read_write with ADD or OUT_IS_X).
//   KEEP: each thread keeps its values (KEEP = ceil(row_len / (WG_SIZE * VW)) of them) in
//     private arrays between the sums of squares and the scaling, and reads all of its inputs
//     (x, the addend, both weights) in one loop before any of them is used. A loop iteration
//     that loads from memory costs a whole memory round trip on the GPUs measured (their
//     compilers did not overlap one iteration's loads with the next's), so the iterations are
//     what count: a 4096-value norm that loaded in one loop and the weights in another took
//     about 23 us on an H200 (two chains of 16); one loop of 4 vec4s takes a few. Without KEEP a
//     thread walks its values in a strided loop twice (rows of more than 32 values a thread).
//   VEC4 (with KEEP): every binding is read as vec4s (row_len and every offset a multiple of 4),
//     a quarter of the iterations. VT is the element type (vec4<f32> or f32), VW its width.
// The sum of squares accumulates in f32: a per-thread strided partial sum, then a tree
// reduction in workgroup memory (log2 WG_SIZE barriers).

#include "common_decls.tmpl"

struct RmsNormParams {
    n_rows: u32,
    row_len: u32,
    eps: f32,
    x_offset: u32,   // element index of x[0, 0]
    out_offset: u32, // element index of out[0, 0]
    add_offset: u32, // element index of add[0, 0] (ADD)
    w_offset: u32,   // element index of w[0] (WEIGHT)
    add_scale: f32,  // residual scale of the addend (ADD)
}

@group(0) @binding(0) var<uniform> p: RmsNormParams;
// Indices into them are in VT elements (offsets divided by VW).
@group(0) @binding(1) var<storage, X_ACCESS> x: array<VT>;       // (n_rows, row_len) from x_offset
#ifndef OUT_IS_X
@group(0) @binding(2) var<storage, read_write> out: array<VT>;   // (n_rows, row_len) from out_offset
#endif
#ifdef ADD
@group(0) @binding(3) var<storage, read> add: array<VT>;         // (n_rows, row_len) from add_offset
#endif
#ifdef WEIGHT
@group(0) @binding(4) var<storage, read> w: array<VT>;           // (row_len) from w_offset
#endif
#ifdef ADD_NORM
@group(0) @binding(5) var<storage, read> w_add: array<VT>;       // (row_len): the addend's norm weight
#endif

alias WgSumT = f32;
#include "wg_sum_decls.tmpl"

// Sum of squares of one element.
fn sq(v: VT) -> f32 {
#ifdef VEC4
    return dot(v, v);
#else
    return v * v;
#endif
}

// The sum of every thread's `v` over the workgroup (wg_sum_decls.tmpl).
fn reduce(lid: u32, v: f32) -> f32 {
    return wg_tree_sum(lid, v);
}

fn store(i: u32, v: VT) {
#ifdef OUT_IS_X
    x[i] = v;
#else
    out[i] = v;
#endif
}

@compute @workgroup_size(WG_SIZE)
fn rmsnorm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let r = get_wid(wid, nwg);
    // Workgroups past the last row skip the work but not the barriers (uniform control flow).
    let live = r < p.n_rows;
#ifdef KEEP
    // Row length and offsets in VT elements.
    let n = p.row_len / VW;
    let xb = p.x_offset / VW + r * n;
    let ob = p.out_offset / VW + r * n;
    let wb = p.w_offset / VW;
#ifdef ADD
    let ab = p.add_offset / VW + r * n;
#endif
    // Every load in one loop (see KEEP above).
    var kx: array<VT, KEEP>;
#ifdef ADD
    var ka: array<VT, KEEP>;
#endif
#ifdef ADD_NORM
    var kwa: array<VT, KEEP>;
    var sa = 0.0;
#endif
#ifdef WEIGHT
    var kw: array<VT, KEEP>;
#endif
    for (var k = 0u; k < KEEP; k++) {
        let i = lid + k * WG_SIZE;
        if live && i < n {
            kx[k] = x[xb + i];
#ifdef ADD
            ka[k] = add[ab + i];
#endif
#ifdef ADD_NORM
            kwa[k] = w_add[i];
            sa += sq(ka[k]);
#endif
#ifdef WEIGHT
            kw[k] = w[wb + i];
#endif
        }
    }
#ifdef ADD
    var add_mul = p.add_scale;
#ifdef ADD_NORM
    // The addend's own norm folds into its scale.
    add_mul = add_mul / sqrt(reduce(lid, sa) / f32(p.row_len) + p.eps);
#endif
#endif
    var ss = 0.0;
    for (var k = 0u; k < KEEP; k++) {
#ifdef ADD_NORM
        kx[k] = kx[k] + ka[k] * add_mul * kwa[k];
#else
#ifdef ADD
        kx[k] = kx[k] + ka[k] * add_mul;
#endif
#endif
        ss += sq(kx[k]);
    }
    let inv = 1.0 / sqrt(reduce(lid, ss) / f32(p.row_len) + p.eps);
    if !live {
        return;
    }
    // Each thread writes only the elements it read: no barrier needed, also in place.
    for (var k = 0u; k < KEEP; k++) {
        let i = lid + k * WG_SIZE;
        if i < n {
#ifdef ADD
            x[xb + i] = kx[k];
#endif
#ifdef WEIGHT
            store(ob + i, kx[k] * inv * kw[k]);
#else
            store(ob + i, kx[k] * inv);
#endif
        }
    }
#else
    let xb = p.x_offset + r * p.row_len;
#ifdef ADD
    let ab = p.add_offset + r * p.row_len;
    var add_mul = p.add_scale;
#endif
#ifdef ADD_NORM
    // The addend's own norm: a first reduction, then the scale folds into add_mul.
    var sa = 0.0;
    if live {
        for (var i = lid; i < p.row_len; i += WG_SIZE) {
            let a = add[ab + i];
            sa += a * a;
        }
    }
    add_mul = add_mul / sqrt(reduce(lid, sa) / f32(p.row_len) + p.eps);
#endif
    var ss = 0.0;
    if live {
        for (var i = lid; i < p.row_len; i += WG_SIZE) {
#ifdef ADD
#ifdef ADD_NORM
            let v = x[xb + i] + add[ab + i] * add_mul * w_add[i];
#else
            let v = x[xb + i] + add[ab + i] * add_mul;
#endif
            x[xb + i] = v;
#else
            let v = x[xb + i];
#endif
            ss += v * v;
        }
    }
    let inv = 1.0 / sqrt(reduce(lid, ss) / f32(p.row_len) + p.eps);
    if !live {
        return;
    }
    let ob = p.out_offset + r * p.row_len;
    // Each thread re-reads only elements it wrote itself (ADD), so no barrier is needed; with
    // OUT_IS_X in place (ob == xb) it also overwrites only its own elements.
    for (var i = lid; i < p.row_len; i += WG_SIZE) {
#ifdef WEIGHT
        store(ob + i, x[xb + i] * inv * w[p.w_offset + i]);
#else
        store(ob + i, x[xb + i] * inv);
#endif
    }
#endif
}
