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
@group(0) @binding(1) var<storage, read_write> dst: array<f32>; // out: (n_rows, out_stride) from out_offset
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
    if idx >= p.n_rows * p.n_cols {
        return;
    }
    let r = idx / p.n_cols;
    let i = idx % p.n_cols;
    let gr = p.gate_offset + (r / p.gate_group) * p.gate_group_stride + (r % p.gate_group) * p.gate_stride;
    let g = IN_GATE[gr + i];
    let u = IN_UP[p.up_offset + r * p.up_stride + i];
    dst[p.out_offset + r * p.out_stride + i] = act(g) * u;
}
