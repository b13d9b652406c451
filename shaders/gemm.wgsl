// Tiled matrix product for prefill: Y[t, r] = sum_c W[r, c] * X[t, c], W quantized.
//
// A workgroup computes a tile of BM rows x BN tokens. It walks K in steps of BK values: the
// threads first decode the W tile (BM x BK) into workgroup memory as f32, each weight once, and
// copy the X tile (BN x BK) beside it; then each thread accumulates its TM rows x TN tokens in
// registers, reading one vec4 of rows and one vec4 of tokens per step (an outer product).
// So each weight is decoded once per BN tokens (matmul.wgsl's register kernel: once per NT
// tokens) and each value read from workgroup memory feeds TM or TN multiply-adds.
//
// Defines (chosen in src/ops/gemm.rs, which reads BM and BN back for the dispatch):
//   TYPE_F32 | TYPE_F16 | TYPE_BF16 | TYPE_Q8_0 | TYPE_Q4_0 | TYPE_Q4_1 | TYPE_Q5_0 | TYPE_Q5_1 |
//   TYPE_Q4_K | TYPE_Q5_K | TYPE_Q6_K: the weight type, in the GPU layout of src/quant/gpu.rs.
//   BM, BN: the tile (multiples of TM and TN). BK: values of K per step (a multiple of 8, the
//   decode run). TM, TN: rows and tokens per thread, 4 or 8; TM8 / TN8 are set when 8.
//   WG_SIZE = (BM / TM) * (BN / TN).
//   PREFETCH: load each K step's words during the step before (GPUs; CPU-emulated adapters
//   keep registers in memory and load at the step itself).
//   W_R2 .. W_R4, X_R2 .. X_R4: set when a thread loads 2 .. 4 runs of W (8 values) or of X
//   (4 values) per K step (runs per step over WG_SIZE, rounded up).
//
// Workgroup memory holds both tiles transposed, K-major, so a thread's vec4 of rows (or of
// tokens) at one k is one aligned vec4 load:
//   ws[k * BM4 + s] = W[r0 + 4s .. r0 + 4s + 3, k0 + k]
//   xs[k * BN4 + s] = X[t0 + 4s .. t0 + 4s + 3, k0 + k]
// A thread owns row slots tx, tx + TX (TM = 8) and token slots ty, ty + TY (TN = 8): neighbouring
// threads read neighbouring vec4s, with no bank conflicts. Tile stores are scalar, neighbouring
// threads writing neighbouring rows (or tokens) of one k, also conflict-free.
//
// The workgroup index g is linear in a 2-D grid (get_wid): token tile g % token_tiles, row tile
// g / token_tiles, so workgroups resident together share rows of W (the larger operand, read
// from memory about once) and sweep the tokens. One dispatch covers one part of a split tensor;
// y_offset already points at its first row.
//
// Edges: rows past the part and tokens past n_tokens load zeros and store nothing; values at and
// past `cols` load as zeros (float rows may have any K; quantized rows are whole 32-value blocks,
// but K need not be a multiple of BK). f16 values are read with unpack2x16float (no
// shader-f16); everything accumulates in f32.

#include "common_decls.tmpl"

