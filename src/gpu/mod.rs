//! The GPU core: one code path for native wgpu and browser WebGPU.
//!
//! - [`context`]: adapter + device with requested limits, carried as [`GpuLimits`].
//! - [`dispatch`]: the 2-D workgroup grid (more than 65535 workgroups under browser limits).
//! - [`knob`]: the bench knobs (environment overrides of kernel shapes, native builds only).
//! - [`preprocess`]: the WGSL preprocessor (`#include`, `#define`, `#ifdef` ...).
//! - [`shaders`]: every `.wgsl` / `.tmpl` in `shaders/`, embedded so the wasm build needs no files.
//! - [`pipeline`]: compute pipelines cached by shader + defines, with the dispatch decisions.
//! - [`plan`]: prepared dispatches (built once, recorded many times) and the per-step buffer.
//! - [`readback`]: the one async readback used on both targets.

pub mod context;
pub mod dispatch;
pub mod knob;
pub mod pipeline;
pub mod plan;
pub mod preprocess;
pub mod profile;
pub mod readback;
pub mod shaders;
pub mod tensor;

pub use context::{GpuContext, GpuLimits, LimitRequest};
pub use dispatch::grid_2d;
pub use pipeline::{CachedPipeline, PipelineKey};
pub use plan::{buffer_entry, entry, Dispatch, Prepared, Recorder, Step, StepState};
pub use readback::read_buffer;
pub use tensor::{GpuTensor, TensorPart};
