//! Checkpoints and resume, end to end through `dlrm-run` (thread ranks):
//!
//! - bit-exact resume: a run of N steps against a run of k steps that checkpoints
//!   and a `--resume` to N: the resumed steps' losses and the final evaluation are
//!   equal bit for bit (1 and 2 ranks with row-wise tables, SGD fp32, bf16
//!   Split-SGD, Adagrad, bf16 row-wise Adagrad as Split-Adagrad);
//! - a run killed with SIGKILL (at a random point of a run that checkpoints every
//!   step, and deterministically in the middle of a checkpoint write through the
//!   `DLRM_CKPT_FAIL_AT` hook) resumes to the uninterrupted run's losses, bit for
//!   bit; the unfinished write is refused by name and the last good checkpoint
//!   loads;
//! - bad input: a corrupted part file (checksum), a missing one, a format version
//!   from the future, another model's checkpoint: clear errors naming what;
//! - 4 ranks' checkpoint resumed on 2 ranks: losses within 1e-5 relative of the
//!   uninterrupted 4-rank run (the tolerance of N ranks against one, `e2e.rs`);
//! - a checkpoint is a plan: `dlrm-run CKPT --infer` and `dlrmc inspect CKPT`;
//! - parameters on demand: each of 2 ranks (a row-wise table) reads exactly its
//!   own rows and parameters of a checkpoint, once, equal to those slices; a
//!   checkpoint resumed in place of the plan is read once and resumes bit for bit.

mod common;

use common::{DLRM_RUN, DLRMC, compile as compile_model, example, ok, run_env, s, tempdir};

use dlrm_ir::{ParamValue, RowSource, Tensor};
use dlrm_runtime::ShardSettings;
use dlrm_runtime::checkpoint::Checkpoint;
use dlrm_runtime::run_with_params;
use dlrm_runtime::{RunOptions, RunSettings, job_for};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Compiles dlrm-tiny (its JSON edited by `edit`) into `dir/name` with `extra`
/// compile flags.
fn compile(dir: &Path, name: &str, edit: &dyn Fn(&mut Value), extra: &[&str]) -> PathBuf {
    let mut v: Value =
        serde_json::from_str(&fs::read_to_string(example("dlrm-tiny.json")).expect("read"))
            .expect("json");
    edit(&mut v);
    let json = dir.join(format!("{name}.json"));
    fs::write(&json, v.to_string()).expect("write");
    let plan = dir.join(name);
    compile_model(&json, &plan, extra);
    plan
}

/// dlrm-tiny with a first table of 120 rows, which [`ROWWISE`] splits by rows on
/// 2 to 4 ranks.
fn tiny(dir: &Path, name: &str, extra: &[&str]) -> PathBuf {
    compile(
        dir,
        name,
        &|v| v["table_rows"] = serde_json::json!([120, 30, 20]),
        extra,
    )
}

/// `dlrm-run` with one rayon thread, and `env`.
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut all = vec![("RAYON_NUM_THREADS", "1")];
    all.extend_from_slice(env);
    run_env(DLRM_RUN, args, &all)
}

