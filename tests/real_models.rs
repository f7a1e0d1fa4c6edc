//! The headline path on real PyTorch exports of every bag layout
//! (`frontends/onnx/test_cases/real/`, made by `export_pytorch.py` with
//! `torch.onnx.export`: per-table offsets, the reference DLRM's stacked `[T, B]`
//! offsets and its Criteo mode, fixed pooling, `mean`, per-sample weights,
//! `include_last_offset`, int32, TorchRec's jagged values + lengths; TorchScript at
//! opsets 11-17 and dynamo): `dlrmc compile` then `dlrm-run PLAN --ranks N` trains
//! on synthetic data at 1, 2 and 4 thread ranks with the same losses, serves
//! synthetic held-out batches at 2 ranks, and serves the case's own inputs (in the
//! model's own input names and layout, as ONNX Runtime is fed) within 1e-5 of
//! PyTorch's outputs; `dlrmc inspect` shows the input contract.
//!
//! Stated tolerance: every logged loss at N ranks within 1e-5 relative of one
//! rank's and the AUC within 1e-4 (the tolerance of N ranks against one,
//! `tests/e2e.rs`).

mod common;

use common::{DLRM_RUN, DLRMC, compile, max_rel, ok, root, run_metrics, s, tempdir};
use std::fs;
use std::path::{Path, PathBuf};

/// The ONNX file of real export `name`.
fn model(name: &str) -> PathBuf {
    root()
        .join("frontends/onnx/test_cases/real")
        .join(name)
        .join("model.onnx")
}

fn cases() -> Vec<(String, PathBuf)> {
    let dir = root().join("frontends/onnx/test_cases/real");
    let mut v: Vec<(String, PathBuf)> = fs::read_dir(&dir)
        .expect("real cases")
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().to_string_lossy().into_owned();
            e.path()
                .join("model.onnx")
                .exists()
                .then(|| (name, e.path()))
        })
        .collect();
    v.sort();
    v
}

/// The largest absolute difference between two npz files' arrays of the same
/// names (every array of `want` must be in `got`).
fn max_abs_diff(got: &Path, want: &Path) -> f32 {
    let got = dlrm_onnx::npz::read(got).expect("outputs");
    let want = dlrm_onnx::npz::read(want).expect("PyTorch outputs");
    let mut worst = 0.0f32;
    for (name, w) in &want {
        let (_, g) = got
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no output `{name}`"));
        assert_eq!(g.shape, w.shape, "output `{name}`");
        for (a, b) in g.to_f32_vec().iter().zip(w.to_f32_vec()) {
            worst = worst.max((a - b).abs());
        }
    }
    worst
}

#[test]
fn every_real_export_trains_and_serves_at_1_2_and_4_ranks() {
    let all = cases();
    assert!(
        all.len() >= 24,
        "expected the committed real exports: {all:?}"
    );
    let dir = tempdir();
    for (name, case) in &all {
        let plan = dir.path().join(format!("{name}.plan"));
        compile(&case.join("model.onnx"), &plan, &[]);
        let train = ["--iters", "4", "--log-every", "1", "--eval-batches", "2"];
        let (want, auc) = run_metrics(&plan, 1, &train);
        assert_eq!(want.len(), 4, "{name}");
        assert!(want.iter().all(|l| l.is_finite()), "{name}: {want:?}");
        for ranks in [2, 4] {
            let (got, a) = run_metrics(&plan, ranks, &train);
            let d = max_rel(&want, &got, 0.0);
            assert!(
                d <= 1e-5,
                "{name}, {ranks} ranks: losses differ by {d} rel: {want:?} vs {got:?}"
            );
            assert!(
                (a - auc).abs() <= 1e-4,
                "{name}, {ranks} ranks: auc {a} vs {auc}"
            );
        }
        let infer = ["--infer", "--iters", "2", "--eval-batches", "2"];
        let (_, a) = run_metrics(&plan, 2, &infer);
        assert!(a.is_finite(), "{name}: served AUC {a}");
        // The case's own inputs, in the model's names and layout.
        let out = dir.path().join(format!("{name}.out.npz"));
        let inputs = case.join("inputs_7.npz");
        ok(
            DLRM_RUN,
            &[
                s(&plan),
                "--infer",
                "--inputs",
                s(&inputs),
                "--outputs",
                s(&out),
                "-q",
            ],
        );
        let d = max_abs_diff(&out, &case.join("outputs_7.npz"));
        assert!(
            d <= 1e-5,
            "{name}: served outputs differ from PyTorch's by {d}"
        );
    }
}

