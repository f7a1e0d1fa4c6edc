//! Dynamic batching seen from clients: requests of different sample counts and
//! bag sizes (the stacked `[T, B]` offsets of `ts17_dot_stacked`, empty bags
//! among them) sent at once from several threads get the answers they get one
//! at a time, while `/metrics` shows that batches merged several requests; a bad
//! request merged with good ones fails alone; a full queue answers 503, a passed
//! deadline 504; the binary tensor extension gives the JSON answers.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

mod common;

use common::{Server, case_inputs, floats, http, json_inputs, plan, raw, start};
use dlrm_ir::Tensor;
use serde_json::{Value, json};
use std::sync::{Arc, Barrier};

/// A deterministic generator (64-bit LCG).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// A request of `b` samples: random dense features, bags of 0 to 3 ids drawn
/// from the case's own ids (so in range), offsets stacked `[3, b]`.
fn random_request(rng: &mut Lcg, b: usize) -> Vec<(String, Tensor)> {
    let case = case_inputs();
    let get = |n: &str| case.iter().find(|(m, _)| m == n).unwrap().1.clone();
    let dense_width = get("dense_x").shape[1];
    let dense: Vec<f32> = (0..b * dense_width)
        .map(|_| rng.next(1000) as f32 / 1000.0)
        .collect();
    let mut out = vec![(
        "dense_x".to_string(),
        Tensor::f32(vec![b, dense_width], dense),
    )];
    let mut offsets = Vec::new();
    for t in 0..3 {
        let pool = get(&format!("indices_{t}")).to_i64_vec().unwrap();
        let mut ids = Vec::new();
        for _ in 0..b {
            offsets.push(ids.len() as i64);
            for _ in 0..rng.next(4) {
                ids.push(pool[rng.next(pool.len() as u64) as usize]);
            }
        }
        let n = ids.len();
        out.push((format!("indices_{t}"), Tensor::i64(vec![n], ids)));
    }
    out.insert(1, ("offsets".to_string(), Tensor::i64(vec![3, b], offsets)));
    out
}

fn infer(s: &Server, inputs: &[Value]) -> (u16, Value) {
    let body = json!({ "inputs": inputs }).to_string();
    http(s, "POST", "/v2/models/dlrm/infer", body.as_bytes())
}

/// The value of the metric line starting with `prefix`.
fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no `{prefix}` in\n{text}"))
}

#[test]
fn concurrent_requests_merge_and_get_the_answers_they_get_alone() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(start(
        &plan(dir.path()),
        &[
            "--max-delay-us",
            "50000",
            "--instances",
            "2",
            "--max-batch",
            "64",
        ],
    ));
    let mut rng = Lcg(7);
    let reqs: Vec<Vec<Value>> = (0..24)
        .map(|i| json_inputs(&random_request(&mut rng, 1 + (i * 5) % 9)))
        .collect();
    // One at a time: each request is a batch of its own.
    let alone: Vec<Vec<f32>> = reqs
        .iter()
        .map(|r| {
            let (status, out) = infer(&s, r);
            assert_eq!(status, 200, "{out}");
            floats(&out, 0)
        })
        .collect();
    let before = http(&s, "GET", "/metrics", b"");
    assert_eq!(before.0, 200);
    // At once from 8 threads, 3 requests each.
    let barrier = Arc::new(Barrier::new(8));
    let reqs = Arc::new(reqs);
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let (s, reqs, barrier) = (Arc::clone(&s), Arc::clone(&reqs), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                (0..3)
                    .map(|k| {
                        let i = t * 3 + k;
                        let (status, out) = infer(&s, &reqs[i]);
                        assert_eq!(status, 200, "request {i}: {out}");
                        (i, floats(&out, 0))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for h in handles {
        for (i, got) in h.join().unwrap() {
            assert_eq!(got.len(), alone[i].len(), "request {i}");
            let worst = got
                .iter()
                .zip(&alone[i])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(worst <= 1e-6, "request {i}: merged differs by {worst}");
        }
    }
    let (status, _, text) = raw(&s, "GET", "/metrics", "", b"");
    assert_eq!(status, 200);
    let text = String::from_utf8(text).unwrap();
    // The format: HELP and TYPE lines, then `name{labels} value` lines.
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            assert!(
                rest.starts_with("HELP ") || rest.starts_with("TYPE "),
                "{line}"
            );
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        assert!(value.parse::<f64>().is_ok(), "{line}");
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
        assert!(
            text.contains(&format!("# TYPE {}", name.trim_end_matches("_bucket")))
                || text.contains(&format!(
                    "# TYPE {}",
                    name.trim_end_matches("_sum").trim_end_matches("_count")
                )),
            "{line} has no TYPE"
        );
    }
    assert_eq!(
        metric(&text, "dlrm_serve_requests_total{outcome=\"success\"}"),
        48.0
    );
    let batches = metric(&text, "dlrm_serve_batch_requests_count");
    let alone_batches = metric(&text, "dlrm_serve_batch_requests_bucket{le=\"1\"}");
    assert!(
        batches < 48.0 && alone_batches < batches,
        "no batch merged requests: {batches} batches, {alone_batches} of one request"
    );
    assert_eq!(
        metric(&text, "dlrm_serve_batch_samples_sum"),
        2.0 * alone.iter().map(Vec::len).sum::<usize>() as f64
    );
}

#[test]
fn a_bad_request_merged_with_good_ones_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(start(&plan(dir.path()), &["--max-delay-us", "100000"]));
    let good = json_inputs(&case_inputs());
    let (_, want) = infer(&s, &good);
    let mut bad = good.clone();
    bad[2]["data"][0] = json!(1000);
    let barrier = Arc::new(Barrier::new(3));
    let handles: Vec<_> = [good.clone(), bad, good]
        .into_iter()
        .map(|r| {
            let (s, barrier) = (Arc::clone(&s), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                infer(&s, &r)
            })
        })
        .collect();
    let answers: Vec<(u16, Value)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(answers[0], (200, want.clone()));
    assert_eq!(answers[2], (200, want));
    assert_eq!(answers[1].0, 400, "{}", answers[1].1);
    let msg = answers[1].1["error"].as_str().unwrap();
    assert!(msg.contains("1000"), "{msg}");
}

