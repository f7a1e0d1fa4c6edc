//! The memory one rank holds while it runs its graph ([`MemoryAccount`]), computed
//! from the rank's graph alone (types, no parameter data) at the job's batch, and
//! the refusal of a job that does not fit a budget ([`check`]).
//!
//! The parts, as the runtime (`dlrm_runtime::exec`) holds them:
//! - **tables**: every parameter looked up or updated by an embedding op (a whole
//!   table, a row-wise shard, a replica), at its stored dtype;
//! - **bf16 low halves**: the low 16 bits of Split-SGD-BF16 masters (`split_sgd`,
//!   `split_embedding_update[_rows]` operand 1), tables' and dense alike;
//! - **optimizer state**: Adagrad accumulators (`adagrad`, `sparse_adagrad`,
//!   `embedding_update_adagrad[_rows]` operand 1); which operand of an update holds
//!   which states are [`Op::state_operands`], as for the executor;
//! - **dense parameters**: every other parameter (MLP weights and biases);
//! - **activations** and **gradients**: the largest set of step values alive at once.
//!   The executor runs the nodes in graph order and drops each value right after
//!   its last use; graph outputs and update values live to the end of the step;
//!   an optimizer update's results are its parameters, updated in place (no new
//!   storage). So the account replays that order: before each node its operands
//!   are alive, its results are added, then the values it used last are dropped;
//!   the peak over the nodes is split into gradients (values named `d.*` by
//!   autodiff, and the operands and results of `all_reduce`) and activations (the
//!   rest). Sizes bind `B` to the rank's local batch (`ceil(G/R)`, the largest
//!   rank's), `G` to the global batch, any other symbol (an offsets bag's index
//!   count) to the local batch;
//! - **communication buffers**: the transient copies of the largest collective,
//!   beyond its operands and results (counted above): an `all_to_all` packs its
//!   operands into per-rank send buffers and the MPI backend flattens them into one
//!   more, and receives into one flat buffer and per-rank pieces, so `2·(in + out)`
//!   bytes (f32); an `all_reduce` of `n` bytes receives `n` bytes of chunks and sums
//!   into `n/R` more. Collectives overlap compute (a progress thread), so this is
//!   added to the peak rather than placed in it;
//! - **data buffers**: the step's inputs at their sizes, plus `prefetch` more steps
//!   assembled ahead by the loader.
//!
//! Not counted: the program itself, the JIT's code, thread stacks, allocator slack,
//! the MPI library's buffers, and whatever the process holds besides its ranks'
//! graphs (the plan's stored parameters — the MLPs; described tables are created
//! only by the ranks that own them). docs/planner.md compares the account with the
//! measured peak resident memory.
//!
//! The planner ([`super::planner`]) places tables (their rows with the low halves
//! and accumulators kept per row, [`crate::partition::TableInfo::bytes`]) against a
//! budget, less [`PlannerOptions::reserved_per_rank`](super::PlannerOptions)
//! when the caller sets it (the orchestration sets it to the rest of this account
//! to estimate a rank count or batch that would fit; the placement itself reserves
//! nothing, and the account of the partitioned graphs is checked afterwards).

use super::ID;
use crate::{PassError, Result};
use dlrm_ir::{Def, Dim, Graph, Op, State, ValueId};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The job a rank's graph runs in, for [`account`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryJob {
    /// Samples per step over all ranks.
    pub global_batch: usize,
    /// Rank count.
    pub ranks: usize,
    /// Steps of inputs the loader assembles ahead (0: none; datasets prefetch).
    pub prefetch: usize,
}

impl MemoryJob {
    /// The largest rank's batch: `ceil(G/R)`.
    pub fn local_batch(&self) -> usize {
        self.global_batch.div_ceil(self.ranks.max(1))
    }
}

/// One table parameter a rank holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableMemory {
    /// The parameter (a table, or a row-wise shard of one).
    pub name: String,
    /// Its bytes.
    pub bytes: u64,
    /// Bytes of the state kept alongside it (low half, accumulator).
    pub state_bytes: u64,
}

