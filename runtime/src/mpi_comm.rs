//! [`MpiComm`]: the [`Communicator`] of one MPI process (`mpirun -n N dlrm-run PLAN
//! --comm mpi`), built with the `mpi` cargo feature (the `mpi` crate over the
//! system's Open MPI or MPICH). Without the feature, a stand-in of the same name
//! (`mpi_stub.rs`) fails at [`MpiComm::init`], so callers need no `cfg`.
//!
//! Invariants:
//! - Sums are bit-identical on every rank: an all-reduce is a reduce-scatter (the
//!   [`batch_slice`] chunks sent to their owners, each owner summing the ranks'
//!   parts in rank order from 0.0) followed by an all-gather of the summed chunks. The thread group ([`dlrm_ir::LocalComm`]) sums in the order of its
//!   algorithm (recursive doubling or ring), so `--comm mpi -n N` and `--ranks N`
//!   agree up to float reassociation (tested within 1e-5 relative).
//! - Every MPI call goes through one mutex over the world communicator, and MPI is
//!   initialised with `MPI_THREAD_SERIALIZED` requested, so the handle may be shared
//!   across threads (`Communicator: Send + Sync`).
//! - [`Communicator::abort`] prints the reason on this process's stderr and calls
//!   `MPI_Abort`, which ends every process of the job (no rank hangs in a
//!   collective); MPI errors use the default `MPI_ERRORS_ARE_FATAL` handler, which
//!   aborts the job the same way. On a group of one, `abort` returns and the caller
//!   reports its error normally.
//!
//! Speed (issue 24): the exchanges are point-to-point messages sent straight from
//! the caller's buffers and received straight into the results (no packing into
//! one `MPI_Alltoallv` buffer and no unpacking); an all-to-all's own part is moved,
//! its receive buffers are the send buffers of earlier exchanges, and the
//! all-reduce's scratch is kept, so a steady-state step allocates nothing here. A
//! waiting rank tests its requests, napping between tests after [`SPIN`]
//! (`DLRM_MPI_WAIT=block`: MPI's blocking calls instead, which hold a core while
//! they wait — the progress thread's polling then competes with the rank's
//! compute thread).

use crate::error::{Result, RuntimeError};
use dlrm_ir::{Communicator, IrError, batch_slice};
use mpi::Count;
use mpi::Tag;
use mpi::environment::{Threading, Universe};
use mpi::point_to_point::{Destination as _, Message, Source as _, Status};
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Equivalence as _};
use std::io::Write as _;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Message tags of the point-to-point exchanges. MPI keeps the messages of one
/// sender, tag and communicator in order, and every rank issues the collectives in
/// the same order, so the k-th message of a kind from a peer is its part of the
/// k-th exchange of that kind.
const TAG_A2A: Tag = 1;
const TAG_REDUCE: Tag = 2;
const TAG_GATHER: Tag = 3;

/// Spare buffers kept for receiving (the send buffers of earlier exchanges).
const SPARES: usize = 8;

/// This process's rank of an MPI job (the world communicator).
pub struct MpiComm {
    rank: usize,
    size: usize,
    world: Mutex<World>,
    wait: Wait,
    // Dropped last: finalises MPI.
    _universe: Universe,
}

/// The world communicator and the buffers its exchanges reuse.
struct World {
    comm: SimpleCommunicator,
    /// All-reduce: the other ranks' parts of this rank's chunk, back to back.
    parts: Vec<f32>,
    /// All-reduce: this rank's summed chunk.
    chunk: Vec<f32>,
    /// All-to-all: buffers this rank sent (moved to it by the caller), reused to
    /// receive the next exchanges' buffers (so steady-state exchanges touch no fresh
    /// pages).
    spare: Vec<Vec<f32>>,
}

/// A buffer of `n` values to receive into: the smallest of `spare` that holds
/// them, else a new one.
fn take_spare(spare: &mut Vec<Vec<f32>>, n: usize) -> Vec<f32> {
    let best = spare
        .iter()
        .enumerate()
        .filter(|(_, b)| b.capacity() >= n)
        .min_by_key(|(_, b)| b.capacity())
        .map(|(i, _)| i);
    let mut b = best.map_or_else(Vec::new, |i| spare.swap_remove(i));
    b.clear();
    b.resize(n, 0.0);
    b
}

