//! Predictions of a [`ShardPlan`]: each rank's tables, bytes, share of the
//! lookups, and predicted compute and communication time per step
//! ([`predict`]); the predicted weak and strong scaling efficiency from 1 to N
//! ranks ([`scaling`]), each rank count planned afresh.
//!
//! Strong scaling keeps the global batch `G`: efficiency `T(1) / (R·T(R))`.
//! Weak scaling keeps the local batch `b = G/N` (N the largest rank count asked
//! for): global batch `b·R`, efficiency `T(1, b) / T(R, b·R)` (see [`scaling`] for
//! rank counts whose plan is infeasible). The step time is the
//! slowest rank's (the ranks synchronise in every collective).

use super::cost::{CostModel, DenseProfile};
use super::{PlannerOptions, ShardKind, ShardPlan, plan};
use crate::Result;
use crate::partition::TableInfo;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One rank's predicted step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankPrediction {
    /// The rank.
    pub rank: usize,
    /// Its tables: `emb.0`, `emb.3[0..50000]` (a row range), `emb.7*` (replicated).
    pub tables: Vec<String>,
    /// Bytes of table storage on the rank.
    pub table_bytes: u64,
    /// Its share of the step's embedding lookups (0..1).
    pub lookup_share: f64,
    /// Dense (MLP, interaction, loss) compute, ms.
    pub dense_ms: f64,
    /// Embedding lookups and updates, ms.
    pub embedding_ms: f64,
    /// `all_to_all` exchanges, ms.
    pub all_to_all_ms: f64,
    /// `all_reduce`s (dense gradients, replicated tables, loss), ms.
    pub all_reduce_ms: f64,
    /// `dense_ms + embedding_ms`.
    pub compute_ms: f64,
    /// `all_to_all_ms + all_reduce_ms`.
    pub comm_ms: f64,
    /// `compute_ms + comm_ms`.
    pub total_ms: f64,
}

/// A plan's predicted step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Rank count.
    pub ranks: usize,
    /// Global batch.
    pub global_batch: usize,
    /// Training step (else inference).
    pub train: bool,
    /// The placement.
    pub plan: ShardPlan,
    /// Per rank.
    pub per_rank: Vec<RankPrediction>,
    /// The slowest rank's time, ms.
    pub step_ms: f64,
    /// `global_batch / step`.
    pub samples_per_s: f64,
}

/// One rank count of the scaling curve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScalePoint {
    /// Rank count.
    pub ranks: usize,
    /// Step time at the fixed global batch, ms (`None`: no feasible plan).
    pub strong_step_ms: Option<f64>,
    /// Strong scaling efficiency.
    pub strong_efficiency: Option<f64>,
    /// Global batch of the weak-scaling step.
    pub weak_global_batch: usize,
    /// Step time at the fixed local batch, ms (`None`: no feasible plan).
    pub weak_step_ms: Option<f64>,
    /// Weak scaling efficiency.
    pub weak_efficiency: Option<f64>,
}

/// Predicts every rank's step for `plan` (see [`super::cost`]).
pub fn predict(
    tables: &[TableInfo],
    dense: &DenseProfile,
    plan: &ShardPlan,
    opts: &PlannerOptions,
) -> Prediction {
    let r = plan.ranks.max(1);
    let opts = PlannerOptions { ranks: r, ..*opts };
    let cm = CostModel::new(opts, dense.train);
    let (dense_c, dense_m) = cm.dense(dense);
    let g = opts.global_batch as f64;
    let b = g / r as f64;
    let total_lookups: f64 = tables.iter().map(|t| g * t.lookups_per_sample as f64).sum();
    let mut per = vec![
        RankPrediction {
            rank: 0,
            tables: Vec::new(),
            table_bytes: 0,
            lookup_share: 0.0,
            dense_ms: dense_c * 1e3,
            embedding_ms: 0.0,
            all_to_all_ms: 0.0,
            all_reduce_ms: dense_m * 1e3,
            compute_ms: 0.0,
            comm_ms: 0.0,
            total_ms: 0.0,
        };
        r
    ];
    let mut sent = vec![0.0f64; r];
    let mut held_recv = vec![0.0f64; r];
    let mut total_recv = 0.0f64;
    let mut lookups = vec![0.0f64; r];
    for (p, t) in plan.tables.iter().zip(tables) {
        let row_bytes = (t.dim * t.elem_bytes) as u64;
        match p.kind {
            ShardKind::DataParallel => {
                let (c, m) = cm.replicated(t);
                for (k, rp) in per.iter_mut().enumerate() {
                    rp.tables.push(format!("{}*", t.name));
                    rp.table_bytes += t.rows as u64 * row_bytes;
                    rp.embedding_ms += c * 1e3;
                    rp.all_reduce_ms += m * 1e3;
                    lookups[k] += b * t.lookups_per_sample as f64;
                }
            }
            ShardKind::TableWise | ShardKind::RowWise => {
                for s in &p.shards {
                    let f = (s.hi - s.lo) as f64 / t.rows.max(1) as f64;
                    let rp = &mut per[s.rank];
                    rp.tables.push(if p.kind == ShardKind::TableWise {
                        t.name.clone()
                    } else {
                        format!("{}[{}..{}]", t.name, s.lo, s.hi)
                    });
                    rp.table_bytes += (s.hi - s.lo) as u64 * row_bytes;
                    rp.embedding_ms += cm.shard_compute(t, f) * 1e3;
                    lookups[s.rank] += f * g * t.lookups_per_sample as f64;
                    sent[s.rank] += cm.unit_send_bytes(t);
                    held_recv[s.rank] += cm.unit_recv_bytes(t);
                    total_recv += cm.unit_recv_bytes(t);
                }
            }
        }
    }
    for (k, rp) in per.iter_mut().enumerate() {
        rp.rank = k;
        rp.lookup_share = if total_lookups > 0.0 {
            lookups[k] / total_lookups
        } else {
            0.0
        };
        rp.all_to_all_ms = cm.all_to_all(sent[k], (total_recv - held_recv[k]).max(0.0)) * 1e3;
        rp.compute_ms = rp.dense_ms + rp.embedding_ms;
        rp.comm_ms = rp.all_to_all_ms + rp.all_reduce_ms;
        rp.total_ms = rp.compute_ms + rp.comm_ms;
    }
    let step_ms = per.iter().map(|p| p.total_ms).fold(0.0, f64::max);
    Prediction {
        ranks: r,
        global_batch: opts.global_batch,
        train: dense.train,
        plan: plan.clone(),
        per_rank: per,
        step_ms,
        samples_per_s: if step_ms > 0.0 {
            g / (step_ms * 1e-3)
        } else {
            0.0
        },
    }
}

