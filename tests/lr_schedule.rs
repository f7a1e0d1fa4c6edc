//! The learning rate as a run-time value of the training step, end to end through
//! `job_for` (what `dlrm-run --lr`, `--lr-warmup-steps`, ... build): the plan's own
//! rate given as `--lr` (or a schedule that never changes it) trains bit for bit
//! like the run without one; `--lr 0` leaves every parameter as it was; a warmup
//! slows the first steps; 2 ranks follow the same schedule as one rank; every
//! logged step reports its rate.

use dlrm_ir::Tensor;
use dlrm_runtime::driver::{Event, Report, run_with_params};
use dlrm_runtime::plan::Plan;
use dlrm_runtime::{Backend, LrPolicy};
use dlrm_runtime::{RunOptions, RunSettings, job_for};
use dlrmc::compile::{CompileOptions, compile};
use dlrmc::model::{Overrides, load_model};
use std::collections::HashMap;
use std::path::Path;

/// dlrm-tiny (lr 0.2), optimised (fused updates, blocked weights).
fn tiny() -> Plan {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/dlrm-tiny.json");
    let model = load_model(&path, Overrides::default()).expect("model");
    compile(model, &CompileOptions::default(), &mut |_, _| {}).expect("compile")
}

struct Run {
    report: Report,
    params: HashMap<String, Tensor>,
    /// `(iter, loss, lr)` of every logged step.
    steps: Vec<(u64, f32, Option<f32>)>,
}

fn train(plan: &Plan, o: RunOptions) -> Run {
    let o = RunOptions {
        settings: RunSettings {
            log_every: 1,
            eval_batches: 1,
            ..o.settings
        },
        ..o
    };
    let job = job_for(plan.clone(), &o).expect("job");
    let mut steps = Vec::new();
    let (report, mut params) = run_with_params(job, &mut |e| {
        if let Event::Step { iter, loss, lr, .. } = e {
            steps.push((*iter, loss.expect("training loss"), *lr));
        }
    })
    .expect("run");
    Run {
        report,
        params: params.swap_remove(0),
        steps,
    }
}

fn opts(iters: u64) -> RunOptions {
    RunOptions {
        iters,
        ..RunOptions::default()
    }
}

fn poly(warmup_steps: u64, decay_start: u64, decay_steps: u64) -> Option<LrPolicy> {
    Some(LrPolicy::Poly {
        warmup_steps,
        decay_start,
        decay_steps,
    })
}

#[test]
fn the_plans_rate_as_a_run_time_value_changes_nothing() {
    let plan = tiny();
    let base = train(&plan, opts(12));
    assert!(
        base.steps.iter().all(|s| s.2 == Some(0.2)),
        "{:?}",
        base.steps
    );
    let runs = [
        RunOptions {
            lr: Some(0.2),
            ..opts(12)
        },
        // A schedule whose rate is the plan's at every step: the executor is
        // handed the rate every step.
        RunOptions {
            lr_policy: Some(LrPolicy::Step {
                step_size: 100,
                gamma: 0.5,
            }),
            ..opts(12)
        },
    ];
    for o in runs {
        let r = train(&plan, o.clone());
        assert_eq!(r.steps, base.steps, "{o:?}");
        assert_eq!(r.params, base.params, "{o:?}");
        assert_eq!(r.report.auc, base.report.auc, "{o:?}");
    }
}

#[test]
fn a_zero_rate_leaves_the_parameters_unchanged() {
    let plan = tiny();
    for backend in [Backend::Jit, Backend::Reference] {
        let r = train(
            &plan,
            RunOptions {
                settings: RunSettings {
                    backend,
                    ..RunSettings::default()
                },
                lr: Some(0.0),
                ..opts(5)
            },
        );
        assert!(r.steps.iter().all(|s| s.2 == Some(0.0)));
        for (name, t) in &plan.tensors().expect("params") {
            assert_eq!(
                r.params.get(name),
                Some(t),
                "{name} moved at lr 0 ({backend:?})"
            );
        }
        // Same data, same parameters: the same loss every step... of its batch;
        // the first step's loss is the plan's.
        assert!(r.steps.iter().all(|s| s.1.is_finite()));
    }
}

