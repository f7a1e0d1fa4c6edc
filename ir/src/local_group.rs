//! [`LocalGroup`]: ranks as threads of one process (the embedded default backend).
//!
//! Ranks talk point to point through per-rank mailboxes: `send` appends a buffer to
//! the receiver's queue for this sender (never blocks), `recv` waits for the next
//! buffer from one sender. Every rank issues the same collectives in the same order,
//! and each collective's pairwise message pattern is symmetric, so per-sender FIFO
//! order matches each message with the collective that sent it; no global barrier
//! is needed between collectives.
//!
//! Allreduce algorithms, chosen by message size as the Aluminum library does
//! (`docs/parallel.md`, "Collectives"):
//! - [`AllReduceAlgo::RecursiveDoubling`] (latency-bound small messages):
//!   `log2 p` pairwise exchanges of the whole buffer; with a rank count that is not a
//!   power of two the extra ranks first fold their data into a partner and get the
//!   result back at the end;
//! - [`AllReduceAlgo::Ring`] (bandwidth-bound large messages): reduce-scatter then
//!   all-gather around the ring, `2 (n-1)/n` of the buffer sent per rank;
//! - [`AllReduceAlgo::Auto`] (default): recursive doubling up to
//!   [`SMALL_ALLREDUCE`] elements, ring above.
//!
//! Determinism: every rank receives bit-identical sums (each partial sum is formed
//! by one rank, or by two ranks adding the same two operands, and float addition is
//! commutative); the summation order differs from a sequential rank-order sum, so
//! results match one rank up to float reassociation.
//!
//! Failure: [`Communicator::abort`] records the first reason and wakes every rank
//! waiting in a `recv`; their pending and future collectives return that reason.

use crate::comm::{Communicator, batch_slice};
use crate::error::{IrError, Result};
use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Largest allreduce, in elements, that [`AllReduceAlgo::Auto`] runs with recursive
/// doubling (Aluminum's measured switch point, `docs/parallel.md`); larger ones use
/// the ring.
pub const SMALL_ALLREDUCE: usize = 512;

/// How a [`LocalGroup`] sums buffers across ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AllReduceAlgo {
    /// Recursive doubling up to [`SMALL_ALLREDUCE`] elements, ring above.
    #[default]
    Auto,
    /// Pairwise exchanges of the whole buffer, `log2 p` rounds.
    RecursiveDoubling,
    /// Reduce-scatter + all-gather around a ring.
    Ring,
}

impl AllReduceAlgo {
    /// Every algorithm, for `--help` texts and tests.
    pub const ALL: [AllReduceAlgo; 3] = [
        AllReduceAlgo::Auto,
        AllReduceAlgo::RecursiveDoubling,
        AllReduceAlgo::Ring,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            AllReduceAlgo::Auto => "auto",
            AllReduceAlgo::RecursiveDoubling => "doubling",
            AllReduceAlgo::Ring => "ring",
        }
    }

    /// The algorithm that runs for a buffer of `len` elements.
    pub fn resolve(self, len: usize) -> AllReduceAlgo {
        match self {
            AllReduceAlgo::Auto if len <= SMALL_ALLREDUCE => AllReduceAlgo::RecursiveDoubling,
            AllReduceAlgo::Auto => AllReduceAlgo::Ring,
            other => other,
        }
    }
}

impl fmt::Display for AllReduceAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AllReduceAlgo {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        AllReduceAlgo::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| format!("unknown allreduce algorithm `{s}` (auto, doubling, ring)"))
    }
}

/// A group of ranks that are threads of one process.
pub struct LocalGroup;

/// One rank's incoming buffers, a FIFO queue per sender.
struct Mailbox {
    queues: Mutex<Vec<VecDeque<Vec<f32>>>>,
    cv: Condvar,
}

struct Shared {
    size: usize,
    algo: AllReduceAlgo,
    boxes: Vec<Mailbox>,
    aborted: AtomicBool,
    reason: Mutex<Option<String>>,
}

/// One rank's handle on a [`LocalGroup`].
#[derive(Clone)]
pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
}

