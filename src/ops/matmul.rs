//! `matmul`: a quantized weight times activations, `Y[t, r] = sum_c W[r, c] * X[t, c]`
//! (see `shaders/matmul.wgsl`). GEMV (decode: one token) and GEMM (prefill: a batch, `NT`
//! tokens per invocation kept in registers) are one kernel with different defines.
//!
//! The weight is a [`GpuTensor`] in the GPU layout of [`crate::quant::gpu`], possibly split into
//! row-range parts: one dispatch per part, writing its rows of `Y`. A split tensor gives exactly
//! the result of an unsplit one (every row is computed the same way).
//!
//! The kernel shape is a decision ([`MatmulConfig`]) recorded in the pipeline key: workgroup
//! size, threads per row (TPR) and tokens per invocation (NT). Two families: thread-per-row with
//! no barrier (for CPU-emulated adapters, where a workgroup barrier is costly: docs/architecture.md) and
//! cooperative rows with a workgroup reduction (for real GPUs: TPR threads read a row's
//! consecutive words, coalesced). Both are tested on every type.
//!
//! On real GPUs GEMV uses row teams ([`MatmulConfig::team`], [`MatmulConfig::gemv_for`]): the
//! lanes of a team take a row's quant words interleaved, read X as vec4 and add their sums with
//! subgroup shuffles. Measured with `cera bench-gemv` on an H200 (Vulkan), GB/s of weights,
//! before (8-lane cooperative units) -> after: Q8_0 4096x4096 330 -> 600, 14336x4096
//! 780 -> 910-1020, 4096x14336 325 -> 610-880, 128256x4096 1410 -> 1360-1400 (a plain copy of
//! as many bytes: 2300-3650). F32 reaches 0.6-0.84 of copy, the quantized types 0.11-0.37: their
//! cost follows the bytes of X read per weight byte (4 for Q8_0, 8 for 4-bit), not the decode
//! (removing int-to-float conversions, unrolling 4 -> 8 and a constant token loop changed
//! nothing measurable), so X is likely re-read from L2 by every row. Sharing X across rows (several
//! rows per lane, or X staged in workgroup memory) is the next step.

use std::mem::offset_of;

use super::attention_split::Partials;
use super::glu::Activation;
use super::{Variant, WgslParams};
use crate::error::{Error, ErrorCode, Result};
use crate::gguf::GgmlType;
use crate::gpu::{buffer_entry, grid_2d, GpuContext, GpuTensor, PipelineKey, Recorder};
use crate::quant::gpu::gpu_row_bytes;

pub const SHADER: &str = "matmul.wgsl";
pub const ENTRY: &str = "matmul";

/// Every type the kernel reads, with its `TYPE_*` define.
pub const TYPES: [(GgmlType, &str); 11] = [
    (GgmlType::F32, "TYPE_F32"),
    (GgmlType::F16, "TYPE_F16"),
    (GgmlType::BF16, "TYPE_BF16"),
    (GgmlType::Q8_0, "TYPE_Q8_0"),
    (GgmlType::Q4_0, "TYPE_Q4_0"),
    (GgmlType::Q4_1, "TYPE_Q4_1"),
    (GgmlType::Q5_0, "TYPE_Q5_0"),
    (GgmlType::Q5_1, "TYPE_Q5_1"),
    (GgmlType::Q4K, "TYPE_Q4_K"),
    (GgmlType::Q5K, "TYPE_Q5_K"),
    (GgmlType::Q6K, "TYPE_Q6_K"),
];

/// Uniform of `matmul.wgsl` for one dispatch (one part of the weight).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MatmulParams {
    /// Rows of W in this part.
    pub rows: u32,
    /// K: values per row.
    pub cols: u32,
    /// u32 words per row in the GPU layout.
    pub row_words: u32,
    /// Decode units per row ([`units_per_row`]).
    pub units: u32,
    pub n_tokens: u32,
    /// Element index of `X[0, 0]`.
    pub x_offset: u32,
    pub x_stride: u32,
    /// Element index of `Y[0, first row of this part]`.
    pub y_offset: u32,
    pub y_stride: u32,
    /// Workgroups along the rows: `ceil(rows / rows_per_workgroup)`.
    pub row_groups: u32,
    /// `X_GLU`: elements from `G[t, c]` to `U[t, c]` (0 when U is its own buffer in G's layout;
    /// the column offset of `up` when gate and up are halves of one fused projection's output).
    pub xu_delta: u32,
    /// `X_PRENORM`, `Y_NORMSCALE`: the norms' epsilon.
    pub pre_eps: f32,
    /// `X_PRENORM` with `PRE_ADD`, `Y_RESNORM`: the addend's scale.
    pub pre_scale: f32,
    /// `Y_RESNORM`: index of this part's first workgroup in the sums of squares.
    pub ss_offset: u32,
    /// `Y_NORMSCALE`: how many sums of squares the producer wrote.
    pub ss_count: u32,
    /// `X_SPLIT` ([`SplitX`]): vec4s a head, the scratch's chunks a head, the attention's
    /// window and the token's position after the step's `pos0`.
    pub sp_nv: u32,
    pub sp_chunks: u32,
    pub sp_window: u32,
    pub sp_pos0: u32,
}

impl WgslParams for MatmulParams {
    const WGSL_NAME: &'static str = "MatmulParams";
    const SHADER: &'static str = SHADER;
    const FIELDS: &'static [(&'static str, usize)] = &[
        ("rows", offset_of!(MatmulParams, rows)),
        ("cols", offset_of!(MatmulParams, cols)),
        ("row_words", offset_of!(MatmulParams, row_words)),
        ("units", offset_of!(MatmulParams, units)),
        ("n_tokens", offset_of!(MatmulParams, n_tokens)),
        ("x_offset", offset_of!(MatmulParams, x_offset)),
        ("x_stride", offset_of!(MatmulParams, x_stride)),
        ("y_offset", offset_of!(MatmulParams, y_offset)),
        ("y_stride", offset_of!(MatmulParams, y_stride)),
        ("row_groups", offset_of!(MatmulParams, row_groups)),
        ("xu_delta", offset_of!(MatmulParams, xu_delta)),
        ("pre_eps", offset_of!(MatmulParams, pre_eps)),
        ("pre_scale", offset_of!(MatmulParams, pre_scale)),
        ("ss_offset", offset_of!(MatmulParams, ss_offset)),
        ("ss_count", offset_of!(MatmulParams, ss_count)),
        ("sp_nv", offset_of!(MatmulParams, sp_nv)),
        ("sp_chunks", offset_of!(MatmulParams, sp_chunks)),
        ("sp_window", offset_of!(MatmulParams, sp_window)),
        ("sp_pos0", offset_of!(MatmulParams, sp_pos0)),
    ];
}

/// Decode units per row: what one loop step of the shader's `unit` covers (4 values for float
/// types, half a Q8_0 block, a legacy block, a 64-value K-quant chunk, 16 values of Q6_K).
pub fn units_per_row(ty: GgmlType, cols: u64) -> u64 {
    use GgmlType::*;
    match ty {
        F32 | F16 | BF16 => cols.div_ceil(4),
        Q8_0 => cols / 32 * 2,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 => cols / 32,
        Q4K | Q5K => cols / 256 * 4,
        Q6K => cols / 256 * 16,
        _ => 0,
    }
}

/// Workgroups a decode GEMV with 16-byte items aims for at least, by letting teams share rows
/// (`MatmulConfig::k_split`): an H200 has 132 compute units, and a GEMV of 256 workgroups (Llama 3
/// 8B's 4096 x 14336 down projection, 16 rows each) kept too few loads in flight.
pub const GEMV_MIN_WORKGROUPS: u64 = 1024;

/// [`GEMV_MIN_WORKGROUPS`], or on native builds `CERA_GEMV_MIN_WG` when set (0 turns row sharing
/// off), so that `cera bench` can compare on a GPU without a rebuild (docs/benchmarking.md).
pub fn gemv_min_workgroups() -> u64 {
    crate::gpu::knob::knob_u64("CERA_GEMV_MIN_WG").unwrap_or(GEMV_MIN_WORKGROUPS)
}

/// Threads a GEMV aims to keep in flight: a large GPU's resident threads a couple of times over
/// (an H200 holds 132 x 2048), more than a small GPU needs, where larger teams only add a
/// short reduction.
pub const GEMV_THREADS: u64 = 1 << 19;

/// The kernel shape: a decision stored in the pipeline key, read back by the dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulConfig {
    pub workgroup_size: u32,
    /// Threads per row (a power of two dividing `workgroup_size`); 1 means no barrier.
    pub threads_per_row: u32,
    /// Tokens per invocation (1 for GEMV).
    pub tokens_per_thread: u32,
    /// A row's team takes its items interleaved (`WORDS`: coalesced loads of W and X).
    pub interleaved: bool,
    /// Add the team's partial sums with subgroup shuffles (`SUBGROUP`); [`MatmulConfig::fit`]
    /// clears it where the device cannot.
    pub subgroup: bool,
    /// Read X as vec4 (`XVEC4`); set per call by [`MatmulConfig::for_x`], never by hand.
    pub x_vec4: bool,
    /// Read W as vec4, an item per 16-byte load (`W_VEC4`); set per weight by
    /// [`MatmulConfig::for_w`], never by hand.
    pub w_vec4: bool,
    /// Rows per team (`ROWS`, `NR`): each item's X is read once for this many rows. Only with
    /// 16-byte items or the item row teams' types (`item_rows_type`) and one token per
    /// invocation (the team's sums go through subgroup shuffles,
    /// or workgroup memory without subgroups); [`MatmulConfig::fit`] and
    /// [`MatmulConfig::for_w`] set it back to 1 elsewhere.
    pub rows_per_team: u32,
    /// Teams that share a workgroup's rows (`KS`), each taking every KS-th stride of the rows'
    /// items, their sums added in workgroup memory: more workgroups for a GEMV of few, long
    /// rows. Only where `ROWS` can run (as `rows_per_team`);
    /// [`MatmulConfig::fit`] and [`MatmulConfig::for_w`] set it back to 1 elsewhere.
    pub k_split: u32,
    /// A GEMV whose X is a gated unit (`X_GLU`) computes it once per workgroup into workgroup
    /// memory (`GLU_WG`) where [`glu_prologue_fits`] allows.
    pub glu_prologue: bool,
    /// Items each lane of an interleaved team decodes per loop step (`UNROLL`: their loads are
    /// independent, so this many are in flight per lane).
    pub unroll: u32,
    /// Quantize X to 8 bits per block of 32 in workgroup memory and multiply with integer dot
    /// products (`XQ8`): only in the `ROWS` kernel of Q8_0, Q4_K, Q5_K, the legacy types and
    /// Q6_K and the interleaved one of Q6_K, one token, `cols` a multiple of 32, where the workgroup memory holds it
    /// ([`xq8_fits`]); ignored elsewhere.
    pub x_q8: bool,
}

