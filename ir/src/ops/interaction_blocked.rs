//! `interaction_blocked{self, bk, dtype}(x, e_0, .., e_{n-1}) -> [Kb, S, bk]`:
//! the dot interaction written straight in the blocked layout of the GEMM that
//! reads it (the pass `fuse-interaction-layout`, `dlrm_passes`), instead of
//! a row-major `[S, width]` result that a `block_act` then copies.
//!
//! Defined as the composition it replaces:
//! `block_act{bk, dtype}(interaction{dot, self}(x, e_0, ..))`, with the
//! interaction's result in its own dtype (`interaction`'s rule: bf16 when
//! every operand is) and then stored as `dtype`, zeros in the last block's
//! padding columns; so a fused plan equals the unfused one bit for bit.
//!
//! Its gradient's counterpart, `interaction_grad_blocked{self}(drb, x, e_0,
//! ..) -> (dx, de_0, ..)`, reads the result's gradient in that blocked layout
//! (`[Kb, S, bk]`, as the top MLP's first `brgemm_dgrad` writes it):
//! `interaction_grad{dot, self}(unblock_act{width, dtype(drb)}(drb), x, e_0,
//! ..)`, the gradients f32.

use super::cross::{arity_error, no_gradient};
use crate::error::Result;
use crate::graph::ValueId;
use crate::instance::Checked;
use crate::interp::fused::{block_act, unblock_act};
use crate::interp::interaction::{interaction_grad_of, interaction_of};
use crate::module::{DecomposeCx, GradCx, ModOp, OpModule, Work};
use crate::op::{Attr, InteractionKind, Op};
use crate::tensor::Tensor;
use crate::types::{DType, Dim, TensorType};

type R<T> = std::result::Result<T, String>;

/// The op (see the module docs).
pub struct InteractionBlocked;

/// Its mnemonic.
pub const MNEMONIC: &str = "interaction_blocked";

/// The gradient's op (see the module docs).
pub struct InteractionGradBlocked;

/// Its mnemonic.
pub const GRAD: &str = "interaction_grad_blocked";

/// An `interaction_grad_blocked` node's op: diagonal pairs kept or not.
pub fn grad_op(self_interaction: bool) -> Op {
    match ModOp::new(
        &InteractionGradBlocked,
        vec![("self", Attr::Bool(self_interaction))],
    ) {
        Ok(m) => Op::Module(m),
        Err(e) => unreachable!("valid attributes: {e}"),
    }
}

/// The diagonal attribute of an `interaction_grad_blocked` op.
pub fn grad_self(op: &ModOp) -> bool {
    matches!(op.attr("self"), Some(Attr::Bool(true)))
}

/// The ops `interaction_grad_blocked{self}` composes for a result of
/// `width` columns stored as `dtype`.
fn grad_parts(self_interaction: bool, width: usize, dtype: DType) -> (Op, Op) {
    let grad = Op::InteractionGrad {
        kind: InteractionKind::Dot,
        self_interaction,
    };
    (Op::UnblockAct { k: width, dtype }, grad)
}

/// The interaction's width for forward operands `fwd` (`None` unless every
/// one is `[S, D]` of one fixed `D`).
fn width_of(fwd: &[&TensorType], self_interaction: bool) -> Option<usize> {
    let d = match fwd.first()?.shape.get(1)? {
        Dim::Fixed(d) => *d,
        _ => return None,
    };
    let w = vec![d; fwd.len()];
    Some(crate::interaction_width(
        InteractionKind::Dot,
        self_interaction,
        &w,
    ))
}

/// An `interaction_blocked` node's op: diagonal pairs kept or not, blocks of
/// `bk` columns, results stored as `dtype` (f32 or bf16).
pub fn op(self_interaction: bool, bk: usize, dtype: DType) -> Op {
    let attrs = vec![
        ("self", Attr::Bool(self_interaction)),
        ("bk", Attr::Int(bk as i64)),
        ("dtype", Attr::Ident(dtype_name(dtype).into())),
    ];
    match ModOp::new(&InteractionBlocked, attrs) {
        Ok(m) => Op::Module(m),
        Err(e) => unreachable!("valid attributes: {e}"),
    }
}

