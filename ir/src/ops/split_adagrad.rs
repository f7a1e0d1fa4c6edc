//! Split-Adagrad: Adagrad on a Split-SGD-BF16 parameter (issue 43), the
//! optimizer of bf16 models trained by Adagrad (MLPerf DLRM-DCNv2: row-wise
//! Adagrad for the tables, Adagrad for the MLPs).
//!
//! A split parameter is the f32 master `w = f32(hi << 16 | lo)`: `hi` is the bf16
//! weight the model computes with, `lo` (bf16-typed raw bits) its low 16 bits.
//! Adagrad's accumulator stays f32. Each op joins the master, runs the f32
//! Adagrad update of [`Op`] on it with exactly that op's float operations, and
//! splits the master again (exact: no rounding), so the joined results are bit
//! for bit the f32 update's.
//!
//! - `split_adagrad {lr, eps, wd, rowwise}(hi, lo, acc, g) -> (hi', lo', acc')`:
//!   [`Op::Adagrad`] (`torch.optim.Adagrad`, `lr_decay = 0`; `wd` folded into the
//!   gradient as `g + wd·w` with the master `w`) on the master. `hi`, `lo` bf16 of
//!   one shape, `acc` f32 shaped like them (`[R]` for `rowwise`, `hi[R, D]`), `g`
//!   f32 or bf16 shaped like `hi`.
//! - `split_embedding_update_adagrad {mode, lr, eps, rowwise, lo, rows}(hi, lo,
//!   acc, dy, indices[, offsets]) -> (hi', lo', acc')`:
//!   [`Op::EmbeddingUpdateAdagradRows`] (the fused row-wise or elementwise
//!   Adagrad update of the rows the bags touch) on the master of the row shard
//!   `lo .. lo+Rs` of a table of `rows` rows; `lo = 0`, `rows = R` is the whole
//!   table, [`Op::EmbeddingUpdateAdagrad`]. Bags as that op takes them: fixed
//!   `indices[S, L]`, or `indices[N]` with `offsets[S]`. Untouched rows (and
//!   their accumulators) are unchanged.
//!
//! Both are optimizer updates ([`OpModule::update`]): operands 0..3 are updated
//! in place (the parameter, its low half, its accumulator); no gradient, no
//! decomposition into primitive ops.

use super::cross::{arity_error, no_gradient};
use crate::error::{IrError, Result};
use crate::graph::{Graph, ValueId};
use crate::instance::Checked;
use crate::interp::{EvalCtx, eval_op};
use crate::module::{DecomposeCx, GradCx, ModOp, OpModule, OptimizerUpdate, UpdateGrad, Work};
use crate::op::{AdagradHyper, Attr, Op, Pool, State};
use crate::tensor::{Data, Tensor};
use crate::types::{DType, Dim, TensorType};
use half::bf16;
use std::collections::HashMap;

type R<T> = std::result::Result<T, String>;

/// The dense update `split_adagrad` (see the module docs).
pub struct SplitAdagrad;

/// The fused table update `split_embedding_update_adagrad` (see the module docs).
pub struct SplitEmbeddingUpdateAdagrad;

/// The dense update's mnemonic.
pub const DENSE: &str = "split_adagrad";

/// The table update's mnemonic.
pub const TABLE: &str = "split_embedding_update_adagrad";

/// The f32 master of a split element: `hi << 16 | lo`.
#[inline(always)]
pub fn join1(hi: bf16, lo: bf16) -> f32 {
    f32::from_bits((u32::from(hi.to_bits()) << 16) | u32::from(lo.to_bits()))
}

/// The halves `(hi, lo)` of an f32 master (exact).
#[inline(always)]
pub fn split1(w: f32) -> (bf16, bf16) {
    let b = w.to_bits();
    (bf16::from_bits((b >> 16) as u16), bf16::from_bits(b as u16))
}

/// A `split_adagrad` op.
pub fn split_adagrad(h: AdagradHyper, wd: f32) -> Op {
    let attrs = vec![
        ("lr", Attr::Float(h.lr)),
        ("eps", Attr::Float(h.eps)),
        ("wd", Attr::Float(wd)),
        ("rowwise", Attr::Bool(h.rowwise)),
    ];
    built(ModOp::new(&SplitAdagrad, attrs))
}

/// A `split_embedding_update_adagrad` op on the rows `lo .. lo+Rs` of a table
/// of `rows` rows.
pub fn split_embedding_update_adagrad(mode: Pool, h: AdagradHyper, lo: usize, rows: usize) -> Op {
    let mode = match mode {
        Pool::Sum => "sum",
        Pool::Mean => "mean",
    };
    let attrs = vec![
        ("mode", Attr::Ident(mode.into())),
        ("lr", Attr::Float(h.lr)),
        ("eps", Attr::Float(h.eps)),
        ("rowwise", Attr::Bool(h.rowwise)),
        ("lo", Attr::Int(lo as i64)),
        ("rows", Attr::Int(rows as i64)),
    ];
    built(ModOp::new(&SplitEmbeddingUpdateAdagrad, attrs))
}

