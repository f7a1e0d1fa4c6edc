//! The egg language of the IR and its analysis (types of every e-class).
//!
//! An IR node `op {attrs} operands` is the e-node `(mnemonic attr-tags.. operands..)`:
//! op names are the IR mnemonics, and each attribute is a leaf child `key=value` (a
//! [`Tag`], printed as in the text form) placed before the operands, in
//! [`dlrm_ir::Op::attrs`] order. Graph inputs and parameters are leaves `%name`
//! ([`ValueRef`]). A node with several results is a tuple e-class; `(get i=k t)` is
//! its result `k` (`get` is the only e-graph-only op). So a rule reads like the IR:
//! `(relu (linear act=none ?x ?w ?b))`.
//!
//! The analysis [`Types`] gives every e-class its result types (one per result;
//! `None` for tags, and for a node the IR cannot type, which rules never build):
//! computed with [`dlrm_ir::infer()`], so e-graph and IR agree by construction.

use dlrm_ir::{Attr, Dim, Op, TensorType, infer};
use egg::{Analysis, DidMerge, EGraph, Id, Symbol};
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

/// An attribute leaf `key=value` (the value in its text form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag {
    /// Attribute name.
    pub key: Symbol,
    /// Attribute value as printed by [`Attr`]'s `Display`.
    pub val: Symbol,
}

impl Tag {
    /// The tag of an attribute.
    pub fn new(key: &str, attr: &Attr) -> Tag {
        Tag {
            key: Symbol::from(key),
            val: Symbol::from(attr.to_string()),
        }
    }

    /// The attribute value parsed back (see [`parse_attr`]).
    pub fn attr(&self) -> Attr {
        parse_attr(self.val.as_str())
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.val)
    }
}

impl FromStr for Tag {
    type Err = String;
    fn from_str(s: &str) -> Result<Tag, String> {
        match s.split_once('=') {
            Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok(Tag {
                key: Symbol::from(k),
                val: Symbol::from(v),
            }),
            _ => Err(format!("`{s}` is not a key=value tag")),
        }
    }
}

/// Parses an attribute value from its printed form: integers, `true`/`false`,
/// lists `[..]` of dimensions, floats (with `.`, `e`, `inf`, `NaN`), else an
/// identifier (the op builder accepts an identifier where a dimension is expected).
pub fn parse_attr(s: &str) -> Attr {
    if let Ok(i) = s.parse::<i64>() {
        return Attr::Int(i);
    }
    match s {
        "true" => return Attr::Bool(true),
        "false" => return Attr::Bool(false),
        "inf" | "-inf" | "NaN" => return Attr::Float(s.parse().unwrap_or(f32::NAN)),
        _ => {}
    }
    if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        let dims = inner
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|p| match p.parse::<usize>() {
                Ok(n) => Dim::Fixed(n),
                Err(_) => dlrm_ir::DimExpr::parse(p)
                    .and_then(Dim::from_expr)
                    .unwrap_or_else(|| Dim::Sym(p.to_string())),
            })
            .collect();
        return Attr::List(dims);
    }
    let numeric = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_digit() || c == '-' || c == '.');
    if numeric && let Ok(f) = s.parse::<f32>() {
        return Attr::Float(f);
    }
    Attr::Ident(s.to_string())
}

/// A graph input or parameter leaf, `%name`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueRef(pub Symbol);

impl fmt::Display for ValueRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

impl FromStr for ValueRef {
    type Err = String;
    fn from_str(s: &str) -> Result<ValueRef, String> {
        match s.strip_prefix('%') {
            Some(n) if !n.is_empty() => Ok(ValueRef(Symbol::from(n))),
            _ => Err(format!("`{s}` is not a %value")),
        }
    }
}

pub use def::Dl;

#[allow(missing_docs)] // The macro does not take docs on variants: `Tag` is an
// attribute leaf, `Value` an input or parameter leaf, `Op` a mnemonic with its
// attribute tags then its operands.
mod def {
    use super::{Tag, ValueRef};
    use egg::{Id, Symbol, define_language};
    define_language! {
        /// The IR as an egg language (see the module docs).
        pub enum Dl {
            Tag(Tag),
            Value(ValueRef),
            Op(Symbol, Vec<Id>),
        }
    }
}

/// The projection of a tuple e-class.
pub const GET: &str = "get";

/// Types of an e-class.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// An attribute tag.
    Tag(Tag),
    /// The result types (one per result); `None` if the IR cannot type the node.
    Types(Option<Vec<TensorType>>),
}