impl LocalGroup {
    /// Creates a group of `size` ranks with the [`AllReduceAlgo::Auto`] choice; hand
    /// element `r` to the thread of rank `r`. `size` must be at least 1.
    #[expect(
        clippy::new_ret_no_self,
        reason = "a group is handed out as one handle per rank"
    )]
    pub fn new(size: usize) -> Vec<LocalComm> {
        LocalGroup::with_algo(size, AllReduceAlgo::Auto)
    }

    /// Creates a group of `size` ranks (at least 1) whose allreduce uses `algo`.
    pub fn with_algo(size: usize, algo: AllReduceAlgo) -> Vec<LocalComm> {
        assert!(size >= 1, "a group has at least one rank");
        let shared = Arc::new(Shared {
            size,
            algo,
            boxes: (0..size)
                .map(|_| Mailbox {
                    queues: Mutex::new(vec![VecDeque::new(); size]),
                    cv: Condvar::new(),
                })
                .collect(),
            aborted: AtomicBool::new(false),
            reason: Mutex::new(None),
        });
        (0..size)
            .map(|rank| LocalComm {
                rank,
                shared: Arc::clone(&shared),
            })
            .collect()
    }
}

/// Locks a mutex whose data stays consistent even if a holder panicked (queues of
/// whole buffers, an abort reason).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LocalComm {
    /// The group's allreduce algorithm.
    pub fn algo(&self) -> AllReduceAlgo {
        self.shared.algo
    }

    fn aborted(&self) -> Option<IrError> {
        if !self.shared.aborted.load(Ordering::Acquire) {
            return None;
        }
        let why = lock(&self.shared.reason)
            .clone()
            .unwrap_or_else(|| "group aborted".into());
        Some(IrError::Comm(why))
    }

    fn send(&self, to: usize, buf: Vec<f32>) -> Result<()> {
        if let Some(e) = self.aborted() {
            return Err(e);
        }
        let mb = &self.shared.boxes[to];
        lock(&mb.queues)[self.rank].push_back(buf);
        mb.cv.notify_all();
        Ok(())
    }

    fn recv(&self, from: usize) -> Result<Vec<f32>> {
        let mb = &self.shared.boxes[self.rank];
        let mut q = lock(&mb.queues);
        loop {
            if let Some(buf) = q[from].pop_front() {
                return Ok(buf);
            }
            if let Some(e) = self.aborted() {
                return Err(e);
            }
            q = mb.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Receives from `from` a buffer that must hold `want` elements; a mismatch
    /// (ranks calling with different lengths) aborts the group.
    fn recv_len(&self, from: usize, want: usize, what: &str) -> Result<Vec<f32>> {
        let buf = self.recv(from)?;
        if buf.len() != want {
            let why = format!(
                "{what} length mismatch: rank {} expects {want} values, rank {from} sent {}",
                self.rank,
                buf.len()
            );
            self.abort(&why);
            return Err(IrError::Comm(why));
        }
        Ok(buf)
    }

    fn all_reduce_doubling(&self, data: &mut [f32]) -> Result<()> {
        let (n, r) = (self.shared.size, self.rank);
        let p = 1usize << n.ilog2();
        let extra = n - p;
        if r >= p {
            // Fold into rank r - p, get the result back.
            self.send(r - p, data.to_vec())?;
            let res = self.recv_len(r - p, data.len(), "all_reduce")?;
            data.copy_from_slice(&res);
            return Ok(());
        }
        if r < extra {
            let other = self.recv_len(r + p, data.len(), "all_reduce")?;
            add_into(data, &other);
        }
        let mut mask = 1;
        while mask < p {
            let partner = r ^ mask;
            self.send(partner, data.to_vec())?;
            let other = self.recv_len(partner, data.len(), "all_reduce")?;
            add_into(data, &other);
            mask <<= 1;
        }
        if r < extra {
            self.send(r + p, data.to_vec())?;
        }
        Ok(())
    }

    fn all_reduce_ring(&self, data: &mut [f32]) -> Result<()> {
        let (n, r) = (self.shared.size, self.rank);
        let len = data.len();
        let chunk = |c: usize| batch_slice(len, n, c % n);
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        // Reduce-scatter: after step s, chunk r-s-1 holds s+2 ranks' values here.
        for s in 0..n - 1 {
            let out = chunk(r + n - s);
            self.send(right, data[out].to_vec())?;
            let into = chunk(r + 2 * n - s - 1);
            let part = self.recv_len(left, into.len(), "all_reduce")?;
            add_into(&mut data[into], &part);
        }
        // All-gather: rank r now owns the complete chunk r+1.
        for s in 0..n - 1 {
            let out = chunk(r + 1 + n - s);
            self.send(right, data[out].to_vec())?;
            let into = chunk(r + n - s);
            let full = self.recv_len(left, into.len(), "all_reduce")?;
            data[into].copy_from_slice(&full);
        }
        Ok(())
    }
}

fn add_into(acc: &mut [f32], other: &[f32]) {
    for (a, b) in acc.iter_mut().zip(other) {
        *a += *b;
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<()> {
        if self.shared.size == 1 {
            return match self.aborted() {
                Some(e) => Err(e),
                None => Ok(()),
            };
        }
        match self.shared.algo.resolve(data.len()) {
            AllReduceAlgo::Ring => self.all_reduce_ring(data),
            _ => self.all_reduce_doubling(data),
        }
    }

    fn all_to_all_v(&self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>> {
        let n = self.shared.size;
        if send.len() != n {
            return Err(IrError::Comm(format!(
                "all_to_all_v on rank {} with {} buffers for {n} ranks",
                self.rank,
                send.len()
            )));
        }
        let mut recv: Vec<Vec<f32>> = vec![Vec::new(); n];
        for (to, buf) in send.into_iter().enumerate() {
            if to == self.rank {
                recv[to] = buf;
            } else {
                self.send(to, buf)?;
            }
        }
        for (from, slot) in recv.iter_mut().enumerate() {
            if from != self.rank {
                *slot = self.recv(from)?;
            }
        }
        Ok(recv)
    }

    fn all_reduce_algo(&self) -> String {
        self.shared.algo.name().to_string()
    }

    fn barrier(&self) -> Result<()> {
        // Dissemination barrier: ceil(log2 n) rounds.
        let (n, r) = (self.shared.size, self.rank);
        let mut step = 1;
        while step < n {
            self.send((r + step) % n, Vec::new())?;
            self.recv((r + n - step) % n)?;
            step <<= 1;
        }
        match self.aborted() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn abort(&self, reason: &str) {
        {
            let mut why = lock(&self.shared.reason);
            if why.is_none() {
                *why = Some(format!("rank {} failed: {reason}", self.rank));
            }
        }
        self.shared.aborted.store(true, Ordering::Release);
        // Take each mailbox's lock before notifying: a rank that checked the flag
        // before it was set is then already waiting and gets the wake-up.
        for mb in &self.shared.boxes {
            let _q = lock(&mb.queues);
            mb.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{AllReduceAlgo, LocalComm, LocalGroup, SMALL_ALLREDUCE};
    use crate::comm::Communicator;
    use std::thread;

    fn on_ranks<T: Send + 'static>(
        comms: Vec<LocalComm>,
        f: impl Fn(LocalComm) -> T + Send + Sync + Clone + 'static,
    ) -> Vec<T> {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                let f = f.clone();
                thread::spawn(move || f(c))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    }

    fn value(rank: usize, i: usize) -> f32 {
        // Not exactly representable sums: exercises reassociation.
        ((rank * 7919 + i * 104_729) % 1000) as f32 * 0.013 - 6.0
    }

    #[test]
    fn every_algorithm_sums_identically_on_every_rank() {
        for algo in AllReduceAlgo::ALL {
            for n in [1usize, 2, 3, 4, 5, 6, 7, 8, 12] {
                for len in [0usize, 1, 3, 11, SMALL_ALLREDUCE + 1, 2000] {
                    let out = on_ranks(LocalGroup::with_algo(n, algo), move |c| {
                        let mut v: Vec<f32> = (0..len).map(|i| value(c.rank(), i)).collect();
                        // Twice in a row: messages of consecutive calls must not mix.
                        c.all_reduce_sum(&mut v).expect("allreduce");
                        let mut w: Vec<f32> = (0..len).map(|i| value(c.rank() + 1, i)).collect();
                        c.all_reduce_sum(&mut w).expect("allreduce");
                        (v, w)
                    });
                    for i in 0..len {
                        let want: f64 = (0..n).map(|r| f64::from(value(r, i))).sum();
                        let got = f64::from(out[0].0[i]);
                        assert!(
                            (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "{algo} n={n} len={len} [{i}]: {got} vs {want}"
                        );
                    }
                    for o in &out {
                        assert_eq!(o, &out[0], "{algo} n={n} len={len}: ranks disagree bitwise");
                    }
                }
            }
        }
    }

    #[test]
    fn auto_switches_at_the_small_message_size() {
        assert_eq!(
            AllReduceAlgo::Auto.resolve(SMALL_ALLREDUCE),
            AllReduceAlgo::RecursiveDoubling
        );
        assert_eq!(
            AllReduceAlgo::Auto.resolve(SMALL_ALLREDUCE + 1),
            AllReduceAlgo::Ring
        );
        assert_eq!(AllReduceAlgo::Ring.resolve(1), AllReduceAlgo::Ring);
        for a in AllReduceAlgo::ALL {
            assert_eq!(a.name().parse::<AllReduceAlgo>(), Ok(a));
        }
        assert!("tree".parse::<AllReduceAlgo>().is_err());
    }

    #[test]
    fn length_mismatch_is_an_error_and_nobody_hangs() {
        for algo in [AllReduceAlgo::RecursiveDoubling, AllReduceAlgo::Ring] {
            let out = on_ranks(LocalGroup::with_algo(3, algo), |c| {
                let mut v = vec![1.0f32; 700 + c.rank()];
                c.all_reduce_sum(&mut v).map_err(|e| e.to_string())
            });
            assert!(
                out.iter()
                    .any(|r| r.as_ref().is_err_and(|e| e.contains("length mismatch"))),
                "{algo}: {out:?}"
            );
            // (A rank whose received chunks happened to fit may finish: as with MPI,
            // the group's error is reported by the ranks that saw it; none hangs.)
        }
    }

    #[test]
    fn all_to_all_and_allreduce_interleave() {
        let out = on_ranks(LocalGroup::new(5), |c| {
            let mut got = Vec::new();
            for round in 0..3 {
                let send = (0..5)
                    .map(|d| vec![(round * 100 + c.rank() * 10 + d) as f32; d + round])
                    .collect();
                got.push(c.all_to_all_v(send).expect("a2a"));
                let mut v = vec![c.rank() as f32; 3];
                c.all_reduce_sum(&mut v).expect("allreduce");
                assert_eq!(v, vec![10.0; 3]);
                c.barrier().expect("barrier");
            }
            got
        });
        for (r, rounds) in out.iter().enumerate() {
            for (round, recv) in rounds.iter().enumerate() {
                for (s, buf) in recv.iter().enumerate() {
                    assert_eq!(buf, &vec![(round * 100 + s * 10 + r) as f32; r + round]);
                }
            }
        }
    }

    #[test]
    fn abort_wakes_ranks_waiting_in_any_collective() {
        let out = on_ranks(LocalGroup::new(4), |c| match c.rank() {
            1 => {
                c.abort("boom");
                Err("aborted".to_string())
            }
            2 => {
                let mut v = vec![0.0f32; 4096];
                c.all_reduce_sum(&mut v).map_err(|e| e.to_string())
            }
            _ => c.barrier().map_err(|e| e.to_string()),
        });
        for r in [0, 2, 3] {
            assert!(
                out[r]
                    .as_ref()
                    .is_err_and(|e| e.contains("rank 1 failed: boom")),
                "rank {r}: {out:?}"
            );
        }
    }
}