fn built(m: R<ModOp>) -> Op {
    match m {
        Ok(m) => Op::Module(m),
        Err(e) => unreachable!("valid attributes: {e}"),
    }
}

fn float(m: &ModOp, key: &str) -> f32 {
    match m.attr(key) {
        Some(Attr::Float(v)) => *v,
        _ => 0.0,
    }
}

fn int(m: &ModOp, key: &str) -> usize {
    match m.attr(key) {
        Some(Attr::Int(v)) => usize::try_from(*v).unwrap_or(0),
        _ => 0,
    }
}

fn hyper(m: &ModOp) -> AdagradHyper {
    AdagradHyper {
        lr: float(m, "lr"),
        eps: float(m, "eps"),
        rowwise: matches!(m.attr("rowwise"), Some(Attr::Bool(true))),
    }
}

/// The hyper-parameters and the weight decay of a `split_adagrad` op.
pub fn dense_attrs(m: &ModOp) -> (AdagradHyper, f32) {
    (hyper(m), float(m, "wd"))
}

/// The pooling, hyper-parameters and row shard `(lo, rows)` of a
/// `split_embedding_update_adagrad` op.
pub fn table_attrs(m: &ModOp) -> (Pool, AdagradHyper, (usize, usize)) {
    let mode = match m.attr("mode") {
        Some(Attr::Ident(s)) if s == "mean" => Pool::Mean,
        _ => Pool::Sum,
    };
    (mode, hyper(m), (int(m, "lo"), int(m, "rows")))
}

/// The f32 update of [`Op`] this op runs on the joined master.
fn plain_op(m: &ModOp) -> Op {
    if m.mnemonic() == DENSE {
        let (h, wd) = dense_attrs(m);
        Op::Adagrad {
            lr: h.lr,
            eps: h.eps,
            wd,
            rowwise: h.rowwise,
        }
    } else {
        let (mode, h, (lo, rows)) = table_attrs(m);
        Op::EmbeddingUpdateAdagradRows {
            mode,
            lr: h.lr,
            eps: h.eps,
            rowwise: h.rowwise,
            lo,
            rows,
        }
    }
}

