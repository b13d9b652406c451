//! Keeps the lists a chat template joins bounded (see [`super::chat`] for fuel and the output cap).
//!
//! minijinja joins lists lazily: `a + b` and `a | chain(b)` build a view over both operands and
//! charge no fuel for it, so `{% set l = l + l %}` in a loop describes 2^64 items in 64 cheap
//! steps. Once such a view nests 33 deep the engine copies it out or flattens it, part by part,
//! without charging either: the render grows memory until the process dies, or (for an empty
//! list, or maps merged by `chain`) walks 2^33 empty parts. Fuel sees none of it.
//!
//! So before a template is compiled, [`guard_source`] wraps every operand of `+` that is not a
//! literal in a call to [`GUARD`], and `chain` is replaced by a version that guards its arguments
//! and hands merged maps back as a plain map. The guard passes strings and numbers on unchanged,
//! a plain list as a view the engine charges nothing for, and a lazy list of known size as it is,
//! charging fuel for its items and refusing one past a cap; an empty one becomes a fresh empty
//! list and one of unknown size is copied out. Every join is then over parts that each hold an
//! item, so what the engine later walks or copies was paid for.
//!
//! Writing a value out as text is bounded the same way ([`register`]): its parts are counted
//! first, so a namespace that holds itself, or lists nested with sharing, are refused instead
//! of overflowing the stack or walking 2^64 parts. So is every other place the engine walks a
//! whole value: the operands of comparisons (`==`, `<`, `in`, ... and the tests `eq`, `lt`, ...),
//! of `%` and `in`, and the inputs of the filters that write out or compare what they are given
//! ([`WALKING_FILTERS`]) are wrapped in [`WRITTEN`] by [`guard_source`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use minijinja::machinery::ast::{BinOpKind, CallArg, Expr, Stmt};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Object, ObjectRepr, Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

/// The function [`guard_source`] wraps operands of `+` in (a name no real template uses).
pub(crate) const GUARD: &str = "__cera_bounded";
/// The function it wraps operands of `~` in: they are written out as text.
pub(crate) const WRITTEN: &str = "__cera_written";

/// Filters that write out or compare all of their input (and arguments): their operands are
/// counted first, as a written-out value is.
const WALKING_FILTERS: &[&str] = &[
    "join",
    "sort",
    "unique",
    "dictsort",
    "groupby",
    "min",
    "max",
    "sum",
    "format",
    "indent",
    "replace",
    "lower",
    "upper",
    "title",
    "capitalize",
    "trim",
    "urlencode",
    "escape",
    "e",
    "safe",
    "wordcount",
    "center",
    "striptags",
    "truncate",
];
/// Python string methods (minijinja-contrib's pycompat) that write out their arguments:
/// `', '.join(items)`, `'{}'.format(x)`.
const WRITING_METHODS: &[&str] = &["join", "format"];
/// Tests that compare their operands.
const COMPARING_TESTS: &[&str] = &[
    "eq",
    "equalto",
    "==",
    "ne",
    "!=",
    "lt",
    "lessthan",
    "<",
    "le",
    "<=",
    "gt",
    "greaterthan",
    ">",
    "ge",
    ">=",
    "in",
    "sameas",
];

/// Items copied out per unit of fuel (minijinja charges a byte of a new string the same).
const ITEMS_PER_FUEL: u64 = 64;

/// `source` with every non-literal operand of `+` wrapped as `__cera_bounded(operand)`, and of
/// `~` as `__cera_written(operand)`. Only characters are inserted (no newline), so errors keep
/// their line numbers. Fails as the compiler would when `source` does not parse.
pub(crate) fn guard_source(source: &str, syntax: SyntaxConfig) -> Result<String, Error> {
    let ast = minijinja::machinery::parse(source, "chat_template", syntax)?;
    let mut operands = Vec::new();
    stmt(&ast, &mut operands);
    if operands.is_empty() {
        return Ok(source.to_string());
    }
    // (offset, opens, nesting, text): at one offset a closing `)` comes before an opening call
    // (the end of one operand may touch the start of another), an outer call opens before an
    // inner one, and an inner one closes first.
    let mut edits: Vec<(usize, bool, usize, &str)> = Vec::new();
    for &(start, end, name) in &operands {
        edits.push((start, true, usize::MAX - (end - start), name));
        edits.push((end, false, end - start, ")"));
    }
    edits.sort_unstable();
    let mut out = String::with_capacity(source.len() + edits.len() * (GUARD.len() + 1));
    let mut at = 0;
    for (offset, opens, _, text) in edits {
        out.push_str(&source[at..offset]);
        at = offset;
        out.push_str(text);
        if opens {
            out.push('(');
        }
    }
    out.push_str(&source[at..]);
    Ok(out)
}

