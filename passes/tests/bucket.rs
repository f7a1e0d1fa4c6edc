//! Gradient all-reduce buckets: the grouping (node order, closed at the byte size,
//! the loss alone), the position of a bucket (after its last gradient, before the
//! rest of backward), the same buckets on every rank, the text form round trip, and
//! the bucketed step computing what the unbucketed one and one device do.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Spec, count, init_params, make_batch, partition, run_ranks, run1, table_wise};
use dlrm_ir::{Graph, Op, text};
use dlrm_passes::{LossKind, PipelineOptions, TrainConfig, bucket, compile, partition_buckets};

fn train(spec: &Spec, optimize: bool) -> Graph {
    let cfg = TrainConfig {
        loss: LossKind::Bce,
        lr: 0.1,
        optimizer: Default::default(),
    };
    let opts = if optimize {
        PipelineOptions::optimized(Some(cfg))
    } else {
        PipelineOptions {
            train: Some(cfg),
            ..Default::default()
        }
    };
    compile(spec.build(), &opts, &mut |_, _| {}).unwrap().0
}

/// Per `all_reduce` node of `g`, in node order: its operands' names and bytes.
fn reduces(g: &Graph) -> Vec<Vec<(String, u64)>> {
    g.nodes()
        .iter()
        .filter(|n| matches!(n.op, Op::AllReduce))
        .map(|n| {
            n.inputs
                .iter()
                .map(|&v| {
                    let t = g.ty(v);
                    let bytes = t.fixed_numel().map_or(0, |e| e * t.dtype.size_bytes());
                    (g.name_of(v).to_string(), bytes as u64)
                })
                .collect()
        })
        .collect()
}

fn is_loss_reduce(g: &Graph, n: &dlrm_ir::Node) -> bool {
    n.outputs.iter().any(|o| g.outputs().contains(o))
}

#[test]
fn buckets_group_gradients_in_backward_order_up_to_the_size() {
    for optimize in [false, true] {
        let t = train(&Spec::dot(), optimize);
        let per_grad = partition_buckets(&t, &table_wise(&t, 2), 0).unwrap();
        let g0 = &per_grad.graphs[0];
        let grads: Vec<(String, u64)> = reduces(g0)
            .into_iter()
            .filter(|r| r.len() == 1 && !r[0].0.contains("loss"))
            .flatten()
            .collect();
        // Without buckets: one all_reduce per dense update, plus the loss's.
        let updates = count(g0, "sgd") + count(g0, "split_sgd");
        assert_eq!(count(g0, "all_reduce"), updates + 1);
        let total: u64 = grads.iter().map(|g| g.1).sum();
        assert!(grads.len() >= 4, "{grads:?}");
        // The gradients in the order the unbucketed step reduces them.
        let order: Vec<&str> = grads.iter().map(|g| g.0.as_str()).collect();
        for cap in [1u64, 64, 200, total / 2, total, u64::MAX] {
            let p = partition_buckets(&t, &per_grad.plan, cap).unwrap();
            let first = reduces(&p.graphs[0]);
            for g in &p.graphs {
                assert_eq!(
                    reduces(g),
                    first,
                    "{}: buckets differ between ranks",
                    g.name
                );
                // Updates still come after every all_reduce.
                let last = g
                    .nodes()
                    .iter()
                    .rposition(|n| matches!(n.op, Op::AllReduce))
                    .unwrap();
                assert!(
                    g.nodes()
                        .iter()
                        .enumerate()
                        .all(|(i, n)| !matches!(n.op, Op::Sgd { .. }) || i > last)
                );
            }
            let g = &p.graphs[0];
            let buckets: Vec<Vec<(String, u64)>> = g
                .nodes()
                .iter()
                .filter(|n| matches!(n.op, Op::AllReduce) && !is_loss_reduce(g, n))
                .map(|n| {
                    n.inputs
                        .iter()
                        .map(|&v| {
                            let t = g.ty(v);
                            let b = t.fixed_numel().unwrap() * t.dtype.size_bytes();
                            (g.name_of(v).to_string(), b as u64)
                        })
                        .collect()
                })
                .collect();
            // Concatenated, the buckets are the gradients in the same order.
            let flat: Vec<&str> = buckets.iter().flatten().map(|g| g.0.as_str()).collect();
            assert_eq!(flat, order, "cap {cap}");
            // Each bucket but the last reaches the cap, and only with its last member.
            for (k, b) in buckets.iter().enumerate() {
                let bytes: u64 = b.iter().map(|g| g.1).sum();
                let before_last = bytes - b.last().unwrap().1;
                assert!(before_last < cap, "cap {cap}: bucket {k} {b:?}");
                if k + 1 < buckets.len() {
                    assert!(bytes >= cap, "cap {cap}: bucket {k} {b:?}");
                }
            }
            let want = match cap {
                1 => grads.len(),
                u64::MAX => 1,
                _ => buckets.len(),
            };
            assert_eq!(buckets.len(), want, "cap {cap}");
            // The loss keeps its own all_reduce.
            assert_eq!(count(g, "all_reduce"), buckets.len() + 1);
        }
    }
}

