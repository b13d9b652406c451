//! Compute pipelines cached by shader + entry + defines, with the dispatch decisions beside them.
//!
//! A kernel's workgroup size is a decision made once, in Rust: [`PipelineKey::workgroup_size`]
//! sets the `WG_SIZE` define the shader's `@workgroup_size` reads *and* records it in
//! [`Decisions`], which the dispatch code reads back. Shader and dispatch cannot disagree.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::shaders;
use crate::error::{Error, Result};

/// What identifies a pipeline variant. Defines are kept sorted so equal sets hash equally.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    pub shader: &'static str,
    pub entry: &'static str,
    pub defines: Vec<(String, String)>,
    /// Compile without naga's loop bounding ([`PipelineKey::unbounded_loops`]).
    pub unbounded_loops: bool,
    /// Compile without index clamping and workgroup-memory zeroing ([`PipelineKey::trusted`]).
    pub trusted: bool,
}

/// Choices the dispatch must agree with, stored with the compiled pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decisions {
    /// Invocations along x per workgroup (`WG_SIZE` in the shader).
    pub workgroup_size: u32,
}

impl PipelineKey {
    pub fn new(shader: &'static str, entry: &'static str) -> Self {
        PipelineKey {
            shader,
            entry,
            defines: Vec::new(),
            unbounded_loops: false,
            trusted: false,
        }
    }

    /// Compile natively without naga's loop bounding: the counter and branch naga adds to every
    /// loop (a guard against infinite loops in untrusted shaders) kept the H200's driver from
    /// scheduling the GEMV's unrolled loads together. Measured there (wgpu 30, Vulkan): the 8B
    /// Q8_0 decode 95 -> 152 tok/s, the test model's 588 -> 743; with every kernel unbounded the
    /// test model's prefill fell 19.0k -> 13.0k tok/s, so only kernels that measured faster ask.
    /// Only for kernels whose every loop is bounded by its params or constants.
    pub fn unbounded_loops(mut self) -> Self {
        self.unbounded_loops = true;
        self
    }

    /// Compile natively without any of naga's guards: no index clamping (each index `i` of a
    /// function or workgroup array becomes `min(i, len - 1)`, and each integer division is
    /// guarded), no loop bounding (as [`PipelineKey::unbounded_loops`]), and no zeroing of
    /// workgroup memory before the first instruction. Buffer accesses stay bounded by the
    /// device's robust buffer access; a browser compiles the WGSL with all its own checks
    /// whatever the key says, and CPU adapters (lavapipe, SwiftShader), where it measured no
    /// faster, keep the guards ([`PipelineCache::new`]). Measured on an H100 (wgpu 30, Vulkan):
    /// the cooperative GEMM of an 8B Q4_K prefill 120 -> 49 ms (1,960 -> 4,200 tok/s; bounding
    /// off alone 3,080, clamping off alone 2,140: unbounded loops get unrolled, and a private
    /// array indexed by an unrolled counter then stays in registers only without the clamps);
    /// the Gemma 3 270M twin's prefill 30.8k -> 46.5k tok/s with the other GEMMs and attention
    /// so. Only for kernels whose every array index is in range by construction, whose loops
    /// are bounded by their params or constants, which write workgroup memory before reading it
    /// and never divide by zero (docs/dispatch.md, "Trusted kernels").
    pub fn trusted(mut self) -> Self {
        self.trusted = true;
        self
    }

    /// Add a define (flag when `value` is empty).
    pub fn define(mut self, name: &str, value: impl ToString) -> Self {
        self.defines.retain(|(k, _)| k != name);
        self.defines.push((name.to_string(), value.to_string()));
        self.defines.sort();
        self
    }

    /// Set the workgroup size: the `WG_SIZE` define and the recorded decision, from one number.
    pub fn workgroup_size(self, n: u32) -> Self {
        self.define("WG_SIZE", format!("{n}u"))
    }