impl MatmulConfig {
    /// Thread per row, no barrier: the shape for CPU-emulated adapters (lavapipe, SwiftShader).
    pub const fn simple(tokens_per_thread: u32) -> Self {
        MatmulConfig {
            workgroup_size: 64,
            threads_per_row: 1,
            tokens_per_thread,
            interleaved: false,
            subgroup: false,
            x_vec4: false,
            w_vec4: false,
            rows_per_team: 1,
            k_split: 1,
            glu_prologue: false,
            unroll: 4,
            x_q8: false,
        }
    }

    /// Cooperative rows: `threads_per_row` threads split a row's units and reduce in workgroup
    /// memory.
    pub const fn cooperative(
        workgroup_size: u32,
        threads_per_row: u32,
        tokens_per_thread: u32,
    ) -> Self {
        MatmulConfig {
            interleaved: false,
            subgroup: false,
            glu_prologue: false,
            ..Self::team(workgroup_size, threads_per_row, tokens_per_thread)
        }
    }

    /// A row team: `threads_per_row` threads take the row's items interleaved and add their sums
    /// with subgroup shuffles where the device has them (workgroup memory otherwise).
    pub const fn team(workgroup_size: u32, threads_per_row: u32, tokens_per_thread: u32) -> Self {
        MatmulConfig {
            workgroup_size,
            threads_per_row,
            tokens_per_thread,
            interleaved: true,
            subgroup: true,
            x_vec4: false,
            w_vec4: false,
            rows_per_team: 1,
            k_split: 1,
            glu_prologue: true,
            unroll: 4,
            x_q8: false,
        }
    }

    /// The GEMV shape for this device and any weight: simple on a CPU adapter, a 16-thread row
    /// team otherwise ([`MatmulConfig::gemv_for`] picks per weight).
    pub fn gemv(ctx: &GpuContext) -> Self {
        if is_cpu_adapter(ctx) {
            Self::simple(1)
        } else {
            Self::team(ctx.limits.workgroup_size(256), 16, 1).fit(ctx)
        }
    }

    /// The GEMV shape for a weight of `ty`, `rows x cols`, on this device.
    ///
    /// Word items: teams as large as it takes for about [`GEMV_THREADS`] threads in flight (a GPU
    /// streams memory at full speed only with enough loads in flight), 8 to 32 lanes and at least
    /// 4 items a lane. Measured on an H200: a 128256-row output head ran fastest with 8-lane
    /// teams and a 4096- or 14336-row matrix with 32-lane ones (with 8, its 448 workgroups of 32
    /// rows left most of the GPU idle).
    ///
    /// 16-byte items ([`w_vec4_items`]): from a sweep on an H200 (us per GEMV, best first):
    /// - latency-bound shapes (Gemma 3 270M's, Llama 3 8B's k/v) want the most lanes, one item
    ///   each or more, and one row a team (8B k/v Q8_0: 32 lanes 6.4, with 2 rows 7.2, 16 lanes
    ///   9.6);
    /// - Q8_0 with 16384 rows or more gains from 4 rows a team, with about 8 items a lane (8B
    ///   gate/up 41.1 -> 24.3 at 32 lanes; the 8B head 283 -> 144 at 32 lanes; the 270M head, 40
    ///   items a row, 122 -> 58 at 8 lanes; on an H100 it later went to 2 rows on 8-bit X,
    ///   [`q8_short_head`]);
    /// - with fewer rows, 4 rows a team pay too once teams share rows (`KS`) to keep the
    ///   workgroups (a later sweep, us): 8B q/o Q8_0 9.8 (2 rows) -> 8.2 (4 rows, 2 teams a row
    ///   group), down 34.7 -> 23.9 (4 rows, 4 teams), k/v (1024 rows) 7.2 -> 4.8 (2 rows, 4
    ///   teams); Q4_K gate/up 36.5 -> 32.3, down 37.0 -> 33.3, q/o 12.9 -> 12.6;
    /// - teams share rows while the GEMV has fewer than [`gemv_min_workgroups`] workgroups and
    ///   each lane keeps 64 values or more of a row (Gemma 3 270M's 640- and 2048-value rows
    ///   never split).
    ///
    /// Measured in decode, Llama 3 8B Q8_0: 180.0 -> 196.6 tok/s.
    pub fn gemv_for(ctx: &GpuContext, ty: GgmlType, rows: u64, cols: u64) -> Self {
        if is_cpu_adapter(ctx) {
            return Self::cpu_gemv(ctx, ty, cols);
        }
        let wg = ctx.limits.workgroup_size(256);
        // The legacy types' word items and Q6_K's units take the same row teams from
        // XQ8_MIN_VALUES up (below, the small latency-bound shapes keep one row a team):
        // measured on an H100, docs/dispatch.md. `CERA_ITEM_ROWS_MIN=N` moves the bound (a
        // bench knob, natively).
        let big = rows * cols >= XQ8_MIN_VALUES;
        let row_items = w_vec4_items(ty, cols).or_else(|| {
            let min = crate::gpu::knob::knob_u64("CERA_ITEM_ROWS_MIN").unwrap_or(XQ8_MIN_VALUES);
            let on = item_rows_type(ty)
                && rows * cols >= min
                && !crate::gpu::knob::knob_off("CERA_ITEM_ROWS");
            on.then(|| items_per_row(ty, cols))
        });
        if let Some(items) = row_items {
            let lanes =
                |per_lane: u64| (items / per_lane).max(1).next_power_of_two().clamp(8, 32) as u32;
            let q8 = ty == GgmlType::Q8_0;
            // Q5_K takes Q4_K's row teams from XQ8_MIN_VALUES up, where a sweep with 8-bit X
            // found them faster on every Llama 3 8B shape (H100, us, one row a team on f32 X ->
            // row teams on 8-bit X: gate+up 82.2 -> 49-54, gate/up 42.9 -> 27-33, q/o 14.6 ->
            // 11.8, k/v 8.1 -> 7.0); below it keeps one row a team (not swept).
            let swept =
                q8 || ty == GgmlType::Q4K || (ty == GgmlType::Q5K && big) || item_rows_type(ty);
            let (tpr, nr) = if q8_short_head(ty, rows, cols) {
                (lanes(8), 2)
            } else if rows >= 65536 || (q8 && rows >= 16384) {
                (lanes(8), 4)
            } else if swept && rows >= 2048 {
                (lanes(1), 4)
            } else if q8 && rows >= 1024 {
                (lanes(1), 2)
            } else {
                (lanes(1), 1)
            };
            // Teams sharing rows (KS) until the GEMV has gemv_min_workgroups() workgroups,
            // keeping 64 values of a row or more a lane.
            let teams = (wg / tpr) as u64;
            let row_groups = rows.div_ceil(teams * nr as u64);
            let mut ks = 1u64;
            while swept
                && ks < teams
                && row_groups * ks < gemv_min_workgroups()
                && cols / (tpr as u64 * ks * 2) >= 64
            {
                ks *= 2;
            }
            // The item row teams (legacy types, Q6_K) on 8-bit X at any width: measured on an
            // H100 (docs/dispatch.md, "Item row teams"); their one-row teams keep the rule below.
            let item_teams = item_rows_type(ty) && nr > 1;
            return Self {
                rows_per_team: nr,
                k_split: ks as u32,
                x_q8: xq8_wanted(ty, rows, cols) || item_teams,
                ..Self::team(wg, tpr, 1)
            }
            .fit(ctx);
        }
        let by_rows = (GEMV_THREADS / rows.max(1)).next_power_of_two();
        let by_items = (items_per_row(ty, cols) / 4).max(1).next_power_of_two();
        let tpr = by_rows.min(by_items).clamp(8, 32) as u32;
        Self {
            x_q8: xq8_wanted(ty, rows, cols),
            ..Self::team(wg, tpr, 1)
        }
        .fit(ctx)
    }

    /// The team shape of [`MatmulConfig::cpu_gemv`]: 64 threads, teams of 8 lanes with 8 rows
    /// each, the gated unit computed per row (no barrier).
    pub const CPU_TEAMS: Self = Self {
        rows_per_team: 8,
        glu_prologue: false,
        ..Self::team(64, 8, 1)
    };

    /// The GEMV shape on a CPU-emulated adapter: a thread a row (no barrier: an emulated
    /// barrier switches every invocation's context), except for the types with 16-byte items
    /// and those read as item rows (Q5_0, Q6_K and the legacy types) where the adapter has
    /// subgroups of 8 lanes or more (lavapipe on AVX2): there an 8-lane
    /// team takes 8 rows' items interleaved and adds its sums with subgroup shuffles, still
    /// without a barrier, so the SIMD lanes load neighbouring words (not eight rows' words far
    /// apart) and each X item serves 8 rows. Measured on lavapipe (`cera bench-gemv --shapes
    /// gemma`, ms a GEMV; thread a row / 8-lane teams of a row / of 8 rows): Q8_0 head 262144 x
    /// 640 381 / 270 / 135, q/k/v 2.7 / 0.8-2.9 / 0.77; Q4_K o 4.3 / 1.1-1.5 / 0.41. Item rows
    /// on another, slower 2-core machine (thread a row -> teams of 8 rows): Q5_0 q+k+v 5.8 ->
    /// 2.7, gate+up 13.6 -> 7.3, o 3.3 -> 1.6; Q6_K down 8.9 -> 4.3. `CERA_CPU_TEAMS=0` keeps a
    /// thread a row everywhere.
    fn cpu_gemv(ctx: &GpuContext, ty: GgmlType, cols: u64) -> Self {
        let teams = Self::CPU_TEAMS.fit(ctx);
        if (w_vec4_items(ty, cols).is_some() || item_rows_type(ty))
            && teams.subgroup
            && teams.threads_per_row == Self::CPU_TEAMS.threads_per_row
            && !crate::gpu::knob::knob_off("CERA_CPU_TEAMS")
        {
            teams
        } else {
            Self::simple(1)
        }
    }

    /// The GEMM shape for this device and a batch of `n_tokens` (8 tokens per invocation; on a
    /// CPU adapter as few as cover the batch, in powers of two). A CPU-emulated thread does every
    /// token's multiply-add itself, so a short batch padded to 8 tokens paid for 8: on lavapipe a
    /// Gemma 3 270M step of 2 tokens took 4.5 s with 8 per thread against 0.85 s for 1 token.
    pub fn gemm(ctx: &GpuContext, n_tokens: u32) -> Self {
        if is_cpu_adapter(ctx) {
            Self::simple(n_tokens.clamp(1, 8).next_power_of_two())
        } else {
            Self::cooperative(ctx.limits.workgroup_size(256), 8, 8).fit(ctx)
        }
    }

