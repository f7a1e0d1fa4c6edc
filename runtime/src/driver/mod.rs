//! The multi-rank driver: runs a job on N ranks, then evaluates the trained model on
//! held-out data. The same per-rank code (`rank_main`, in `rank.rs`) runs either as N threads
//! of this process with a [`LocalGroup`] ([`run`], [`run_with_params`]) or as this
//! process's single rank of a job whose other ranks are other processes, with any
//! [`Communicator`] (e.g. [`crate::MpiComm`] under `mpirun`: [`run_rank`]).
//!
//! Flow:
//! 1. checks the job, derives the data schema from the *unpartitioned* graph
//!    (training graph if any, for the label; else inference) and builds the data
//!    [`Source`]: the [`SyntheticData`] (a pure function of the seed: every process
//!    builds the same) or, with [`RunSettings::data`], the memory-mapped dataset (each
//!    process opens it and reads only its ranks' slices);
//! 2. hands every rank the parameters its graphs declare, creating only those: a
//!    described parameter ([`dlrm_ir::Described`], every table of a JSON model) is
//!    generated for the ranks that declare it, a row shard (`<table>.rows<lo>_<hi>`,
//!    [`Job::row_shards`]) as just its rows, so no rank ever holds a table or rows it
//!    does not own, and a process running one rank (MPI) creates only that rank's
//!    parameters. Each rank creates its own, on its own thread and worker pool (the
//!    thread ranks concurrently, from values they share until the last is done); a
//!    stored parameter needed by one rank only is *moved* to it instead, replicated
//!    ones (MLP weights) are cloned by each rank that needs them. Creation
//!    allocates fallibly: a parameter too large for this process is an error naming
//!    it and the bytes, and ends the job like any rank's failure. A resumed job
//!    reads the kept ranks' values from the checkpoint instead (each rank its own)
//!    and creates nothing from the plan;
//! 3. every rank runs `iters` training steps (or inference steps in inference mode)
//!    on steps `0..iters` of the data, feeding its own slice (a dataset's batches
//!    assembled ahead by a loader thread, [`crate::prefetch`]), on its own pool of
//!    worker threads ([`RunSettings::threads`], `rank_pool`); rank 0 reports each
//!    logged step as an [`Event`] (through a channel to the calling
//!    thread, where the caller's `on_event` runs and can draw progress);
//!    With [`RunSettings::eval_every`] = N, after every N-th step (and the last) every rank
//!    evaluates a copy of its current parameters on the evaluation set (a dataset's
//!    validation split, or the synthetic held-out batches) without stopping training;
//! 4. every rank then runs its inference graph on the final evaluation set
//!    (`eval_batches` held-out global batches, [`crate::synthetic::eval_step`], or a
//!    dataset's test split) with the trained parameters and sends its
//!    predictions to rank 0 through the communicator (an `all_to_all_v` with empty
//!    buffers to the other ranks); rank 0 joins them in rank order (= global sample
//!    order), computes AUC, log loss, accuracy@0.5 and normalized entropy against the
//!    labels ([`eval`]) and builds the [`Report`] (only rank 0 has one).
//!
//! Failure: a rank that returns an error or panics calls `comm.abort(..)`, so every
//! other rank's pending or next collective fails instead of hanging (threads), or
//! the whole job ends (MPI: `MPI_Abort`); [`run`] then returns the original error
//! (not the peers' "aborted" echoes), which names the rank and the step (a panic
//! names the step it happened in). A non-finite loss is an error ("loss became NaN
//! at step k").
//!
//! Steps are numbered from 1 in events, reports and errors (`iter` k is the k-th
//! step); step k reads data step k-1. A resumed job ([`Job::start`] = s + 1, the
//! parameters from a [`Checkpoint`] via [`Job::resume`]) runs steps s+1..=iters on
//! data steps s.. — the same inputs as the uninterrupted run's. With
//! [`Job::checkpoint`], after every N-th step and the last, every rank writes its
//! pieces of the checkpoint ([`crate::checkpoint`]) and rank 0 reports
//! [`Event::Checkpoint`].

mod eval;
mod handout;
mod limits;
mod rank;
mod report;
mod wait;

