//! The rewrite rules, one file per theme (invariants in `README.md` beside this
//! file): [`recognise`], [`contract`], [`loss`], [`embedding`], [`layout`] (the
//! `fuse` pass, [`all`]), and [`canon`] (the `canon` pass, run before autodiff:
//! DLRM ops from the generic ONNX ops).
//!
//! Simple rules are egg patterns over the IR mnemonics; rules that need shapes
//! (block sizes, type conditions) use [`Build`], an applier that runs a Rust
//! function on the match and unions its result with the matched e-class. Every
//! builder checks with [`dlrm_ir::infer()`] that what it adds is well typed and has
//! the matched class's type, and adds nothing otherwise.

pub mod canon;
pub mod contract;
pub mod cross;
pub mod embedding;
pub mod layout;
pub mod loss;
pub mod recognise;

use super::convert::op_children;
use super::lang::{Data, Dl, DlGraph, Types};
use dlrm_ir::{Attr, Op, TensorType, infer};
use egg::{Applier, Id, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};

/// What the rules are configured with.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RuleConfig {
    /// Force this block size (capped at each dimension); `None`: the cost model
    /// chooses per dimension ([`super::extract::block_for`]).
    pub block: Option<usize>,
    /// Include the fused embedding update (theme `embedding`).
    pub fuse_embedding: bool,
}

/// Every rule for `cfg`, themes in order.
pub fn all(cfg: &RuleConfig) -> Vec<Rewrite<Dl, Types>> {
    let mut r = recognise::rules();
    r.extend(contract::rules(cfg));
    r.extend(loss::rules());
    r.extend(layout::rules());
    if cfg.fuse_embedding {
        r.extend(embedding::rules());
    }
    r
}

/// The names of every rule of `cfg` (for logs and tests).
pub fn names(cfg: &RuleConfig) -> Vec<String> {
    all(cfg).iter().map(|r| r.name.to_string()).collect()
}

/// A builder: from the e-graph, the matched class and the substitution, the class
/// to union with the match (`None`: the rule does not apply here).
pub type BuildFn = fn(&mut DlGraph, Id, &Subst, &RuleConfig) -> Option<Id>;

/// An applier running a [`BuildFn`].
pub struct Build {
    /// The builder.
    pub f: BuildFn,
    /// Its configuration.
    pub cfg: RuleConfig,
}

impl Applier<Dl, Types> for Build {
    fn apply_one(
        &self,
        egraph: &mut DlGraph,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<Dl>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        match (self.f)(egraph, eclass, subst, &self.cfg) {
            Some(new) if egraph.union(eclass, new) => vec![eclass],
            _ => vec![],
        }
    }
}

/// A rule `pattern => builder`.
pub fn build_rule(name: &str, pattern: &str, f: BuildFn, cfg: &RuleConfig) -> Rewrite<Dl, Types> {
    let searcher: egg::Pattern<Dl> = pattern
        .parse()
        .unwrap_or_else(|e| panic!("rule {name}: bad pattern {pattern}: {e:?}"));
    Rewrite::new(name, searcher, Build { f, cfg: *cfg })
        .unwrap_or_else(|e| panic!("rule {name}: {e}"))
}

/// A searcher matching every e-class that holds an e-node of one op (any arity,
/// any attributes), with an empty substitution: for rules over variadic ops
/// (`concat`), whose builder reads the e-nodes of the matched class itself.
pub struct OpSearcher {
    /// The op mnemonic.
    pub op: Symbol,
}