/// The attributes of an `interaction_blocked` op: `(self, bk, dtype)`.
pub fn attrs_of(op: &ModOp) -> (bool, usize, DType) {
    let self_interaction = matches!(op.attr("self"), Some(Attr::Bool(true)));
    let bk = match op.attr("bk") {
        Some(Attr::Int(v)) => usize::try_from(*v).unwrap_or(0),
        _ => 0,
    };
    let dtype = match op.attr("dtype") {
        Some(Attr::Ident(d)) if d == "bf16" => DType::BF16,
        _ => DType::F32,
    };
    (self_interaction, bk, dtype)
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bf16",
        _ => "f32",
    }
}

/// The dtype the dot interaction of `ins` stores its result in
/// (`interaction`'s rule: bf16 when every operand is, else f32): the
/// intermediate of `interaction_blocked`, which its kernels must match.
pub fn interaction_dtype(ins: &[&Tensor]) -> DType {
    match ins.iter().all(|t| t.dtype() == DType::BF16) {
        true => DType::BF16,
        false => DType::F32,
    }
}

/// The two ops it composes.
fn parts(op: &ModOp) -> (Op, Op) {
    let (self_interaction, bk, dtype) = attrs_of(op);
    let inter = Op::Interaction {
        kind: InteractionKind::Dot,
        self_interaction,
    };
    (inter, Op::BlockAct { bk, dtype })
}

/// The work of a dot interaction or its gradient on forward operands `fwd`
/// (of all operands `ins`): `per·D` flops per kept pair of each sample, and
/// the bytes of every operand and result.
fn dot_work(
    (ins, fwd): (&[&TensorType], &[&TensorType]),
    outs: &[&TensorType],
    dim: &dyn Fn(&Dim) -> f64,
    (self_interaction, per): (bool, f64),
) -> Work {
    let numel = |t: &TensorType| t.shape.iter().map(dim).product::<f64>();
    let (s, d) = match fwd.first() {
        Some(x) if x.shape.len() == 2 => (dim(&x.shape[0]), dim(&x.shape[1])),
        _ => (0.0, 0.0),
    };
    let f = fwd.len() as f64;
    let pairs = match self_interaction {
        true => f * (f + 1.0) / 2.0,
        false => f * (f - 1.0) / 2.0,
    };
    Work {
        flops: per * s * d * pairs,
        bytes: ins
            .iter()
            .chain(outs)
            .map(|t| numel(t) * t.dtype.size_bytes() as f64)
            .sum(),
    }
}