pub use report::{BENCH_NODES, BestAuc, Report};
pub use wait::WaitPolicy;

use crate::checkpoint::{Checkpoint, CheckpointSpec, CheckpointWritten, RowPiece, Writer};
use crate::dataset::{DataConfig, DatasetSource};
use crate::error::{Result, RuntimeError};
use crate::exec::{Backend, KernelChoice, OpTime};
use crate::lr_schedule::{LrSchedule, graph_lr};
use crate::metrics::EvalMetrics;
use crate::plan::Plan;
use crate::progress::CommTimes;
use crate::source::{EvalSet, Source};
use crate::synthetic::{DataSchema, SyntheticData};
use dlrm_ir::{AllReduceAlgo, Communicator, Graph, LocalGroup, ParamValue, Tensor};
use handout::{Handout, hand_out};
pub use limits::{MAX_EVAL_BATCHES, MAX_ITERS, MAX_SYNTHETIC_BATCHES, MAX_THREADS};
use rank::{panic_message, rank_guarded, rank_pool};
use report::report;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// What a job does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Training steps, then evaluation.
    Train,
    /// Inference steps (throughput), then evaluation.
    Infer,
}

/// The settings of a run that `dlrm-run` takes from its command line as they are
/// (its flags in parentheses): [`Job::settings`], and the `settings` of `dlrmc`'s
/// run options, from which it builds the job.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSettings {
    /// Number of ranks (`--ranks`).
    pub ranks: usize,
    /// Report every `log_every`-th step (and the last); 0 reports only the last
    /// (`--log-every`).
    pub log_every: u64,
    /// Held-out global batches evaluated at the end (`--eval-batches`).
    pub eval_batches: usize,
    /// Steps excluded from the throughput median (warm-up, `--warmup`).
    pub warmup: u64,
    /// Kernel backend (`--backend jit|reference`).
    pub backend: Backend,
    /// GEMM micro-kernel choice of the JIT backend (`--kernels
    /// cranelift|native|avx512|avx512bf16|amxbf16|auto`, see [`KernelChoice`]).
    pub kernels: KernelChoice,
    /// Overlap collectives with compute (`--no-overlap` turns it off).
    pub overlap: bool,
    /// Allreduce algorithm of the thread group (`--allreduce auto|doubling|ring`).
    pub allreduce: AllReduceAlgo,
    /// Threads of each rank's worker pool (`--threads`); `None`: this process's
    /// CPUs ([`default_threads`]) shared among the ranks it runs.
    pub threads: Option<usize>,
    /// How each rank's idle workers wait (`--wait-policy`, [`WaitPolicy`]).
    pub wait: WaitPolicy,
    /// Train on a dataset instead of synthetic data (`--data`).
    pub data: Option<DataConfig>,
    /// Evaluate on the evaluation set every this many training steps and after the
    /// last (`--eval-every`); 0: only the final evaluation.
    pub eval_every: u64,
    /// Synthetic data: generate this many batches once and cycle them (step `k`
    /// takes batch `k mod n`), as the PyTorch comparison script times its steps;
    /// 0 generates a new batch every step (`--synthetic-batches`).
    pub synthetic_batches: usize,
    /// Synthetic data: the bag sizes of the variable bags, one for every table or
    /// one per table (`--pooling`); empty: 0..=2 ids a bag.
    pub pooling: Vec<crate::synthetic::BagSizes>,
}

impl Default for RunSettings {
    /// One rank, a report every 10 steps, 4 evaluation batches, 3 warm-up steps,
    /// the default kernels, overlapped collectives, synthetic data, no evaluation
    /// during training.
    fn default() -> RunSettings {
        RunSettings {
            ranks: 1,
            log_every: 10,
            eval_batches: 4,
            warmup: 3,
            backend: Backend::default(),
            kernels: KernelChoice::default(),
            overlap: true,
            allreduce: AllReduceAlgo::default(),
            threads: None,
            wait: WaitPolicy::Auto,
            data: None,
            eval_every: 0,
            synthetic_batches: 0,
            pooling: Vec::new(),
        }
    }
}

