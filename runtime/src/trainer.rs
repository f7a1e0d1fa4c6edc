//! A plan trained from Rust: loaded once, set up by a builder, run on N ranks.
//!
//! A [`Trainer`] reads a plan (or a checkpoint's trained model), takes the run's
//! options (ranks, data, steps, learning-rate schedule, checkpoints, kernels)
//! with the defaults of `dlrm-run`, then at [`Trainer::run`] places the tables
//! and partitions the graphs for the ranks ([`crate::launch`]), checks every
//! rank's memory against its budget before allocating anything, and runs the job
//! on threads of this process, returning the driver's [`Report`].
//! [`Trainer::job`] stops before running, for a caller that runs one rank of a
//! multi-process group ([`Ranks::Process`], e.g. MPI) or inspects the job first.
//! [`crate::Session`] serves a plan's inference graph instead.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("tiny.plan");
//! # let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/dlrm-tiny.json");
//! # let m = dlrm_json::load(tiny)?;
//! # let config = dlrm_passes::TrainConfig { loss: dlrm_passes::LossKind::Bce, lr: 0.1,
//! #     optimizer: Default::default() };
//! # let opts = dlrm_passes::PipelineOptions { train: Some(config), ..Default::default() };
//! # let (train, _) = dlrm_passes::compile(m.graph.clone(), &opts, &mut |_, _| {})?;
//! # let (infer, _) = dlrm_passes::compile(m.graph, &Default::default(), &mut |_, _| {})?;
//! # let params = m.params.into_iter().map(|(n, t)| (n, dlrm_ir::ParamValue::Stored(t))).collect();
//! # let training = dlrm_runtime::Training { loss: "bce".into(), optimizer: "sgd".into(),
//! #     learning_rate: 0.1, batch_size: 8, seed: 1 };
//! # let plan = dlrm_runtime::Plan { name: "tiny".into(), infer, train: Some(train), params,
//! #     training, precision: "fp32".into(), pass_log: serde_json::Value::Null,
//! #     contract: Default::default() };
//! # dlrm_runtime::write_plan(&path, &plan)?;
//! use dlrm_runtime::{LrPolicy, Trainer};
//!
//! let report = Trainer::open(&path)? // a plan or a checkpoint directory
//!     .ranks(2) // two threads of this process, each with half of every batch
//!     .steps(20) // on synthetic data (`.data(DataConfig::new(ds))`: a dataset)
//!     .lr_policy(LrPolicy::Poly { warmup_steps: 5, decay_start: 10, decay_steps: 10 })
//!     .memory_budget(256 << 20) // bytes per rank (default: this machine's memory)
//!     .run(&mut |_event| {})?; // progress: steps, evaluations, checkpoints
//! assert_eq!((report.ranks, report.iters), (2, 20));
//! assert!(report.final_loss.is_some_and(f32::is_finite));
//! assert!(report.auc.is_some()); // evaluated on held-out batches after training
//! # Ok(())
//! # }
//! ```

use crate::checkpoint::{Checkpoint, is_checkpoint};
use crate::dataset::DataConfig;
use crate::driver::{Event, Job, Report, RunSettings, run};
use crate::error::Result;
use crate::exec::{Backend, KernelChoice};
use crate::launch::memory::run_budget;
use crate::launch::shard::ShardSettings;
use crate::launch::{CheckpointOptions, Ranks, RunOptions, job_for, resume_note};
use crate::lr_schedule::LrPolicy;
use crate::plan::{Plan, read_plan};
use std::path::Path;
use std::sync::Arc;

/// A plan and how to train it (module docs). Built with [`Trainer::open`] or
/// [`Trainer::new`], set up with its builder methods, run with [`Trainer::run`].
pub struct Trainer {
    plan: Plan,
    /// The checkpoint [`Trainer::open`] read the plan from, if it was one.
    opened: Option<Arc<Checkpoint>>,
    /// The options passed on to [`job_for`]; `iters`, `epochs`, the budget and
    /// the planner's memory are resolved at [`Trainer::job`].
    opts: RunOptions,
    /// [`Trainer::steps`], if given.
    steps: Option<u64>,
    /// [`Trainer::memory_budget`], if given.
    mem_per_rank: Option<u64>,
    /// [`Trainer::memory_check`].
    memory_check: bool,
}

impl Trainer {
    /// Loads the plan or checkpoint at `path`: a checkpoint (`DIR/step-<n>`, or a
    /// checkpoint root: its newest) runs as its plan with its trained parameters,
    /// read on demand (each rank reads only the rows it holds). Training it goes
    /// on from its parameters as a new run unless it is also given to
    /// [`Trainer::resume`] (see [`Trainer::opened_checkpoint`]).
    pub fn open(path: &Path) -> Result<Trainer> {
        if is_checkpoint(path) && !path.join("weights.safetensors").is_file() {
            let c = Arc::new(Checkpoint::open(path)?);
            let mut t = Trainer::new(c.to_plan_on_demand()?);
            t.opened = Some(c);
            Ok(t)
        } else {
            Ok(Trainer::new(read_plan(path)?))
        }
    }

