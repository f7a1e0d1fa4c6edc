//! Reverse-mode automatic differentiation and the SGD step (pass id `autodiff`).
//!
//! Input: a forward graph whose first output is the prediction. Output: the training
//! step. The pass
//! 1. adds the input `label` with the prediction's type and the loss node (`bce` or
//!    `mse`, `denom=B`); the loss becomes the graph's only output;
//! 2. differentiates backwards over the nodes the loss depends on, only for values
//!    that depend on a float parameter (so nothing is computed for inputs);
//! 3. appends the optimizer: `sgd(w, dw)` for every dense parameter with a gradient,
//!    and for every embedding table (a parameter used as operand 0 of
//!    `embedding_bag` or `embedding_bag_weighted`) one row gradient per bag (see
//!    below) plus a chain of `sparse_sgd` (one per bag, in bag order); each new
//!    value is registered as the parameter's update.
//!
//! With Adagrad ([`crate::Optimizer`]) the optimizer is `adagrad(w, %w.acc, dw)`
//! for dense parameters and `sparse_adagrad(t, %t.acc, idx, rows)` for tables,
//! where the accumulator `%p.acc` is a new f32 parameter (shaped like `p`; `[R]` for
//! a row-wise table `[R, D]`) whose value, when the pass is given parameter
//! tensors, is `initial_accumulator_value` everywhere; both results are registered
//! as updates (of `p` and of `%p.acc`). A table looked up by more than one bag is
//! refused under Adagrad (one coalesced update per step would need the bags' row
//! gradients joined first).
//!
//! Gradient rules (`dy` = gradient of the node's result):
//! - `linear{act}(x, w, b) = y`: `dz` = `relu_grad(dy, y)` / `sigmoid_grad(dy, y)` /
//!   `dy`; `dx = linear_dx(dz, w)`, `dw = linear_dw(dz, x)`, `db = linear_db(dz)`,
//!   each only when that operand needs a gradient;
//! - `embedding_bag_weighted(t, idx, off, w)`: the table's row gradient is
//!   `binary{mul}(embedding_bag_grad{sum}(dy, idx, off), reshape[N,1](w))` (row `i`
//!   is `w[i]·dy[bag(i)]`), applied by `sparse_sgd` like an unweighted bag's
//!   `embedding_bag_grad`; weights that depend on a parameter are an error;
//! - `embedding_bag[last_offset](t, idx, off)`: the update gets `off` as its last
//!   operand (`sparse_sgd(t, idx, rows, off)`, `sparse_adagrad(.., rows, off)`):
//!   only the indices the bags read are applied (a jagged batch's `values` holds
//!   other keys' ids, which need not be rows of `t`);
//! - `relu`, `sigmoid`: `relu_grad(dy, y)`, `sigmoid_grad(dy, y)`;
//! - `add(a, b)`: both operands receive `dy`;
//! - `interaction`: `interaction_grad(dy, operands..)`, the needed results taken;
//! - `concat` -> `split` of `dy`; `reshape` -> `reshape` back; `split` -> `concat` of
//!   the results' gradients (every result must have one);
//! - the loss: `bce_grad` / `mse_grad` (the seed, `d loss = 1`).
//!
//! A value used several times gets the sum of its gradient contributions (`add`).
//! Gradients are f32 whatever the forward dtype. Names: the gradient of `%x` is
//! `%d.x` (partial contributions of a value used several times are `%d.x.part*`),
//! the pre-activation gradient of a linear layer `%y` is `%d.y.pre`, a table's row
//! gradient `%d.t.rows`, a parameter's new value `%p.next` (all made unique with
//! [`Graph::fresh_name`]). Any other op on the gradient path is an error naming the
//! node and op.

use crate::pass::Params;
use crate::{LossKind, Optimizer, Pass, PassError, Ran, Result, TrainConfig};
use dlrm_ir::{DType, Def, Dim, Graph, Op, Tensor, TensorType, ValueId, verify};

/// The pass id.
pub const ID: &str = "autodiff";

mod cx;
mod rules;

/// The autodiff pass with its training configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Autodiff {
    /// Loss and learning rate.
    pub cfg: TrainConfig,
}

impl Pass for Autodiff {
    fn id(&self) -> &'static str {
        ID
    }

    fn run(&self, g: Graph, params: Option<&mut Params>) -> Result<Ran> {
        Ok(autodiff_with(&g, &self.cfg, params)?.into())
    }
}

