//! `dlrmc calibrate`: measures, on this machine, the rates the sharding planner's
//! cost model takes ([`dlrm_passes::shard::Machine`], [`Network`]), with the
//! kernels and the communicator a job runs on, and keeps them in a calibration
//! file the planner reads instead of its built-in guesses.
//!
//! - **GFLOP/s** (dense, GEMM-dominated work): what a training step runs of an
//!   MLP compiled at `-O1`, through the JIT kernels of a plan: a chain of blocked
//!   layers (local batch 1024, widths 512 → 512 → 256 → 64), each `brgemm` with
//!   its ReLU forward, then `brgemm_wgrad` and (but for the first layer)
//!   `brgemm_dgrad` with the ReLU mask fused backward; the flops as the planner
//!   counts them (`2·S·N·K` a GEMM) over the best time of several chains on the
//!   rank's threads.
//! - **Memory GB/s** (embedding gathers): the JIT `embedding_bag` (sum, 20 rows a
//!   bag, random rows of a 256 MiB table, far larger than the caches), counting the
//!   rows gathered, the indices and the results.
//! - **Network** (alpha-beta): `all_to_all_v` between the ranks of the job's
//!   communicator: N threads of this process (`--ranks`, the thread backend of
//!   `dlrm-run`), or the processes of `mpirun -n N dlrmc calibrate --comm mpi`. The
//!   latency is the best time of an exchange of one float per peer; the bandwidth
//!   is the bytes a rank sends in a 4 MiB-per-peer exchange over its best time less
//!   that latency (each time the slowest rank's, as the cost model takes; after a
//!   warm-up, with the same buffers every time: no allocation or page fault is
//!   timed; the time includes one copy of the received values, as a step unpacks
//!   them).
//!
//! The file (JSON, written atomically) is `--output`, else the default path
//! ([`default_path`]: `$DLRMC_CALIBRATION`, else
//! `$XDG_CACHE_HOME/dlrmc/calibration.json`, else
//! `~/.cache/dlrmc/calibration.json`). `dlrmc plan-shards`, `dlrmc compile` and
//! `dlrm-run` read it when `--machine`/`--network` are not given
//! ([`shard_settings`], behind their planner flags); `DLRMC_CALIBRATION=none`
//! turns that off.
//!
//! This is the runtime's: the rates are those of the kernels (the codegen JIT,
//! run as the executor runs a plan's nodes) and the communicators (thread ranks,
//! MPI) a job runs on, and the file feeds the placement of a plan on N ranks
//! ([`ShardSettings`], [`crate::launch::shard`]); `dlrmc calibrate` only parses
//! its flags and prints.

use crate::error::{Result, RuntimeError};
use crate::launch::shard::{Rates, ShardSettings};
use dlrm_codegen::jit::{self, JitOptions};
use dlrm_ir::Op::{BlockAct, BlockWeight, Brgemm, BrgemmDgrad, BrgemmWgrad};
use dlrm_ir::{
    Act, Communicator, DType, Dim, LocalGroup, NodeInstance, Op, Pool, Tensor, TensorType,
};
use dlrm_passes::egraph::extract::block_for;
use dlrm_passes::shard::{Machine, Network};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The calibration file's `format` value.
pub const FORMAT: &str = "dlrmc-calibration";

/// Measured rates of one machine (the calibration file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Always [`FORMAT`].
    pub format: String,
    /// The CPU (`model name` of `/proc/cpuinfo`, or the architecture).
    pub cpu: String,
    /// Worker threads of one rank during the compute measurements.
    pub threads: usize,
    /// Ranks of the network measurement, and how they talk (`threads` or `mpi`).
    pub ranks: usize,
    /// `threads` or `mpi`.
    pub comm: String,
    /// One rank's compute and memory rates.
    pub machine: Machine,
    /// Latency and bandwidth between ranks.
    pub network: Network,
    /// Seconds since the Unix epoch when it was measured.
    pub measured_at: u64,
}

