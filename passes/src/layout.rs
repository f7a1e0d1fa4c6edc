//! Blocked weight storage (pass id `layout`).
//!
//! After the e-graph pass, a weight used by `brgemm` is reached through
//! `block_weight {bn,bk}(%w)`, and its SGD update reads the gradient through
//! `unblock_weight(dwb)`. This pass stores such a weight blocked once and for all:
//! the parameter keeps its name and takes the blocked type `[N/bn, K/bk, bk, bn]`,
//! the `block_weight` nodes disappear (their users read the parameter), and
//! `sgd(%w, unblock_weight(dwb))` becomes `sgd(%w, dwb)` (the `unblock_weight` is
//! left dead for `dce`). Its initial value is blocked the same way (zero padding),
//! by the interpreter's `block_weight`, so both plans compute the same.
//! `adagrad(%w, %w.acc, unblock_weight(dwb))` (elementwise) becomes
//! `adagrad(%w, %w.acc, dwb)` with the accumulator blocked like its weight (it must
//! be a parameter used by that update alone); the padding stays 0 in both (a zero
//! gradient leaves a weight unchanged when `eps > 0`).
//!
//! A parameter qualifies only if every use is a `block_weight` with one block
//! shape, or an `sgd` / `adagrad` as described; any other use leaves it unblocked
//! (correct, only slower: the `block_weight` then runs every step).

use crate::pass::Params;
use crate::{Pass, PassError, Ran, Result};
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{Def, Graph, Op, SingleRank, TensorType, ValueId};
use std::collections::HashMap;

/// The pass id.
pub const ID: &str = "layout";

/// The layout pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct Layout;

impl Pass for Layout {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph, params: Option<&mut Params>) -> Result<Ran> {
        Ok(layout(&g, params)?.into())
    }
}

fn def_node(g: &Graph, v: ValueId) -> Option<usize> {
    match g.value(v).def {
        Def::Node(n, _) => Some(n),
        _ => None,
    }
}

/// The operand holding the (unblocked) gradient of a dense update of `p`.
fn grad_operand(op: &Op) -> Option<usize> {
    match op {
        Op::Sgd { .. } => Some(1),
        Op::Adagrad { rowwise: false, .. } => Some(2),
        _ => None,
    }
}

/// The block shape `(bn, bk)` each qualifying parameter (and accumulator) gets.
fn plan(g: &Graph) -> HashMap<ValueId, Op> {
    let users = g.users();
    let mut out = HashMap::new();
    'params: for &p in g.params() {
        let mut blocks: Option<Op> = None;
        let mut accs = Vec::new();
        for &n in &users[p.index()] {
            let node = &g.nodes()[n];
            match &node.op {
                op @ Op::BlockWeight { .. } => {
                    if blocks.as_ref().is_some_and(|b| b != op) {
                        continue 'params;
                    }
                    blocks = Some(op.clone());
                }
                Op::Sgd { .. } if node.inputs[0] == p && node.inputs[1] != p => {
                    let ok = def_node(g, node.inputs[1])
                        .is_some_and(|m| matches!(g.nodes()[m].op, Op::UnblockWeight { .. }));
                    if !ok {
                        continue 'params;
                    }
                }
                Op::Adagrad { rowwise: false, .. }
                    if node.inputs[0] == p && node.inputs[1] != p && node.inputs[2] != p =>
                {
                    let acc = node.inputs[1];
                    let ok = def_node(g, node.inputs[2])
                        .is_some_and(|m| matches!(g.nodes()[m].op, Op::UnblockWeight { .. }))
                        && matches!(g.value(acc).def, Def::Param(_))
                        && users[acc.index()] == [n]
                        && g.ty(acc) == g.ty(p);
                    if !ok {
                        continue 'params;
                    }
                    accs.push(acc);
                }
                _ => continue 'params,
            }
        }
        let Some(b) = blocks else { continue };
        // The update gradients must be blocked exactly like the weight.
        let pt = g.ty(p).clone();
        let Ok(bt) = dlrm_ir::infer(&b, &[&pt], &[]) else {
            continue;
        };
        for &n in &users[p.index()] {
            let node = &g.nodes()[n];
            if let Some(k) = grad_operand(&node.op) {
                let m = def_node(g, node.inputs[k]).unwrap_or(usize::MAX);
                let src = g.nodes()[m].inputs[0];
                if Some(g.ty(src)) != bt.first() {
                    continue 'params;
                }
            }
        }
        for acc in accs {
            out.insert(acc, b.clone());
        }
        out.insert(p, b);
    }
    out
}

