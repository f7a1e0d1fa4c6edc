//! The `quantize-tables` pass: which tables become int8 rows, the bags that
//! read them, a bf16 bag's cast, the values, and the refusals.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use dlrm_ir::{DType, text};
use dlrm_passes::Pass;
use dlrm_passes::quantize::{QuantizeTables, quantize_tables};

const SRC: &str = "graph @q {
  input %i0: i64[B,2]
  input %i1: i64[N]
  input %o1: i64[B]
  input %w1: f32[N]
  param %t0: f32[10,4]
  param %t1: bf16[7,4]
  param %t2: f32[5,4]
  %e0: f32[B,4] = embedding_bag %t0, %i0 {mode=mean}
  %e1: bf16[B,4] = embedding_bag %t1, %i1, %o1 {mode=sum}
  %e2: f32[B,4] = embedding_bag_weighted %t0, %i1, %o1, %w1
  %m: f32[5,4] = relu %t2
  %c: f32[B,12] = interaction %e0, %e1, %e2 {kind=cat, self=false}
  output %c
  output %m
}
";

#[test]
fn bag_tables_become_int8_rows_and_others_stay() {
    let g = text::parse(SRC).expect("parses");
    let (q, tables) = quantize_tables(&g).expect("quantizes");
    let names: Vec<&str> = tables.iter().map(|t| t.param.as_str()).collect();
    // %t2 is read by `relu`: not a bag table.
    assert_eq!(names, ["t0", "t1"]);
    assert_eq!(
        (tables[1].rows, tables[1].dim, tables[1].was),
        (7, 4, DType::BF16)
    );
    let printed = text::print(&q);
    for want in [
        "param %t0: u8[10,12]",
        "param %t1: u8[7,12]",
        "param %t2: f32[5,4]",
        "= embedding_bag_q8 %t0, %i0 {mode=mean, last_offset=false}",
        "= embedding_bag_q8 %t0, %i1, %o1, %w1 {mode=sum, last_offset=false}",
        "%e1: bf16[B,4] = cast",
    ] {
        assert!(printed.contains(want), "`{want}` not in:\n{printed}");
    }
    // Quantized again: nothing left to do.
    let (_, again) = quantize_tables(&q).expect("idempotent");
    assert!(again.is_empty());
}

#[test]
fn the_pass_quantizes_the_values_it_is_given() {
    let g = text::parse(SRC).expect("parses");
    let t0: Vec<f32> = (0..40).map(|i| (i as f32 * 0.7).sin()).collect();
    let mut params = vec![
        (
            "t0".to_string(),
            dlrm_ir::Tensor::f32(vec![10, 4], t0.clone()),
        ),
        (
            "t2".to_string(),
            dlrm_ir::Tensor::f32(vec![5, 4], vec![0.5; 20]),
        ),
    ];
    let ran = QuantizeTables.run(g, Some(&mut params)).expect("runs");
    assert_eq!(ran.stats.counts["tables"], 2);
    assert_eq!(params[0].1.dtype(), DType::U8);
    assert_eq!(params[0].1.shape, [10, 12]);
    let back = dlrm_ir::ops::embedding_bag_q8::dequantize_rows(params[0].1.as_u8().unwrap(), 12);
    let worst = back
        .iter()
        .zip(&t0)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(worst <= 2.0 / 255.0, "{worst}");
    assert_eq!(params[1].1.dtype(), DType::F32);
    // A NaN in a table is refused, naming it.
    let g = text::parse(SRC).expect("parses");
    let mut bad = vec![(
        "t0".to_string(),
        dlrm_ir::Tensor::f32(vec![10, 4], vec![f32::NAN; 40]),
    )];
    let e = QuantizeTables
        .run(g, Some(&mut bad))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`t0`") && e.contains("NaN"), "{e}");
}

#[test]
fn a_training_graph_is_refused() {
    let src = "graph @t {
  input %i: i64[B,1]
  param %t: f32[4,2]
  %e: f32[B,2] = embedding_bag %t, %i {mode=sum}
  %t2: f32[4,2] = relu %t
  output %e
  update %t <- %t2
}
";
    let g = text::parse(src).expect("parses");
    let e = quantize_tables(&g).unwrap_err().to_string();
    assert!(
        e.contains("training graph") && e.contains("serve only"),
        "{e}"
    );
}
