//! The reference interpreter: the executable definition of every op.
//!
//! It implements the text of [`crate::Op`]'s documentation with plain sequential
//! loops; every optimised path (codegen kernels, JIT code) is tested against it.
//! One file per op family: `dense` (linear, elementwise, losses),
//! `embedding`, `interaction`, `shape` (concat/split/reshape), `optim`,
//! `collective`; `common` holds the operand helpers.
//!
//! Rules shared by every op:
//! - float operands of any dtype are widened to f32 (bf16 exactly), computed in f32,
//!   and each result is stored in the dtype of its declared type (`out_types`), bf16
//!   rounded to nearest even; index operands may be i64 or i32;
//! - sums use one f32 accumulator in a fixed order, documented in each family;
//! - operands are checked against each other at run time: any mismatch, bad index
//!   or bad offset is an error message, never a panic or an out-of-bounds access;
//! - results are checked against `out_types`: the count, the dtype, and every
//!   fixed dimension and every *bound* symbol (a symbol missing from `ctx.syms` is
//!   not checked, except where the op needs its value: loss `denom`, `reshape`
//!   targets, `all_to_all`'s `G` and received shapes).
//!
//! [`run`] evaluates a whole graph in node order, drops each value after its last
//! use, and applies the graph's updates to the parameters at the end.

mod adagrad;
mod collective;
mod common;
mod dense;
mod embedding;
mod fused;
mod generic;
mod interaction;
mod jagged;
mod optim;
mod shape;

/// Scalar definitions that the kernels call too, so that their results equal the
/// interpreter's bit for bit by construction (an elementwise op whose formula is
/// longer than a line keeps it in one place).
pub use adagrad::{adagrad_acc1, adagrad_row_acc, adagrad_step1};
pub use dense::{gelu_grad1, gelu1};
pub use jagged::narrow_to_bags;

use crate::{A2aDir, Communicator, Def, Graph, IrError, Op, Result, Tensor, TensorType, ValueId};
use common::{R, fmt_shape};
use std::borrow::Cow;
use std::collections::HashMap;

/// What an op may need besides its operands: symbol sizes and the rank's group.
pub struct EvalCtx<'a> {
    /// Sizes bound to symbolic dimensions (`B`, `G`, ...).
    pub syms: &'a HashMap<String, usize>,
    /// This rank's communicator ([`crate::SingleRank`] when alone).
    pub comm: &'a dyn Communicator,
}

/// Evaluates one op on concrete operands. `out_types` are the node's declared
/// result types (the result dtypes; the shapes of data received from other ranks).
/// Errors are plain messages; [`run`] attaches the node. A collective whose local
/// checks fail calls `ctx.comm.abort` before returning, so peers never hang.
pub fn eval_op(
    op: &Op,
    inputs: &[&Tensor],
    out_types: &[TensorType],
    ctx: &EvalCtx<'_>,
) -> std::result::Result<Vec<Tensor>, String> {
    check_result_count(op, inputs.len(), out_types)?;
    let results = dispatch(op, inputs, out_types, ctx)?;
    check_results(&results, out_types, ctx.syms)?;
    Ok(results)
}

/// The number of results `op` produces with `n_in` operands.
fn result_count(op: &Op, n_in: usize) -> usize {
    match op {
        Op::Split { sizes, .. } => sizes.len(),
        Op::InteractionGrad { .. } => n_in.saturating_sub(1),
        Op::AllReduce => n_in,
        Op::AllToAll {
            dir: A2aDir::Scatter,
            counts,
            ..
        } => counts.iter().fold(0usize, |a, &c| a.saturating_add(c)),
        Op::AllToAll {
            dir: A2aDir::Gather,
            counts,
            rank,
        } => counts.get(*rank).copied().unwrap_or(0),
        // ---- fused / blocked ops (e-graph, precision)
        Op::BrgemmWgrad { .. }
        | Op::SplitSgd { .. }
        | Op::SplitEmbeddingUpdate { .. }
        | Op::SplitEmbeddingUpdateRows { .. } => 2,
        Op::Adagrad { .. }
        | Op::SparseAdagrad { .. }
        | Op::EmbeddingUpdateAdagrad { .. }
        | Op::EmbeddingUpdateAdagradRows { .. } => 2,
        _ => 1,
    }
}

