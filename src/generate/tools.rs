//! Tool calls (OpenAI's `tools` / `tool_choice`): the tools go into the chat template, the
//! model's own call syntax is constrained while it is generated and parsed back into calls.
//!
//! Each family writes a call its own way; [`ToolSyntax::detect`] reads it off the template:
//! - [`ToolSyntax::Hermes`] (Qwen 2.5 / Qwen 3, the ChatML built-in):
//!   `<tool_call>\n{"name": "f", "arguments": {..}}\n</tool_call>`, one block per call.
//! - [`ToolSyntax::Llama3`] (Llama 3.1+ JSON tool calling): the whole answer is
//!   `{"name": "f", "parameters": {..}}`; after `<|python_tag|>` a call may also follow text.
//! - [`ToolSyntax::Lfm2`] (LFM2): `<|tool_call_start|>[f(a="x", b=1)]<|tool_call_end|>`, a
//!   Python-style call list. The markers are control tokens, which render as no text: with tools
//!   generation shows them as text ([`ToolSyntax::markers`]), and the parser also takes the bare
//!   list.
//! - [`ToolSyntax::Fenced`] (the Gemma built-in: Gemma 3's template defines no tool syntax): a
//!   fenced JSON block, `` ```tool_call\n{"name": "f", "arguments": {..}}\n``` ``.
//!
//! The grammar ([`ToolSyntax::grammar`]) is free text, optionally followed by calls
//! (`tool_choice: "auto"`: the call's marker, `<tool_call>` for Qwen, may come after any text),
//! calls only (`"required"`), or one call of a named function. From the marker on, the arguments
//! of each call are held to that tool's JSON Schema by llguidance's `%json`; the parser returns
//! the text before the calls as the answer's content.

use serde_json::{json, Value};

use super::constraint::ConstraintSpec;
use crate::error::{Error, Result};

/// One tool the model may call: OpenAI's `{type: "function", function: {name, description,
/// parameters}}`, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The arguments' JSON Schema (`{"type": "object"}` when the tool gives none).
    pub parameters: Value,
}

/// A call parsed from the model's output.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ToolCall {
    pub name: String,
    /// The arguments object.
    pub arguments: Value,
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

impl ToolChoice {
    /// `"none" | "auto" | "required" | {type: "function", function: {name}}` (absent: auto).
    pub fn from_json(v: Option<&Value>) -> Result<Self> {
        let Some(v) = v.filter(|v| !v.is_null()) else {
            return Ok(ToolChoice::Auto);
        };
        match v.as_str() {
            Some("none") => return Ok(ToolChoice::None),
            Some("auto") => return Ok(ToolChoice::Auto),
            Some("required") => return Ok(ToolChoice::Required),
            _ => {}
        }
        v.get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map(|n| ToolChoice::Named(n.to_string()))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "tool_choice must be 'none', 'auto', 'required' or {{type: 'function', function: {{name}}}}, not {v}"
                ))
            })
    }
}

/// Check OpenAI's `tools` array.
pub fn parse_tools(tools: &[Value]) -> Result<Vec<Tool>> {
    let mut out: Vec<Tool> = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let ty = t.get("type").and_then(Value::as_str).unwrap_or("function");
        if ty != "function" {
            return Err(Error::invalid(format!(
                "tools[{i}]: type '{ty}' is not supported (only 'function')"
            )));
        }
        let f = t
            .get("function")
            .ok_or_else(|| Error::invalid(format!("tools[{i}] needs a 'function'")))?;
        let name = f.get("name").and_then(Value::as_str).unwrap_or("");
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        {
            return Err(Error::invalid(format!(
                "tools[{i}].function.name must be letters, digits, '_', '-' or '.', not {name:?}"
            )));
        }
        if out.iter().any(|o| o.name == name) {
            return Err(Error::invalid(format!(
                "tools[{i}]: two tools are named '{name}'"
            )));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(p) if p.is_object() => p.clone(),
            Some(p) => {
                return Err(Error::invalid(format!(
                    "tools[{i}].function.parameters must be a JSON Schema object, not {p}"
                )))
            }
        };
        out.push(Tool {
            name: name.to_string(),
            parameters,
        });
    }
    Ok(out)
}

/// How a model family writes a tool call (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    Hermes,
    Llama3,
    Lfm2,
    Fenced,
}

