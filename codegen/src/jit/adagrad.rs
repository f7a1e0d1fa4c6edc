//! JIT kernels of the Adagrad updates (`adagrad`, `sparse_adagrad`,
//! `embedding_update_adagrad` and its row-shard form).
//!
//! One Cranelift kernel updates `n` consecutive elements, f32x4 lanes then a
//! scalar tail, with the interpreter's operations in its order (no fused
//! multiply-add, IEEE `sqrt` and divide per lane), so it is bitwise the
//! definition:
//! - elementwise (`AdagradSpec { given_den: false }`): `a = acc + g·g`,
//!   `w = w - lr·(g / (sqrt(a) + eps))`, `acc = a`;
//! - given denominator (`given_den: true`, row-wise Adagrad): `w = w - lr·(g / den)`
//!   with the row's `den = sqrt(G_r) + eps` computed once by the caller
//!   ([`adagrad_row_acc`] for `G_r`).
//!
//! The dense update runs the kernel over chunks in parallel (row-wise: per row).
//! The sparse updates keep the reference kernels' race-free owner-computes
//! structure ([`crate::reference::adagrad`]: row ranges per task, positions grouped
//! by row, each row's gradient summed in index order) and call the kernel on each
//! touched row. Gradients must be f32 and weight decay 0 for the JIT; otherwise
//! the reference kernel runs (`None`).
//!
//! ABI: `fn(w, acc, g, n: i64, lr: f32, eps_or_den: f32)`.

use super::clif::{flags, for_range};
use super::{Jit, JitError};
use crate::reference::adagrad::{Hyper, embedding_update_adagrad, sparse_adagrad, state};
use crate::reference::{KResult, KernelError};
use crate::update::rows_of;
use cranelift_codegen::ir::{InstBuilder, Value, types};
use cranelift_frontend::FunctionBuilder;
use dlrm_ir::interp::adagrad_row_acc;
use dlrm_ir::module::ModOp;
use dlrm_ir::{CheckedMut, Data, Op, Tensor};
use rayon::prelude::*;

/// What an Adagrad kernel is specialised on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AdagradSpec {
    /// The denominator is given (row-wise); else it comes from the accumulator.
    pub given_den: bool,
}

type AdaFn = unsafe extern "C" fn(*mut f32, *mut f32, *const f32, i64, f32, f32);

/// A compiled Adagrad kernel.
#[derive(Clone, Copy, Debug)]
pub struct AdagradKernel {
    f: AdaFn,
}

impl AdagradKernel {
    /// Updates `w` (and `acc`, elementwise) with `g`, all of one length.
    fn run(&self, w: &mut [f32], acc: &mut [f32], g: &[f32], lr: f32, eps_or_den: f32) {
        debug_assert!(g.len() == w.len());
        // SAFETY: `w`, `g` (and `acc` for the elementwise kernel, which the caller
        // sizes like `w`) hold `w.len()` elements; the kernel touches no others.
        unsafe {
            (self.f)(
                w.as_mut_ptr(),
                acc.as_mut_ptr(),
                g.as_ptr(),
                w.len() as i64,
                lr,
                eps_or_den,
            )
        }
    }
}

/// One step on `lanes` (4 or 1) elements at byte offset `off`.
fn step(b: &mut FunctionBuilder<'_>, spec: AdagradSpec, p: [Value; 3], s: [Value; 2], lanes: u8) {
    let [w, acc, g] = p;
    let [lr, e] = s;
    let ty = if lanes == 4 { types::F32X4 } else { types::F32 };
    let (lr, e) = if lanes == 4 {
        (b.ins().splat(ty, lr), b.ins().splat(ty, e))
    } else {
        (lr, e)
    };
    let gv = b.ins().load(ty, flags(), g, 0);
    let wv = b.ins().load(ty, flags(), w, 0);
    let den = if spec.given_den {
        e
    } else {
        let av = b.ins().load(ty, flags(), acc, 0);
        let gg = b.ins().fmul(gv, gv);
        let a = b.ins().fadd(av, gg);
        b.ins().store(flags(), a, acc, 0);
        let r = b.ins().sqrt(a);
        b.ins().fadd(r, e)
    };
    let q = b.ins().fdiv(gv, den);
    let u = b.ins().fmul(lr, q);
    let nw = b.ins().fsub(wv, u);
    b.ins().store(flags(), nw, w, 0);
}

pub(crate) fn compile(jit: &Jit, spec: AdagradSpec) -> Result<AdagradKernel, JitError> {
    let module = jit.new_module()?;
    let scalars = [types::I64, types::F32, types::F32];
    let f = jit.compile_fn(module, "adagrad", 3, &scalars, |_, b, p| {
        let (w, acc, g, n, lr, e) = (p[0], p[1], p[2], p[3], p[4], p[5]);
        let n4 = b.ins().band_imm_s(n, !3);
        let zero = b.ins().iconst(types::I64, 0);
        let at = |b: &mut FunctionBuilder<'_>, i: Value| {
            let o = b.ins().imul_imm_s(i, 4);
            [b.ins().iadd(w, o), b.ins().iadd(acc, o), b.ins().iadd(g, o)]
        };
        for_range(b, zero, n4, 4, &mut |b, i| {
            let ptrs = at(b, i);
            step(b, spec, ptrs, [lr, e], 4);
        });
        for_range(b, n4, n, 1, &mut |b, i| {
            let ptrs = at(b, i);
            step(b, spec, ptrs, [lr, e], 1);
        });
    })?;
    // SAFETY: generated with exactly this signature and the C call convention.
    let f: AdaFn = unsafe { std::mem::transmute::<*const u8, AdaFn>(f) };
    Ok(AdagradKernel { f })
}

