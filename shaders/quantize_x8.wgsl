// X to 8 bits, the layout gemm_q8.wgsl (and matmul.wgsl XQ8_MEM) reads: per row, out_stride
// words from out_offset, its values as i8 (four a word, in order), then per block of 32 values
// (d, d * sum of quants 0..15, d * sum of quants 16..31, 0) as four f32, value ~= d * quant.
//
// The rounding is llama.cpp's for the activations of its quantized dot products (x86), so a
// product on this X sums what llama.cpp's does:
//   Q8_0 style (default; weights of 32-value blocks): per block of 32, d = f16(max |x| / 127),
//     quant = round(x * 127 / max |x|) (ties to even).
//   Q8_K style (K_STYLE; the K-quants' weights): per block of 256, with m the value of largest
//     magnitude (the first if several), s = -127 / m, quant = min(127, round(s x)), d = 1 / s,
//     the same d written for its 8 blocks of 32.
// A block of zeros is all zeros with d = 0. The sums are of the quants (times d), as llama.cpp
// multiplies a min with them.
//
// One invocation per block (32 values, or 256 with K_STYLE), in a 2-D grid; n_cols is a
// multiple of the block.
//
// Defines (src/ops/quantize_x8.rs): WG_SIZE; K_STYLE.

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

#ifdef K_STYLE
const BLOCK: u32 = 256u;
#else
const BLOCK: u32 = 32u;
#endif

fn xv(xb: u32, i: u32) -> vec4<f32> {
    let c = xb + 4u * i;
    return vec4<f32>(x[c], x[c + 1u], x[c + 2u], x[c + 3u]);
}

@compute @workgroup_size(WG_SIZE)
fn quantize_x8(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let idx = get_wid(wid, nwg) * WG_SIZE + lid;
    let blocks = p.n_cols / BLOCK;
    if idx >= p.n_rows * blocks {
        return;
    }
    let r = idx / blocks;
    let b = idx % blocks;
    let xb = p.x_offset + r * p.x_stride + BLOCK * b;
    // The scale: s multiplies a value into its quant, d the quant back.
    var amax = 0.0;
    var mx = 0.0;
    for (var i = 0u; i < BLOCK / 4u; i++) {
        let v = xv(xb, i);
        for (var k = 0u; k < 4u; k++) {
            if abs(v[k]) > amax {
                amax = abs(v[k]);
                mx = v[k];
            }
        }
    }
#ifdef K_STYLE
    let s = select(0.0, -127.0 / mx, amax > 0.0);
    let d = select(0.0, 1.0 / s, amax > 0.0);
#else
    let s = select(0.0, 127.0 / amax, amax > 0.0);
    let d = unpack2x16float(pack2x16float(vec2<f32>(amax / 127.0, 0.0))).x;
#endif
    let row = p.out_offset + r * p.out_stride;
    for (var j = 0u; j < BLOCK / 32u; j++) {
        var sum = vec2<i32>(0);
        for (var i = 0u; i < 8u; i++) {
            let q = min(vec4<i32>(round(xv(xb, 8u * j + i) * s)), vec4<i32>(127));
            dst[row + (BLOCK / 4u) * b + 8u * j + i] = pack4xI8Clamp(q);
            let t = q.x + q.y + q.z + q.w;
            if i < 4u {
                sum.x += t;
            } else {
                sum.y += t;
            }
        }
        let sb = row + p.n_cols / 4u + 4u * ((BLOCK / 32u) * b + j);
        dst[sb] = bitcast<u32>(d);
        dst[sb + 1u] = bitcast<u32>(d * f32(sum.x));
        dst[sb + 2u] = bitcast<u32>(d * f32(sum.y));
        dst[sb + 3u] = 0u;
    }
}
