//! Launching a plan on N ranks: the plan, partitioned for them, as the driver's
//! [`Job`], the tables placed and every rank's memory checked on the way.
//!
//! The plan holds unpartitioned graphs; the partition pass splits them here, at
//! launch, so the same plan runs on any number of ranks. The global batch is the
//! plan's batch size (the same whatever the rank count), so N ranks train on the
//! same samples as one rank. The tables are placed by the sharding planner
//! ([`shard`]) with [`RunOptions::shards`]; row-wise tables' shard parameters are
//! listed in [`Job::row_shards`], and each rank creates just its rows of the table
//! (the runtime's driver), never the whole table. [`memory`] accounts each rank's
//! memory and refuses a job that does not fit its budget before anything is
//! allocated.
//!
//! [`run_job`] runs the job on the chosen [`Ranks`]: N threads of this process, or
//! this process's rank of an MPI job (`mpirun -n N dlrm-run PLAN --comm mpi`), where
//! every process partitions the same plan the same way and runs its own rank.
//! [`crate::Trainer`] puts it all behind one builder.

pub mod memory;
pub mod shard;

use crate::checkpoint::{Checkpoint, CheckpointSpec, RowPiece, RunInfo, plan_identity};
use crate::driver::{Event, Job, Report, RunSettings, run, run_rank};
use crate::error::{Result, RuntimeError};
use crate::lr_schedule::{LrPolicy, LrSchedule, graph_lr};
use crate::plan::Plan;
use crate::{Backend, KernelChoice};
use dlrm_ir::{Communicator, Tensor};
use memory::Budget;
use shard::{ShardSettings, partition_graph, shard_plan};
use std::path::PathBuf;
use std::sync::Arc;

/// How to run a plan: the [`RunSettings`] the job takes as they are, and what
/// [`job_for`] resolves against the plan (steps, seed, batch, learning rate,
/// placement, checkpoints, memory check).
#[derive(Clone, Debug, PartialEq)]
pub struct RunOptions {
    /// The settings passed on to the job ([`Job::settings`]).
    pub settings: RunSettings,
    /// Steps to run.
    pub iters: u64,
    /// Seed of the synthetic data; `None`: the plan's seed.
    pub seed: Option<u64>,
    /// Global batch; `None`: the plan's batch size.
    pub batch_size: Option<usize>,
    /// Run inference even if the plan can train.
    pub infer: bool,
    /// The sharding planner's settings (where the tables go on N ranks).
    pub shards: ShardSettings,
    /// With `settings.data`: run this many epochs of its training split (`iters`
    /// is then ignored).
    pub epochs: Option<u64>,
    /// The base learning rate of the training steps (`--lr`); `None`: the plan's.
    pub lr: Option<f32>,
    /// How the learning rate moves with the step (`--lr-warmup-steps`, ...);
    /// `None`: constant.
    pub lr_policy: Option<LrPolicy>,
    /// Write checkpoints while training.
    pub checkpoint: Option<CheckpointOptions>,
    /// Resume from this checkpoint: its parameters, its step + 1 as the first
    /// step; `iters` is the run's total (the last step).
    pub resume: Option<Arc<Checkpoint>>,
    /// Refuse the job, before anything is allocated, if a rank's memory account
    /// ([`memory`]) exceeds this budget, or the planner cannot place the
    /// tables in it (`dlrm-run` places them in the same budget:
    /// `shards.mem_per_rank` is its bytes); `None`: no check.
    pub memory_budget: Option<Budget>,
}

/// `--checkpoint DIR --checkpoint-every N --keep K`.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointOptions {
    /// The checkpoint root.
    pub dir: PathBuf,
    /// Every this many steps, and after the last (0: only after the last).
    pub every: u64,
    /// Keep the newest K checkpoints.
    pub keep: usize,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions {
            settings: RunSettings::default(),
            iters: 100,
            seed: None,
            batch_size: None,
            infer: false,
            shards: ShardSettings::default(),
            epochs: None,
            lr: None,
            lr_policy: None,
            checkpoint: None,
            resume: None,
            memory_budget: None,
        }
    }
}

/// Which communicator connects the ranks (`dlrm-run --comm`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Comm {
    /// N threads of this process (`--ranks N`).
    #[default]
    Threads,
    /// One rank per MPI process, rank and size from MPI (launched by `mpirun`).
    Mpi,
}

impl Comm {
    /// Parses `threads` or `mpi`.
    pub fn parse(s: &str) -> Option<Comm> {
        match s {
            "threads" => Some(Comm::Threads),
            "mpi" => Some(Comm::Mpi),
            _ => None,
        }
    }
}

