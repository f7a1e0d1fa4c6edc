//! The Cranelift code of the dot interaction's kernels (the algorithm and the ABI
//! are in the parent module's docs): the forward's pair blocks, and the backward's
//! unrolled chunks or, above [`UNROLL_F`] operands of one element type, its
//! run-time loops over operands and partners.

use super::DotSpec;
use crate::jit::clif::{flags, for_range, load_f32, load_f32x4, store_f32, store_f32x4, var};
use crate::jit::gemm::Elt;
use cranelift_codegen::ir::{InstBuilder, Value, types};
use cranelift_frontend::{FunctionBuilder, Variable};

/// Row pointers of sample `s` of every operand: `ops[i] + s·D·size_i`.
fn rows_of(b: &mut FunctionBuilder<'_>, spec: &DotSpec, ops: Value, s: Value) -> Vec<Value> {
    (0..spec.f)
        .map(|i| {
            let base = b.ins().load(types::I64, flags(), ops, (8 * i) as i32);
            let o = b.ins().imul_imm_s(s, (spec.d * spec.elt(i).size()) as i64);
            b.ins().iadd(base, o)
        })
        .collect()
}

/// Copies `d` values from `src` (`se`) to `dst` (`de`), converting.
fn copy_row(b: &mut FunctionBuilder<'_>, d: usize, src: Value, se: Elt, dst: Value, de: Elt) {
    for c in (0..d / 4).map(|v| 4 * v) {
        let x = load_f32x4(b, se, src, (c * se.size()) as i32);
        store_f32x4(b, de, x, dst, (c * de.size()) as i32);
    }
    for c in d / 4 * 4..d {
        let x = load_f32(b, se, src, (c * se.size()) as i32);
        store_f32(b, de, x, dst, (c * de.size()) as i32);
    }
}

fn zero_x4(b: &mut FunctionBuilder<'_>) -> Value {
    let z = b.ins().f32const(0.0);
    b.ins().splat(types::F32X4, z)
}

/// Offsets `p + c·k` for a runtime column chunk `c`.
fn at(b: &mut FunctionBuilder<'_>, p: Value, c: Value, k: i64) -> Value {
    let o = b.ins().imul_imm_s(c, k);
    b.ins().iadd(p, o)
}

/// The dot products of `T_i` with up to four `T_j` (row pointers `ti`, `tjs`).
fn dot_block(
    b: &mut FunctionBuilder<'_>,
    spec: &DotSpec,
    i: usize,
    ti: Value,
    js: &[(usize, Value)],
) -> Vec<Value> {
    const CC: usize = 16;
    let d = spec.d;
    let ei = spec.elt(i);
    let z = zero_x4(b);
    let accs: Vec<_> = js.iter().map(|_| var(b, types::F32X4, z)).collect();
    // Accumulates vectors at column offsets `cols` from the row pointers given.
    let step = |b: &mut FunctionBuilder<'_>, pi: Value, pjs: &[Value], cols: &[usize]| {
        for &c in cols {
            let xi = load_f32x4(b, ei, pi, (c * ei.size()) as i32);
            for (k, &(j, _)) in js.iter().enumerate() {
                let ej = spec.elt(j);
                let xj = load_f32x4(b, ej, pjs[k], (c * ej.size()) as i32);
                let a = b.use_var(accs[k]);
                let a = b.ins().fma(xi, xj, a);
                b.def_var(accs[k], a);
            }
        }
    };
    let full = d / CC;
    if full > 0 {
        let zero = b.ins().iconst(types::I64, 0);
        let end = b.ins().iconst(types::I64, full as i64);
        for_range(b, zero, end, 1, &mut |b, c| {
            let pi = at(b, ti, c, (CC * ei.size()) as i64);
            let pjs: Vec<Value> = js
                .iter()
                .map(|&(j, tj)| at(b, tj, c, (CC * spec.elt(j).size()) as i64))
                .collect();
            step(b, pi, &pjs, &[0, 4, 8, 12]);
        });
    }
    let rest: Vec<usize> = (full * CC..d / 4 * 4).step_by(4).collect();
    let tjs: Vec<Value> = js.iter().map(|&(_, tj)| tj).collect();
    step(b, ti, &tjs, &rest);
    js.iter()
        .enumerate()
        .map(|(k, &(j, tj))| {
            let a = b.use_var(accs[k]);
            let l: Vec<Value> = (0..4).map(|q| b.ins().extractlane(a, q)).collect();
            let s01 = b.ins().fadd(l[0], l[1]);
            let s23 = b.ins().fadd(l[2], l[3]);
            let mut s = b.ins().fadd(s01, s23);
            let ej = spec.elt(j);
            for c in d / 4 * 4..d {
                let xi = load_f32(b, ei, ti, (c * ei.size()) as i32);
                let xj = load_f32(b, ej, tj, (c * ej.size()) as i32);
                let p = b.ins().fmul(xi, xj);
                s = b.ins().fadd(s, p);
            }
            s
        })
        .collect()
}

