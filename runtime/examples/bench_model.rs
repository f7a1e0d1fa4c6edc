//! Throughput of a JSON model on this machine, training and inference, per backend
//! and micro-kernel choice, with the per-op-kind table of the last run.
//!
//! `RAYON_NUM_THREADS=2 cargo run --release -p dlrm-runtime --example bench_model -- \
//!     examples/dlrm-small.json [iters] [ranks] [configs]`
//! where `configs` is a comma list of `reference` and the `--kernels` choices
//! (`cranelift`, `native`, `avx512`, `avx512bf16`, `amxbf16`, `auto`; default: `reference`,
//! `cranelift`, `native`, `auto`). With `ranks > 1` the tables are placed by the sharding
//! planner and the dense gradients all-reduced in buckets, as `dlrm-run` does.

use dlrm_passes::{
    DEFAULT_BUCKET_BYTES, LossKind, PipelineOptions, PlannerOptions, TrainConfig, compile,
    partition, partition_buckets, shard,
};
use dlrm_runtime::{Backend, Job, KernelChoice, Plan, Training, run};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .map_or("examples/dlrm-small.json", String::as_str);
    let iters: u64 = args.get(2).map_or(Ok(20), |s| s.parse())?;
    let ranks: usize = args.get(3).map_or(Ok(1), |s| s.parse())?;
    let configs = args
        .get(4)
        .map_or("reference,cranelift,native,auto", String::as_str);
    let model = dlrm_json::load(path)?;
    let loss = match model.training.loss {
        dlrm_json::Loss::Bce => LossKind::Bce,
        dlrm_json::Loss::Mse => LossKind::Mse,
    };
    let cfg = TrainConfig {
        loss,
        lr: model.training.learning_rate,
        optimizer: Default::default(),
    };
    let (train, _) = compile(
        model.graph.clone(),
        &PipelineOptions {
            train: Some(cfg),
            ..Default::default()
        },
        &mut |_, _| {},
    )?;
    let (infer, _) = compile(
        model.graph.clone(),
        &PipelineOptions::default(),
        &mut |_, _| {},
    )?;
    let plan = Plan {
        name: model.spec.name.clone(),
        infer,
        train: Some(train),
        params: model
            .params
            .into_iter()
            .map(|(n, t)| (n, dlrm_ir::ParamValue::Stored(t)))
            .collect(),
        training: Training {
            loss: "bce".into(),
            optimizer: "sgd".into(),
            learning_rate: model.training.learning_rate,
            batch_size: model.training.batch_size,
            seed: model.training.seed,
        },
        precision: "fp32".into(),
        pass_log: serde_json::Value::Null,
        contract: Default::default(),
    };
    let threads = rayon::current_num_threads();
    for train_mode in [true, false] {
        for c in configs.split(',') {
            let (backend, kernels) = match c {
                "reference" => (Backend::Reference, KernelChoice::Auto),
                other => (
                    Backend::Jit,
                    KernelChoice::parse(other).ok_or("config: reference|cranelift|native|auto")?,
                ),
            };
            let mut job = Job::from_plan(plan.clone());
            if !train_mode {
                job.train_graphs = None;
                job.full_train = None;
            }
            if ranks > 1 {
                let tables = partition::tables(&job.full_infer)?;
                let opts = PlannerOptions::new(ranks, plan.training.batch_size.max(ranks));
                let sp = shard::plan(&tables, &opts)?;
                let infer = partition_buckets(&job.full_infer, &sp, DEFAULT_BUCKET_BYTES)?;
                let mut parts = infer.clone();
                if let Some(t) = &job.full_train {
                    // The training partition's row shards also cover Split-SGD low halves.
                    parts = partition_buckets(t, &sp, DEFAULT_BUCKET_BYTES)?;
                    job.train_graphs = Some(parts.graphs.clone());
                }
                job.infer_graphs = infer.graphs;
                job.row_shards = parts
                    .row_shards
                    .iter()
                    .map(|s| dlrm_runtime::checkpoint::RowPiece {
                        param: s.param.clone(),
                        table: s.table.clone(),
                        lo: s.lo,
                        hi: s.hi,
                    })
                    .collect();
                job.settings.ranks = ranks;
            }
            job.iters = iters;
            job.settings.log_every = 0;
            job.settings.eval_batches = 1;
            job.settings.warmup = 3;
            job.settings.backend = backend;
            job.settings.kernels = kernels;
            let r = run(job, &mut |_| {})?;
            println!(
                "{:<6} {:<10} threads={threads} ranks={ranks}: {:>9.0} samples/s (loss {:?}, jit {} kernels {:.3}s)",
                if train_mode { "train" } else { "infer" },
                c,
                r.samples_per_s,
                r.final_loss,
                r.jit_kernels,
                r.jit_compile_s
            );
            if std::env::var_os("BENCH_TABLE").is_some() {
                print!("{}", r.bench_table());
            }
        }
    }
    Ok(())
}
