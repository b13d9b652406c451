// The gated delta rule in its chunked form, for prefill: the same function of the inputs as
// gated_delta.wgsl (whose header states the rule), computed a chunk of CHUNK tokens at a time.
// For value head h, a chunk of tokens r = 0 .. c-1 entered with state S0 (S x S, column j of S
// = row j of the stored state):
//   G[r]     = sum_{s <= r} log decay[s]          (cumulative, <= 0; decays inside the chunk are
//                                                  exp(G[r] - G[s]) <= 1 for s <= r, never a
//                                                  quotient of tiny numbers)
//   k^, q^   = the L2-normalised k and q (q^ also times 1 / sqrt(S))
//   A[r, s]  = beta[r] exp(G[r] - G[s]) (k^_r . k^_s)          s < r
//   B[r, s]  = exp(G[r] - G[s]) (q^_r . k^_s)                  s <= r
//   d[r, j]  = beta[r] (v[r, j] - exp(G[r]) (S0[:, j] . k^_r)) - sum_{s < r} A[r, s] d[s, j]
//   o[r, j]  = exp(G[r]) (S0[:, j] . q^_r) + sum_{s <= r} B[r, s] d[s, j]
//   S[:, j]  = exp(G[c-1]) S0[:, j] + sum_r exp(G[c-1] - G[r]) k^_r d[r, j]    (the next S0)
// d is the delta each token adds (the recurrent form's (v - S k) beta): its triangular system
// (I + A) d = rhs is the WY / UT-transform form of the chunk's product of Householder-like
// updates, solved here by forward substitution per column, so no C x C inverse is stored. Then
// out = o / sqrt(mean_j o^2 + norm_eps) * norm_w, as in the recurrent form.
//
// Work split: one workgroup per value head (2-D grid). Per chunk the workgroup shares the
// normalised keys and queries (CHUNK x HEAD_DIM each) and A and B (one CHUNK x CHUNK array: B
// on and below the diagonal, A transposed above it) in workgroup memory; then every invocation
// owns value columns j (rows of the stored state, as in the recurrent form) and solves, outputs
// and advances them alone, with d and o in private arrays. The barriers are per chunk, not per
// token. Queries in workgroup memory rather than read from qkv in the innermost loop: on
// lavapipe 15-20 % faster, although the chunk is then 16 tokens instead of 32 at heads of 128.
// o is written to dst before its norm; the norm of token r sums a row that other invocations
// wrote, hence the storage barrier.
//
// Defines (src/ops/gated_delta_chunked.rs): WG_SIZE, CHUNK (tokens per chunk, sized from the
// device's workgroup memory), HEAD_DIM (S, equal to p.head_dim: the workgroup arrays' size).
// A dispatch may cover part of a batch (p's offsets then start at its first token; the host
// splits long batches on CPU adapters to stay under lavapipe's loop limit, see the .rs).

#include "gated_delta_decls.tmpl"

var<workgroup> keys: array<f32, CHUNK * HEAD_DIM>;   // (CHUNK, S): k^ of the chunk's tokens
var<workgroup> queries: array<f32, CHUNK * HEAD_DIM>; // (CHUNK, S): q^ of the chunk's tokens
var<workgroup> mixes: array<f32, CHUNK * CHUNK>;     // [r, s]: B[r, s] (s <= r); [s, r]: A[r, s] (s < r)
var<workgroup> tok_beta: array<f32, CHUNK>;          // beta
var<workgroup> tok_lg: array<f32, CHUNK>;            // log decay, then 1 / rms of the output
var<workgroup> tok_g: array<f32, CHUNK>;             // G, the cumulative log decay
var<workgroup> tok_iq: array<f32, CHUNK>;            // 1 / (|q| sqrt(S))
var<workgroup> tok_ik: array<f32, CHUNK>;            // 1 / |k|

