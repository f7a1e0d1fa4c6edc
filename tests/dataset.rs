//! Training from a `.ds` dataset end to end: `dlrmc compile --data` takes the table
//! sizes from it, `dlrm-run --data --epochs --eval-every` learns a generated pattern
//! (loss falls, validation AUC far above chance, metrics lines per evaluation), two
//! thread ranks give one rank's losses, and a dataset that does not fit the plan is a
//! clear error.

mod common;

use common::{DLRM_RUN, DLRMC, assert_contains_all, ok, run, s, stderr, tempdir};
use dlrm_data::{Learnable, write_learnable};
use dlrm_runtime::DataConfig;
use dlrm_runtime::driver::{Report, run_with_params};
use dlrm_runtime::{RunOptions, RunSettings, job_for};
use dlrmc::compile::{CompileOptions, compile};
use dlrmc::model::{Overrides, load_model, table_rows_of};
use std::path::{Path, PathBuf};

const ROWS: [u64; 3] = [40, 7, 300];

/// `n` samples with `dense` columns and tables of [`ROWS`] ([`write_learnable`]: the
/// label depends on dense column 0 and on the parity of table 0's id; 80% train,
/// 10% val, 10% test).
fn write_ds(dir: &Path, n: u64, dense: usize) -> PathBuf {
    let path = dir.join("data.ds");
    let spec = Learnable {
        samples: n,
        dense,
        rows: ROWS.to_vec(),
        generator: "tests/dataset.rs".into(),
    };
    write_learnable(&path, &spec).expect("dataset");
    path
}

/// A pooling-1 JSON model whose `table_rows` (wrong on purpose) the data replaces.
fn write_model(dir: &Path, dense: usize) -> PathBuf {
    let path = dir.join("model.json");
    let src = serde_json::json!({
        "name": "dlrm-ds",
        "dense_features": dense,
        "embedding_dim": 8,
        "table_rows": [10, 10, 10],
        "pooling": 1,
        "pooling_mode": "sum",
        "bottom_mlp": format!("{dense}-16-8"),
        "top_mlp": "16-1",
        "interaction": "dot",
        "interaction_itself": false,
        "loss": "bce",
        "batch_size": 64,
        "optimizer": "sgd",
        "learning_rate": 0.3,
        "seed": 1
    });
    std::fs::write(&path, src.to_string()).expect("write model");
    path
}

fn plan_for(dir: &Path, ds: &Path) -> dlrm_runtime::Plan {
    let overrides = Overrides {
        table_rows: Some(table_rows_of(ds).expect("rows")),
        ..Overrides::default()
    };
    let model = load_model(&write_model(dir, 4), overrides).expect("load");
    assert!(
        model.summary.contains("table rows from the dataset"),
        "{}",
        model.summary
    );
    compile(model, &CompileOptions::default(), &mut |_, _| {}).expect("compile")
}

fn train(plan: dlrm_runtime::Plan, ds: &Path, opts: RunOptions) -> Report {
    let opts = RunOptions {
        settings: RunSettings {
            data: Some(DataConfig::new(ds)),
            ..opts.settings
        },
        ..opts
    };
    run_with_params(job_for(plan, &opts).expect("job"), &mut |_| {})
        .expect("run")
        .0
}

#[test]
fn a_model_learns_from_a_dataset_and_is_evaluated_during_training() {
    let dir = tempdir();
    let ds = write_ds(dir.path(), 6000, 4);
    let plan = plan_for(dir.path(), &ds);
    // 4800 training samples: 75 steps of 64 per epoch; two epochs.
    let r = train(
        plan,
        &ds,
        RunOptions {
            settings: RunSettings {
                eval_every: 50,
                log_every: 1,
                ..RunSettings::default()
            },
            epochs: Some(2),
            ..RunOptions::default()
        },
    );
    assert_eq!(r.iters, 150);
    assert_eq!(r.steps_per_epoch, Some(75));
    let losses: Vec<f32> = r.losses.iter().map(|l| l.1).collect();
    let mean = |s: &[f32]| s.iter().sum::<f32>() / s.len() as f32;
    let (first, last) = (mean(&losses[..10]), mean(&losses[losses.len() - 10..]));
    assert!(last < 0.8 * first, "loss {first} -> {last}");
    let steps: Vec<u64> = r.evals.iter().map(|m| m.iter).collect();
    assert_eq!(steps, vec![50, 100, 150]);
    assert!(r.evals.iter().all(|m| m.split == "val" && m.samples == 600));
    let val: Vec<f64> = r.evals.iter().map(|m| m.auc.expect("auc")).collect();
    assert!(val[2] > 0.8, "validation AUC {val:?}");
    let best = r.best.expect("best");
    assert!(val.contains(&best.auc) && val.iter().all(|&a| a <= best.auc));
    // The final evaluation is the test split, all of it (the padded tail dropped).
    assert_eq!((r.eval_split.as_str(), r.eval_samples), ("test", 600));
    assert!(r.auc.expect("test auc") > 0.8);
    assert!(r.log_loss.expect("log loss") < 0.6);
    assert!(r.ne.expect("ne") < 1.0);
}

