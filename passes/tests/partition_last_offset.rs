//! The partition of last_offset bags (`include_last_offset=True`, `[B+1]` offsets):
//! the per-rank graphs take plain offsets (`[G]` on a table's holders, `[B]` for a
//! data-parallel table) and interpret to the single-device step of the last_offset
//! graph, whichever the placement (table-wise, row-wise, data-parallel) and rank
//! count, in training (unoptimised and optimised) and inference. Same tolerance as
//! `partition.rs`: 1e-5 relative.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Spec, count, hand_plan, init_params, make_batch, run_ranks, run1};
use dlrm_ir::{DType, Dim, DimExpr, Graph, Op, Pool, TensorType, verify};
use dlrm_passes::partition::{Partitioned, tables};
use dlrm_passes::{
    AdagradConfig, LossKind, Optimizer, PipelineOptions, ShardKind, ShardPlan, TrainConfig,
    compile, partition_with,
};

fn train(spec: &Spec, lr: f32, optimize: bool) -> Graph {
    train_with(spec, lr, optimize, Optimizer::Sgd)
}

fn train_with(spec: &Spec, lr: f32, optimize: bool, optimizer: Optimizer) -> Graph {
    let base = if optimize {
        PipelineOptions::optimized(None)
    } else {
        PipelineOptions::default()
    };
    let opts = PipelineOptions {
        train: Some(TrainConfig {
            loss: LossKind::Bce,
            lr,
            optimizer,
        }),
        ..base
    };
    compile(spec.build(), &opts, &mut |_, _| {}).unwrap().0
}

/// [`hand_plan`] of `g`'s tables.
fn plan(g: &Graph, ranks: usize, kinds: &[(ShardKind, usize)]) -> ShardPlan {
    hand_plan(&tables(g).unwrap(), ranks, kinds)
}

fn last_offset_nodes(g: &Graph) -> usize {
    g.nodes()
        .iter()
        .filter(|n| {
            matches!(
                n.op,
                Op::EmbeddingBag {
                    last_offset: true,
                    ..
                } | Op::EmbeddingBagGrad {
                    last_offset: true,
                    ..
                }
            )
        })
        .count()
}

/// Partitions `t` under `plan` and checks the per-rank graphs: no last_offset bag
/// left, offsets one entry per sample (`[G]` or `[B]`), and the step on `params`
/// equal to the single-device one (loss on every rank; every parameter, a row shard
/// against its rows of the updated table).
fn check(t: &Graph, plan: &ShardPlan) -> Partitioned {
    let global = 12;
    let mut params = init_params(t, 11);
    // Adagrad accumulators are sums of squares.
    for (name, v) in params.iter_mut() {
        if name.ends_with(".acc") {
            let vals = v.to_f32_vec().iter().map(|x| x.abs()).collect();
            *v = dlrm_ir::Tensor::f32(v.shape.clone(), vals);
        }
    }
    let batch = make_batch(t, global, 5);
    assert_eq!(batch.inputs["off.0"].shape, vec![global + 1]);
    let (out1, after1) = run1(t, &batch, &params);
    let p = partition_with(t, plan).unwrap();
    let mut all = params.clone();
    for s in &p.row_shards {
        all.insert(s.param.clone(), s.slice(&params[&s.table]).unwrap());
    }
    let results = run_ranks(&p.graphs, &batch, &all);
    let mut seen = 0;
    for (r, (g, (out, after))) in p.graphs.iter().zip(&results).enumerate() {
        let what = format!("{} on {} ranks, rank {r}", t.name, plan.ranks);
        verify(g).unwrap();
        assert_eq!(last_offset_nodes(g), 0, "{what}");
        for &v in g.inputs() {
            let lead = &g.ty(v).shape[0];
            if g.name_of(v).starts_with("off.") {
                assert!(lead.is_sym("G") || lead.is_sym("B"), "{what}: {lead}");
            }
        }
        if t.updates().is_empty() {
            continue;
        }
        common::assert_close(
            &format!("{what}: loss"),
            &out[0].to_f32_vec(),
            &out1[0].to_f32_vec(),
            1e-5,
        );
        for (name, v) in after {
            let want = match p.row_shards.iter().find(|s| &s.param == name) {
                Some(s) => s.slice(&after1[&s.table]).unwrap(),
                None => after1[name].clone(),
            };
            let what = format!("{what}: {name}");
            common::assert_close(&what, &v.to_f32_vec(), &want.to_f32_vec(), 1e-5);
            seen += 1;
        }
    }
    if !t.updates().is_empty() {
        assert!(seen >= params.len(), "every parameter is checked somewhere");
    }
    p
}