    /// Clamp to the device: workgroup size within limits, TPR a power of two dividing it, the
    /// reduction buffer within workgroup storage, subgroups only where every team fits in one
    /// full subgroup.
    pub fn fit(mut self, ctx: &GpuContext) -> Self {
        self.workgroup_size = ctx.limits.workgroup_size(self.workgroup_size);
        let mut tpr = self
            .threads_per_row
            .max(1)
            .next_power_of_two()
            .min(self.workgroup_size);
        while !self.workgroup_size.is_multiple_of(tpr) {
            tpr /= 2;
        }
        self.threads_per_row = tpr;
        self.tokens_per_thread = self.tokens_per_thread.max(1);
        self.interleaved &= tpr > 1;
        self.unroll = self.unroll.clamp(1, 16);
        // At most a row a lane (a norm epilogue's lane k writes row k of its team).
        self.rows_per_team = self.rows_per_team.clamp(1, 8).next_power_of_two().min(tpr);
        self.k_split = self
            .k_split
            .clamp(1, self.workgroup_size / tpr)
            .next_power_of_two();
        self.subgroup &= tpr > 1
            && ctx.features.contains(wgpu::Features::SUBGROUP)
            && tpr <= ctx.adapter.subgroup_min_size
            && self
                .workgroup_size
                .is_multiple_of(ctx.adapter.subgroup_max_size.max(1));
        while tpr > 1
            && !self.subgroup
            && self.workgroup_size * self.tokens_per_thread * 4
                > ctx.limits.max_compute_workgroup_storage_size
            && self.tokens_per_thread > 1
        {
            self.tokens_per_thread /= 2;
        }
        if !(self.interleaved && self.tokens_per_thread == 1) {
            self.rows_per_team = 1;
            self.k_split = 1;
        }
        self
    }

    /// This shape for one call: X as vec4 when the interleaved kernel can (every token's row of
    /// X starts at a multiple of 4 elements).
    pub fn for_x(mut self, x_offset: u64, cols: u64) -> Self {
        self.x_vec4 =
            self.threads_per_row > 1 && x_offset.is_multiple_of(4) && cols.is_multiple_of(4);
        self
    }

    /// This shape for one weight: 16-byte items where the interleaved kernel has them for the
    /// type ([`w_vec4_items`]).
    pub fn for_w(mut self, ty: GgmlType, cols: u64) -> Self {
        self.w_vec4 = self.interleaved && w_vec4_items(ty, cols).is_some();
        if !self.w_vec4 && !item_rows_type(ty) {
            self.rows_per_team = 1;
            self.k_split = 1;
        }
        self
    }

    /// Rows a workgroup covers: its teams times the rows of each.
    pub fn rows_per_workgroup(&self) -> u32 {
        self.workgroup_size / self.threads_per_row / self.k_split * self.rows_per_team
    }

    /// Whether this shape runs the `ROWS` kernel (several rows a team, or teams sharing rows).
    fn rows_kernel(&self, ty: GgmlType) -> bool {
        (self.rows_per_team > 1 || self.k_split > 1)
            && self.interleaved
            && ((self.w_vec4 && w_vec4_type(ty)) || item_rows_type(ty))
    }
}

/// `wg256 tpr16 nt1 words sg`: what the bench prints and `--configs` parses.
impl std::fmt::Display for MatmulConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "wg{} tpr{} nt{}",
            self.workgroup_size, self.threads_per_row, self.tokens_per_thread
        )?;
        if self.interleaved && self.unroll != 4 {
            write!(f, " u{}", self.unroll)?;
        }
        if self.rows_per_team > 1 {
            write!(f, " r{}", self.rows_per_team)?;
        }
        if self.k_split > 1 {
            write!(f, " k{}", self.k_split)?;
        }
        for (on, name) in [
            (self.interleaved, "words"),
            (self.subgroup, "sg"),
            (self.x_vec4, "xvec4"),
            (self.w_vec4, "wvec4"),
            (self.x_q8, "xq8"),
        ] {
            if on {
                write!(f, " {name}")?;
            }
        }
        Ok(())
    }
}

impl std::str::FromStr for MatmulConfig {
    type Err = Error;

    /// Parse what `Display` writes (fields separated by spaces or commas, any order; `xvec4` and
    /// `wvec4` are decided per call and ignored).
    fn from_str(s: &str) -> Result<Self> {
        let mut cfg = MatmulConfig::simple(1);
        for part in s.split([' ', ',']).filter(|p| !p.is_empty()) {
            let num = |prefix: &str| {
                part.strip_prefix(prefix)
                    .and_then(|v| v.parse::<u32>().ok())
            };
            if let Some(v) = num("wg") {
                cfg.workgroup_size = v;
            } else if let Some(v) = num("tpr") {
                cfg.threads_per_row = v;
            } else if let Some(v) = num("nt") {
                cfg.tokens_per_thread = v;
            } else if let Some(v) = num("u") {
                cfg.unroll = v;
            } else if let Some(v) = num("r") {
                cfg.rows_per_team = v;
            } else if let Some(v) = num("k") {
                cfg.k_split = v;
            } else if part == "words" {
                cfg.interleaved = true;
            } else if part == "sg" {
                cfg.subgroup = true;
            } else if part == "xq8" {
                cfg.x_q8 = true;
            } else if part != "xvec4" && part != "wvec4" {
                return Err(Error::invalid(format!("matmul config {s:?}: unknown field {part:?} (want e.g. \"wg256 tpr16 nt1 words sg\")")));
            }
        }
        Ok(cfg)
    }
}

/// Whether `ty` has 16-byte items at all (for some shapes).
fn w_vec4_type(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q8_0 | GgmlType::Q4K | GgmlType::Q5K)
}

/// The legacy types, whose row teams (`ROWS`) take word items: their blocks (18 to 24 bytes)
/// leave rows off 16-byte boundaries, so they have no 16-byte items (`quant_decls.tmpl`).
fn word_rows_type(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_0 | Q4_1 | Q5_0 | Q5_1)
}

/// The types whose row teams take the interleaved kernel's own items (the legacy types' words,
/// Q6_K's 16-value units; its 212-byte blocks are not 16-byte aligned either).
fn item_rows_type(ty: GgmlType) -> bool {
    word_rows_type(ty) || ty == GgmlType::Q6K
}

/// Items per row of the interleaved kernel with 16-byte items (`W_VEC4` in `quant_decls.tmpl`),
/// for the types that have them and where every row starts on a 16-byte boundary: Q4_K and Q5_K
/// (144- and 176-byte blocks) and Q8_0 (rows padded to 16 bytes, `quant::gpu`), whatever the
/// width; the check stays for a layout that would not be.
pub fn w_vec4_items(ty: GgmlType, cols: u64) -> Option<u64> {
    use GgmlType::*;
    match ty {
        Q4K | Q5K => Some(cols / 32),
        Q8_0 if gpu_row_bytes(ty, cols).is_multiple_of(16) => Some(cols / 16),
        _ => None,
    }
}

/// Items per row of the interleaved kernel (`items()` in `quant_decls.tmpl`): four quant words
/// where [`w_vec4_items`] allows, else a quant word for the legacy and 4/5-bit K types, a unit
/// for the float types and Q6_K.
pub fn items_per_row(ty: GgmlType, cols: u64) -> u64 {
    use GgmlType::*;
    if let Some(n) = w_vec4_items(ty, cols) {
        return n;
    }
    match ty {
        Q8_0 => cols / 4,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q4K | Q5K => cols / 8,
        _ => units_per_row(ty, cols),
    }
}

/// Whether the adapter is a CPU (lavapipe, SwiftShader through Vulkan). In the browser wgpu
/// reports a fallback adapter (Chrome's SwiftShader) as a CPU and every other adapter as another
/// type (its info is mostly blank there), so a real GPU in the browser gets the GPU shapes.
pub fn is_cpu_adapter(ctx: &GpuContext) -> bool {
    ctx.adapter.device_type == "Cpu"
}

fn type_define(ty: GgmlType) -> Result<&'static str> {
    TYPES
        .iter()
        .find(|(t, _)| *t == ty)
        .map(|(_, d)| *d)
        .ok_or_else(|| {
            Error::new(
                ErrorCode::UnsupportedQuant,
                format!("tensor type {ty} has no GPU matmul kernel"),
            )
        })
}

/// The pipeline key of a type and shape.
pub fn key(ty: GgmlType, cfg: MatmulConfig) -> Result<PipelineKey> {
    // Loops: over a row's items or units and over the team's reduction, bounded by the params;
    // trusted (docs/dispatch.md, "Trusted kernels").
    let mut k = PipelineKey::new(SHADER, ENTRY)
        .trusted()
        .unbounded_loops()
        .define(type_define(ty)?, "")
        .workgroup_size(cfg.workgroup_size)
        .define("TPR", format!("{}u", cfg.threads_per_row))
        .define("NT", format!("{}u", cfg.tokens_per_thread));
    if cfg.threads_per_row > 1 {
        k = k.define("COOP", "");
    }
    for (on, name) in [
        (cfg.interleaved, "WORDS"),
        (cfg.subgroup, "SUBGROUP"),
        (cfg.x_vec4, "XVEC4"),
        (cfg.w_vec4 && cfg.interleaved && w_vec4_type(ty), "W_VEC4"),
    ] {
        if on {
            k = k.define(name, "");
        }
    }
    if cfg.interleaved {
        k = k.define("UNROLL", format!("{}u", cfg.unroll));
    }
    if cfg.rows_kernel(ty) {
        k = k
            .define("ROWS", "")
            .define("NR", format!("{}u", cfg.rows_per_team));
        if cfg.k_split > 1 {
            k = k.define("KS", format!("{}u", cfg.k_split));
        }
    }
    Ok(k)
}