/// Builds the training step of the forward graph `fwd` (see the module docs).
pub fn autodiff(fwd: &Graph, cfg: &TrainConfig) -> Result<Graph> {
    autodiff_with(fwd, cfg, None)
}

/// [`autodiff`], adding the optimizer state's initial values (Adagrad's
/// accumulators, for the parameters among them) to `params` when given.
pub fn autodiff_with(
    fwd: &Graph,
    cfg: &TrainConfig,
    mut params: Option<&mut Params>,
) -> Result<Graph> {
    let pred = prediction(fwd, cfg)?;
    let need = needed(fwd, pred)?;
    let (active, uses) = gradient_uses(fwd, pred, &need)?;
    let nvals = fwd.values().len();
    let mut ad = Ad {
        g: fwd.clone(),
        need,
        uses,
        contribs: vec![Vec::new(); nvals],
        total: vec![None; nvals],
        rows: vec![Vec::new(); nvals],
    };
    let loss = add_loss(&mut ad, fwd, cfg, pred)?;
    // Backward, in reverse order of the forward nodes.
    for n in (0..fwd.nodes().len()).rev() {
        if active[n] {
            ad.backward(fwd, n)?;
        }
    }
    check_adagrad(fwd, cfg)?;
    for &p in fwd.params() {
        let bags = std::mem::take(&mut ad.rows[p.index()]);
        if cfg.optimizer != Optimizer::Sgd {
            adagrad_step(&mut ad, cfg, p, bags, params.as_deref_mut())?;
        } else {
            sgd_step(&mut ad, cfg, p, bags)?;
        }
    }
    ad.g.set_outputs(vec![loss]);
    verify(&ad.g).map_err(|source| PassError::Verify {
        after: ID.to_string(),
        source,
    })?;
    Ok(ad.g)
}

/// An error about the forward graph as a whole.
fn graph_err(fwd: &Graph, reason: String) -> PassError {
    PassError::Graph {
        pass: ID.to_string(),
        graph: fwd.name.clone(),
        reason,
    }
}

/// The prediction (the first output) of a forward graph that can be trained
/// with `cfg`: a finite learning rate, no state updates yet, a float prediction.
fn prediction(fwd: &Graph, cfg: &TrainConfig) -> Result<ValueId> {
    if !cfg.lr.is_finite() {
        return Err(graph_err(
            fwd,
            format!("learning rate must be finite, got {}", cfg.lr),
        ));
    }
    if !fwd.updates().is_empty() {
        return Err(graph_err(
            fwd,
            "the graph already has state updates (is it a training graph?)".into(),
        ));
    }
    let &pred = fwd.outputs().first().ok_or_else(|| {
        graph_err(
            fwd,
            "no output: the first output must be the prediction".into(),
        )
    })?;
    if !fwd.ty(pred).dtype.is_float() {
        return Err(graph_err(
            fwd,
            format!(
                "the prediction %{} must be a float tensor, got {}",
                fwd.name_of(pred),
                fwd.ty(pred)
            ),
        ));
    }
    Ok(pred)
}

/// Per value: does it need a gradient (it depends on a float parameter and the
/// prediction depends on it)? The prediction must.
fn needed(fwd: &Graph, pred: ValueId) -> Result<Vec<bool>> {
    let nvals = fwd.values().len();
    // Values depending on a float parameter.
    let mut dep = vec![false; nvals];
    for &p in fwd.params() {
        dep[p.index()] = fwd.ty(p).dtype.is_float();
    }
    for node in fwd.nodes() {
        if node.inputs.iter().any(|v| dep[v.index()]) {
            for &o in &node.outputs {
                dep[o.index()] = true;
            }
        }
    }
    // Values the prediction depends on (itself included).
    let mut reach = vec![false; nvals];
    reach[pred.index()] = true;
    for node in fwd.nodes().iter().rev() {
        if node.outputs.iter().any(|v| reach[v.index()]) {
            for &v in &node.inputs {
                reach[v.index()] = true;
            }
        }
    }
    let need: Vec<bool> = (0..nvals).map(|i| dep[i] && reach[i]).collect();
    if !need[pred.index()] {
        return Err(graph_err(
            fwd,
            format!(
                "the prediction %{} depends on no float parameter: nothing to train",
                fwd.name_of(pred)
            ),
        ));
    }
    Ok(need)
}