/// A run of a model on `settings.ranks` ranks.
#[derive(Clone, Debug)]
pub struct Job {
    /// Initial parameter values, stored or described (each rank gets, or creates,
    /// only those its graphs declare; a row shard's rows come from its table's
    /// value, see [`Job::row_shards`]).
    pub params: Vec<(String, ParamValue)>,
    /// The unpartitioned inference graph (data schema).
    pub full_infer: Graph,
    /// The unpartitioned training graph (data schema with the label), if training.
    pub full_train: Option<Graph>,
    /// One training graph per rank, already partitioned; `None`: inference mode.
    pub train_graphs: Option<Vec<Graph>>,
    /// One inference graph per rank, already partitioned.
    pub infer_graphs: Vec<Graph>,
    /// The ranks, the logging, the kernels, the data: the settings `dlrm-run`
    /// passes on as given.
    pub settings: RunSettings,
    /// Training (or inference) steps.
    pub iters: u64,
    /// Data seed.
    pub seed: u64,
    /// Global batch (split over the ranks with [`dlrm_ir::batch_slice`]).
    pub global_batch: usize,
    /// The learning rate of each training step (`dlrm-run --lr`, `--lr-warmup-steps`,
    /// ...); `None`: every update keeps the rate it was compiled with. A pure
    /// function of the step ([`LrSchedule::lr_at`]), the same on every rank.
    pub lr_schedule: Option<LrSchedule>,
    /// The first training step to run (1: a fresh run; `s + 1` resuming the state
    /// after step `s`). The run ends after step [`Job::iters`].
    pub start: u64,
    /// The row-shard parameters of the partitioned graphs (`<table>.rows<lo>_<hi>`)
    /// and the rows of the full parameter each holds: a rank creates (or loads) just
    /// those rows of the table's value; checkpoints store and load them as parts of
    /// the full parameter.
    pub row_shards: Vec<RowPiece>,
    /// Write checkpoints (training only).
    pub checkpoint: Option<CheckpointSpec>,
    /// Take the parameters from this checkpoint instead of [`Job::params`] (each
    /// process reads only the rows its ranks hold); [`Job::start`] should be its
    /// step + 1.
    pub resume: Option<Arc<Checkpoint>>,
}

impl Job {
    /// A one-rank job from a plan: its graphs as the per-rank graphs (train mode if
    /// the plan has a training graph), its batch size and seed, its parameters
    /// (moved). 100 iterations and the default [`RunSettings`] (a report every 10
    /// steps, 4 evaluation batches, 3 warm-up steps). For N ranks, set
    /// `settings.ranks` and replace `train_graphs` / `infer_graphs` by the
    /// partitioned graphs.
    pub fn from_plan(plan: Plan) -> Job {
        Job {
            train_graphs: plan.train.clone().map(|g| vec![g]),
            infer_graphs: vec![plan.infer.clone()],
            full_infer: plan.infer,
            full_train: plan.train,
            params: plan.params,
            settings: RunSettings::default(),
            iters: 100,
            seed: plan.training.seed,
            global_batch: plan.training.batch_size,
            lr_schedule: None,
            start: 1,
            row_shards: Vec::new(),
            checkpoint: None,
            resume: None,
        }
    }

    /// Training if there are training graphs, else inference.
    pub fn mode(&self) -> Mode {
        if self.train_graphs.is_some() {
            Mode::Train
        } else {
            Mode::Infer
        }
    }
}

/// Progress reported by rank 0 while a job runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A logged step.
    Step {
        /// The step (1-based).
        iter: u64,
        /// The global training loss (`None` in inference mode).
        loss: Option<f32>,
        /// The learning rate of this step (`None` in inference mode, or when the
        /// training graph has no update).
        lr: Option<f32>,
        /// Global samples per second of this step (executor time only).
        samples_per_s: f64,
        /// Time since the first step started.
        elapsed: Duration,
    },
    /// A batch of the final evaluation is done.
    Eval {
        /// Batches done.
        batch: usize,
        /// Batches in all.
        batches: usize,
    },
    /// An evaluation (during training, or the final one) is done.
    Evaluated(EvalMetrics),
    /// A checkpoint was written and put in place.
    Checkpoint(CheckpointWritten),
}

