//! The kernels of the module ops (`dlrm_ir::ops`, one file per op), by
//! mnemonic: the one list the reference backend ([`crate::try_eval`]), the JIT
//! ([`crate::jit::try_eval`]) and the in-place updates
//! ([`crate::update_in_place`]) consult for an [`Op::Module`](dlrm_ir::Op).
//!
//! A module op with a kernel is one line of [`KERNELS`]: its mnemonic and the
//! kernels it has, each optional — a reference kernel ([`Reference`]), a JIT
//! kernel ([`JitKernel`], tried first when the caller allows the JIT), an
//! in-place update ([`Update`]) and its JIT form ([`JitUpdate`]). Every kernel
//! takes its operands checked against the node's instance and answers `None`
//! for dtypes it does not handle: the next one runs (JIT, then reference, then
//! the interpreter, which runs every module op from its definition). A kernel
//! computes what the module's `eval` defines (bit for bit or within the
//! tolerance its file documents; `codegen/tests` check it).

mod cross_brgemm;
mod gelu;
mod interaction_blocked;

use crate::jit::{Jit, JitOptions};
use crate::reference::KResult;
use dlrm_ir::module::ModOp;
use dlrm_ir::ops::{embedding_bag_q8, split_adagrad};
use dlrm_ir::{Checked, CheckedMut, Tensor, TensorType};

/// A module op's reference kernel: its results, `None` for operands or result
/// dtypes it does not handle.
pub(crate) type Reference = fn(&ModOp, &Checked<'_>) -> Option<KResult<Vec<Tensor>>>;

/// A module op's JIT kernel (`out_types`: the declared results): as
/// [`Reference`].
pub(crate) type JitKernel =
    fn(&Jit, &ModOp, &Checked<'_>, &[TensorType], &JitOptions) -> Option<KResult<Vec<Tensor>>>;

/// A module update's in-place kernel (the parameters and states are the
/// checked operands' mutable part): `None` for operands it does not handle.
pub(crate) type Update = fn(&ModOp, &mut CheckedMut<'_>) -> Option<KResult<()>>;

/// A module update's in-place JIT kernel: as [`Update`].
pub(crate) type JitUpdate = fn(&Jit, &ModOp, &mut CheckedMut<'_>) -> Option<KResult<()>>;

/// The kernels of one module op (a line of [`KERNELS`]).
#[derive(Clone, Copy)]
pub(crate) struct Kernels {
    mnemonic: &'static str,
    reference: Option<Reference>,
    jit: Option<JitKernel>,
    update: Option<Update>,
    jit_update: Option<JitUpdate>,
}

impl Kernels {
    /// The op `mnemonic`, no kernel yet.
    const fn of(mnemonic: &'static str) -> Kernels {
        Kernels {
            mnemonic,
            reference: None,
            jit: None,
            update: None,
            jit_update: None,
        }
    }

    /// With reference kernel `f`.
    const fn reference(self, f: Reference) -> Kernels {
        Kernels {
            reference: Some(f),
            ..self
        }
    }

    /// With JIT kernel `f`.
    const fn jit(self, f: JitKernel) -> Kernels {
        Kernels {
            jit: Some(f),
            ..self
        }
    }

    /// With in-place update kernel `f`.
    const fn update(self, f: Update) -> Kernels {
        Kernels {
            update: Some(f),
            ..self
        }
    }

    /// With in-place JIT update kernel `f`.
    const fn jit_update(self, f: JitUpdate) -> Kernels {
        Kernels {
            jit_update: Some(f),
            ..self
        }
    }
}

/// Every module op with a kernel; a module op not listed runs in the
/// interpreter.
static KERNELS: &[Kernels] = {
    use crate::jit::{adagrad, embedding};
    use crate::reference::{cross, split_adagrad as split};
    &[
        Kernels::of("cross").reference(cross::cross),
        Kernels::of("cross_grad").reference(cross::cross_grad),
        Kernels::of("cross_save").reference(cross::cross_save),
        Kernels::of("cross_grad_saved").reference(cross::cross_grad_saved),
        Kernels::of("cross_mix").reference(cross::cross_mix),
        Kernels::of("cross_mix_grad").reference(cross::cross_mix_grad),
        Kernels::of("cross_brgemm")
            .reference(cross_brgemm::forward)
            .jit(cross_brgemm::forward_jit),
        Kernels::of("cross_brgemm_save")
            .reference(cross_brgemm::forward)
            .jit(cross_brgemm::forward_jit),
        Kernels::of("cross_brgemm_dgrad")
            .reference(cross_brgemm::dgrad)
            .jit(cross_brgemm::dgrad_jit),
        Kernels::of(embedding_bag_q8::MNEMONIC).jit(embedding::embedding_bag_q8),
        Kernels::of("gelu")
            .reference(gelu::gelu)
            .jit(gelu::gelu_jit),
        Kernels::of("gelu_grad")
            .reference(gelu::gelu_grad)
            .jit(gelu::gelu_grad_jit),
        Kernels::of(dlrm_ir::ops::interaction_blocked::MNEMONIC)
            .jit(interaction_blocked::interaction_blocked_jit),
        Kernels::of(dlrm_ir::ops::interaction_blocked::GRAD)
            .jit(interaction_blocked::interaction_grad_blocked_jit),
        Kernels::of(split_adagrad::DENSE).update(split::dense_update),
        Kernels::of(split_adagrad::TABLE)
            .update(split::table_update)
            .jit_update(adagrad::split_table_update),
    ]
};

/// The kernels of `m`, if it has any.
fn of(m: &ModOp) -> Option<&'static Kernels> {
    KERNELS.iter().find(|k| k.mnemonic == m.mnemonic())
}

/// The reference kernel of `m`.
pub(crate) fn reference(m: &ModOp) -> Option<Reference> {
    of(m)?.reference
}

/// The JIT kernel of `m`.
pub(crate) fn jit(m: &ModOp) -> Option<JitKernel> {
    of(m)?.jit
}

/// The update `m` in place: its JIT kernel when `jit` allows it and it has one
/// that handles these operands, else its reference kernel (`None`: neither, the
/// interpreter runs it).
pub(crate) fn update(m: &ModOp, c: &mut CheckedMut<'_>, jit: bool) -> Option<KResult<()>> {
    let k = of(m)?;
    if jit
        && let Some(f) = k.jit_update
        && let Ok(j) = Jit::global()
        && let Some(r) = f(j, m, c)
    {
        return Some(r);
    }
    (k.update?)(m, c)
}

#[cfg(test)]
mod tests {
    use super::KERNELS;

    #[test]
    fn every_line_names_a_module_once() {
        for (i, k) in KERNELS.iter().enumerate() {
            assert!(
                dlrm_ir::module::find(k.mnemonic).is_some(),
                "`{}` is not an op module",
                k.mnemonic
            );
            assert!(
                KERNELS[..i].iter().all(|o| o.mnemonic != k.mnemonic),
                "`{}` is listed twice",
                k.mnemonic
            );
        }
    }
}