fn check_result_count(op: &Op, n_in: usize, out_types: &[TensorType]) -> R<()> {
    let want = result_count(op, n_in);
    if out_types.len() == want {
        Ok(())
    } else {
        Err(format!(
            "`{}` with {n_in} operands has {want} results, but {} result types were given",
            op.mnemonic(),
            out_types.len()
        ))
    }
}

/// Checks each result against its declared type: dtype, rank, fixed dims and bound
/// symbols.
fn check_results(
    results: &[Tensor],
    out_types: &[TensorType],
    syms: &HashMap<String, usize>,
) -> R<()> {
    if results.len() != out_types.len() {
        return Err(format!(
            "internal: {} results for {} declared types",
            results.len(),
            out_types.len()
        ));
    }
    for (k, (t, ty)) in results.iter().zip(out_types).enumerate() {
        let dims_ok = t.shape.len() == ty.shape.len()
            && t.shape.iter().zip(&ty.shape).all(|(&n, d)| match d {
                crate::Dim::Fixed(f) => *f == n,
                crate::Dim::Sym(s) => syms.get(s).is_none_or(|&b| b == n),
                crate::Dim::Expr(e) => e.eval(&|s| syms.get(s).copied()).is_none_or(|b| b == n),
            });
        if t.dtype() != ty.dtype || !dims_ok {
            return Err(format!(
                "result {k} is {}{} but is declared {ty}{}",
                t.dtype(),
                fmt_shape(&t.shape),
                bound_syms(ty, syms)
            ));
        }
    }
    Ok(())
}

/// ` (with B=4, G=8)` for the bound symbols of a type, for messages.
fn bound_syms(ty: &TensorType, syms: &HashMap<String, usize>) -> String {
    let mut seen: Vec<String> = Vec::new();
    for s in ty.shape.iter().flat_map(crate::Dim::symbols) {
        let b = syms
            .get(s)
            .map_or_else(|| format!("{s} unbound"), |v| format!("{s}={v}"));
        if !seen.contains(&b) {
            seen.push(b);
        }
    }
    if seen.is_empty() {
        String::new()
    } else {
        format!(" (with {})", seen.join(", "))
    }
}

