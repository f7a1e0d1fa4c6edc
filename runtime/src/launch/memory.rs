//! Memory planning on a plan: each rank's memory account
//! ([`dlrm_passes::shard::memory`]) from the graphs it runs, the budget it must fit
//! ([`Budget`]: `--mem-per-rank`, or in `dlrm-run` this machine's available memory
//! shared by the ranks it hosts), and the refusal of a job that does not fit, with
//! an estimated rank count, batch and precision that would ([`suggest`]).
//!
//! `dlrmc plan-shards` prints the accounts and refuses a plan that does not fit;
//! `dlrm-run` checks them in [`super::job_for`], after partitioning and
//! before any rank's parameters, executor or data are allocated.
//!
//! The suggestions are estimates: for a rank count `R'` (or a batch), the planner
//! must place the tables in the budget with [`super::shard::reserved_per_rank`]
//! (the unpartitioned graph's non-table account at the local batch) set aside; the
//! asked configuration itself is judged on the partitioned graphs.

use super::Ranks;
use super::shard::{ShardSettings, planner_options};
use crate::error::{Result, RuntimeError};
use dlrm_ir::Graph;
use dlrm_passes::partition::TableInfo;
use dlrm_passes::shard::{self, MemoryAccount, MemoryJob, Suggestion};

/// What one rank may hold, and where that number comes from (for messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Bytes per rank.
    pub bytes: u64,
    /// Where it comes from, e.g. `--mem-per-rank`.
    pub source: String,
    /// `Some(bytes)` when the ranks are threads of one process (`dlrm-run --comm
    /// threads`): more of them add no memory, so a refusal advises more machines,
    /// one rank each with `bytes` ([`Budget::on_threads`]).
    pub per_machine: Option<u64>,
}

impl Budget {
    /// The budget given with `--mem-per-rank`.
    pub fn given(bytes: u64) -> Budget {
        Budget {
            bytes,
            source: "--mem-per-rank".to_string(),
            per_machine: None,
        }
    }

    /// This budget for ranks that are threads of this process: a refusal's advice
    /// is machines with `per_machine` bytes for their one rank (this machine's
    /// available memory, or `--mem-per-rank`), not more threads.
    pub fn on_threads(self, per_machine: u64) -> Budget {
        Budget {
            per_machine: Some(per_machine),
            ..self
        }
    }

    /// This machine's available memory (`MemAvailable` of `/proc/meminfo`) shared
    /// by the `ranks_here` ranks this machine runs.
    pub fn machine(ranks_here: usize) -> Result<Budget> {
        let info = std::fs::read_to_string("/proc/meminfo").map_err(|e| {
            RuntimeError::Options(format!(
                "reading /proc/meminfo for the default memory budget: {e}; give --mem-per-rank"
            ))
        })?;
        let kib = info
            .lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .ok_or_else(|| {
                RuntimeError::Options(
                    "/proc/meminfo has no MemAvailable line for the default memory budget; \
                     give --mem-per-rank"
                        .into(),
                )
            })?;
        let n = ranks_here.max(1) as u64;
        Ok(Budget {
            bytes: kib * 1024 / n,
            source: format!(
                "this machine's available memory {} shared by {n} rank(s) here; \
                 --mem-per-rank sets it",
                shard::human(kib * 1024)
            ),
            per_machine: None,
        })
    }
}

/// The ranks an MPI job runs on this machine: Open MPI's
/// `OMPI_COMM_WORLD_LOCAL_SIZE` (MPICH/Hydra: `MPI_LOCALNRANKS`), else 1.
pub fn mpi_ranks_here() -> usize {
    ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1)
}

/// Each rank's account: of its training graph if it trains, else of its inference
/// graph (the final evaluation runs after training, on the same parameters, and is
/// counted when it needs more).
pub fn rank_accounts(
    train: Option<&[Graph]>,
    infer: &[Graph],
    job: &MemoryJob,
) -> Vec<MemoryAccount> {
    infer
        .iter()
        .enumerate()
        .map(|(r, ig)| {
            let i = shard::account(ig, r, job);
            match train.and_then(|t| t.get(r)) {
                Some(tg) => {
                    let t = shard::account(tg, r, job);
                    if i.total > t.total { i } else { t }
                }
                None => i,
            }
        })
        .collect()
}

