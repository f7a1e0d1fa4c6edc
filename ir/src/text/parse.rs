//! The parser: tokens to graphs (grammar in `docs/ir.md`).
//!
//! A hand-written recursive-descent parser without recursion depth (the grammar has
//! no nesting beyond one level of brackets), so no input can exhaust the stack.
//! Invariants:
//! - every error is an [`IrError::Parse`] at the line and column of the offending
//!   token (an unknown value: at its use; a bad attribute: at the attribute);
//! - a name is resolved when it is read, so operands, outputs and updates can only
//!   refer to values defined above them, and no [`ValueId`] handed to the graph
//!   builder is out of range;
//! - attributes are read generically into `(name, Attr)` pairs and turned into an op
//!   by [`Op::from_parts`]: the parser has no per-op code;
//! - node results are taken as declared ([`Graph::push_node_unchecked`]); the
//!   caller runs [`crate::verify()`] on each graph built here.

use super::lexer::{Tok, Token, lex};
use crate::error::{IrError, Result};
use crate::graph::{Def, Graph, ValueId};
use crate::op::{Attr, MNEMONICS, Op};
use crate::types::{DType, Dim, DimExpr, TensorType};

/// Parses every graph of `src`, in order, without verifying them; each graph comes
/// with the line and column of its `graph` keyword.
pub(crate) fn parse_graphs(src: &str) -> Result<Vec<(Graph, (usize, usize))>> {
    let mut p = Parser {
        toks: lex(src),
        pos: 0,
    };
    let mut graphs = Vec::new();
    while p.peek().tok != Tok::Eof {
        let at = p.at();
        graphs.push((p.graph()?, at));
    }
    Ok(graphs)
}

struct Parser {
    /// Never empty; the last token is `Eof` or `Error` (see the lexer).
    toks: Vec<Token>,
    pos: usize,
}

/// An attribute as written, with the positions of its name and value.
struct AttrAt {
    key: String,
    key_at: (usize, usize),
    value: Attr,
    value_at: (usize, usize),
}

fn err_at(at: (usize, usize), reason: impl Into<String>) -> IrError {
    IrError::Parse {
        line: at.0,
        col: at.1,
        reason: reason.into(),
    }
}

impl Parser {
    fn peek(&self) -> &Token {
        &self.toks[self.pos.min(self.toks.len() - 1)]
    }

    fn peek2(&self) -> &Token {
        &self.toks[(self.pos + 1).min(self.toks.len() - 1)]
    }

    fn at(&self) -> (usize, usize) {
        let t = self.peek();
        (t.line, t.col)
    }

