//! The multi-rank driver: runs a job on N ranks, then evaluates the trained model on
//! held-out data. The same per-rank code ([`rank_main`]) runs either as N threads
//! of this process with a [`LocalGroup`] ([`run`], [`run_with_params`]) or as this
//! process's single rank of a job whose other ranks are other processes, with any
//! [`Communicator`] (e.g. [`crate::MpiComm`] under `mpirun`: [`run_rank`]).
//!
//! Flow:
//! 1. checks the job, derives the data schema from the *unpartitioned* graph
//!    (training graph if any, for the label; else inference) and builds the
//!    [`SyntheticData`] (a pure function of the seed: every process builds the same);
//! 2. hands every rank the parameters its graphs declare — a parameter needed by
//!    one rank only (an embedding table on its owner) is *moved*, replicated ones
//!    (MLP weights) are cloned for all but the last rank that needs them; a process
//!    running one rank keeps only that rank's parameters;
//! 3. every rank runs `iters` training steps (or inference steps in inference mode)
//!    on steps `0..iters` of the data, feeding its own slice, on its own pool of
//!    worker threads ([`Job::threads`], `rank_pool`); rank 0 reports each
//!    logged step as an [`Event`] (through a channel to the calling
//!    thread, where the caller's `on_event` runs and can draw progress);
//! 4. every rank then runs its inference graph on `eval_batches` held-out global
//!    batches ([`crate::data::eval_step`]) with the trained parameters and sends its
//!    predictions to rank 0 through the communicator (an `all_to_all_v` with empty
//!    buffers to the other ranks); rank 0 joins them in rank order (= global sample
//!    order), computes AUC and accuracy@0.5 against the teacher's labels and builds
//!    the [`Report`] (only rank 0 has one).
//!
//! Failure: a rank that returns an error or panics calls `comm.abort(..)`, so every
//! other rank's pending or next collective fails instead of hanging (threads), or
//! the whole job ends (MPI: `MPI_Abort`); [`run`] then returns the original error
//! (not the peers' "aborted" echoes), which names the rank and the step (a panic
//! names the step it happened in). A non-finite loss is an error ("loss became NaN
//! at step k").
//!
//! Steps are numbered from 1 in events, reports and errors (`iter` k is the k-th
//! step); step k reads data step k-1.

use crate::data::{DataSchema, SyntheticData, eval_step};
use crate::error::{Result, RuntimeError};
use crate::exec::{Backend, Executor, KernelChoice, OpTime};
use crate::metrics::{accuracy, auc};
use crate::plan::Plan;
use crate::progress::CommTimes;
use dlrm_ir::{AllReduceAlgo, Communicator, Dim, Graph, LocalGroup, Tensor, batch_slice};
use serde::Serialize;
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
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

/// A run of a model on `ranks` ranks.
#[derive(Clone, Debug)]
pub struct Job {
    /// Initial parameter values (moved to the ranks: tables to their owner).
    pub params: Vec<(String, Tensor)>,
    /// The unpartitioned inference graph (data schema).
    pub full_infer: Graph,
    /// The unpartitioned training graph (data schema with the label), if training.
    pub full_train: Option<Graph>,
    /// One training graph per rank, already partitioned; `None`: inference mode.
    pub train_graphs: Option<Vec<Graph>>,
    /// One inference graph per rank, already partitioned.
    pub infer_graphs: Vec<Graph>,
    /// Number of ranks.
    pub ranks: usize,
    /// Training (or inference) steps.
    pub iters: u64,
    /// Data seed.
    pub seed: u64,
    /// Global batch (split over the ranks with [`batch_slice`]).
    pub global_batch: usize,
    /// Report every `log_every`-th step (and the last); 0 reports only the last.
    pub log_every: u64,
    /// Held-out global batches evaluated at the end.
    pub eval_batches: usize,
    /// Steps excluded from the throughput median (warm-up).
    pub warmup: u64,
    /// Kernel backend (`--backend jit|reference`).
    pub backend: Backend,
    /// GEMM micro-kernel choice of the JIT backend (`--kernels
    /// cranelift|native|avx512|avx512bf16|auto`, see [`KernelChoice`]).
    pub kernels: KernelChoice,
    /// Overlap collectives with compute (`--no-overlap` turns it off).
    pub overlap: bool,
    /// Allreduce algorithm of the thread group (`--allreduce auto|doubling|ring`).
    pub allreduce: AllReduceAlgo,
    /// Threads of each rank's worker pool (`--threads`); `None`: this process's
    /// CPUs ([`default_threads`]) shared among the ranks it runs.
    pub threads: Option<usize>,
}

