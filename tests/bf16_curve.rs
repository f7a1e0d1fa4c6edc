//! bf16 training against fp32 on the example models: a `--precision bf16` plan's
//! backward GEMMs take bf16 operands (its activation gradients are bf16), and its
//! loss curve stays within a stated tolerance of the fp32 plan's (docs/performance.md's
//! 500-step table is the same comparison at full batch).

mod common;

use common::{example, losses};
use dlrm_ir::{DType, Graph, Op};
use dlrm_passes::pipeline::Precision;
use dlrm_runtime::driver::run_with_params;
use dlrm_runtime::plan::Plan;
use dlrm_runtime::{RunOptions, RunSettings, job_for};
use dlrmc::compile::{CompileOptions, compile};
use dlrmc::model::{Overrides, load_model};

fn plan(name: &str, precision: Precision, batch: usize) -> Plan {
    let over = Overrides {
        batch_size: Some(batch),
        ..Overrides::default()
    };
    let model = load_model(&example(name), over).expect("load");
    let opts = CompileOptions {
        precision,
        ..CompileOptions::default()
    };
    compile(model, &opts, &mut |_, _| {}).expect("compile")
}

/// Per backward GEMM of `g`: (dy is bf16, its other GEMM operand — the weight
/// of `brgemm_dgrad`, `x` of `brgemm_wgrad` — is bf16).
fn backward_operands(g: &Graph) -> Vec<(bool, bool)> {
    let bf = |v| g.ty(v).dtype == DType::BF16;
    g.nodes()
        .iter()
        .filter_map(|n| {
            let other = match n.op {
                Op::BrgemmDgrad { mask, .. } => {
                    n.inputs.len() - 1 - usize::from(mask != dlrm_ir::Act::None)
                }
                Op::BrgemmWgrad { .. } => n.inputs.len() - 1,
                _ => return None,
            };
            Some((bf(n.inputs[0]), bf(n.inputs[other])))
        })
        .collect()
}

#[test]
fn bf16_plans_run_their_backward_gemms_on_bf16_operands() {
    // A wgrad per layer, a dgrad per layer but the first: 3 + 3 layers (small),
    // 3 + 5 (mlperf).
    for (name, gemms) in [("dlrm-small.json", 11), ("dlrm-mlperf.json", 15)] {
        let bf16 = plan(name, Precision::Bf16, 64);
        let ops = backward_operands(bf16.train.as_ref().expect("a training graph"));
        assert_eq!(ops.len(), gemms, "{name}: {ops:?}");
        assert!(ops.iter().all(|&o| o == (true, true)), "{name}: {ops:?}");
        // Mixed: the last layer is f32, and so is the loss gradient it takes;
        // every other backward GEMM is all-bf16.
        let mixed = plan(name, Precision::Mixed, 64);
        let ops = backward_operands(mixed.train.as_ref().expect("a training graph"));
        let f32_dy = ops.iter().filter(|o| !o.0).count();
        assert_eq!(
            f32_dy, 2,
            "{name}: the last layer's dgrad and wgrad: {ops:?}"
        );
        assert!(ops.iter().filter(|o| o.0).all(|o| o.1), "{name}: {ops:?}");
    }
}

/// The training losses of `name` at `precision`, `iters` steps of `batch`
/// synthetic samples.
fn curve(name: &str, precision: Precision, iters: u64, batch: usize) -> Vec<f32> {
    let opts = RunOptions {
        settings: RunSettings {
            log_every: 1,
            eval_batches: 1,
            ..RunSettings::default()
        },
        iters,
        ..RunOptions::default()
    };
    let job = job_for(plan(name, precision, batch), &opts).expect("job");
    let (report, _) = run_with_params(job, &mut |_| {}).expect("run");
    losses(&report)
}

/// Means of consecutive windows of `w` losses.
fn windows(l: &[f32], w: usize) -> Vec<f32> {
    l.chunks(w)
        .map(|c| c.iter().sum::<f32>() / c.len() as f32)
        .collect()
}

#[test]
fn bf16_training_follows_the_fp32_loss_curve() {
    for name in ["dlrm-small.json", "dlrm-kaggle.json"] {
        let (iters, batch) = (STEPS, BATCH);
        let f32_curve = curve(name, Precision::Fp32, iters, batch);
        for precision in [Precision::Bf16, Precision::Mixed] {
            let other = curve(name, precision, iters, batch);
            let (a, b) = (windows(&f32_curve, WINDOW), windows(&other, WINDOW));
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs() / x.abs())
                .fold(0.0f32, f32::max);
            assert!(
                worst <= TOLERANCE,
                "{name} {precision}: windowed losses differ by {worst} rel: {a:?} vs {b:?}"
            );
        }
    }
}

/// Steps and global batch of the test's runs (docs/performance.md's table: 500 steps of
/// 512); the losses are compared as means of windows of [`WINDOW`] steps.
const STEPS: u64 = 100;
const BATCH: usize = 256;
const WINDOW: usize = 25;

/// Largest relative difference of a window's mean loss from fp32's. Measured
/// (release build, AVX512_BF16 CPU): 0.41% (bf16) and 0.36% (mixed) on
/// dlrm-small, 0.18% and 0.16% on dlrm-kaggle; bf16 learns slightly slower, the gap
/// growing with the steps. 2% leaves room for the FMA kernels' sums on CPUs
/// without AVX512_BF16 and for another seed's data, and still fails a
/// gradient rounding that was wrong (a missed or doubled rounding moves the
/// curve by far more).
const TOLERANCE: f32 = 0.02;