/// Per node, whether it is differentiated (a result needs a gradient), and per
/// value the number of gradient contributions it will get (to name partial
/// sums). Tables (operand 0 of a bag) must be parameters used only as tables;
/// a weighted bag's weights may not need a gradient.
fn gradient_uses(fwd: &Graph, pred: ValueId, need: &[bool]) -> Result<(Vec<bool>, Vec<usize>)> {
    let nvals = fwd.values().len();
    let active: Vec<bool> = fwd
        .nodes()
        .iter()
        .map(|node| node.outputs.iter().any(|v| need[v.index()]))
        .collect();
    let mut uses = vec![0usize; nvals];
    uses[pred.index()] += 1;
    let mut is_table = vec![false; nvals];
    for (n, node) in fwd.nodes().iter().enumerate() {
        if !active[n] {
            continue;
        }
        for (i, &v) in node.inputs.iter().enumerate() {
            if !need[v.index()] {
                continue;
            }
            if matches!(node.op, Op::EmbeddingBagWeighted) && i == 3 {
                return Err(node_err(
                    fwd,
                    n,
                    &node.op,
                    format!(
                        "unsupported: the per-sample weights %{} depend on a parameter \
                         (only the table is trained)",
                        fwd.name_of(v)
                    ),
                ));
            }
            if matches!(node.op, Op::EmbeddingBag { .. } | Op::EmbeddingBagWeighted) && i == 0 {
                if !matches!(fwd.value(v).def, Def::Param(_)) {
                    return Err(node_err(
                        fwd,
                        n,
                        &node.op,
                        format!(
                            "the table %{} must be a parameter to be trained",
                            fwd.name_of(v)
                        ),
                    ));
                }
                is_table[v.index()] = true;
            } else {
                uses[v.index()] += 1;
            }
        }
    }
    if let Some(t) = (0..nvals).find(|&i| is_table[i] && uses[i] > 0) {
        return Err(graph_err(
            fwd,
            format!(
                "parameter %{} is used both as an embedding table and densely: unsupported",
                fwd.values()[t].name
            ),
        ));
    }
    Ok((active, uses))
}

/// Adds the input `label`, the loss of `pred` against it (returned) and the
/// loss gradient, the seed of the backward pass.
fn add_loss(ad: &mut Ad, fwd: &Graph, cfg: &TrainConfig, pred: ValueId) -> Result<ValueId> {
    let e = PassError::ir(ID);
    let label_name = ad.g.fresh_name("label");
    let label =
        ad.g.add_input(&label_name, fwd.ty(pred).clone())
            .map_err(&e)?;
    let (loss_op, grad_op) = match cfg.loss {
        LossKind::Bce => (
            Op::Bce {
                denom: Dim::batch(),
            },
            Op::BceGrad {
                denom: Dim::batch(),
            },
        ),
        LossKind::Mse => (
            Op::Mse {
                denom: Dim::batch(),
            },
            Op::MseGrad {
                denom: Dim::batch(),
            },
        ),
    };
    let loss = ad.g.add(loss_op, &[pred, label], "loss").map_err(&e)?;
    let hint = ad.hint(pred);
    let seed = ad.g.add(grad_op, &[pred, label], &hint).map_err(&e)?;
    ad.contribute(pred, seed);
    Ok(loss)
}

/// Adagrad's hyper-parameters, when it is the optimizer: eps finite and > 0 (a
/// zero gradient must leave a weight, and blocked padding, as it is, not divide
/// 0 by 0), the initial accumulator value and the weight decay finite and >= 0.
fn check_adagrad(fwd: &Graph, cfg: &TrainConfig) -> Result<()> {
    let (Optimizer::Adagrad(a) | Optimizer::RowwiseAdagrad(a)) = cfg.optimizer else {
        return Ok(());
    };
    if !(a.eps.is_finite() && a.eps > 0.0) {
        return Err(graph_err(
            fwd,
            format!("adagrad eps must be finite and > 0, got {}", a.eps),
        ));
    }
    for (what, v) in [
        ("initial_accumulator_value", a.initial_accumulator_value),
        ("weight_decay", a.weight_decay),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(graph_err(
                fwd,
                format!("adagrad {what} must be finite and >= 0, got {v}"),
            ));
        }
    }
    Ok(())
}

