//! The placement algorithm: decide each table's kind and shard count, place the
//! shards greedily (LPT), then refine with moves and swaps that lower the
//! predicted time of the slowest rank ([`super::cost`] for every formula).
//!
//! 1. Data-parallel (only with 2+ ranks): a table is replicated when its
//!    per-rank cost replicated (local lookups, dense gradient, all-reduce, `sgd`)
//!    is below its table-wise cost (the holder's lookups and sends spread over the
//!    ranks, plus every rank's receive) and it fits every rank's budget (tables
//!    tried smallest first).
//! 0. Capacity: a rank's budget for tables is `mem_per_rank` less
//!    `reserved_per_rank` (0 unless the caller sets aside the rest of the rank's
//!    memory account, [`super::memory`]); a table's bytes are its rows with the
//!    state kept per row ([`TableInfo::bytes`]: rows × (dim × element bytes + the
//!    bytes of its Split-SGD low half or Adagrad accumulator row)), so a table whose
//!    state does not fit beside it is split. The rest of the account (dense
//!    parameters and their state, activations, buffers) is checked afterwards.
//! 2. Shard count `k` of every other table: at least `ceil(bytes / budget left)`
//!    (a table larger than a rank's budget must be split; more than `min(ranks,
//!    rows)` shards is an error); the table (f32, or bf16 with its Split-SGD low
//!    half split alike) then takes the `k` (up to `min(ranks, rows)`) that minimises
//!    `max(unit(k), mean load) + k·receive` — a hot table is split until its
//!    shards stop being the slowest units or their extra messages cost more than
//!    they save. Rows are split evenly: shard `i` of `k` holds rows
//!    `i·rows/k .. (i+1)·rows/k`.
//! 3. LPT: units by decreasing cost (ties: table order, then first row) each go to
//!    the least-loaded rank (ties: lowest rank) that has memory left and holds no
//!    other shard of that table.
//! 4. Refine: repeatedly apply the single move (a unit to another rank) or swap
//!    (two units of different ranks) involving the slowest rank that most lowers
//!    (predicted max rank time, sum of squared rank times), lexicographically,
//!    until none does (at most 16 × units + 64 rounds).
//!
//! Everything iterates in a fixed order and breaks ties by index, so the plan is a
//! function of the tables and the options only.

use super::cost::CostModel;
use super::{PlannerOptions, Shard, ShardKind, ShardPlan, TablePlan};
use crate::partition::TableInfo;
use crate::{PassError, Result};

fn err(reason: String) -> PassError {
    PassError::Arg {
        pass: super::ID.to_string(),
        reason,
    }
}

/// Places `tables` as the module docs say.
pub fn plan(tables: &[TableInfo], opts: &PlannerOptions) -> Result<ShardPlan> {
    let budget = table_budget(opts)?;
    let cm = CostModel::new(*opts, true);
    // 1. Data-parallel tables.
    let (mut kind, replicated_bytes) = data_parallel(tables, opts, &cm, budget);
    let room = Room {
        avail: budget - replicated_bytes,
        replicated: replicated_bytes,
    };
    // 2. Shard counts.
    let units = shard_units(tables, &mut kind, opts, &cm, room.avail);
    // 3. LPT, 4. refine.
    let mut st = lpt(tables, &units, opts, &cm, room)?;
    st.refine(&units, room.avail);

    // The plan, shards in row order.
    let mut plans: Vec<TablePlan> = tables
        .iter()
        .zip(&kind)
        .map(|(t, k)| TablePlan {
            table: t.name.clone(),
            kind: *k,
            shards: Vec::new(),
        })
        .collect();
    for (u, unit) in units.iter().enumerate() {
        plans[unit.table].shards.push(Shard {
            rank: st.rank_of[u],
            lo: unit.lo,
            hi: unit.hi,
        });
    }
    for p in &mut plans {
        p.shards.sort_by_key(|s| s.lo);
    }
    let plan = ShardPlan {
        ranks: opts.ranks,
        tables: plans,
    };
    plan.check(tables)?;
    Ok(plan)
}

/// Step 0: each rank's bytes for tables (`mem_per_rank` less
/// `reserved_per_rank`), or an error when the options leave none.
fn table_budget(opts: &PlannerOptions) -> Result<u64> {
    let r = opts.ranks;
    if r == 0 {
        return Err(err("the rank count must be at least 1".into()));
    }
    super::check_rank_count(r).map_err(err)?;
    if opts.global_batch < r {
        return Err(err(format!(
            "{r} ranks need a global batch of at least {r} samples (every rank needs one), \
             got {}",
            opts.global_batch
        )));
    }
    let budget = opts.mem_per_rank;
    if opts.reserved_per_rank >= budget {
        return Err(err(format!(
            "every rank needs {} ({} bytes) besides its tables (dense parameters and \
             optimizer state, activations and gradients at the local batch of {}, \
             buffers), which leaves nothing of --mem-per-rank {} ({budget} bytes) for \
             tables; raise --mem-per-rank or --ranks, or lower --batch-size",
            super::memory::human(opts.reserved_per_rank),
            opts.reserved_per_rank,
            opts.global_batch.div_ceil(r),
            super::memory::human(budget),
        )));
    }
    Ok(budget - opts.reserved_per_rank)
}