/// The shapes the engine may pick, for every type (the naga test compiles each).
pub fn variants() -> Vec<Variant> {
    let mut shapes = vec![
        MatmulConfig::simple(1),
        MatmulConfig::simple(8),
        MatmulConfig::cooperative(256, 8, 1),
        MatmulConfig::cooperative(256, 8, 8),
        MatmulConfig::cooperative(64, 4, 3),
    ];
    // The row teams, with and without subgroups and vec4 X, and the cooperative shape with vec4 X.
    shapes.push(MatmulConfig {
        x_vec4: true,
        ..MatmulConfig::cooperative(256, 8, 1)
    });
    shapes.push(MatmulConfig {
        unroll: 8,
        ..MatmulConfig::team(256, 32, 1)
    });
    for (tpr, nr, ks) in [
        (8, 4, 1),
        (32, 2, 1),
        (16, 8, 1),
        (32, 2, 4),
        (32, 1, 8),
        (8, 4, 2),
    ] {
        shapes.push(MatmulConfig {
            w_vec4: true,
            rows_per_team: nr,
            k_split: ks,
            ..MatmulConfig::team(256, tpr, 1)
        });
    }
    // The CPU adapters' teams, with the X reads a call gives them.
    for x_vec4 in [false, true] {
        shapes.push(MatmulConfig {
            w_vec4: true,
            x_vec4,
            ..MatmulConfig::CPU_TEAMS
        });
    }
    for (tpr, nt) in [(8, 1), (16, 1), (32, 1), (16, 8)] {
        for subgroup in [false, true] {
            for x_vec4 in [false, true] {
                for w_vec4 in [false, true] {
                    shapes.push(MatmulConfig {
                        subgroup,
                        x_vec4,
                        w_vec4,
                        ..MatmulConfig::team(256, tpr, nt)
                    });
                }
            }
        }
    }
    // X fused from a GLU: the key that reads the gated unit, then the one computing it once per
    // workgroup where the shape does.
    let glu_keys = |ty, cfg: MatmulConfig, act| {
        let plain = key_glu(ty, cfg, Some(act)).expect("every listed type has a define");
        let prologue = cfg
            .glu_prologue
            .then(|| key_glu_prologue(ty, cfg, act, 256).expect("as above"));
        std::iter::once(plain).chain(prologue)
    };
    let mut v = Vec::new();
    for (ty, _) in TYPES {
        for &cfg in &shapes {
            v.push(key(ty, cfg).expect("every listed type has a define").into());
        }
        // X fused from a GLU, with each activation, on the shapes decode uses.
        for cfg in [
            MatmulConfig::simple(1),
            MatmulConfig::team(256, 16, 1),
            MatmulConfig {
                x_vec4: true,
                ..MatmulConfig::team(256, 32, 1)
            },
            MatmulConfig {
                w_vec4: true,
                rows_per_team: 4,
                ..MatmulConfig::team(256, 8, 1)
            },
        ] {
            for act in [Activation::Silu, Activation::GeluTanh] {
                v.extend(glu_keys(ty, cfg, act).map(Variant::from));
            }
        }
        // Norms carried by the epilogues (decode): producer (also reading a gated unit) and
        // consumer, thread-per-row, row teams with and without subgroups, rows shared by teams.
        for cfg in [
            MatmulConfig::simple(1),
            MatmulConfig::team(256, 32, 1),
            MatmulConfig {
                subgroup: false,
                ..MatmulConfig::team(256, 32, 1)
            },
            MatmulConfig {
                w_vec4: true,
                rows_per_team: 2,
                k_split: 4,
                ..MatmulConfig::team(256, 8, 1)
            },
        ] {
            let plain = key(ty, cfg).expect("listed");
            let keys = [
                plain.clone().define("Y_RESNORM", ""),
                plain
                    .clone()
                    .define("Y_NORMSCALE", "")
                    .define("NS_SLOTS", "1u"),
                plain.define("Y_NORMSCALE", "").define("NS_SLOTS", "4u"),
            ]
            .into_iter()
            .chain(glu_keys(ty, cfg, Activation::Silu).map(|k| k.define("Y_RESNORM", "")));
            v.extend(keys.map(Variant::from));
        }
        // X normed by the prologue (decode), plain, with a residual add, with a post-norm.
        for cfg in [MatmulConfig::simple(1), MatmulConfig::team(256, 32, 1)] {
            for (add, add_norm) in [(false, false), (true, false), (true, true)] {
                for subgroup in [false, true] {
                    let cfg = MatmulConfig {
                        subgroup: subgroup && cfg.threads_per_row > 1,
                        ..cfg
                    };
                    // A post-norm over a row a workgroup holds in one vec4 per invocation
                    // (PRENORM_ONE), and over a longer one.
                    let widths: &[u64] = if add_norm { &[256, 4096] } else { &[256] };
                    for &cols in widths {
                        let k = key_prenorm(ty, cfg, cols, add, add_norm)
                            .expect("every listed type has a define");
                        v.push(k.into());
                    }
                }
            }
        }
        // X reduced from a split attention's partials (decode), plain and with the producer's
        // epilogue, thread-per-row and row teams (several rows a team, with and without
        // subgroups).
        for cfg in [
            MatmulConfig::simple(1),
            MatmulConfig::team(256, 32, 1),
            MatmulConfig {
                w_vec4: true,
                rows_per_team: 2,
                k_split: 4,
                ..MatmulConfig::team(256, 8, 1)
            },
            MatmulConfig {
                subgroup: false,
                ..MatmulConfig::team(256, 16, 1)
            },
        ] {
            let k = key_split(ty, cfg, 1024, 16).expect("listed");
            v.push(k.clone().into());
            v.push(k.define("Y_RESNORM", "").into());
        }
        // X quantized to 8 bits (the row teams of the integer-dot types): from memory (scalar
        // and vec4), from a gated unit, a prologue's norm, with the norm epilogues, and read
        // quantized from memory (plain and with the producer's epilogue).
        if xq8_type(ty) {
            let xq = |k: PipelineKey| k.define("XQ8", "").define("XQW", "64u");
            for (ks, subgroup) in [(1, true), (4, true), (2, false)] {
                let cfg = MatmulConfig {
                    w_vec4: true,
                    rows_per_team: 4,
                    k_split: ks,
                    subgroup,
                    ..MatmulConfig::team(256, 8, 1)
                };
                let plain = key(ty, cfg).expect("listed");
                let vec4 = key(
                    ty,
                    MatmulConfig {
                        x_vec4: true,
                        ..cfg
                    },
                )
                .expect("listed");
                let keys = [
                    xq(plain.clone()),
                    xq(vec4),
                    xq(key_glu(ty, cfg, Some(Activation::Silu)).expect("listed")),
                    xq(key_glu_prologue(ty, cfg, Activation::GeluTanh, 256).expect("listed")),
                    xq(key_prenorm(ty, cfg, 256, true, true).expect("listed")),
                    xq(plain.clone()).define("Y_RESNORM", ""),
                    xq(plain.clone())
                        .define("Y_NORMSCALE", "")
                        .define("NS_SLOTS", "2u"),
                    xq(plain.clone())
                        .define("XQ8_MEM", "")
                        .define("XQS0", "16u"),
                    xq(plain)
                        .define("XQ8_MEM", "")
                        .define("XQS0", "16u")
                        .define("Y_RESNORM", ""),
                ];
                v.extend(keys.map(Variant::from));
            }
        }
    }
    v
}

/// The fewest values (rows x cols) of a GEMV whose X the engine quantizes to 8 bits (`XQ8`).
pub const XQ8_MIN_VALUES: u64 = 1 << 22;

/// Whether the engine's GEMV of a `ty` weight `rows x cols` asks for X quantized to 8 bits.
/// Measured on an H100 (`cera bench-gemv --shapes all`, us a GEMV, f32 X -> XQ8):
/// - Q4_K with 4096-value rows (its row teams): Llama 3 8B's gate+up 61.5 -> 46.8, gate/up 32.4
///   -> 26.5, q+k+v 15.8 -> 12.9, q/o 12.8 -> 10.6, the output head 245 -> 170; but the down
///   projection's 14336-value rows 33.3 -> 38.9 (each of its 256 workgroups quantizes all of X
///   for 8 rows), so wider rows keep f32 X;
/// - the output heads of Q5_K (365 -> 209) and Q6_K (269 -> 190); Q6_K's other shapes went
///   either way in teams of 32 lanes (q+k+v 16.6 -> 24.5, down 40.7 -> 35.5) and Q5_K's took
///   no row teams;
/// - Q8_0 gained little where it is large (the 8B head 195 -> 190) and keeps f32 X;
/// - in Q4_K's row teams (from [`XQ8_MIN_VALUES`] up, [`MatmulConfig::gemv_for`]) a later sweep
///   found Q5_K's 8-bit items faster on every Llama 3 8B shape (figures there). Q6_K in teams of
///   16 lanes on 8-bit X was faster in that sweep too (gate+up 66.4 -> 51.6, down 40.7 -> 30.4)
///   but not end to end on a Q4_K_M-mix 8B file (decode 200.7 -> 190.9 tok/s: its down
///   projections, reading the 8-bit unit from memory, 40.8 -> 61.1 us), so Q6_K keeps its shape.
///
/// So: Q4_K, Q5_K and the legacy types' GEMVs of [`XQ8_MIN_VALUES`] values or more with rows
/// of at most 4096 values, Q4_K, Q5_K and Q6_K output heads (65536 rows or more), and Q8_0
/// heads of short rows ([`q8_short_head`]). Besides
/// this rule, [`MatmulConfig::gemv_for`] gives 8-bit X to every item row team of several rows
/// (legacy types, Q6_K) whatever its width: a later kernel, measured faster there. `CERA_XQ8_MIN=N` instead asks for it on every Q4_K, Q5_K and Q6_K GEMV of N values or more (a huge N: never); `CERA_XQ8_Q8=1`
/// adds Q8_0 to that rule. Bench knobs, natively.
fn xq8_wanted(ty: GgmlType, rows: u64, cols: u64) -> bool {
    use crate::gpu::knob::{knob_on, knob_u64};
    let k_type = matches!(ty, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K);
    if let Some(min) = knob_u64("CERA_XQ8_MIN") {
        let q8 = ty == GgmlType::Q8_0 && knob_on("CERA_XQ8_Q8");
        return (k_type || q8) && rows * cols >= min;
    }
    let head = (k_type && rows >= 65536) || q8_short_head(ty, rows, cols);
    let big = rows * cols >= XQ8_MIN_VALUES;
    let rows_kind =
        (matches!(ty, GgmlType::Q4K | GgmlType::Q5K) || word_rows_type(ty)) && big && cols <= 4096;
    head || rows_kind
}

/// A Q8_0 output head (65536 rows or more) of short rows (at most 1024 values, 64 items or
/// fewer): such a head takes 2 rows a team on 8-bit X instead of 4 rows on f32 X. Measured on an
/// H100 (`cera bench-gemv --types q8_0 --shapes gemma --configs ...`, us, copy at 2,977 GB/s):
/// Gemma 3 270M's 262144 x 640 head, 8 lanes: 4 rows f32 X 77.9 (0.78 of copy), 2 rows 70.8,
/// 4 rows 8-bit X 69.7, 2 rows 8-bit X 64.4 (0.94). Wider Q8_0 heads keep their shape (the 8B
/// head gained little from 8-bit X with 4 rows, [`xq8_wanted`]).
fn q8_short_head(ty: GgmlType, rows: u64, cols: u64) -> bool {
    ty == GgmlType::Q8_0 && rows >= 65536 && cols <= 1024
}

/// The types whose items can multiply with X quantized to 8 bits (`XQ8`).
fn xq8_type(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0 | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K
    ) || word_rows_type(ty)
}

/// Whether shape `cfg` (fitted, for the weight) has `XQ8` items for `ty`: the row teams of the
/// 16-byte-item types and of the legacy types (word items), the interleaved items of Q6_K.
fn xq8_kernel(cfg: MatmulConfig, ty: GgmlType) -> bool {
    match ty {
        GgmlType::Q8_0
        | GgmlType::Q4K
        | GgmlType::Q5K
        | GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1 => cfg.rows_kernel(ty),
        GgmlType::Q6K => cfg.interleaved && cfg.threads_per_row > 1,
        _ => false,
    }
}