#[test]
fn a_full_queue_answers_503_and_a_passed_deadline_504() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(start(
        &plan(dir.path()),
        &[
            "--max-delay-us",
            "400000",
            "--max-queue",
            "1",
            "--instances",
            "1",
            "--no-warm-up",
        ],
    ));
    let good = json_inputs(&case_inputs());
    // The first request waits in the queue for others to join it...
    let first = {
        let (s, r) = (Arc::clone(&s), good.clone());
        std::thread::spawn(move || infer(&s, &r))
    };
    std::thread::sleep(std::time::Duration::from_millis(150));
    // ... so the queue is full for the second.
    let (status, out) = infer(&s, &good);
    assert_eq!(status, 503, "{out}");
    assert!(
        out["error"].as_str().unwrap().contains("the queue is full"),
        "{out}"
    );
    assert_eq!(first.join().unwrap().0, 200);
    // A deadline of 2 ms passes while the request waits for others.
    let body = json!({"inputs": good, "parameters": {"timeout": 2000}}).to_string();
    let t = std::time::Instant::now();
    let (status, out) = http(&s, "POST", "/v2/models/dlrm/infer", body.as_bytes());
    assert_eq!(status, 504, "{out}");
    assert!(
        out["error"].as_str().unwrap().contains("deadline passed"),
        "{out}"
    );
    assert!(
        t.elapsed().as_millis() < 300,
        "answered after {:?}",
        t.elapsed()
    );
    let (_, _, text) = raw(&s, "GET", "/metrics", "", b"");
    let text = String::from_utf8(text).unwrap();
    assert_eq!(
        metric(&text, "dlrm_serve_requests_total{outcome=\"queue_full\"}"),
        1.0
    );
    assert_eq!(
        metric(&text, "dlrm_serve_requests_total{outcome=\"deadline\"}"),
        1.0
    );
}

#[test]
fn binary_tensors_in_and_out_give_the_json_answers() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(&plan(dir.path()), &["--max-delay-us", "0"]);
    let inputs = case_inputs();
    let (_, want) = infer(&s, &json_inputs(&inputs));
    let mut bin = Vec::new();
    let mut tensors = Vec::new();
    for (name, t) in &inputs {
        let before = bin.len();
        let datatype = match t.to_i64_vec() {
            Some(v) if t.dtype().is_int() => {
                v.iter().for_each(|x| bin.extend(x.to_le_bytes()));
                "INT64"
            }
            _ => {
                t.to_f32_vec()
                    .iter()
                    .for_each(|x| bin.extend(x.to_le_bytes()));
                "FP32"
            }
        };
        tensors.push(json!({"name": name, "shape": t.shape, "datatype": datatype,
            "parameters": {"binary_data_size": bin.len() - before}}));
    }
    let head = json!({"inputs": tensors, "outputs": [{"name": "pred", "parameters": {"binary_data": true}}]})
        .to_string();
    let mut body = head.clone().into_bytes();
    body.extend(&bin);
    let hdr = format!("Inference-Header-Content-Length: {}\r\n", head.len());
    let (status, headers, out) = raw(&s, "POST", "/v2/models/dlrm/infer", &hdr, &body);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&out));
    let n: usize = headers
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("inference-header-content-length: ")
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("no JSON length in {headers}"))
        .trim()
        .parse()
        .unwrap();
    let json: Value = serde_json::from_slice(&out[..n]).unwrap();
    assert_eq!(json["outputs"][0]["parameters"]["binary_data_size"], 28);
    let got: Vec<f32> = out[n..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(got, floats(&want, 0));
    // A short binary part is refused naming the input.
    let hdr_short = format!("Inference-Header-Content-Length: {}\r\n", head.len());
    let (status, _, out) = raw(
        &s,
        "POST",
        "/v2/models/dlrm/infer",
        &hdr_short,
        &body[..body.len() - 8],
    );
    assert_eq!(status, 400);
    let e: Value = serde_json::from_slice(&out).unwrap();
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("input `indices_2`: binary_data_size"),
        "{e}"
    );
}
