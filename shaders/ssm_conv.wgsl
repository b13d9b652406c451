// The causal depthwise convolution of a gated delta-net layer (Qwen3.5), over the q | k | v
// projection output, followed by SiLU:
//   out[t, c] = silu( sum_{j < d_conv} w[c, j] * x(pos_t - (d_conv - 1) + j, c) )
// where x of positions before this batch come from the layer's rolling conv state, the last
// d_conv - 1 inputs (oldest first), and positions below 0 are zero. This is llama.cpp's
// ggml_ssm_conv over its conv state concatenated with the batch, then ggml_silu.
//
// One invocation per channel walks the batch's tokens in order, so it alone reads and rewrites
// its channel of the state: no other invocation touches it, and the state left behind is the
// last d_conv - 1 inputs. A batch starting at position 0 starts from a zero state (a new
// sequence), whatever the buffer held.
//
// Defines (src/ops/ssm_conv.rs): WG_SIZE. One invocation per channel, 2-D grid.

#include "common_decls.tmpl"

struct SsmConvParams {
    n_tokens: u32,
    channels: u32,
    d_conv: u32,     // taps: the current token and d_conv - 1 before it
    pos0: u32,       // added to step.pos0 (a one-off dispatch binds a zero step)
    in_offset: u32,  // element index of x[0, 0] in src
    in_stride: u32,  // elements between tokens in src
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> p: SsmConvParams;
@group(0) @binding(1) var<storage, read> src: array<f32>;         // (n_tokens, in_stride): x from in_offset
@group(0) @binding(2) var<storage, read> w: array<f32>;           // (channels, d_conv): the kernel, oldest tap first
@group(0) @binding(3) var<storage, read_write> state: array<f32>; // (d_conv - 1, channels): the last inputs, oldest first
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;   // (n_tokens, channels)
@group(0) @binding(5) var<storage, read> step: StepState;         // this step's positions

@compute @workgroup_size(WG_SIZE)
fn ssm_conv(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let c = get_wid(wid, nwg) * WG_SIZE + lid;
    if c >= p.channels {
        return;
    }
    let hist = p.d_conv - 1u; // rows of state
    if step.pos0 + p.pos0 == 0u {
        for (var j = 0u; j < hist; j++) {
            state[j * p.channels + c] = 0.0;
        }
    }
    let wb = c * p.d_conv;
    for (var t = 0u; t < p.n_tokens; t++) {
        let x = src[p.in_offset + t * p.in_stride + c];
        var acc = 0.0; // oldest tap first, as llama.cpp sums
        for (var j = 0u; j < hist; j++) {
            acc += w[wb + j] * state[j * p.channels + c];
        }
        acc += w[wb + hist] * x;
        // Slide the window: drop the oldest input, append x.
        for (var j = 0u; j + 1u < hist; j++) {
            state[j * p.channels + c] = state[(j + 1u) * p.channels + c];
        }
        if hist > 0u {
            state[(hist - 1u) * p.channels + c] = x;
        }
        // silu; exp(-acc) overflows to inf below -88: acc / inf = -0, the right limit.
        dst[t * p.channels + c] = acc / (1.0 + exp(-acc));
    }
}
