//! The JS class: `Engine.load(source, options)` then `generate` / `chat` / `tokenize` / ...
//!
//! Thin and typed (docs/architecture.md, decision 12): options are serde structs read with serde-wasm-bindgen, the two
//! callbacks (`onProgress`, `onToken`) and the `AbortSignal` are read by name, results are serde
//! structs written back, errors are JS `Error`s with a stable `code` ([`super::js_error`]).
//!
//! Async methods return a `Promise` built from a future that owns an `Rc` of the engine's state,
//! so JS may call anything at any time: a second call while a generation runs gets a clear
//! "busy" error instead of a borrow panic, and `dispose()` during a generation stops it at the
//! next token and frees the GPU when it returns. `dispose()` destroys the device, which destroys
//! every buffer made on it (weights, KV cache, workspace) at once (WebGPU `GPUDevice.destroy`);
//! a failed or aborted load does the same, so nothing is left on the GPU.
//!
//! KV reuse: the session keeps the token at every cell. A new prompt (raw or a rendered chat) is
//! compared with it; the common prefix stays in the cache, and only the differing suffix is
//! prefilled. A chat's next turn therefore costs only its own tokens.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use js_sys::{Function, Promise, Reflect};
use serde::{Deserialize, Serialize};
use sha2::Digest;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use super::fetch::wasm_memory_bytes;
use super::js_error;
use super::source::{self, Abort, Origin, Source};
use crate::error::{Error, ErrorCode, Result};
use crate::generate::chat::ChatMessage;
use crate::generate::constraint::ConstraintSpec;
use crate::generate::open::{OpenedModel, DEFAULT_MAX_TOKENS};
use crate::generate::sampler::SamplerParams;
use crate::generate::session::{GenerateOptions, Session, SessionOptions};
use crate::generate::tools::{parse_tools, ToolCall, ToolChoice, ToolSyntax};
use crate::gpu::{GpuContext, GpuLimits, LimitRequest};
use crate::loader::{LoadedModel, MemoryPlan, StreamLoader};
use crate::model::HParams;
use crate::tokenizer::Tokenizer;

// ---------------------------------------------------------------- options (JS -> Rust)

#[derive(Deserialize)]
#[serde(untagged)]
enum CacheOption {
    Flag(bool),
    Name(String),
}

/// `Engine.load` options (besides `onProgress` and `signal`, read by name).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct LoadOptions {
    context_size: Option<u32>,
    n_keep: Option<u32>,
    n_discard: Option<u32>,
    context_shift: Option<bool>,
    /// Shift by re-evaluating the kept tokens (exact) instead of keeping their cache and state.
    exact_context_shift: Option<bool>,
    batch_size: Option<u32>,
    expected_size: Option<u64>,
    expected_sha256: Option<String>,
    cache: Option<CacheOption>,
}

/// `generate` / `chat` options (besides `onToken`, read by name). Sampling defaults are
/// llama.cpp's; `temperature: 0` is greedy.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct GenOptions {
    max_tokens: Option<u32>,
    stop: Vec<String>,
    temperature: Option<f32>,
    top_k: Option<i32>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    repeat_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    penalty_last_n: Option<i32>,
    seed: Option<u64>,
    /// Raw prompts: add BOS (default true). Chat prompts always get the tokenizer's BOS.
    add_special: Option<bool>,
    /// Raw prompts: parse `<start_of_turn>`-style special tokens in the text (default true).
    parse_special: Option<bool>,
    /// `{type: 'json_object'}` or `{type: 'json_schema', schema}` (OpenAI's shapes).
    response_format: Option<serde_json::Value>,
    /// `{lark}`, `{gbnf}` or `{regex}`.
    grammar: Option<GrammarOption>,
    /// Chat only: OpenAI's `tools` (`[{type: 'function', function: {name, description,
    /// parameters}}]`), rendered by the template; calls are constrained and parsed back.
    tools: Option<Vec<serde_json::Value>>,
    /// `'none' | 'auto' | 'required' | {type: 'function', function: {name}}` (default auto).
    tool_choice: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct GrammarOption {
    lark: Option<String>,
    gbnf: Option<String>,
    regex: Option<String>,
}

