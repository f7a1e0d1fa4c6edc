//! Shape and dtype inference: the result types of every op from its operand types.
//!
//! [`infer`] is the single source of truth used by the graph builder and the
//! verifier. Errors are plain messages; callers attach the node.

use crate::dim::DimExpr;
use crate::op::family::{fused_ops, generic_ops};
use crate::op::{A2aDir, InteractionKind, Op};
use crate::types::{DType, Dim, Shape, TensorType};

mod fused;
mod generic;
mod optim;

use fused::{fixed_dim, infer_fused};

type R<T> = Result<T, String>;

fn expect_arity(op: &Op, ins: &[&TensorType], allowed: &[usize]) -> R<()> {
    if allowed.contains(&ins.len()) {
        return Ok(());
    }
    let want: Vec<String> = allowed.iter().map(|n| n.to_string()).collect();
    Err(format!(
        "`{}` takes {} operands, got {}",
        op.mnemonic(),
        want.join(" or "),
        ins.len()
    ))
}

fn expect_rank(what: &str, t: &TensorType, rank: usize) -> R<()> {
    if t.rank() == rank {
        Ok(())
    } else {
        Err(format!("{what} must have rank {rank}, got {t}"))
    }
}

fn expect_float(what: &str, t: &TensorType) -> R<()> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("{what} must be f32 or bf16, got {t}"))
    }
}

fn expect_int(what: &str, t: &TensorType) -> R<()> {
    if t.dtype.is_int() {
        Ok(())
    } else {
        Err(format!("{what} must be i64 or i32, got {t}"))
    }
}

fn expect_dim(what: &str, got: &Dim, want: &Dim) -> R<()> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: expected {want}, got {got}"))
    }
}

fn expect_same_shape(a_what: &str, a: &TensorType, b_what: &str, b: &TensorType) -> R<()> {
    if a.shape == b.shape {
        Ok(())
    } else {
        Err(format!(
            "{a_what} {a} and {b_what} {b} must have the same shape"
        ))
    }
}

/// The f32 result type of a computation over operands of these dtypes: bf16 only
/// when every float operand is bf16.
fn float_result(ts: &[&TensorType]) -> DType {
    if ts
        .iter()
        .filter(|t| t.dtype.is_float())
        .all(|t| t.dtype == DType::BF16)
    {
        DType::BF16
    } else {
        DType::F32
    }
}

/// Symbolic element count: the product of the dimensions as an expression (`None`
/// on overflow).
fn symbolic_numel(shape: &Shape) -> Option<crate::DimExpr> {
    let mut n = crate::DimExpr::int(1);
    for d in shape {
        n = n.mul(&d.to_expr())?;
    }
    Some(n)
}

/// Width of the interaction output for `f` vectors of dimension `d` (saturating:
/// absurd widths give `usize::MAX` rather than overflowing).
pub fn interaction_width(kind: InteractionKind, self_interaction: bool, widths: &[usize]) -> usize {
    match kind {
        InteractionKind::Cat => widths.iter().fold(0usize, |a, &w| a.saturating_add(w)),
        InteractionKind::Dot => {
            let f = widths.len();
            let pairs = if self_interaction {
                f * (f + 1) / 2
            } else {
                f * (f - 1) / 2
            };
            widths[0].saturating_add(pairs)
        }
    }
}

/// The number of bags of an offsets vector of length `len`: `len`, or `len - 1`
/// with `last_offset` (the last entry ends the last bag).
fn bag_count(len: &Dim, last_offset: bool) -> R<Dim> {
    if !last_offset {
        return Ok(len.clone());
    }
    len.to_expr()
        .sub(&DimExpr::int(1))
        .and_then(Dim::from_expr)
        .ok_or_else(|| {
            format!(
                "offsets of length {len} with last_offset need at least one entry (the end of the last bag)"
            )
        })
}

/// Refuses `indices[N]` with empty `offsets` (no bags) when `N > 0`: indices no
/// bag holds. Checked when both lengths are known (always on an instance).
fn expect_bags(indices: &TensorType, offsets: &TensorType) -> R<()> {
    match (indices.shape.first(), offsets.shape.first()) {
        (Some(Dim::Fixed(n)), Some(Dim::Fixed(0))) if *n > 0 => {
            Err(format!("{n} indices but no bags (offsets is empty)"))
        }
        _ => Ok(()),
    }
}

