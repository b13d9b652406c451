//! kv_shift on the GPU against the CPU RoPE reference: a K cell roped at its old position and
//! shifted must equal the same raw vector roped at its new position. Runs natively and in
//! headless Chrome.

#![allow(clippy::needless_range_loop)] // index loops compare several arrays at one index

mod common;

use cera_web::generate::session::now_s;
use cera_web::gpu::readback::read_f32;
use cera_web::gpu::{GpuContext, LimitRequest};
use cera_web::kv::{KvCache, KvCacheConfig};
use cera_web::rope::{RopeConfig, RopeType};
use common::Rng;

#[cfg(target_arch = "wasm32")]
wasm_bindgen_test::wasm_bindgen_test_configure!(run_in_browser);

/// One shift scenario.
#[derive(Clone)]
struct Case {
    rope: RopeType,
    freq_factors: bool,
    head_dim: u32,
    n_rot: u32,
    n_kv_heads: u32,
    n_ctx: u32,
    n_past: u32,
    n_keep: u32,
    n_discard: u32,
    layers: u32,
    workgroup_size: Option<u32>,
    max_scratch_cells: Option<u32>,
}

impl Case {
    fn new(
        rope: RopeType,
        head_dim: u32,
        n_kv_heads: u32,
        n_past: u32,
        n_keep: u32,
        n_discard: u32,
    ) -> Self {
        Case {
            rope,
            freq_factors: false,
            head_dim,
            n_rot: head_dim,
            n_kv_heads,
            n_ctx: n_past + 3,
            n_past,
            n_keep,
            n_discard,
            layers: 1,
            workgroup_size: None,
            max_scratch_cells: None,
        }
    }

    /// Layer `l`'s rope: layers alternate bases (as Gemma 3's local/global layers do).
    fn rope_cfg(&self, l: u32) -> RopeConfig {
        let base = if l.is_multiple_of(2) {
            10000.0
        } else {
            1_000_000.0
        };
        let mut r = RopeConfig::new(self.head_dim as usize, base, self.rope);
        r.n_rot = self.n_rot as usize;
        if self.freq_factors {
            r.freq_factors = Some(
                (0..self.n_rot / 2)
                    .map(|j| 1.0 + (j % 7) as f32 * 0.75)
                    .collect(),
            );
        }
        r
    }

    fn cache_cfg(&self) -> KvCacheConfig {
        KvCacheConfig {
            n_ctx: self.n_ctx,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            layer_ropes: (0..self.layers).map(|l| self.rope_cfg(l)).collect(),
            shift_workgroup_size: self.workgroup_size,
            max_scratch_cells: self.max_scratch_cells,
        }
    }
}

/// Raw (unroped) K and V rows of every position of every layer, from a fixed seed.
struct Data {
    raw_k: Vec<Vec<f32>>, // [layer] (n_past, kv_dim)
    v: Vec<Vec<f32>>,
}

fn make_data(c: &Case, seed: u64) -> Data {
    let kv_dim = (c.n_kv_heads * c.head_dim) as usize;
    let mut rng = Rng::new(seed);
    let raw_k = (0..c.layers)
        .map(|_| rng.vec(c.n_past as usize * kv_dim))
        .collect();
    let v = (0..c.layers)
        .map(|_| rng.vec(c.n_past as usize * kv_dim))
        .collect();
    Data { raw_k, v }
}

/// K as the forward pass would have stored it: raw row `t` roped at position `t + pos0`.
fn roped(c: &Case, l: u32, raw: &[f32], pos0: u32) -> Vec<f32> {
    let kv_dim = (c.n_kv_heads * c.head_dim) as usize;
    let rope = c.rope_cfg(l);
    let mut out = raw.to_vec();
    for (t, row) in out.chunks_exact_mut(kv_dim).enumerate() {
        rope.apply_heads(row, (t as u32 + pos0) as f64);
    }
    out
}

