//! The precision pass on Adagrad updates (issue 43): a bf16 MLP weight's `adagrad`
//! becomes `split_adagrad` and a bf16 table's fused `embedding_update_adagrad`
//! becomes `split_embedding_update_adagrad` (a `.lo` parameter each, the
//! accumulators f32, the parameter tensors split exactly); an unfused
//! `sparse_adagrad` on a bf16 table is refused with a clear message.

use dlrm_ir::text::parse;
use dlrm_ir::{DType, Data, Tensor};
use dlrm_passes::precision::{Precision, select};

const FUSED: &str = r#"graph @ada {
  input %x: f32[B,4]
  input %idx: i64[B,2]
  input %y: f32[B,1]
  param %w: f32[1,4]
  param %w.acc: f32[1,4]
  param %b: f32[1]
  param %t: f32[10,1]
  param %t.acc: f32[10]
  %z: f32[B,1] = linear %x, %w, %b {act=none}
  %e: f32[B,1] = embedding_bag %t, %idx {mode=sum}
  %s: f32[B,1] = add %z, %e
  %l: f32[] = mse %s, %y {denom=B}
  %ds: f32[B,1] = mse_grad %s, %y {denom=B}
  %dw: f32[1,4] = linear_dw %ds, %x
  %w.next: f32[1,4], %w.acc.next: f32[1,4] = adagrad %w, %w.acc, %dw {lr=0.1, eps=1e-10, wd=0.0, rowwise=false}
  %t.next: f32[10,1], %t.acc.next: f32[10] = embedding_update_adagrad %t, %t.acc, %ds, %idx {mode=sum, lr=0.1, eps=1e-10, rowwise=true}
  output %l
  update %w <- %w.next
  update %w.acc <- %w.acc.next
  update %t <- %t.next
  update %t.acc <- %t.acc.next
}"#;

#[test]
fn adagrad_on_bf16_parameters_becomes_split_adagrad() {
    let g = parse(FUSED).expect("parse");
    let w: Vec<f32> = vec![0.1, -0.2, 0.3337, 1.0e-3];
    let mut params = vec![
        ("w".to_string(), Tensor::f32(vec![1, 4], w.clone())),
        ("w.acc".to_string(), Tensor::f32(vec![1, 4], vec![0.5; 4])),
        ("b".to_string(), Tensor::f32(vec![1], vec![0.0])),
        ("t".to_string(), Tensor::f32(vec![10, 1], vec![0.7; 10])),
        ("t.acc".to_string(), Tensor::f32(vec![10], vec![0.5; 10])),
    ];
    let out = select(&g, Precision::Bf16, Some(&mut params)).expect("bf16 adagrad");
    let text = dlrm_ir::text::print(&out);
    for want in [
        "= split_adagrad %w, %w.lo, %w.acc, %dw {lr=0.1, eps=1e-10, wd=0.0, rowwise=false}",
        "= split_embedding_update_adagrad %t, %t.lo, %t.acc, %ds, %idx {mode=sum, lr=0.1, \
         eps=1e-10, rowwise=true, lo=0, rows=10}",
        "update %w.acc <- %w.acc.next",
        "update %t.lo <- ",
        "update %w.lo <- ",
    ] {
        assert!(text.contains(want), "no `{want}` in {text}");
    }
    dlrm_ir::verify(&out).expect("verifies");
    let get = |n: &str| &params.iter().find(|(k, _)| k == n).expect(n).1;
    assert_eq!(get("w.acc").dtype(), DType::F32);
    assert_eq!(get("t.acc").dtype(), DType::F32);
    // The halves join back to the f32 master exactly.
    let (Data::BF16(hi), Data::BF16(lo)) = (&get("w").data, &get("w.lo").data) else {
        panic!("w and w.lo are not bf16");
    };
    for ((h, l), want) in hi.iter().zip(lo).zip(&w) {
        let joined = dlrm_ir::ops::split_adagrad::join1(*h, *l);
        assert_eq!(joined.to_bits(), want.to_bits());
    }
}

#[test]
fn unfused_sparse_adagrad_on_a_bf16_table_is_refused() {
    let src = r#"graph @unfused {
  input %dy: f32[B,1]
  input %idx: i64[B,2]
  param %t: f32[10,1]
  param %t.acc: f32[10]
  %e: f32[B,1] = embedding_bag %t, %idx {mode=sum}
  %rows: f32[B,2,1] = embedding_bag_grad %dy, %idx {mode=sum}
  %t.next: f32[10,1], %t.acc.next: f32[10] = sparse_adagrad %t, %t.acc, %idx, %rows {lr=0.1, eps=1e-10, rowwise=true}
  output %e
  update %t <- %t.next
  update %t.acc <- %t.acc.next
}"#;
    let g = parse(src).expect("parse");
    let err = select(&g, Precision::Bf16, None).expect_err("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("needs the fused update") && msg.contains("sparse_adagrad"),
        "{msg}"
    );
}