impl GenOptions {
    fn to_generate(&self) -> Result<GenerateOptions> {
        let d = SamplerParams::default();
        let from_format = match &self.response_format {
            Some(v) => ConstraintSpec::from_response_format(v)?,
            None => None,
        };
        let from_grammar = match &self.grammar {
            Some(g) => Some(ConstraintSpec::from_grammar(
                g.lark.as_deref(),
                g.gbnf.as_deref(),
                g.regex.as_deref(),
            )?),
            None => None,
        };
        if from_format.is_some() && from_grammar.is_some() {
            return Err(Error::invalid("give responseFormat or grammar, not both"));
        }
        Ok(GenerateOptions {
            constraint: from_format.or(from_grammar),
            max_tokens: self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
            stop: self.stop.clone(),
            sampler: SamplerParams {
                temperature: self.temperature.unwrap_or(d.temperature),
                top_k: self.top_k.unwrap_or(d.top_k),
                top_p: self.top_p.unwrap_or(d.top_p),
                min_p: self.min_p.unwrap_or(d.min_p),
                repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
                frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
                presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
                penalty_last_n: self.penalty_last_n.unwrap_or(d.penalty_last_n),
                seed: self.seed.unwrap_or(d.seed),
            },
            shown_control: Vec::new(),
        })
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct TokenizeOptions {
    add_special: Option<bool>,
    parse_special: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct DetokenizeOptions {
    remove_special: Option<bool>,
    unparse_special: Option<bool>,
    clean_up: Option<bool>,
}

fn from_js<T: for<'de> Deserialize<'de> + Default>(v: &JsValue, what: &str) -> Result<T> {
    if v.is_undefined() || v.is_null() {
        return Ok(T::default());
    }
    serde_wasm_bindgen::from_value(v.clone()).map_err(|e| Error::invalid(format!("{what}: {e}")))
}

fn get_fn(v: &JsValue, name: &str) -> Result<Option<Function>> {
    if v.is_undefined() || v.is_null() {
        return Ok(None);
    }
    let f = Reflect::get(v, &name.into()).unwrap_or(JsValue::UNDEFINED);
    if f.is_undefined() || f.is_null() {
        return Ok(None);
    }
    f.dyn_into::<Function>()
        .map(Some)
        .map_err(|_| Error::invalid(format!("option {name} must be a function")))
}

fn to_js<T: Serialize>(v: &T) -> Result<JsValue> {
    v.serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .map_err(|e| Error::internal(e.to_string()))
}

// ---------------------------------------------------------------- results (Rust -> JS)

#[derive(Serialize, Clone)]
#[serde(rename_all = "camelCase")]
struct LimitsInfo {
    max_storage_buffer_binding_size: u64,
    max_buffer_size: u64,
    max_compute_workgroups_per_dimension: u32,
    max_compute_invocations_per_workgroup: u32,
    max_compute_workgroup_storage_size: u32,
    max_storage_buffers_per_shader_stage: u32,
}

impl From<&GpuLimits> for LimitsInfo {
    fn from(l: &GpuLimits) -> Self {
        LimitsInfo {
            max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
            max_buffer_size: l.max_buffer_size,
            max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
            max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
            max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
            max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
        }
    }
}

#[derive(Serialize, Clone)]
#[serde(rename_all = "camelCase")]
struct ModelInfo {
    name: Option<String>,
    architecture: String,
    n_layer: u32,
    n_embd: u32,
    n_head: u32,
    n_head_kv: u32,
    n_ff: u32,
    n_vocab: u32,
    n_ctx_train: u32,
    file_bytes: u64,
    file_bytes_per_type: std::collections::BTreeMap<String, u64>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    eog_ids: Vec<u32>,
    chat_template: Option<String>,
}

#[derive(Serialize, Clone)]
#[serde(rename_all = "camelCase")]
struct LoadInfo {
    source: String,
    origin: Origin,
    parts: usize,
    bytes: u64,
    resumes: u32,
    cached: bool,
    load_ms: f64,
    /// The wasm linear memory after the load (it only grows: the peak heap of the load).
    peak_wasm_heap_bytes: u64,
    sha256: Option<String>,
}

#[derive(Serialize, Clone)]
#[serde(rename_all = "camelCase")]
struct AdapterInfo {
    name: String,
    backend: String,
    device_type: String,
    driver: String,
}

#[derive(Serialize, Clone)]
#[serde(rename_all = "camelCase")]
struct MemoryInfo {
    weights_gpu_bytes: u64,
    buffers: usize,
    split_tensors: usize,
    max_binding: u64,
    gpu_bytes_per_type: std::collections::BTreeMap<String, u64>,
}

/// What `info()` returns.
#[derive(Serialize, Clone)]
#[serde(rename_all = "camelCase")]
struct EngineInfo {
    model: ModelInfo,
    adapter: AdapterInfo,
    limits: LimitsInfo,
    adapter_limits: LimitsInfo,
    memory: MemoryInfo,
    load: LoadInfo,
    context_size: u32,
    n_keep: u32,
    context_shift: bool,
    n_past: u32,
    context_shifts: u32,
}

/// What `generate` / `chat` resolve to.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenStats {
    prompt_tokens: u32,
    /// Prompt tokens already in the KV cache (the common prefix with the previous call).
    reused_tokens: u32,
    /// Prompt tokens run through the model by this call.
    prefilled_tokens: u32,
    generated_tokens: u32,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    first_token_ms: f64,
    total_ms: f64,
    finish_reason: String,
    context_shifts: u32,
    total_context_shifts: u32,
    n_past: u32,
    context_size: u32,
    /// CPU time of the constraint's token masks, ms per token (0 without responseFormat/grammar).
    mask_ms_per_token: f64,
    /// GPU work per decoded token (after the first): dispatches, compute passes, submissions.
    dispatches_per_token: f64,
    passes_per_token: f64,
    submits_per_token: f64,
    /// With `tools`: the calls parsed from the answer (`finishReason` is then `'tool_calls'`).
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ToolCall>>,
    /// With `tools`: the answer's text outside its calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<String>,
}

// ---------------------------------------------------------------- the class

/// What stays fixed after the load.
struct Core {
    ctx: Arc<GpuContext>,
    opened: OpenedModel,
    info: EngineInfo,
}

struct Inner {
    core: Rc<Core>,
    /// `None` while a generation holds it.
    session: Option<Session>,
}

/// `None` once disposed.
type State = Rc<RefCell<Option<Inner>>>;

fn disposed() -> Error {
    Error::invalid("this Engine was disposed; load the model again with Engine.load()")
}

fn busy() -> Error {
    Error::invalid(
        "the engine is busy with another generation; wait for it to finish or stop it first",
    )
}

/// A model on the GPU with its session. Create with `Engine.load`.
#[wasm_bindgen]
pub struct Engine {
    state: State,
}

#[wasm_bindgen]
impl Engine {
    /// Load a model: `source` is a URL string, a `File`/`Blob`, a `ReadableStream`, an
    /// `ArrayBuffer` or a `Uint8Array`. Resolves to an `Engine`.
    #[wasm_bindgen(unchecked_return_type = "Promise<Engine>")]
    pub fn load(source: JsValue, options: JsValue) -> Promise {
        future_to_promise(async move {
            load(source, options)
                .await
                .map(JsValue::from)
                .map_err(js_error)
        })
    }

    /// Generate a continuation of `prompt` (raw text). `options.onToken(text, tokenId)` is
    /// called per token (return `false` to stop). Resolves to the stats.
    #[wasm_bindgen(unchecked_return_type = "Promise<any>")]
    pub fn generate(&self, prompt: String, options: JsValue) -> Promise {
        let state = self.state.clone();
        future_to_promise(async move {
            run(state, Input::Raw(prompt), options)
                .await
                .map_err(js_error)
        })
    }

    /// Chat: `messages` is `[{role, content}]`; the template is applied and the KV cache of the
    /// previous turns is reused. Same options and result as `generate`.
    #[wasm_bindgen(unchecked_return_type = "Promise<any>")]
    pub fn chat(&self, messages: JsValue, options: JsValue) -> Promise {
        let state = self.state.clone();
        future_to_promise(async move {
            let messages: Vec<ChatMessage> =
                serde_wasm_bindgen::from_value(messages).map_err(|e| {
                    js_error(Error::invalid(format!(
                        "chat: messages must be [{{role, content}}]: {e}"
                    )))
                })?;
            run(state, Input::Chat(messages), options)
                .await
                .map_err(js_error)
        })
    }

    /// Text -> token ids (`options`: `{addSpecial = true, parseSpecial = true}`).
    pub fn tokenize(&self, text: &str, options: JsValue) -> std::result::Result<Vec<u32>, JsValue> {
        let o: TokenizeOptions = from_js(&options, "tokenize options").map_err(js_error)?;
        let core = self.core().map_err(js_error)?;
        Ok(core.opened.tok.encode(
            text,
            o.add_special.unwrap_or(true),
            o.parse_special.unwrap_or(true),
        ))
    }

    /// Token ids -> text (`options`: `{removeSpecial, unparseSpecial, cleanUp}`, all false by
    /// default: the pieces as generation streams them; see [`DetokenizeOptions`]).
    ///
    /// [`DetokenizeOptions`]: crate::tokenizer::DetokenizeOptions
    pub fn detokenize(
        &self,
        ids: Vec<u32>,
        options: JsValue,
    ) -> std::result::Result<String, JsValue> {
        let o: DetokenizeOptions = from_js(&options, "detokenize options").map_err(js_error)?;
        let core = self.core().map_err(js_error)?;
        Ok(core.opened.tok.detokenize(
            &ids,
            crate::tokenizer::DetokenizeOptions {
                remove_special: o.remove_special.unwrap_or(false),
                unparse_special: o.unparse_special.unwrap_or(false),
                clean_up: o.clean_up.unwrap_or(false),
            },
        ))
    }

    /// Drop `nDiscard` cells of the KV cache after the first `nKeep` (the kv_shift kernel).
    #[wasm_bindgen(js_name = shiftContext)]
    pub fn shift_context(&self, n_keep: u32, n_discard: u32) -> std::result::Result<(), JsValue> {
        self.with_session(|s| s.shift(n_keep, n_discard))
            .map_err(js_error)
    }

    /// Forget the conversation (the KV cache is cleared; the model stays loaded).
    pub fn reset(&self) -> std::result::Result<(), JsValue> {
        self.with_session(|s| {
            s.reset();
            Ok(())
        })
        .map_err(js_error)
    }

    /// Model metadata, adapter, granted limits, GPU memory plan, load figures, context use.
    pub fn info(&self) -> std::result::Result<JsValue, JsValue> {
        let st = self.state.borrow();
        let inner = st.as_ref().ok_or_else(|| js_error(disposed()))?;
        let mut info = inner.core.info.clone();
        if let Some(s) = &inner.session {
            info.n_past = s.n_past();
            info.context_shifts = s.shifts;
        }
        to_js(&info).map_err(js_error)
    }

    /// Tokens in the KV cache now.
    #[wasm_bindgen(getter, js_name = nPast)]
    pub fn n_past(&self) -> u32 {
        self.state
            .borrow()
            .as_ref()
            .and_then(|i| i.session.as_ref())
            .map_or(0, |s| s.n_past())
    }

    /// Whether `dispose()` was called.
    #[wasm_bindgen(getter)]
    pub fn disposed(&self) -> bool {
        self.state.borrow().is_none()
    }

    /// Free every GPU buffer now. Any later call throws; a running generation stops at its next
    /// token.
    pub fn dispose(&self) {
        let inner = self.state.borrow_mut().take();
        if let Some(inner) = inner {
            if inner.session.is_some() {
                inner.core.ctx.device.destroy();
            }
            // Else a generation holds the session: it destroys the device when it returns.
        }
    }
}

impl Engine {
    fn core(&self) -> Result<Rc<Core>> {
        self.state
            .borrow()
            .as_ref()
            .map(|i| i.core.clone())
            .ok_or_else(disposed)
    }

    fn with_session<R>(&self, f: impl FnOnce(&mut Session) -> Result<R>) -> Result<R> {
        let mut st = self.state.borrow_mut();
        let inner = st.as_mut().ok_or_else(disposed)?;
        let s = inner.session.as_mut().ok_or_else(busy)?;
        f(s)
    }
}

// ---------------------------------------------------------------- load

struct Progress<'f> {
    f: Option<&'f Function>,
    last_ms: f64,
}

impl Progress<'_> {
    fn emit(&mut self, force: bool, value: impl FnOnce() -> serde_json::Value) {
        let Some(f) = self.f else { return };
        let now = js_sys::Date::now();
        if !force && now - self.last_ms < 100.0 {
            return;
        }
        self.last_ms = now;
        if let Ok(v) = to_js(&value()) {
            let _ = f.call1(&JsValue::NULL, &v);
        }
    }
}

