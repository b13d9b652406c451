// Context shift of one layer's K cache: rotate each retained cell from its old position
// (n_keep + shift + t) to its new one (n_keep + t) by R(-shift), into a scratch buffer.
// The host then copies scratch back over K at cell n_keep + t_begin, and moves V by copies.
//
// Why scratch: source cells [n_keep + shift, ...) and destination cells [n_keep, ...) overlap
// when shift < retained, and invocations of one dispatch cannot order a read before another's
// write. Chunks (t_begin, count) are processed in ascending order, which is safe because a
// chunk's destination ends below the next chunk's source (shift >= 1).
//
// Why a cos/sin table instead of rope_angle here: R(-shift) is the same for every cell, so the
// host computes cos/sin of -shift * theta_d once in f64 (with Llama-3 frequency factors folded
// in). The GPU's f32 pow/sin/cos of angles up to `shift` radians would lose about
// shift * 2^-24 rad; the table is exact to f32 rounding.
//
// Pairs: NeoX (rope_type 0) rotates (j, j + n_rot/2); NORM (1) rotates (2j, 2j + 1); both for
// j < n_rot/2. Dimensions at and beyond n_rot are copied unrotated, as pairs (2j, 2j + 1).
// One invocation per pair: (count, n_kv_heads, head_dim / 2) invocations in a 2-D grid.

#include "common_decls.tmpl"

struct KvShiftParams {
    n_keep: u32,
    shift: u32,
    t_begin: u32,
    count: u32,
    n_kv_heads: u32,
    head_dim: u32,
    n_rot: u32,
    rope_type: u32,
}

@group(0) @binding(0) var<uniform> p: KvShiftParams;
@group(0) @binding(1) var<storage, read> k_cache: array<f32>;       // (n_ctx, n_kv_heads, head_dim)
@group(0) @binding(2) var<storage, read_write> scratch: array<f32>; // (count, n_kv_heads, head_dim)
@group(0) @binding(3) var<storage, read> cs: array<vec2<f32>>;      // (n_rot / 2): (cos, sin) of R(-shift)

@compute @workgroup_size(WG_SIZE)
fn kv_shift(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
) {
    let idx = get_wid(wid, nwg) * WG_SIZE + lid.x;
    let half_dim = p.head_dim / 2u;
    let per_cell = p.n_kv_heads * half_dim;
    if idx >= p.count * per_cell {
        return;
    }
    let t = idx / per_cell;
    let h = (idx % per_cell) / half_dim;
    let j = idx % half_dim;

    let kv_dim = p.n_kv_heads * p.head_dim;
    let src = (p.n_keep + p.shift + p.t_begin + t) * kv_dim + h * p.head_dim;
    let dst = t * kv_dim + h * p.head_dim;

    let half_rot = p.n_rot / 2u;
    var e0 = 2u * j;
    var e1 = 2u * j + 1u;
    if p.rope_type == 0u && j < half_rot {
        e0 = j;
        e1 = j + half_rot;
    }
    let x0 = k_cache[src + e0];
    let x1 = k_cache[src + e1];
    if j < half_rot {
        let r = rotate_rope(x0, x1, cs[j].x, cs[j].y);
        scratch[dst + e0] = r.x;
        scratch[dst + e1] = r.y;
    } else {
        scratch[dst + e0] = x0;
        scratch[dst + e1] = x1;
    }
}