/// Runs the op's family implementation. `out_types` has the right length.
fn dispatch(
    op: &Op,
    ins: &[&Tensor],
    out_types: &[TensorType],
    ctx: &EvalCtx<'_>,
) -> R<Vec<Tensor>> {
    let out = out_types.first().map(|t| t.dtype);
    let dtypes: Vec<_> = out_types.iter().map(|t| t.dtype).collect();
    // Every single-result op below reads `one`; `out_types` has exactly one entry
    // for them (checked by `check_result_count`).
    let one = || out.ok_or_else(|| "internal: no result type".to_string());
    let single = |r: R<Tensor>| r.map(|t| vec![t]);
    match op {
        Op::EmbeddingBag { mode, last_offset } => {
            single(embedding::embedding_bag(*mode, *last_offset, ins, one()?))
        }
        Op::EmbeddingBagGrad { mode, last_offset } => single(embedding::embedding_bag_grad(
            *mode,
            *last_offset,
            ins,
            one()?,
        )),
        Op::Linear { act } => single(dense::linear(*act, ins, one()?)),
        Op::Relu => single(dense::relu(ins, one()?)),
        Op::Add => single(dense::add(ins, one()?)),
        Op::Sigmoid => single(dense::sigmoid(ins, one()?)),
        Op::Gelu => single(dense::gelu(ins, one()?)),
        Op::Interaction {
            kind,
            self_interaction,
        } => single(interaction::interaction(
            *kind,
            *self_interaction,
            ins,
            one()?,
        )),
        Op::InteractionGrad {
            kind,
            self_interaction,
        } => interaction::interaction_grad(*kind, *self_interaction, ins, &dtypes),
        Op::Concat { axis } => single(shape::concat(*axis, ins, one()?)),
        Op::Split { axis, sizes } => shape::split(*axis, sizes, ins, &dtypes),
        Op::Reshape { shape: target } => single(shape::reshape(target, ins, one()?, ctx.syms)),
        Op::Bce { denom } => single(dense::bce(ins, denom, ctx.syms, one()?)),
        Op::Mse { denom } => single(dense::mse(ins, denom, ctx.syms, one()?)),
        Op::ReluGrad => single(dense::relu_grad(ins, one()?)),
        Op::SigmoidGrad => single(dense::sigmoid_grad(ins, one()?)),
        Op::GeluGrad => single(dense::gelu_grad(ins, one()?)),
        Op::LinearDx => single(dense::linear_dx(ins, one()?)),
        Op::LinearDw => single(dense::linear_dw(ins, one()?)),
        Op::LinearDb => single(dense::linear_db(ins, one()?)),
        Op::BceGrad { denom } => single(dense::bce_grad(ins, denom, ctx.syms, one()?)),
        Op::MseGrad { denom } => single(dense::mse_grad(ins, denom, ctx.syms, one()?)),
        Op::Sgd { lr } => single(optim::sgd(*lr, ins, one()?)),
        Op::SparseSgd { lr } => single(optim::sparse_sgd_ref(*lr, ins, one()?)),
        Op::Adagrad {
            lr,
            eps,
            wd,
            rowwise,
        } => adagrad::adagrad(*lr, *eps, *wd, *rowwise, ins),
        Op::SparseAdagrad { lr, eps, rowwise } => adagrad::sparse_adagrad(
            adagrad::Hyper {
                lr: *lr,
                eps: *eps,
                rowwise: *rowwise,
            },
            ins,
        ),
        Op::EmbeddingUpdateAdagrad {
            mode,
            lr,
            eps,
            rowwise,
        } => adagrad::embedding_update_adagrad(
            *mode,
            adagrad::Hyper {
                lr: *lr,
                eps: *eps,
                rowwise: *rowwise,
            },
            None,
            ins,
        ),
        Op::EmbeddingUpdateAdagradRows {
            mode,
            lr,
            eps,
            rowwise,
            lo,
            rows,
        } => adagrad::embedding_update_adagrad(
            *mode,
            adagrad::Hyper {
                lr: *lr,
                eps: *eps,
                rowwise: *rowwise,
            },
            Some((*lo, *rows)),
            ins,
        ),
        Op::AllReduce => collective::all_reduce(ins, ctx),
        Op::AllToAll { dir, counts, rank } => {
            collective::all_to_all(*dir, counts, *rank, ins, out_types, ctx)
        }
        // ---- fused / blocked ops (e-graph, precision)
        Op::BlockAct { .. }
        | Op::UnblockAct { .. }
        | Op::BlockWeight { .. }
        | Op::UnblockWeight { .. }
        | Op::Brgemm { .. }
        | Op::BrgemmDgrad { .. }
        | Op::BrgemmWgrad { .. }
        | Op::BceLogits { .. }
        | Op::BceLogitsGrad { .. }
        | Op::SplitSgd { .. }
        | Op::EmbeddingUpdate { .. }
        | Op::SplitEmbeddingUpdate { .. } => fused::eval(op, ins, &dtypes, ctx.syms),
        // ---- sharded embeddings
        Op::EmbeddingBagRows { mode, lo, rows } => single(embedding::embedding_bag_rows(
            *mode,
            *lo,
            *rows,
            ins,
            one()?,
        )),
        Op::SparseSgdRows { lr, lo, rows } => {
            single(optim::sparse_sgd_rows_ref(*lr, *lo, *rows, ins, one()?))
        }
        Op::EmbeddingUpdateRows { mode, lr, lo, rows } => {
            common::expect_arity("embedding_update_rows", ins, &[3, 4])?;
            let mut grad_ins = vec![ins[1]];
            grad_ins.extend_from_slice(&ins[2..]);
            let rowgrad =
                embedding::embedding_bag_grad(*mode, false, &grad_ins, crate::DType::F32)?;
            single(optim::sparse_sgd_rows_ref(
                *lr,
                *lo,
                *rows,
                &[ins[0], ins[2], &rowgrad],
                one()?,
            ))
        }
        Op::SplitEmbeddingUpdateRows { mode, lr, lo, rows } => {
            fused::split_embedding_update_rows(*mode, *lr, *lo, *rows, ins)
        }
        Op::EmbeddingGradDense { mode, rows } => {
            single(embedding::embedding_grad_dense(*mode, *rows, ins))
        }
        // ---- generic ops (ONNX import)
        Op::MatMul => single(generic::matmul(ins, one()?)),
        Op::Binary { kind } => single(generic::binary(*kind, ins, one()?)),
        Op::Transpose { perm } => single(generic::transpose(perm, ins)),
        Op::Gather { axis } => single(generic::gather(*axis, ins)),
        Op::GatherElements { axis } => single(generic::gather_elements(*axis, ins)),
        Op::GatherNd { batch_dims } => single(generic::gather_nd(*batch_dims, ins)),
        Op::Slice {
            axes,
            starts,
            ends,
            steps,
        } => {
            let ends = ends
                .iter()
                .map(|d| common::resolve_dim(d, ctx.syms))
                .collect::<R<Vec<usize>>>()?;
            single(generic::slice(axes, starts, &ends, steps, ins))
        }
        Op::Reduce {
            kind,
            axes,
            keepdims,
        } => single(generic::reduce(*kind, axes, *keepdims, ins, one()?)),
        Op::Cast { to } => single(generic::cast(*to, ins)),
        Op::EmbeddingBagWeighted => single(generic::embedding_bag_weighted(ins, one()?)),
        Op::OffsetsFromLengths { keys, key } => {
            single(jagged::offsets_from_lengths(*keys, *key, ins))
        }
    }
}

