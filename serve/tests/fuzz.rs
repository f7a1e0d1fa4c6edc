//! A fuzzed request campaign against `dlrm-serve` on a real export's plan
//! (`ts17_dot_stacked`): random and mutated bodies (random bytes, malformed and
//! truncated JSON, flipped bytes, wrong names, datatypes and shapes, huge
//! declared shapes, ids out of range, NaN in binary tensors, binary-extension
//! lengths that lie, oversized bodies, deep nesting) and clients that disconnect
//! mid-request, from two threads, with a valid request every few. The server
//! never answers 5xx nor drops a complete request without an answer, every
//! refusal is a 4xx with a JSON message, every valid request gets the case's
//! PyTorch outputs (1e-5), the process is alive at the end and has logged no
//! panic, and its resident memory (VmRSS) after the campaign is within 32 MiB
//! of the figure after a warm-up.
//!
//! `DLRM_FUZZ_REQUESTS` sets the campaign's size (default 2,000);
//! `scripts/fuzz-serve` runs a long one and prints the figures.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

mod common;

use common::{Server, case, case_inputs, plan, request, start};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A deterministic generator (64-bit LCG).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }

    fn pick<T: Clone>(&mut self, v: &[T]) -> T {
        v[self.next(v.len() as u64) as usize].clone()
    }
}

/// One request to send: its extra header lines, its body, and whether to cut
/// the connection after `cut` bytes of the body (a client that goes away).
struct Shot {
    kind: &'static str,
    headers: String,
    body: Vec<u8>,
    cut: Option<usize>,
    valid: bool,
}

impl Shot {
    fn json(kind: &'static str, body: impl Into<Vec<u8>>) -> Shot {
        Shot {
            kind,
            headers: String::new(),
            body: body.into(),
            cut: None,
            valid: false,
        }
    }
}

/// The case's request in the binary tensor extension, dense features replaced by
/// `dense` when given; the JSON part's length in the header.
fn binary(dense: Option<f32>) -> (String, Vec<u8>, usize) {
    let mut inputs = Vec::new();
    let mut bin = Vec::new();
    for (name, t) in case_inputs() {
        let before = bin.len();
        let datatype = match t.to_i64_vec() {
            Some(v) if t.dtype().is_int() => {
                v.iter()
                    .for_each(|x| bin.extend_from_slice(&x.to_le_bytes()));
                "INT64"
            }
            _ => {
                for x in t.to_f32_vec() {
                    bin.extend_from_slice(&dense.unwrap_or(x).to_le_bytes());
                }
                "FP32"
            }
        };
        inputs.push(json!({"name": name, "shape": t.shape, "datatype": datatype,
            "parameters": {"binary_data_size": bin.len() - before}}));
    }
    let head = json!({ "inputs": inputs }).to_string();
    let n = head.len();
    let mut body = head.into_bytes();
    body.extend_from_slice(&bin);
    (String::new(), body, n)
}

fn header(n: impl std::fmt::Display) -> String {
    format!("Inference-Header-Content-Length: {n}\r\n")
}

