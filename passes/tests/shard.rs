//! The sharding planner and the partition pass's row-wise and data-parallel
//! placements: per-rank graph structure and the numerical equivalence of the
//! partitioned training step with the single-device one (same tolerance as
//! `partition.rs`: 1e-5 relative).

#![allow(clippy::unwrap_used)]

mod common;

use common::{Spec, count, hand_plan, init_params, make_batch, run_ranks, run1};
use dlrm_ir::{Graph, Tensor, verify};
use dlrm_passes::partition::{Partitioned, TableInfo, tables};
use dlrm_passes::shard::{self, Machine, Network};
use dlrm_passes::{
    LossKind, PipelineOptions, PlannerOptions, ShardKind, ShardPlan, TrainConfig, compile,
    partition_with,
};
use std::collections::HashMap;

fn train(spec: &Spec, loss: LossKind, lr: f32, optimize: bool) -> Graph {
    let base = if optimize {
        PipelineOptions::optimized(None)
    } else {
        PipelineOptions::default()
    };
    let opts = PipelineOptions {
        train: Some(TrainConfig {
            loss,
            lr,
            optimizer: Default::default(),
        }),
        ..base
    };
    compile(spec.build(), &opts, &mut |_, _| {}).unwrap().0
}

/// `params` with every row shard's value added: its rows of the table.
fn shard_params(p: &Partitioned, params: &HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    let mut all = params.clone();
    for s in &p.row_shards {
        all.insert(s.param.clone(), s.slice(&params[&s.table]).unwrap());
    }
    all
}

/// The partitioned step under `plan` equals the one-device step: the loss on every
/// rank, every dense parameter and replicated table on every rank, each row shard
/// against the rows of the updated table.
fn check_plan(t: &Graph, plan: &ShardPlan) {
    let global = 12;
    let params = init_params(t, 11);
    let batch = make_batch(t, global, 5);
    let (out1, after1) = run1(t, &batch, &params);
    let loss1 = out1[0].to_f32_vec()[0];
    let p = partition_with(t, plan).unwrap();
    let with_shards = shard_params(&p, &params);
    let results = run_ranks(&p.graphs, &batch, &with_shards);
    let mut seen = 0;
    for (r, (out, after)) in results.iter().enumerate() {
        let what = format!("{} on {} ranks, rank {r}", t.name, plan.ranks);
        common::assert_close(
            &format!("{what}: loss"),
            &out[0].to_f32_vec(),
            &[loss1],
            1e-5,
        );
        for (name, v) in after {
            let want = match p.row_shards.iter().find(|s| &s.param == name) {
                Some(s) => s.slice(&after1[&s.table]).unwrap(),
                None => after1[name].clone(),
            };
            common::assert_close(
                &format!("{what}: {name}"),
                &v.to_f32_vec(),
                &want.to_f32_vec(),
                1e-5,
            );
            seen += 1;
        }
    }
    assert!(seen >= params.len(), "every parameter is checked somewhere");
}

#[test]
fn row_wise_tables_train_like_one_device() {
    for (spec, optimize) in [
        (Spec::dot(), false),
        (Spec::dot(), true),
        (Spec::offsets(), false),
        (Spec::offsets(), true),
        (Spec::cat(), true),
        (Spec::shared(), false),
    ] {
        let t = train(&spec, LossKind::Bce, 0.5, optimize);
        let ts = tables(&t).unwrap();
        // Table 0 split over 3 ranks, table 1 over 2, table 2 whole on rank 0.
        let plan = hand_plan(
            &ts,
            3,
            &[
                (ShardKind::RowWise, 3),
                (ShardKind::RowWise, 2),
                (ShardKind::TableWise, 0),
            ],
        );
        let p = partition_with(&t, &plan).unwrap();
        for g in &p.graphs {
            verify(g).unwrap();
            assert_eq!(count(g, "all_to_all"), 2, "{}", g.name);
        }
        // Every rank adds the partial sums: (3 - 1) + (2 - 1) adds per bag set.
        let rows_bags: usize = p
            .graphs
            .iter()
            .map(|g| count(g, "embedding_bag_rows"))
            .sum();
        let shared_bags = spec.bags.iter().filter(|b| b.table == 0).count();
        assert_eq!(rows_bags, 3 * shared_bags + 2);
        let upd = if optimize {
            "embedding_update_rows"
        } else {
            "sparse_sgd_rows"
        };
        let updates: usize = p.graphs.iter().map(|g| count(g, upd)).sum();
        assert_eq!(updates, 3 * shared_bags + 2, "{}", spec.name);
        assert_eq!(p.row_shards.len(), 5);
        check_plan(&t, &plan);
    }
}

