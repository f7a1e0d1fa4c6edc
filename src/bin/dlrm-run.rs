//! `dlrm-run`: trains or serves a plan on N ranks: threads of this process
//! (`--ranks N`), or one rank per MPI process (`mpirun -n N dlrm-run PLAN --comm
//! mpi`, where only rank 0 prints and writes `--metrics`), on synthetic data or a
//! `.ds` dataset (`--data`, see docs/data.md).

use anyhow::{Context, Result, bail};
use clap::Parser;
use dlrm_ir::Communicator;
use dlrm_passes::shard::human;
use dlrm_runtime::checkpoint::Checkpoint;
use dlrm_runtime::launch::{CheckpointOptions, Comm, Ranks, infer_once, mpi_ranks, run_job};
use dlrm_runtime::metrics::{MetricsWriter, peak_rss_bytes};
use dlrm_runtime::plan::Plan;
use dlrm_runtime::{
    AllReduceAlgo, Backend, DataConfig, KernelChoice, LrPolicy, MpiComm, OnNonFinite, RunSettings,
    ShardSettings, Trainer, WaitPolicy, bench_loader,
};
use dlrmc::console::{Console, Show, summary};
use dlrmc::planner::{PlannerArgs, parse_mem_arg};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// mimalloc keeps the pages of freed tensors for the next step's: with the
/// system allocator every multi-MiB activation came back from the OS, zeroed
/// and page-faulted, each step (~30% of a dlrm-small training step).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// A function of the mimalloc library linked above (`mimalloc.h`).
unsafe extern "C" {
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// `mi_option_purge_delay` in the `mi_option_t` of the bundled mimalloc
/// (`libmimalloc-sys` 0.1.49: mimalloc 3.x, and 2.x with its `v2` feature).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// mimalloc gives the pages of freed memory back to the OS a second after the
/// free (its `purge_delay`), and sooner for runs of frees; so the step's
/// activations kept coming back as fresh, zeroed pages: a 100-step
/// `dlrm-small` run had 8,000–20,000 page faults, and about 590 with a 10 s
/// delay; in three interleaved pairs of 200-step runs the system time fell
/// from 0.62–0.83 s to 0.53–0.73 s (samples/s: within this machine's noise).
/// Ten seconds keeps the pages across steps and still returns them once a
/// run goes idle. Left alone when `MIMALLOC_PURGE_DELAY` is set.
fn keep_freed_pages_across_steps() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: a plain call into the allocator's option table (no pointers);
    // mimalloc's options may be set at any time.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 10_000) };
}

