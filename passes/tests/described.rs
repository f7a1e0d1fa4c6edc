//! Described parameters through the pipeline ([`dlrm_passes::compile_values`]): every
//! value derived from a description equals, bit for bit, what the passes make of
//! the created tensor ([`dlrm_passes::compile_params`]), for every precision and
//! optimizer (the bf16 parts, Split-SGD and Split-Adagrad low halves, Adagrad
//! accumulators), with the default threshold (tables described) and with every
//! parameter described (the blocked MLP weights, their low halves and
//! accumulators).

use dlrm_ir::init::materialize_all;
use dlrm_ir::{ParamValue, Tensor};
use dlrm_passes::pipeline::{PipelineOptions, Precision, compile_params};
use dlrm_passes::{AdagradConfig, LossKind, Optimizer, TrainConfig, compile_values};

const TINY: &str = r#"{
    "name": "toy", "dense_features": 4, "embedding_dim": 8,
    "table_rows": [70000, 30], "pooling": [1, 3],
    "bottom_mlp": "4-16-8", "top_mlp": "16-1",
    "batch_size": 32, "learning_rate": 0.1, "seed": 5
}"#;

#[test]
fn described_values_equal_the_passes_on_created_tensors() {
    let spec = dlrm_json::ModelSpec::parse(TINY, "<toy>").expect("spec");
    let values = spec.initial_values().expect("values");
    assert!(
        matches!(values[0].1, ParamValue::Described(_)),
        "tables are described"
    );
    assert!(
        matches!(values[2].1, ParamValue::Stored(_)),
        "small weights are stored"
    );
    check(&spec, values, false);
}

/// Every weight described (threshold 0), with weights the layout pass blocks
/// with padding (`bot.0.w` is `[16, 4]`, `top.0.w` `[1, 16]`).
#[test]
fn described_blocked_weights_equal_the_passes_on_created_tensors() {
    let spec = dlrm_json::ModelSpec::parse(TINY, "<toy>").expect("spec");
    let values = spec.initial_values_describing(0).expect("values");
    assert!(
        values
            .iter()
            .all(|(_, v)| matches!(v, ParamValue::Described(_))),
        "everything is described"
    );
    check(&spec, values, true);
}

fn check(spec: &dlrm_json::ModelSpec, values: Vec<(String, ParamValue)>, all: bool) {
    let graph = spec.graph().expect("graph");
    let created: Vec<(String, Tensor)> = materialize_all(&values).expect("created");
    let adagrad = AdagradConfig {
        eps: 1e-10,
        initial_accumulator_value: 0.25,
        weight_decay: 0.0,
    };
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Mixed] {
        for optimizer in [
            None,
            Some(Optimizer::Sgd),
            Some(Optimizer::Adagrad(adagrad)),
            Some(Optimizer::RowwiseAdagrad(adagrad)),
        ] {
            let train = optimizer.map(|optimizer| TrainConfig {
                loss: LossKind::Bce,
                lr: 0.1,
                optimizer,
            });
            let opts = PipelineOptions {
                precision,
                ..PipelineOptions::optimized(train)
            };
            let case = format!("{precision} {optimizer:?}");
            let eager = compile_params(graph.clone(), created.clone(), &opts, &mut |_, _| {});
            let lazy = compile_values(graph.clone(), values.clone(), &opts, &mut |_, _| {});
            // Every combination compiles (bf16 with Adagrad as Split-Adagrad:
            // the low halves and f32 accumulators described too).
            let (eager, lazy) = match (eager, lazy) {
                (Ok(e), Ok(l)) => (e, l),
                (e, l) => panic!("{case}: eager {:?} but described {:?}", e.err(), l.err()),
            };
            assert_eq!(lazy.graph, eager.graph, "{case}");
            let names =
                |p: &[(String, Tensor)]| p.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
            let lazy_created = materialize_all(&lazy.params).expect("lazy created");
            assert_eq!(names(&lazy_created), names(&eager.params), "{case}");
            assert!(
                lazy.params
                    .iter()
                    .any(|(_, v)| matches!(v, ParamValue::Described(_))),
                "{case}: the table stays described"
            );
            if all {
                assert!(
                    lazy.params
                        .iter()
                        .all(|(_, v)| matches!(v, ParamValue::Described(_))),
                    "{case}: every parameter stays described"
                );
                assert!(
                    lazy.params.iter().any(|(_, v)| matches!(
                        v,
                        ParamValue::Described(d) if d.blocked.is_some()
                    )),
                    "{case}: blocked weights are described blocked"
                );
            }
            for ((n, a), (_, b)) in lazy_created.iter().zip(&eager.params) {
                assert_eq!(a.shape, b.shape, "{case} {n}");
                assert_eq!(a.dtype(), b.dtype(), "{case} {n}");
                let bits = |t: &Tensor| -> Vec<u32> {
                    t.to_f32_vec().iter().map(|x| x.to_bits()).collect()
                };
                assert_eq!(bits(a), bits(b), "{case} {n}");
            }
        }
    }
}
