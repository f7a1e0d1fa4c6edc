//! Shape and dtype inference of the shape ops (`concat`, `split`, `reshape`).
//! Same rules as `infer`: plain messages, the caller attaches the node.

use super::{R, expect_arity, expect_dim};
use crate::op::Op;
use crate::types::{Dim, Shape, TensorType};

/// The result types of `concat`, `split` or `reshape`.
pub(super) fn infer_shape_op(op: &Op, ins: &[&TensorType]) -> R<Vec<TensorType>> {
    match op {
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
        _ => Err(format!("internal: `{}` is not a shape op", op.mnemonic())),
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
