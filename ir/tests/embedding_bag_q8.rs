//! `embedding_bag_q8` (int8 row-wise tables): the quantizer against FBGEMM's own
//! bytes, the op against `embedding_bag` on the dequantized table in every
//! operand form, the text form, and the errors.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use dlrm_ir::interp::{EvalCtx, eval_op};
use dlrm_ir::ops::embedding_bag_q8::{
    self, SCALE_BIAS_BYTES, dequantize_rows, quantize_rows, scale_bias,
};
use dlrm_ir::{Dim, Op, Pool, SingleRank, Tensor, TensorType, infer, text};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::path::Path;

fn ty(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), t.shape.iter().map(|&d| Dim::Fixed(d)))
}

fn eval(op: &Op, ins: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    let tys: Vec<TensorType> = ins.iter().map(|t| ty(t)).collect();
    let refs: Vec<&TensorType> = tys.iter().collect();
    let outs = infer(op, &refs, &[])?;
    let syms = HashMap::new();
    let ctx = EvalCtx {
        syms: &syms,
        comm: &SingleRank,
    };
    eval_op(op, ins, &outs, &ctx)
}

fn fixture(name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fbgemm_q8")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// dlrmc writes FBGEMM's bytes: `torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized`
/// (fbgemm_gpu 1.9.0) on rows of widths 1 to 128, with constant, zero, one-hot and
/// subnormal rows (`tests/fbgemm_q8/make.py`).
#[test]
fn quantizer_writes_fbgemms_bytes() {
    for d in [1usize, 7, 16, 64, 128] {
        let x: Vec<f32> = fixture(&format!("d{d}.f32"))
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let want = fixture(&format!("d{d}.u8"));
        let got = quantize_rows(&x, d).expect("finite rows");
        assert_eq!(got.len(), want.len(), "d={d}");
        let w = d + SCALE_BIAS_BYTES;
        for (r, (g, f)) in got.chunks(w).zip(want.chunks(w)).enumerate() {
            assert_eq!(g, f, "d={d}, row {r}");
        }
        // Each value comes back within half a step (plus float rounding).
        let back = dequantize_rows(&got, w);
        for (r, row) in got.chunks(w).enumerate() {
            let (s, _) = scale_bias(row);
            for j in 0..d {
                let (a, b) = (x[r * d + j], back[r * d + j]);
                let tol = s * 0.5 + 1e-6 * a.abs().max(1e-30);
                assert!((a - b).abs() <= tol, "d={d} row {r} col {j}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn rows_with_nan_or_infinity_are_refused_naming_them() {
    let e = quantize_rows(&[1.0, 2.0, 3.0, f32::NAN], 2).unwrap_err();
    assert!(e.contains("row 1") && e.contains("column 1"), "{e}");
    let e = quantize_rows(&[f32::INFINITY, 2.0], 2).unwrap_err();
    assert!(e.contains("row 0") && e.contains("inf"), "{e}");
    assert!(quantize_rows(&[1.0, 2.0, 3.0], 2).is_err());
}

fn random_table(g: &mut ChaCha8Rng, rows: usize, d: usize) -> (Vec<f32>, Tensor) {
    let x: Vec<f32> = (0..rows * d)
        .map(|_| g.random::<f32>() * 2.0 - 1.0)
        .collect();
    let q = quantize_rows(&x, d).expect("finite");
    (x, Tensor::u8(vec![rows, d + SCALE_BIAS_BYTES], q))
}

/// Every operand form is `embedding_bag` over the dequantized table, bit for bit.
#[test]
fn equals_embedding_bag_on_the_dequantized_table() {
    let mut g = ChaCha8Rng::seed_from_u64(3);
    for case in 0..40 {
        let (rows, d, s) = (
            g.random_range(1..50),
            g.random_range(1..40),
            g.random_range(0..9),
        );
        let (_, table) = random_table(&mut g, rows, d);
        let plain = Tensor::f32(
            vec![rows, d],
            dequantize_rows(table.as_u8().unwrap(), d + 8),
        );
        let mode = if g.random::<bool>() {
            Pool::Sum
        } else {
            Pool::Mean
        };
        let lens: Vec<usize> = (0..s).map(|_| g.random_range(0..5)).collect();
        let n: usize = lens.iter().sum();
        let idx: Vec<i64> = (0..n).map(|_| g.random_range(0..rows as i64)).collect();
        let mut offs = vec![0i64];
        for l in &lens {
            offs.push(offs.last().unwrap() + *l as i64);
        }
        let form = case % 4;
        let (ins, op_plain, op_q8): (Vec<Tensor>, Op, Op) = match form {
            0 => {
                // Fixed pooling [S, L].
                let l = 3;
                let idx: Vec<i64> = (0..s * l).map(|_| g.random_range(0..rows as i64)).collect();
                (
                    vec![Tensor::i64(vec![s, l], idx)],
                    Op::EmbeddingBag {
                        mode,
                        last_offset: false,
                    },
                    embedding_bag_q8::op(mode, false),
                )
            }
            1 => (
                vec![
                    Tensor::i32(vec![n], idx.iter().map(|&i| i as i32).collect()),
                    Tensor::i32(vec![s], offs[..s].iter().map(|&o| o as i32).collect()),
                ],
                Op::EmbeddingBag {
                    mode,
                    last_offset: false,
                },
                embedding_bag_q8::op(mode, false),
            ),
            2 => (
                vec![Tensor::i64(vec![n], idx), Tensor::i64(vec![s + 1], offs)],
                Op::EmbeddingBag {
                    mode,
                    last_offset: true,
                },
                embedding_bag_q8::op(mode, true),
            ),
            _ => {
                let w: Vec<f32> = (0..n).map(|_| g.random::<f32>() * 3.0).collect();
                (
                    vec![
                        Tensor::i64(vec![n], idx),
                        Tensor::i64(vec![s], offs[..s].to_vec()),
                        Tensor::f32(vec![n], w),
                    ],
                    Op::EmbeddingBagWeighted,
                    embedding_bag_q8::op(Pool::Sum, false),
                )
            }
        };
        let mut a: Vec<&Tensor> = vec![&plain];
        a.extend(ins.iter());
        let mut b: Vec<&Tensor> = vec![&table];
        b.extend(ins.iter());
        let want = eval(&op_plain, &a).expect("embedding_bag");
        let got = eval(&op_q8, &b).expect("embedding_bag_q8");
        assert_eq!(got, want, "case {case} (form {form})");
    }
}

#[test]
fn shape_and_index_errors_name_what_is_wrong() {
    let mut g = ChaCha8Rng::seed_from_u64(5);
    let (x, table) = random_table(&mut g, 4, 3);
    let idx = Tensor::i64(vec![3], vec![0, 4, 1]);
    let off = Tensor::i64(vec![2], vec![0, 1]);
    let e = eval(
        &embedding_bag_q8::op(Pool::Sum, false),
        &[&table, &idx, &off],
    )
    .unwrap_err();
    assert!(e.contains("sample 1") && e.contains('4'), "{e}");
    let f32_table = Tensor::f32(vec![4, 3], x);
    let e = eval(
        &embedding_bag_q8::op(Pool::Sum, false),
        &[&f32_table, &idx, &off],
    )
    .unwrap_err();
    assert!(e.contains("u8[R, D+8]"), "{e}");
    let narrow = Tensor::u8(vec![2, 8], vec![0; 16]);
    assert!(
        eval(
            &embedding_bag_q8::op(Pool::Sum, false),
            &[&narrow, &idx, &off]
        )
        .is_err()
    );
    let w = Tensor::f32(vec![3], vec![1.0; 3]);
    let e = eval(
        &embedding_bag_q8::op(Pool::Mean, false),
        &[&table, &idx, &off, &w],
    )
    .unwrap_err();
    assert!(e.contains("mode=sum"), "{e}");
}

#[test]
fn text_form_round_trips_and_has_no_decomposition() {
    let src = "graph @q8 {
  input %i: i64[N]
  input %o: i64[B+1]
  param %t: u8[10,12]
  %y: f32[B,4] = embedding_bag_q8 %t, %i, %o {mode=mean, last_offset=true}
  output %y
}
";
    let g = text::parse(src).expect("parses");
    let printed = text::print(&g);
    assert!(printed.contains("embedding_bag_q8"), "{printed}");
    let back = text::parse(&printed).expect("parses back");
    assert_eq!(text::print(&back), printed);
    let e = dlrm_ir::module::decompose_modules(&g)
        .unwrap_err()
        .to_string();
    assert!(e.contains("exporter"), "{e}");
    let bad = src.replace("f32[B,4]", "f32[B,5]");
    assert!(text::parse(&bad).is_err());
}