#[test]
fn data_parallel_tables_train_like_one_device() {
    for (spec, optimize) in [
        (Spec::dot(), false),
        (Spec::dot(), true),
        (Spec::shared(), true),
        (Spec::cat(), false),
    ] {
        let t = train(&spec, LossKind::Mse, 0.5, optimize);
        let ts = tables(&t).unwrap();
        let plan = hand_plan(
            &ts,
            3,
            &[
                (ShardKind::DataParallel, 0),
                (ShardKind::TableWise, 2),
                (ShardKind::DataParallel, 0),
            ],
        );
        let p = partition_with(&t, &plan).unwrap();
        for g in &p.graphs {
            verify(g).unwrap();
            assert!(g.find("emb.0").is_some() && g.find("emb.2").is_some());
            assert_eq!(g.find("emb.1").is_some(), g.name.ends_with("rank2"));
            assert!(count(g, "embedding_grad_dense") >= 2, "{}", g.name);
            assert_eq!(count(g, "all_to_all"), 2);
        }
        check_plan(&t, &plan);
    }
    // All tables replicated: no exchange at all.
    let t = train(&Spec::dot(), LossKind::Bce, 0.5, true);
    let ts = tables(&t).unwrap();
    let plan = hand_plan(&ts, 2, &[(ShardKind::DataParallel, 0); 3]);
    let p = partition_with(&t, &plan).unwrap();
    for g in &p.graphs {
        assert_eq!(count(g, "all_to_all"), 0);
    }
    check_plan(&t, &plan);
}

#[test]
fn bf16_tables_replicate_and_split_by_rows() {
    let opts = PipelineOptions {
        train: Some(TrainConfig {
            loss: LossKind::Bce,
            lr: 0.5,
            optimizer: Default::default(),
        }),
        precision: dlrm_passes::Precision::Bf16,
        ..PipelineOptions::optimized(None)
    };
    let t = compile(Spec::dot().build(), &opts, &mut |_, _| {})
        .unwrap()
        .0;
    let ts = tables(&t).unwrap();
    let plan = hand_plan(
        &ts,
        2,
        &[
            (ShardKind::DataParallel, 0),
            (ShardKind::TableWise, 1),
            (ShardKind::TableWise, 0),
        ],
    );
    let p = partition_with(&t, &plan).unwrap();
    for g in &p.graphs {
        verify(g).unwrap();
        assert!(count(g, "split_sgd") >= 1);
    }
    // Table 0 over 3 ranks, table 1 over 2: the low halves split with the rows.
    let plan = hand_plan(
        &ts,
        3,
        &[
            (ShardKind::RowWise, 3),
            (ShardKind::RowWise, 2),
            (ShardKind::TableWise, 0),
        ],
    );
    let p = partition_with(&t, &plan).unwrap();
    for g in &p.graphs {
        verify(g).unwrap();
    }
    let updates: usize = p
        .graphs
        .iter()
        .map(|g| count(g, "split_embedding_update_rows"))
        .sum();
    assert_eq!(updates, 3 + 2, "one update per row shard");
    let lows: Vec<&dlrm_passes::RowShard> = p
        .row_shards
        .iter()
        .filter(|s| s.table.ends_with(".lo"))
        .collect();
    assert_eq!(lows.len(), 3 + 2, "{:?}", p.row_shards);
    // Against one device: the loss, and every shard's f32 master (high and low
    // halves joined) against the same rows of the one-device table.
    // Parameters in their declared dtypes (the low halves: arbitrary bits).
    let params: HashMap<String, Tensor> = init_params(&t, 11)
        .into_iter()
        .map(|(name, v)| {
            let dtype = t.ty(t.find(&name).unwrap()).dtype;
            let cast = Tensor::from_f32(dtype, v.shape.clone(), v.to_f32_vec());
            (name, cast)
        })
        .collect();
    let batch = make_batch(&t, 12, 5);
    let (out1, after1) = run1(&t, &batch, &params);
    let with_shards = shard_params(&p, &params);
    let results = run_ranks(&p.graphs, &batch, &with_shards);
    let master = |hi: &Tensor, lo: &Tensor| -> Vec<f32> {
        match (&hi.data, &lo.data) {
            (dlrm_ir::Data::BF16(h), dlrm_ir::Data::BF16(l)) => h
                .iter()
                .zip(l)
                .map(|(h, l)| {
                    f32::from_bits((u32::from(h.to_bits()) << 16) | u32::from(l.to_bits()))
                })
                .collect(),
            _ => panic!("split halves must be bf16"),
        }
    };
    let mut checked = 0;
    for (r, (out, after)) in results.iter().enumerate() {
        common::assert_close(
            &format!("rank {r}: loss"),
            &out[0].to_f32_vec(),
            &out1[0].to_f32_vec(),
            1e-4,
        );
        for low in &lows {
            let Some(lo_shard) = after.get(&low.param) else {
                continue;
            };
            let table = low.table.trim_end_matches(".lo");
            let hi_name = format!("{table}.rows{}_{}", low.lo, low.hi);
            let hi_shard = &after[&hi_name];
            let hi_want = p
                .row_shards
                .iter()
                .find(|s| s.param == hi_name)
                .unwrap()
                .slice(&after1[table])
                .unwrap();
            let lo_want = low.slice(&after1[&low.table]).unwrap();
            common::assert_close(
                &format!("rank {r}: {hi_name} master"),
                &master(hi_shard, lo_shard),
                &master(&hi_want, &lo_want),
                1e-5,
            );
            checked += 1;
        }
    }
    assert_eq!(checked, lows.len());
}

