// Tiled matrix product for prefill on 8-bit X: Y[t, r] = sum_c W[r, c] * X[t, c], with W
// quantized in blocks of 32 values and X quantized to i8 per block of 32 (quantize_x8.wgsl, or
// glu.wgsl Q8_OUT for the down projection). Each block's product is an integer dot product of
// quants (dot4I8Packed: four i8 products and their sum in one instruction), scaled once:
//
//   sum_{c in block} W[r, c] X[t, c] ~= dw[r] dx[t] sum_c qw[r, c] qx[t, c] - mw[r] sx[t]
//
// where W[r, c] = dw[r] qw[r, c] - mw[r] (Q8_0: mw = 0; Q4_0: qw the 4-bit quant 0..15 and
// mw = 8 dw; Q4_K: dw = d * scale, mw = dmin * min of the sub-block), X[t, c] ~= dx[t] qx[t, c]
// and sx[t] is the block's exact sum of X. Against gemm.wgsl (W decoded to f32), a tile step
// moves a quarter of the bytes through workgroup memory and does a quarter of the multiply
// instructions; llama.cpp multiplies quantized weights with 8-bit activations the same way.
//
// A workgroup computes a tile of BM rows x BN tokens and walks K KB blocks (32 KB values) per
// step: the threads store the step's W quants (BM x 8 KB words, four i8 a word) with each row's
// dw and mw per block, and X's (BN x 8 KB words) with each token's dx and sx per block, into
// workgroup memory; each thread then sums, block by block, TM rows x TN tokens of integer dot
// products in registers and scales them into its f32 accumulators. Each step's words are loaded
// during the step before (registers), so a workgroup does not wait a memory round trip per
// step; a deeper step (KB 2 or 4) halves or quarters the barrier pairs and round trips per K.
//
// Defines (chosen in src/ops/gemm_q8.rs, which reads BM and BN back for the dispatch):
//   TYPE_Q8_0 | TYPE_Q4_0 | TYPE_Q4_K: the weight type, in the GPU layout of src/quant/gpu.rs.
//   BM, BN: the tile. TM, TN: rows and tokens per thread, 4 or 8 (TM8 / TN8 set when 8).
//   KB: blocks of 32 values per step, 1, 2 or 4. WG_SIZE = (BM / TM) * (BN / TN).
//   W_WORDS, X_WORDS: quant words of one row (token) each thread loads per step: 8 KB BM /
//   WG_SIZE and 8 KB BN / WG_SIZE, each 1, 2, 4 or 8, so a thread's words lie in one block.
//
// X's layout (per token, x_stride words apart from x_offset): cols / 4 words of i8 quants, four
// a word in order, then per block (dx, sum of values 0..15, sum of 16..31, 0) as four f32.
//
// Workgroup memory holds the tiles k-major, so a thread's vec4 of rows (or tokens) at word k is
// one aligned vec4 load: wq[k * BM4 + s] = words k (of the step's 8 KB) of rows r0 + 4s ..
// r0 + 4s + 3; the scales block-major: wsd[kb * BM4 + s]. A thread owns
// row slots tx, tx + TX (TM = 8) and token slots ty, ty + TY (TN = 8), as in gemm.wgsl.
//
// Edges: rows past the part, tokens past n_tokens and blocks past K (the last step when KB
// does not divide K's blocks) load zero words and zero scales, adding nothing, and store
// nothing; K is whole blocks (quantized rows always are).

#include "common_decls.tmpl"