/// What [`suggest`] needs to know of the plan.
pub struct Want<'a> {
    /// The graph the placement is computed from (training if any).
    pub graph: &'a Graph,
    /// Its tables.
    pub tables: &'a [TableInfo],
    /// The asked rank count.
    pub ranks: usize,
    /// The global batch.
    pub global_batch: usize,
    /// The planner settings.
    pub settings: &'a ShardSettings,
    /// The budget per rank.
    pub budget: u64,
    /// The plan trains (else inference only).
    pub train: bool,
    /// The plan's precision (`fp32`, `bf16`, ...).
    pub precision: &'a str,
    /// The ranks are threads of one process: the rank count is searched as
    /// machines with this budget for their one rank ([`Budget::per_machine`]).
    pub per_machine: Option<u64>,
}

/// True if the planner places `tables` on `ranks` ranks within `w.budget` with the
/// rest of the rank set aside (see the module docs).
fn fits(w: &Want<'_>, tables: &[TableInfo], ranks: usize, batch: usize) -> bool {
    fits_in(w, w.budget, tables, ranks, batch)
}

/// [`fits`] with another budget per rank.
fn fits_in(w: &Want<'_>, budget: u64, tables: &[TableInfo], ranks: usize, batch: usize) -> bool {
    if batch < ranks || ranks == 0 {
        return false;
    }
    let opts = dlrm_passes::PlannerOptions {
        mem_per_rank: budget,
        reserved_per_rank: super::shard::reserved_per_rank(w.graph, ranks, batch),
        ..planner_options(w.graph, ranks, batch, w.settings)
    };
    opts.reserved_per_rank < budget && shard::plan(tables, &opts).is_ok()
}

/// The smallest rank count above `w.ranks` that [`fits`] (doubling, then a binary
/// search below the first fit; for thread ranks, [`Want::per_machine`], a count of
/// machines above this one, each rank with a machine's budget),
/// the largest global batch below `w.global_batch` that fits on `w.ranks` ranks,
/// and what bf16 tables would change.
pub fn suggest(w: &Want<'_>) -> Suggestion {
    const MAX_RANKS: usize = 1 << 20;
    let limit = w.global_batch.min(MAX_RANKS);
    let scale_budget = w.per_machine.unwrap_or(w.budget);
    let scaled = |ranks: usize| fits_in(w, scale_budget, w.tables, ranks, w.global_batch);
    let mut ranks = None;
    // Known not to fit: the asked ranks at the asked budget; for machines with
    // this machine's whole budget for one rank, this one machine.
    let mut lo = if scale_budget == w.budget { w.ranks } else { 1 };
    let mut hi = lo.saturating_mul(2);
    while lo < limit {
        hi = hi.min(limit);
        if scaled(hi) {
            ranks = Some(hi);
            break;
        }
        lo = hi;
        hi = hi.saturating_mul(2);
    }
    if let Some(mut h) = ranks {
        while h - lo > 1 {
            let mid = lo + (h - lo) / 2;
            if scaled(mid) {
                h = mid;
            } else {
                lo = mid;
            }
        }
        ranks = Some(h);
    }
    // The largest batch on the asked ranks, if any fits.
    let batch = if fits(w, w.tables, w.ranks, w.ranks) {
        let (mut ok, mut bad) = (w.ranks, w.global_batch);
        while bad - ok > 1 {
            let mid = ok + (bad - ok) / 2;
            if fits(w, w.tables, w.ranks, mid) {
                ok = mid;
            } else {
                bad = mid;
            }
        }
        Some(ok)
    } else {
        None
    };
    let f32_tables = w.tables.iter().any(|t| t.elem_bytes == 4);
    let precision = if !f32_tables {
        None
    } else if w.train {
        Some(format!(
            "bf16 tables (dlrmc compile --precision bf16; the plan is {}) would not shrink \
             them in training: Split-SGD-BF16 keeps a 2-byte low half per element",
            w.precision
        ))
    } else {
        let halved: Vec<TableInfo> = w
            .tables
            .iter()
            .map(|t| TableInfo {
                elem_bytes: t.elem_bytes.min(2),
                ..t.clone()
            })
            .collect();
        let ok = fits(w, &halved, w.ranks, w.global_batch);
        Some(format!(
            "bf16 tables (dlrmc compile --precision bf16) would halve them and {} on {} \
             rank(s)",
            if ok {
                "would fit"
            } else {
                "would still not fit"
            },
            w.ranks
        ))
    };
    Suggestion {
        ranks,
        batch,
        precision,
        per_machine: w.per_machine,
    }
}

