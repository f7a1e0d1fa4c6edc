//! Gradient all-reduce buckets (pass id `bucket`): fuses a rank's dense-gradient
//! `all_reduce`s into few larger ones, as PyTorch DDP's gradient buckets do, so a
//! step pays the collective's latency a few times instead of once per gradient.
//!
//! A per-rank pass ([`crate::pipeline::RANK_PASSES`]): the pipeline runs it on every
//! rank's graph after `partition`, before [`crate::schedule()`].
//! A *gradient all-reduce* is an `all_reduce` whose results are not graph outputs and
//! are used only by dense optimizer updates (`sgd`, `split_sgd`, `adagrad`); the loss's
//! `all_reduce` and every other collective stay as they are.
//!
//! Grouping: the gradient all-reduces are taken in node order (the order backward
//! produces the gradients: the partition pass emits each right after its gradient,
//! and the schedule keeps the collectives' order); a bucket collects their operands
//! until it holds at least `bucket_bytes` bytes, then closes (the last bucket takes
//! what is left). `bucket_bytes = 0` keeps one all-reduce per gradient; an all-reduce
//! whose size is not fixed (a symbolic dimension) gets a bucket of its own; an
//! `all_reduce` that already has several operands is never split.
//!
//! A bucket becomes one `all_reduce` node with the members' operands and results
//! (the results keep their names and types, so the updates read them unchanged),
//! placed where its last member was: its operands all exist there, so the bucket
//! starts as soon as its last gradient is computed, while the rest of backward
//! (whose gradients go to later buckets) still runs; the updates that used an
//! earlier member's result move after the bucket. The runtime reduces a bucket with
//! one communicator call on the operands packed back to back (`dlrm_ir::interp`).
//!
//! Invariants: a function of the graph's structure and `bucket_bytes` only, so every
//! rank of a partitioned step (which issue the same gradient all-reduces in the
//! same order) buckets identically; the collectives keep their relative order; the
//! interface, value names and types are unchanged; a graph without gradient
//! all-reduces comes back node for node.

use crate::copy::Copier;
use crate::pass::Params;
use crate::{PassError, Ran, Result};
use dlrm_ir::{Def, Graph, Op, ValueId, verify};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The pass id.
pub const ID: &str = "bucket";

/// The default bucket size: 1 MiB.
///
/// With the planner's default network (`--network 2,12.5`: α = 2 µs, β = 12.5 GB/s)
/// a ring all-reduce of `n` bytes on `p` ranks costs `2(p-1)α + 2(p-1)/p · n/β`.
/// A bucket of 1 MiB moves in about 0.15 ms, against a latency of 28 µs at 8 ranks
/// (the wire is busy ≥ 80% of the bucket's time) and 0.25 ms at 64; smaller buckets
/// waste a growing share on latency, larger ones start later and leave a longer
/// last bucket exposed after backward (1 MiB costs ≤ 0.5 ms exposed at 64 ranks,
/// under 1% of a dlrm-small step). DDP's 25 MiB suits GPU steps whose gradients are
/// hundreds of MiB; dlrm-small's MLP gradients total 1.3 MiB (two buckets here).
pub const DEFAULT_BUCKET_BYTES: u64 = 1 << 20;

/// The bucketing pass with its bucket size in bytes.
#[derive(Clone, Copy, Debug)]
pub struct Bucket {
    /// A bucket closes once it holds at least this many bytes (0: no buckets).
    pub bytes: u64,
}

impl Default for Bucket {
    fn default() -> Bucket {
        Bucket {
            bytes: DEFAULT_BUCKET_BYTES,
        }
    }
}

impl crate::Pass for Bucket {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph, _params: Option<&mut Params>) -> Result<Ran> {
        Ok(bucket(&g, self.bytes)?.into())
    }
}

/// Whether node `n` is a gradient all-reduce (see the module docs).
fn is_grad_reduce(g: &Graph, users: &[Vec<usize>], n: usize) -> bool {
    let node = &g.nodes()[n];
    matches!(node.op, Op::AllReduce)
        && !node.outputs.is_empty()
        && node.outputs.iter().all(|&v| {
            !g.outputs().contains(&v)
                && !users[v.index()].is_empty()
                && users[v.index()]
                    .iter()
                    .all(|&u| g.nodes()[u].op.dense_grad_operand().is_some())
        })
}