struct GemmParams {
    rows: u32,        // rows of W in this part
    cols: u32,        // K: values per row
    row_words: u32,   // u32 words per row in the GPU layout
    n_tokens: u32,
    x_offset: u32,    // element index of X[0, 0]
    x_stride: u32,    // elements between X[t, 0] and X[t + 1, 0]
    y_offset: u32,    // element index of Y[0, first row of this part]
    y_stride: u32,    // elements between Y[t, r] and Y[t + 1, r]
    token_tiles: u32, // ceil(n_tokens / BN)
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> p: GemmParams;
@group(0) @binding(1) var<storage, read> w: array<u32>;       // (rows, row_words): this part, GPU layout
@group(0) @binding(2) var<storage, read> x: array<f32>;       // (n_tokens, x_stride) from x_offset
@group(0) @binding(3) var<storage, read_write> y: array<f32>; // (n_tokens, y_stride) from y_offset

const BM4: u32 = BM / 4u; // vec4 slots of rows in a tile
const BN4: u32 = BN / 4u; // vec4 slots of tokens
const TX: u32 = BM / TM;  // threads along the rows
const TY: u32 = BN / TN;  // threads along the tokens

var<workgroup> ws: array<vec4<f32>, BK * BM4>; // (BK, BM) the W tile, k-major
var<workgroup> xs: array<vec4<f32>, BK * BN4>; // (BK, BN) the X tile, k-major

// (TM / 4, TN): acc[i * TN + j] holds rows of slot tx + i * TX for token j of this thread
// (token slot ty + (j / 4) * TY, lane j % 4). Every index into it is a constant (no loop
// variable): a dynamically indexed private array can be placed in local memory instead of
// registers, which capped every tile at the same ~2 TFLOP/s on an H200.
var<private> acc: array<vec4<f32>, TM / 4u * TN>;

// ---------------------------------------------------------------------------------------------
// Decoders, in two halves so a step's loads can be issued a whole step before their values are
// used (the prefetch of `gemm` below): fetch8(rb, c) only loads the words that hold values
// c .. c + 7 of the row starting at word rb (c a multiple of 8, c < cols) into a Raw, and
// decode8(raw, c) turns them into the 8 values. Quantized runs never cross a 32-value block or
// a K-quant sub-block, so each run needs one scale. A Raw of zero words decodes to zeros in every
// type (its scales are zero), which is what runs past the tile's edges hold.

struct W8 {
    lo: vec4<f32>, // values c .. c + 3
    hi: vec4<f32>, // values c + 4 .. c + 7
}

// Up to 8 words; which word goes where is each type's own.
struct Raw {
    a: vec4<u32>,
    b: vec4<u32>,
}

#include "quant_words.tmpl"

// Nibbles of a word: low ones when `high` is false, else high ones.
fn nibs(v: u32, high: bool) -> vec4<u32> {
    return select(nib_lo(v), nib_hi(v), high);
}

// The f16 of half `b & 1` of word v (legacy blocks keep two scales a word).
fn half_of(v: u32, b: u32) -> f32 {
    let h = unpack2x16float(v);
    return select(h.x, h.y, (b & 1u) == 1u);
}

#ifdef TYPE_F32
#define FLOAT_TYPE
// Words per run and the word of value c.
const RUN_WORDS: u32 = 8u;
fn word_of(c: u32) -> u32 {
    return c;
}
fn decode8(r: Raw, c: u32) -> W8 {
    return W8(bitcast<vec4<f32>>(r.a), bitcast<vec4<f32>>(r.b));
}
#endif

#ifdef TYPE_F16
#define FLOAT_TYPE
#define HALF_WORDS
fn decode8(r: Raw, c: u32) -> W8 {
    return W8(
        vec4<f32>(unpack2x16float(r.a.x), unpack2x16float(r.a.y)),
        vec4<f32>(unpack2x16float(r.a.z), unpack2x16float(r.a.w)),
    );
}
#endif

#ifdef TYPE_BF16
#define FLOAT_TYPE
#define HALF_WORDS
// bf16 is the high half of an f32: widening is a shift.
fn bf16x2(v: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(v << 16u), bitcast<f32>(v & 0xffff0000u));
}
fn decode8(r: Raw, c: u32) -> W8 {
    return W8(vec4<f32>(bf16x2(r.a.x), bf16x2(r.a.y)), vec4<f32>(bf16x2(r.a.z), bf16x2(r.a.w)));
}
#endif

#ifdef HALF_WORDS
// Two 16-bit values a word, value c in the low half when c is even.
const RUN_WORDS: u32 = 4u;
fn word_of(c: u32) -> u32 {
    return c >> 1u;
}
#endif