/// Trains (or, with --infer, serves) a plan written by `dlrmc compile` on synthetic
/// data whose labels come from a hidden teacher model, then reports AUC and
/// accuracy on held-out batches.
///
/// Ranks are threads of this process (`--ranks N`), or one per MPI process:
/// `mpirun -n N dlrm-run PLAN --comm mpi` (a build with `--features mpi`).
#[derive(Parser, Debug)]
#[command(name = "dlrm-run", version, about, long_about = None)]
struct Cli {
    /// The plan directory, or a checkpoint (`DIR/step-<n>`, or a checkpoint root
    /// `DIR`: its newest checkpoint), which runs as its plan with the trained
    /// parameters (serve it with --infer; with --resume, continue its run).
    plan: PathBuf,
    /// Ranks, each running its share of the global batch and owning a share of the
    /// embedding tables [default: 1 with --comm threads; with --comm mpi the MPI
    /// job's size, which a given --ranks must equal; at most 65536].
    #[arg(long, value_name = "N")]
    ranks: Option<usize>,
    /// How ranks talk: `threads` (ranks are threads of this process) or `mpi` (this
    /// process is one rank of an MPI job: launch with `mpirun -n N`; only rank 0
    /// prints and writes --metrics; needs a build with `--features mpi`).
    #[arg(long, default_value = "threads", value_name = "KIND", value_parser = parse_comm)]
    comm: Comm,
    /// Steps to run [default: 100, or with --data and --epochs the epochs' steps;
    /// at most 10^8].
    #[arg(long, value_name = "K")]
    iters: Option<u64>,
    /// Train on this `.ds` dataset (`dlrmc data convert`) instead of synthetic data;
    /// each rank (each MPI process) maps it and reads only its slice of each batch.
    /// A Criteo TSV file (plain or gzip) is converted first, with `dlrmc data
    /// convert`'s defaults, into a temporary dataset removed after the run.
    #[arg(long, value_name = "DS|TSV")]
    data: Option<PathBuf>,
    /// With --data: epochs over the training split (the steps unless --iters is
    /// given; the last partial batch of an epoch is dropped).
    #[arg(long, value_name = "E", requires = "data")]
    epochs: Option<u64>,
    /// Evaluate on the evaluation split (--eval-split; synthetic data: the held-out
    /// batches) every N training steps and after the last: AUC, log loss, accuracy,
    /// normalized entropy, in the log and in --metrics.
    #[arg(long, alias = "test-freq", default_value_t = 0, value_name = "N")]
    eval_every: u64,
    /// With --data: the split trained on.
    #[arg(long, default_value = "train", value_name = "NAME")]
    train_split: String,
    /// With --data: the split of the evaluations during training.
    #[arg(long, default_value = "val", value_name = "NAME")]
    eval_split: String,
    /// With --data: the split of the final evaluation.
    #[arg(long, default_value = "test", value_name = "NAME")]
    test_split: String,
    /// With --data: skip the check of the dataset's checksums and id ranges at the
    /// start (ids are still checked against the plan's tables as batches are read).
    #[arg(long)]
    no_verify: bool,
    /// With --data: what a sample with a NaN or infinite dense value or a label
    /// other than 0 or 1 does: `error` ends the run naming it when a batch reaches
    /// it; `skip` leaves such samples out of every split at the start and counts
    /// them in the summary.
    #[arg(long, default_value = "error", value_name = "POLICY")]
    on_nonfinite: OnNonFinite,
    /// Write checkpoints of the whole training state into DIR: `DIR/step-<n>/`
    /// (manifest, graphs, one safetensors file per writing rank) and `DIR/latest`,
    /// each written atomically; see --checkpoint-every and --keep.
    #[arg(long, value_name = "DIR")]
    checkpoint: Option<PathBuf>,
    /// With --checkpoint: write one every N steps and after the last (0: only
    /// after the last).
    #[arg(long, default_value_t = 0, value_name = "N", requires = "checkpoint")]
    checkpoint_every: u64,
    /// With --checkpoint: keep the newest K checkpoints.
    #[arg(long, default_value_t = 3, value_name = "K", requires = "checkpoint")]
    keep: usize,
    /// Continue a run from a checkpoint: `--resume DIR` with a plan (DIR a
    /// checkpoint root, its newest checkpoint, or one `DIR/step-<n>`), or
    /// `--resume` alone when the positional argument is the checkpoint. The
    /// losses equal the uninterrupted run's bit for bit at the same rank count;
    /// any rank count loads it. --iters is the run's total steps (default: the
    /// checkpointed run's); seed and batch are the checkpoint's.
    #[arg(long, value_name = "DIR", num_args = 0..=1)]
    resume: Option<Option<PathBuf>>,
    /// Synthetic data: generate N batches once and cycle them (step k takes batch
    /// k mod N), so that the steps' time excludes making their data, as
    /// scripts/pytorch_dlrm.py times PyTorch on 4 batches made beforehand
    /// (scripts/measure-peers uses 4; at most 2^20). Default: a new batch every step.
    #[arg(long, value_name = "N", conflicts_with = "data")]
    synthetic_batches: Option<usize>,
    /// Synthetic data: how many ids each variable bag holds, `N` or a range `A-B`
    /// (uniform), one for every table or a comma list per table in the model's
    /// input order, e.g. `1-100` or `3,2,1`. Default: 0 to 2 ids a bag. A
    /// fixed-pooling model's bags keep their size (another size given for them is
    /// an error).
    #[arg(long, value_name = "SIZES", value_parser = parse_pooling, conflicts_with = "data")]
    pooling: Option<Pooling>,
    /// Seed of the synthetic data (default: the plan's).
    #[arg(long)]
    seed: Option<u64>,
    /// Global batch (default: the plan's); the same whatever --ranks is.
    #[arg(long, value_name = "N")]
    batch_size: Option<usize>,
    /// Run inference instead of training.
    #[arg(long)]
    infer: bool,
    /// With --infer: serve the tables as int8 rows with an f32 scale and bias
    /// per row (FBGEMM's fused 8-bit row-wise format), quantized from the plan's
    /// or checkpoint's values as it loads (as `dlrmc compile --quantize-tables`).
    #[arg(long, value_name = "FORMAT", value_parser = ["int8"], requires = "infer")]
    quantize_tables: Option<String>,
    /// Write JSON lines (one per logged step, then a summary with auc and accuracy).
    #[arg(long, value_name = "FILE")]
    metrics: Option<PathBuf>,
    /// Log a step every N steps (0: only the last).
    #[arg(long, default_value_t = 10, value_name = "N")]
    log_every: u64,
    /// Held-out batches evaluated at the end (at most 2^20).
    #[arg(long, default_value_t = 4, value_name = "N")]
    eval_batches: usize,
    /// Steps left out of the samples/s median.
    #[arg(long, default_value_t = 3, value_name = "N")]
    warmup: u64,
    /// Print the final report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Kernels: `jit` (Cranelift, falling back to reference kernels per op) or
    /// `reference` (plain Rust).
    #[arg(long, default_value = "jit", value_parser = parse_backend)]
    backend: Backend,
    /// GEMM micro-kernel of the JIT: `cranelift` (128-bit), `native` (AVX2+FMA),
    /// `avx512` (AVX-512, where the CPU has it), `avx512bf16` (the AVX-512 BF16
    /// dot product for GEMMs of two bf16 operands, AVX-512 for the others),
    /// `amxbf16` (the AMX-BF16 tile kernel for GEMMs of two bf16 operands,
    /// AVX-512 for the others) or `auto` (the fastest this CPU can run, per
    /// shape; for two bf16 operands the AMX-BF16 kernel where the CPU has
    /// it, else the AVX-512 BF16 one where a probe finds it at least 1.25x
    /// the FMA kernel's rate, not timed per shape); with all but `cranelift` and
    /// `native` the dot interaction (both directions) runs on AVX-512 too.
    #[arg(long, default_value = "auto", value_parser = parse_kernels)]
    kernels: KernelChoice,
    /// Print a per-op-kind table (time share, ms/step, GFLOP/s, GB/s) of the steps
    /// after the warm-up at the end, then the heaviest nodes, with several ranks
    /// how much collective time the overlap hid, and the roofline report: per op
    /// class and for the step, the fraction reached of this machine's bound (its
    /// FMA peak and triad bandwidth, measured before and after the run, about a
    /// second each, the higher kept; each node's work bounded on its own, by its
    /// flops at the peak or its bytes at the bandwidth, whichever is longer)
    #[arg(long)]
    bench: bool,
    /// Run collectives inline instead of on a progress thread overlapped with
    /// compute (to measure what the overlap gains).
    #[arg(long)]
    no_overlap: bool,
    /// Allreduce algorithm of the thread ranks: `auto` (recursive doubling up to 512
    /// elements, ring above), `doubling` or `ring`.
    #[arg(long, default_value = "auto", value_name = "ALGO")]
    allreduce: AllReduceAlgo,
    /// Worker threads of each rank, at most 1024 [default: this machine's CPUs, or
    /// RAYON_NUM_THREADS, shared among the ranks of this process].
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// How each rank's idle worker threads wait for the next parallel loop
    /// (OpenMP's OMP_WAIT_POLICY): `active` keeps them looking for work,
    /// yielding the CPU between looks (fewer sleeps and wake-ups between
    /// kernels; the cores stay busy while the rank has no parallel work),
    /// `passive` lets them sleep, `auto` is active where this process's
    /// workers fit its CPUs and no other process of an MPI job shares them.
    #[arg(long, default_value = "auto", value_name = "POLICY")]
    wait_policy: WaitPolicy,
    /// With --infer: run the model once on these arrays (`.npz`, named after the
    /// model's inputs) instead of synthetic data.
    #[arg(long, value_name = "FILE", requires = "infer")]
    inputs: Option<PathBuf>,
    /// With --inputs: write the model's outputs here (`.npz`, named after them).
    #[arg(long, value_name = "FILE", requires = "inputs")]
    outputs: Option<PathBuf>,
    /// No progress output, only the summary.
    #[arg(short, long)]
    quiet: bool,
    /// Memory one rank may hold, e.g. `512MiB`, `2GB`: the sharding planner
    /// places table storage in it, splitting larger tables by rows, and the run is
    /// refused before anything is allocated if a rank's memory account (tables,
    /// optimizer state, activations and gradients at the batch, buffers) exceeds
    /// it [default: this machine's available memory divided by the ranks it runs
    /// (--ranks, or the MPI ranks on this node; under MPI the smallest of all
    /// processes', so every process places the tables alike)].
    #[arg(long, value_name = "BYTES", value_parser = parse_mem_arg)]
    mem_per_rank: Option<u64>,
    /// Skip the memory check (e.g. a --mem-per-rank of a few KiB to force row-wise
    /// splits of a small model's tables); the tables are still placed in the
    /// budget.
    #[arg(long)]
    no_mem_check: bool,
    #[command(flatten)]
    planner: PlannerArgs,
    /// Learning rate of the training steps, instead of the plan's (the rate its
    /// update ops were compiled with; no recompile). The base rate of a schedule.
    #[arg(long, value_name = "F", value_parser = parse_lr, help_heading = "Learning rate")]
    lr: Option<f32>,
    /// Warm the learning rate up over the first N steps (the reference DLRM's
    /// LRPolicyScheduler, exactly: step k < N runs at lr·k/N, then the rate stays
    /// at step N-1's until the decay starts, or is lr without a decay).
    #[arg(
        long,
        visible_alias = "lr-num-warmup-steps",
        value_name = "N",
        help_heading = "Learning rate"
    )]
    lr_warmup_steps: Option<u64>,
    /// The step at which the polynomial decay starts (LRPolicyScheduler; >=
    /// --lr-warmup-steps) [default: --lr-warmup-steps].
    #[arg(
        long,
        visible_alias = "lr-decay-start-step",
        value_name = "STEP",
        help_heading = "Learning rate"
    )]
    lr_decay_start: Option<u64>,
    /// Decay over N steps from the decay start: step k runs at
    /// max(1e-7, lr·((N - (k - start))/N)²), then the rate stays at the last
    /// decayed step's, lr/N² (LRPolicyScheduler) [default: 0, no decay].
    #[arg(
        long,
        visible_alias = "lr-num-decay-steps",
        value_name = "N",
        help_heading = "Learning rate"
    )]
    lr_decay_steps: Option<u64>,
    /// Step decay (as torch's StepLR, stepped every training step): multiply the
    /// rate by --lr-gamma every N steps.
    #[arg(
        long,
        value_name = "N",
        conflicts_with_all = ["lr_warmup_steps", "lr_decay_start", "lr_decay_steps"],
        help_heading = "Learning rate"
    )]
    lr_step_size: Option<u64>,
    /// The factor of each step decay [default: 0.1, as StepLR's].
    #[arg(
        long,
        value_name = "G",
        requires = "lr_step_size",
        help_heading = "Learning rate"
    )]
    lr_gamma: Option<f64>,
}