/// What one rank holds (module docs), in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryAccount {
    /// The rank.
    pub rank: usize,
    /// The local batch the sizes are for.
    pub local_batch: usize,
    /// The rank's table parameters, largest first.
    pub tables: Vec<TableMemory>,
    /// Sum of the tables' bytes.
    pub table_bytes: u64,
    /// bf16 low halves (Split-SGD-BF16), tables' and dense.
    pub low_half_bytes: u64,
    /// Optimizer accumulators (Adagrad), tables' and dense.
    pub optimizer_bytes: u64,
    /// The other parameters.
    pub dense_param_bytes: u64,
    /// Activations alive at the peak.
    pub activation_bytes: u64,
    /// Gradients alive at the peak.
    pub gradient_bytes: u64,
    /// The node at which the step's values peak (its first result's name).
    pub peak_node: String,
    /// Transient buffers of the largest collective.
    pub comm_bytes: u64,
    /// Step inputs, with the prefetched ones.
    pub data_bytes: u64,
    /// The sum of the parts.
    pub total: u64,
}

impl MemoryAccount {
    /// Parameter storage: tables, low halves, optimizer state, dense parameters.
    pub fn param_bytes(&self) -> u64 {
        self.table_bytes + self.low_half_bytes + self.optimizer_bytes + self.dense_param_bytes
    }

    /// The named parts, largest first: `(what, bytes)`; a table names itself.
    pub fn parts(&self) -> Vec<(String, u64)> {
        let mut v = vec![
            (
                format!("activations at a local batch of {}", self.local_batch),
                self.activation_bytes,
            ),
            (
                format!("gradients at a local batch of {}", self.local_batch),
                self.gradient_bytes,
            ),
            ("dense parameters".to_string(), self.dense_param_bytes),
            ("communication buffers".to_string(), self.comm_bytes),
            ("data buffers".to_string(), self.data_bytes),
        ];
        // Low halves and accumulators of tables go with their table.
        let table_state: u64 = self.tables.iter().map(|t| t.state_bytes).sum();
        let dense_state = (self.low_half_bytes + self.optimizer_bytes).saturating_sub(table_state);
        v.push(("dense optimizer state".to_string(), dense_state));
        for t in &self.tables {
            let what = if t.state_bytes > 0 {
                format!(
                    "table `{}` ({} with its {} of optimizer state)",
                    t.name,
                    human(t.bytes + t.state_bytes),
                    human(t.state_bytes)
                )
            } else {
                format!("table `{}`", t.name)
            };
            v.push((what, t.bytes + t.state_bytes));
        }
        v.sort_by_key(|p| std::cmp::Reverse(p.1));
        v
    }
}

/// `bytes` as `12.3 GiB` (binary units, 3 significant digits), `512 B` below 1 KiB.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else if v >= 100.0 {
        format!("{v:.0} {}", UNITS[u])
    } else if v >= 10.0 {
        format!("{v:.1} {}", UNITS[u])
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// The results of `op` that are its parameters updated in place
/// ([`Op::in_place_operands`], as the executor): the first `k` results take no new
/// storage.
fn in_place_results(op: &Op) -> usize {
    op.in_place_operands().unwrap_or(0)
}

/// The role of a parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Dense,
    Table,
    LowHalf,
    Accumulator,
}

/// The roles of `g`'s values (only parameters get one besides `Dense`), and for
/// each state parameter the table it belongs to (if it is a table's).
fn roles(g: &Graph) -> (Vec<Role>, Vec<Option<ValueId>>) {
    let n = g.values().len();
    let mut role = vec![Role::Dense; n];
    let mut owner = vec![None; n];
    for node in g.nodes() {
        let table_op = matches!(
            node.op,
            Op::EmbeddingBag { .. }
                | Op::EmbeddingBagRows { .. }
                | Op::SparseSgd { .. }
                | Op::SparseSgdRows { .. }
                | Op::SparseAdagrad { .. }
        ) || node.op.bag_update().is_some();
        if table_op && let Some(&t) = node.inputs.first() {
            role[t.index()] = Role::Table;
        }
        for (k, state) in node.op.state_operands() {
            let Some(&s) = node.inputs.get(k) else {
                continue;
            };
            role[s.index()] = match state {
                State::LowHalf => Role::LowHalf,
                State::Accumulator => Role::Accumulator,
            };
            owner[s.index()] = node.inputs.first().copied();
        }
    }
    // A state parameter's owner counts as a table only if it is one.
    for o in owner.iter_mut() {
        if o.is_some_and(|t| role[t.index()] != Role::Table) {
            *o = None;
        }
    }
    (role, owner)
}