impl ToolSyntax {
    /// The syntax a template's source asks for; `None` when it defines none.
    pub fn detect(template_source: &str) -> Option<ToolSyntax> {
        let s = template_source;
        if s.contains("<|tool_call_start|>") || s.contains("<|tool_list_start|>") {
            Some(ToolSyntax::Lfm2)
        } else if s.contains("<tool_call>") {
            Some(ToolSyntax::Hermes)
        } else if s.contains("```tool_call") {
            Some(ToolSyntax::Fenced)
        } else if s.contains("<|start_header_id|>") && s.contains("\"parameters\"") {
            Some(ToolSyntax::Llama3)
        } else {
            None
        }
    }

    /// The JSON object key of a call's arguments.
    fn args_key(self) -> &'static str {
        match self {
            ToolSyntax::Llama3 => "parameters",
            _ => "arguments",
        }
    }

    /// The text that opens a call (see the module docs). Llama 3's JSON call needs none at the
    /// start of the answer; after text it follows `<|python_tag|>`.
    fn marker(self) -> &'static str {
        match self {
            ToolSyntax::Hermes => "<tool_call>",
            ToolSyntax::Fenced => "```tool_call",
            ToolSyntax::Llama3 => "<|python_tag|>",
            ToolSyntax::Lfm2 => "<|tool_call_start|>",
        }
    }

    /// Every marker of the syntax. Where the vocabulary makes one a control token it renders as
    /// no text, so generation shows these as text ([`GenerateOptions::shown_control`]) for the
    /// parser and the stream to see where a call begins and ends.
    ///
    /// [`GenerateOptions::shown_control`]: super::session::GenerateOptions::shown_control
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolSyntax::Hermes => &["<tool_call>", "</tool_call>"],
            ToolSyntax::Fenced => &[],
            ToolSyntax::Llama3 => &["<|python_tag|>"],
            ToolSyntax::Lfm2 => &["<|tool_call_start|>", "<|tool_call_end|>"],
        }
    }

    /// The grammar for `choice` over `tools` (`None` for `tool_choice: "none"`). `special` says
    /// whether a marker text is a control token of the vocabulary: then the grammar names the
    /// token (`<|tool_call_start|>`) instead of spelling its text.
    pub fn grammar(
        self,
        tools: &[Tool],
        choice: &ToolChoice,
        special: &dyn Fn(&str) -> bool,
    ) -> Result<Option<ConstraintSpec>> {
        let allowed: Vec<&Tool> = match choice {
            ToolChoice::None => return Ok(None),
            ToolChoice::Named(n) => {
                let t = tools.iter().find(|t| &t.name == n).ok_or_else(|| {
                    Error::invalid(format!("tool_choice names '{n}', which is not in tools"))
                })?;
                vec![t]
            }
            _ => tools.iter().collect(),
        };
        if allowed.is_empty() {
            return Err(Error::invalid(format!(
                "tool_choice {choice:?} needs at least one tool"
            )));
        }
        let lit = |s: &str| -> String {
            if special(s) {
                s.to_string()
            } else {
                json_str(s)
            }
        };
        let mut g = String::new();
        // One call (a Named choice) or one or more.
        let many = !matches!(choice, ToolChoice::Named(_));
        // `call_body`: one call after its marker; `more`: the calls after the first.
        let mut more = String::new();
        match self {
            ToolSyntax::Lfm2 => {
                // One list holds every call.
                g.push_str(&format!(
                    "call_body: \"[\" call {} \"]\" {}\n",
                    if many { "(\", \" call)*" } else { "" },
                    lit("<|tool_call_end|>")
                ));
                g.push_str(&python_calls(&allowed)?);
            }
            _ => {
                let close = match self {
                    ToolSyntax::Hermes => "\n</tool_call>",
                    ToolSyntax::Fenced => "\n```",
                    _ => "",
                };
                if self == ToolSyntax::Llama3 {
                    g.push_str("call_body: call_json\n");
                } else {
                    g.push_str(&format!(
                        "call_body: \"\\n\" call_json {}\n",
                        json_str(close)
                    ));
                    if many {
                        more = format!(" (\"\\n\" {} call_body)*", lit(self.marker()));
                    }
                }
                let key = self.args_key();
                let alternatives: Vec<Value> = allowed
                    .iter()
                    .map(|t| {
                        json!({
                            "type": "object",
                            "properties": {"name": {"const": t.name}, key: t.parameters},
                            "required": ["name", key],
                            "additionalProperties": false
                        })
                    })
                    .collect();
                // Python's json.dumps separators: what the templates' `tojson` writes.
                let schema = json!({
                    "anyOf": alternatives,
                    "x-guidance": {"whitespace_flexible": false, "key_separator": ": ", "item_separator": ", "}
                });
                g.push_str(&format!("call_json: %json {schema}\n"));
            }
        }
        let marker = self.marker();
        let start = match choice {
            ToolChoice::Auto => {
                // Free text, then optionally the calls: the marker may come after any text, and
                // from the marker on the calls are held to the grammar. Llama 3's bare JSON call
                // may only be the whole answer, so its free text may not begin with a brace.
                let not_json = if self == ToolSyntax::Llama3 {
                    " & ~/(?s:\\s*\\{.*)/"
                } else {
                    ""
                };
                g.push_str(&format!("TEXT: /(?s:.+)/{not_json}\n"));
                let bare = if self == ToolSyntax::Llama3 {
                    " | call_json"
                } else {
                    ""
                };
                if special(marker) {
                    // A control token is no text: TEXT runs up to it.
                    format!("start: TEXT | TEXT? {marker} call_body{more}{bare}\n")
                } else {
                    // The lead ends at the first marker (a lazy lexeme is done as soon as it
                    // matches, and wins over TEXT there): text can never hold a marker that
                    // escapes the grammar.
                    g.push_str(&format!(
                        "LEAD: /(?s:.*){}/{not_json}\nlead[lazy]: LEAD\n",
                        regex_escape(marker)
                    ));
                    format!("start: TEXT | lead call_body{more}{bare}\n")
                }
            }
            _ if self == ToolSyntax::Llama3 => "start: call_body\n".to_string(),
            _ => format!("start: {} call_body{more}\n", lit(marker)),
        };
        Ok(Some(ConstraintSpec::Lark(format!("{start}{g}"))))
    }

    /// Split an answer into its text and its calls (no calls: the text is the whole answer).
    pub fn parse(self, text: &str) -> (String, Vec<ToolCall>) {
        let calls = match self {
            ToolSyntax::Hermes => blocks(text, "<tool_call>", "</tool_call>", self),
            ToolSyntax::Fenced => blocks(text, "```tool_call", "```", self),
            ToolSyntax::Llama3 => {
                // The calls are the whole answer, or follow `<|python_tag|>` (after text or not).
                let (before, t) = match text.find("<|python_tag|>") {
                    Some(i) => (&text[..i], &text[i + "<|python_tag|>".len()..]),
                    None => ("", text),
                };
                let t = t.trim();
                // One call, or several separated by ';' (what Llama 3.1's docs show).
                let calls: Option<Vec<ToolCall>> = if t.starts_with('{') {
                    split_json_values(t, ';').map(|vs| {
                        vs.iter()
                            .filter_map(|v| call_from_json(v, self))
                            .collect::<Vec<_>>()
                    })
                } else {
                    None
                };
                match calls {
                    Some(c) if !c.is_empty() => Some((before.to_string(), c)),
                    _ => None,
                }
            }
            ToolSyntax::Lfm2 => {
                let (before, body, after) = match (
                    text.find("<|tool_call_start|>"),
                    text.find("<|tool_call_end|>"),
                ) {
                    (Some(a), Some(b)) if a < b => (
                        &text[..a],
                        &text[a + "<|tool_call_start|>".len()..b],
                        &text[b + "<|tool_call_end|>".len()..],
                    ),
                    _ => ("", text.trim(), ""),
                };
                parse_python_calls(body.trim()).map(|c| (format!("{before}{after}"), c))
            }
        };
        match calls {
            Some((rest, c)) if !c.is_empty() => (rest.trim().to_string(), c),
            _ => (text.to_string(), Vec::new()),
        }
    }
}

