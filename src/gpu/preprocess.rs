//! A tiny WGSL preprocessor: `#include "file"`, `#define NAME [value]`, `#undef`, `#ifdef`,
//! `#ifndef`, `#else`, `#endif`. Nothing clever.
//!
//! Every directive line (and every line switched off by a conditional) becomes an empty line, so
//! the compiler's line numbers inside one file stay right. An `#include` splices the file in
//! place; [`Preprocessed::origin`] maps any output line back to its file and line for errors.
//! Defines with a value replace whole identifiers in code lines (`WG_SIZE` -> `256u`); this is
//! how a loop bound and the Rust dispatch come from the same number.

use std::collections::HashMap;

use crate::error::{Error, Result};

/// The output of [`preprocess`]: WGSL text plus a line map back to the sources.
#[derive(Clone, Debug)]
pub struct Preprocessed {
    pub source: String,
    /// `(file, 1-based line)` for each output line.
    pub lines: Vec<(String, u32)>,
}

impl Preprocessed {
    /// Where output line `line` (1-based) came from, as `file:line`.
    pub fn origin(&self, line: usize) -> String {
        match self.lines.get(line.wrapping_sub(1)) {
            Some((f, l)) => format!("{f}:{l}"),
            None => format!("<generated>:{line}"),
        }
    }
}

/// Expand `name` (looked up with `resolve`) under `defines`.
pub fn preprocess(
    name: &str,
    defines: &[(&str, &str)],
    resolve: &dyn Fn(&str) -> Option<&'static str>,
) -> Result<Preprocessed> {
    let mut st = State {
        defines: defines
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        out: String::new(),
        lines: Vec::new(),
        stack: Vec::new(),
    };
    st.file(name, resolve, 0)?;
    Ok(Preprocessed {
        source: st.out,
        lines: st.lines,
    })
}

struct State {
    defines: HashMap<String, String>,
    out: String,
    lines: Vec<(String, u32)>,
    /// Include chain, to reject cycles.
    stack: Vec<String>,
}

/// One open `#if...` block: whether its branch is taken, whether the enclosing one was active,
/// and whether `#else` was seen.
struct Cond {
    taken: bool,
    parent_active: bool,
    seen_else: bool,
    line: u32,
}

