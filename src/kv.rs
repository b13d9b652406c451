//! The f32 KV cache (time-major, one K and one V buffer per layer) and its context shift.
//!
//! Shape of each buffer: `(n_ctx, n_kv_heads, head_dim)` f32. `n_past` cells are in use. A shift
//! drops cells `[n_keep, n_keep + n_discard)`: retained K cells are re-rotated by `R(-n_discard)`
//! (`kv_shift.wgsl`) into a scratch buffer and copied back; V cells move through the same
//! scratch with two buffer copies (WebGPU forbids a copy within one buffer). Nothing is
//! recomputed.
//!
//! Short-convolution layers (LFM2) keep no K/V: they keep `B * x` of every position, `(n_ctx,
//! n_embd)` f32 ([`KvCache::with_conv_rows`]), which a shift moves like V cells. The conv state
//! after any prefix is then its last `l_cache - 1` rows: rewinds and chat-turn reuse stay exact,
//! and a shift keeps the state of the tokens it keeps (docs/architecture.md, decision 13).
//!
//! Gated delta-net layers (Qwen3.5) keep no K/V either: they keep a recurrent state of fixed size
//! ([`KvCache::with_recurrent`]), a rolling conv state of the last `d_conv - 1` inputs and an
//! `S x S` matrix per value head, which the forward pass advances. The state describes one
//! position ([`KvCache::recurrent_at`]): a step may continue from there or start over at 0, and
//! after a rewind the tokens must be evaluated again from the start. A shift keeps the state.

use crate::error::{Error, ErrorCode, Result};
use crate::gpu::GpuContext;
use crate::ops::kv_shift::{self, KvShiftParams};
use crate::rope::RopeConfig;

/// How to build a cache.
#[derive(Clone, Debug)]
pub struct KvCacheConfig {
    pub n_ctx: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    /// One rope per layer (Gemma 3's local and global layers differ in `freq_base`).
    pub layer_ropes: Vec<RopeConfig>,
    /// Workgroup size of the shift kernel; `None` picks 256 within the device's limits.
    pub shift_workgroup_size: Option<u32>,
    /// Cap on scratch cells (the shift then runs in chunks); `None` sizes it to one layer,
    /// within the binding limit.
    pub max_scratch_cells: Option<u32>,
}

struct LayerKv {
    k: wgpu::Buffer,
    v: wgpu::Buffer,
}

/// What one shift did, for stats and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShiftStats {
    pub retained: u32,
    pub chunks: u32,
    /// Largest workgroup count of one dispatch (above 65535 means the 2-D grid was used).
    pub max_workgroups: u64,
}

pub struct KvCache {
    cfg: KvCacheConfig,
    layers: Vec<LayerKv>,
    scratch: wgpu::Buffer,
    scratch_cells: u32,
    workgroup_size: u32,
    n_past: u32,
    /// Per layer: the conv rows of a short-convolution layer, `(n_ctx, conv_width)` f32.
    conv: Vec<Option<wgpu::Buffer>>,
    conv_width: u32,
    /// Per layer: the recurrent state of a gated delta-net layer.
    recurrent: Vec<Option<RecurrentState>>,
    /// The position the recurrent states describe (the tokens they have seen).
    recurrent_at: u32,
}

/// A copy of every recurrent layer's state after `pos` tokens ([`KvCache::checkpoint`]): a
/// session restores it to continue from `pos` after a rewind, evaluating again only the tokens
/// after it.
pub struct RecurrentCheckpoint {
    pub pos: u32,
    /// Per recurrent layer, in layer order: `(conv, delta)`.
    states: Vec<(wgpu::Buffer, wgpu::Buffer)>,
}

/// The state of one gated delta-net layer.
pub struct RecurrentState {
    /// `(d_conv - 1, channels)` f32: the conv's last inputs, oldest first.
    pub conv: wgpu::Buffer,
    /// `(n_v_heads, S, S)` f32: the delta rule's state, row j of a head = column j of S.
    pub delta: wgpu::Buffer,
}

impl KvCache {
    pub fn new(ctx: &GpuContext, cfg: KvCacheConfig) -> Result<Self> {
        Self::with_conv_rows(ctx, cfg, &[], 0)
    }