/// Blocks the qualifying weights of `g` (see the module docs); `params`, when
/// given, are transformed alike.
pub fn layout(g: &Graph, params: Option<&mut Params>) -> Result<Graph> {
    let blocked = plan(g);
    let e = PassError::ir(ID);
    let mut out = Graph::new(g.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; g.values().len()];
    for &v in g.inputs() {
        map[v.index()] = Some(out.add_input(g.name_of(v), g.ty(v).clone()).map_err(e)?);
    }
    let mut new_types: HashMap<String, (Op, TensorType)> = HashMap::new();
    for &p in g.params() {
        let ty = match blocked.get(&p) {
            Some(b) => {
                let t = dlrm_ir::infer(b, &[g.ty(p)], &[])
                    .map_err(|r| PassError::Graph {
                        pass: ID.into(),
                        graph: g.name.clone(),
                        reason: r,
                    })?
                    .remove(0);
                new_types.insert(g.name_of(p).to_string(), (b.clone(), t.clone()));
                t
            }
            None => g.ty(p).clone(),
        };
        map[p.index()] = Some(out.add_param(g.name_of(p), ty).map_err(e)?);
    }
    let get = |map: &[Option<ValueId>], v: ValueId| {
        map[v.index()].ok_or_else(|| PassError::Graph {
            pass: ID.into(),
            graph: g.name.clone(),
            reason: format!("%{} is used before it is defined", g.name_of(v)),
        })
    };
    for node in g.nodes() {
        if let (Op::BlockWeight { .. }, [p]) = (&node.op, node.inputs.as_slice())
            && blocked.contains_key(p)
        {
            map[node.outputs[0].index()] = map[p.index()];
            continue;
        }
        let mut ins = Vec::with_capacity(node.inputs.len());
        for (i, &v) in node.inputs.iter().enumerate() {
            let src = if Some(i) == grad_operand(&node.op) && blocked.contains_key(&node.inputs[0])
            {
                // sgd(w, unblock_weight(dwb)) -> sgd(w, dwb), adagrad alike
                let m = def_node(g, v).unwrap_or(usize::MAX);
                g.nodes()[m].inputs[0]
            } else {
                v
            };
            ins.push(get(&map, src)?);
        }
        let names: Vec<&str> = node.outputs.iter().map(|&o| g.name_of(o)).collect();
        let outs = out.add_node(node.op.clone(), &ins, &names).map_err(e)?;
        for (&o, n) in node.outputs.iter().zip(outs) {
            map[o.index()] = Some(n);
        }
    }
    let outputs = g
        .outputs()
        .iter()
        .map(|&v| get(&map, v))
        .collect::<Result<Vec<_>>>()?;
    out.set_outputs(outputs);
    for u in g.updates() {
        let (p, v) = (get(&map, u.param)?, get(&map, u.value)?);
        out.add_update(p, v).map_err(e)?;
    }
    if let Some(params) = params {
        let syms = HashMap::new();
        let ctx = EvalCtx {
            syms: &syms,
            comm: &SingleRank,
        };
        for (name, t) in params.iter_mut() {
            if let Some((op, ty)) = new_types.get(name) {
                let mut r =
                    eval_op(op, &[t], std::slice::from_ref(ty), &ctx).map_err(|reason| {
                        PassError::Arg {
                            pass: ID.into(),
                            reason: format!("blocking parameter %{name}: {reason}"),
                        }
                    })?;
                *t = r.remove(0);
            }
        }
    }
    Ok(out)
}
