//! The partition pass on table-wise plans (`common::table_wise`; `shard.rs` tests
//! the row-wise and data-parallel placements): per-rank graph structure, the tables'
//! cost-model data, and the numerical equivalence of the partitioned training step
//! with the single-device one.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Spec, count, init_params, is_input, make_batch, partition, run_ranks, run1};
use dlrm_ir::{A2aDir, DType, Dim, Graph, Op, TensorType, verify};
use dlrm_passes::partition::{TableInfo, tables};
use dlrm_passes::{
    LossKind, PipelineOptions, PlannerOptions, ShardPlan, TrainConfig, compile, partition_with,
    shard,
};

fn train(spec: &Spec, loss: LossKind, lr: f32) -> Graph {
    let opts = PipelineOptions {
        train: Some(TrainConfig {
            loss,
            lr,
            optimizer: Default::default(),
        }),
        ..Default::default()
    };
    compile(spec.build(), &opts, &mut |_, _| {}).unwrap().0
}

fn a2a(g: &Graph, want: A2aDir) -> Vec<(&dlrm_ir::Node, Vec<usize>, usize)> {
    g.nodes()
        .iter()
        .filter_map(|n| match &n.op {
            Op::AllToAll { dir, counts, rank } if *dir == want => Some((n, counts.clone(), *rank)),
            _ => None,
        })
        .collect()
}

#[test]
fn zero_ranks_is_an_error() {
    let g = Spec::dot().build();
    let zero = ShardPlan {
        ranks: 0,
        tables: common::table_wise(&g, 1).tables,
    };
    let err = partition_with(&g, &zero).unwrap_err().to_string();
    assert!(err.contains("at least 1"), "{err}");
    let ts = tables(&g).unwrap();
    let err = shard::plan(&ts, &PlannerOptions::new(0, 12))
        .unwrap_err()
        .to_string();
    assert!(err.contains("at least 1"), "{err}");
}