/// Infers the result types of `op` applied to operands of types `ins`.
///
/// `declared` is the list of result types written in the graph; it is consulted
/// only by ops whose results cannot be derived from this rank's operands
/// ([`Op::AllToAll`] scatter: the other ranks' tensors), and checked against what
/// can be derived.
pub fn infer(op: &Op, ins: &[&TensorType], declared: &[TensorType]) -> R<Vec<TensorType>> {
    match op {
        Op::Module(m) => m.def().infer(m, ins),
        Op::EmbeddingBag { last_offset, .. } => {
            expect_arity(op, ins, if *last_offset { &[3] } else { &[2, 3] })?;
            let table = ins[0];
            expect_rank("table", table, 2)?;
            expect_float("table", table)?;
            expect_int("indices", ins[1])?;
            let d = table.shape[1].clone();
            let s = if ins.len() == 2 {
                expect_rank("indices (fixed pooling)", ins[1], 2)?;
                ins[1].shape[0].clone()
            } else {
                expect_rank("indices (with offsets)", ins[1], 1)?;
                expect_int("offsets", ins[2])?;
                expect_rank("offsets", ins[2], 1)?;
                if !*last_offset {
                    expect_bags(ins[1], ins[2])?;
                }
                bag_count(&ins[2].shape[0], *last_offset)?
            };
            Ok(vec![TensorType::new(table.dtype, [s, d])])
        }
        Op::EmbeddingBagGrad { last_offset, .. } => {
            expect_arity(op, ins, if *last_offset { &[3, 4] } else { &[2, 3, 4] })?;
            let dy = ins[0];
            expect_rank("dy", dy, 2)?;
            expect_float("dy", dy)?;
            expect_int("indices", ins[1])?;
            let d = dy.shape[1].clone();
            if ins.len() == 2 {
                expect_rank("indices (fixed pooling)", ins[1], 2)?;
                expect_dim("indices samples", &ins[1].shape[0], &dy.shape[0])?;
                let mut shape = ins[1].shape.clone();
                shape.push(d);
                Ok(vec![TensorType::new(DType::F32, shape)])
            } else {
                expect_rank("indices (with offsets)", ins[1], 1)?;
                expect_rank("offsets", ins[2], 1)?;
                expect_int("offsets", ins[2])?;
                if !*last_offset {
                    expect_bags(ins[1], ins[2])?;
                }
                let s = bag_count(&ins[2].shape[0], *last_offset)?;
                expect_dim("offsets samples", &s, &dy.shape[0])?;
                if let Some(w) = ins.get(3) {
                    if matches!(
                        op,
                        Op::EmbeddingBagGrad {
                            mode: crate::Pool::Mean,
                            ..
                        }
                    ) {
                        return Err("per-sample weights need mode sum".into());
                    }
                    expect_rank("weights", w, 1)?;
                    expect_float("weights", w)?;
                    expect_dim("weights", &w.shape[0], &ins[1].shape[0])?;
                }
                Ok(vec![TensorType::new(
                    DType::F32,
                    [ins[1].shape[0].clone(), d],
                )])
            }
        }
        Op::Linear { .. } => {
            expect_arity(op, ins, &[3])?;
            let (x, w, b) = (ins[0], ins[1], ins[2]);
            expect_rank("x", x, 2)?;
            expect_rank("weight", w, 2)?;
            expect_rank("bias", b, 1)?;
            for (n, t) in [("x", x), ("weight", w), ("bias", b)] {
                expect_float(n, t)?;
            }
            expect_dim("x features vs weight columns", &x.shape[1], &w.shape[1])?;
            expect_dim("bias length vs weight rows", &b.shape[0], &w.shape[0])?;
            Ok(vec![TensorType::new(
                float_result(&[x, w]),
                [x.shape[0].clone(), w.shape[0].clone()],
            )])
        }
        Op::Relu | Op::Sigmoid | Op::Gelu => {
            expect_arity(op, ins, &[1])?;
            expect_float("operand", ins[0])?;
            Ok(vec![ins[0].clone()])
        }
        Op::Add => {
            expect_arity(op, ins, &[2])?;
            expect_float("a", ins[0])?;
            expect_float("b", ins[1])?;
            expect_same_shape("a", ins[0], "b", ins[1])?;
            Ok(vec![TensorType::new(
                float_result(ins),
                ins[0].shape.clone(),
            )])
        }
        Op::ReluGrad | Op::SigmoidGrad | Op::GeluGrad => {
            // relu_grad and sigmoid_grad read the forward output, gelu_grad its input.
            let fwd = if *op == Op::GeluGrad { "x" } else { "y" };
            expect_arity(op, ins, &[2])?;
            expect_float("dy", ins[0])?;
            expect_float(fwd, ins[1])?;
            expect_same_shape("dy", ins[0], fwd, ins[1])?;
            Ok(vec![ins[0].clone()])
        }
        Op::Interaction {
            kind,
            self_interaction,
        } => {
            if ins.is_empty() {
                return Err("`interaction` needs at least the dense operand".into());
            }
            let widths = interaction_operands(ins, *kind)?;
            let w = widths.map(|ws| interaction_width(*kind, *self_interaction, &ws));
            let width = match w {
                Some(w) => Dim::Fixed(w),
                None => return Err("interaction operands need fixed feature widths".into()),
            };
            Ok(vec![TensorType::new(
                float_result(ins),
                [ins[0].shape[0].clone(), width],
            )])
        }
        Op::InteractionGrad {
            kind,
            self_interaction,
        } => {
            if ins.len() < 2 {
                return Err("`interaction_grad` needs dr and at least the dense operand".into());
            }
            let fwd = &ins[1..];
            let widths = interaction_operands(fwd, *kind)?
                .ok_or("interaction operands need fixed feature widths")?;
            let width = interaction_width(*kind, *self_interaction, &widths);
            let dr = ins[0];
            expect_rank("dr", dr, 2)?;
            expect_dim("dr samples", &dr.shape[0], &fwd[0].shape[0])?;
            expect_dim("dr width", &dr.shape[1], &Dim::Fixed(width))?;
            Ok(fwd.iter().map(|t| t.with_dtype(DType::F32)).collect())
        }
        Op::Concat { axis } => {
            if ins.is_empty() {
                return Err("`concat` needs at least one operand".into());
            }
            let first = ins[0];
            if *axis >= first.rank() {
                return Err(format!("axis {axis} out of range for {first}"));
            }
            let mut total = 0usize;
            for (i, t) in ins.iter().enumerate() {
                if t.rank() != first.rank() || t.dtype != first.dtype {
                    return Err(format!("operand {i} {t} does not match operand 0 {first}"));
                }
                for (k, (a, b)) in t.shape.iter().zip(&first.shape).enumerate() {
                    if k != *axis && a != b {
                        return Err(format!("operand {i} {t} differs from {first} in axis {k}"));
                    }
                }
                let w = t.shape[*axis].fixed().ok_or_else(|| {
                    format!("concat axis {axis} of operand {i} {t} must be fixed")
                })?;
                total = total
                    .checked_add(w)
                    .ok_or_else(|| format!("concat axis {axis} length overflows"))?;
            }
            let mut shape = first.shape.clone();
            shape[*axis] = Dim::Fixed(total);
            Ok(vec![TensorType::new(first.dtype, shape)])
        }
        Op::Split { axis, sizes } => {
            expect_arity(op, ins, &[1])?;
            let x = ins[0];
            if *axis >= x.rank() {
                return Err(format!("axis {axis} out of range for {x}"));
            }
            let sum = sizes
                .iter()
                .try_fold(0usize, |a, &s| a.checked_add(s))
                .ok_or("split sizes overflow")?;
            expect_dim("sum of split sizes", &Dim::Fixed(sum), &x.shape[*axis])?;
            Ok(sizes
                .iter()
                .map(|&s| {
                    let mut shape = x.shape.clone();
                    shape[*axis] = Dim::Fixed(s);
                    TensorType::new(x.dtype, shape)
                })
                .collect())
        }
        Op::Reshape { shape } => {
            expect_arity(op, ins, &[1])?;
            let x = ins[0];
            let (a, b) = (symbolic_numel(&x.shape), symbolic_numel(shape));
            if a.is_none() || a != b {
                let t = TensorType::new(x.dtype, shape.clone());
                return Err(format!("cannot reshape {x} to {t}: element counts differ"));
            }
            Ok(vec![TensorType::new(x.dtype, shape.clone())])
        }
        Op::Bce { .. } | Op::Mse { .. } => {
            expect_arity(op, ins, &[2])?;
            expect_float("prediction", ins[0])?;
            expect_float("label", ins[1])?;
            expect_same_shape("prediction", ins[0], "label", ins[1])?;
            Ok(vec![TensorType::scalar_f32()])
        }
        Op::BceGrad { .. } | Op::MseGrad { .. } => {
            expect_arity(op, ins, &[2])?;
            expect_float("prediction", ins[0])?;
            expect_float("label", ins[1])?;
            expect_same_shape("prediction", ins[0], "label", ins[1])?;
            Ok(vec![ins[0].with_dtype(DType::F32)])
        }
        Op::LinearDx => {
            expect_arity(op, ins, &[2])?;
            let (dz, w) = (ins[0], ins[1]);
            expect_rank("dz", dz, 2)?;
            expect_rank("weight", w, 2)?;
            expect_dim("dz width vs weight rows", &dz.shape[1], &w.shape[0])?;
            Ok(vec![TensorType::new(
                DType::F32,
                [dz.shape[0].clone(), w.shape[1].clone()],
            )])
        }
        Op::LinearDw => {
            expect_arity(op, ins, &[2])?;
            let (dz, x) = (ins[0], ins[1]);
            expect_rank("dz", dz, 2)?;
            expect_rank("x", x, 2)?;
            expect_dim("dz vs x samples", &dz.shape[0], &x.shape[0])?;
            Ok(vec![TensorType::new(
                DType::F32,
                [dz.shape[1].clone(), x.shape[1].clone()],
            )])
        }
        Op::LinearDb => {
            expect_arity(op, ins, &[1])?;
            expect_rank("dz", ins[0], 2)?;
            Ok(vec![TensorType::new(DType::F32, [ins[0].shape[1].clone()])])
        }
        Op::Sgd { .. } => {
            expect_arity(op, ins, &[2])?;
            expect_float("weight", ins[0])?;
            expect_float("gradient", ins[1])?;
            expect_same_shape("weight", ins[0], "gradient", ins[1])?;
            Ok(vec![ins[0].clone()])
        }
        Op::SparseSgd { .. } => {
            expect_arity(op, ins, &[3, 4])?;
            let (table, idx, g) = (ins[0], ins[1], ins[2]);
            if let Some(b) = ins.get(3) {
                optim::bag_bounds(idx, b)?;
            }
            expect_rank("table", table, 2)?;
            expect_float("table", table)?;
            expect_int("indices", idx)?;
            let mut want = idx.shape.clone();
            want.push(table.shape[1].clone());
            if g.shape != want {
                return Err(format!(
                    "row gradient {g} must have shape [{}] (indices shape then the table width)",
                    want.iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ));
            }
            Ok(vec![table.clone()])
        }
        Op::Adagrad { .. }
        | Op::SparseAdagrad { .. }
        | Op::EmbeddingUpdateAdagrad { .. }
        | Op::EmbeddingUpdateAdagradRows { .. } => optim::infer_adagrad(op, ins),
        Op::AllReduce => {
            for (i, t) in ins.iter().enumerate() {
                if t.dtype != DType::F32 {
                    return Err(format!("all_reduce operand {i} must be f32, got {t}"));
                }
            }
            Ok(ins.iter().map(|t| (*t).clone()).collect())
        }
        Op::AllToAll { dir, counts, rank } => infer_all_to_all(*dir, counts, *rank, ins, declared),
        // ---- fused / blocked ops (e-graph, precision)
        fused_ops!() => infer_fused(op, ins),
        // ---- sharded embeddings
        Op::EmbeddingBagRows { mode, lo, rows } => {
            shard_range(op, ins, *lo, *rows)?;
            infer(
                &Op::EmbeddingBag {
                    mode: *mode,
                    last_offset: false,
                },
                ins,
                declared,
            )
        }
        Op::SparseSgdRows { lr, lo, rows } => {
            shard_range(op, ins, *lo, *rows)?;
            infer(&Op::SparseSgd { lr: *lr }, ins, declared)
        }
        Op::EmbeddingUpdateRows { mode, lr, lo, rows } => {
            shard_range(op, ins, *lo, *rows)?;
            let fused = Op::EmbeddingUpdate {
                mode: *mode,
                lr: *lr,
            };
            infer_fused(&fused, ins)
        }
        Op::SplitEmbeddingUpdateRows { mode, lr, lo, rows } => {
            shard_range(op, ins, *lo, *rows)?;
            let fused = Op::SplitEmbeddingUpdate {
                mode: *mode,
                lr: *lr,
            };
            infer(&fused, ins, declared)
        }
        Op::EmbeddingGradDense { mode, rows } => {
            infer(
                &Op::EmbeddingBagGrad {
                    mode: *mode,
                    last_offset: false,
                },
                ins,
                declared,
            )?;
            let d = ins[0].shape[1].clone();
            Ok(vec![TensorType::new(DType::F32, [Dim::Fixed(*rows), d])])
        }
        // ---- generic ops (ONNX import)
        generic_ops!() | Op::OffsetsFromLengths { .. } => generic::infer_generic(op, ins),
    }
}

