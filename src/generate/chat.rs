//! Chat templates: messages -> the prompt text a model was trained on (docs/architecture.md, decision 11).
//!
//! The GGUF's `tokenizer.chat_template` is Jinja (Hugging Face's `apply_chat_template`); we render
//! it with minijinja configured like transformers (`trim_blocks`, `lstrip_blocks`, no trailing
//! newline kept) plus minijinja-contrib's Python string/dict methods (`.strip()`, `.items()`...).
//! The context holds `messages`, `add_generation_prompt`, `bos_token`, `eos_token` and the
//! `raise_exception(msg)` function. `strftime_now` is not defined, so templates that test for it
//! take their fixed fallback date (Llama 3.x: "26 Jul 2024"): same output natively and in wasm.
//!
//! When the file has no template (the Gemma 3 270M file has none), a built-in one is chosen by
//! architecture ([`Builtin::detect`]). Built-ins produce exactly what llama.cpp's built-in
//! templates (`llm_chat_apply_template`) produce: no BOS (the tokenizer adds it), Gemma's system
//! message folded into the first user turn.
//!
//! A file's template may start with `bos_token` while the tokenizer also adds BOS; llama.cpp
//! drops one of them, and [`strip_leading_bos`] does the same for the caller that tokenizes with
//! `add_bos`.
//!
//! A template is code from whatever file a page loads, so its work is bounded: minijinja's fuel
//! (one unit per instruction, plus one per 64 bytes of every string it builds or writes) and a
//! cap on the rendered text, both scaled by the size of the conversation. A loop over
//! `range(100000)` inside another, or a string doubled 64 times, ends with `INVALID_ARGUMENT`
//! in milliseconds instead of hanging the worker or growing memory without bound. Recursion
//! is already limited by minijinja (500 levels). Lists are bounded too: minijinja joins lists
//! (`+`, `chain`) lazily and charges no fuel for it, so a list doubled in a loop would describe
//! 2^64 items in 64 steps and then be copied out at once; [`template_bounds`] guards every
//! operand of `+` and `chain`, charging fuel for what a list holds and refusing one of more
//! than 65,536 items plus two per message. Writing a value out as text (`{{ x }}`, `~`,
//! `string`, `tojson`, `pprint`) first counts its parts, without recursion, and refuses more
//! than four times that: a namespace that holds itself would otherwise recurse until the stack
//! overflows, and a list holding one list twice, 64 levels deep, is 2^64 parts. So does every
//! other walk of a whole value: comparisons, `in`, `%`, the filters that write out or compare
//! (`join`, `sort`, `format`, ...) and Python's `str.join` / `str.format`.

use super::template_bounds;
use crate::error::{Error, ErrorCode, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Fuel for one render: this much, plus [`TEMPLATE_FUEL_PER_MESSAGE`] per message and
/// [`TEMPLATE_FUEL_PER_BYTE`] per byte of message text. Real templates stay far below it: the
/// built-ins and the official Llama 3 / Qwen 2.5 templates render a 5,000-message chat within
/// budget (tests/refusals.rs), while a hostile one is stopped after ~250k instructions
/// (milliseconds).
const TEMPLATE_FUEL: u64 = 250_000;
/// A template's loop body per message: tens of instructions for every template tested, with
/// room for tool-call branches and filters.
const TEMPLATE_FUEL_PER_MESSAGE: u64 = 500;
/// Per byte of text (a template may pass each message through a few filters; minijinja charges
/// 1/64 of a unit per byte a string operation builds).
const TEMPLATE_FUEL_PER_BYTE: u64 = 1;
/// A list the template concatenates (`+`, `chain`) may hold this many items plus two per message:
/// a template's lists are a few turns or tool calls; this many items take 1.5 MiB.
const TEMPLATE_LIST_ITEMS: usize = 1 << 16;
/// The rendered prompt may be this many bytes plus twice the conversation's text: room for
/// every turn's markers, far below what would exhaust memory (1 MiB is ~250k tokens).
const TEMPLATE_OUTPUT_BYTES: usize = 1 << 20;

/// One message of a conversation. `role` is `system`, `user`, `assistant` or `tool` (a tool's
/// result). An assistant message may carry OpenAI's `tool_calls`
/// (`[{id, type: "function", function: {name, arguments}}]`, `arguments` a JSON string or an
/// object); a tool message its `tool_call_id` and `name`. `content` may be null (an assistant
/// message that only calls tools).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    use serde::Deserialize;
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..Default::default()
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }

    /// A tool's result, answering the call `tool_call_id`.
    pub fn tool(content: impl Into<String>, tool_call_id: impl Into<String>) -> Self {
        ChatMessage {
            tool_call_id: Some(tool_call_id.into()),
            ..Self::new("tool", content)
        }
    }

    /// The map a template sees: `role`, `content`, and `tool_calls` / `tool_call_id` / `name`
    /// when set. Templates (Qwen's, Llama's) write a call's arguments with `tojson`, so a JSON
    /// string of arguments (OpenAI's form) is handed over parsed.
    fn to_value(&self) -> minijinja::Value {
        let mut m = serde_json::Map::new();
        m.insert("role".into(), self.role.clone().into());
        m.insert("content".into(), self.content.clone().into());
        if let Some(calls) = &self.tool_calls {
            let calls: Vec<serde_json::Value> = calls
                .iter()
                .map(|c| {
                    let mut c = c.clone();
                    if let Some(f) = c.get_mut("function") {
                        if let Some(s) = f.get("arguments").and_then(|a| a.as_str()) {
                            if let Ok(v) = serde_json::from_str::<serde_json::Value>(s) {
                                f["arguments"] = v;
                            }
                        }
                    }
                    c
                })
                .collect();
            m.insert("tool_calls".into(), calls.into());
        }
        if let Some(id) = &self.tool_call_id {
            m.insert("tool_call_id".into(), id.clone().into());
        }
        if let Some(n) = &self.name {
            m.insert("name".into(), n.clone().into());
        }
        minijinja::Value::from(minijinja::value::Serde(&m))
    }
}