/// Runs a job on `job.settings.ranks` threads of this process (see the module docs).
/// `on_event` runs on the calling thread.
pub fn run(job: Job, on_event: &mut dyn FnMut(&Event)) -> Result<Report> {
    run_with_params(job, on_event).map(|(r, _)| r)
}

/// What every rank shares: the data, the step configuration, the start time.
struct Setup {
    data: Source,
    cfg: RankCfg,
    wall: Instant,
}

/// The CPUs this process may use: `RAYON_NUM_THREADS` if it is set to a positive
/// number (rayon's own convention), else the available parallelism.
pub fn default_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
}

/// The threads of each rank's worker pool when this process runs `ranks_here`
/// ranks: [`RunSettings::threads`], else this process's CPUs
/// ([`default_threads`]) shared among them, at least one each.
pub fn rank_threads(settings: &RunSettings, ranks_here: usize) -> usize {
    settings
        .threads
        .unwrap_or_else(|| (default_threads() / ranks_here.max(1)).max(1))
}

/// Checks the job and builds the data (step 1 of the module docs). `ranks_here`:
/// the ranks this process runs, which share its CPUs unless the job sets
/// [`RunSettings::threads`].
fn setup(job: &Job, ranks_here: usize) -> Result<Setup> {
    let wall = Instant::now();
    check_job(job)?;
    limits::check_counts(job)?;
    let threads = rank_threads(&job.settings, ranks_here);
    // This process runs every rank, or one of an MPI job's.
    let procs_here = match ranks_here == job.settings.ranks {
        true => Some(1),
        false => wait::mpi_local_size(),
    };
    let mode = job.mode();
    let lr = lr_setup(job)?;
    let schema_graph = job.full_train.as_ref().unwrap_or(&job.full_infer);
    let schema = DataSchema::from_graph(schema_graph)?;
    if mode == Mode::Train && schema.label.is_none() {
        return Err(job_err(
            "the training graph has no loss whose label is a graph input",
        ));
    }
    if job.settings.data.is_some() && job.settings.synthetic_batches > 0 {
        return Err(job_err(
            "--synthetic-batches cycles synthetic batches; with --data every step reads the dataset",
        ));
    }
    if job.settings.data.is_some() && !job.settings.pooling.is_empty() {
        return Err(job_err(
            "--pooling sets synthetic bag sizes; with --data the dataset's bags are used",
        ));
    }
    let data = match &job.settings.data {
        None => Source::Synthetic(SyntheticData::new(
            schema.with_bag_sizes(&job.settings.pooling)?,
            job.seed,
        )),
        Some(cfg) => Source::Dataset(Box::new(DatasetSource::open(
            cfg,
            schema,
            job.seed,
            job.global_batch,
        )?)),
    };
    let (eval_name, test_name) = job
        .settings
        .data
        .as_ref()
        .map_or(("", ""), |d| (d.eval_split.as_str(), d.test_split.as_str()));
    let eval_set = if job.settings.eval_every > 0 && mode == Mode::Train {
        Some(data.eval_set(eval_name, job.settings.eval_batches)?)
    } else {
        None
    };
    let final_set = data.eval_set(test_name, job.settings.eval_batches)?;
    let writer = match (&job.checkpoint, &job.train_graphs) {
        (Some(spec), Some(train)) => {
            let graphs: Vec<Vec<&Graph>> = train
                .iter()
                .zip(&job.infer_graphs)
                .map(|(t, i)| vec![t, i])
                .collect();
            Some(Writer::new(
                spec.clone(),
                (&job.full_infer, job.full_train.as_ref()),
                &graphs,
                &job.row_shards,
                (job.seed, job.global_batch, job.iters),
            )?)
        }
        _ => None,
    };
    Ok(Setup {
        cfg: RankCfg {
            steps_per_epoch: data.steps_per_epoch(),
            skipped: data.dataset().map_or(0, DatasetSource::skipped),
            eval_every: job.settings.eval_every,
            eval_set,
            final_set,
            prefetch: job.settings.data.as_ref().map_or(1, |d| d.prefetch),
            cycle: job.settings.synthetic_batches,
            mode,
            ranks: job.settings.ranks,
            iters: job.iters,
            global_batch: job.global_batch,
            log_every: job.settings.log_every,
            warmup: job.settings.warmup,
            backend: job.settings.backend,
            kernels: job.settings.kernels,
            overlap: job.settings.overlap,
            allreduce: job.settings.allreduce,
            threads,
            hot: job
                .settings
                .wait
                .active(threads, ranks_here, wait::cpus(), procs_here),
            lr,
            start: job.start,
            writer,
            data_desc: job
                .settings
                .data
                .as_ref()
                .map(|d| (d.path.display().to_string(), d.train_split.clone())),
        },
        data,
        wall,
    })
}