/// The last_offset graph computes what its plain-offsets twin computes on the same
/// batch (its offsets without the last entry): the single-device reference of the
/// checks below is itself right.
#[test]
fn last_offset_step_equals_the_plain_offsets_step() {
    for optimize in [false, true] {
        let lt = train(&Spec::last_offset(), 0.5, optimize);
        let pt = train(&Spec::offsets(), 0.5, optimize);
        assert_eq!(last_offset_nodes(&lt), 4, "two bags and their gradients");
        let params = init_params(&lt, 11);
        let lb = make_batch(&lt, 12, 5);
        let pb = make_batch(&pt, 12, 5);
        let (lo, la) = run1(&lt, &lb, &params);
        let (po, pa) = run1(&pt, &pb, &params);
        assert_eq!(lo[0].to_f32_vec(), po[0].to_f32_vec());
        for (name, v) in &pa {
            assert_eq!(v, &la[name], "{name}");
            assert_ne!(v, &params[name], "{name} did not change");
        }
    }
}

#[test]
fn table_wise_last_offset_bags_train_like_one_device() {
    for optimize in [false, true] {
        let t = train(&Spec::last_offset(), 0.5, optimize);
        for ranks in 1..=3 {
            let kinds: Vec<_> = (0..3).map(|i| (ShardKind::TableWise, i % ranks)).collect();
            let p = check(&t, &plan(&t, ranks, &kinds));
            let sgds: usize = p.graphs.iter().map(|g| count(g, "sparse_sgd")).sum();
            let fused: usize = p.graphs.iter().map(|g| count(g, "embedding_update")).sum();
            // The last_offset bags keep their unfused update (no fused form); the
            // fixed bag's is fused at -O1.
            assert_eq!((sgds, fused), if optimize { (2, 1) } else { (3, 0) });
        }
    }
}

#[test]
fn row_wise_and_data_parallel_last_offset_bags_train_like_one_device() {
    use ShardKind::{DataParallel, RowWise, TableWise};
    for optimize in [false, true] {
        let t = train(&Spec::last_offset(), 0.5, optimize);
        let p = check(
            &t,
            &plan(&t, 3, &[(RowWise, 3), (RowWise, 2), (TableWise, 0)]),
        );
        let rows: usize = p
            .graphs
            .iter()
            .map(|g| count(g, "embedding_bag_rows"))
            .sum();
        assert_eq!(rows, 5);
        assert_eq!(p.row_shards.len(), 5);
        let p = check(
            &t,
            &plan(
                &t,
                3,
                &[(DataParallel, 0), (TableWise, 2), (DataParallel, 0)],
            ),
        );
        for g in &p.graphs {
            assert!(count(g, "embedding_grad_dense") >= 2, "{}", g.name);
            // The replicated table's offsets stay local, one per sample.
            let off = g.find("off.0").unwrap();
            assert_eq!(g.ty(off).shape, vec![Dim::batch()]);
        }
        check(
            &t,
            &plan(&t, 2, &[(DataParallel, 0), (RowWise, 2), (RowWise, 2)]),
        );
    }
}