#[test]
fn an_early_bucket_starts_while_backward_still_runs() {
    let t = train(&Spec::dot(), false);
    let plan = table_wise(&t, 2);
    let g = &partition_buckets(&t, &plan, 64).unwrap().graphs[0];
    let first_bucket = g
        .nodes()
        .iter()
        .position(|n| matches!(n.op, Op::AllReduce) && !is_loss_reduce(g, n))
        .unwrap();
    // Some gradient of a later bucket is computed after the first bucket is issued.
    let late = g.nodes()[first_bucket + 1..]
        .iter()
        .any(|n| matches!(n.op, Op::LinearDw | Op::LinearDb));
    assert!(late, "{}", text::print(g));
}

#[test]
fn a_graph_without_gradient_reduces_is_unchanged() {
    let t = train(&Spec::dot(), false);
    assert_eq!(bucket(&t, 1 << 20).unwrap(), t);
    let infer = Spec::dot().build();
    let p = partition(&infer, 3).unwrap();
    for g in &p.graphs {
        assert_eq!(&bucket(g, 1 << 20).unwrap(), g);
    }
}

#[test]
fn a_bucketed_rank_graph_prints_and_parses_back() {
    let t = train(&Spec::cat(), true);
    let p = partition_buckets(&t, &table_wise(&t, 2), 256).unwrap();
    for g in &p.graphs {
        let s = text::print(g);
        assert!(
            g.nodes()
                .iter()
                .any(|n| matches!(n.op, Op::AllReduce) && n.inputs.len() > 1),
            "{s}"
        );
        assert_eq!(&text::parse(&s).unwrap(), g);
    }
}

#[test]
fn bucketed_steps_equal_unbucketed_and_one_device() {
    for optimize in [false, true] {
        for spec in [Spec::dot(), Spec::offsets(), Spec::cat()] {
            let t = train(&spec, optimize);
            let params = init_params(&t, 3);
            let batch = make_batch(&t, 12, 7);
            let (one, one_params) = run1(&t, &batch, &params);
            for ranks in [1usize, 2, 4] {
                let plan = table_wise(&t, ranks);
                let plain = run_ranks(
                    &partition_buckets(&t, &plan, 0).unwrap().graphs,
                    &batch,
                    &params,
                );
                for cap in [128u64, 1 << 20] {
                    let p = partition_buckets(&t, &plan, cap).unwrap();
                    let res = run_ranks(&p.graphs, &batch, &params);
                    for (r, ((out, after), (out0, after0))) in res.iter().zip(&plain).enumerate() {
                        let what = format!("{} {ranks} ranks cap {cap} rank {r}", t.name);
                        common::assert_close(
                            &format!("{what} loss"),
                            &out[0].to_f32_vec(),
                            &out0[0].to_f32_vec(),
                            1e-5,
                        );
                        common::assert_close(
                            &format!("{what} loss vs one device"),
                            &out[0].to_f32_vec(),
                            &one[0].to_f32_vec(),
                            1e-5,
                        );
                        for (name, v) in after {
                            common::assert_close(
                                &format!("{what} {name}"),
                                &v.to_f32_vec(),
                                &after0[name].to_f32_vec(),
                                1e-5,
                            );
                            if let Some(w) = one_params.get(name) {
                                common::assert_close(
                                    &format!("{what} {name} vs one device"),
                                    &v.to_f32_vec(),
                                    &w.to_f32_vec(),
                                    1e-5,
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
