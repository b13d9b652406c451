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
//   KEEP: each thread keeps its values (KEEP = ceil(row_len / WG_SIZE) of them) in registers
//     between the sum of squares and the scaling, and loads them (x, the addend, the weights)
//     in loops holding nothing but loads (all in flight at once; see the kernel for why no
//     store may sit between them). Without it a thread walks its values in a strided loop twice,
//     one load after another, re-reading what it wrote: a latency chain that made one 4096-value
//     norm take about 21 us on an H200 (the host sets KEEP where it is at most 32).
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
@group(0) @binding(1) var<storage, X_ACCESS> x: array<f32>;       // (n_rows, row_len) from x_offset
#ifndef OUT_IS_X
@group(0) @binding(2) var<storage, read_write> out: array<f32>;   // (n_rows, row_len) from out_offset
#endif
#ifdef ADD
@group(0) @binding(3) var<storage, read> add: array<f32>;         // (n_rows, row_len) from add_offset
#endif
#ifdef WEIGHT
@group(0) @binding(4) var<storage, read> w: array<f32>;           // (row_len) from w_offset
#endif
#ifdef ADD_NORM
@group(0) @binding(5) var<storage, read> w_add: array<f32>;       // (row_len): the addend's norm weight
#endif

var<workgroup> red: array<f32, WG_SIZE>;

fn store(i: u32, v: f32) {
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
    red[lid] = sa;
    workgroupBarrier();
    for (var s = WG_SIZE / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    add_mul = add_mul / sqrt(red[0] / f32(p.row_len) + p.eps);
    workgroupBarrier(); // every thread has read red[0] before it is reused
#endif
#ifdef KEEP
    // Every load first, in loops with no store between them: a store to a storage buffer may
    // alias any later load (the compiler cannot tell the bindings apart), so a loop that wrote
    // x back as it went waited one memory round trip per value (about 18 us for a 4096-value
    // norm on an H200). The stores come after, into the elements this thread read.
    var kx: array<f32, KEEP>;
    for (var k = 0u; k < KEEP; k++) {
        let i = lid + k * WG_SIZE;
        if live && i < p.row_len {
            kx[k] = x[xb + i];
        }
    }
#ifdef ADD
    var ka: array<f32, KEEP>;
    for (var k = 0u; k < KEEP; k++) {
        let i = lid + k * WG_SIZE;
        if live && i < p.row_len {
            ka[k] = add[ab + i];
        }
    }
#endif
#ifdef ADD_NORM
    var kwa: array<f32, KEEP>;
    for (var k = 0u; k < KEEP; k++) {
        let i = lid + k * WG_SIZE;
        if live && i < p.row_len {
            kwa[k] = w_add[i];
        }
    }
#endif
#ifdef WEIGHT
    // The weights too, so their loads are in flight during the reduction.
    var kw: array<f32, KEEP>;
    for (var k = 0u; k < KEEP; k++) {
        let i = lid + k * WG_SIZE;
        if live && i < p.row_len {
            kw[k] = w[p.w_offset + i];
        }
    }
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
        ss += kx[k] * kx[k];
    }
#ifdef ADD
    for (var k = 0u; k < KEEP; k++) {
        let i = lid + k * WG_SIZE;
        if live && i < p.row_len {
            x[xb + i] = kx[k];
        }
    }
#endif
#else
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
#endif
    red[lid] = ss;
    workgroupBarrier();
    for (var s = WG_SIZE / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    if !live {
        return;
    }
    let inv = 1.0 / sqrt(red[0] / f32(p.row_len) + p.eps);
    let ob = p.out_offset + r * p.row_len;
    // Each thread re-reads only elements it wrote itself (ADD), so no barrier is needed; with
    // OUT_IS_X in place (ob == xb) it also overwrites only its own elements.
#ifdef KEEP
    for (var k = 0u; k < KEEP; k++) {
        let i = lid + k * WG_SIZE;
        if i < p.row_len {
#ifdef WEIGHT
            store(ob + i, kx[k] * inv * kw[k]);
#else
            store(ob + i, kx[k] * inv);
#endif
        }
    }
#else
    for (var i = lid; i < p.row_len; i += WG_SIZE) {
#ifdef WEIGHT
        store(ob + i, x[xb + i] * inv * w[p.w_offset + i]);
#else
        store(ob + i, x[xb + i] * inv);
#endif
    }
#endif
}
