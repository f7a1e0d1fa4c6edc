//! The structure-aware target `model`: the fuzzer's bytes, read by `arbitrary`,
//! choose a small DLRM description (dense features, tables, bag forms, pooling,
//! MLPs, the dot, cat or DCN-v2 interaction, loss, optimizer, batch); it is
//! compiled twice, with the optimising passes (`dlrmc compile`: e-graph fusion,
//! blocked layouts, the JIT kernels) and without (`-O0`), and the two are run
//! side by side: one training step (the optimised plan on the runtime's
//! executor, the `-O0` one in the reference interpreter), then inference on
//! another batch with the trained parameters. A description the loader or the
//! compiler refuses is an expected answer (`false`); a panic, or outputs that
//! differ by more than [`TOL`] ([`TOL_ADAGRAD`]; relative, above [`FLOOR`]), is a finding.

use arbitrary::{Result, Unstructured};
use dlrm_ir::{SingleRank, Tensor};
use dlrm_runtime::{DataSchema, Executor, SyntheticData};
use dlrmc::compile::{CompileOptions, compile};
use dlrmc::model::{Overrides, load_model};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::Path;

/// Largest relative difference allowed between the optimised and the reference
/// run after an SGD step (sums in another order: 6e-8 seen).
const TOL: f32 = 1e-4;
/// The same after an Adagrad or row-wise Adagrad step, whose `g / sqrt(G)`
/// turns a rounding difference in a near-zero gradient into a step-sized one
/// (7e-4 seen at learning rate 0.5).
const TOL_ADAGRAD: f32 = 3e-3;
/// Differences below this are ignored (probabilities near 0 or 1).
const FLOOR: f32 = 1e-6;

/// A description from the bytes (some invalid on purpose: the loader's checks
/// are part of what is fuzzed).
fn spec(u: &mut Unstructured<'_>) -> Result<Value> {
    let tables = u.int_in_range(1..=4usize)?;
    let dim = u.int_in_range(1..=12usize)?;
    let dense = u.int_in_range(1..=9usize)?;
    let rows: Vec<usize> = (0..tables)
        .map(|_| u.int_in_range(1..=40usize))
        .collect::<Result<_>>()?;
    let mut bottom = vec![dense];
    for _ in 0..u.int_in_range(0..=2usize)? {
        bottom.push(u.int_in_range(1..=24usize)?);
    }
    // The dot interaction needs the bottom MLP to end at the table width; most
    // descriptions keep to it, a few do not.
    if !u.ratio(1u8, 16)? {
        bottom.push(dim);
    }
    let mut top: Vec<usize> = (0..u.int_in_range(0..=2usize)?)
        .map(|_| u.int_in_range(1..=24usize))
        .collect::<Result<_>>()?;
    top.push(1);
    let interaction = *u.choose(&["dot", "cat", "dcn"])?;
    let mut m = json!({
        "name": "fuzz",
        "dense_features": dense,
        "embedding_dim": dim,
        "table_rows": rows,
        "pooling_mode": *u.choose(&["sum", "mean"])?,
        "bottom_mlp": bottom,
        "top_mlp": top,
        "interaction": interaction,
        "interaction_itself": u.arbitrary::<bool>()?,
        "loss": "bce",
        "batch_size": u.int_in_range(1..=12usize)?,
        "optimizer": *u.choose(&["sgd", "adagrad", "rowwise_adagrad"])?,
        "learning_rate": *u.choose(&[0.01f32, 0.1, 0.5])?,
        "seed": u.int_in_range(0..=1000u64)?,
    });
    if interaction == "dcn" {
        m["dcn_layers"] = json!(u.int_in_range(1..=3usize)?);
        m["dcn_low_rank"] = json!(u.int_in_range(1..=6usize)?);
        m["interaction_itself"] = json!(false);
    }
    if u.arbitrary::<bool>()? {
        m["bags"] = json!("offsets");
    } else {
        let pooling: Vec<usize> = (0..tables)
            .map(|_| u.int_in_range(1..=3usize))
            .collect::<Result<_>>()?;
        m["pooling"] = json!(pooling);
    }
    Ok(m)
}

/// The largest relative difference of two outputs (`None`: shapes differ).
fn max_rel(a: &Tensor, b: &Tensor) -> Option<f32> {
    if a.shape != b.shape {
        return None;
    }
    let (x, y) = (a.to_f32_vec(), b.to_f32_vec());
    Some(x.iter().zip(&y).fold(0.0f32, |m, (p, q)| {
        let d = (p - q).abs();
        if d <= FLOOR || (p.is_nan() && q.is_nan()) {
            m
        } else {
            m.max(d / p.abs().max(q.abs()))
        }
    }))
}

/// The description's plans, optimised and `-O0` (`None`: the loader or the
/// compiler refused it, an expected answer).
fn plans(spec: &Value, work: &Path) -> Option<(dlrm_runtime::Plan, dlrm_runtime::Plan)> {
    let file = work.join("fuzz-model.json");
    std::fs::write(&file, spec.to_string()).ok()?;
    let load = || load_model(&file, Overrides::default()).ok();
    let (a, b) = (load()?, load()?);
    let reference = CompileOptions {
        optimize: false,
        ..CompileOptions::default()
    };
    let fast = compile(a, &CompileOptions::default(), &mut |_, _| {}).ok()?;
    let slow = compile(b, &reference, &mut |_, _| {}).ok()?;
    Some((fast, slow))
}