impl World {
    /// Keeps `b` for later receives (the largest [`SPARES`] buffers are kept).
    fn keep(&mut self, b: Vec<f32>) {
        if b.capacity() == 0 {
            return;
        }
        self.spare.push(b);
        if self.spare.len() > SPARES {
            self.spare.sort_by_key(|b| std::cmp::Reverse(b.capacity()));
            self.spare.truncate(SPARES);
        }
    }
}

// SAFETY: the handle is MPI_COMM_WORLD, valid process-wide. MPI is initialised with
// MPI_THREAD_SERIALIZED requested, and every call on the handle holds the mutex of
// `MpiComm::world`, so no two threads call MPI on it at once. (If the library only
// provides a lower level, dlrm-run still calls MPI from its main thread only.)
unsafe impl Send for World {}

impl MpiComm {
    /// Initialises MPI (once per process) and returns this process's rank of the
    /// world communicator. Run under `mpirun`; started alone, a process is a group
    /// of one.
    pub fn init() -> Result<MpiComm> {
        let (universe, _provided) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| RuntimeError::Mpi {
                reason: "MPI is already initialised in this process".into(),
            })?;
        let world = universe.world();
        let rank = usize::try_from(world.rank()).map_err(|_| RuntimeError::Mpi {
            reason: format!("negative MPI rank {}", world.rank()),
        })?;
        let size = usize::try_from(world.size()).map_err(|_| RuntimeError::Mpi {
            reason: format!("negative MPI size {}", world.size()),
        })?;
        Ok(MpiComm {
            rank,
            size,
            world: Mutex::new(World {
                comm: world,
                parts: Vec::new(),
                chunk: Vec::new(),
                spare: Vec::new(),
            }),
            wait: Wait::from_env()?,
            _universe: universe,
        })
    }

    /// True: this build has MPI support.
    pub const fn available() -> bool {
        true
    }

    fn world(&self) -> MutexGuard<'_, World> {
        // A poisoned lock: a thread panicked between MPI calls; the handle is intact.
        self.world.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn comm_err(&self, what: String) -> IrError {
        IrError::Comm(format!("MPI rank {}: {what}", self.rank))
    }

    fn count(&self, n: usize) -> dlrm_ir::Result<Count> {
        Count::try_from(n).map_err(|_| {
            self.comm_err(format!(
                "a message of {n} values is more than MPI's count limit {}",
                Count::MAX
            ))
        })
    }

    /// The other ranks, starting after this one (so that not every rank receives
    /// from rank 0 first).
    fn peers(&self) -> impl Iterator<Item = usize> + use<> {
        let (me, n) = (self.rank, self.size);
        (1..n).map(move |k| (me + k) % n)
    }

    /// Aborts the job with `why` (a rank whose message does not fit the exchange).
    fn mismatch(&self, why: String) -> IrError {
        self.abort(&why);
        self.comm_err(why)
    }
}

fn rank_of(r: usize) -> mpi::Rank {
    // Ranks come from the communicator's size, an MPI `int`.
    mpi::Rank::try_from(r).unwrap_or(mpi::Rank::MAX)
}

/// How a rank waits for its messages (`DLRM_MPI_WAIT`, read once at start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// MPI's blocking calls: the library polls (and with `mpi_yield_when_idle`
    /// yields) until the message is there, holding a core meanwhile.
    Block,
    /// Non-blocking calls tested for [`SPIN`], then between naps of growing length
    /// (up to [`NAP_MAX`]): a progress thread waiting for a peer that still computes
    /// leaves the core to this process's compute thread.
    Nap,
}

/// How long a waiting rank tests without sleeping.
const SPIN: Duration = Duration::from_micros(50);
/// The longest nap between two tests.
const NAP_MAX: Duration = Duration::from_micros(200);