#[test]
fn training_graphs_partition_for_1_to_5_ranks() {
    for spec in [Spec::dot(), Spec::offsets(), Spec::shared(), Spec::cat()] {
        let t = train(&spec, LossKind::Bce, 0.1);
        let n_tables = spec.tables.len();
        let n_bags = spec.bags.len();
        let dense_params = t.params().len() - n_tables;
        for ranks in 1..=5 {
            let p = partition(&t, ranks).unwrap();
            assert_eq!(p.graphs.len(), ranks);
            assert_eq!(p.plan.ranks, ranks);
            // Each table is owned exactly once, and only its owner holds it.
            let mut owners = vec![Vec::new(); n_tables];
            for (r, g) in p.graphs.iter().enumerate() {
                verify(g).unwrap();
                assert_eq!(g.name, format!("{}.rank{r}", t.name));
                for (k, o) in owners.iter_mut().enumerate() {
                    if g.find(&format!("emb.{k}")).is_some() {
                        o.push(r);
                    }
                }
            }
            for (k, o) in owners.iter().enumerate() {
                assert_eq!(
                    o.len(),
                    1,
                    "{} ranks {ranks}: table {k} on {o:?}",
                    spec.name
                );
                assert_eq!(p.plan.owner(&format!("emb.{k}")), Some(o[0]));
            }
            let owned_bags: Vec<usize> = (0..ranks)
                .map(|r| spec.bags.iter().filter(|b| owners[b.table][0] == r).count())
                .collect();
            for (r, g) in p.graphs.iter().enumerate() {
                let scatter = a2a(g, A2aDir::Scatter);
                let gather = a2a(g, A2aDir::Gather);
                assert_eq!(scatter.len(), 1);
                assert_eq!(gather.len(), 1);
                for (node, counts, rank) in scatter.iter().chain(&gather) {
                    assert_eq!(counts, &owned_bags, "{} ranks {ranks} rank {r}", spec.name);
                    assert_eq!(*rank, r);
                    let _ = node;
                }
                let (s, _, _) = &scatter[0];
                assert_eq!(s.inputs.len(), owned_bags[r]);
                assert_eq!(s.outputs.len(), n_bags);
                for &o in &s.outputs {
                    assert_eq!(g.ty(o).shape[0], Dim::batch());
                }
                for &i in &s.inputs {
                    assert_eq!(g.ty(i).shape[0], Dim::global());
                }
                let (ga, _, _) = &gather[0];
                assert_eq!(ga.inputs.len(), n_bags);
                assert_eq!(ga.outputs.len(), owned_bags[r]);
                assert_eq!(count(g, "embedding_bag"), owned_bags[r]);
                assert_eq!(count(g, "embedding_bag_grad"), owned_bags[r]);
                assert_eq!(count(g, "sparse_sgd"), owned_bags[r]);
                // One all_reduce per dense gradient, one for the loss.
                assert_eq!(count(g, "all_reduce"), dense_params + 1);
                assert_eq!(count(g, "sgd"), dense_params);
                for n in g.nodes() {
                    if let Op::Sgd { .. } = n.op {
                        let d = g.nodes().iter().find(|m| m.outputs.contains(&n.inputs[1]));
                        assert_eq!(d.unwrap().op, Op::AllReduce);
                    }
                    if let Op::Bce { denom } | Op::BceGrad { denom } = &n.op {
                        assert_eq!(denom, &Dim::global());
                    }
                }
                // The output is the all-reduced loss.
                let out = g.outputs()[0];
                let def = g.nodes().iter().find(|m| m.outputs.contains(&out)).unwrap();
                assert_eq!(def.op, Op::AllReduce);
                let loss_node = g
                    .nodes()
                    .iter()
                    .find(|m| m.outputs.contains(&def.inputs[0]))
                    .unwrap();
                assert!(matches!(loss_node.op, Op::Bce { .. }));
                // Index inputs: present with G iff owned.
                for (k, b) in spec.bags.iter().enumerate() {
                    let idx = g.find(&format!("idx.{k}"));
                    let off = g.find(&format!("off.{k}"));
                    if owners[b.table][0] == r {
                        let idx = idx.unwrap();
                        assert!(is_input(g, idx));
                        match off {
                            Some(off) => {
                                assert_eq!(g.ty(off).shape, vec![Dim::global()]);
                                assert!(!g.ty(idx).shape[0].is_sym("G"));
                            }
                            None => assert_eq!(g.ty(idx).shape[0], Dim::global()),
                        }
                    } else {
                        assert!(idx.is_none() && off.is_none());
                    }
                }
                // Updates: every dense param and the owned tables.
                let owned_tables = owners.iter().filter(|o| o[0] == r).count();
                assert_eq!(g.updates().len(), dense_params + owned_tables);
                // Dense inputs keep B.
                let dense = g.find("dense").unwrap();
                assert_eq!(g.ty(dense).shape[0], Dim::batch());
                let label = g.find("label").unwrap();
                assert_eq!(g.ty(label).shape[0], Dim::batch());
            }
            // Collectives in the same order on every rank.
            let seq = |g: &Graph| -> Vec<String> {
                g.nodes()
                    .iter()
                    .filter(|n| n.op.is_collective())
                    .map(|n| match n.op {
                        Op::AllReduce => format!("all_reduce:{}", g.name_of(n.inputs[0])),
                        _ => format!("{:?}", n.op).replace(char::is_numeric, ""),
                    })
                    .collect()
            };
            for g in &p.graphs {
                assert_eq!(seq(g), seq(&p.graphs[0]));
            }
        }
    }
}