async fn load(source: JsValue, options: JsValue) -> Result<Engine> {
    let t0 = js_sys::Date::now();
    let source = Source::from_js(&source)?;
    let opts: LoadOptions = from_js(&options, "Engine.load options")?;
    let on_progress = get_fn(&options, "onProgress")?;
    let signal = if options.is_object() {
        Reflect::get(&options, &"signal".into()).ok()
    } else {
        None
    };
    let abort = Abort(
        signal
            .filter(|s| !s.is_undefined() && !s.is_null())
            .map(|s| s.unchecked_into()),
    );
    let cache_name = match &opts.cache {
        Some(CacheOption::Flag(true)) => Some(source::DEFAULT_CACHE.to_string()),
        Some(CacheOption::Name(n)) => Some(n.clone()),
        _ => None,
    };
    let mut progress = Progress {
        f: on_progress.as_ref(),
        last_ms: 0.0,
    };
    progress.emit(true, || serde_json::json!({"phase": "gpu", "loadedBytes": 0, "totalBytes": null, "tensorsLoaded": 0, "tensorsTotal": 0}));
    abort.check()?;

    let ctx = Arc::new(GpuContext::new(&LimitRequest::default()).await?);
    // From here on, any failure destroys the device: every buffer made so far goes with it.
    match load_on(
        &ctx,
        &source,
        &opts,
        cache_name.as_deref(),
        &abort,
        &mut progress,
        t0,
    )
    .await
    {
        Ok(engine) => Ok(engine),
        Err(e) => {
            ctx.device.destroy();
            Err(e)
        }
    }
}

