//! Precision selection (pass id `precision`): bf16 storage with fp32 accumulation.
//!
//! - `fp32`: nothing changes (the pass is not run).
//! - `bf16`: MLP weights (the weight operand of `brgemm`/`linear`, directly or
//!   through `block_weight`) and embedding tables are stored in bf16; forward
//!   activations are blocked (`block_act`) and unblocked (`unblock_act`) as bf16 —
//!   except values that are graph outputs or reach a loss, which stay f32.
//!   Compute stays f32 (every op widens, accumulates in f32, and rounds to nearest
//!   even when it stores bf16). The blocked activation gradients between MLP
//!   layers are stored bf16 where every GEMM they feed is then all-bf16: a
//!   gradient `block_act` or `brgemm_dgrad` result (its `dtype`) whose users all
//!   take it as the `dy` of a `brgemm_dgrad` with bf16 weights or of a
//!   `brgemm_wgrad` with a bf16 `x` — the loss gradient entering the top MLP and
//!   the one entering the bottom MLP, and every `dx` passed down inside an MLP —
//!   so the backward GEMMs run on bf16 operands (the AMX-BF16 or AVX-512 BF16
//!   kernel where the CPU has one). Each is the f32 value rounded once to nearest even (after
//!   the fused mask). Weight and bias gradients stay f32 (f32 sums), and so do
//!   gradients leaving an MLP (unblocked for the interaction or the bags).
//!   DCN-v2's contracted cross layers (`contract-cross`) are treated alike: their
//!   weights are MLP weights, `x0` and `x` (operands of `cross_mix` and
//!   `cross_mix_grad`) blocked activations, `cross_mix`'s result a forward
//!   activation; `cross_mix_grad` stores `g` and `dx0` in the dtypes of `w` and
//!   `x0`, so a layer's backward GEMMs run on bf16 operands too.
//! - `mixed`: as `bf16`, but the precision-sensitive parts stay fp32: the loss, the
//!   last layer (its weights; its output is then f32), and the interaction's output
//!   (the bottom MLP's output is unblocked to f32, so the interaction computes f32).
//!   The gradient rule is the same, so the loss gradient, which feeds the f32 last
//!   layer, stays f32; the last layer's `dx` and the gradients below it are bf16.
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
//!
//! Adagrad trains the same split parameters as Split-Adagrad (the module ops of
//! `dlrm_ir::ops::split_adagrad`): `adagrad(%w, %acc, g)` on a bf16 MLP weight
//! becomes `split_adagrad(%w, %w.lo, %acc, g)` and a table's fused
//! `embedding_update_adagrad(%t, %acc, dy, ..)` (row-wise or elementwise) becomes
//! `split_embedding_update_adagrad(%t, %t.lo, %acc, dy, ..)` on the whole table
//! (`lo=0`, `rows=R`; the partition pass shards it by rows). Each joins the f32
//! master, runs the f32 Adagrad step with its exact arithmetic and splits it
//! again; the accumulators stay f32. A table updated by an unfused
//! `sparse_adagrad` (embedding fusion off, per-sample-weighted bags) is refused:
//! it has no split form.

use crate::pass::Params;
use crate::{Pass, PassError, Ran, Result};
use dlrm_ir::{Act, DType, Data, Def, Graph, Op, Tensor, ValueId};
use half::bf16;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

/// Storage precision of the optimised plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything f32.
    #[default]
    Fp32,
    /// MLP weights, activations and tables in bf16 (f32 accumulation, f32 masters
    /// by Split-SGD-BF16).
    Bf16,
    /// bf16 except the precision-sensitive ops (loss, last layer, interaction output).
    Mixed,
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Mixed => "mixed",
        })
    }
}