/// Bytes of value `v` with `B` (and unknown symbols) bound to `local` and `G` to
/// `global`; saturating (a huge batch gives a huge count, never a wrap).
fn value_bytes(g: &Graph, v: ValueId, local: usize, global: usize) -> u64 {
    let t = g.ty(v);
    let bind = |s: &str| Some(if s == Dim::GLOBAL { global } else { local });
    t.shape
        .iter()
        .map(|d| d.resolve(&bind).unwrap_or(local) as u64)
        .fold(t.dtype.size_bytes() as u64, u64::saturating_mul)
}

/// The memory account of rank `rank`'s graph `g` in `job` (module docs).
pub fn account(g: &Graph, rank: usize, job: &MemoryJob) -> MemoryAccount {
    let local = job.local_batch();
    let global = job.global_batch;
    let bytes = |v: ValueId| value_bytes(g, v, local, global);
    let mut a = MemoryAccount {
        rank,
        local_batch: local,
        ..MemoryAccount::default()
    };
    account_params(g, &bytes, &mut a);
    // Data: the step's inputs, and the prefetched steps.
    let inputs: u64 = g.inputs().iter().map(|&v| bytes(v)).sum();
    a.data_bytes = inputs.saturating_mul(1 + job.prefetch as u64);
    account_step(g, job, &bytes, &mut a);
    a.total = [
        a.table_bytes,
        a.low_half_bytes,
        a.optimizer_bytes,
        a.dense_param_bytes,
        a.activation_bytes,
        a.gradient_bytes,
        a.comm_bytes,
        a.data_bytes,
    ]
    .into_iter()
    .fold(0, u64::saturating_add);
    a
}

/// The parameters' bytes by role, and the tables with their state, largest
/// first.
fn account_params(g: &Graph, bytes: &impl Fn(ValueId) -> u64, a: &mut MemoryAccount) {
    let (role, owner) = roles(g);
    let mut state_of = vec![0u64; g.values().len()];
    for &p in g.params() {
        let b = bytes(p);
        match role[p.index()] {
            Role::Dense => a.dense_param_bytes += b,
            Role::Table => a.table_bytes += b,
            Role::LowHalf => a.low_half_bytes += b,
            Role::Accumulator => a.optimizer_bytes += b,
        }
        if let Some(t) = owner[p.index()] {
            state_of[t.index()] += b;
        }
    }
    for &p in g.params() {
        if role[p.index()] == Role::Table {
            a.tables.push(TableMemory {
                name: g.name_of(p).to_string(),
                bytes: bytes(p),
                state_bytes: state_of[p.index()],
            });
        }
    }
    a.tables
        .sort_by_key(|t| std::cmp::Reverse(t.bytes + t.state_bytes));
}

/// A value's lifetime end: after node `n`, or kept to the end of the step.
const KEEP: usize = usize::MAX;

/// Per node, the step values that die after it (their last use; outputs and
/// update values are kept to the end of the step).
fn free_after(g: &Graph) -> Vec<Vec<ValueId>> {
    let nodes = g.nodes();
    let mut last_use = vec![0usize; g.values().len()];
    for (i, v) in g.values().iter().enumerate() {
        if let Def::Node(n, _) = v.def {
            last_use[i] = n;
        }
    }
    for (n, node) in nodes.iter().enumerate() {
        for &v in &node.inputs {
            last_use[v.index()] = last_use[v.index()].max(n);
        }
    }
    for &o in g.outputs() {
        last_use[o.index()] = KEEP;
    }
    for u in g.updates() {
        last_use[u.value.index()] = KEEP;
    }
    let mut free_after: Vec<Vec<ValueId>> = vec![Vec::new(); nodes.len()];
    for (i, v) in g.values().iter().enumerate() {
        if matches!(v.def, Def::Node(..)) && last_use[i] != KEEP {
            free_after[last_use[i]].push(ValueId(i as u32));
        }
    }
    free_after
}

