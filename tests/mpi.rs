//! `mpirun` of the built `dlrm-run` (compiled only with the `mpi` feature): N MPI
//! processes train a plan like N thread ranks, with fewer and with more tables than
//! ranks, and a PyTorch export with `include_last_offset=True` bags; a failing or
//! killed rank ends the whole job, naming the rank, within a timeout; bad rank
//! counts and an unknown `DLRM_MPI_WAIT` are clear errors; under a per-process
//! memory limit several times smaller than the model, each process holds only its
//! tables (table-wise) or only its rows of a table (row-wise); `dlrmc calibrate`
//! measures the exchanges between the processes.
//!
//! Stated tolerance: every logged loss of `mpirun -n N ... --comm mpi` within 1e-5
//! relative of the thread backend's with `--ranks N` (same plan, seed, global
//! batch), and the AUC within 1e-4: the tolerance of N ranks against one. The MPI
//! all-reduce sums each chunk in rank order; the thread group picks recursive
//! doubling or a ring by message size (`dlrm_ir::AllReduceAlgo`), so the two agree
//! up to float reassociation, not bit for bit.
//!
//! Open MPI runs as root and oversubscribes the 2 cores of CI through environment
//! variables set on each `mpirun` here; `MPIRUN` names another launcher.

mod common;

use common::{DLRM_RUN, DLRMC, compile as compile_model, example, metric_lines, ok, s, tempdir};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// No test here should come near it; a hung job fails the test instead of CI.
const TIMEOUT: Duration = Duration::from_secs(90);

/// Compiles a JSON model (the tiny example, or `json` if given) into `dir/name`.
fn compile(dir: &Path, name: &str, json: Option<&str>) -> PathBuf {
    let model = match json {
        Some(text) => {
            let p = dir.join(format!("{name}.json"));
            fs::write(&p, text).expect("write model");
            p
        }
        None => example("dlrm-tiny.json"),
    };
    let plan = dir.join(name);
    compile_model(&model, &plan, &[]);
    plan
}

/// `mpirun` with the settings this machine (and CI) needs.
fn mpirun() -> Command {
    let mut c = Command::new(std::env::var("MPIRUN").unwrap_or_else(|_| "mpirun".into()));
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        // More processes than cores: yield instead of busy-polling in collectives.
        .env("OMPI_MCA_mpi_yield_when_idle", "1")
        // Containers often forbid the cross-memory-attach single copy (then Open
        // MPI fails on large messages); `none` works anywhere, at a cost in
        // speed that these tests do not measure (docs/parallel.md: MPI settings).
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .env("OMPI_MCA_hwloc_base_binding_policy", "none")
        .env("RAYON_NUM_THREADS", "1");
    c
}

struct Ran {
    status: ExitStatus,
    stderr: String,
    secs: f64,
}

/// Runs `cmd` to the end, or kills it after `timeout` (then panics: a hang).
fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Ran {
    let dir = tempdir();
    let err_path = dir.path().join("stderr");
    let err = fs::File::create(&err_path).expect("stderr file");
    let t0 = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("spawn mpirun");
    let status = wait_or_kill(&mut child, timeout, t0);
    Ran {
        status,
        stderr: fs::read_to_string(&err_path).unwrap_or_default(),
        secs: t0.elapsed().as_secs_f64(),
    }
}