async fn load_on(
    ctx: &Arc<GpuContext>,
    source: &Source,
    opts: &LoadOptions,
    cache: Option<&str>,
    abort: &Abort,
    progress: &mut Progress<'_>,
    t0: f64,
) -> Result<Engine> {
    let parts: Vec<Source> = match source {
        Source::Url(u) => source::split_urls(u).into_iter().map(Source::Url).collect(),
        _ => vec![],
    };
    let parts_ref: Vec<&Source> = if parts.is_empty() {
        vec![source]
    } else {
        parts.iter().collect()
    };
    let n_parts = parts_ref.len();
    let mut hasher = opts.expected_sha256.as_ref().map(|_| sha2::Sha256::new());
    let mut weights: Option<LoadedModel> = None;
    let mut total_bytes = 0u64;
    let origin = std::cell::Cell::new(Origin::Network);
    let (mut resumes, mut cached) = (0u32, true);

    for (pi, part) in parts_ref.iter().enumerate() {
        let loader: RefCell<Option<StreamLoader>> = RefCell::new(None);
        let base = total_bytes;
        let report = source::read(
            part,
            cache,
            abort,
            &mut |size, from| {
                if let (Some(want), Some(have), 1) = (opts.expected_size, size, n_parts) {
                    if want != have {
                        return Err(Error::new(
                            ErrorCode::BadGguf,
                            format!(
                                "expected {want} bytes but {} has {have}; is it the right file?",
                                part.describe()
                            ),
                        ));
                    }
                }
                origin.set(from);
                let l = StreamLoader::new(ctx, size);
                // The first part's header names the architecture: refuse an unknown one (or a
                // vocabulary we cannot build) before any tensor is written.
                *loader.borrow_mut() = Some(if pi == 0 {
                    l.with_header_check(|h| {
                        HParams::from_gguf(h)?;
                        Tokenizer::from_gguf(h)?;
                        Ok(())
                    })
                } else {
                    l
                });
                Ok(())
            },
            &mut |chunk| {
                if let Some(h) = hasher.as_mut() {
                    h.update(chunk);
                }
                let mut guard = loader.borrow_mut();
                let l = guard
                    .as_mut()
                    .ok_or_else(|| Error::internal("chunk before size"))?;
                l.push(chunk)?;
                let p = l.progress();
                progress.emit(false, || {
                    serde_json::json!({
                        "phase": p.phase, "loadedBytes": base + p.loaded_bytes,
                        "totalBytes": if n_parts == 1 { p.total_bytes } else { None },
                        "tensorsLoaded": p.tensors_loaded, "tensorsTotal": p.tensors_total,
                        "part": pi + 1, "parts": n_parts, "origin": from_origin(origin.get()),
                    })
                });
                Ok(())
            },
        )
        .await?;
        resumes += report.resumes;
        cached &= report.cached;
        let l = loader
            .into_inner()
            .ok_or_else(|| source::net(format!("{}: no response", part.describe())))?;
        let p = l.progress();
        total_bytes += p.loaded_bytes;
        let part_weights = l.finish()?;
        weights = Some(match weights {
            None => part_weights,
            Some(w) => merge(w, part_weights),
        });
        progress.emit(true, || {
            serde_json::json!({
                "phase": if pi + 1 == n_parts { "done" } else { "weights" }, "loadedBytes": total_bytes,
                "totalBytes": if pi + 1 == n_parts { Some(total_bytes) } else { None },
                "tensorsLoaded": p.tensors_loaded, "tensorsTotal": p.tensors_total,
                "part": pi + 1, "parts": n_parts, "origin": from_origin(origin.get()),
            })
        });
    }
    let weights = weights.ok_or_else(|| Error::internal("no parts"))?;

    if let Some(want) = opts.expected_size {
        if want != total_bytes {
            return Err(Error::new(
                ErrorCode::BadGguf,
                format!("expected {want} bytes but got {total_bytes}; is it the right file?"),
            ));
        }
    }
    let sha256 = hasher.map(|h| hex(&h.finalize()));
    if let (Some(want), Some(got)) = (&opts.expected_sha256, &sha256) {
        if !want.eq_ignore_ascii_case(got) {
            if let (Some(c), Source::Url(u)) = (cache, source) {
                source::evict(c, u).await;
            }
            return Err(Error::new(
                ErrorCode::BadGguf,
                format!("the file's SHA-256 is {got}, not the expected {want}: the download is corrupt or it is another file"),
            ));
        }
    }

    progress.emit(true, || serde_json::json!({"phase": "model", "loadedBytes": total_bytes, "totalBytes": total_bytes, "tensorsLoaded": 0, "tensorsTotal": 0}));
    let header = weights.header.clone();
    let plan: MemoryPlan = weights.plan.clone();
    let opened = OpenedModel::new(ctx, weights).await?;
    let (model, tok, template) = (&opened.model, &opened.tok, &opened.template);
    let hp = &model.hp;

    let defaults = SessionOptions::default();
    let sopts = SessionOptions {
        n_ctx: opened.context_size(opts.context_size),
        n_keep: opts.n_keep.unwrap_or(defaults.n_keep),
        n_discard: opts.n_discard.or(defaults.n_discard),
        context_shift: opts.context_shift.unwrap_or(defaults.context_shift),
        batch: opts.batch_size.unwrap_or(defaults.batch),
        chain: defaults.chain,
        chain_steps: defaults.chain_steps,
        shift_recompute: opts.exact_context_shift.unwrap_or(defaults.shift_recompute),
    };
    let session = opened.session(ctx, sopts.clone())?;
    // One round trip to the GPU before the engine is handed out. No step of the load reads
    // anything back, and in the browser a device lost meanwhile is reported only
    // asynchronously (its `lost` promise); a readback on it fails, so a load that met a device
    // loss ends in DEVICE_LOST here instead of an engine whose first generation fails.
    let probe = ctx.storage_buffer("load: device check", &[0u8; 4]);
    let probed = crate::gpu::read_buffer(ctx, &probe, 0, 4).await;
    probe.destroy();
    probed?;
    ctx.check_errors()?;

    let info = EngineInfo {
        model: ModelInfo {
            name: header.get_str("general.name").map(str::to_string),
            architecture: hp.arch.name().to_string(),
            n_layer: hp.n_layer,
            n_embd: hp.n_embd,
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            n_ff: hp.n_ff,
            n_vocab: hp.n_vocab,
            n_ctx_train: hp.n_ctx_train,
            file_bytes: total_bytes,
            file_bytes_per_type: plan.file_bytes_per_type.clone(),
            bos_id: tok.bos_id(),
            eos_id: tok.eos_id(),
            eog_ids: tok.eog_ids().to_vec(),
            chat_template: template.as_ref().ok().map(|t| match t.builtin {
                Some(b) => format!("built-in {b:?}"),
                None => "from the file".to_string(),
            }),
        },
        adapter: AdapterInfo {
            name: ctx.adapter.name.clone(),
            backend: ctx.adapter.backend.clone(),
            device_type: ctx.adapter.device_type.clone(),
            driver: ctx.adapter.driver.clone(),
        },
        limits: (&ctx.limits).into(),
        adapter_limits: (&ctx.adapter_limits).into(),
        memory: MemoryInfo {
            weights_gpu_bytes: plan.total_gpu_bytes,
            buffers: plan.buffers,
            split_tensors: plan.split_tensors,
            max_binding: plan.max_binding,
            gpu_bytes_per_type: plan.gpu_bytes_per_type.clone(),
        },
        load: LoadInfo {
            source: source.describe(),
            origin: origin.get(),
            parts: n_parts,
            bytes: total_bytes,
            resumes,
            cached: cached && cache.is_some(),
            load_ms: js_sys::Date::now() - t0,
            peak_wasm_heap_bytes: wasm_memory_bytes(),
            sha256,
        },
        context_size: sopts.n_ctx,
        n_keep: sopts.n_keep,
        context_shift: sopts.context_shift,
        n_past: 0,
        context_shifts: 0,
    };
    progress.emit(true, || serde_json::json!({"phase": "ready", "loadedBytes": total_bytes, "totalBytes": total_bytes, "tensorsLoaded": 0, "tensorsTotal": 0}));
    let core = Rc::new(Core {
        ctx: ctx.clone(),
        opened,
        info,
    });
    Ok(Engine {
        state: Rc::new(RefCell::new(Some(Inner {
            core,
            session: Some(session),
        }))),
    })
}

