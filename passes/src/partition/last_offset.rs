//! Last-offset bags (`embedding_bag {last_offset=true}`, PyTorch's
//! `include_last_offset=True`) made plain before the partition: every such bag and
//! its `embedding_bag_grad` become `last_offset=false`, and their offsets input
//! `[B+1]` becomes `[B]` (the usual offsets, one per sample; `[G]` on the ranks that
//! hold the table, as for any offsets bag).
//!
//! Why: the exchange looks a bag up for the global batch and the ranks' data sources
//! build each rank's offsets from the samples anyway (`dlrm_runtime::synthetic`: offsets
//! start at 0 and end at the number of indices), so the last entry carries nothing a
//! plain bag does not know; plain bags have every placement's form already
//! (`embedding_bag_rows`, `embedding_grad_dense`, the row-wise updates), none of
//! which has a last_offset form. The data sources give a per-rank graph's `[B]` /
//! `[G]` offsets `S` entries and an unpartitioned graph's `[B+1]` ones `S+1`.
//!
//! The partition places only the fused Adagrad update (`embedding_update_adagrad`),
//! which has no last_offset form, so the pass fuses a last_offset bag gradient and
//! the `sparse_adagrad` that alone uses it, as the `fuse-embedding-update` rule does
//! for plain bags; a `sparse_sgd` stays unfused (the partition places it).
//!
//! Requirements (errors naming the node otherwise): the offsets of a last_offset
//! bag are a graph input `[B+1]` used only as the offsets (operand 2) of
//! last_offset bags and bag gradients, and as the bounds of the sparse updates of
//! their rows (`sparse_sgd`/`sparse_adagrad`'s last operand, dropped: every index
//! of plain offsets is in a bag).

use super::{ID, graph_err, node_err};
use crate::{PassError, Result};
use dlrm_ir::{Def, Dim, DimExpr, Graph, Op, ValueId, verify};
use std::borrow::Cow;
use std::collections::HashMap;

/// True for a bag or bag gradient with `last_offset`.
fn is_last_offset(op: &Op) -> bool {
    matches!(
        op,
        Op::EmbeddingBag {
            last_offset: true,
            ..
        } | Op::EmbeddingBagGrad {
            last_offset: true,
            ..
        }
    )
}

/// `g` with its last_offset bags made plain (module docs); `g` itself when it has
/// none.
pub(super) fn plain_offsets(g: &Graph) -> Result<Cow<'_, Graph>> {
    let nodes = g.nodes();
    let mut retype = vec![false; g.values().len()];
    for (n, node) in nodes.iter().enumerate() {
        if !is_last_offset(&node.op) {
            continue;
        }
        let Some(&o) = node.inputs.get(2) else {
            return Err(node_err(g, n, "a last_offset bag needs offsets".into()));
        };
        if !matches!(g.value(o).def, Def::Input(_)) {
            return Err(node_err(
                g,
                n,
                format!(
                    "the offsets %{} must be a graph input [{}+1] (offsets computed in the \
                     graph, e.g. a jagged batch's `offsets_from_lengths`, are not placed \
                     yet, and dlrm-run's data sources do not produce jagged batches; \
                     `dlrm-run PLAN --infer --inputs FILE` serves such a plan)",
                    g.name_of(o),
                    Dim::BATCH
                ),
            ));
        }
        retype[o.index()] = true;
    }
    if !retype.contains(&true) {
        return Ok(Cow::Borrowed(g));
    }
    let users = g.users();
    for (i, _) in retype.iter().enumerate().filter(|(_, r)| **r) {
        let o = ValueId(i as u32);
        for &n in &users[i] {
            let node = &nodes[n];
            let bad_slot = node
                .inputs
                .iter()
                .enumerate()
                .find(|&(slot, &v)| v == o && !offsets_slot(&node.op, slot));
            if let Some((slot, _)) = bad_slot {
                return Err(node_err(
                    g,
                    n,
                    format!(
                        "uses %{}, the offsets of a last_offset bag (include_last_offset=True), \
                         as operand {slot} of `{}`: the partition needs them used only by \
                         last_offset bags and their gradients",
                        g.name_of(o),
                        node.op.mnemonic()
                    ),
                ));
            }
        }
        if plain_len(g.ty(o).shape.first()).is_none() {
            return Err(graph_err(
                g,
                format!(
                    "the offsets %{} of a last_offset bag are {}: the partition needs [{}+1]",
                    g.name_of(o),
                    g.ty(o),
                    Dim::BATCH
                ),
            ));
        }
    }
    rebuild(g, &retype, &adagrad_pairs(g)).map(Cow::Owned)
}

/// The last_offset bag gradients to fuse with the `sparse_adagrad` that is their
/// only user (same indices): sparse_adagrad node by bag gradient node.
fn adagrad_pairs(g: &Graph) -> HashMap<usize, usize> {
    let (nodes, users) = (g.nodes(), g.users());
    let mut pairs = HashMap::new();
    for (n, node) in nodes.iter().enumerate() {
        if !matches!(node.op, Op::SparseAdagrad { .. }) {
            continue;
        }
        let Some(&rows) = node.inputs.get(3) else {
            continue;
        };
        let Def::Node(k, 0) = g.value(rows).def else {
            continue;
        };
        let grad = &nodes[k];
        let alone = users[rows.index()] == [n] && !g.outputs().contains(&rows);
        let op_ok = matches!(
            grad.op,
            Op::EmbeddingBagGrad {
                last_offset: true,
                ..
            }
        );
        if op_ok && alone && grad.inputs.get(1) == node.inputs.get(2) {
            pairs.insert(k, n);
        }
    }
    pairs
}