/// Per value: the bytes its definition allocates (0 for a result updated in
/// place), and whether it is a gradient (named `d.*`, or all-reduced).
fn sizes(g: &Graph, bytes: &impl Fn(ValueId) -> u64) -> (Vec<u64>, Vec<bool>) {
    let nv = g.values().len();
    let mut grad = vec![false; nv];
    for (i, v) in g.values().iter().enumerate() {
        grad[i] = v.name.starts_with("d.");
    }
    let mut size = vec![0u64; nv];
    for node in g.nodes() {
        let in_place = in_place_results(&node.op);
        for (k, &o) in node.outputs.iter().enumerate() {
            size[o.index()] = if k < in_place { 0 } else { bytes(o) };
        }
        if matches!(node.op, Op::AllReduce) {
            for &v in node.inputs.iter().chain(&node.outputs) {
                grad[v.index()] = true;
            }
        }
    }
    (size, grad)
}

/// The step values, replayed in node order: the peak of live activations and
/// gradients (and the node it is reached at), and the largest transient
/// buffers of a collective.
fn account_step(
    g: &Graph,
    job: &MemoryJob,
    bytes: &impl Fn(ValueId) -> u64,
    a: &mut MemoryAccount,
) {
    let free_after = free_after(g);
    let (size, grad) = sizes(g, bytes);
    let (mut act, mut gr) = (0u64, 0u64);
    for (n, node) in g.nodes().iter().enumerate() {
        for &o in &node.outputs {
            let s = size[o.index()];
            if grad[o.index()] {
                gr = gr.saturating_add(s);
            } else {
                act = act.saturating_add(s);
            }
        }
        if act.saturating_add(gr) > a.activation_bytes.saturating_add(a.gradient_bytes)
            || a.peak_node.is_empty()
        {
            a.activation_bytes = act;
            a.gradient_bytes = gr;
            a.peak_node = node
                .outputs
                .first()
                .map_or_else(|| format!("#{n}"), |&o| g.name_of(o).to_string());
        }
        for &v in &free_after[n] {
            let s = size[v.index()];
            if grad[v.index()] {
                gr -= s;
            } else {
                act -= s;
            }
        }
        a.comm_bytes = a.comm_bytes.max(transient_bytes(g, node, job, bytes));
    }
}

/// A collective's transient buffers (f32): `all_to_all` packs and unpacks its
/// operands and results, `all_reduce` keeps its operands and one rank's chunk.
fn transient_bytes(
    g: &Graph,
    node: &dlrm_ir::Node,
    job: &MemoryJob,
    bytes: &impl Fn(ValueId) -> u64,
) -> u64 {
    let f32s = |vs: &[ValueId]| -> u64 {
        vs.iter()
            .map(|&v| bytes(v) / g.ty(v).dtype.size_bytes() as u64 * 4)
            .fold(0, u64::saturating_add)
    };
    match node.op {
        Op::AllToAll { .. } => f32s(&node.inputs)
            .saturating_add(f32s(&node.outputs))
            .saturating_mul(2),
        Op::AllReduce => {
            let n = f32s(&node.inputs);
            n.saturating_add(n / job.ranks.max(1) as u64)
        }
        _ => 0,
    }
}

/// A rank count or precision that would fit, for [`check`]'s message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Suggestion {
    /// The smallest rank count whose largest rank fits (`None`: none tried did).
    pub ranks: Option<usize>,
    /// The largest global batch that fits on the asked ranks, when the batch-sized
    /// parts are what does not fit (`None`: no batch helps, or not asked).
    pub batch: Option<usize>,
    /// What bf16 tables would change (a sentence), if anything.
    pub precision: Option<String>,
    /// `Some(bytes)` when the asked ranks are threads of one process (more of them
    /// add no memory): [`Suggestion::ranks`] then counts machines, one rank each
    /// with `bytes`, and the advice says so (`mpirun -n N ... --comm mpi` across
    /// machines) instead of more ranks.
    pub per_machine: Option<u64>,
}

