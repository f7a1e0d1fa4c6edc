//! The sharding planner: where each embedding table lives on N ranks, chosen by a
//! cost model (`docs/parallel.md` describes the hybrid-parallel step it plans for).
//!
//! Three placements per table ([`ShardKind`]):
//! - **table-wise**: the whole table on one rank, which looks up its bags for the
//!   whole global batch `G` and scatters the results with `all_to_all`;
//! - **row-wise**: the table split by contiguous row ranges over `k >= 2` distinct
//!   ranks; each shard looks up, for the whole global batch, only the indices in its
//!   range (`embedding_bag_rows`), the partial sums go through the same `all_to_all`
//!   and are added on the receiving rank; in backward each shard receives the bag
//!   gradient and updates only its rows. For tables larger than a rank's memory
//!   budget, or hot tables that alone would exceed the average rank's load;
//! - **data-parallel**: the table replicated on every rank, looked up locally for
//!   the rank's own samples; its dense gradient (`embedding_grad_dense`) is
//!   all-reduced and every rank applies the same `sgd`. For tiny tables, where the
//!   all-reduce of the whole table costs less than the exchange it saves.
//!
//! [`plan`] is a function of the table list and [`PlannerOptions`] only (not of the
//! graph's dense part, not of whether it is the training or the inference graph), so
//! both graphs of one model place identically; it always plans for a training step.
//! The cost model is in [`cost`], the placement algorithm in [`planner`], the
//! per-rank predictions and the scaling curve in [`report`].
//!
//! Invariants of a [`ShardPlan`]: one [`TablePlan`] per table, in table order;
//! table-wise: one shard covering `0..rows`; row-wise: `k >= 2` shards in row
//! order, contiguous, covering `0..rows`, non-empty, on distinct ranks;
//! data-parallel: no shards (every rank). A row-wise Split-SGD-BF16 table has its
//! low half split at the same rows (`split_embedding_update_rows`).

pub mod cost;
pub mod memory;
pub mod planner;
pub mod report;

pub use cost::{CostModel, DenseProfile, Machine, Network};
pub use memory::{MemoryAccount, MemoryJob, Suggestion, account, check, human, memory_table};
pub use planner::plan;
pub use report::{
    Prediction, RankPrediction, ScalePoint, predict, rank_counts, scaling, scaling_table,
};

use crate::partition::TableInfo;
use crate::{PassError, Result};

/// The most ranks a plan is partitioned for or a shard plan places tables on
/// (`--ranks`): 65536. Per-rank tables are sized by the rank count, so a larger
/// one is refused before anything is allocated.
pub const MAX_RANKS: usize = 1 << 16;

/// Refuses a rank count above [`MAX_RANKS`], naming the flag and the value.
pub fn check_rank_count(ranks: usize) -> std::result::Result<(), String> {
    if ranks > MAX_RANKS {
        return Err(format!(
            "--ranks {ranks} is more than the {MAX_RANKS} ranks dlrmc supports"
        ));
    }
    Ok(())
}
use serde::{Deserialize, Serialize};
use std::fmt;

/// The id used in errors.
pub const ID: &str = "plan-shards";

/// How a table is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShardKind {
    /// The whole table on one rank.
    TableWise,
    /// Row ranges on several ranks.
    RowWise,
    /// Replicated on every rank.
    DataParallel,
}

impl ShardKind {
    /// `table-wise`, `row-wise` or `data-parallel`.
    pub fn name(self) -> &'static str {
        match self {
            ShardKind::TableWise => "table-wise",
            ShardKind::RowWise => "row-wise",
            ShardKind::DataParallel => "data-parallel",
        }
    }
}

/// The rows `lo..hi` of a table, held by `rank`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// The rank holding the rows.
    pub rank: usize,
    /// First row.
    pub lo: usize,
    /// One past the last row.
    pub hi: usize,
}

/// The placement of one table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TablePlan {
    /// The table parameter's name.
    pub table: String,
    /// Table-wise, row-wise or data-parallel.
    pub kind: ShardKind,
    /// The shards (see the module docs); empty for data-parallel.
    pub shards: Vec<Shard>,
}

/// Where every table lives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardPlan {
    /// The rank count.
    pub ranks: usize,
    /// One entry per table, in table order.
    pub tables: Vec<TablePlan>,
}

impl ShardPlan {
    /// The plan of `table`.
    pub fn get(&self, table: &str) -> Option<&TablePlan> {
        self.tables.iter().find(|t| t.table == table)
    }

    /// The owner of a table-wise `table`.
    pub fn owner(&self, table: &str) -> Option<usize> {
        self.get(table)
            .filter(|t| t.kind == ShardKind::TableWise)
            .and_then(|t| t.shards.first())
            .map(|s| s.rank)
    }