#[test]
fn two_thread_ranks_give_one_ranks_losses_on_a_dataset() {
    let dir = tempdir();
    let ds = write_ds(dir.path(), 3000, 4);
    let plan = plan_for(dir.path(), &ds);
    let run = |ranks| {
        let opts = RunOptions {
            settings: RunSettings {
                ranks,
                log_every: 1,
                eval_every: 6,
                ..RunSettings::default()
            },
            iters: 12,
            ..RunOptions::default()
        };
        train(plan.clone(), &ds, opts)
    };
    let (one, two) = (run(1), run(2));
    for (a, b) in one.losses.iter().zip(&two.losses) {
        let d = (a.1 - b.1).abs() / a.1.abs().max(b.1.abs());
        assert!(d <= 1e-5, "step {}: {} vs {}", a.0, a.1, b.1);
    }
    assert_eq!(one.losses.len(), 12);
    for (a, b) in one.evals.iter().zip(&two.evals) {
        assert_eq!(a.samples, b.samples);
        let (x, y) = (a.auc.expect("auc"), b.auc.expect("auc"));
        assert!((x - y).abs() < 1e-3, "step {}: AUC {x} vs {y}", a.iter);
    }
}

#[test]
fn the_cli_compiles_from_data_trains_with_eval_every_and_refuses_a_misfit() {
    let dir = tempdir();
    let ds = write_ds(dir.path(), 3000, 4);
    let model = write_model(dir.path(), 4);
    let plan = dir.path().join("plan");
    ok(
        DLRMC,
        &["compile", s(&model), "--data", s(&ds), "-o", s(&plan)],
    );
    let metrics = dir.path().join("m.jsonl");
    let out = ok(
        DLRM_RUN,
        &[
            s(&plan),
            "--data",
            s(&ds),
            "--epochs",
            "1",
            "--test-freq",
            "15",
            "--metrics",
            s(&metrics),
        ],
    );
    let err = stderr(&out);
    assert!(
        err.contains("best val AUC") && err.contains("`test`"),
        "{err}"
    );
    let text = std::fs::read_to_string(&metrics).expect("metrics");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    // 2400 training samples: 37 steps of 64; evaluations after 15, 30 and 37.
    let evals: Vec<u64> = lines
        .iter()
        .filter(|l| l["split"] == "val")
        .map(|l| l["iter"].as_u64().expect("iter"))
        .collect();
    assert_eq!(evals, vec![15, 30, 37]);
    let summary = lines.last().expect("summary");
    assert_eq!(summary["eval_split"], "test");
    assert!(summary["best_auc"].as_f64().is_some());

    // The curves of the run, and of two runs overlaid.
    let svg = dir.path().join("curves.svg");
    let copy = dir.path().join("again.jsonl");
    std::fs::copy(&metrics, &copy).expect("copy");
    ok(DLRMC, &["plot", s(&metrics), s(&copy), "-o", s(&svg)]);
    let text = std::fs::read_to_string(&svg).expect("svg");
    assert_contains_all(
        &text,
        &[
            "<svg",
            "training loss",
            "validation AUC",
            "validation log loss",
            ">\nm\n<",
            ">\nagain\n<",
        ],
    );
    assert!(
        text.matches("<polyline").count() >= 6,
        "three panels of two runs"
    );
    let out = run(DLRMC, &["plot", s(&model), "-o", s(&svg)]);
    assert!(!out.status.success());

    // A plan whose dense width differs from the data's.
    let other = tempdir();
    let ds5 = write_ds(other.path(), 500, 5);
    let out = run(DLRM_RUN, &[s(&plan), "--data", s(&ds5), "--iters", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(s(&ds5)) && err.contains("has 5 dense features"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // --epochs without --data.
    let out = run(DLRM_RUN, &[s(&plan), "--epochs", "1"]);
    assert!(!out.status.success());
}

#[test]
fn a_run_on_a_dataset_resumes_across_an_epoch_bit_for_bit() {
    use dlrm_runtime::CheckpointOptions;
    use dlrm_runtime::checkpoint::Checkpoint;
    use std::sync::Arc;
    let dir = tempdir();
    let ds = write_ds(dir.path(), 3000, 4);
    // 2400 training samples: 37 steps of 64 per epoch; step 50 is in epoch 2.
    let opts = |iters: u64| RunOptions {
        settings: RunSettings {
            log_every: 1,
            ranks: 2,
            ..RunSettings::default()
        },
        iters,
        ..RunOptions::default()
    };
    let full = train(plan_for(dir.path(), &ds), &ds, opts(50));
    let ck = dir.path().join("ck");
    let first = RunOptions {
        checkpoint: Some(CheckpointOptions {
            dir: ck.clone(),
            every: 0,
            keep: 1,
        }),
        ..opts(30)
    };
    train(plan_for(dir.path(), &ds), &ds, first);
    let c = Arc::new(Checkpoint::open(&ck).expect("checkpoint"));
    assert_eq!(c.manifest().data.next_data_step, 30);
    let resumed = train(
        plan_for(dir.path(), &ds),
        &ds,
        RunOptions {
            resume: Some(Arc::clone(&c)),
            ..opts(50)
        },
    );
    let after = |r: &Report| -> Vec<(u64, u32)> {
        r.losses
            .iter()
            .filter(|l| l.0 > 30)
            .map(|l| (l.0, l.1.to_bits()))
            .collect()
    };
    assert_eq!(after(&full).len(), 20);
    assert_eq!(after(&resumed), after(&full));
    assert_eq!(resumed.auc, full.auc);
    // Without the dataset the run would go on with synthetic data: refused.
    let e = job_for(
        plan_for(dir.path(), &ds),
        &RunOptions {
            resume: Some(c),
            ..opts(50)
        },
    )
    .expect_err("no --data");
    assert!(e.to_string().contains("resume with `--data"), "{e}");
}

/// A 3000-sample dataset in `dir` and the plan compiled from it (`dlrmc compile
/// --data`).
fn compiled_on_data(dir: &Path) -> (PathBuf, PathBuf) {
    let ds = write_ds(dir, 3000, 4);
    let model = write_model(dir, 4);
    let plan = dir.join("plan");
    ok(
        DLRMC,
        &["compile", s(&model), "--data", s(&ds), "-o", s(&plan), "-q"],
    );
    (ds, plan)
}

/// A dataset file truncated under a running job ends it with an error naming the
/// file and both sizes (exit status 1), not a silent SIGBUS death (issue 42's
/// soak fault): the dataset's files are checked before every batch, and a
/// SIGBUS in between is reported by a handler.
#[test]
fn a_dataset_truncated_under_a_running_job_is_a_named_error() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempdir();
    let (ds, plan) = compiled_on_data(dir.path());
    let mut child = Command::new(DLRM_RUN)
        .args([s(&plan), "--data", s(&ds), "--iters", "50000"])
        .args(["--log-every", "10", "--threads", "1"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlrm-run");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    // Training is under way once a step is logged.
    let mut seen = String::new();
    for line in lines.by_ref() {
        let line = line.expect("stderr line");
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("step ") {
            break;
        }
    }
    let dense = ds.join("dense.f32");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&dense)
        .and_then(|f| f.set_len(100))
        .expect("truncate");
    for line in lines {
        seen.push_str(&line.expect("stderr line"));
        seen.push('\n');
    }
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(1), "{status:?}: {seen}");
    assert!(
        seen.contains("dense.f32: changed under the running job") && seen.contains("now 100"),
        "{seen}"
    );
}

/// `--on-nonfinite`: a sample with a NaN dense value ends the run naming it
/// (`error`, the default); with `skip` that sample and one whose label is 7 are
/// left out, the run trains, and the summary and the metrics count them.
#[test]
fn on_nonfinite_error_names_the_sample_and_skip_counts_it() {
    let dir = tempdir();
    let (ds, plan) = compiled_on_data(dir.path());
    // Sample 10's dense column 2 becomes NaN, sample 20's label 7 (both training
    // samples; the files' checksums no longer match, hence --no-verify).
    let dense = ds.join("dense.f32");
    let mut bytes = std::fs::read(&dense).expect("dense");
    bytes[(10 * 4 + 2) * 4..(10 * 4 + 3) * 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&dense, bytes).expect("write dense");
    let labels = ds.join("label.u8");
    let mut l = std::fs::read(&labels).expect("labels");
    l[20] = 7;
    std::fs::write(&labels, l).expect("write labels");
    let base = [s(&plan), "--data", s(&ds), "--no-verify", "--epochs", "1"];
    let out = run(DLRM_RUN, &base);
    assert!(!out.status.success());
    let err = stderr(&out);
    // Whichever of the two a batch reaches first (the order is shuffled).
    assert!(
        (err.contains("sample 10: dense column 2") && err.contains("NaN"))
            || err.contains("sample 20: label 7 is not 0 or 1"),
        "{err}"
    );
    let metrics = dir.path().join("m.jsonl");
    let args = [
        &base[..],
        &["--on-nonfinite", "skip", "--metrics", s(&metrics)],
    ]
    .concat();
    let out = ok(DLRM_RUN, &args);
    let err = stderr(&out);
    assert!(err.contains(", 2 samples skipped (non-finite"), "{err}");
    let text = std::fs::read_to_string(&metrics).expect("metrics");
    let summary: serde_json::Value =
        serde_json::from_str(text.lines().last().expect("summary")).expect("json");
    assert_eq!(summary["skipped_samples"], 2);
    let bad = run(DLRM_RUN, &[&base[..], &["--on-nonfinite", "drop"]].concat());
    assert!(
        stderr(&bad).contains("expected `error` or `skip`, got `drop`"),
        "{}",
        stderr(&bad)
    );
}
