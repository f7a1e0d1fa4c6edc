//! Node instances: an op with the concrete types of its operands and results,
//! verified once by [`infer`], so the kernels and the interpreter take checked
//! shapes instead of re-deriving the op's shape rule.
//!
//! - [`NodeInstance::new`] resolves a node's declared operand types under a symbol
//!   binding (a batch size), runs [`infer`] on the concrete types and checks the
//!   declared results against what it derives: the runtime builds one per node
//!   when a plan is instantiated for a binding, and keeps it while the binding
//!   holds. [`NodeInstance::of_operands`] does the same from the operands' own
//!   shapes (a call outside a plan: tests, benches, a node whose shapes vary per
//!   call).
//! - [`NodeInstance::bind`] is the one check of each call, at the boundary to the
//!   kernels (generated or `unsafe` code among them): every operand's dtype and
//!   shape equal the instance's, and every buffer holds exactly its shape's
//!   element count. It is O(rank) per operand and stays in release builds. The
//!   resulting [`Checked`] is the only way to reach a kernel, so a kernel reads its
//!   dims from it without checking them again.
//!
//! What stays with the kernels is what depends on the data: an index outside its
//! table, offsets that do not partition the indices, a NaN policy.

use crate::infer::infer;
use crate::op::Op;
use crate::tensor::Tensor;
use crate::types::{DType, Dim, TensorType};
use std::collections::HashMap;

/// A concrete tensor type: an element type and fixed dimensions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Concrete {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
}

impl Concrete {
    /// The number of elements (saturating: a shape whose count overflows matches
    /// no buffer).
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }

    fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.shape.iter().map(|&d| Dim::Fixed(d)))
    }
}

/// An op with the verified concrete types of its operands and results (see the
/// module docs). Built only by [`NodeInstance::new`] and
/// [`NodeInstance::of_operands`], which run the op's shape rule.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeInstance {
    op: Op,
    ins: Vec<Concrete>,
    outs: Vec<Concrete>,
}

impl NodeInstance {
    /// The instance of `op` with operands of the declared types `ins` and results
    /// declared `outs`, under the symbol binding `syms`. Every operand dimension
    /// must resolve; a result dimension whose symbols are unbound is taken from
    /// [`infer`], the others must equal it. The results keep their declared
    /// dtypes (a kernel rounds to them). Errors are plain messages naming the op.
    pub fn new(
        op: &Op,
        ins: &[TensorType],
        outs: &[TensorType],
        syms: &HashMap<String, usize>,
    ) -> Result<NodeInstance, String> {
        let bind = |s: &str| syms.get(s).copied();
        let ins = ins
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let shape: Option<Vec<usize>> = t.shape.iter().map(|d| d.resolve(&bind)).collect();
                shape
                    .map(|shape| Concrete {
                        dtype: t.dtype,
                        shape,
                    })
                    .ok_or_else(|| {
                        format!("`{}`: operand {i} of type {t} is not bound", op.mnemonic())
                    })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Self::verify(op, ins, outs, syms)
    }

    /// The instance of `op` for these operands (their dtypes and shapes), results
    /// declared `outs` under `syms` (as [`NodeInstance::new`]).
    pub fn of_operands(
        op: &Op,
        inputs: &[&Tensor],
        outs: &[TensorType],
        syms: &HashMap<String, usize>,
    ) -> Result<NodeInstance, String> {
        let ins = inputs
            .iter()
            .map(|t| Concrete {
                dtype: t.dtype(),
                shape: t.shape.clone(),
            })
            .collect();
        Self::verify(op, ins, outs, syms)
    }

    fn verify(
        op: &Op,
        ins: Vec<Concrete>,
        declared: &[TensorType],
        syms: &HashMap<String, usize>,
    ) -> Result<NodeInstance, String> {
        let name = op.mnemonic();
        let in_tys: Vec<TensorType> = ins.iter().map(Concrete::ty).collect();
        let refs: Vec<&TensorType> = in_tys.iter().collect();
        let inferred = infer(op, &refs, declared).map_err(|e| {
            if e.contains(&format!("`{name}`")) {
                e
            } else {
                format!("`{name}`: {e}")
            }
        })?;
        if inferred.len() != declared.len() {
            return Err(format!(
                "`{name}`: {} results for {} declared types",
                inferred.len(),
                declared.len()
            ));
        }
        let bind = |s: &str| syms.get(s).copied();
        let mut outs = Vec::with_capacity(declared.len());
        for (k, (got, want)) in inferred.iter().zip(declared).enumerate() {
            let shape: Option<Vec<usize>> = got.shape.iter().map(Dim::fixed).collect();
            let Some(shape) = shape else {
                return Err(format!(
                    "`{name}`: result {k} has no concrete shape ({got})"
                ));
            };
            let fits = shape.len() == want.shape.len()
                && shape
                    .iter()
                    .zip(&want.shape)
                    .all(|(&n, d)| d.resolve(&bind).is_none_or(|v| v == n));
            if !fits {
                return Err(format!(
                    "`{name}`: result {k} has shape {shape:?} for these operands, declared {want}"
                ));
            }
            outs.push(Concrete {
                dtype: want.dtype,
                shape,
            });
        }
        Ok(NodeInstance {
            op: op.clone(),
            ins,
            outs,
        })
    }

