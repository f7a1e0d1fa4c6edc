//! The [`Trainer`] on the hand-built tiny DLRM: a checkpoint opened as the plan and
//! resumed runs to the checkpointed run's last step with its losses, a budget too
//! small for the tables is the memory refusal, and a run on 2 ranks learns.

mod common;

use dlrm_runtime::checkpoint::Checkpoint;
use dlrm_runtime::{CheckpointOptions, Report, RuntimeError, Trainer, write_plan};
use std::path::Path;
use std::sync::Arc;

/// The tiny plan written into `dir`, opened as a trainer on 2 ranks.
fn trainer(dir: &Path) -> Trainer {
    let path = dir.join("tiny.plan");
    write_plan(&path, &common::plan(0.1)).expect("write plan");
    Trainer::open(&path)
        .expect("open plan")
        .ranks(2)
        .memory_budget(256 << 20)
}

fn run(t: Trainer) -> Report {
    t.run(&mut |_| {}).expect("run")
}

#[test]
fn a_resumed_checkpoint_runs_to_its_last_step_with_the_same_losses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("ckpt");
    let whole = run(trainer(dir.path()).steps(6).checkpoint(CheckpointOptions {
        dir: root.clone(),
        every: 3,
        keep: 3,
    }));
    assert_eq!(whole.iters, 6);
    let mut steps: Vec<_> = std::fs::read_dir(&root)
        .expect("checkpoint root")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("step-"))
        })
        .collect();
    steps.sort();
    let first = &steps[0];
    let t = Trainer::open(first).expect("open checkpoint");
    let opened = Arc::clone(t.opened_checkpoint().expect("opened as a checkpoint"));
    assert_eq!(opened.step(), 3, "{steps:?}");
    // No steps given: the checkpointed run's last step.
    let resumed = run(t.ranks(2).memory_budget(256 << 20).resume(opened));
    assert_eq!(resumed.final_loss, whole.final_loss);
    // A checkpoint root opens as its newest checkpoint.
    let again = Trainer::open(&root)
        .expect("open root")
        .opened_checkpoint()
        .cloned();
    assert!(again.is_some_and(|c: Arc<Checkpoint>| c.step() == 6));
}

#[test]
fn a_budget_too_small_for_the_tables_is_refused_before_running() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = trainer(dir.path())
        .memory_budget(1024)
        .run(&mut |_| panic!("nothing runs"))
        .map(|_| ())
        .expect_err("refused");
    assert!(matches!(e, RuntimeError::Memory(_)), "{e}");
    assert!(e.to_string().starts_with("not enough memory: "), "{e}");
}

#[test]
fn two_ranks_train_as_one_rank_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let two = run(trainer(dir.path()).steps(10).seed(3));
    let one = run(trainer(dir.path()).ranks(1).steps(10).seed(3));
    assert_eq!((two.ranks, one.ranks, two.iters), (2, 1, 10));
    let (a, b) = (two.final_loss.expect("loss"), one.final_loss.expect("loss"));
    assert!((a - b).abs() <= 1e-4 * b.abs(), "{a} vs {b}");
    assert!(two.auc.is_some());
}
