//! Graph statistics: op counts, parameter sizes, FLOPs per sample.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Spec, partition};
use dlrm_passes::autodiff::autodiff;
use dlrm_passes::{GraphStats, LossKind, TrainConfig};

#[test]
fn forward_stats_of_the_dot_model() {
    let s = GraphStats::of(&Spec::dot().build());
    assert_eq!(s.ops["linear"], 4);
    assert_eq!(s.ops["embedding_bag"], 3);
    assert_eq!(s.ops["interaction"], 1);
    assert_eq!(s.ops.len(), 3);
    // Tables 7+11+5 rows x 4; bottom 4-8-4; top 10-8-1.
    let elements = (7 + 11 + 5) * 4 + (32 + 8) + (32 + 4) + (80 + 8) + (8 + 1);
    assert_eq!(s.params["f32"], elements);
    assert_eq!(s.param_bytes["f32"], 4 * elements);
    assert_eq!(s.param_count(), elements);
    assert_eq!(s.total_param_bytes(), 4 * elements);
    // linear 2MNK: 64 + 64 + 160 + 16; bags 3 x (2 lookups x 4); dot 6 pairs x 2 x 4.
    assert_eq!(s.flops_per_sample, 304.0 + 24.0 + 48.0);
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["ops"]["linear"], 4);
    assert!(s.to_string().contains("flops per sample: 376"));
}

#[test]
fn training_stats_count_backward_and_sparse_updates() {
    let t = autodiff(
        &Spec::dot().build(),
        &TrainConfig {
            loss: LossKind::Bce,
            lr: 0.1,
            optimizer: Default::default(),
        },
    )
    .unwrap();
    let s = GraphStats::of(&t);
    assert_eq!(s.ops["sgd"], 8);
    assert_eq!(s.ops["sparse_sgd"], 3);
    let forward = 376.0;
    let backward = 240.0 // linear_dx of prob, top.0, bot.1
        + 304.0 // linear_dw
        + 21.0 // linear_db: 1 + 8 + 4 + 8
        + 20.0 + 1.0 // relu_grad, sigmoid_grad
        + 1.0 + 1.0 // bce, bce_grad
        + 96.0 // interaction_grad: 6 pairs x 4 x 4
        + 24.0 // embedding_bag_grad: 3 x [1,2,4]
        + 48.0; // sparse_sgd: 2 per row-gradient element; sgd: 0
    assert_eq!(s.flops_per_sample, forward + backward);
    // Partitioned: collectives cost nothing, the per-rank graphs split the tables.
    let p = partition(&t, 2).unwrap();
    let per_rank: Vec<GraphStats> = p.graphs.iter().map(GraphStats::of).collect();
    let tables: usize = per_rank
        .iter()
        .map(|r| r.ops.get("sparse_sgd").copied().unwrap_or(0))
        .sum();
    assert_eq!(tables, 3);
    assert_eq!(per_rank[0].ops["all_reduce"], 9);
}