fn from_origin(o: Origin) -> serde_json::Value {
    serde_json::to_value(o).unwrap_or(serde_json::Value::Null)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A split GGUF's parts as one model: the first part's header (it holds the metadata), every
/// part's tensors.
fn merge(mut a: LoadedModel, b: LoadedModel) -> LoadedModel {
    a.tensors.extend(b.tensors);
    a.fused.extend(b.fused);
    let (pa, pb) = (&mut a.plan, b.plan);
    pa.tensors.extend(pb.tensors);
    for (k, v) in pb.file_bytes_per_type {
        *pa.file_bytes_per_type.entry(k).or_default() += v;
    }
    for (k, v) in pb.gpu_bytes_per_type {
        *pa.gpu_bytes_per_type.entry(k).or_default() += v;
    }
    pa.buffers += pb.buffers;
    pa.split_tensors += pb.split_tensors;
    pa.total_gpu_bytes += pb.total_gpu_bytes;
    a
}

// ---------------------------------------------------------------- generate / chat

enum Input {
    Raw(String),
    Chat(Vec<ChatMessage>),
}

async fn run(state: State, input: Input, options: JsValue) -> Result<JsValue> {
    let t0 = js_sys::Date::now();
    let opts: GenOptions = from_js(&options, "generate options")?;
    let on_token = get_fn(&options, "onToken")?;
    // Take the session out for the duration (a concurrent call sees "busy").
    let (core, mut session) = {
        let mut st = state.borrow_mut();
        let inner = st.as_mut().ok_or_else(disposed)?;
        let s = inner.session.take().ok_or_else(busy)?;
        (inner.core.clone(), s)
    };
    let result = generate(
        &core,
        &mut session,
        &state,
        input,
        &opts,
        on_token.as_ref(),
        t0,
    )
    .await;
    let mut st = state.borrow_mut();
    match st.as_mut() {
        Some(inner) => inner.session = Some(session),
        // Disposed meanwhile: free the GPU now.
        None => core.ctx.device.destroy(),
    }
    result
}

async fn generate(
    core: &Core,
    session: &mut Session,
    state: &State,
    input: Input,
    opts: &GenOptions,
    on_token: Option<&Function>,
    t0: f64,
) -> Result<JsValue> {
    // Bad options fail before the session is touched.
    let mut gopts = opts.to_generate()?;
    let tools = opts.tools.as_deref().filter(|t| !t.is_empty());
    if tools.is_none() && opts.tool_choice.as_ref().is_some_and(|c| c != "none") {
        return Err(Error::invalid("toolChoice needs tools"));
    }
    // The call syntax to parse the answer with (tools given and calls allowed).
    let mut parse_with: Option<ToolSyntax> = None;
    let tokens = match &input {
        Input::Raw(_) if tools.is_some() => {
            return Err(Error::invalid(
                "tools need a chat (messages and the model's chat template), not a raw prompt",
            ))
        }
        Input::Raw(p) => core.opened.tok.encode(
            p,
            opts.add_special.unwrap_or(true),
            opts.parse_special.unwrap_or(true),
        ),
        Input::Chat(messages) => {
            let t = core.opened.template.as_ref().map_err(Clone::clone)?;
            if let Some(tools) = tools {
                let syntax = t.tool_syntax().ok_or_else(|| {
                    Error::invalid(
                        "this model's chat template defines no tool-call syntax, so tools cannot be used",
                    )
                })?;
                let parsed = parse_tools(tools)?;
                let choice = ToolChoice::from_json(opts.tool_choice.as_ref())?;
                // A marker that is a control token is named as a token by the grammar.
                let tok = &core.opened.tok;
                let special = |s: &str| {
                    tok.token_id(s)
                        .is_some_and(|id| tok.token_bytes(id).is_empty())
                };
                if let Some(spec) = syntax.grammar(&parsed, &choice, &special)? {
                    if gopts.constraint.is_some() {
                        return Err(Error::invalid(
                            "responseFormat or grammar cannot be combined with tools (unless toolChoice is 'none')",
                        ));
                    }
                    gopts.constraint = Some(spec);
                    // Markers that are control tokens show as text, for the parse and the stream.
                    gopts.shown_control = syntax
                        .markers()
                        .iter()
                        .filter(|m| special(m))
                        .filter_map(|m| tok.token_id(m))
                        .collect();
                    parse_with = Some(syntax);
                }
            }
            core.opened.chat_tokens_with_tools(messages, tools)?
        }
    };
    if tokens.is_empty() {
        return Err(Error::invalid("the prompt is empty"));
    }
    // Keep the common prefix in the cache; feed the rest (at least one token, for fresh logits).
    let held = session.tokens().len();
    let mut keep = session
        .tokens()
        .iter()
        .zip(&tokens)
        .take_while(|(a, b)| a == b)
        .count();
    keep = keep.min(tokens.len() - 1);
    if keep == 0 {
        session.reset();
    } else if keep < held {
        // Forget the cells after the prefix (a conv layer's state at the prefix is its rows there).
        session.truncate(keep as u32)?;
    }
    let suffix = &tokens[keep..];

    let mut js_err: Option<JsValue> = None;
    let mut first_ms: Option<f64> = None;
    let mut answer = String::new();
    let mut cb = |id: Option<u32>, text: &str| -> bool {
        if first_ms.is_none() {
            first_ms = Some(js_sys::Date::now() - t0);
        }
        if parse_with.is_some() {
            answer.push_str(text);
        }
        // Disposed during the generation: stop at once.
        if state.borrow().is_none() {
            return false;
        }
        let Some(f) = on_token else { return true };
        let id_js = id.map_or(JsValue::NULL, JsValue::from);
        match f.call2(&JsValue::NULL, &JsValue::from_str(text), &id_js) {
            Ok(v) => v != JsValue::FALSE,
            Err(e) => {
                js_err = Some(e);
                false
            }
        }
    };
    let stats = session.generate(suffix, &gopts, &mut cb).await?;
    if let Some(e) = js_err {
        return Err(Error::invalid(format!(
            "the onToken callback threw: {}",
            source::js_msg(&e)
        )));
    }
    core.ctx.check_errors()?;
    let (mut tool_calls, mut content, mut finish_reason) =
        (None, None, stats.finish_reason.clone());
    if let Some(syntax) = parse_with {
        let (text, calls) = syntax.parse(&answer);
        if !calls.is_empty() && finish_reason == "stop" {
            finish_reason = "tool_calls".into();
        }
        tool_calls = Some(calls);
        content = Some(text);
    }
    let out = GenStats {
        prompt_tokens: tokens.len() as u32,
        reused_tokens: keep as u32,
        prefilled_tokens: suffix.len() as u32,
        generated_tokens: stats.generated_tokens,
        prefill_tok_s: stats.prefill_tok_s,
        decode_tok_s: stats.decode_tok_s,
        first_token_ms: first_ms.unwrap_or(0.0),
        total_ms: js_sys::Date::now() - t0,
        finish_reason,
        context_shifts: stats.context_shifts,
        total_context_shifts: session.shifts,
        n_past: session.n_past(),
        context_size: session.options().n_ctx,
        mask_ms_per_token: stats.mask_ms_per_token,
        dispatches_per_token: stats.dispatches_per_token,
        passes_per_token: stats.passes_per_token,
        submits_per_token: stats.submits_per_token,
        tool_calls,
        content,
    };
    to_js(&out)
}