pub(super) fn emit_forward(b: &mut FunctionBuilder<'_>, spec: &DotSpec, p: &[Value]) {
    let (ops, out, s0, s1) = (p[0], p[1], p[2], p[3]);
    let eo = spec.out.size();
    let width = spec.width();
    for_range(b, s0, s1, 1, &mut |b, s| {
        let t = rows_of(b, spec, ops, s);
        let rel = b.ins().isub(s, s0);
        let orow = {
            let o = b.ins().imul_imm_s(rel, (width * eo) as i64);
            b.ins().iadd(out, o)
        };
        copy_row(b, spec.d, t[0], spec.elt(0), orow, spec.out);
        let mut k = spec.d;
        for i in 0..spec.f {
            let nj = if spec.self_interaction { i + 1 } else { i };
            for j0 in (0..nj).step_by(4) {
                let js: Vec<(usize, Value)> = (j0..nj.min(j0 + 4)).map(|j| (j, t[j])).collect();
                for z in dot_block(b, spec, i, t[i], &js) {
                    store_f32(b, spec.out, z, orow, (k * eo) as i32);
                    k += 1;
                }
            }
        }
    });
}

/// Columns per backward chunk (8 f32x4 accumulators).
const CC: usize = 32;

/// Operands up to which the backward is unrolled over every operand and
/// partner; above, it loops over them at run time: the unrolled code grows as F²
/// and at 27 operands outgrew the instruction cache (slower than the reference).
const UNROLL_F: usize = 12;

