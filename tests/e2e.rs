//! End to end through the library the binaries use: a JSON model compiled into a
//! plan, written and read back, trained and served on 1..8 ranks, checked against
//! the reference interpreter; and the IR text form round-trips for every example
//! model at every stage of both pipelines and after partitioning.

mod common;

use common::{O0, example, losses, max_rel, tempdir, trained_value};
use dlrm_ir::{Graph, SingleRank, text};
use dlrm_passes::pipeline::{self, PipelineOptions, Precision};
use dlrm_passes::{LossKind, TrainConfig};
use dlrm_runtime::driver::{Report, run_with_params};
use dlrm_runtime::plan::{Plan, read_plan, write_plan};
use dlrm_runtime::{DataSchema, Executor, SyntheticData};
use dlrm_runtime::{RunOptions, RunSettings, job_for};
use dlrmc::compile::{CompileOptions, Stage, compile, partition_stages};
use dlrmc::model::{Overrides, load_model};
use std::collections::HashMap;

/// The tiny example compiled with the optimising passes (the default).
fn tiny_plan() -> Plan {
    tiny_plan_with(&CompileOptions::default())
}

fn tiny_plan_with(opts: &CompileOptions) -> Plan {
    let model = load_model(&example("dlrm-tiny.json"), Overrides::default()).expect("load");
    compile(model, opts, &mut |_, _| {}).expect("compile")
}

fn train(plan: Plan, ranks: usize, iters: u64) -> (Report, Vec<HashMap<String, dlrm_ir::Tensor>>) {
    let opts = RunOptions {
        settings: RunSettings {
            ranks,
            log_every: 1,
            ..RunSettings::default()
        },
        iters,
        ..RunOptions::default()
    };
    run_with_params(job_for(plan, &opts).expect("job"), &mut |_| {}).expect("run")
}

#[test]
fn tiny_model_learns() {
    let (report, _) = train(tiny_plan(), 1, 300);
    let losses: Vec<f32> = report.losses.iter().map(|l| l.1).collect();
    let mean = |s: &[f32]| s.iter().sum::<f32>() / s.len() as f32;
    let (first, last) = (mean(&losses[..20]), mean(&losses[losses.len() - 20..]));
    // The stated factor: the mean loss of the last 20 steps is at most 70% of the
    // first 20's, and the held-out AUC is far from chance.
    assert!(last < 0.7 * first, "loss {first} -> {last}");
    let auc = report.auc.expect("auc");
    assert!(auc > 0.85, "AUC {auc}");
}

#[test]
fn optimised_plan_trains_like_the_unoptimised_one() {
    // Stated tolerance: fp32 losses within 1e-5 relative over 50 steps.
    let (o0, _) = train(tiny_plan_with(&O0), 1, 50);
    let (o1, _) = train(tiny_plan(), 1, 50);
    let l0: Vec<f32> = o0.losses.iter().map(|l| l.1).collect();
    let l1: Vec<f32> = o1.losses.iter().map(|l| l.1).collect();
    let d = max_rel(&l0, &l1, 0.0);
    assert!(d <= 1e-5, "-O0 vs -O1 losses differ by {d} rel");
    assert!((o0.auc.expect("auc") - o1.auc.expect("auc")).abs() < 1e-3);
}

