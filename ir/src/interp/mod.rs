//! The reference interpreter: the executable definition of every op.
//!
//! It implements the text of [`crate::Op`]'s documentation with plain sequential
//! loops; every optimised path (codegen kernels, JIT code) is tested against it.
//! One file per op family, each with an `eval` that holds its ops' arms: `dense`
//! (linear, elementwise, losses), `embedding`, `interaction`, `shape`
//! (concat/split/reshape), `optim`, `adagrad`, `fused` (blocked and fused ops),
//! `generic` (ONNX import), `jagged`, `collective`; `common` holds the operand
//! helpers.
//!
//! Shapes: an op's shape rule is written once, in [`crate::infer()`]. Each node gets
//! one [`NodeInstance`] (its concrete operand and result types, verified by that
//! rule: [`NodeInstance::new`] from the declared types under the symbol binding in
//! [`run`], [`NodeInstance::of_operands`] from the operands in [`eval_op`]); the
//! operands are bound to it once ([`NodeInstance::bind`]: count, dtypes, shapes,
//! buffer lengths), and the families read their dims from the [`Checked`]
//! operands without re-deriving the rule. Symbolic attributes (a `reshape`
//! target, `slice` ends) are resolved under the binding first. `all_to_all` has no
//! instance: its results are the other ranks' data (see [`eval_op`]).
//!
//! Rules shared by every op:
//! - float operands of any dtype are widened to f32 (bf16 exactly), computed in f32,
//!   and each result is stored in the dtype of its declared type, bf16 rounded to
//!   nearest even; index operands may be i64 or i32;
//! - sums use one f32 accumulator in a fixed order, documented in each family;
//! - what depends on the data is checked where the data is read: an index out of
//!   range, offsets that do not partition the indices, a negative length; any
//!   mismatch is an error message, never a panic or an out-of-bounds access;
//! - results are checked against the instance's concrete result types (an
//!   interpreter bug otherwise); a symbol missing from `ctx.syms` is taken from
//!   the shape rule, except where the op needs its value: loss `denom`, `reshape`
//!   targets, `slice` ends, `all_to_all`'s `G` and received shapes.
//!
//! [`run`] evaluates a whole graph in node order, drops each value after its last
//! use, and applies the graph's updates to the parameters at the end.

mod adagrad;
mod collective;
pub(crate) mod common;
mod dense;
mod embedding;
pub(crate) mod fused;
mod generic;
pub(crate) mod interaction;
mod jagged;
mod optim;
mod shape;

/// Scalar definitions that the kernels call too, so that their results equal the
/// interpreter's bit for bit by construction (an elementwise op whose formula is
/// longer than a line keeps it in one place).
pub use adagrad::{adagrad_acc1, adagrad_row_acc, adagrad_step1};
pub use jagged::narrow_to_bags;

use crate::op::family::{fused_ops, generic_ops};
use crate::{
    A2aDir, Checked, Communicator, Concrete, Def, Dim, Graph, IrError, NodeInstance, Op, Result,
    Tensor, TensorType, ValueId,
};
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
/// The op's instance for these operands is verified first
/// ([`NodeInstance::of_operands`]: the op's shape rule, [`crate::infer()`], run on
/// their concrete types), then [`eval_instance`] runs it. Errors are plain
/// messages; [`run`] attaches the node. A collective whose local checks fail calls
/// `ctx.comm.abort` before returning, so peers never hang.
pub fn eval_op(
    op: &Op,
    inputs: &[&Tensor],
    out_types: &[TensorType],
    ctx: &EvalCtx<'_>,
) -> std::result::Result<Vec<Tensor>, String> {
    if let Op::AllToAll { dir, counts, rank } = op {
        return all_to_all(*dir, counts, *rank, inputs, out_types, ctx);
    }
    let op = bind_attrs(op, ctx.syms)?;
    let inst = NodeInstance::of_operands(&op, inputs, out_types, ctx.syms)?;
    eval_instance(&inst, inputs, ctx)
}