    /// A cache whose layers flagged in `conv_layers` are short-convolution layers (LFM2): each
    /// keeps `(n_ctx, width)` f32 conv rows instead of K and V (which are then a placeholder that
    /// is never bound). An empty `conv_layers` is [`KvCache::new`].
    pub fn with_conv_rows(
        ctx: &GpuContext,
        cfg: KvCacheConfig,
        conv_layers: &[bool],
        width: u32,
    ) -> Result<Self> {
        if !conv_layers.is_empty() && (conv_layers.len() != cfg.layer_ropes.len() || width == 0) {
            return Err(Error::invalid(
                "conv rows: one flag per layer and a nonzero width",
            ));
        }
        let is_conv = |l: usize| conv_layers.get(l).copied().unwrap_or(false);
        if cfg.n_ctx == 0 || cfg.n_kv_heads == 0 || cfg.layer_ropes.is_empty() {
            return Err(Error::invalid(
                "a KV cache needs n_ctx, n_kv_heads and at least one layer",
            ));
        }
        for r in &cfg.layer_ropes {
            r.validate()?;
            if r.head_dim != cfg.head_dim as usize {
                return Err(Error::invalid(format!(
                    "rope head_dim {} != cache head_dim {}",
                    r.head_dim, cfg.head_dim
                )));
            }
        }
        let cell = cfg.n_kv_heads as u64 * cfg.head_dim as u64 * 4;
        let layer_bytes = cell * cfg.n_ctx as u64;
        let max = ctx.limits.max_binding();
        if layer_bytes > max {
            return Err(Error::new(
                ErrorCode::AdapterTooSmall,
                format!(
                    "a context of {} tokens needs {} MiB per layer of K cache, above this device's {} MiB binding limit; \
                     use a context of at most {} tokens",
                    cfg.n_ctx,
                    layer_bytes >> 20,
                    max >> 20,
                    max / cell
                ),
            ));
        }
        let mut scratch_cells = cfg.n_ctx;
        if let Some(c) = cfg.max_scratch_cells {
            scratch_cells = scratch_cells.min(c.max(1));
        }
        let workgroup_size = ctx
            .limits
            .workgroup_size(cfg.shift_workgroup_size.unwrap_or(256));
        let mut layers = Vec::with_capacity(cfg.layer_ropes.len());
        let mut conv = Vec::with_capacity(cfg.layer_ropes.len());
        let row = width as u64 * 4;
        let conv_bytes = row * cfg.n_ctx as u64;
        if conv_layers.iter().any(|&c| c) && conv_bytes > max {
            return Err(Error::new(
                ErrorCode::AdapterTooSmall,
                format!(
                    "a context of {} tokens needs {} MiB per convolution layer, above this device's {} MiB binding limit; use a context of at most {} tokens",
                    cfg.n_ctx,
                    conv_bytes >> 20,
                    max >> 20,
                    max / row
                ),
            ));
        }
        for l in 0..cfg.layer_ropes.len() {
            if is_conv(l) {
                layers.push(LayerKv {
                    k: ctx.empty_storage("kv.k (conv layer, unused)", 16)?,
                    v: ctx.empty_storage("kv.v (conv layer, unused)", 16)?,
                });
                conv.push(Some(
                    ctx.empty_storage(&format!("kv.conv[{l}]"), conv_bytes)?,
                ));
                continue;
            }
            conv.push(None);
            layers.push(LayerKv {
                k: ctx.empty_storage(&format!("kv.k[{l}]"), layer_bytes)?,
                v: ctx.empty_storage(&format!("kv.v[{l}]"), layer_bytes)?,
            });
        }
        // The shift moves conv rows through the scratch too.
        let scratch_row = if conv.iter().any(|c| c.is_some()) {
            cell.max(row)
        } else {
            cell
        };
        scratch_cells = scratch_cells.min((max / scratch_row) as u32).max(1);
        let scratch = ctx.empty_storage("kv.scratch", scratch_cells as u64 * scratch_row)?;
        Ok(KvCache {
            cfg,
            layers,
            scratch,
            scratch_cells,
            workgroup_size,
            n_past: 0,
            conv,
            conv_width: width,
            recurrent: Vec::new(),
            recurrent_at: 0,
        })
    }

