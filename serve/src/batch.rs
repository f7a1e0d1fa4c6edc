//! Dynamic batching: a bounded queue of requests, merged into batches and run on
//! a pool of executors over one shared copy of the parameters.
//!
//! A request (its graph inputs, checked) enters the queue or, when the queue
//! holds `max_queue` requests already, is refused ([`Batcher::submit`]: the
//! server answers 503). Each of `instances` worker threads owns a
//! [`Session::fork`] of the model and repeatedly takes a batch: the oldest
//! request and those behind it that merge with it ([`Layout::key`], same
//! signature), until they hold `max_batch` samples, or the oldest has waited
//! `max_delay`, or the next request cannot join. A request whose deadline has
//! passed (or whose client has gone) is answered without being computed. The
//! batch's graph inputs are merged ([`Layout::merge`]), run once and split back
//! per request ([`merge::split`]); a batch is padded to the next of few sizes
//! ([`merge::bucket`]) so that the executors' kernels, compiled once per batch
//! size, are few and (with `warm_up`) compiled at start. When a merged batch fails (a bad id in one
//! request, say), each of its requests runs again alone, so that only the bad
//! one gets the error.
//!
//! The kernels run on the batcher's own thread pool: a lone executor runs its
//! loop on one of the pool's workers (a kernel's parallel loop is then a
//! fork-join among them, as in `dlrm-run`), several hand each batch to it.

use crate::merge::{self, Key, Layout};
use crate::metrics::Metrics;
use dlrm_ir::Tensor;
use dlrm_runtime::{RuntimeError, Session};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Why a request was not answered with outputs: the HTTP status and a message.
pub type Failure = (u16, String);

/// A request's answer: its outputs by name, or why not.
pub type Answer = Result<Vec<(String, Tensor)>, Failure>;

/// The batching settings.
#[derive(Clone, Copy, Debug)]
pub struct BatchOptions {
    /// The most samples merged into one batch (a larger request runs alone).
    pub max_batch: usize,
    /// How long the oldest request may wait for others to join it.
    pub max_delay: Duration,
    /// The most requests waiting in the queue.
    pub max_queue: usize,
    /// Executors (threads), each running one batch at a time.
    pub instances: usize,
    /// Compile the kernels of every padded batch size at start (one executor
    /// runs a padding batch of each while the others serve).
    pub warm_up: bool,
}

/// One queued request.
struct Job {
    inputs: HashMap<String, Tensor>,
    /// `None`: runs alone.
    key: Option<Key>,
    enqueued: Instant,
    deadline: Option<Instant>,
    reply: oneshot::Sender<Answer>,
}

impl Job {
    fn samples(&self) -> usize {
        self.key.as_ref().map_or(0, |k| k.samples)
    }
}

struct Shared {
    queue: Mutex<VecDeque<Job>>,
    /// The threads the executors' kernels run on: each batch runs *on* this
    /// pool (`install`), so a kernel's parallel loop is a fork-join among its
    /// workers, not a hand-over from the executor's thread for every kernel.
    pool: rayon::ThreadPool,
    ready: Condvar,
    opts: BatchOptions,
    layout: Option<Layout>,
    metrics: Arc<Metrics>,
    /// Set (under the queue's lock) when the batcher is dropped: the workers
    /// finish what is queued and stop, releasing their sessions.
    closed: AtomicBool,
    /// Set when the warm-up has compiled every padded batch size (at once
    /// without warm-up).
    warm: AtomicBool,
}

/// The queue and its workers (module docs). Dropping it stops the workers once
/// the queue is empty (a model swapped out is released when its last batch
/// has run).
pub struct Batcher {
    shared: Arc<Shared>,
}

impl Drop for Batcher {
    fn drop(&mut self) {
        let q = lock(&self.shared.queue);
        self.shared.closed.store(true, Ordering::SeqCst);
        drop(q);
        self.shared.ready.notify_all();
    }
}

/// The HTTP status of a failed inference: the request's fault or the server's.
pub fn status_of(e: &RuntimeError) -> u16 {
    match e {
        RuntimeError::Data { .. }
        | RuntimeError::Input { .. }
        | RuntimeError::NonFinite { .. }
        | RuntimeError::Node { .. }
        | RuntimeError::Ir(_) => 400,
        _ => 500,
    }
}