    /// A trainer of `plan` with the defaults: one rank, 100 steps of synthetic
    /// data, the plan's seed, batch and learning rate, no checkpoints, the default
    /// kernels, the tables placed and the memory checked in this machine's
    /// available memory shared by the ranks.
    pub fn new(plan: Plan) -> Trainer {
        Trainer {
            plan,
            opened: None,
            opts: RunOptions::default(),
            steps: None,
            mem_per_rank: None,
            memory_check: true,
        }
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The plan, taken back (e.g. to serve it with [`crate::Session`] instead).
    pub fn into_plan(self) -> Plan {
        self.plan
    }

    /// The checkpoint [`Trainer::open`] loaded, if `path` was one.
    pub fn opened_checkpoint(&self) -> Option<&Arc<Checkpoint>> {
        self.opened.as_ref()
    }

    /// A note if the plan's graphs are not the ones the checkpoint resumed from
    /// was written with (same parameters, other graphs).
    pub fn resume_note(&self) -> Option<String> {
        resume_note(&self.plan, self.opts.resume.as_deref()?)
    }

    /// Every run setting at once (ranks, data, logging, evaluation, kernels,
    /// threads, ...); the builder methods below change one of them, so give this
    /// first.
    pub fn settings(mut self, settings: RunSettings) -> Trainer {
        self.opts.settings = settings;
        self
    }

    /// Ranks (threads of this process at [`Trainer::run`]); a group's size under
    /// [`Ranks::Process`].
    pub fn ranks(mut self, ranks: usize) -> Trainer {
        self.opts.settings.ranks = ranks;
        self
    }

    /// Train on this dataset instead of synthetic data.
    pub fn data(mut self, data: DataConfig) -> Trainer {
        self.opts.settings.data = Some(data);
        self
    }

    /// Kernels: the backend and the JIT's GEMM micro-kernel.
    pub fn backend(mut self, backend: Backend, kernels: KernelChoice) -> Trainer {
        self.opts.settings.backend = backend;
        self.opts.settings.kernels = kernels;
        self
    }

    /// Steps to run (default 100; resuming, the checkpointed run's last step); the
    /// total of the run when resuming.
    pub fn steps(mut self, steps: u64) -> Trainer {
        self.steps = Some(steps);
        self
    }

    /// With [`Trainer::data`] and no [`Trainer::steps`]: this many epochs of its
    /// training split.
    pub fn epochs(mut self, epochs: u64) -> Trainer {
        self.opts.epochs = Some(epochs);
        self
    }

    /// Seed of the synthetic data (default: the plan's).
    pub fn seed(mut self, seed: u64) -> Trainer {
        self.opts.seed = Some(seed);
        self
    }

    /// Global batch, the same whatever the rank count (default: the plan's).
    pub fn batch_size(mut self, batch: usize) -> Trainer {
        self.opts.batch_size = Some(batch);
        self
    }

    /// Run inference on the held-out data instead of training (`dlrm-run --infer`).
    pub fn infer(mut self, infer: bool) -> Trainer {
        self.opts.infer = infer;
        self
    }

    /// The base learning rate (default: the rate the plan was compiled with).
    pub fn lr(mut self, lr: f32) -> Trainer {
        self.opts.lr = Some(lr);
        self
    }

    /// How the learning rate moves with the step (default: constant).
    pub fn lr_policy(mut self, policy: LrPolicy) -> Trainer {
        self.opts.lr_policy = Some(policy);
        self
    }

    /// Write checkpoints while training.
    pub fn checkpoint(mut self, checkpoint: CheckpointOptions) -> Trainer {
        self.opts.checkpoint = Some(checkpoint);
        self
    }

    /// Continue the run of this checkpoint: its parameters, seed, batch and
    /// schedule, from its step + 1.
    pub fn resume(mut self, checkpoint: Arc<Checkpoint>) -> Trainer {
        self.opts.resume = Some(checkpoint);
        self
    }

    /// The sharding planner's settings (network, machine, buckets); its
    /// `mem_per_rank` is replaced by the memory budget.
    pub fn shards(mut self, shards: ShardSettings) -> Trainer {
        self.opts.shards = shards;
        self
    }

    /// Bytes one rank may hold: the tables are placed in it and the job refused if
    /// a rank's memory account exceeds it (default: this machine's available
    /// memory shared by the ranks it runs).
    pub fn memory_budget(mut self, bytes: u64) -> Trainer {
        self.mem_per_rank = Some(bytes);
        self
    }

    /// Check every rank's memory account against the budget (default: true); the
    /// tables are placed in the budget either way.
    pub fn memory_check(mut self, check: bool) -> Trainer {
        self.memory_check = check;
        self
    }

    /// The job: the plan placed and partitioned for the ranks (`place`'s group size
    /// under [`Ranks::Process`]; the budget is then the least of the group's, a
    /// collective), its memory checked; nothing of the run is allocated yet. Run it
    /// with [`crate::launch::run_job`] on the same `place`.
    pub fn job(self, place: &Ranks<'_>) -> Result<Job> {
        let mut opts = self.opts;
        if let Ranks::Process(comm) = place {
            opts.settings.ranks = comm.size();
        }
        let resumed_last = opts.resume.as_ref().map(|c| c.manifest().last_step);
        opts.iters = self.steps.or(resumed_last).unwrap_or(opts.iters);
        if self.steps.is_some() {
            opts.epochs = None;
        }
        let ranks = opts.settings.ranks;
        let budget = run_budget(self.mem_per_rank, ranks, place, !self.memory_check)?;
        // One budget: the tables are placed in what the check allows.
        opts.shards.mem_per_rank = budget
            .as_ref()
            .map_or(ShardSettings::default().mem_per_rank, |b| b.bytes);
        opts.memory_budget = budget.filter(|_| self.memory_check);
        job_for(self.plan, &opts)
    }

    /// Runs the job on threads of this process; `on_event` sees its progress.
    pub fn run(self, on_event: &mut dyn FnMut(&Event)) -> Result<Report> {
        run(self.job(&Ranks::Threads)?, on_event)
    }
}