// ---- sharded embeddings

/// Checks that a shard (operand 0, `[Rs, D]`) holds rows `lo .. lo+Rs` of a table of
/// `rows` rows.
fn shard_range(op: &Op, ins: &[&TensorType], lo: usize, rows: usize) -> R<()> {
    let Some(shard) = ins.first() else {
        return Err(format!(
            "`{}` needs the table shard as operand 0",
            op.mnemonic()
        ));
    };
    expect_rank("table shard", shard, 2)?;
    let rs = fixed_dim("the table shard's rows", &shard.shape[0])?;
    if lo.checked_add(rs).is_none_or(|hi| hi > rows) {
        return Err(format!(
            "the shard {shard} starting at row {lo} does not fit a table of {rows} rows"
        ));
    }
    Ok(())
}

/// Checks interaction operands; returns the feature widths when all are fixed.
fn interaction_operands(ins: &[&TensorType], kind: InteractionKind) -> R<Option<Vec<usize>>> {
    let s = &ins[0]
        .shape
        .first()
        .cloned()
        .ok_or("interaction operands must have rank 2")?;
    let mut widths = Vec::with_capacity(ins.len());
    for (i, t) in ins.iter().enumerate() {
        expect_rank(&format!("interaction operand {i}"), t, 2)?;
        expect_float(&format!("interaction operand {i}"), t)?;
        expect_dim(&format!("interaction operand {i} samples"), &t.shape[0], s)?;
        match t.shape[1].fixed() {
            Some(w) => widths.push(w),
            None => return Ok(None),
        }
    }
    if kind == InteractionKind::Dot && widths.iter().any(|&w| w != widths[0]) {
        return Err(format!(
            "dot interaction needs equal widths (bottom MLP output = embedding dim), got {widths:?}"
        ));
    }
    Ok(Some(widths))
}

