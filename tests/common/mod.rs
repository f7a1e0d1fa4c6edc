//! What the top-level integration tests share: the two binaries ([`DLRMC`],
//! [`DLRM_RUN`]) and running them with their exit status checked ([`run`], [`run_env`],
//! [`ok`], [`fails`]), `dlrmc compile` of a model into a plan ([`compile`]), the examples
//! ([`example`]), temporary directories ([`tempdir`]), paths as `&str` ([`s`]), and
//! checking that a message names every wanted piece ([`assert_contains_all`]); and
//! for the tests that compile and train through the library: the unoptimised
//! compile options ([`O0`]), a report's losses ([`losses`]), a parameter's trained
//! value over the ranks ([`trained_value`]) and the relative difference of two
//! runs' numbers ([`max_rel`]).

#![allow(dead_code)]

use dlrm_ir::Tensor;
use dlrm_passes::pipeline::Precision;
use dlrm_runtime::driver::Report;
use dlrmc::compile::CompileOptions;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const DLRMC: &str = env!("CARGO_BIN_EXE_dlrmc");
pub const DLRM_RUN: &str = env!("CARGO_BIN_EXE_dlrm-run");

/// The workspace root (where `examples/` and `README.md` are).
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `examples/NAME`.
pub fn example(name: &str) -> PathBuf {
    root().join("examples").join(name)
}

/// A fresh temporary directory, removed when dropped.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// A path as the `&str` a command line takes.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Runs `bin` with `args` to the end.
pub fn run(bin: &str, args: &[&str]) -> Output {
    run_env(bin, args, &[])
}

/// [`run`] with the environment variables `env` set. The planner's rates are the
/// built-in ones unless `env` says otherwise (a calibration this machine keeps,
/// `dlrmc calibrate`, would change placements and predictions).
pub fn run_env(bin: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(bin);
    c.args(args).env("DLRMC_CALIBRATION", "none");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("spawn")
}

/// The text a command printed on stderr.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs a command that must succeed; returns its output.
pub fn ok(bin: &str, args: &[&str]) -> Output {
    let out = run(bin, args);
    assert!(
        out.status.success(),
        "{bin} {args:?} failed:\n{}",
        stderr(&out)
    );
    out
}

/// Runs a command that must fail with exit status 1; returns its stderr.
pub fn fails(bin: &str, args: &[&str]) -> String {
    let out = run(bin, args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{bin} {args:?}: {err}");
    err
}

/// [`fails`], and the command printed nothing on stdout.
pub fn fails_silently(bin: &str, args: &[&str]) -> String {
    let out = run(bin, args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{bin} {args:?}: {err}");
    assert!(out.stdout.is_empty(), "{bin} {args:?} printed to stdout");
    err
}

/// `dlrmc compile MODEL -o PLAN --quiet EXTRA...`, which must succeed.
pub fn compile(model: &Path, plan: &Path, extra: &[&str]) {
    let mut args = vec!["compile", s(model), "-o", s(plan), "--quiet"];
    args.extend_from_slice(extra);
    ok(DLRMC, &args);
}

/// Asserts that `text` contains every one of `wants`.
pub fn assert_contains_all(text: &str, wants: &[&str]) {
    for want in wants {
        assert!(text.contains(want), "`{want}` not in: {text}");
    }
}

/// Compilation without the optimising passes, in f32.
pub const O0: CompileOptions = CompileOptions {
    infer_only: false,
    optimize: false,
    precision: Precision::Fp32,
    block: None,
};

/// A report's logged losses, in step order.
pub fn losses(r: &Report) -> Vec<f32> {
    r.losses.iter().map(|l| l.1).collect()
}

/// Largest relative difference, with differences below `floor` ignored.
pub fn max_rel(a: &[f32], b: &[f32], floor: f32) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = (x - y).abs();
            if d <= floor {
                0.0
            } else {
                d / x.abs().max(y.abs())
            }
        })
        .fold(0.0, f32::max)
}

/// A parameter's trained value over the ranks: from the first rank holding it, or
/// for a row-wise table its shards `<name>.rows<lo>_<hi>` joined in row order.
pub fn trained_value(per_rank: &[HashMap<String, Tensor>], name: &str) -> Vec<f32> {
    if let Some(p) = per_rank.iter().find(|p| p.contains_key(name)) {
        return p[name].to_f32_vec();
    }
    let prefix = format!("{name}.rows");
    let mut shards: Vec<(usize, Vec<f32>)> = per_rank
        .iter()
        .flat_map(|p| p.iter())
        .filter_map(|(n, t)| {
            let lo = n.strip_prefix(&prefix)?.split('_').next()?.parse().ok()?;
            Some((lo, t.to_f32_vec()))
        })
        .collect();
    assert!(!shards.is_empty(), "{name} on no rank");
    shards.sort_by_key(|s| s.0);
    shards.dedup_by_key(|s| s.0);
    shards.into_iter().flat_map(|s| s.1).collect()
}

/// The JSON lines of a metrics file.
pub fn metric_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// The step losses and the summary's AUC of a metrics file.
pub fn metrics(path: &Path) -> (Vec<f32>, f64) {
    let lines = metric_lines(path);
    let (last, steps) = lines.split_last().expect("a summary line");
    let losses = steps
        .iter()
        .filter(|l| l.get("elapsed_s").is_some())
        .filter_map(|l| l["loss"].as_f64())
        .map(|l| l as f32)
        .collect();
    (losses, last["auc"].as_f64().expect("auc"))
}

/// `dlrm-run PLAN --ranks N ARGS..` with a fresh metrics file beside the plan: its
/// step losses and AUC ([`metrics`]).
pub fn run_metrics(plan: &Path, ranks: usize, args: &[&str]) -> (Vec<f32>, f64) {
    let m = plan.with_extension(format!("{ranks}.{}.jsonl", args.len()));
    let _ = std::fs::remove_file(&m);
    let n = ranks.to_string();
    let common = [s(plan), "--ranks", &n, "--metrics", s(&m), "-q"];
    ok(DLRM_RUN, &[&common[..], args].concat());
    metrics(&m)
}

/// The real PyTorch export `name` (`frontends/onnx/test_cases/real/NAME/model.onnx`).
pub fn real_model(name: &str) -> PathBuf {
    root()
        .join("frontends/onnx/test_cases/real")
        .join(name)
        .join("model.onnx")
}
