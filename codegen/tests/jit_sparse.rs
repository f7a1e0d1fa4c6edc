//! Property tests of the sparse/dense optimizer updates (whole tables and row
//! shards), the sharded embedding ops (`embedding_bag_rows`,
//! `embedding_grad_dense`) and the dot interaction: JIT kernels against the
//! reference kernels, and the reference kernels against the interpreter (the
//! definition), on random ragged shapes with duplicate indices, f32 and bf16
//! data. Updates and embedding ops must be bitwise equal; interaction agrees
//! up to reassociation (1e-5 relative to the terms' magnitudes, plus one bf16
//! rounding step for bf16 results).

use dlrm_codegen::jit::{JitOptions, micro};
use dlrm_codegen::{KernelChoice, KernelError, update_in_place};
use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{DType, Dim, InteractionKind, Op, Pool, SingleRank, Tensor, TensorType};
use half::bf16;
use proptest::prelude::*;
use std::collections::HashMap;

mod common;
use common::{random_indices, same_bits, vals};

fn bits(seed: u64, n: usize) -> Vec<bf16> {
    vals(seed, n)
        .iter()
        .map(|v| bf16::from_bits((v.to_bits() >> 7) as u16))
        .collect()
}

fn syms(s: usize) -> HashMap<String, usize> {
    HashMap::from([("B".to_string(), s)])
}

fn interp(op: &Op, ins: &[&Tensor], outs: &[TensorType], s: usize) -> Result<Vec<Tensor>, String> {
    let sy = syms(s);
    let ctx = EvalCtx {
        syms: &sy,
        comm: &SingleRank,
    };
    eval_op(op, ins, outs, &ctx)
}

fn ty_of(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), t.shape.iter().map(|&n| Dim::Fixed(n)))
}

/// Runs `op` in place on copies of `params` with the JIT (`jit`) or the reference
/// kernels.
fn run(
    op: &Op,
    params: &[Tensor],
    rest: &[&Tensor],
    jit: bool,
) -> Result<Vec<Tensor>, KernelError> {
    let mut ps = params.to_vec();
    let o = JitOptions::default();
    update_in_place(op, &mut ps, rest, jit.then_some(&o)).expect("an in-place kernel")?;
    Ok(ps)
}

/// Non-decreasing offsets from 0 cutting `n` indices into `s` bags (some empty).
fn offsets(seed: u64, s: usize, n: usize) -> Tensor {
    let mut cuts: Vec<i64> = vals(seed, s)
        .iter()
        .map(|v| ((v + 1.0) * 0.5 * n as f32) as i64)
        .collect();
    cuts.sort_unstable();
    if let Some(c) = cuts.first_mut() {
        *c = 0;
    }
    Tensor::i64(vec![s], cuts)
}

#[derive(Debug, Clone, Copy)]
enum TableKind {
    F32,
    BF16,
    Split,
}

/// The row shard `lo..lo+len` of a table of `rows` rows picked by `cut` (`None`:
/// the whole table).
fn shard_of(cut: Option<(usize, usize)>, rows: usize) -> Option<(usize, usize)> {
    cut.map(|(a, b)| {
        let lo = a % rows;
        (lo, 1 + b % (rows - lo))
    })
}

/// Rows `lo..lo+len` of a `[rows, d]` table (all of it for `None`).
fn rows_of<T: Clone>(v: Vec<T>, d: usize, shard: Option<(usize, usize)>) -> Vec<T> {
    match shard {
        None => v,
        Some((lo, len)) => v[lo * d..(lo + len) * d].to_vec(),
    }
}