impl Job {
    /// A one-rank job from a plan: its graphs as the per-rank graphs (train mode if
    /// the plan has a training graph), its batch size and seed, its parameters
    /// (moved). 100 iterations, a report every 10, 4 evaluation batches, 3 warm-up
    /// steps. For N ranks, set `ranks` and replace `train_graphs` / `infer_graphs`
    /// by the partitioned graphs.
    pub fn from_plan(plan: Plan) -> Job {
        Job {
            train_graphs: plan.train.clone().map(|g| vec![g]),
            infer_graphs: vec![plan.infer.clone()],
            full_infer: plan.infer,
            full_train: plan.train,
            params: plan.params,
            ranks: 1,
            iters: 100,
            seed: plan.training.seed,
            global_batch: plan.training.batch_size,
            log_every: 10,
            eval_batches: 4,
            warmup: 3,
            backend: Backend::default(),
            kernels: KernelChoice::default(),
            overlap: true,
            allreduce: AllReduceAlgo::default(),
            threads: None,
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
        /// Global samples per second of this step (executor time only).
        samples_per_s: f64,
        /// Time since the first step started.
        elapsed: Duration,
    },
    /// An evaluation batch is done.
    Eval {
        /// Batches done.
        batch: usize,
        /// Batches in all.
        batches: usize,
    },
}

/// The outcome of a job.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Train or infer.
    pub mode: Mode,
    /// Number of ranks.
    pub ranks: usize,
    /// Threads of rank 0's worker pool (every rank has as many).
    pub threads: usize,
    /// Steps run.
    pub iters: u64,
    /// Global batch.
    pub global_batch: usize,
    /// The last step's loss (training).
    pub final_loss: Option<f32>,
    /// `(iter, loss)` of every logged step (training).
    pub losses: Vec<(u64, f32)>,
    /// Median global samples per second over the steps after warm-up (executor time
    /// of rank 0, which waits for the others in every collective).
    pub samples_per_s: f64,
    /// AUC on the held-out batches (`None` if undefined or no evaluation).
    pub auc: Option<f64>,
    /// Accuracy at threshold 0.5 on the held-out batches.
    pub accuracy: Option<f64>,
    /// Samples evaluated.
    pub eval_samples: usize,
    /// Wall time of the whole run, in seconds.
    pub wall_s: f64,
    /// Rank 0's time per op kind during the timed steps (evaluation and
    /// warm-up excluded).
    pub op_times: Vec<OpTime>,
    /// Rank 0's heaviest nodes during the timed steps ([`BENCH_NODES`] of them,
    /// most expensive first).
    pub node_times: Vec<OpTime>,
    /// Steps `op_times`, `node_times` and `comm` cover (the steps after the warm-up, or all
    /// if there are no more than `warmup`).
    pub timed_steps: u64,
    /// The kernel backend used.
    pub backend: Backend,
    /// The GEMM micro-kernel choice (`cranelift`, `native` or `auto`).
    pub kernels: &'static str,
    /// JIT kernels compiled by the process so far (all ranks share them).
    pub jit_kernels: usize,
    /// Total JIT compile time of the process so far, in seconds.
    pub jit_compile_s: f64,
    /// GEMM shapes per micro-kernel the JIT picked so far
    /// ([`dlrm_codegen::Jit::gemm_picks`]).
    pub gemm_picks: Vec<(String, usize)>,
    /// Whether collectives overlapped compute.
    pub overlap: bool,
    /// How the communicator all-reduces (the thread group's algorithm, or MPI's).
    pub allreduce: String,
    /// Rank 0's collective time during the steps (in flight vs blocking it).
    pub comm: CommTimes,
}