/// `y[r] = sum_c W[r, c] * x[c]` for one token (decode), in the device's GEMV shape.
///
/// - `x`: `(cols)` f32 from element `x_offset`
/// - `y`: `(rows)` f32 from element `y_offset`
pub fn gemv(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    x_offset: u64,
    y: &wgpu::Buffer,
    y_offset: u64,
) -> Result<()> {
    matmul(
        ctx,
        encoder,
        MatmulConfig::gemv_for(ctx, w.ty, w.rows, w.cols),
        w,
        x,
        x_offset,
        y,
        y_offset,
        1,
    )
}

/// `Y[t, r] = sum_c W[r, c] * X[t, c]` for `n_tokens` tokens (prefill), in the device's GEMM
/// shape (its GEMV shape for one token).
///
/// - `x`: `(n_tokens, cols)` f32 from element `x_offset`
/// - `y`: `(n_tokens, rows)` f32 from element `y_offset`
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    x_offset: u64,
    y: &wgpu::Buffer,
    y_offset: u64,
    n_tokens: u32,
) -> Result<()> {
    let cfg = if n_tokens == 1 {
        MatmulConfig::gemv_for(ctx, w.ty, w.rows, w.cols)
    } else {
        MatmulConfig::gemm(ctx, n_tokens)
    };
    matmul(ctx, encoder, cfg, w, x, x_offset, y, y_offset, n_tokens)
}

/// [`gemm`] with an explicit shape (tests run every shape on every adapter).
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    ctx: &GpuContext,
    encoder: &mut wgpu::CommandEncoder,
    cfg: MatmulConfig,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    x_offset: u64,
    y: &wgpu::Buffer,
    y_offset: u64,
    n_tokens: u32,
) -> Result<()> {
    let mut rec = Recorder::new(ctx);
    prepare(&mut rec, cfg, w, x, x_offset, y, y_offset, n_tokens)?;
    rec.encode(encoder)
}

/// `Y[t, r] = sum_c W[r, c] * X[t, c]` in the device's shape for `n_tokens`: a GEMV for one
/// token, the tiled GEMM for a batch where it is the faster kernel (on cooperative matrices,
/// [`super::gemm_coop`], where the device has them, else [`super::gemm`]), else this kernel's
/// register shape.
#[allow(clippy::too_many_arguments)]
pub fn prepare_auto(
    rec: &mut Recorder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    x_offset: u64,
    y: &wgpu::Buffer,
    y_offset: u64,
    n_tokens: u32,
) -> Result<()> {
    prepare_auto_strided(rec, w, x, x_offset, None, y, y_offset, None, n_tokens)
}

/// [`prepare_auto`] with row strides: `X[t, c]` at `x_offset + t * x_stride + c` (default
/// `w.cols`), `Y[t, r]` at `y_offset + t * y_stride + r` (default `w.rows`), so a projection can
/// read columns of a wider activation and write its columns of a wider output.
#[allow(clippy::too_many_arguments)]
pub fn prepare_auto_strided(
    rec: &mut Recorder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    x_offset: u64,
    x_stride: Option<u64>,
    y: &wgpu::Buffer,
    y_offset: u64,
    y_stride: Option<u64>,
    n_tokens: u32,
) -> Result<()> {
    if super::gemm_coop::wanted(rec.ctx, w, n_tokens) {
        let cfg = super::gemm_coop::for_shape(rec.ctx, w.rows, n_tokens);
        return super::gemm_coop::prepare(
            rec, cfg, w, x, x_offset, x_stride, y, y_offset, y_stride, n_tokens,
        );
    }
    if super::gemm::use_gemm(rec.ctx, n_tokens) {
        let cfg = super::gemm::GemmConfig::for_shape(rec.ctx, w.rows, n_tokens);
        return super::gemm::prepare_strided(
            rec, cfg, w, x, x_offset, x_stride, y, y_offset, y_stride, n_tokens,
        );
    }
    let cfg = if n_tokens == 1 {
        MatmulConfig::gemv_for(rec.ctx, w.ty, w.rows, w.cols)
    } else {
        MatmulConfig::gemm(rec.ctx, n_tokens)
    };
    let io = Io {
        x,
        x_offset,
        x_stride: x_stride.unwrap_or(w.cols),
        y,
        y_offset,
        y_stride: y_stride.unwrap_or(w.rows),
    };
    prepare_with(rec, cfg, w, &io, None, n_tokens)
}

/// Prepare the dispatches of [`matmul`]: one per part of the weight.
#[allow(clippy::too_many_arguments)]
pub fn prepare(
    rec: &mut Recorder,
    cfg: MatmulConfig,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    x_offset: u64,
    y: &wgpu::Buffer,
    y_offset: u64,
    n_tokens: u32,
) -> Result<()> {
    let io = Io {
        x,
        x_offset,
        x_stride: w.cols,
        y,
        y_offset,
        y_stride: w.rows,
    };
    prepare_with(rec, cfg, w, &io, None, n_tokens)
}

/// `Y[t, r] = sum_c W[r, c] * (act(G[t, c]) * U[t, c])`: a feed-forward block's GLU fused into
/// its down projection (`gate` and `up` in the same layout, from element `x_offset`).
#[allow(clippy::too_many_arguments)]
pub fn prepare_glu(
    rec: &mut Recorder,
    cfg: MatmulConfig,
    act: Activation,
    w: &GpuTensor,
    gate: &wgpu::Buffer,
    up: &wgpu::Buffer,
    x_offset: u64,
    y: &wgpu::Buffer,
    y_offset: u64,
    n_tokens: u32,
) -> Result<()> {
    if gate == up || gate == y || up == y {
        return Err(Error::invalid(
            "matmul glu: gate, up and y must be three buffers",
        ));
    }
    let io = Io {
        x: gate,
        x_offset,
        x_stride: w.cols,
        y,
        y_offset,
        y_stride: w.rows,
    };
    prepare_with(rec, cfg, w, &io, Some((up, 0, act)), n_tokens)
}

/// [`prepare_glu`] where gate and up are the two halves of one fused projection's output
/// `gu (n_tokens, x_stride)`: `G[t, c]` at `x_offset + t * x_stride + c`, `U[t, c]` `up_delta`
/// elements further (`up_delta >= w.cols`, so the halves do not overlap).
#[allow(clippy::too_many_arguments)]
pub fn prepare_glu_fused(
    rec: &mut Recorder,
    cfg: MatmulConfig,
    act: Activation,
    w: &GpuTensor,
    gu: &wgpu::Buffer,
    x_offset: u64,
    up_delta: u64,
    x_stride: u64,
    y: &wgpu::Buffer,
    y_offset: u64,
    n_tokens: u32,
) -> Result<()> {
    if gu == y {
        return Err(Error::invalid(
            "matmul glu: the gate/up buffer cannot be the output",
        ));
    }
    if up_delta < w.cols || x_stride < up_delta + w.cols {
        return Err(Error::invalid(format!(
            "matmul glu: up {up_delta} elements after gate with rows of {x_stride} does not hold two halves of {}",
            w.cols
        )));
    }
    let io = Io {
        x: gu,
        x_offset,
        x_stride,
        y,
        y_offset,
        y_stride: w.rows,
    };
    prepare_with(rec, cfg, w, &io, Some((gu, up_delta, act)), n_tokens)
}

/// Where a product reads and writes: `X[t, c]` at `x_offset + t * x_stride + c`, `Y[t, r]` at
/// `y_offset + t * y_stride + r`.
struct Io<'a> {
    x: &'a wgpu::Buffer,
    x_offset: u64,
    x_stride: u64,
    y: &'a wgpu::Buffer,
    y_offset: u64,
    y_stride: u64,
}

/// The pipeline key of a type and shape, with X fused from a GLU when `glu` is given.
pub fn key_glu(ty: GgmlType, cfg: MatmulConfig, glu: Option<Activation>) -> Result<PipelineKey> {
    let k = key(ty, cfg)?;
    Ok(match glu {
        Some(act) => k.define("X_GLU", "").define(act.define(), ""),
        None => k,
    })
}

/// [`key_glu`] with the gated unit computed once per workgroup (`GLU_WG`, `cols` values).
pub fn key_glu_prologue(
    ty: GgmlType,
    cfg: MatmulConfig,
    act: Activation,
    cols: u64,
) -> Result<PipelineKey> {
    Ok(key_glu(ty, cfg, Some(act))?
        .define("GLU_WG", "")
        .define("X_WG", "")
        .define("XW4", format!("{}u", cols / 4)))
}

/// Whether the engine's decode GEMV of `w` with a gated-unit X would compute that X once per
/// workgroup ([`glu_prologue_fits`]). Where it would not (X wider than workgroup memory), every
/// row recomputes the unit: on an H200 Llama 3 8B's down projection (4096 x 14336 Q8_0) took
/// 51 us so, against 35 us for the plain GEMV, so the caller runs the GLU as its own dispatch.
pub fn glu_fused_worth(ctx: &GpuContext, w: &GpuTensor) -> bool {
    let cfg = MatmulConfig::gemv_for(ctx, w.ty, w.rows, w.cols)
        .fit(ctx)
        .for_w(w.ty, w.cols);
    let rpw = cfg.rows_per_workgroup() as u64;
    let workgroups: u64 = w.parts.iter().map(|p| p.rows.div_ceil(rpw)).sum();
    // A shape that does not ask for the once-per-workgroup unit (a thread a row, the CPU
    // adapters' teams) recomputes it per row by design.
    cfg.threads_per_row == 1 || !cfg.glu_prologue || glu_prologue_fits(ctx, cfg, w.cols, workgroups)
}

/// Whether a GEMV in shape `cfg` (fitted) with a gated-unit X of `cols` values may compute it
/// once per workgroup: asked for (`glu_prologue`), one token an invocation, `cols` a multiple of
/// 4 within the workgroup storage beside the reduction's, and `workgroups x cols` within
/// [`PRENORM_MAX_VALUES`] (past that the repeats outweigh what they save, as for the norm).
pub fn glu_prologue_fits(ctx: &GpuContext, cfg: MatmulConfig, cols: u64, workgroups: u64) -> bool {
    glu_prologue_fits_with(ctx, cfg, cols, workgroups, 0)
}

/// [`glu_prologue_fits`] beside `extra` bytes of other workgroup memory (an epilogue's sum).
fn glu_prologue_fits_with(
    ctx: &GpuContext,
    cfg: MatmulConfig,
    cols: u64,
    workgroups: u64,
    extra: u64,
) -> bool {
    if !cfg.glu_prologue || cfg.tokens_per_thread != 1 || !cols.is_multiple_of(4) {
        return false;
    }
    cols * 4 + team_red_bytes(cfg) + ks_bytes(cfg) + extra
        <= ctx.limits.max_compute_workgroup_storage_size as u64
        && workgroups * cols <= prenorm_max_values()
}

fn prepare_with(
    rec: &mut Recorder,
    cfg: MatmulConfig,
    w: &GpuTensor,
    io: &Io,
    glu: Option<(&wgpu::Buffer, u64, Activation)>,
    n_tokens: u32,
) -> Result<()> {
    prepare_full(rec, cfg, w, io, glu, Prologue::None, None, n_tokens).map(|_| ())
}