/// The sharding planner's settings, with `mem_per_rank` bytes of tables per
/// rank: the rates `machine`/`network` (the `--machine`/`--network` flags) when
/// given, else the calibration's (the file `calibration`, else the default file
/// [`default_path`] when it exists), else the built-in guesses; `bucket_bytes`
/// (`None`: the default). An unreadable or invalid calibration file is an error.
pub fn shard_settings(
    mem_per_rank: u64,
    machine: Option<Machine>,
    network: Option<Network>,
    calibration: Option<&Path>,
    bucket_bytes: Option<u64>,
) -> Result<ShardSettings> {
    let d = ShardSettings::default();
    let path = match calibration {
        Some(p) => Some(p.to_path_buf()),
        None => default_path().filter(|p| p.exists()),
    };
    let measured = match (machine.is_some() && network.is_some(), path) {
        (false, Some(p)) => Some(read(&p)?),
        _ => None,
    };
    let rates = match (machine.is_some() || network.is_some(), &measured) {
        (true, _) => Rates::Flags,
        (false, Some(_)) => Rates::Calibrated,
        (false, None) => Rates::Default,
    };
    let (m, n) = match measured {
        Some(c) => (c.machine, c.network),
        None => (d.machine, d.network),
    };
    Ok(ShardSettings {
        mem_per_rank,
        network: network.unwrap_or(n),
        machine: machine.unwrap_or(m),
        bucket_bytes: bucket_bytes.unwrap_or(d.bucket_bytes),
        rates,
    })
}

/// What to measure with.
#[derive(Clone, Copy, Debug)]
pub struct CalibrateOptions {
    /// Worker threads of one rank.
    pub threads: usize,
    /// Thread ranks of the network measurement (ignored under MPI).
    pub ranks: usize,
    /// Fewer repetitions (a rougher, faster measurement).
    pub quick: bool,
}

/// Measures every rate; `comm` is the MPI communicator when run under `mpirun`
/// (every process calls this; all measure compute, all take part in the
/// exchanges). `say` reports each measurement as it finishes.
pub fn measure(
    opts: CalibrateOptions,
    comm: Option<&dyn Communicator>,
    say: &mut dyn FnMut(&str),
) -> Result<Calibration> {
    if opts.threads == 0 {
        return Err(RuntimeError::Options("--threads must be at least 1".into()));
    }
    if comm.is_none() && opts.ranks < 2 {
        return Err(RuntimeError::Options(
            "--ranks must be at least 2 to measure exchanges between ranks".into(),
        ));
    }
    let reps = if opts.quick { 3 } else { 10 };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .build()
        .map_err(|e| {
            RuntimeError::Calibration(format!("cannot start {} threads: {e}", opts.threads))
        })?;
    let gflops = pool.install(|| dense_gflops(reps))?;
    let widths = DENSE_WIDTHS.map(|w| w.to_string()).join("-");
    say(&format!(
        "GEMM (brgemm chain {widths}, batch {DENSE_BATCH}, forward and backward): {gflops:.1} GFLOP/s"
    ));
    let mem_gbps = pool.install(|| gather_gbps(reps))?;
    say(&format!(
        "embedding gather (256 MiB table, 20 rows a bag): {mem_gbps:.2} GB/s"
    ));
    let (network, ranks, how) = match comm {
        Some(c) => (exchange_rates(c, reps)?, c.size(), "mpi"),
        None => (
            thread_exchange_rates(opts.ranks, reps)?,
            opts.ranks,
            "threads",
        ),
    };
    say(&format!(
        "all_to_all_v between {ranks} ranks ({how}): {:.1} µs, {:.2} GB/s",
        network.latency_us, network.gbps
    ));
    Ok(Calibration {
        format: FORMAT.into(),
        cpu: cpu_name(),
        threads: opts.threads,
        ranks,
        comm: how.into(),
        machine: Machine { gflops, mem_gbps },
        network,
        measured_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    })
}

/// The best time of `reps` calls of `f` after one warm-up call.
fn best_of(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best.max(1e-9))
}

/// Runs one JIT kernel; an op without a JIT kernel on this CPU is an error.
fn jit_eval(op: &Op, ins: &[&Tensor], out: &TensorType, b: usize) -> Result<Vec<Tensor>> {
    let syms = HashMap::from([("B".to_string(), b)]);
    let outs = std::slice::from_ref(out);
    match jit::try_eval(op, ins, outs, &syms, &JitOptions::default()) {
        Some(r) => r.map_err(|e| failed(op, e)),
        None => Err(no_jit(op)),
    }
}

/// A fixed xorshift64 stream (the measurements need spread data, not randomness).
fn xorshift(mut x: u64) -> impl Iterator<Item = u64> {
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    })
}