    /// A `u32` define read back (`"64u"` -> 64): the dispatch reads the shape the shader was
    /// built with. `None` when the key has no such define or it is not a number.
    pub fn define_u32(&self, name: &str) -> Option<u32> {
        self.defines
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.trim_end_matches('u').parse().ok())
    }

    /// [`PipelineKey::define_u32`] for a define the dispatch cannot go without.
    pub fn require_u32(&self, name: &str) -> Result<u32> {
        self.define_u32(name)
            .ok_or_else(|| Error::internal(format!("pipeline key {} has no {name}", self.label())))
    }

    pub fn decisions(&self) -> Decisions {
        Decisions {
            workgroup_size: self.define_u32("WG_SIZE").unwrap_or(1),
        }
    }

    /// A label naming the variant, for every wgpu object made from it.
    pub fn label(&self) -> String {
        let mut s = format!("{}::{}", self.shader, self.entry);
        for (k, v) in &self.defines {
            if v.is_empty() {
                s.push_str(&format!(" {k}"));
            } else {
                s.push_str(&format!(" {k}={v}"));
            }
        }
        s
    }
}

/// A compiled pipeline, its bind group layout (group 0) and the decisions it was built with.
pub struct CachedPipeline {
    pub key: PipelineKey,
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    pub decisions: Decisions,
}

#[derive(Default)]
pub struct PipelineCache {
    map: Mutex<HashMap<PipelineKey, Arc<CachedPipeline>>>,
    /// Every kernel keeps naga's guards, trusted keys too.
    guarded: bool,
}

impl PipelineCache {
    /// A cache for a device; `guarded` keeps naga's guards in every kernel ([`PipelineKey::trusted`]
    /// ignored): on CPU adapters, and natively with `CERA_CHECKED=1`.
    pub fn new(guarded: bool) -> Self {
        PipelineCache {
            map: Mutex::default(),
            guarded,
        }
    }

    pub fn get(&self, device: &wgpu::Device, key: &PipelineKey) -> Result<Arc<CachedPipeline>> {
        let mut map = self
            .map
            .lock()
            .map_err(|_| Error::internal("pipeline cache poisoned"))?;
        if let Some(p) = map.get(key) {
            return Ok(p.clone());
        }
        let src = shaders::expand(key.shader, &key.defines)?;
        let label = key.label();
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(src.source.into()),
        };
        // Every guard stays unless the key is trusted (and the cache is not guarded); loop
        // bounding also goes where the key asks (see `unbounded_loops`, `trusted`).
        // SAFETY: a key asks for either only for a kernel whose loops are all bounded by its
        // params or constants, the one condition `force_loop_bounding: false` puts on us, and
        // `trusted` only for one whose indices are in range by construction (see `trusted`).
        let trusted = key.trusted && !self.guarded;
        let checks = if trusted {
            wgpu::ShaderRuntimeChecks::unchecked()
        } else {
            wgpu::ShaderRuntimeChecks {
                force_loop_bounding: !key.unbounded_loops,
                ..wgpu::ShaderRuntimeChecks::checked()
            }
        };
        let module = unsafe { device.create_shader_module_trusted(desc, checks) };
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some(key.entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                zero_initialize_workgroup_memory: !trusted,
                ..Default::default()
            },
            cache: None,
        });
        let layout = pipeline.get_bind_group_layout(0);
        let cached = Arc::new(CachedPipeline {
            key: key.clone(),
            pipeline,
            layout,
            decisions: key.decisions(),
        });
        map.insert(key.clone(), cached.clone());
        Ok(cached)
    }

    pub fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_order_independent_and_carries_workgroup_size() {
        let a = PipelineKey::new("x.wgsl", "main")
            .define("A", "")
            .define("B", 2)
            .workgroup_size(64);
        let b = PipelineKey::new("x.wgsl", "main")
            .workgroup_size(64)
            .define("B", 2)
            .define("A", "");
        assert_eq!(a, b);
        assert_eq!(a.decisions().workgroup_size, 64);
        assert_eq!(a.label(), "x.wgsl::main A B=2 WG_SIZE=64u");
    }
}