/// `dlrm-run --pooling` draws the synthetic bags' sizes: 1 to 100 ids a bag on the
/// reference layout and per table on TorchRec's jagged batch, with the same losses
/// at 1 and 3 ranks; a size a fixed-pooling model cannot take, or a list of the
/// wrong length, is a clear error.
#[test]
fn synthetic_bag_sizes_are_drawn_as_pooling_says() {
    let dir = tempdir();
    let case = model;
    for (name, pooling) in [("ts17_dot_stacked", "1-100"), ("ts17_torchrec", "3,2,1-8")] {
        let plan = dir.path().join(format!("{name}.plan"));
        compile(&case(name), &plan, &[]);
        let args = [
            "--iters",
            "3",
            "--log-every",
            "1",
            "--eval-batches",
            "1",
            "--pooling",
            pooling,
        ];
        let (one, _) = run_metrics(&plan, 1, &args);
        let (three, _) = run_metrics(&plan, 3, &args);
        let d = max_rel(&one, &three, 0.0);
        assert!(
            d <= 1e-5,
            "{name} --pooling {pooling}: 1 vs 3 ranks {d} rel"
        );
        // Bigger bags sum more rows: the first loss differs from the default's.
        let (default, _) = run_metrics(&plan, 1, &args[..6]);
        assert_ne!(one[0], default[0], "{name}: --pooling changed nothing");
    }
    let plan = dir.path().join("fixed.plan");
    compile(&case("ts17_dot_fixed"), &plan, &[]);
    let err = common::fails(DLRM_RUN, &[s(&plan), "--iters", "1", "--pooling", "2"]);
    assert!(err.contains("hold exactly 3 id(s)"), "{err}");
    let err = common::fails(DLRM_RUN, &[s(&plan), "--iters", "1", "--pooling", "3,3"]);
    assert!(
        err.contains("lists 2 bag sizes, but the model has 3"),
        "{err}"
    );
}

/// `dlrmc inspect` shows each graph input's role and, for a model whose bags come
/// in another layout, the model's own inputs and where each canonical input comes
/// from.
#[test]
fn inspect_shows_the_input_contract() {
    let dir = tempdir();
    let case = model;
    let plan = dir.path().join("stacked.plan");
    compile(&case("ts17_dot_stacked_weighted"), &plan, &[]);
    let text = String::from_utf8(ok(DLRMC, &["inspect", s(&plan)]).stdout).expect("utf-8");
    common::assert_contains_all(
        &text,
        &[
            "inputs (stacked [T, B] tensors):",
            "offsets: i64[3,B]",
            "%offsets_1",
            "offsets[1]",
            "offsets of %emb_l.1.weight",
            "per-sample weights of %emb_l.2.weight",
            "ids of %emb_l.0.weight",
            "label",
        ],
    );
    let plan = dir.path().join("jagged.plan");
    compile(&case("ts17_torchrec"), &plan, &[]);
    let text = String::from_utf8(ok(DLRMC, &["inspect", s(&plan)]).stdout).expect("utf-8");
    common::assert_contains_all(
        &text,
        &[
            "inputs (jagged values + lengths):",
            "ids of key 1/3 of jagged (values, lengths)",
            "offsets with the last of %tables.1",
        ],
    );
}
