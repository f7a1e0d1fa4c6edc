//! `dlrm-run` on plans with `include_last_offset=True` bags (`embedding_bag
//! {last_offset=true}`, `[B+1]` offsets): the real PyTorch exports
//! `ts17_dot_last_offset` and `dynamo_dot_last_offset` train on synthetic data and
//! on a dataset, and serve synthetic held-out batches, at 1, 2 and 3 thread ranks
//! (table-wise or replicated tables as the planner places them, and row-wise under a
//! tiny memory budget), and log the losses of their plain-offsets twins
//! (`*_dot_offsets`: the same model, weights and data but for the last offset).
//!
//! Stated tolerance: every logged loss within 1e-5 relative of the plain twin's on
//! one rank (the tolerance of N ranks against one, `tests/e2e.rs`), the AUC within
//! 1e-4.

mod common;

use common::{compile, max_rel, real_model, run_metrics, s, tempdir};
use dlrm_data::{Learnable, write_learnable};
use std::path::Path;

/// `last` at each of `ranks` (with `extra` options too) logs `plain`'s one-rank
/// losses and AUC (both runs given `args`); returns how many losses were compared.
fn agree(plain: &Path, last: &Path, (args, extra): (&[&str], &[&str]), ranks: &[usize]) -> usize {
    let what = s(last);
    let (want, auc) = run_metrics(plain, 1, args);
    for &r in ranks {
        let (got, a) = run_metrics(last, r, &[args, extra].concat());
        assert_eq!(got.len(), want.len(), "{what} {extra:?}, {r} ranks");
        let d = max_rel(&want, &got, 0.0);
        assert!(
            d <= 1e-5,
            "{what} {extra:?}, {r} ranks: losses differ by {d} rel: {want:?} vs {got:?}"
        );
        assert!(
            (a - auc).abs() <= 1e-4,
            "{what} {extra:?}, {r} ranks: auc {a} vs {auc}"
        );
    }
    want.len()
}

#[test]
fn last_offset_exports_train_and_serve_at_any_rank_count_like_their_plain_twins() {
    let dir = tempdir();
    let ds = dir.path().join("data.ds");
    let spec = Learnable {
        samples: 600,
        dense: 13,
        rows: vec![40, 25, 60],
        generator: "tests/last_offset.rs".into(),
    };
    write_learnable(&ds, &spec).expect("dataset");
    for (last, plain) in [
        ("ts17_dot_last_offset", "ts17_dot_offsets"),
        ("dynamo_dot_last_offset", "dynamo_dot_offsets"),
    ] {
        let (lp, pp) = (
            dir.path().join(format!("{last}.plan")),
            dir.path().join(format!("{plain}.plan")),
        );
        compile(&real_model(last), &lp, &[]);
        compile(&real_model(plain), &pp, &[]);
        let train = ["--iters", "8", "--log-every", "1", "--eval-batches", "2"];
        assert_eq!(agree(&pp, &lp, (&train, &[]), &[1, 2, 3]), 8);
        // Row-wise splits: the 60-row table (1920 bytes) cannot stay whole.
        let tiny = ["--mem-per-rank", "1800B", "--no-mem-check"];
        assert_eq!(agree(&pp, &lp, (&train, &tiny), &[3]), 8);
        // Synthetic held-out inference (the AUC).
        let infer = ["--infer", "--iters", "2", "--eval-batches", "2"];
        agree(&pp, &lp, (&infer, &[]), &[1, 2, 3]);
        // A dataset (one id per sample and table).
        let data = ["--data", s(&ds), "--iters", "6", "--log-every", "1"];
        let data = [&data[..], &["--batch-size", "64"]].concat();
        assert_eq!(agree(&pp, &lp, (&data, &[]), &[1, 3]), 6);
    }
}
