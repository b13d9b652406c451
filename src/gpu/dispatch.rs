//! The 2-D dispatch grid: one helper so no kernel assumes 65535 workgroups per dimension.
//!
//! A kernel that needs `n` workgroups is dispatched as `(min(n, max), ceil(n / max), 1)` where
//! `max` is the device's `maxComputeWorkgroupsPerDimension`. In WGSL, `get_wid` (in
//! `common_decls.tmpl`) recovers the linear index as `wid.x + wid.y * num_workgroups.x`; the
//! tail of the last row (`index >= n`) must return early, which every kernel's bounds check does.

use crate::error::{Error, ErrorCode, Result};

/// The `[x, y, z]` workgroup grid for `n` workgroups under a per-dimension limit.
///
/// `n == 0` gives `[0, 0, 0]` (callers skip the dispatch). Fails only when even a square grid
/// cannot hold `n` (more than `max_per_dim²` workgroups).
pub fn grid_2d(n: u64, max_per_dim: u32) -> Result<[u32; 3]> {
    if n == 0 {
        return Ok([0, 0, 0]);
    }
    let max = max_per_dim.max(1) as u64;
    let x = n.min(max);
    let y = n.div_ceil(max);
    if y > max {
        return Err(Error::new(
            ErrorCode::AdapterTooSmall,
            format!("{n} workgroups exceed this adapter's {max} x {max} dispatch grid; use a smaller context"),
        ));
    }
    Ok([x as u32, y as u32, 1])
}

/// The linear workgroup index of grid cell `(x, y)`: what WGSL's `get_wid` computes.
pub fn linear_wid(x: u32, y: u32, grid: [u32; 3]) -> u64 {
    x as u64 + y as u64 * grid[0] as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every index in `0..n` is produced exactly once, and the grid wastes less than one row.
    fn check_cover(n: u64, max: u32) {
        let g = grid_2d(n, max).unwrap();
        assert!(
            g[0] <= max && g[1] <= max && g[2] == 1,
            "n={n} max={max} grid={g:?}"
        );
        let total = g[0] as u64 * g[1] as u64;
        assert!(
            total >= n && total - n < g[0] as u64,
            "n={n} grid={g:?} wastes a row"
        );
        let mut seen = vec![0u64; (n as usize).div_ceil(64)];
        let mut count = 0u64;
        for y in 0..g[1] {
            for x in 0..g[0] {
                let i = linear_wid(x, y, g);
                if i >= n {
                    continue; // the kernel's bounds check drops these
                }
                let (w, b) = ((i / 64) as usize, i % 64);
                assert!(seen[w] & (1 << b) == 0, "index {i} covered twice (n={n})");
                seen[w] |= 1 << b;
                count += 1;
            }
        }
        assert_eq!(count, n, "n={n}: not every index covered");
    }

    #[test]
    fn covers_every_index_once_around_and_beyond_65535() {
        for n in [
            1, 2, 255, 65534, 65535, 65536, 65537, 131069, 131070, 131071, 131072, 200_000,
        ] {
            check_cover(n, 65535);
        }
        // Far beyond: 1000 rows and a ragged last row.
        check_cover(65535 * 1000 + 17, 65535);
        check_cover(65535 * 1000, 65535);
    }

    #[test]
    fn covers_every_index_once_for_small_limits_exhaustively() {
        for max in [1u32, 2, 3, 7, 16] {
            for n in 0..=(max as u64 * max as u64) {
                if n > 0 {
                    check_cover(n, max);
                }
            }
        }
    }

    #[test]
    fn zero_and_too_many() {
        assert_eq!(grid_2d(0, 65535).unwrap(), [0, 0, 0]);
        assert_eq!(grid_2d(65535u64 * 65535, 65535).unwrap(), [65535, 65535, 1]);
        let e = grid_2d(65535u64 * 65535 + 1, 65535).unwrap_err();
        assert_eq!(e.code, ErrorCode::AdapterTooSmall);
    }
}