#[test]
fn bad_plans_are_rejected() {
    let t = train(&Spec::dot(), LossKind::Bce, 0.5, false);
    let ts = tables(&t).unwrap();
    let mut plan = hand_plan(&ts, 2, &[(ShardKind::TableWise, 0); 3]);
    plan.tables[1].shards[0].hi -= 1;
    let err = partition_with(&t, &plan).unwrap_err().to_string();
    assert!(err.contains("bad table-wise placement of `emb.1`"), "{err}");
    let mut plan = hand_plan(&ts, 2, &[(ShardKind::RowWise, 2); 3]);
    plan.tables[0].shards[1].rank = plan.tables[0].shards[0].rank;
    assert!(partition_with(&t, &plan).is_err());
    let plan = hand_plan(&ts, 2, &[(ShardKind::TableWise, 5); 3]);
    assert!(partition_with(&t, &plan).is_err());
}

fn info(name: &str, rows: usize, dim: usize, lookups: usize) -> TableInfo {
    TableInfo {
        name: name.into(),
        rows,
        dim,
        elem_bytes: 4,
        lookups_per_sample: lookups,
        bags: 1,
        state_bytes_per_row: 0,
        row_wise: true,
    }
}

fn table_bytes(t: &TableInfo) -> u64 {
    (t.rows * t.dim * t.elem_bytes) as u64
}

#[test]
fn planner_honours_the_memory_budget() {
    let ts: Vec<TableInfo> = (0..6)
        .map(|i| info(&format!("t{i}"), 10_000 * (i + 1), 64, 1 + i % 3))
        .collect();
    let biggest = ts.iter().map(table_bytes).max().unwrap();
    for ranks in [2, 3, 4, 8] {
        let budget = biggest / 2 + 1;
        let opts = PlannerOptions {
            mem_per_rank: budget,
            ..PlannerOptions::new(ranks, 2048)
        };
        let Ok(plan) = shard::plan(&ts, &opts) else {
            // Too few ranks for the budget: it must say so.
            let err = shard::plan(&ts, &opts).unwrap_err().to_string();
            assert!(err.contains("--mem-per-rank"), "{err}");
            continue;
        };
        plan.check(&ts).unwrap();
        let mut per_rank = vec![0u64; ranks];
        for (p, t) in plan.tables.iter().zip(&ts) {
            let row = (t.dim * t.elem_bytes) as u64;
            match p.kind {
                ShardKind::DataParallel => {
                    per_rank.iter_mut().for_each(|b| *b += t.rows as u64 * row)
                }
                _ => {
                    for s in &p.shards {
                        per_rank[s.rank] += (s.hi - s.lo) as u64 * row;
                    }
                }
            }
        }
        assert!(
            per_rank.iter().all(|&b| b <= budget),
            "{ranks}: {per_rank:?} > {budget}\n{plan}"
        );
        // The largest table cannot fit one rank: it is split.
        assert_eq!(plan.tables[5].kind, ShardKind::RowWise, "{plan}");
    }
}

