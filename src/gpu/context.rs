//! Adapter and device on both targets, with the limits the work asks for.
//!
//! Limits are data: [`GpuContext::new`] asks the adapter for what a [`LimitRequest`] wants (up
//! to what the adapter offers), fails with `ADAPTER_TOO_SMALL` when the adapter is below the
//! minimum, and carries what the device granted as [`GpuLimits`]. No kernel assumes a number.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::pipeline::{CachedPipeline, PipelineCache, PipelineKey};
use crate::error::{Error, ErrorCode, Result};

/// What the caller needs (`min_*`: fail below it) and would like (`want_*`: ask up to it).
#[derive(Clone, Debug)]
pub struct LimitRequest {
    pub min_storage_binding: u64,
    pub want_storage_binding: u64,
    pub min_buffer_size: u64,
    pub want_buffer_size: u64,
    pub min_storage_buffers_per_stage: u32,
}

impl Default for LimitRequest {
    /// The WebGPU defaults as minimum; ask for as much binding/buffer size as the adapter has
    /// (a model's largest tensors then need fewer splits).
    fn default() -> Self {
        LimitRequest {
            min_storage_binding: 128 << 20,
            want_storage_binding: u64::MAX,
            min_buffer_size: 256 << 20,
            want_buffer_size: u64::MAX,
            min_storage_buffers_per_stage: 8,
        }
    }
}

impl LimitRequest {
    /// Exactly the WebGPU defaults: what a page gets without asking (for tests of small adapters).
    pub fn webgpu_defaults() -> Self {
        LimitRequest {
            min_storage_binding: 128 << 20,
            want_storage_binding: 128 << 20,
            min_buffer_size: 256 << 20,
            want_buffer_size: 256 << 20,
            min_storage_buffers_per_stage: 8,
        }
    }
}

/// The limits the device granted: the only place kernels and planners read limits from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuLimits {
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_workgroups_per_dimension: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub max_compute_workgroup_size_x: u32,
    pub max_compute_workgroup_storage_size: u32,
    pub max_storage_buffers_per_shader_stage: u32,
    pub min_storage_buffer_offset_alignment: u32,
    pub max_uniform_buffer_binding_size: u64,
}

impl GpuLimits {
    /// Why a workgroup of `threads` invocations holding `storage` bytes of workgroup memory
    /// cannot run on this device (its tile checks share it), or `None` when it can.
    pub fn workgroup_misfit(&self, threads: u32, storage: u32) -> Option<String> {
        let max_threads = self
            .max_compute_invocations_per_workgroup
            .min(self.max_compute_workgroup_size_x);
        if threads > max_threads {
            return Some(format!(
                "{threads} threads exceed this device's {max_threads} invocations per workgroup"
            ));
        }
        if storage > self.max_compute_workgroup_storage_size {
            return Some(format!(
                "{storage} bytes of workgroup memory exceed this device's {}",
                self.max_compute_workgroup_storage_size
            ));
        }
        None
    }

    pub fn from_wgpu(l: &wgpu::Limits) -> Self {
        GpuLimits {
            max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
            max_buffer_size: l.max_buffer_size,
            max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
            max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
            max_compute_workgroup_size_x: l.max_compute_workgroup_size_x,
            max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
            max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
            min_storage_buffer_offset_alignment: l.min_storage_buffer_offset_alignment,
            max_uniform_buffer_binding_size: l.max_uniform_buffer_binding_size,
        }
    }

    /// The largest storage binding usable for one buffer (binding and buffer limits both apply).
    pub fn max_binding(&self) -> u64 {
        self.max_storage_buffer_binding_size
            .min(self.max_buffer_size)
    }

    /// The largest 1-D workgroup size both the x limit and the invocation limit allow, capped.
    pub fn workgroup_size(&self, want: u32) -> u32 {
        want.min(self.max_compute_invocations_per_workgroup)
            .min(self.max_compute_workgroup_size_x)
            .max(1)
    }
}

/// What we know of the adapter, for `info()` and test logs.
#[derive(Clone, Debug, Default)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    /// The range of subgroup sizes the adapter may use (wgpu's defaults, 4 and 128, when unknown).
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
}