impl OpModule for InteractionBlocked {
    fn mnemonic(&self) -> &'static str {
        MNEMONIC
    }

    fn attr_keys(&self) -> &'static [&'static str] {
        &["self", "bk", "dtype"]
    }

    fn check_attrs(&self, attrs: &[(&'static str, Attr)]) -> R<()> {
        for (k, a) in attrs {
            match (*k, a) {
                ("self", Attr::Bool(_)) => {}
                ("bk", Attr::Int(v)) if *v > 0 => {}
                ("bk", other) => return Err(format!("bk must be a positive integer, got {other}")),
                ("dtype", Attr::Ident(d)) if d == "f32" || d == "bf16" => {}
                ("dtype", other) => return Err(format!("dtype must be f32 or bf16, got {other}")),
                (k, other) => return Err(format!("{k} must be true or false, got {other}")),
            }
        }
        Ok(())
    }

    fn infer(&self, op: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
        let (inter, block) = parts(op);
        let r = crate::infer::infer(&inter, ins, &[]).map_err(|e| e.to_string())?;
        crate::infer::infer(&block, &[&r[0]], &[]).map_err(|e| e.to_string())
    }

    fn eval(&self, c: &Checked<'_>) -> R<Vec<Tensor>> {
        let Op::Module(m) = c.op() else {
            return Err(format!("internal: `{MNEMONIC}` is a module op"));
        };
        let (self_interaction, bk, dtype) = attrs_of(m);
        let ins = c.inputs();
        let mid = interaction_dtype(ins);
        let r = interaction_of(InteractionKind::Dot, self_interaction, ins, mid)?;
        Ok(vec![block_act(bk, &r, dtype)?])
    }

    fn work(
        &self,
        op: &ModOp,
        ins: &[&TensorType],
        outs: &[&TensorType],
        dim: &dyn Fn(&Dim) -> f64,
    ) -> Work {
        // `2·D` per kept pair of each sample (a multiply-add per column).
        dot_work((ins, ins), outs, dim, (attrs_of(op).0, 2.0))
    }

    fn backward(&self, _: &ModOp, _: &mut dyn GradCx) -> Result<()> {
        no_gradient(MNEMONIC)
    }

    fn decompose(
        &self,
        op: &ModOp,
        g: &mut DecomposeCx<'_>,
        ins: &[ValueId],
        names: &[&str],
    ) -> Result<Vec<ValueId>> {
        if ins.is_empty() {
            return Err(arity_error(g, MNEMONIC, 1, 0));
        }
        let (inter, block) = parts(op);
        let y = names.first().copied().unwrap_or("inter.blk");
        let r = g.add(inter, ins, &format!("{y}.rows"))?;
        Ok(vec![g.add(block, &[r], y)?])
    }

    no_onnx_form!();

    not_an_update!();
}

impl OpModule for InteractionGradBlocked {
    fn mnemonic(&self) -> &'static str {
        GRAD
    }

    fn attr_keys(&self) -> &'static [&'static str] {
        &["self"]
    }

    fn check_attrs(&self, attrs: &[(&'static str, Attr)]) -> R<()> {
        for (k, a) in attrs {
            match (*k, a) {
                ("self", Attr::Bool(_)) => {}
                (k, other) => return Err(format!("{k} must be true or false, got {other}")),
            }
        }
        Ok(())
    }

    fn infer(&self, op: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
        let Some((drb, fwd)) = ins.split_first() else {
            return Err(format!("`{GRAD}` needs drb and at least the dense operand"));
        };
        let self_interaction = grad_self(op);
        let width = width_of(fwd, self_interaction)
            .ok_or("interaction operands need one fixed feature width")?;
        let (unblock, grad) = grad_parts(self_interaction, width, drb.dtype);
        let dr = crate::infer::infer(&unblock, &[drb], &[]).map_err(|e| e.to_string())?;
        let mut operands = vec![&dr[0]];
        operands.extend_from_slice(fwd);
        crate::infer::infer(&grad, &operands, &[]).map_err(|e| e.to_string())
    }

    fn eval(&self, c: &Checked<'_>) -> R<Vec<Tensor>> {
        let Op::Module(m) = c.op() else {
            return Err(format!("internal: `{GRAD}` is a module op"));
        };
        let Some((drb, fwd)) = c.inputs().split_first() else {
            return Err(format!("internal: `{GRAD}` without operands"));
        };
        let self_interaction = grad_self(m);
        let d = fwd
            .first()
            .and_then(|t| t.shape.get(1))
            .copied()
            .unwrap_or(0);
        let width =
            crate::interaction_width(InteractionKind::Dot, self_interaction, &vec![d; fwd.len()]);
        let dr = unblock_act(width, drb, drb.dtype())?;
        let outs: Vec<DType> = (0..fwd.len()).map(|k| c.out(k).dtype).collect();
        interaction_grad_of(InteractionKind::Dot, self_interaction, &dr, fwd, &outs)
    }

    fn work(
        &self,
        op: &ModOp,
        ins: &[&TensorType],
        outs: &[&TensorType],
        dim: &dyn Fn(&Dim) -> f64,
    ) -> Work {
        // `4·D` per kept pair of each sample (a multiply-add per column into
        // each of the pair's two gradients), as `interaction_grad`.
        dot_work(
            (ins, ins.get(1..).unwrap_or(&[])),
            outs,
            dim,
            (grad_self(op), 4.0),
        )
    }

    fn backward(&self, _: &ModOp, _: &mut dyn GradCx) -> Result<()> {
        no_gradient(GRAD)
    }

    fn decompose(
        &self,
        op: &ModOp,
        g: &mut DecomposeCx<'_>,
        ins: &[ValueId],
        names: &[&str],
    ) -> Result<Vec<ValueId>> {
        if ins.len() < 2 {
            return Err(arity_error(g, GRAD, 2, ins.len()));
        }
        let self_interaction = grad_self(op);
        let fwd: Vec<TensorType> = ins[1..].iter().map(|&v| g.ty(v).clone()).collect();
        let refs: Vec<&TensorType> = fwd.iter().collect();
        let width = width_of(&refs, self_interaction).unwrap_or(0);
        let dtype = g.ty(ins[0]).dtype;
        let (unblock, grad) = grad_parts(self_interaction, width, dtype);
        let dr = g.add(unblock, &ins[..1], "d.inter.rows")?;
        let mut operands = vec![dr];
        operands.extend_from_slice(&ins[1..]);
        let names: Vec<String> = (0..ins.len() - 1)
            .map(|k| {
                names
                    .get(k)
                    .map_or_else(|| format!("d.op.{k}"), |n| n.to_string())
            })
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        g.add_node(grad, &operands, &refs)
    }

    no_onnx_form!();

    not_an_update!();
}