/// `n` values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    xorshift(seed)
        .take(n)
        .map(|x| (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        .collect()
}

/// The local batch of the dense chain [`dense_gflops`] times (dlrm-small's
/// global batch of 2048 on 2 ranks).
const DENSE_BATCH: usize = 1024;

/// The widths of the dense chain's activations: three layers of DLRM-like
/// widths, 512 → 512 → 256 → 64.
const DENSE_WIDTHS: [usize; 4] = [512, 512, 256, 64];

/// One blocked layer of the dense chain: its blocked weight and bias, and the
/// verified instances of its three kernels (built once, as a plan keeps them).
struct DenseLayer {
    w: Tensor,
    b: Tensor,
    fwd: Instance,
    wgrad: Instance,
    /// `None` for the first layer (a step computes no gradient of its input).
    dgrad: Option<Instance>,
    /// Flops of one of its GEMMs as the planner counts them (`2·S·N·K`).
    flops: f64,
}

/// A node instance with the declared types of its results.
struct Instance {
    inst: NodeInstance,
    outs: Vec<TensorType>,
}

impl Instance {
    /// The instance of `op` on operands of these types (the results inferred).
    fn of(op: Op, ins: &[&Tensor]) -> Result<Instance> {
        let tys: Vec<TensorType> = ins.iter().map(|t| ty_of(t)).collect();
        let refs: Vec<&TensorType> = tys.iter().collect();
        let bad = |e: String| RuntimeError::Calibration(format!("`{}`: {e}", op.mnemonic()));
        let outs = dlrm_ir::infer(&op, &refs, &[]).map_err(bad)?;
        let inst = NodeInstance::of_operands(&op, ins, &outs, &HashMap::new()).map_err(bad)?;
        Ok(Instance { inst, outs })
    }

    /// Runs its JIT kernel, as the executor runs a plan's node, and returns the
    /// first result; an op without a JIT kernel on this CPU is an error.
    fn run(&self, ins: &[&Tensor]) -> Result<Tensor> {
        let op = self.inst.op();
        let syms = HashMap::new();
        match jit::try_eval_instance(&self.inst, ins, &self.outs, &syms, &JitOptions::default()) {
            Some(r) => first(op, r.map_err(|e| failed(op, e))?),
            None => Err(no_jit(op)),
        }
    }
}

/// The type of `t`: its dtype and fixed dims.
fn ty_of(t: &Tensor) -> TensorType {
    TensorType::new(t.dtype(), t.shape.iter().map(|&d| Dim::Fixed(d)))
}

/// The first of `op`'s results.
fn first(op: &Op, results: Vec<Tensor>) -> Result<Tensor> {
    results
        .into_iter()
        .next()
        .ok_or_else(|| RuntimeError::Calibration(format!("`{}` gave no result", op.mnemonic())))
}

fn failed(op: &Op, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Calibration(format!("`{}` failed: {e}", op.mnemonic()))
}

fn no_jit(op: &Op) -> RuntimeError {
    RuntimeError::Calibration(format!(
        "no JIT kernel for `{}` on this CPU: nothing to calibrate with",
        op.mnemonic()
    ))
}

/// The one result of `op` (a re-layout) on `x`, by the interpreter: set-up,
/// not timed.
fn relayout(op: Op, x: &Tensor) -> Result<Tensor> {
    let out = dlrm_ir::infer(&op, &[&ty_of(x)], &[])
        .map_err(|e| RuntimeError::Calibration(format!("`{}`: {e}", op.mnemonic())))?;
    let syms = HashMap::new();
    let ctx = dlrm_ir::interp::EvalCtx {
        syms: &syms,
        comm: &dlrm_ir::SingleRank,
    };
    let results = dlrm_ir::interp::eval_op(&op, &[x], &out, &ctx).map_err(|e| failed(&op, e))?;
    first(&op, results)
}

/// The layers of the dense chain, and the blocked input of the first; block
/// sizes as the `contract` rules choose them (`block_for`), so that consecutive
/// layers agree.
fn dense_chain() -> Result<(Tensor, Vec<DenseLayer>)> {
    let s = DENSE_BATCH;
    let k0 = DENSE_WIDTHS[0];
    let x = Tensor::f32(vec![s, k0], values(s * k0, 1));
    let bk0 = block_for(k0, None);
    let xb = relayout(
        BlockAct {
            bk: bk0,
            dtype: DType::F32,
        },
        &x,
    )?;
    let mut layers = Vec::new();
    let mut act = xb.clone();
    for (i, pair) in DENSE_WIDTHS.windows(2).enumerate() {
        let (k, n) = (pair[0], pair[1]);
        let (bn, bk) = (block_for(n, None), block_for(k, None));
        let seed = 2 + 2 * i as u64;
        let w = Tensor::f32(vec![n, k], values(n * k, seed));
        let w = relayout(BlockWeight { bn, bk }, &w)?;
        let b = Tensor::f32(vec![n], values(n, seed + 1));
        let fwd = Instance::of(Brgemm { act: Act::Relu }, &[&act, &w, &b])?;
        let y = fwd.run(&[&act, &w, &b])?;
        // The gradient reaching this layer's output has its output's type.
        let wgrad = Instance::of(BrgemmWgrad { act: Act::None, n }, &[&y, &act])?;
        let dgrad = match i {
            0 => None,
            _ => Some(Instance::of(
                BrgemmDgrad {
                    act: Act::None,
                    mask: Act::Relu,
                    dtype: DType::F32,
                },
                &[&y, &w, &act],
            )?),
        };
        let flops = 2.0 * (s * n * k) as f64;
        layers.push(DenseLayer {
            w,
            b,
            fwd,
            wgrad,
            dgrad,
            flops,
        });
        act = y;
    }
    Ok((xb, layers))
}

/// One training step's dense chain on `xb`: every layer forward (`brgemm` with
/// its ReLU), then backward from the last layer: `brgemm_wgrad` (weight and bias
/// gradients) and, but for the first layer, `brgemm_dgrad` with the previous
/// layer's ReLU mask fused, as `-O1` compiles an MLP's training step.
fn dense_step(xb: &Tensor, layers: &[DenseLayer]) -> Result<()> {
    let mut ys: Vec<Tensor> = Vec::with_capacity(layers.len());
    for l in layers {
        let x = ys.last().unwrap_or(xb);
        let y = l.fwd.run(&[x, &l.w, &l.b])?;
        ys.push(y);
    }
    // The loss gradient: the last layer's output stands in for it (same type).
    let Some(mut dz) = ys.pop() else {
        return Ok(());
    };
    let xs: Vec<&Tensor> = std::iter::once(xb).chain(&ys).collect();
    for (l, x) in layers.iter().zip(xs).rev() {
        std::hint::black_box(l.wgrad.run(&[&dz, x])?);
        if let Some(d) = &l.dgrad {
            dz = d.run(&[&dz, &l.w, x])?;
        }
    }
    Ok(())
}

/// GFLOP/s of the dense chain of a training step ([`dense_step`]), counted as
/// the planner counts a step's dense work: `2·S·N·K` per GEMM.
fn dense_gflops(reps: usize) -> Result<f64> {
    let (xb, layers) = dense_chain()?;
    let flops: f64 = layers
        .iter()
        .map(|l| l.flops * if l.dgrad.is_some() { 3.0 } else { 2.0 })
        .sum();
    let secs = best_of(reps, || dense_step(&xb, &layers))?;
    Ok(flops / secs / 1e9)
}

fn gather_gbps(reps: usize) -> Result<f64> {
    let (rows, d, batch, pool) = (1usize << 20, 64usize, 2048usize, 20usize);
    let table = Tensor::f32(vec![rows, d], values(rows * d, 4));
    let idx: Vec<i64> = xorshift(0x9e37_79b9_7f4a_7c15)
        .take(batch * pool)
        .map(|x| (x % rows as u64) as i64)
        .collect();
    let idx = Tensor::i64(vec![batch, pool], idx);
    let out = TensorType::new(DType::F32, [Dim::batch(), Dim::Fixed(d)]);
    let op = Op::EmbeddingBag {
        mode: Pool::Sum,
        last_offset: false,
    };
    let secs = best_of(reps, || {
        jit_eval(&op, &[&table, &idx], &out, batch).map(drop)
    })?;
    let bytes = batch * pool * (d * 4 + 8) + batch * d * 4;
    Ok(bytes as f64 / secs / 1e9)
}

/// Floats per peer of the bandwidth exchange (4 MiB).
const BIG: usize = 1 << 20;

/// Untimed exchanges of each size before the timed ones (first touches of the
/// buffers, the transport's connection set-up).
const WARMUP: usize = 2;

/// Latency and bandwidth of `all_to_all_v` on `comm` (every rank calls this).
/// Each exchange is timed between barriers and counts as its slowest rank's time;
/// the best of `reps` such times is taken (the noise of a shared machine only ever
/// adds time). The buffers a rank receives are the ones it sends next, so after
/// the warm-up no exchange allocates or page-faults (as in a training step, whose
/// allocator keeps its pages across steps); the time includes one copy of the
/// received values (what a step does with them), else an exchange between thread
/// ranks, which hands over the buffers, would take no time whatever its size.
fn exchange_rates(comm: &dyn Communicator, reps: usize) -> Result<Network> {
    let peers = comm.size();
    let best = |floats: usize| -> Result<f64> {
        let mut bufs = vec![vec![1.0f32; floats]; peers];
        let mut used = vec![0.0f32; floats * peers];
        let mut best = f64::INFINITY;
        for i in 0..WARMUP + reps {
            comm.barrier().map_err(comm_err)?;
            let t = Instant::now();
            bufs = comm.all_to_all_v(bufs).map_err(comm_err)?;
            // The values received are used: copied out once, as `all_to_all`
            // unpacks them into its results (thread ranks move the buffers
            // themselves, so this copy is all their exchange costs).
            for (dst, b) in used.chunks_mut(floats).zip(&bufs) {
                dst.copy_from_slice(b);
            }
            std::hint::black_box(&used);
            let mine = t.elapsed().as_secs_f32();
            // Every rank's time to every rank: each takes the slowest.
            let all = comm
                .all_to_all_v(vec![vec![mine]; peers])
                .map_err(comm_err)?;
            let slowest = all.iter().flatten().copied().fold(mine, f32::max);
            if i >= WARMUP {
                best = best.min(f64::from(slowest));
            }
        }
        Ok(best)
    };
    let alpha = best(1)?;
    let big = best(BIG)?;
    let bytes = ((peers - 1) * BIG * 4) as f64;
    let gbps = bytes / (big - alpha).max(1e-9) / 1e9;
    Ok(Network {
        latency_us: alpha * 1e6,
        gbps,
    })
}

/// [`exchange_rates`] between `ranks` threads of this process.
fn thread_exchange_rates(ranks: usize, reps: usize) -> Result<Network> {
    let comms = LocalGroup::new(ranks);
    let results: Vec<Result<Network>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| s.spawn(move || exchange_rates(c, reps)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(RuntimeError::Calibration("a rank thread panicked".into()))
                })
            })
            .collect()
    });
    // Every rank saw the same slowest times: rank 0's rates are the job's.
    let rates = results.into_iter().collect::<Result<Vec<Network>>>()?;
    rates
        .into_iter()
        .next()
        .ok_or_else(|| RuntimeError::Calibration("no ranks".into()))
}

