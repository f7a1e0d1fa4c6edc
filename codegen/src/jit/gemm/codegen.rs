//! Code generation of the GEMM loop nest (see the parent module's docs): the
//! Cranelift function for one [`GemmSpec`], with the micro-kernel inlined
//! ([`Micro::Cranelift`]) or called through its [`TileArgs`].

use super::{CL_NR, CL_UNROLL, Elt, GemmFn, GemmKernel, GemmSpec, Micro};
use crate::jit::clif::{self, flags};
use crate::jit::micro::{self, TileArgs};
use crate::jit::{Jit, JitError};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{
    AbiParam, FuncRef, InstBuilder, StackSlot, StackSlotData, StackSlotKind, Value, types,
};
use cranelift_frontend::{FunctionBuilder, Variable};
use cranelift_module::{Linkage, Module};

/// Compiles the loop nest for `spec`.
pub(crate) fn compile(jit: &Jit, spec: GemmSpec) -> Result<GemmKernel, JitError> {
    let in_order =
        std::env::var_os("DLRM_JIT_GEMM_OPT").is_none() && spec.micro == Micro::Cranelift;
    let mut module = jit.module_with(spec.micro, in_order)?;
    let ptr = module.target_config().pointer_type();
    let ukernel = if let Some(kernel) = spec.micro.kernel() {
        // `unsafe extern "C" fn(*const TileArgs)` (micro::UkernelFn).
        let mut usig = module.make_signature();
        usig.params.push(AbiParam::new(ptr));
        Some(
            module
                .declare_function(kernel.symbol, Linkage::Import, &usig)
                .map_err(JitError::module)?,
        )
    } else {
        None
    };
    let f = jit.compile_fn(module, "gemm", 4, &[types::I64; 4], |module, b, params| {
        let uref = ukernel.map(|u| module.declare_func_in_func(u, b.func));
        let mut g = Gen {
            b,
            spec,
            ptr,
            ukernel: None,
        };
        if let Some(f) = uref {
            let slot = g.tile_args_slot();
            g.ukernel = Some((f, slot));
        }
        g.body(params);
    })?;
    // SAFETY: the function was generated with exactly this signature (8 params:
    // 4 pointers, 4 i64) and the platform's default call convention (C).
    let f: GemmFn = unsafe { std::mem::transmute::<*const u8, GemmFn>(f) };
    Ok(GemmKernel { spec, f })
}

struct Gen<'a, 'b> {
    b: &'a mut FunctionBuilder<'b>,
    spec: GemmSpec,
    ptr: types::Type,
    /// The native micro-kernel to call and the stack slot of its [`TileArgs`]
    /// (made by [`Gen::tile_args_slot`] in the entry block).
    ukernel: Option<(FuncRef, StackSlot)>,
}

/// The offset of a [`TileArgs`] field, for the generated code's stores.
macro_rules! field {
    ($f:ident) => {
        i32::try_from(std::mem::offset_of!(TileArgs, $f)).expect("a small offset")
    };
}

impl Gen<'_, '_> {
    fn iconst(&mut self, v: usize) -> Value {
        self.b.ins().iconst(types::I64, v as i64)
    }

    fn var(&mut self, ty: types::Type, init: Value) -> Variable {
        clif::var(self.b, ty, init)
    }

    /// A counted loop `for i in (start..end).step_by(step)` with the body emitted by
    /// `body(gen, i)`; `end` is a runtime value, `start` too.
    fn for_loop(
        &mut self,
        start: Value,
        end: Value,
        step: usize,
        body: &mut dyn FnMut(&mut Self, Value),
    ) {
        let iv = self.var(types::I64, start);
        let head = self.b.create_block();
        let blk = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(head, &[]);
        self.b.switch_to_block(head);
        let i = self.b.use_var(iv);
        let c = self.b.ins().icmp(IntCC::SignedLessThan, i, end);
        self.b.ins().brif(c, blk, &[], exit, &[]);
        self.b.switch_to_block(blk);
        let i = self.b.use_var(iv);
        body(self, i);
        let i = self.b.use_var(iv);
        let next = self.b.ins().iadd_imm_s(i, step as i64);
        self.b.def_var(iv, next);
        self.b.ins().jump(head, &[]);
        self.b.switch_to_block(exit);
    }