impl Report {
    /// Rank 0's `all_reduce` calls per step (one per node: a gradient bucket is
    /// one call), rounded.
    pub fn all_reduce_calls_per_step(&self) -> u64 {
        let calls: u64 = self
            .op_times
            .iter()
            .filter(|t| t.op == "all_reduce")
            .map(|t| t.calls)
            .sum();
        (calls as f64 / self.timed_steps.max(1) as f64).round() as u64
    }

    /// The `--bench` table: per op kind, calls per step, time share, ms per step,
    /// GFLOP/s and GB/s, then the throughput line.
    pub fn bench_table(&self) -> String {
        let total: f64 = self.op_times.iter().map(|t| t.seconds).sum();
        let iters = self.timed_steps.max(1) as f64;
        let mut s = format!(
            "{:<20} {:>7} {:>7} {:>10} {:>9} {:>8}\n",
            "op", "calls", "share", "ms/step", "GFLOP/s", "GB/s"
        );
        for t in &self.op_times {
            let share = if total > 0.0 {
                100.0 * t.seconds / total
            } else {
                0.0
            };
            s.push_str(&format!(
                "{:<20} {:>7.1} {:>6.1}% {:>10.3} {:>9.2} {:>8.2}\n",
                t.op,
                t.calls as f64 / iters,
                share,
                1e3 * t.seconds / iters,
                t.gflops(),
                t.gbytes()
            ));
        }
        if !self.node_times.is_empty() {
            s.push_str(&format!(
                "\n{:<20} {:<24} {:>10} {:>9} {:>8}\n",
                "heaviest nodes", "result", "ms/step", "GFLOP/s", "GB/s"
            ));
            for t in &self.node_times {
                s.push_str(&format!(
                    "{:<20} {:<24} {:>10.3} {:>9.2} {:>8.2}\n",
                    t.op,
                    format!("%{}", t.node.as_deref().unwrap_or("?")),
                    1e3 * t.seconds / iters,
                    t.gflops(),
                    t.gbytes()
                ));
            }
            s.push('\n');
        }
        if self.ranks > 1 {
            s.push_str(&format!(
                "collectives (rank 0): {:.3} ms/step in flight, {:.3} ms/step exposed, {:.0}% hidden, {} all_reduce calls/step (overlap {}, allreduce {})\n",
                1e3 * self.comm.busy_s / iters,
                1e3 * self.comm.exposed_s / iters,
                100.0 * self.comm.hidden_fraction(),
                self.all_reduce_calls_per_step(),
                if self.overlap { "on" } else { "off" },
                self.allreduce,
            ));
        }
        s.push_str(&format!(
            "{} {:?} x{} ranks x{} threads, backend {} (kernels {}): {:.0} samples/s; {} JIT kernels compiled in {:.3} s\n",
            match self.mode {
                Mode::Train => "train",
                Mode::Infer => "infer",
            },
            self.global_batch,
            self.ranks,
            self.threads,
            self.backend.name(),
            self.kernels,
            self.samples_per_s,
            self.jit_kernels,
            self.jit_compile_s
        ));
        if !self.gemm_picks.is_empty() {
            let picks: Vec<String> = self
                .gemm_picks
                .iter()
                .map(|(name, n)| format!("{name} {n}"))
                .collect();
            s.push_str(&format!(
                "GEMM shapes by micro-kernel: {}\n",
                picks.join(", ")
            ));
        }
        s
    }
}