/// `sparse_adagrad(t, acc, idx, embedding_bag_grad(dy, idx, off))` as
/// `embedding_update_adagrad(t, acc, dy, idx, off)`: the fused op and its operands
/// (source values).
fn fused_adagrad(g: &Graph, grad: usize, upd: usize) -> Option<(Op, Vec<ValueId>)> {
    let (gn, un) = (&g.nodes()[grad], &g.nodes()[upd]);
    let (Op::EmbeddingBagGrad { mode, .. }, &Op::SparseAdagrad { lr, eps, rowwise }) =
        (&gn.op, &un.op)
    else {
        return None;
    };
    let op = Op::EmbeddingUpdateAdagrad {
        mode: *mode,
        lr,
        eps,
        rowwise,
    };
    let ins = vec![
        *un.inputs.first()?,
        *un.inputs.get(1)?,
        *gn.inputs.first()?,
        *gn.inputs.get(1)?,
        *gn.inputs.get(2)?,
    ];
    Some((op, ins))
}

/// True if operand `slot` of `op` may be a last_offset bag's offsets: the offsets
/// of a last_offset bag or bag gradient, or the bounds of the sparse update of
/// such a bag's rows (`sparse_sgd`'s fourth operand, `sparse_adagrad`'s fifth).
fn offsets_slot(op: &Op, slot: usize) -> bool {
    match op {
        _ if is_last_offset(op) => slot == 2,
        _ => bounds_slot(op) == Some(slot),
    }
}

/// The operand of a sparse update that bounds it to a last_offset bag's indices.
fn bounds_slot(op: &Op) -> Option<usize> {
    match op {
        Op::SparseSgd { .. } => Some(3),
        Op::SparseAdagrad { .. } => Some(4),
        _ => None,
    }
}

/// `B` for a length `B+1`.
fn plain_len(len: Option<&Dim>) -> Option<Dim> {
    let d = Dim::from_expr(len?.to_expr().sub(&DimExpr::int(1))?)?;
    d.is_sym(Dim::BATCH).then_some(d)
}

/// `g` rebuilt with the inputs marked in `retype` one entry shorter, every
/// last_offset bag and bag gradient plain, and the bag gradients of `adagrad`
/// fused into their `sparse_adagrad`.
fn rebuild(g: &Graph, retype: &[bool], adagrad: &HashMap<usize, usize>) -> Result<Graph> {
    let e = PassError::ir(ID);
    let mut ng = Graph::new(g.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; g.values().len()];
    for &v in g.inputs() {
        let mut ty = g.ty(v).clone();
        if retype[v.index()]
            && let Some(d) = plain_len(ty.shape.first())
        {
            ty.shape[0] = d;
        }
        map[v.index()] = Some(ng.add_input(g.name_of(v), ty).map_err(e)?);
    }
    for &p in g.params() {
        map[p.index()] = Some(ng.add_param(g.name_of(p), g.ty(p).clone()).map_err(e)?);
    }
    let get = |map: &[Option<ValueId>], v: ValueId| {
        map[v.index()].ok_or_else(|| {
            graph_err(
                g,
                format!("internal: %{} is used before it is defined", g.name_of(v)),
            )
        })
    };
    let fused: HashMap<usize, usize> = adagrad.iter().map(|(&k, &n)| (n, k)).collect();
    for (n, node) in g.nodes().iter().enumerate() {
        if adagrad.contains_key(&n) {
            continue; // fused into its sparse_adagrad below
        }
        let (op, ins) = match fused.get(&n).and_then(|&k| fused_adagrad(g, k, n)) {
            Some(f) => f,
            None => (plain_op(&node.op), unbounded(node, retype)),
        };
        let ins = ins
            .iter()
            .map(|&v| get(&map, v))
            .collect::<Result<Vec<_>>>()?;
        let results = node
            .outputs
            .iter()
            .map(|&v| (g.name_of(v).to_string(), g.ty(v).clone()))
            .collect();
        let outs = ng.push_node_unchecked(op, ins, results).map_err(e)?;
        for (&old, new) in node.outputs.iter().zip(outs) {
            map[old.index()] = Some(new);
        }
    }
    let outputs = g
        .outputs()
        .iter()
        .map(|&v| get(&map, v))
        .collect::<Result<Vec<_>>>()?;
    ng.set_outputs(outputs);
    for u in g.updates() {
        ng.add_update(get(&map, u.param)?, get(&map, u.value)?)
            .map_err(e)?;
    }
    verify(&ng).map_err(|source| PassError::Verify {
        after: format!("{ID} (last_offset bags made plain)"),
        source,
    })?;
    Ok(ng)
}

/// `node`'s operands without the bounds of a sparse update bounded by plain-made
/// offsets: plain offsets start at 0 and end at the index count, so every index is
/// in a bag and the update needs no bounds.
fn unbounded(node: &dlrm_ir::Node, retype: &[bool]) -> Vec<ValueId> {
    let mut ins = node.inputs.clone();
    if let Some(k) = bounds_slot(&node.op)
        && ins.get(k).is_some_and(|v| retype[v.index()])
    {
        ins.truncate(k);
    }
    ins
}

/// `op` with `last_offset=false` if it is a bag or a bag gradient.
fn plain_op(op: &Op) -> Op {
    match *op {
        Op::EmbeddingBag { mode, .. } => Op::EmbeddingBag {
            mode,
            last_offset: false,
        },
        Op::EmbeddingBagGrad { mode, .. } => Op::EmbeddingBagGrad {
            mode,
            last_offset: false,
        },
        ref op => op.clone(),
    }
}