/// [`run`], also returning each rank's final parameters (index = rank), e.g. to
/// save a checkpoint or compare runs.
pub fn run_with_params(
    job: Job,
    on_event: &mut dyn FnMut(&Event),
) -> Result<(Report, Vec<HashMap<String, Tensor>>)> {
    let ranks_here = job.settings.ranks;
    let Prepared {
        setup: Setup { data, cfg, wall },
        mut handout,
        train_graphs,
        infer_graphs,
        resume,
    } = prepare(job, ranks_here, None)?;
    let ranks = cfg.ranks;
    let moved = std::mem::take(&mut handout.moved);
    // Shared by the rank threads while they create their parameters; the last
    // one done frees the values.
    let handout = Arc::new(handout);
    let resume = resume.as_deref();
    let comms = LocalGroup::with_algo(ranks, cfg.allreduce);
    let (tx, rx) = mpsc::channel::<Event>();
    let mut train_graphs = train_graphs.map(|v| v.into_iter().map(Some).collect::<Vec<_>>());

    let results: Vec<Result<RankOutput>> = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(ranks);
        for (rank, ((comm, infer), moved)) in
            comms.into_iter().zip(infer_graphs).zip(moved).enumerate()
        {
            let train = train_graphs.as_mut().and_then(|v| v[rank].take());
            let events = (rank == 0).then(|| tx.clone());
            let (data, cfg) = (&data, &cfg);
            let handout = Arc::clone(&handout);
            // The rank creates its parameters on its own thread (its pool).
            let params = move || {
                let p = handout.create(rank, moved, resume);
                drop(handout);
                p
            };
            let handle = std::thread::Builder::new()
                .name(format!("dlrm-rank-{rank}"))
                .spawn_scoped(s, move || {
                    let mut send = |ev: Event| {
                        if let Some(tx) = &events {
                            // The caller may have stopped listening; progress is
                            // best effort.
                            let _ = tx.send(ev);
                        }
                    };
                    let graphs = (train, infer);
                    match rank_pool(rank, cfg.threads) {
                        Ok(pool) => pool.install(|| {
                            wait::hot_workers(cfg.hot, || {
                                rank_guarded(rank, &comm, graphs, params, data, cfg, &mut send)
                            })
                        }),
                        Err(e) => {
                            comm.abort(&e.to_string());
                            Err(e)
                        }
                    }
                });
            handles.push((rank, handle));
        }
        drop(tx);
        drop(handout);
        // Progress on the calling thread until rank 0 hangs up.
        for ev in rx {
            on_event(&ev);
        }
        handles
            .into_iter()
            .map(|(rank, h)| match h {
                Ok(h) => h.join().unwrap_or_else(|p| {
                    Err(RuntimeError::Rank {
                        rank,
                        step: None,
                        reason: format!("panicked: {}", panic_message(&*p)),
                    })
                }),
                Err(e) => Err(RuntimeError::Rank {
                    rank,
                    step: None,
                    reason: format!("cannot start the rank's thread: {e}"),
                }),
            })
            .collect()
    });

    // The original failure, not the peers' abort echoes.
    if results.iter().any(Result::is_err) {
        let errs: Vec<RuntimeError> = results.into_iter().filter_map(Result::err).collect();
        let first = errs.iter().position(|e| !e.is_peer_abort()).unwrap_or(0);
        return Err(errs
            .into_iter()
            .nth(first)
            .unwrap_or_else(|| job_err("a rank failed")));
    }
    let mut outs: Vec<RankOutput> = results.into_iter().filter_map(Result::ok).collect();
    let params = outs
        .iter_mut()
        .map(|o| std::mem::take(&mut o.params))
        .collect();
    let report = report(&outs[0], &cfg, wall, cfg.allreduce.name());
    Ok((report, params))
}