pub(super) fn emit_backward(b: &mut FunctionBuilder<'_>, spec: &DotSpec, p: &[Value]) {
    if spec.f > UNROLL_F
        && let Some(e) = spec.tail_elt()
    {
        return emit_backward_loops(b, spec, p, e);
    }
    let (ops, dr, grads, s0, s1) = (p[0], p[1], p[2], p[3], p[4]);
    let (d, f) = (spec.d, spec.f);
    let (ed, eo) = (spec.dr.size(), spec.out.size());
    let width = spec.width();
    // The `dr` column of each pair.
    let mut col = vec![vec![usize::MAX; f]; f];
    for (k, &(i, j)) in spec.pairs().iter().enumerate() {
        col[i][j] = d + k;
    }
    for_range(b, s0, s1, 1, &mut |b, s| {
        let t = rows_of(b, spec, ops, s);
        let drow = at(b, dr, s, (width * ed) as i64);
        for i in 0..f {
            let g = {
                let base = b.ins().load(types::I64, flags(), grads, (8 * i) as i32);
                at(b, base, s, (d * eo) as i64)
            };
            // Partners of operand i with the dr column of their pair and the factor.
            let mut partners: Vec<(usize, usize, bool)> = Vec::new();
            for k in 0..f {
                let (hi, lo) = if k > i { (k, i) } else { (i, k) };
                let c = col[hi][lo];
                if c != usize::MAX {
                    partners.push((k, c, k == i));
                }
            }
            // Columns [c0, c0+cols) of dT_i from the pointers (relative offsets).
            let chunk = |b: &mut FunctionBuilder<'_>,
                         tp: &[Value],
                         dp: Value,
                         gp: Value,
                         c0: usize,
                         cols: usize| {
                let nv = cols / 4;
                let z = b.ins().f32const(0.0);
                let zv = b.ins().splat(types::F32X4, z);
                let mut acc: Vec<Value> = (0..nv)
                    .map(|v| {
                        if i == 0 {
                            load_f32x4(b, spec.dr, dp, ((c0 + 4 * v) * ed) as i32)
                        } else {
                            zv
                        }
                    })
                    .collect();
                let mut sacc: Vec<Value> = (c0 + 4 * nv..c0 + cols)
                    .map(|c| {
                        if i == 0 {
                            load_f32(b, spec.dr, dp, (c * ed) as i32)
                        } else {
                            z
                        }
                    })
                    .collect();
                for &(k, c, diag) in &partners {
                    let mut coef = load_f32(b, spec.dr, drow, (c * ed) as i32);
                    if diag {
                        let two = b.ins().f32const(2.0);
                        coef = b.ins().fmul(two, coef);
                    }
                    let cv = b.ins().splat(types::F32X4, coef);
                    let ek = spec.elt(k);
                    for (v, a) in acc.iter_mut().enumerate() {
                        let x = load_f32x4(b, ek, tp[k], ((c0 + 4 * v) * ek.size()) as i32);
                        *a = b.ins().fma(cv, x, *a);
                    }
                    for (q, a) in sacc.iter_mut().enumerate() {
                        let x = load_f32(b, ek, tp[k], ((c0 + 4 * nv + q) * ek.size()) as i32);
                        let m = b.ins().fmul(coef, x);
                        *a = b.ins().fadd(*a, m);
                    }
                }
                for (v, &a) in acc.iter().enumerate() {
                    store_f32x4(b, spec.out, a, gp, ((c0 + 4 * v) * eo) as i32);
                }
                for (q, &a) in sacc.iter().enumerate() {
                    store_f32(b, spec.out, a, gp, ((c0 + 4 * nv + q) * eo) as i32);
                }
            };
            let full = d / CC;
            if full > 0 {
                let zero = b.ins().iconst(types::I64, 0);
                let end = b.ins().iconst(types::I64, full as i64);
                for_range(b, zero, end, 1, &mut |b, c| {
                    let tp: Vec<Value> = (0..f)
                        .map(|k| at(b, t[k], c, (CC * spec.elt(k).size()) as i64))
                        .collect();
                    let dp = at(b, drow, c, (CC * ed) as i64);
                    let gp = at(b, g, c, (CC * eo) as i64);
                    chunk(b, &tp, dp, gp, 0, CC);
                });
            }
            if !d.is_multiple_of(CC) {
                chunk(b, &t, drow, g, full * CC, d % CC);
            }
        }
    });
}

/// The backward with run-time loops (many operands, operands `1..F` all of
/// element type `e`): per sample, operand 0 (with `dr`'s first `D` columns) then
/// operands `i = 1..F` in a loop; per 32-column chunk, the partners `k` in a loop,
/// each adding `dZ_ik · T_k` (`2·dZ_ii` on the diagonal with self-interaction).
/// The `dr` column of pair `(hi, lo)` (row-major lower triangle) is
/// `D + hi(hi∓1)/2 + lo`, computed at run time.
fn emit_backward_loops(b: &mut FunctionBuilder<'_>, spec: &DotSpec, p: &[Value], e: Elt) {
    let (ops, dr, grads, s0, s1) = (p[0], p[1], p[2], p[3], p[4]);
    let (d, f) = (spec.d, spec.f);
    let (ed, eo, ex) = (spec.dr.size(), spec.out.size(), spec.elt(0));
    let width = spec.width();
    for_range(b, s0, s1, 1, &mut |b, s| {
        let drow = at(b, dr, s, (width * ed) as i64);
        let row = LoopRow {
            spec,
            ops,
            drow,
            s,
            e,
        };
        // dT_i for operand i (run time; `first`: i = 0, with dr's passthrough).
        let operand = |b: &mut FunctionBuilder<'_>, i: Value, first: bool| {
            let g = row.row_of(b, grads, i, eo);
            let ei = if first { ex } else { e };
            let ti = row.row_of(b, ops, i, ei.size());
            let x = {
                let z = b.ins().iconst(types::I64, 0);
                row.row_of(b, ops, z, ex.size())
            };
            let one = b.ins().iconst(types::I64, 1);
            let fv = b.ins().iconst(types::I64, f as i64);
            let i1 = b.ins().iadd_imm_s(i, 1);
            let opd = LoopOperand {
                i,
                first,
                g,
                ti,
                ei,
                x,
                one,
                fv,
                i1,
            };
            let full = d / CC;
            if full > 0 {
                let zero = b.ins().iconst(types::I64, 0);
                let end = b.ins().iconst(types::I64, full as i64);
                for_range(b, zero, end, 1, &mut |b, c| {
                    backward_chunk(b, &row, &opd, (Some(c), 0, CC));
                });
            }
            if !d.is_multiple_of(CC) {
                backward_chunk(b, &row, &opd, (None, full * CC, d % CC));
            }
        };
        let zero = b.ins().iconst(types::I64, 0);
        operand(b, zero, true);
        let one = b.ins().iconst(types::I64, 1);
        let fv = b.ins().iconst(types::I64, f as i64);
        for_range(b, one, fv, 1, &mut |b, i| operand(b, i, false));
    });
}

