enable f16;
enable wgpu_cooperative_matrix;

// Tiled matrix product for prefill on cooperative matrices (tensor cores): Y[t, r] =
// sum_c W[r, c] * X[t, c], W quantized, X f32. Built only where the device offers cooperative
// matrices of 16 x 16 x 16 with f16 inputs and an f32 accumulator on subgroups of 32
// (src/ops/gemm_coop.rs, `available`); a native-only path, next to gemm.wgsl and gemm_q8.wgsl.
//
// A workgroup computes a tile of BM rows x BN tokens with SG_M x SG_N subgroups, each owning
// 16 FM rows x 32 tokens of it as FM x 2 accumulators of 16 x 16 (f32). It walks K in steps of BK
// values: the threads decode the W tile (BM x BK) to f16 into workgroup memory with the same
// decoders as gemm.wgsl (gemm_decls.tmpl) and convert the X tile (BN x BK) beside it; then
// each subgroup multiplies its fragments, BK / 16 products of 16 x 16 x 16 per accumulator.
// As in gemm.wgsl, each step's words are loaded during the step before.
//
// In the matrix product's terms, C (M x N) = A (M x K) B (K x N) with M the rows of W, N the
// tokens: A[m, k] = W[r0 + m, k0 + k] sits row-major in `wa` (row m at m * LDA), B[k, n] =
// X[t0 + n, k0 + k] column-major in `xb` (token n at n * LDB), so both tiles keep K contiguous,
// as in memory. The rows are padded by 8 values (16 bytes) against bank conflicts. (The tiles
// are f16 arrays stored value by value: the NVIDIA Vulkan compiler refused cooperative loads of
// f16 through a u32 array, which would have stored two values a word). Tried and dropped:
// K-major tiles (A loaded column-major, B row-major, stores of neighbouring rows adjacent), 1,050
// tok/s against 1,806 for an 8B prefill on an H100.
//
// Defines (chosen in src/ops/gemm_coop.rs, which reads BM and BN back for the dispatch):
//   TYPE_*: the weight type, as in gemm.wgsl. SG_M, SG_N: subgroups along rows and tokens.
//   FM: fragments of 16 rows per subgroup, 2 or 4 (FM4 set when 4); BM = 16 FM SG_M,
//   BN = 32 SG_N; WG_SIZE = 32 SG_M SG_N. BK: values of K per step, 32 or 64.
//   W_RUNS, X_RUNS: runs of W (8 values) and of X (4 values) each thread loads per step.
//
// Precision: W's decoded values and X are rounded to f16 (X clamped to f16's range, +-65504),
// products accumulate in f32. Edges: rows past the part, tokens past n_tokens and values past
// `cols` load as zeros; the accumulators go out through workgroup memory, so every store is
// bounds checked.

#include "common_decls.tmpl"

#include "gemm_decls.tmpl"

// The same buffers as `w` (Q4_K only: the one type whose runs are read so) and `x`, 4 words
// (values) at a time: a run's aligned words in one load instead of one load each
// (src/ops/gemm.rs binds them; `p.x_vec4` says whether X's rows are aligned for it).
#ifdef TYPE_Q4_K
@group(0) @binding(4) var<storage, read> w4: array<vec4<u32>>;
#endif
@group(0) @binding(5) var<storage, read> x4: array<vec4<f32>>;

const N_SG: u32 = SG_M * SG_N;
const SUB_M: u32 = 16u * FM; // rows of a subgroup's part of the tile
const LDA: u32 = BK + 8u; // f16s between rows of the W tile
const LDB: u32 = BK + 8u; // f16s between tokens of the X tile

var<workgroup> wa: array<f16, BM * LDA>; // (BM, LDA) the W tile, row-major
var<workgroup> xb: array<f16, BN * LDB>; // (BN, LDB) the X tile, token-major
var<workgroup> cs: array<f32, N_SG * 256u>; // one 16 x 16 fragment per subgroup, column-major

// ---------------------------------------------------------------------------------------------
// Tile loads. W goes as BM * BK / 8 runs of 8 values (run i: row i / (BK / 8), values
// 8 * (i % (BK / 8)) ..), X as BN * BK / 4 runs of 4 (run i: token i / (BK / 4)); thread lid
// takes runs lid, lid + WG_SIZE, ... So neighbouring threads read neighbouring words of a row
// and store neighbouring values of a tile row. fetch_* only load (registers); put_* decode,
// convert and store.

#ifdef TYPE_Q4_K
// Q4_K's fetch8 (weight_decode.tmpl) in three loads instead of six: a block's 36 words start
// at a multiple of 4 (rows are whole blocks), so its header (d, dmin, 3 scale words) is one
// vec4; the run's two quant words stay scalar loads.
fn fetch8_vec(rb: u32, c: u32) -> Raw {
    let bw = rb + 36u * (c / 256u);
    let j = (c % 256u) / 32u;
    let q = bw + 4u + 8u * (j / 2u) + (c % 32u) / 4u;
    let h = w4[bw / 4u];
    return Raw(vec4<u32>(w[q], w[q + 1u], h.x, 0u), vec4<u32>(h.y, h.z, h.w, 0u));
}
#else
fn fetch8_vec(rb: u32, c: u32) -> Raw {
    return fetch8(rb, c);
}
#endif

