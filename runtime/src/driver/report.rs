//! The outcome of a job: the [`Report`], its `--bench` table, and how rank 0 builds
//! it from its output.

use super::{Mode, RankCfg, RankOutput};
use crate::exec::{Backend, OpTime};
use crate::metrics::EvalMetrics;
use crate::progress::CommTimes;
use serde::Serialize;
use std::time::Instant;

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
    /// AUC of the final evaluation: the held-out batches (synthetic data) or the test
    /// split (`None` if undefined or no evaluation).
    pub auc: Option<f64>,
    /// Accuracy at threshold 0.5 on the held-out batches.
    pub accuracy: Option<f64>,
    /// Log loss (mean binary cross entropy) of the final evaluation.
    pub log_loss: Option<f64>,
    /// Normalized entropy of the final evaluation.
    pub ne: Option<f64>,
    /// The set of the final evaluation (`heldout`, or the test split's name).
    pub eval_split: String,
    /// The evaluations during training (`--eval-every`), in step order.
    pub evals: Vec<EvalMetrics>,
    /// The best AUC of the evaluations during training and its step.
    pub best: Option<BestAuc>,
    /// Training steps per epoch of a dataset (`None`: synthetic data).
    pub steps_per_epoch: Option<u64>,
    /// Dataset samples left out for a non-finite dense value or a label outside
    /// {0, 1} (`--on-nonfinite skip`; 0 otherwise).
    pub skipped_samples: u64,
    /// Samples evaluated.
    pub eval_samples: usize,
    /// Wall time of the whole run, in seconds.
    pub wall_s: f64,
    /// Rank 0's time per op kind during the timed steps (evaluation and
    /// warm-up excluded).
    pub op_times: Vec<OpTime>,
    /// Rank 0's time per node during the timed steps, every node that ran,
    /// most expensive first (the `--bench` table shows the first
    /// [`BENCH_NODES`]; the roofline bounds each node's work on its own).
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
    /// The AVX-512 BF16 kernel's tile rate over the FMA kernel's, where this
    /// run measured it ([`dlrm_codegen::jit::micro::probe`]).
    pub bf16_dot_speedup: Option<f64>,
    /// Whether collectives overlapped compute.
    pub overlap: bool,
    /// How the communicator all-reduces (the thread group's algorithm, or MPI's).
    pub allreduce: String,
    /// Rank 0's collective time during the steps (in flight vs blocking it).
    pub comm: CommTimes,
    /// This process's peak resident memory at the end of the run, bytes
    /// ([`crate::metrics::peak_rss_bytes`]; `None` where the OS does not say).
    pub peak_rss_bytes: Option<u64>,
    /// The roofline report of the timed steps (`dlrm-run --bench`: the caller
    /// measures the machine and fills it in, [`crate::roofline`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roofline: Option<crate::roofline::Roofline>,
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
            for t in self.node_times.iter().take(BENCH_NODES) {
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
        if let Some(r) = &self.roofline {
            s.push_str(&r.table());
        }
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
        if let Some(r) = self.bf16_dot_speedup {
            let (verdict, pays) = (
                if r >= dlrm_codegen::jit::micro::probe::PAYS {
                    "taken"
                } else {
                    "not taken"
                },
                dlrm_codegen::jit::micro::probe::PAYS,
            );
            s.push_str(&format!(
                "AVX-512 BF16 kernel: {r:.2}x the AVX-512 FMA kernel's tile rate on this CPU, \
                 so {verdict} for bf16 GEMMs under `auto` (from {pays}x)\n"
            ));
        }
        s
    }
}

/// The best AUC seen by the evaluations during training.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BestAuc {
    /// The step it followed.
    pub iter: u64,
    /// The AUC.
    pub auc: f64,
}

/// Nodes in the `--bench` table of the heaviest nodes ([`Report::node_times`]).
pub const BENCH_NODES: usize = 12;

/// Rank 0's report from its output (which holds the evaluations' metrics).
/// `allreduce` names the communicator's all-reduce
/// ([`dlrm_ir::Communicator::all_reduce_algo`]).
pub(super) fn report(rank0: &RankOutput, cfg: &RankCfg, wall: Instant, allreduce: &str) -> Report {
    let last = rank0.final_metrics.as_ref();
    let best = rank0
        .evals
        .iter()
        .filter_map(|m| m.auc.map(|auc| BestAuc { iter: m.iter, auc }))
        .fold(None::<BestAuc>, |b, m| match b {
            Some(b) if b.auc >= m.auc => Some(b),
            _ => Some(m),
        });
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
        auc: last.and_then(|m| m.auc),
        accuracy: last.and_then(|m| m.accuracy),
        log_loss: last.and_then(|m| m.log_loss),
        ne: last.and_then(|m| m.ne),
        eval_samples: last.map_or(0, |m| m.samples),
        eval_split: last.map_or_else(String::new, |m| m.split.clone()),
        evals: rank0.evals.clone(),
        best,
        steps_per_epoch: cfg.steps_per_epoch,
        skipped_samples: cfg.skipped,
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
        bf16_dot_speedup: dlrm_codegen::jit::micro::probe::bf16_dot_measured(),
        overlap: cfg.overlap,
        allreduce: allreduce.to_string(),
        comm: rank0.comm,
        peak_rss_bytes: crate::metrics::peak_rss_bytes(),
        roofline: None,
    }
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