/// The rank count of an MPI job of `size` processes: `--ranks`, if given, must
/// agree with it.
pub fn mpi_ranks(size: usize, ranks: Option<usize>) -> Result<usize> {
    match ranks {
        Some(r) if r != size => Err(RuntimeError::Options(format!(
            "--ranks {r} disagrees with the MPI job's {size} processes (drop --ranks \
             under --comm mpi, or launch `mpirun -n {r}`)"
        ))),
        _ => Ok(size),
    }
}

/// Where a job runs: this process's threads, or one rank of a multi-process group.
pub enum Ranks<'a> {
    /// `job.ranks` threads of this process.
    Threads,
    /// This process's rank of a group whose other ranks are other processes.
    Process(&'a dyn Communicator),
}

/// Runs `job` where `ranks` says. Returns the report on rank 0 (always with
/// threads) and `None` on the other ranks of a multi-process group; `on_event`
/// runs on rank 0 only.
pub fn run_job(
    job: Job,
    ranks: Ranks<'_>,
    on_event: &mut dyn FnMut(&Event),
) -> Result<Option<Report>> {
    Ok(match ranks {
        Ranks::Threads => Some(run(job, on_event)?),
        Ranks::Process(comm) => run_rank(job, comm, on_event)?,
    })
}

/// Builds the job that runs `plan` as `opts` says, partitioning its graphs.
pub fn job_for(plan: Plan, opts: &RunOptions) -> Result<Job> {
    let ranks = opts.settings.ranks;
    if ranks == 0 {
        return Err(RuntimeError::Options("--ranks must be at least 1".into()));
    }
    if opts.settings.threads == Some(0) {
        return Err(RuntimeError::Options("--threads must be at least 1".into()));
    }
    let (global_batch, iters) = batch_and_steps(&plan, opts)?;
    let (seed, global_batch, iters) = match &opts.resume {
        Some(c) => resume_settings(&plan, c, opts, global_batch, iters)?,
        None => (opts.seed.unwrap_or(plan.training.seed), global_batch, iters),
    };
    if opts.infer && (opts.resume.is_some() || opts.checkpoint.is_some()) {
        return Err(RuntimeError::Options(
            "--resume and --checkpoint are for training; to serve a checkpoint, give it \
             in place of the plan with --infer"
                .into(),
        ));
    }
    let lr_schedule = match (&opts.resume, opts.lr.is_none() && opts.lr_policy.is_none()) {
        // A resumed run continues the checkpointed run's schedule unless told otherwise.
        (Some(c), true) => c.manifest().lr_schedule,
        _ => lr_schedule_for(&plan, opts)?,
    };
    let spec = opts.checkpoint.as_ref().map(|c| CheckpointSpec {
        dir: c.dir.clone(),
        every: c.every,
        keep: c.keep,
        info: RunInfo {
            name: plan.name.clone(),
            precision: plan.precision.clone(),
            training: plan.training.clone(),
            pass_log: plan.pass_log.clone(),
            contract: plan.contract.clone(),
            lr_schedule,
        },
    });
    let (infer_graphs, train_graphs, row_shards) = place(&plan, opts, global_batch)?;
    if let Some(budget) = &opts.memory_budget {
        check_memory(
            &plan,
            opts,
            budget,
            global_batch,
            &infer_graphs,
            train_graphs.as_deref(),
        )?;
    }
    let mut job = Job::from_plan(plan);
    job.lr_schedule = lr_schedule;
    job.row_shards = row_shards;
    if opts.infer {
        job.full_train = None;
    }
    job.train_graphs = train_graphs;
    job.infer_graphs = infer_graphs;
    job.settings = opts.settings.clone();
    job.iters = iters;
    job.global_batch = global_batch;
    job.seed = seed;
    job.checkpoint = spec;
    if let Some(c) = &opts.resume {
        job.start = c.step() + 1;
        job.resume = Some(Arc::clone(c));
    }
    Ok(job)
}