/// Adagrad's unfused `sparse_adagrad` on a last_offset bag gradient (no fused
/// form) becomes the plain bag's fused `embedding_update_adagrad`, the form the
/// partition places.
#[test]
fn last_offset_adagrad_tables_train_like_one_device() {
    use ShardKind::{DataParallel, RowWise, TableWise};
    let cfg = AdagradConfig::default();
    for opt in [Optimizer::Adagrad(cfg), Optimizer::RowwiseAdagrad(cfg)] {
        let t = train_with(&Spec::last_offset(), 0.1, true, opt);
        assert_eq!(count(&t, "sparse_adagrad"), 2, "{}", opt.name());
        let p = check(
            &t,
            &plan(&t, 2, &[(TableWise, 1), (TableWise, 0), (TableWise, 1)]),
        );
        let fused: usize = p
            .graphs
            .iter()
            .map(|g| count(g, "embedding_update_adagrad"))
            .sum();
        assert_eq!(fused, 3, "{}", opt.name());
        check(
            &t,
            &plan(&t, 3, &[(RowWise, 3), (DataParallel, 0), (TableWise, 2)]),
        );
    }
}

#[test]
fn partitioned_last_offset_inference_matches_one_device() {
    let fwd = Spec::last_offset().build();
    let params = init_params(&fwd, 2);
    let batch = make_batch(&fwd, 10, 9);
    let (out1, _) = run1(&fwd, &batch, &params);
    let want = out1[0].to_f32_vec();
    use ShardKind::{DataParallel, RowWise, TableWise};
    for (ranks, kinds) in [
        (1, [(TableWise, 0); 3]),
        (2, [(TableWise, 1), (TableWise, 0), (TableWise, 1)]),
        (3, [(RowWise, 3), (DataParallel, 0), (TableWise, 2)]),
    ] {
        let p = check(&fwd, &plan(&fwd, ranks, &kinds));
        let mut all = params.clone();
        for s in &p.row_shards {
            all.insert(s.param.clone(), s.slice(&params[&s.table]).unwrap());
        }
        let got: Vec<f32> = run_ranks(&p.graphs, &batch, &all)
            .iter()
            .flat_map(|(out, _)| out[0].to_f32_vec())
            .collect();
        common::assert_close(&format!("prob on {ranks} ranks"), &got, &want, 1e-5);
    }
}

/// Offsets the partition cannot make plain are errors naming the node or value.
#[test]
fn last_offset_offsets_used_otherwise_are_errors() {
    let b1 = Dim::from_expr(DimExpr::sym("B").add(&DimExpr::int(1)).unwrap()).unwrap();
    let build = |plain_too: bool| {
        let mut g = Graph::new("mixed");
        let idx = g
            .add_input("idx", TensorType::new(DType::I64, [Dim::Sym("N".into())]))
            .unwrap();
        let off = g
            .add_input("off", TensorType::new(DType::I64, [b1.clone()]))
            .unwrap();
        let t = g
            .add_param("emb", TensorType::f32([Dim::Fixed(5), Dim::Fixed(4)]))
            .unwrap();
        let bag = |last_offset| Op::EmbeddingBag {
            mode: Pool::Sum,
            last_offset,
        };
        let e = g.add(bag(true), &[t, idx, off], "e").unwrap();
        g.add_output(e);
        if plain_too {
            let m = g.add(bag(false), &[t, idx, off], "m").unwrap();
            g.add_output(m);
        }
        g
    };
    let one = |g: &Graph| plan(g, 1, &[(ShardKind::TableWise, 0)]);
    let g = build(false);
    let p = partition_with(&g, &one(&g)).unwrap();
    let off = p.graphs[0].find("off").unwrap();
    assert_eq!(p.graphs[0].ty(off).shape, vec![Dim::global()]);
    let g = build(true);
    let err = tables(&g).unwrap_err().to_string();
    assert!(
        err.contains("%m") && err.contains("%off") && err.contains("last_offset"),
        "{err}"
    );
}