    /// Give the layers flagged in `layers` a recurrent state (`conv_bytes` and `delta_bytes`
    /// each) in place of K and V, whose buffers become placeholders that are never bound.
    pub fn with_recurrent(
        mut self,
        ctx: &GpuContext,
        layers: &[bool],
        conv_bytes: u64,
        delta_bytes: u64,
    ) -> Result<Self> {
        if layers.len() != self.layers.len() || conv_bytes == 0 || delta_bytes == 0 {
            return Err(Error::invalid(
                "recurrent state: one flag per layer and nonzero sizes",
            ));
        }
        let max = ctx.limits.max_binding();
        if delta_bytes > max || conv_bytes > max {
            return Err(Error::new(
                ErrorCode::AdapterTooSmall,
                format!(
                    "a recurrent state of {} MiB per layer is above this device's {} MiB binding limit",
                    delta_bytes.max(conv_bytes) >> 20,
                    max >> 20
                ),
            ));
        }
        self.recurrent = Vec::with_capacity(layers.len());
        for (l, &r) in layers.iter().enumerate() {
            if !r {
                self.recurrent.push(None);
                continue;
            }
            self.layers[l] = LayerKv {
                k: ctx.empty_storage("kv.k (recurrent layer, unused)", 16)?,
                v: ctx.empty_storage("kv.v (recurrent layer, unused)", 16)?,
            };
            self.recurrent.push(Some(RecurrentState {
                conv: ctx.empty_storage(&format!("kv.conv_state[{l}]"), conv_bytes)?,
                delta: ctx.empty_storage(&format!("kv.delta_state[{l}]"), delta_bytes)?,
            }));
        }
        Ok(self)
    }

    /// The recurrent state of layer `layer`, if it is a gated delta-net layer.
    pub fn recurrent(&self, layer: usize) -> Option<&RecurrentState> {
        self.recurrent.get(layer).and_then(|r| r.as_ref())
    }

    /// Whether any layer keeps a recurrent state.
    pub fn has_recurrent(&self) -> bool {
        self.recurrent.iter().any(|r| r.is_some())
    }

    /// The position the recurrent states describe: the tokens they have seen.
    pub fn recurrent_at(&self) -> u32 {
        self.recurrent_at
    }

    /// Mark the recurrent states as describing no position (a pass ran that must not count): the
    /// next step starts from a checkpoint or position 0.
    pub fn invalidate_recurrent(&mut self) {
        self.recurrent_at = u32::MAX;
    }

    /// Copy every recurrent state (they describe `n_past` tokens) into `reuse`'s buffers, or new
    /// ones. Encodes and submits one command buffer, after the passes already submitted.
    pub fn checkpoint(
        &self,
        ctx: &GpuContext,
        reuse: Option<RecurrentCheckpoint>,
    ) -> Result<RecurrentCheckpoint> {
        if self.recurrent_at != self.n_past {
            return Err(Error::internal(format!(
                "checkpoint at {} of recurrent states at {}",
                self.n_past, self.recurrent_at
            )));
        }
        let mut states = reuse.map(|c| c.states).unwrap_or_default();
        let layers: Vec<&RecurrentState> = self.recurrent.iter().flatten().collect();
        if states.len() != layers.len() {
            states = layers
                .iter()
                .map(|r| {
                    Ok((
                        ctx.empty_storage("checkpoint conv state", r.conv.size())?,
                        ctx.empty_storage("checkpoint delta state", r.delta.size())?,
                    ))
                })
                .collect::<Result<_>>()?;
        }
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        for (r, (c, d)) in layers.iter().zip(&states) {
            enc.copy_buffer_to_buffer(&r.conv, 0, c, 0, r.conv.size());
            enc.copy_buffer_to_buffer(&r.delta, 0, d, 0, r.delta.size());
        }
        ctx.submit([enc.finish()]);
        Ok(RecurrentCheckpoint {
            pos: self.n_past,
            states,
        })
    }