/// Evaluates the op of a verified instance ([`NodeInstance`]) on `inputs`: they
/// are bound to it ([`NodeInstance::bind`]: count, dtypes, shapes, buffer lengths),
/// the op's family evaluates the [`Checked`] operands without re-deriving its
/// shape rule, and each result is compared with the instance's concrete result
/// type. `all_to_all` has no instance (its results are the other ranks' data):
/// [`eval_op`] runs it.
pub fn eval_instance(
    inst: &NodeInstance,
    inputs: &[&Tensor],
    ctx: &EvalCtx<'_>,
) -> std::result::Result<Vec<Tensor>, String> {
    let c = inst.bind(inputs)?;
    let results = dispatch(&c, ctx)?;
    check_results(&results, inst.outputs())?;
    Ok(results)
}

/// `op` with its symbolic attributes (a `reshape` target, `slice` ends) resolved
/// under `syms`, so that its shape rule runs on concrete types.
fn bind_attrs<'o>(op: &'o Op, syms: &HashMap<String, usize>) -> R<Cow<'o, Op>> {
    let fixed = |dims: &[Dim], what: &str| -> R<Vec<Dim>> {
        dims.iter()
            .map(|d| common::resolve_dim(d, syms).map(Dim::Fixed))
            .collect::<R<Vec<Dim>>>()
            .map_err(|e| format!("{what}: {e}"))
    };
    Ok(match op {
        Op::Reshape { shape } if shape.iter().any(|d| d.fixed().is_none()) => {
            Cow::Owned(Op::Reshape {
                shape: fixed(shape, "reshape target")?,
            })
        }
        Op::Slice {
            axes,
            starts,
            ends,
            steps,
        } if ends.iter().any(|d| d.fixed().is_none()) => Cow::Owned(Op::Slice {
            axes: axes.clone(),
            starts: starts.clone(),
            ends: fixed(ends, "slice ends")?,
            steps: steps.clone(),
        }),
        _ => Cow::Borrowed(op),
    })
}

/// `all_to_all`, whose results are the other ranks' data: the exchange checks its
/// operands and the received sizes (aborting the group on a local error), then
/// each result is checked against its declared type under `ctx.syms` (dtype, rank,
/// fixed dims and bound symbols).
fn all_to_all(
    dir: A2aDir,
    counts: &[usize],
    rank: usize,
    ins: &[&Tensor],
    out_types: &[TensorType],
    ctx: &EvalCtx<'_>,
) -> R<Vec<Tensor>> {
    let results = collective::all_to_all(dir, counts, rank, ins, out_types, ctx)?;
    let bind = |s: &str| ctx.syms.get(s).copied();
    for (k, (t, ty)) in results.iter().zip(out_types).enumerate() {
        let dims_ok = t.shape.len() == ty.shape.len()
            && (t.shape.iter().zip(&ty.shape))
                .all(|(&n, d)| d.resolve(&bind).is_none_or(|b| b == n));
        if t.dtype() != ty.dtype || !dims_ok {
            return Err(format!(
                "result {k} is {} but is declared {ty}{}",
                common::describe(t),
                bound_syms(ty, ctx.syms)
            ));
        }
    }
    Ok(results)
}

