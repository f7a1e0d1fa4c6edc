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

use super::cross::{arity_error, no_gradient};
use crate::error::Result;
use crate::graph::ValueId;
use crate::instance::Checked;
use crate::interp::fused::block_act;
use crate::interp::interaction::interaction_of;
use crate::module::{DecomposeCx, GradCx, ModOp, OpModule, Work};
use crate::op::{Attr, InteractionKind, Op};
use crate::tensor::Tensor;
use crate::types::{DType, Dim, TensorType};

type R<T> = std::result::Result<T, String>;

/// The op (see the module docs).
pub struct InteractionBlocked;

/// Its mnemonic.
pub const MNEMONIC: &str = "interaction_blocked";

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

/// The two ops it composes.
fn parts(op: &ModOp) -> (Op, Op) {
    let (self_interaction, bk, dtype) = attrs_of(op);
    let inter = Op::Interaction {
        kind: InteractionKind::Dot,
        self_interaction,
    };
    (inter, Op::BlockAct { bk, dtype })
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
        // The interaction's own result dtype (`interaction`'s rule).
        let mid = match ins.iter().all(|t| t.dtype() == DType::BF16) {
            true => DType::BF16,
            false => DType::F32,
        };
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
        let numel = |t: &TensorType| t.shape.iter().map(dim).product::<f64>();
        // `2·D` per kept pair of each sample (a multiply-add per column).
        let (s, d) = match ins.first() {
            Some(x) if x.shape.len() == 2 => (dim(&x.shape[0]), dim(&x.shape[1])),
            _ => (0.0, 0.0),
        };
        let f = ins.len() as f64;
        let pairs = match attrs_of(op).0 {
            true => f * (f + 1.0) / 2.0,
            false => f * (f - 1.0) / 2.0,
        };
        Work {
            flops: 2.0 * s * d * pairs,
            bytes: ins
                .iter()
                .chain(outs)
                .map(|t| numel(t) * t.dtype.size_bytes() as f64)
                .sum(),
        }
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
