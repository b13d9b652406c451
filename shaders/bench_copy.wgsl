// Bandwidth references for the GEMV benchmark (src/ops/matmul_bench.rs): what a plain streaming
// kernel reaches on this GPU, to compare a GEMV's weight bandwidth with.
//
//   copy: dst[i] = src[i] over n 16-byte elements (reads n * 16 bytes, writes as many).
//   stream: each invocation folds PER_THREAD elements strided across the buffer (so a warp's loads
//         are coalesced) and writes one word only if the fold hits a value random data never
//         gives: reads n * 16 bytes and writes (almost) nothing, like a GEMV's weight stream.
//
// Defines: WG_SIZE (invocations per workgroup). The grid is 2-D (get_wid); the host sizes it.

#include "common_decls.tmpl"

struct BenchCopyParams {
    n: u32,          // 16-byte elements in src (and dst)
    per_thread: u32, // elements each `stream` invocation folds
    threads: u32,    // invocations of the `stream` grid (its stride)
    pad0: u32,
}

@group(0) @binding(0) var<uniform> p: BenchCopyParams;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;       // (n)
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>; // (n)

@compute @workgroup_size(WG_SIZE)
fn copy(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = get_wid(wid, nwg) * WG_SIZE + lid;
    if i < p.n {
        dst[i] = src[i];
    }
}

@compute @workgroup_size(WG_SIZE)
fn stream(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = get_wid(wid, nwg) * WG_SIZE + lid;
    if t >= p.threads {
        return;
    }
    var acc = vec4<u32>(0u);
    for (var k = 0u; k < p.per_thread; k++) {
        let i = t + k * p.threads;
        if i < p.n {
            acc ^= src[i];
        }
    }
    // Never true for the bench's data (a fold of random words equal to this in all four lanes),
    // but the compiler cannot know: the loads stay.
    if all(acc == vec4<u32>(0x9e3779b9u)) {
        dst[t] = acc;
    }
}
