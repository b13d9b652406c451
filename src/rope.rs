//! Rotary position embedding on the CPU, in f64: the reference the GPU kernels are tested
//! against, and the source of the exact cos/sin table the context shift uploads.
//!
//! Convention (llama.cpp's): pair `j < n_rot/2` rotates by `pos * base^(-2j/n_rot) / ff[j]`,
//! where `ff` are the optional Llama-3 frequency factors (or Phi-3's LongRoPE factors). NeoX pairs
//! `(j, j + n_rot/2)`; NORM pairs `(2j, 2j + 1)`. Dimensions from `n_rot` to `head_dim` are not
//! rotated. A token's own rope also scales its rotated pairs by `attn_factor` (LongRoPE's
//! attention factor, llama.cpp's `mscale`; 1 elsewhere); a context shift's relative rotation of
//! cells already roped does not scale again.

use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeType {
    /// Split halves: Qwen2/3, Gemma 3, GPT-NeoX.
    Neox = 0,
    /// Adjacent pairs: LLaMA, Mistral, Granite.
    Norm = 1,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    pub head_dim: usize,
    /// Rotated dimensions (even, at most `head_dim`).
    pub n_rot: usize,
    pub freq_base: f32,
    pub rope_type: RopeType,
    /// One factor per rotary pair (`n_rot / 2`), dividing its angle (Llama 3 `rope_freqs`).
    pub freq_factors: Option<Vec<f32>>,
    /// Multiplies the rotated pairs of a token's own rope (not a shift's rotation): Phi-3's
    /// `rope.scaling.attn_factor`, 1 elsewhere.
    pub attn_factor: f32,
}

impl RopeConfig {
    pub fn new(head_dim: usize, freq_base: f32, rope_type: RopeType) -> Self {
        RopeConfig {
            head_dim,
            n_rot: head_dim,
            freq_base,
            rope_type,
            freq_factors: None,
            attn_factor: 1.0,
        }
    }

    pub fn validate(&self) -> Result<()> {
        if self.head_dim == 0
            || !self.head_dim.is_multiple_of(2)
            || !self.n_rot.is_multiple_of(2)
            || self.n_rot > self.head_dim
        {
            return Err(Error::invalid(format!(
                "rope needs an even head_dim and an even n_rot <= head_dim (got {} and {})",
                self.head_dim, self.n_rot
            )));
        }
        if !(self.attn_factor.is_finite() && self.attn_factor > 0.0) {
            return Err(Error::invalid(format!(
                "rope attention factor {} (must be finite and positive)",
                self.attn_factor
            )));
        }
        if let Some(ff) = &self.freq_factors {
            if ff.len() != self.n_rot / 2 {
                return Err(Error::invalid(format!(
                    "rope frequency factors: {} given, {} needed",
                    ff.len(),
                    self.n_rot / 2
                )));
            }
        }
        Ok(())
    }

    /// Angle per unit position of pair `j`.
    pub fn theta(&self, j: usize) -> f64 {
        let base = (self.freq_base as f64).powf(-2.0 * j as f64 / self.n_rot as f64);
        match &self.freq_factors {
            Some(ff) => base / ff[j] as f64,
            None => base,
        }
    }

    /// The element indices of rotary pair `j` within a head.
    pub fn pair(&self, j: usize) -> (usize, usize) {
        match self.rope_type {
            RopeType::Neox => (j, j + self.n_rot / 2),
            RopeType::Norm => (2 * j, 2 * j + 1),
        }
    }

    /// Rotate one head (`head_dim` values) in place to position `pos` (rotated pairs scaled by
    /// `attn_factor`).
    pub fn apply(&self, head: &mut [f32], pos: f64) {
        let m = self.attn_factor as f64;
        for j in 0..self.n_rot / 2 {
            let (a, b) = self.pair(j);
            let (s, c) = (pos * self.theta(j)).sin_cos();
            let (s, c) = (s * m, c * m);
            let (x0, x1) = (head[a] as f64, head[b] as f64);
            head[a] = (x0 * c - x1 * s) as f32;
            head[b] = (x0 * s + x1 * c) as f32;
        }
    }

