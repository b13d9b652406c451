// X to 8 bits per block of 32 values, the layout gemm_q8.wgsl (and matmul.wgsl XQ8_MEM) reads:
// per row, out_stride words from out_offset, its values as i8 (four a word, in order), then each
// block's (d, sum of values 0..15, sum of 16..31, 0) as four f32, where d = max |v| / 127 and a
// value is round(v / d) (a block of max |v| <= 1e-30 is all zeros). The rounding is
// glu.wgsl Q8_OUT's, so either producer gives a product the same X.
//
// One invocation per block, in a 2-D grid; n_cols is a multiple of 32.
//
// Defines (src/ops/quantize_x8.rs): WG_SIZE.

#include "common_decls.tmpl"

struct QuantizeX8Params {
    n_rows: u32,
    n_cols: u32,
    x_offset: u32,   // element index of X[0, 0]
    x_stride: u32,   // elements between rows of X
    out_offset: u32, // word index of row 0's quants
    out_stride: u32, // words between rows of out
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> p: QuantizeX8Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(WG_SIZE)
fn quantize_x8(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let idx = get_wid(wid, nwg) * WG_SIZE + lid;
    let blocks = p.n_cols / 32u;
    if idx >= p.n_rows * blocks {
        return;
    }
    let r = idx / blocks;
    let b = idx % blocks;
    let xb = p.x_offset + r * p.x_stride + 32u * b;
    var v: array<vec4<f32>, 8>;
    var amax = vec4<f32>(0.0);
    for (var i = 0u; i < 8u; i++) {
        let c = xb + 4u * i;
        v[i] = vec4<f32>(x[c], x[c + 1u], x[c + 2u], x[c + 3u]);
        amax = max(amax, abs(v[i]));
    }
    let m = max(max(amax.x, amax.y), max(amax.z, amax.w));
    // A block this small is zeros to any product (and 127 / m could overflow to inf, and 0 * inf
    // is NaN); the clamp keeps a rounding of 127.00001 in the byte.
    let inv = select(0.0, 127.0 / m, m > 1e-30);
    let row = p.out_offset + r * p.out_stride;
    var s0 = vec4<f32>(0.0);
    var s1 = vec4<f32>(0.0);
    for (var i = 0u; i < 8u; i++) {
        dst[row + 8u * b + i] = pack4xI8Clamp(vec4<i32>(round(v[i] * inv)));
        if i < 4u {
            s0 += v[i];
        } else {
            s1 += v[i];
        }
    }
    let one = vec4<f32>(1.0);
    let sb = row + p.n_cols / 4u + 4u * b;
    dst[sb] = bitcast<u32>(m / 127.0);
    dst[sb + 1u] = bitcast<u32>(dot(s0, one));
    dst[sb + 2u] = bitcast<u32>(dot(s1, one));
    dst[sb + 3u] = 0u;
}
