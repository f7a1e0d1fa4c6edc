//! The fused and blocked ops (e-graph / precision) against the ops they replace:
//! the brgemm family reproduces `linear` and its gradients bit for bit on random
//! shapes (sizes that are not multiples of the blocks included), the layouts
//! round-trip with zero padding, `bce_logits` agrees with `bce(sigmoid)`,
//! `split_sgd` is an exact f32 SGD on the joined master, `embedding_update` is
//! exactly `sparse_sgd(embedding_bag_grad)`, and the text form round-trips.

#![allow(clippy::unwrap_used)]

use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::{Act, DType, Data, Dim, Op, Pool, SingleRank, Tensor, TensorType, infer, text};
use half::bf16;
use std::collections::HashMap;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn f(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn tensor(&mut self, shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        Tensor::f32(shape, (0..n).map(|_| self.f()).collect())
    }
}

fn ty(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), t.shape.iter().map(|&d| Dim::Fixed(d)))
}

/// Evaluates `op` with result types from inference.
fn eval(op: &Op, ins: &[&Tensor]) -> Vec<Tensor> {
    let tys: Vec<TensorType> = ins.iter().map(|t| ty(t)).collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    let out = infer(op, &refs, &[]).unwrap_or_else(|e| panic!("{}: {e}", op.mnemonic()));
    let syms = HashMap::from([("B".to_string(), ins[0].shape.first().copied().unwrap_or(1))]);
    let ctx = EvalCtx {
        syms: &syms,
        comm: &SingleRank,
    };
    eval_op(op, ins, &out, &ctx).unwrap_or_else(|e| panic!("{}: {e}", op.mnemonic()))
}

fn one(op: Op, ins: &[&Tensor]) -> Tensor {
    eval(&op, ins).remove(0)
}

fn act_grad(act: Act, dy: &Tensor, y: &Tensor) -> Tensor {
    match act {
        Act::None => dy.clone(),
        Act::Relu => one(Op::ReluGrad, &[dy, y]),
        Act::Sigmoid => one(Op::SigmoidGrad, &[dy, y]),
    }
}

#[test]
fn brgemm_family_reproduces_linear_bit_for_bit() {
    let mut rng = Rng(11);
    for case in 0..60 {
        let (s, k, n) = (1 + rng.below(7), 1 + rng.below(13), 1 + rng.below(11));
        let (bk, bn) = (1 + rng.below(8), 1 + rng.below(8));
        let act = [Act::None, Act::Relu, Act::Sigmoid][case % 3];
        let x = rng.tensor(vec![s, k]);
        let w = rng.tensor(vec![n, k]);
        let b = rng.tensor(vec![n]);
        let dy = rng.tensor(vec![s, n]);
        let what = format!("case {case}: s={s} k={k} n={n} bk={bk} bn={bn} {act:?}");

        let y = one(Op::Linear { act }, &[&x, &w, &b]);
        let xb = one(
            Op::BlockAct {
                bk,
                dtype: DType::F32,
            },
            &[&x],
        );
        let wb = one(Op::BlockWeight { bn, bk }, &[&w]);
        let yb = one(Op::Brgemm { act }, &[&xb, &wb, &b]);
        assert_eq!(
            one(
                Op::UnblockAct {
                    k: n,
                    dtype: DType::F32
                },
                &[&yb]
            ),
            y,
            "{what}"
        );
        // Padding is zero.
        let full = one(
            Op::BlockAct {
                bk: bn,
                dtype: DType::F32,
            },
            &[&y],
        );
        assert_eq!(yb, full, "{what}: padding");

        let dz = act_grad(act, &dy, &y);
        let dx = one(Op::LinearDx, &[&dz, &w]);
        let dw = one(Op::LinearDw, &[&dz, &x]);
        let db = one(Op::LinearDb, &[&dz]);
        let dyb = one(
            Op::BlockAct {
                bk: bn,
                dtype: DType::F32,
            },
            &[&dy],
        );
        let (dg_ins, wg_ins): (Vec<&Tensor>, Vec<&Tensor>) = if act == Act::None {
            (vec![&dyb, &wb], vec![&dyb, &xb])
        } else {
            (vec![&dyb, &yb, &wb], vec![&dyb, &yb, &xb])
        };
        let dxb = one(
            Op::BrgemmDgrad {
                act,
                mask: Act::None,
                dtype: DType::F32,
            },
            &dg_ins,
        );
        assert_eq!(
            one(
                Op::UnblockAct {
                    k,
                    dtype: DType::F32
                },
                &[&dxb]
            ),
            dx,
            "{what}: dgrad"
        );
        let wg = eval(&Op::BrgemmWgrad { act, n }, &wg_ins);
        assert_eq!(
            one(Op::UnblockWeight { n, k }, &[&wg[0]]),
            dw,
            "{what}: wgrad"
        );
        assert_eq!(wg[1], db, "{what}: bias grad");
        assert_eq!(
            wg[0],
            one(Op::BlockWeight { bn, bk }, &[&dw]),
            "{what}: wgrad padding"
        );
    }
}