/// Binds symbolic dimensions from the shapes of the given inputs and parameters
/// (conflicting sizes for one symbol are an error naming the value).
///
/// Walks the graph's inputs, then its parameters, in declaration order. A value
/// missing from the maps, or whose rank differs from its declared type, is an
/// [`IrError::Binding`] too. Symbols that no input or parameter carries (e.g. `G`
/// on a rank that owns no table) are simply absent from the result.
pub fn bind_symbols(
    g: &Graph,
    inputs: &HashMap<String, Tensor>,
    params: &HashMap<String, Tensor>,
) -> Result<HashMap<String, usize>> {
    let mut syms: HashMap<String, usize> = HashMap::new();
    let mut first_seen: HashMap<String, String> = HashMap::new();
    let mut exprs: Vec<(crate::DimExpr, usize, String)> = Vec::new();
    let sources = g
        .inputs()
        .iter()
        .map(|&v| (v, inputs, "input"))
        .chain(g.params().iter().map(|&v| (v, params, "parameter")));
    for (v, map, kind) in sources {
        let name = g.name_of(v);
        let ty = g.ty(v);
        let t = map.get(name).ok_or_else(|| IrError::Binding {
            name: name.to_string(),
            reason: format!("missing {kind} (declared {ty})"),
        })?;
        if t.shape.len() != ty.shape.len() {
            return Err(IrError::Binding {
                name: name.to_string(),
                reason: format!(
                    "{kind} has shape {} but is declared {ty}",
                    fmt_shape(&t.shape)
                ),
            });
        }
        for (k, (d, &n)) in ty.shape.iter().zip(&t.shape).enumerate() {
            if let crate::Dim::Expr(e) = d {
                exprs.push((e.clone(), n, name.to_string()));
                continue;
            }
            let crate::Dim::Sym(s) = d else { continue };
            match syms.get(s) {
                None => {
                    syms.insert(s.clone(), n);
                    first_seen.insert(s.clone(), name.to_string());
                }
                Some(&b) if b == n => {}
                Some(&b) => {
                    let from = first_seen.get(s).map_or("?", String::as_str);
                    return Err(IrError::Binding {
                        name: name.to_string(),
                        reason: format!(
                            "symbol {s} (dimension {k} of {ty}) is {n} here but {b} from %{from}"
                        ),
                    });
                }
            }
        }
    }
    // Expressions (`B+1`): solved for a symbol no plain dimension bound, then
    // checked.
    let pairs: Vec<(crate::DimExpr, usize)> =
        exprs.iter().map(|(e, n, _)| (e.clone(), *n)).collect();
    crate::dim::bind_exprs(&pairs, &mut syms).map_err(|reason| IrError::Binding {
        name: exprs
            .iter()
            .map(|(_, _, v)| v.as_str())
            .next()
            .unwrap_or("?")
            .to_string(),
        reason,
    })?;
    Ok(syms)
}