impl Searcher<Dl, Types> for OpSearcher {
    fn search_eclass_with_limit(
        &self,
        egraph: &DlGraph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, Dl>> {
        let found = egraph[eclass]
            .nodes
            .iter()
            .any(|n| matches!(n, Dl::Op(m, _) if *m == self.op));
        (found && limit > 0).then(|| SearchMatches {
            eclass,
            substs: vec![Subst::default()],
            ast: None,
        })
    }

    fn vars(&self) -> Vec<Var> {
        Vec::new()
    }
}

/// A rule `any e-class holding an op e-node => builder` (see [`OpSearcher`]).
pub fn build_op_rule(name: &str, op: &str, f: BuildFn, cfg: &RuleConfig) -> Rewrite<Dl, Types> {
    let searcher = OpSearcher {
        op: Symbol::from(op),
    };
    Rewrite::new(name, searcher, Build { f, cfg: *cfg })
        .unwrap_or_else(|e| panic!("rule {name}: {e}"))
}

/// An op e-node's attributes and operand classes.
pub type OpNode = (Vec<(String, Attr)>, Vec<Id>);

/// The e-nodes of op `op` in class `c`: attributes and operand classes.
pub fn op_nodes(eg: &DlGraph, c: Id, op: &str) -> Vec<OpNode> {
    eg[c]
        .nodes
        .iter()
        .filter_map(|n| match n {
            Dl::Op(m, ch) if m.as_str() == op => Some(super::lang::split_children(eg, ch)),
            _ => None,
        })
        .collect()
}

/// The value of an integer constant class (a parameter leaf whose tensor the
/// `canon` pass was given, see [`Types::consts`]).
pub fn const_ints(eg: &DlGraph, c: Id) -> Option<Vec<i64>> {
    eg[c].nodes.iter().find_map(|n| match n {
        Dl::Value(v) => eg.analysis.consts.get(&v.0).cloned(),
        _ => None,
    })
}

/// The variable `?name` (given without the `?`).
pub fn var(name: &str) -> Var {
    format!("?{name}")
        .parse()
        .unwrap_or_else(|e| panic!("bad variable {name}: {e:?}"))
}

/// The class bound to `?name`.
pub fn bound(subst: &Subst, name: &str) -> Option<Id> {
    subst.get(var(name)).copied()
}

/// The single result type of a class.
pub fn ty_of(eg: &DlGraph, c: Id) -> Option<TensorType> {
    eg[c].data.ty().cloned()
}

/// The attribute of a tag class.
pub fn attr_of(eg: &DlGraph, c: Id) -> Option<Attr> {
    match &eg[c].data {
        Data::Tag(t) => Some(t.attr()),
        _ => None,
    }
}

/// Adds `op(operands)` if it is well typed; returns its class and types.
pub fn add_op(eg: &mut DlGraph, op: &Op, operands: &[Id]) -> Option<(Id, Vec<TensorType>)> {
    let tys: Vec<TensorType> = operands
        .iter()
        .map(|&c| ty_of(eg, c))
        .collect::<Option<_>>()?;
    let refs: Vec<&TensorType> = tys.iter().collect();
    let out = infer(op, &refs, &[]).ok()?;
    let ch = op_children(eg, op, operands);
    let id = eg.add(Dl::Op(Symbol::from(op.mnemonic()), ch));
    Some((id, out))
}

/// Adds a one-result op; returns its class and type.
pub fn add1(eg: &mut DlGraph, op: &Op, operands: &[Id]) -> Option<(Id, TensorType)> {
    let (id, mut tys) = add_op(eg, op, operands)?;
    if tys.len() == 1 {
        tys.pop().map(|t| (id, t))
    } else {
        None
    }
}

/// `(get i=k tuple)`.
pub fn get(eg: &mut DlGraph, tuple: Id, k: usize) -> Id {
    let t = super::convert::tag(eg, "i", &Attr::Int(k as i64));
    eg.add(Dl::Op(Symbol::from(super::lang::GET), vec![t, tuple]))
}

/// Returns `new` if its type equals the matched class's (the soundness check every
/// builder ends with).
pub fn same_type(eg: &DlGraph, matched: Id, new: Id) -> Option<Id> {
    let (a, b) = (ty_of(eg, matched)?, ty_of(eg, new)?);
    (a == b).then_some(new)
}