/// Registers [`GUARD`] and the bounded `chain` filter: a lazy list of more than `max_items`
/// items is refused, and `over` then holds its size (`max_items + 1` when it had no known size),
/// so the caller can say which bound was hit. Also registers the writers' bound (`max_parts`,
/// `parts_over`; see `register_writers`).
pub(crate) fn register(
    env: &mut Environment<'_>,
    max_items: usize,
    over: Arc<AtomicUsize>,
    max_parts: usize,
    parts_over: Arc<AtomicUsize>,
) {
    register_writers(env, max_parts, parts_over);
    let o = over.clone();
    env.add_function(GUARD, move |state: &State, v: Value| {
        bounded(state, v, max_items, &o)
    });
    env.add_filter(
        "chain",
        move |state: &State, value: Value, others: Rest<Value>| -> Result<Value, Error> {
            let value = bounded(state, value, max_items, &over)?;
            let others = others
                .0
                .into_iter()
                .map(|v| bounded(state, v, max_items, &over))
                .collect::<Result<Vec<_>, _>>()?;
            let rv = minijinja::filters::chain(state, value, Rest(others))?;
            if rv.kind() == ValueKind::Map {
                // Maps merged by `chain` are a lazy view too; a plain map (charged by the engine
                // per entry when returned) keeps the next `chain` from nesting views.
                minijinja::functions::dict(
                    Some(rv),
                    Kwargs::from_iter(std::iter::empty::<(&str, Value)>()),
                )
            } else {
                Ok(rv)
            }
        },
    );
}

/// Text from a value (`{{ x }}`, `~`, `string`, `tojson`, `pprint`) walks all of it: a list that
/// holds one list twice, 64 levels deep, is 2^64 parts to write, and a namespace that holds
/// itself never ends (the engine recurses until the stack overflows). Before any of these, the
/// value's parts are counted, each time it is reached, without recursion; more than `max_parts`
/// is refused, and `over` says so.
fn register_writers(env: &mut Environment<'_>, max_parts: usize, over: Arc<AtomicUsize>) {
    let o = over.clone();
    env.set_formatter(move |out, state, v| {
        count_parts(state, v, max_parts, &o)?;
        minijinja::escape_formatter(out, state, v)
    });
    let o = over.clone();
    env.add_function(WRITTEN, move |state: &State, v: Value| {
        count_parts(state, &v, max_parts, &o).map(|_| v)
    });
    let o = over.clone();
    env.add_filter("string", move |state: &State, v: Value| {
        count_parts(state, &v, max_parts, &o)?;
        minijinja::filters::string(state, &v)
    });
    let o = over.clone();
    env.add_filter(
        "tojson",
        move |state: &State, v: Value, indent: Option<Value>, args: Kwargs| {
            count_parts(state, &v, max_parts, &o)?;
            super::chat::tojson(state, v, indent, args)
        },
    );
    env.add_filter("pprint", move |state: &State, v: Value| {
        count_parts(state, &v, max_parts, &over)?;
        Ok::<_, Error>(minijinja::filters::pprint(&v))
    });
}

