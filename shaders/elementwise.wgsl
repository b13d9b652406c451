// Elementwise ops on (n_rows, n_cols) f32 views with row strides (a stride of 0 broadcasts a row):
//   add_scaled: out[r, i] = a[r, i] + b[r, i] * scale
//               (residual add; Granite's residual multiplier; a bias row added to every token
//               with b_stride = 0 and a = out, in place)
//   scale:      out[r, i] *= scale, in place
//
// Defines (src/ops/elementwise.rs): WG_SIZE; IN_A, IN_B: the binding each input reads through
// (dst, src0 or src1), and HAS_SRC0 / HAS_SRC1: which read-only bindings exist. An input in the
// output's buffer reads through dst, and two inputs in one buffer share a binding: WebGPU
// (Dawn) rejects a buffer bound twice in one dispatch when either binding is writable.
// One invocation per element, in a 2-D grid.

#include "common_decls.tmpl"

struct ElementwiseParams {
    n_rows: u32,
    n_cols: u32,
    out_offset: u32, // element index of out[0, 0]
    out_stride: u32, // elements between out[r, 0] and out[r + 1, 0]
    a_offset: u32,
    a_stride: u32,
    b_offset: u32,
    b_stride: u32,   // 0 broadcasts one row of b over every row
    scale: f32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> p: ElementwiseParams;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>; // out: (n_rows, out_stride) from out_offset
#ifdef HAS_SRC0
@group(0) @binding(2) var<storage, read> src0: array<f32>;      // the first input buffer other than out's
#endif
#ifdef HAS_SRC1
@group(0) @binding(3) var<storage, read> src1: array<f32>;      // the second
#endif

fn index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return get_wid(wid, nwg) * WG_SIZE + lid;
}

#ifdef ADD_SCALED
@compute @workgroup_size(WG_SIZE)
fn add_scaled(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let idx = index(wid, nwg, lid);
    if idx >= p.n_rows * p.n_cols {
        return;
    }
    let r = idx / p.n_cols;
    let i = idx % p.n_cols;
    let a = IN_A[p.a_offset + r * p.a_stride + i];
    let b = IN_B[p.b_offset + r * p.b_stride + i];
    dst[p.out_offset + r * p.out_stride + i] = a + b * p.scale;
}
#endif

#ifdef SCALE
@compute @workgroup_size(WG_SIZE)
fn scale(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let idx = index(wid, nwg, lid);
    if idx >= p.n_rows * p.n_cols {
        return;
    }
    let o = p.out_offset + (idx / p.n_cols) * p.out_stride + idx % p.n_cols;
    dst[o] = dst[o] * p.scale;
}
#endif
