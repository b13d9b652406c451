// Token embedding gather: out[t, c] = E[ids[t], c] * scale, for a table E of any GPU weight type.
//
// The table may be split into row-range parts (src/gpu/tensor.rs): the host dispatches once per
// part, and each dispatch writes only the tokens whose row lies in its part (the others return
// at once), so every token is written by exactly one dispatch. Ids outside the table are written
// by none (the host validates nothing it cannot see: ids live on the GPU).
//
// Defines: TYPE_* (the table's type, decoded by quant_decls.tmpl), WG_SIZE.
// One invocation per (token, decode unit): n_tokens * units invocations in a 2-D grid.

#include "common_decls.tmpl"

struct EmbedParams {
    n_tokens: u32,
    cols: u32,       // values per row (n_embd)
    row_words: u32,  // u32 words per row in the GPU layout
    units: u32,      // decode units per row (src/ops/matmul.rs units_per_row)
    row_start: u32,  // first table row held by this part
    rows: u32,       // rows in this part
    ids_offset: u32, // element index of ids[0]
    out_offset: u32, // element index of out[0, 0]
    out_stride: u32, // elements between out[t, 0] and out[t + 1, 0]
    scale: f32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> p: EmbedParams;
@group(0) @binding(1) var<storage, read> w: array<u32>;         // (rows, row_words): this part, GPU layout
@group(0) @binding(2) var<storage, read> ids: array<u32>;       // (n_tokens) from ids_offset
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // (n_tokens, out_stride) from out_offset

var<private> obase: u32; // out[t, 0] of this invocation's token

// The decoders' sinks: store 4 scaled values (all of them, or those before `cols`).
fn acc4(wv: vec4<f32>, col: u32) {
    let i = obase + col;
    let v = wv * p.scale;
    out[i] = v.x;
    out[i + 1u] = v.y;
    out[i + 2u] = v.z;
    out[i + 3u] = v.w;
}
fn acc4_tail(wv: vec4<f32>, col: u32) {
    let v = wv * p.scale;
    for (var k = 0u; k < 4u && col + k < p.cols; k++) {
        out[obase + col + k] = v[k];
    }
}

#include "quant_decls.tmpl"

@compute @workgroup_size(WG_SIZE)
fn embed(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let idx = get_wid(wid, nwg) * WG_SIZE + lid;
    if idx >= p.n_tokens * p.units {
        return;
    }
    let t = idx / p.units;
    let u = idx % p.units;
    let row = ids[p.ids_offset + t];
    if row < p.row_start || row - p.row_start >= p.rows {
        return; // another part holds this row
    }
    obase = p.out_offset + t * p.out_stride;
    unit((row - p.row_start) * p.row_words, u);
}