/// Counts the parts of `v` (itself, the items of its lists, the keys and values of its maps),
/// depth first with a stack of its own; fails past `max_parts`. Fuel: one unit per 64 parts.
fn count_parts(
    state: &State,
    v: &Value,
    max_parts: usize,
    over: &AtomicUsize,
) -> Result<(), Error> {
    let container = |v: &Value| {
        matches!(
            v.kind(),
            ValueKind::Seq | ValueKind::Iterable | ValueKind::Map
        )
    };
    if !container(v) {
        return Ok(());
    }
    // A part is counted when it is found, so the stack never holds more than `max_parts`.
    let mut stack = vec![v.clone()];
    let mut n = 1usize;
    let found = |n: &mut usize, parts: usize| {
        *n += parts;
        if *n > max_parts {
            over.store(*n, Ordering::Relaxed);
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("a value of more than {max_parts} parts written out"),
            ));
        }
        Ok(())
    };
    while let Some(v) = stack.pop() {
        let children: Box<dyn Iterator<Item = (usize, Value)>> = if v.kind() == ValueKind::Map {
            match v.as_object().and_then(|o| o.try_iter_pairs()) {
                Some(pairs) => Box::new(pairs.map(|(_, x)| (2, x))), // the key and the value
                None => continue,
            }
        } else {
            match v.try_iter() {
                Ok(items) => Box::new(items.map(|x| (1, x))),
                Err(_) => continue,
            }
        };
        for (parts, x) in children {
            found(&mut n, parts)?;
            if container(&x) {
                stack.push(x);
            }
        }
    }
    state.consume_fuel((n as u64).div_ceil(ITEMS_PER_FUEL))
}

/// A plain list behind a view the engine charges nothing for: its items were paid for when they
/// were built or copied, and passing it on copies nothing.
#[derive(Debug)]
struct Flat(Value);

impl Object for Flat {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0.get_item(key).ok().filter(|v| !v.is_undefined())
    }
    fn enumerate(self: &Arc<Self>) -> minijinja::value::Enumerator {
        minijinja::value::Enumerator::Seq(self.0.len().unwrap_or(0))
    }
}

fn bounded(state: &State, v: Value, max_items: usize, over: &AtomicUsize) -> Result<Value, Error> {
    if !matches!(v.kind(), ValueKind::Seq | ValueKind::Iterable)
        || v.is_tuple()
        || v.downcast_object_ref::<Flat>().is_some()
    {
        // Tuples are concatenated eagerly, and charged, by the engine itself.
        return Ok(v);
    }
    if v.downcast_object_ref::<Vec<Value>>().is_some() {
        return Ok(Value::from_object(Flat(v)));
    }
    let refuse = |n: usize| {
        over.store(n, Ordering::Relaxed);
        Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("a list of {n} items (at most {max_items})"),
        ))
    };
    match v.len() {
        // Empty, however many parts it joins: start over from one empty part.
        Some(0) => Ok(Value::from_object(Flat(Value::from(Vec::<Value>::new())))),
        Some(n) if n > max_items => refuse(n),
        // A view with a known size is passed on as it is, paid for by its size: each of its parts
        // holds an item (an empty part never gets here), so walking or copying it is bounded.
        Some(n) => {
            state.consume_fuel((n as u64).div_ceil(ITEMS_PER_FUEL))?;
            Ok(v)
        }
        // No known size (a `map` or `select` result): copied out, one item at a time.
        None => {
            let mut items = Vec::new();
            for item in v.try_iter()? {
                if items.len() == max_items {
                    return refuse(max_items + 1);
                }
                items.push(item);
            }
            state.consume_fuel((items.len() as u64).div_ceil(ITEMS_PER_FUEL))?;
            Ok(Value::from_object(Flat(Value::from(items))))
        }
    }
}