/// The global batch and the step count (`--epochs` of a dataset counted in
/// steps), checked against the ranks and the plan.
fn batch_and_steps(plan: &Plan, opts: &RunOptions) -> Result<(usize, u64)> {
    let ranks = opts.settings.ranks;
    let global_batch = opts.batch_size.unwrap_or(plan.training.batch_size);
    let iters = match (&opts.settings.data, opts.epochs) {
        (Some(d), Some(e)) => {
            let ds = dlrm_data::Dataset::open(&d.path)?;
            let spe = crate::dataset::steps_per_epoch(&ds, &d.train_split, global_batch)?;
            e.checked_mul(spe)
                .ok_or_else(|| RuntimeError::Options(format!("--epochs {e}: too many steps")))?
        }
        (None, Some(_)) => {
            return Err(RuntimeError::Options(
                "--epochs needs --data (synthetic data has no epochs)".into(),
            ));
        }
        _ => opts.iters,
    };
    if iters == 0 {
        return Err(RuntimeError::Options(
            "--iters (or --epochs) must be at least 1".into(),
        ));
    }
    if global_batch == 0 {
        return Err(RuntimeError::Options(
            "the batch size must be at least 1".into(),
        ));
    }
    if global_batch < ranks {
        return Err(RuntimeError::Options(format!(
            "--ranks {ranks} is more than the global batch of {global_batch} samples: \
             every rank needs at least one sample (lower --ranks or raise --batch-size)"
        )));
    }
    if !opts.infer && plan.train.is_none() {
        return Err(RuntimeError::Options(format!(
            "plan `{}` was compiled for inference only; run it with --infer, or compile \
             it again without --infer-only",
            plan.name
        )));
    }
    Ok((global_batch, iters))
}

/// Each rank's inference graph, training graph (when training), and the row
/// shards the ranks hold.
type Placed = (
    Vec<dlrm_ir::Graph>,
    Option<Vec<dlrm_ir::Graph>>,
    Vec<RowPiece>,
);

/// The per-rank graphs (inference, training) of `plan` at `opts`' rank count and
/// the row shards they hold: one placement for both graphs ([`shard`]), or
/// the whole graphs on one rank.
fn place(plan: &Plan, opts: &RunOptions, global_batch: usize) -> Result<Placed> {
    let ranks = opts.settings.ranks;
    if ranks == 1 {
        let train = match (&plan.train, opts.infer) {
            (Some(t), false) => Some(vec![t.clone()]),
            _ => None,
        };
        return Ok((vec![plan.infer.clone()], train, Vec::new()));
    }
    let sp = match (
        shard_plan(plan, ranks, global_batch, &opts.shards),
        &opts.memory_budget,
    ) {
        (Ok(sp), _) => sp,
        // The tables do not fit the budget: the refusal with its advice.
        (Err(RuntimeError::Partition { source, .. }), Some(budget)) => {
            let tables = shard::plan_tables(plan)?;
            let w = want(plan, opts, budget, global_batch, &tables);
            return Err(memory::placement_refusal(&source, &w));
        }
        (Err(e), _) => return Err(e),
    };
    let infer = partition_graph(&plan.infer, "infer", &sp, opts.shards.bucket_bytes)?;
    let train = match (&plan.train, opts.infer) {
        (Some(t), false) => Some(partition_graph(t, "train", &sp, opts.shards.bucket_bytes)?),
        _ => None,
    };
    let graphs = train.as_ref().map(|t| t.graphs.clone());
    // The training partition's row shards also cover the tables' Split-SGD
    // low halves, which the inference graph does not hold.
    let infer_graphs = infer.graphs.clone();
    let row_shards = train
        .unwrap_or(infer)
        .row_shards
        .iter()
        .map(|s| RowPiece {
            param: s.param.clone(),
            table: s.table.clone(),
            lo: s.lo,
            hi: s.hi,
        })
        .collect();
    Ok((infer_graphs, graphs, row_shards))
}

/// Refuses the job if a rank's memory account does not fit `budget`
/// ([`memory`]); nothing of the run is allocated yet.
fn check_memory(
    plan: &Plan,
    opts: &RunOptions,
    budget: &Budget,
    global_batch: usize,
    infer: &[dlrm_ir::Graph],
    train: Option<&[dlrm_ir::Graph]>,
) -> Result<()> {
    let job = dlrm_passes::shard::MemoryJob {
        global_batch,
        ranks: opts.settings.ranks,
        prefetch: opts.settings.data.as_ref().map_or(0, |d| d.prefetch),
    };
    let accounts = memory::rank_accounts(train, infer, &job);
    let tables = shard::plan_tables(plan)?;
    let w = want(plan, opts, budget, global_batch, &tables);
    memory::check(&accounts, budget, &w)
}

/// What a refusal's advice ([`memory::suggest`]) needs of the job.
fn want<'a>(
    plan: &'a Plan,
    opts: &'a RunOptions,
    budget: &Budget,
    global_batch: usize,
    tables: &'a [dlrm_passes::partition::TableInfo],
) -> memory::Want<'a> {
    memory::Want {
        graph: plan.train.as_ref().unwrap_or(&plan.infer),
        tables,
        ranks: opts.settings.ranks,
        global_batch,
        settings: &opts.shards,
        budget: budget.bytes,
        train: plan.train.is_some() && !opts.infer,
        precision: &plan.precision,
        per_machine: budget.per_machine,
    }
}