    /// Checks the invariants (module docs) against the tables.
    pub fn check(&self, tables: &[TableInfo]) -> Result<()> {
        let err = |reason: String| PassError::Arg {
            pass: ID.to_string(),
            reason,
        };
        if self.ranks == 0 {
            return Err(err("the rank count must be at least 1".into()));
        }
        check_rank_count(self.ranks).map_err(err)?;
        if self.tables.len() != tables.len() {
            return Err(err(format!(
                "the plan places {} tables, the graph has {}",
                self.tables.len(),
                tables.len()
            )));
        }
        for (p, t) in self.tables.iter().zip(tables) {
            if p.table != t.name {
                return Err(err(format!(
                    "the plan places `{}` where the graph has table `{}`",
                    p.table, t.name
                )));
            }
            let ok = match p.kind {
                ShardKind::DataParallel => p.shards.is_empty(),
                ShardKind::TableWise => {
                    p.shards.len() == 1 && p.shards[0].lo == 0 && p.shards[0].hi == t.rows
                }
                ShardKind::RowWise => {
                    let mut ranks: Vec<usize> = p.shards.iter().map(|s| s.rank).collect();
                    ranks.sort_unstable();
                    ranks.dedup();
                    p.shards.len() >= 2
                        && ranks.len() == p.shards.len()
                        && p.shards.first().is_some_and(|s| s.lo == 0)
                        && p.shards.last().is_some_and(|s| s.hi == t.rows)
                        && p.shards.windows(2).all(|w| w[0].hi == w[1].lo)
                        && p.shards.iter().all(|s| s.lo < s.hi)
                }
            };
            if !ok {
                return Err(err(format!(
                    "bad {} placement of `{}` ({} rows): {:?}",
                    p.kind.name(),
                    p.table,
                    t.rows,
                    p.shards
                )));
            }
            if p.shards.iter().any(|s| s.rank >= self.ranks) {
                return Err(err(format!(
                    "`{}` is placed on a rank >= {}",
                    p.table, self.ranks
                )));
            }
        }
        Ok(())
    }
}

impl fmt::Display for ShardPlan {
    /// One line per table: `emb.0: row-wise 0..50000@r0 50000..100000@r1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for t in &self.tables {
            write!(f, "{}: {}", t.table, t.kind.name())?;
            for s in &t.shards {
                write!(f, " {}..{}@r{}", s.lo, s.hi, s.rank)?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// What the planner optimises for.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannerOptions {
    /// Rank count.
    pub ranks: usize,
    /// Global batch (samples per step over all ranks).
    pub global_batch: usize,
    /// Bytes one rank may hold (default [`DEFAULT_MEM_PER_RANK`]): its tables and
    /// `reserved_per_rank`.
    pub mem_per_rank: u64,
    /// Bytes every rank needs besides its tables (dense parameters and their state,
    /// activations, gradients, buffers: [`memory`]); set aside before tables are
    /// placed. 0: tables may take the whole budget.
    #[serde(default)]
    pub reserved_per_rank: u64,
    /// The network between ranks.
    pub network: Network,
    /// One rank's compute and memory rates.
    pub machine: Machine,
}

/// Default `--mem-per-rank` of the planner: 16 GiB per rank.
pub const DEFAULT_MEM_PER_RANK: u64 = 16 << 30;

impl PlannerOptions {
    /// The defaults for `ranks` ranks and a global batch.
    pub fn new(ranks: usize, global_batch: usize) -> PlannerOptions {
        PlannerOptions {
            ranks,
            global_batch,
            mem_per_rank: DEFAULT_MEM_PER_RANK,
            reserved_per_rank: 0,
            network: Network::default(),
            machine: Machine::default(),
        }
    }
}

fn arg_err(reason: String) -> PassError {
    PassError::Arg {
        pass: ID.to_string(),
        reason,
    }
}

/// Parses a byte count: a number with an optional unit `B`, `KB`/`MB`/`GB`/`TB`
/// (powers of 1000) or `KiB`/`MiB`/`GiB`/`TiB` (powers of 1024), e.g. `512MiB`.
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| arg_err(format!("bad byte count `{s}` (e.g. 512MiB, 2GB, 1000000)")))?;
    let mul: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0f64.powi(4),
        other => {
            return Err(arg_err(format!(
                "bad byte unit `{other}` in `{s}` (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
            )));
        }
    };
    let bytes = v * mul;
    if !bytes.is_finite() || bytes < 1.0 {
        return Err(arg_err(format!(
            "the byte count `{s}` must be at least 1 byte"
        )));
    }
    Ok(bytes as u64)
}

/// Parses two positive numbers `a,b`.
pub(crate) fn parse_pair(s: &str, what: &str, example: &str) -> Result<(f64, f64)> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let nums: Option<Vec<f64>> = parts.iter().map(|p| p.parse::<f64>().ok()).collect();
    match nums.as_deref() {
        Some(&[a, b]) if a.is_finite() && b.is_finite() && a >= 0.0 && b > 0.0 => Ok((a, b)),
        _ => Err(arg_err(format!(
            "bad {what} `{s}`: expected two numbers, e.g. `{example}`"
        ))),
    }
}
