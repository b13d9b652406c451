//! llama.cpp's GBNF grammars translated to the Lark dialect llguidance reads.
//!
//! GBNF (llama.cpp `grammars/README.md`): `name ::= alternatives` rules, `"literals"` with `\x`,
//! `\u`, `\U`, `\t`, `\n`, `\r`, `\\`, `\"` escapes, `[a-z]` / `[^...]` character classes, `.`,
//! `( )` groups, `|`, `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, `#` comments; the start rule is
//! `root`. As in llama.cpp, a rule ends at the end of its line unless inside parentheses or after
//! a trailing `|`.
//!
//! Every GBNF rule becomes a Lark rule (lowercase name), literals become JSON-escaped Lark strings
//! and character classes Rust-regex terminals (`/[\x{61}-\x{7a}]/`). What has no Lark form
//! (llama.cpp's token references `<[id]>` / `<token>` / `!<...>`) is an error naming its line.

use std::collections::HashMap;

/// A translation error: 1-based line and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct GbnfError {
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for GbnfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GBNF line {}: {}", self.line, self.message)
    }
}

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
    names: HashMap<String, String>,
    used: Vec<(String, usize)>,
}

fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-' || c == b'_'
}

/// A character as a Rust-regex escape inside a class.
fn class_char(c: char) -> String {
    format!("\\x{{{:x}}}", c as u32)
}

impl<'a> Parser<'a> {
    fn line(&self) -> usize {
        1 + self.src[..self.pos.min(self.src.len())]
            .iter()
            .filter(|&&c| c == b'\n')
            .count()
    }

