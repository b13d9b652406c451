// Matrix products with a quantized weight: Y[t, r] = sum_c W[r, c] * X[t, c].
// GEMV (decode, one token) and GEMM (prefill, a batch of tokens) are the same kernel: NT = 1
// token per invocation for GEMV, NT tokens kept in registers for GEMM (each weight unit is
// decoded once and used NT times).
//
// Defines (chosen in src/ops/matmul.rs, which also reads them for the dispatch):
//   TYPE_F32 | TYPE_F16 | TYPE_BF16 | TYPE_Q8_0 | TYPE_Q4_0 | TYPE_Q4_1 | TYPE_Q5_0 | TYPE_Q5_1 |
//   TYPE_Q4_K | TYPE_Q5_K | TYPE_Q6_K: the weight type, in the GPU layout of src/quant/gpu.rs.
//   WG_SIZE: invocations per workgroup. TPR: threads per row (a power of two dividing WG_SIZE),
//   so a workgroup covers WG_SIZE / TPR rows. NT: tokens per invocation.
//   COOP (with TPR > 1): the TPR threads of a row split its units and add their partial sums in
//   workgroup memory (log2 TPR barriers). Without COOP (TPR = 1) a thread walks a whole row and
//   there is no barrier: the variant for CPU-emulated adapters, where barriers are costly.
//
// A row is a sequence of "units" (4 to 64 values decoded together; the host passes their count).
// The workgroup index is linear in a 2-D grid: g = row_group + row_groups * token_tile.
// One dispatch covers one part of a split tensor; y_offset already points at its first row.
// f16 values are read with unpack2x16float (no shader-f16); everything accumulates in f32.

#include "common_decls.tmpl"

struct MatmulParams {
    rows: u32,       // rows of W in this part
    cols: u32,       // K: values per row
    row_words: u32,  // u32 words per row in the GPU layout
    units: u32,      // decode units per row
    n_tokens: u32,
    x_offset: u32,   // element index of X[0, 0]
    x_stride: u32,   // elements between X[t, 0] and X[t + 1, 0]
    y_offset: u32,   // element index of Y[0, first row of this part]
    y_stride: u32,   // elements between Y[t, r] and Y[t + 1, r]
    row_groups: u32, // ceil(rows / (WG_SIZE / TPR))
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> p: MatmulParams;
@group(0) @binding(1) var<storage, read> w: array<u32>;       // (rows, row_words): this part, GPU layout
@group(0) @binding(2) var<storage, read> x: array<f32>;       // (n_tokens, x_stride) from x_offset
@group(0) @binding(3) var<storage, read_write> y: array<f32>; // (n_tokens, y_stride) from y_offset

const RPW: u32 = WG_SIZE / TPR; // rows per workgroup

var<private> acc: array<f32, NT>; // partial sums of this thread's row, one per token
var<private> xbase: u32;           // X[t0, 0]
var<private> nt: u32;              // tokens this thread handles (<= NT)

// acc[t] += dot(wv, X[t, col .. col + 4]) for each token of the tile.
fn acc4(wv: vec4<f32>, col: u32) {
    for (var t = 0u; t < nt; t++) {
        let i = xbase + t * p.x_stride + col;
        acc[t] += dot(wv, vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]));
    }
}

// acc4 for the last, partial unit of a float row: values at and past `cols` count as zero
// (their weights belong to padding or the next row, their x to the next token).
fn acc4_tail(wv: vec4<f32>, col: u32) {
    let n = p.cols - col;
    if n >= 4u {
        acc4(wv, col);
        return;
    }
    let m = vec4<bool>(true, n > 1u, n > 2u, false);
    let wm = select(vec4<f32>(0.0), wv, m);
    for (var t = 0u; t < nt; t++) {
        let i = xbase + t * p.x_stride + col;
        let xv = select(vec4<f32>(0.0), vec4<f32>(x[i], x[i + 1u], x[i + 2u], 0.0), m);
        acc[t] += dot(wm, xv);
    }
}