/// A Lark string literal.
fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .map(|c| {
            if "\\.+*?()|[]{}^$/".contains(c) {
                format!("\\{c}")
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `{"name": .., "arguments"|"parameters": {..}}` -> a call.
fn call_from_json(v: &Value, syntax: ToolSyntax) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get(syntax.args_key())
        .or_else(|| v.get("arguments"))
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or_else(|| json!({}));
    // Some models write the arguments as a JSON string.
    let arguments = match args {
        Value::String(s) => serde_json::from_str(&s).ok()?,
        a => a,
    };
    Some(ToolCall { name, arguments })
}

/// Every `open .. close` block holding a JSON call; the text outside them.
fn blocks(
    text: &str,
    open: &str,
    close: &str,
    syntax: ToolSyntax,
) -> Option<(String, Vec<ToolCall>)> {
    let (mut rest, mut calls, mut outside) = (text, Vec::new(), String::new());
    while let Some(a) = rest.find(open) {
        outside.push_str(&rest[..a]);
        let body = &rest[a + open.len()..];
        let (inner, next) = match body.find(close) {
            Some(b) => (&body[..b], &body[b + close.len()..]),
            None => (body, ""),
        };
        let v: Value = serde_json::from_str(inner.trim()).ok()?;
        calls.push(call_from_json(&v, syntax)?);
        rest = next;
    }
    outside.push_str(rest);
    Some((outside, calls))
}

/// JSON values separated by `sep` (and whitespace); `None` when any part is not JSON.
fn split_json_values(s: &str, sep: char) -> Option<Vec<Value>> {
    let mut out = Vec::new();
    let mut stream = serde_json::Deserializer::from_str(s).into_iter::<Value>();
    loop {
        match stream.next() {
            Some(Ok(v)) => out.push(v),
            Some(Err(_)) => {
                // The separator stops the stream reader: skip it and go on.
                let off = stream.byte_offset();
                let tail = s[off..].trim_start();
                let tail = tail.strip_prefix(sep)?;
                let mut more = split_json_values(tail, sep)?;
                out.append(&mut more);
                return Some(out);
            }
            None => return Some(out),
        }
    }
}

/// The LFM2 grammar's `call` rule: `name(key=value, ..)` with values held to each property's
/// schema (JSON literals: Python reads strings, numbers, lists and dicts the same), required
/// keys present, the schema's order kept.
fn python_calls(tools: &[&Tool]) -> Result<String> {
    let mut g = String::new();
    let names: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
    g.push_str(&format!("call: {}\n", names.join(" | ")));
    for (i, t) in tools.iter().enumerate() {
        let props: Vec<(String, Value)> = t
            .parameters
            .get("properties")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let required: Vec<&str> = t
            .parameters
            .get("required")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (k, _) in &props {
            if !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(Error::invalid(format!(
                    "tool '{}': argument name {k:?} cannot be a Python keyword argument (LFM2's call syntax)",
                    t.name
                )));
            }
        }
        // Rules a{i}_{j}_first / a{i}_{j}_more: the arguments from the j-th on, when none /
        // some have been written (the comma goes before every argument but the first).
        let n = props.len();
        g.push_str(&format!(
            "call_{i}: {} \"(\" a{i}_0_first \")\"\n",
            json_str(&t.name)
        ));
        g.push_str(&format!("a{i}_{n}_first: \"\"\na{i}_{n}_more: \"\"\n"));
        for (j, (k, schema)) in props.iter().enumerate() {
            let item = format!(
                "{} %json {}",
                json_str(&format!("{k}=")),
                json!({"allOf": [schema], "x-guidance": {"whitespace_flexible": false, "key_separator": ": ", "item_separator": ", "}})
            );
            let opt = !required.contains(&k.as_str());
            let skip_first = if opt {
                format!(" | a{i}_{}_first", j + 1)
            } else {
                String::new()
            };
            let skip_more = if opt {
                format!(" | a{i}_{}_more", j + 1)
            } else {
                String::new()
            };
            g.push_str(&format!(
                "a{i}_{j}_first: {item} a{i}_{}_more{skip_first}\n",
                j + 1
            ));
            g.push_str(&format!(
                "a{i}_{j}_more: \", \" {item} a{i}_{}_more{skip_more}\n",
                j + 1
            ));
        }
    }
    Ok(g)
}

/// `[f(a="x", b=1), g()]` -> calls. Values are Python literals: JSON plus `True`, `False`,
/// `None` and single-quoted strings.
fn parse_python_calls(s: &str) -> Option<Vec<ToolCall>> {
    let mut p = Py {
        s: s.as_bytes(),
        i: 0,
    };
    p.ws();
    let bracketed = p.eat(b'[');
    let mut calls = Vec::new();
    loop {
        p.ws();
        if bracketed && p.eat(b']') {
            break;
        }
        let name = p.ident()?;
        p.ws();
        if !p.eat(b'(') {
            return None;
        }
        let mut args = serde_json::Map::new();
        loop {
            p.ws();
            if p.eat(b')') {
                break;
            }
            let k = p.ident()?;
            p.ws();
            if !p.eat(b'=') {
                return None;
            }
            let v = p.value()?;
            args.insert(k, v);
            p.ws();
            if !p.eat(b',') {
                p.ws();
                if !p.eat(b')') {
                    return None;
                }
                break;
            }
        }
        calls.push(ToolCall {
            name,
            arguments: Value::Object(args),
        });
        p.ws();
        if !p.eat(b',') {
            p.ws();
            if bracketed && !p.eat(b']') {
                return None;
            }
            break;
        }
    }
    p.ws();
    (p.i == p.s.len()).then_some(calls)
}

/// A tiny reader of Python literals.
struct Py<'a> {
    s: &'a [u8],
    i: usize,
}