/// The Jinja source of a built-in whose every turn is `open + role + mid + content + close` and
/// whose generation prompt is the assistant's `open + "assistant" + mid`. Arguments are Jinja
/// string text (`\n` as an escape) and the content expression.
macro_rules! turns {
    ($open:literal, $mid:literal, $content:literal, $close:literal) => {
        concat!(
            "{%- for message in messages -%}\n{{- '",
            $open,
            "' + message.role + '",
            $mid,
            "' + ",
            $content,
            " + '",
            $close,
            "' -}}\n{%- endfor -%}\n",
            "{%- if add_generation_prompt -%}{{- '",
            $open,
            "assistant",
            $mid,
            "' -}}{%- endif -%}"
        )
    };
}

/// The built-in templates, for files without `tokenizer.chat_template`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    /// `<start_of_turn>user\n{content}<end_of_turn>\n<start_of_turn>model\n`; system folded into
    /// the next user turn; `assistant` is `model`.
    Gemma,
    /// `<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>`.
    Llama3,
    /// `<|im_start|>{role}\n{content}<|im_end|>\n` (Qwen 2 / 3).
    ChatMl,
    /// `[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST]{assistant}</s><s>[INST] ...`
    /// (llama.cpp's `llama2-sys-bos`; also used for Mistral files without a template).
    Llama2,
    /// `<|start_of_role|>{role}<|end_of_role|>{content}<|end_of_text|>\n` (IBM Granite).
    Granite,
    /// `<|{role}|>\n{content}<|end|>\n` (Phi-3, Phi-3.5, Phi-4-mini).
    Phi3,
    /// `<|im_start|>{role}<|im_sep|>{content}<|im_end|>` (Phi-4 14B, whose vocabulary has
    /// `<|im_sep|>`).
    Phi4,
}

impl Builtin {
    /// The built-in for a GGUF `general.architecture`. `has_token` tells whether the vocabulary
    /// holds a token text: it separates Llama 3 from Llama 2 / Mistral, which share `llama`.
    pub fn detect(arch: &str, has_token: &dyn Fn(&str) -> bool) -> Option<Builtin> {
        match arch {
            "gemma" | "gemma2" | "gemma3" | "gemma3n" => Some(Builtin::Gemma),
            "qwen2" | "qwen3" | "qwen2moe" | "qwen3moe" => Some(Builtin::ChatMl),
            "granite" | "granitemoe" => Some(Builtin::Granite),
            "phi3" if has_token("<|im_sep|>") => Some(Builtin::Phi4),
            "phi3" => Some(Builtin::Phi3),
            "llama" if has_token("<|start_header_id|>") => Some(Builtin::Llama3),
            "llama" => Some(Builtin::Llama2),
            _ if has_token("<|im_start|>") => Some(Builtin::ChatMl),
            _ => None,
        }
    }

    /// By llama.cpp's template names (`--chat-template NAME`), for an explicit override.
    pub fn from_name(name: &str) -> Option<Builtin> {
        Some(match name {
            "gemma" => Builtin::Gemma,
            "llama3" => Builtin::Llama3,
            "chatml" => Builtin::ChatMl,
            "llama2" | "llama2-sys-bos" | "mistral" => Builtin::Llama2,
            "granite" => Builtin::Granite,
            "phi3" => Builtin::Phi3,
            "phi4" => Builtin::Phi4,
            _ => return None,
        })
    }