/// Tolerance: f32 rounding of a rotation (two products and a sum) on values of size ~1.
const ATOL: f32 = 2e-6;

async fn check_case(ctx: &GpuContext, c: &Case) {
    let kv_dim = (c.n_kv_heads * c.head_dim) as usize;
    let data = make_data(c, 0x5eed ^ c.n_past as u64 ^ (c.head_dim as u64) << 20);
    let mut cache = KvCache::new(ctx, c.cache_cfg()).expect("cache");
    for l in 0..c.layers {
        let k = roped(c, l, &data.raw_k[l as usize], 0);
        cache
            .write_cells(ctx, l as usize, 0, &k, &data.v[l as usize])
            .unwrap();
    }
    cache.advance(c.n_past).unwrap();
    let stats = cache.shift(ctx, c.n_keep, c.n_discard).expect("shift");
    let n_after = c.n_past - c.n_discard;
    assert_eq!(cache.n_past(), n_after);
    assert_eq!(stats.retained, c.n_past - c.n_keep - c.n_discard);

    for l in 0..c.layers {
        let got_k = read_f32(ctx, cache.k(l as usize), 0, n_after as usize * kv_dim)
            .await
            .unwrap();
        let got_v = read_f32(ctx, cache.v(l as usize), 0, n_after as usize * kv_dim)
            .await
            .unwrap();
        // Expected: kept cells untouched; retained raw rows roped at their new positions.
        let keep = c.n_keep as usize * kv_dim;
        let raw = &data.raw_k[l as usize];
        let mut retained_raw = raw[..keep].to_vec();
        retained_raw.extend_from_slice(&raw[keep + c.n_discard as usize * kv_dim..]);
        let want_k = roped(c, l, &retained_raw, 0);
        let v = &data.v[l as usize];
        let mut want_v = v[..keep].to_vec();
        want_v.extend_from_slice(&v[keep + c.n_discard as usize * kv_dim..]);
        let mut worst = 0f32;
        for i in 0..want_k.len() {
            let d = (got_k[i] - want_k[i]).abs();
            worst = worst.max(d);
            assert!(
                d <= ATOL,
                "layer {l} cell {} elem {}: gpu {} vs cpu {} (case {:?} hd {} heads {} keep {} discard {})",
                i / kv_dim,
                i % kv_dim,
                got_k[i],
                want_k[i],
                c.rope,
                c.head_dim,
                c.n_kv_heads,
                c.n_keep,
                c.n_discard
            );
        }
        assert_eq!(got_v, want_v, "layer {l}: V must move bit-exactly");
        let _ = worst;
    }
}

async fn run(c: Case) {
    let ctx = common::shared_context().await;
    check_case(&ctx, &c).await;
}

use RopeType::{Neox, Norm};