#ifdef FLOAT_TYPE
// Float rows may end inside a run: values at and past `cols` load as zero bits (their words
// belong to the next row, or lie past the end of the buffer for the last one). c is even, so a
// 16-bit word is whole, half (its low value only) or past the end.
fn fetch8(rb: u32, c: u32) -> Raw {
    let i = rb + word_of(c);
    if c + 8u <= p.cols {
        if RUN_WORDS == 8u {
            return Raw(vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]), vec4<u32>(w[i + 4u], w[i + 5u], w[i + 6u], w[i + 7u]));
        }
        return Raw(vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]), vec4<u32>(0u));
    }
    var v = array<u32, 8>();
    for (var j = 0u; j < RUN_WORDS; j++) {
        let first = c + j * (8u / RUN_WORDS); // the first value in word j
        if first < p.cols {
            v[j] = w[i + j];
            if RUN_WORDS == 4u && first + 1u >= p.cols {
                v[j] = v[j] & 0xffffu;
            }
        }
    }
    return Raw(vec4<u32>(v[0], v[1], v[2], v[3]), vec4<u32>(v[4], v[5], v[6], v[7]));
}
#endif

#ifdef TYPE_Q8_0
// Quants: 8 words per block (i8); then the f16 scales, two per word.
// Raw: a = (quants c .. c + 3, c + 4 .. c + 7, scale word).
fn fetch8(rb: u32, c: u32) -> Raw {
    let q = rb + c / 4u;
    return Raw(vec4<u32>(w[q], w[q + 1u], w[rb + 8u * (p.cols / 32u) + (c / 64u)], 0u), vec4<u32>(0u));
}
fn decode8(r: Raw, c: u32) -> W8 {
    let d = half_of(r.a.z, c / 32u);
    return W8(d * i8x4(r.a.x), d * i8x4(r.a.y));
}
#endif

// Q4_0, Q4_1: quants 4 words per block; byte j holds value j (low nibble) and j + 16 (high).
// Raw: a = (two quant words, the scale word (Q4_0) or (d, m) word (Q4_1)).
#ifdef TYPE_Q4_0
fn fetch8(rb: u32, c: u32) -> Raw {
    let b = c / 32u;
    let q = rb + 4u * b + (c % 16u) / 4u;
    return Raw(vec4<u32>(w[q], w[q + 1u], w[rb + 4u * (p.cols / 32u) + (b >> 1u)], 0u), vec4<u32>(0u));
}
fn decode8(r: Raw, c: u32) -> W8 {
    let d = half_of(r.a.z, c / 32u);
    let high = c % 32u >= 16u;
    return W8(d * (vec4<f32>(nibs(r.a.x, high)) - 8.0), d * (vec4<f32>(nibs(r.a.y, high)) - 8.0));
}
#endif

#ifdef TYPE_Q4_1
fn fetch8(rb: u32, c: u32) -> Raw {
    let b = c / 32u;
    let q = rb + 4u * b + (c % 16u) / 4u;
    return Raw(vec4<u32>(w[q], w[q + 1u], w[rb + 4u * (p.cols / 32u) + b], 0u), vec4<u32>(0u));
}
fn decode8(r: Raw, c: u32) -> W8 {
    let dm = unpack2x16float(r.a.z);
    let high = c % 32u >= 16u;
    return W8(dm.x * vec4<f32>(nibs(r.a.x, high)) + dm.y, dm.x * vec4<f32>(nibs(r.a.y, high)) + dm.y);
}
#endif