    /// The Jinja source (rendered by the same engine as a file's template).
    pub fn source(self) -> &'static str {
        match self {
            Builtin::Gemma => {
                // Gemma 3's own template defines no tool syntax. With `tools`, this one lists them
                // before the first user message and asks for a fenced JSON call; a call the model
                // made is written back the same way and a tool's result is a user turn holding a
                // ```tool_result block (see `tools::ToolSyntax::Fenced`).
                r#"{%- set ns = namespace(system='') -%}
{%- if tools -%}
  {%- set ns.system = 'You can call these functions; each one\'s arguments follow its JSON Schema:\n' -%}
  {%- for t in tools -%}{%- set ns.system = ns.system + (t | tojson) + '\n' -%}{%- endfor -%}
  {%- set ns.system = ns.system + 'To call one, answer with nothing but\n```tool_call\n{"name": "NAME", "arguments": {ARGUMENTS}}\n```\nA call\'s result comes back in a ```tool_result block.\n\n' -%}
{%- endif -%}
{%- for message in messages -%}
  {%- if message.role == 'system' -%}
    {%- set ns.system = ns.system + message.content | trim -%}
  {%- else -%}
    {%- set role = 'model' if message.role == 'assistant' else ('user' if message.role == 'tool' else message.role) -%}
    {{- '<start_of_turn>' + role + '\n' -}}
    {%- if ns.system and role != 'model' -%}
      {{- ns.system | trim + '\n\n' -}}
      {%- set ns.system = '' -%}
    {%- endif -%}
    {%- if message.role == 'tool' -%}
      {{- '```tool_result\n' + message.content | trim + '\n```' -}}
    {%- else -%}
      {{- message.content | trim -}}
    {%- endif -%}
    {%- for tc in message.tool_calls or [] -%}
      {%- set f = tc.function if tc.function is defined else tc -%}
      {{- ('\n' if loop.first and message.content | trim else '') + '```tool_call\n{"name": ' + (f.name | tojson) + ', "arguments": ' + (f.arguments | tojson) + '}\n```' + ('' if loop.last else '\n') -}}
    {%- endfor -%}
    {{- '<end_of_turn>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}"#
            }
            Builtin::Llama3 => turns!(
                r"<|start_header_id|>",
                r"<|end_header_id|>\n\n",
                "message.content | trim",
                r"<|eot_id|>"
            ),
            Builtin::ChatMl => {
                // With `tools`: a system block listing them in <tools> and asking for
                // <tool_call> JSON (Qwen's convention, `tools::ToolSyntax::Hermes`); a tool's
                // result goes back in a user turn inside <tool_response>.
                r#"{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if messages[0].role == 'system' -%}{{- messages[0].content + '\n\n' -}}{%- endif -%}
  {{- 'Functions you can call, with the JSON Schema of their arguments:\n<tools>\n' -}}
  {%- for t in tools -%}{{- (t | tojson) + '\n' -}}{%- endfor -%}
  {{- '</tools>\nTo call one, answer with\n<tool_call>\n{"name": "NAME", "arguments": {ARGUMENTS}}\n</tool_call><|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if tools and loop.first and message.role == 'system' -%}
  {%- elif message.role == 'tool' -%}
    {{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\n' + message.content -}}
    {%- for tc in message.tool_calls or [] -%}
      {%- set f = tc.function if tc.function is defined else tc -%}
      {{- ('\n' if message.content or not loop.first else '') + '<tool_call>\n{"name": ' + (f.name | tojson) + ', "arguments": ' + (f.arguments | tojson) + '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"#
            }
            Builtin::Llama2 => {
                r#"{%- set ns = namespace(inside=true) -%}
{{- '[INST] ' -}}
{%- for message in messages -%}
  {%- if not ns.inside -%}
    {%- set ns.inside = true -%}
    {{- bos_token + '[INST] ' -}}
  {%- endif -%}
  {%- if message.role == 'system' -%}
    {{- '<<SYS>>\n' + message.content + '\n<</SYS>>\n\n' -}}
  {%- elif message.role == 'user' -%}
    {{- message.content + ' [/INST]' -}}
  {%- else -%}
    {{- message.content + eos_token -}}
    {%- set ns.inside = false -%}
  {%- endif -%}
{%- endfor -%}"#
            }
            Builtin::Granite => turns!(
                r"<|start_of_role|>",
                r"<|end_of_role|>",
                "message.content",
                r"<|end_of_text|>\n"
            ),
            Builtin::Phi3 => turns!(r"<|", r"|>\n", "message.content", r"<|end|>\n"),
            Builtin::Phi4 => turns!(
                r"<|im_start|>",
                r"<|im_sep|>",
                "message.content",
                r"<|im_end|>"
            ),
        }
    }
}

/// A chat template ready to render: its Jinja source and the special token texts it may use.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    pub source: String,
    pub bos_token: String,
    pub eos_token: String,
    /// `Some` when this is a built-in.
    pub builtin: Option<Builtin>,
}

impl ChatTemplate {
    /// A template from Jinja source (checked now, so a broken file fails at load, not at chat).
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self> {
        let t = ChatTemplate {
            source: source.into(),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            builtin: None,
        };
        let env = environment();
        env.template_from_str(&t.source).map_err(|e| {
            Error::new(
                ErrorCode::BadGguf,
                format!("the model's chat template does not parse: {}", describe(&e)),
            )
        })?;
        Ok(t)
    }

    pub fn builtin(b: Builtin, bos_token: impl Into<String>, eos_token: impl Into<String>) -> Self {
        ChatTemplate {
            source: b.source().to_string(),
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            builtin: Some(b),
        }
    }

    /// The file's template when it has one, else the built-in for its architecture.
    pub fn select(
        file_template: Option<&str>,
        arch: &str,
        has_token: &dyn Fn(&str) -> bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<Self> {
        match file_template {
            Some(src) if !src.trim().is_empty() => Self::new(src, bos_token, eos_token),
            _ => Builtin::detect(arch, has_token).map(|b| Self::builtin(b, bos_token, eos_token)).ok_or_else(|| {
                Error::new(
                    ErrorCode::InvalidArgument,
                    format!("the model has no chat template and none is built in for architecture \"{arch}\"; pass a template or use plain text prompts"),
                )
            }),
        }
    }

    /// Render `messages`; `add_generation_prompt` appends the opening of the assistant's turn.
    /// A template that spends its fuel or writes past the output cap is refused
    /// (`INVALID_ARGUMENT`, naming which bound it hit).
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// The tool-call syntax this template defines (`None`: it takes no tools).
    pub fn tool_syntax(&self) -> Option<super::tools::ToolSyntax> {
        super::tools::ToolSyntax::detect(&self.source)
    }

    /// [`Self::render`] with OpenAI's `tools` (`[{type: "function", function: {name,
    /// description, parameters}}]`) in the template's `tools` variable (undefined when `None`).
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let text_bytes: usize = messages
            .iter()
            .map(|m| m.role.len() + m.content.len())
            .sum::<usize>()
            + tools.map_or(0, |t| t.iter().map(|v| v.to_string().len()).sum());
        let fuel = TEMPLATE_FUEL
            + TEMPLATE_FUEL_PER_MESSAGE * messages.len() as u64
            + TEMPLATE_FUEL_PER_BYTE * text_bytes as u64;
        let cap = TEMPLATE_OUTPUT_BYTES + 2 * text_bytes;
        let max_items = TEMPLATE_LIST_ITEMS + 2 * messages.len();
        let mut env = environment();
        env.set_fuel(Some(fuel));
        let list_over = Arc::new(AtomicUsize::new(0));
        let max_parts = 4 * max_items;
        let parts_over = Arc::new(AtomicUsize::new(0));
        template_bounds::register(
            &mut env,
            max_items,
            list_over.clone(),
            max_parts,
            parts_over.clone(),
        );
        let unparsable = |e: minijinja::Error| {
            Error::new(
                ErrorCode::BadGguf,
                format!("the chat template does not parse: {}", describe(&e)),
            )
        };
        let guarded = template_bounds::guard_source(&self.source, syntax()).map_err(unparsable)?;
        let tmpl = env.template_from_str(&guarded).map_err(unparsable)?;
        let mut ctx = minijinja::context! {
            messages => messages.iter().map(ChatMessage::to_value).collect::<Vec<_>>(),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        if let Some(t) = tools {
            ctx = minijinja::context! { tools => minijinja::Value::from(minijinja::value::Serde(t)), ..ctx };
        }
        let mut out = CappedWriter {
            buf: Vec::new(),
            cap,
            overflowed: false,
        };
        let result = tmpl.render_captured_to(ctx, &mut out).map(|_| ());
        let at_line = |e: &minijinja::Error| {
            e.line()
                .map(|l| format!(" (template line {l})"))
                .unwrap_or_default()
        };
        match result {
            Ok(()) => String::from_utf8(out.buf).map_err(|_| {
                Error::new(
                    ErrorCode::Internal,
                    "the chat template produced invalid UTF-8",
                )
            }),
            Err(e) if e.kind() == minijinja::ErrorKind::OutOfFuel => Err(Error::new(
                ErrorCode::InvalidArgument,
                format!(
                    "the chat template does too much work: it ran out of its budget of {fuel} \
                     steps (a chat template needs a few thousand){}",
                    at_line(&e)
                ),
            )),
            Err(e) if list_over.load(Ordering::Relaxed) > 0 => Err(Error::new(
                ErrorCode::InvalidArgument,
                format!(
                    "the chat template builds a list of {} items, past its cap of {max_items} \
                     ({TEMPLATE_LIST_ITEMS} plus two per message){}",
                    list_over.load(Ordering::Relaxed),
                    at_line(&e)
                ),
            )),
            Err(e) if parts_over.load(Ordering::Relaxed) > 0 => Err(Error::new(
                ErrorCode::InvalidArgument,
                format!(
                    "the chat template writes out a value of more than {max_parts} parts (a list \
                     or map that holds itself, or holds one list many times over){}",
                    at_line(&e)
                ),
            )),
            Err(e) if out.overflowed => Err(Error::new(
                ErrorCode::InvalidArgument,
                format!(
                    "the chat template's output passed {cap} bytes (1 MiB plus twice the \
                     conversation's {text_bytes} bytes of text){}",
                    at_line(&e)
                ),
            )),
            Err(e) => Err(Error::new(
                ErrorCode::InvalidArgument,
                format!(
                    "the chat template rejected the conversation: {}",
                    describe(&e)
                ),
            )),
        }
    }
}

/// The rendered text, refusing to grow past `cap` bytes (the write that would pass it fails,
/// which stops the render).
struct CappedWriter {
    buf: Vec<u8>,
    cap: usize,
    overflowed: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > self.cap {
            self.overflowed = true;
            return Err(std::io::Error::other("chat template output cap"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// [`ChatTemplate::select`] then [`ChatTemplate::render`] in one call.
pub fn render_chat(
    file_template: Option<&str>,
    arch: &str,
    has_token: &dyn Fn(&str) -> bool,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    ChatTemplate::select(file_template, arch, has_token, bos_token, eos_token)?
        .render(messages, add_generation_prompt)
}

/// `rendered` without a leading `bos_token`, for a tokenizer that adds BOS itself.
pub fn strip_leading_bos<'a>(rendered: &'a str, bos_token: &str) -> &'a str {
    if bos_token.is_empty() {
        rendered
    } else {
        rendered.strip_prefix(bos_token).unwrap_or(rendered)
    }
}

/// Block whitespace as transformers sets it (`trim_blocks`, `lstrip_blocks`, no trailing newline).
fn syntax() -> minijinja::syntax::SyntaxConfig {
    minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        .unwrap_or_default()
}

/// A minijinja environment set up like transformers' chat template renderer.
fn environment() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_syntax(syntax());
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    env
}

/// `tojson` as chat templates are written for: Python's `json.dumps`, which is what Hugging Face's
/// renderer registers under that name (and what llama.cpp's renderer writes). Keys in their
/// order, `", "` and `": "` between items (`","` and a newline with `indent`), non-ASCII text as
/// it is, and no HTML escaping: Jinja's and minijinja's own `tojson` write `<`, `>`, `&` and `'`
/// as `\u003c`..., so a tool description such as "a < b" would reach the model unlike the prompts
/// it was trained on. Takes `json.dumps`'s `indent` (also positional, as Jinja's filter does),
/// `separators`, `ensure_ascii` and `sort_keys`.
pub(crate) fn tojson(
    state: &minijinja::State,
    value: minijinja::Value,
    indent: Option<minijinja::Value>,
    kwargs: minijinja::value::Kwargs,
) -> std::result::Result<minijinja::Value, minijinja::Error> {
    let bad = |what: String| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, what);
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<minijinja::Value>>("indent")?,
    };
    // An integer is that many spaces, a string is itself (as in Python); none is one line.
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_str(), i64::try_from(v.clone()).ok()) {
            (Some(s), _) => Some(s.to_string()),
            (None, Some(n)) if (0..=64).contains(&n) => Some(" ".repeat(n as usize)),
            _ => {
                return Err(bad(format!(
                    "tojson: indent must be a small integer or a string, not {v}"
                )))
            }
        },
    };
    let (item, key) = match kwargs.get::<Option<minijinja::Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<String> = v
                .try_iter()
                .map_err(|_| bad(format!("tojson: separators must be two strings, not {v}")))?
                .map(|p| p.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .filter(|p| p.len() == 2)
                .ok_or_else(|| bad(format!("tojson: separators must be two strings, not {v}")))?;
            (parts[0].clone(), parts[1].clone())
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(
        &mut out,
        PyJson {
            item,
            key,
            indent,
            level: 0,
            has_value: false,
            ensure_ascii,
        },
    );
    let written = if sort_keys {
        serde_json::to_value(&value).and_then(|mut v| {
            v.sort_all_objects();
            serde::Serialize::serialize(&v, &mut ser)
        })
    } else {
        serde::Serialize::serialize(&value, &mut ser)
    };
    written.map_err(|e| bad(format!("tojson: cannot write this value as JSON: {e}")))?;
    // The engine charges for the returned string; this is the walk that produced it.
    state.consume_fuel(out.len() as u64 / 16)?;
    let text = String::from_utf8(out).map_err(|_| bad("tojson: not UTF-8".into()))?;
    Ok(minijinja::Value::from_safe_string(text))
}

/// serde_json's output in `json.dumps`'s layout (see [`tojson`]).
struct PyJson {
    item: String,
    key: String,
    indent: Option<String>,
    level: usize,
    /// Whether the container being written holds a value (an empty one stays `[]` / `{}`).
    has_value: bool,
    ensure_ascii: bool,
}

impl PyJson {
    fn newline<W: ?Sized + std::io::Write>(&self, w: &mut W) -> std::io::Result<()> {
        if let Some(ind) = &self.indent {
            w.write_all(b"\n")?;
            for _ in 0..self.level {
                w.write_all(ind.as_bytes())?;
            }
        }
        Ok(())
    }

    fn open<W: ?Sized + std::io::Write>(&mut self, w: &mut W, c: &[u8]) -> std::io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(c)
    }

    fn close<W: ?Sized + std::io::Write>(&mut self, w: &mut W, c: &[u8]) -> std::io::Result<()> {
        self.level -= 1;
        if self.has_value {
            self.newline(w)?;
        }
        w.write_all(c)
    }

    fn next<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if !first {
            w.write_all(self.item.as_bytes())?;
        }
        self.newline(w)
    }
}

impl serde_json::ser::Formatter for PyJson {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"[")
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"]")
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.next(w, first)
    }
    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"{")
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"}")
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.next(w, first)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(self.key.as_bytes())
    }
    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
    /// `ensure_ascii`: everything from DEL up as `\uXXXX` (UTF-16, as Python writes it).
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        if !self.ensure_ascii {
            return w.write_all(fragment.as_bytes());
        }
        for c in fragment.chars() {
            if (c as u32) < 0x7f {
                w.write_all(&[c as u8])?;
            } else {
                for u in c.encode_utf16(&mut [0; 2]) {
                    write!(w, "\\u{u:04x}")?;
                }
            }
        }
        Ok(())
    }
}