    /// Put a checkpoint's states back: they describe `cp.pos` tokens (at most `n_past`; the
    /// caller evaluates the tokens after it again). Encodes and submits one command buffer.
    pub fn restore(&mut self, ctx: &GpuContext, cp: &RecurrentCheckpoint) -> Result<()> {
        let layers: Vec<&RecurrentState> = self.recurrent.iter().flatten().collect();
        if cp.pos > self.n_past || cp.states.len() != layers.len() {
            return Err(Error::internal(format!(
                "restore a checkpoint at {} into a cache of {} cells",
                cp.pos, self.n_past
            )));
        }
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        for (r, (c, d)) in layers.iter().zip(&cp.states) {
            enc.copy_buffer_to_buffer(c, 0, &r.conv, 0, r.conv.size());
            enc.copy_buffer_to_buffer(d, 0, &r.delta, 0, r.delta.size());
        }
        ctx.submit([enc.finish()]);
        self.recurrent_at = cp.pos;
        Ok(())
    }

    /// Whether a step may start at `pos0`: always without recurrent layers; with them, at 0 (the
    /// kernels start from a zero state) or where the states are.
    pub fn can_continue_at(&self, pos0: u32) -> bool {
        !self.has_recurrent() || pos0 == 0 || pos0 == self.recurrent_at
    }

    /// The conv rows of layer `layer`, `(n_ctx, width)` f32, if it is a short-convolution layer.
    pub fn conv_rows(&self, layer: usize) -> Option<&wgpu::Buffer> {
        self.conv.get(layer).and_then(|c| c.as_ref())
    }

    pub fn config(&self) -> &KvCacheConfig {
        &self.cfg
    }
    pub fn n_past(&self) -> u32 {
        self.n_past
    }
    pub fn n_ctx(&self) -> u32 {
        self.cfg.n_ctx
    }
    /// Bytes of one cell (all KV heads of one position).
    pub fn cell_bytes(&self) -> u64 {
        self.cfg.n_kv_heads as u64 * self.cfg.head_dim as u64 * 4
    }
    pub fn k(&self, layer: usize) -> &wgpu::Buffer {
        &self.layers[layer].k
    }
    pub fn v(&self, layer: usize) -> &wgpu::Buffer {
        &self.layers[layer].v
    }

    /// Mark `n` cells as used (the forward pass wrote them).
    pub fn advance(&mut self, n: u32) -> Result<()> {
        let to = self.n_past.checked_add(n).filter(|&t| t <= self.cfg.n_ctx);
        self.n_past = to.ok_or_else(|| {
            Error::new(
                ErrorCode::ContextFull,
                format!(
                    "{} + {n} tokens exceed the context of {}",
                    self.n_past, self.cfg.n_ctx
                ),
            )
        })?;
        // The step that wrote these cells advanced the recurrent states to the same position.
        self.recurrent_at = self.n_past;
        Ok(())
    }

    /// Forget the last `n` cells (their contents are overwritten when used again). The recurrent
    /// states stay where they were: see [`KvCache::can_continue_at`].
    pub fn rewind(&mut self, n: u32) -> Result<()> {
        self.n_past = self
            .n_past
            .checked_sub(n)
            .ok_or_else(|| Error::internal(format!("rewind {n} cells of {}", self.n_past)))?;
        Ok(())
    }

    /// Forget every cell.
    pub fn clear(&mut self) {
        self.n_past = 0;
        self.recurrent_at = 0;
    }

    /// Write K and V rows (`(cells, n_kv_heads, head_dim)` each) at `cell` of `layer`.
    pub fn write_cells(
        &self,
        ctx: &GpuContext,
        layer: usize,
        cell: u32,
        k: &[f32],
        v: &[f32],
    ) -> Result<()> {
        let cb = self.cell_bytes() as usize;
        let n = k.len() * 4 / cb;
        if k.len() != v.len()
            || !(k.len() * 4).is_multiple_of(cb)
            || cell as usize + n > self.cfg.n_ctx as usize
            || layer >= self.layers.len()
        {
            return Err(Error::invalid("write_cells: rows do not fit the cache"));
        }
        let off = cell as u64 * cb as u64;
        ctx.queue
            .write_buffer(&self.layers[layer].k, off, bytemuck::cast_slice(k));
        ctx.queue
            .write_buffer(&self.layers[layer].v, off, bytemuck::cast_slice(v));
        Ok(())
    }