#[test]
fn bf16_plan_trains_alike_on_both_backends() {
    // The Split-SGD-BF16 updates (`split_embedding_update`, `split_sgd`) run in
    // place with JIT kernels on one backend and reference kernels on the other,
    // bitwise alike; the JIT dot interaction reassociates its sums. Stated
    // tolerance: losses within 1e-3 relative over 20 steps, trained parameters
    // within 1e-2 relative (bf16 storage).
    let bf16 = CompileOptions {
        precision: Precision::Bf16,
        ..CompileOptions::default()
    };
    let run_on = |backend| {
        let opts = RunOptions {
            settings: RunSettings {
                log_every: 1,
                backend,
                ..RunSettings::default()
            },
            iters: 20,
            ..RunOptions::default()
        };
        run_with_params(
            job_for(tiny_plan_with(&bf16), &opts).expect("job"),
            &mut |_| {},
        )
        .expect("run")
    };
    let (jit, pj) = run_on(dlrm_runtime::Backend::Jit);
    let (reference, pr) = run_on(dlrm_runtime::Backend::Reference);
    let lj: Vec<f32> = jit.losses.iter().map(|l| l.1).collect();
    let lr: Vec<f32> = reference.losses.iter().map(|l| l.1).collect();
    let d = max_rel(&lj, &lr, 0.0);
    assert!(d <= 1e-3, "jit vs reference losses differ by {d} rel");
    // (The `.lo` halves are raw low bits of the masters: compared through `hi`.)
    for (name, t) in pr[0].iter().filter(|(n, _)| !n.ends_with(".lo")) {
        let d = max_rel(&t.to_f32_vec(), &pj[0][name].to_f32_vec(), 1e-3);
        assert!(d <= 1e-2, "{name} differs by {d} rel");
    }
}

#[test]
fn n_ranks_train_like_one_rank() {
    for opts in [O0, CompileOptions::default()] {
        n_ranks_agree(&opts);
    }
}

fn n_ranks_agree(opts: &CompileOptions) {
    // Stated tolerance: every step's global loss within 1e-5 relative of one rank's,
    // and every trained parameter within 1e-4 relative (summation order differs).
    let (one, p1) = train(tiny_plan_with(opts), 1, 20);
    let l1: Vec<f32> = one.losses.iter().map(|l| l.1).collect();
    for ranks in [2usize, 3, 4, 8] {
        let (rep, pn) = train(tiny_plan_with(opts), ranks, 20);
        let ln: Vec<f32> = rep.losses.iter().map(|l| l.1).collect();
        assert_eq!(ln.len(), l1.len());
        let d = max_rel(&l1, &ln, 0.0);
        assert!(
            d <= 1e-5,
            "{ranks} ranks: losses differ by {d} rel: {l1:?} vs {ln:?}"
        );
        for (name, t1) in &p1[0] {
            let got = trained_value(&pn, name);
            let d = max_rel(&t1.to_f32_vec(), &got, 1e-7);
            assert!(d <= 1e-4, "{ranks} ranks: {name} differs by {d} rel");
        }
        assert!((rep.auc.expect("auc") - one.auc.expect("auc")).abs() < 1e-3);
    }
}

#[test]
fn planner_placements_train_like_one_rank() {
    // dlrm-tiny with a 3-row table. Stated tolerance as above. With a zero-latency
    // network the 3-row table is replicated; on 8 ranks (more ranks than tables)
    // and with a 1 KiB budget the others are split by rows.
    let src = std::fs::read_to_string(example("dlrm-tiny.json"))
        .expect("read")
        .replace("[50, 30, 20]", "[50, 30, 3]");
    let dir = tempdir();
    let path = dir.path().join("tiny3.json");
    std::fs::write(&path, src).expect("write");
    for opts in [O0, CompileOptions::default()] {
        let model = load_model(&path, Overrides::default()).expect("model");
        let plan = compile(model, &opts, &mut |_, _| {}).expect("compile");
        let settings = dlrm_runtime::ShardSettings {
            mem_per_rank: 1024,
            network: dlrm_passes::shard::Network {
                latency_us: 0.0,
                gbps: 100.0,
            },
            ..dlrm_runtime::ShardSettings::default()
        };
        let sp = dlrm_runtime::launch::shard::shard_plan(&plan, 8, 24, &settings).expect("plan");
        let kinds: Vec<_> = sp.tables.iter().map(|t| t.kind).collect();
        use dlrm_passes::ShardKind::{DataParallel, RowWise};
        assert!(
            kinds.contains(&RowWise) && kinds.contains(&DataParallel),
            "{sp}"
        );
        let run = |ranks: usize| {
            let o = RunOptions {
                settings: RunSettings {
                    ranks,
                    log_every: 1,
                    ..RunSettings::default()
                },
                iters: 15,
                shards: settings,
                ..RunOptions::default()
            };
            run_with_params(job_for(plan.clone(), &o).expect("job"), &mut |_| {}).expect("run")
        };
        let (one, p1) = run(1);
        let l1: Vec<f32> = one.losses.iter().map(|l| l.1).collect();
        for ranks in [3, 8] {
            let (rep, pn) = run(ranks);
            let ln: Vec<f32> = rep.losses.iter().map(|l| l.1).collect();
            let d = max_rel(&l1, &ln, 0.0);
            assert!(d <= 1e-5, "{ranks} ranks: losses differ by {d} rel");
            for (name, t1) in &p1[0] {
                let d = max_rel(&t1.to_f32_vec(), &trained_value(&pn, name), 1e-7);
                assert!(d <= 1e-4, "{ranks} ranks: {name} differs by {d} rel");
            }
        }
    }
}