/// A rank's room for sharded tables: what is left of its budget, and what the
/// replicated tables took.
#[derive(Clone, Copy, Debug)]
struct Room {
    avail: u64,
    replicated: u64,
}

/// Step 1: each table's kind (data-parallel or, for now, table-wise) and the
/// bytes the replicated ones take on every rank.
fn data_parallel(
    tables: &[TableInfo],
    opts: &PlannerOptions,
    cm: &CostModel,
    budget: u64,
) -> (Vec<ShardKind>, u64) {
    let r = opts.ranks;
    let mut kind = vec![ShardKind::TableWise; tables.len()];
    let mut replicated_bytes = 0u64;
    if r > 1 {
        let mut by_size: Vec<usize> = (0..tables.len()).collect();
        by_size.sort_by_key(|&i| (tables[i].bytes(), i));
        for i in by_size {
            let t = &tables[i];
            let (c, m) = cm.replicated(t);
            let beta = 1.0 / (opts.network.gbps * 1e9);
            let tw = (cm.shard_compute(t, 1.0) + cm.exchanges() * cm.unit_send_bytes(t) * beta)
                / r as f64
                + cm.exchanges() * cm.unit_recv_bytes(t) * beta;
            if c + m < tw && replicated_bytes + t.bytes() <= budget {
                kind[i] = ShardKind::DataParallel;
                replicated_bytes += t.bytes();
            }
        }
    }
    (kind, replicated_bytes)
}

/// Step 2: every table that is not data-parallel cut into its shards (row-wise
/// when more than one), each a [`Unit`] with its costs.
fn shard_units(
    tables: &[TableInfo],
    kind: &mut [ShardKind],
    opts: &PlannerOptions,
    cm: &CostModel,
    avail: u64,
) -> Vec<Unit> {
    let r = opts.ranks;
    let beta = 1.0 / (opts.network.gbps * 1e9);
    let unit_cost = |t: &TableInfo, k: usize| {
        cm.shard_compute(t, 1.0 / k as f64) + cm.exchanges() * cm.unit_send_bytes(t) * beta
    };
    let mean_load = tables
        .iter()
        .zip(kind.iter())
        .filter(|(_, k)| **k != ShardKind::DataParallel)
        .map(|(t, _)| unit_cost(t, 1))
        .sum::<f64>()
        / r as f64;
    let mut units: Vec<Unit> = Vec::new();
    for (i, t) in tables.iter().enumerate() {
        if kind[i] == ShardKind::DataParallel {
            continue;
        }
        let need = t.bytes().div_ceil(avail.max(1)).max(1) as usize;
        let k_max = if t.row_wise { r.min(t.rows.max(1)) } else { 1 };
        let mut k = need;
        if k_max >= 2 {
            let recv = cm.exchanges() * cm.unit_recv_bytes(t) * beta;
            let est = |k: usize| unit_cost(t, k).max(mean_load) + k as f64 * recv;
            let mut best = (est(need), need);
            for kk in need + 1..=k_max {
                let e = est(kk);
                if e < best.0 {
                    best = (e, kk);
                }
            }
            k = best.1;
        }
        if k >= 2 {
            kind[i] = ShardKind::RowWise;
        }
        for s in 0..k {
            let (lo, hi) = (s * t.rows / k, (s + 1) * t.rows / k);
            units.push(Unit {
                table: i,
                lo,
                hi,
                cost: unit_cost(t, k),
                compute: cm.shard_compute(t, (hi - lo) as f64 / t.rows.max(1) as f64),
                send: cm.unit_send_bytes(t),
                recv: cm.unit_recv_bytes(t),
                bytes: ((hi - lo) as u64).saturating_mul(t.bytes_per_row()),
            });
        }
    }
    units
}