/// One sample of [`emit_backward_loops`]: the spec, the operands' pointer
/// table `ops`, the sample `s` and its `dr` row `drow`; operands `1..F` are of
/// element type `e`.
struct LoopRow<'s> {
    spec: &'s DotSpec,
    ops: Value,
    drow: Value,
    s: Value,
    e: Elt,
}

impl LoopRow<'_> {
    /// Row pointer of operand k (run time) for this sample.
    fn row_of(&self, b: &mut FunctionBuilder<'_>, base: Value, k: Value, size: usize) -> Value {
        let off = b.ins().ishl_imm_u(k, 3);
        let addr = b.ins().iadd(base, off);
        let p = b.ins().load(types::I64, flags(), addr, 0);
        at(b, p, self.s, (self.spec.d * size) as i64)
    }

    /// `dr` column of pair (hi, lo): D + hi(hi∓1)/2 + lo.
    fn col_of(&self, b: &mut FunctionBuilder<'_>, hi: Value, lo: Value) -> Value {
        let n = if self.spec.self_interaction {
            b.ins().iadd_imm_s(hi, 1)
        } else {
            b.ins().iadd_imm_s(hi, -1)
        };
        let t = b.ins().imul(hi, n);
        let t = b.ins().ushr_imm_u(t, 1);
        let t = b.ins().iadd(t, lo);
        b.ins().iadd_imm_s(t, self.spec.d as i64)
    }

    /// `dZ` at `dr` column `col` of this sample.
    fn coef_at(&self, b: &mut FunctionBuilder<'_>, col: Value) -> Value {
        let o = b.ins().imul_imm_s(col, self.spec.dr.size() as i64);
        let a = b.ins().iadd(self.drow, o);
        load_f32(b, self.spec.dr, a, 0)
    }
}

/// Operand `i` of one sample in [`emit_backward_loops`] (`first`: operand 0):
/// its gradient row `g`, its row `ti` (element type `ei`), operand 0's row `x`,
/// and the constants 1, `F` and `i + 1`.
struct LoopOperand {
    i: Value,
    first: bool,
    g: Value,
    ti: Value,
    ei: Elt,
    x: Value,
    one: Value,
    fv: Value,
    i1: Value,
}

