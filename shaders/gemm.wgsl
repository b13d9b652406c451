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

#include "gemm_decls.tmpl"

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
