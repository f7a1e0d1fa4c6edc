//! Multi-hot datasets end to end: `dlrmc data generate --pooling` writes bags of
//! 1..=100 ids (and of a fixed 3), `dlrmc compile` compiles the real PyTorch
//! exports `ts17_dot_offsets` (bags with offsets) and `ts17_dot_fixed` (pooling 3),
//! and `dlrm-run --data` trains them at 1 and 3 thread ranks; a fixed-pooling model
//! on variable bags (or the wrong hotness) is refused naming the input and table.
//!
//! Stated tolerance: every logged loss at 3 ranks within 1e-5 relative of one
//! rank's (the tolerance of N ranks against one, `tests/e2e.rs`), the AUC within 1e-4.

mod common;

use common::{DLRM_RUN, DLRMC, compile, fails, max_rel, ok, real_model, run_metrics, s, tempdir};
use std::path::Path;

/// `dlrmc data generate` of a 3-table (40, 25, 60 rows), 13-dense dataset.
fn generate(ds: &Path, samples: &str, pooling: &str) {
    let tables = ["--tables", "40,25,60", "--pooling", pooling];
    ok(
        DLRMC,
        &[
            &["data", "generate", "--rows", samples, "-o", s(ds), "-q"][..],
            &tables,
        ]
        .concat(),
    );
}

/// Trains `plan` on `ds` at 1 and 3 ranks: the losses and AUC agree.
fn agree_at_1_and_3_ranks(plan: &Path, ds: &Path) {
    let args = [
        "--data",
        s(ds),
        "--iters",
        "6",
        "--log-every",
        "1",
        "--batch-size",
        "64",
    ];
    let (want, auc) = run_metrics(plan, 1, &args);
    assert_eq!(want.len(), 6, "{want:?}");
    assert!(want.iter().all(|l| l.is_finite()), "{want:?}");
    let (got, a) = run_metrics(plan, 3, &args);
    let d = max_rel(&want, &got, 0.0);
    assert!(d <= 1e-5, "losses differ by {d} rel: {want:?} vs {got:?}");
    assert!((a - auc).abs() <= 1e-4, "auc {a} vs {auc}");
}

#[test]
fn multi_hot_datasets_train_variable_and_fixed_bags_at_1_and_3_ranks() {
    let dir = tempdir();
    let (var, fixed) = (dir.path().join("var.ds"), dir.path().join("fixed.ds"));
    generate(&var, "1000", "1-100");
    let text =
        String::from_utf8(ok(DLRMC, &["data", "inspect", s(&var)]).stdout).unwrap_or_default();
    assert!(text.contains("multi-hot"), "{text}");
    let offsets = dir.path().join("offsets.plan");
    compile(&real_model("ts17_dot_offsets"), &offsets, &[]);
    agree_at_1_and_3_ranks(&offsets, &var);

    generate(&fixed, "1000", "3");
    let fixed_plan = dir.path().join("fixed.plan");
    compile(&real_model("ts17_dot_fixed"), &fixed_plan, &[]);
    agree_at_1_and_3_ranks(&fixed_plan, &fixed);
    // Bags with offsets take fixed-hotness bags too.
    agree_at_1_and_3_ranks(&offsets, &fixed);

    // A fixed pooling of 3 on variable bags, and on bags of 2.
    let run = |ds: &Path| {
        fails(
            DLRM_RUN,
            &[
                s(&fixed_plan),
                "--data",
                s(ds),
                "--iters",
                "1",
                "--batch-size",
                "64",
            ],
        )
    };
    let e = run(&var);
    assert!(
        e.contains("%indices_0") && e.contains("table 0 (`C1`)") && e.contains("varying size"),
        "{e}"
    );
    let two = dir.path().join("two.ds");
    generate(&two, "300", "3,2,3");
    let e = run(&two);
    assert!(
        e.contains("%indices_1") && e.contains("table 1 (`C2`)") && e.contains("bags of 2 ids"),
        "{e}"
    );
}