// Bytes 0..3 of a word as four i8 / four u8 / its 8 nibbles (low nibbles, high nibbles).
fn i8x4(v: u32) -> vec4<f32> {
    let s = bitcast<i32>(v);
    return vec4<f32>(vec4<i32>((s << 24u) >> 24u, (s << 16u) >> 24u, (s << 8u) >> 24u, s >> 24u));
}
fn bytes4(v: u32) -> vec4<u32> {
    return vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(0xffu);
}
fn nib_lo(v: u32) -> vec4<u32> {
    return vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(15u);
}
fn nib_hi(v: u32) -> vec4<u32> {
    return vec4<u32>(v >> 4u, v >> 12u, v >> 20u, v >> 28u) & vec4<u32>(15u);
}
// Bits s .. s + 3 of `qh`, one per lane.
fn bits4(qh: u32, s: u32) -> vec4<u32> {
    return (vec4<u32>(qh) >> vec4<u32>(s, s + 1u, s + 2u, s + 3u)) & vec4<u32>(1u);
}
// The f16 `d` of legacy block b: two per word in the scale section starting at word `sw`.
fn half_at(sw: u32, b: u32) -> f32 {
    let h = unpack2x16float(w[sw + (b >> 1u)]);
    return select(h.x, h.y, (b & 1u) == 1u);
}

#ifdef TYPE_F32
// Unit: 4 values (the last may be partial).
fn unit(rb: u32, u: u32) {
    let i = rb + 4u * u;
    acc4_tail(bitcast<vec4<f32>>(vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u])), 4u * u);
}
#endif

#ifdef TYPE_F16
// Unit: 4 values in 2 words (the last may be partial).
fn unit(rb: u32, u: u32) {
    let i = rb + 2u * u;
    acc4_tail(vec4<f32>(unpack2x16float(w[i]), unpack2x16float(w[i + 1u])), 4u * u);
}
#endif

#ifdef TYPE_BF16
// bf16 is the high half of an f32: widening is a shift.
fn bf16x2(v: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(v << 16u), bitcast<f32>(v & 0xffff0000u));
}
fn unit(rb: u32, u: u32) {
    let i = rb + 2u * u;
    acc4_tail(vec4<f32>(bf16x2(w[i]), bf16x2(w[i + 1u])), 4u * u);
}
#endif

#ifdef TYPE_Q8_0
// Unit: half a block (16 values, 4 words). Quants: 8 words per block; then f16 scales.
fn unit(rb: u32, u: u32) {
    let nb = p.cols / 32u;
    let d = half_at(rb + 8u * nb, u >> 1u);
    let q = rb + 4u * u;
    let c = 16u * u;
    for (var i = 0u; i < 4u; i++) {
        acc4(d * i8x4(w[q + i]), c + 4u * i);
    }
}
#endif

#ifdef TYPE_Q4_0
// Unit: a block (32 values, 4 words). Byte j: value j (low nibble), j + 16 (high).
fn unit(rb: u32, u: u32) {
    let nb = p.cols / 32u;
    let d = half_at(rb + 4u * nb, u);
    let q = rb + 4u * u;
    let c = 32u * u;
    for (var i = 0u; i < 4u; i++) {
        let v = w[q + i];
        acc4(d * (vec4<f32>(nib_lo(v)) - 8.0), c + 4u * i);
        acc4(d * (vec4<f32>(nib_hi(v)) - 8.0), c + 16u + 4u * i);
    }
}
#endif

#ifdef TYPE_Q4_1
// Unit: a block (4 words); then one (d, m) word per block.
fn unit(rb: u32, u: u32) {
    let nb = p.cols / 32u;
    let dm = unpack2x16float(w[rb + 4u * nb + u]);
    let q = rb + 4u * u;
    let c = 32u * u;
    for (var i = 0u; i < 4u; i++) {
        let v = w[q + i];
        acc4(dm.x * vec4<f32>(nib_lo(v)) + dm.y, c + 4u * i);
        acc4(dm.x * vec4<f32>(nib_hi(v)) + dm.y, c + 16u + 4u * i);
    }
}
#endif