@compute @workgroup_size(WG_SIZE)
fn gated_delta_chunked(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // Workgroups past the last head compute the shared values of the last head but own no
    // column and write nothing; they keep the barriers (uniform control flow).
    let h_raw = get_wid(wid, nwg);
    let live = h_raw < p.n_v_heads;
    let h = min(h_raw, p.n_v_heads - 1u);
    let hk = h % p.n_k_heads;
    let n = HEAD_DIM;
    let rows = h * n * n; // this head's state
    // The columns this invocation owns: j0, j0 + WG_SIZE, ... (none in a workgroup past the heads).
    let j0 = select(n, lid, live);
    if step.pos0 + p.pos0 == 0u {
        for (var j = j0; j < n; j += WG_SIZE) {
            for (var i = 0u; i < n; i++) {
                state[rows + j * n + i] = 0.0;
            }
        }
    }
    let scale = 1.0 / sqrt(f32(n));
    for (var c0 = 0u; c0 < p.n_tokens; c0 += CHUNK) {
        let nc = min(CHUNK, p.n_tokens - c0);
        // Per token: the norms of q and k, beta, the log decay.
        for (var r = lid; r < nc; r += WG_SIZE) {
            let t = c0 + r;
            let qb = p.q_offset + t * p.qkv_stride + hk * n;
            let kb = p.k_offset + t * p.qkv_stride + hk * n;
            var ss = vec2<f32>(0.0);
            for (var i = 0u; i < n; i++) {
                let q = qkv[qb + i];
                let k = qkv[kb + i];
                ss += vec2<f32>(q * q, k * k);
            }
            tok_iq[r] = scale / sqrt(ss.x + p.eps);
            tok_ik[r] = 1.0 / sqrt(ss.y + p.eps);
            let gate = gates(t, h);
            tok_beta[r] = gate.x;
            tok_lg[r] = gate.y;
        }
        workgroupBarrier();
        // The cumulative log decay, and the normalised keys.
        for (var r = lid; r < nc; r += WG_SIZE) {
            var g = 0.0;
            for (var s = 0u; s <= r; s++) {
                g += tok_lg[s];
            }
            tok_g[r] = g;
        }
        for (var e = lid; e < nc * n; e += WG_SIZE) {
            let r = e / n;
            let i = e % n;
            keys[e] = qkv[p.k_offset + (c0 + r) * p.qkv_stride + hk * n + i] * tok_ik[r];
            queries[e] = qkv[p.q_offset + (c0 + r) * p.qkv_stride + hk * n + i] * tok_iq[r];
        }
        workgroupBarrier();
        // A and B: the pairs s <= r of the chunk.
        for (var e = lid; e < nc * nc; e += WG_SIZE) {
            let r = e / nc;
            let s = e % nc;
            if s <= r {
                var kk = 0.0;
                var qk = 0.0;
                for (var i = 0u; i < n; i++) {
                    let ks = keys[s * n + i];
                    kk += keys[r * n + i] * ks;
                    qk += queries[r * n + i] * ks;
                }
                let decay = exp(tok_g[r] - tok_g[s]);
                mixes[r * CHUNK + s] = decay * qk;
                if s < r {
                    mixes[s * CHUNK + r] = tok_beta[r] * decay * kk;
                }
            }
        }
        workgroupBarrier();
        // Every owned column: solve for d, write o, advance the state.
        let g_last = tok_g[nc - 1u];
        for (var j = j0; j < n; j += WG_SIZE) {
            let row = rows + j * n;
            var d: array<f32, CHUNK>; // S0[:, j] . k^_r, then d[r, j]
            var o: array<f32, CHUNK>; // S0[:, j] . q^_r
            for (var r = 0u; r < nc; r++) {
                d[r] = 0.0;
                o[r] = 0.0;
            }
            for (var i = 0u; i < n; i++) {
                let s0 = state[row + i];
                for (var r = 0u; r < nc; r++) {
                    d[r] += s0 * keys[r * n + i];
                    o[r] += s0 * queries[r * n + i];
                }
            }
            for (var r = 0u; r < nc; r++) {
                let v = qkv[p.v_offset + (c0 + r) * p.qkv_stride + h * n + j];
                var dr = tok_beta[r] * (v - exp(tok_g[r]) * d[r]);
                for (var s = 0u; s < r; s++) {
                    dr -= mixes[s * CHUNK + r] * d[s];
                }
                d[r] = dr;
            }
            for (var r = 0u; r < nc; r++) {
                var out_r = exp(tok_g[r]) * o[r];
                for (var s = 0u; s <= r; s++) {
                    out_r += mixes[r * CHUNK + s] * d[s];
                }
                dst[p.out_offset + (c0 + r) * p.out_stride + h * n + j] = out_r;
            }
            // From here d[r] carries the decay from token r to the chunk's end.
            for (var r = 0u; r < nc; r++) {
                d[r] *= exp(g_last - tok_g[r]);
            }
            let carry = exp(g_last);
            for (var i = 0u; i < n; i++) {
                var s1 = carry * state[row + i];
                for (var r = 0u; r < nc; r++) {
                    s1 += keys[r * n + i] * d[r];
                }
                state[row + i] = s1;
            }
        }
        // The outputs' RMS norm: invocation r sums token r's row, written by every invocation.
        storageBarrier();
        if live {
            for (var r = lid; r < nc; r += WG_SIZE) {
                let ob = p.out_offset + (c0 + r) * p.out_stride + h * n;
                var oo = 0.0;
                for (var j = 0u; j < n; j++) {
                    let x = dst[ob + j];
                    oo += x * x;
                }
                tok_lg[r] = 1.0 / sqrt(oo / f32(n) + p.norm_eps);
            }
        }
        // tok_lg is shared; the rows just read are rescaled by their owners.
        workgroupBarrier();
        storageBarrier();
        let nv = p.n_v_heads;
        for (var j = j0; j < n; j += WG_SIZE) {
            for (var r = 0u; r < nc; r++) {
                let ob = p.out_offset + (c0 + r) * p.out_stride + h * n;
                dst[ob + j] = dst[ob + j] * tok_lg[r] * head_w[2u * nv + j];
            }
        }
        // The next chunk overwrites the shared arrays.
        workgroupBarrier();
    }
}
