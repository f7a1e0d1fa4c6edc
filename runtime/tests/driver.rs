//! The multi-rank driver on the hand-built tiny DLRM: it learns, N ranks agree with
//! one, inference mode, failures (no hang, the original error), metrics file.

mod common;

use common::*;
use dlrm_ir::{ParamValue, Tensor, text};
use dlrm_runtime::driver::{default_threads, run_rank};
use dlrm_runtime::{
    Event, Job, LocalGroup, MetricsWriter, Mode, RuntimeError, run, run_with_params,
};
use std::time::{Duration, Instant};

fn job(ranks: usize, lr: f32, iters: u64, batch: usize) -> Job {
    let mut j = Job::from_plan(plan(lr));
    j.settings.ranks = ranks;
    j.train_graphs = Some((0..ranks).map(|r| tiny(ranks, r, true, lr)).collect());
    j.infer_graphs = (0..ranks).map(|r| tiny(ranks, r, false, lr)).collect();
    j.iters = iters;
    j.global_batch = batch;
    j.settings.log_every = 1;
    j.settings.eval_batches = 4;
    j
}

#[test]
fn one_rank_learns_the_synthetic_task() {
    let mut j = job(1, 0.5, 300, 128);
    j.settings.log_every = 50;
    j.settings.eval_batches = 8;
    let mut steps = Vec::new();
    let report = run(j, &mut |e| {
        if let Event::Step { iter, loss, .. } = e {
            steps.push((*iter, loss.expect("training loss")));
        }
    })
    .expect("run");
    assert_eq!(report.mode, Mode::Train);
    assert_eq!(
        steps.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![50, 100, 150, 200, 250, 300]
    );
    assert_eq!(report.losses, steps);
    let first = report.losses[0].1;
    let last = report.final_loss.expect("loss");
    let auc = report.auc.expect("auc");
    eprintln!(
        "loss {first} -> {last}, auc {auc}, acc {:?}",
        report.accuracy
    );
    assert!(last < 0.9 * first, "loss did not fall: {first} -> {last}");
    assert!(auc > 0.75, "AUC {auc}");
    assert!(report.accuracy.expect("accuracy") > 0.7);
    assert_eq!(report.eval_samples, 8 * 128);
    assert!(report.samples_per_s > 0.0);
    // The op timers cover the steps after the 3 warm-up steps.
    assert_eq!(report.timed_steps, 297);
    assert!(
        report
            .op_times
            .iter()
            .any(|t| t.op == "sparse_sgd" && t.calls == 3 * report.timed_steps)
    );
}

#[test]
fn several_ranks_match_one_rank() {
    let (one, p1) = run_with_params(job(1, 0.2, 6, 24), &mut |_| {}).expect("1 rank");
    for ranks in [2usize, 3, 4] {
        let (rep, pn) = run_with_params(job(ranks, 0.2, 6, 24), &mut |_| {}).expect("n ranks");
        let l1: Vec<f32> = one.losses.iter().map(|l| l.1).collect();
        let ln: Vec<f32> = rep.losses.iter().map(|l| l.1).collect();
        assert!(close(&l1, &ln, 1e-5), "{ranks} ranks: {l1:?} vs {ln:?}");
        assert_eq!(rep.eval_samples, one.eval_samples);
        assert!((rep.auc.expect("auc") - one.auc.expect("auc")).abs() < 1e-3);
        // Tables live on their owner only; MLPs are identical on every rank.
        for (t, _) in TABLES.iter().enumerate() {
            let name = format!("emb.{t}");
            for (r, params) in pn.iter().enumerate() {
                assert_eq!(
                    params.contains_key(&name),
                    t % ranks == r,
                    "{name} on rank {r}"
                );
            }
            let trained = &pn[t % ranks][&name];
            assert!(
                close(&trained.to_f32_vec(), &p1[0][&name].to_f32_vec(), 1e-4),
                "{name}"
            );
        }
        for r in 1..ranks {
            assert_eq!(pn[r]["top.0.w"], pn[0]["top.0.w"], "rank {r} MLP diverged");
        }
        assert!(close(
            &pn[0]["bot.0.w"].to_f32_vec(),
            &p1[0]["bot.0.w"].to_f32_vec(),
            1e-4
        ));
    }
}