gpu_test!(neox_hd64_one_head, run(Case::new(Neox, 64, 1, 40, 4, 9)));
gpu_test!(norm_hd64_one_head, run(Case::new(Norm, 64, 1, 40, 4, 9)));
gpu_test!(
    neox_hd128_four_heads,
    run(Case::new(Neox, 128, 4, 33, 2, 5))
);
gpu_test!(
    norm_hd128_four_heads,
    run(Case::new(Norm, 128, 4, 33, 2, 5))
);
gpu_test!(
    neox_hd256_eight_heads,
    run(Case::new(Neox, 256, 8, 21, 1, 6))
);
gpu_test!(
    norm_hd256_eight_heads,
    run(Case::new(Norm, 256, 8, 21, 1, 6))
);
gpu_test!(
    neox_freq_factors,
    run(Case {
        freq_factors: true,
        ..Case::new(Neox, 128, 2, 30, 3, 7)
    })
);
gpu_test!(
    norm_freq_factors,
    run(Case {
        freq_factors: true,
        ..Case::new(Norm, 128, 2, 30, 3, 7)
    })
);
gpu_test!(
    hd256_freq_factors_three_heads,
    run(Case {
        freq_factors: true,
        ..Case::new(Norm, 256, 3, 19, 0, 4)
    })
);
// Retained counts: 0, 1 and odd.
gpu_test!(retained_zero, run(Case::new(Neox, 64, 2, 20, 5, 15)));
gpu_test!(retained_one, run(Case::new(Norm, 64, 2, 20, 5, 14)));
gpu_test!(retained_odd, run(Case::new(Neox, 128, 5, 30, 2, 5)));
// n_keep 0 and > 0 (above); shift larger than the retained count.
gpu_test!(keep_zero, run(Case::new(Norm, 128, 1, 25, 0, 10)));
gpu_test!(
    shift_larger_than_retained,
    run(Case::new(Neox, 64, 3, 40, 3, 30))
);
// Partial rotary (n_rot < head_dim): the tail moves unrotated.
gpu_test!(
    partial_rotary_neox,
    run(Case {
        n_rot: 32,
        ..Case::new(Neox, 64, 2, 24, 2, 5)
    })
);
gpu_test!(
    partial_rotary_norm,
    run(Case {
        n_rot: 32,
        ..Case::new(Norm, 64, 2, 24, 2, 5)
    })
);
// No rope at all (SmolLM3's every fourth layer): K cells move unrotated.
gpu_test!(
    no_rope_layer,
    run(Case {
        n_rot: 0,
        ..Case::new(Norm, 64, 2, 24, 2, 5)
    })
);
// Several layers with different rope bases, and a scratch smaller than the retained range
// (the shift runs in ascending chunks).
gpu_test!(
    layers_and_chunked_scratch,
    run(Case {
        layers: 3,
        max_scratch_cells: Some(4),
        ..Case::new(Neox, 64, 2, 40, 3, 2)
    })
);
gpu_test!(
    chunks_with_shift_of_one,
    run(Case {
        max_scratch_cells: Some(3),
        ..Case::new(Norm, 64, 1, 17, 1, 1)
    })
);

/// Shifting by a then b equals shifting by a + b.
async fn composition() {
    let ctx = common::shared_context().await;
    let c = Case {
        freq_factors: true,
        layers: 2,
        ..Case::new(Neox, 128, 2, 50, 4, 0)
    };
    let kv_dim = (c.n_kv_heads * c.head_dim) as usize;
    let data = make_data(&c, 77);
    let mut one = KvCache::new(&ctx, c.cache_cfg()).unwrap();
    let mut two = KvCache::new(&ctx, c.cache_cfg()).unwrap();
    for cache in [&mut one, &mut two] {
        for l in 0..c.layers {
            let k = roped(&c, l, &data.raw_k[l as usize], 0);
            cache
                .write_cells(&ctx, l as usize, 0, &k, &data.v[l as usize])
                .unwrap();
        }
        cache.advance(c.n_past).unwrap();
    }
    two.shift(&ctx, 4, 7).unwrap();
    two.shift(&ctx, 4, 11).unwrap();
    one.shift(&ctx, 4, 18).unwrap();
    assert_eq!(one.n_past(), two.n_past());
    for l in 0..c.layers as usize {
        let a = read_f32(&ctx, one.k(l), 0, one.n_past() as usize * kv_dim)
            .await
            .unwrap();
        let b = read_f32(&ctx, two.k(l), 0, two.n_past() as usize * kv_dim)
            .await
            .unwrap();
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                (x - y).abs() <= 2.0 * ATOL,
                "layer {l} elem {i}: {x} vs {y}"
            );
        }
        let va = read_f32(&ctx, one.v(l), 0, one.n_past() as usize * kv_dim)
            .await
            .unwrap();
        let vb = read_f32(&ctx, two.v(l), 0, two.n_past() as usize * kv_dim)
            .await
            .unwrap();
        assert_eq!(va, vb);
    }
}
gpu_test!(shift_a_then_b_equals_shift_a_plus_b, composition());

