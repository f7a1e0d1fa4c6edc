//! Communication-aware scheduling (pass id `schedule`): reorders a rank's graph so
//! that collectives start as early as possible and the work that does not depend
//! on them runs while they are in flight (the runtime starts a collective when its
//! node is reached and waits for it only when a later node uses its results). A
//! per-rank pass ([`crate::pipeline::RANK_PASSES`]): the pipeline runs it on every
//! rank's graph after `partition` and `bucket`.
//!
//! List scheduling: among the nodes whose operands are all defined, pick the one
//! with the smallest key `(c(n), n)`, where `c(n)` is the original position of the
//! earliest collective that `n` feeds (itself for a collective; after every
//! collective when it feeds none) and `n` its original position. On a partitioned
//! DLRM step this means:
//! - the embedding bags and their `all_to_all {dir=scatter}` come before the bottom
//!   MLP, which then overlaps the exchange;
//! - backward runs up to the embedding-gradient `all_to_all {dir=gather}` first;
//!   each weight gradient's `all_reduce` is issued as soon as the gradient exists;
//! - the optimizer updates, which feed no collective, come last, so the gradient
//!   all-reduces overlap the rest of backward and the embedding update.
//!
//! Invariants: the result is a valid execution order of the same nodes (names and
//! types verbatim, interface unchanged); collectives keep their relative order, so
//! every rank issues them identically (while collective `a` precedes `b`, some
//! unscheduled node with key at most `a` is always ready, so `b`, whose key is
//! larger, is never picked before `a`); a graph without collectives keeps its order.

use crate::copy::copy_nodes;
use crate::pass::Params;
use crate::{Pass, Ran, Result};
use dlrm_ir::{Def, Graph};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The scheduling pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct Schedule;

/// The pass id.
pub const ID: &str = "schedule";

impl Pass for Schedule {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph, _params: Option<&mut Params>) -> Result<Ran> {
        Ok(schedule(&g)?.into())
    }
}

/// The scheduled order of `g`'s nodes (indices into `g.nodes()`), see the module docs.
pub fn order(g: &Graph) -> Vec<usize> {
    let nodes = g.nodes();
    let users = g.users();
    // Distinct consumer nodes of each node's results.
    let succ: Vec<Vec<usize>> = nodes
        .iter()
        .map(|node| {
            let mut s: Vec<usize> = node
                .outputs
                .iter()
                .flat_map(|v| users[v.index()].iter().copied())
                .collect();
            s.sort_unstable();
            s.dedup();
            s
        })
        .collect();
    // c(n): the earliest collective reachable from n (consumers come later in a
    // valid order, so one backward sweep suffices).
    let mut key = vec![usize::MAX; nodes.len()];
    for n in (0..nodes.len()).rev() {
        let own = if nodes[n].op.is_collective() {
            n
        } else {
            usize::MAX
        };
        key[n] = succ[n].iter().map(|&u| key[u]).fold(own, usize::min);
    }
    let mut pending: Vec<usize> = nodes
        .iter()
        .map(|node| {
            let mut producers: Vec<usize> = node
                .inputs
                .iter()
                .filter_map(|&v| match g.value(v).def {
                    Def::Node(p, _) => Some(p),
                    _ => None,
                })
                .collect();
            producers.sort_unstable();
            producers.dedup();
            producers.len()
        })
        .collect();
    let mut ready: BinaryHeap<Reverse<(usize, usize)>> = (0..nodes.len())
        .filter(|&n| pending[n] == 0)
        .map(|n| Reverse((key[n], n)))
        .collect();
    let mut out = Vec::with_capacity(nodes.len());
    while let Some(Reverse((_, n))) = ready.pop() {
        out.push(n);
        for &u in &succ[n] {
            pending[u] -= 1;
            if pending[u] == 0 {
                ready.push(Reverse((key[u], u)));
            }
        }
    }
    out
}

/// `g` with its nodes in the scheduled order.
pub fn schedule(g: &Graph) -> Result<Graph> {
    copy_nodes(g, order(g), ID)
}