    fn err<T>(&self, message: impl Into<String>) -> Result<T, GbnfError> {
        Err(GbnfError {
            line: self.line(),
            message: message.into(),
        })
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    /// Skip spaces, tabs and comments; newlines too when `newline_ok`.
    fn space(&mut self, newline_ok: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newline_ok => self.pos += 1,
                b'#' => {
                    while let Some(c) = self.peek() {
                        if c == b'\n' {
                            break;
                        }
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(is_name_char) {
            self.pos += 1;
        }
        if start == self.pos {
            return self.err("expected a rule name");
        }
        Ok(String::from_utf8_lossy(&self.src[start..self.pos]).into_owned())
    }

    /// The Lark name of a GBNF rule name: lowercase, `-` as `_`, unique.
    fn lark_name(&mut self, name: &str) -> String {
        if let Some(n) = self.names.get(name) {
            return n.clone();
        }
        let mut base: String = name
            .chars()
            .map(|c| {
                if c == '-' {
                    '_'
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect();
        base = format!("g_{base}");
        let mut n = base.clone();
        let mut i = 1;
        while self.names.values().any(|v| *v == n) {
            i += 1;
            n = format!("{base}_{i}");
        }
        self.names.insert(name.to_string(), n.clone());
        n
    }

    /// One (possibly escaped) character of a literal or class.
    fn char(&mut self) -> Result<char, GbnfError> {
        let rest = std::str::from_utf8(&self.src[self.pos..]).map_err(|_| GbnfError {
            line: self.line(),
            message: "invalid UTF-8".into(),
        })?;
        let mut it = rest.chars();
        let c = it.next().ok_or_else(|| GbnfError {
            line: self.line(),
            message: "unexpected end of input".into(),
        })?;
        if c != '\\' {
            self.pos += c.len_utf8();
            return Ok(c);
        }
        let e = it.next().ok_or_else(|| GbnfError {
            line: self.line(),
            message: "unexpected end after '\\'".into(),
        })?;
        self.pos += 2;
        let hex = |p: &mut Self, n: usize| -> Result<char, GbnfError> {
            let s = std::str::from_utf8(p.src.get(p.pos..p.pos + n).unwrap_or(b"")).unwrap_or("");
            let v = u32::from_str_radix(s, 16)
                .ok()
                .filter(|_| s.len() == n)
                .and_then(char::from_u32);
            match v {
                Some(c) => {
                    p.pos += n;
                    Ok(c)
                }
                None => p.err(format!("bad escape: expected {n} hex digits")),
            }
        };
        match e {
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            't' => Ok('\t'),
            'n' => Ok('\n'),
            'r' => Ok('\r'),
            '\\' | '"' | '[' | ']' | '-' | '^' => Ok(e),
            other => self.err(format!("unknown escape '\\{other}'")),
        }
    }

    fn literal(&mut self) -> Result<String, GbnfError> {
        self.pos += 1; // opening quote
        let mut s = String::new();
        loop {
            match self.peek() {
                None | Some(b'\n') => return self.err("unterminated string literal"),
                Some(b'"') => {
                    self.pos += 1;
                    break;
                }
                _ => s.push(self.char()?),
            }
        }
        Ok(serde_json::to_string(&s).expect("a string serializes"))
    }

    fn class(&mut self) -> Result<String, GbnfError> {
        self.pos += 1; // '['
        let mut out = String::from("/[");
        if self.peek() == Some(b'^') {
            self.pos += 1;
            out.push('^');
        }
        let mut any = false;
        loop {
            match self.peek() {
                None | Some(b'\n') => return self.err("unterminated character class"),
                Some(b']') => {
                    self.pos += 1;
                    break;
                }
                _ => {
                    let lo = self.char()?;
                    out.push_str(&class_char(lo));
                    if self.peek() == Some(b'-') && self.src.get(self.pos + 1) != Some(&b']') {
                        self.pos += 1;
                        let hi = self.char()?;
                        if hi < lo {
                            return self.err(format!("character range {lo:?}-{hi:?} is reversed"));
                        }
                        out.push('-');
                        out.push_str(&class_char(hi));
                    }
                    any = true;
                }
            }
        }
        if !any {
            return self.err("empty character class");
        }
        out.push_str("]/");
        Ok(out)
    }

    fn number(&mut self) -> Result<u32, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        std::str::from_utf8(&self.src[start..self.pos])
            .unwrap_or("")
            .parse()
            .or_else(|_| self.err("expected a number"))
    }

    /// A sequence of items up to `|`, `)` or (at the top level) the end of the line.
    fn sequence(&mut self, nested: bool) -> Result<String, GbnfError> {
        let mut items: Vec<String> = Vec::new();
        while let Some(c) = self.peek() {
            let item = match c {
                b'"' => self.literal()?,
                b'[' => self.class()?,
                b'.' => {
                    self.pos += 1;
                    "/(?s:.)/".to_string()
                }
                b'(' => {
                    self.pos += 1;
                    self.space(true);
                    let inner = self.alternates(true)?;
                    if self.peek() != Some(b')') {
                        return self.err("expected ')'");
                    }
                    self.pos += 1;
                    format!("({inner})")
                }
                b'<' | b'!' => return self.err("token references (<[id]>, <token>, !<...>) have no equivalent in llguidance's Lark; write the token's text as a literal"),
                c if is_name_char(c) => {
                    let line = self.line();
                    let name = self.name()?;
                    self.used.push((name.clone(), line));
                    self.lark_name(&name)
                }
                _ => break,
            };
            self.space(nested);
            // Repetition suffixes.
            let item = match self.peek() {
                Some(op @ (b'*' | b'+' | b'?')) => {
                    self.pos += 1;
                    format!("{item}{}", op as char)
                }
                Some(b'{') => {
                    self.pos += 1;
                    self.space(nested);
                    let m = self.number()?;
                    self.space(nested);
                    let rep = if self.peek() == Some(b',') {
                        self.pos += 1;
                        self.space(nested);
                        if self.peek() == Some(b'}') {
                            format!("{item}{{{m},}}")
                        } else {
                            let n = self.number()?;
                            if n < m {
                                return self.err(format!(
                                    "repetition {{{m},{n}}}: the maximum is below the minimum"
                                ));
                            }
                            if n == 0 {
                                "\"\"".to_string()
                            } else {
                                format!("{item}{{{m},{n}}}")
                            }
                        }
                    } else if m == 0 {
                        "\"\"".to_string()
                    } else {
                        format!("{item}{{{m}}}")
                    };
                    self.space(nested);
                    if self.peek() != Some(b'}') {
                        return self.err("expected '}'");
                    }
                    self.pos += 1;
                    rep
                }
                _ => item,
            };
            self.space(nested);
            items.push(item);
        }
        if items.is_empty() {
            return Ok("\"\"".to_string());
        }
        Ok(items.join(" "))
    }

    fn alternates(&mut self, nested: bool) -> Result<String, GbnfError> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts.join(" | "))
    }
}

/// Translate a GBNF grammar into llguidance Lark (`start: g_root`).
pub fn gbnf_to_lark(gbnf: &str) -> Result<String, GbnfError> {
    let mut p = Parser {
        src: gbnf.as_bytes(),
        pos: 0,
        names: HashMap::new(),
        used: Vec::new(),
    };
    let mut rules: Vec<(String, String)> = Vec::new();
    let mut defined: HashMap<String, usize> = HashMap::new();
    p.space(true);
    while p.pos < p.src.len() {
        let line = p.line();
        let name = p.name()?;
        p.space(false);
        if !p.src[p.pos..].starts_with(b"::=") {
            return p.err(format!("expected '::=' after rule name '{name}'"));
        }
        p.pos += 3;
        p.space(true);
        let body = p.alternates(false)?;
        match p.peek() {
            None | Some(b'\n') | Some(b'\r') => {}
            Some(c) => return p.err(format!("unexpected '{}' (a rule ends at the end of its line; continue it inside parentheses or after '|')", c as char)),
        }
        if defined.insert(name.clone(), line).is_some() {
            // llama.cpp appends the alternatives of a rule defined twice.
            let lark = p.lark_name(&name);
            let r = rules.iter_mut().find(|(n, _)| *n == lark).expect("defined");
            r.1 = format!("{} | {body}", r.1);
        } else {
            let lark = p.lark_name(&name);
            rules.push((lark, body));
        }
        p.space(true);
    }
    if !defined.contains_key("root") {
        return Err(GbnfError {
            line: 1,
            message: "the grammar has no 'root' rule".into(),
        });
    }
    for (name, line) in &p.used {
        if !defined.contains_key(name) {
            return Err(GbnfError {
                line: *line,
                message: format!("rule '{name}' is used but never defined"),
            });
        }
    }
    let mut out = format!("start: {}\n", p.names["root"]);
    for (name, body) in rules {
        out.push_str(&format!("{name}: {body}\n"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translates_rules_literals_classes_and_repeats() {
        let g = "# a comment\nroot ::= greeting \" \" name-part{1,3} # trailing\ngreeting ::= (\"hi\" | \"hello\\n\")\nname-part ::= [a-zA-Z] [^\\x00-\\x1f]* .?\n";
        let lark = gbnf_to_lark(g).unwrap();
        assert_eq!(
            lark,
            "start: g_root\ng_root: g_greeting \" \" g_name_part{1,3}\ng_greeting: (\"hi\" | \"hello\\n\")\ng_name_part: /[\\x{61}-\\x{7a}\\x{41}-\\x{5a}]/ /[^\\x{0}-\\x{1f}]/* /(?s:.)/?\n"
        );
    }

    #[test]
    fn alternatives_continue_after_a_trailing_bar_and_inside_parentheses() {
        let g = "root ::= \"a\" |\n  \"b\"\nx ::= (\n  \"c\"\n  | \"d\"\n)\n";
        let lark = gbnf_to_lark(g).unwrap();
        assert!(lark.contains("g_root: \"a\" | \"b\""), "{lark}");
        assert!(lark.contains("g_x: (\"c\" | \"d\")"), "{lark}");
    }

    #[test]
    fn errors_name_the_line() {
        let e = gbnf_to_lark("root ::= item\nitem ::= <[42]>\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("token references"), "{e}");
        let e = gbnf_to_lark("root ::= item\n\nother ::= \"x\"\n").unwrap_err();
        assert_eq!(e.line, 1);
        assert!(e.message.contains("'item'"), "{e}");
        let e = gbnf_to_lark("root ::= \"x\"\n  | \"y\"\n").unwrap_err();
        assert_eq!(e.line, 2);
        let e = gbnf_to_lark("root ::= \"unterminated\n").unwrap_err();
        assert_eq!(e.line, 1);
        assert!(gbnf_to_lark("item ::= \"x\"\n")
            .unwrap_err()
            .message
            .contains("root"));
    }
}