fn fetch_w(i: u32, r0: u32, k0: u32) -> Raw {
    let m = i / (BK / 8u);
    let c = k0 + 8u * (i % (BK / 8u));
    if r0 + m < p.rows && c < p.cols {
        return fetch8_vec((r0 + m) * p.row_words, c);
    }
    return Raw(vec4<u32>(0u), vec4<u32>(0u));
}

#ifdef FAST_W
// Q4_K and Q8_0 decode a run without decode8's integer-to-float conversions, which run at a
// quarter of the arithmetic rate on NVIDIA GPUs: 2^23 + b, as an f32, holds a small integer b in
// its low mantissa bits, so b is a bit-or and a subtraction away. The same arithmetic as decode8
// otherwise, so the same values.
fn low_bytes_f32(v: u32, mask: u32) -> vec4<f32> {
    let b = (vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(mask);
    return bitcast<vec4<f32>>(b | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0);
}
#ifdef TYPE_Q4_K
fn decode8h(r: Raw, c: u32) -> W8 {
    let j = (c % 256u) / 32u;
    let dm = unpack2x16float(r.a.z);
    let sm = scale_min_w(r.b.xyz, j);
    let d = dm.x * sm.x;
    let m = dm.y * sm.y;
    let sh = 4u * (j & 1u);
    return W8(d * low_bytes_f32(r.a.x >> sh, 15u) - m, d * low_bytes_f32(r.a.y >> sh, 15u) - m);
}
#endif
#ifdef TYPE_Q8_0
// Byte b ^ 0x80 is q + 128.
fn decode8h(r: Raw, c: u32) -> W8 {
    let d = half_of(r.a.z, c / 32u);
    let lo = low_bytes_f32(r.a.x ^ 0x80808080u, 255u) - 128.0;
    let hi = low_bytes_f32(r.a.y ^ 0x80808080u, 255u) - 128.0;
    return W8(d * lo, d * hi);
}
#endif

fn decode_run(r: Raw, c: u32) -> W8 {
    return decode8h(r, c);
}
#else
fn decode_run(r: Raw, c: u32) -> W8 {
    return decode8(r, c);
}
#endif

fn put_w(i: u32, k0: u32, r: Raw) {
    let m = i / (BK / 8u);
    let kk = 8u * (i % (BK / 8u));
    let v = decode_run(r, k0 + kk);
    let lo = vec4<f16>(v.lo);
    let hi = vec4<f16>(v.hi);
    let s = m * LDA + kk;
    wa[s] = lo.x;
    wa[s + 1u] = lo.y;
    wa[s + 2u] = lo.z;
    wa[s + 3u] = lo.w;
    wa[s + 4u] = hi.x;
    wa[s + 5u] = hi.y;
    wa[s + 6u] = hi.z;
    wa[s + 7u] = hi.w;
}

fn fetch_x(i: u32, t0: u32, k0: u32) -> vec4<f32> {
    let n = i / (BK / 4u);
    let c = k0 + 4u * (i % (BK / 4u));
    var v = vec4<f32>(0.0);
    if t0 + n < p.n_tokens && c < p.cols {
        let xi = p.x_offset + (t0 + n) * p.x_stride + c;
        if c + 4u <= p.cols && p.x_vec4 == 1u {
            v = x4[xi / 4u];
        } else if c + 4u <= p.cols {
            v = vec4<f32>(x[xi], x[xi + 1u], x[xi + 2u], x[xi + 3u]);
        } else {
            // A float row's tail: the X values past `cols` belong to the next token.
            let n_in = p.cols - c;
            v.x = x[xi];
            if n_in > 1u {
                v.y = x[xi + 1u];
            }
            if n_in > 2u {
                v.z = x[xi + 2u];
            }
        }
    }
    return v;
}

fn put_x(i: u32, v: vec4<f32>) {
    let n = i / (BK / 4u);
    let kk = 4u * (i % (BK / 4u));
    let h = vec4<f16>(clamp(v, vec4<f32>(-65504.0), vec4<f32>(65504.0)));
    let s = n * LDB + kk;
    xb[s] = h.x;
    xb[s + 1u] = h.y;
    xb[s + 2u] = h.z;
    xb[s + 3u] = h.w;
}

// Y for the fragment this subgroup just put in its slot of `cs`: rows rb .. rb + 15, tokens
// tb .. tb + 15, bounds checked. Lane l writes elements l, l + 32, ... (neighbouring rows of a
// token: adjacent addresses in Y).
fn out_frag(sg: u32, lane: u32, rb: u32, tb: u32) {
    for (var j = 0u; j < 8u; j++) {
        let e = lane + 32u * j;
        let r = rb + e % 16u;
        let t = tb + e / 16u;
        if r < p.rows && t < p.n_tokens {
            y[p.y_offset + t * p.y_stride + r] = cs[sg * 256u + e];
        }
    }
}

@compute @workgroup_size(WG_SIZE)
fn gemm_coop(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let g = get_wid(wid, nwg);
    let t0 = (g % p.token_tiles) * BN;
    let r0 = (g / p.token_tiles) * BM;
    // Workgroups past the grid's end (r0 >= rows) run through: every load is zero and every
    // store bounds checked, and the cooperative operations need the whole subgroup's control
    // flow uniform, which an early return would break.
    // This subgroup's rows rm .. rm + SUB_M - 1 and tokens tn .. tn + 31 of the tile.
    let rm = SUB_M * (sg % SG_M);
    let tn = 32u * (sg / SG_M);
    // The accumulators start from a zero fragment loaded from workgroup memory.
    for (var i = lid; i < N_SG * 256u; i += WG_SIZE) {
        cs[i] = 0.0;
    }
    workgroupBarrier();
    var c00 = coopLoad<coop_mat16x16<f32, C>>(&cs[0], 16u);
    var c01 = c00;
    var c10 = c00;
    var c11 = c00;
#ifdef FM4
    var c20 = c00;
    var c21 = c00;
    var c30 = c00;
    var c31 = c00;
#endif

    var wn: array<Raw, W_RUNS>;
    var xn: array<vec4<f32>, X_RUNS>;
    for (var j = 0u; j < W_RUNS; j++) {
        wn[j] = fetch_w(lid + j * WG_SIZE, r0, 0u);
    }
    for (var j = 0u; j < X_RUNS; j++) {
        xn[j] = fetch_x(lid + j * WG_SIZE, t0, 0u);
    }
    for (var k0 = 0u; k0 < p.cols; k0 += BK) {
        for (var j = 0u; j < W_RUNS; j++) {
            put_w(lid + j * WG_SIZE, k0, wn[j]);
        }
        for (var j = 0u; j < X_RUNS; j++) {
            put_x(lid + j * WG_SIZE, xn[j]);
        }
        workgroupBarrier();
        for (var j = 0u; j < W_RUNS; j++) {
            wn[j] = fetch_w(lid + j * WG_SIZE, r0, k0 + BK);
        }
        for (var j = 0u; j < X_RUNS; j++) {
            xn[j] = fetch_x(lid + j * WG_SIZE, t0, k0 + BK);
        }
        for (var kw = 0u; kw < BK; kw += 16u) {
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&xb[tn * LDB + kw], LDB);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&xb[(tn + 16u) * LDB + kw], LDB);
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&wa[rm * LDA + kw], LDA);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&wa[(rm + 16u) * LDA + kw], LDA);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
#ifdef FM4
            let a2 = coopLoadT<coop_mat16x16<f16, A>>(&wa[(rm + 32u) * LDA + kw], LDA);
            let a3 = coopLoadT<coop_mat16x16<f16, A>>(&wa[(rm + 48u) * LDA + kw], LDA);
            c20 = coopMultiplyAdd(a2, b0, c20);
            c21 = coopMultiplyAdd(a2, b1, c21);
            c30 = coopMultiplyAdd(a3, b0, c30);
            c31 = coopMultiplyAdd(a3, b1, c31);