/// Runs a graph once: checks every input and parameter against its declared type
/// (under `syms`), evaluates the nodes in order, applies the updates to `params`,
/// and returns the outputs in order.
///
/// Values are dropped after their last use (outputs and update values are kept to
/// the end). Errors from an op become [`IrError::Eval`] naming the node, the op
/// and the operands. When the table operand of a `sparse_sgd` is an intermediate
/// value at its last use it is updated in place; a parameter table is copied once.
/// On any error `params` is left unchanged and `comm.abort` is called, so that peer
/// ranks waiting in a collective fail instead of hanging.
pub fn run(
    g: &Graph,
    inputs: &HashMap<String, Tensor>,
    params: &mut HashMap<String, Tensor>,
    syms: &HashMap<String, usize>,
    comm: &dyn Communicator,
) -> Result<Vec<Tensor>> {
    run_with_lr(g, inputs, params, syms, comm, None)
}

/// [`run`] with the step's learning rate: with `Some(lr)` every optimizer update
/// runs as if its `lr` attribute were `lr` ([`Op::with_lr`]: a learning-rate
/// schedule's step); `None` keeps the rates the graph was compiled with.
pub fn run_with_lr(
    g: &Graph,
    inputs: &HashMap<String, Tensor>,
    params: &mut HashMap<String, Tensor>,
    syms: &HashMap<String, usize>,
    comm: &dyn Communicator,
    lr: Option<f32>,
) -> Result<Vec<Tensor>> {
    let result = evaluate(g, inputs, params, syms, comm, lr);
    match result {
        Ok((outputs, updates)) => {
            for (name, t) in updates {
                params.insert(name, t);
            }
            Ok(outputs)
        }
        Err(e) => {
            comm.abort(&e.to_string());
            Err(e)
        }
    }
}

/// The `(param name, new value)` pairs of a finished run.
type NewParams = Vec<(String, Tensor)>;

/// A value during a run: borrowed (inputs, parameters) or computed.
type Slot<'a> = Option<Cow<'a, Tensor>>;

