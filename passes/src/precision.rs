//! Precision selection (pass id `precision`): bf16 storage with fp32 accumulation.
//!
//! - `fp32`: nothing changes (the pass is not run).
//! - `bf16`: MLP weights (the weight operand of `brgemm`/`linear`, directly or
//!   through `block_weight`) and embedding tables are stored in bf16; forward
//!   activations are blocked (`block_act`) and unblocked (`unblock_act`) as bf16 —
//!   except values that are graph outputs or reach a loss, which stay f32.
//!   Compute stays f32 (every op widens, accumulates in f32, and rounds to nearest
//!   even when it stores bf16); gradients stay f32.
//! - `mixed`: as `bf16`, but the precision-sensitive parts stay fp32: the loss, the
//!   last layer (its weights; its output is then f32), and the interaction's output
//!   (the bottom MLP's output is unblocked to f32, so the interaction computes f32).
//!
//! Training keeps an fp32 master of every bf16 MLP weight as Split-SGD-BF16: the
//! bf16 parameter `%w` is the high half of the master, a new parameter `%w.lo`
//! (bf16-typed, raw bits) its low 16 bits, and `sgd(%w, g)` becomes
//! `split_sgd(%w, %w.lo, g)` updating both: no second copy of the weights exists.
//! Tables updated by `embedding_update` (the fused update) are split the same way:
//! `%t.lo` holds their low halves and the updates become `split_embedding_update`
//! (f32 master per touched row). Tables updated by a plain `sparse_sgd` (embedding
//! fusion off) are bf16 with that op's rounding (f32 update, rounded once per row and
//! step). Biases stay f32. Parameter tensors are converted alike: split parameters
//! (the bf16 value is the truncated high half), other bf16 ones rounded to nearest
//! even.

use crate::pipeline::{Params, Precision};
use crate::{Pass, PassError, Ran, Result};
use dlrm_ir::{DType, Data, Def, Graph, Op, Tensor, ValueId};
use half::bf16;
use std::collections::{HashMap, HashSet};

/// The pass id.
pub const ID: &str = "precision";

/// The precision pass.
#[derive(Clone, Copy, Debug)]
pub struct PrecisionPass {
    /// The precision to select.
    pub precision: Precision,
}

impl Pass for PrecisionPass {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph, params: Option<&mut Params>) -> Result<Ran> {
        Ok(select(&g, self.precision, params)?.into())
    }
}

fn def_node(g: &Graph, v: ValueId) -> Option<usize> {
    match g.value(v).def {
        Def::Node(n, _) => Some(n),
        _ => None,
    }
}

fn is_loss(op: &Op) -> bool {
    matches!(
        op,
        Op::Bce { .. }
            | Op::BceGrad { .. }
            | Op::Mse { .. }
            | Op::MseGrad { .. }
            | Op::BceLogits { .. }
            | Op::BceLogitsGrad { .. }
    )
}

/// Values that are outputs or loss operands, and the layers feeding them directly
/// (through an `unblock_act`).
fn sensitive(g: &Graph) -> (HashSet<ValueId>, HashSet<usize>) {
    let mut vals: HashSet<ValueId> = g.outputs().iter().copied().collect();
    for node in g.nodes() {
        if is_loss(&node.op) {
            vals.extend(node.inputs.iter().copied());
        }
    }
    let mut last = HashSet::new();
    for &v in &vals.clone() {
        let mut m = def_node(g, v);
        if let Some(n) = m
            && matches!(g.nodes()[n].op, Op::UnblockAct { .. })
        {
            m = def_node(g, g.nodes()[n].inputs[0]);
        }
        if let Some(n) = m
            && matches!(g.nodes()[n].op, Op::Brgemm { .. } | Op::Linear { .. })
        {
            last.insert(n);
        }
    }
    (vals, last)
}