    /// Rotate every head of a `(n_heads, head_dim)` row to `pos`.
    pub fn apply_heads(&self, row: &mut [f32], pos: f64) {
        for head in row.chunks_exact_mut(self.head_dim) {
            self.apply(head, pos);
        }
    }

    /// `(cos, sin)` of the rotation by `delta` positions for each pair, computed in f64 (a pure
    /// rotation: cells were scaled by `attn_factor` when written).
    pub fn delta_table(&self, delta: f64) -> Vec<[f32; 2]> {
        (0..self.n_rot / 2)
            .map(|j| {
                let (s, c) = (delta * self.theta(j)).sin_cos();
                [c as f32, s as f32]
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) / 3.0).collect()
    }

    #[test]
    fn rotation_preserves_pair_norms_and_composes() {
        for rt in [RopeType::Neox, RopeType::Norm] {
            let mut cfg = RopeConfig::new(64, 10000.0, rt);
            cfg.freq_factors = Some((0..32).map(|j| 1.0 + j as f32 / 8.0).collect());
            let x = head(64);
            let mut a = x.clone();
            cfg.apply(&mut a, 7.0);
            cfg.apply(&mut a, 5.0);
            let mut b = x.clone();
            cfg.apply(&mut b, 12.0);
            for (p, q) in a.iter().zip(&b) {
                assert!((p - q).abs() < 1e-5);
            }
            for j in 0..32 {
                let (i0, i1) = cfg.pair(j);
                let n0 = x[i0].hypot(x[i1]);
                let n1 = b[i0].hypot(b[i1]);
                assert!((n0 - n1).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn neox_and_norm_pair_differently_and_partial_rotary_leaves_tail() {
        let mut cfg = RopeConfig::new(8, 10000.0, RopeType::Neox);
        assert_eq!(cfg.pair(1), (1, 5));
        cfg.rope_type = RopeType::Norm;
        assert_eq!(cfg.pair(1), (2, 3));
        cfg.n_rot = 4;
        let x = head(8);
        let mut y = x.clone();
        cfg.apply(&mut y, 3.0);
        assert_eq!(&x[4..], &y[4..]);
        assert_ne!(&x[..4], &y[..4]);
    }

    #[test]
    fn pair_zero_at_position_one_turns_one_radian() {
        let cfg = RopeConfig::new(4, 10000.0, RopeType::Norm);
        let mut h = vec![1.0, 0.0, 0.0, 0.0];
        cfg.apply(&mut h, 1.0);
        assert!((h[0] - 1f32.cos()).abs() < 1e-7 && (h[1] - 1f32.sin()).abs() < 1e-7);
    }

    #[test]
    fn attn_factor_scales_rotated_pairs_only() {
        let mut cfg = RopeConfig::new(8, 10000.0, RopeType::Neox);
        cfg.n_rot = 4;
        let x = head(8);
        let mut plain = x.clone();
        cfg.apply(&mut plain, 5.0);
        cfg.attn_factor = 1.25;
        let mut scaled = x.clone();
        cfg.apply(&mut scaled, 5.0);
        for i in 0..4 {
            assert!((scaled[i] - 1.25 * plain[i]).abs() < 1e-6, "{i}");
        }
        assert_eq!(&scaled[4..], &x[4..]);
        // The shift's table stays a rotation.
        for [c, s] in cfg.delta_table(3.0) {
            assert!((c.hypot(s) - 1.0).abs() < 1e-6);
        }
    }

    #[test]
    fn bad_configs_are_rejected() {
        assert!(RopeConfig::new(7, 1e4, RopeType::Neox).validate().is_err());
        let mut c = RopeConfig::new(8, 1e4, RopeType::Neox);
        c.freq_factors = Some(vec![1.0; 3]);
        assert!(c.validate().is_err());
        let mut c = RopeConfig::new(8, 1e4, RopeType::Neox);
        c.attn_factor = 0.0;
        assert!(c.validate().is_err());
    }
}