/// The learning-rate schedule `opts` asks for (`None`: none asked, every update
/// keeps its compiled rate). Its base rate is `--lr`, else the rate the plan's
/// training graph was compiled with (the same value, bit for bit: a schedule that
/// changes nothing gives the run without one).
fn lr_schedule_for(plan: &Plan, opts: &RunOptions) -> Result<Option<LrSchedule>> {
    if opts.lr.is_none() && opts.lr_policy.is_none() {
        return Ok(None);
    }
    let compiled = match &plan.train {
        Some(g) => graph_lr(g)?,
        None => None,
    };
    let s = LrSchedule {
        lr: opts.lr.or(compiled).unwrap_or(plan.training.learning_rate),
        policy: opts.lr_policy.unwrap_or_default(),
    };
    s.check()?;
    Ok(Some(s))
}

/// The seed, global batch and last step of a run resuming from `c`: the
/// checkpoint's seed and batch (a different one given explicitly is refused: the
/// data would not continue the run's), and `iters` as the run's total steps
/// (`None` given: the checkpointed run's own last step). Checks that the plan's
/// parameters are the checkpoint's, naming the first that differs.
fn resume_settings(
    plan: &Plan,
    c: &Checkpoint,
    opts: &RunOptions,
    batch: usize,
    iters: u64,
) -> Result<(u64, usize, u64)> {
    let m = c.manifest();
    c.check_params(plan.param_types())?;
    // The data continues the checkpointed run's only on the same kind of source
    // and split (a dataset may have moved: its path is not compared).
    let now = opts.settings.data.as_ref();
    match (m.data.dataset.as_deref(), now) {
        (Some(was), None) => {
            return Err(RuntimeError::Options(format!(
                "checkpoint {} was trained on dataset {was}: resume with `--data {was}` \
                 (without it the run would continue on synthetic data)",
                c.dir().display()
            )));
        }
        (None, Some(d)) => {
            return Err(RuntimeError::Options(format!(
                "checkpoint {} was trained on synthetic data, not a dataset: drop `--data {}` \
                 to resume it",
                c.dir().display(),
                d.path.display()
            )));
        }
        (Some(_), Some(d)) => {
            if let Some(split) = m.data.train_split.as_deref()
                && split != d.train_split
            {
                return Err(RuntimeError::Options(format!(
                    "checkpoint {} trained on split `{split}`, this run on `{}`: resume with \
                     `--train-split {split}`",
                    c.dir().display(),
                    d.train_split
                )));
            }
        }
        (None, None) => {}
    }
    if let Some(s) = opts.seed
        && s != m.seed
    {
        return Err(RuntimeError::Options(format!(
            "--seed {s}: checkpoint {} was trained with seed {} (resume with its seed, or \
             drop --seed)",
            c.dir().display(),
            m.seed
        )));
    }
    if opts.batch_size.is_some() && batch != m.global_batch {
        return Err(RuntimeError::Options(format!(
            "--batch-size {batch}: checkpoint {} was trained with a global batch of {}",
            c.dir().display(),
            m.global_batch
        )));
    }
    if iters <= m.step {
        return Err(RuntimeError::Options(format!(
            "checkpoint {} holds the state after step {}; --iters {iters} is the run's \
             total steps, so nothing is left to train (raise --iters)",
            c.dir().display(),
            m.step
        )));
    }
    Ok((m.seed, m.global_batch, iters))
}

/// A note if `plan`'s graphs are not the ones the checkpoint was written with
/// (same parameters, e.g. another learning rate baked into the graph).
pub fn resume_note(plan: &Plan, c: &Checkpoint) -> Option<String> {
    let id = plan_identity(&plan.infer, plan.train.as_ref());
    (id != c.manifest().plan.sha256).then(|| {
        format!(
            "note: the plan's graphs differ from those checkpoint {} was written with \
             (the parameters match); continuing with the plan's",
            c.dir().display()
        )
    })
}

/// Runs the plan's inference graph once on one rank with the given inputs (e.g.
/// read from an `.npz` file) and returns its outputs by name: a
/// [`crate::Session`] used once (inputs in the model's own names and
/// layout, NaN and infinite values refused naming the rows).
pub fn infer_once(
    plan: Plan,
    inputs: Vec<(String, Tensor)>,
    backend: Backend,
    kernels: KernelChoice,
) -> Result<Vec<(String, Tensor)>> {
    crate::Session::new(plan, backend, kernels)?.infer(inputs)
}