#ifdef TYPE_Q5_0
// Unit: a block (5 words: qh, then 4 of qs). Bit j of qh is the 5th bit of value j.
fn unit(rb: u32, u: u32) {
    let nb = p.cols / 32u;
    let d = half_at(rb + 5u * nb, u);
    let q = rb + 5u * u;
    let qh = w[q];
    let c = 32u * u;
    for (var i = 0u; i < 4u; i++) {
        let v = w[q + 1u + i];
        let lo = nib_lo(v) | (bits4(qh, 4u * i) << vec4<u32>(4u));
        let hi = nib_hi(v) | (bits4(qh, 16u + 4u * i) << vec4<u32>(4u));
        acc4(d * (vec4<f32>(lo) - 16.0), c + 4u * i);
        acc4(d * (vec4<f32>(hi) - 16.0), c + 16u + 4u * i);
    }
}
#endif

#ifdef TYPE_Q5_1
fn unit(rb: u32, u: u32) {
    let nb = p.cols / 32u;
    let dm = unpack2x16float(w[rb + 5u * nb + u]);
    let q = rb + 5u * u;
    let qh = w[q];
    let c = 32u * u;
    for (var i = 0u; i < 4u; i++) {
        let v = w[q + 1u + i];
        let lo = nib_lo(v) | (bits4(qh, 4u * i) << vec4<u32>(4u));
        let hi = nib_hi(v) | (bits4(qh, 16u + 4u * i) << vec4<u32>(4u));
        acc4(dm.x * vec4<f32>(lo) + dm.y, c + 4u * i);
        acc4(dm.x * vec4<f32>(hi) + dm.y, c + 16u + 4u * i);
    }
}
#endif

#ifdef TYPE_Q4_K
#define K_SCALES
#endif
#ifdef TYPE_Q5_K
#define K_SCALES
#endif