/// Step 3: units by decreasing cost, each to the least-loaded rank with room
/// that holds no other shard of its table; an error naming the unit when none
/// has room.
fn lpt<'u>(
    tables: &[TableInfo],
    units: &'u [Unit],
    opts: &PlannerOptions,
    cm: &'u CostModel,
    room: Room,
) -> Result<State<'u>> {
    let r = opts.ranks;
    let mut order: Vec<usize> = (0..units.len()).collect();
    order.sort_by(|&a, &b| {
        units[b]
            .cost
            .total_cmp(&units[a].cost)
            .then((units[a].table, units[a].lo).cmp(&(units[b].table, units[b].lo)))
    });
    let mut st = State::new(r, units, cm);
    let mut load = vec![0.0f64; r];
    for u in order {
        // The first of the least loaded (ties: lowest rank).
        let best = (0..r)
            .filter(|&rank| st.fits(units, u, rank, room.avail))
            .min_by(|&a, &b| load[a].total_cmp(&load[b]));
        let Some(rank) = best else {
            return Err(no_room(&tables[units[u].table], &units[u], opts, room));
        };
        load[rank] += units[u].cost;
        st.assign(units, u, rank);
    }
    Ok(st)
}

/// The error when no rank can hold `un` of table `t`.
fn no_room(t: &TableInfo, un: &Unit, opts: &PlannerOptions, room: Room) -> PassError {
    // What the bytes count: the rows and the state sharded with them.
    let row = t.dim * t.elem_bytes;
    let counted = match t.state_bytes_per_row {
        0 => format!("{row} bytes a row, no optimizer state"),
        s => format!(
            "{row} bytes a row and {s} of its optimizer state (a bf16 table's \
             Split-SGD low half, or an Adagrad accumulator), held with it"
        ),
    };
    err(format!(
        "no rank can hold rows {}..{} of table `{}` ({}, {} bytes: {counted}): \
         every rank's {} for tables (--mem-per-rank {} less \
         {} for the rest of the rank, {} of replicated tables) is taken; raise \
         --mem-per-rank or --ranks",
        un.lo,
        un.hi,
        t.name,
        super::memory::human(un.bytes),
        un.bytes,
        super::memory::human(room.avail),
        super::memory::human(opts.mem_per_rank),
        super::memory::human(opts.reserved_per_rank),
        super::memory::human(room.replicated),
    ))
}

/// A refinement step: its score (max rank time, sum of squares), the unit moved,
/// the rank it goes to, and the unit it is swapped with (if any).
type Candidate = ((f64, f64), usize, usize, Option<usize>);

/// A shard to place: table index, rows, and its costs.
#[derive(Clone, Debug)]
struct Unit {
    table: usize,
    lo: usize,
    hi: usize,
    /// LPT weight: compute plus sending time.
    cost: f64,
    /// Lookup (and update) seconds on its holder.
    compute: f64,
    /// Bytes its holder sends per exchange.
    send: f64,
    /// Bytes every other rank receives from it per exchange.
    recv: f64,
    /// Memory.
    bytes: u64,
}

/// Per-rank aggregates of an assignment.
struct State<'a> {
    cm: &'a CostModel,
    rank_of: Vec<usize>,
    compute: Vec<f64>,
    send: Vec<f64>,
    held_recv: Vec<f64>,
    mem: Vec<u64>,
    /// Shards of table `t` on rank `r` at `t·ranks + r`.
    held: Vec<u32>,
    ranks: usize,
    total_recv: f64,
}

