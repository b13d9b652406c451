// LFM2's gated short convolution, the part between its two projections:
//   bx[t, c]  = B[t, c] * x[t, c]                 (B, C, x: the thirds of the in_proj output)
//   conv[t,c] = sum_{j < L} w[c, j] * bx(pos_t - (L - 1) + j, c)   (causal, depthwise, width L)
//   out[t, c] = C[t, c] * conv[t, c]
// bx of every position is kept in `rows` (the layer's conv rows, one per cache cell), so the
// positions before this batch come from there, the batch's own from `bcx`, and positions below 0
// are zero. This is llama.cpp's ggml_ssm_conv over its conv state (the last L - 1 bx rows)
// concatenated with the batch, with the state kept per cell instead of once per sequence.
//
// Defines (src/ops/short_conv.rs): WG_SIZE. One invocation per (token, channel), 2-D grid.

#include "common_decls.tmpl"

struct ShortConvParams {
    n_tokens: u32,
    n_embd: u32,
    l_cache: u32,    // L: taps of the kernel (the current token and L - 1 before it)
    pos0: u32,       // added to step.pos0 (a one-off dispatch binds a zero step)
    bcx_stride: u32, // elements between tokens in bcx (3 n_embd for a packed in_proj output)
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> p: ShortConvParams;
@group(0) @binding(1) var<storage, read> bcx: array<f32>;        // (n_tokens, bcx_stride): B | C | x, n_embd each
@group(0) @binding(2) var<storage, read> w: array<f32>;          // (n_embd, l_cache): the kernel, oldest tap first
@group(0) @binding(3) var<storage, read_write> rows: array<f32>; // (n_ctx, n_embd): bx by position
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;  // (n_tokens, n_embd)
@group(0) @binding(5) var<storage, read> step: StepState;        // this step's positions

@compute @workgroup_size(WG_SIZE)
fn short_conv(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let idx = get_wid(wid, nwg) * WG_SIZE + lid;
    if idx >= p.n_tokens * p.n_embd {
        return;
    }
    let t = idx / p.n_embd;
    let c = idx % p.n_embd;
    let base = step.pos0 + p.pos0; // position of the batch's first token
    let pos = base + t;
    var acc = 0.0;
    for (var j = 0u; j < p.l_cache; j++) {
        let back = p.l_cache - 1u - j; // how many tokens before this one
        if back > pos {
            continue; // before position 0: zero padding
        }
        let q = pos - back;
        var v: f32;
        if q >= base {
            let r = (q - base) * p.bcx_stride;
            v = bcx[r + c] * bcx[r + 2u * p.n_embd + c];
        } else {
            v = rows[q * p.n_embd + c];
        }
        acc += w[c * p.l_cache + j] * v;
    }
    let r = t * p.bcx_stride;
    // Positions of this batch are only read from bcx above, so this write races with nothing.
    rows[pos * p.n_embd + c] = bcx[r + c] * bcx[r + 2u * p.n_embd + c];
    dst[t * p.n_embd + c] = bcx[r + p.n_embd + c] * acc;
}
