//! Model lifecycle: `dlrm-serve --watch DIR` on the checkpoint directory of a
//! training run (`examples/dlrm-tiny.json`, trained in this process by the
//! library `dlrm-run` is built on). While client threads send requests without
//! pause, the run resumes and writes a checkpoint of more steps into the
//! directory: the server loads it beside the old model and swaps it in; no
//! request fails, each answer equals (1e-5) the outputs of a session opened on
//! the checkpoint whose step the answer names, and both versions answered. A
//! corrupt newer checkpoint then fails to load, is logged and counted, and the
//! model before it goes on serving.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

mod common;

use common::{Server, floats, http, json_inputs, raw, start_args};
use dlrm_ir::Tensor;
use dlrm_runtime::CheckpointOptions;
use dlrm_runtime::Session;
use dlrm_runtime::checkpoint::Checkpoint;
use dlrm_runtime::{Ranks, RunOptions, job_for, run_job};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn tiny_plan(dir: &Path) -> PathBuf {
    let json = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/dlrm-tiny.json");
    let model = dlrm_compiler::model::load_model(&json, dlrm_compiler::model::Overrides::default())
        .unwrap();
    let opts = dlrm_compiler::compile::CompileOptions::default();
    let plan = dlrm_compiler::compile::compile(model, &opts, &mut |_, _| {}).unwrap();
    let path = dir.join("tiny.plan");
    dlrm_runtime::write_plan(&path, &plan).unwrap();
    path
}

/// Trains `plan` to step `iters` (resuming from `ck`'s newest checkpoint if
/// `resume`), writing a checkpoint into `ck` after the last step.
fn train(plan: &Path, ck: &Path, iters: u64, resume: bool) {
    let opts = RunOptions {
        iters,
        checkpoint: Some(CheckpointOptions {
            dir: ck.to_path_buf(),
            every: 0,
            keep: 3,
        }),
        resume: resume.then(|| Arc::new(Checkpoint::open(ck).unwrap())),
        ..RunOptions::default()
    };
    let job = job_for(dlrm_runtime::read_plan(plan).unwrap(), &opts).unwrap();
    run_job(job, Ranks::Threads, &mut |_| {}).unwrap();
}

/// The outputs of a session on the checkpoint at `path` (its first output).
fn expected(path: &Path, inputs: &[(String, Tensor)]) -> Vec<f32> {
    let mut s = Session::open(path).unwrap();
    s.infer(inputs.to_vec()).unwrap()[0].1.to_f32_vec()
}

fn worst(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Polls `f` every 20 ms until it holds; fails after `limit`.
fn wait_for(what: &str, limit: Duration, s: &Server, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < limit,
            "{what}: not after {limit:?}; server log:\n{}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn metrics(s: &Server) -> String {
    String::from_utf8(raw(s, "GET", "/metrics", "", b"").2).unwrap()
}

fn version(s: &Server) -> Value {
    http(s, "GET", "/v2/models/dlrm", b"").1["versions"][0].clone()
}

/// One answer: its status, the version that answered and its outputs.
type Answer = (u16, String, Vec<f32>);

fn ask(s: &Server, body: &str) -> Answer {
    let (status, out) = http(s, "POST", "/v2/models/dlrm/infer", body.as_bytes());
    if status != 200 {
        return (status, out.to_string(), Vec::new());
    }
    let v = out["model_version"].as_str().unwrap_or("?").to_string();
    (status, v, floats(&out, 0))
}

#[test]
fn a_newer_checkpoint_is_swapped_in_under_load_and_a_corrupt_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let plan = tiny_plan(dir.path());
    let ck = dir.path().join("ck");
    train(&plan, &ck, 2, false);
    let ck_s = ck.to_str().unwrap();
    let s = Arc::new(start_args(&[
        "--watch",
        ck_s,
        "--watch-interval-ms",
        "30",
        "--max-delay-us",
        "200",
    ]));
    assert_eq!(version(&s), "2");
    let inputs = Session::open(&plan).unwrap().example_inputs(5, 7).unwrap();
    let body = json!({ "inputs": json_inputs(&inputs) }).to_string();
    let old = expected(&ck.join("step-000000002"), &inputs);

    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let (s, body, stop) = (Arc::clone(&s), body.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                let start = Instant::now();
                while !stop.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(180) {
                    answers.push(ask(&s, &body));
                }
                answers
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    train(&plan, &ck, 30, true);
    let new = expected(&ck.join("step-000000030"), &inputs);
    wait_for("step 30 served", Duration::from_secs(60), &s, || {
        version(&s) == "30"
    });
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let answers: Vec<Answer> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();

    assert!(worst(&old, &new) > 1e-3, "training moved nothing: {old:?}");
    let mut by_version = [0usize; 2];
    for (status, v, got) in &answers {
        assert_eq!(*status, 200, "a request failed during the swap: {v}");
        let (i, want) = match v.as_str() {
            "2" => (0, &old),
            "30" => (1, &new),
            _ => panic!("answered by version {v}"),
        };
        assert!(worst(got, want) <= 1e-5, "version {v}: {got:?} vs {want:?}");
        by_version[i] += 1;
    }
    assert!(
        by_version[0] > 0 && by_version[1] > 0,
        "answers by version (2, 30): {by_version:?}"
    );
    eprintln!("answers by version (2, 30): {by_version:?}");
    let m = metrics(&s);
    assert!(m.contains("dlrm_serve_model_version 30"), "{m}");
    assert!(
        m.contains("dlrm_serve_model_loads_total{outcome=\"success\"} 1"),
        "{m}"
    );

    // A corrupt checkpoint of step 31, put in place as the writer does.
    let bad = ck.join("step-000000031");
    let tmp = ck.join(".step-000000031.tmp");
    std::fs::create_dir(&tmp).unwrap();
    for e in std::fs::read_dir(ck.join("step-000000030")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), tmp.join(e.file_name())).unwrap();
    }
    let part = tmp.join("part-00000.safetensors");
    let mut bytes = std::fs::read(&part).unwrap();
    let n = bytes.len();
    bytes[n - 5] ^= 0x55;
    std::fs::write(&part, bytes).unwrap();
    std::fs::rename(&tmp, &bad).unwrap();
    std::fs::write(ck.join("latest.tmp"), "step-000000031").unwrap();
    std::fs::rename(ck.join("latest.tmp"), ck.join("latest")).unwrap();
    wait_for(
        "the corrupt load counted",
        Duration::from_secs(30),
        &s,
        || metrics(&s).contains("dlrm_serve_model_loads_total{outcome=\"failure\"} 1"),
    );
    let (status, v, got) = ask(&s, &body);
    assert_eq!((status, v.as_str()), (200, "30"));
    assert!(worst(&got, &new) <= 1e-5);
    let log = s.log();
    assert!(
        log.contains("not serving") && log.contains("step-000000031"),
        "{log}"
    );
    assert_eq!(version(&s), "30");
}