/// The SGD update of parameter `p`: a chain of `sparse_sgd`, one per bag, for a
/// table (`bags` not empty), else `sgd` with its gradient if it has one.
fn sgd_step(
    ad: &mut Ad,
    cfg: &TrainConfig,
    p: ValueId,
    bags: Vec<(Vec<ValueId>, ValueId)>,
) -> Result<()> {
    let e = PassError::ir(ID);
    let name = ad.g.name_of(p).to_string();
    if !bags.is_empty() {
        let mut table = p;
        let last = bags.len() - 1;
        for (k, (index_ops, rowgrad)) in bags.into_iter().enumerate() {
            let hint = if k == last {
                format!("{name}.next")
            } else {
                format!("{name}.next.part")
            };
            let mut ins = vec![table, index_ops[0], rowgrad];
            ins.extend(index_ops.get(1));
            table =
                ad.g.add(Op::SparseSgd { lr: cfg.lr }, &ins, &hint)
                    .map_err(&e)?;
        }
        ad.g.add_update(p, table).map_err(&e)?;
    } else if ad.need[p.index()]
        && let Some(dp) = ad.grad(p)?
    {
        let next =
            ad.g.add(Op::Sgd { lr: cfg.lr }, &[p, dp], &format!("{name}.next"))
                .map_err(&e)?;
        ad.g.add_update(p, next).map_err(&e)?;
    }
    Ok(())
}

/// The Adagrad update of parameter `p` (a table when `bags` is not empty), with
/// its accumulator parameter (see the module docs).
fn adagrad_step(
    ad: &mut Ad,
    cfg: &TrainConfig,
    p: ValueId,
    bags: Vec<(Vec<ValueId>, ValueId)>,
    params: Option<&mut Params>,
) -> Result<()> {
    let e = PassError::ir(ID);
    let (a, rowwise_tables) = match cfg.optimizer {
        Optimizer::Adagrad(a) => (a, false),
        Optimizer::RowwiseAdagrad(a) => (a, true),
        Optimizer::Sgd => return Ok(()),
    };
    let name = ad.g.name_of(p).to_string();
    let table = !bags.is_empty();
    if !table && !(ad.need[p.index()]) {
        return Ok(());
    }
    let grad = if table {
        None
    } else {
        match ad.grad(p)? {
            Some(dp) => Some(dp),
            None => return Ok(()),
        }
    };
    if bags.len() > 1 {
        return Err(PassError::Graph {
            pass: ID.to_string(),
            graph: ad.g.name.clone(),
            reason: format!(
                "table %{name} is looked up by {} bags: adagrad supports one bag per table",
                bags.len()
            ),
        });
    }
    let ty = ad.g.ty(p).clone();
    let rowwise = table && rowwise_tables;
    let acc_ty = if rowwise {
        TensorType::new(DType::F32, [ty.shape[0].clone()])
    } else {
        ty.with_dtype(DType::F32)
    };
    let acc_name = ad.g.fresh_name(&format!("{name}.acc"));
    let acc = ad.g.add_param(&acc_name, acc_ty.clone()).map_err(&e)?;
    // Only a parameter given as a tensor gets its accumulator as one; a described
    // parameter's accumulator is described too (crate::described).
    if let Some(params) = params.filter(|ps| ps.iter().any(|(n, _)| *n == name)) {
        let shape: Option<Vec<usize>> = acc_ty.shape.iter().map(|d| d.fixed()).collect();
        let Some(shape) = shape else {
            return Err(PassError::Graph {
                pass: ID.to_string(),
                graph: ad.g.name.clone(),
                reason: format!("parameter %{name} has a symbolic shape {ty}"),
            });
        };
        let n = shape.iter().product();
        let init = vec![a.initial_accumulator_value; n];
        params.push((acc_name.clone(), Tensor::f32(shape, init)));
    }
    let names = [format!("{name}.next"), format!("{acc_name}.next")];
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let outs = match (grad, bags.into_iter().next()) {
        (Some(dp), _) => {
            let op = Op::Adagrad {
                lr: cfg.lr,
                eps: a.eps,
                wd: a.weight_decay,
                rowwise: false,
            };
            ad.g.add_node(op, &[p, acc, dp], &names).map_err(&e)?
        }
        (None, Some((index_ops, rowgrad))) => {
            let op = Op::SparseAdagrad {
                lr: cfg.lr,
                eps: a.eps,
                rowwise,
            };
            let mut ins = vec![p, acc, index_ops[0], rowgrad];
            ins.extend(index_ops.get(1));
            ad.g.add_node(op, &ins, &names).map_err(&e)?
        }
        (None, None) => return Ok(()),
    };
    ad.g.add_update(p, outs[0]).map_err(&e)?;
    ad.g.add_update(acc, outs[1]).map_err(&e)?;
    Ok(())
}

