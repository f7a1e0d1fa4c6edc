//! E-graph optimisation (pass id `fuse`): MLPs as blocked batch-reduce GEMMs with
//! fused epilogues, the stable BCE on logits, the fused embedding update. The
//! [`canon`] pass runs the same machinery ([`saturate`]) with the rules of theme
//! `canon` (DLRM ops from an imported model's generic ops).
//!
//! The graph goes into an e-graph ([`convert::encode`]; training ops and every op
//! no rule mentions are opaque e-nodes, kept as they are), the rules of
//! [`rules::all`] run under explicit [`Limits`] (iterations, e-nodes, time), and the
//! cheapest graph under the [`extract::ExtractCost`] is extracted ([`convert::decode`]).
//! [`EgraphStats`] records the e-graph's size, the iterations, the stop reason and
//! how often each rule applied; the pass returns it and the pipeline stores it in
//! the pass log. The one rewrite tree extraction cannot choose, a gradient shared
//! by two ops, is the next pass of the pipeline, `fuse-dgrad-mask` ([`crate::mask`]).
//!
//! Invariants: names of surviving values, inputs, parameters (names and types),
//! outputs and updates are kept; the result verifies; in f32 it computes what the
//! input computes with the same arithmetic, except the `loss` theme (stable BCE,
//! equal up to rounding).

pub mod canon;
pub mod convert;
pub mod extract;
pub mod lang;
pub mod rules;

use crate::pass::Params;
use crate::{Pass, PassStats, Ran, Result};
use dlrm_ir::Graph;
use egg::{Extractor, Runner, SimpleScheduler, StopReason};
use extract::{DlCost, ExtractCost};
use lang::{Data, Dl, DlGraph, GET};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

/// The pass id.
pub const ID: &str = "fuse";

/// Runner limits: whichever is reached first stops rewriting.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Maximum rewrite iterations.
    pub iterations: usize,
    /// Maximum e-nodes.
    pub nodes: usize,
    /// Maximum wall time, milliseconds.
    pub time_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            iterations: 30,
            nodes: 200_000,
            time_ms: 5_000,
        }
    }
}

/// What the e-graph pass is configured with.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FuseOptions {
    /// Runner limits.
    pub limits: Limits,
    /// The extraction cost model.
    pub cost: ExtractCost,
    /// Rule configuration (forced block size, embedding fusion).
    pub rules: rules::RuleConfig,
}

/// What one run of the e-graph did (stored in the pass log).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EgraphStats {
    /// E-nodes when rewriting stopped.
    pub nodes: usize,
    /// E-classes when rewriting stopped.
    pub classes: usize,
    /// Rewrite iterations run.
    pub iterations: usize,
    /// Why rewriting stopped (`saturated`, `iteration limit`, `node limit`,
    /// `time limit`, or another reason).
    pub stop_reason: String,
    /// How many times each rule applied (rules that never applied are absent).
    pub rules_applied: BTreeMap<String, usize>,
    /// Estimated cost of the input graph (ns per step, the cost model's units).
    pub cost_before: f64,
    /// Estimated cost of the extracted graph.
    pub cost_after: f64,
}

/// The e-graph pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fuse {
    /// Its options.
    pub opts: FuseOptions,
}

impl Pass for Fuse {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph, _params: Option<&mut Params>) -> Result<Ran> {
        let (graph, stats) = fuse(&g, &self.opts)?;
        Ok(Ran {
            graph,
            stats: PassStats {
                egraph: Some(stats),
                ..Default::default()
            },
        })
    }
}

fn reason(r: &Option<StopReason>) -> String {
    match r {
        Some(StopReason::Saturated) => "saturated".into(),
        Some(StopReason::IterationLimit(n)) => format!("iteration limit ({n})"),
        Some(StopReason::NodeLimit(n)) => format!("node limit ({n})"),
        Some(StopReason::TimeLimit(t)) => format!("time limit ({t:.3} s)"),
        Some(StopReason::Other(s)) => s.clone(),
        None => "not run".into(),
    }
}

/// Runs the e-graph optimisation on `g` (see the module docs): the rules of
/// [`rules::all`], then extraction.
pub fn fuse(g: &Graph, opts: &FuseOptions) -> Result<(Graph, EgraphStats)> {
    let rules = rules::all(&opts.rules);
    saturate(g, &rules, &opts.limits, opts.cost, HashMap::new())
}