#[test]
fn a_written_plan_serves_the_interpreters_answer() {
    let dir = tempdir();
    let path = dir.path().join("tiny.plan");
    let model = load_model(&example("dlrm-tiny.json"), Overrides::default()).expect("load");
    let (graph, params) = (
        model.graph.clone(),
        dlrm_ir::init::materialize_all(&model.params).expect("params"),
    );
    let plan = compile(model, &CompileOptions::default(), &mut |_, _| {}).expect("compile");
    write_plan(&path, &plan).expect("write");
    let read = read_plan(&path).expect("read");
    assert!(
        read.params == plan.params,
        "weights changed on the way through the plan"
    );
    assert!(read.infer == plan.infer && read.train == plan.train);
    let plan = read;

    let data = SyntheticData::new(DataSchema::from_graph(&graph).expect("schema"), 7);
    let batch = 24;
    let inputs = data.inputs_for(3, batch, 1, 0, &graph).expect("inputs");
    let syms = HashMap::from([("B".to_string(), batch)]);

    let mut interp_params: HashMap<_, _> = params.into_iter().collect();
    let want = dlrm_ir::interp::run(&graph, &inputs, &mut interp_params, &syms, &SingleRank)
        .expect("interpreter");
    let mut exec = Executor::new(
        plan.infer.clone(),
        plan.tensors().expect("params").into_iter().collect(),
        0,
    )
    .expect("executor");
    let got = exec.step(inputs, &syms, &SingleRank).expect("runtime");
    assert_eq!(got.len(), want.len());
    let d = max_rel(&want[0].to_f32_vec(), &got[0].to_f32_vec(), 1e-7);
    assert!(
        d <= 1e-5,
        "plan inference differs from the interpreter by {d} rel"
    );
}

fn assert_round_trips(stage: &Stage, g: &Graph) {
    let src = text::print(g);
    let back = text::parse(&src).unwrap_or_else(|e| panic!("{stage}: {e}\n{src}"));
    assert!(back == *g, "{stage}: parse(print(g)) != g");
    assert_eq!(text::print(&back), src, "{stage}: printing is not stable");
}

