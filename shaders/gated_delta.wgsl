// The gated delta rule of a gated delta-net layer (Qwen3.5), token by token, with the output's
// gated RMS norm up to the gate: for value head h (key head hk = h % n_k_heads), token t,
//   q, k     = the head's q and k from the conv output, each L2-normalised (x / sqrt(|x|^2 + eps))
//   beta     = sigmoid(b[t, h]);  g = softplus(a_in[t, h] + dt_bias[h]) * A[h]   (A < 0: decay)
//   S       *= exp(g)                                    (S: the head's S x S state, per layer)
//   d[j]     = (v[j] - sum_i S[i, j] k[i]) * beta
//   S[i, j] += k[i] d[j]
//   o[j]     = sum_i S[i, j] q[i] / sqrt(S)
//   out[j]   = o[j] / sqrt(mean_j o^2 + norm_eps) * norm_w[j]
// This is llama.cpp's recurrent form (ggml_gated_delta_net), exact for a batch of any length;
// the engine runs it for decode, and gated_delta_chunked.wgsl (the same function a chunk of
// tokens at a time) for prefill batches. The caller multiplies by silu(z) (the GLU of the output
// projection).
//
// The state is stored as llama.cpp stores it, transposed: row j holds column j of S, so an
// invocation owning j reads and writes only its row, and the rows need no synchronisation. The
// barriers are the norms' reductions (the sums of squares of q, k and o over the head).
// A batch starting at position 0 starts from a zero state (a new sequence).
//
// Defines (src/ops/gated_delta.rs): WG_SIZE, a power of two (the tree reduction halves it).
// One workgroup per value head, 2-D grid. A dispatch may cover part of a batch (p's offsets then
// start at its first token): on a CPU adapter the host splits long batches to stay under
// lavapipe's loop limit (src/ops/gated_delta.rs, tokens_per_dispatch).

#include "gated_delta_decls.tmpl"

alias WgSumT = vec2<f32>;
#include "wg_sum_decls.tmpl"

// Sum of (x, y) over the workgroup; every invocation gets it. Callers are in uniform control flow.
fn reduce2(lid: u32, v: vec2<f32>) -> vec2<f32> {
    return wg_tree_sum(lid, v);
}

@compute @workgroup_size(WG_SIZE)
fn gated_delta(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // Workgroups past the last head skip the work but not the barriers (uniform control flow).
    let h_raw = get_wid(wid, nwg);
    let live = h_raw < p.n_v_heads;
    let h = min(h_raw, p.n_v_heads - 1u);
    let hk = h % p.n_k_heads;
    let n = p.head_dim;
    let rows = h * n * n; // this head's state
    // The rows this invocation owns: j0, j0 + WG_SIZE, ... (none in a workgroup past the heads).
    let j0 = select(n, lid, live);
    if step.pos0 + p.pos0 == 0u {
        for (var j = j0; j < n; j += WG_SIZE) {
            for (var i = 0u; i < n; i++) {
                state[rows + j * n + i] = 0.0;
            }
        }
    }
    let nv = p.n_v_heads;
    let scale = 1.0 / sqrt(f32(n));
    for (var t = 0u; t < p.n_tokens; t++) {
        let qb = p.q_offset + t * p.qkv_stride + hk * n;
        let kb = t * p.qkv_stride + p.k_offset + hk * n;
        let vb = t * p.qkv_stride + p.v_offset + h * n;
        var ss = vec2<f32>(0.0);
        for (var i = lid; i < n; i += WG_SIZE) {
            let q = qkv[qb + i];
            let k = qkv[kb + i];
            ss += vec2<f32>(q * q, k * k);
        }
        let tot = reduce2(lid, ss);
        let inv_q = 1.0 / sqrt(tot.x + p.eps);
        let inv_k = 1.0 / sqrt(tot.y + p.eps);
        let gate = gates(t, h);
        let beta = gate.x;
        let decay = exp(gate.y);
        var oo = 0.0;
        let ob = p.out_offset + t * p.out_stride + h * n;
        for (var j = j0; j < n; j += WG_SIZE) {
            let r = rows + j * n;
            var sk = 0.0;
            for (var i = 0u; i < n; i++) {
                let s = state[r + i] * decay;
                state[r + i] = s;
                sk += s * (qkv[kb + i] * inv_k);
            }
            let d = (qkv[vb + j] - sk) * beta;
            var o = 0.0;
            for (var i = 0u; i < n; i++) {
                let s = state[r + i] + (qkv[kb + i] * inv_k) * d;
                state[r + i] = s;
                o += s * (qkv[qb + i] * inv_q);
            }
            o *= scale;
            dst[ob + j] = o;
            oo += o * o;
        }
        let o_ss = reduce2(lid, vec2<f32>(oo, 0.0)).x;
        let inv_o = 1.0 / sqrt(o_ss / f32(n) + p.norm_eps);
        // Each invocation rescales the outputs it wrote itself.
        for (var j = j0; j < n; j += WG_SIZE) {
            dst[ob + j] = dst[ob + j] * inv_o * head_w[2u * nv + j];
        }
    }
}