/// X of a decode GEMV computed by its own workgroups (`X_PRENORM` in `matmul.wgsl`):
/// `X = rmsnorm(r) * w` with `r = x`, or `r = x + add * scale` (the addend post-normed first
/// when `add_norm` is given) which is also written to `out`.
///
/// - `x`: the residual stream, `(cols)` f32 from element 0
/// - `add`, `out`: `(cols)` f32 from element 0; `out` is neither `x` nor `add`
/// - `w`, `add_norm`: f32 vectors of `cols`
pub struct PreNorm<'a> {
    pub x: &'a wgpu::Buffer,
    pub add: Option<PreAdd<'a>>,
    pub w: &'a GpuTensor,
    pub eps: f32,
}

/// The residual add of a [`PreNorm`].
pub struct PreAdd<'a> {
    pub add: &'a wgpu::Buffer,
    pub add_norm: Option<&'a GpuTensor>,
    pub scale: f32,
    pub out: &'a wgpu::Buffer,
}

/// Workgroup memory of the teams' reduction where there are no subgroups (`red` in
/// `matmul.wgsl`): a sum per invocation and token, or per invocation and row of its team.
fn team_red_bytes(cfg: MatmulConfig) -> u64 {
    if cfg.threads_per_row > 1 && !cfg.subgroup {
        (cfg.workgroup_size * cfg.tokens_per_thread.max(cfg.rows_per_team)) as u64 * 4
    } else {
        0
    }
}

/// Workgroup memory of the KS teams' sums (`ks_red` in `matmul.wgsl`), 0 without row sharing.
fn ks_bytes(cfg: MatmulConfig) -> u64 {
    if cfg.k_split > 1 {
        (cfg.workgroup_size / cfg.threads_per_row * cfg.rows_per_team) as u64 * 4
    } else {
        0
    }
}

/// Whether a GEMV of `ty` with `cols` values a row may quantize its X (`XQ8`, asked for by
/// `cfg.x_q8`): a type with integer-dot items (Q8_0, Q4_K, Q5_K, Q6_K, the legacy types), `cols` a multiple of
/// 32, and the quantized X (a byte a value and 16 bytes a block) within the workgroup storage
/// beside what the kernel holds already (X as f32 where a prologue computes it, `x_wg`; the
/// teams' and a norm's sums, `wg_sum`).
pub fn xq8_fits(
    ctx: &GpuContext,
    cfg: MatmulConfig,
    ty: GgmlType,
    cols: u64,
    x_wg: bool,
    wg_sum: bool,
) -> bool {
    if !xq8_type(ty) || !cols.is_multiple_of(32) || cfg.tokens_per_thread != 1 {
        return false;
    }
    let mut bytes = cols + cols / 32 * 16 + team_red_bytes(cfg) + ks_bytes(cfg);
    if x_wg {
        bytes += cols * 4;
    }
    if wg_sum {
        bytes += cfg.workgroup_size as u64 * 4;
    }
    bytes <= ctx.limits.max_compute_workgroup_storage_size as u64
}

/// Whether a decode GEMV of `w` in shape `cfg` can compute its X with a [`PreNorm`] on this
/// device: `cols` a multiple of 4, and X plus the prologue's reduction (plus the team
/// reduction's workgroup memory where there are no subgroups) within the workgroup storage, and
/// 7 storage buffers within the per-stage limit. Otherwise the caller runs the norm as its own
/// dispatch.
pub fn prenorm_fits(ctx: &GpuContext, cfg: MatmulConfig, cols: u64) -> bool {
    let cfg = cfg.fit(ctx);
    if !cols.is_multiple_of(4) || cfg.tokens_per_thread != 1 {
        return false;
    }
    let bytes = cols * 4 + cfg.workgroup_size as u64 * 4 + team_red_bytes(cfg) + ks_bytes(cfg);
    bytes <= ctx.limits.max_compute_workgroup_storage_size as u64
        && ctx.limits.max_storage_buffers_per_shader_stage >= 7
}

/// The most values a [`PreNorm`] GEMV's workgroups may read between them (workgroups x cols).
/// Each workgroup repeats the norm; past this the repeats cost more than the norm's own dispatch.
/// Measured on an H200 (native, Vulkan): Gemma 3 270M's projections (up to 512 workgroups x 640
/// values, 0.33 M) ran 681 -> 744 tok/s with their norms folded in; Llama 3 8B's (768 x 4096
/// for q/k/v, 3584 x 4096 for gate/up: 3.1 M and 14.7 M) 148 -> 125.
pub const PRENORM_MAX_VALUES: u64 = 1 << 20;

/// [`PRENORM_MAX_VALUES`], or on native builds `CERA_PRENORM_MAX` when set (a bench knob).
pub fn prenorm_max_values() -> u64 {
    crate::gpu::knob::knob_u64("CERA_PRENORM_MAX").unwrap_or(PRENORM_MAX_VALUES)
}

/// Whether a decode GEMV of `w` in the engine's shape should compute its X with a [`PreNorm`]:
/// it fits ([`prenorm_fits`]) and its workgroups read at most [`PRENORM_MAX_VALUES`] values.
pub fn prenorm_worth(ctx: &GpuContext, w: &GpuTensor) -> bool {
    let cfg = MatmulConfig::gemv_for(ctx, w.ty, w.rows, w.cols)
        .fit(ctx)
        .for_w(w.ty, w.cols);
    let workgroups: u64 = w
        .parts
        .iter()
        .map(|p| p.rows.div_ceil(cfg.rows_per_workgroup() as u64))
        .sum();
    prenorm_fits(ctx, cfg, w.cols) && workgroups * w.cols <= prenorm_max_values()
}

/// `y[r] = sum_c W[r, c] * X[c]` for one token with X computed by `pre` (see [`PreNorm`]), into
/// `y` from element `y_offset` (a projection's columns of a wider output). The caller checked
/// [`prenorm_fits`].
pub fn prepare_prenorm(
    rec: &mut Recorder,
    w: &GpuTensor,
    pre: &PreNorm,
    y: &wgpu::Buffer,
    y_offset: u64,
) -> Result<()> {
    let cfg = MatmulConfig::gemv_for(rec.ctx, w.ty, w.rows, w.cols);
    prepare_prenorm_as(rec, cfg, w, pre, y, y_offset)
}

/// [`prepare_prenorm`] in an explicit kernel shape (tests run the GPU's shape on every adapter).
pub fn prepare_prenorm_as(
    rec: &mut Recorder,
    cfg: MatmulConfig,
    w: &GpuTensor,
    pre: &PreNorm,
    y: &wgpu::Buffer,
    y_offset: u64,
) -> Result<()> {
    if !prenorm_fits(rec.ctx, cfg, w.cols) {
        return Err(Error::invalid(format!(
            "matmul {}: a normed X of {} values does not fit this device's workgroup memory",
            w.name, w.cols
        )));
    }
    let vector = |t: &GpuTensor, what: &str| -> Result<()> {
        if !t.is_f32_vector(w.cols) {
            return Err(Error::invalid(format!(
                "matmul {}: {what} {} must be an f32 vector of {} in one part",
                w.name, t.name, w.cols
            )));
        }
        Ok(())
    };
    vector(pre.w, "norm weight")?;
    if let Some(a) = &pre.add {
        if let Some(n) = a.add_norm {
            vector(n, "addend norm weight")?;
        }
        if a.out == pre.x || a.out == a.add || a.out == y || a.add == y || pre.x == y {
            return Err(Error::invalid(format!(
                "matmul {}: the residual's input, addend, output and y must be distinct buffers",
                w.name
            )));
        }
    }
    let io = Io {
        x: pre.x,
        x_offset: 0,
        x_stride: w.cols,
        y,
        y_offset,
        y_stride: w.rows,
    };
    prepare_full(rec, cfg, w, &io, None, Prologue::Norm(pre), None, 1).map(|_| ())
}

/// The pipeline key of a prologue-normed GEMV over `cols` values: with a residual add, and
/// with the addend post-normed.
pub fn key_prenorm(
    ty: GgmlType,
    cfg: MatmulConfig,
    cols: u64,
    add: bool,
    add_norm: bool,
) -> Result<PipelineKey> {
    let mut k = key(ty, cfg)?
        .define("X_PRENORM", "")
        .define("X_WG", "")
        .define("XW4", format!("{}u", cols / 4));
    if add {
        k = k.define("PRE_ADD", "");
        if add_norm {
            k = k.define("PRE_ADD_NORM", "");
            // Each invocation holds at most one vec4 of the row: every load in one round trip
            // before the post-norm's sum (H100, Gemma 3 270M decode +2.7 %).
            if cols / 4 <= cfg.workgroup_size as u64
                && !crate::gpu::knob::knob_off("CERA_PRENORM_ONE")
            {
                k = k.define("PRENORM_ONE", "");
            }
        }
    }
    Ok(k)
}

/// What computes a GEMV's X inside its workgroups, if anything.
#[derive(Clone, Copy)]
enum Prologue<'a> {
    None,
    Norm(&'a PreNorm<'a>),
    Split(&'a SplitX<'a>),
    /// X quantized to 8 bits in memory, the `Io`'s x ([`prepare_q8_x`]).
    Q8,
}

/// X of a decode GEMV that a split attention's partial left as chunks
/// ([`crate::ops::attention_split::prepare`] without `out`): every workgroup does the reduce
/// itself (`X_SPLIT` in `matmul.wgsl`), so the attention needs no reduce dispatch. X is the
/// token's heads side by side: the GEMV's cols are `n_head * head_dim`.
pub struct SplitX<'a> {
    /// The partials' scratch and the step buffer the partial read its position from.
    pub scratch: &'a wgpu::Buffer,
    pub step: &'a wgpu::Buffer,
    pub partials: Partials,
}

/// Whether a decode GEMV of `cols` in shape `cfg` can take its X from a [`SplitX`] on this
/// device: one token, X in workgroup memory beside the teams' reduction (and with an epilogue,
/// its sum: `epilogue`).
pub fn split_x_fits(ctx: &GpuContext, cfg: MatmulConfig, cols: u64, epilogue: bool) -> bool {
    let cfg = cfg.fit(ctx);
    let sum = if epilogue {
        cfg.workgroup_size as u64 * 4
    } else {
        0
    };
    cols.is_multiple_of(4)
        && cfg.tokens_per_thread == 1
        && cols * 4 + sum + team_red_bytes(cfg) + ks_bytes(cfg)
            <= ctx.limits.max_compute_workgroup_storage_size as u64
}

/// The pipeline key of a GEMV over `cols` values whose X is a split attention's reduce, the
/// partial's chunks `chunk` cells.
pub fn key_split(ty: GgmlType, cfg: MatmulConfig, cols: u64, chunk: u32) -> Result<PipelineKey> {
    Ok(key(ty, cfg)?
        .define("X_SPLIT", "")
        .define("X_WG", "")
        .define("XW4", format!("{}u", cols / 4))
        .define("SP_CHUNK", format!("{chunk}u")))
}

