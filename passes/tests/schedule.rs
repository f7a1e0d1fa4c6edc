//! The schedule pass on partitioned training steps: collectives start as early as
//! their operands allow, updates come last, every rank issues the same collectives
//! in the same order. (That partitioned, scheduled steps compute what one device
//! does is tested by `partition.rs` and the root end-to-end tests.)

#![allow(clippy::unwrap_used)]

mod common;

use common::{Spec, partition};
use dlrm_ir::{A2aDir, Graph, Op};
use dlrm_passes::{LossKind, PipelineOptions, TrainConfig, compile, schedule};

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

fn position(g: &Graph, pred: impl Fn(&Op) -> bool) -> Vec<usize> {
    (0..g.nodes().len())
        .filter(|&n| pred(&g.nodes()[n].op))
        .collect()
}

/// The sequence of collectives a rank issues (kind and direction).
fn collectives(g: &Graph) -> Vec<String> {
    g.nodes()
        .iter()
        .filter(|n| n.op.is_collective())
        .map(|n| match &n.op {
            Op::AllToAll { dir, .. } => format!("all_to_all {dir:?}"),
            op => op.mnemonic().to_string(),
        })
        .collect()
}

#[test]
fn collectives_early_updates_late_same_order_on_every_rank() {
    for optimize in [false, true] {
        for spec in [Spec::dot(), Spec::offsets(), Spec::cat()] {
            let t = train(&spec, optimize);
            for ranks in [2usize, 3] {
                let p = partition(&t, ranks).unwrap();
                let first = collectives(&p.graphs[0]);
                for g in &p.graphs {
                    assert_eq!(collectives(g), first, "{}: collective order", g.name);
                    let scatter = position(
                        g,
                        |op| matches!(op, Op::AllToAll { dir, .. } if *dir == A2aDir::Scatter),
                    );
                    let gemm =
                        position(g, |op| matches!(op, Op::Linear { .. } | Op::Brgemm { .. }));
                    // The exchange is issued before the first MLP layer runs.
                    assert!(scatter[0] < gemm[0], "{}: scatter after the MLP", g.name);
                    let reduces = position(g, |op| matches!(op, Op::AllReduce));
                    let updates = position(g, Op::is_update);
                    let last_reduce = *reduces.last().unwrap();
                    assert!(
                        updates.iter().all(|&u| u > last_reduce),
                        "{}: an update precedes an all_reduce",
                        g.name
                    );
                }
            }
        }
    }
}

#[test]
fn scheduling_is_idempotent_and_keeps_graphs_without_collectives() {
    let t = train(&Spec::dot(), true);
    let again = schedule(&t).unwrap();
    assert_eq!(dlrm_ir::text::print(&again), dlrm_ir::text::print(&t));
    let p = partition(&t, 3).unwrap();
    for g in &p.graphs {
        let twice = schedule(g).unwrap();
        assert_eq!(dlrm_ir::text::print(&twice), dlrm_ir::text::print(g));
    }
}