/// `--pooling`'s bag sizes (one value to clap).
#[derive(Clone, Debug)]
struct Pooling(Vec<dlrm_runtime::synthetic::BagSizes>);

fn parse_pooling(s: &str) -> Result<Pooling, String> {
    dlrm_runtime::synthetic::BagSizes::parse_list(s).map(Pooling)
}

fn parse_lr(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}`: expected a finite learning rate >= 0")),
    }
}

/// The learning-rate policy the `--lr-*` flags ask for (`None`: constant).
fn lr_policy(cli: &Cli) -> Option<LrPolicy> {
    if let Some(step_size) = cli.lr_step_size {
        return Some(LrPolicy::Step {
            step_size,
            gamma: cli.lr_gamma.unwrap_or(0.1),
        });
    }
    if cli.lr_warmup_steps.is_none() && cli.lr_decay_start.is_none() && cli.lr_decay_steps.is_none()
    {
        return None;
    }
    let warmup_steps = cli.lr_warmup_steps.unwrap_or(0);
    Some(LrPolicy::Poly {
        warmup_steps,
        decay_start: cli.lr_decay_start.unwrap_or(warmup_steps),
        decay_steps: cli.lr_decay_steps.unwrap_or(0),
    })
}

fn parse_comm(s: &str) -> Result<Comm, String> {
    Comm::parse(s).ok_or_else(|| format!("`{s}`: expected threads or mpi"))
}

fn parse_backend(s: &str) -> Result<Backend, String> {
    Backend::parse(s).ok_or_else(|| format!("`{s}`: expected jit or reference"))
}

fn parse_kernels(s: &str) -> Result<KernelChoice, String> {
    KernelChoice::parse(s).ok_or_else(|| {
        format!("`{s}`: expected cranelift, native, avx512, avx512bf16, amxbf16 or auto")
    })
}

fn main() -> ExitCode {
    dlrmc::console::exit_quietly_on_closed_pipe();
    keep_freed_pages_across_steps();
    match real_main(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlrm-run: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli) -> Result<()> {
    if cli.ranks == Some(0) {
        bail!("--ranks must be at least 1");
    }
    dlrm_passes::shard::check_rank_count(cli.ranks.unwrap_or(1)).map_err(anyhow::Error::msg)?;
    match cli.comm {
        Comm::Threads => run_plan(&cli, cli.ranks.unwrap_or(1), Ranks::Threads),
        Comm::Mpi => {
            let comm = MpiComm::init()?;
            let out = mpi_ranks(comm.size(), cli.ranks)
                .map_err(anyhow::Error::from)
                .and_then(|n| run_plan(&cli, n, Ranks::Process(&comm)));
            if let Err(e) = &out {
                // Ends the whole MPI job (every rank) unless this is a group of one.
                comm.abort(&format!("{e:#}"));
            }
            out
        }
    }
}

/// Runs the plan on `ranks` ranks placed as `place` says; only rank 0 reports.
fn run_plan(cli: &Cli, ranks: usize, place: Ranks<'_>) -> Result<()> {
    let (root, rank) = match place {
        Ranks::Threads => (true, None),
        Ranks::Process(comm) => (comm.rank() == 0, Some(comm.rank())),
    };
    // `_converted` keeps a dataset converted from TSV alive for the run.
    let (_converted, data_path) = match &cli.data {
        Some(p) if p.is_file() => {
            let (dir, ds) = convert_tsv(p, root && !cli.quiet)?;
            (Some(dir), Some(ds))
        }
        other => (None, other.clone()),
    };
    let data = data_path.as_ref().map(|path| DataConfig {
        train_split: cli.train_split.clone(),
        eval_split: cli.eval_split.clone(),
        test_split: cli.test_split.clone(),
        verify: !cli.no_verify,
        on_nonfinite: cli.on_nonfinite,
        ..DataConfig::new(path)
    });
    if cli.inputs.is_some() && cli.comm == Comm::Mpi {
        bail!("--inputs runs the model once in one process: drop --comm mpi");
    }
    let trainer = load(cli)?;
    if root && let Some(note) = trainer.resume_note() {
        eprintln!("{note}");
    }
    let trainer = configure(cli, trainer, ranks, data)?;
    if let Some(inputs) = &cli.inputs {
        return infer_file(trainer.into_plan(), inputs, cli.outputs.as_deref(), cli);
    }
    let name = trainer.plan().name.clone();
    let job = trainer.job(&place)?;
    let iters = job.iters;
    let steps_per_epoch = match &job.settings.data {
        Some(d) => Some(dlrm_runtime::dataset::steps_per_epoch(
            &dlrm_data::Dataset::open(&d.path)?,
            &d.train_split,
            job.global_batch,
        )?),
        None => None,
    };
    let loader = if cli.bench && root {
        bench_loader(&job, 50)?
    } else {
        None
    };
    let mut console = Console::new(
        iters,
        match cli.quiet {
            true => Show::Nothing,
            false if root && std::io::stderr().is_terminal() => Show::Bar,
            false => Show::Lines,
        },
        steps_per_epoch,
        match &cli.metrics {
            Some(path) if root => Some(MetricsWriter::create(path)?),
            _ => None,
        },
    );
    // The machine's bounds for --bench, measured before the run and again
    // after it (about a second each; `Machine::best_of`).
    let bounds_before = (cli.bench && root).then(|| bounds_before_run(&job.settings, &place));
    let report = run_job(job, place, &mut |e| console.event(e));
    let metrics = console.finish();
    let Some(mut report) = report? else {
        // Not rank 0: rank 0 reports for the job; each process its own peak memory.
        if !cli.quiet
            && let (Some(rank), Some(b)) = (rank, peak_rss_bytes())
        {
            // One write: stderr is unbuffered, and `mpirun` merges the processes'
            // streams, so a line written in pieces can be cut by another rank's.
            let line = format!(
                "rank {rank}: peak resident memory {} ({b} bytes)\n",
                human(b)
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
        return Ok(());
    };
    if let Some(m) = metrics? {
        m.finish(&report)?;
    }
    if cli.bench {
        report.roofline = Some(roofline_of(&report, bounds_before));
    }
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    if cli.bench {
        eprint!("{}", report.bench_table());
        if let Some(l) = loader {
            let steps_per_s = report.samples_per_s / report.global_batch.max(1) as f64;
            eprintln!(
                "loader (rank 0 of {}, one thread): {:.1} batches/s = {:.0} samples/s, {:.1}x the training step's consumption ({:.1} steps/s)",
                report.ranks,
                l.batches_per_s,
                l.samples_per_s,
                if steps_per_s > 0.0 {
                    l.batches_per_s / steps_per_s
                } else {
                    0.0
                },
                steps_per_s
            );
        }
    }
    eprintln!("{}", summary(&name, &report));
    Ok(())
}

/// The trainer set up as the command line says: `data` (the dataset, if any) as
/// [`run_plan`] found it; the plan and the checkpoint resumed from as [`load`]
/// found them. The memory budget of a rank, for both the placement of the tables
/// and the check, is `--mem-per-rank`, else this machine's available memory shared
/// by the ranks it runs ([`dlrm_runtime::launch::memory::run_budget`]).
fn configure(
    cli: &Cli,
    trainer: Trainer,
    ranks: usize,
    data: Option<DataConfig>,
) -> Result<Trainer> {
    let mut t = trainer
        .settings(RunSettings {
            ranks,
            log_every: cli.log_every,
            eval_batches: cli.eval_batches,
            warmup: cli.warmup,
            backend: cli.backend,
            kernels: cli.kernels,
            overlap: !cli.no_overlap,
            allreduce: cli.allreduce,
            threads: cli.threads,
            wait: cli.wait_policy,
            data,
            eval_every: cli.eval_every,
            synthetic_batches: cli.synthetic_batches.unwrap_or(0),
            pooling: cli.pooling.clone().map(|p| p.0).unwrap_or_default(),
        })
        .infer(cli.infer)
        .shards(
            cli.planner
                .settings(ShardSettings::default().mem_per_rank)?,
        )
        .memory_check(!cli.no_mem_check);
    if let Some(n) = cli.iters {
        t = t.steps(n);
    }
    if let Some(e) = cli.epochs {
        t = t.epochs(e);
    }
    if let Some(s) = cli.seed {
        t = t.seed(s);
    }
    if let Some(b) = cli.batch_size {
        t = t.batch_size(b);
    }
    if let Some(lr) = cli.lr {
        t = t.lr(lr);
    }
    if let Some(p) = lr_policy(cli) {
        t = t.lr_policy(p);
    }
    if let Some(dir) = &cli.checkpoint {
        t = t.checkpoint(CheckpointOptions {
            dir: dir.clone(),
            every: cli.checkpoint_every,
            keep: cli.keep,
        });
    }
    if let Some(bytes) = cli.mem_per_rank {
        t = t.memory_budget(bytes);
    }
    Ok(t)
}

/// The plan to run and the checkpoint to resume from: the positional argument is
/// a plan, or a checkpoint whose graphs and trained parameters make the plan.
fn load(cli: &Cli) -> Result<Trainer> {
    let mut trainer = Trainer::open(&cli.plan)?;
    if cli.quantize_tables.is_some() {
        let (plan, report) = trainer.into_plan().quantize_tables()?;
        if !cli.quiet {
            eprintln!("{}", report.summary());
        }
        trainer = Trainer::new(plan);
    }
    let resume = match (&cli.resume, trainer.opened_checkpoint()) {
        (None, _) => None,
        (Some(Some(dir)), _) => Some(Arc::new(Checkpoint::open(dir)?)),
        (Some(None), Some(c)) => Some(Arc::clone(c)),
        (Some(None), None) => bail!(
            "--resume without a directory continues the checkpoint given in place of the \
             plan, but {} is a plan: give `--resume CHECKPOINT_DIR`",
            cli.plan.display()
        ),
    };
    Ok(match resume {
        Some(c) => trainer.resume(c),
        None => trainer,
    })
}

/// `--infer --inputs FILE [--outputs FILE]`: one inference on the given arrays.
fn infer_file(plan: Plan, inputs: &Path, outputs: Option<&Path>, cli: &Cli) -> Result<()> {
    let arrays = dlrm_onnx::npz::read(inputs)?
        .into_iter()
        .map(|(name, t)| (dlrm_onnx::ir_name(&name), t))
        .collect();
    let name = plan.name.clone();
    let start = std::time::Instant::now();
    let results = infer_once(plan, arrays, cli.backend, cli.kernels)?;
    let secs = start.elapsed().as_secs_f64();
    if let Some(path) = outputs {
        dlrm_onnx::npz::write(path, &results)?;
    }
    if !cli.quiet {
        for (n, t) in &results {
            eprintln!("output `{n}`: {:?} {:?}", t.dtype(), t.shape);
        }
    }
    eprintln!(
        "served `{name}` on {} ({:.1} ms){}",
        inputs.display(),
        secs * 1e3,
        outputs.map_or(String::new(), |p| format!(", outputs in {}", p.display()))
    );
    Ok(())
}

/// Converts a raw Criteo TSV file into a dataset in a new temporary directory
/// (`dlrmc data convert`'s defaults: the reference's vocabulary, its split by the
/// input's shape). Returns the directory (the dataset lives as long as it) and the
/// dataset's path.
fn convert_tsv(tsv: &Path, say: bool) -> Result<(tempfile::TempDir, PathBuf)> {
    use dlrm_data::{ConvertOptions, Format, IdMapping, convert};
    let dir = tempfile::Builder::new()
        .prefix("dlrm-run-data-")
        .tempdir()
        .context("cannot make a temporary directory for the converted dataset")?;
    let ds = dir.path().join("data.ds");
    if say {
        eprintln!(
            "converting {} (Criteo TSV) to a temporary dataset; `dlrmc data convert` keeps one to reuse",
            tsv.display()
        );
    }
    let opts = ConvertOptions {
        format: Format::CriteoTsv,
        inputs: vec![tsv.to_path_buf()],
        output: ds.clone(),
        mapping: IdMapping::default(),
        split: None,
        skip_bad_lines: false,
    };
    convert(&opts, &mut |_| {}).with_context(|| format!("converting {}", tsv.display()))?;
    Ok((dir, ds))
}

/// The roofline report of `report`'s timed steps: the machine's bounds
/// measured now on a rank's threads (about a second), the higher of this and
/// the measurement `before` the run, and each node bounded on its own (the op
/// kinds' totals if no node was timed).
fn roofline_of(
    report: &dlrm_runtime::driver::Report,
    before: Option<dlrm_runtime::roofline::Machine>,
) -> dlrm_runtime::roofline::Roofline {
    let after = dlrm_runtime::roofline::measure(report.threads);
    let machine = before.map_or(after, |b| after.best_of(b));
    let times = if report.node_times.is_empty() {
        &report.op_times
    } else {
        &report.node_times
    };
    dlrm_runtime::roofline::roofline(times, report.timed_steps, machine)
}

/// The roofline's bounds measured before a run, on the threads a rank of this
/// job will have (`driver::rank_threads`: one rank in an MPI process, every
/// rank in this one with threads); after the run, `run_plan` keeps the
/// higher of this and its second measurement.
fn bounds_before_run(settings: &RunSettings, place: &Ranks<'_>) -> dlrm_runtime::roofline::Machine {
    let ranks_here = match place {
        Ranks::Threads => settings.ranks,
        Ranks::Process(_) => 1,
    };
    dlrm_runtime::roofline::measure(dlrm_runtime::driver::rank_threads(settings, ranks_here))
}