/// The rank counts of a scaling curve up to `n`: 1, 2, 4, .. and `n` itself.
pub fn rank_counts(n: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut k = 1usize;
    while k < n {
        v.push(k);
        k = k.saturating_mul(2);
    }
    v.push(n.max(1));
    v
}

/// The predicted scaling from 1 to `opts.ranks` ranks (module docs). A rank count
/// whose plan is infeasible (tables do not fit `mem_per_rank`, fewer samples than
/// ranks) has no times; efficiencies are then relative to the smallest feasible
/// rank count `r0` (`r0·T(r0) / (R·T(R))`, and `T(r0, b·r0) / T(R, b·R)`).
pub fn scaling(
    tables: &[TableInfo],
    dense: &DenseProfile,
    opts: &PlannerOptions,
) -> Result<Vec<ScalePoint>> {
    let n = opts.ranks.max(1);
    let local = (opts.global_batch / n).max(1);
    let step = |ranks: usize, batch: usize| -> Option<f64> {
        let o = PlannerOptions {
            ranks,
            global_batch: batch,
            ..*opts
        };
        let p = plan(tables, &o).ok()?;
        Some(predict(tables, dense, &p, &o).step_ms)
    };
    let mut out = Vec::new();
    let mut strong0: Option<(usize, f64)> = None;
    let mut weak0: Option<(usize, f64)> = None;
    for r in rank_counts(n) {
        let strong = step(r, opts.global_batch);
        let weak = step(r, local * r);
        if strong0.is_none() {
            strong0 = strong.map(|t| (r, t));
        }
        if weak0.is_none() {
            weak0 = weak.map(|t| (r, t));
        }
        out.push(ScalePoint {
            ranks: r,
            strong_step_ms: strong,
            strong_efficiency: strong
                .zip(strong0)
                .map(|(t, (r0, t0))| r0 as f64 * t0 / (r as f64 * t)),
            weak_global_batch: local * r,
            weak_step_ms: weak,
            weak_efficiency: weak.zip(weak0).map(|(t, (_, t0))| t0 / t),
        });
    }
    Ok(out)
}

impl fmt::Display for Prediction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} step, {} rank{}, global batch {}: predicted {:.3} ms/step, {:.0} samples/s",
            if self.train { "training" } else { "inference" },
            self.ranks,
            if self.ranks == 1 { "" } else { "s" },
            self.global_batch,
            self.step_ms,
            self.samples_per_s
        )?;
        writeln!(
            f,
            "{:>5} {:>10} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}  tables (name[rows]: row-wise, name*: replicated)",
            "rank", "MiB", "lookups", "dense ms", "emb ms", "a2a ms", "allred ms", "total ms"
        )?;
        for p in &self.per_rank {
            let tables = if p.tables.is_empty() {
                "-".to_string()
            } else {
                p.tables.join(", ")
            };
            writeln!(
                f,
                "{:>5} {:>10.2} {:>7.1}% {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}  {tables}",
                p.rank,
                p.table_bytes as f64 / (1024.0 * 1024.0),
                p.lookup_share * 100.0,
                p.dense_ms,
                p.embedding_ms,
                p.all_to_all_ms,
                p.all_reduce_ms,
                p.total_ms
            )?;
        }
        Ok(())
    }
}

/// The scaling table as text.
pub fn scaling_table(points: &[ScalePoint]) -> String {
    let mut s = format!(
        "{:>6} {:>14} {:>10} {:>12} {:>12} {:>10}\n",
        "ranks", "strong ms/step", "strong eff", "weak batch", "weak ms/step", "weak eff"
    );
    let cell = |v: Option<f64>, pct: bool| match v {
        Some(x) if pct => format!("{:.1}%", x * 100.0),
        Some(x) => format!("{x:.3}"),
        None => "-".into(),
    };
    for p in points {
        s.push_str(&format!(
            "{:>6} {:>14} {:>10} {:>12} {:>12} {:>10}\n",
            p.ranks,
            cell(p.strong_step_ms, false),
            cell(p.strong_efficiency, true),
            p.weak_global_batch,
            cell(p.weak_step_ms, false),
            cell(p.weak_efficiency, true)
        ));
    }
    s
}