#[test]
fn one_rank_is_the_graph_plus_trivial_collectives() {
    let t = train(&Spec::dot(), LossKind::Bce, 0.1);
    let p = partition(&t, 1).unwrap();
    let g = &p.graphs[0];
    let ops = |g: &Graph| -> Vec<&'static str> {
        let mut v: Vec<_> = g
            .nodes()
            .iter()
            .filter(|n| !n.op.is_collective())
            .map(|n| n.op.mnemonic())
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(ops(g), ops(&t));
    assert_eq!(g.params().len(), t.params().len());
    assert_eq!(g.inputs().len(), t.inputs().len());
    assert_eq!(g.updates().len(), t.updates().len());
    assert_eq!(
        g.nodes().len(),
        t.nodes().len() + 2 + count(&t, "sgd") + 1,
        "two all_to_all, one all_reduce per sgd and one for the loss"
    );
}

#[test]
fn inference_graphs_partition_with_local_outputs() {
    let fwd = Spec::dot().build();
    for ranks in 1..=4 {
        let p = partition(&fwd, ranks).unwrap();
        for g in &p.graphs {
            verify(g).unwrap();
            assert_eq!(count(g, "all_reduce"), 0);
            assert_eq!(a2a(g, A2aDir::Scatter).len(), 1);
            assert_eq!(a2a(g, A2aDir::Gather).len(), 0);
            assert_eq!(g.outputs().len(), 1);
            assert_eq!(
                g.ty(g.outputs()[0]),
                &TensorType::f32([Dim::batch(), Dim::Fixed(1)])
            );
            assert_eq!(g.name_of(g.outputs()[0]), "prob");
        }
    }
}

#[test]
fn train_and_inference_graphs_place_identically() {
    for spec in [Spec::dot(), Spec::shared(), Spec::offsets()] {
        let fwd = spec.build();
        let t = train(&spec, LossKind::Mse, 0.1);
        assert_eq!(tables(&fwd).unwrap(), tables(&t).unwrap());
        for ranks in 1..=5 {
            let opts = PlannerOptions::new(ranks, 12);
            let a = shard::plan(&tables(&fwd).unwrap(), &opts).unwrap();
            let b = shard::plan(&tables(&t).unwrap(), &opts).unwrap();
            assert_eq!(a, b);
            assert_eq!(partition_with(&fwd, &a).unwrap().plan, a);
            assert_eq!(partition_with(&t, &b).unwrap().plan, b);
        }
    }
}

#[test]
fn tables_report_rows_width_and_lookups() {
    let t = tables(&Spec::shared().build()).unwrap();
    assert_eq!(t.len(), 3);
    // emb.0: 7 rows x 4 f32, 2 + 3 lookups per sample over its two bags.
    assert_eq!(
        t[0],
        TableInfo {
            name: "emb.0".into(),
            rows: 7,
            dim: 4,
            elem_bytes: 4,
            lookups_per_sample: 5,
            bags: 2,
            state_bytes_per_row: 0,
            row_wise: true,
        }
    );
    let off = tables(&Spec::offsets().build()).unwrap();
    assert_eq!(off[0].lookups_per_sample, 1, "bags with offsets count 1");
}

#[test]
fn bf16_tables_partition() {
    let mut g = Graph::new("bf");
    let idx = g
        .add_input(
            "idx",
            TensorType::new(DType::I64, [Dim::batch(), Dim::Fixed(2)]),
        )
        .unwrap();
    let t = g
        .add_param(
            "emb",
            TensorType::new(DType::BF16, [Dim::Fixed(5), Dim::Fixed(4)]),
        )
        .unwrap();
    let e = g
        .add(
            Op::EmbeddingBag {
                mode: dlrm_ir::Pool::Sum,
                last_offset: false,
            },
            &[t, idx],
            "e",
        )
        .unwrap();
    g.add_output(e);
    for ranks in 1..=3 {
        let p = partition(&g, ranks).unwrap();
        for g in &p.graphs {
            verify(g).unwrap();
            let out = g.outputs()[0];
            assert_eq!(g.ty(out).dtype, DType::BF16);
        }
    }
}