// Q5_0, Q5_1: 5 words per block (qh, then 4 of qs as in Q4_0). Bit j of qh is the 5th bit of
// value j. Raw: a = (two quant words, scale or (d, m) word, qh).
#ifdef TYPE_Q5_0
fn fetch8(rb: u32, c: u32) -> Raw {
    let b = c / 32u;
    let q = rb + 5u * b + 1u + (c % 16u) / 4u;
    return Raw(vec4<u32>(w[q], w[q + 1u], w[rb + 5u * (p.cols / 32u) + (b >> 1u)], w[rb + 5u * b]), vec4<u32>(0u));
}
fn decode8(r: Raw, c: u32) -> W8 {
    let o = c % 32u;
    let d = half_of(r.a.z, c / 32u);
    let high = o >= 16u;
    let lo = nibs(r.a.x, high) | (bits4(r.a.w, o) << vec4<u32>(4u));
    let hi = nibs(r.a.y, high) | (bits4(r.a.w, o + 4u) << vec4<u32>(4u));
    return W8(d * (vec4<f32>(lo) - 16.0), d * (vec4<f32>(hi) - 16.0));
}
#endif

#ifdef TYPE_Q5_1
fn fetch8(rb: u32, c: u32) -> Raw {
    let b = c / 32u;
    let q = rb + 5u * b + 1u + (c % 16u) / 4u;
    return Raw(vec4<u32>(w[q], w[q + 1u], w[rb + 5u * (p.cols / 32u) + b], w[rb + 5u * b]), vec4<u32>(0u));
}
fn decode8(r: Raw, c: u32) -> W8 {
    let o = c % 32u;
    let dm = unpack2x16float(r.a.z);
    let high = o >= 16u;
    let lo = nibs(r.a.x, high) | (bits4(r.a.w, o) << vec4<u32>(4u));
    let hi = nibs(r.a.y, high) | (bits4(r.a.w, o + 4u) << vec4<u32>(4u));
    return W8(dm.x * vec4<f32>(lo) + dm.y, dm.x * vec4<f32>(hi) + dm.y);
}
#endif