#[test]
fn layouts_round_trip_and_convert() {
    let mut rng = Rng(3);
    let x = rng.tensor(vec![5, 11]);
    let xb = one(
        Op::BlockAct {
            bk: 4,
            dtype: DType::BF16,
        },
        &[&x],
    );
    assert_eq!(xb.shape, vec![3, 5, 4]);
    assert_eq!(xb.dtype(), DType::BF16);
    let back = one(
        Op::UnblockAct {
            k: 11,
            dtype: DType::F32,
        },
        &[&xb],
    );
    let want: Vec<f32> = x
        .to_f32_vec()
        .iter()
        .map(|&v| bf16::from_f32(v).to_f32())
        .collect();
    assert_eq!(back.to_f32_vec(), want);
    let w = rng.tensor(vec![7, 5]);
    let wb = one(Op::BlockWeight { bn: 3, bk: 2 }, &[&w]);
    assert_eq!(wb.shape, vec![3, 3, 2, 3]);
    assert_eq!(one(Op::UnblockWeight { n: 7, k: 5 }, &[&wb]), w);
    // Bad shapes are errors, not panics.
    let bad = TensorType::f32([Dim::Fixed(3), Dim::batch(), Dim::Fixed(4)]);
    assert!(
        infer(
            &Op::UnblockAct {
                k: 13,
                dtype: DType::F32
            },
            &[&bad],
            &[]
        )
        .is_err()
    );
    assert!(
        infer(
            &Op::UnblockAct {
                k: 8,
                dtype: DType::F32
            },
            &[&bad],
            &[]
        )
        .is_err()
    );
}

#[test]
fn bce_logits_is_bce_of_sigmoid_and_stable() {
    let mut rng = Rng(5);
    let z = Tensor::f32(vec![6, 1], (0..6).map(|_| 4.0 * rng.f()).collect());
    let y = Tensor::f32(vec![6, 1], vec![0.0, 1.0, 1.0, 0.0, 1.0, 0.0]);
    let d = Dim::batch();
    let p = one(Op::Sigmoid, &[&z]);
    let a = one(Op::Bce { denom: d.clone() }, &[&p, &y]).to_f32_vec()[0];
    let b = one(Op::BceLogits { denom: d.clone() }, &[&z, &y]).to_f32_vec()[0];
    assert!((a - b).abs() <= 1e-5 * a.abs(), "{a} vs {b}");
    let g1 = one(Op::BceGrad { denom: d.clone() }, &[&p, &y]);
    let g1 = one(Op::SigmoidGrad, &[&g1, &p]).to_f32_vec();
    let g2 = one(Op::BceLogitsGrad { denom: d.clone() }, &[&z, &y]).to_f32_vec();
    for (u, v) in g1.iter().zip(&g2) {
        assert!((u - v).abs() <= 1e-5, "{u} vs {v}");
    }
    let big = Tensor::f32(vec![2, 1], vec![100.0, -100.0]);
    let l = one(
        Op::BceLogits { denom: d },
        &[&big, &Tensor::f32(vec![2, 1], vec![0.0, 1.0])],
    );
    assert!((l.to_f32_vec()[0] - 100.0).abs() < 1e-3, "{l:?}");
}