fn check(attrs: &[(&'static str, Attr)]) -> R<()> {
    for (k, a) in attrs {
        match (*k, a) {
            ("lr" | "eps" | "wd", Attr::Float(_)) | ("rowwise", Attr::Bool(_)) => {}
            ("mode", Attr::Ident(m)) if m == "sum" || m == "mean" => {}
            ("lo" | "rows", Attr::Int(v)) if *v >= 0 => {}
            ("mode", other) => return Err(format!("mode must be sum or mean, got {other}")),
            ("rowwise", other) => {
                return Err(format!("rowwise must be true or false, got {other}"));
            }
            ("lo" | "rows", other) => {
                return Err(format!("{k} must be a row count (>= 0), got {other}"));
            }
            (k, other) => return Err(format!("{k} must be a float, got {other}")),
        }
    }
    Ok(())
}

/// The shape rule: `hi`, `lo` bf16 of one shape, then the f32 update's rule on
/// the master (an f32 `hi`) and the other operands.
fn infer(m: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    let arity = if m.mnemonic() == DENSE { 4..=4 } else { 5..=6 };
    if !arity.contains(&ins.len()) {
        let what = if m.mnemonic() == DENSE {
            "4 operands (hi, lo, acc, g)"
        } else {
            "5 or 6 operands (hi, lo, acc, dy, indices[, offsets])"
        };
        return Err(format!(
            "`{}` takes {what}, got {}",
            m.mnemonic(),
            ins.len()
        ));
    }
    let (hi, lo) = (ins[0], ins[1]);
    if hi.dtype != DType::BF16 || lo.dtype != DType::BF16 {
        return Err(format!("hi and lo must be bf16, got {hi} and {lo}"));
    }
    if hi.shape != lo.shape {
        return Err(format!("hi {hi} and lo {lo} must have the same shape"));
    }
    let master = hi.with_dtype(DType::F32);
    let mut f32_ins: Vec<&TensorType> = vec![&master];
    f32_ins.extend_from_slice(&ins[2..]);
    let out = crate::infer::infer(&plain_op(m), &f32_ins, &[]).map_err(|e| e.to_string())?;
    Ok(vec![hi.clone(), lo.clone(), out[1].clone()])
}

/// The interpreter: join, the f32 update's interpreter, split.
fn eval(c: &Checked<'_>) -> R<Vec<Tensor>> {
    let Op::Module(m) = c.op() else {
        return Err("a split Adagrad update evaluated for another op".into());
    };
    let (Data::BF16(hi), Data::BF16(lo)) = (&c.input(0).data, &c.input(1).data) else {
        return Err("hi and lo are not bf16".into());
    };
    let shape = c.in_shape(0).to_vec();
    let master = Tensor::f32(
        shape.clone(),
        hi.iter().zip(lo).map(|(&h, &l)| join1(h, l)).collect(),
    );
    let mut operands: Vec<&Tensor> = vec![&master];
    operands.extend_from_slice(&c.inputs()[2..]);
    let fixed =
        |k: usize, dtype| TensorType::new(dtype, c.out(k).shape.iter().map(|&n| Dim::Fixed(n)));
    let outs = [fixed(0, DType::F32), fixed(2, DType::F32)];
    let syms = HashMap::new();
    let ctx = EvalCtx {
        syms: &syms,
        comm: &crate::SingleRank,
    };
    let mut res = eval_op(&plain_op(m), &operands, &outs, &ctx)?;
    let acc = res.pop().ok_or("no accumulator result")?;
    let w = res.pop().ok_or("no weight result")?;
    let Data::F32(w) = w.data else {
        return Err("the master's update is not f32".into());
    };
    let (h, l): (Vec<bf16>, Vec<bf16>) = w.into_iter().map(split1).unzip();
    Ok(vec![
        Tensor::bf16(shape.clone(), h),
        Tensor::bf16(shape, l),
        acc,
    ])
}

fn work(m: &ModOp, ins: &[&TensorType], outs: &[&TensorType], dim: &dyn Fn(&Dim) -> f64) -> Work {
    let numel = |t: &TensorType| t.shape.iter().map(dim).product::<f64>();
    let bytes = |t: &&TensorType| numel(t) * t.dtype.size_bytes() as f64;
    // Per updated element: join, square-add, root, add, divide, multiply,
    // subtract, split (the table update: per index position and column).
    let flops = if m.mnemonic() == DENSE {
        ins.first().map_or(0.0, |t| 7.0 * numel(t))
    } else {
        let d = ins.first().and_then(|t| t.shape.get(1)).map_or(0.0, dim);
        ins.get(4).map_or(0.0, |t| 7.0 * numel(t) * d)
    };
    Work {
        flops,
        bytes: ins.iter().chain(outs).map(bytes).sum(),
    }
}

fn update(m: &ModOp) -> OptimizerUpdate {
    let grad = if m.mnemonic() == DENSE {
        UpdateGrad::Dense(3)
    } else {
        let (mode, _, (lo, rows)) = table_attrs(m);
        UpdateGrad::Bags { mode, lo, rows }
    };
    OptimizerUpdate {
        lr: float(m, "lr"),
        states: vec![State::LowHalf, State::Accumulator],
        grad,
    }
}

fn no_decomposition(g: &Graph, op: &str) -> IrError {
    IrError::Graph {
        graph: g.name.clone(),
        reason: format!(
            "`{op}` is an optimizer update: it has no decomposition into primitive ops"
        ),
    }
}

/// The `OpModule` methods the two ops share (the functions above, by mnemonic).
macro_rules! split_update {
    ($mn:expr, $keys:expr, $n:expr) => {
        fn mnemonic(&self) -> &'static str {
            $mn
        }

        fn attr_keys(&self) -> &'static [&'static str] {
            $keys
        }

        fn check_attrs(&self, attrs: &[(&'static str, Attr)]) -> R<()> {
            check(attrs)
        }

        fn infer(&self, op: &ModOp, ins: &[&TensorType]) -> R<Vec<TensorType>> {
            infer(op, ins)
        }

        fn eval(&self, c: &Checked<'_>) -> R<Vec<Tensor>> {
            eval(c)
        }

        fn work(
            &self,
            op: &ModOp,
            ins: &[&TensorType],
            outs: &[&TensorType],
            dim: &dyn Fn(&Dim) -> f64,
        ) -> Work {
            work(op, ins, outs, dim)
        }

        fn backward(&self, _: &ModOp, _: &mut dyn GradCx) -> Result<()> {
            no_gradient($mn)
        }

        fn decompose(
            &self,
            _: &ModOp,
            g: &mut DecomposeCx<'_>,
            ins: &[ValueId],
            _: &[&str],
        ) -> Result<Vec<ValueId>> {
            if ins.len() < $n {
                return Err(arity_error(g, $mn, $n, ins.len()));
            }
            Err(no_decomposition(g, $mn))
        }

        no_onnx_form!();

        fn update(&self, op: &ModOp) -> Option<OptimizerUpdate> {
            Some(update(op))
        }
    };
}

impl OpModule for SplitAdagrad {
    split_update!(DENSE, &["lr", "eps", "wd", "rowwise"], 4);
}

impl OpModule for SplitEmbeddingUpdateAdagrad {
    split_update!(TABLE, &["mode", "lr", "eps", "rowwise", "lo", "rows"], 5);
}