/// Bad arguments get clear errors, and the cache is unchanged.
async fn bad_arguments() {
    let ctx = common::shared_context().await;
    let c = Case::new(Neox, 64, 1, 10, 2, 0);
    let mut cache = KvCache::new(&ctx, c.cache_cfg()).unwrap();
    cache.advance(10).unwrap();
    let e = cache.shift(&ctx, 4, 7).unwrap_err();
    assert!(e.message.contains("more than the 10 cells"), "{e}");
    assert_eq!(cache.n_past(), 10);
    let e = cache.advance(100).unwrap_err();
    assert_eq!(e.code, cera_web::ErrorCode::ContextFull);
    let mut big = c.cache_cfg();
    big.n_ctx = u32::MAX / 256;
    let e = KvCache::new(&ctx, big)
        .err()
        .expect("too large for any binding");
    assert_eq!(e.code, cera_web::ErrorCode::AdapterTooSmall);
    assert!(e.message.contains("binding limit"), "{e}");
}
gpu_test!(bad_arguments_are_clear_errors, bad_arguments());

/// More than 65535 workgroups in one dispatch (the 2-D grid): every cell holds seeded K and V,
/// and every cell is compared after the shift, kept, moved and rotated, including those around
/// linear workgroup 65,535 (the first one on the grid's second row when a row holds 65,535).
///
/// Natively (lavapipe's 128 MiB binding limit) this uses the 64-wide variant: 65535 x 64
/// invocations need only 33.5 MB of K. In the browser it uses the default 256-wide variant,
/// which needs a K binding above 128 MiB: the context requests the adapter's higher limit.
/// Data is made, written and checked in slices of cells, so the host never holds a whole layer.
async fn many_workgroups() {
    let ctx = GpuContext::new(&LimitRequest::default()).await.unwrap();
    let wg: u32 = if cfg!(target_arch = "wasm32") {
        256
    } else {
        64
    };
    let (head_dim, n_kv_heads) = (256u32, 1u32);
    let per_cell = (n_kv_heads * head_dim / 2) as u64;
    // Enough retained cells for 20% more than 65535 workgroups.
    let retained = (65535u64 * wg as u64 * 6 / 5).div_ceil(per_cell) as u32;
    let (n_keep, n_discard) = (7u32, 1000u32);
    let n_past = n_keep + n_discard + retained;
    let c = Case {
        workgroup_size: Some(wg),
        n_ctx: n_past,
        ..Case::new(Neox, head_dim, n_kv_heads, n_past, n_keep, n_discard)
    };
    let kv_dim = (n_kv_heads * head_dim) as usize;
    let t0 = now_s();
    tlog!(
        "many_workgroups: wg {wg}, {} cells, K binding {} MiB, limit {} MiB",
        n_past,
        (n_past as u64 * kv_dim as u64 * 4) >> 20,
        ctx.limits.max_storage_buffer_binding_size >> 20
    );
    let mut cache = KvCache::new(&ctx, c.cache_cfg()).unwrap();
    // Element `i` of cell `s`'s K (`salt` 0) or V (1) before the shift: a hash of the three, in
    // [-1, 1) (cheap enough for 80 M values in a debug wasm build, no state to replay).
    let val = |s: u32, i: usize, salt: u32| {
        let mut h = (s.wrapping_mul(0x9E37_79B1)
            ^ (i as u32).wrapping_mul(0x85EB_CA77)
            ^ salt.wrapping_mul(0xC2B2_AE3D))
        .wrapping_add(0x27D4_EB2F);
        h ^= h >> 15;
        h = h.wrapping_mul(0x2C1B_3C6D);
        h ^= h >> 12;
        (h >> 8) as f32 / (1u32 << 23) as f32 - 1.0
    };
    const SLICE: u32 = 4096;
    for s0 in (0..n_past).step_by(SLICE as usize) {
        let cells = s0..(s0 + SLICE).min(n_past);
        let k: Vec<f32> = cells
            .clone()
            .flat_map(|s| (0..kv_dim).map(move |i| val(s, i, 0)))
            .collect();
        let v: Vec<f32> = cells
            .flat_map(|s| (0..kv_dim).map(move |i| val(s, i, 1)))
            .collect();
        cache.write_cells(&ctx, 0, s0, &k, &v).unwrap();
    }
    cache.advance(n_past).unwrap();
    let stats = cache.shift(&ctx, n_keep, n_discard).unwrap();
    tlog!(
        "many_workgroups: max workgroups in one dispatch = {} (wg {wg}), chunks {}",
        stats.max_workgroups,
        stats.chunks
    );
    assert!(
        stats.max_workgroups > 65535,
        "only {} workgroups",
        stats.max_workgroups
    );
    assert_eq!(stats.chunks, 1);
    assert_eq!(cache.n_past(), n_past - n_discard);

    // A moved cell must be R(-n_discard) of its source: cos/sin in f64, independent of the
    // kernel's table; V moves bit-exactly, kept cells stay bit-exact.
    let rope = c.rope_cfg(0);
    let rot: Vec<(f64, f64)> = (0..rope.n_rot / 2)
        .map(|j| (-(n_discard as f64) * rope.theta(j)).sin_cos())
        .collect();
    // Retained cells whose pairs straddle linear workgroup 65,535 (one invocation per pair).
    let boundary = (65535 * wg as u64 / per_cell) as u32 + n_keep;
    let mut checked = 0u32;
    for t0_ in (0..cache.n_past()).step_by(SLICE as usize) {
        let n = SLICE.min(cache.n_past() - t0_);
        let off = t0_ as u64 * kv_dim as u64 * 4;
        let got_k = read_f32(&ctx, cache.k(0), off, n as usize * kv_dim)
            .await
            .unwrap();
        let got_v = read_f32(&ctx, cache.v(0), off, n as usize * kv_dim)
            .await
            .unwrap();
        for t in t0_..t0_ + n {
            let at = (t - t0_) as usize * kv_dim;
            let (gk, gv) = (&got_k[at..at + kv_dim], &got_v[at..at + kv_dim]);
            if t < n_keep {
                for i in 0..kv_dim {
                    assert!(
                        gk[i] == val(t, i, 0) && gv[i] == val(t, i, 1),
                        "kept cell {t} changed at {i}"
                    );
                }
            } else {
                let src = t + n_discard;
                for i in 0..kv_dim {
                    assert!(
                        gv[i] == val(src, i, 1),
                        "V at cell {t} (from {src}) elem {i}: {} vs {}",
                        gv[i],
                        val(src, i, 1)
                    );
                }
                for j in 0..rope.n_rot / 2 {
                    let (a, b) = rope.pair(j);
                    let (sin, cos) = rot[j];
                    let (x0, x1) = (val(src, a, 0) as f64, val(src, b, 0) as f64);
                    let (w0, w1) = (x0 * cos - x1 * sin, x0 * sin + x1 * cos);
                    let ok = (gk[a] as f64 - w0).abs() <= ATOL as f64
                        && (gk[b] as f64 - w1).abs() <= ATOL as f64;
                    assert!(ok, "cell {t} pair {j}: gpu ({}, {}) vs ({w0}, {w1}) (workgroup-65535 boundary at cell {boundary})", gk[a], gk[b]);
                }
            }
            checked += 1;
        }
    }
    assert_eq!(checked, n_past - n_discard);
    assert!(
        boundary > n_keep + 1 && boundary + 1 < n_past - n_discard,
        "the boundary cell {boundary} is among the moved cells"
    );
    tlog!("many_workgroups: all {checked} cells equal the reference (boundary at cell {boundary}), {:.1} s", now_s() - t0);
}
gpu_test!(more_than_65535_workgroups, many_workgroups());