/// Nodes in the `--bench` table of the heaviest nodes ([`Report::node_times`]).
pub const BENCH_NODES: usize = 12;

/// Runs a job on `job.ranks` threads of this process (see the module docs).
/// `on_event` runs on the calling thread.
pub fn run(job: Job, on_event: &mut dyn FnMut(&Event)) -> Result<Report> {
    run_with_params(job, on_event).map(|(r, _)| r)
}

/// What every rank shares: the data, the step configuration, the start time.
struct Setup {
    data: SyntheticData,
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

/// Checks the job and builds the data (step 1 of the module docs). `ranks_here`:
/// the ranks this process runs, which share its CPUs unless the job sets
/// [`Job::threads`].
fn setup(job: &Job, ranks_here: usize) -> Result<Setup> {
    let wall = Instant::now();
    check_job(job)?;
    if job.threads == Some(0) {
        return Err(job_err("a rank needs at least one thread"));
    }
    let threads = job
        .threads
        .unwrap_or_else(|| (default_threads() / ranks_here).max(1));
    let mode = job.mode();
    let schema_graph = job.full_train.as_ref().unwrap_or(&job.full_infer);
    let schema = DataSchema::from_graph(schema_graph)?;
    if mode == Mode::Train && schema.label.is_none() {
        return Err(job_err(
            "the training graph has no loss whose label is a graph input",
        ));
    }
    Ok(Setup {
        data: SyntheticData::new(schema, job.seed),
        cfg: RankCfg {
            mode,
            ranks: job.ranks,
            iters: job.iters,
            global_batch: job.global_batch,
            log_every: job.log_every,
            eval_batches: job.eval_batches,
            warmup: job.warmup,
            backend: job.backend,
            kernels: job.kernels,
            overlap: job.overlap,
            allreduce: job.allreduce,
            threads,
        },
        wall,
    })
}

/// [`run`], also returning each rank's final parameters (index = rank), e.g. to
/// save a checkpoint or compare runs.
pub fn run_with_params(
    job: Job,
    on_event: &mut dyn FnMut(&Event),
) -> Result<(Report, Vec<HashMap<String, Tensor>>)> {
    let Setup { data, cfg, wall } = setup(&job, job.ranks)?;
    let ranks = cfg.ranks;
    let Job {
        params,
        train_graphs,
        infer_graphs,
        ..
    } = job;
    let per_rank = distribute(params, train_graphs.as_deref(), &infer_graphs, None)?;
    let comms = LocalGroup::with_algo(ranks, cfg.allreduce);
    let (tx, rx) = mpsc::channel::<Event>();
    let mut train_graphs = train_graphs.map(|v| v.into_iter().map(Some).collect::<Vec<_>>());

    let results: Vec<Result<RankOutput>> = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(ranks);
        for (rank, ((comm, infer), params)) in comms
            .into_iter()
            .zip(infer_graphs)
            .zip(per_rank)
            .enumerate()
        {
            let train = train_graphs.as_mut().and_then(|v| v[rank].take());
            let events = (rank == 0).then(|| tx.clone());
            let (data, cfg) = (&data, &cfg);
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
                            rank_guarded(rank, &comm, graphs, params, data, cfg, &mut send)
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
    let report = report(&outs[0], &data, &cfg, wall, cfg.allreduce.name());
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
    if comm.size() != job.ranks {
        let e = job_err(format!(
            "the job is for {} ranks but the communicator has {}",
            job.ranks,
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
    let Setup { data, cfg, wall } = setup(&job, 1).map_err(fail)?;
    let Job {
        params,
        train_graphs,
        infer_graphs,
        ..
    } = job;
    let mut per_rank =
        distribute(params, train_graphs.as_deref(), &infer_graphs, Some(rank)).map_err(fail)?;
    let params = std::mem::take(&mut per_rank[rank]);
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
            *out = Some(rank_guarded(
                rank,
                comm,
                (train, infer),
                params,
                data,
                cfg,
                &mut send,
            ));
        });
        for ev in rx {
            on_event(&ev);
        }
    });
    let out = out.unwrap_or_else(|| Err(job_err("the rank's task did not run")))?;
    Ok((rank == 0).then(|| report(&out, &data, &cfg, wall, &comm.all_reduce_algo())))
}

/// Rank 0's report from its output (which holds every rank's predictions).
/// `allreduce` names the communicator's all-reduce ([`Communicator::all_reduce_algo`]).
fn report(
    rank0: &RankOutput,
    data: &SyntheticData,
    cfg: &RankCfg,
    wall: Instant,
    allreduce: &str,
) -> Report {
    let mut labels = Vec::with_capacity(rank0.scores.len());
    for b in 0..cfg.eval_batches {
        labels.extend(data.labels(eval_step(b as u64), 0..cfg.global_batch));
    }
    let scores = &rank0.scores;
    let jit_stats = dlrm_codegen::Jit::global()
        .map(|j| j.stats())
        .unwrap_or_default();
    let measured: Vec<f64> = {
        let skip = if (rank0.step_times.len() as u64) > cfg.warmup {
            cfg.warmup as usize
        } else {
            0
        };
        rank0.step_times[skip..].to_vec()
    };
    let samples_per_s = median(&measured).map_or(0.0, |dt| {
        if dt > 0.0 {
            cfg.global_batch as f64 / dt
        } else {
            0.0
        }
    });
    Report {
        mode: cfg.mode,
        ranks: cfg.ranks,
        threads: rank0.threads,
        iters: cfg.iters,
        global_batch: cfg.global_batch,
        final_loss: rank0.last_loss,
        losses: rank0.losses.clone(),
        samples_per_s,
        auc: auc(scores, &labels),
        accuracy: accuracy(scores, &labels, 0.5),
        eval_samples: scores.len(),
        wall_s: wall.elapsed().as_secs_f64(),
        op_times: rank0.op_times.clone(),
        node_times: rank0.node_times.clone(),
        timed_steps: if cfg.iters > cfg.warmup {
            cfg.iters - cfg.warmup
        } else {
            cfg.iters
        },
        backend: cfg.backend,
        kernels: cfg.kernels.name(),
        jit_kernels: jit_stats.compiled,
        jit_compile_s: jit_stats.compile_s,
        gemm_picks: dlrm_codegen::Jit::global()
            .map(|j| j.gemm_picks())
            .unwrap_or_default(),
        overlap: cfg.overlap,
        allreduce: allreduce.to_string(),
        comm: rank0.comm,
    }
}

fn job_err(reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Job {
        reason: reason.into(),
    }
}

fn check_job(job: &Job) -> Result<()> {
    if job.ranks == 0 {
        return Err(job_err("at least one rank is needed"));
    }
    if job.infer_graphs.len() != job.ranks {
        return Err(job_err(format!(
            "{} inference graphs for {} ranks",
            job.infer_graphs.len(),
            job.ranks
        )));
    }
    if let Some(t) = &job.train_graphs
        && t.len() != job.ranks
    {
        return Err(job_err(format!(
            "{} training graphs for {} ranks",
            t.len(),
            job.ranks
        )));
    }
    if job.global_batch < job.ranks {
        return Err(job_err(format!(
            "global batch {} is smaller than the {} ranks",
            job.global_batch, job.ranks
        )));
    }
    Ok(())
}

/// Each rank's parameters: those its graphs declare; single-owner ones moved. With
/// `only = Some(r)`, the other ranks' maps stay empty (a process running rank r),
/// but a parameter missing for any rank is still an error.
fn distribute(
    params: Vec<(String, Tensor)>,
    train: Option<&[Graph]>,
    infer: &[Graph],
    only: Option<usize>,
) -> Result<Vec<HashMap<String, Tensor>>> {
    let ranks = infer.len();
    let mut need: HashMap<String, Vec<usize>> = HashMap::new();
    for r in 0..ranks {
        let mut names: HashSet<&str> = infer[r].param_types().map(|(n, _)| n).collect();
        if let Some(t) = train {
            names.extend(t[r].param_types().map(|(n, _)| n));
        }
        for n in names {
            need.entry(n.to_string()).or_default().push(r);
        }
    }
    let mut per_rank: Vec<HashMap<String, Tensor>> = vec![HashMap::new(); ranks];
    for (name, t) in params {
        let Some(rs) = need.remove(&name) else {
            continue;
        };
        let mut rs = rs;
        rs.retain(|&r| only.is_none_or(|o| o == r));
        rs.sort_unstable();
        let Some((&last, others)) = rs.split_last() else {
            continue;
        };
        for &r in others {
            per_rank[r].insert(name.clone(), t.clone());
        }
        per_rank[last].insert(name, t);
    }
    if let Some((name, rs)) = need.into_iter().min_by(|a, b| a.0.cmp(&b.0)) {
        return Err(RuntimeError::Param {
            name,
            reason: format!("needed by rank {} but the job has no value for it", rs[0]),
        });
    }
    Ok(per_rank)
}

struct RankCfg {
    mode: Mode,
    ranks: usize,
    overlap: bool,
    allreduce: AllReduceAlgo,
    /// Threads of the rank's worker pool.
    threads: usize,
    iters: u64,
    global_batch: usize,
    log_every: u64,
    eval_batches: usize,
    warmup: u64,
    backend: Backend,
    kernels: KernelChoice,
}

struct RankOutput {
    losses: Vec<(u64, f32)>,
    last_loss: Option<f32>,
    step_times: Vec<f64>,
    /// Rank 0: every rank's held-out predictions in global sample order, batch
    /// after batch; other ranks: empty.
    scores: Vec<f32>,
    op_times: Vec<OpTime>,
    node_times: Vec<OpTime>,
    comm: CommTimes,
    params: HashMap<String, Tensor>,
    /// The threads of the pool the rank ran on.
    threads: usize,
}

/// Takes from `params` the parameters `g` declares.
fn params_for(g: &Graph, params: &mut HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    g.param_types()
        .filter_map(|(n, _)| params.remove_entry(n))
        .collect()
}

/// Symbols of one rank's step: those the inputs carry, plus `B` and `G`.
fn step_syms(
    exec: &Executor,
    inputs: &HashMap<String, Tensor>,
    rank: usize,
    cfg: &RankCfg,
) -> Result<HashMap<String, usize>> {
    let mut syms = exec.bind_symbols(inputs)?;
    let local = batch_slice(cfg.global_batch, cfg.ranks, rank).len();
    for (s, v) in [(Dim::BATCH, local), (Dim::GLOBAL, cfg.global_batch)] {
        match syms.insert(s.to_string(), v) {
            Some(old) if old != v => {
                return Err(RuntimeError::Rank {
                    rank,
                    step: Some(exec.next_step()),
                    reason: format!("the inputs bind {s} = {old}, the job says {v}"),
                });
            }
            _ => {}
        }
    }
    Ok(syms)
}

/// [`rank_main`] with the failure rule: a panic becomes an error naming the rank
/// and the step it happened in, and any error aborts the group before returning.
fn rank_guarded(
    rank: usize,
    comm: &dyn Communicator,
    graphs: (Option<Graph>, Graph),
    params: HashMap<String, Tensor>,
    data: &SyntheticData,
    cfg: &RankCfg,
    events: &mut (dyn FnMut(Event) + Send),
) -> Result<RankOutput> {
    let step = Cell::new(None);
    let out = catch_unwind(AssertUnwindSafe(|| {
        rank_main(rank, comm, graphs, params, data, cfg, events, &step)
    }));
    let out = match out {
        Ok(r) => r,
        Err(payload) => Err(RuntimeError::Rank {
            rank,
            step: step.get(),
            reason: format!("panicked: {}", panic_message(&*payload)),
        }),
    };
    if let Err(e) = &out {
        comm.abort(&e.to_string());
    }
    out
}

/// The worker pool of `rank`: its kernels' parallel loops run on these `threads`
/// only. The rank's code runs *on* one of the workers (`install`, or a task
/// spawned into the pool), so a kernel's parallel loop is a fork-join among the
/// workers, not a hand-over from a thread outside the pool that then sleeps until
/// the loop is done (measured: 300 → 47 context switches per `dlrm-small`
/// training step, 2 threads).
fn rank_pool(rank: usize, threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("dlrm-rank-{rank}-w{i}"))
        .build()
        .map_err(|e| RuntimeError::Rank {
            rank,
            step: None,
            reason: format!("cannot start its {threads} worker threads: {e}"),
        })
}