#[test]
fn split_sgd_is_exact_fp32_sgd_on_the_master() {
    let mut rng = Rng(9);
    let w: Vec<f32> = (0..40).map(|_| rng.f()).collect();
    let g = rng.tensor(vec![5, 8]);
    let hi = Tensor::bf16(
        vec![5, 8],
        w.iter()
            .map(|v| bf16::from_bits((v.to_bits() >> 16) as u16))
            .collect(),
    );
    let lo = Tensor::bf16(
        vec![5, 8],
        w.iter()
            .map(|v| bf16::from_bits(v.to_bits() as u16))
            .collect(),
    );
    let mut master = Tensor::f32(vec![5, 8], w.clone());
    let (mut hi, mut lo) = (hi, lo);
    for _ in 0..5 {
        master = one(Op::Sgd { lr: 0.3 }, &[&master, &g]);
        let r = eval(&Op::SplitSgd { lr: 0.3 }, &[&hi, &lo, &g]);
        hi = r[0].clone();
        lo = r[1].clone();
    }
    let (Data::BF16(h), Data::BF16(l)) = (&hi.data, &lo.data) else {
        panic!()
    };
    let joined: Vec<f32> = h
        .iter()
        .zip(l)
        .map(|(a, b)| f32::from_bits((u32::from(a.to_bits()) << 16) | u32::from(b.to_bits())))
        .collect();
    assert_eq!(joined, master.to_f32_vec());
}

#[test]
fn split_embedding_update_is_the_f32_update_of_the_master() {
    let mut rng = Rng(33);
    let master = rng.tensor(vec![6, 3]);
    let split = |t: &Tensor| {
        let v = t.to_f32_vec();
        (
            Tensor::bf16(
                vec![6, 3],
                v.iter()
                    .map(|x| bf16::from_bits((x.to_bits() >> 16) as u16))
                    .collect(),
            ),
            Tensor::bf16(
                vec![6, 3],
                v.iter()
                    .map(|x| bf16::from_bits(x.to_bits() as u16))
                    .collect(),
            ),
        )
    };
    let dy = rng.tensor(vec![4, 3]);
    let idx = Tensor::i64(vec![4, 2], vec![0, 5, 5, 5, 2, 0, 1, 1]);
    let want = one(
        Op::EmbeddingUpdate {
            mode: Pool::Mean,
            lr: 0.7,
        },
        &[&master, &dy, &idx],
    );
    let (hi, lo) = split(&master);
    let got = eval(
        &Op::SplitEmbeddingUpdate {
            mode: Pool::Mean,
            lr: 0.7,
        },
        &[&hi, &lo, &dy, &idx],
    );
    let (wh, wl) = split(&want);
    let bits = |t: &Tensor| match &t.data {
        Data::BF16(v) => v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>(),
        _ => panic!("bf16"),
    };
    assert_eq!(bits(&got[0]), bits(&wh));
    assert_eq!(bits(&got[1]), bits(&wl));
    let bad = Tensor::i64(vec![4, 2], vec![0, 6, 0, 0, 0, 0, 0, 0]);
    let tys = [ty(&hi), ty(&lo)];
    let syms = HashMap::new();
    let ctx = EvalCtx {
        syms: &syms,
        comm: &SingleRank,
    };
    let op = Op::SplitEmbeddingUpdate {
        mode: Pool::Sum,
        lr: 0.1,
    };
    assert!(eval_op(&op, &[&hi, &lo, &dy, &bad], &tys, &ctx).is_err());
}