#ifdef K_SCALES
// Byte k of the 12 packed scale bytes of the block at word bw (they start at word bw + 1).
fn scale_byte(bw: u32, k: u32) -> u32 {
    return (w[bw + 1u + (k >> 2u)] >> (8u * (k & 3u))) & 0xffu;
}
// (scale, min) of sub-block j, as ggml's get_scale_min_k4.
fn scale_min_k4(bw: u32, j: u32) -> vec2<f32> {
    if j < 4u {
        return vec2<f32>(f32(scale_byte(bw, j) & 63u), f32(scale_byte(bw, j + 4u) & 63u));
    }
    let sc = (scale_byte(bw, j + 4u) & 15u) | ((scale_byte(bw, j - 4u) >> 6u) << 4u);
    let m = (scale_byte(bw, j + 4u) >> 4u) | ((scale_byte(bw, j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}
#endif

#ifdef TYPE_Q4_K
// Block: 36 words (d, dmin | 3 words of scales | 32 words of qs). Unit: a 64-value chunk c of
// block b (8 words of qs): sub-block 2c in the low nibbles, 2c + 1 in the high ones.
fn unit(rb: u32, u: u32) {
    let b = u >> 2u;
    let c = u & 3u;
    let bw = rb + 36u * b;
    let dm = unpack2x16float(w[bw]);
    let s_lo = scale_min_k4(bw, 2u * c);
    let s_hi = scale_min_k4(bw, 2u * c + 1u);
    let d_lo = dm.x * s_lo.x;
    let m_lo = dm.y * s_lo.y;
    let d_hi = dm.x * s_hi.x;
    let m_hi = dm.y * s_hi.y;
    let q = bw + 4u + 8u * c;
    let col = 256u * b + 64u * c;
    for (var i = 0u; i < 8u; i++) {
        let v = w[q + i];
        acc4(d_lo * vec4<f32>(nib_lo(v)) - m_lo, col + 4u * i);
        acc4(d_hi * vec4<f32>(nib_hi(v)) - m_hi, col + 32u + 4u * i);
    }
}
#endif

#ifdef TYPE_Q5_K
// Block: 44 words (d, dmin | 3 of scales | 8 of qh | 32 of qs). Unit: a 64-value chunk as in
// Q4_K; bit s of qh byte l is the 5th bit of value l of sub-block s.
fn unit(rb: u32, u: u32) {
    let b = u >> 2u;
    let c = u & 3u;
    let bw = rb + 44u * b;
    let dm = unpack2x16float(w[bw]);
    let s_lo = scale_min_k4(bw, 2u * c);
    let s_hi = scale_min_k4(bw, 2u * c + 1u);
    let d_lo = dm.x * s_lo.x;
    let m_lo = dm.y * s_lo.y;
    let d_hi = dm.x * s_hi.x;
    let m_hi = dm.y * s_hi.y;
    let q = bw + 12u + 8u * c;
    let col = 256u * b + 64u * c;
    for (var i = 0u; i < 8u; i++) {
        let v = w[q + i];
        let hb = bytes4(w[bw + 4u + i]);
        let lo = nib_lo(v) | (((hb >> vec4<u32>(2u * c)) & vec4<u32>(1u)) << vec4<u32>(4u));
        let hi = nib_hi(v) | (((hb >> vec4<u32>(2u * c + 1u)) & vec4<u32>(1u)) << vec4<u32>(4u));
        acc4(d_lo * vec4<f32>(lo) - m_lo, col + 4u * i);
        acc4(d_hi * vec4<f32>(hi) - m_hi, col + 32u + 4u * i);
    }
}
#endif

#ifdef TYPE_Q6_K
// i8 scale k of the block at word bw (16 of them at words bw + 48 .. bw + 51).
fn scale_i8(bw: u32, k: u32) -> f32 {
    let v = bitcast<i32>(w[bw + 48u + (k >> 2u)]);
    return f32((v << (24u - 8u * (k & 3u))) >> 24u);
}
// Block: 53 words (ql 32 | qh 16 | scales 4 | d, pad). Unit: half h, word i (16 units a block):
// ql word 16h + i and 16h + 8 + i, qh word 32 + 8h + i give values 128h + 32k + 4i .. + 3 for
// k = 0..3 (low nibbles of the first, of the second, high of the first, of the second; high
// bits 2k, 2k + 1 of qh).
fn unit(rb: u32, u: u32) {
    let b = u >> 4u;
    let h = (u >> 3u) & 1u;
    let i = u & 7u;
    let bw = rb + 53u * b;
    let d = unpack2x16float(w[bw + 52u]).x;
    let l1 = w[bw + 16u * h + i];
    let l2 = w[bw + 16u * h + 8u + i];
    let qh = bytes4(w[bw + 32u + 8u * h + i]);
    var low = array<vec4<u32>, 4>(nib_lo(l1), nib_lo(l2), nib_hi(l1), nib_hi(l2));
    let col = 256u * b + 128u * h + 4u * i;
    let s0 = 8u * h + (i >> 2u);
    for (var k = 0u; k < 4u; k++) {
        let q = low[k] | (((qh >> vec4<u32>(2u * k)) & vec4<u32>(3u)) << vec4<u32>(4u));
        let ds = d * scale_i8(bw, s0 + 2u * k);
        acc4(ds * (vec4<f32>(q) - 32.0), col + 32u * k);
    }
}
#endif

#ifdef COOP
var<workgroup> red: array<f32, WG_SIZE * NT>; // (WG_SIZE, NT) partial sums
#endif

@compute @workgroup_size(WG_SIZE)
fn matmul(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = get_wid(wid, nwg);
    let t0 = (g / p.row_groups) * NT;
    let lane = lid % TPR;
    let r = (g % p.row_groups) * RPW + lid / TPR;
    // Workgroups past the grid's end have t0 >= n_tokens; rows past the part's end idle too
    // (but still take part in the barriers).
    let live = r < p.rows && t0 < p.n_tokens;
    nt = 0u;
    if live {
        nt = min(NT, p.n_tokens - t0);
    }
    xbase = p.x_offset + t0 * p.x_stride;
    for (var t = 0u; t < NT; t++) {
        acc[t] = 0.0;
    }
    if live {
        let rb = r * p.row_words;
        for (var u = lane; u < p.units; u += TPR) {
            unit(rb, u);
        }
    }
#ifdef COOP
    for (var t = 0u; t < NT; t++) {
        red[lid * NT + t] = acc[t];
    }
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if lane < s {
            for (var t = 0u; t < NT; t++) {
                red[lid * NT + t] += red[(lid + s) * NT + t];
            }
        }
        workgroupBarrier();
    }
    for (var t = 0u; t < NT; t++) {
        acc[t] = red[lid * NT + t];
    }
#endif
    if live && lane == 0u {
        for (var t = 0u; t < nt; t++) {
            y[p.y_offset + (t0 + t) * p.y_stride + r] = acc[t];
        }
    }
}