/// Runs this process's rank (`comm.rank()`) of a job whose other ranks run in other
/// processes with the same job (e.g. MPI processes launched by `mpirun`, each
/// calling this with its [`crate::MpiComm`]). The job holds every rank's graphs
/// (partitioned the same way in every process); this process keeps only its own
/// graphs and parameters. `on_event` runs on rank 0 only, on the calling thread.
///
/// Returns the [`Report`] on rank 0 and `None` on the others. On failure the rank
/// calls `comm.abort` first (with MPI that ends the job and does not return).
pub fn run_rank(
    job: Job,
    comm: &dyn Communicator,
    on_event: &mut dyn FnMut(&Event),
) -> Result<Option<Report>> {
    if comm.size() != job.settings.ranks {
        let e = job_err(format!(
            "the job is for {} ranks but the communicator has {}",
            job.settings.ranks,
            comm.size()
        ));
        comm.abort(&e.to_string());
        return Err(e);
    }
    let rank = comm.rank();
    let fail = |e: RuntimeError| {
        comm.abort(&e.to_string());
        e
    };
    let Prepared {
        setup: Setup { data, cfg, wall },
        mut handout,
        train_graphs,
        infer_graphs,
        resume,
    } = prepare(job, 1, Some(rank)).map_err(fail)?;
    let moved = std::mem::take(&mut handout.moved[rank]);
    let params = || handout.create(rank, moved, resume.as_deref());
    let train = train_graphs.and_then(|v| v.into_iter().nth(rank));
    let infer = infer_graphs
        .into_iter()
        .nth(rank)
        .ok_or_else(|| fail(job_err(format!("no inference graph for rank {rank}"))))?;
    let pool = rank_pool(rank, cfg.threads).map_err(fail)?;
    // The rank runs on its pool; its events come back to `on_event` here, on the
    // calling thread.
    let (tx, rx) = mpsc::channel::<Event>();
    let mut out = None;
    pool.in_place_scope(|s| {
        let (data, cfg, out) = (&data, &cfg, &mut out);
        s.spawn(move |_| {
            let mut send = |ev: Event| {
                if rank == 0 {
                    // The receiver lives until this job ends.
                    let _ = tx.send(ev);
                }
            };
            *out = Some(wait::hot_workers(cfg.hot, || {
                rank_guarded(rank, comm, (train, infer), params, data, cfg, &mut send)
            }));
        });
        for ev in rx {
            on_event(&ev);
        }
    });
    let out = out.unwrap_or_else(|| Err(job_err("the rank's task did not run")))?;
    Ok((rank == 0).then(|| report(&out, &cfg, wall, &comm.all_reduce_algo())))
}

/// A job unpacked for its ranks, the same for the thread and the MPI path: the
/// shared setup, the parameters handed out, the per-rank graphs, the checkpoint to
/// resume from.
struct Prepared {
    setup: Setup,
    handout: Handout,
    train_graphs: Option<Vec<Graph>>,
    infer_graphs: Vec<Graph>,
    resume: Option<Arc<Checkpoint>>,
}

/// Checks the job, builds its data ([`setup`], for `ranks_here` ranks in this
/// process) and hands its parameters out ([`hand_out`]; `only`: this process runs
/// that rank alone).
fn prepare(job: Job, ranks_here: usize, only: Option<usize>) -> Result<Prepared> {
    let setup = setup(&job, ranks_here)?;
    let Job {
        params,
        train_graphs,
        infer_graphs,
        row_shards,
        resume,
        ..
    } = job;
    let graphs = (train_graphs.as_deref(), infer_graphs.as_slice());
    let handout = hand_out(params, graphs, only, &row_shards, resume.is_some())?;
    Ok(Prepared {
        setup,
        handout,
        train_graphs,
        infer_graphs,
        resume,
    })
}