/// One token's `y = W x` with `x` the attention output a split attention's partial left in
/// `sx` (see [`SplitX`]), into `y` from `y_offset`, in shape `cfg` (the engine's:
/// [`MatmulConfig::gemv_for`]), with an optional [`Epilogue`] (as [`prepare_epilogue`]).
/// Returns the sums of squares a [`ResNorm`] wrote (0 otherwise).
pub fn prepare_split_x(
    rec: &mut Recorder,
    cfg: MatmulConfig,
    w: &GpuTensor,
    sx: &SplitX,
    y: &wgpu::Buffer,
    y_offset: u64,
    epi: Option<&Epilogue>,
) -> Result<u64> {
    let bad = |what: String| Err(Error::invalid(format!("matmul {}: {what}", w.name)));
    let pt = &sx.partials;
    if pt.n_tokens != 1 || !pt.vec4 || pt.head_dim == 0 || !pt.head_dim.is_multiple_of(4) {
        return bad(format!(
            "partials of {} tokens, heads of {} (vec4: {}): one token in vec4 heads only",
            pt.n_tokens, pt.head_dim, pt.vec4
        ));
    }
    if pt.n_head as u64 * pt.head_dim as u64 != w.cols {
        return bad(format!(
            "{} heads of {} are not the {} cols",
            pt.n_head, pt.head_dim, w.cols
        ));
    }
    let need = pt.n_head as u64 * pt.n_chunks as u64 * (pt.head_dim as u64 + 4) * 4;
    if sx.scratch.size() < need || sx.scratch == y {
        return bad(format!(
            "the partials' scratch holds {} bytes, {need} are needed (and it is not y)",
            sx.scratch.size()
        ));
    }
    if !split_x_fits(rec.ctx, cfg, w.cols, epi.is_some()) {
        return bad(format!(
            "an X of {} values does not fit this device's workgroup memory",
            w.cols
        ));
    }
    if let Some(epi) = epi {
        check_epilogue(rec.ctx, cfg, w, sx.scratch, y, y_offset, epi)?;
    }
    let io = Io {
        x: sx.scratch,
        x_offset: 0,
        x_stride: w.cols,
        y,
        y_offset,
        y_stride: w.rows,
    };
    prepare_full(rec, cfg, w, &io, None, Prologue::Split(sx), epi, 1)
}

/// A decode GEMV's epilogue that carries an RMS norm from one projection to the next without
/// a dispatch of its own (`Y_RESNORM` and `Y_NORMSCALE` in `matmul.wgsl`): the producer ends a
/// block and the consumer starts the next.
pub enum Epilogue<'a> {
    ResNorm(ResNorm<'a>),
    NormScale(NormScale<'a>),
}

/// The producer's epilogue: `y += scale * (W x)` in place (`y` is the residual stream, `(rows)`
/// f32 from element 0), `h = y * w` (the next norm's weight: the part of the norm that needs no
/// other row), and every workgroup's sum of its rows' `y^2` into `ss` ([`resnorm_partials`]
/// f32).
pub struct ResNorm<'a> {
    /// The next norm's weight: an f32 vector of the GEMV's rows, in one part.
    pub w: &'a GpuTensor,
    /// `(rows)` f32: `y * w`, what the consumer reads as its X.
    pub h: &'a wgpu::Buffer,
    pub ss: &'a wgpu::Buffer,
    pub scale: f32,
}

/// The consumer's epilogue: `y = (W h) / sqrt(sum(ss[0 .. count]) / cols + eps)`, the rest of
/// the norm (its scale is one number for the whole of h, so it moves out of the dot product).
pub struct NormScale<'a> {
    pub ss: &'a wgpu::Buffer,
    /// Sums of squares the producer wrote (what its prepare returned).
    pub count: u32,
    pub eps: f32,
}

/// Whether decode GEMVs may carry norms in their epilogues on this device: the producer binds
/// 7 storage buffers (with a fused gated unit). [`prepare_epilogue`] also checks each shape's
/// workgroup memory (the epilogue's sum, one f32 an invocation, beside the teams' reduction).
pub fn epilogue_fits(ctx: &GpuContext) -> bool {
    ctx.limits.max_storage_buffers_per_shader_stage >= 7
}

/// Sums of squares a [`ResNorm`] GEMV of `w` in shape `cfg` writes: one per workgroup of each
/// part (the workgroups as its dispatch counts them, from the same pipeline key).
pub fn resnorm_partials(ctx: &GpuContext, cfg: MatmulConfig, w: &GpuTensor) -> u64 {
    let cfg = cfg.fit(ctx).for_w(w.ty, w.cols);
    let Ok(k) = key(w.ty, cfg) else {
        return 0;
    };
    let rpw = key_rows_per_workgroup(&k) as u64;
    w.parts.iter().map(|p| p.rows.div_ceil(rpw)).sum()
}

/// Rows a workgroup of the kernel built from `key` covers: its teams (WG_SIZE / TPR / KS) times
/// the rows of each (NR).
fn key_rows_per_workgroup(key: &PipelineKey) -> u32 {
    key.decisions().workgroup_size
        / key.define_u32("TPR").unwrap_or(1)
        / key.define_u32("KS").unwrap_or(1)
        * key.define_u32("NR").unwrap_or(1)
}

/// [`resnorm_partials`] in the engine's decode shape for `w`.
pub fn resnorm_partials_gemv(ctx: &GpuContext, w: &GpuTensor) -> u64 {
    resnorm_partials(ctx, MatmulConfig::gemv_for(ctx, w.ty, w.rows, w.cols), w)
}

/// One token's `y = W x` with an [`Epilogue`], X at `x_offset` (with `glu`: the gated unit of
/// the fused gate/up halves `up_delta` elements apart, as [`prepare_glu_fused`]), in shape `cfg`
/// (the engine's: [`MatmulConfig::gemv_for`]). Returns the sums of squares a producer wrote (0
/// for a consumer).
#[allow(clippy::too_many_arguments)]
pub fn prepare_epilogue(
    rec: &mut Recorder,
    cfg: MatmulConfig,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    x_offset: u64,
    glu: Option<(u64, Activation)>,
    y: &wgpu::Buffer,
    y_offset: u64,
    epi: &Epilogue,
) -> Result<u64> {
    check_epilogue(rec.ctx, cfg, w, x, y, y_offset, epi)?;
    let bad = |what: String| Err(Error::invalid(format!("matmul {}: {what}", w.name)));
    let (x_stride, glu) = match glu {
        Some((delta, act)) => {
            if delta < w.cols {
                return bad(format!(
                    "up {delta} elements after gate overlaps its {}",
                    w.cols
                ));
            }
            (delta + w.cols, Some((x, delta, act)))
        }
        None => (w.cols, None),
    };
    let io = Io {
        x,
        x_offset,
        x_stride,
        y,
        y_offset,
        y_stride: w.rows,
    };
    prepare_full(rec, cfg, w, &io, glu, Prologue::None, Some(epi), 1)
}

/// Whether a decode GEMV of `w` in shape `cfg` can read X quantized to 8 bits from memory
/// ([`prepare_q8_x`]): a type with integer-dot items in a shape that has them, `cols` a
/// multiple of 32.
pub fn q8_x_fits(ctx: &GpuContext, cfg: MatmulConfig, w: &GpuTensor) -> bool {
    let cfg = cfg.fit(ctx).for_w(w.ty, w.cols);
    xq8_type(w.ty)
        && xq8_kernel(cfg, w.ty)
        && w.cols.is_multiple_of(32)
        && cfg.tokens_per_thread == 1
}

/// Whether the engine's decode GEMV of `w` reads a gated unit that a dispatch of its own
/// computes quantized to 8 bits ([`crate::ops::glu::prepare_q8`], then [`prepare_q8_x`]) rather
/// than as f32: K-quant and legacy-type weights where the engine's GEMV shape has 8-bit items
/// ([`q8_x_fits`]). Measured on an H100, Llama 3 8B's 4096 x 14336 down projection: Q4_K 45.3
/// -> 35.9 us, Q8_0 36.9 -> 36.6 (its items are one load and an FMA a value already), so Q8_0
/// keeps f32 X. With the legacy types' row teams on 8-bit X at any width, an 8B-shaped file of
/// Q4_0 matrices decodes at 289.9 tok/s instead of 278.7 (alternating runs, one call).
/// (Only GPUs get here: the CPU adapters' GEMVs compute the unit themselves.)
/// `CERA_XQ8_GLU=0` turns it off natively, `=1` adds Q8_0 (bench knobs).
pub fn q8_glu_wanted(ctx: &GpuContext, w: &GpuTensor) -> bool {
    let knob = crate::gpu::knob::knob("CERA_XQ8_GLU");
    let knob = knob.as_deref().map(str::trim);
    let ty_ok = match w.ty {
        GgmlType::Q4K
        | GgmlType::Q5K
        | GgmlType::Q6K
        | GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1 => knob != Some("0"),
        GgmlType::Q8_0 => knob == Some("1"),
        _ => false,
    };
    ty_ok && q8_x_fits(ctx, MatmulConfig::gemv_for(ctx, w.ty, w.rows, w.cols), w)
}

/// `y[r] = sum_c W[r, c] * X[c]` for one token with X quantized to 8 bits in `xq` as
/// [`crate::ops::glu::prepare_q8`] writes one row (from byte 0: `cols` bytes of quants, then 16
/// bytes a block of 32), into `y` from element `y_offset`, with an optional epilogue; returns
/// the sums of squares a [`ResNorm`] wrote. The items multiply 8-bit X (`XQ8_MEM` in
/// `matmul.wgsl`): `cfg` must have them for `w` ([`q8_x_fits`]).
#[allow(clippy::too_many_arguments)]
pub fn prepare_q8_x(
    rec: &mut Recorder,
    cfg: MatmulConfig,
    w: &GpuTensor,
    xq: &wgpu::Buffer,
    y: &wgpu::Buffer,
    y_offset: u64,
    epi: Option<&Epilogue>,
) -> Result<u64> {
    let bad = |what: String| Err(Error::invalid(format!("matmul {}: {what}", w.name)));
    if !q8_x_fits(rec.ctx, cfg, w) {
        return bad(format!(
            "shape {} has no 8-bit X items for {} with {} cols",
            cfg.fit(rec.ctx).for_w(w.ty, w.cols),
            w.ty,
            w.cols
        ));
    }
    let need = crate::ops::glu::q8_bytes(1, w.cols);
    if xq.size() < need {
        return bad(format!(
            "a quantized X of {} values needs {need} bytes, the buffer has {}",
            w.cols,
            xq.size()
        ));
    }
    if let Some(epi) = epi {
        check_epilogue(rec.ctx, cfg, w, xq, y, y_offset, epi)?;
    }
    let io = Io {
        x: xq,
        x_offset: 0,
        x_stride: w.cols,
        y,
        y_offset,
        y_stride: w.rows,
    };
    prepare_full(rec, cfg, w, &io, None, Prologue::Q8, epi, 1)
}