#[allow(clippy::too_many_arguments)]
fn update_case(
    kind: TableKind,
    rows: usize,
    d: usize,
    s: usize,
    l: usize,
    var: bool,
    mean: bool,
    i32s: bool,
    bf_grad: bool,
    seed: u64,
    shard: Option<(usize, usize)>,
) {
    let n = s * l;
    let idx = random_indices(seed, n, rows, i32s, if var { vec![n] } else { vec![s, l] });
    let off = offsets(seed + 1, s, n);
    let gdt = if bf_grad { DType::BF16 } else { DType::F32 };
    let dy = Tensor::from_f32(gdt, vec![s, d], vals(seed + 2, s * d));
    let mode = if mean { Pool::Mean } else { Pool::Sum };
    let lr = 0.37;
    let tab = rows_of(vals(seed + 3, rows * d), d, shard);
    let held = vec![shard.map_or(rows, |(_, len)| len), d];
    let (op, params) = match kind {
        TableKind::F32 | TableKind::BF16 => {
            let dt = if matches!(kind, TableKind::F32) {
                DType::F32
            } else {
                DType::BF16
            };
            let op = match shard {
                None => Op::EmbeddingUpdate { mode, lr },
                Some((lo, _)) => Op::EmbeddingUpdateRows { mode, lr, lo, rows },
            };
            (op, vec![Tensor::from_f32(dt, held, tab)])
        }
        TableKind::Split => {
            let op = match shard {
                None => Op::SplitEmbeddingUpdate { mode, lr },
                Some((lo, _)) => Op::SplitEmbeddingUpdateRows { mode, lr, lo, rows },
            };
            let low = rows_of(bits(seed + 4, rows * d), d, shard);
            let params = vec![
                Tensor::from_f32(DType::BF16, held.clone(), tab),
                Tensor::bf16(held, low),
            ];
            (op, params)
        }
    };
    let mut rest: Vec<&Tensor> = vec![&dy, &idx];
    if var {
        rest.push(&off);
    }
    let name = format!(
        "{kind:?} rows={rows} d={d} s={s} l={l} var={var} mean={mean} i32={i32s} bfg={bf_grad} shard={shard:?}"
    );
    let reference = run(&op, &params, &rest, false).expect("reference");
    let jit = run(&op, &params, &rest, true).expect("jit");
    // The definition.
    let mut all: Vec<&Tensor> = params.iter().collect();
    all.extend(&rest);
    let tys: Vec<TensorType> = params.iter().map(ty_of).collect();
    let want = interp(&op, &all, &tys, s).expect("interpreter");
    for ((r, j), w) in reference.iter().zip(&jit).zip(&want) {
        same_bits(&format!("{name} reference vs interpreter"), r, w);
        same_bits(&format!("{name} jit vs reference"), j, r);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn embedding_updates_agree(
        kind in prop_oneof![Just(TableKind::F32), Just(TableKind::BF16), Just(TableKind::Split)],
        rows in 1usize..300,
        d in 1usize..80,
        s in 0usize..40,
        l in 0usize..6,
        var: bool,
        mean: bool,
        i32s: bool,
        bf_grad: bool,
        seed in 0u64..1000,
        cut in proptest::option::of((0usize..300, 0usize..300)),
    ) {
        let shard = shard_of(cut, rows);
        update_case(kind, rows, d, s, l, var, mean, i32s, bf_grad, seed, shard);
        // The shard's forward bag and the table's dense gradient, or the
        // weighted bag.
        let bf = (!matches!(kind, TableKind::F32), bf_grad);
        embedding_ops_case(rows, d, s, l, var, mean, i32s, bf, seed, shard);
    }

    #[test]
    fn sparse_sgd_agrees(
        bf_table: bool,
        rows in 1usize..200,
        d in 1usize..70,
        s in 0usize..30,
        l in 1usize..5,
        i32s: bool,
        bf_grad: bool,
        seed in 0u64..1000,
        cut in proptest::option::of((0usize..200, 0usize..200)),
    ) {
        let n = s * l;
        let idx = random_indices(seed, n, rows, i32s, vec![s, l]);
        let gdt = if bf_grad { DType::BF16 } else { DType::F32 };
        let g = Tensor::from_f32(gdt, vec![s, l, d], vals(seed + 1, n * d));
        let tdt = if bf_table { DType::BF16 } else { DType::F32 };
        let shard = shard_of(cut, rows);
        let held = vec![shard.map_or(rows, |(_, len)| len), d];
        let table = Tensor::from_f32(tdt, held, rows_of(vals(seed + 2, rows * d), d, shard));
        let op = match shard {
            None => Op::SparseSgd { lr: 0.5 },
            Some((lo, _)) => Op::SparseSgdRows { lr: 0.5, lo, rows },
        };
        let params = vec![table];
        let reference = run(&op, &params, &[&idx, &g], false).expect("reference");
        let jit = run(&op, &params, &[&idx, &g], true).expect("jit");
        let want = interp(&op, &[&params[0], &idx, &g], &[ty_of(&params[0])], s).expect("interp");
        same_bits("sparse_sgd reference vs interpreter", &reference[0], &want[0]);
        same_bits("sparse_sgd jit vs reference", &jit[0], &reference[0]);
    }

    #[test]
    fn dense_updates_agree(
        n in 0usize..200,
        big: bool,
        w_kind in 0usize..3,
        bf_grad: bool,
        seed in 0u64..1000,
    ) {
        let n = if big { n + 70_000 } else { n };
        let gdt = if bf_grad { DType::BF16 } else { DType::F32 };
        let g = Tensor::from_f32(gdt, vec![n], vals(seed, n));
        let w = vals(seed + 1, n);
        let (op, params) = match w_kind {
            0 => (Op::Sgd { lr: 0.1 }, vec![Tensor::f32(vec![n], w)]),
            1 => (Op::Sgd { lr: 0.1 }, vec![Tensor::from_f32(DType::BF16, vec![n], w)]),
            _ => (
                Op::SplitSgd { lr: 0.1 },
                vec![
                    Tensor::from_f32(DType::BF16, vec![n], w),
                    Tensor::bf16(vec![n], bits(seed + 2, n)),
                ],
            ),
        };
        let reference = run(&op, &params, &[&g], false).expect("reference");
        let jit = run(&op, &params, &[&g], true).expect("jit");
        let mut all: Vec<&Tensor> = params.iter().collect();
        all.push(&g);
        let tys: Vec<TensorType> = params.iter().map(ty_of).collect();
        let want = interp(&op, &all, &tys, 1).expect("interpreter");
        for ((r, j), w) in reference.iter().zip(&jit).zip(&want) {
            same_bits("dense reference vs interpreter", r, w);
            same_bits("dense jit vs reference", j, r);
        }
    }
}

/// `embedding_bag_rows` on a shard and `embedding_grad_dense` of the table
/// (with a shard), `embedding_bag_weighted` (with offsets; weights in [-1, 1)
/// and a NaN): the JIT kernel bitwise equal to the interpreter and, where there
/// is one (f32 operands and result), to the reference kernel.
#[allow(clippy::too_many_arguments)]
fn embedding_ops_case(
    rows: usize,
    d: usize,
    s: usize,
    l: usize,
    var: bool,
    mean: bool,
    i32s: bool,
    bf: (bool, bool),
    seed: u64,
    shard: Option<(usize, usize)>,
) {
    let n = s * l;
    let idx = random_indices(seed, n, rows, i32s, if var { vec![n] } else { vec![s, l] });
    let off = offsets(seed + 1, s, n);
    let (bf_in, bf_out) = bf;
    let edt = if bf_in { DType::BF16 } else { DType::F32 };
    let mode = if mean { Pool::Mean } else { Pool::Sum };
    let (lo, len) = shard.unwrap_or((0, rows));
    let table = Tensor::from_f32(
        edt,
        vec![len, d],
        rows_of(vals(seed + 2, rows * d), d, Some((lo, len))),
    );
    let dy = Tensor::from_f32(edt, vec![s, d], vals(seed + 3, s * d));
    let mut w = vals(seed + 4, n);
    if let Some(x) = w.get_mut(seed as usize % n.max(1)) {
        *x = f32::NAN;
    }
    let weights = Tensor::f32(vec![n], w);
    let odt = if bf_out { DType::BF16 } else { DType::F32 };
    let mut cases = Vec::new();
    if shard.is_some() {
        cases.push((
            Op::EmbeddingBagRows { mode, lo, rows },
            &table,
            odt,
            vec![s, d],
        ));
        cases.push((
            Op::EmbeddingGradDense { mode, rows },
            &dy,
            DType::F32,
            vec![rows, d],
        ));
    }
    if var && shard.is_none() {
        cases.push((Op::EmbeddingBagWeighted, &table, odt, vec![s, d]));
    }
    for (op, first, odt, oshape) in cases {
        let mut ins = vec![first, &idx];
        if var {
            ins.push(&off);
        }
        if op == Op::EmbeddingBagWeighted {
            ins.push(&weights);
        }
        let out = TensorType::new(odt, oshape.into_iter().map(Dim::Fixed));
        let name = format!(
            "{} rows={rows} d={d} s={s} l={l} var={var} mean={mean} i32={i32s} bf={bf:?} shard={shard:?}",
            op.mnemonic()
        );
        let sy = syms(s);
        let o = JitOptions::default();
        let want = interp(&op, &ins, std::slice::from_ref(&out), s).expect("interpreter");
        let jit = dlrm_codegen::jit::try_eval(&op, &ins, std::slice::from_ref(&out), &sy, &o)
            .expect("a JIT kernel")
            .expect("jit");
        same_bits(&format!("{name} jit vs interpreter"), &jit[0], &want[0]);
        if let Some(r) = dlrm_codegen::try_eval(&op, &ins, std::slice::from_ref(&out), &sy) {
            same_bits(
                &format!("{name} reference vs interpreter"),
                &r.expect("reference")[0],
                &want[0],
            );
        }
    }
}

#[test]
fn sharded_errors_name_the_sample_and_leave_the_shard() {
    // A shard of rows 2..4 of a 6-row table: index 6 is out of the table (an
    // error naming its sample), index 5 out of the shard (skipped).
    let shard = Tensor::f32(vec![2, 3], (0..6).map(|x| x as f32).collect());
    let dy = Tensor::f32(vec![2, 3], vec![1.0; 6]);
    let bad = Tensor::i64(vec![2, 2], vec![2, 5, 3, 6]);
    let op = Op::EmbeddingUpdateRows {
        mode: Pool::Sum,
        lr: 1.0,
        lo: 2,
        rows: 6,
    };
    let o = JitOptions::default();
    for jit in [false, true] {
        let mut ps = vec![shard.clone()];
        let err = update_in_place(&op, &mut ps, &[&dy, &bad], jit.then_some(&o))
            .expect("kernel")
            .expect_err("index 6 of 6 rows");
        assert_eq!(
            err,
            KernelError::IndexOutOfRange {
                op: "embedding_update_rows",
                position: 3,
                sample: Some(1),
                index: 6,
                rows: 6
            }
        );
        assert_eq!(ps[0], shard);
        // A shard that does not fit its table.
        let wide = Op::SparseSgdRows {
            lr: 1.0,
            lo: 5,
            rows: 6,
        };
        let g = Tensor::f32(vec![2, 2, 3], vec![1.0; 12]);
        let err = update_in_place(&wide, &mut ps, &[&bad, &g], jit.then_some(&o))
            .expect("kernel")
            .expect_err("rows 5..7 of 6");
        assert!(
            err.to_string().contains("does not fit a table of 6 rows"),
            "{err}"
        );
        assert_eq!(ps[0], shard);
        // In range: rows 2 and 3 updated, 5 skipped.
        let ok = Tensor::i64(vec![2, 2], vec![2, 5, 3, 3]);
        update_in_place(&op, &mut ps, &[&dy, &ok], jit.then_some(&o))
            .expect("kernel")
            .expect("update");
        assert_eq!(
            ps[0].to_f32_vec(),
            vec![-1.0, 0.0, 1.0, 1.0, 2.0, 3.0],
            "jit={jit}"
        );
    }
    let sy = syms(2);
    let out = TensorType::new(DType::F32, [Dim::Fixed(2), Dim::Fixed(3)]);
    let bag = Op::EmbeddingBagRows {
        mode: Pool::Sum,
        lo: 2,
        rows: 6,
    };
    let err =
        dlrm_codegen::jit::try_eval(&bag, &[&shard, &bad], std::slice::from_ref(&out), &sy, &o)
            .expect("a JIT kernel")
            .expect_err("index 6 of 6 rows");
    assert!(
        matches!(
            err,
            KernelError::IndexOutOfRange {
                sample: Some(1),
                index: 6,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn update_errors_name_the_sample_and_leave_the_table() {
    let table = Tensor::f32(vec![4, 3], (0..12).map(|x| x as f32).collect());
    let dy = Tensor::f32(vec![2, 3], vec![1.0; 6]);
    let op = Op::EmbeddingUpdate {
        mode: Pool::Sum,
        lr: 1.0,
    };
    for jit in [false, true] {
        // Fixed pooling: position 5 is sample 1.
        let idx = Tensor::i64(vec![2, 3], vec![0, 1, 2, 3, 0, 4]);
        let mut ps = vec![table.clone()];
        let o = JitOptions::default();
        let err = update_in_place(&op, &mut ps, &[&dy, &idx], jit.then_some(&o))
            .expect("kernel")
            .expect_err("index 4 of 4 rows");
        assert_eq!(
            err,
            KernelError::IndexOutOfRange {
                op: "embedding_update",
                position: 5,
                sample: Some(1),
                index: 4,
                rows: 4
            }
        );
        assert_eq!(ps[0], table);
        // Offsets: position 1 (negative) is in bag 0 of [0, 2).
        let idx = Tensor::i64(vec![3], vec![0, -1, 2]);
        let off = Tensor::i64(vec![2], vec![0, 2]);
        let err = update_in_place(&op, &mut ps, &[&dy, &idx, &off], jit.then_some(&o))
            .expect("kernel")
            .expect_err("negative index");
        assert!(
            matches!(
                err,
                KernelError::IndexOutOfRange {
                    sample: Some(0),
                    index: -1,
                    ..
                }
            ),
            "{err}"
        );
        // Bad offsets and a dy of the wrong width.
        let bad_off = Tensor::i64(vec![2], vec![0, 5]);
        assert!(matches!(
            update_in_place(&op, &mut ps, &[&dy, &idx, &bad_off], jit.then_some(&o))
                .expect("kernel"),
            Err(KernelError::Offsets { .. })
        ));
        let dy4 = Tensor::f32(vec![2, 4], vec![1.0; 8]);
        let idx = Tensor::i64(vec![2, 1], vec![0, 1]);
        assert!(
            update_in_place(&op, &mut ps, &[&dy4, &idx], jit.then_some(&o))
                .expect("kernel")
                .is_err()
        );
        assert_eq!(ps[0], table);
    }
}

/// One interaction case under every micro-kernel choice: each agrees with the
/// reference kernels; the backward of the Cranelift kernel and of the AVX-512
/// one (f32 only, where the CPU has it) agree bit for bit on the columns of
/// whole f32x4 vectors (the same FMAs in the same order).
fn interaction_case(
    f: usize,
    d: usize,
    s: usize,
    self_i: bool,
    bf_mask: u64,
    bf_out: bool,
    seed: u64,
) {
    let case = Case {
        f,
        d,
        s,
        self_i,
        bf_mask,
        bf_out,
        seed,
    };
    let run = |kernels| {
        let o = JitOptions {
            kernels,
            ..JitOptions::default()
        };
        interaction_case_with(&o, case)
    };
    let cl = run(KernelChoice::Cranelift);
    let auto = run(KernelChoice::Auto);
    // Where `auto` takes AVX512_BF16's pair dot product for bf16 operands,
    // the AVX-512 F kernels' widened bf16 path under `avx512` too, and the
    // AVX2 kernels under `native` (each run checks its forward against the
    // reference).
    let mut others = vec![("auto", auto)];
    if micro::AVX512.available() {
        others.push(("avx512", run(KernelChoice::Avx512)));
    }
    if micro::AVX2.available() {
        others.push(("native", run(KernelChoice::Native)));
    }
    let whole = d / 4 * 4;
    for (kernels, grads) in &others {
        for (k, (a, b)) in cl.iter().zip(grads).enumerate() {
            let (a, b) = (a.to_f32_vec(), b.to_f32_vec());
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                if i % d < whole {
                    assert_eq!(
                        x.to_bits(),
                        y.to_bits(),
                        "{kernels}: f={f} d={d} s={s} self={self_i}: gradient {k} element {i}: {x} vs {y}"
                    );
                }
            }
        }
    }
}

/// An interaction case: `f` operands of `d` columns, `s` samples, the diagonal
/// kept or not, operand `i` bf16 when bit `i` of `bf_mask` is set, bf16
/// results or f32, the data's seed.
#[derive(Clone, Copy)]
struct Case {
    f: usize,
    d: usize,
    s: usize,
    self_i: bool,
    bf_mask: u64,
    bf_out: bool,
    seed: u64,
}

/// [`interaction_case`] under `o`; returns the backward's gradients.
fn interaction_case_with(o: &JitOptions, case: Case) -> Vec<Tensor> {
    let Case {
        f,
        d,
        s,
        self_i,
        bf_mask,
        bf_out,
        seed,
    } = case;
    let ops: Vec<Tensor> = (0..f)
        .map(|i| {
            let dt = if (bf_mask >> i) & 1 == 1 {
                DType::BF16
            } else {
                DType::F32
            };
            Tensor::from_f32(dt, vec![s, d], vals(seed + i as u64, s * d))
        })
        .collect();
    // The reference kernels take f32: the same values widened (exact).
    let ops32: Vec<Tensor> = ops
        .iter()
        .map(|t| Tensor::f32(t.shape.clone(), t.to_f32_vec()))
        .collect();
    let kind = InteractionKind::Dot;
    let width = dlrm_ir::interaction_width(kind, self_i, &vec![d; f]);
    let out_dt = if bf_out { DType::BF16 } else { DType::F32 };
    let name = format!("f={f} d={d} s={s} self={self_i} bf={bf_mask:b} out={out_dt}");
    let sy = syms(s);
    let tol = if bf_out { 1.0 / 128.0 } else { 1e-5 };
    // Forward.
    let op = Op::Interaction {
        kind,
        self_interaction: self_i,
    };
    let ins: Vec<&Tensor> = ops.iter().collect();
    let ins32: Vec<&Tensor> = ops32.iter().collect();
    let ty = TensorType::new(out_dt, [Dim::Fixed(s), Dim::Fixed(width)]);
    let got = dlrm_codegen::jit::try_eval(&op, &ins, std::slice::from_ref(&ty), &sy, o)
        .expect("a JIT kernel")
        .expect("runs");
    let ty32 = TensorType::new(DType::F32, [Dim::Fixed(s), Dim::Fixed(width)]);
    let want = dlrm_codegen::try_eval(&op, &ins32, std::slice::from_ref(&ty32), &sy)
        .expect("a reference kernel")
        .expect("runs");
    // Magnitude of the terms of each dot product: |T_i|·|T_j|.
    let mags: Vec<Tensor> = ops32
        .iter()
        .map(|t| {
            Tensor::f32(
                t.shape.clone(),
                t.to_f32_vec().iter().map(|v| v.abs()).collect(),
            )
        })
        .collect();
    let mag_ins: Vec<&Tensor> = mags.iter().collect();
    let scale = dlrm_codegen::try_eval(&op, &mag_ins, std::slice::from_ref(&ty32), &sy)
        .expect("kernel")
        .expect("runs");
    close(
        &format!("{name} forward"),
        &got[0],
        &want[0],
        &scale[0],
        tol,
    );
    // Backward.
    let dr = Tensor::from_f32(out_dt, vec![s, width], vals(seed + 99, s * width));
    let dr32 = Tensor::f32(dr.shape.clone(), dr.to_f32_vec());
    let op = Op::InteractionGrad {
        kind,
        self_interaction: self_i,
    };
    let mut ins: Vec<&Tensor> = vec![&dr];
    ins.extend(ops.iter());
    let mut ins32: Vec<&Tensor> = vec![&dr32];
    ins32.extend(ops32.iter());
    let tys: Vec<TensorType> = (0..f)
        .map(|_| TensorType::new(out_dt, [Dim::Fixed(s), Dim::Fixed(d)]))
        .collect();
    let tys32: Vec<TensorType> = (0..f)
        .map(|_| TensorType::new(DType::F32, [Dim::Fixed(s), Dim::Fixed(d)]))
        .collect();
    let got = dlrm_codegen::jit::try_eval(&op, &ins, &tys, &sy, o)
        .expect("a JIT kernel")
        .expect("runs");
    let want = dlrm_codegen::try_eval(&op, &ins32, &tys32, &sy)
        .expect("a reference kernel")
        .expect("runs");
    let dra = Tensor::f32(
        dr.shape.clone(),
        dr32.to_f32_vec().iter().map(|v| v.abs()).collect(),
    );
    let mut mag_ins: Vec<&Tensor> = vec![&dra];
    mag_ins.extend(mags.iter());
    let scale = dlrm_codegen::try_eval(&op, &mag_ins, &tys32, &sy)
        .expect("kernel")
        .expect("runs");
    assert_eq!(got.len(), f);
    for (k, ((g, w), m)) in got.iter().zip(&want).zip(&scale).enumerate() {
        close(&format!("{name} backward {k}"), g, w, m, tol);
    }
    got
}

fn close(name: &str, got: &Tensor, want: &Tensor, scale: &Tensor, tol: f32) {
    assert_eq!(got.shape, want.shape, "{name}: shape");
    let (g, w, m) = (got.to_f32_vec(), want.to_f32_vec(), scale.to_f32_vec());
    for (i, ((g, w), m)) in g.iter().zip(&w).zip(&m).enumerate() {
        let bound = tol * m.max(w.abs()).max(1e-30) + 1e-30;
        assert!(
            (g - w).abs() <= bound,
            "{name}: element {i}: {g} vs {w} (scale {m})"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn dot_interaction_agrees(
        f in 1usize..10,
        d in 1usize..70,
        s in 0usize..20,
        self_i: bool,
        // All-f32 operands half the time (the AVX-512 backward's case).
        bf_mask in prop_oneof![Just(0u64), any::<u64>()],
        bf_out: bool,
        seed in 0u64..1000,
    ) {
        interaction_case(f, d, s, self_i, bf_mask, bf_out, seed);
    }
}

#[test]
fn dot_interaction_at_dlrm_shapes() {
    for (f, d, self_i) in [
        (9, 64, false),
        (27, 128, false),
        (27, 16, true),
        (3, 33, true),
    ] {
        interaction_case(f, d, 37, self_i, 0, false, 5);
        interaction_case(f, d, 37, self_i, !1, true, 6);
        // Every operand bf16 (read in place by the AVX-512 kernels, widened
        // in registers), f32 and bf16 results.
        interaction_case(f, d, 37, self_i, !0, false, 8);
        interaction_case(f, d, 37, self_i, !0, true, 9);
    }
    // More operands than the unrolled backward takes (it loops over operands
    // and partners at run time when operands 1.. share a type): every width
    // class, with and without the diagonal, and mixed types (unrolled again).
    for (f, d, self_i, mask) in [
        (13, 1, false, 0),
        (20, 40, true, 0),
        (27, 35, false, !1),
        (16, 67, true, 1),
        (14, 36, false, 0b1010_1010),
    ] {
        interaction_case(f, d, 23, self_i, mask, false, 7);
    }
    // The narrow forward (at most 16 columns, at most 32 operands): partners
    // across its two vectors of lanes, at its largest operand count, one past
    // it (the general kernel), and one column.
    for (f, d, self_i) in [
        (17, 16, false),
        (17, 16, true),
        (16, 7, true),
        (32, 5, false),
        (32, 16, true),
        (33, 16, false),
        (30, 1, true),
    ] {
        interaction_case(f, d, 21, self_i, 0, false, 10);
    }
    // Widths of whole 8-lane vectors whose AVX2 backward passes end in a
    // partial chunk of one or two vectors (24-column chunks), operand counts
    // around its blocks of 3 (forward) and 4 (backward).
    for (f, d, self_i) in [(5, 8, false), (7, 40, true), (4, 56, false), (28, 16, true)] {
        interaction_case(f, d, 19, self_i, 0, false, 11);
        interaction_case(f, d, 19, self_i, !0, true, 12);
    }
    // Zero-width operands (the result is the empty pairs' zeros), f32 and bf16.
    for (mask, bf_out) in [(0, false), (!0, true), (0b10, false)] {
        interaction_case(4, 0, 9, false, mask, bf_out, 8);
        interaction_case(3, 0, 5, true, mask, bf_out, 9);
    }
}

#[test]
fn bce_logits_kernels_are_bitwise_the_interpreter() {
    for n in [1usize, 7, 2048, 70_001] {
        let z = Tensor::f32(vec![n, 1], vals(1, n).iter().map(|v| 8.0 * v).collect());
        let y = Tensor::f32(
            vec![n, 1],
            vals(2, n).iter().map(|v| f32::from(*v > 0.0)).collect(),
        );
        let denom = Dim::batch();
        for op in [
            Op::BceLogits {
                denom: denom.clone(),
            },
            Op::BceLogitsGrad {
                denom: denom.clone(),
            },
        ] {
            let ty = if matches!(op, Op::BceLogits { .. }) {
                TensorType::new(DType::F32, [])
            } else {
                ty_of(&z)
            };
            let want = interp(&op, &[&z, &y], std::slice::from_ref(&ty), n).expect("interp");
            let got = dlrm_codegen::try_eval(&op, &[&z, &y], std::slice::from_ref(&ty), &syms(n))
                .expect("a kernel")
                .expect("runs");
            same_bits(&format!("{} n={n}", op.mnemonic()), &got[0], &want[0]);
        }
    }
    // Unbound denominator: no kernel (the interpreter reports it).
    let z = Tensor::f32(vec![2], vec![0.0; 2]);
    let op = Op::BceLogits {
        denom: Dim::Sym("G".into()),
    };
    let ty = TensorType::new(DType::F32, []);
    assert!(dlrm_codegen::try_eval(&op, &[&z, &z], &[ty], &HashMap::new()).is_none());
}

/// `interaction_blocked` (the dot interaction written in the top MLP's
/// blocked layout) equals the composition it replaces, `block_act` of the
/// interaction, bit for bit, under every kernel choice (the native kernels
/// write their rows into the blocks; the Cranelift ones block after), and the
/// interpreter's definition within the interaction's reassociation; and
/// `interaction_grad_blocked` equals `interaction_grad` of the unblocked
/// gradient bit for bit.
#[test]
fn interaction_blocked_and_its_gradient_are_their_compositions() {
    let mut kernels = vec![KernelChoice::Auto, KernelChoice::Cranelift];
    if micro::AVX512.available() {
        kernels.push(KernelChoice::Avx512);
    }
    if micro::AVX2.available() {
        kernels.push(KernelChoice::Native);
    }
    // (operands, width, samples, diagonal, bf16, block): the DLRM shapes
    // (dlrm-small, dlrm-kaggle, dlrm-mlperf into blocks of 64), blocks that
    // pad the last one, a block wider than the row, one column, no samples.
    for (f, d, s, self_i, bf, bk) in [
        (9, 64, 37, false, false, 64),
        (27, 16, 37, false, false, 64),
        (27, 16, 37, false, true, 64),
        (27, 128, 21, false, true, 64),
        (27, 128, 21, false, false, 160),
        (6, 6, 19, false, false, 8),
        (3, 33, 19, true, true, 7),
        (5, 8, 19, true, false, 100),
        (30, 1, 9, true, false, 16),
        (4, 16, 0, false, false, 64),
    ] {
        let dt = if bf { DType::BF16 } else { DType::F32 };
        let ops: Vec<Tensor> = (0..f)
            .map(|i| Tensor::from_f32(dt, vec![s, d], vals(40 + i as u64, s * d)))
            .collect();
        let ins: Vec<&Tensor> = ops.iter().collect();
        let width = d + if self_i {
            f * (f + 1) / 2
        } else {
            f * (f - 1) / 2
        };
        let kb = width.div_ceil(bk);
        let fused_op = dlrm_ir::ops::interaction_blocked::op(self_i, bk, dt);
        let blocked = TensorType::new(dt, [Dim::Fixed(kb), Dim::batch(), Dim::Fixed(bk)]);
        let rows = TensorType::new(dt, [Dim::batch(), Dim::Fixed(width)]);
        let inter = Op::Interaction {
            kind: InteractionKind::Dot,
            self_interaction: self_i,
        };
        let syms = HashMap::from([("B".to_string(), s)]);
        let name = format!("f={f} d={d} s={s} self={self_i} bf16={bf} bk={bk}");
        for &k in &kernels {
            let o = JitOptions {
                kernels: k,
                ..JitOptions::default()
            };
            let run = |op: &Op, ins: &[&Tensor], out: &TensorType| {
                dlrm_codegen::jit::try_eval(op, ins, std::slice::from_ref(out), &syms, &o)
                    .unwrap_or_else(|| panic!("{name} {k:?}: a JIT kernel for {op:?}"))
                    .unwrap_or_else(|e| panic!("{name} {k:?}: {e}"))
                    .remove(0)
            };
            let fused = run(&fused_op, &ins, &blocked);
            let r = run(&inter, &ins, &rows);
            let composed = run(&Op::BlockAct { bk, dtype: dt }, &[&r], &blocked);
            assert_eq!(fused.shape, vec![kb, s, bk], "{name} {k:?}");
            same_bits(
                &format!("{name} {k:?}: fused vs composed"),
                &fused,
                &composed,
            );
            // The gradient from a blocked `dr` (garbage in the padding,
            // which is not read) against the gradient of its unblocked rows.
            let drb = Tensor::from_f32(dt, vec![kb, s, bk], vals(90, kb * s * bk));
            let dr = run(
                &Op::UnblockAct {
                    k: width,
                    dtype: dt,
                },
                &[&drb],
                &rows,
            );
            let gty = TensorType::new(DType::F32, [Dim::batch(), Dim::Fixed(d)]);
            let gtys = vec![gty; f];
            let grads = |op: &Op, first: &Tensor| {
                let mut gins = vec![first];
                gins.extend(ins.iter().copied());
                dlrm_codegen::jit::try_eval(op, &gins, &gtys, &syms, &o)
                    .unwrap_or_else(|| panic!("{name} {k:?}: a JIT kernel for {op:?}"))
                    .unwrap_or_else(|e| panic!("{name} {k:?}: {e}"))
            };
            let grad_op = dlrm_ir::ops::interaction_blocked::grad_op(self_i);
            let plain = Op::InteractionGrad {
                kind: InteractionKind::Dot,
                self_interaction: self_i,
            };
            let (gf, gc) = (grads(&grad_op, &drb), grads(&plain, &dr));
            assert_eq!(gf.len(), f, "{name} {k:?}");
            for (q, (a, b)) in gf.iter().zip(&gc).enumerate() {
                same_bits(&format!("{name} {k:?}: gradient {q}"), a, b);
            }
        }
        let ctx = EvalCtx {
            syms: &syms,
            comm: &SingleRank,
        };
        let want = eval_op(&fused_op, &ins, std::slice::from_ref(&blocked), &ctx)
            .expect("interpreter")
            .remove(0);
        let o = JitOptions::default();
        let got = dlrm_codegen::jit::try_eval(&fused_op, &ins, &[blocked], &syms, &o)
            .expect("a JIT kernel")
            .expect("runs")
            .remove(0);
        let tol = if bf { 1.0 / 128.0 } else { 1e-5 };
        for (i, (a, b)) in got.to_f32_vec().iter().zip(want.to_f32_vec()).enumerate() {
            assert!(
                (a - b).abs() <= tol * b.abs().max(1.0),
                "{name}: element {i}: {a} vs the interpreter's {b}"
            );
        }
    }
}

/// The AVX-512 forward on bf16 operands (each sample's rows widened once,
/// `native_dot::forward_widened`, or `forward_narrow` up to 16 columns)
/// gives the bits of the f32 forward on the widened values, at the DLRM
/// widths and ragged ones, with and without the diagonal.
#[test]
fn the_bf16_interaction_forward_is_the_f32_one_on_the_widened_operands() {
    if !micro::AVX512.available() {
        return; // The AVX-512 kernels only.
    }
    let o = JitOptions {
        kernels: KernelChoice::Avx512,
        ..JitOptions::default()
    };
    for (f, d, s, self_i) in [
        (9, 64, 37, false),
        (27, 128, 21, false),
        (27, 16, 19, false),
        (3, 33, 19, true),
        (5, 100, 8, false),
    ] {
        let b16: Vec<Tensor> = (0..f)
            .map(|i| Tensor::from_f32(DType::BF16, vec![s, d], vals(70 + i as u64, s * d)))
            .collect();
        let f32s: Vec<Tensor> = b16
            .iter()
            .map(|t| Tensor::f32(vec![s, d], t.to_f32_vec()))
            .collect();
        let op = Op::Interaction {
            kind: InteractionKind::Dot,
            self_interaction: self_i,
        };
        let width = d + if self_i {
            f * (f + 1) / 2
        } else {
            f * (f - 1) / 2
        };
        let ty = [TensorType::new(
            DType::F32,
            [Dim::Fixed(s), Dim::Fixed(width)],
        )];
        let run = |ops: &[Tensor]| {
            let ins: Vec<&Tensor> = ops.iter().collect();
            dlrm_codegen::jit::try_eval(&op, &ins, &ty, &HashMap::new(), &o)
                .expect("a JIT kernel")
                .expect("runs")
                .remove(0)
                .to_f32_vec()
        };
        let (a, b) = (run(&b16), run(&f32s));
        let first = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits());
        assert!(
            a.len() == b.len() && first.is_none(),
            "f={f} d={d}: element {first:?} differs"
        );
    }
}