/// The device, its queue, the granted limits and the pipeline cache. Everything GPU hangs off it.
pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub limits: GpuLimits,
    /// The adapter's own maxima (what could have been asked for).
    pub adapter_limits: GpuLimits,
    pub adapter: AdapterSummary,
    pub features: wgpu::Features,
    /// Whether the device multiplies cooperative matrices of 16 x 16 x 16 with f16 inputs and
    /// an f32 accumulator on subgroups of 32 (`ops::gemm_coop`; natively only, where offered).
    pub coop_f16: bool,
    pipelines: PipelineCache,
    /// Errors reported by wgpu outside any scope (validation, out of memory), surfaced at the
    /// next [`GpuContext::check_errors`] instead of a panic.
    errors: Arc<Mutex<Vec<String>>>,
    lost: Arc<Mutex<Option<String>>>,
    counters: Counters,
    zero_step: OnceLock<wgpu::Buffer>,
}

impl GpuContext {
    /// Open the best adapter and a device with the requested limits.
    pub async fn new(req: &LimitRequest) -> Result<Self> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::from_env()
                .unwrap_or(wgpu::Backends::PRIMARY | wgpu::Backends::BROWSER_WEBGPU),
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|e| {
                Error::new(
                    ErrorCode::NoWebgpu,
                    format!(
                        "no GPU adapter found ({e}). In a browser, use one with WebGPU enabled (Chrome/Edge 113+, \
                         or Chromium on Linux with --enable-unsafe-webgpu); natively, install a Vulkan driver \
                         (Mesa's lavapipe works on any CPU)"
                    ),
                )
            })?;
        let info = adapter.get_info();
        let summary = AdapterSummary {
            name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: format!("{} {}", info.driver, info.driver_info)
                .trim()
                .to_string(),
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
        };
        // Subgroup operations, natively only where offered (the matmul reduction uses them when
        // present). Not in the browser: there WGSL would need `enable subgroups;`, which the
        // native WGSL front end rejects, and one source serves both.
        // Timestamp queries wherever offered (natively also inside passes): `cera bench
        // --profile` times each dispatch with them.
        let wanted = wgpu::Features::TIMESTAMP_QUERY
            | if cfg!(target_arch = "wasm32") {
                wgpu::Features::empty()
            } else {
                wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
            };
        // Cooperative matrices (tensor cores) for the prefill GEMM, natively where the adapter
        // multiplies 16 x 16 f16 fragments into f32 on subgroups of exactly 32 (wgpu's feature
        // is experimental; `CERA_GEMM_COOP=0` leaves it off).
        let coop_f16 = !cfg!(target_arch = "wasm32")
            && crate::gpu::knob::knob("CERA_GEMM_COOP")
                .as_deref()
                .map(str::trim)
                != Some("0")
            && adapter.features().contains(
                wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
                    | wgpu::Features::SHADER_F16
                    | wgpu::Features::SUBGROUP,
            )
            && info.subgroup_min_size == 32
            && info.subgroup_max_size == 32
            && adapter.cooperative_matrix_properties().iter().any(|c| {
                (c.m_size, c.n_size, c.k_size) == (16, 16, 16)
                    && c.ab_type == wgpu::CooperativeScalarType::F16
                    && c.cr_type == wgpu::CooperativeScalarType::F32
            });
        let wanted = wanted
            | if coop_f16 {
                wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16
            } else {
                wgpu::Features::empty()
            };
        let features = adapter.features() & wanted;
        let offered = adapter.limits();
        let required = Self::required_limits(req, &offered, &summary.name)?;
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("cera-web"),
                required_features: features,
                required_limits: required,
                // SAFETY: wgpu's experimental features may have bugs; the one asked for here is
                // only requested where the adapter reports the fragment shape the kernel uses,
                // and one knob turns it off.
                experimental_features: if coop_f16 {
                    unsafe { wgpu::ExperimentalFeatures::enabled() }
                } else {
                    wgpu::ExperimentalFeatures::disabled()
                },
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| {
                Error::new(
                    ErrorCode::AdapterTooSmall,
                    format!("the GPU refused the device request: {e}"),
                )
            })?;
        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        let lost = Arc::new(Mutex::new(None));
        let lost_sink = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            if let Ok(mut l) = lost_sink.lock() {
                *l = Some(format!("{reason:?}: {msg}"));
            }
        });
        Ok(GpuContext {
            limits: GpuLimits::from_wgpu(&device.limits()),
            adapter_limits: GpuLimits::from_wgpu(&offered),
            adapter: summary,
            features: device.features(),
            coop_f16: coop_f16
                && device.features().contains(
                    wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
                        | wgpu::Features::SHADER_F16
                        | wgpu::Features::SUBGROUP,
                ),
            device,
            queue,
            // CPU adapters keep every kernel's guards (trusted kernels measured no faster on
            // lavapipe); `CERA_CHECKED=1` natively keeps them everywhere.
            pipelines: PipelineCache::new(
                info.device_type == wgpu::DeviceType::Cpu
                    || crate::gpu::knob::knob_on("CERA_CHECKED"),
            ),
            errors,
            lost,
            counters: Counters::default(),
            zero_step: OnceLock::new(),
        })
    }

    /// Natively, [`GpuContext::new`] without an executor.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new_blocking(req: &LimitRequest) -> Result<Self> {
        pollster::block_on(Self::new(req))
    }

    /// WebGPU defaults, raised to what `req` wants where the adapter offers it.
    fn required_limits(
        req: &LimitRequest,
        offered: &wgpu::Limits,
        adapter: &str,
    ) -> Result<wgpu::Limits> {
        let too_small = |what: &str, have: u64, need: u64| {
            Error::new(
                ErrorCode::AdapterTooSmall,
                format!("adapter \"{adapter}\" offers {what} = {have}, below the {need} this needs; use a smaller model or context, or another GPU"),
            )
        };
        if offered.max_storage_buffer_binding_size < req.min_storage_binding {
            return Err(too_small(
                "maxStorageBufferBindingSize",
                offered.max_storage_buffer_binding_size,
                req.min_storage_binding,
            ));
        }
        if offered.max_buffer_size < req.min_buffer_size {
            return Err(too_small(
                "maxBufferSize",
                offered.max_buffer_size,
                req.min_buffer_size,
            ));
        }
        if offered.max_storage_buffers_per_shader_stage < req.min_storage_buffers_per_stage {
            return Err(too_small(
                "maxStorageBuffersPerShaderStage",
                offered.max_storage_buffers_per_shader_stage as u64,
                req.min_storage_buffers_per_stage as u64,
            ));
        }
        // Start from the WebGPU defaults (or the downlevel ones on a weaker adapter) ...
        let mut l = wgpu::Limits::defaults();
        if !l.check_limits(offered) {
            l = wgpu::Limits::downlevel_defaults();
        }
        // ... and raise what the work wants, never above the adapter.
        l.max_storage_buffer_binding_size = req
            .want_storage_binding
            .min(offered.max_storage_buffer_binding_size)
            .max(req.min_storage_binding);
        l.max_buffer_size = req
            .want_buffer_size
            .min(offered.max_buffer_size)
            .max(req.min_buffer_size)
            .max(
                l.max_storage_buffer_binding_size
                    .min(offered.max_buffer_size),
            );
        l.max_storage_buffers_per_shader_stage = offered
            .max_storage_buffers_per_shader_stage
            .min(16)
            .max(req.min_storage_buffers_per_stage);
        l.max_compute_invocations_per_workgroup =
            offered.max_compute_invocations_per_workgroup.min(1024).max(
                l.max_compute_invocations_per_workgroup
                    .min(offered.max_compute_invocations_per_workgroup),
            );
        l.max_compute_workgroup_size_x = offered.max_compute_workgroup_size_x.min(1024).max(
            l.max_compute_workgroup_size_x
                .min(offered.max_compute_workgroup_size_x),
        );
        l.max_compute_workgroup_storage_size = offered
            .max_compute_workgroup_storage_size
            .min(32 << 10)
            .max(
                l.max_compute_workgroup_storage_size
                    .min(offered.max_compute_workgroup_storage_size),
            );
        l.max_compute_workgroups_per_dimension = offered.max_compute_workgroups_per_dimension;
        Ok(l)
    }

    /// The compiled pipeline for `key` (built once, then cached).
    pub fn pipeline(&self, key: &PipelineKey) -> Result<Arc<CachedPipeline>> {
        self.pipelines.get(&self.device, key)
    }

    /// Fail with the first GPU error reported since the last check (device loss first).
    pub fn check_errors(&self) -> Result<()> {
        if let Some(msg) = self.lost.lock().ok().and_then(|l| l.clone()) {
            return Err(Error::new(
                ErrorCode::DeviceLost,
                format!("the GPU device was lost ({msg}); reload the model"),
            ));
        }
        let first = self.errors.lock().ok().and_then(|mut v| {
            if v.is_empty() {
                None
            } else {
                Some(v.remove(0))
            }
        });
        match first {
            Some(msg) => Err(Error::new(
                ErrorCode::DeviceLost,
                format!("a GPU operation failed: {msg}"),
            )),
            None => Ok(()),
        }
    }

    /// A storage buffer holding `data` (usable as copy source and destination).
    pub fn storage_buffer(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        self.buffer_with(
            label,
            data,
            wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
        )
    }

    /// A buffer created holding `contents` (its size rounded up to 4 bytes, the tail zeroed).
    ///
    /// In the browser: mapped at creation, written, unmapped (no staging copy); a lost device
    /// still hands out a mapped range there. Natively wgpu panics when it cannot map a buffer
    /// made at creation, which it cannot on a lost device ("buffer is invalid"), so the contents go
    /// through the queue instead: on a lost device that is a reported error, which the next
    /// readback turns into `DEVICE_LOST`.
    fn buffer_with(&self, label: &str, contents: &[u8], usage: wgpu::BufferUsages) -> wgpu::Buffer {
        #[cfg(target_arch = "wasm32")]
        {
            use wgpu::util::DeviceExt;
            self.device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(label),
                    contents,
                    usage,
                })
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let size = (contents.len() as u64).div_ceil(4) * 4;
            let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: size.max(4),
                usage: usage | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            // write_buffer takes whole 4-byte words: the last partial word goes padded.
            let whole = contents.len() / 4 * 4;
            if whole > 0 {
                self.queue.write_buffer(&buffer, 0, &contents[..whole]);
            }
            if whole < contents.len() {
                let mut tail = [0u8; 4];
                tail[..contents.len() - whole].copy_from_slice(&contents[whole..]);
                self.queue.write_buffer(&buffer, whole as u64, &tail);
            }
            buffer
        }
    }

    /// A zeroed storage buffer of `size` bytes, checked against the granted limits.
    pub fn empty_storage(&self, label: &str, size: u64) -> Result<wgpu::Buffer> {
        if size > self.limits.max_buffer_size {
            return Err(Error::new(
                ErrorCode::AdapterTooSmall,
                format!(
                    "{label} needs {size} bytes, above this device's maxBufferSize {}",
                    self.limits.max_buffer_size
                ),
            ));
        }
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.max(4),
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }))
    }

    /// One params struct as a uniform binding of its own (one-off work: kv shift chunks).
    pub fn uniform_buffer<T: bytemuck::Pod>(&self, label: &str, value: &T) -> Uniform {
        Uniform::Own(self.uniform_buffer_owned(label, value))
    }

    /// A uniform buffer of its own, for params kept across submissions (never a frame slot).
    pub fn uniform_buffer_owned<T: bytemuck::Pod>(&self, label: &str, value: &T) -> wgpu::Buffer {
        self.buffer_with(
            label,
            bytemuck::bytes_of(value),
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        )
    }

    /// Submit command buffers (counted: `cera bench` reports submissions per token).
    pub fn submit<I: IntoIterator<Item = wgpu::CommandBuffer>>(&self, cmds: I) {
        self.counters.submits.fetch_add(1, Ordering::Relaxed);
        self.queue.submit(cmds);
    }

    /// Count compute passes and dispatches recorded (for the per-token figures of `cera bench`).
    pub fn count_recorded(&self, passes: u64, dispatches: u64) {
        self.counters.passes.fetch_add(passes, Ordering::Relaxed);
        self.counters
            .dispatches
            .fetch_add(dispatches, Ordering::Relaxed);
    }

    /// Submissions, passes and dispatches so far.
    pub fn counts(&self) -> Counts {
        Counts {
            submits: self.counters.submits.load(Ordering::Relaxed),
            passes: self.counters.passes.load(Ordering::Relaxed),
            dispatches: self.counters.dispatches.load(Ordering::Relaxed),
        }
    }

    /// A [`super::StepState`] buffer of zeros, for one-off dispatches of position-dependent
    /// kernels (whose params then carry the positions themselves).
    pub fn zero_step(&self) -> &wgpu::Buffer {
        self.zero_step
            .get_or_init(|| self.storage_buffer("zero step", &[0u8; 16]))
    }
}

/// Running totals of GPU work submitted through a context.
#[derive(Default)]
struct Counters {
    submits: AtomicU64,
    passes: AtomicU64,
    dispatches: AtomicU64,
}

/// A snapshot of [`GpuContext::counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub submits: u64,
    pub passes: u64,
    pub dispatches: u64,
}

impl Counts {
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            submits: self.submits - earlier.submits,
            passes: self.passes - earlier.passes,
            dispatches: self.dispatches - earlier.dispatches,
        }
    }
}

/// A uniform binding.
pub enum Uniform {
    Own(wgpu::Buffer),
}

impl Uniform {
    pub fn as_entire_binding(&self) -> wgpu::BindingResource<'_> {
        match self {
            Uniform::Own(b) => b.as_entire_binding(),
        }
    }
}