    /// Consumes the current token (never moves past the final `Eof`/`Error`).
    fn bump(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    /// The error for an unexpected current token; a lexical error is reported as is.
    fn unexpected(&self, expected: &str) -> IrError {
        let t = self.peek();
        match &t.tok {
            Tok::Error(reason) => err_at((t.line, t.col), reason.clone()),
            found => err_at(
                (t.line, t.col),
                format!("expected {expected}, found {found}"),
            ),
        }
    }

    fn is_punct(&self, c: char) -> bool {
        self.peek().tok == Tok::Punct(c)
    }

    fn eat_punct(&mut self, c: char) -> bool {
        let hit = self.is_punct(c);
        if hit {
            self.bump();
        }
        hit
    }

    fn expect_punct(&mut self, c: char) -> Result<()> {
        if self.eat_punct(c) {
            Ok(())
        } else {
            Err(self.unexpected(&format!("`{c}`")))
        }
    }

    fn is_keyword(&self, kw: &str) -> bool {
        matches!(&self.peek().tok, Tok::Ident(s) if s == kw)
    }

    fn expect_keyword(&mut self, kw: &str) -> Result<()> {
        if self.is_keyword(kw) {
            self.bump();
            Ok(())
        } else {
            Err(self.unexpected(&format!("`{kw}`")))
        }
    }

    fn ident(&mut self, what: &str) -> Result<(String, (usize, usize))> {
        let at = self.at();
        match &self.peek().tok {
            Tok::Ident(s) => {
                let s = s.clone();
                self.bump();
                Ok((s, at))
            }
            _ => Err(self.unexpected(what)),
        }
    }

    fn value_name(&mut self, what: &str) -> Result<(String, (usize, usize))> {
        let at = self.at();
        match &self.peek().tok {
            Tok::Value(s) => {
                let s = s.clone();
                self.bump();
                Ok((s, at))
            }
            _ => Err(self.unexpected(what)),
        }
    }

    /// Reads `%name` and resolves it among the values defined so far.
    fn use_value(&mut self, g: &Graph, what: &str) -> Result<(ValueId, (usize, usize))> {
        let (name, at) = self.value_name(what)?;
        match g.find(&name) {
            Some(v) => Ok((v, at)),
            None => Err(err_at(at, format!("unknown value %{name}"))),
        }
    }

    /// Reads a name for a new value; it must not be defined yet.
    fn def_value(&mut self, g: &Graph, taken: &[(String, TensorType)]) -> Result<String> {
        let (name, at) = self.value_name("a value name `%name`")?;
        if g.find(&name).is_some() || taken.iter().any(|(n, _)| *n == name) {
            return Err(err_at(at, format!("value %{name} is defined twice")));
        }
        Ok(name)
    }

    // ---------------------------------------------------------------- graphs

    fn graph(&mut self) -> Result<Graph> {
        self.expect_keyword("graph")?;
        let name = match &self.peek().tok {
            Tok::Graph(s) => s.clone(),
            _ => return Err(self.unexpected("a graph name `@name`")),
        };
        self.bump();
        self.expect_punct('{')?;
        let mut g = Graph::new(name);
        loop {
            let at = self.at();
            match &self.peek().tok {
                Tok::Punct('}') => {
                    self.bump();
                    return Ok(g);
                }
                Tok::Ident(kw) if kw == "input" || kw == "param" => {
                    let is_input = kw == "input";
                    self.bump();
                    let name = self.def_value(&g, &[])?;
                    self.expect_punct(':')?;
                    let ty = self.ty()?;
                    let added = if is_input {
                        g.add_input(&name, ty)
                    } else {
                        g.add_param(&name, ty)
                    };
                    added.map_err(|e| err_at(at, e.to_string()))?;
                }
                Tok::Ident(kw) if kw == "output" => {
                    self.bump();
                    loop {
                        let (v, _) = self.use_value(&g, "a value `%name`")?;
                        g.add_output(v);
                        if !self.eat_punct(',') {
                            break;
                        }
                    }
                }
                Tok::Ident(kw) if kw == "update" => {
                    self.bump();
                    let (param, param_at) = self.use_value(&g, "a parameter `%name`")?;
                    if !matches!(g.value(param).def, Def::Param(_)) {
                        return Err(err_at(
                            param_at,
                            format!("update target %{} is not a parameter", g.name_of(param)),
                        ));
                    }
                    if self.peek().tok == Tok::Arrow {
                        self.bump();
                    } else {
                        return Err(self.unexpected("`<-`"));
                    }
                    let (value, _) = self.use_value(&g, "a value `%name`")?;
                    g.add_update(param, value)
                        .map_err(|e| err_at(param_at, e.to_string()))?;
                }
                Tok::Value(_) => self.node(&mut g)?,
                _ => {
                    return Err(self.unexpected(
                        "`input`, `param`, a node `%name: type = op ...`, `output`, `update` or `}`",
                    ));
                }
            }
        }
    }

    // ----------------------------------------------------------------- nodes

    fn node(&mut self, g: &mut Graph) -> Result<()> {
        let first_at = self.at();
        let mut results: Vec<(String, TensorType)> = Vec::new();
        loop {
            let name = self.def_value(g, &results)?;
            self.expect_punct(':')?;
            let ty = self.ty()?;
            results.push((name, ty));
            if !self.eat_punct(',') {
                break;
            }
        }
        self.expect_punct('=')?;
        let (mnemonic, op_at) = self.ident("an op name")?;
        if !MNEMONICS.contains(&mnemonic.as_str()) && crate::module::find(&mnemonic).is_none() {
            return Err(err_at(
                op_at,
                format!(
                    "unknown op `{mnemonic}` (expected one of: {})",
                    MNEMONICS.join(", ")
                ),
            ));
        }
        // Operands: values up to the attributes or the next item. A `%name` followed
        // by `:` starts the next node, so an op may have no operands.
        let mut inputs = Vec::new();
        if matches!(self.peek().tok, Tok::Value(_)) && self.peek2().tok != Tok::Punct(':') {
            loop {
                let (v, _) = self.use_value(g, "an operand `%name`")?;
                inputs.push(v);
                if !self.eat_punct(',') {
                    break;
                }
            }
        }
        let attrs = if self.is_punct('{') {
            self.attrs()?
        } else {
            Vec::new()
        };
        let pairs: Vec<(String, Attr)> = attrs
            .iter()
            .map(|a| (a.key.clone(), a.value.clone()))
            .collect();
        let op = Op::from_parts(&mnemonic, &pairs)
            .map_err(|reason| attr_error(&attrs, &mnemonic, op_at, reason))?;
        g.push_node_unchecked(op, inputs, results)
            .map_err(|e| err_at(first_at, e.to_string()))?;
        Ok(())
    }

    fn attrs(&mut self) -> Result<Vec<AttrAt>> {
        self.expect_punct('{')?;
        let mut attrs: Vec<AttrAt> = Vec::new();
        if self.eat_punct('}') {
            return Ok(attrs);
        }
        loop {
            let (key, key_at) = self.ident("an attribute name")?;
            if attrs.iter().any(|a| a.key == key) {
                return Err(err_at(key_at, format!("attribute `{key}` is given twice")));
            }
            self.expect_punct('=')?;
            let value_at = self.at();
            let value = self.attr_value()?;
            attrs.push(AttrAt {
                key,
                key_at,
                value,
                value_at,
            });
            if self.eat_punct('}') {
                return Ok(attrs);
            }
            if !self.eat_punct(',') {
                return Err(self.unexpected("`,` or `}`"));
            }
        }
    }

    fn attr_value(&mut self) -> Result<Attr> {
        let at = self.at();
        let value = match &self.peek().tok {
            Tok::Ident(s) => match s.as_str() {
                "true" => Attr::Bool(true),
                "false" => Attr::Bool(false),
                "inf" | "NaN" => Attr::Float(float(s, at)?),
                _ => Attr::Ident(s.clone()),
            },
            Tok::Number(s) if is_float_literal(s) => Attr::Float(float(s, at)?),
            Tok::Number(s) => Attr::Int(
                s.parse::<i64>()
                    .map_err(|_| err_at(at, format!("integer `{s}` is out of range")))?,
            ),
            Tok::Punct('[') => return Ok(Attr::List(self.dims()?)),
            _ => return Err(self.unexpected("an attribute value")),
        };
        self.bump();
        Ok(value)
    }

    // ----------------------------------------------------------------- types

    fn ty(&mut self) -> Result<TensorType> {
        let (name, at) = self.ident("a type such as `f32[B,4]`")?;
        let dtype = DType::from_mnemonic(&name).ok_or_else(|| {
            err_at(
                at,
                format!("unknown element type `{name}` (expected f32, bf16, i64 or i32)"),
            )
        })?;
        Ok(TensorType::new(dtype, self.dims()?))
    }

    /// One dimension: a non-negative integer, a symbol, or an expression of them
    /// with `+`, `*` and negative integer terms (`B+1`, `B*F`, `B-1`, `B-2*N`).
    fn dim_expr(&mut self) -> Result<Dim> {
        let at = self.at();
        // A plain integer keeps the whole `usize` range.
        if let Tok::Number(s) = &self.peek().tok
            && let Ok(n) = s.parse::<usize>()
        {
            let save = self.pos;
            self.bump();
            if matches!(self.peek().tok, Tok::Punct(',' | ']')) {
                return Ok(Dim::Fixed(n));
            }
            self.pos = save;
        }
        let mut sum = self.dim_term()?;
        loop {
            // `+ term`, or a term that starts with a negative integer (`B-1`).
            let more = self.eat_punct('+')
                || matches!(&self.peek().tok, Tok::Number(s) if s.starts_with('-'));
            if !more {
                break;
            }
            let next = self.dim_term()?;
            sum = sum
                .add(&next)
                .ok_or_else(|| err_at(at, "dimension overflows".to_string()))?;
        }
        Dim::from_expr(sum.clone()).ok_or_else(|| {
            err_at(
                at,
                format!("a dimension must be a non-negative integer or a symbol, found `{sum}`"),
            )
        })
    }

    fn dim_term(&mut self) -> Result<DimExpr> {
        let at = self.at();
        let mut acc = self.dim_factor()?;
        while self.eat_punct('*') {
            let f = self.dim_factor()?;
            acc = acc
                .mul(&f)
                .ok_or_else(|| err_at(at, "dimension overflows".to_string()))?;
        }
        Ok(acc)
    }

    fn dim_factor(&mut self) -> Result<DimExpr> {
        let at = self.at();
        let e = match &self.peek().tok {
            Tok::Ident(s) => DimExpr::sym(s),
            Tok::Number(s) => DimExpr::int(s.parse::<i64>().map_err(|_| {
                err_at(
                    at,
                    format!("a dimension must be a non-negative integer or a symbol, found `{s}`"),
                )
            })?),
            _ => return Err(self.unexpected("a dimension (integer or symbol)")),
        };
        self.bump();
        Ok(e)
    }

    /// `[dim, ...]` where a dim is a non-negative integer, a symbol or an expression.
    fn dims(&mut self) -> Result<Vec<Dim>> {
        self.expect_punct('[')?;
        let mut dims = Vec::new();
        if self.eat_punct(']') {
            return Ok(dims);
        }
        loop {
            let dim = self.dim_expr()?;
            dims.push(dim);
            if self.eat_punct(']') {
                return Ok(dims);
            }
            if !self.eat_punct(',') {
                return Err(self.unexpected("`,` or `]`"));
            }
        }
    }
}

fn is_float_literal(s: &str) -> bool {
    s.contains(['.', 'e', 'E']) || s.ends_with("inf")
}

fn float(s: &str, at: (usize, usize)) -> Result<f32> {
    s.parse::<f32>()
        .map_err(|_| err_at(at, format!("invalid number `{s}`")))
}

/// Places an [`Op::from_parts`] error: at the attribute it names first (prefixed
/// with "attribute `name`: "), else at the op's mnemonic.
fn attr_error(attrs: &[AttrAt], mnemonic: &str, op_at: (usize, usize), reason: String) -> IrError {
    let mention = |a: &AttrAt| {
        reason
            .find(&format!("`{}`", a.key))
            .or_else(|| reason.starts_with(&format!("{} ", a.key)).then_some(0))
    };
    let named = attrs
        .iter()
        .filter_map(|a| mention(a).map(|i| (i, a)))
        .min_by_key(|&(i, _)| i);
    match named {
        Some((_, a)) => {
            let at = if reason.contains("has no attribute") {
                a.key_at
            } else {
                a.value_at
            };
            err_at(at, format!("attribute `{}`: {reason}", a.key))
        }
        None if reason.contains("op `") => err_at(op_at, reason),
        None => err_at(op_at, format!("op `{mnemonic}`: {reason}")),
    }
}
