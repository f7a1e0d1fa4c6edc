//! The server's metrics in the Prometheus text exposition format (version
//! 0.0.4), served at `GET /metrics`: inference requests by outcome, the batches
//! run (samples and requests per batch), and histograms of the time requests
//! wait in the queue, the time batches compute and the requests' whole latency.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A request's outcome, a label of `dlrm_serve_requests_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Answered 200.
    Success,
    /// A client error (4xx but 404).
    BadRequest,
    /// An unknown model (404).
    NotFound,
    /// Refused: the queue was full (503).
    QueueFull,
    /// Its deadline passed before it was computed (504).
    Deadline,
    /// The server's fault (5xx).
    Error,
}

const OUTCOMES: [(Outcome, &str); 6] = [
    (Outcome::Success, "success"),
    (Outcome::BadRequest, "bad_request"),
    (Outcome::NotFound, "not_found"),
    (Outcome::QueueFull, "queue_full"),
    (Outcome::Deadline, "deadline"),
    (Outcome::Error, "error"),
];

impl Outcome {
    /// The outcome of an answer with HTTP status `status`.
    pub fn of_status(status: u16) -> Outcome {
        match status {
            200..=299 => Outcome::Success,
            404 => Outcome::NotFound,
            503 => Outcome::QueueFull,
            504 => Outcome::Deadline,
            400..=499 => Outcome::BadRequest,
            _ => Outcome::Error,
        }
    }
}

/// A cumulative histogram with fixed upper bounds.
struct Histogram {
    bounds: Vec<f64>,
    /// Per bound (and +Inf last): observations at most it, not cumulated.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: Vec<f64>) -> Histogram {
        Histogram {
            counts: vec![0; bounds.len() + 1],
            bounds,
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, x: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| x <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += x;
        self.count += 1;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut acc = 0;
        for (i, c) in self.counts.iter().enumerate() {
            acc += c;
            let le = self
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {acc}");
        }
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", self.sum, self.count);
    }
}

/// Seconds buckets from 50 µs to 10 s.
fn seconds() -> Vec<f64> {
    vec![
        5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5,
        10.0,
    ]
}

/// Powers of two up to 2^16.
fn sizes() -> Vec<f64> {
    (0..=16).map(|i| f64::from(1u32 << i)).collect()
}

struct Histograms {
    batch_samples: Histogram,
    batch_requests: Histogram,
    queue: Histogram,
    compute: Histogram,
    latency: Histogram,
}

/// The server's metrics (module docs).
pub struct Metrics {
    requests: [AtomicU64; 6],
    queued: AtomicU64,
    /// The checkpoint step served (0: a plan, or a checkpoint of step 0).
    version: AtomicU64,
    /// Model loads of a watched directory: succeeded, failed.
    loads: [AtomicU64; 2],
    h: Mutex<Histograms>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            requests: Default::default(),
            queued: AtomicU64::new(0),
            version: AtomicU64::new(0),
            loads: Default::default(),
            h: Mutex::new(Histograms {
                batch_samples: Histogram::new(sizes()),
                batch_requests: Histogram::new(sizes()),
                queue: Histogram::new(seconds()),
                compute: Histogram::new(seconds()),
                latency: Histogram::new(seconds()),
            }),
        }
    }
}

