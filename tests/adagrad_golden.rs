//! Adagrad and row-wise Adagrad against PyTorch, without PyTorch: dlrm-tiny trained
//! 100 steps (batch 24, lr 0.02, the synthetic data of seed 3) must reproduce the
//! loss curve and the trained parameters and accumulators that
//! `torch.optim.Adagrad` and the reference DLRM's `RWSAdagrad` computed from the
//! same initial weights and batches (`tests/golden/adagrad_tiny.json`, written by
//! `scripts/compare-pytorch-optim --bless`): every loss within 1e-5 relative, every
//! tensor within 1e-5 of its largest magnitude (its sum of magnitudes, sum of
//! squares and first 8 elements are stored).
//!
//! The same holds under learning-rate schedules, the rate handed to the executor
//! each step: Adagrad under the reference DLRM's `LRPolicyScheduler` (warmup and
//! polynomial decay) and SGD under `StepLR`, replayed by the script with those
//! PyTorch schedulers.
//!
//! With `DLRMC_OPTIM_TRACE=DIR` the test also writes what PyTorch needs to redo the
//! run: `DIR/<optimizer>.json` holds the initial parameters, every batch, the
//! losses and the trained values (the script reads it).

mod common;

use common::O0;
use dlrm_ir::{SingleRank, Tensor};
use dlrm_runtime::{DataSchema, Executor, LrPolicy, LrSchedule, SyntheticData};
use dlrmc::compile::{CompileOptions, compile};
use dlrmc::model::{Overrides, load_model};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

const STEPS: u64 = 100;
const BATCH: usize = 24;
const LR: f32 = 0.02;
const SEED: u64 = 3;

/// The unfused plan (parameters unblocked, as PyTorch holds them).
fn tensor_json(t: &Tensor) -> Value {
    json!({ "shape": t.shape, "data": t.to_f32_vec() })
}

struct Trace {
    losses: Vec<f32>,
    params: BTreeMap<String, Vec<f32>>,
}

/// A golden run: its name (in the golden file and the trace's file name), the
/// optimizer, and the learning-rate schedule (`None`: the compiled rate).
struct Case {
    name: &'static str,
    optimizer: &'static str,
    schedule: Option<LrSchedule>,
}

/// The runs checked against PyTorch: each optimizer at a constant rate, then
/// Adagrad under the reference DLRM's `LRPolicyScheduler` (warmup 10 steps, decay
/// from step 40 over 50 steps: every phase, the frozen rates between and after
/// included) and SGD under `StepLR` (halved every 25 steps).
fn cases() -> [Case; 4] {
    let case = |name, optimizer, policy: Option<LrPolicy>| Case {
        name,
        optimizer,
        schedule: policy.map(|policy| LrSchedule { lr: LR, policy }),
    };
    [
        case("adagrad", "adagrad", None),
        case("rowwise_adagrad", "rowwise_adagrad", None),
        case(
            "adagrad_lr_policy",
            "adagrad",
            Some(LrPolicy::Poly {
                warmup_steps: 10,
                decay_start: 40,
                decay_steps: 50,
            }),
        ),
        case(
            "sgd_step_lr",
            "sgd",
            Some(LrPolicy::Step {
                step_size: 25,
                gamma: 0.5,
            }),
        ),
    ]
}