/// Collects the byte spans of the operands to guard.
fn stmt(s: &Stmt<'_>, out: &mut Vec<(usize, usize, &'static str)>) {
    let body = |b: &[Stmt<'_>], out: &mut Vec<(usize, usize, &'static str)>| {
        b.iter().for_each(|s| stmt(s, out))
    };
    match s {
        Stmt::Template(t) => body(&t.children, out),
        Stmt::EmitExpr(e) => expr(&e.expr, out),
        Stmt::EmitRaw(_) | Stmt::Continue(_) | Stmt::Break(_) => {}
        Stmt::ForLoop(f) => {
            expr(&f.target, out);
            expr(&f.iter, out);
            if let Some(e) = &f.filter_expr {
                expr(e, out);
            }
            body(&f.body, out);
            body(&f.else_body, out);
        }
        Stmt::IfCond(c) => {
            expr(&c.expr, out);
            body(&c.true_body, out);
            body(&c.false_body, out);
        }
        Stmt::WithBlock(w) => {
            for (t, e) in &w.assignments {
                expr(t, out);
                expr(e, out);
            }
            body(&w.body, out);
        }
        Stmt::Set(s) => {
            expr(&s.target, out);
            expr(&s.expr, out);
        }
        Stmt::SetBlock(s) => {
            expr(&s.target, out);
            if let Some(f) = &s.filter {
                expr(f, out);
            }
            body(&s.body, out);
        }
        Stmt::AutoEscape(a) => {
            expr(&a.enabled, out);
            body(&a.body, out);
        }
        Stmt::FilterBlock(f) => {
            expr(&f.filter, out);
            body(&f.body, out);
        }
        Stmt::Block(b) => body(&b.body, out),
        Stmt::Import(i) => {
            expr(&i.expr, out);
            expr(&i.name, out);
        }
        Stmt::FromImport(i) => {
            expr(&i.expr, out);
            for (n, a) in &i.names {
                expr(n, out);
                if let Some(a) = a {
                    expr(a, out);
                }
            }
        }
        Stmt::Extends(e) => expr(&e.name, out),
        Stmt::Include(i) => expr(&i.name, out),
        Stmt::Macro(m) => {
            m.args.iter().chain(&m.defaults).for_each(|e| expr(e, out));
            body(&m.body, out);
        }
        Stmt::CallBlock(c) => {
            expr(&c.call.expr, out);
            args(&c.call.args, out);
            let m = &c.macro_decl;
            m.args.iter().chain(&m.defaults).for_each(|e| expr(e, out));
            body(&m.body, out);
        }
        Stmt::Do(d) => {
            expr(&d.call.expr, out);
            args(&d.call.args, out);
        }
    }
}

fn args(a: &[CallArg<'_>], out: &mut Vec<(usize, usize, &'static str)>) {
    for_args(a, &mut |e| {
        expr(e, out);
    });
}

fn for_args<'a>(a: &'a [CallArg<'a>], f: &mut dyn FnMut(&'a Expr<'a>)) {
    for a in a {
        match a {
            CallArg::Pos(e)
            | CallArg::Kwarg(_, e)
            | CallArg::PosSplat(e)
            | CallArg::KwargSplat(e) => f(e),
        }
    }
}

/// Calls `f` on each direct sub-expression of `e`.
fn children<'a>(e: &'a Expr<'a>, f: &mut dyn FnMut(&'a Expr<'a>)) {
    match e {
        Expr::Var(_) | Expr::Const(_) => {}
        Expr::Slice(s) => {
            f(&s.expr);
            [&s.start, &s.stop, &s.step]
                .into_iter()
                .flatten()
                .for_each(f);
        }
        Expr::UnaryOp(u) => f(&u.expr),
        Expr::BinOp(b) => {
            f(&b.left);
            f(&b.right);
        }
        Expr::Compare(c) => {
            f(&c.expr);
            c.ops.iter().for_each(|o| f(&o.expr));
        }
        Expr::IfExpr(i) => {
            f(&i.test_expr);
            f(&i.true_expr);
            if let Some(e) = &i.false_expr {
                f(e);
            }
        }
        Expr::Filter(x) => {
            if let Some(e) = &x.expr {
                f(e);
            }
            for_args(&x.args, f);
        }
        Expr::Test(t) => {
            f(&t.expr);
            for_args(&t.args, f);
        }
        Expr::GetAttr(g) => f(&g.expr),
        Expr::GetItem(g) => {
            f(&g.expr);
            f(&g.subscript_expr);
        }
        Expr::Call(c) => {
            f(&c.expr);
            for_args(&c.args, f);
        }
        Expr::List(l) => l.items.iter().for_each(f),
        Expr::Tuple(t) => t.items.iter().for_each(f),
        Expr::Map(m) => m.keys.iter().chain(&m.values).for_each(f),
    }
}

/// Notes the operands of `+` in `e`.
fn expr(e: &Expr<'_>, out: &mut Vec<(usize, usize, &'static str)>) {
    walk(e, out);
}