/// Refuses the job if a rank's account exceeds the budget ([`shard::check`] with
/// [`suggest`]'s advice).
pub fn check(accounts: &[MemoryAccount], budget: &Budget, want: &Want<'_>) -> Result<()> {
    shard::check(accounts, budget.bytes, &budget.source, &|| suggest(want)).map_err(|e| {
        // The reason alone: the refusal is the caller's (`dlrmc plan-shards` or
        // `dlrm-run`), not the planner pass's.
        RuntimeError::Memory(match e {
            dlrm_passes::PassError::Arg { reason, .. } => reason,
            e => e.to_string(),
        })
    })
}

/// The planner could not place the tables in the budget: its reason, with
/// [`suggest`]'s advice.
pub fn placement_refusal(reason: &dlrm_passes::PassError, want: &Want<'_>) -> RuntimeError {
    let advice = suggest(want).clauses(false);
    RuntimeError::Memory(format!(
        "{} tables do not fit {} ranks: {reason}{}{}",
        want.tables.len(),
        want.ranks,
        if advice.is_empty() { "" } else { "; " },
        advice.join("; ")
    ))
}

/// The memory budget of a rank, for both the placement of the tables and the
/// check: `mem_per_rank` (`--mem-per-rank`), else this machine's available memory
/// shared by the ranks it runs. Thread ranks share one process's memory (a refusal
/// advises more machines, not more threads); MPI processes take the smallest
/// budget of all (a collective of `place`'s group), so that every process places
/// the tables alike. `None` only when `optional` (no memory check) and the
/// machine's memory cannot be read (the planner's default then places the tables).
pub fn run_budget(
    mem_per_rank: Option<u64>,
    ranks: usize,
    place: &Ranks<'_>,
    optional: bool,
) -> Result<Option<Budget>> {
    let here = match place {
        Ranks::Threads => ranks,
        Ranks::Process(_) => mpi_ranks_here(),
    };
    let budget = match mem_per_rank {
        Some(b) => Budget::given(b),
        None => match Budget::machine(here) {
            Ok(b) => b,
            Err(_) if optional => return Ok(None),
            Err(e) => return Err(e),
        },
    };
    Ok(Some(match place {
        Ranks::Threads => {
            let machine = match mem_per_rank {
                Some(b) => b,
                None => budget.bytes.saturating_mul(here as u64),
            };
            budget.on_threads(machine)
        }
        Ranks::Process(comm) if mem_per_rank.is_none() => {
            // In MiB, exact in f32 up to 16 TiB; each process its own slot.
            let mib = (budget.bytes >> 20).min(1 << 24) as f32;
            let mut all = vec![0f32; comm.size()];
            all[comm.rank()] = mib;
            comm.all_reduce_sum(&mut all)?;
            let least = all.iter().copied().fold(f32::INFINITY, f32::min) as u64;
            Budget {
                bytes: least << 20,
                source: format!("{}, the least of the job's processes", budget.source),
                ..budget
            }
        }
        Ranks::Process(_) => budget,
    }))
}
