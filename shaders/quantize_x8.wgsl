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
// One invocation per output word (4 values, loads adjacent to its neighbours'), a team of
// BLOCK / 4 invocations per block; a team finds its block's largest magnitude by a tree in
// workgroup memory, and the sums of quants per 16 values the same way. (One invocation per
// block, reading its 256 values alone, took 77 us for the 256 x 4096 X of an 8B prefill on an
// H100.) A 2-D grid; n_cols is a multiple of the block, WG_SIZE of BLOCK / 4.
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

const TEAM: u32 = BLOCK / 4u; // invocations of one block

var<workgroup> red_a: array<f32, WG_SIZE>; // largest magnitude of a part of the block
var<workgroup> red_v: array<f32, WG_SIZE>; // the (first) value with it
var<workgroup> sums: array<i32, WG_SIZE>;  // each invocation's sum of its 4 quants

// x rounded to the nearest f16 (ties to even), as an f32, for x in f16's range: the mantissa's
// low 13 bits rounded off, or below f16's normals (2^-14) to a multiple of 2^-24. Not
// unpack2x16float(pack2x16float(x)): NVIDIA's Vulkan compiler folds that pair to x.
fn f16_round(x: f32) -> f32 {
    if abs(x) < 6.103515625e-5 {
        return round(x * 16777216.0) / 16777216.0;
    }
    let u = bitcast<u32>(x);
    return bitcast<f32>((u + 0xfffu + ((u >> 13u) & 1u)) & 0xffffe000u);
}

@compute @workgroup_size(WG_SIZE)
fn quantize_x8(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let idx = get_wid(wid, nwg) * WG_SIZE + lid;
    let words = p.n_cols / 4u;
    // A team is whole: rows are whole blocks. Invocations past the end take part in the
    // barriers and write nothing.
    let valid = idx < p.n_rows * words;
    let r = idx / words;
    let w = idx % words;
    var v = vec4<f32>(0.0);
    if valid {
        let c = p.x_offset + r * p.x_stride + 4u * w;
        v = vec4<f32>(x[c], x[c + 1u], x[c + 2u], x[c + 3u]);
    }
    // The first value of largest magnitude: strictly larger wins, so within the word and
    // across the tree (the lower invocation holds the earlier values) the first is kept.
    var a = -1.0;
    var m = 0.0;
    for (var k = 0u; k < 4u; k++) {
        if abs(v[k]) > a {
            a = abs(v[k]);
            m = v[k];
        }
    }
    red_a[lid] = a;
    red_v[lid] = m;
    workgroupBarrier();
    for (var s = TEAM / 2u; s > 0u; s >>= 1u) {
        if lid % TEAM < s && red_a[lid + s] > red_a[lid] {
            red_a[lid] = red_a[lid + s];
            red_v[lid] = red_v[lid + s];
        }
        workgroupBarrier();
    }
    let lead = lid - lid % TEAM;
    let amax = max(red_a[lead], 0.0);
    let mx = select(0.0, red_v[lead], amax > 0.0);
    // The scale: s multiplies a value into its quant, d the quant back.
#ifdef K_STYLE
    let s = select(0.0, -127.0 / mx, amax > 0.0);
    let d = select(0.0, 1.0 / s, amax > 0.0);
#else
    let s = select(0.0, 127.0 / amax, amax > 0.0);
    let d = f16_round(amax / 127.0);
#endif
    let q = min(vec4<i32>(round(v * s)), vec4<i32>(127));
    sums[lid] = q.x + q.y + q.z + q.w;
    workgroupBarrier();
    if !valid {
        return;
    }
    let row = p.out_offset + r * p.out_stride;
    dst[row + w] = pack4xI8Clamp(q);
    // The first invocation of each block of 32 (8 words) writes its scale and half sums.
    if w % 8u == 0u {
        let lo = sums[lid] + sums[lid + 1u] + sums[lid + 2u] + sums[lid + 3u];
        let hi = sums[lid + 4u] + sums[lid + 5u] + sums[lid + 6u] + sums[lid + 7u];
        let sb = row + words + 4u * (w / 8u);
        dst[sb] = bitcast<u32>(d);
        dst[sb + 1u] = bitcast<u32>(d * f32(lo));
        dst[sb + 2u] = bitcast<u32>(d * f32(hi));
        dst[sb + 3u] = 0u;
    }
}