#[test]
fn a_warmup_slows_the_first_steps() {
    let plan = tiny();
    let flat = train(&plan, opts(10));
    let warm = train(
        &plan,
        RunOptions {
            lr_policy: poly(10, 10, 0),
            ..opts(10)
        },
    );
    // The reference's warmup: step k < 10 at 0.2·k/10.
    for (k, s) in warm.steps.iter().enumerate().take(9) {
        let want = (0.2f32 as f64 * (1.0 - (10 - (k + 1)) as f64 / 10.0)) as f32;
        assert_eq!(s.2, Some(want), "step {}", k + 1);
    }
    assert_eq!(warm.steps[9].2, Some(0.2));
    // The first loss is computed before any update; then the parameters move
    // less, and the loss falls less.
    assert_eq!(warm.steps[0].1, flat.steps[0].1);
    let moved = |r: &Run| -> f64 {
        plan.tensors()
            .expect("params")
            .iter()
            .map(|(n, t)| {
                let after = r.params[n].to_f32_vec();
                let before = t.to_f32_vec();
                after
                    .iter()
                    .zip(&before)
                    .map(|(a, b)| f64::from((a - b).abs()))
                    .sum::<f64>()
            })
            .sum()
    };
    let (mw, mf) = (moved(&warm), moved(&flat));
    assert!(
        mw > 0.0 && mw < mf,
        "warmup moved the parameters by {mw}, constant by {mf}"
    );
    let mean = |r: &Run| r.steps[1..].iter().map(|s| f64::from(s.1)).sum::<f64>() / 9.0;
    assert!(
        mean(&warm) > mean(&flat),
        "mean loss of steps 2..10: warmup {} vs constant {}",
        mean(&warm),
        mean(&flat)
    );
}

#[test]
fn ranks_follow_the_same_schedule() {
    let plan = tiny();
    let policy = poly(3, 5, 4);
    let one = train(
        &plan,
        RunOptions {
            lr: Some(0.1),
            lr_policy: policy,
            ..opts(12)
        },
    );
    let two = train(
        &plan,
        RunOptions {
            settings: RunSettings {
                ranks: 2,
                ..RunSettings::default()
            },
            lr: Some(0.1),
            lr_policy: policy,
            ..opts(12)
        },
    );
    for (a, b) in one.steps.iter().zip(&two.steps) {
        assert_eq!(a.2, b.2, "step {}: the rates differ", a.0);
        assert!(
            (a.1 - b.1).abs() <= 1e-5 * a.1.abs(),
            "step {}: 1 rank {} vs 2 ranks {}",
            a.0,
            a.1,
            b.1
        );
    }
    let rates: Vec<f32> = one.steps.iter().filter_map(|s| s.2).collect();
    // LRPolicyScheduler(3, 5, 4) at base 0.1 (see runtime/src/schedule.rs).
    let want = [
        0.033333335,
        0.06666667,
        0.06666667,
        0.06666667,
        0.1,
        0.056250002,
        0.025,
        0.00625,
        0.00625,
        0.00625,
        0.00625,
        0.00625,
    ];
    assert_eq!(rates, want);
}

#[test]
fn bad_rates_are_clear_errors() {
    let plan = tiny();
    let err = |o: RunOptions| {
        job_for(plan.clone(), &o)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert!(
        err(RunOptions {
            lr: Some(-1.0),
            ..opts(3)
        })
        .contains("learning rate")
    );
    assert!(
        err(RunOptions {
            lr: Some(f32::NAN),
            ..opts(3)
        })
        .contains("learning rate")
    );
    let e = err(RunOptions {
        lr_policy: poly(10, 5, 3),
        ..opts(3)
    });
    assert!(e.contains("warmup"), "{e}");
}