/// The job's learning rates: its schedule, checked (one that changes no rate is
/// dropped, so the updates keep their compiled rates bit for bit), and the rate
/// the training graph was compiled with (reported when there is no schedule).
fn lr_setup(job: &Job) -> Result<StepLr> {
    let Some(train) = job
        .full_train
        .as_ref()
        .filter(|_| job.mode() == Mode::Train)
    else {
        return Ok(StepLr::default());
    };
    let compiled = match (graph_lr(train), &job.lr_schedule) {
        (Ok(r), _) => r,
        (Err(e), Some(_)) => return Err(e),
        (Err(_), None) => None,
    };
    let schedule = match job.lr_schedule {
        Some(s) => {
            s.check()?;
            let same = s.is_constant() && compiled.is_some_and(|c| c.to_bits() == s.lr.to_bits());
            (!same).then_some(s)
        }
        None => None,
    };
    Ok(StepLr { schedule, compiled })
}

fn job_err(reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Job {
        reason: reason.into(),
    }
}

fn check_job(job: &Job) -> Result<()> {
    if job.settings.ranks == 0 {
        return Err(job_err("at least one rank is needed"));
    }
    if job.infer_graphs.len() != job.settings.ranks {
        return Err(job_err(format!(
            "{} inference graphs for {} ranks",
            job.infer_graphs.len(),
            job.settings.ranks
        )));
    }
    if let Some(t) = &job.train_graphs
        && t.len() != job.settings.ranks
    {
        return Err(job_err(format!(
            "{} training graphs for {} ranks",
            t.len(),
            job.settings.ranks
        )));
    }
    if job.start == 0 || job.start > job.iters {
        return Err(job_err(format!(
            "the first step ({}) must be in 1..={} (the last step)",
            job.start, job.iters
        )));
    }
    if job.global_batch < job.settings.ranks {
        return Err(job_err(format!(
            "global batch {} is smaller than the {} ranks",
            job.global_batch, job.settings.ranks
        )));
    }
    Ok(())
}

/// The learning rate of the training steps.
#[derive(Clone, Copy, Debug, Default)]
struct StepLr {
    /// Each step's rate, handed to the executor; `None`: the compiled rates.
    schedule: Option<LrSchedule>,
    /// The rate the training graph was compiled with.
    compiled: Option<f32>,
}

impl StepLr {
    /// The rate of step `k` (1-based).
    fn at(&self, k: u64) -> Option<f32> {
        self.schedule.map_or(self.compiled, |s| Some(s.lr_at(k)))
    }
}

struct RankCfg {
    mode: Mode,
    /// The training steps' learning rate.
    lr: StepLr,
    ranks: usize,
    overlap: bool,
    allreduce: AllReduceAlgo,
    /// Threads of the rank's worker pool.
    threads: usize,
    /// Its idle workers wait actively ([`wait::hot_workers`]).
    hot: bool,
    iters: u64,
    global_batch: usize,
    log_every: u64,
    warmup: u64,
    backend: Backend,
    kernels: KernelChoice,
    /// A dataset's training steps per epoch.
    steps_per_epoch: Option<u64>,
    /// Samples the dataset skipped (`--on-nonfinite skip`).
    skipped: u64,
    /// Evaluate every this many steps (0: never during training).
    eval_every: u64,
    /// The set evaluated during training.
    eval_set: Option<EvalSet>,
    /// The set of the final evaluation.
    final_set: EvalSet,
    /// Batches the loader prepares ahead.
    prefetch: usize,
    /// Training batches generated once and cycled (0: none, see
    /// [`RunSettings::synthetic_batches`]).
    cycle: usize,
    /// The first training step.
    start: u64,
    /// The checkpoint writer, if the run writes checkpoints.
    writer: Option<Writer>,
    /// A dataset's path and training split, for checkpoints' data position.
    data_desc: Option<(String, String)>,
}

struct RankOutput {
    losses: Vec<(u64, f32)>,
    last_loss: Option<f32>,
    step_times: Vec<f64>,
    /// Rank 0: the final evaluation's metrics; other ranks: `None`.
    final_metrics: Option<EvalMetrics>,
    /// Rank 0: the evaluations during training.
    evals: Vec<EvalMetrics>,
    op_times: Vec<OpTime>,
    node_times: Vec<OpTime>,
    comm: CommTimes,
    params: HashMap<String, Tensor>,
    /// The threads of the pool the rank ran on.
    threads: usize,
}