/// Visits `e`, noting the operands of `+` to guard, and returns the bytes `e` is spelled with.
/// A node's own span may cover only part of it (a filter's covers `| name(args)`, not the value
/// filtered), so this joins the spans of all its parts. Parentheses around `e` are not included;
/// a call inserted inside them is still valid.
fn walk(e: &Expr<'_>, out: &mut Vec<(usize, usize, &'static str)>) -> (usize, usize) {
    let s = e.span();
    let mut r = (s.start_offset as usize, s.end_offset as usize);
    let guard = match e {
        Expr::BinOp(b) if matches!(b.op, BinOpKind::Add) => Some(GUARD),
        Expr::BinOp(b)
            if matches!(
                b.op,
                BinOpKind::Concat
                    | BinOpKind::Rem
                    | BinOpKind::In
                    | BinOpKind::Eq
                    | BinOpKind::Ne
                    | BinOpKind::Lt
                    | BinOpKind::Lte
                    | BinOpKind::Gt
                    | BinOpKind::Gte
            ) =>
        {
            Some(WRITTEN)
        }
        Expr::Compare(_) => Some(WRITTEN),
        Expr::Filter(f) if WALKING_FILTERS.contains(&f.name) => Some(WRITTEN),
        Expr::Test(t) if COMPARING_TESTS.contains(&t.name) => Some(WRITTEN),
        Expr::Call(c) if matches!(&c.expr, Expr::GetAttr(g) if WRITING_METHODS.contains(&g.name)) => {
            Some(WRITTEN)
        }
        _ => None,
    };
    // A method call's callee (`', '.join`) is not a value: only its arguments are guarded.
    let callee: *const Expr<'_> = match e {
        Expr::Call(c) => &c.expr,
        _ => std::ptr::null(),
    };
    children(e, &mut |c| {
        let (a, b) = walk(c, out);
        // Literals are as large as the source that spells them out.
        let literal = matches!(
            c,
            Expr::Const(_) | Expr::List(_) | Expr::Tuple(_) | Expr::Map(_)
        );
        // A list or map spelled out may still hold anything: only constants skip the count.
        let skip = match guard {
            Some(WRITTEN) => matches!(c, Expr::Const(_)),
            _ => literal,
        };
        if let (Some(name), false) = (guard, skip || std::ptr::eq(c, callee)) {
            out.push((a, b, name));
        }
        r = (r.0.min(a), r.1.max(b));
    });
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(src: &str) -> String {
        guard_source(src, SyntaxConfig::default()).unwrap()
    }

    #[test]
    fn operands_of_plus_and_of_walks_are_wrapped_and_nothing_else() {
        assert_eq!(
            g("{{ a + b }}"),
            "{{ __cera_bounded(a) + __cera_bounded(b) }}"
        );
        assert_eq!(
            g("{{ 'x' + m.content | trim + [1] }}"),
            "{{ __cera_bounded('x' + __cera_bounded(__cera_written(m.content) | trim)) + [1] }}"
        );
        // Comparisons, `in`, `%`, walking filters and tests, and str.join / str.format.
        assert_eq!(
            g("{{ m.role == 'user' }}{{ a in b }}{{ '%s' % x }}{{ x is eq(y) }}"),
            "{{ __cera_written(m.role) == 'user' }}{{ __cera_written(a) in __cera_written(b) }}{{ '%s' % __cera_written(x) }}{{ __cera_written(x) is eq(__cera_written(y)) }}"
        );
        assert_eq!(
            g("{{ x | join(', ') }}{{ ', '.join(x) }}{{ x | length }}{{ x is defined }}"),
            "{{ __cera_written(x) | join(', ') }}{{ ', '.join(__cera_written(x)) }}{{ x | length }}{{ x is defined }}"
        );
        assert_eq!(
            g("{{ (a + b) + c[0] }}"),
            "{{ (__cera_bounded(__cera_bounded(a) + __cera_bounded(b))) + __cera_bounded(c[0]) }}"
        );
        assert_eq!(g("{% set x = f(a+b) %}é{{ -x + y.z }}"), "{% set x = f(__cera_bounded(a)+__cera_bounded(b)) %}é{{ __cera_bounded(-x) + __cera_bounded(y.z) }}");
        assert_eq!(
            g("{{ (a + b) ~ 'c' }}{{ a - b }}"),
            "{{ (__cera_written(__cera_bounded(a) + __cera_bounded(b))) ~ 'c' }}{{ a - b }}"
        );
    }
}