#ifdef K_SCALES
// (scale, min) of sub-block j from the block's three packed scale words, as ggml's
// get_scale_min_k4 (quant_words.tmpl's scale_min_k4, on words already loaded).
fn sbyte(s: vec3<u32>, k: u32) -> u32 {
    return (s[k >> 2u] >> (8u * (k & 3u))) & 0xffu;
}
fn scale_min_w(s: vec3<u32>, j: u32) -> vec2<f32> {
    if j < 4u {
        return vec2<f32>(f32(sbyte(s, j) & 63u), f32(sbyte(s, j + 4u) & 63u));
    }
    let sc = (sbyte(s, j + 4u) & 15u) | ((sbyte(s, j - 4u) >> 6u) << 4u);
    let m = (sbyte(s, j + 4u) >> 4u) | ((sbyte(s, j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}
#endif

#ifdef TYPE_Q4_K
// Block: 36 words (d, dmin | 3 words of scales | 32 words of qs). Sub-block j (32 values) is in
// the low nibbles (j even) or high nibbles (j odd) of qs words 8 * (j / 2) .. + 7.
// Raw: a = (two quant words, (d, dmin)), b = the three scale words.
fn fetch8(rb: u32, c: u32) -> Raw {
    let bw = rb + 36u * (c / 256u);
    let j = (c % 256u) / 32u;
    let q = bw + 4u + 8u * (j / 2u) + (c % 32u) / 4u;
    return Raw(vec4<u32>(w[q], w[q + 1u], w[bw], 0u), vec4<u32>(w[bw + 1u], w[bw + 2u], w[bw + 3u], 0u));
}
fn decode8(r: Raw, c: u32) -> W8 {
    let j = (c % 256u) / 32u;
    let dm = unpack2x16float(r.a.z);
    let sm = scale_min_w(r.b.xyz, j);
    let d = dm.x * sm.x;
    let m = dm.y * sm.y;
    let high = (j & 1u) == 1u;
    return W8(d * vec4<f32>(nibs(r.a.x, high)) - m, d * vec4<f32>(nibs(r.a.y, high)) - m);
}
#endif

#ifdef TYPE_Q5_K
// Block: 44 words (d, dmin | 3 of scales | 8 of qh | 32 of qs). qs as in Q4_K; bit j of qh byte
// o is the 5th bit of value o of sub-block j.
// Raw: a = (two quant words, two qh words), b = ((d, dmin), the three scale words).
fn fetch8(rb: u32, c: u32) -> Raw {
    let bw = rb + 44u * (c / 256u);
    let j = (c % 256u) / 32u;
    let o = c % 32u;
    let q = bw + 12u + 8u * (j / 2u) + o / 4u;
    let h = bw + 4u + o / 4u;
    return Raw(vec4<u32>(w[q], w[q + 1u], w[h], w[h + 1u]), vec4<u32>(w[bw], w[bw + 1u], w[bw + 2u], w[bw + 3u]));
}
fn decode8(r: Raw, c: u32) -> W8 {
    let j = (c % 256u) / 32u;
    let dm = unpack2x16float(r.b.x);
    let sm = scale_min_w(r.b.yzw, j);
    let d = dm.x * sm.x;
    let m = dm.y * sm.y;
    let high = (j & 1u) == 1u;
    let sh = vec4<u32>(j);
    let lo = nibs(r.a.x, high) | (((bytes4(r.a.z) >> sh) & vec4<u32>(1u)) << vec4<u32>(4u));
    let hi = nibs(r.a.y, high) | (((bytes4(r.a.w) >> sh) & vec4<u32>(1u)) << vec4<u32>(4u));
    return W8(d * vec4<f32>(lo) - m, d * vec4<f32>(hi) - m);
}
#endif

#ifdef TYPE_Q6_K
// Block: 53 words (ql 32 | qh 16 | 16 i8 scales in 4 | d, pad). Value v = 128h + 32k + o (half
// h, quarter k, o < 32): its low 4 bits are in ql byte 64h + 32 (k & 1) + o (low nibble for
// k < 2, high for k >= 2), its high 2 bits are bits 2k, 2k + 1 of qh byte 32h + o, its scale is
// scales[8h + 2k + o / 16].
// Raw: a = (two ql words, two qh words), b = (the d word, the scale word).
fn fetch8(rb: u32, c: u32) -> Raw {
    let bw = rb + 53u * (c / 256u);
    let v = c % 256u;
    let h = v / 128u;
    let k = (v % 128u) / 32u;
    let o = v % 32u;
    let si = 8u * h + 2u * k + o / 16u;
    let l = bw + 16u * h + 8u * (k & 1u) + o / 4u;
    let qh = bw + 32u + 8u * h + o / 4u;
    return Raw(vec4<u32>(w[l], w[l + 1u], w[qh], w[qh + 1u]), vec4<u32>(w[bw + 52u], w[bw + 48u + (si >> 2u)], 0u, 0u));
}
fn decode8(r: Raw, c: u32) -> W8 {
    let v = c % 256u;
    let k = (v % 128u) / 32u;
    let si = 8u * (v / 128u) + 2u * k + (v % 32u) / 16u;
    let d = unpack2x16float(r.b.x).x;
    let sc = f32((bitcast<i32>(r.b.y) << (24u - 8u * (si & 3u))) >> 24u);
    let ds = d * sc;
    let high = k >= 2u;
    let sh = vec4<u32>(2u * k);
    let lo = nibs(r.a.x, high) | (((bytes4(r.a.z) >> sh) & vec4<u32>(3u)) << vec4<u32>(4u));
    let hi = nibs(r.a.y, high) | (((bytes4(r.a.w) >> sh) & vec4<u32>(3u)) << vec4<u32>(4u));
    return W8(ds * (vec4<f32>(lo) - 32.0), ds * (vec4<f32>(hi) - 32.0));
}
#endif

// ---------------------------------------------------------------------------------------------
// Tile loads. W goes as BM * BK / 8 runs of 8 values (run i: row i % BM, values 8 * (i / BM) ..),
// X as BN * BK / 4 runs of 4 (run i: token i % BN); thread lid takes runs lid, lid + WG_SIZE,
// ... (W_RUNS and X_RUNS of them, the last ones possibly past the tile: empty). Consecutive
// threads take consecutive rows (tokens), so their workgroup-memory stores are adjacent.
// fetch_* only load (registers); put_* decode and store into the tiles.

const W_RUNS_ALL: u32 = BM * BK / 8u;
const X_RUNS_ALL: u32 = BN * BK / 4u;

fn fetch_w(i: u32, r0: u32, k0: u32) -> Raw {
    let m = i % BM;
    let c = k0 + 8u * (i / BM);
    if i < W_RUNS_ALL && r0 + m < p.rows && c < p.cols {
        return fetch8((r0 + m) * p.row_words, c);
    }
    return Raw(vec4<u32>(0u), vec4<u32>(0u));
}

fn put_w(i: u32, k0: u32, r: Raw) {
    if i >= W_RUNS_ALL {
        return;
    }
    let m = i % BM;
    let kk = 8u * (i / BM);
    let v = decode8(r, k0 + kk);
    let s = kk * BM4 + m / 4u;
    let lane = m % 4u;
    ws[s][lane] = v.lo.x;
    ws[s + BM4][lane] = v.lo.y;
    ws[s + 2u * BM4][lane] = v.lo.z;
    ws[s + 3u * BM4][lane] = v.lo.w;
    ws[s + 4u * BM4][lane] = v.hi.x;
    ws[s + 5u * BM4][lane] = v.hi.y;
    ws[s + 6u * BM4][lane] = v.hi.z;
    ws[s + 7u * BM4][lane] = v.hi.w;
}

fn fetch_x(i: u32, t0: u32, k0: u32) -> vec4<f32> {
    let n = i % BN;
    let c = k0 + 4u * (i / BN);
    var v = vec4<f32>(0.0);
    if i < X_RUNS_ALL && t0 + n < p.n_tokens && c < p.cols {
        let xb = p.x_offset + (t0 + n) * p.x_stride + c;
        if c + 4u <= p.cols {
            v = vec4<f32>(x[xb], x[xb + 1u], x[xb + 2u], x[xb + 3u]);
        } else {
            // A float row's tail: the X values past `cols` belong to the next token.
            let n_in = p.cols - c;
            v.x = x[xb];
            if n_in > 1u {
                v.y = x[xb + 1u];
            }
            if n_in > 2u {
                v.z = x[xb + 2u];
            }
        }
    }
    return v;
}

fn put_x(i: u32, v: vec4<f32>) {
    if i >= X_RUNS_ALL {
        return;
    }
    let n = i % BN;
    let s = 4u * (i / BN) * BN4 + n / 4u;
    let lane = n % 4u;
    xs[s][lane] = v.x;
    xs[s + BN4][lane] = v.y;
    xs[s + 2u * BN4][lane] = v.z;
    xs[s + 3u * BN4][lane] = v.w;
}

// acc[base + q] += a * b[q]: one vec4 of rows times four tokens.
fn outer4(base: u32, a: vec4<f32>, b: vec4<f32>) {
    acc[base] = fma(a, vec4<f32>(b.x), acc[base]);
    acc[base + 1u] = fma(a, vec4<f32>(b.y), acc[base + 1u]);
    acc[base + 2u] = fma(a, vec4<f32>(b.z), acc[base + 2u]);
    acc[base + 3u] = fma(a, vec4<f32>(b.w), acc[base + 3u]);
}

// Store Y[t, r .. r + 3] for the 4 tokens t of token slot `tslot` and the 4 rows r of row slot
// `rslot` (row and token bounds checked); v0 .. v3 are the tokens' rows.
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

// The runs a thread carries from one K step to the next: W_R2 .. W_R4 and X_R2 .. X_R4 are
// defined when a thread has that many (src/ops/gemm.rs: at most 4 of each).
struct Carry {
    w0: Raw,
#ifdef W_R2
    w1: Raw,
#endif
#ifdef W_R3
    w2: Raw,
#endif
#ifdef W_R4
    w3: Raw,
#endif
    x0: vec4<f32>,
#ifdef X_R2
    x1: vec4<f32>,
#endif
#ifdef X_R3
    x2: vec4<f32>,
#endif
#ifdef X_R4
    x3: vec4<f32>,
#endif
}

fn fetch_step(lid: u32, r0: u32, t0: u32, k0: u32) -> Carry {
    var f: Carry;
    f.w0 = fetch_w(lid, r0, k0);
#ifdef W_R2
    f.w1 = fetch_w(lid + WG_SIZE, r0, k0);
#endif
#ifdef W_R3
    f.w2 = fetch_w(lid + 2u * WG_SIZE, r0, k0);
#endif
#ifdef W_R4
    f.w3 = fetch_w(lid + 3u * WG_SIZE, r0, k0);
#endif
    f.x0 = fetch_x(lid, t0, k0);
#ifdef X_R2
    f.x1 = fetch_x(lid + WG_SIZE, t0, k0);
#endif
#ifdef X_R3
    f.x2 = fetch_x(lid + 2u * WG_SIZE, t0, k0);
#endif
#ifdef X_R4
    f.x3 = fetch_x(lid + 3u * WG_SIZE, t0, k0);
#endif
    return f;
}

fn put_step(lid: u32, k0: u32, f: Carry) {
    put_w(lid, k0, f.w0);
#ifdef W_R2
    put_w(lid + WG_SIZE, k0, f.w1);
#endif
#ifdef W_R3
    put_w(lid + 2u * WG_SIZE, k0, f.w2);
#endif
#ifdef W_R4
    put_w(lid + 3u * WG_SIZE, k0, f.w3);
#endif
    put_x(lid, f.x0);
#ifdef X_R2
    put_x(lid + WG_SIZE, f.x1);
#endif
#ifdef X_R3
    put_x(lid + 2u * WG_SIZE, f.x2);
#endif
#ifdef X_R4
    put_x(lid + 3u * WG_SIZE, f.x3);
#endif
}

@compute @workgroup_size(WG_SIZE)
fn gemm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = get_wid(wid, nwg);
    let t0 = (g % p.token_tiles) * BN;
    let r0 = (g / p.token_tiles) * BM;
    // Workgroups past the grid's end (the last row of a 2-D grid): uniform across the workgroup,
    // so the barriers below stay in uniform control flow.
    if r0 >= p.rows {
        return;
    }
    let tx = lid % TX;
    let ty = lid / TX;
    acc = array<vec4<f32>, TM / 4u * TN>();
    // Each step's words are loaded during the step before, while that step multiplies: a
    // workgroup no longer waits a memory round trip per step with nothing to do. (Small
    // matrices have about one workgroup per core, so no other workgroup hides that wait.)
#ifdef PREFETCH
    var next = fetch_step(lid, r0, t0, 0u);
#endif
    for (var k0 = 0u; k0 < p.cols; k0 += BK) {
#ifdef PREFETCH
        put_step(lid, k0, next);
        workgroupBarrier();
        next = fetch_step(lid, r0, t0, k0 + BK);
#else
        // Each run loaded and stored at once, in strided loops (nothing carried between steps).
        for (var i = lid; i < W_RUNS_ALL; i += WG_SIZE) {
            put_w(i, k0, fetch_w(i, r0, k0));
        }
        for (var i = lid; i < X_RUNS_ALL; i += WG_SIZE) {
            put_x(i, fetch_x(i, t0, k0));
        }
        workgroupBarrier();
#endif
        for (var k = 0u; k < BK; k++) {
            let a0 = ws[k * BM4 + tx];
            let b0 = xs[k * BN4 + ty];
            outer4(0u, a0, b0);
#ifdef TN8
            let b1 = xs[k * BN4 + ty + TY];
            outer4(4u, a0, b1);
#endif
#ifdef TM8
            let a1 = ws[k * BM4 + tx + TX];
            outer4(TN, a1, b0);
#ifdef TN8
            outer4(TN + 4u, a1, b1);
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