impl Wait {
    /// `DLRM_MPI_WAIT`: `nap` (the default, also when unset) or `block`; any
    /// other value is an error naming it.
    fn from_env() -> Result<Wait> {
        match std::env::var_os("DLRM_MPI_WAIT") {
            None => Ok(Wait::Nap),
            Some(v) if v == "nap" => Ok(Wait::Nap),
            Some(v) if v == "block" => Ok(Wait::Block),
            Some(v) => Err(RuntimeError::Mpi {
                reason: format!("DLRM_MPI_WAIT is {v:?}; it takes `nap` (the default) or `block`"),
            }),
        }
    }
}

/// Polls `poll` (each poll progresses MPI) until it returns a value, and returns
/// that value: [`SPIN`] of busy polls, then naps of growing length between polls.
fn wait_for<T>(mut poll: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    let mut nap = Duration::from_micros(5);
    loop {
        if let Some(v) = poll() {
            return v;
        }
        if t0.elapsed() < SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(nap);
            nap = (nap * 2).min(NAP_MAX);
        }
    }
}

impl MpiComm {
    /// The next message from `p` with `tag`, once it is there.
    fn probe(&self, comm: &SimpleCommunicator, p: usize, tag: Tag) -> (Message, Status) {
        let peer = comm.process_at_rank(rank_of(p));
        if self.wait == Wait::Block {
            return peer.matched_probe_with_tag(tag);
        }
        wait_for(|| peer.immediate_matched_probe_with_tag(tag))
    }