#[test]
fn every_example_round_trips_at_every_stage() {
    let examples = [
        "dlrm-tiny.json",
        "dlrm-small.json",
        "dlrm-kaggle.json",
        "dlrm-mlperf.json",
        "dlrm-intel-small.json",
    ];
    for name in examples {
        // Graphs only: initialising the big examples' tables takes seconds.
        let spec = dlrm_json::ModelSpec::load(example(name)).expect("spec");
        let training = spec.training();
        let model = dlrmc::Model {
            graph: spec.graph().expect("graph"),
            params: Vec::new(),
            training: dlrm_runtime::plan::Training {
                loss: "bce".into(),
                optimizer: "sgd".into(),
                learning_rate: training.learning_rate,
                batch_size: training.batch_size,
                seed: training.seed,
            },
            optimizer: Default::default(),
            summary: String::new(),
            infer_only: None,
            label: None,
        };
        let mut stages = Vec::new();
        let plan = compile(model, &CompileOptions::default(), &mut |s, g| {
            assert_round_trips(s, g);
            stages.push(s.to_string());
        })
        .expect("compile");
        let train = TrainConfig {
            loss: LossKind::Bce,
            lr: 0.1,
            optimizer: Default::default(),
        };
        let mut want = Vec::new();
        for (g, cfg) in [("infer", None), ("train", Some(train))] {
            want.push(format!("{g}: after input"));
            for p in pipeline::pass_ids_for(&PipelineOptions::optimized(cfg)) {
                want.push(format!("{g}: after {p}"));
            }
        }
        assert_eq!(stages, want, "{name}");
        for ranks in [2, 3] {
            let mut n = 0;
            partition_stages(
                &plan,
                ranks,
                &dlrm_runtime::ShardSettings::default(),
                &mut |s, g| {
                    assert_round_trips(s, g);
                    n += 1;
                },
            )
            .expect("partition");
            // Two graphs, each after `partition` and after every per-rank pass.
            let stages = 1 + pipeline::RANK_PASSES.len();
            assert_eq!(n, 2 * ranks * stages, "{name}");
        }
    }
}

#[test]
fn bad_run_options_are_refused_before_running() {
    let refused = |plan: Plan, opts: RunOptions| match job_for(plan, &opts) {
        Ok(_) => panic!("{opts:?} was accepted"),
        Err(e) => e.to_string(),
    };
    let err = |opts: RunOptions| refused(tiny_plan(), opts);
    let msg = err(RunOptions {
        settings: RunSettings {
            ranks: 0,
            ..RunSettings::default()
        },
        ..RunOptions::default()
    });
    assert!(msg.contains("--ranks must be at least 1"), "{msg}");
    let msg = err(RunOptions {
        settings: RunSettings {
            ranks: 25,
            ..RunSettings::default()
        },
        ..RunOptions::default()
    });
    assert!(msg.contains("more than the global batch of 24"), "{msg}");
    let mut plan = tiny_plan();
    plan.train = None;
    let msg = refused(plan, RunOptions::default());
    assert!(msg.contains("inference only"), "{msg}");
}

#[test]
fn gradient_buckets_train_like_one_allreduce_per_gradient() {
    // dlrm-tiny's dense gradients total ~2.6 KB: 256-byte buckets make several,
    // the 1 MiB default one. Same tolerance as `n_ranks_train_like_one_rank`.
    let run = |ranks: usize, bucket_bytes: u64| {
        let opts = RunOptions {
            settings: RunSettings {
                ranks,
                log_every: 1,
                ..RunSettings::default()
            },
            iters: 10,
            shards: dlrm_runtime::ShardSettings {
                bucket_bytes,
                ..dlrm_runtime::ShardSettings::default()
            },
            ..RunOptions::default()
        };
        run_with_params(job_for(tiny_plan(), &opts).expect("job"), &mut |_| {}).expect("run")
    };
    let (one, _) = run(1, 0);
    for ranks in [1usize, 2, 4] {
        let (plain, _) = run(ranks, 0);
        let mut calls = vec![plain.all_reduce_calls_per_step()];
        for bucket_bytes in [256u64, dlrm_passes::DEFAULT_BUCKET_BYTES] {
            let (b, _) = run(ranks, bucket_bytes);
            let d = max_rel(&losses(&b), &losses(&plain), 0.0);
            assert!(
                d <= 1e-5,
                "{ranks} ranks, {bucket_bytes} B buckets: {d} rel"
            );
            let d = max_rel(&losses(&b), &losses(&one), 0.0);
            assert!(d <= 1e-5, "{ranks} ranks vs 1: {d} rel");
            calls.push(b.all_reduce_calls_per_step());
        }
        if ranks > 1 {
            // Fewer all-reduce calls per step as the buckets grow; the default
            // bucket takes every gradient (plus the loss's all-reduce).
            assert!(calls[0] > calls[1] && calls[1] > calls[2], "{calls:?}");
            assert_eq!(calls[2], 2, "{calls:?}");
        }
    }
}