fn infer_all_to_all(
    dir: A2aDir,
    counts: &[usize],
    rank: usize,
    ins: &[&TensorType],
    declared: &[TensorType],
) -> R<Vec<TensorType>> {
    if rank >= counts.len() {
        return Err(format!(
            "rank {rank} out of range for {} ranks",
            counts.len()
        ));
    }
    let total = counts
        .iter()
        .try_fold(0usize, |a, &c| a.checked_add(c))
        .ok_or("all_to_all counts overflow")?;
    let own_start: usize = counts[..rank].iter().sum();
    let own = counts[rank];
    let (n_in, n_out, from, to) = match dir {
        A2aDir::Scatter => (own, total, Dim::global(), Dim::batch()),
        A2aDir::Gather => (total, own, Dim::batch(), Dim::global()),
    };
    if ins.len() != n_in {
        return Err(format!(
            "all_to_all {dir:?} on rank {rank} takes {n_in} operands, got {}",
            ins.len()
        ));
    }
    for (i, t) in ins.iter().enumerate() {
        if t.shape.first() != Some(&from) {
            return Err(format!(
                "all_to_all operand {i} {t} must have leading dimension {from}"
            ));
        }
    }
    let retag = |t: &TensorType, d: &Dim| {
        let mut t = t.clone();
        t.shape[0] = d.clone();
        t
    };
    match dir {
        A2aDir::Scatter => {
            if declared.len() != n_out {
                return Err(format!(
                    "all_to_all scatter must declare {n_out} result types (the owners' tensors), got {}",
                    declared.len()
                ));
            }
            for (i, t) in declared.iter().enumerate() {
                if t.shape.first() != Some(&to) {
                    return Err(format!(
                        "all_to_all result {i} {t} must have leading dimension {to}"
                    ));
                }
            }
            for k in 0..own {
                let want = retag(ins[k], &to);
                if declared[own_start + k] != want {
                    return Err(format!(
                        "all_to_all result {} is this rank's operand {k}: expected {want}, got {}",
                        own_start + k,
                        declared[own_start + k]
                    ));
                }
            }
            Ok(declared.to_vec())
        }
        A2aDir::Gather => Ok((0..own).map(|k| retag(ins[own_start + k], &to)).collect()),
    }
}