/// Applies `precision` to `g` (see the module docs); `params`, when given, are
/// converted alike (and gain the `.lo` halves).
pub fn select(g: &Graph, precision: Precision, params: Option<&mut Params>) -> Result<Graph> {
    if precision == Precision::Fp32 {
        return Ok(g.clone());
    }
    // Adagrad keeps f32 state; Split-SGD-BF16 has no accumulator form yet.
    if let Some(n) = g.nodes().iter().position(|n| {
        matches!(
            n.op,
            Op::Adagrad { .. }
                | Op::SparseAdagrad { .. }
                | Op::EmbeddingUpdateAdagrad { .. }
                | Op::EmbeddingUpdateAdagradRows { .. }
        )
    }) {
        return Err(PassError::Node {
            pass: ID.into(),
            node: g.node_label(n),
            op: g.nodes()[n].op.mnemonic().into(),
            reason: format!(
                "adagrad with bf16 tables is not supported yet (precision {precision}: \
                 use fp32 with adagrad)"
            ),
        });
    }
    let mixed = precision == Precision::Mixed;
    let (sens_vals, last_layers) = sensitive(g);
    let nodes = g.nodes();
    // Weights and tables.
    let mut tables: HashSet<ValueId> = HashSet::new();
    let mut weights: HashSet<ValueId> = HashSet::new();
    let mut fp32_weights: HashSet<ValueId> = HashSet::new();
    for (n, node) in nodes.iter().enumerate() {
        let w = match &node.op {
            Op::EmbeddingBag { .. } | Op::EmbeddingUpdate { .. } | Op::SparseSgd { .. } => {
                tables.insert(node.inputs[0]);
                None
            }
            Op::Linear { .. } | Op::Brgemm { .. } => Some(node.inputs[1]),
            _ => None,
        };
        let Some(mut w) = w else { continue };
        if let Some(m) = def_node(g, w)
            && matches!(nodes[m].op, Op::BlockWeight { .. })
        {
            w = nodes[m].inputs[0];
        }
        if !matches!(g.value(w).def, Def::Param(_)) {
            continue;
        }
        if mixed && last_layers.contains(&n) {
            fp32_weights.insert(w);
        } else {
            weights.insert(w);
        }
    }
    for w in &fp32_weights {
        weights.remove(w);
    }
    tables.retain(|t| matches!(g.value(*t).def, Def::Param(_)));
    // Tables whose whole update chain is `embedding_update`: Split-SGD-BF16.
    let users = g.users();
    let mut split_tables: HashSet<ValueId> = HashSet::new();
    for &t in &tables {
        let mut ok = false;
        let mut frontier = vec![t];
        let mut good = true;
        while let Some(v) = frontier.pop() {
            for &u in &users[v.index()] {
                match &nodes[u].op {
                    Op::EmbeddingBag { .. } if v == t && nodes[u].inputs[0] == v => {}
                    Op::EmbeddingUpdate { .. } if nodes[u].inputs[0] == v => {
                        ok = true;
                        frontier.push(nodes[u].outputs[0]);
                    }
                    _ => good = false,
                }
            }
        }
        if ok && good {
            split_tables.insert(t);
        }
    }
    // Trained weights: sgd(w, g) is the update of w.
    let mut trained: HashSet<ValueId> = HashSet::new();
    for node in nodes {
        if let Op::Sgd { .. } = node.op
            && weights.contains(&node.inputs[0])
        {
            trained.insert(node.inputs[0]);
        }
    }

    let e = PassError::ir(ID);
    let mut out = Graph::new(g.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; g.values().len()];
    for &v in g.inputs() {
        map[v.index()] = Some(out.add_input(g.name_of(v), g.ty(v).clone()).map_err(e)?);
    }
    let mut lo_of: HashMap<ValueId, ValueId> = HashMap::new();
    for &p in g.params() {
        let ty = if weights.contains(&p) || tables.contains(&p) {
            g.ty(p).with_dtype(DType::BF16)
        } else {
            g.ty(p).clone()
        };
        map[p.index()] = Some(out.add_param(g.name_of(p), ty).map_err(e)?);
    }
    for &p in g.params() {
        if trained.contains(&p) || split_tables.contains(&p) {
            let name = out.fresh_name(&format!("{}.lo", g.name_of(p)));
            let lo = out
                .add_param(&name, g.ty(p).with_dtype(DType::BF16))
                .map_err(e)?;
            lo_of.insert(p, lo);
        }
    }
    let get = |map: &[Option<ValueId>], v: ValueId| {
        map[v.index()].ok_or_else(|| PassError::Graph {
            pass: ID.into(),
            graph: g.name.clone(),
            reason: format!("%{} is used before it is defined", g.name_of(v)),
        })
    };
    // Per source value of a split table's chain: its low half in the new graph.
    let mut cur_lo: HashMap<ValueId, ValueId> =
        split_tables.iter().map(|t| (*t, lo_of[t])).collect();
    let mut extra_updates: Vec<(ValueId, ValueId)> = Vec::new();
    for node in nodes {
        let ins = node
            .inputs
            .iter()
            .map(|&v| get(&map, v))
            .collect::<Result<Vec<_>>>()?;
        let names: Vec<&str> = node.outputs.iter().map(|&o| g.name_of(o)).collect();
        let op = match &node.op {
            Op::BlockAct { bk, .. } => {
                // An activation (forward input or the x of a weight gradient)?
                let y = node.outputs[0];
                let act_use = users[y.index()].iter().all(|&u| match &nodes[u].op {
                    Op::Brgemm { .. } => nodes[u].inputs[0] == y,
                    Op::BrgemmWgrad { .. } => nodes[u].inputs.last() == Some(&y),
                    _ => false,
                });
                let dtype = if act_use && !users[y.index()].is_empty() {
                    DType::BF16
                } else {
                    DType::F32
                };
                Op::BlockAct { bk: *bk, dtype }
            }
            Op::UnblockAct { k, dtype } => {
                let src = node.inputs[0];
                let from_fwd =
                    def_node(g, src).is_some_and(|m| matches!(nodes[m].op, Op::Brgemm { .. }));
                let keep = sens_vals.contains(&node.outputs[0]) || mixed;
                let dtype = if from_fwd && !keep {
                    DType::BF16
                } else {
                    *dtype
                };
                Op::UnblockAct { k: *k, dtype }
            }
            Op::Sgd { lr } if trained.contains(&node.inputs[0]) => {
                let w = node.inputs[0];
                let lo = lo_of[&w];
                let lo_next = format!("{}.next", out.name_of(lo));
                let outs = out
                    .add_node(
                        Op::SplitSgd { lr: *lr },
                        &[ins[0], lo, ins[1]],
                        &[g.name_of(node.outputs[0]), &lo_next],
                    )
                    .map_err(e)?;
                map[node.outputs[0].index()] = Some(outs[0]);
                extra_updates.push((lo, outs[1]));
                continue;
            }
            Op::EmbeddingUpdate { mode, lr } if cur_lo.contains_key(&node.inputs[0]) => {
                let lo = cur_lo[&node.inputs[0]];
                let lo_next = out.fresh_name(&format!("{}.next", out.name_of(lo)));
                let mut operands = vec![ins[0], lo];
                operands.extend_from_slice(&ins[1..]);
                let outs = out
                    .add_node(
                        Op::SplitEmbeddingUpdate {
                            mode: *mode,
                            lr: *lr,
                        },
                        &operands,
                        &[g.name_of(node.outputs[0]), &lo_next],
                    )
                    .map_err(e)?;
                map[node.outputs[0].index()] = Some(outs[0]);
                cur_lo.insert(node.outputs[0], outs[1]);
                continue;
            }
            other => other.clone(),
        };
        let outs = out.add_node(op, &ins, &names).map_err(e)?;
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
        if split_tables.contains(&u.param)
            && let Some(&lo) = cur_lo.get(&u.value)
        {
            extra_updates.push((lo_of[&u.param], lo));
        }
    }
    for (p, v) in extra_updates {
        out.add_update(p, v).map_err(e)?;
    }
    if let Some(params) = params {
        let mut los = Vec::new();
        for (name, t) in params.iter_mut() {
            let Some(v) = g.find(name) else { continue };
            let vals = t.to_f32_vec();
            if trained.contains(&v) || split_tables.contains(&v) {
                let (hi, lo): (Vec<bf16>, Vec<bf16>) = vals
                    .iter()
                    .map(|x| {
                        let b = x.to_bits();
                        (
                            bf16::from_bits((b >> 16) as u16),
                            bf16::from_bits((b & 0xffff) as u16),
                        )
                    })
                    .unzip();
                let lo_name = out.name_of(lo_of[&v]).to_string();
                los.push((lo_name, Tensor::bf16(t.shape.clone(), lo)));
                *t = Tensor::bf16(t.shape.clone(), hi);
            } else if (weights.contains(&v) || tables.contains(&v))
                && matches!(t.data, Data::F32(_))
            {
                *t = Tensor::from_f32(DType::BF16, t.shape.clone(), vals);
            }
        }
        params.extend(los);
    }
    Ok(out)
}