impl Metrics {
    fn with(&self, f: impl FnOnce(&mut Histograms)) {
        // A panic never happens while the lock is held; take the data even so.
        let mut h = self.h.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut h);
    }

    /// An inference request answered with `outcome` after `latency`.
    pub fn request(&self, outcome: Outcome, latency: Duration) {
        if let Some(i) = OUTCOMES.iter().position(|(o, _)| *o == outcome) {
            self.requests[i].fetch_add(1, Ordering::Relaxed);
        }
        self.with(|h| h.latency.observe(latency.as_secs_f64()));
    }

    /// A request that waited `wait` in the queue before its batch ran.
    pub fn queued(&self, wait: Duration) {
        self.with(|h| h.queue.observe(wait.as_secs_f64()));
    }

    /// A batch of `requests` requests and `samples` samples computed in `took`.
    pub fn batch(&self, requests: usize, samples: usize, took: Duration) {
        self.with(|h| {
            h.batch_requests.observe(requests as f64);
            h.batch_samples.observe(samples as f64);
            h.compute.observe(took.as_secs_f64());
        });
    }

    /// Sets the number of requests waiting in the queue.
    pub fn set_queue_depth(&self, n: usize) {
        self.queued.store(n as u64, Ordering::Relaxed);
    }

    /// A model (checkpoint step `version`) loaded and swapped in.
    pub fn loaded(&self, version: u64) {
        self.version.store(version, Ordering::Relaxed);
        self.loads[0].fetch_add(1, Ordering::Relaxed);
    }

    /// Sets the served model's version without counting a load (the first model).
    pub fn set_version(&self, version: u64) {
        self.version.store(version, Ordering::Relaxed);
    }

    /// A model load that failed (the old model goes on serving).
    pub fn load_failed(&self) {
        self.loads[1].fetch_add(1, Ordering::Relaxed);
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let name = "dlrm_serve_requests_total";
        let _ = writeln!(
            out,
            "# HELP {name} Inference requests answered, by outcome.\n# TYPE {name} counter"
        );
        for (i, (_, label)) in OUTCOMES.iter().enumerate() {
            let n = self.requests[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}{{outcome=\"{label}\"}} {n}");
        }
        let name = "dlrm_serve_queue_depth";
        let _ = writeln!(
            out,
            "# HELP {name} Requests waiting in the queue.\n# TYPE {name} gauge\n{name} {}",
            self.queued.load(Ordering::Relaxed)
        );
        let name = "dlrm_serve_model_version";
        let _ = writeln!(
            out,
            "# HELP {name} The checkpoint step of the model served.\n# TYPE {name} gauge\n{name} {}",
            self.version.load(Ordering::Relaxed)
        );
        let name = "dlrm_serve_model_loads_total";
        let _ = writeln!(
            out,
            "# HELP {name} Models loaded from the watched directory, by outcome.\n# TYPE {name} counter"
        );
        for (i, label) in ["success", "failure"].iter().enumerate() {
            let n = self.loads[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}{{outcome=\"{label}\"}} {n}");
        }
        self.with(|h| {
            h.batch_samples.write(
                &mut out,
                "dlrm_serve_batch_samples",
                "Samples per batch computed (requests merged).",
            );
            h.batch_requests.write(
                &mut out,
                "dlrm_serve_batch_requests",
                "Requests per batch computed.",
            );
            h.queue.write(
                &mut out,
                "dlrm_serve_queue_seconds",
                "Time a request waited in the queue before its batch ran.",
            );
            h.compute.write(
                &mut out,
                "dlrm_serve_compute_seconds",
                "Time a batch took to compute.",
            );
            h.latency.write(
                &mut out,
                "dlrm_serve_request_seconds",
                "Inference request latency, body read to answer.",
            );
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_counts_move() {
        let m = Metrics::default();
        m.batch(3, 10, Duration::from_millis(2));
        m.batch(1, 1, Duration::from_millis(20));
        m.request(Outcome::Success, Duration::from_micros(70));
        m.request(Outcome::of_status(503), Duration::from_micros(1));
        m.loaded(30);
        m.load_failed();
        m.load_failed();
        let text = m.render();
        for want in [
            "dlrm_serve_requests_total{outcome=\"success\"} 1",
            "dlrm_serve_requests_total{outcome=\"queue_full\"} 1",
            "dlrm_serve_batch_samples_bucket{le=\"1\"} 1",
            "dlrm_serve_batch_samples_bucket{le=\"8\"} 1",
            "dlrm_serve_batch_samples_bucket{le=\"16\"} 2",
            "dlrm_serve_batch_samples_bucket{le=\"+Inf\"} 2",
            "dlrm_serve_batch_samples_sum 11",
            "dlrm_serve_compute_seconds_bucket{le=\"0.0025\"} 1",
            "dlrm_serve_compute_seconds_count 2",
            "# TYPE dlrm_serve_request_seconds histogram",
            "dlrm_serve_model_version 30",
            "dlrm_serve_model_loads_total{outcome=\"success\"} 1",
            "dlrm_serve_model_loads_total{outcome=\"failure\"} 2",
        ] {
            assert!(text.contains(want), "{want} not in\n{text}");
        }
    }
}