/// Encodes `g`, runs `rules` under `limits` (the rules see `consts` as the values
/// of the integer parameter leaves, [`lang::Types::consts`]), and extracts the
/// cheapest graph under `cost`.
pub fn saturate(
    g: &Graph,
    rules: &[egg::Rewrite<Dl, lang::Types>],
    limits: &Limits,
    cost: ExtractCost,
    consts: HashMap<egg::Symbol, Vec<i64>>,
) -> Result<(Graph, EgraphStats)> {
    let mut enc = convert::encode(g);
    enc.egraph.analysis.consts = consts;
    let roots: Vec<egg::Id> = g
        .outputs()
        .iter()
        .chain(g.updates().iter().map(|u| &u.value))
        .map(|v| enc.class_of[v.index()])
        .collect();
    let cost_before = {
        let ex = Extractor::new(
            &enc.egraph,
            DlCost {
                egraph: &enc.egraph,
                model: cost,
            },
        );
        roots.iter().map(|&r| ex.find_best_cost(r)).sum::<f64>()
    };
    let convert::Encoded {
        egraph,
        class_of,
        names,
    } = enc;
    let runner = Runner::default()
        .with_scheduler(SimpleScheduler)
        .with_iter_limit(limits.iterations)
        .with_node_limit(limits.nodes)
        .with_time_limit(Duration::from_millis(limits.time_ms))
        .with_egraph(egraph)
        .run(rules);
    let mut applied: BTreeMap<String, usize> = BTreeMap::new();
    for it in &runner.iterations {
        for (name, n) in &it.applied {
            *applied.entry(name.to_string()).or_default() += n;
        }
    }
    let enc = convert::Encoded {
        egraph: runner.egraph,
        class_of,
        names,
    };
    let ex = Extractor::new(
        &enc.egraph,
        DlCost {
            egraph: &enc.egraph,
            model: cost,
        },
    );
    let cost_after = roots.iter().map(|&r| ex.find_best_cost(r)).sum::<f64>();
    let chosen = select(&enc.egraph, &ex, cost, &roots);
    let out = convert::decode(g, &enc, |c| {
        chosen
            .get(&enc.egraph.find(c))
            .cloned()
            .unwrap_or_else(|| ex.find_best_node(c).clone())
    })?;
    let stats = EgraphStats {
        nodes: enc.egraph.total_number_of_nodes(),
        classes: enc.egraph.number_of_classes(),
        iterations: runner.iterations.len(),
        stop_reason: reason(&runner.stop_reason),
        rules_applied: applied,
        cost_before,
        cost_after,
    };
    Ok((out, stats))
}

/// The index and tuple of a `get` e-node.
fn as_get(eg: &DlGraph, n: &Dl) -> Option<(bool, egg::Id)> {
    match n {
        Dl::Op(m, ch) if m.as_str() == GET => {
            let first = ch.first().is_some_and(|&t| match &eg[t].data {
                Data::Tag(tag) => tag.val.as_str() == "0",
                _ => false,
            });
            ch.last().map(|&t| (first, eg.find(t)))
        }
        _ => None,
    }
}

/// Corrects the tree extraction for shared tuples: a result `k > 0` of a tuple is
/// costed as free (the tuple is paid by its result 0); where the extraction uses a
/// tuple only through such free results, those classes switch to their cheapest
/// other e-node. Returns the overridden choices.
fn select(
    eg: &DlGraph,
    ex: &Extractor<'_, DlCost<'_>, Dl, lang::Types>,
    model: ExtractCost,
    roots: &[egg::Id],
) -> HashMap<egg::Id, Dl> {
    let mut over: HashMap<egg::Id, Dl> = HashMap::new();
    let mut banned: HashSet<egg::Id> = HashSet::new();
    for _ in 0..8 {
        let best = |c: egg::Id| -> Dl {
            let c = eg.find(c);
            over.get(&c)
                .cloned()
                .unwrap_or_else(|| ex.find_best_node(c).clone())
        };
        let mut paid = HashSet::new();
        let mut riders = Vec::new();
        let mut seen = HashSet::new();
        let mut stack: Vec<egg::Id> = roots.iter().map(|&r| eg.find(r)).collect();
        while let Some(c) = stack.pop() {
            if !seen.insert(c) {
                continue;
            }
            let n = best(c);
            match as_get(eg, &n) {
                Some((true, t)) => {
                    paid.insert(t);
                }
                Some((false, t)) => riders.push((c, t)),
                None => {}
            }
            for &ch in egg::Language::children(&n) {
                stack.push(eg.find(ch));
            }
        }
        let mut changed = false;
        for (c, t) in riders {
            if paid.contains(&t) {
                continue;
            }
            banned.insert(t);
            let mut cf = DlCost { egraph: eg, model };
            let alt = eg[c]
                .nodes
                .iter()
                .filter(|n| as_get(eg, n).is_none_or(|(_, tt)| !banned.contains(&tt)))
                .map(|n| {
                    let cost = egg::CostFunction::cost(&mut cf, n, |x| ex.find_best_cost(x));
                    (cost, n)
                })
                .filter(|(cost, _)| cost.is_finite())
                .min_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((_, n)) = alt {
                over.insert(c, n.clone());
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    over
}