/// Columns `[c0, c0 + cols)` of operand `o`'s gradient (chunk `c` of
/// [`CC`] columns when given, at run time): accumulated over its partners in
/// ascending order, then stored.
fn backward_chunk(
    b: &mut FunctionBuilder<'_>,
    row: &LoopRow<'_>,
    o: &LoopOperand,
    (c, c0, cols): (Option<Value>, usize, usize),
) {
    let (spec, e, ops) = (row.spec, row.e, row.ops);
    let (ed, eo, ex) = (spec.dr.size(), spec.out.size(), spec.elt(0));
    let (i, first) = (o.i, o.first);
    // Byte offsets of the chunk's columns in a row of elements of `size`.
    let off = |b: &mut FunctionBuilder<'_>, p: Value, size: usize| match c {
        Some(c) => at(b, p, c, (CC * size) as i64),
        None => b.ins().iadd_imm_s(p, (c0 * size) as i64),
    };
    let nv = cols / 4;
    let zf = b.ins().f32const(0.0);
    let zv = b.ins().splat(types::F32X4, zf);
    let dp = off(b, row.drow, ed);
    let accs: Vec<Variable> = (0..nv)
        .map(|v| {
            let init = if first {
                load_f32x4(b, spec.dr, dp, (4 * v * ed) as i32)
            } else {
                zv
            };
            var(b, types::F32X4, init)
        })
        .collect();
    let saccs: Vec<Variable> = (4 * nv..cols)
        .map(|q| {
            let init = if first {
                load_f32(b, spec.dr, dp, (q * ed) as i32)
            } else {
                zf
            };
            var(b, types::F32, init)
        })
        .collect();
    // acc += coef · T_k[chunk] (T_k's row at `tk`, element type `ek`).
    let add = |b: &mut FunctionBuilder<'_>, coef: Value, tk: Value, ek: Elt| {
        let tk = off(b, tk, ek.size());
        let cv = b.ins().splat(types::F32X4, coef);
        for (v, &a) in accs.iter().enumerate() {
            let xk = load_f32x4(b, ek, tk, (4 * v * ek.size()) as i32);
            let acc = b.use_var(a);
            let nacc = b.ins().fma(cv, xk, acc);
            b.def_var(a, nacc);
        }
        for (q, &a) in saccs.iter().enumerate() {
            let xk = load_f32(b, ek, tk, ((4 * nv + q) * ek.size()) as i32);
            let m = b.ins().fmul(coef, xk);
            let acc = b.use_var(a);
            let nacc = b.ins().fadd(acc, m);
            b.def_var(a, nacc);
        }
    };
    // The partners in ascending order (the unrolled kernel's and the AVX-512
    // kernel's order: the same sums bit for bit).
    // The diagonal: 2·dZ_ii · T_i.
    let diagonal = |b: &mut FunctionBuilder<'_>| {
        let col = row.col_of(b, i, i);
        let c1 = row.coef_at(b, col);
        let two = b.ins().f32const(2.0);
        let coef = b.ins().fmul(two, c1);
        add(b, coef, o.ti, o.ei);
    };
    let self_i = spec.self_interaction;
    if first {
        if self_i {
            diagonal(b);
        }
        // Partners k = 1..F of operand 0: pairs (k, 0).
        let zero = b.ins().iconst(types::I64, 0);
        for_range(b, o.one, o.fv, 1, &mut |b, k| {
            let col = row.col_of(b, k, zero);
            let coef = row.coef_at(b, col);
            let tk = row.row_of(b, ops, k, e.size());
            add(b, coef, tk, e);
        });
    } else {
        // Partner 0 (x): pair (i, 0).
        let zero = b.ins().iconst(types::I64, 0);
        let col = row.col_of(b, i, zero);
        let coef = row.coef_at(b, col);
        add(b, coef, o.x, ex);
        // Partners 1 <= k < i: pairs (i, k).
        for_range(b, o.one, i, 1, &mut |b, k| {
            let col = row.col_of(b, i, k);
            let coef = row.coef_at(b, col);
            let tk = row.row_of(b, ops, k, e.size());
            add(b, coef, tk, e);
        });
        if self_i {
            diagonal(b);
        }
    }
    if !first {
        // Partners i < k < F: pairs (k, i).
        for_range(b, o.i1, o.fv, 1, &mut |b, k| {
            let col = row.col_of(b, k, i);
            let coef = row.coef_at(b, col);
            let tk = row.row_of(b, ops, k, e.size());
            add(b, coef, tk, e);
        });
    }
    let gp = off(b, o.g, eo);
    for (v, &a) in accs.iter().enumerate() {
        let val = b.use_var(a);
        store_f32x4(b, spec.out, val, gp, (4 * v * eo) as i32);
    }
    for (q, &a) in saccs.iter().enumerate() {
        let val = b.use_var(a);
        store_f32(b, spec.out, val, gp, ((4 * nv + q) * eo) as i32);
    }
}