#[test]
fn already_partitioned_graphs_are_rejected() {
    let p = partition(&Spec::dot().build(), 2).unwrap();
    let err = partition(&p.graphs[0], 2).unwrap_err().to_string();
    assert!(err.contains("already"), "{err}");
}

// ------------------------------------------------------------ numerical

/// The partitioned training step on N ranks equals the single-device step: same
/// loss on every rank, same updated dense parameters on every rank, same updated
/// tables on their owners.
fn check_equivalence(spec: &Spec, loss: LossKind) {
    let global = 12;
    let lr = 0.5;
    let t = train(spec, loss, lr);
    let params = init_params(&t, 11);
    let batch = make_batch(&t, global, 5);
    let (out1, after1) = run1(&t, &batch, &params);
    let loss1 = out1[0].to_f32_vec()[0];
    // The step changes every parameter (the comparison below is not vacuous).
    for (name, p) in &params {
        assert_ne!(p, &after1[name], "{name} did not change");
    }
    for ranks in 1..=4 {
        let p = partition(&t, ranks).unwrap();
        let results = run_ranks(&p.graphs, &batch, &params);
        for (r, (out, after)) in results.iter().enumerate() {
            let what = format!("{} on {ranks} ranks, rank {r}", spec.name);
            assert_eq!(out.len(), 1);
            common::assert_close(
                &format!("{what}: loss"),
                &out[0].to_f32_vec(),
                &[loss1],
                1e-5,
            );
            for (name, t) in after {
                common::assert_close(
                    &format!("{what}: {name}"),
                    &t.to_f32_vec(),
                    &after1[name].to_f32_vec(),
                    1e-5,
                );
            }
        }
        // Every parameter was updated on some rank.
        for name in params.keys() {
            assert!(results.iter().any(|(_, a)| a.contains_key(name)), "{name}");
        }
    }
}

#[test]
fn partitioned_step_matches_one_device_dot_bce() {
    check_equivalence(&Spec::dot(), LossKind::Bce);
}

#[test]
fn partitioned_step_matches_one_device_offsets_mse() {
    check_equivalence(&Spec::offsets(), LossKind::Mse);
}

#[test]
fn partitioned_step_matches_one_device_shared_table() {
    check_equivalence(&Spec::shared(), LossKind::Bce);
}

#[test]
fn partitioned_step_matches_one_device_cat_twice() {
    check_equivalence(&Spec::cat(), LossKind::Bce);
    check_equivalence(&Spec::twice(), LossKind::Mse);
}

#[test]
fn partitioned_inference_matches_one_device() {
    let fwd = Spec::dot().build();
    let params = init_params(&fwd, 2);
    let global = 10;
    let batch = make_batch(&fwd, global, 9);
    let (out1, _) = run1(&fwd, &batch, &params);
    let want = out1[0].to_f32_vec();
    for ranks in 1..=4 {
        let p = partition(&fwd, ranks).unwrap();
        let results = run_ranks(&p.graphs, &batch, &params);
        let mut got = Vec::new();
        for (out, _) in &results {
            got.extend(out[0].to_f32_vec());
        }
        common::assert_close(&format!("prob on {ranks} ranks"), &got, &want, 1e-5);
    }
}

#[test]
fn per_rank_graphs_round_trip_through_the_text_form() {
    let t = train(&Spec::offsets(), LossKind::Bce, 0.25);
    let p = partition(&t, 3).unwrap();
    let text = dlrm_ir::text::print_module(&p.graphs);
    let back = dlrm_ir::text::parse_module(&text).unwrap();
    assert_eq!(back, p.graphs);
}