/// One case (module docs); `work` holds the description's file.
pub fn check(bytes: &[u8], work: &Path) -> bool {
    let Ok(spec) = spec(&mut Unstructured::new(bytes)) else {
        return false;
    };
    let Some((fast, slow)) = plans(&spec, work) else {
        return false;
    };
    let (Some(fast_train), Some(slow_train)) = (&fast.train, &slow.train) else {
        return false;
    };
    let batch = fast.training.batch_size.max(1);
    let tol = if spec["optimizer"] == "sgd" {
        TOL
    } else {
        TOL_ADAGRAD
    };
    let Ok(schema) = DataSchema::from_graph(slow_train) else {
        return false;
    };
    let data = SyntheticData::new(schema, 11);
    let (Ok(step0), Ok(step1)) = (
        data.inputs_for(0, batch, 1, 0, slow_train),
        data.inputs_for(1, batch, 1, 0, &slow.infer),
    ) else {
        return false;
    };
    // The symbols (e.g. the ids of a bag with offsets) are bound from the inputs
    // as the runtime binds them.
    let mut params: HashMap<String, Tensor> = slow.tensors().expect("params").into_iter().collect();
    let bind = |g: &dlrm_ir::Graph, ins: &HashMap<String, Tensor>, p: &HashMap<String, Tensor>| {
        dlrm_ir::interp::bind_symbols(g, ins, p)
            .unwrap_or_else(|e| panic!("the inputs do not bind on {spec}: {e}"))
    };
    // Inference before training, on the first batch. The optimised step's loss
    // is `bce_logits` (the e-graph's stable form of `bce(sigmoid(z))`), which
    // differs from the clamped `bce` where the sigmoid saturates in f32: such a
    // batch is not compared further.
    if first_inference(&spec, (&fast, &slow), &step0, &params) {
        return true;
    }
    // One training step each.
    let syms = bind(slow_train, &step0, &params);
    let want = dlrm_ir::interp::run(slow_train, &step0, &mut params, &syms, &SingleRank)
        .unwrap_or_else(|e| panic!("the reference step failed on {spec}: {e}"));
    let mut exec = Executor::new(
        fast_train.clone(),
        fast.tensors().expect("params").into_iter().collect(),
        0,
    )
    .unwrap_or_else(|e| panic!("no executor for {spec}: {e}"));
    let got = exec
        .step(step0, &syms, &SingleRank)
        .unwrap_or_else(|e| panic!("the optimised step failed on {spec}: {e}"));
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        let d = max_rel(w, g);
        assert!(
            d.is_some_and(|d| d <= tol),
            "training output {k} differs ({d:?}) on {spec}"
        );
    }
    // Inference on the next batch with the trained parameters.
    let trained: HashMap<String, Tensor> = fast
        .infer
        .params()
        .iter()
        .map(|&p| {
            let n = fast.infer.name_of(p);
            (
                n.to_string(),
                exec.param(n).expect("a trained parameter").clone(),
            )
        })
        .collect();
    let syms = bind(&slow.infer, &step1, &params);
    let want = dlrm_ir::interp::run(&slow.infer, &step1, &mut params, &syms, &SingleRank)
        .unwrap_or_else(|e| panic!("reference inference failed on {spec}: {e}"));
    let mut infer = Executor::new(fast.infer.clone(), trained, 0)
        .unwrap_or_else(|e| panic!("no inference executor for {spec}: {e}"));
    let got = infer
        .step(step1, &syms, &SingleRank)
        .unwrap_or_else(|e| panic!("optimised inference failed on {spec}: {e}"));
    let d = max_rel(&want[0], &got[0]);
    assert!(
        d.is_some_and(|d| d <= tol),
        "inference after a step differs ({d:?}) on {spec}"
    );
    true
}

/// Inference of both plans on the inputs of `step0` the inference graph reads,
/// with the initial parameters (`params`, the `-O0` plan's): equal within
/// [`TOL`]. Returns whether a probability saturates (within 1e-6 of 0 or 1).
fn first_inference(
    spec: &Value,
    (fast, slow): (&dlrm_runtime::Plan, &dlrm_runtime::Plan),
    step0: &HashMap<String, Tensor>,
    params: &HashMap<String, Tensor>,
) -> bool {
    let first: HashMap<String, Tensor> = slow
        .infer
        .inputs()
        .iter()
        .filter_map(|&v| {
            let n = slow.infer.name_of(v);
            step0.get(n).map(|t| (n.to_string(), t.clone()))
        })
        .collect();
    let syms = dlrm_ir::interp::bind_symbols(&slow.infer, &first, params)
        .unwrap_or_else(|e| panic!("the inputs do not bind on {spec}: {e}"));
    let mut p0 = params.clone();
    let want = dlrm_ir::interp::run(&slow.infer, &first, &mut p0, &syms, &SingleRank)
        .unwrap_or_else(|e| panic!("reference inference failed on {spec}: {e}"));
    let declared: Vec<&str> = fast
        .infer
        .params()
        .iter()
        .map(|&p| fast.infer.name_of(p))
        .collect();
    let initial: HashMap<String, Tensor> = fast
        .tensors()
        .expect("params")
        .into_iter()
        .filter(|(n, _)| declared.contains(&n.as_str()))
        .collect();
    let mut infer = Executor::new(fast.infer.clone(), initial, 0)
        .unwrap_or_else(|e| panic!("no inference executor for {spec}: {e}"));
    let got = infer
        .step(first, &syms, &SingleRank)
        .unwrap_or_else(|e| panic!("optimised inference failed on {spec}: {e}"));
    let d = max_rel(&want[0], &got[0]);
    assert!(
        d.is_some_and(|d| d <= TOL),
        "inference differs ({d:?}) on {spec}"
    );
    want[0]
        .to_f32_vec()
        .iter()
        .any(|&p| !(1e-6..=1.0 - 1e-6).contains(&p))
}