    /// The op.
    pub fn op(&self) -> &Op {
        &self.op
    }

    /// The operands' concrete types.
    pub fn inputs(&self) -> &[Concrete] {
        &self.ins
    }

    /// The results' concrete types.
    pub fn outputs(&self) -> &[Concrete] {
        &self.outs
    }

    /// Checks `inputs` against the instance (see the module docs): their count,
    /// each one's dtype and shape, and that each buffer holds exactly its shape's
    /// element count. Errors name the op and the operand.
    pub fn bind<'a>(&'a self, inputs: &[&'a Tensor]) -> Result<Checked<'a>, String> {
        let name = self.op.mnemonic();
        if inputs.len() != self.ins.len() {
            return Err(format!(
                "`{name}`: {} operands given, the instance has {}",
                inputs.len(),
                self.ins.len()
            ));
        }
        for (i, (t, c)) in inputs.iter().zip(&self.ins).enumerate() {
            self.check_operand(i, t, c)?;
        }
        Ok(Checked {
            inst: self,
            inputs: inputs.to_vec(),
        })
    }
}

/// The number of elements a tensor's buffer holds.
pub fn stored_len(t: &Tensor) -> usize {
    t.data.len()
}

/// Operands checked against a [`NodeInstance`] ([`NodeInstance::bind`]): each
/// operand has the instance's dtype and shape, and its buffer exactly its element
/// count. Kernels read dims from here without checking them again.
#[derive(Clone, Debug)]
pub struct Checked<'a> {
    inst: &'a NodeInstance,
    inputs: Vec<&'a Tensor>,
}

impl<'a> Checked<'a> {
    /// The instance the operands were checked against.
    pub fn instance(&self) -> &'a NodeInstance {
        self.inst
    }

    /// The op.
    pub fn op(&self) -> &'a Op {
        &self.inst.op
    }

    /// The op's mnemonic (for error messages).
    pub fn name(&self) -> &'static str {
        self.inst.op.mnemonic()
    }

    /// The operands.
    pub fn inputs(&self) -> &[&'a Tensor] {
        &self.inputs
    }

    /// Operand `i` (`i` below the op's verified operand count).
    pub fn input(&self, i: usize) -> &'a Tensor {
        self.inputs[i]
    }

    /// The shape of operand `i`.
    pub fn in_shape(&self, i: usize) -> &'a [usize] {
        &self.inst.ins[i].shape
    }

    /// The concrete type of result `k`.
    pub fn out(&self, k: usize) -> &'a Concrete {
        &self.inst.outs[k]
    }
}

/// In-place updates: the parameters updated in place are checked as operands
/// too, so an update's kernel reads its dims from the instance like any other.
impl NodeInstance {
    /// [`NodeInstance::bind`] for an in-place update: `params` are the op's
    /// leading operands that the update writes ([`Op::in_place_operands`] of
    /// them), `rest` the others. The same one check of each call: the counts,
    /// each operand's dtype and shape, and that each buffer holds exactly its
    /// shape's element count. Errors name the op and the operand.
    pub fn bind_mut<'a>(
        &'a self,
        params: &'a mut [Tensor],
        rest: &[&'a Tensor],
    ) -> Result<CheckedMut<'a>, String> {
        let name = self.op.mnemonic();
        if self.op.in_place_operands() != Some(params.len()) {
            return Err(format!(
                "`{name}`: {} parameters given to update in place, the op updates {}",
                params.len(),
                self.op.in_place_operands().unwrap_or(0)
            ));
        }
        if params.len() + rest.len() != self.ins.len() {
            return Err(format!(
                "`{name}`: {} operands given, the instance has {}",
                params.len() + rest.len(),
                self.ins.len()
            ));
        }
        let all = params.iter().chain(rest.iter().copied());
        for (i, (t, c)) in all.zip(&self.ins).enumerate() {
            self.check_operand(i, t, c)?;
        }
        Ok(CheckedMut {
            inst: self,
            params,
            rest: rest.to_vec(),
        })
    }

    /// Operand `i` against its concrete type `c` (dtype, shape, buffer length).
    fn check_operand(&self, i: usize, t: &Tensor, c: &Concrete) -> Result<(), String> {
        let name = self.op.mnemonic();
        if t.dtype() != c.dtype || t.shape != c.shape {
            return Err(format!(
                "`{name}`: operand {i} is {}{:?}, the instance has {}{:?}",
                t.dtype(),
                t.shape,
                c.dtype,
                c.shape
            ));
        }
        let len = stored_len(t);
        if len != c.numel() {
            return Err(format!(
                "`{name}`: operand {i} holds {len} elements for shape {:?}",
                t.shape
            ));
        }
        Ok(())
    }
}