fn comm_err(e: dlrm_ir::IrError) -> RuntimeError {
    RuntimeError::Calibration(format!("all_to_all_v failed: {e}"))
}

/// The CPU's model name, or the architecture when `/proc/cpuinfo` has none.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Where the calibration is kept when no `--output`/`--calibration` is given:
/// `$DLRMC_CALIBRATION` (`none`: nowhere), else
/// `$XDG_CACHE_HOME/dlrmc/calibration.json`, else
/// `$HOME/.cache/dlrmc/calibration.json`.
pub fn default_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DLRMC_CALIBRATION") {
        return (p != "none" && !p.is_empty()).then(|| PathBuf::from(p));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("dlrmc").join("calibration.json"))
}

/// Writes `c` to `path` atomically (its directory created if needed).
pub fn write(path: &Path, c: &Calibration) -> Result<()> {
    let json =
        serde_json::to_vec_pretty(c).map_err(|e| RuntimeError::Calibration(e.to_string()))?;
    let dir = dlrm_data::durable::parent_of(path);
    std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
    dlrm_data::durable::write_file_atomic(path, &json).map_err(|e| io_err(path, e))
}

/// Reads a calibration file, checking its format and that every rate is positive.
pub fn read(path: &Path) -> Result<Calibration> {
    let bytes = std::fs::read(path).map_err(|e| io_err(path, e))?;
    let bad = |why: String| RuntimeError::Calibration(format!("{}: {why}", path.display()));
    let c: Calibration = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
    if c.format != FORMAT {
        return Err(bad(format!("format `{}`, expected `{FORMAT}`", c.format)));
    }
    let rates = [
        c.machine.gflops,
        c.machine.mem_gbps,
        c.network.gbps,
        c.network.latency_us + 1.0,
    ];
    if rates.iter().any(|r| !r.is_finite() || *r <= 0.0) {
        return Err(bad(
            "a rate is not a positive number (measure again with `dlrmc calibrate`)".into(),
        ));
    }
    Ok(c)
}

fn io_err(path: &Path, e: std::io::Error) -> RuntimeError {
    RuntimeError::Calibration(format!("{}: {e}", path.display()))
}