/// An error's detail (e.g. raise_exception's message) and where it happened.
fn describe(e: &minijinja::Error) -> String {
    let mut s = e
        .detail()
        .map(str::to_string)
        .unwrap_or_else(|| e.kind().to_string());
    if let Some(line) = e.line() {
        s.push_str(&format!(" (template line {line})"));
    }
    s
}

/// Render `messages` with a model's template (its own, else the built-in for its architecture),
/// ready for `Tokenizer::encode(.., add_special = true, parse_special = true)`: a leading BOS
/// the template wrote is removed, since the tokenizer adds it.
pub fn render_for_model(
    header: &crate::gguf::GgufHeader,
    tok: &crate::tokenizer::Tokenizer,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Result<String> {
    let text_of = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or("").to_string();
    let (bos, eos) = (text_of(tok.bos_id()), text_of(tok.eos_id()));
    let has = |t: &str| tok.token_id(t).is_some();
    let arch = header.architecture().unwrap_or("");
    let out = render_chat(
        header.get_str("tokenizer.chat_template"),
        arch,
        &has,
        messages,
        add_generation_prompt,
        &bos,
        &eos,
    )?;
    Ok(if tok.add_bos() {
        strip_leading_bos(&out, &bos).to_string()
    } else {
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv() -> Vec<ChatMessage> {
        vec![
            ChatMessage::system("You are terse."),
            ChatMessage::user("Hi!"),
            ChatMessage::assistant("Hello."),
            ChatMessage::user(" What is 2+2? "),
        ]
    }

    fn fixture(name: &str) -> &'static str {
        match name {
            "qwen2.5" => include_str!("../../tests/fixtures/chat/qwen2.5-instruct.jinja"),
            "llama3" => include_str!("../../tests/fixtures/chat/llama3-instruct.jinja"),
            "llama3.2" => include_str!("../../tests/fixtures/chat/llama3.2-instruct.jinja"),
            _ => unreachable!(),
        }
    }

    fn no_tokens(_: &str) -> bool {
        false
    }

    #[test]
    fn gemma_builtin_folds_system_into_the_first_user_turn() {
        let t = ChatTemplate::select(None, "gemma3", &no_tokens, "<bos>", "<eos>").unwrap();
        assert_eq!(t.builtin, Some(Builtin::Gemma));
        assert_eq!(
            t.render(&[ChatMessage::user("Hello")], true).unwrap(),
            "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            t.render(&conv(), true).unwrap(),
            "<start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            t.render(&[ChatMessage::user("x")], false).unwrap(),
            "<start_of_turn>user\nx<end_of_turn>\n"
        );
    }

    #[test]
    fn other_builtins_render_like_llama_cpp() {
        let m = conv();
        let r = |b| {
            ChatTemplate::builtin(b, "<s>", "</s>")
                .render(&m, true)
                .unwrap()
        };
        assert_eq!(
            r(Builtin::Llama3),
            "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_eq!(
            r(Builtin::ChatMl),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n\
             <|im_start|>user\n What is 2+2? <|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            r(Builtin::Llama2),
            "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi! [/INST]Hello.</s><s>[INST]  What is 2+2?  [/INST]"
        );
        assert_eq!(
            r(Builtin::Granite),
            "<|start_of_role|>system<|end_of_role|>You are terse.<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Hi!<|end_of_text|>\n\
             <|start_of_role|>assistant<|end_of_role|>Hello.<|end_of_text|>\n<|start_of_role|>user<|end_of_role|> What is 2+2? <|end_of_text|>\n\
             <|start_of_role|>assistant<|end_of_role|>"
        );
        assert_eq!(
            r(Builtin::Phi3),
            "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi!<|end|>\n<|assistant|>\nHello.<|end|>\n\
             <|user|>\n What is 2+2? <|end|>\n<|assistant|>\n"
        );
        assert_eq!(
            r(Builtin::Phi4),
            "<|im_start|>system<|im_sep|>You are terse.<|im_end|><|im_start|>user<|im_sep|>Hi!<|im_end|>\
             <|im_start|>assistant<|im_sep|>Hello.<|im_end|><|im_start|>user<|im_sep|> What is 2+2? <|im_end|>\
             <|im_start|>assistant<|im_sep|>"
        );
    }

    #[test]
    fn builtins_are_chosen_by_architecture() {
        let llama3_vocab = |t: &str| t == "<|start_header_id|>";
        assert_eq!(Builtin::detect("gemma3", &no_tokens), Some(Builtin::Gemma));
        assert_eq!(Builtin::detect("qwen2", &no_tokens), Some(Builtin::ChatMl));
        assert_eq!(Builtin::detect("qwen3", &no_tokens), Some(Builtin::ChatMl));
        assert_eq!(
            Builtin::detect("granite", &no_tokens),
            Some(Builtin::Granite)
        );
        assert_eq!(
            Builtin::detect("llama", &llama3_vocab),
            Some(Builtin::Llama3)
        );
        assert_eq!(Builtin::detect("llama", &no_tokens), Some(Builtin::Llama2));
        assert_eq!(Builtin::detect("phi3", &no_tokens), Some(Builtin::Phi3));
        assert_eq!(
            Builtin::detect("phi3", &|t: &str| t == "<|im_sep|>"),
            Some(Builtin::Phi4)
        );
        assert_eq!(Builtin::detect("lfm2", &no_tokens), None);
        assert_eq!(
            Builtin::detect("lfm2", &|t: &str| t == "<|im_start|>"),
            Some(Builtin::ChatMl)
        );
        let e = ChatTemplate::select(None, "mamba", &no_tokens, "", "").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        assert_eq!(Builtin::from_name("mistral"), Some(Builtin::Llama2));
    }

    /// Expected strings are what transformers' `apply_chat_template` gives for these templates.
    #[test]
    fn qwen2_5_official_template() {
        let t = ChatTemplate::new(fixture("qwen2.5"), "", "<|im_end|>").unwrap();
        assert_eq!(
            t.render(&[ChatMessage::user("Hello")], true).unwrap(),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
             <|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            t.render(&conv(), false).unwrap(),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n\
             <|im_start|>user\n What is 2+2? <|im_end|>\n"
        );
    }

    #[test]
    fn llama3_official_templates() {
        let t = ChatTemplate::new(fixture("llama3"), "<|begin_of_text|>", "<|eot_id|>").unwrap();
        let want = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>\
                    <|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>\
                    <|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
        let got = t.render(&conv(), true).unwrap();
        assert_eq!(got, want);
        // The built-in is the same text without BOS.
        assert_eq!(
            strip_leading_bos(&got, "<|begin_of_text|>"),
            ChatTemplate::builtin(Builtin::Llama3, "", "")
                .render(&conv(), true)
                .unwrap()
        );

        let t = ChatTemplate::new(fixture("llama3.2"), "<|begin_of_text|>", "<|eot_id|>").unwrap();
        assert_eq!(
            t.render(&conv(), true).unwrap(),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n\
             You are terse.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn raise_exception_and_syntax_errors_are_reported() {
        let t = ChatTemplate::new(
            "{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}ok",
            "",
            "",
        )
        .unwrap();
        assert_eq!(t.render(&[ChatMessage::user("a")], false).unwrap(), "ok");
        let e = t.render(&conv(), false).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        assert!(e.to_string().contains("one message only"), "{e}");
        let e = ChatTemplate::new("{% for %}", "", "").unwrap_err();
        assert_eq!(e.code, ErrorCode::BadGguf);
        // Python string methods (pycompat) work.
        let t = ChatTemplate::new("{{ messages[0].content.strip().upper() }}", "", "").unwrap();
        assert_eq!(
            t.render(&[ChatMessage::user("  hi ")], false).unwrap(),
            "HI"
        );
    }

    /// `tojson` writes what Python's `json.dumps` writes under Hugging Face's renderer (expected
    /// strings from Python 3): no HTML escaping, keys in order, its separators and options.
    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        let render = |expr: &str| {
            let src = format!(
                "{{% set v = {{'b': messages[0].content, 'a': [1, {{}}, []], 'c': {{'x': none, 'y': true}}}} %}}{{{{ {expr} }}}}"
            );
            ChatTemplate::new(&src, "", "")
                .unwrap()
                .render(&[ChatMessage::user("a < b & c > d, it's \u{e9}")], false)
        };
        assert_eq!(
            render("v|tojson").unwrap(),
            r#"{"b": "a < b & c > d, it's é", "a": [1, {}, []], "c": {"x": null, "y": true}}"#
        );
        let pretty = "{\n  \"b\": \"a < b & c > d, it's \u{e9}\",\n  \"a\": [\n    1,\n    {},\n    []\n  ],\n  \"c\": {\n    \"x\": null,\n    \"y\": true\n  }\n}";
        assert_eq!(render("v|tojson(indent=2)").unwrap(), pretty);
        assert_eq!(render("v|tojson(2)").unwrap(), pretty);
        assert_eq!(
            render("v|tojson(sort_keys=true, ensure_ascii=true, separators=[',', ':'])").unwrap(),
            r#"{"a":[1,{},[]],"b":"a < b & c > d, it's \u00e9","c":{"x":null,"y":true}}"#
        );
        assert_eq!(
            render("'\u{1F600}\u{7f}'|tojson(ensure_ascii=true)").unwrap(),
            r#""\ud83d\ude00\u007f""#
        );
        let e = render("v|tojson(colour=1)").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");
        let e = render("v|tojson(separators=[','])").unwrap_err();
        assert!(e.to_string().contains("separators"), "{e}");
    }

    fn weather_tool() -> serde_json::Value {
        serde_json::json!({"type": "function", "function": {"name": "get_weather", "description": "Weather now",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    /// A conversation with a call and its result, as OpenAI clients send it.
    fn tool_conv() -> Vec<ChatMessage> {
        let call: ChatMessage = serde_json::from_value(serde_json::json!({"role": "assistant", "content": null,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}))
        .unwrap();
        vec![
            ChatMessage::user("Weather in Paris?"),
            call,
            ChatMessage::tool("{\"temp\": 21}", "c1"),
        ]
    }

    #[test]
    fn templates_render_tools_calls_and_results() {
        let tools = [weather_tool()];
        // Qwen 2.5's own template: tools in <tools>, the call in <tool_call>, the result in
        // <tool_response>.
        let t = ChatTemplate::new(fixture("qwen2.5"), "", "<|im_end|>").unwrap();
        assert_eq!(
            t.tool_syntax(),
            Some(super::super::tools::ToolSyntax::Hermes)
        );
        let out = t
            .render_with_tools(&tool_conv(), Some(&tools), true)
            .unwrap();
        assert!(
            out.contains(
                "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""
            ),
            "{out}"
        );
        assert!(out.contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>"), "{out}");
        assert!(out.contains("<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"), "{out}");
        // Without tools the template renders as before.
        assert_eq!(
            t.render_with_tools(&conv(), None, true).unwrap(),
            t.render(&conv(), true).unwrap()
        );

        // Llama 3.2's: the tools in the first user turn, the call as {"name", "parameters"}.
        let t = ChatTemplate::new(fixture("llama3.2"), "<|begin_of_text|>", "<|eot_id|>").unwrap();
        assert_eq!(
            t.tool_syntax(),
            Some(super::super::tools::ToolSyntax::Llama3)
        );
        let out = t
            .render_with_tools(&tool_conv(), Some(&tools), true)
            .unwrap();
        assert!(out.contains("\"name\": \"get_weather\""), "{out}");
        assert!(
            out.contains("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"),
            "{out}"
        );
        assert!(
            out.contains(
                "<|start_header_id|>ipython<|end_header_id|>\n\n\"{\\\"temp\\\": 21}\"<|eot_id|>"
            ) || out.contains(
                "<|start_header_id|>ipython<|end_header_id|>\n\n{\"temp\": 21}<|eot_id|>"
            ),
            "{out}"
        );

        // The Gemma built-in: the fenced convention.
        let t = ChatTemplate::builtin(Builtin::Gemma, "<bos>", "<eos>");
        assert_eq!(
            t.tool_syntax(),
            Some(super::super::tools::ToolSyntax::Fenced)
        );
        let out = t
            .render_with_tools(&tool_conv(), Some(&tools), true)
            .unwrap();
        assert!(
            out.starts_with("<start_of_turn>user\nYou can call these functions"),
            "{out}"
        );
        assert!(out.contains("Weather in Paris?<end_of_turn>\n<start_of_turn>model\n```tool_call\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```<end_of_turn>\n\
             <start_of_turn>user\n```tool_result\n{\"temp\": 21}\n```<end_of_turn>\n<start_of_turn>model\n"), "{out}");
        // The ChatML built-in: Qwen's convention.
        let t = ChatTemplate::builtin(Builtin::ChatMl, "", "");
        assert_eq!(
            t.tool_syntax(),
            Some(super::super::tools::ToolSyntax::Hermes)
        );
        let out = t
            .render_with_tools(&tool_conv(), Some(&tools), true)
            .unwrap();
        assert!(
            out.starts_with("<|im_start|>system\nFunctions you can call"),
            "{out}"
        );
        assert!(out.contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n\
             <|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"), "{out}");
        // The Llama 3 built-in defines no tool syntax.
        assert_eq!(
            ChatTemplate::builtin(Builtin::Llama3, "", "").tool_syntax(),
            None
        );
    }
}