impl Suggestion {
    /// The advice as clauses for an error message: the rank count (or that none
    /// tried fits, when `say_none`), the batch, the precision.
    pub fn clauses(&self, say_none: bool) -> Vec<String> {
        let mut advice = Vec::new();
        match (self.ranks, self.per_machine) {
            (Some(r), None) => {
                advice.push(format!("{r} ranks would fit (--ranks {r} / mpirun -n {r})"));
            }
            (Some(r), Some(m)) => advice.push(format!(
                "the model needs more machines: {r} ranks with {} each would fit, one per \
                 machine (`mpirun -n {r} --host ... dlrm-run PLAN --comm mpi`); more --ranks \
                 here are threads sharing this machine's memory",
                human(m)
            )),
            (None, None) if say_none => {
                advice.push("no rank count tried would fit".to_string());
            }
            (None, Some(m)) if say_none => advice.push(format!(
                "no machine count tried would fit (one rank of {} per machine)",
                human(m)
            )),
            (None, _) => {}
        }
        if let Some(b) = self.batch {
            advice.push(format!(
                "a global batch of at most {b} would fit (--batch-size)"
            ));
        }
        if let Some(p) = &self.precision {
            advice.push(p.clone());
        }
        advice
    }
}

/// Refuses `accounts` (one per rank) if any rank's total exceeds `budget`: the
/// error names the rank, its total against the budget (and where the budget comes
/// from, `budget_source`), its largest parts (a table by name with its bytes), and
/// `suggest`'s rank count, batch and precision.
pub fn check(
    accounts: &[MemoryAccount],
    budget: u64,
    budget_source: &str,
    suggest: &dyn Fn() -> Suggestion,
) -> Result<()> {
    let Some(worst) = accounts
        .iter()
        .max_by_key(|a| (a.total, usize::MAX - a.rank))
    else {
        return Ok(());
    };
    if worst.total <= budget {
        return Ok(());
    }
    let parts = worst.parts();
    let largest: Vec<String> = parts
        .iter()
        .filter(|(_, b)| *b > 0)
        .take(3)
        .map(|(what, b)| format!("{what}: {} ({b} bytes)", human(*b)))
        .collect();
    let advice = suggest().clauses(true);
    Err(PassError::Arg {
        pass: ID.to_string(),
        reason: format!(
            "rank {} of {} needs {} ({} bytes), more than its memory budget of {} ({} bytes, \
             {budget_source}); largest parts: {}; {}",
            worst.rank,
            accounts.len(),
            human(worst.total),
            worst.total,
            human(budget),
            budget,
            largest.join(", "),
            advice.join("; ")
        ),
    })
}

impl fmt::Display for MemoryAccount {
    /// One row of the per-rank memory table ([`memory_table`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = |b: u64| b as f64 / (1024.0 * 1024.0);
        write!(
            f,
            "{:>5} {:>11.2} {:>9.2} {:>9.2} {:>9.2} {:>10.2} {:>9.2} {:>8.2} {:>8.2} {:>11.2}",
            self.rank,
            m(self.table_bytes),
            m(self.low_half_bytes + self.optimizer_bytes),
            m(self.dense_param_bytes),
            m(self.activation_bytes),
            m(self.gradient_bytes),
            m(self.comm_bytes),
            m(self.data_bytes),
            m(self.total - self.param_bytes()),
            m(self.total)
        )
    }
}

/// The per-rank memory table (MiB), with the budget.
pub fn memory_table(accounts: &[MemoryAccount], budget: u64) -> String {
    let mut s = format!(
        "{:>5} {:>11} {:>9} {:>9} {:>9} {:>10} {:>9} {:>8} {:>8} {:>11}\n",
        "rank",
        "tables MiB",
        "opt MiB",
        "dense MiB",
        "act MiB",
        "grads MiB",
        "comm MiB",
        "data MiB",
        "step MiB",
        "total MiB"
    );
    for a in accounts {
        s.push_str(&format!("{a}\n"));
    }
    if let Some(w) = accounts.iter().max_by_key(|a| a.total) {
        s.push_str(&format!(
            "largest rank {}: {} of a {} budget ({:.1}%); opt = bf16 low halves + \
             optimizer accumulators; step = act + grads + comm + data\n",
            w.rank,
            human(w.total),
            human(budget),
            w.total as f64 / budget.max(1) as f64 * 100.0
        ));
    }
    s
}