#endif
        }
        workgroupBarrier();
    }

    // C[m, n] = Y[t0 + tn + n, r0 + rm + m]: each fragment goes through this subgroup's slot.
    coopStore(c00, &cs[sg * 256u], 16u);
    workgroupBarrier();
    out_frag(sg, lane, r0 + rm, t0 + tn);
    workgroupBarrier();
    coopStore(c01, &cs[sg * 256u], 16u);
    workgroupBarrier();
    out_frag(sg, lane, r0 + rm, t0 + tn + 16u);
    workgroupBarrier();
    coopStore(c10, &cs[sg * 256u], 16u);
    workgroupBarrier();
    out_frag(sg, lane, r0 + rm + 16u, t0 + tn);
    workgroupBarrier();
    coopStore(c11, &cs[sg * 256u], 16u);
    workgroupBarrier();
    out_frag(sg, lane, r0 + rm + 16u, t0 + tn + 16u);
#ifdef FM4
    workgroupBarrier();
    coopStore(c20, &cs[sg * 256u], 16u);
    workgroupBarrier();
    out_frag(sg, lane, r0 + rm + 32u, t0 + tn);
    workgroupBarrier();
    coopStore(c21, &cs[sg * 256u], 16u);
    workgroupBarrier();
    out_frag(sg, lane, r0 + rm + 32u, t0 + tn + 16u);
    workgroupBarrier();
    coopStore(c30, &cs[sg * 256u], 16u);
    workgroupBarrier();
    out_frag(sg, lane, r0 + rm + 48u, t0 + tn);
    workgroupBarrier();
    coopStore(c31, &cs[sg * 256u], 16u);
    workgroupBarrier();
    out_frag(sg, lane, r0 + rm + 48u, t0 + tn + 16u);
#endif
}