#[test]
fn embedding_update_is_bag_grad_then_sparse_sgd() {
    let mut rng = Rng(21);
    let table = rng.tensor(vec![6, 3]);
    let dy = rng.tensor(vec![4, 3]);
    let idx = Tensor::i64(vec![4, 2], vec![0, 5, 5, 5, 2, 0, 1, 1]);
    for mode in [Pool::Sum, Pool::Mean] {
        let rows = one(
            Op::EmbeddingBagGrad {
                mode,
                last_offset: false,
            },
            &[&dy, &idx],
        );
        let want = one(Op::SparseSgd { lr: 0.7 }, &[&table, &idx, &rows]);
        let got = one(Op::EmbeddingUpdate { mode, lr: 0.7 }, &[&table, &dy, &idx]);
        assert_eq!(got, want, "{mode:?}");
    }
    let flat = Tensor::i64(vec![5], vec![3, 3, 0, 4, 1]);
    let off = Tensor::i64(vec![4], vec![0, 2, 2, 4]);
    let rows = one(
        Op::EmbeddingBagGrad {
            mode: Pool::Mean,
            last_offset: false,
        },
        &[&dy, &flat, &off],
    );
    let want = one(Op::SparseSgd { lr: 0.5 }, &[&table, &flat, &rows]);
    let got = one(
        Op::EmbeddingUpdate {
            mode: Pool::Mean,
            lr: 0.5,
        },
        &[&table, &dy, &flat, &off],
    );
    assert_eq!(got, want);
    // An out-of-range index is an error.
    let bad = Tensor::i64(vec![4, 2], vec![0, 9, 0, 0, 0, 0, 0, 0]);
    let tys = [ty(&table)];
    let syms = HashMap::new();
    let ctx = EvalCtx {
        syms: &syms,
        comm: &SingleRank,
    };
    let op = Op::EmbeddingUpdate {
        mode: Pool::Sum,
        lr: 0.1,
    };
    assert!(eval_op(&op, &[&table, &dy, &bad], &tys, &ctx).is_err());
}

#[test]
fn fused_ops_round_trip_through_text() {
    let src = "graph @fused {
  input %x: f32[B,5]
  input %y: f32[B,3]
  input %idx: i64[B,2]
  param %w: f32[2,2,4,2]
  param %w.lo: bf16[2,2,4,2]
  param %wh: bf16[3,5]
  param %b: f32[3]
  param %t: f32[6,3]
  %xb: bf16[2,B,4] = block_act %x {bk=4, dtype=bf16}
  %yb: f32[2,B,2] = brgemm %xb, %w, %b {act=relu}
  %z: f32[B,3] = unblock_act %yb {k=3, dtype=f32}
  %wb: bf16[2,2,4,2] = block_weight %wh {bn=2, bk=4}
  %wu: bf16[3,5] = unblock_weight %wb {n=3, k=5}
  %dyb: f32[2,B,2] = block_act %y {bk=2, dtype=f32}
  %dxb: f32[2,B,4] = brgemm_dgrad %dyb, %yb, %w {act=relu}
  %dx2: f32[2,B,4] = brgemm_dgrad %dyb, %w {act=none}
  %dz2: f32[2,B,4] = brgemm_dgrad %dyb, %w, %xb {act=none, mask=sigmoid}
  %dw: f32[2,2,4,2], %db: f32[3] = brgemm_wgrad %dyb, %yb, %xb {act=relu, n=3}
  %l: f32[] = bce_logits %z, %y {denom=B}
  %g: f32[B,3] = bce_logits_grad %z, %y {denom=B}
  %t2: f32[6,3] = embedding_update %t, %y, %idx {mode=sum, lr=0.5}
  output %l
  output %wu
  output %dxb
  output %dx2
  output %dz2
  output %db
  output %g
  output %t2
}
";
    let g = text::parse(src).unwrap();
    assert_eq!(text::print(&g), src);
    let split = "graph @split {
  input %g: f32[4]
  param %w: bf16[4]
  param %w.lo: bf16[4]
  %w2: bf16[4], %lo2: bf16[4] = split_sgd %w, %w.lo, %g {lr=0.25}
  output %w2
  update %w <- %w2
  update %w.lo <- %lo2
}
";
    assert_eq!(text::print(&text::parse(split).unwrap()), split);
}