impl FromStr for Precision {
    type Err = PassError;
    fn from_str(s: &str) -> Result<Precision> {
        match s {
            "fp32" | "f32" => Ok(Precision::Fp32),
            "bf16" => Ok(Precision::Bf16),
            "mixed" => Ok(Precision::Mixed),
            other => Err(PassError::Arg {
                pass: ID.into(),
                reason: format!("precision must be fp32, bf16 or mixed, got `{other}`"),
            }),
        }
    }
}

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
    refuse_adagrad(g, precision)?;
    let mixed = precision == Precision::Mixed;
    let choice = Choice::of(g, mixed);
    // Which gradients are stored bf16 depends on the other operands' dtypes
    // after the rewrite: rewrite once with f32 gradients, read them off, redo.
    let (first, _, map) = Rewrite::new(g, &choice, HashSet::new())?.run(mixed)?;
    let grads = bf16_gradients(g, &first, &map);
    let (out, lo_of, _) = Rewrite::new(g, &choice, grads)?.run(mixed)?;
    if let Some(params) = params {
        convert_params(g, &out, &choice, &lo_of, params);
    }
    Ok(out)
}

/// Adagrad on a bf16 table is Split-Adagrad only in the fused form
/// (`embedding_update_adagrad`); an unfused `sparse_adagrad` (embedding fusion
/// off, per-sample-weighted bags) would update a rounded bf16 table without its
/// f32 master, so it is refused.
fn refuse_adagrad(g: &Graph, precision: Precision) -> Result<()> {
    let Some(n) = g.nodes().iter().position(|n| {
        matches!(
            n.op,
            Op::SparseAdagrad { .. } | Op::EmbeddingUpdateAdagradRows { .. }
        )
    }) else {
        return Ok(());
    };
    Err(PassError::Node {
        pass: ID.into(),
        node: g.node_label(n),
        op: g.nodes()[n].op.mnemonic().into(),
        reason: format!(
            "adagrad on a bf16 table needs the fused update (embedding_update_adagrad, \
             trained as Split-Adagrad); this unfused one is not supported (precision \
             {precision}: compile with -O1 and unweighted bags, or use fp32)"
        ),
    })
}

/// The nodes of `g` (`block_act` and `brgemm_dgrad`) whose result, a blocked
/// activation gradient, is stored bf16: every user takes it as the `dy` of a
/// `brgemm_dgrad` whose weight is bf16 or of a `brgemm_wgrad` whose `x` is
/// bf16 in `first` (the rewrite with f32 gradients; `map` takes `g`'s values
/// there), so the GEMMs it feeds are all-bf16; not a graph output.
fn bf16_gradients(g: &Graph, first: &Graph, map: &[Option<ValueId>]) -> HashSet<usize> {
    let (nodes, users) = (first.nodes(), first.users());
    let bf16_gemm = |v: ValueId, u: usize| {
        let ins = &nodes[u].inputs;
        let other = match &nodes[u].op {
            Op::BrgemmDgrad { mask, .. } => {
                ins.len().checked_sub(1 + usize::from(*mask != Act::None))
            }
            Op::BrgemmWgrad { .. } => ins.len().checked_sub(1),
            _ => None,
        };
        ins.first() == Some(&v)
            && !ins[1..].contains(&v)
            && other.is_some_and(|o| first.ty(ins[o]).dtype == DType::BF16)
    };
    let mut out = HashSet::new();
    for (n, node) in g.nodes().iter().enumerate() {
        if !matches!(node.op, Op::BlockAct { .. } | Op::BrgemmDgrad { .. }) {
            continue;
        }
        let Some(v) = map[node.outputs[0].index()] else {
            continue;
        };
        let us = &users[v.index()];
        let gradient =
            !us.is_empty() && !first.outputs().contains(&v) && us.iter().all(|&u| bf16_gemm(v, u));
        if gradient {
            out.insert(n);
        }
    }
    out
}

/// Which parameters become bf16, and how they are trained.
struct Choice {
    /// Embedding tables (bf16).
    tables: HashSet<ValueId>,
    /// MLP weights stored in bf16 (not the last layers' under `mixed`).
    weights: HashSet<ValueId>,
    /// Tables whose whole update chain is `embedding_update` (Split-SGD-BF16) or
    /// `embedding_update_adagrad` (Split-Adagrad).
    split_tables: HashSet<ValueId>,
    /// bf16 weights updated by `sgd` (Split-SGD-BF16) or `adagrad`
    /// (Split-Adagrad).
    trained: HashSet<ValueId>,
    /// Outputs and loss operands (kept f32 when unblocked).
    sensitive: HashSet<ValueId>,
}