impl Py<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn ident(&mut self) -> Option<String> {
        let a = self.i;
        while self.i < self.s.len()
            && (self.s[self.i].is_ascii_alphanumeric() || b"_-.".contains(&self.s[self.i]))
        {
            self.i += 1;
        }
        (self.i > a).then(|| String::from_utf8_lossy(&self.s[a..self.i]).into_owned())
    }
    fn value(&mut self) -> Option<Value> {
        self.ws();
        let c = *self.s.get(self.i)?;
        match c {
            b'\'' | b'"' => {
                let q = c;
                self.i += 1;
                let mut out = Vec::new();
                while let Some(&b) = self.s.get(self.i) {
                    self.i += 1;
                    if b == q {
                        return Some(Value::String(String::from_utf8(out).ok()?));
                    }
                    if b == b'\\' {
                        let e = *self.s.get(self.i)?;
                        self.i += 1;
                        out.push(match e {
                            b'n' => b'\n',
                            b't' => b'\t',
                            other => other,
                        });
                    } else {
                        out.push(b);
                    }
                }
                None
            }
            b'[' => {
                self.i += 1;
                let mut a = Vec::new();
                loop {
                    self.ws();
                    if self.eat(b']') {
                        return Some(Value::Array(a));
                    }
                    a.push(self.value()?);
                    self.ws();
                    if !self.eat(b',') {
                        self.ws();
                        return self.eat(b']').then_some(Value::Array(a));
                    }
                }
            }
            b'{' => {
                self.i += 1;
                let mut m = serde_json::Map::new();
                loop {
                    self.ws();
                    if self.eat(b'}') {
                        return Some(Value::Object(m));
                    }
                    let k = match self.value()? {
                        Value::String(k) => k,
                        _ => return None,
                    };
                    self.ws();
                    if !self.eat(b':') {
                        return None;
                    }
                    m.insert(k, self.value()?);
                    self.ws();
                    if !self.eat(b',') {
                        self.ws();
                        return self.eat(b'}').then_some(Value::Object(m));
                    }
                }
            }
            _ => {
                let a = self.i;
                while self.i < self.s.len()
                    && (self.s[self.i].is_ascii_alphanumeric() || b"+-._".contains(&self.s[self.i]))
                {
                    self.i += 1;
                }
                match std::str::from_utf8(&self.s[a..self.i]).ok()? {
                    "True" | "true" => Some(Value::Bool(true)),
                    "False" | "false" => Some(Value::Bool(false)),
                    "None" | "null" => Some(Value::Null),
                    num => serde_json::from_str::<serde_json::Number>(num)
                        .ok()
                        .map(Value::Number),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Vec<Tool> {
        parse_tools(&[
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"]
            }}}),
        ])
        .unwrap()
    }

    fn call(name: &str, arguments: Value) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments,
        }
    }

    #[test]
    fn hermes_calls_parse() {
        let s = ToolSyntax::Hermes;
        let (text, calls) = s.parse("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
        assert_eq!(text, "");
        assert_eq!(
            calls,
            vec![
                call("get_weather", json!({"city": "Paris"})),
                call("f", json!({}))
            ]
        );
        // Text before a call is kept; an unclosed final block still parses (stopped at EOS).
        let (text, calls) =
            s.parse("Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}");
        assert_eq!(text, "Let me check.");
        assert_eq!(calls, vec![call("f", json!({"a": 1}))]);
        // Not a call: all of it is text.
        let t = "<tool_call>\nnot json\n</tool_call>";
        assert_eq!(s.parse(t), (t.to_string(), vec![]));
        assert_eq!(s.parse("Hello"), ("Hello".to_string(), vec![]));
    }

    #[test]
    fn llama3_calls_parse() {
        let s = ToolSyntax::Llama3;
        assert_eq!(
            s.parse("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"),
            (
                String::new(),
                vec![call("get_weather", json!({"city": "Paris"}))]
            )
        );
        assert_eq!(
            s.parse("<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 2}\"}").1,
            vec![call("a", json!({})), call("b", json!({"x": 2}))]
        );
        assert_eq!(s.parse("{\"not\": \"a call\"}").1, Vec::<ToolCall>::new());
        assert_eq!(s.parse("The answer is 4.").0, "The answer is 4.");
        // Text, then a call after <|python_tag|>: the text is the content.
        assert_eq!(
            s.parse("Let me check.\n<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"),
            (
                "Let me check.".to_string(),
                vec![call("get_weather", json!({"city": "Oslo"}))]
            )
        );
    }

    #[test]
    fn lfm2_calls_parse() {
        let s = ToolSyntax::Lfm2;
        assert_eq!(
            s.parse("<|tool_call_start|>[get_weather(city=\"Paris\", unit='c'), ping()]<|tool_call_end|>Checking."),
            (
                "Checking.".to_string(),
                vec![
                    call("get_weather", json!({"city": "Paris", "unit": "c"})),
                    call("ping", json!({}))
                ]
            )
        );
        // Markers are control tokens (no text): the bare list, Python literals.
        assert_eq!(
            s.parse("[f(a=True, b=None, c=[1, 2.5], d={'k': False}, e=-3)]")
                .1,
            vec![call(
                "f",
                json!({"a": true, "b": null, "c": [1, 2.5], "d": {"k": false}, "e": -3})
            )]
        );
        assert_eq!(s.parse("[not a call").1, Vec::<ToolCall>::new());
        assert_eq!(s.parse("Plain answer.").0, "Plain answer.");
    }

    #[test]
    fn fenced_calls_parse() {
        let s = ToolSyntax::Fenced;
        assert_eq!(
            s.parse("```tool_call\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n```"),
            (
                String::new(),
                vec![call("get_weather", json!({"city": "Oslo"}))]
            )
        );
        assert_eq!(
            s.parse("```python\nprint(1)\n```").1,
            Vec::<ToolCall>::new()
        );
    }

    #[test]
    fn syntaxes_are_detected_from_templates() {
        let qwen = include_str!("../../tests/fixtures/chat/qwen2.5-instruct.jinja");
        let llama = include_str!("../../tests/fixtures/chat/llama3.2-instruct.jinja");
        assert_eq!(ToolSyntax::detect(qwen), Some(ToolSyntax::Hermes));
        assert_eq!(ToolSyntax::detect(llama), Some(ToolSyntax::Llama3));
        assert_eq!(
            ToolSyntax::detect("{{ '<|tool_list_start|>' }}"),
            Some(ToolSyntax::Lfm2)
        );
        let old = include_str!("../../tests/fixtures/chat/llama3-instruct.jinja");
        assert_eq!(ToolSyntax::detect(old), None);
    }

    #[test]
    fn tools_and_choices_are_checked() {
        assert!(parse_tools(&[json!({"type": "retrieval"})]).is_err());
        assert!(parse_tools(&[json!({"function": {"name": "a b"}})]).is_err());
        assert!(parse_tools(&[json!({"function": {"name": "a", "parameters": 3}})]).is_err());
        let e = parse_tools(&[
            json!({"function": {"name": "a"}}),
            json!({"function": {"name": "a"}}),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("two tools"), "{e}");
        assert_eq!(
            parse_tools(&[json!({"function": {"name": "a"}})]).unwrap()[0].parameters,
            json!({"type": "object"})
        );
        assert_eq!(
            ToolChoice::from_json(Some(
                &json!({"type": "function", "function": {"name": "f"}})
            ))
            .unwrap(),
            ToolChoice::Named("f".into())
        );
        assert_eq!(ToolChoice::from_json(None).unwrap(), ToolChoice::Auto);
        assert!(ToolChoice::from_json(Some(&json!("sometimes"))).is_err());
        let none = |_: &str| false;
        let e = ToolSyntax::Hermes
            .grammar(&weather(), &ToolChoice::Named("nope".into()), &none)
            .unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        assert_eq!(
            ToolSyntax::Hermes
                .grammar(&weather(), &ToolChoice::None, &none)
                .unwrap(),
            None
        );
    }
}
