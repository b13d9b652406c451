//! A self-check anyone can run on their GPU (the demo page, `cera selfcheck`): shift a small
//! KV cache with the `kv_shift` kernel and compare with the CPU RoPE reference.

use serde::Serialize;

use crate::error::Result;
use crate::gpu::readback::read_f32;
use crate::gpu::{GpuContext, GpuLimits};
use crate::kv::{KvCache, KvCacheConfig};
use crate::rope::{RopeConfig, RopeType};

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CaseReport {
    pub name: String,
    pub max_abs_error: f32,
    pub passed: bool,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SelfCheckReport {
    pub adapter: String,
    pub backend: String,
    pub limits: LimitsReport,
    pub cases: Vec<CaseReport>,
    pub passed: bool,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitsReport {
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_workgroups_per_dimension: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroup_storage_size: u32,
    pub max_storage_buffers_per_shader_stage: u32,
}

impl From<&GpuLimits> for LimitsReport {
    fn from(l: &GpuLimits) -> Self {
        LimitsReport {
            max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
            max_buffer_size: l.max_buffer_size,
            max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
            max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
            max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
            max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
        }
    }
}

/// Pseudo-random values in [-1, 1) from a seed (no RNG dependency).
fn values(seed: u32, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

/// One shift of `n_past` cells dropping `n_discard` after `n_keep`; the max error of K.
async fn check_one(
    ctx: &GpuContext,
    rope: RopeConfig,
    n_kv_heads: u32,
    n_past: u32,
    n_keep: u32,
    n_discard: u32,
) -> Result<f32> {
    let head_dim = rope.head_dim as u32;
    let kv_dim = (n_kv_heads * head_dim) as usize;
    let mut cache = KvCache::new(
        ctx,
        KvCacheConfig {
            n_ctx: n_past,
            n_kv_heads,
            head_dim,
            layer_ropes: vec![rope.clone()],
            shift_workgroup_size: None,
            max_scratch_cells: None,
        },
    )?;
    let raw = values(n_past ^ head_dim, n_past as usize * kv_dim);
    let mut k = raw.clone();
    for (t, row) in k.chunks_exact_mut(kv_dim).enumerate() {
        rope.apply_heads(row, t as f64);
    }
    cache.write_cells(ctx, 0, 0, &k, &raw)?;
    cache.advance(n_past)?;
    cache.shift(ctx, n_keep, n_discard)?;
    let n = cache.n_past() as usize;
    let got = read_f32(ctx, cache.k(0), 0, n * kv_dim).await?;
    let mut want = Vec::with_capacity(n * kv_dim);
    for t in 0..n {
        let src = if t < n_keep as usize {
            t
        } else {
            t + n_discard as usize
        };
        let mut row = raw[src * kv_dim..(src + 1) * kv_dim].to_vec();
        rope.apply_heads(&mut row, t as f64);
        want.extend_from_slice(&row);
    }
    Ok(max_abs_error(&got, &want))
}

/// The largest `|got - want|`, NaN if any element of either is NaN (or the lengths differ), so a
/// kernel that writes NaN fails the check: `f32::max` would skip the NaN and report 0.
fn max_abs_error(got: &[f32], want: &[f32]) -> f32 {
    if got.len() != want.len() {
        return f32::NAN;
    }
    let mut worst = 0f32;
    for (a, b) in got.iter().zip(want) {
        let d = (a - b).abs();
        if d.is_nan() {
            return f32::NAN;
        }
        worst = worst.max(d);
    }
    worst
}

/// A case passes when its error is a number within the tolerance (NaN compares false).
fn passes(max_abs_error: f32) -> bool {
    max_abs_error <= TOLERANCE
}

/// f32 rounding of a rotation (two products and a sum) on values of size ~1.
const TOLERANCE: f32 = 2e-6;

/// Run the check on `ctx`: NeoX and NORM, with and without frequency factors.
pub async fn run(ctx: &GpuContext) -> Result<SelfCheckReport> {
    let mut cases = Vec::new();
    for (name, rt, ff) in [
        ("NeoX, head_dim 256", RopeType::Neox, false),
        (
            "NORM, head_dim 128, frequency factors",
            RopeType::Norm,
            true,
        ),
    ] {
        let hd = if rt == RopeType::Neox { 256 } else { 128 };
        let mut rope = RopeConfig::new(hd, 10000.0, rt);
        if ff {
            rope.freq_factors = Some((0..hd / 2).map(|j| 1.0 + (j % 5) as f32 * 0.5).collect());
        }
        let err = check_one(ctx, rope, 2, 300, 4, 100).await?;
        cases.push(CaseReport {
            name: name.into(),
            max_abs_error: err,
            passed: passes(err),
        });
    }
    Ok(SelfCheckReport {
        adapter: ctx.adapter.name.clone(),
        backend: ctx.adapter.backend.clone(),
        limits: (&ctx.limits).into(),
        passed: cases.iter().all(|c| c.passed),
        cases,
    })
}

#[cfg(test)]
mod tests {
    use super::{max_abs_error, passes};

    #[test]
    fn nan_anywhere_fails_the_check() {
        let want = [1.0f32, -2.0, 0.5];
        assert_eq!(max_abs_error(&[1.0, -2.0, 0.5], &want), 0.0);
        assert!(passes(max_abs_error(&[1.0, -2.0, 0.5 + 1e-7], &want)));
        assert!(!passes(max_abs_error(&[1.0, -2.0, 0.6], &want)));
        // A NaN first, in the middle, last, or in the reference: never a pass.
        for i in 0..3 {
            let mut got = want;
            got[i] = f32::NAN;
            assert!(
                max_abs_error(&got, &want).is_nan(),
                "NaN at {i} was skipped"
            );
            assert!(!passes(max_abs_error(&got, &want)));
            assert!(!passes(max_abs_error(&want, &got)));
        }
        assert!(
            !passes(max_abs_error(&[f32::INFINITY], &[f32::INFINITY])),
            "inf - inf is NaN"
        );
        assert!(
            !passes(max_abs_error(&want[..2], &want)),
            "a short readback"
        );
    }
}