impl Choice {
    fn of(g: &Graph, mixed: bool) -> Choice {
        let (sensitive, last_layers) = sensitive(g);
        let (nodes, users) = (g.nodes(), g.users());
        let mut tables: HashSet<ValueId> = HashSet::new();
        let mut weights: HashSet<ValueId> = HashSet::new();
        let mut fp32_weights: HashSet<ValueId> = HashSet::new();
        for (n, node) in nodes.iter().enumerate() {
            let w = match &node.op {
                Op::EmbeddingBag { .. }
                | Op::EmbeddingUpdate { .. }
                | Op::EmbeddingUpdateAdagrad { .. }
                | Op::SparseSgd { .. } => {
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
        let split_tables = tables
            .iter()
            .copied()
            .filter(|&t| only_fused_updates(g, &users, t))
            .collect();
        let trained = nodes
            .iter()
            .filter(|n| {
                matches!(n.op, Op::Sgd { .. } | Op::Adagrad { .. })
                    && weights.contains(&n.inputs[0])
            })
            .map(|n| n.inputs[0])
            .collect();
        Choice {
            tables,
            weights,
            split_tables,
            trained,
            sensitive,
        }
    }

    /// Does `p` get a `.lo` half (Split-SGD-BF16)?
    fn split(&self, p: ValueId) -> bool {
        self.trained.contains(&p) || self.split_tables.contains(&p)
    }
}

/// Is table `t` read by bags and updated only by a chain of `embedding_update`s
/// or of `embedding_update_adagrad`s (at least one)?
fn only_fused_updates(g: &Graph, users: &[Vec<usize>], t: ValueId) -> bool {
    let nodes = g.nodes();
    let mut updated = false;
    let mut frontier = vec![t];
    while let Some(v) = frontier.pop() {
        for &u in &users[v.index()] {
            match &nodes[u].op {
                Op::EmbeddingBag { .. } if v == t && nodes[u].inputs[0] == v => {}
                Op::EmbeddingUpdate { .. } | Op::EmbeddingUpdateAdagrad { .. }
                    if nodes[u].inputs[0] == v =>
                {
                    updated = true;
                    frontier.push(nodes[u].outputs[0]);
                }
                _ => return false,
            }
        }
    }
    updated
}

/// The rewrite of a graph under a [`Choice`]: the new graph, the map from old
/// values to new ones, and the `.lo` halves.
struct Rewrite<'g> {
    g: &'g Graph,
    choice: &'g Choice,
    out: Graph,
    map: Vec<Option<ValueId>>,
    /// Each split parameter's `.lo` parameter.
    lo_of: HashMap<ValueId, ValueId>,
    /// Per source value of a split table's chain: its low half in the new graph.
    cur_lo: HashMap<ValueId, ValueId>,
    /// Updates of the `.lo` halves, added after the graph's own.
    extra_updates: Vec<(ValueId, ValueId)>,
    /// Nodes whose result (a blocked activation gradient) is stored bf16.
    grads: HashSet<usize>,
}

impl<'g> Rewrite<'g> {
    /// The new graph's inputs and parameters (bf16 where chosen, `.lo` halves).
    fn new(g: &'g Graph, choice: &'g Choice, grads: HashSet<usize>) -> Result<Rewrite<'g>> {
        let e = PassError::ir(ID);
        let mut out = Graph::new(g.name.clone());
        let mut map: Vec<Option<ValueId>> = vec![None; g.values().len()];
        for &v in g.inputs() {
            map[v.index()] = Some(out.add_input(g.name_of(v), g.ty(v).clone()).map_err(e)?);
        }
        for &p in g.params() {
            let ty = if choice.weights.contains(&p) || choice.tables.contains(&p) {
                g.ty(p).with_dtype(DType::BF16)
            } else {
                g.ty(p).clone()
            };
            map[p.index()] = Some(out.add_param(g.name_of(p), ty).map_err(e)?);
        }
        let mut lo_of: HashMap<ValueId, ValueId> = HashMap::new();
        for &p in g.params().iter().filter(|&&p| choice.split(p)) {
            let name = out.fresh_name(&format!("{}.lo", g.name_of(p)));
            let lo = out
                .add_param(&name, g.ty(p).with_dtype(DType::BF16))
                .map_err(e)?;
            lo_of.insert(p, lo);
        }
        let cur_lo = choice.split_tables.iter().map(|t| (*t, lo_of[t])).collect();
        Ok(Rewrite {
            g,
            choice,
            out,
            map,
            lo_of,
            cur_lo,
            extra_updates: Vec::new(),
            grads,
        })
    }

    /// The value `v` of the old graph in the new one.
    fn get(&self, v: ValueId) -> Result<ValueId> {
        self.map[v.index()].ok_or_else(|| PassError::Graph {
            pass: ID.into(),
            graph: self.g.name.clone(),
            reason: format!("%{} is used before it is defined", self.g.name_of(v)),
        })
    }

    /// Rewrites every node, the outputs and the updates; returns the new graph,
    /// the `.lo` parameter of each split parameter and the map of values.
    fn run(mut self, mixed: bool) -> Result<Rewritten> {
        let g = self.g;
        let users = g.users();
        for (n, node) in g.nodes().iter().enumerate() {
            let ins = node
                .inputs
                .iter()
                .map(|&v| self.get(v))
                .collect::<Result<Vec<_>>>()?;
            if self.split_update(node, &ins)? {
                continue;
            }
            let op = match &node.op {
                Op::BlockAct { bk, .. } => {
                    // An activation (forward input or the x of a weight gradient)?
                    let y = node.outputs[0];
                    let act_use = users[y.index()].iter().all(|&u| {
                        let ins = &g.nodes()[u].inputs;
                        match &g.nodes()[u].op {
                            Op::Brgemm { .. } => ins[0] == y,
                            Op::BrgemmWgrad { .. } => ins.last() == Some(&y),
                            // A cross layer's x0 or x (`contract-cross`).
                            op if op.is_module("cross_mix") => ins[1] != y,
                            op if op.is_module("cross_mix_grad") => ins[1] == y,
                            _ => false,
                        }
                    });
                    let dtype =
                        if (act_use && !users[y.index()].is_empty()) || self.grads.contains(&n) {
                            DType::BF16
                        } else {
                            DType::F32
                        };
                    Op::BlockAct { bk: *bk, dtype }
                }
                Op::BrgemmDgrad { act, mask, .. } if self.grads.contains(&n) => Op::BrgemmDgrad {
                    act: *act,
                    mask: *mask,
                    dtype: DType::BF16,
                },
                Op::UnblockAct { k, dtype } => {
                    let from_fwd = def_node(g, node.inputs[0]).is_some_and(|m| {
                        let op = &g.nodes()[m].op;
                        matches!(op, Op::Brgemm { .. }) || op.is_module("cross_mix")
                    });
                    let keep = self.choice.sensitive.contains(&node.outputs[0]) || mixed;
                    let dtype = if from_fwd && !keep {
                        DType::BF16
                    } else {
                        *dtype
                    };
                    Op::UnblockAct { k: *k, dtype }
                }
                other => other.clone(),
            };
            let names: Vec<&str> = node.outputs.iter().map(|&o| g.name_of(o)).collect();
            let outs = self
                .out
                .add_node(op, &ins, &names)
                .map_err(PassError::ir(ID))?;
            for (&o, n) in node.outputs.iter().zip(outs) {
                self.map[o.index()] = Some(n);
            }
        }
        self.finish()
    }

    /// Adds `node` as its Split-SGD-BF16 form if it is the update of a split
    /// parameter (`sgd` -> `split_sgd`, `embedding_update` ->
    /// `split_embedding_update`) or its Split-Adagrad form (`adagrad` ->
    /// `split_adagrad`, `embedding_update_adagrad` ->
    /// `split_embedding_update_adagrad`, the accumulator kept f32); false if it
    /// is not.
    fn split_update(&mut self, node: &dlrm_ir::Node, ins: &[ValueId]) -> Result<bool> {
        use dlrm_ir::ops::split_adagrad::{split_adagrad, split_embedding_update_adagrad};
        let e = PassError::ir(ID);
        let g = self.g;
        let w = node.inputs[0];
        let table_lo = self.cur_lo.get(&w).copied();
        let trained = self.choice.trained.contains(&w);
        let (op, lo, dense) = match (&node.op, table_lo) {
            (&Op::Sgd { lr }, _) if trained => (Op::SplitSgd { lr }, self.lo_of[&w], true),
            (
                &Op::Adagrad {
                    lr,
                    eps,
                    wd,
                    rowwise,
                },
                _,
            ) if trained => {
                let h = dlrm_ir::AdagradHyper { lr, eps, rowwise };
                (split_adagrad(h, wd), self.lo_of[&w], true)
            }
            (&Op::EmbeddingUpdate { mode, lr }, Some(lo)) => {
                (Op::SplitEmbeddingUpdate { mode, lr }, lo, false)
            }
            (
                &Op::EmbeddingUpdateAdagrad {
                    mode,
                    lr,
                    eps,
                    rowwise,
                },
                Some(lo),
            ) => {
                let rows = g.ty(w).shape[0].fixed().ok_or_else(|| PassError::Graph {
                    pass: ID.into(),
                    graph: g.name.clone(),
                    reason: format!("table %{} has no fixed row count", g.name_of(w)),
                })?;
                let h = dlrm_ir::AdagradHyper { lr, eps, rowwise };
                (split_embedding_update_adagrad(mode, h, 0, rows), lo, false)
            }
            _ => return Ok(false),
        };
        let lo_next = if dense {
            format!("{}.next", self.out.name_of(lo))
        } else {
            self.out
                .fresh_name(&format!("{}.next", self.out.name_of(lo)))
        };
        // The low half is the operand after the parameter, before its other
        // state (an accumulator) and the gradient.
        let mut operands = vec![ins[0], lo];
        operands.extend_from_slice(&ins[1..]);
        // Results: the parameter, the low half, then the old node's other
        // results (the accumulator).
        let mut names = vec![g.name_of(node.outputs[0]), &lo_next];
        names.extend(node.outputs[1..].iter().map(|&o| g.name_of(o)));
        let outs = self.out.add_node(op, &operands, &names).map_err(e)?;
        self.map[node.outputs[0].index()] = Some(outs[0]);
        for (&o, &n) in node.outputs[1..].iter().zip(&outs[2..]) {
            self.map[o.index()] = Some(n);
        }
        if dense {
            self.extra_updates.push((lo, outs[1]));
        } else {
            self.cur_lo.insert(node.outputs[0], outs[1]);
        }
        Ok(true)
    }

    /// The outputs and updates, the `.lo` halves' updates last.
    fn finish(mut self) -> Result<Rewritten> {
        let e = PassError::ir(ID);
        let g = self.g;
        let outputs = g
            .outputs()
            .iter()
            .map(|&v| self.get(v))
            .collect::<Result<Vec<_>>>()?;
        self.out.set_outputs(outputs);
        for u in g.updates() {
            let (p, v) = (self.get(u.param)?, self.get(u.value)?);
            self.out.add_update(p, v).map_err(e)?;
            if self.choice.split_tables.contains(&u.param)
                && let Some(&lo) = self.cur_lo.get(&u.value)
            {
                self.extra_updates.push((self.lo_of[&u.param], lo));
            }
        }
        for (p, v) in std::mem::take(&mut self.extra_updates) {
            self.out.add_update(p, v).map_err(e)?;
        }
        Ok((self.out, self.lo_of, self.map))
    }
}

/// A rewritten graph, the `.lo` parameter of each split parameter, and the map
/// from the old graph's values to the new one's.
type Rewritten = (Graph, HashMap<ValueId, ValueId>, Vec<Option<ValueId>>);

/// Converts the parameter tensors as the graph's types changed: a split
/// parameter into its truncated high half and a new `.lo` tensor, other bf16
/// ones rounded to nearest even.
fn convert_params(
    g: &Graph,
    out: &Graph,
    choice: &Choice,
    lo_of: &HashMap<ValueId, ValueId>,
    params: &mut Params,
) {
    let mut los = Vec::new();
    for (name, t) in params.iter_mut() {
        let Some(v) = g.find(name) else { continue };
        let vals = t.to_f32_vec();
        if choice.split(v) {
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
        } else if (choice.weights.contains(&v) || choice.tables.contains(&v))
            && matches!(t.data, Data::F32(_))
        {
            *t = Tensor::from_f32(DType::BF16, t.shape.clone(), vals);
        }
    }
    params.extend(los);
}
