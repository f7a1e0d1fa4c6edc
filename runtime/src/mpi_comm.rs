//! [`MpiComm`]: the [`Communicator`] of one MPI process (`mpirun -n N dlrm-run PLAN
//! --comm mpi`), built with the `mpi` cargo feature (the `mpi` crate over the
//! system's Open MPI or MPICH). Without the feature, a stand-in of the same name
//! (`mpi_stub.rs`) fails at [`MpiComm::init`], so callers need no `cfg`.
//!
//! Invariants:
//! - Sums are bit-identical on every rank: an all-reduce is a reduce-scatter (an
//!   all-to-all of the [`batch_slice`] chunks, each chunk's owner summing the
//!   ranks' parts in rank order from 0.0) followed by an all-gather of the summed
//!   chunks. The thread group ([`dlrm_ir::LocalComm`]) sums in the order of its
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

use crate::error::{Result, RuntimeError};
use dlrm_ir::{Communicator, IrError, batch_slice};
use mpi::Count;
use mpi::datatype::{Partition, PartitionMut};
use mpi::environment::{Threading, Universe};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _};
use std::io::Write as _;
use std::sync::{Mutex, MutexGuard};

/// This process's rank of an MPI job (the world communicator).
pub struct MpiComm {
    rank: usize,
    size: usize,
    world: Mutex<World>,
    // Dropped last: finalises MPI.
    _universe: Universe,
}

struct World(SimpleCommunicator);

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
            world: Mutex::new(World(world)),
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

    /// All-to-all of one flat buffer: `counts[r]` values (in rank order) go to rank
    /// `r`. Returns the received values in rank order and the count from each rank.
    fn exchange(&self, send: &[f32], counts: &[Count]) -> dlrm_ir::Result<(Vec<f32>, Vec<Count>)> {
        let world = self.world();
        let mut recv_counts: Vec<Count> = vec![0; self.size];
        world.0.all_to_all_into(counts, &mut recv_counts[..]);
        let total: usize = recv_counts.iter().map(|&c| c as usize).sum();
        self.count(total)?;
        let mut recv = vec![0.0f32; total];
        {
            let send_part = Partition::new(send, counts, displacements(counts));
            let rdispls = displacements(&recv_counts);
            let mut recv_part = PartitionMut::new(&mut recv[..], &recv_counts[..], rdispls);
            world.0.all_to_all_varcount_into(&send_part, &mut recv_part);
        }
        Ok((recv, recv_counts))
    }
}

/// Exclusive prefix sums of `counts`: where each rank's block starts.
fn displacements(counts: &[Count]) -> Vec<Count> {
    counts
        .iter()
        .scan(0, |acc, &c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect()
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&self, data: &mut [f32]) -> dlrm_ir::Result<()> {
        let n = self.size;
        if n == 1 {
            return Ok(());
        }
        let len = data.len();
        self.count(len)?;
        // Reduce-scatter: chunk r of everyone's data goes to rank r ...
        let counts: Vec<Count> = (0..n)
            .map(|r| batch_slice(len, n, r).len() as Count)
            .collect();
        let (parts, from) = self.exchange(data, &counts)?;
        let mine = batch_slice(len, n, self.rank);
        if let Some(bad) = from.iter().position(|&c| c as usize != mine.len()) {
            let why = format!(
                "all_reduce length mismatch: rank {} has {len} values, rank {bad} a different count",
                self.rank
            );
            self.abort(&why);
            return Err(self.comm_err(why));
        }
        // ... which sums the ranks' parts in rank order (as LocalComm does) ...
        let mut chunk = vec![0.0f32; mine.len()];
        for part in parts.chunks(mine.len().max(1)).take(n) {
            for (c, x) in chunk.iter_mut().zip(part) {
                *c += *x;
            }
        }
        // ... then every rank gathers every summed chunk.
        let world = self.world();
        let mut part = PartitionMut::new(data, &counts[..], displacements(&counts));
        world.0.all_gather_varcount_into(&chunk[..], &mut part);
        Ok(())
    }

    fn all_reduce_algo(&self) -> String {
        "mpi (MPI_Alltoallv reduce-scatter in rank order + MPI_Allgatherv)".to_string()
    }

    fn all_to_all_v(&self, send: Vec<Vec<f32>>) -> dlrm_ir::Result<Vec<Vec<f32>>> {
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
        let counts = send
            .iter()
            .map(|b| self.count(b.len()))
            .collect::<dlrm_ir::Result<Vec<Count>>>()?;
        let flat = send.concat();
        self.count(flat.len())?;
        let (recv, from) = self.exchange(&flat, &counts)?;
        let mut out = Vec::with_capacity(n);
        let mut at = 0usize;
        for c in from {
            let c = c as usize;
            out.push(recv[at..at + c].to_vec());
            at += c;
        }
        Ok(out)
    }

    fn barrier(&self) -> dlrm_ir::Result<()> {
        if self.size > 1 {
            self.world().0.barrier();
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