impl State {
    fn file(
        &mut self,
        name: &str,
        resolve: &dyn Fn(&str) -> Option<&'static str>,
        depth: usize,
    ) -> Result<()> {
        if depth > 16 || self.stack.iter().any(|s| s == name) {
            return Err(Error::internal(format!(
                "#include cycle through {name}: {:?}",
                self.stack
            )));
        }
        let text = resolve(name)
            .ok_or_else(|| Error::internal(format!("shader file not found: {name}")))?;
        self.stack.push(name.to_string());
        let mut conds: Vec<Cond> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let lineno = i as u32 + 1;
            let active = conds.last().is_none_or(|c| c.taken && c.parent_active);
            let trimmed = raw.trim_start();
            let at = |msg: &str| Error::internal(format!("{name}:{lineno}: {msg}"));
            if let Some(dir) = trimmed.strip_prefix('#') {
                let mut parts = dir.split_whitespace();
                let word = parts.next().unwrap_or("");
                let arg = parts.next();
                match word {
                    "ifdef" | "ifndef" => {
                        let sym = arg.ok_or_else(|| at("#ifdef needs a name"))?;
                        let defined = self.defines.contains_key(sym);
                        conds.push(Cond {
                            taken: defined == (word == "ifdef"),
                            parent_active: active,
                            seen_else: false,
                            line: lineno,
                        });
                    }
                    "else" => {
                        let c = conds.last_mut().ok_or_else(|| at("#else without #ifdef"))?;
                        if c.seen_else {
                            return Err(at("second #else"));
                        }
                        c.seen_else = true;
                        c.taken = !c.taken;
                    }
                    "endif" => {
                        conds.pop().ok_or_else(|| at("#endif without #ifdef"))?;
                    }
                    "define" if active => {
                        let sym = arg.ok_or_else(|| at("#define needs a name"))?;
                        let rest: Vec<&str> = parts.collect();
                        self.defines.insert(sym.to_string(), rest.join(" "));
                    }
                    "undef" if active => {
                        self.defines
                            .remove(arg.ok_or_else(|| at("#undef needs a name"))?);
                    }
                    "include" if active => {
                        let inc = trimmed["include".len() + 1..].trim();
                        let inc = inc.strip_prefix('"').and_then(|s| s.strip_suffix('"'));
                        let inc = inc.ok_or_else(|| at("#include needs a \"quoted\" file name"))?;
                        self.file(inc, resolve, depth + 1)?;
                        continue; // the included file's lines stand in for this one
                    }
                    "define" | "undef" | "include" => {}
                    other => return Err(at(&format!("unknown directive #{other}"))),
                }
                self.emit("", name, lineno);
            } else if active {
                let line = self.substitute(raw);
                self.emit(&line, name, lineno);
            } else {
                self.emit("", name, lineno);
            }
        }
        if let Some(c) = conds.last() {
            return Err(Error::internal(format!(
                "{name}:{}: #ifdef without #endif",
                c.line
            )));
        }
        self.stack.pop();
        Ok(())
    }

    fn emit(&mut self, line: &str, file: &str, lineno: u32) {
        self.out.push_str(line);
        self.out.push('\n');
        self.lines.push((file.to_string(), lineno));
    }

    /// Replace whole identifiers that have a non-empty define value. Comments are left alone.
    fn substitute(&self, line: &str) -> String {
        if self.defines.values().all(|v| v.is_empty()) {
            return line.to_string();
        }
        let (code, comment) = match line.find("//") {
            Some(i) => line.split_at(i),
            None => (line, ""),
        };
        let mut out = String::with_capacity(line.len());
        let bytes = code.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let c = bytes[i];
            if c.is_ascii_alphabetic() || c == b'_' {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let ident = &code[start..i];
                match self.defines.get(ident) {
                    Some(v) if !v.is_empty() => out.push_str(v),
                    _ => out.push_str(ident),
                }
            } else if c.is_ascii_digit() {
                // A number literal (with suffix like `1u` or `0x1F`): copy as is.
                let start = i;
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.' || bytes[i] == b'_')
                {
                    i += 1;
                }
                out.push_str(&code[start..i]);
            } else {
                let ch = code[i..].chars().next().unwrap_or(' ');
                out.push(ch);
                i += ch.len_utf8();
            }
        }
        out.push_str(comment);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(name: &str) -> Option<&'static str> {
        match name {
            "main.wgsl" => Some(
                "#include \"lib.tmpl\"\n#ifdef FAST\nfast();\n#else\nslow();\n#endif\nlet n = WG;\n// WG stays in comments\n",
            ),
            "lib.tmpl" => Some("#ifndef LIB\n#define LIB\nfn lib() {}\n#endif\n"),
            "cycle_a" => Some("#include \"cycle_b\"\n"),
            "cycle_b" => Some("#include \"cycle_a\"\n"),
            "twice.wgsl" => Some("#include \"lib.tmpl\"\n#include \"lib.tmpl\"\nx\n"),
            "unterminated" => Some("#ifdef X\nx\n"),
            "nested" => Some("#ifdef A\n#ifdef B\nab\n#else\na_not_b\n#endif\n#else\n#ifdef B\nnot_a_b\n#endif\n#endif\n"),
            _ => None,
        }
    }

    fn code_lines(p: &Preprocessed) -> Vec<&str> {
        p.source.lines().filter(|l| !l.trim().is_empty()).collect()
    }

    #[test]
    fn include_define_ifdef_else() {
        let p = preprocess("main.wgsl", &[("FAST", ""), ("WG", "64u")], &files).unwrap();
        assert_eq!(
            code_lines(&p),
            [
                "fn lib() {}",
                "fast();",
                "let n = 64u;",
                "// WG stays in comments"
            ]
        );
        let p = preprocess("main.wgsl", &[("WG", "64u")], &files).unwrap();
        assert!(p.source.contains("slow();") && !p.source.contains("fast();"));
    }

    #[test]
    fn directive_lines_stay_blank_and_lines_map_back() {
        let p = preprocess("main.wgsl", &[("WG", "8u")], &files).unwrap();
        // lib.tmpl contributes 4 lines; then main.wgsl lines 2..=8.
        assert_eq!(p.lines.len(), 4 + 7);
        let out: Vec<&str> = p.source.lines().collect();
        let slow = out.iter().position(|l| *l == "slow();").unwrap();
        assert_eq!(p.origin(slow + 1), "main.wgsl:5");
        assert_eq!(p.origin(3), "lib.tmpl:3");
    }

    #[test]
    fn include_guard_makes_double_include_harmless() {
        let p = preprocess("twice.wgsl", &[], &files).unwrap();
        assert_eq!(code_lines(&p), ["fn lib() {}", "x"]);
    }

    #[test]
    fn nested_conditionals() {
        let run =
            |d: &[(&str, &str)]| code_lines(&preprocess("nested", d, &files).unwrap()).join(",");
        assert_eq!(run(&[("A", ""), ("B", "")]), "ab");
        assert_eq!(run(&[("A", "")]), "a_not_b");
        assert_eq!(run(&[("B", "")]), "not_a_b");
        assert_eq!(run(&[]), "");
    }

    #[test]
    fn errors_are_clear() {
        let e = preprocess("cycle_a", &[], &files).unwrap_err();
        assert!(e.message.contains("cycle"), "{e}");
        let e = preprocess("unterminated", &[], &files).unwrap_err();
        assert!(e.message.contains("without #endif"), "{e}");
        let e = preprocess("missing.wgsl", &[], &files).unwrap_err();
        assert!(e.message.contains("not found"), "{e}");
    }
}