#[test]
fn an_infeasible_budget_is_a_clear_error() {
    let ts = vec![info("big", 1000, 16, 1), info("small", 10, 16, 1)];
    let opts = PlannerOptions {
        mem_per_rank: 1000,
        ..PlannerOptions::new(2, 64)
    };
    let err = shard::plan(&ts, &opts).unwrap_err().to_string();
    assert!(
        err.contains("table `big`") && err.contains("--mem-per-rank"),
        "{err}"
    );
    assert!(
        err.contains("bytes: 64 bytes a row, no optimizer state)"),
        "{err}"
    );
    // The bytes named count the optimizer state kept per row (here a bf16
    // table's low half), and say so: the rows alone would fit one rank.
    let mut bf = info("big", 1000, 16, 1);
    bf.elem_bytes = 2;
    bf.state_bytes_per_row = 32;
    let err = shard::plan(
        &[bf],
        &PlannerOptions {
            mem_per_rank: 17_000,
            ..PlannerOptions::new(1, 64)
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("(15.6 KiB, 16000 bytes: 32 bytes a row and 32 of its optimizer state")
            && err.contains("Split-SGD low half")
            && err.contains("Adagrad accumulator"),
        "{err}"
    );
    // A bf16 table is split to fit, like an f32 one.
    let mut bf = info("bf", 1000, 16, 1);
    bf.elem_bytes = 2;
    let plan = shard::plan(
        &[bf],
        &PlannerOptions {
            mem_per_rank: 10_000,
            ..PlannerOptions::new(4, 64)
        },
    )
    .unwrap();
    assert_eq!(plan.tables[0].kind, ShardKind::RowWise, "{plan}");
    // Too few samples for the ranks.
    let err = shard::plan(&ts, &PlannerOptions::new(8, 4))
        .unwrap_err()
        .to_string();
    assert!(err.contains("global batch"), "{err}");
    assert!(shard::plan(&ts, &PlannerOptions::new(0, 4)).is_err());
}

#[test]
fn planner_is_deterministic_and_graph_independent() {
    let spec = Spec::shared();
    let fwd = spec.build();
    let t = train(&spec, LossKind::Bce, 0.1, true);
    let (a, b) = (tables(&fwd).unwrap(), tables(&t).unwrap());
    assert_eq!(a, b);
    for ranks in 1..=6 {
        let opts = PlannerOptions::new(ranks, 12);
        let p = shard::plan(&a, &opts).unwrap();
        assert_eq!(p, shard::plan(&b, &opts).unwrap());
        assert_eq!(p, shard::plan(&a, &opts).unwrap());
    }
}

#[test]
fn more_ranks_than_tables_split_and_tiny_tables_replicate() {
    // Two hot tables and a tiny one on 8 ranks: the hot ones are split by rows, the
    // tiny one replicated (with a fast network the all-reduce of 8 rows is cheap).
    let ts = vec![
        info("hot.0", 1_000_000, 64, 20),
        info("hot.1", 1_000_000, 64, 20),
        info("tiny", 8, 16, 1),
    ];
    let opts = PlannerOptions {
        network: Network {
            latency_us: 0.5,
            gbps: 25.0,
        },
        ..PlannerOptions::new(8, 4096)
    };
    let plan = shard::plan(&ts, &opts).unwrap();
    assert_eq!(plan.tables[0].kind, ShardKind::RowWise, "{plan}");
    assert_eq!(plan.tables[1].kind, ShardKind::RowWise, "{plan}");
    assert_eq!(plan.tables[2].kind, ShardKind::DataParallel, "{plan}");
    // Split evenly over distinct ranks, and no rank idles while another holds two
    // shards' worth of work.
    let pred = shard::predict(&ts, &shard::DenseProfile::default(), &plan, &opts);
    let total: f64 = pred.per_rank.iter().map(|p| p.lookup_share).sum();
    assert!(
        (total - 1.0).abs() < 1e-9,
        "lookup shares sum to 1: {total}"
    );
    let max = pred
        .per_rank
        .iter()
        .map(|p| p.embedding_ms)
        .fold(0.0, f64::max);
    let min = pred
        .per_rank
        .iter()
        .map(|p| p.embedding_ms)
        .fold(f64::MAX, f64::min);
    assert!(max < 2.0 * min, "balanced: {pred}");
    // On one rank everything is table-wise.
    let one = shard::plan(&ts, &PlannerOptions::new(1, 4096)).unwrap();
    assert!(one.tables.iter().all(|t| t.kind == ShardKind::TableWise));
}

/// The baseline the planner must not lose to: every table table-wise, placed by the
/// LPT greedy heuristic on `rows · dim · elem_bytes + lookups_per_sample · dim`
/// (tables by decreasing cost, ties by name, each on the least-loaded rank, ties
/// to the lowest).
fn lpt(ts: &[TableInfo], ranks: usize) -> ShardPlan {
    let cost = |t: &TableInfo| {
        (t.rows * t.dim * t.elem_bytes) as f64 + (t.lookups_per_sample * t.dim) as f64
    };
    let mut order: Vec<usize> = (0..ts.len()).collect();
    order.sort_by(|&a, &b| {
        cost(&ts[b])
            .total_cmp(&cost(&ts[a]))
            .then_with(|| ts[a].name.cmp(&ts[b].name))
    });
    let mut load = vec![0.0f64; ranks];
    let mut owner = vec![0usize; ts.len()];
    for t in order {
        let mut best = 0;
        for r in 1..ranks {
            if load[r] < load[best] {
                best = r;
            }
        }
        owner[t] = best;
        load[best] += cost(&ts[t]);
    }
    let kinds: Vec<(ShardKind, usize)> = owner.iter().map(|&r| (ShardKind::TableWise, r)).collect();
    hand_plan(ts, ranks, &kinds)
}

#[test]
fn refinement_never_loses_to_plain_lpt() {
    // Uneven tables where LPT alone leaves an imbalance.
    let ts: Vec<TableInfo> = [9, 7, 6, 5, 5, 4, 3, 3, 2]
        .iter()
        .enumerate()
        .map(|(i, &k)| info(&format!("t{i}"), 50_000 * k, 32, k))
        .collect();
    let opts = PlannerOptions {
        machine: Machine {
            gflops: 20.0,
            mem_gbps: 4.0,
        },
        ..PlannerOptions::new(3, 1024)
    };
    let plan = shard::plan(&ts, &opts).unwrap();
    let dense = shard::DenseProfile {
        train: true,
        ..Default::default()
    };
    let refined = shard::predict(&ts, &dense, &plan, &opts).step_ms;
    let lpt_plan = lpt(&ts, 3);
    let plain = shard::predict(&ts, &dense, &lpt_plan, &opts).step_ms;
    assert!(refined <= plain * (1.0 + 1e-9), "{refined} > {plain}");
}

#[test]
fn scaling_curve_covers_1_to_n() {
    let ts = vec![info("a", 100_000, 64, 1), info("b", 100_000, 64, 1)];
    let dense = shard::DenseProfile {
        flops_per_sample: 2e6,
        param_bytes: 1e6,
        grad_bytes: vec![5e5, 5e5],
        train: true,
    };
    let pts = shard::scaling(&ts, &dense, &PlannerOptions::new(1024, 2048)).unwrap();
    let ranks: Vec<usize> = pts.iter().map(|p| p.ranks).collect();
    assert_eq!(ranks, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]);
    assert!((pts[0].strong_efficiency.unwrap() - 1.0).abs() < 1e-12);
    assert!((pts[0].weak_efficiency.unwrap() - 1.0).abs() < 1e-12);
    for p in &pts {
        let e = p.strong_efficiency.unwrap();
        assert!(e > 0.0 && e <= 1.0 + 1e-9, "{p:?}");
        // Weak scaling may be superlinear: per-table costs (the update's copy of
        // the table) are split over more ranks while the local batch stays.
        let w = p.weak_efficiency.unwrap();
        assert!(w > 0.0 && w.is_finite(), "{p:?}");
    }
    // Strong scaling of a fixed batch loses efficiency at scale.
    assert!(pts[10].strong_efficiency.unwrap() < pts[1].strong_efficiency.unwrap());
    assert!(shard::scaling_table(&pts).contains("1024"));
    // A budget one rank cannot meet: the curve starts where the plan is feasible.
    let opts = PlannerOptions {
        mem_per_rank: 30_000_000,
        ..PlannerOptions::new(8, 2048)
    };
    let pts = shard::scaling(&ts, &dense, &opts).unwrap();
    assert!(pts[0].strong_step_ms.is_none() && pts[0].weak_efficiency.is_none());
    assert!(
        (pts[1].strong_efficiency.unwrap() - 1.0).abs() < 1e-12,
        "{pts:?}"
    );
}

#[test]
fn option_strings_parse() {
    assert_eq!(shard::parse_bytes("512MiB").unwrap(), 512 << 20);
    assert_eq!(shard::parse_bytes("2GB").unwrap(), 2_000_000_000);
    assert_eq!(shard::parse_bytes("1000").unwrap(), 1000);
    assert!(shard::parse_bytes("12 parsecs").is_err());
    assert!(shard::parse_bytes("0").is_err());
    let n = Network::parse("5,10").unwrap();
    assert_eq!((n.latency_us, n.gbps), (5.0, 10.0));
    assert!(Network::parse("5").is_err());
    assert!(Network::parse("5,0").is_err());
    let m = Machine::parse("30,8").unwrap();
    assert_eq!((m.gflops, m.mem_gbps), (30.0, 8.0));
}