    /// Waits for every request of `reqs`.
    fn complete<'a, S: Scope<'a>>(&self, reqs: Vec<Request<'a, [f32], S>>) {
        if self.wait == Wait::Block {
            for r in reqs {
                r.wait();
            }
            return;
        }
        let mut pending = reqs;
        wait_for(|| {
            pending = std::mem::take(&mut pending)
                .into_iter()
                .filter_map(|r| r.test().err())
                .collect();
            pending.is_empty().then_some(())
        });
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    /// A reduce-scatter (chunk `r` of every rank's data sent to rank `r`, straight
    /// from `data`; each rank sums its chunk's parts in rank order from 0.0) then an
    /// all-gather of the summed chunks (received straight into `data`), as
    /// point-to-point messages: no packing, and the scratch buffers are reused.
    fn all_reduce_sum(&self, data: &mut [f32]) -> dlrm_ir::Result<()> {
        let n = self.size;
        if n == 1 {
            return Ok(());
        }
        let len = data.len();
        self.count(len)?;
        let me = self.rank;
        let mine = batch_slice(len, n, me);
        let m = mine.len();
        let mut guard = self.world();
        let w = &mut *guard;
        w.parts.clear();
        w.parts.resize(m * n, 0.0);
        // Reduce-scatter: every rank's part of my chunk into parts[r].
        let mut bad = None;
        mpi::request::scope(|scope| {
            let sends: Vec<_> = self
                .peers()
                .map(|p| {
                    let s = batch_slice(len, n, p);
                    w.comm
                        .process_at_rank(rank_of(p))
                        .immediate_send_with_tag(scope, &data[s], TAG_REDUCE)
                })
                .collect();
            for p in self.peers() {
                let (msg, status) = self.probe(&w.comm, p, TAG_REDUCE);
                let got = status.count(f32::equivalent_datatype());
                let part = &mut w.parts[p * m..(p + 1) * m];
                if got as usize == m {
                    msg.matched_receive_into(part);
                } else {
                    // Take the message (an unreceived one would be matched by the
                    // next exchange); report after the sends completed.
                    let mut sink = vec![0.0f32; usize::try_from(got).unwrap_or(0)];
                    msg.matched_receive_into(&mut sink[..]);
                    bad.get_or_insert((p, got));
                }
            }
            self.complete(sends);
        });
        if let Some((p, got)) = bad {
            return Err(self.mismatch(format!(
                "all_reduce length mismatch: rank {me} has {len} values (its chunk {m}), rank {p} sent {got} for it"
            )));
        }
        w.parts[me * m..(me + 1) * m].copy_from_slice(&data[mine.clone()]);
        // ... summed in rank order (as LocalComm does) ...
        w.chunk.clear();
        w.chunk.resize(m, 0.0);
        for part in w.parts.chunks(m.max(1)).take(n) {
            for (c, x) in w.chunk.iter_mut().zip(part) {
                *c += *x;
            }
        }
        // ... then every rank gathers every summed chunk into `data`.
        data[mine].copy_from_slice(&w.chunk);
        let (comm, chunk) = (&w.comm, &w.chunk);
        // The other ranks' chunks of `data`, each to receive into.
        let mut slots: Vec<(usize, &mut [f32])> = Vec::with_capacity(n - 1);
        let mut rest = &mut *data;
        for p in 0..n {
            let (head, tail) = rest.split_at_mut(batch_slice(len, n, p).len());
            if p != me {
                slots.push((p, head));
            }
            rest = tail;
        }
        mpi::request::scope(|scope| {
            let mut reqs: Vec<_> = self
                .peers()
                .map(|p| {
                    comm.process_at_rank(rank_of(p)).immediate_send_with_tag(
                        scope,
                        &chunk[..],
                        TAG_GATHER,
                    )
                })
                .collect();
            for (p, slot) in slots {
                reqs.push(
                    comm.process_at_rank(rank_of(p))
                        .immediate_receive_into_with_tag(scope, slot, TAG_GATHER),
                );
            }
            self.complete(reqs);
        });
        Ok(())
    }

    fn all_reduce_algo(&self) -> String {
        "mpi (point-to-point reduce-scatter in rank order + all-gather)".to_string()
    }

    /// Point-to-point: each buffer is sent as it is (no packing) and each received
    /// into a buffer of its size (found by probing: no count exchange), reusing the
    /// buffers earlier exchanges sent; this rank's own buffer is moved, not copied.
    fn all_to_all_v(&self, mut send: Vec<Vec<f32>>) -> dlrm_ir::Result<Vec<Vec<f32>>> {
        let n = self.size;
        if send.len() != n {
            return Err(self.comm_err(format!(
                "all_to_all_v with {} buffers for {n} ranks",
                send.len()
            )));
        }
        if n == 1 {
            return Ok(send);
        }
        for b in &send {
            self.count(b.len())?;
        }
        let mut guard = self.world();
        let w = &mut *guard;
        let mut recv: Vec<Vec<f32>> = vec![Vec::new(); n];
        recv[self.rank] = std::mem::take(&mut send[self.rank]);
        let (comm, spare) = (&w.comm, &mut w.spare);
        mpi::request::scope(|scope| {
            let sends: Vec<_> = self
                .peers()
                .map(|p| {
                    comm.process_at_rank(rank_of(p)).immediate_send_with_tag(
                        scope,
                        &send[p][..],
                        TAG_A2A,
                    )
                })
                .collect();
            for p in self.peers() {
                let (msg, status) = self.probe(comm, p, TAG_A2A);
                let got = usize::try_from(status.count(f32::equivalent_datatype())).unwrap_or(0);
                let mut b = take_spare(spare, got);
                msg.matched_receive_into(&mut b[..]);
                recv[p] = b;
            }
            self.complete(sends);
        });
        for b in send {
            w.keep(b);
        }
        Ok(recv)
    }

    fn barrier(&self) -> dlrm_ir::Result<()> {
        if self.size > 1 {
            self.world().comm.barrier();
        }
        Ok(())
    }

    fn abort(&self, reason: &str) {
        if self.size == 1 {
            return;
        }
        let mut err = std::io::stderr().lock();
        // Best effort: the reason is lost only if stderr is gone.
        let _ = writeln!(
            err,
            "error: MPI rank {} of {} failed, aborting the job: {reason}",
            self.rank, self.size
        );
        let _ = err.flush();
        drop(err);
        // Not through the mutex: a thread may be blocked in a collective holding it.
        SimpleCommunicator::world().abort(1);
    }
}