fn node_err(g: &Graph, n: usize, op: &Op, reason: String) -> PassError {
    PassError::Node {
        pass: ID.to_string(),
        node: g.node_label(n),
        op: op.mnemonic().to_string(),
        reason,
    }
}

/// The state of one differentiation: the graph being extended and the gradients.
struct Ad {
    g: Graph,
    /// Per forward value: needs a gradient.
    need: Vec<bool>,
    /// Per forward value: expected number of gradient contributions.
    uses: Vec<usize>,
    /// Per forward value: gradient contributions so far.
    contribs: Vec<Vec<ValueId>>,
    /// Per forward value: the summed gradient, once asked for.
    total: Vec<Option<ValueId>>,
    /// Per table parameter: (index operands of the bag, row gradient), in bag order
    /// (filled in reverse and reversed when used).
    rows: Vec<Vec<(Vec<ValueId>, ValueId)>>,
}

impl Ad {
    /// The name hint for a gradient contribution to `v`.
    fn hint(&self, v: ValueId) -> String {
        let name = self.g.name_of(v);
        if self.uses[v.index()] > 1 {
            format!("d.{name}.part")
        } else {
            format!("d.{name}")
        }
    }

    fn contribute(&mut self, v: ValueId, grad: ValueId) {
        if self.need[v.index()] {
            self.contribs[v.index()].push(grad);
        }
    }

    /// The full gradient of `v` (sum of its contributions), `None` if it has none.
    fn grad(&mut self, v: ValueId) -> Result<Option<ValueId>> {
        if let Some(t) = self.total[v.index()] {
            return Ok(Some(t));
        }
        let parts = std::mem::take(&mut self.contribs[v.index()]);
        let Some((&first, rest)) = parts.split_first() else {
            return Ok(None);
        };
        let name = self.g.name_of(v).to_string();
        let mut acc = first;
        for (k, &p) in rest.iter().enumerate() {
            let hint = if k + 1 == rest.len() {
                format!("d.{name}")
            } else {
                format!("d.{name}.part")
            };
            acc = self
                .g
                .add(Op::Add, &[acc, p], &hint)
                .map_err(PassError::ir(ID))?;
        }
        self.total[v.index()] = Some(acc);
        Ok(Some(acc))
    }

    /// Emits the backward of forward node `n`.
    fn backward(&mut self, fwd: &Graph, n: usize) -> Result<()> {
        let node = &fwd.nodes()[n];
        let mut dys = Vec::with_capacity(node.outputs.len());
        for &o in &node.outputs {
            dys.push(self.grad(o)?);
        }
        if let Op::Module(m) = &node.op {
            return cx::backward(self, fwd, n, m, &dys);
        }
        if let Op::Split { axis, .. } = &node.op {
            return self.backward_split(fwd, n, *axis, &dys);
        }
        // Every other op with a rule has exactly one result.
        let (Some(dy), &[y]) = (dys.first().copied().flatten(), node.outputs.as_slice()) else {
            if dys.iter().all(Option::is_none) {
                return Ok(());
            }
            return Err(node_err(
                fwd,
                n,
                &node.op,
                format!("autodiff: no gradient rule for `{}`", node.op.mnemonic()),
            ));
        };
        let ins = node.inputs.as_slice();
        match &node.op {
            Op::Linear { act } => self.backward_linear(fwd, *act, ins, dy, y),
            Op::Relu | Op::Sigmoid | Op::Add => self.backward_elementwise(&node.op, ins, dy, y),
            Op::Interaction {
                kind,
                self_interaction,
            } => self.backward_interaction(*kind, *self_interaction, ins, dy),
            Op::Concat { axis } => self.backward_concat(fwd, n, *axis, dy),
            Op::Reshape { .. } => self.backward_reshape(fwd, ins[0], dy),
            Op::EmbeddingBag { .. } | Op::EmbeddingBagWeighted => {
                self.backward_embedding(fwd, n, dy)
            }
            other => Err(node_err(
                fwd,
                n,
                other,
                format!("autodiff: no gradient rule for `{}`", other.mnemonic()),
            )),
        }
    }
}