#[test]
fn sixty_four_ranks_train_like_one() {
    // 64 thread ranks (more than cores and tables: row-wise tables) on a global
    // batch of 64; the full dlrm-small run is in the README.
    let run = |ranks: usize| {
        let opts = RunOptions {
            settings: RunSettings {
                ranks,
                log_every: 1,
                eval_batches: 1,
                ..RunSettings::default()
            },
            iters: 5,
            batch_size: Some(64),
            ..RunOptions::default()
        };
        run_with_params(job_for(tiny_plan(), &opts).expect("job"), &mut |_| {}).expect("run")
    };
    let (one, _) = run(1);
    let (many, _) = run(64);
    let d = max_rel(&losses(&many), &losses(&one), 0.0);
    assert!(d <= 1e-5, "64 ranks vs 1: losses differ by {d} rel");
}

#[test]
fn bf16_row_wise_tables_train_like_one_rank() {
    // A 1200-byte table budget splits dlrm-tiny's bf16 tables (800, 480 and 320
    // bytes, and as much again of Split-SGD low halves, which the planner places
    // with their rows) by rows, with their low halves, over 4 ranks. Tolerance as `bf16_plan_trains_alike..`.
    let bf16 = CompileOptions {
        precision: Precision::Bf16,
        ..CompileOptions::default()
    };
    let run = |ranks: usize| {
        let opts = RunOptions {
            settings: RunSettings {
                ranks,
                log_every: 1,
                ..RunSettings::default()
            },
            iters: 10,
            shards: dlrm_runtime::ShardSettings {
                mem_per_rank: 1200,
                ..dlrm_runtime::ShardSettings::default()
            },
            ..RunOptions::default()
        };
        let plan = tiny_plan_with(&bf16);
        if ranks > 1 {
            let sp = dlrm_runtime::launch::shard::shard_plan(&plan, ranks, 24, &opts.shards)
                .expect("plan");
            assert!(
                sp.tables
                    .iter()
                    .any(|t| t.kind == dlrm_passes::ShardKind::RowWise),
                "{sp}"
            );
        }
        run_with_params(job_for(plan, &opts).expect("job"), &mut |_| {}).expect("run")
    };
    let (one, _) = run(1);
    let (four, _) = run(4);
    let d = max_rel(&losses(&four), &losses(&one), 0.0);
    assert!(d <= 1e-3, "bf16 row-wise on 4 ranks vs 1: {d} rel");
}

#[test]
fn synthetic_batches_cycle_the_steps_data() {
    // With the weights frozen (learning rate 0) a step's loss is a function of
    // its batch: with 2 cycled batches steps 1 and 3 (and 2 and 4) see the same
    // batch, bit for bit; without the cycle every step has its own.
    let losses = |cycle: usize| -> Vec<f32> {
        let opts = RunOptions {
            settings: RunSettings {
                log_every: 1,
                synthetic_batches: cycle,
                ..RunSettings::default()
            },
            iters: 4,
            lr: Some(0.0),
            ..RunOptions::default()
        };
        let job = job_for(tiny_plan(), &opts).expect("job");
        let (report, _) = run_with_params(job, &mut |_| {}).expect("run");
        report.losses.iter().map(|l| l.1).collect()
    };
    let (cycled, fresh) = (losses(2), losses(0));
    assert_eq!(cycled.len(), 4);
    assert_eq!(cycled[0].to_bits(), cycled[2].to_bits(), "{cycled:?}");
    assert_eq!(cycled[1].to_bits(), cycled[3].to_bits(), "{cycled:?}");
    assert_ne!(cycled[0], cycled[1], "{cycled:?}");
    // The cycle's batches are the first steps' own.
    assert_eq!(fresh[..2], cycled[..2], "{fresh:?} {cycled:?}");
    assert_ne!(fresh[2], cycled[2], "{fresh:?} {cycled:?}");
}