    /// The stack slot for the native micro-kernel's [`TileArgs`], with the
    /// fields that are constants of the spec stored once, from the entry block
    /// (the kernels only read the struct; each call stores the tile's pointers
    /// and size).
    fn tile_args_slot(&mut self) -> StackSlot {
        let s = self.spec;
        let size = u32::try_from(std::mem::size_of::<TileArgs>()).expect("a small struct");
        let align = std::mem::align_of::<TileArgs>().trailing_zeros() as u8;
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            size,
            align,
        ));
        let (_, lda, acs) = s.a_layout();
        let mut fl = 0u32;
        if s.a == Elt::BF16 {
            fl |= micro::F_A_BF16;
        }
        if s.c == Elt::BF16 {
            fl |= micro::F_C_BF16;
        }
        if s.bias {
            fl |= micro::F_BIAS;
        }
        if s.relu {
            fl |= micro::F_RELU;
        }
        if s.mask {
            fl |= micro::F_MASK;
        }
        if s.b_size() == 2 {
            fl |= micro::F_B_BF16;
        }
        for (v, off) in [
            (s.k, field!(k)),
            (lda, field!(lda)),
            (acs, field!(acs)),
            (s.ldc, field!(ldc)),
            (s.b_geom().0, field!(ldb)),
            (s.kb.max(1), field!(kb)),
            (s.a_blk, field!(a_blk)),
        ] {
            let x = self.b.ins().iconst(self.ptr, v as i64);
            self.b.ins().stack_store(self.ptr, x, slot, off);
        }
        let x = self.b.ins().iconst(types::I32, i64::from(fl));
        self.b.ins().stack_store(self.ptr, x, slot, field!(flags));
        slot
    }

    /// The loop nest, from the entry block with parameters `params`.
    fn body(&mut self, params: &[Value]) {
        let s = self.spec;
        let (a, bp, c, bias, rows, p0, p1) = (
            params[0], params[1], params[2], params[3], params[4], params[5], params[6],
        );
        if let Some((_, slot)) = self.ukernel {
            // The mask's offset from C: constant through the call.
            self.b
                .ins()
                .stack_store(self.ptr, params[7], slot, field!(mask));
        }
        let mc = s.mc();
        let zero = self.iconst(0);
        self.for_loop(zero, rows, mc, &mut |g, mb| {
            // mend = min(mb + mc, rows)
            let mb_end = g.b.ins().iadd_imm_s(mb, mc as i64);
            let lt = g.b.ins().icmp(IntCC::SignedLessThan, mb_end, rows);
            let mend = g.b.ins().select(lt, mb_end, rows);
            if s.kc == 0 {
                g.panels(a, bp, (c, bias), (mb, mend), (p0, p1));
            } else {
                g.chunks(a, bp, (c, bias), (mb, mend), (p0, p1));
            }
        });
    }

    /// The reduction of rows `mb..mend` in chunks of [`GemmSpec::kc`] steps
    /// (native micro-kernels only): per chunk, its length and flags stored in
    /// the [`TileArgs`] (`F_ACC` after the first, the bias and relu on the
    /// last), then every panel's tiles on `A` and `B` from the chunk's start.
    fn chunks(
        &mut self,
        a: Value,
        bp: Value,
        cb: (Value, Value),
        m: (Value, Value),
        p: (Value, Value),
    ) {
        let s = self.spec;
        let Some((_, slot)) = self.ukernel else {
            unreachable!("GemmSpec::normalized keeps kc for native micro-kernels only")
        };
        let (_, _, acs) = s.a_layout();
        let n = s.k.div_ceil(s.kc);
        let last_len = s.k - (n - 1) * s.kc;
        // Bytes from one chunk's start to the next's, in A and in B.
        let a_step = if s.kb < s.k {
            (s.kc / s.kb) * s.a_blk * s.a.size()
        } else {
            s.kc * acs * s.a.size()
        };
        let b_step = s.micro.b_packing().rows(s.kc) * s.b_geom().0 * s.b_size();
        let mut base = 0u32;
        if s.a == Elt::BF16 {
            base |= micro::F_A_BF16;
        }
        if s.b_size() == 2 {
            base |= micro::F_B_BF16;
        }
        let mut fin = micro::F_ACC;
        if s.bias {
            fin |= micro::F_BIAS;
        }
        if s.relu {
            fin |= micro::F_RELU;
        }
        if s.mask {
            fin |= micro::F_MASK;
        }
        let (zero, count) = (self.iconst(0), self.iconst(n));
        self.for_loop(zero, count, 1, &mut |g, q| {
            let is_last = g.b.ins().icmp_imm_s(IntCC::Equal, q, (n - 1) as i64);
            let is_first = g.b.ins().icmp_imm_s(IntCC::Equal, q, 0);
            let (kc, kl) = (g.iconst(s.kc), g.iconst(last_len));
            let len = g.b.ins().select(is_last, kl, kc);
            let f_mid = g.b.ins().iconst(types::I32, i64::from(base | micro::F_ACC));
            let f_first = g.b.ins().iconst(types::I32, i64::from(base));
            let f_last = g.b.ins().iconst(types::I32, i64::from(base | fin));
            let fl = g.b.ins().select(is_first, f_first, f_mid);
            // One chunk (n = 1 cannot happen: kc < k) is never both.
            let fl = g.b.ins().select(is_last, f_last, fl);
            g.b.ins().stack_store(g.ptr, len, slot, field!(k));
            g.b.ins().stack_store(g.ptr, fl, slot, field!(flags));
            let aq = g.b.ins().imul_imm_s(q, a_step as i64);
            let aq = g.b.ins().iadd(a, aq);
            let bq = g.b.ins().imul_imm_s(q, b_step as i64);
            let bq = g.b.ins().iadd(bp, bq);
            g.panels(aq, bq, cb, m, p);
        });
    }

    /// Every panel `p0..p1`'s tiles of rows `mb..mend`, `A` and `B` from `a`
    /// and `bp`.
    fn panels(
        &mut self,
        a: Value,
        bp: Value,
        (c, bias): (Value, Value),
        (mb, mend): (Value, Value),
        (p0, p1): (Value, Value),
    ) {
        let s = self.spec;
        let (mr, nr) = (s.micro.mr(), s.micro.nr());
        let ragged_n = s.n % nr;
        let npanels = s.panels();
        self.for_loop(p0, p1, 1, &mut |g, p| {
            // Panel base pointers.
            let bstride = g.iconst(s.b_geom().1 * s.b_size());
            let boff = g.b.ins().imul(p, bstride);
            let bpan = g.b.ins().iadd(bp, boff);
            let biasoff = g.b.ins().imul_imm_s(p, (nr * 4) as i64);
            let biaspan = g.b.ins().iadd(bias, biasoff);
            let coff = g.b.ins().imul_imm_s(p, (nr * s.c.size()) as i64);
            let cpan = g.b.ins().iadd(c, coff);
            let full = g.b.create_block();
            let done = g.b.create_block();
            if ragged_n != 0 {
                let ragged = g.b.create_block();
                let is_last = g.b.ins().icmp_imm_s(IntCC::Equal, p, (npanels - 1) as i64);
                g.b.ins().brif(is_last, ragged, &[], full, &[]);
                g.b.switch_to_block(ragged);
                g.row_tiles(a, bpan, cpan, biaspan, mb, mend, mr, ragged_n);
                g.b.ins().jump(done, &[]);
            } else {
                g.b.ins().jump(full, &[]);
            }
            g.b.switch_to_block(full);
            g.row_tiles(a, bpan, cpan, biaspan, mb, mend, mr, nr);
            g.b.ins().jump(done, &[]);
            g.b.switch_to_block(done);
        });
    }

    /// Tiles of rows `mb..mend` of one panel with `ncols` valid columns: full tiles,
    /// then (if any rows remain) one tile of `m % mr` rows.
    #[allow(clippy::too_many_arguments)]
    fn row_tiles(
        &mut self,
        a: Value,
        bpan: Value,
        cpan: Value,
        biaspan: Value,
        mb: Value,
        mend: Value,
        mr: usize,
        ncols: usize,
    ) {
        let s = self.spec;
        let last_full = self.b.ins().iadd_imm_s(mend, -(mr as i64) + 1);
        let iv = self.var(types::I64, mb);
        let head = self.b.create_block();
        let blk = self.b.create_block();
        let tail = self.b.create_block();
        let done = self.b.create_block();
        self.b.ins().jump(head, &[]);
        self.b.switch_to_block(head);
        let i = self.b.use_var(iv);
        let cnd = self.b.ins().icmp(IntCC::SignedLessThan, i, last_full);
        self.b.ins().brif(cnd, blk, &[], tail, &[]);
        self.b.switch_to_block(blk);
        let i = self.b.use_var(iv);
        self.tile_at(a, bpan, cpan, biaspan, i, mr, ncols);
        let i = self.b.use_var(iv);
        let next = self.b.ins().iadd_imm_s(i, mr as i64);
        self.b.def_var(iv, next);
        self.b.ins().jump(head, &[]);
        self.b.switch_to_block(tail);
        let rem = s.m % mr;
        if rem != 0 {
            let i = self.b.use_var(iv);
            let left = self.b.ins().icmp(IntCC::SignedLessThan, i, mend);
            let rblk = self.b.create_block();
            self.b.ins().brif(left, rblk, &[], done, &[]);
            self.b.switch_to_block(rblk);
            let i = self.b.use_var(iv);
            self.tile_at(a, bpan, cpan, biaspan, i, rem, ncols);
        }
        self.b.ins().jump(done, &[]);
        self.b.switch_to_block(done);
    }

    /// One tile at row `i`: pointers, then the micro-kernel.
    #[allow(clippy::too_many_arguments)]
    fn tile_at(
        &mut self,
        a: Value,
        bpan: Value,
        cpan: Value,
        biaspan: Value,
        i: Value,
        rows: usize,
        ncols: usize,
    ) {
        let s = self.spec;
        let (tile_stride, _, _) = s.a_layout();
        let aoff = self
            .b
            .ins()
            .imul_imm_s(i, (tile_stride * s.a.size()) as i64);
        let at = self.b.ins().iadd(a, aoff);
        let coff = self.b.ins().imul_imm_s(i, (s.ldc * s.c.size()) as i64);
        let ct = self.b.ins().iadd(cpan, coff);
        match self.ukernel {
            Some((fref, slot)) => {
                // The tile's fields; the others were stored at entry.
                let nr = self.b.ins().iconst(self.ptr, ncols as i64);
                let mr = self.b.ins().iconst(self.ptr, rows as i64);
                for (v, off) in [
                    (at, field!(a)),
                    (bpan, field!(b)),
                    (ct, field!(c)),
                    (biaspan, field!(bias)),
                    (mr, field!(mr)),
                    (nr, field!(nr)),
                ] {
                    self.b.ins().stack_store(self.ptr, v, slot, off);
                }
                let args = self.b.ins().stack_addr(self.ptr, slot, 0);
                self.b.ins().call(fref, &[args]);
            }
            None => self.cl_tile(at, bpan, ct, biaspan, rows, ncols),
        }
    }

    /// Loads `A[r][kk]` (byte offset `off` from `pa`) and broadcasts it.
    fn a_splat(&mut self, pa: Value, off: i32) -> Value {
        let x = clif::load_f32(self.b, self.spec.a, pa, off);
        self.b.ins().splat(types::F32X4, x)
    }

    /// The Cranelift micro-kernel: `rows × ncols` (`ncols <= CL_NR`) tile with
    /// `rows × 2` f32x4 accumulators, k loop unrolled by [`CL_UNROLL`]: the
    /// batch-reduce into the accumulators ([`Gen::cl_reduce`]), then the
    /// epilogue ([`Gen::cl_store`]).
    fn cl_tile(
        &mut self,
        at: Value,
        bpan: Value,
        ct: Value,
        biaspan: Value,
        rows: usize,
        ncols: usize,
    ) {
        let zf = self.b.ins().f32const(0.0);
        let zv = self.b.ins().splat(types::F32X4, zf);
        let nv = CL_NR / 4;
        let t = ClTile {
            accs: (0..rows * nv).map(|_| self.var(types::F32X4, zv)).collect(),
            pa: self.var(self.ptr, at),
            pb: self.var(self.ptr, bpan),
            rows,
        };
        self.cl_reduce(&t, at);
        let outs: Vec<Value> = t.accs.iter().map(|&v| self.b.use_var(v)).collect();
        self.cl_store(outs, ct, biaspan, rows, ncols);
    }

    /// The batch-reduce of a Cranelift tile: full blocks of `kb` steps (a loop
    /// when there are several), then the partial last one; each block restarts
    /// A at its own base (from `at`), B runs on.
    fn cl_reduce(&mut self, t: &ClTile, at: Value) {
        let s = self.spec;
        let ae = s.a.size();
        let kb = s.kb.clamp(1, s.k.max(1));
        let (full, last) = (s.k / kb, s.k % kb);
        if full == 1 && last == 0 {
            self.cl_steps(t, kb);
        } else if s.k > 0 {
            let blk_a = self.var(self.ptr, at);
            let blk_step = (s.a_blk * ae) as i64;
            if full > 0 {
                let z = self.b.ins().iconst(types::I64, 0);
                let q = self.var(types::I64, z);
                let head = self.b.create_block();
                let body = self.b.create_block();
                let exit = self.b.create_block();
                self.b.ins().jump(head, &[]);
                self.b.switch_to_block(head);
                let qv = self.b.use_var(q);
                let more = self
                    .b
                    .ins()
                    .icmp_imm_s(IntCC::SignedLessThan, qv, full as i64);
                self.b.ins().brif(more, body, &[], exit, &[]);
                self.b.switch_to_block(body);
                let base = self.b.use_var(blk_a);
                self.b.def_var(t.pa, base);
                self.cl_steps(t, kb);
                let base = self.b.use_var(blk_a);
                let nb = self.b.ins().iadd_imm_s(base, blk_step);
                self.b.def_var(blk_a, nb);
                let qv = self.b.use_var(q);
                let nq = self.b.ins().iadd_imm_s(qv, 1);
                self.b.def_var(q, nq);
                self.b.ins().jump(head, &[]);
                self.b.switch_to_block(exit);
            }
            if last > 0 {
                let base = self.b.use_var(blk_a);
                self.b.def_var(t.pa, base);
                self.cl_steps(t, last);
            }
        }
    }

    /// `len` steps of a Cranelift tile's reduction from its current A and B
    /// pointers (both advance): a loop of [`CL_UNROLL`] steps, then the tail.
    fn cl_steps(&mut self, t: &ClTile, len: usize) {
        let (_, _, acs) = self.spec.a_layout();
        let ae = self.spec.a.size();
        let ldb = self.spec.b_geom().0;
        let iters = len / CL_UNROLL;
        if iters > 0 {
            let z = self.b.ins().iconst(types::I64, 0);
            let cnt = self.var(types::I64, z);
            let head = self.b.create_block();
            let blk = self.b.create_block();
            let exit = self.b.create_block();
            self.b.ins().jump(head, &[]);
            self.b.switch_to_block(head);
            let kc = self.b.use_var(cnt);
            let more = self
                .b
                .ins()
                .icmp_imm_s(IntCC::SignedLessThan, kc, iters as i64);
            self.b.ins().brif(more, blk, &[], exit, &[]);
            self.b.switch_to_block(blk);
            for u in 0..CL_UNROLL {
                self.cl_step(t, u);
            }
            self.cl_advance(t, CL_UNROLL * acs * ae, CL_UNROLL * ldb * 4);
            let kc = self.b.use_var(cnt);
            let nk = self.b.ins().iadd_imm_s(kc, 1);
            self.b.def_var(cnt, nk);
            self.b.ins().jump(head, &[]);
            self.b.switch_to_block(exit);
        }
        let tail = len % CL_UNROLL;
        for u in 0..tail {
            self.cl_step(t, u);
        }
        if tail > 0 {
            self.cl_advance(t, tail * acs * ae, tail * ldb * 4);
        }
    }

    /// Step `u` (of the current unrolled group) of a Cranelift tile: one B row
    /// of `CL_NR` lanes, each A element of the tile's rows broadcast and
    /// multiplied into its row's accumulators.
    fn cl_step(&mut self, t: &ClTile, u: usize) {
        let fl = flags();
        let nv = CL_NR / 4;
        let (_, lda, acs) = self.spec.a_layout();
        let ae = self.spec.a.size();
        let ldb = self.spec.b_geom().0;
        let pa = self.b.use_var(t.pa);
        let pb = self.b.use_var(t.pb);
        let bvs: Vec<Value> = (0..nv)
            .map(|v| {
                self.b
                    .ins()
                    .load(types::F32X4, fl, pb, ((u * ldb + v * 4) * 4) as i32)
            })
            .collect();
        for r in 0..t.rows {
            let av = self.a_splat(pa, (r * lda * ae + u * acs * ae) as i32);
            for (v, &bv) in bvs.iter().enumerate() {
                let acc = self.b.use_var(t.accs[r * nv + v]);
                let nacc = self.b.ins().fma(av, bv, acc);
                self.b.def_var(t.accs[r * nv + v], nacc);
            }
        }
    }

    /// Advances a Cranelift tile's A and B pointers by `da` and `db` bytes.
    fn cl_advance(&mut self, t: &ClTile, da: usize, db: usize) {
        let pa = self.b.use_var(t.pa);
        let npa = self.b.ins().iadd_imm_s(pa, da as i64);
        self.b.def_var(t.pa, npa);
        let pb = self.b.use_var(t.pb);
        let npb = self.b.ins().iadd_imm_s(pb, db as i64);
        self.b.def_var(t.pb, npb);
    }

    /// The epilogue of a Cranelift tile: bias and relu on the accumulators'
    /// values `outs` (`rows × CL_NR/4` vectors), stored to the `rows × ncols`
    /// tile at `ct` as `C`'s element type.
    fn cl_store(
        &mut self,
        mut outs: Vec<Value>,
        ct: Value,
        biaspan: Value,
        rows: usize,
        ncols: usize,
    ) {
        let s = self.spec;
        let nv = CL_NR / 4;
        let fl = flags();
        if s.bias {
            for v in 0..nv {
                let bb = self
                    .b
                    .ins()
                    .load(types::F32X4, fl, biaspan, (v * 16) as i32);
                for r in 0..rows {
                    outs[r * nv + v] = self.b.ins().fadd(outs[r * nv + v], bb);
                }
            }
        }
        if s.relu {
            for o in outs.iter_mut() {
                *o = clif::relu_x4(self.b, *o);
            }
        }
        for r in 0..rows {
            let row_off = (r * s.ldc * s.c.size()) as i32;
            match s.c {
                Elt::F32 => {
                    for v in 0..nv {
                        let x = outs[r * nv + v];
                        let col = v * 4;
                        if col + 4 <= ncols {
                            self.b.ins().store(fl, x, ct, row_off + (col * 4) as i32);
                        } else {
                            for l in col..ncols.min(col + 4) {
                                let e = self.b.ins().extractlane(x, (l - col) as u8);
                                self.b.ins().store(fl, e, ct, row_off + (l * 4) as i32);
                            }
                        }
                    }
                }
                Elt::BF16 => {
                    let words: Vec<Value> = (0..nv)
                        .map(|v| clif::bf16_bits_x4(self.b, outs[r * nv + v]))
                        .collect();
                    if ncols == CL_NR {
                        for pair in 0..nv / 2 {
                            let h = self.b.ins().unarrow(words[2 * pair], words[2 * pair + 1]);
                            self.b.ins().store(fl, h, ct, row_off + (pair * 16) as i32);
                        }
                    } else {
                        for l in 0..ncols {
                            let e = self.b.ins().extractlane(words[l / 4], (l % 4) as u8);
                            self.b.ins().istore16(fl, e, ct, row_off + (l * 2) as i32);
                        }
                    }
                }
            }
        }
    }
}

/// A Cranelift tile's state while its code is emitted: one f32x4 accumulator
/// per row and 4 columns, and the A and B pointers.
struct ClTile {
    accs: Vec<Variable>,
    pa: Variable,
    pb: Variable,
    rows: usize,
}