/// [`prepare_epilogue`]'s checks of `epi` on a GEMV of `w` in shape `cfg` reading `x`.
fn check_epilogue(
    ctx: &GpuContext,
    cfg: MatmulConfig,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    y_offset: u64,
    epi: &Epilogue,
) -> Result<()> {
    let bad = |what: String| Err(Error::invalid(format!("matmul {}: {what}", w.name)));
    if cfg.fit(ctx).tokens_per_thread != 1 {
        return bad("a norm epilogue needs the one-token (GEMV) shape".into());
    }
    if !epilogue_fits(ctx) {
        return bad("this device binds too few storage buffers for a norm epilogue".into());
    }
    let fitted = cfg.fit(ctx).for_w(w.ty, w.cols);
    let shared = fitted.workgroup_size as u64 * 4 + team_red_bytes(fitted) + ks_bytes(fitted);
    if shared > ctx.limits.max_compute_workgroup_storage_size as u64 {
        return bad(format!(
            "a norm epilogue in shape {fitted} needs {shared} bytes of workgroup memory"
        ));
    }
    if x == y {
        return bad("the epilogue's output cannot be its input".into());
    }
    match epi {
        Epilogue::ResNorm(rn) => {
            let t = rn.w;
            if !t.is_f32_vector(w.rows) {
                return bad(format!(
                    "the norm weight {} must be an f32 vector of {} in one part",
                    t.name, w.rows
                ));
            }
            if y_offset != 0 {
                return bad("the residual stream starts at element 0".into());
            }
            let ss_bytes = resnorm_partials(ctx, cfg, w) * 4;
            if rn.h == y || rn.h == x || rn.ss == y || rn.ss == x || rn.ss == rn.h {
                return bad("the residual, h, the sums and x must be distinct buffers".into());
            }
            if rn.ss.size() < ss_bytes || rn.h.size() < w.rows * 4 || y.size() < w.rows * 4 {
                return bad(format!(
                    "h ({} bytes), y ({}) or the sums ({} bytes, {ss_bytes} needed) too small",
                    rn.h.size(),
                    y.size(),
                    rn.ss.size()
                ));
            }
        }
        Epilogue::NormScale(ns) => {
            if ns.count == 0 || ns.ss.size() < ns.count as u64 * 4 {
                return bad(format!(
                    "{} sums of squares in a buffer of {} bytes",
                    ns.count,
                    ns.ss.size()
                ));
            }
            if ns.ss == y {
                return bad("the sums of squares cannot be the output".into());
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn prepare_full(
    rec: &mut Recorder,
    cfg: MatmulConfig,
    w: &GpuTensor,
    io: &Io,
    glu: Option<(&wgpu::Buffer, u64, Activation)>,
    prologue: Prologue,
    epi: Option<&Epilogue>,
    n_tokens: u32,
) -> Result<u64> {
    if n_tokens == 0 || w.rows == 0 {
        return Ok(0);
    }
    if io.x_stride < w.cols || io.y_stride < w.rows {
        return Err(Error::invalid(format!(
            "matmul {}: strides x {} y {} below the {} cols and {} rows",
            w.name, io.x_stride, io.y_stride, w.cols, w.rows
        )));
    }
    let ctx = rec.ctx;
    let delta = glu.map_or(0, |g| g.1);
    let mut cfg = cfg.fit(ctx).for_x(io.x_offset, w.cols).for_w(w.ty, w.cols);
    cfg.x_vec4 &= io.x_stride.is_multiple_of(4)
        && delta.is_multiple_of(4)
        && matches!(prologue, Prologue::None);
    let pre = match prologue {
        Prologue::Norm(pre) => Some(pre),
        _ => None,
    };
    let split = match prologue {
        Prologue::Split(sx) => Some(sx),
        _ => None,
    };
    let key = match prologue {
        Prologue::Split(sx) => key_split(w.ty, cfg, w.cols, sx.partials.chunk)?,
        Prologue::Q8 => key(w.ty, cfg)?
            .define("XQ8", "")
            .define("XQ8_MEM", "")
            .define("XQW", format!("{}u", w.cols / 4))
            .define("XQS0", format!("{}u", w.cols / 16)),
        Prologue::Norm(pre) => {
            let add = pre.add.as_ref();
            key_prenorm(
                w.ty,
                cfg,
                w.cols,
                add.is_some(),
                add.is_some_and(|a| a.add_norm.is_some()),
            )?
        }
        Prologue::None => match glu {
            Some((_, _, act)) => {
                let rpw = cfg.rows_per_workgroup() as u64;
                let workgroups: u64 = w.parts.iter().map(|p| p.rows.div_ceil(rpw)).sum();
                // (An epilogue's workgroup sum takes one f32 an invocation beside X.)
                let extra = if epi.is_some() {
                    cfg.workgroup_size as u64 * 4
                } else {
                    0
                };
                if glu_prologue_fits_with(ctx, cfg, w.cols, workgroups * n_tokens as u64, extra) {
                    key_glu_prologue(w.ty, cfg, act, w.cols)?
                } else {
                    key_glu(w.ty, cfg, Some(act))?
                }
            }
            None => key(w.ty, cfg)?,
        },
    };
    let from_memory = matches!(prologue, Prologue::Q8);
    let key = if cfg.x_q8 && xq8_kernel(cfg, w.ty) && n_tokens == 1 && !from_memory {
        let x_wg = key.defines.iter().any(|(k, _)| k == "X_WG");
        let wg_sum = epi.is_some() || matches!(prologue, Prologue::Norm(_));
        if xq8_fits(ctx, cfg, w.ty, w.cols, x_wg, wg_sum) {
            key.define("XQ8", "")
                .define("XQW", format!("{}u", w.cols / 4))
        } else {
            key
        }
    } else {
        key
    };
    let key = match epi {
        Some(Epilogue::ResNorm(_)) => key.define("Y_RESNORM", ""),
        Some(Epilogue::NormScale(ns)) => {
            // Slots of the sums each invocation loads before its loop (the rest in a loop).
            let slots = (ns.count as u64)
                .div_ceil(cfg.workgroup_size as u64)
                .clamp(1, 4);
            key.define("Y_NORMSCALE", "")
                .define("NS_SLOTS", format!("{slots}u"))
        }
        None => key,
    };
    let pipe = ctx.pipeline(&key)?;
    let rpw = key_rows_per_workgroup(&pipe.key);
    let nt = pipe.key.define_u32("NT").unwrap_or(1);
    let too_big = |what: &str, v: u64| {
        Error::invalid(format!(
            "matmul {}: {what} = {v} does not fit in u32",
            w.name
        ))
    };
    let u32_of = |what: &str, v: u64| u32::try_from(v).map_err(|_| too_big(what, v));
    // The last element each binding is indexed at must fit the shader's u32 arithmetic.
    u32_of("x end", io.x_offset + delta + n_tokens as u64 * io.x_stride)?;
    u32_of("y end", io.y_offset + n_tokens as u64 * io.y_stride)?;
    let label = pipe.key.label();
    let mut ss_offset = 0u64;
    for part in &w.parts {
        if part.rows == 0 {
            continue;
        }
        let row_groups = part.rows.div_ceil(rpw as u64);
        let groups = row_groups * (n_tokens as u64).div_ceil(nt as u64);
        let grid = grid_2d(groups, ctx.limits.max_compute_workgroups_per_dimension)?;
        let params = MatmulParams {
            rows: u32_of("rows", part.rows)?,
            cols: u32_of("cols", w.cols)?,
            row_words: u32_of("row words", w.row_bytes / 4)?,
            units: u32_of("units", units_per_row(w.ty, w.cols))?,
            n_tokens,
            x_offset: u32_of("x offset", io.x_offset)?,
            x_stride: u32_of("x stride", io.x_stride)?,
            y_offset: u32_of("y offset", io.y_offset + part.row_start)?,
            y_stride: u32_of("y stride", io.y_stride)?,
            row_groups: u32_of("row groups", row_groups)?,
            xu_delta: u32_of("up delta", delta)?,
            pre_eps: match epi {
                Some(Epilogue::NormScale(ns)) => ns.eps,
                _ => pre.map_or(0.0, |p| p.eps),
            },
            pre_scale: match epi {
                Some(Epilogue::ResNorm(rn)) => rn.scale,
                _ => pre.and_then(|p| p.add.as_ref()).map_or(0.0, |a| a.scale),
            },
            ss_offset: u32_of("sums of squares", ss_offset)?,
            ss_count: match epi {
                Some(Epilogue::NormScale(ns)) => ns.count,
                _ => 0,
            },
            sp_nv: split.map_or(0, |sx| sx.partials.head_dim / 4),
            sp_chunks: split.map_or(0, |sx| sx.partials.n_chunks),
            sp_window: split.map_or(0, |sx| sx.partials.window),
            sp_pos0: split.map_or(0, |sx| sx.partials.pos0),
        };
        ss_offset += row_groups; // one sum of squares a workgroup (Y_RESNORM)
        let ubuf = rec.uniform(&label, &params);
        let mut entries = vec![
            buffer_entry(0, &ubuf),
            buffer_entry(1, &part.buffer),
            buffer_entry(3, io.y),
        ];
        match split {
            // (X comes from the partials: the shader declares no X binding it uses.)
            Some(sx) => entries.extend([buffer_entry(13, sx.scratch), buffer_entry(14, sx.step)]),
            // (The quantized X, bound as its words and as its blocks' scales.)
            None if from_memory => entries.extend([buffer_entry(15, io.x), buffer_entry(16, io.x)]),
            None => entries.push(buffer_entry(2, io.x)),
        }
        if let Some((up, _, _)) = glu {
            entries.push(buffer_entry(4, up));
        }
        if let Some(pre) = pre {
            let mut extra: Vec<(u32, &wgpu::Buffer)> = vec![(6, &pre.w.parts[0].buffer)];
            if let Some(a) = &pre.add {
                extra.extend([(5, a.add), (8, a.out)]);
                if let Some(n) = a.add_norm {
                    extra.push((7, &n.parts[0].buffer));
                }
            }
            entries.extend(
                extra
                    .into_iter()
                    .map(|(binding, b)| buffer_entry(binding, b)),
            );
        }
        let extra: Vec<(u32, &wgpu::Buffer)> = match epi {
            Some(Epilogue::ResNorm(rn)) => {
                vec![(9, &rn.w.parts[0].buffer), (10, rn.h), (11, rn.ss)]
            }
            Some(Epilogue::NormScale(ns)) => vec![(12, ns.ss)],
            None => vec![],
        };
        entries.extend(
            extra
                .into_iter()
                .map(|(binding, b)| buffer_entry(binding, b)),
        );
        rec.push("matmul", &pipe, &entries, grid);
    }
    Ok(ss_offset)
}
