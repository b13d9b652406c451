// Gated linear units: out[r, i] = act(gate[r, i]) * up[r, i] over (n_rows, n_cols) with row
// strides, so gate and up may be the two halves of one fused gate|up matmul output
// (T, 2 * n_ff): gate_offset 0, up_offset n_ff, both strides 2 * n_ff.
//
// The gate's rows may come in groups (gate_group rows gate_stride apart, groups
// gate_group_stride apart): Qwen3.5's per-head attention gates, interleaved with q in the q
// projection's output.
//
// Defines (src/ops/glu.rs): WG_SIZE; SILU (SwiGLU: x * sigmoid(x)), GELU (GeGLU with
// llama.cpp's tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))) or SIGMOID
// (a plain sigmoid gate);
// IN_GATE, IN_UP, HAS_SRC0, HAS_SRC1: which binding each input reads through (as in
// elementwise.wgsl: an input in out's buffer reads through dst, inputs sharing a buffer share a
// binding). One invocation per element, in a 2-D grid.
//
// Q8_OUT: out is not f32 but the unit quantized to 8 bits per block of 32 values, for a
// product whose items multiply 8-bit X (matmul.wgsl XQ8_MEM): row r takes 3 n_cols / 8 words of dst from word r * 3 n_cols / 8 (out_offset and
// out_stride unused), first its values as i8, four a word, in order (q = round(v / d),
// d = max |v| / 127 over the block, a block of max |v| <= 1e-30 all zeros), then each block's
// (d, sum of values 0..15, sum of 16..31, 0) as four f32. n_cols is a multiple of 32. One
// invocation per four values.

#include "common_decls.tmpl"
#include "act_decls.tmpl"

struct GluParams {
    n_rows: u32,
    n_cols: u32,
    out_offset: u32,
    out_stride: u32,
    gate_offset: u32,
    gate_stride: u32,
    up_offset: u32,
    up_stride: u32,
    gate_group: u32,        // rows of gate per group (a plain view: n_rows)
    gate_group_stride: u32, // elements between groups of gate rows
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> p: GluParams;
#ifdef Q8_OUT
@group(0) @binding(1) var<storage, read_write> dst: array<u32>; // out: (n_rows, 3 n_cols / 8) words
#else
@group(0) @binding(1) var<storage, read_write> dst: array<f32>; // out: (n_rows, out_stride) from out_offset
#endif
#ifdef HAS_SRC0
@group(0) @binding(2) var<storage, read> src0: array<f32>;      // the first input buffer other than out's
#endif
#ifdef HAS_SRC1
@group(0) @binding(3) var<storage, read> src1: array<f32>;      // the second
#endif

@compute @workgroup_size(WG_SIZE)
fn glu(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let idx = get_wid(wid, nwg) * WG_SIZE + lid;
#ifdef Q8_OUT
    glu_q8(idx, lid);
#else
    if idx >= p.n_rows * p.n_cols {
        return;
    }
    let r = idx / p.n_cols;
    let i = idx % p.n_cols;
    dst[p.out_offset + r * p.out_stride + i] = unit_at(r, i);
#endif
}

// The gated unit's value at row r, column i.
fn unit_at(r: u32, i: u32) -> f32 {
    let gr = p.gate_offset + (r / p.gate_group) * p.gate_group_stride + (r % p.gate_group) * p.gate_stride;
    return act(IN_GATE[gr + i]) * IN_UP[p.up_offset + r * p.up_stride + i];
}

#ifdef Q8_OUT
var<workgroup> q8_max: array<f32, WG_SIZE>; // max |v| of each invocation's four values
var<workgroup> q8_sum: array<f32, WG_SIZE>; // and their sum
// Word idx of the (n_rows, n_cols / 4) words: its four values, quantized. Eight consecutive
// invocations hold a block (WG_SIZE is a multiple of 8, a row a multiple of 32 values, so a
// block never straddles workgroups) and share its max through workgroup memory: a block an
// invocation left most of a wide GPU idle (Llama 3 8B's 14336 values: 448 invocations, 20 us on
// an H100 against 9.5 for the f32 unit). Called by every invocation (it has a barrier).
fn glu_q8(idx: u32, lid: u32) {
    let nw = p.n_cols / 4u;
    let live = idx < p.n_rows * nw;
    let r = idx / nw;
    let c = 4u * (idx % nw);
    var v = vec4<f32>(0.0);
    if live {
        v = vec4<f32>(unit_at(r, c), unit_at(r, c + 1u), unit_at(r, c + 2u), unit_at(r, c + 3u));
    }
    let a = abs(v);
    q8_max[lid] = max(max(a.x, a.y), max(a.z, a.w));
    q8_sum[lid] = dot(v, vec4<f32>(1.0));
    workgroupBarrier();
    let first = lid & ~7u;
    var m = 0.0;
    for (var k = 0u; k < 8u; k++) {
        m = max(m, q8_max[first + k]);
    }
    if !live {
        return;
    }
    // (As matmul.wgsl's xq8_prologue: a block this small is zeros, and 127 / m could be inf.)
    let inv = select(0.0, 127.0 / m, m > 1e-30);
    let row = r * (3u * p.n_cols / 8u);
    dst[row + c / 4u] = pack4xI8Clamp(vec4<i32>(round(v * inv)));
    if (lid & 7u) == 0u {
        var s0 = 0.0;
        var s1 = 0.0;
        for (var k = 0u; k < 4u; k++) {
            s0 += q8_sum[first + k];
            s1 += q8_sum[first + 4u + k];
        }
        let sb = row + nw + 4u * (c / 32u);
        dst[sb] = bitcast<u32>(m / 127.0);
        dst[sb + 1u] = bitcast<u32>(s0);
        dst[sb + 2u] = bitcast<u32>(s1);
        dst[sb + 3u] = 0u;
    }
}
#endif