fn jit_err(op: &'static str) -> impl Fn(JitError) -> KernelError {
    move |e| KernelError::Jit {
        op,
        reason: e.to_string(),
    }
}

/// A row update: `(w[D], acc[D] or acc[1], summed g[D])`.
trait RowUpdate: Fn(&mut [f32], &mut [f32], &[f32]) + Sync {}
impl<F: Fn(&mut [f32], &mut [f32], &[f32]) + Sync> RowUpdate for F {}

/// The row update of the sparse forms with the JIT kernels.
fn jit_row(op: &'static str, jit: &Jit, h: Hyper) -> KResult<impl RowUpdate> {
    let k = jit
        .adagrad(AdagradSpec {
            given_den: h.rowwise,
        })
        .map_err(jit_err(op))?;
    Ok(move |w: &mut [f32], acc: &mut [f32], g: &[f32]| {
        if h.rowwise {
            acc[0] = adagrad_row_acc(acc[0], g);
            let den = acc[0].sqrt() + h.eps;
            k.run(w, &mut [], g, h.lr, den);
        } else {
            k.run(w, acc, g, h.lr, h.eps);
        }
    })
}

/// Elements per task of the dense update.
const CHUNK: usize = 1 << 15;

/// `adagrad` (no weight decay, f32 gradient) with the JIT kernel.
/// The operands are checked ([`CheckedMut`]): `g` (f32, the caller's match) is
/// shaped like `w`.
fn dense(ps: &mut [Tensor], gv: &[f32], h: Hyper, jit: &Jit) -> KResult<()> {
    const OP: &str = "adagrad";
    let k = jit
        .adagrad(AdagradSpec {
            given_den: h.rowwise,
        })
        .map_err(jit_err(OP))?;
    let (w, a, d) = state(OP, ps)?;
    if h.rowwise {
        if d == 0 {
            return Ok(());
        }
        let rows = (CHUNK / d).max(1);
        w.par_chunks_mut(rows * d)
            .zip(a.par_chunks_mut(rows))
            .zip(gv.par_chunks(rows * d))
            .for_each(|((w, a), g)| {
                for ((wr, ar), gr) in w.chunks_mut(d).zip(a.iter_mut()).zip(g.chunks(d)) {
                    *ar = adagrad_row_acc(*ar, gr);
                    k.run(wr, &mut [], gr, h.lr, ar.sqrt() + h.eps);
                }
            });
    } else {
        w.par_chunks_mut(CHUNK)
            .zip(a.par_chunks_mut(CHUNK))
            .zip(gv.par_chunks(CHUNK))
            .for_each(|((w, a), g)| k.run(w, a, g, h.lr, h.eps));
    }
    Ok(())
}

/// Split-Adagrad's table update (`split_embedding_update_adagrad`, its JIT
/// kernel in the registry, `crate::modules`): the reference kernel with the JIT's
/// Adagrad row on each joined master.
pub(crate) fn split_table_update(
    jit: &Jit,
    m: &ModOp,
    c: &mut CheckedMut<'_>,
) -> Option<KResult<()>> {
    let h = dlrm_ir::ops::split_adagrad::table_attrs(m).1;
    let split = crate::reference::split_adagrad::split_embedding_update_adagrad;
    Some(jit_row(m.mnemonic(), jit, h).and_then(|row| split(c, m, &row)))
}

/// The Adagrad update `op` on checked operands with JIT kernels (`None`: not an
/// Adagrad op, weight decay, or a non-f32 gradient; the caller runs the
/// reference kernel). Same contract as [`crate::update::update_in_place`].
pub(crate) fn update_in_place(op: &Op, c: &mut CheckedMut<'_>) -> Option<KResult<()>> {
    let jit = Jit::global().ok()?;
    let row = |h: Hyper| jit_row(op.mnemonic(), jit, h);
    match *op {
        Op::Adagrad {
            lr,
            eps,
            wd: 0.0,
            rowwise,
        } => {
            let (ps, rest) = c.split();
            let [g] = *rest else { return None };
            let Data::F32(gv) = &g.data else { return None };
            Some(dense(ps, gv, Hyper { lr, eps, rowwise }, jit))
        }
        Op::SparseAdagrad { lr, eps, rowwise } => {
            let h = Hyper { lr, eps, rowwise };
            Some(row(h).and_then(|row| sparse_adagrad(c, rows_of(op), h, &row)))
        }
        _ => {
            let (mode, h) = op.embedding_adagrad()?;
            Some(row(h).and_then(|row| embedding_update_adagrad(c, rows_of(op), mode, h, &row)))
        }
    }
}