impl<'a> State<'a> {
    fn new(r: usize, units: &[Unit], cm: &'a CostModel) -> State<'a> {
        State {
            cm,
            rank_of: vec![usize::MAX; units.len()],
            compute: vec![0.0; r],
            send: vec![0.0; r],
            held_recv: vec![0.0; r],
            mem: vec![0; r],
            held: vec![0; (units.iter().map(|u| u.table).max().map_or(0, |t| t + 1)) * r],
            ranks: r,
            total_recv: units.iter().map(|u| u.recv).sum(),
        }
    }

    /// True if `rank` can take unit `u` (memory, one shard of a table per rank),
    /// ignoring `except` (a unit leaving that rank in a swap).
    fn fits_except(
        &self,
        units: &[Unit],
        u: usize,
        rank: usize,
        avail: u64,
        except: Option<usize>,
    ) -> bool {
        let freed = except.map_or(0, |x| units[x].bytes);
        if self.mem[rank] - freed + units[u].bytes > avail {
            return false;
        }
        let same = except.is_some_and(|x| units[x].table == units[u].table);
        self.held[units[u].table * self.ranks + rank] <= u32::from(same)
    }

    fn fits(&self, units: &[Unit], u: usize, rank: usize, avail: u64) -> bool {
        self.fits_except(units, u, rank, avail, None)
    }

    fn assign(&mut self, units: &[Unit], u: usize, rank: usize) {
        let un = &units[u];
        self.rank_of[u] = rank;
        self.compute[rank] += un.compute;
        self.send[rank] += un.send;
        self.held_recv[rank] += un.recv;
        self.mem[rank] += un.bytes;
        self.held[un.table * self.ranks + rank] += 1;
    }

    fn remove(&mut self, units: &[Unit], u: usize) {
        let un = &units[u];
        let rank = self.rank_of[u];
        self.compute[rank] -= un.compute;
        self.send[rank] -= un.send;
        self.held_recv[rank] -= un.recv;
        self.mem[rank] -= un.bytes;
        self.held[un.table * self.ranks + rank] -= 1;
        self.rank_of[u] = usize::MAX;
    }

    /// Predicted time of a rank with these aggregates (the terms that depend on
    /// the placement).
    fn time_of(&self, compute: f64, send: f64, held_recv: f64) -> f64 {
        compute
            + self
                .cm
                .all_to_all(send, (self.total_recv - held_recv).max(0.0))
    }

    fn time(&self, rank: usize) -> f64 {
        self.time_of(self.compute[rank], self.send[rank], self.held_recv[rank])
    }

    /// The time of `rank` with unit `out` removed and unit `inn` added.
    fn time_with(
        &self,
        units: &[Unit],
        rank: usize,
        out: Option<usize>,
        inn: Option<usize>,
    ) -> f64 {
        let (mut c, mut s, mut h) = (self.compute[rank], self.send[rank], self.held_recv[rank]);
        if let Some(o) = out {
            c -= units[o].compute;
            s -= units[o].send;
            h -= units[o].recv;
        }
        if let Some(i) = inn {
            c += units[i].compute;
            s += units[i].send;
            h += units[i].recv;
        }
        self.time_of(c, s, h)
    }

    fn refine(&mut self, units: &[Unit], avail: u64) {
        let r = self.compute.len();
        if r < 2 || units.is_empty() {
            return;
        }
        let eps = 1e-12;
        for _ in 0..16 * units.len() + 64 {
            let times: Vec<f64> = (0..r).map(|k| self.time(k)).collect();
            let worst = (0..r)
                .reduce(|a, b| if times[b] > times[a] { b } else { a })
                .unwrap_or(0);
            let cur = (times[worst], times.iter().map(|t| t * t).sum::<f64>());
            // The largest times, to get the max over the ranks a change leaves alone.
            let mut top: Vec<usize> = (0..r).collect();
            top.sort_by(|&a, &b| times[b].total_cmp(&times[a]).then(a.cmp(&b)));
            top.truncate(3);
            let rest_max = |a: usize, b: usize| {
                top.iter()
                    .find(|&&k| k != a && k != b)
                    .map_or(0.0, |&k| times[k])
            };
            let mine: Vec<usize> = (0..units.len())
                .filter(|&u| self.rank_of[u] == worst)
                .collect();
            let mut best: Option<Candidate> = None;
            let mut consider = |score: (f64, f64), u: usize, to: usize, v: Option<usize>| {
                let better_than_cur =
                    score.0 < cur.0 - eps || (score.0 <= cur.0 + eps && score.1 < cur.1 - eps);
                let better_than_best = best.as_ref().is_none_or(|b| {
                    score.0 < b.0.0 - eps || (score.0 <= b.0.0 + eps && score.1 < b.0.1 - eps)
                });
                if better_than_cur && better_than_best {
                    best = Some((score, u, to, v));
                }
            };
            for &u in &mine {
                // Move u to another rank.
                for to in 0..r {
                    if to == worst || !self.fits(units, u, to, avail) {
                        continue;
                    }
                    let a = self.time_with(units, worst, Some(u), None);
                    let b = self.time_with(units, to, None, Some(u));
                    let sq = cur.1 - times[worst].powi(2) - times[to].powi(2) + a * a + b * b;
                    consider((rest_max(worst, to).max(a).max(b), sq), u, to, None);
                }
                // Swap u with a unit v of another rank.
                for v in 0..units.len() {
                    let to = self.rank_of[v];
                    if to == worst
                        || !self.fits_except(units, u, to, avail, Some(v))
                        || !self.fits_except(units, v, worst, avail, Some(u))
                    {
                        continue;
                    }
                    let a = self.time_with(units, worst, Some(u), Some(v));
                    let b = self.time_with(units, to, Some(v), Some(u));
                    let sq = cur.1 - times[worst].powi(2) - times[to].powi(2) + a * a + b * b;
                    consider((rest_max(worst, to).max(a).max(b), sq), u, to, Some(v));
                }
            }
            let Some((_, u, to, v)) = best else {
                return;
            };
            self.remove(units, u);
            if let Some(v) = v {
                self.remove(units, v);
                self.assign(units, v, worst);
            }
            self.assign(units, u, to);
        }
    }
}