/// Trains dlrm-tiny as `case` says (with `opts`), writing the trace when asked.
fn trace(case: &Case, opts: &CompileOptions, dump: Option<&Path>) -> Trace {
    let optimizer = case.optimizer;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = Overrides {
        optimizer: Some(optimizer.into()),
        learning_rate: Some(LR),
        batch_size: Some(BATCH),
        ..Overrides::default()
    };
    let model = load_model(&root.join("examples/dlrm-tiny.json"), o).expect("model");
    let init = dlrm_ir::init::materialize_all(&model.params).expect("params");
    let plan = compile(model, opts, &mut |_, _| {}).expect("compile");
    let train = plan.train.clone().expect("train graph");
    let data = SyntheticData::new(DataSchema::from_graph(&train).expect("schema"), SEED);
    let mut exec = Executor::new(
        train.clone(),
        plan.tensors().expect("params").into_iter().collect(),
        0,
    )
    .expect("exec");
    let syms = HashMap::from([("B".to_string(), BATCH)]);
    let (mut losses, mut batches) = (Vec::new(), Vec::new());
    for step in 0..STEPS {
        let inputs = data.inputs_for(step, BATCH, 1, 0, &train).expect("inputs");
        if dump.is_some() {
            let b: BTreeMap<String, Value> = inputs
                .iter()
                .map(|(k, t)| (k.clone(), tensor_json(t)))
                .collect();
            batches.push(b);
        }
        if let Some(sch) = &case.schedule {
            exec.set_lr(Some(sch.lr_at(step + 1))).expect("rate");
        }
        let outs = exec.step(inputs, &syms, &SingleRank).expect("step");
        losses.push(outs[0].to_f32_vec()[0]);
    }
    let params: BTreeMap<String, Vec<f32>> = exec
        .into_params()
        .into_iter()
        .map(|(k, t)| (k, t.to_f32_vec()))
        .collect();
    if let Some(dir) = dump {
        let init: BTreeMap<&String, Value> =
            init.iter().map(|(k, t)| (k, tensor_json(t))).collect();
        let doc = json!({
            "optimizer": optimizer, "lr": LR, "eps": 1e-10, "steps": STEPS,
            "batch": BATCH, "seed": SEED, "init": init, "batches": batches,
            "losses": losses, "trained": params, "schedule": case.schedule,
        });
        std::fs::create_dir_all(dir).expect("trace dir");
        let path = dir.join(format!("{}.json", case.name));
        std::fs::write(&path, doc.to_string()).expect("write trace");
    }
    Trace { losses, params }
}

fn golden() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/adagrad_tiny.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("golden file")).expect("json")
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

/// Checks `t` against PyTorch's golden values for `optimizer`.
fn check(optimizer: &str, t: &Trace) {
    let g = &golden()[optimizer];
    let want = f32s(&g["losses"]);
    assert_eq!(want.len(), t.losses.len());
    for (i, (a, b)) in t.losses.iter().zip(&want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs(),
            "{optimizer}: loss of step {i}: {a} vs PyTorch {b}"
        );
    }
    let params = g["params"].as_object().expect("params");
    assert_eq!(params.len(), t.params.len(), "{optimizer}: parameter count");
    for (name, p) in params {
        let got = t
            .params
            .get(name)
            .unwrap_or_else(|| panic!("no parameter {name}"));
        let scale = p["max_abs"].as_f64().expect("max_abs");
        let sum_abs: f64 = got.iter().map(|&x| (x as f64).abs()).sum();
        let sum_sq: f64 = got.iter().map(|&x| (x as f64) * (x as f64)).sum();
        let n = got.len() as f64;
        let tol = |want: f64, per: f64| (want - per).abs() <= 1e-5 * want.abs().max(scale * n);
        assert!(
            tol(p["sum_abs"].as_f64().expect("sum_abs"), sum_abs),
            "{optimizer}: {name}: sum |x| {sum_abs} vs PyTorch {}",
            p["sum_abs"]
        );
        assert!(
            (p["sum_sq"].as_f64().expect("sum_sq") - sum_sq).abs()
                <= 1e-5 * p["sum_sq"].as_f64().unwrap_or(0.0).max(scale * scale * n),
            "{optimizer}: {name}: sum x² {sum_sq} vs PyTorch {}",
            p["sum_sq"]
        );
        for (i, (a, b)) in got.iter().zip(f32s(&p["head"])).enumerate() {
            assert!(
                ((a - b).abs() as f64) <= 1e-5 * scale.max(f64::MIN_POSITIVE),
                "{optimizer}: {name}[{i}]: {a} vs PyTorch {b} (largest |x| {scale})"
            );
        }
    }
}

#[test]
fn adagrad_matches_pytorch() {
    let dump = std::env::var_os("DLRMC_OPTIM_TRACE");
    let dump = dump.as_deref().map(Path::new);
    // Both traces first (the script needs both), then the checks.
    let traces: Vec<(&str, Trace)> = cases()
        .iter()
        .map(|c| (c.name, trace(c, &O0, dump)))
        .collect();
    for (name, t) in &traces {
        check(name, t);
    }
}

#[test]
fn fused_adagrad_matches_pytorch_losses() {
    // The optimised plan (fused updates, blocked weights): its losses.
    for case in cases() {
        let optimizer = case.name;
        let t = trace(&case, &CompileOptions::default(), None);
        let want = f32s(&golden()[optimizer]["losses"]);
        for (i, (a, b)) in t.losses.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs(),
                "{optimizer} (fused): loss of step {i}: {a} vs PyTorch {b}"
            );
        }
    }
}