fn wait_or_kill(child: &mut Child, timeout: Duration, t0: Instant) -> ExitStatus {
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return st;
        }
        if t0.elapsed() > timeout {
            // SIGTERM first: mpirun then ends its processes.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            std::thread::sleep(Duration::from_secs(3));
            let _ = child.kill();
            let _ = child.wait();
            panic!("the job hung: still running after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Losses (by iter) and the summary line of a metrics file.
fn metrics(path: &Path) -> (Vec<(u64, f64)>, Value) {
    let lines = metric_lines(path);
    let (last, steps) = lines.split_last().expect("a summary line");
    let losses = steps
        .iter()
        .map(|l| {
            (
                l["iter"].as_u64().expect("iter"),
                l["loss"].as_f64().expect("loss"),
            )
        })
        .collect();
    (losses, last.clone())
}

/// `mpirun -n N dlrm-run PLAN --comm mpi` and `dlrm-run PLAN --ranks N` log the
/// same losses and the same held-out AUC.
fn mpi_matches_threads(plan: &Path, n: usize, iters: u64) {
    mpi_matches_threads_under(plan, n, iters, &[], &[]);
}

/// [`mpi_matches_threads`], each MPI process started through `wrap` (e.g.
/// `prlimit --data=BYTES`), both runs given `extra` options.
fn mpi_matches_threads_under(plan: &Path, n: usize, iters: u64, wrap: &[&str], extra: &[&str]) {
    let dir = plan.parent().expect("plan dir");
    let m_mpi = dir.join(format!("mpi-{n}.jsonl"));
    let m_thr = dir.join(format!("threads-{n}.jsonl"));
    let iters = iters.to_string();
    let mut common = vec!["--iters", &iters, "--log-every", "1", "--eval-batches", "2"];
    common.extend_from_slice(extra);

    let mut cmd = mpirun();
    cmd.args(["-n", &n.to_string()])
        .args(wrap)
        .args([DLRM_RUN, s(plan), "--comm", "mpi"])
        .args(&common)
        .args(["--metrics", s(&m_mpi)]);
    let ran = run_with_timeout(cmd, TIMEOUT);
    assert!(ran.status.success(), "mpirun -n {n}: {}", ran.stderr);
    // Only rank 0 prints the summary.
    let summaries: Vec<&str> = ran
        .stderr
        .lines()
        // `contains`: mpirun merges the processes' stderr, so another rank's output
        // may precede the summary on its line.
        .filter(|l| l.contains("trained `"))
        .collect();
    assert_eq!(summaries.len(), 1, "{}", ran.stderr);
    assert!(
        summaries[0].contains(&format!("on {n} ranks")),
        "{}",
        summaries[0]
    );
    eprintln!("mpirun -n {n}: {:.1} s", ran.secs);

    let n_ranks = n.to_string();
    ok(
        DLRM_RUN,
        &[
            &[s(plan), "--ranks", &n_ranks][..],
            &common,
            &["--metrics", s(&m_thr), "-q"],
        ]
        .concat(),
    );

    let (lm, sm) = metrics(&m_mpi);
    let (lt, st) = metrics(&m_thr);
    assert_eq!(
        lm.iter().map(|l| l.0).collect::<Vec<_>>(),
        lt.iter().map(|l| l.0).collect::<Vec<_>>()
    );
    let mut worst = 0.0f64;
    for ((k, a), (_, b)) in lm.iter().zip(&lt) {
        assert!(a.is_finite(), "step {k}: loss {a}");
        let rel = (a - b).abs() / a.abs().max(b.abs()).max(1e-30);
        worst = worst.max(rel);
        assert!(rel <= 1e-5, "{n} ranks, step {k}: mpi {a} vs threads {b}");
    }
    eprintln!("{n} ranks: largest relative loss difference mpi vs threads {worst:e}");
    let (am, at) = (sm["auc"].as_f64(), st["auc"].as_f64());
    let (am, at) = (am.expect("mpi auc"), at.expect("threads auc"));
    assert!((am - at).abs() <= 1e-4, "AUC mpi {am} vs threads {at}");
}

#[test]
fn four_processes_train_like_four_threads_with_fewer_tables_than_ranks() {
    // dlrm-tiny has 3 tables: one of the 4 ranks owns none.
    let dir = tempdir();
    let plan = compile(dir.path(), "tiny.plan", None);
    mpi_matches_threads(&plan, 4, 12);
}

#[test]
fn eight_processes_train_like_eight_threads_with_more_tables_than_ranks() {
    // 10 tables on 8 ranks: some ranks own two.
    let model = fs::read_to_string(example("dlrm-tiny.json")).expect("tiny");
    let mut v: Value = serde_json::from_str(&model).expect("json");
    v["name"] = "dlrm-tiny-10t".into();
    v["table_rows"] = (0..10).map(|t| 20 + 5 * t).collect::<Vec<u64>>().into();
    v["top_mlp"] = serde_json::json!([64, 1]);
    let dir = tempdir();
    let plan = compile(dir.path(), "ten.plan", Some(&v.to_string()));
    mpi_matches_threads(&plan, 8, 6);
}

/// DLRM-DCNv2 (`examples/dlrm-dcnv2-tiny.json`: cross layers, per-table pooling,
/// row-wise Adagrad) trains under `mpirun -n 3` like three thread ranks.
#[test]
fn dcnv2_trains_under_mpi_like_threads() {
    let dir = tempdir();
    let model = fs::read_to_string(example("dlrm-dcnv2-tiny.json")).expect("dcnv2 tiny");
    let plan = compile(dir.path(), "dcn.plan", Some(&model));
    mpi_matches_threads(&plan, 3, 6);
}

/// DLRM-DCNv2 with `--precision bf16`: its Adagrad as Split-Adagrad (bf16 halves,
/// f32 accumulators) trains under `mpirun -n 2` like two thread ranks.
#[test]
fn bf16_dcnv2_with_split_adagrad_trains_under_mpi_like_threads() {
    let dir = tempdir();
    let plan = dir.path().join("dcn16.plan");
    compile_model(
        &example("dlrm-dcnv2-tiny.json"),
        &plan,
        &["--precision", "bf16"],
    );
    mpi_matches_threads(&plan, 2, 6);
}

/// DLRM-DCNv2 with variable-length bags (`"bags": "offsets"`: ids and offsets
/// per table, synthetic bags of 1 to 5 ids) trains under `mpirun -n 2` like two
/// thread ranks.
#[test]
fn dcnv2_with_offsets_bags_trains_under_mpi_like_threads() {
    let dir = tempdir();
    let model = fs::read_to_string(example("dlrm-dcnv2-tiny.json")).expect("dcnv2 tiny");
    let mut v: Value = serde_json::from_str(&model).expect("json");
    v["name"] = "dlrm-dcnv2-tiny-offsets".into();
    v["bags"] = "offsets".into();
    if let Some(m) = v.as_object_mut() {
        m.remove("pooling");
    }
    let plan = compile(dir.path(), "dcn-offsets.plan", Some(&v.to_string()));
    mpi_matches_threads_under(&plan, 2, 6, &[], &["--pooling", "1-5"]);
}

/// A plan with int8 row-wise tables (`dlrmc compile --quantize-tables int8`)
/// serves under `mpirun -n 2 ... --infer` with the held-out AUC of two thread
/// ranks and of one.
#[test]
fn int8_tables_serve_under_mpi_like_threads() {
    let dir = tempdir();
    let plan = dir.path().join("q8.plan");
    compile_model(
        &example("dlrm-tiny.json"),
        &plan,
        &["--quantize-tables", "int8"],
    );
    let common = ["--infer", "--iters", "3", "--eval-batches", "2"];
    let auc = |m: &Path| {
        let lines = metric_lines(m);
        lines
            .last()
            .and_then(|l| l["auc"].as_f64())
            .expect("an auc")
    };
    let m_mpi = dir.path().join("mpi.jsonl");
    let mut cmd = mpirun();
    cmd.args(["-n", "2", DLRM_RUN, s(&plan), "--comm", "mpi"])
        .args(common)
        .args(["--metrics", s(&m_mpi)]);
    let ran = run_with_timeout(cmd, TIMEOUT);
    assert!(ran.status.success(), "mpirun -n 2: {}", ran.stderr);
    assert!(ran.stderr.contains("on 2 ranks"), "{}", ran.stderr);
    for ranks in ["1", "2"] {
        let m = dir.path().join(format!("threads-{ranks}.jsonl"));
        let args = [
            &[s(&plan), "--ranks", ranks, "--metrics", s(&m), "-q"][..],
            &common,
        ]
        .concat();
        ok(DLRM_RUN, &args);
        let (a, b) = (auc(&m_mpi), auc(&m));
        assert!(
            (a - b).abs() <= 1e-6,
            "AUC mpi {a} vs {ranks} thread ranks {b}"
        );
    }
}

/// A real PyTorch export with `include_last_offset=True` bags (`[B+1]` offsets)
/// trains under `mpirun -n 2` like two thread ranks.
#[test]
fn a_last_offset_export_trains_under_mpi_like_threads() {
    let dir = tempdir();
    let plan = dir.path().join("last.plan");
    let model = "frontends/onnx/test_cases/real/ts17_dot_last_offset/model.onnx";
    compile_model(&common::root().join(model), &plan, &[]);
    mpi_matches_threads(&plan, 2, 6);
}

/// Every committed real export (`frontends/onnx/test_cases/real/`: every bag
/// layout, both PyTorch exporters, TorchRec-style, DCN-v2, and the reference DLRM's
/// own `--save-onnx` files in both of its modes) trains under `mpirun -n 2` like
/// two thread ranks (weighted bags: tables placed whole, a weighted bag has no
/// row-wise form).
#[test]
fn exports_of_every_bag_layout_train_under_mpi_like_threads() {
    let dir = tempdir();
    let real = common::root().join("frontends/onnx/test_cases/real");
    let mut names: Vec<String> = fs::read_dir(&real)
        .expect("real cases")
        .filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
        .filter(|n| real.join(n).join("model.onnx").exists())
        .collect();
    names.sort();
    assert!(names.len() >= 29, "the committed real exports: {names:?}");
    for name in names {
        let plan = dir.path().join(format!("{name}.plan"));
        compile_model(&real.join(&name).join("model.onnx"), &plan, &[]);
        mpi_matches_threads(&plan, 2, 4);
    }
}

/// Per-rank residency: a model whose tables (4 x 3,000,000 x 64 f32 = 3.07 GB) are
/// three times a per-process data limit (RLIMIT_DATA, 960 MiB: it counts the
/// private writable mappings that hold a process's tensors) trains under
/// `mpirun -n 4`, every process under that limit, because each creates only the
/// table it owns (table-wise: one 768 MB table each); its losses equal 4 thread
/// ranks'. The same limit stops a process that holds the whole model — with a
/// clear error naming the parameter, not an abort — so the limit does bite.
#[test]
fn four_processes_each_hold_only_their_tables_under_a_memory_limit() {
    let model = serde_json::json!({
        "name": "big4", "dense_features": 4, "embedding_dim": 64,
        "table_rows": [3_000_000, 3_000_000, 3_000_000, 3_000_000], "pooling": 2,
        "bottom_mlp": "4-16-64", "top_mlp": "16-1",
        "batch_size": 64, "learning_rate": 0.1, "seed": 3
    });
    let dir = tempdir();
    let plan = compile(dir.path(), "big4.plan", Some(&model.to_string()));
    let size: u64 = fs::read_dir(&plan)
        .expect("plan")
        .map(|e| e.expect("entry").metadata().expect("meta").len())
        .sum();
    assert!(size < 1 << 20, "the plan stores its tables: {size} bytes");
    // A process holds one table and 110-190 MiB of its own (libraries, MPI, thread
    // stacks; measured: 720 MiB fails, 800 passes).
    let limit = format!("--data={}", 960u64 << 20);
    // One process holding the whole model: refused cleanly under the limit.
    let whole = Command::new("prlimit")
        .args([limit.as_str(), DLRM_RUN, s(&plan), "--iters", "2", "-q"])
        .output()
        .expect("spawn prlimit");
    let err = String::from_utf8_lossy(&whole.stderr);
    assert!(
        !whole.status.success(),
        "the whole model fit under the limit"
    );
    assert!(
        err.contains("dlrm-run: error: `emb.") && err.contains("needs 768000000 bytes"),
        "{err}"
    );
    mpi_matches_threads_under(&plan, 4, 4, &["prlimit", &limit], &[]);
}

/// Per-rank residency, row-wise: one table of 12,000,000 x 64 f32 (3.07 GB, 3.2
/// times the 960 MiB data limit of each process) split by rows over
/// `mpirun -n 4` (`--mem-per-rank 900MiB` makes the planner split it in 4: no rank
/// may hold more than a quarter of it) trains, every process under the limit, as
/// each creates only its 3,000,000 rows (768 MB); its losses equal 4 thread
/// ranks' of the same placement. A process holding the whole table, or half of
/// it, would exceed the limit: the limit proves each holds only its rows.
#[test]
fn four_processes_each_hold_only_their_rows_of_a_table_under_a_memory_limit() {
    let model = serde_json::json!({
        "name": "rows4", "dense_features": 4, "embedding_dim": 64,
        "table_rows": [12_000_000], "pooling": 2,
        "bottom_mlp": "4-16-64", "top_mlp": "16-1",
        "batch_size": 64, "learning_rate": 0.1, "seed": 5
    });
    let dir = tempfile::tempdir().expect("tmp");
    let plan = compile(dir.path(), "rows4.plan", Some(&model.to_string()));
    let limit = format!("--data={}", 960u64 << 20);
    // The same placement in both runs: the table in 4 row shards (the budget is
    // for placing only: 4 thread ranks share this process's memory).
    let place = ["--mem-per-rank", "900MiB", "--no-mem-check"];
    mpi_matches_threads_under(&plan, 4, 3, &["prlimit", &limit], &place);
}

#[test]
fn a_rank_that_fails_ends_the_job_naming_the_rank() {
    // Rank 3 is given a copy of the plan with a corrupted weight file (MPMD launch):
    // it fails while ranks 0..2 go on into their first collective.
    let dir = tempdir();
    let good = compile(dir.path(), "good.plan", None);
    let bad = compile(dir.path(), "bad.plan", None);
    let w = bad.join("weights.safetensors");
    let mut bytes = fs::read(&w).expect("weights");
    let n = bytes.len();
    bytes[n - 3] ^= 0x40;
    fs::write(&w, &bytes).expect("corrupt");
    let mut cmd = mpirun();
    cmd.args([
        "-n",
        "3",
        DLRM_RUN,
        s(&good),
        "--comm",
        "mpi",
        "--iters",
        "50",
    ])
    .args([":", "-n", "1", DLRM_RUN, s(&bad), "--comm", "mpi"])
    .args(["--iters", "50"]);
    let ran = run_with_timeout(cmd, TIMEOUT);
    assert!(!ran.status.success(), "{}", ran.stderr);
    assert!(
        ran.stderr.contains("MPI rank 3 of 4 failed") && ran.stderr.contains("checksum"),
        "{}",
        ran.stderr
    );
}

#[test]
fn a_diverging_loss_ends_the_job_naming_the_rank_and_the_step() {
    // The largest finite learning rate overflows the weights in the first update;
    // the loss turns infinite on every rank at the same step.
    let model = fs::read_to_string(example("dlrm-tiny.json")).expect("tiny");
    let mut v: Value = serde_json::from_str(&model).expect("json");
    v["learning_rate"] = 3e38.into();
    let dir = tempdir();
    let plan = compile(dir.path(), "nan.plan", Some(&v.to_string()));
    let mut cmd = mpirun();
    cmd.args([
        "-n",
        "2",
        DLRM_RUN,
        s(&plan),
        "--comm",
        "mpi",
        "--iters",
        "50",
    ]);
    let ran = run_with_timeout(cmd, TIMEOUT);
    assert!(!ran.status.success(), "{}", ran.stderr);
    let line = ran
        .stderr
        .lines()
        .find(|l| l.contains("failed, aborting the job"))
        .unwrap_or_else(|| panic!("no abort message: {}", ran.stderr));
    assert!(
        line.contains("loss became") && line.contains("at step "),
        "{line}"
    );
}

#[test]
fn a_killed_rank_ends_the_job_naming_the_rank() {
    let dir = tempdir();
    let plan = compile(dir.path(), "tiny.plan", None);
    let m = dir.path().join("m.jsonl");
    let err_path = dir.path().join("stderr");
    let mut cmd = mpirun();
    cmd.args(["-n", "3", DLRM_RUN, s(&plan), "--comm", "mpi"])
        .args(["--iters", "1000000", "--log-every", "1", "--metrics", s(&m)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&err_path).expect("stderr file"));
    let t0 = Instant::now();
    let mut child = cmd.spawn().expect("spawn mpirun");
    // Wait until training is under way (rank 0 has logged a step) ...
    while !fs::read_to_string(&m).is_ok_and(|t| t.lines().count() >= 2) {
        if t0.elapsed() > TIMEOUT || child.try_wait().expect("wait").is_some() {
            let _ = child.kill();
            panic!(
                "training never started: {}",
                fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // ... then SIGKILL the process of rank 1 (Open MPI tells each its rank).
    let victim = rank_pid(1, s(&m)).expect("the process of rank 1");
    let killed = Command::new("kill")
        .args(["-KILL", &victim.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = wait_or_kill(&mut child, TIMEOUT, Instant::now());
    let stderr = fs::read_to_string(&err_path).unwrap_or_default();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("rank 1") && stderr.contains("signal 9"),
        "{stderr}"
    );
}

/// The pid of the `dlrm-run` process of MPI rank `rank` (Open MPI sets
/// `OMPI_COMM_WORLD_RANK` in its environment) among those whose command line holds
/// `marker` (a path of this test's own temporary directory).
fn rank_pid(rank: usize, marker: &str) -> Option<u32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if !cmdline.starts_with(DLRM_RUN) || !cmdline.contains(marker) {
            continue;
        }
        let env = fs::read(entry.path().join("environ")).unwrap_or_default();
        if env.split(|&b| b == 0).any(|v| v == want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// Runs `cmd` to the end and checks that it failed with `msg` on stderr.
fn refused(cmd: Command, msg: &str) {
    let ran = run_with_timeout(cmd, TIMEOUT);
    assert!(!ran.status.success(), "succeeded; wanted: {msg}");
    assert!(ran.stderr.contains(msg), "{}", ran.stderr);
}

#[test]
fn bad_rank_counts_are_clear_errors() {
    let dir = tempdir();
    let plan = compile(dir.path(), "tiny.plan", None);
    // --ranks must agree with the MPI job's size.
    let mut cmd = mpirun();
    cmd.args(["-n", "2", DLRM_RUN, s(&plan), "--comm", "mpi"])
        .args(["--ranks", "3"]);
    refused(cmd, "--ranks 3 disagrees with the MPI job's 2 processes");
    // More processes than samples in the global batch.
    let mut cmd = mpirun();
    cmd.args(["-n", "3", DLRM_RUN, s(&plan), "--comm", "mpi"])
        .args(["--batch-size", "2", "--iters", "1"]);
    refused(cmd, "--ranks 3 is more than the global batch of 2 samples");
}

#[test]
fn an_unknown_mpi_wait_mode_is_a_clear_error() {
    let dir = tempdir();
    let plan = compile(dir.path(), "tiny.plan", None);
    let mut cmd = mpirun();
    cmd.env("DLRM_MPI_WAIT", "spin")
        .args(["-n", "2", DLRM_RUN, s(&plan), "--comm", "mpi"])
        .args(["--iters", "1"]);
    refused(
        cmd,
        "DLRM_MPI_WAIT is \"spin\"; it takes `nap` (the default) or `block`",
    );
}

/// `(iter, loss)` of the training lines of a metrics file with evaluation lines.
fn train_losses(path: &Path) -> Vec<(u64, f64)> {
    fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json line"))
        .filter(|v| v.get("split").is_none())
        .filter_map(|v| Some((v["iter"].as_u64()?, v["loss"].as_f64()?)))
        .collect()
}

#[test]
fn two_processes_reading_a_criteo_dataset_train_like_one_rank() {
    let dir = tempdir();
    let (tsv, ds) = (dir.path().join("train.txt"), dir.path().join("train.ds"));
    for args in [
        vec![
            "data",
            "generate",
            "--rows",
            "6000",
            "--seed",
            "2",
            "-q",
            "-o",
            s(&tsv),
        ],
        vec!["data", "convert", "-q", s(&tsv), "-o", s(&ds)],
    ] {
        ok(DLRMC, &args);
    }
    let model = serde_json::json!({
        "name": "criteo-mpi", "dense_features": 13, "embedding_dim": 8,
        "table_rows": vec![1; 26], "pooling": 1, "pooling_mode": "sum",
        "bottom_mlp": "13-16-8", "top_mlp": "16-1", "interaction": "dot",
        "interaction_itself": false, "loss": "bce", "batch_size": 64,
        "optimizer": "sgd", "learning_rate": 0.1, "seed": 1
    });
    let json = dir.path().join("model.json");
    fs::write(&json, model.to_string()).expect("write model");
    let plan = dir.path().join("plan");
    compile_model(&json, &plan, &["--data", s(&ds)]);
    let common = [
        "--data",
        s(&ds),
        "--iters",
        "10",
        "--log-every",
        "1",
        "--eval-every",
        "5",
    ];
    let (m_mpi, m_one) = (dir.path().join("mpi.jsonl"), dir.path().join("one.jsonl"));
    let mut cmd = mpirun();
    cmd.args(["-n", "2", DLRM_RUN, s(&plan), "--comm", "mpi"])
        .args(common)
        .args(["--metrics", s(&m_mpi)]);
    let ran = run_with_timeout(cmd, TIMEOUT);
    assert!(ran.status.success(), "mpirun -n 2: {}", ran.stderr);
    ok(
        DLRM_RUN,
        &[&[s(&plan), "-q", "--metrics", s(&m_one)][..], &common].concat(),
    );
    let (a, b) = (train_losses(&m_mpi), train_losses(&m_one));
    assert_eq!(a.len(), 10, "{a:?}");
    assert_eq!(
        a.iter().map(|l| l.0).collect::<Vec<_>>(),
        b.iter().map(|l| l.0).collect::<Vec<_>>()
    );
    for ((k, x), (_, y)) in a.iter().zip(&b) {
        let rel = (x - y).abs() / x.abs().max(y.abs()).max(1e-30);
        assert!(rel <= 1e-5, "step {k}: 2 MPI processes {x} vs 1 rank {y}");
    }
}

/// 4 MPI processes checkpointing every step, the job aborted in the middle of
/// writing step 4's checkpoint (`DLRM_CKPT_FAIL_AT`, like a `kill -9` of one
/// process mid-write), then resumed by 4 new processes: the losses of steps 4..6
/// equal the uninterrupted MPI run's bit for bit. Each process wrote only its own
/// rows: a row-wise table's pieces are in several ranks' part files, and the
/// replicated MLP weights only in rank 0's.
#[test]
fn mpi_checkpoint_killed_mid_write_resumes_bit_for_bit() {
    let dir = tempdir();
    // dlrm-tiny with a 120-row first table: split by rows on 4 ranks at 3000
    // bytes of tables per rank.
    let json = fs::read_to_string(example("dlrm-tiny.json"))
        .expect("read")
        .replace("[50, 30, 20]", "[120, 30, 20]");
    let plan = compile(dir.path(), "tiny120", Some(&json));
    let ck = dir.path().join("ck");
    let common = [
        "--iters",
        "6",
        "--log-every",
        "1",
        "--eval-batches",
        "2",
        "--mem-per-rank",
        "3000",
        "--no-mem-check",
    ];
    let job = |extra: &[&str], metrics: &Path, fail: Option<&str>| {
        let mut cmd = mpirun();
        cmd.args(["-n", "4", DLRM_RUN, s(&plan), "--comm", "mpi"])
            .args(common)
            .args(extra)
            .args(["--metrics", s(metrics)]);
        if let Some(f) = fail {
            cmd.env("DLRM_CKPT_FAIL_AT", f);
        }
        run_with_timeout(cmd, TIMEOUT)
    };
    let m_full = dir.path().join("full.jsonl");
    let ran = job(&[], &m_full, None);
    assert!(ran.status.success(), "{}", ran.stderr);

    let m_killed = dir.path().join("killed.jsonl");
    let ran = job(
        &["--checkpoint", s(&ck), "--checkpoint-every", "1"],
        &m_killed,
        Some("4:part"),
    );
    assert!(
        !ran.status.success(),
        "the injected abort did not end the job"
    );
    assert_eq!(
        fs::read_to_string(ck.join("latest"))
            .expect("latest")
            .trim(),
        "step-000000003"
    );
    let manifest: Value = serde_json::from_str(
        &fs::read_to_string(ck.join("step-000000003/manifest.json")).expect("manifest"),
    )
    .expect("json");
    let files = manifest["files"].as_array().expect("files");
    assert_eq!(files.len(), 4, "one part file per rank: {manifest}");
    let tensors = manifest["tensors"].as_array().expect("tensors");
    let split = tensors.iter().find(|t| {
        let files: std::collections::HashSet<&str> = t["pieces"]
            .as_array()
            .expect("pieces")
            .iter()
            .map(|p| p["file"].as_str().expect("file"))
            .collect();
        files.len() > 1
    });
    assert!(
        split.is_some(),
        "no table stored by several ranks: {manifest}"
    );
    for t in tensors {
        let name = t["name"].as_str().expect("name");
        if name.starts_with("bot") || name.starts_with("top") {
            for p in t["pieces"].as_array().expect("pieces") {
                assert_eq!(p["file"], "part-00000.safetensors", "{name}");
            }
        }
    }

    let m_resumed = dir.path().join("resumed.jsonl");
    let ran = job(&["--resume", s(&ck)], &m_resumed, None);
    assert!(ran.status.success(), "{}", ran.stderr);
    let (full, sf) = metrics(&m_full);
    let (resumed, sr) = metrics(&m_resumed);
    let after: Vec<_> = full.iter().filter(|l| l.0 > 3).collect();
    assert_eq!(resumed.iter().collect::<Vec<_>>(), after);
    assert_eq!(sf["auc"], sr["auc"]);
}

#[test]
fn calibrate_measures_exchanges_between_mpi_processes() {
    let dir = tempdir();
    let file = dir.path().join("cal.json");
    let mut cmd = mpirun();
    cmd.args(["-n", "2", DLRMC, "calibrate", "--comm", "mpi", "--quick"])
        .args(["-o", s(&file)]);
    let ran = run_with_timeout(cmd, TIMEOUT);
    assert!(ran.status.success(), "{}", ran.stderr);
    // Rank 0 alone reports and writes.
    assert_eq!(
        ran.stderr
            .matches("all_to_all_v between 2 ranks (mpi)")
            .count(),
        1,
        "{}",
        ran.stderr
    );
    let c: Value = serde_json::from_slice(&fs::read(&file).expect("written")).expect("JSON");
    assert_eq!(c["comm"], "mpi");
    assert_eq!(c["ranks"], 2);
    let gbps = c["network"]["gbps"].as_f64().expect("a number");
    let lat = c["network"]["latency_us"].as_f64().expect("a number");
    // Any positive finite rate: what two processes exchange per second depends
    // on the machine's load (0.00996 GB/s and 28 ms latency with two builds
    // running beside the test on 2 cores).
    assert!(
        gbps > 0.0 && gbps.is_finite() && (0.0..1e6).contains(&lat),
        "{c}"
    );
}