#[test]
fn a_model_without_tables_is_data_parallel_only() {
    let mut g = Graph::new("mlp");
    let x = g
        .add_input("x", TensorType::f32([Dim::batch(), Dim::Fixed(3)]))
        .unwrap();
    let w = g
        .add_param("w", TensorType::f32([Dim::Fixed(2), Dim::Fixed(3)]))
        .unwrap();
    let b = g.add_param("b", TensorType::f32([Dim::Fixed(2)])).unwrap();
    let h = g
        .add(
            Op::Linear {
                act: dlrm_ir::Act::Relu,
            },
            &[x, w, b],
            "h",
        )
        .unwrap();
    let w2 = g
        .add_param("w2", TensorType::f32([Dim::Fixed(1), Dim::Fixed(2)]))
        .unwrap();
    let b2 = g.add_param("b2", TensorType::f32([Dim::Fixed(1)])).unwrap();
    let p = g
        .add(
            Op::Linear {
                act: dlrm_ir::Act::Sigmoid,
            },
            &[h, w2, b2],
            "p",
        )
        .unwrap();
    g.add_output(p);
    let opts = PipelineOptions {
        train: Some(TrainConfig {
            loss: LossKind::Bce,
            lr: 0.5,
            optimizer: Default::default(),
        }),
        ..Default::default()
    };
    let t = compile(g, &opts, &mut |_, _| {}).unwrap().0;
    let params = init_params(&t, 1);
    let batch = make_batch(&t, 9, 2);
    let (out1, after1) = run1(&t, &batch, &params);
    for ranks in [1, 3] {
        let p = partition(&t, ranks).unwrap();
        assert!(p.plan.tables.is_empty());
        assert_eq!(p.plan.ranks, ranks);
        for g in &p.graphs {
            assert_eq!(count(g, "all_to_all"), 0);
            assert_eq!(count(g, "all_reduce"), 5);
        }
        for (out, after) in run_ranks(&p.graphs, &batch, &params) {
            common::assert_close("loss", &out[0].to_f32_vec(), &out1[0].to_f32_vec(), 1e-5);
            for (name, v) in &after {
                common::assert_close(name, &v.to_f32_vec(), &after1[name].to_f32_vec(), 1e-5);
            }
        }
    }
}

#[test]
fn unsupported_structures_are_errors_naming_the_node() {
    // Indices computed by a node rather than fed as an input.
    let mut g = Graph::new("computed_idx");
    let idx = g
        .add_input(
            "idx",
            TensorType::new(DType::I64, [Dim::batch(), Dim::Fixed(2)]),
        )
        .unwrap();
    let r = g
        .add(
            Op::Reshape {
                shape: vec![Dim::batch(), Dim::Fixed(2)],
            },
            &[idx],
            "idx2",
        )
        .unwrap();
    let t = g
        .add_param("emb", TensorType::f32([Dim::Fixed(5), Dim::Fixed(4)]))
        .unwrap();
    let e = g
        .add(
            Op::EmbeddingBag {
                mode: dlrm_ir::Pool::Sum,
                last_offset: false,
            },
            &[t, r],
            "e",
        )
        .unwrap();
    g.add_output(e);
    let err = partition(&g, 2).unwrap_err().to_string();
    assert!(err.contains("%e") && err.contains("graph input"), "{err}");

    // A table used densely.
    let mut g = Graph::new("dense_table");
    let idx = g
        .add_input(
            "idx",
            TensorType::new(DType::I64, [Dim::batch(), Dim::Fixed(2)]),
        )
        .unwrap();
    let t = g
        .add_param("emb", TensorType::f32([Dim::Fixed(4), Dim::Fixed(4)]))
        .unwrap();
    let e = g
        .add(
            Op::EmbeddingBag {
                mode: dlrm_ir::Pool::Sum,
                last_offset: false,
            },
            &[t, idx],
            "e",
        )
        .unwrap();
    let bias = g
        .add_param("bias", TensorType::f32([Dim::Fixed(4)]))
        .unwrap();
    let y = g
        .add(
            Op::Linear {
                act: dlrm_ir::Act::None,
            },
            &[e, t, bias],
            "y",
        )
        .unwrap();
    g.add_output(y);
    let err = partition(&g, 2).unwrap_err().to_string();
    assert!(err.contains("%y") && err.contains("%emb"), "{err}");
}