/// The buckets of `g` for `bucket_bytes`: each a list of `(node, operand index)` of
/// gradient all-reduces, in node and operand order (see the module docs). A node's
/// operands always go to one bucket.
pub fn buckets(g: &Graph, bucket_bytes: u64) -> Vec<Vec<(usize, usize)>> {
    let users = g.users();
    let mut out: Vec<Vec<(usize, usize)>> = Vec::new();
    let mut cur: Vec<(usize, usize)> = Vec::new();
    let mut bytes = 0u64;
    for n in (0..g.nodes().len()).filter(|&n| is_grad_reduce(g, &users, n)) {
        let node = &g.nodes()[n];
        let size: Option<u64> = node
            .inputs
            .iter()
            .map(|&v| {
                let ty = g.ty(v);
                ty.fixed_numel().map(|e| (e * ty.dtype.size_bytes()) as u64)
            })
            .sum();
        let all = (0..node.inputs.len()).map(|i| (n, i));
        match size {
            Some(size) => {
                cur.extend(all);
                bytes += size;
                if bytes >= bucket_bytes {
                    out.push(std::mem::take(&mut cur));
                    bytes = 0;
                }
            }
            None => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    bytes = 0;
                }
                out.push(all.collect());
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// What the new graph holds at a position: an original node, or a bucket.
#[derive(Clone, Copy)]
enum Item {
    Node(usize),
    Bucket(usize),
}

/// `g` with its gradient all-reduces fused into buckets of at least `bucket_bytes`
/// bytes (see the module docs).
pub fn bucket(g: &Graph, bucket_bytes: u64) -> Result<Graph> {
    let groups = buckets(g, bucket_bytes);
    let nodes = g.nodes();
    // Item per position: a bucket sits where its last member node was; its other
    // member nodes vanish.
    let mut slot: Vec<Option<Item>> = (0..nodes.len()).map(|n| Some(Item::Node(n))).collect();
    let mut members: Vec<Vec<(usize, usize)>> = Vec::with_capacity(groups.len());
    for (b, group) in groups.into_iter().enumerate() {
        for &(n, _) in &group {
            slot[n] = None;
        }
        let last = group.iter().map(|&(n, _)| n).max().unwrap_or(0);
        slot[last] = Some(Item::Bucket(b));
        members.push(group);
    }
    let items: Vec<(usize, Item)> = slot
        .iter()
        .enumerate()
        .filter_map(|(p, it)| it.map(|it| (p, it)))
        .collect();
    // Per value: the item that defines it.
    let mut def_item: Vec<Option<usize>> = vec![None; g.values().len()];
    for (k, &(_, it)) in items.iter().enumerate() {
        match it {
            Item::Node(n) => nodes[n]
                .outputs
                .iter()
                .for_each(|v| def_item[v.index()] = Some(k)),
            Item::Bucket(b) => members[b]
                .iter()
                .for_each(|&(n, i)| def_item[nodes[n].outputs[i].index()] = Some(k)),
        }
    }
    let operands = |it: Item| -> Vec<ValueId> {
        match it {
            Item::Node(n) => nodes[n].inputs.clone(),
            Item::Bucket(b) => members[b]
                .iter()
                .map(|&(n, i)| nodes[n].inputs[i])
                .collect(),
        }
    };
    // Kahn's algorithm, earliest position first: the original order, except that
    // users of a bucket's results wait for it.
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); items.len()];
    let mut pending = vec![0usize; items.len()];
    for (k, &(_, it)) in items.iter().enumerate() {
        let mut preds: Vec<usize> = operands(it)
            .into_iter()
            .filter(|v| matches!(g.value(*v).def, Def::Node(..)))
            .filter_map(|v| def_item[v.index()])
            .collect();
        preds.sort_unstable();
        preds.dedup();
        pending[k] = preds.len();
        for p in preds {
            succ[p].push(k);
        }
    }
    let mut ready: BinaryHeap<Reverse<(usize, usize)>> = (0..items.len())
        .filter(|&k| pending[k] == 0)
        .map(|k| Reverse((items[k].0, k)))
        .collect();
    let mut c = Copier::new(g, ID, &[])?;
    let mut placed = 0;
    while let Some(Reverse((_, k))) = ready.pop() {
        placed += 1;
        let it = items[k].1;
        let (op, results): (Op, Vec<ValueId>) = match it {
            Item::Node(n) => (nodes[n].op.clone(), nodes[n].outputs.clone()),
            Item::Bucket(b) => (
                Op::AllReduce,
                members[b]
                    .iter()
                    .map(|&(n, i)| nodes[n].outputs[i])
                    .collect(),
            ),
        };
        c.push(op, &operands(it), &results)?;
        for &s in &succ[k] {
            pending[s] -= 1;
            if pending[s] == 0 {
                ready.push(Reverse((items[s].0, s)));
            }
        }
    }
    if placed != items.len() {
        return Err(PassError::Graph {
            pass: ID.to_string(),
            graph: g.name.clone(),
            reason: "the buckets would make the graph cyclic".into(),
        });
    }
    let out = c.finish()?;
    verify(&out).map_err(PassError::ir(ID))?;
    Ok(out)
}