struct GemmQ8Params {
    rows: u32,        // rows of W in this part
    cols: u32,        // K: values per row, a multiple of 32
    row_words: u32,   // u32 words per row of W in the GPU layout
    n_tokens: u32,
    x_offset: u32,    // word index of token 0's row of X
    x_stride: u32,    // words between tokens' rows of X
    y_offset: u32,    // element index of Y[0, first row of this part]
    y_stride: u32,    // elements between Y[t, r] and Y[t + 1, r]
    token_tiles: u32, // ceil(n_tokens / BN)
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> p: GemmQ8Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;       // (rows, row_words): this part, GPU layout
@group(0) @binding(2) var<storage, read> xq: array<u32>;      // (n_tokens, x_stride) words from x_offset
@group(0) @binding(3) var<storage, read_write> y: array<f32>; // (n_tokens, y_stride) from y_offset

const BM4: u32 = BM / 4u; // vec4 slots of rows in a tile
const BN4: u32 = BN / 4u; // vec4 slots of tokens
const TX: u32 = BM / TM;  // threads along the rows
const TY: u32 = BN / TN;  // threads along the tokens

var<workgroup> wq: array<vec4<u32>, 8u * KB * BM4>; // (8 KB, BM) the step's W quant words
var<workgroup> wsd: array<vec4<f32>, KB * BM4>;     // (KB, BM) each row's dw per block
var<workgroup> wsm: array<vec4<f32>, KB * BM4>;     // (KB, BM) each row's mw per block
var<workgroup> xw: array<vec4<u32>, 8u * KB * BN4>; // (8 KB, BN) the step's X quant words
var<workgroup> xsd: array<vec4<f32>, KB * BN4>;     // (KB, BN) each token's dx per block
var<workgroup> xss: array<vec4<f32>, KB * BN4>;     // (KB, BN) each token's block sum

// (TM / 4, TN): acc[i * TN + j] holds rows of slot tx + i * TX for token j of this thread, as
// in gemm.wgsl; dq the block's integer sums in the same places. Every index into them is a
// constant, so they stay in registers.
var<private> acc: array<vec4<f32>, TM / 4u * TN>;
var<private> dq: array<vec4<i32>, TM / 4u * TN>;

// ---------------------------------------------------------------------------------------------
// W: the words of one row's block as i8 quants (W_WORDS of the 8, from word k0 of the block),
// and the row's (dw, mw) for the block. A fetch only loads (registers); `w_word(raw, b, k, kb)`
// (the k-th word loaded, word kb of the block) and `w_scale` turn what it loaded into what the
// tile stores.

struct WRaw {
    q: array<u32, 8>, // the words the type reads for words k0 .. k0 + W_WORDS - 1
    s: vec4<u32>,     // the words of the block's scales
}

fn nib_words(v: u32, high: bool) -> u32 {
    return select(v & 0x0f0f0f0fu, (v >> 4u) & 0x0f0f0f0fu, high);
}

#ifdef TYPE_Q8_0
// Quants: 8 words per block; then the f16 scales, two per word.
fn fetch_w_block(rb: u32, b: u32, k0: u32) -> WRaw {
    var r: WRaw;
    for (var k = 0u; k < W_WORDS; k++) {
        r.q[k] = w[rb + 8u * b + k0 + k];
    }
    r.s.x = w[rb + 8u * (p.cols / 32u) + (b >> 1u)];
    return r;
}
fn w_word(r: WRaw, b: u32, k: u32, kb: u32) -> u32 {
    return r.q[k];
}
fn w_scale(r: WRaw, b: u32) -> vec2<f32> {
    let h = unpack2x16float(r.s.x);
    return vec2<f32>(select(h.x, h.y, (b & 1u) == 1u), 0.0);
}
#endif

#ifdef TYPE_Q4_0
// Quants: 4 words per block, byte j holding value j (low nibble) and j + 16 (high); then the
// f16 scales. Value = d (q - 8): dw = d, mw = 8 d.
fn fetch_w_block(rb: u32, b: u32, k0: u32) -> WRaw {
    var r: WRaw;
    for (var k = 0u; k < W_WORDS; k++) {
        r.q[k] = w[rb + 4u * b + ((k0 + k) & 3u)];
    }
    r.s.x = w[rb + 4u * (p.cols / 32u) + (b >> 1u)];
    return r;
}
fn w_word(r: WRaw, b: u32, k: u32, kb: u32) -> u32 {
    return nib_words(r.q[k], kb >= 4u);
}
fn w_scale(r: WRaw, b: u32) -> vec2<f32> {
    let h = unpack2x16float(r.s.x);
    let d = select(h.x, h.y, (b & 1u) == 1u);
    return vec2<f32>(d, 8.0 * d);
}
#endif

#ifdef TYPE_Q4_K
// Block of 256 values: 36 words (d, dmin | 3 words of scales | 32 words of qs). Sub-block j
// (32 values, a block of this kernel) is in the low nibbles (j even) or high nibbles (j odd) of
// qs words 8 (j / 2) .. + 7. Value = d sc_j q - dmin m_j.
fn fetch_w_block(rb: u32, b: u32, k0: u32) -> WRaw {
    var r: WRaw;
    let bw = rb + 36u * (b >> 3u);
    let j = b & 7u;
    for (var k = 0u; k < W_WORDS; k++) {
        r.q[k] = w[bw + 4u + 8u * (j >> 1u) + k0 + k];
    }
    r.s = vec4<u32>(w[bw], w[bw + 1u], w[bw + 2u], w[bw + 3u]);
    return r;
}
fn w_word(r: WRaw, b: u32, k: u32, kb: u32) -> u32 {
    return nib_words(r.q[k], (b & 1u) == 1u);
}
fn sbyte(s: vec4<u32>, k: u32) -> u32 {
    // Scale byte k of the 12 in words s.y, s.z, s.w.
    return (s[1u + (k >> 2u)] >> (8u * (k & 3u))) & 0xffu;
}
fn w_scale(r: WRaw, b: u32) -> vec2<f32> {
    let j = b & 7u;
    var sc: u32;
    var m: u32;
    if j < 4u {
        sc = sbyte(r.s, j) & 63u;
        m = sbyte(r.s, j + 4u) & 63u;
    } else {
        sc = (sbyte(r.s, j + 4u) & 15u) | ((sbyte(r.s, j - 4u) >> 6u) << 4u);
        m = (sbyte(r.s, j + 4u) >> 4u) | ((sbyte(r.s, j) >> 6u) << 4u);
    }
    let dm = unpack2x16float(r.s.x);
    return vec2<f32>(dm.x * f32(sc), dm.y * f32(m));
}
#endif

// ---------------------------------------------------------------------------------------------
// Tile loads: thread lid takes row (token) lid % BM (% BN) and the step's words W_WORDS *
// (lid / BM) .. (X_WORDS * (lid / BN) ..), which lie in one block; the thread whose words start
// a block also carries the row's scales (the token's (dx, sx)) for it. Consecutive threads take
// consecutive rows, so their stores are adjacent.

struct Carry {
    w: WRaw,
    x: array<u32, 8>,
    xs: vec4<f32>,
}

fn fetch_step(lid: u32, r0: u32, t0: u32, step: u32) -> Carry {
    var f: Carry;
    let n_blocks = p.cols / 32u;
    let m = lid % BM;
    let wk = W_WORDS * (lid / BM);
    let wb = step * KB + wk / 8u;
    if r0 + m < p.rows && wb < n_blocks {
        f.w = fetch_w_block((r0 + m) * p.row_words, wb, wk % 8u);
    }
    let n = lid % BN;
    let xk = X_WORDS * (lid / BN);
    let xb = step * KB + xk / 8u;
    if t0 + n < p.n_tokens && xb < n_blocks {
        let row = p.x_offset + (t0 + n) * p.x_stride;
        for (var k = 0u; k < X_WORDS; k++) {
            f.x[k] = xq[row + 8u * xb + xk % 8u + k];
        }
        if xk % 8u == 0u {
            let sb = row + p.cols / 4u + 4u * xb;
            f.xs = vec4<f32>(bitcast<f32>(xq[sb]), bitcast<f32>(xq[sb + 1u]), bitcast<f32>(xq[sb + 2u]), 0.0);
        }
    }
    return f;
}

fn put_step(lid: u32, step: u32, f: Carry) {
    let m = lid % BM;
    let wk = W_WORDS * (lid / BM);
    let wb = step * KB + wk / 8u;
    for (var k = 0u; k < W_WORDS; k++) {
        wq[(wk + k) * BM4 + m / 4u][m % 4u] = w_word(f.w, wb, k, wk % 8u + k);
    }
    if wk % 8u == 0u {
        let s = w_scale(f.w, wb);
        let slot = (wk / 8u) * BM4 + m / 4u;
        wsd[slot][m % 4u] = s.x;
        wsm[slot][m % 4u] = s.y;
    }
    let n = lid % BN;
    let xk = X_WORDS * (lid / BN);
    for (var k = 0u; k < X_WORDS; k++) {
        xw[(xk + k) * BN4 + n / 4u][n % 4u] = f.x[k];
    }
    if xk % 8u == 0u {
        let slot = (xk / 8u) * BN4 + n / 4u;
        xsd[slot][n % 4u] = f.xs.x;
        xss[slot][n % 4u] = f.xs.y + f.xs.z;
    }
}

// dq[base + q] += the dot products of a's four rows with token q of b (one word each).
fn idot4(base: u32, a: vec4<u32>, b: vec4<u32>) {
    dq[base] += vec4<i32>(dot4I8Packed(a.x, b.x), dot4I8Packed(a.y, b.x), dot4I8Packed(a.z, b.x), dot4I8Packed(a.w, b.x));
    dq[base + 1u] += vec4<i32>(dot4I8Packed(a.x, b.y), dot4I8Packed(a.y, b.y), dot4I8Packed(a.z, b.y), dot4I8Packed(a.w, b.y));
    dq[base + 2u] += vec4<i32>(dot4I8Packed(a.x, b.z), dot4I8Packed(a.y, b.z), dot4I8Packed(a.z, b.z), dot4I8Packed(a.w, b.z));
    dq[base + 3u] += vec4<i32>(dot4I8Packed(a.x, b.w), dot4I8Packed(a.y, b.w), dot4I8Packed(a.z, b.w), dot4I8Packed(a.w, b.w));
}

// acc[base + q] += dw dx_q dq - mw sx_q for the four tokens q of a token slot, and dq cleared.
fn scale4(base: u32, dw: vec4<f32>, mw: vec4<f32>, dx: vec4<f32>, sx: vec4<f32>) {
    acc[base] = fma(dw * dx.x, vec4<f32>(dq[base]), acc[base]) - mw * sx.x;
    acc[base + 1u] = fma(dw * dx.y, vec4<f32>(dq[base + 1u]), acc[base + 1u]) - mw * sx.y;
    acc[base + 2u] = fma(dw * dx.z, vec4<f32>(dq[base + 2u]), acc[base + 2u]) - mw * sx.z;
    acc[base + 3u] = fma(dw * dx.w, vec4<f32>(dq[base + 3u]), acc[base + 3u]) - mw * sx.w;
    dq[base] = vec4<i32>(0);
    dq[base + 1u] = vec4<i32>(0);
    dq[base + 2u] = vec4<i32>(0);
    dq[base + 3u] = vec4<i32>(0);
}

// Store Y[t, r .. r + 3] for the 4 tokens t of token slot `tslot` and the 4 rows r of row slot
// `rslot` (bounds checked); v0 .. v3 are the tokens' rows.
fn store4(r0: u32, t0: u32, rslot: u32, tslot: u32, v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>) {
    let r = r0 + 4u * rslot;
    let t = t0 + 4u * tslot;
    if r >= p.rows || t >= p.n_tokens {
        return;
    }
    let n_rows = min(4u, p.rows - r);
    let n_tokens = min(4u, p.n_tokens - t);
    let yb = p.y_offset + t * p.y_stride + r;
    var v = array<vec4<f32>, 4>(v0, v1, v2, v3);
    for (var j = 0u; j < n_tokens; j++) {
        let row = yb + j * p.y_stride;
        if n_rows == 4u {
            y[row] = v[j].x;
            y[row + 1u] = v[j].y;
            y[row + 2u] = v[j].z;
            y[row + 3u] = v[j].w;
        } else {
            for (var q = 0u; q < n_rows; q++) {
                y[row + q] = v[j][q];
            }
        }
    }
}

@compute @workgroup_size(WG_SIZE)
fn gemm_q8(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = get_wid(wid, nwg);
    let t0 = (g % p.token_tiles) * BN;
    let r0 = (g / p.token_tiles) * BM;
    // Workgroups past the grid's end: uniform across the workgroup, so the barriers below stay
    // in uniform control flow.
    if r0 >= p.rows {
        return;
    }
    let tx = lid % TX;
    let ty = lid / TX;
    acc = array<vec4<f32>, TM / 4u * TN>();
    dq = array<vec4<i32>, TM / 4u * TN>();
    let n_steps = (p.cols / 32u + KB - 1u) / KB;
    var next = fetch_step(lid, r0, t0, 0u);
    for (var step = 0u; step < n_steps; step++) {
        put_step(lid, step, next);
        workgroupBarrier();
        next = fetch_step(lid, r0, t0, step + 1u);
        for (var kb = 0u; kb < KB; kb++) {
            for (var k = 0u; k < 8u; k++) {
                let kw = (8u * kb + k);
                let a0 = wq[kw * BM4 + tx];
                let b0 = xw[kw * BN4 + ty];
                idot4(0u, a0, b0);
#ifdef TN8
                let b1 = xw[kw * BN4 + ty + TY];
                idot4(4u, a0, b1);
#endif
#ifdef TM8
                let a1 = wq[kw * BM4 + tx + TX];
                idot4(TN, a1, b0);
#ifdef TN8
                idot4(TN + 4u, a1, b1);
#endif
#endif
            }
            let dw0 = wsd[kb * BM4 + tx];
            let mw0 = wsm[kb * BM4 + tx];
            let dx0 = xsd[kb * BN4 + ty];
            let sx0 = xss[kb * BN4 + ty];
            scale4(0u, dw0, mw0, dx0, sx0);
#ifdef TN8
            let dx1 = xsd[kb * BN4 + ty + TY];
            let sx1 = xss[kb * BN4 + ty + TY];
            scale4(4u, dw0, mw0, dx1, sx1);
#endif
#ifdef TM8
            let dw1 = wsd[kb * BM4 + tx + TX];
            let mw1 = wsm[kb * BM4 + tx + TX];
            scale4(TN, dw1, mw1, dx0, sx0);
#ifdef TN8
            scale4(TN + 4u, dw1, mw1, dx1, sx1);
#endif
#endif
        }
        workgroupBarrier();
    }
    store4(r0, t0, tx, ty, acc[0], acc[1], acc[2], acc[3]);
#ifdef TN8
    store4(r0, t0, tx, ty + TY, acc[4], acc[5], acc[6], acc[7]);
#endif
#ifdef TM8
    store4(r0, t0, tx + TX, ty, acc[TN], acc[TN + 1u], acc[TN + 2u], acc[TN + 3u]);
#ifdef TN8
    store4(r0, t0, tx + TX, ty + TY, acc[12], acc[13], acc[14], acc[15]);
#endif
#endif
}
