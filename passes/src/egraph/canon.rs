//! Canonicalisation (pass id `canon`): the DLRM ops of an imported model, found in
//! its generic ops by the e-graph rules of theme [`super::rules::canon`]
//! (embedding bags, `linear` layers, the dot / cat interaction), with the
//! [`super::rules::recognise`] rules (activations into the `linear` epilogue), so
//! that the canonical forward graph is what the JSON frontend builds.
//!
//! It runs first, before autodiff, whenever the graph has generic ops
//! ([`applies`]): autodiff differentiates the canonical ops, and the `fuse` rules
//! expect `linear`. A graph that does not match keeps its generic ops (it still
//! runs, op by op). After extraction, a parameter used only through
//! `transpose{[1,0]}` (the pre-transposed weight of an exported `MatMul` + `Add`)
//! is stored transposed: it keeps its name, takes the transposed type, and the
//! transposes disappear; its tensor, when given, is transposed alike.
//!
//! The rules read the values of the integer parameters of at most
//! [`CONST_LIMIT`] elements (the lower-triangle indices of an interaction); without
//! parameter tensors (`dlrmc opt`, [`crate::compile`]) the rules that need them do
//! not fire. Invariants: those of the e-graph pass (names of surviving values and
//! the interface kept, the result verifies, f32 results bit-exact; see
//! `rules/README.md`).

use super::extract::ExtractCost;
use super::{EgraphStats, Limits, rules, saturate};
use crate::copy::{Rewire, copy_rewired};
use crate::pass::Params;
use crate::{Pass, PassError, PassStats, Ran, Result};
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{Graph, Node, Op, SingleRank, TensorType, ValueId};
use egg::Symbol;
use std::collections::HashMap;

/// The pass id.
pub const ID: &str = "canon";

/// Integer parameters up to this many elements are visible to the rules.
pub const CONST_LIMIT: usize = 1 << 16;

/// The canonicalisation pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct Canon {
    /// Runner limits.
    pub limits: Limits,
}

impl Pass for Canon {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph, params: Option<&mut Params>) -> Result<Ran> {
        let (graph, stats) = canonicalise(&g, params, &self.limits)?;
        Ok(Ran {
            graph,
            stats: PassStats {
                egraph: Some(stats),
                ..Default::default()
            },
        })
    }
}

/// The ops only an imported model has (no DLRM-level meaning of their own).
pub const GENERIC: &[&str] = &[
    "matmul",
    "binary",
    "transpose",
    "gather",
    "gather_elements",
    "gather_nd",
    "slice",
    "reduce",
    "cast",
    "concat",
];

/// True if `g` has an op that a canonicalisation rule starts from.
pub fn applies(g: &Graph) -> bool {
    g.nodes().iter().any(|n| GENERIC.contains(&n.op.mnemonic()))
}

/// Runs the `canon` rules on `g` (see the module docs); `params`, when given,
/// provide the constants and are transformed with the graph.
pub fn canonicalise(
    g: &Graph,
    params: Option<&mut Params>,
    limits: &Limits,
) -> Result<(Graph, EgraphStats)> {
    if !applies(g) {
        let stats = EgraphStats {
            stop_reason: "no generic ops".into(),
            ..EgraphStats::default()
        };
        return Ok((g.clone(), stats));
    }
    let consts: HashMap<Symbol, Vec<i64>> = params
        .as_deref()
        .into_iter()
        .flatten()
        .filter(|(_, t)| t.dtype().is_int() && t.numel() <= CONST_LIMIT)
        .filter_map(|(n, t)| Some((Symbol::from(n.as_str()), t.to_i64_vec()?)))
        .collect();
    let mut rules = rules::canon::rules(&rules::RuleConfig::default());
    rules.extend(rules::cross::rules(&rules::RuleConfig::default()));
    rules.extend(rules::recognise::rules());
    let (out, stats) = saturate(g, &rules, limits, ExtractCost::default(), consts)?;
    let out = store_transposed(&out, params)?;
    Ok((out, stats))
}

/// The parameters used only as operand of `transpose{[1,0]}` (and not updated).
fn transposed_params(g: &Graph) -> Vec<ValueId> {
    let users = g.users();
    let flip = Op::Transpose { perm: vec![1, 0] };
    g.params()
        .iter()
        .copied()
        .filter(|&p| {
            let us = &users[p.index()];
            !us.is_empty()
                && us.iter().all(|&n| g.nodes()[n].op == flip)
                && !g.outputs().contains(&p)
                && g.updates().iter().all(|u| u.param != p && u.value != p)
        })
        .collect()
}

/// Stores the parameters of [`transposed_params`] transposed (see the module docs).
fn store_transposed(g: &Graph, params: Option<&mut Params>) -> Result<Graph> {
    let flipped = transposed_params(g);
    if flipped.is_empty() {
        return Ok(g.clone());
    }
    let flip = Op::Transpose { perm: vec![1, 0] };
    let mut param_types = Vec::with_capacity(flipped.len());
    let mut new_types: HashMap<String, TensorType> = HashMap::new();
    for &p in &flipped {
        let t = dlrm_ir::infer(&flip, &[g.ty(p)], &[])
            .map_err(|reason| graph_err(g, reason))?
            .remove(0);
        new_types.insert(g.name_of(p).to_string(), t.clone());
        param_types.push((p, t));
    }
    // `transpose{[1,0]}(p)` of a flipped parameter becomes `p` itself.
    let forward = |node: &Node| match node.inputs.as_slice() {
        [p] if node.op == flip && flipped.contains(p) => Some(*p),
        _ => None,
    };
    let rewire = Rewire {
        param_types,
        forward: Some(&forward),
    };
    let out = copy_rewired(g, 0..g.nodes().len(), ID, &rewire)?;
    if let Some(params) = params {
        let syms = HashMap::new();
        let ctx = EvalCtx {
            syms: &syms,
            comm: &SingleRank,
        };
        for (name, t) in params.iter_mut() {
            if let Some(ty) = new_types.get(name) {
                let mut r =
                    eval_op(&flip, &[t], std::slice::from_ref(ty), &ctx).map_err(|reason| {
                        PassError::Arg {
                            pass: ID.into(),
                            reason: format!("transposing parameter %{name}: {reason}"),
                        }
                    })?;
                *t = r.remove(0);
            }
        }
    }
    Ok(out)
}

fn graph_err(g: &Graph, reason: String) -> PassError {
    PassError::Graph {
        pass: ID.into(),
        graph: g.name.clone(),
        reason,
    }
}