impl Batcher {
    /// Starts `opts.instances` workers, each on a fork of `session`; requests
    /// merge by `layout` (`None`: each runs alone).
    pub fn start(
        session: &Session,
        layout: Option<Layout>,
        opts: BatchOptions,
        metrics: Arc<Metrics>,
    ) -> Result<Batcher, RuntimeError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("dlrm-serve-k{i}"))
            .build()
            .map_err(|e| RuntimeError::Data {
                reason: format!("starting the kernels' threads: {e}"),
            })?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            pool,
            ready: Condvar::new(),
            opts,
            warm: AtomicBool::new(!(opts.warm_up && layout.is_some())),
            layout,
            metrics,
            closed: AtomicBool::new(false),
        });
        for i in 0..opts.instances.max(1) {
            let s = session.fork()?;
            let sh = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("dlrm-serve-{i}"))
                .spawn(move || {
                    let warm = i == 0 && opts.warm_up;
                    // One executor runs its whole loop on a worker of the pool
                    // (waiting for requests there too): no hand-over to the
                    // pool and back per batch. Several each hand their batches
                    // over, so that an idle one holds no worker of the pool.
                    if opts.instances <= 1 {
                        let pool = &sh.pool;
                        pool.install(|| worker(&sh, s, warm));
                    } else {
                        worker(&sh, s, warm);
                    }
                })
                .map_err(|e| RuntimeError::Data {
                    reason: format!("starting executor thread {i}: {e}"),
                })?;
        }
        Ok(Batcher { shared })
    }

    /// True once the kernels of every padded batch size are compiled (at once
    /// when the batcher does not warm up).
    pub fn is_warm(&self) -> bool {
        self.shared.warm.load(Ordering::SeqCst)
    }

    /// Queues a request's graph inputs (deadline: when its answer stops being
    /// wanted); the answer arrives on the returned channel. Refused, with the
    /// reason, when the queue is full.
    pub fn submit(
        &self,
        inputs: HashMap<String, Tensor>,
        deadline: Option<Instant>,
    ) -> Result<oneshot::Receiver<Answer>, String> {
        let key = self
            .shared
            .layout
            .as_ref()
            .and_then(|l| l.key(&inputs).ok());
        let (tx, rx) = oneshot::channel();
        let job = Job {
            inputs,
            key,
            enqueued: Instant::now(),
            deadline,
            reply: tx,
        };
        let mut q = lock(&self.shared.queue);
        let cap = self.shared.opts.max_queue;
        if q.len() >= cap {
            return Err(format!(
                "the queue is full ({} requests waiting, --max-queue {cap}); retry later",
                q.len()
            ));
        }
        q.push_back(job);
        self.shared.metrics.set_queue_depth(q.len());
        drop(q);
        self.shared.ready.notify_one();
        Ok(rx)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Workers never panic holding the lock; take the queue even so.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Answers and removes the queued requests whose deadline has passed or whose
/// client is gone.
fn expire(q: &mut VecDeque<Job>, now: Instant, metrics: &Metrics) {
    let mut i = 0;
    while i < q.len() {
        let late = q[i].deadline.is_some_and(|d| now >= d);
        if late || q[i].reply.is_closed() {
            if let Some(job) = q.remove(i) {
                let waited = now.duration_since(job.enqueued);
                metrics.queued(waited);
                let _ = job.reply.send(Err((
                    504,
                    format!(
                        "the request's deadline passed after {} us in the queue; not computed",
                        waited.as_micros()
                    ),
                )));
            }
        } else {
            i += 1;
        }
    }
}

/// How many requests from the queue's front form the next batch, and whether
/// to take them now (else wait for more, at most until the returned instant).
fn plan(q: &VecDeque<Job>, opts: &BatchOptions, now: Instant) -> (usize, Option<Instant>) {
    let Some(front) = q.front() else {
        return (0, None);
    };
    let Some(key) = &front.key else {
        return (1, None);
    };
    let (mut n, mut samples) = (1, key.samples);
    let mut blocked = false;
    for job in q.iter().skip(1) {
        match &job.key {
            Some(k) if k.fits(key) && samples + k.samples <= opts.max_batch => {
                n += 1;
                samples += k.samples;
            }
            _ => {
                blocked = true;
                break;
            }
        }
    }
    let until = front.enqueued + opts.max_delay;
    if blocked || samples >= opts.max_batch || now >= until {
        (n, None)
    } else {
        // Wake at the first deadline too, to answer it on time.
        let first_deadline = q.iter().filter_map(|j| j.deadline).min();
        (n, Some(first_deadline.map_or(until, |d| d.min(until))))
    }
}

fn worker(sh: &Shared, mut session: Session, warm: bool) {
    if warm && let Some(layout) = &sh.layout {
        // A kernel's panic is caught here as in a batch: the sizes left are
        // compiled on first use.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            sh.pool
                .install(|| warm_up(&mut session, layout, sh.opts.max_batch));
        }));
        sh.warm.store(true, Ordering::SeqCst);
    }
    loop {
        let batch: Vec<Job> = {
            let mut q = lock(&sh.queue);
            loop {
                let now = Instant::now();
                expire(&mut q, now, &sh.metrics);
                match plan(&q, &sh.opts, now) {
                    (0, _) if sh.closed.load(Ordering::SeqCst) => return,
                    (0, _) => q = sh.ready.wait(q).unwrap_or_else(|p| p.into_inner()),
                    (n, None) => break q.drain(..n).collect(),
                    (_, Some(until)) => {
                        let wait = until.saturating_duration_since(now);
                        q = sh
                            .ready
                            .wait_timeout(q, wait)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                    }
                }
            }
        };
        sh.metrics.set_queue_depth(lock(&sh.queue).len());
        // Another worker may form the next batch meanwhile.
        sh.ready.notify_one();
        // A panic in a kernel must not take the worker down: its requests are
        // answered 500 (their reply channels dropped) and the worker goes on.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            sh.pool.install(|| run(sh, &mut session, batch));
        }));
        if ran.is_err() {
            sh.metrics.set_queue_depth(lock(&sh.queue).len());
        }
    }
}