/// The case's JSON request with one field changed.
fn mutated(rng: &mut Lcg) -> (&'static str, Value) {
    let mut r = request();
    let i = rng.next(5) as usize;
    let kind = match rng.next(9) {
        0 => {
            r["inputs"][i]["name"] = json!(rng.pick(&["bogus", "", "dense", "indices_9"]));
            "wrong name"
        }
        1 => {
            let d = rng.pick(&["FP16", "BYTES", "INT8", "BOOL", "fp32", "", "UINT64"]);
            r["inputs"][i]["datatype"] = json!(d);
            "wrong datatype"
        }
        2 => {
            let s = rng.pick(&[
                json!([7]),
                json!([]),
                json!([0, 13]),
                json!([-1, 13]),
                json!([7, 13, 1, 1]),
            ]);
            r["inputs"][i]["shape"] = s;
            "wrong shape"
        }
        3 => {
            let big = rng.pick(&[
                json!([1u64 << 40, 1u64 << 40]),
                json!([u64::MAX, 2]),
                json!([1u64 << 62]),
            ]);
            r["inputs"][i]["shape"] = big;
            "huge shape"
        }
        4 => {
            let t = 2 + rng.next(3) as usize;
            let id = rng.pick(&[
                json!(1_000_000),
                json!(-1),
                json!(i64::MAX),
                json!(i64::MIN),
            ]);
            r["inputs"][t]["data"][0] = id;
            "id out of range"
        }
        5 => {
            r["inputs"][i]["data"] = rng.pick(&[
                json!("x"),
                json!(null),
                json!([[1], 2]),
                json!([1.5e300]),
                json!({}),
            ]);
            "wrong data"
        }
        6 => {
            r["inputs"].as_array_mut().unwrap().remove(i);
            "missing input"
        }
        7 => {
            r["inputs"][1]["data"][rng.next(21) as usize] = json!(rng.next(1000) as i64 - 500);
            "bad offsets"
        }
        _ => {
            r["parameters"] = rng.pick(&[
                json!({"timeout": "soon"}),
                json!({"timeout": -1}),
                json!({"binary_data_output": 3}),
            ]);
            r["outputs"] = rng.pick(&[json!([{"name": "nope"}]), json!("pred"), json!([])]);
            "bad parameters"
        }
    };
    (kind, r)
}

/// Lies in the binary tensor extension.
fn lying_binary(rng: &mut Lcg) -> Shot {
    let (_, mut body, n) = binary(None);
    let (kind, headers) = match rng.next(5) {
        0 => (
            "binary: header past the body",
            header(body.len() + 1 + rng.next(1 << 20) as usize),
        ),
        1 => ("binary: header short", header(rng.next(n as u64))),
        2 => (
            "binary: header not a number",
            header(rng.pick(&["-5", "ten", "1e3", "18446744073709551616"])),
        ),
        3 => {
            body.truncate(n + rng.next((body.len() - n) as u64) as usize);
            ("binary: data cut short", header(n))
        }
        _ => {
            body.extend_from_slice(&vec![7u8; 1 + rng.next(64) as usize]);
            ("binary: data too long", header(n))
        }
    };
    Shot {
        kind,
        headers,
        body,
        cut: None,
        valid: false,
    }
}

/// The next request of the campaign.
fn shot(rng: &mut Lcg, valid: &str) -> Shot {
    match rng.next(12) {
        0 | 1 => Shot {
            valid: true,
            ..Shot::json("valid", valid)
        },
        2 => Shot::json(
            "random bytes",
            (0..rng.next(300))
                .map(|_| rng.next(256) as u8)
                .collect::<Vec<u8>>(),
        ),
        3 => Shot::json(
            "truncated JSON",
            &valid.as_bytes()[..rng.next(valid.len() as u64) as usize],
        ),
        4 => {
            let mut b = valid.as_bytes().to_vec();
            for _ in 0..1 + rng.next(4) {
                let i = rng.next(b.len() as u64) as usize;
                b[i] = rng.next(256) as u8;
            }
            Shot::json("flipped bytes", b)
        }
        5 | 6 => {
            let (kind, r) = mutated(rng);
            Shot::json(kind, r.to_string())
        }
        7 => lying_binary(rng),
        8 => {
            let (_, body, n) = binary(Some(f32::NAN));
            Shot {
                headers: header(n),
                ..Shot::json("NaN in binary", body)
            }
        }
        9 => Shot {
            cut: Some(rng.next(valid.len() as u64 + 1) as usize),
            ..Shot::json("disconnect mid-body", valid)
        },
        10 => {
            let deep = rng.next(3000) as usize;
            Shot::json(
                "deep nesting",
                format!("{}{}", "[".repeat(deep), "]".repeat(deep)),
            )
        }
        _ => Shot::json("oversized", vec![b' '; 300_000]),
    }
}