/// One rank's whole run: steps, evaluation, predictions to rank 0. `step` tracks
/// the training (or inference) step in progress, for error reports.
#[allow(clippy::too_many_arguments)]
fn rank_main(
    rank: usize,
    comm: &dyn Communicator,
    (train, infer): (Option<Graph>, Graph),
    mut params: HashMap<String, Tensor>,
    data: &SyntheticData,
    cfg: &RankCfg,
    send: &mut dyn FnMut(Event),
    at_step: &Cell<Option<u64>>,
) -> Result<RankOutput> {
    let data_err = |step: u64, e: RuntimeError| RuntimeError::Rank {
        rank,
        step: Some(step),
        reason: e.to_string(),
    };
    let is_logged =
        |k: u64| k == cfg.iters || (cfg.log_every > 0 && k.is_multiple_of(cfg.log_every));
    let training = train.is_some();
    let mut exec = match train {
        Some(g) => {
            let p = params_for(&g, &mut params);
            Executor::new(g, p, rank)?
        }
        None => {
            let p = params_for(&infer, &mut params);
            Executor::new(infer.clone(), p, rank)?
        }
    };
    exec.set_backend(cfg.backend, cfg.kernels);
    exec.set_overlap(cfg.overlap);
    let mut out = RankOutput {
        losses: Vec::new(),
        last_loss: None,
        step_times: Vec::with_capacity(cfg.iters as usize),
        scores: Vec::new(),
        op_times: Vec::new(),
        node_times: Vec::new(),
        comm: CommTimes::default(),
        params: HashMap::new(),
        threads: rayon::current_num_threads(),
    };
    let start = Instant::now();
    exec.set_step(1);
    for k in 1..=cfg.iters {
        at_step.set(Some(k));
        let inputs = data
            .inputs_for(k - 1, cfg.global_batch, cfg.ranks, rank, exec.graph())
            .map_err(|e| data_err(k, e))?;
        let syms = step_syms(&exec, &inputs, rank, cfg)?;
        let t0 = Instant::now();
        let outs = exec.step(inputs, &syms, comm)?;
        let dt = t0.elapsed().as_secs_f64();
        out.step_times.push(dt);
        if k == cfg.warmup && cfg.iters > cfg.warmup {
            // The per-op times (--bench) cover the same steps as samples/s: not
            // the warm-up, whose first step compiles and tunes the kernels.
            exec.reset_timers();
        }
        let loss = if training {
            let l = outs
                .first()
                .and_then(|t| t.to_f32_vec().first().copied())
                .ok_or_else(|| RuntimeError::Rank {
                    rank,
                    step: Some(k),
                    reason: "the training graph's first output (the loss) is empty".into(),
                })?;
            if !l.is_finite() {
                return Err(RuntimeError::NonFinite {
                    rank,
                    step: k,
                    value: l,
                });
            }
            out.last_loss = Some(l);
            Some(l)
        } else {
            None
        };
        if is_logged(k) {
            if let Some(l) = loss {
                out.losses.push((k, l));
            }
            send(Event::Step {
                iter: k,
                loss,
                samples_per_s: if dt > 0.0 {
                    cfg.global_batch as f64 / dt
                } else {
                    0.0
                },
                elapsed: start.elapsed(),
            });
        }
    }
    out.op_times = exec.op_times();
    out.node_times = exec.node_times(BENCH_NODES);
    out.comm = exec.comm_times();

    // Evaluation with the trained parameters.
    at_step.set(None);
    let mut eval = if training {
        let mut trained = exec.into_params();
        trained.extend(params.drain());
        params = trained;
        let p = params_for(&infer, &mut params);
        let mut e = Executor::new(infer, p, rank)?;
        e.set_backend(cfg.backend, cfg.kernels);
        e.set_overlap(cfg.overlap);
        e
    } else {
        exec
    };
    let local = batch_slice(cfg.global_batch, cfg.ranks, rank).len();
    let mut preds = Vec::with_capacity(cfg.eval_batches * local);
    for b in 0..cfg.eval_batches {
        let step = eval_step(b as u64);
        let eval_err = |e: RuntimeError| RuntimeError::Rank {
            rank,
            step: None,
            reason: format!("evaluation batch {}: {e}", b + 1),
        };
        let inputs = data
            .inputs_for(step, cfg.global_batch, cfg.ranks, rank, eval.graph())
            .map_err(eval_err)?;
        let syms = step_syms(&eval, &inputs, rank, cfg).map_err(eval_err)?;
        let outs = eval.step(inputs, &syms, comm).map_err(eval_err)?;
        let pred = outs.first().map(Tensor::to_f32_vec).unwrap_or_default();
        if pred.len() != local {
            return Err(eval_err(RuntimeError::Rank {
                rank,
                step: None,
                reason: format!(
                    "the inference graph's first output has {} values for {local} samples (expected one prediction per sample)",
                    pred.len()
                ),
            }));
        }
        preds.extend_from_slice(&pred);
        send(Event::Eval {
            batch: b + 1,
            batches: cfg.eval_batches,
        });
    }
    let mut final_params = eval.into_params();
    final_params.extend(params);
    out.params = final_params;
    let comm_err = |e: dlrm_ir::IrError| RuntimeError::Rank {
        rank,
        step: None,
        reason: e.to_string(),
    };
    // The predictions to rank 0, which joins them in global sample order.
    let mut send_preds = vec![Vec::new(); cfg.ranks];
    send_preds[0] = preds;
    let got = comm.all_to_all_v(send_preds).map_err(comm_err)?;
    if rank == 0 {
        out.scores = join_predictions(got, cfg).map_err(|reason| RuntimeError::Rank {
            rank,
            step: None,
            reason,
        })?;
    }
    // Leave the group together (a late failure elsewhere still reaches us).
    comm.barrier().map_err(comm_err)?;
    Ok(out)
}

/// Rank 0's view of the gathered predictions: `got[r]` is rank r's predictions,
/// batch after batch; returns them in global sample order, batch after batch.
fn join_predictions(got: Vec<Vec<f32>>, cfg: &RankCfg) -> std::result::Result<Vec<f32>, String> {
    let locals: Vec<usize> = (0..cfg.ranks)
        .map(|r| batch_slice(cfg.global_batch, cfg.ranks, r).len())
        .collect();
    for (r, (g, l)) in got.iter().zip(&locals).enumerate() {
        if g.len() != l * cfg.eval_batches {
            return Err(format!(
                "rank {r} sent {} predictions, expected {} ({} batches of {l})",
                g.len(),
                l * cfg.eval_batches,
                cfg.eval_batches
            ));
        }
    }
    let mut scores = Vec::with_capacity(cfg.global_batch * cfg.eval_batches);
    for b in 0..cfg.eval_batches {
        for (g, &l) in got.iter().zip(&locals) {
            scores.extend_from_slice(&g[b * l..(b + 1) * l]);
        }
    }
    Ok(scores)
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    Some(if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    })
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}