/// The operands of an in-place update checked against a [`NodeInstance`]
/// ([`NodeInstance::bind_mut`]): the parameters it writes (operands
/// `0..params().len()`) and the others, each of the instance's dtype and shape,
/// each buffer exactly its element count. Kernels read dims from here without
/// checking them again.
#[derive(Debug)]
pub struct CheckedMut<'a> {
    inst: &'a NodeInstance,
    params: &'a mut [Tensor],
    rest: Vec<&'a Tensor>,
}

impl<'a> CheckedMut<'a> {
    /// The instance the operands were checked against.
    pub fn instance(&self) -> &'a NodeInstance {
        self.inst
    }

    /// The op's mnemonic (for error messages).
    pub fn name(&self) -> &'static str {
        self.inst.op.mnemonic()
    }

    /// The shape of operand `i` (parameters first, then the others).
    pub fn in_shape(&self, i: usize) -> &'a [usize] {
        &self.inst.ins[i].shape
    }

    /// The parameters (read only).
    pub fn params(&self) -> &[Tensor] {
        &*self.params
    }

    /// The operands that are not updated.
    pub fn rest(&self) -> &[&'a Tensor] {
        &self.rest
    }

    /// The parameters to write and the other operands, at once.
    pub fn split(&mut self) -> (&mut [Tensor], &[&'a Tensor]) {
        (&mut *self.params, &self.rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Data;

    fn syms() -> HashMap<String, usize> {
        HashMap::from([("B".to_string(), 2)])
    }

    #[test]
    fn verified_once_then_bound_per_call() {
        let ty = TensorType::f32([Dim::batch(), Dim::Fixed(3)]);
        let inst = NodeInstance::new(
            &Op::Add,
            &[ty.clone(), ty.clone()],
            std::slice::from_ref(&ty),
            &syms(),
        )
        .expect("add");
        assert_eq!(inst.outputs()[0].shape, vec![2, 3]);
        let a = Tensor::f32(vec![2, 3], vec![1.0; 6]);
        let c = inst.bind(&[&a, &a]).expect("bind");
        assert_eq!(c.in_shape(1), &[2, 3]);
        // Another shape, a short buffer, a missing operand: errors naming `add`.
        let b = Tensor::f32(vec![3, 2], vec![1.0; 6]);
        let short = Tensor {
            shape: vec![2, 3],
            data: Data::F32(vec![1.0; 5]),
        };
        for bad in [vec![&a, &b], vec![&a, &short], vec![&a]] {
            let e = inst.bind(&bad).expect_err("refused");
            assert!(e.starts_with("`add`"), "{e}");
        }
    }

    #[test]
    fn shape_rule_and_declaration_are_checked() {
        let a = Tensor::f32(vec![2, 3], vec![1.0; 6]);
        let b = Tensor::f32(vec![2, 4], vec![1.0; 8]);
        let out = TensorType::f32([Dim::batch(), Dim::Fixed(3)]);
        let e = NodeInstance::of_operands(&Op::Add, &[&a, &b], std::slice::from_ref(&out), &syms())
            .expect_err("shapes differ");
        assert!(e.contains("`add`") && e.contains("same shape"), "{e}");
        let wrong = TensorType::f32([Dim::batch(), Dim::Fixed(4)]);
        let e = NodeInstance::of_operands(&Op::Add, &[&a, &a], &[wrong], &syms())
            .expect_err("declared 4 columns");
        assert!(e.contains("declared"), "{e}");
        // An unbound result symbol is taken from inference.
        let inst = NodeInstance::of_operands(&Op::Add, &[&a, &a], &[out], &HashMap::new())
            .expect("B unbound");
        assert_eq!(inst.outputs()[0].shape, vec![2, 3]);
        let unbound = NodeInstance::new(
            &Op::Relu,
            &[TensorType::f32([Dim::batch()])],
            &[],
            &HashMap::new(),
        );
        assert!(unbound.expect_err("B unbound").contains("not bound"));
    }
}