    /// Drop cells `[n_keep, n_keep + n_discard)`, keep everything else at rebased positions.
    ///
    /// Encodes and submits one command buffer. After it, `n_past` is `n_past - n_discard`.
    pub fn shift(&mut self, ctx: &GpuContext, n_keep: u32, n_discard: u32) -> Result<ShiftStats> {
        let end = n_keep.checked_add(n_discard).filter(|&e| e <= self.n_past).ok_or_else(|| {
            Error::invalid(format!(
                "context shift: n_keep {n_keep} + n_discard {n_discard} is more than the {} cells in use",
                self.n_past
            ))
        })?;
        if n_discard == 0 {
            return Ok(ShiftStats::default());
        }
        let retained = self.n_past - end;
        let mut stats = ShiftStats {
            retained,
            ..Default::default()
        };
        let cell = self.cell_bytes();
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("kv shift"),
            });

        // One cos/sin table per distinct rope (layers sharing a rope share the table).
        let mut tables: Vec<(RopeConfig, wgpu::Buffer)> = Vec::new();
        for r in &self.cfg.layer_ropes {
            if !tables.iter().any(|(t, _)| t == r) {
                let mut tab = r.delta_table(-(n_discard as f64));
                if tab.is_empty() {
                    // n_rot 0 (a layer without rope): a binding cannot be empty; nothing reads it.
                    tab.push(Default::default());
                }
                let buf = ctx.storage_buffer("kv_shift cos/sin", bytemuck::cast_slice(&tab));
                tables.push((r.clone(), buf));
            }
        }

        let mut t0 = 0u32;
        while t0 < retained {
            let count = (retained - t0).min(self.scratch_cells);
            stats.chunks += 1;
            let bytes = count as u64 * cell;
            for (l, layer) in self.layers.iter().enumerate() {
                if self.recurrent(l).is_some() {
                    // A recurrent state has no cells: it is kept as it is (it drifts).
                    continue;
                }
                if let Some(rows) = self.conv_rows(l) {
                    // Conv rows move with their tokens, like V cells.
                    let row = self.conv_width as u64 * 4;
                    let (src, dst) = ((end + t0) as u64 * row, (n_keep + t0) as u64 * row);
                    enc.copy_buffer_to_buffer(rows, src, &self.scratch, 0, count as u64 * row);
                    enc.copy_buffer_to_buffer(&self.scratch, 0, rows, dst, count as u64 * row);
                    continue;
                }
                let rope = &self.cfg.layer_ropes[l];
                let params = KvShiftParams {
                    n_keep,
                    shift: n_discard,
                    t_begin: t0,
                    count,
                    n_kv_heads: self.cfg.n_kv_heads,
                    head_dim: self.cfg.head_dim,
                    n_rot: rope.n_rot as u32,
                    rope_type: rope.rope_type as u32,
                };
                let pbuf = ctx.uniform_buffer("kv_shift params", &params);
                let table = &tables
                    .iter()
                    .find(|(t, _)| t == rope)
                    .expect("table built above")
                    .1;
                let groups = kv_shift::encode(
                    ctx,
                    &mut enc,
                    self.workgroup_size,
                    &pbuf,
                    &params,
                    &layer.k,
                    &self.scratch,
                    table,
                )?;
                stats.max_workgroups = stats.max_workgroups.max(groups);
                let dst = (n_keep + t0) as u64 * cell;
                let src = (end + t0) as u64 * cell;
                enc.copy_buffer_to_buffer(&self.scratch, 0, &layer.k, dst, bytes);
                enc.copy_buffer_to_buffer(&layer.v, src, &self.scratch, 0, bytes);
                enc.copy_buffer_to_buffer(&self.scratch, 0, &layer.v, dst, bytes);
            }
            t0 += count;
        }
        ctx.submit([enc.finish()]);
        if self.recurrent_at == self.n_past {
            self.recurrent_at -= n_discard;
        } else {
            // States of a later position (rewound cells): now of no position this cache holds.
            self.recurrent_at = u32::MAX;
        }
        self.n_past -= n_discard;
        Ok(stats)
    }
}