/// Evaluates the graph; returns the outputs and the `(param name, new value)` pairs.
fn evaluate(
    g: &Graph,
    inputs: &HashMap<String, Tensor>,
    params: &HashMap<String, Tensor>,
    syms: &HashMap<String, usize>,
    comm: &dyn Communicator,
    lr: Option<f32>,
) -> Result<(Vec<Tensor>, NewParams)> {
    let nvals = g.values().len();
    let mut slots: Vec<Slot<'_>> = (0..nvals).map(|_| None).collect();
    let bind = |s: &str| syms.get(s).copied();
    for (ids, map, kind) in [
        (g.inputs(), inputs, "input"),
        (g.params(), params, "parameter"),
    ] {
        for &v in ids {
            let name = g.name_of(v);
            let ty = g.ty(v);
            let t = map.get(name).ok_or_else(|| IrError::Binding {
                name: name.to_string(),
                reason: format!("missing {kind} (declared {ty})"),
            })?;
            if !t.matches(ty, &bind) {
                return Err(IrError::Binding {
                    name: name.to_string(),
                    reason: format!(
                        "{kind} is {} but is declared {ty}{}",
                        common::describe(t),
                        bound_syms(ty, syms)
                    ),
                });
            }
            if let Err(e) = common::check_len(t, kind) {
                return Err(IrError::Binding {
                    name: name.to_string(),
                    reason: e,
                });
            }
            slots[v.index()] = Some(Cow::Borrowed(t));
        }
    }

    // Last use of each value; outputs and update values live to the end.
    const KEEP: usize = usize::MAX;
    let mut last: Vec<Option<usize>> = vec![None; nvals];
    for (n, node) in g.nodes().iter().enumerate() {
        for &v in &node.inputs {
            if let Some(l) = last.get_mut(v.index()) {
                *l = Some(n);
            }
        }
    }
    for &v in g
        .outputs()
        .iter()
        .chain(g.updates().iter().map(|u| &u.value))
    {
        if let Some(l) = last.get_mut(v.index()) {
            *l = Some(KEEP);
        }
    }

    let ctx = EvalCtx { syms, comm };
    for (n, node) in g.nodes().iter().enumerate() {
        let operand_names = || -> String {
            let names: Vec<String> = node
                .inputs
                .iter()
                .map(|&v| match g.values().get(v.index()) {
                    Some(val) => format!("%{}", val.name),
                    None => format!("{v:?}"),
                })
                .collect();
            if names.is_empty() {
                " (no operands)".to_string()
            } else {
                format!(" (operands: {})", names.join(", "))
            }
        };
        let eval_err = |reason: String| IrError::Eval {
            node: g.node_label(n),
            op: node.op.mnemonic().to_string(),
            reason: format!("{reason}{}", operand_names()),
        };
        let out_types: Vec<TensorType> = node.outputs.iter().map(|&v| g.ty(v).clone()).collect();
        // The step's learning rate, if the run gives one.
        let op: Cow<'_, Op> = match lr {
            Some(lr) if node.op.is_update() => Cow::Owned(node.op.with_lr(lr)),
            _ => Cow::Borrowed(&node.op),
        };

        // sparse_sgd on an owned table at its last use: update it in place.
        let owned_table = match (op.as_ref(), node.inputs.as_slice()) {
            (Op::SparseSgd { lr }, [t, rest @ ..])
                if last.get(t.index()) == Some(&Some(n))
                    && !rest.contains(t)
                    && matches!(slots.get(t.index()), Some(Some(Cow::Owned(_)))) =>
            {
                slots[t.index()].take().map(|table| (*lr, table))
            }
            _ => None,
        };
        let results = {
            let first = usize::from(owned_table.is_some());
            let mut operands: Vec<&Tensor> = Vec::with_capacity(node.inputs.len());
            for &v in &node.inputs[first..] {
                match slots.get(v.index()) {
                    Some(Some(t)) => operands.push(t.as_ref()),
                    _ => {
                        return Err(eval_err(format!(
                            "operand {v:?} has no value (is the graph in execution order?)"
                        )));
                    }
                }
            }
            match owned_table {
                Some((lr, table)) => check_result_count(&op, node.inputs.len(), &out_types)
                    .and_then(|()| optim::sparse_sgd(lr, table, &operands, out_types[0].dtype))
                    .map(|t| vec![t])
                    .and_then(|r| check_results(&r, &out_types, syms).map(|()| r)),
                None => eval_op(&op, &operands, &out_types, &ctx),
            }
            .map_err(eval_err)?
        };
        if results.len() != node.outputs.len() {
            return Err(eval_err(format!(
                "internal: {} results for {} declared",
                results.len(),
                node.outputs.len()
            )));
        }
        for (&v, t) in node.outputs.iter().zip(results) {
            // A result nobody uses is dropped at once.
            if last[v.index()].is_some() {
                slots[v.index()] = Some(Cow::Owned(t));
            }
        }
        for &v in &node.inputs {
            if last.get(v.index()) == Some(&Some(n)) {
                slots[v.index()] = None;
            }
        }
    }

    let mut take = |v: ValueId, keep: bool, what: &str| -> Result<Tensor> {
        let slot = slots.get_mut(v.index()).ok_or_else(|| IrError::Graph {
            graph: g.name.clone(),
            reason: format!("{what} {v:?} does not exist"),
        })?;
        let t = if keep { slot.clone() } else { slot.take() };
        t.map(Cow::into_owned).ok_or_else(|| IrError::Graph {
            graph: g.name.clone(),
            reason: format!("{what} %{} has no value after the run", g.name_of(v)),
        })
    };
    let outs = g.outputs();
    let updates = g.updates();
    let mut outputs = Vec::with_capacity(outs.len());
    for (i, &v) in outs.iter().enumerate() {
        let keep = outs[i + 1..].contains(&v) || updates.iter().any(|u| u.value == v);
        outputs.push(take(v, keep, "output")?);
    }
    let mut new_params = Vec::with_capacity(updates.len());
    for (i, u) in updates.iter().enumerate() {
        let keep = updates[i + 1..].iter().any(|w| w.value == u.value);
        if !matches!(
            g.values().get(u.param.index()).map(|p| p.def),
            Some(Def::Param(_))
        ) {
            return Err(IrError::Graph {
                graph: g.name.clone(),
                reason: format!("update target {:?} is not a parameter", u.param),
            });
        }
        new_params.push((
            g.name_of(u.param).to_string(),
            take(u.value, keep, "update value")?,
        ));
    }
    Ok((outputs, new_params))
}