/// The one-rank-per-process path (what `--comm mpi` runs), with each "process" a
/// thread holding its own copy of the job and its own communicator handle: the
/// same losses, bit for bit, and the same AUC as the thread driver; only rank 0
/// reports, and its events are the thread driver's.
#[test]
fn one_rank_per_process_runs_like_the_thread_driver() {
    for ranks in [1usize, 3, 4] {
        let mut want_events = Vec::new();
        let want =
            run(job(ranks, 0.2, 6, 24), &mut |e| want_events.push(e.clone())).expect("threads");
        let got: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = LocalGroup::new(ranks)
                .into_iter()
                .map(|comm| {
                    s.spawn(move || {
                        let mut events = Vec::new();
                        let rep = run_rank(job(ranks, 0.2, 6, 24), &comm, &mut |e| {
                            events.push(e.clone())
                        });
                        (rep, events)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rank thread"))
                .collect()
        });
        for (r, (rep, events)) in got.into_iter().enumerate() {
            let rep = rep.expect("run_rank");
            if r > 0 {
                assert!(rep.is_none() && events.is_empty(), "rank {r} reported");
                continue;
            }
            let rep = rep.expect("rank 0 reports");
            assert_eq!(rep.losses, want.losses, "{ranks} ranks");
            assert_eq!(rep.auc, want.auc);
            assert_eq!(rep.eval_samples, want.eval_samples);
            let steps = |ev: &[Event]| -> Vec<(u64, Option<f32>)> {
                ev.iter()
                    .filter_map(|e| match e {
                        Event::Step { iter, loss, .. } => Some((*iter, *loss)),
                        Event::Eval { .. } | Event::Evaluated(_) | Event::Checkpoint(_) => None,
                    })
                    .collect()
            };
            assert_eq!(steps(&events), steps(&want_events));
        }
    }
    // A communicator of another size than the job is refused.
    let comm = LocalGroup::new(1).pop().expect("one rank");
    let err = run_rank(job(2, 0.2, 1, 24), &comm, &mut |_| {}).expect_err("size mismatch");
    assert!(
        err.to_string()
            .contains("the job is for 2 ranks but the communicator has 1"),
        "{err}"
    );
}

#[test]
fn inference_mode_reports_throughput_and_auc() {
    let mut j = job(2, 0.1, 5, 32);
    j.train_graphs = None;
    j.full_train = None;
    let mut events = 0;
    let report = run(j, &mut |e| {
        if let Event::Step { loss, .. } = e {
            assert!(loss.is_none());
            events += 1;
        }
    })
    .expect("infer");
    assert_eq!(events, 5);
    assert_eq!(report.mode, Mode::Infer);
    assert!(report.final_loss.is_none() && report.losses.is_empty());
    assert!(report.auc.is_some() && report.samples_per_s > 0.0);
    assert_eq!(report.eval_samples, 4 * 32);
}

#[test]
fn a_diverging_loss_is_an_error_naming_the_step() {
    // BCE clamps its logs, so a huge step size saturates the loss instead; a NaN
    // learning rate poisons every weight in step 1, the loss of step 2 is NaN.
    let err = run(job(2, f32::NAN, 50, 32), &mut |_| {}).expect_err("diverges");
    match &err {
        RuntimeError::NonFinite { step, value, .. } => {
            assert_eq!(*step, 2);
            assert!(!value.is_finite());
            assert!(
                err.to_string().contains(&format!("at step {step}")),
                "{err}"
            );
        }
        other => panic!("wrong error: {other}"),
    }
}

#[test]
fn a_failing_rank_stops_the_others_with_its_own_error() {
    // Rank 1 (owner of emb.1) gets a 10-row table while the data indexes 30 rows:
    // its embedding_bag fails at step 1 while rank 0 waits in the all_to_all.
    let mut j = job(2, 0.1, 3, 16);
    let shrink = |g: &dlrm_ir::Graph| {
        let src = text::print(g).replace("f32[30,4]", "f32[10,4]");
        text::parse(&src).expect("edited graph")
    };
    let tg = j.train_graphs.as_mut().expect("train");
    tg[1] = shrink(&tg[1]);
    j.infer_graphs[1] = shrink(&j.infer_graphs[1]);
    for (n, t) in &mut j.params {
        if n == "emb.1" {
            *t = ParamValue::Stored(Tensor::f32(vec![10, 4], vec![0.0; 40]));
        }
    }
    let t0 = Instant::now();
    let err = run(j, &mut |_| {}).expect_err("rank 1 fails");
    assert!(t0.elapsed() < Duration::from_secs(20), "ranks hung");
    match &err {
        RuntimeError::Node {
            rank,
            step,
            op,
            node,
            ..
        } => {
            assert_eq!(
                (*rank, *step, op.as_str()),
                (1, 1, "embedding_bag"),
                "{err}"
            );
            assert!(node.contains("bag.1"), "{node}");
        }
        other => panic!("wrong error: {other}"),
    }
    // A setup failure (a parameter of the wrong shape) is reported the same way.
    let mut j = job(3, 0.1, 3, 16);
    for (n, t) in &mut j.params {
        if n == "emb.2" {
            *t = ParamValue::Stored(Tensor::f32(vec![7, 4], vec![0.0; 28]));
        }
    }
    let err = run(j, &mut |_| {}).expect_err("rank 2 fails");
    assert!(
        matches!(&err, RuntimeError::Param { name, reason } if name == "emb.2" && reason.contains("rank 2")),
        "{err}"
    );
}

#[test]
fn worker_threads_change_no_result() {
    let with = |threads| {
        let mut j = job(1, 0.2, 4, 256);
        j.settings.threads = Some(threads);
        run_with_params(j, &mut |_| {}).expect("run")
    };
    let (one, p1) = with(1);
    assert_eq!(one.threads, 1);
    for threads in [2, 3] {
        let (rep, pn) = with(threads);
        assert_eq!(rep.threads, threads);
        assert_eq!(rep.losses, one.losses, "{threads} threads");
        assert_eq!(pn, p1, "{threads} threads");
    }
    // Thread ranks share the process's CPUs unless told: at least one each.
    let rep = run(job(3, 0.2, 1, 24), &mut |_| {}).expect("3 ranks");
    assert_eq!(rep.threads, (default_threads() / 3).max(1));
}

#[test]
fn bad_jobs_are_refused() {
    let mut j = job(2, 0.1, 1, 16);
    j.infer_graphs.pop();
    assert!(matches!(run(j, &mut |_| {}), Err(RuntimeError::Job { .. })));
    let j = job(4, 0.1, 1, 3);
    assert!(matches!(run(j, &mut |_| {}), Err(RuntimeError::Job { .. })));
    let mut j = job(1, 0.1, 1, 8);
    j.settings.threads = Some(0);
    assert!(matches!(run(j, &mut |_| {}), Err(RuntimeError::Job { .. })));
    let mut j = job(1, 0.1, 1, 8);
    j.params.retain(|(n, _)| n != "bot.0.b");
    assert!(matches!(
        run(j, &mut |_| {}),
        Err(RuntimeError::Param { .. })
    ));
}

#[test]
fn metrics_file_has_a_line_per_logged_step_and_a_summary() {
    let tmp = tempfile::tempdir().expect("tmp");
    let path = tmp.path().join("metrics.jsonl");
    let mut w = MetricsWriter::create(&path).expect("create");
    let mut j = job(1, 0.1, 6, 16);
    j.settings.log_every = 2;
    let mut werr = None;
    let report = run(j, &mut |e| {
        if let Err(err) = w.event(e) {
            werr = Some(err);
        }
    })
    .expect("run");
    assert!(werr.is_none());
    w.finish(&report).expect("finish");
    let text = std::fs::read_to_string(&path).expect("read");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(
        lines
            .iter()
            .take(3)
            .map(|l| l["iter"].as_u64().expect("iter"))
            .collect::<Vec<_>>(),
        vec![2, 4, 6]
    );
    assert!(lines[0]["loss"].as_f64().is_some() && lines[0]["elapsed_s"].as_f64().is_some());
    let last = &lines[3];
    for key in [
        "auc",
        "accuracy",
        "eval_samples",
        "final_loss",
        "samples_per_s",
        "ranks",
        "iters",
    ] {
        assert!(last.get(key).is_some(), "summary lacks {key}");
    }
    assert_eq!(last["iters"], 6);
    assert_eq!(
        last["final_loss"].as_f64().map(|v| v as f32),
        report.final_loss
    );
}

#[test]
fn overlap_and_allreduce_algorithms_keep_the_losses() {
    use dlrm_runtime::AllReduceAlgo;
    let (one, _) = run_with_params(job(1, 0.2, 6, 24), &mut |_| {}).expect("1 rank");
    let l1: Vec<f32> = one.losses.iter().map(|l| l.1).collect();
    for ranks in [2usize, 3] {
        let overlapped = run(job(ranks, 0.2, 6, 24), &mut |_| {}).expect("overlap");
        assert!(overlapped.overlap);
        assert!(overlapped.comm.busy_s > 0.0, "{:?}", overlapped.comm);
        let mut j = job(ranks, 0.2, 6, 24);
        j.settings.overlap = false;
        let inline = run(j, &mut |_| {}).expect("no overlap");
        assert!(!inline.overlap);
        // The progress thread changes when collectives run, not what they compute.
        assert_eq!(overlapped.losses, inline.losses, "{ranks} ranks");
        // Inline collectives block the rank for all of their time.
        assert_eq!(inline.comm.busy_s, inline.comm.exposed_s);
        for algo in AllReduceAlgo::ALL {
            let mut j = job(ranks, 0.2, 6, 24);
            j.settings.allreduce = algo;
            let rep = run(j, &mut |_| {}).expect("algorithm");
            assert_eq!(rep.allreduce, algo.name());
            let ln: Vec<f32> = rep.losses.iter().map(|l| l.1).collect();
            assert!(
                close(&l1, &ln, 1e-5),
                "{algo} {ranks} ranks: {l1:?} vs {ln:?}"
            );
        }
    }
}