/// The padding that brings a batch of `total` samples to its bucket
/// ([`merge::bucket`], at most `max_batch` unless the batch is larger already).
fn padding(layout: &Layout, total: usize, max_batch: usize) -> Option<HashMap<String, Tensor>> {
    let target = merge::bucket(total).min(max_batch.max(total));
    (target > total)
        .then(|| layout.padding(target - total))
        .flatten()
}

/// Runs a padding batch of every bucket size up to `max_batch`, so that the
/// kernels of those sizes are compiled before requests need them (the JIT's
/// cache is shared by every executor).
fn warm_up(session: &mut Session, layout: &Layout, max_batch: usize) {
    let mut n = 1;
    while n <= max_batch {
        if let Some(inputs) = layout.padding(n) {
            let _ = session.infer_graph_inputs(inputs);
        }
        n = merge::bucket(n + 1);
    }
    if let Some(inputs) = layout.padding(max_batch) {
        let _ = session.infer_graph_inputs(inputs);
    }
}

/// Runs one batch and answers its requests.
fn run(sh: &Shared, session: &mut Session, batch: Vec<Job>) {
    let start = Instant::now();
    for job in &batch {
        sh.metrics.queued(start.duration_since(job.enqueued));
    }
    let merged_ok = batch.iter().all(|j| j.key.is_some());
    if merged_ok && let Some(layout) = &sh.layout {
        let mut counts: Vec<usize> = batch.iter().map(Job::samples).collect();
        let total = counts.iter().sum();
        let pad = padding(layout, total, sh.opts.max_batch);
        if batch.len() > 1 || pad.is_some() {
            let mut parts: Vec<&HashMap<String, Tensor>> =
                batch.iter().map(|j| &j.inputs).collect();
            if let Some(p) = &pad {
                parts.push(p);
                counts.push(layout.key(p).map_or(0, |k| k.samples));
            }
            let merged = layout.merge(&parts).and_then(|inputs| {
                session
                    .infer_graph_inputs(inputs)
                    .map_err(|e| e.to_string())
                    .and_then(|outs| merge::split(&outs, &counts))
            });
            if let Ok(answers) = merged {
                sh.metrics.batch(batch.len(), total, start.elapsed());
                for (job, outs) in batch.into_iter().zip(answers) {
                    let _ = job.reply.send(Ok(outs));
                }
                return;
            }
            // Run each alone below: only a bad request gets the error.
        }
    }
    for job in batch {
        let t = Instant::now();
        let samples = job.samples().max(1);
        let answer = session
            .infer_graph_inputs(job.inputs)
            .map_err(|e| (status_of(&e), e.to_string()));
        sh.metrics.batch(1, samples, t.elapsed());
        let _ = job.reply.send(answer);
    }
}