impl Data {
    /// The single result type of a one-result e-class.
    pub fn ty(&self) -> Option<&TensorType> {
        match self {
            Data::Types(Some(ts)) if ts.len() == 1 => ts.first(),
            _ => None,
        }
    }
}

/// The type analysis: leaves are typed from the graph's inputs and parameters.
#[derive(Clone, Debug, Default)]
pub struct Types {
    /// Types of the `%name` leaves.
    pub leaves: HashMap<Symbol, TensorType>,
    /// Original value names by e-class (as encoded; look up with [`class_name`]).
    pub names: HashMap<Id, String>,
    /// Name hints for e-classes the rules create (e.g. `bot.0.blk`).
    pub hints: HashMap<Id, String>,
    /// Values of the small integer parameters (constants of an imported model, e.g.
    /// the lower-triangle indices of an interaction), by leaf name; only the
    /// `canon` pass fills it, from the parameter tensors it is given.
    pub consts: HashMap<Symbol, Vec<i64>>,
}

/// The original name, else the hint, of e-class `c` (ids compared canonically).
pub fn class_name(eg: &DlGraph, c: Id) -> Option<String> {
    let c = eg.find(c);
    let scan = |m: &HashMap<Id, String>| {
        m.iter()
            .filter(|(k, _)| eg.find(**k) == c)
            .min_by_key(|(k, _)| **k)
            .map(|(_, v)| v.clone())
    };
    scan(&eg.analysis.names).or_else(|| scan(&eg.analysis.hints))
}

/// Records `name` as the hint of class `c` unless it has one.
pub fn set_hint(eg: &mut DlGraph, c: Id, name: String) {
    if class_name(eg, c).is_none() {
        eg.analysis.hints.insert(c, name);
    }
}

/// The e-graph of the IR.
pub type DlGraph = EGraph<Dl, Types>;

/// Splits an op e-node's children into attributes and operand classes.
pub fn split_children(eg: &DlGraph, children: &[Id]) -> (Vec<(String, Attr)>, Vec<Id>) {
    let mut attrs = Vec::new();
    let mut operands = Vec::new();
    for &c in children {
        match &eg[c].data {
            Data::Tag(t) => attrs.push((t.key.as_str().to_string(), t.attr())),
            Data::Types(_) => operands.push(c),
        }
    }
    (attrs, operands)
}

/// Builds the IR op of an op e-node (`None` for `get` or an invalid op).
pub fn ir_op(mnemonic: &str, attrs: &[(String, Attr)]) -> Option<Op> {
    Op::from_parts(mnemonic, attrs).ok()
}

impl Analysis<Dl> for Types {
    type Data = Data;

    fn make(egraph: &mut DlGraph, enode: &Dl, _id: Id) -> Data {
        match enode {
            Dl::Tag(t) => Data::Tag(*t),
            Dl::Value(v) => Data::Types(egraph.analysis.leaves.get(&v.0).map(|t| vec![t.clone()])),
            Dl::Op(m, children) => {
                let (attrs, operands) = split_children(egraph, children);
                let mut tys: Vec<&Vec<TensorType>> = Vec::with_capacity(operands.len());
                for &o in &operands {
                    match &egraph[o].data {
                        Data::Types(Some(t)) => tys.push(t),
                        _ => return Data::Types(None),
                    }
                }
                if m.as_str() == GET {
                    let k = attrs.first().and_then(|(_, a)| match a {
                        Attr::Int(k) => usize::try_from(*k).ok(),
                        _ => None,
                    });
                    let t = match (k, tys.as_slice()) {
                        (Some(k), [t]) => t.get(k).cloned().map(|t| vec![t]),
                        _ => None,
                    };
                    return Data::Types(t);
                }
                let mut ins = Vec::with_capacity(tys.len());
                for t in &tys {
                    match t.as_slice() {
                        [one] => ins.push(one),
                        _ => return Data::Types(None),
                    }
                }
                let types = ir_op(m.as_str(), &attrs).and_then(|op| infer(&op, &ins, &[]).ok());
                Data::Types(types)
            }
        }
    }

    fn merge(&mut self, to: &mut Data, from: Data) -> DidMerge {
        match (&*to, from) {
            (Data::Types(None), Data::Types(Some(t))) => {
                *to = Data::Types(Some(t));
                DidMerge(true, false)
            }
            (Data::Types(Some(_)), Data::Types(None)) => DidMerge(false, true),
            _ => DidMerge(false, false),
        }
    }
}