/// Checks each result against the instance's concrete result type (dtype and
/// shape): an interpreter bug, reported rather than passed on.
fn check_results(results: &[Tensor], outs: &[Concrete]) -> R<()> {
    if results.len() != outs.len() {
        return Err(format!(
            "internal: {} results for {} declared types",
            results.len(),
            outs.len()
        ));
    }
    for (k, (t, c)) in results.iter().zip(outs).enumerate() {
        if t.dtype() != c.dtype || t.shape != c.shape {
            return Err(format!(
                "internal: result {k} is {} but the instance has {}{}",
                common::describe(t),
                c.dtype,
                fmt_shape(&c.shape)
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

/// Runs the op's family on checked operands: one arm per family, each family's
/// `eval` holds its ops' arms.
fn dispatch(c: &Checked<'_>, ctx: &EvalCtx<'_>) -> R<Vec<Tensor>> {
    let single = |r: R<Tensor>| r.map(|t| vec![t]);
    match c.op() {
        Op::EmbeddingBag { .. }
        | Op::EmbeddingBagGrad { .. }
        | Op::EmbeddingBagRows { .. }
        | Op::EmbeddingGradDense { .. } => single(embedding::eval(c)),
        Op::Linear { .. }
        | Op::Relu
        | Op::Add
        | Op::Sigmoid
        | Op::ReluGrad
        | Op::SigmoidGrad
        | Op::LinearDx
        | Op::LinearDw
        | Op::LinearDb
        | Op::Bce { .. }
        | Op::Mse { .. }
        | Op::BceGrad { .. }
        | Op::MseGrad { .. } => single(dense::eval(c, ctx.syms)),
        Op::Interaction { .. } | Op::InteractionGrad { .. } => interaction::eval(c),
        Op::Concat { .. } | Op::Split { .. } | Op::Reshape { .. } => shape::eval(c),
        Op::Sgd { .. }
        | Op::SparseSgd { .. }
        | Op::SparseSgdRows { .. }
        | Op::EmbeddingUpdateRows { .. } => single(optim::eval(c)),
        Op::Adagrad { .. }
        | Op::SparseAdagrad { .. }
        | Op::EmbeddingUpdateAdagrad { .. }
        | Op::EmbeddingUpdateAdagradRows { .. } => adagrad::eval(c),
        Op::AllReduce => collective::all_reduce(c.inputs(), ctx),
        Op::AllToAll { .. } => Err("internal: `all_to_all` has no instance".into()),
        fused_ops!() | Op::SplitEmbeddingUpdateRows { .. } => fused::eval(c, ctx.syms),
        generic_ops!() => single(generic::eval(c)),
        Op::OffsetsFromLengths { keys, key } => {
            single(jagged::offsets_from_lengths(*keys, *key, c))
        }
        Op::Module(m) => m.def().eval(c),
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
    let mut slots = bound_slots(g, inputs, params, syms)?;
    let last = last_uses(g);
    let ctx = EvalCtx { syms, comm };
    for (n, node) in g.nodes().iter().enumerate() {
        let eval_err = |reason: String| IrError::Eval {
            node: g.node_label(n),
            op: node.op.mnemonic().to_string(),
            reason: format!("{reason}{}", operand_names(g, &node.inputs)),
        };
        // The step's learning rate, if the run gives one.
        let op: Cow<'_, Op> = match lr {
            Some(lr) if node.op.is_update() => Cow::Owned(node.op.with_lr(lr)),
            _ => Cow::Borrowed(&node.op),
        };
        // sparse_sgd on an owned table at its last use: update it in place.
        let table = match (op.as_ref(), node.inputs.as_slice()) {
            (Op::SparseSgd { .. }, [t, rest @ ..])
                if last.get(t.index()) == Some(&Some(n))
                    && !rest.contains(t)
                    && matches!(slots.get(t.index()), Some(Some(Cow::Owned(_)))) =>
            {
                slots[t.index()].take()
            }
            _ => None,
        };
        let results = {
            let mut rest: Vec<&Tensor> = Vec::with_capacity(node.inputs.len());
            for &v in &node.inputs[usize::from(table.is_some())..] {
                match slots.get(v.index()) {
                    Some(Some(t)) => rest.push(t.as_ref()),
                    _ => {
                        return Err(eval_err(format!(
                            "operand {v:?} has no value (is the graph in execution order?)"
                        )));
                    }
                }
            }
            let types = |vs: &[ValueId]| -> Vec<TensorType> {
                vs.iter().map(|&v| g.ty(v).clone()).collect()
            };
            let (in_types, out_types) = (types(&node.inputs), types(&node.outputs));
            eval_node(&op, (&in_types, &out_types), table, &rest, &ctx).map_err(eval_err)?
        };
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
    finish(g, slots)
}

/// Evaluates one node of a run: its instance is built from its declared types
/// under the binding ([`NodeInstance::new`]; from the operands' shapes when an
/// operand type has a symbol the binding lacks), the operands are bound to it and
/// its family runs. `table` is the owned table of an in-place `sparse_sgd`
/// (operand 0; `rest` are the others).
fn eval_node(
    op: &Op,
    (in_types, out_types): (&[TensorType], &[TensorType]),
    table: Option<Cow<'_, Tensor>>,
    rest: &[&Tensor],
    ctx: &EvalCtx<'_>,
) -> R<Vec<Tensor>> {
    if table.is_none() && matches!(op, Op::AllToAll { .. }) {
        return eval_op(op, rest, out_types, ctx);
    }
    let op = bind_attrs(op, ctx.syms)?;
    let all: Vec<&Tensor> = table
        .iter()
        .map(AsRef::as_ref)
        .chain(rest.iter().copied())
        .collect();
    let inst = match NodeInstance::new(&op, in_types, out_types, ctx.syms) {
        Ok(inst) => inst,
        Err(_) => NodeInstance::of_operands(&op, &all, out_types, ctx.syms)?,
    };
    if table.is_none() {
        return eval_instance(&inst, &all, ctx);
    }
    inst.bind(&all)?;
    drop(all);
    let (Some(table), Op::SparseSgd { lr }) = (table, inst.op()) else {
        return Err("internal: an in-place update of another op".into());
    };
    let t = optim::sparse_sgd(*lr, table, rest, inst.outputs()[0].dtype)?;
    let results = vec![t];
    check_results(&results, inst.outputs())?;
    Ok(results)
}

/// The value slots of a run with its inputs and parameters in place, each checked
/// against its declared type under `syms` (and its buffer against its shape).
fn bound_slots<'a>(
    g: &Graph,
    inputs: &'a HashMap<String, Tensor>,
    params: &'a HashMap<String, Tensor>,
    syms: &HashMap<String, usize>,
) -> Result<Vec<Slot<'a>>> {
    let mut slots: Vec<Slot<'a>> = (0..g.values().len()).map(|_| None).collect();
    let bind = |s: &str| syms.get(s).copied();
    for (ids, map, kind) in [
        (g.inputs(), inputs, "input"),
        (g.params(), params, "parameter"),
    ] {
        for &v in ids {
            let name = g.name_of(v);
            let ty = g.ty(v);
            let binding_err = |reason: String| IrError::Binding {
                name: name.to_string(),
                reason,
            };
            let t = map
                .get(name)
                .ok_or_else(|| binding_err(format!("missing {kind} (declared {ty})")))?;
            if !t.matches(ty, &bind) {
                return Err(binding_err(format!(
                    "{kind} is {} but is declared {ty}{}",
                    common::describe(t),
                    bound_syms(ty, syms)
                )));
            }
            common::check_len(t, kind).map_err(binding_err)?;
            slots[v.index()] = Some(Cow::Borrowed(t));
        }
    }
    Ok(slots)
}

/// The node index of each value's last use; `usize::MAX` for outputs and update
/// values, which live to the end.
fn last_uses(g: &Graph) -> Vec<Option<usize>> {
    let mut last: Vec<Option<usize>> = vec![None; g.values().len()];
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
            *l = Some(usize::MAX);
        }
    }
    last
}

/// ` (operands: %a, %b)` for an error message.
fn operand_names(g: &Graph, inputs: &[ValueId]) -> String {
    let names: Vec<String> = inputs
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
}

/// Takes the outputs and the update values out of a finished run's slots.
fn finish(g: &Graph, mut slots: Vec<Slot<'_>>) -> Result<(Vec<Tensor>, NewParams)> {
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