/// Runs `dlrm-run` with `--json --quiet --log-every 1`; returns the report.
fn report(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--json", "--quiet", "--log-every", "1", "--warmup", "0"]);
    let out = run(&all, &[]);
    assert!(
        out.status.success(),
        "dlrm-run {all:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("report json")
}

fn fails(args: &[&str]) -> String {
    let out = run(args, &[]);
    assert!(!out.status.success(), "dlrm-run {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The report's losses after step `after`, as (step, f32 bits).
fn losses_after(r: &Value, after: u64) -> Vec<(u64, u32)> {
    r["losses"]
        .as_array()
        .expect("losses")
        .iter()
        .map(|p| {
            let k = p[0].as_u64().expect("step");
            let l = p[1].as_f64().expect("loss") as f32;
            (k, l.to_bits())
        })
        .filter(|&(k, _)| k > after)
        .collect()
}

/// The final evaluation's numbers (bit-exact comparisons).
fn final_eval(r: &Value) -> Vec<Value> {
    ["final_loss", "auc", "log_loss", "accuracy"]
        .iter()
        .map(|k| r[*k].clone())
        .collect()
}

/// Splits [`tiny`]'s first table by rows on 2 to 4 ranks: 3000 bytes of tables
/// per rank (the planner counts a table's optimizer state with it: bf16's low
/// halves make a table as large as f32's, and [`rowwise`] gives Adagrad's
/// accumulators, which double a table, twice the budget).
const ROWWISE: [&str; 3] = ["--mem-per-rank", "3000", "--no-mem-check"];

/// [`ROWWISE`] for `plan`: the same split, the budget doubled for an Adagrad
/// plan's accumulators (the first table is then 7680 bytes with its state: split
/// under 6000, its shards and the other tables fit 2 ranks).
fn rowwise(plan: &Path) -> [&'static str; 3] {
    let m: Value =
        serde_json::from_str(&fs::read_to_string(plan.join("manifest.json")).expect("manifest"))
            .expect("json");
    if m["training"]["optimizer"]
        .as_str()
        .is_some_and(|o| o.contains("adagrad"))
    {
        ["--mem-per-rank", "6000", "--no-mem-check"]
    } else {
        ROWWISE
    }
}

/// N steps straight against k steps + checkpoint + resume to N: bit for bit.
fn check_resume_bit_exact(plan: &Path, ranks: &str, n: u64, k: u64, what: &str) {
    check_resume_with(plan, ranks, n, k, &[], what);
}

/// [`check_resume_bit_exact`] with `lr` (learning-rate flags) given to the
/// uninterrupted run and the checkpointed one, not to the resumed run: it
/// continues with the schedule the checkpoint recorded.
fn check_resume_with(plan: &Path, ranks: &str, n: u64, k: u64, lr: &[&str], what: &str) {
    let dir = tempdir();
    let ck = dir.path().join("ck");
    let n_s = n.to_string();
    let k_s = k.to_string();
    let mut base = vec![s(plan), "--ranks", ranks];
    base.extend_from_slice(&rowwise(plan));
    let mut a = base.clone();
    a.extend_from_slice(&["--iters", &n_s]);
    a.extend_from_slice(lr);
    let full = report(&a);
    let mut b = base.clone();
    b.extend_from_slice(&["--iters", &k_s, "--checkpoint", s(&ck)]);
    b.extend_from_slice(lr);
    report(&b);
    assert!(ck.join("latest").is_file(), "{what}: no latest");
    let mut c = base.clone();
    c.extend_from_slice(&["--iters", &n_s, "--resume", s(&ck)]);
    let resumed = report(&c);
    let want = losses_after(&full, k);
    assert_eq!(want.len() as u64, n - k, "{what}");
    assert_eq!(
        losses_after(&resumed, k),
        want,
        "{what}: resumed losses differ"
    );
    assert_eq!(
        final_eval(&resumed),
        final_eval(&full),
        "{what}: final eval differs"
    );
}

#[test]
fn resume_is_bit_exact_on_one_and_two_ranks() {
    let dir = tempdir();
    let plan = tiny(dir.path(), "tiny", &[]);
    check_resume_bit_exact(&plan, "1", 9, 4, "fp32 1 rank");
    check_resume_bit_exact(&plan, "2", 9, 5, "fp32 2 ranks");
}

#[test]
fn resume_is_bit_exact_with_bf16_and_adagrad() {
    let dir = tempdir();
    let bf16 = tiny(dir.path(), "bf16", &["--precision", "bf16"]);
    check_resume_bit_exact(&bf16, "1", 8, 3, "bf16 1 rank");
    check_resume_bit_exact(&bf16, "2", 8, 3, "bf16 2 ranks");
    let ada = tiny(dir.path(), "ada", &["--optimizer", "adagrad"]);
    check_resume_bit_exact(&ada, "1", 8, 3, "adagrad 1 rank");
    check_resume_bit_exact(&ada, "3", 8, 3, "adagrad 3 ranks");
    // Split-Adagrad: bf16 halves and f32 accumulators, a row-wise table on 2 ranks.
    let args = ["--precision", "bf16", "--optimizer", "rowwise_adagrad"];
    let split = tiny(dir.path(), "bf16ada", &args);
    check_resume_bit_exact(&split, "1", 8, 3, "bf16 adagrad 1 rank");
    check_resume_bit_exact(&split, "2", 8, 3, "bf16 adagrad 2 ranks");
}

#[test]
fn a_resumed_run_continues_the_learning_rate_schedule() {
    let dir = tempdir();
    let plan = tiny(dir.path(), "tiny", &[]);
    // Warmup over steps 1-4, constant, then a polynomial decay from step 6: the
    // checkpoint after step 4 resumes mid-schedule.
    let poly = [
        "--lr-warmup-steps",
        "4",
        "--lr-decay-start",
        "6",
        "--lr-decay-steps",
        "3",
    ];
    check_resume_with(&plan, "1", 9, 4, &poly, "poly schedule 1 rank");
    check_resume_with(&plan, "2", 9, 3, &["--lr", "0.05"], "--lr 2 ranks");
}

/// A tiny model with big tables, so that a checkpoint takes a few ms to write.
fn big(dir: &Path) -> PathBuf {
    compile(
        dir,
        "big",
        &|v| {
            v["table_rows"] = serde_json::json!([60000, 40000, 20]);
            v["embedding_dim"] = serde_json::json!(16);
            v["bottom_mlp"] = serde_json::json!([4, 16, 16]);
            v["top_mlp"] = serde_json::json!([16, 1]);
        },
        &[],
    )
}

#[test]
fn a_run_killed_during_a_step_or_a_write_resumes_bit_for_bit() {
    let dir = tempdir();
    let plan = big(dir.path());
    let n = 10u64;
    let full = report(&[s(&plan), "--ranks", "2", "--iters", "10"]);

    // SIGKILL at an arbitrary point of a run checkpointing every step.
    let ck = dir.path().join("ck-kill");
    let log = dir.path().join("kill.log");
    let mut child = Command::new(DLRM_RUN)
        .args([
            s(&plan),
            "--ranks",
            "2",
            "--iters",
            "10",
            "--checkpoint",
            s(&ck),
            "--checkpoint-every",
            "1",
            "--keep",
            "2",
            "--log-every",
            "1",
        ])
        .env("RAYON_NUM_THREADS", "1")
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn");
    let t0 = Instant::now();
    loop {
        let text = fs::read_to_string(&log).unwrap_or_default();
        if text.contains("checkpoint after step 3") {
            break;
        }
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the run ended before its 3rd checkpoint: {text}"
        );
        assert!(t0.elapsed() < Duration::from_secs(120), "too slow: {text}");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().expect("SIGKILL");
    let status = child.wait().expect("wait");
    assert!(!status.success());
    let resumed = report(&[s(&plan), "--ranks", "2", "--resume", s(&ck)]);
    let from = resumed["losses"][0][0].as_u64().expect("first step") - 1;
    assert!(from >= 3, "resumed from step {from}");
    if from < n {
        assert_eq!(losses_after(&resumed, from), losses_after(&full, from));
    }
    assert_eq!(final_eval(&resumed), final_eval(&full));
    let steps: Vec<_> = fs::read_dir(&ck)
        .expect("ls")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    assert!(steps.len() <= 2, "--keep 2 left {steps:?}");

    // Killed in the middle of writing the checkpoint of step 4: after the part
    // files, and after the manifest before the rename.
    for point in ["part", "manifest"] {
        let ck = dir.path().join(format!("ck-{point}"));
        let fail = format!("4:{point}");
        let out = run(
            &[
                s(&plan),
                "--ranks",
                "2",
                "--iters",
                "10",
                "--checkpoint",
                s(&ck),
                "--checkpoint-every",
                "2",
                "--quiet",
            ],
            &[("DLRM_CKPT_FAIL_AT", &fail)],
        );
        assert!(
            !out.status.success(),
            "{point}: the injected abort did not end the run"
        );
        let tmp = ck.join(".step-000000004.tmp");
        assert!(tmp.is_dir(), "{point}: no unfinished write left");
        assert_eq!(
            fs::read_to_string(ck.join("latest"))
                .expect("latest")
                .trim(),
            "step-000000002"
        );
        let err = fails(&[s(&plan), "--resume", s(&tmp), "--quiet"]);
        assert!(
            err.contains("unfinished checkpoint write") && err.contains("step-000000002"),
            "{point}: {err}"
        );
        let resumed = report(&[s(&plan), "--ranks", "2", "--resume", s(&ck)]);
        assert_eq!(losses_after(&resumed, 2), losses_after(&full, 2), "{point}");
        assert_eq!(final_eval(&resumed), final_eval(&full), "{point}");
    }
}

#[test]
fn bad_checkpoints_are_clear_errors() {
    let dir = tempdir();
    let plan = tiny(dir.path(), "tiny", &[]);
    let ck = dir.path().join("ck");
    report(&[
        s(&plan),
        "--iters",
        "3",
        "--checkpoint",
        s(&ck),
        "--checkpoint-every",
        "1",
    ]);
    let step3 = ck.join("step-000000003");
    let step2 = ck.join("step-000000002");
    assert!(step3.is_dir() && step2.is_dir());

    // A corrupted byte in the last tensor's data.
    let part = step3.join("part-00000.safetensors");
    let mut bytes = fs::read(&part).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    fs::write(&part, &bytes).expect("write");
    let err = fails(&[s(&plan), "--resume", s(&step3), "--iters", "5"]);
    assert!(
        err.contains("checksum mismatch") && err.contains("part-00000.safetensors"),
        "{err}"
    );
    // A missing file.
    fs::remove_file(&part).expect("rm");
    let err = fails(&[s(&plan), "--resume", s(&step3), "--iters", "5"]);
    assert!(
        err.contains("part-00000.safetensors") && err.contains("missing"),
        "{err}"
    );
    // The last good checkpoint still loads.
    report(&[s(&plan), "--resume", s(&step2), "--iters", "4"]);

    // A format version from the future.
    let m = step2.join("manifest.json");
    let mut v: Value = serde_json::from_str(&fs::read_to_string(&m).expect("read")).expect("json");
    v["version"] = 2.into();
    fs::write(&m, v.to_string()).expect("write");
    let err = fails(&[s(&plan), "--resume", s(&step2), "--iters", "4"]);
    assert!(err.contains("version 2") && err.contains("newer"), "{err}");

    // Another model's checkpoint: the first parameter that differs is named.
    let other = compile(
        dir.path(),
        "other",
        &|v| v["table_rows"] = serde_json::json!([120, 31, 20]),
        &[],
    );
    let ck2 = dir.path().join("ck2");
    report(&[s(&other), "--iters", "2", "--checkpoint", s(&ck2)]);
    let err = fails(&[s(&plan), "--resume", s(&ck2), "--iters", "4"]);
    assert!(
        err.contains("parameter `") && err.contains("[31, 8]"),
        "{err}"
    );
    // Not a checkpoint at all.
    let err = fails(&[s(&plan), "--resume", s(&plan), "--iters", "4"]);
    assert!(err.contains("not a dlrmc checkpoint"), "{err}");
    // Nothing left to train.
    let err = fails(&[s(&other), "--resume", s(&ck2), "--iters", "2"]);
    assert!(err.contains("nothing is left to train"), "{err}");
}

#[test]
fn four_ranks_checkpoint_resumes_on_two() {
    let dir = tempdir();
    let plan = tiny(dir.path(), "tiny", &["--optimizer", "adagrad"]);
    let ck = dir.path().join("ck");
    let mut a = vec![s(&plan), "--ranks", "4", "--iters", "8"];
    a.extend_from_slice(&rowwise(&plan));
    let full = report(&a);
    let mut b = vec![
        s(&plan),
        "--ranks",
        "4",
        "--iters",
        "4",
        "--checkpoint",
        s(&ck),
    ];
    b.extend_from_slice(&rowwise(&plan));
    report(&b);
    // The 4 ranks' row shards are pieces of the tables.
    let m: Value = serde_json::from_str(
        &fs::read_to_string(ck.join("step-000000004/manifest.json")).expect("manifest"),
    )
    .expect("json");
    let split = m["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .filter(|t| t["pieces"].as_array().is_some_and(|p| p.len() > 1))
        .count();
    assert!(split > 0, "no table stored in row pieces: {m}");
    let mut c = vec![s(&plan), "--ranks", "2", "--iters", "8", "--resume", s(&ck)];
    c.extend_from_slice(&rowwise(&plan));
    let resumed = report(&c);
    let want = losses_after(&full, 4);
    let got = losses_after(&resumed, 4);
    assert_eq!(want.len(), got.len());
    for ((k, w), (_, g)) in want.iter().zip(&got) {
        let (w, g) = (f32::from_bits(*w), f32::from_bits(*g));
        let d = (w - g).abs() / w.abs().max(1e-7);
        assert!(
            d <= 1e-5,
            "step {k}: 4 ranks {w}, resumed on 2 {g} ({d} rel)"
        );
    }
    // And on 1 rank, reading the whole tables.
    let one = report(&[s(&plan), "--iters", "6", "--resume", s(&ck)]);
    assert_eq!(losses_after(&one, 4).len(), 2);
}

#[test]
fn a_checkpoint_serves_and_inspects_like_a_plan() {
    let dir = tempdir();
    let plan = tiny(dir.path(), "tiny", &[]);
    let ck = dir.path().join("ck");
    let trained = report(&[s(&plan), "--iters", "5", "--checkpoint", s(&ck)]);
    let served = report(&[s(&ck), "--infer", "--iters", "2"]);
    assert_eq!(
        served["auc"], trained["auc"],
        "serving the checkpoint evaluates the trained model"
    );
    let out = ok(DLRMC, &["inspect", s(&ck), "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["name"], "dlrm-tiny");
    assert_eq!(v["checkpoint"]["step"], 5);
    let text = common::run(DLRMC, &["inspect", s(&ck)]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("after step 5 of 5"));
    // Resuming the checkpoint given in place of the plan.
    let resumed = report(&[s(&ck), "--resume", "--iters", "7"]);
    assert_eq!(losses_after(&resumed, 0).len(), 2);
}

/// Records every row range read through it, then reads it from the checkpoint.
struct Counting {
    inner: Arc<Checkpoint>,
    reads: Mutex<Vec<(String, usize, usize)>>,
}

impl RowSource for Counting {
    fn read_rows(&self, key: &str, lo: usize, hi: usize) -> dlrm_ir::Result<Tensor> {
        if let Ok(mut r) = self.reads.lock() {
            r.push((key.to_string(), lo, hi));
        }
        RowSource::read_rows(&*self.inner, key, lo, hi)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// `ck`'s plan read on demand through a [`Counting`] source.
fn counted_plan(ck: &Path) -> (Arc<Checkpoint>, Arc<Counting>, dlrm_runtime::Plan) {
    let c = Arc::new(Checkpoint::open(ck).expect("open"));
    let mut plan = c.to_plan_on_demand().expect("plan");
    let counting = Arc::new(Counting {
        inner: Arc::clone(&c),
        reads: Mutex::new(Vec::new()),
    });
    for (_, v) in &mut plan.params {
        let ParamValue::OnDemand(o) = v else {
            panic!("a checkpoint's parameter was read whole: {v:?}")
        };
        o.source = Arc::clone(&counting) as Arc<dyn RowSource>;
    }
    (c, counting, plan)
}

/// Two ranks with [`tiny`]'s first table split by rows ([`ROWWISE`]'s budget).
fn two_rowwise_ranks(infer: bool) -> RunOptions {
    RunOptions {
        settings: RunSettings {
            ranks: 2,
            eval_batches: 1,
            log_every: 0,
            threads: Some(1),
            ..RunSettings::default()
        },
        iters: 1,
        infer,
        shards: ShardSettings {
            mem_per_rank: 3000,
            ..ShardSettings::default()
        },
        ..RunOptions::default()
    }
}

/// A checkpoint's parameters are read on demand: serving it on 2 ranks with a
/// row-wise table, each rank reads exactly the rows (row shards) and parameters
/// its graphs hold, once, straight from the part files (no whole read of a split
/// table), and what it holds equals those slices of the checkpoint bit for bit.
#[test]
fn each_rank_reads_only_its_rows_of_a_checkpoint_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let plan = tiny(dir.path(), "tiny", &[]);
    let ck = dir.path().join("ck");
    report(&[s(&plan), "--iters", "3", "--checkpoint", s(&ck)]);
    let (c, counting, plan) = counted_plan(&ck);
    assert!(
        counting.reads.lock().expect("lock").is_empty(),
        "the plan read parameters before any rank asked"
    );
    let job = job_for(plan, &two_rowwise_ranks(true)).expect("job");
    let shards: HashMap<String, (String, usize, usize)> = job
        .row_shards
        .iter()
        .map(|p| (p.param.clone(), (p.table.clone(), p.lo, p.hi)))
        .collect();
    assert!(!shards.is_empty(), "no table split by rows");
    let split: HashSet<&str> = shards.values().map(|(t, _, _)| t.as_str()).collect();
    let (_, held) = run_with_params(job, &mut |_| {}).expect("run");
    let mut expected = Vec::new();
    for (rank, params) in held.iter().enumerate() {
        for (name, t) in params {
            assert!(
                !split.contains(name.as_str()),
                "rank {rank} holds the whole split table {name}"
            );
            let (table, lo, hi) = shards.get(name).cloned().unwrap_or_else(|| {
                let rows = t.shape.first().copied().unwrap_or(1);
                (name.clone(), 0, rows)
            });
            let want = c.read_rows(&table, lo..hi).expect("slice");
            assert_eq!(
                t, &want,
                "rank {rank}: {name} is not rows {lo}..{hi} of {table}"
            );
            expected.push((table, lo, hi));
        }
    }
    let mut reads = counting.reads.lock().expect("lock").clone();
    reads.sort();
    expected.sort();
    assert_eq!(reads, expected, "reads are not each rank's own rows, once");
}

/// Resuming the checkpoint given in place of the plan reads the parameters from
/// it once (the ranks' resume reads), not also as the plan's values; and on 2
/// ranks with a row-wise table its losses and final evaluation equal the
/// uninterrupted run's bit for bit. Served on 2 ranks (row shards read from the
/// table's pieces) it evaluates like 1 rank.
#[test]
fn a_checkpoint_resumed_in_place_of_the_plan_reads_once_and_matches() {
    let dir = tempfile::tempdir().expect("tmp");
    let plan = tiny(dir.path(), "tiny", &[]);
    let ck = dir.path().join("ck");
    let mut base = vec![s(&plan), "--ranks", "2"];
    base.extend_from_slice(&ROWWISE);
    let mut a = base.clone();
    a.extend_from_slice(&["--iters", "7"]);
    let full = report(&a);
    let mut b = base.clone();
    b.extend_from_slice(&["--iters", "3", "--checkpoint", s(&ck)]);
    report(&b);
    let mut r = vec![s(&ck), "--resume", "--ranks", "2", "--iters", "7"];
    r.extend_from_slice(&ROWWISE);
    let resumed = report(&r);
    assert_eq!(losses_after(&resumed, 3), losses_after(&full, 3));
    assert_eq!(losses_after(&resumed, 3).len(), 4);
    assert_eq!(final_eval(&resumed), final_eval(&full));
    // Served on 2 ranks, each reading its rows of the split table: the 1-rank
    // evaluation up to the cross-rank tolerance.
    let mut two = vec![s(&ck), "--infer", "--iters", "2", "--ranks", "2"];
    two.extend_from_slice(&ROWWISE);
    let two = report(&two);
    let one = report(&[s(&ck), "--infer", "--iters", "2"]);
    let (a, b) = (two["auc"].as_f64(), one["auc"].as_f64());
    let (a, b) = (a.expect("auc"), b.expect("auc"));
    assert!(
        (a - b).abs() <= 1e-4,
        "served on 2 ranks: AUC {a}, on 1: {b}"
    );
    // Through the API: the plan's on-demand values are never read.
    let (c, counting, plan) = counted_plan(&ck);
    let mut opts = two_rowwise_ranks(false);
    opts.iters = 4;
    opts.resume = Some(c);
    let job = job_for(plan, &opts).expect("job");
    run_with_params(job, &mut |_| {}).expect("run");
    assert!(
        counting.reads.lock().expect("lock").is_empty(),
        "the plan's values were read besides the resume's"
    );
}