/// Sends `shot`; the status and body, `None` for a cut connection.
fn send(s: &Server, shot: &Shot) -> Option<(u16, Vec<u8>)> {
    let mut c = TcpStream::connect(&s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
        s.addr,
        shot.body.len(),
        shot.headers
    );
    c.write_all(head.as_bytes()).unwrap();
    if let Some(n) = shot.cut {
        let _ = c.write_all(&shot.body[..n]);
        return None;
    }
    // The server may answer (413) before reading the whole body.
    let _ = c.write_all(&shot.body);
    let mut out = Vec::new();
    c.read_to_end(&mut out).unwrap();
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| {
            panic!(
                "{}: no answer: {:?}",
                shot.kind,
                String::from_utf8_lossy(&out)
            )
        });
    let status = String::from_utf8_lossy(&out[9..12]).parse().unwrap();
    Some((status, out[end + 4..].to_vec()))
}

/// Checks an answer; its status.
fn check(shot: &Shot, status: u16, body: &[u8], want: &[f32]) -> u16 {
    let out: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if shot.valid {
        assert_eq!(status, 200, "a valid request: {out}");
        let got: Vec<f32> = out["outputs"][0]["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(
            got.len() == want.len() && worst <= 1e-5,
            "valid answer off by {worst}"
        );
    } else if status != 200 {
        assert!(
            (400..500).contains(&status),
            "{}: answered {status}: {out}",
            shot.kind
        );
        let msg = out["error"].as_str().unwrap_or("");
        assert!(
            !msg.is_empty(),
            "{}: {status} without a message: {:?}",
            shot.kind,
            String::from_utf8_lossy(body)
        );
    }
    status
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Runs `n` shots from a thread seeded with `seed`; outcomes by kind and status.
fn campaign(s: &Server, n: usize, seed: u64, want: &[f32]) -> BTreeMap<String, usize> {
    let valid = request().to_string();
    let mut rng = Lcg(seed);
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        let shot = shot(&mut rng, &valid);
        let key = match send(s, &shot) {
            None => "cut".to_string(),
            Some((status, body)) => check(&shot, status, &body, want).to_string(),
        };
        *seen.entry(format!("{} {key}", shot.kind)).or_insert(0) += 1;
    }
    seen
}

#[test]
fn a_fuzzed_campaign_leaves_the_server_up_answering_and_flat() {
    let total: usize = std::env::var("DLRM_FUZZ_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(start(&plan(dir.path()), &["--max-body-bytes", "100000"]));
    let want = dlrm_onnx::npz::read(&case().join("outputs_7.npz")).unwrap()[0]
        .1
        .to_f32_vec();
    // Warm-up: the allocator's and the JIT's steady state.
    campaign(&s, 300, 1, &want);
    let before = rss_kib(s.pid());
    let start = Instant::now();
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let (s, want) = (Arc::clone(&s), want.clone());
            std::thread::spawn(move || campaign(&s, total / 2, 100 + t, &want))
        })
        .collect();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for t in threads {
        for (k, v) in t.join().unwrap() {
            *seen.entry(k).or_insert(0) += v;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(300));
    let after = rss_kib(s.pid());
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    for (k, v) in &seen {
        *by_status
            .entry(k.rsplit(' ').next().unwrap().to_string())
            .or_insert(0) += v;
    }
    eprintln!(
        "fuzz: {} requests in {secs:.1} s; by status {by_status:?}",
        by_status.values().sum::<usize>()
    );
    eprintln!("fuzz: VmRSS {before} kB after warm-up, {after} kB after the campaign");
    for (k, v) in &seen {
        eprintln!("fuzz:   {k}: {v}");
    }
    let mut s = Arc::try_unwrap(s).ok().unwrap();
    assert!(s.alive(), "the server exited:\n{}", s.log());
    assert!(!s.log().contains("panicked"), "{}", s.log());
    assert!(
        by_status.get("200").copied().unwrap_or(0) > total / 10,
        "{by_status:?}"
    );
    assert!(
        after <= before + 32 * 1024,
        "VmRSS grew from {before} to {after} kB"
    );
}
