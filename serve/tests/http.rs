//! `dlrm-serve` as a client sees it: the binary started on a real export's plan
//! (the reference DLRM's stacked `[T, B]` offsets, `ts17_dot_stacked`), driven
//! over TCP with plain HTTP/1.1 requests in the Open Inference Protocol's JSON:
//! health, metadata in the model's own names (-1 for varying axes), inference on
//! the case's inputs within 1e-5 of PyTorch's outputs, and bad requests answered
//! 4xx naming the input while the server keeps serving.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

use dlrmc::compile::{CompileOptions, compile};
use dlrmc::model::{Overrides, load_model};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn case() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../frontends/onnx/test_cases/real/ts17_dot_stacked")
}

/// A running server, killed when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(plan: &Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dlrm-serve"))
        .arg(plan)
        .args(["--port", "0", "--model-name", "dlrm"])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    Server { child, addr }
}

/// One request; the status and the body as JSON (`Null` when empty).
fn http(s: &Server, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let mut c = TcpStream::connect(&s.addr).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        s.addr,
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    let _ = c.write_all(body);
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let text = out.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(text).unwrap_or(Value::Null))
}

fn plan(dir: &Path) -> PathBuf {
    let model = load_model(&case().join("model.onnx"), Overrides::default()).unwrap();
    let plan = compile(model, &CompileOptions::default(), &mut |_, _| {}).unwrap();
    let path = dir.join("stacked.plan");
    dlrm_runtime::write_plan(&path, &plan).unwrap();
    path
}

/// The case's inputs of batch 7 as a request.
fn request() -> Value {
    let inputs: Vec<Value> = dlrm_onnx::npz::read(&case().join("inputs_7.npz"))
        .unwrap()
        .into_iter()
        .map(|(name, t)| {
            let (datatype, data): (&str, Vec<Value>) = match t.to_i64_vec() {
                Some(v) if t.dtype().is_int() => {
                    ("INT64", v.into_iter().map(Value::from).collect())
                }
                _ => (
                    "FP32",
                    t.to_f32_vec().into_iter().map(|x| json!(x)).collect(),
                ),
            };
            json!({"name": name, "shape": t.shape, "datatype": datatype, "data": data})
        })
        .collect();
    json!({"id": "r1", "inputs": inputs})
}

#[test]
fn a_client_drives_health_metadata_and_inference() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(&plan(dir.path()), &[]);
    assert_eq!(http(&s, "GET", "/v2/health/live", b"").0, 200);
    assert_eq!(http(&s, "GET", "/v2/health/ready", b"").0, 200);
    assert_eq!(http(&s, "GET", "/v2/models/dlrm/ready", b"").0, 200);
    assert_eq!(http(&s, "GET", "/v2", b"").1["name"], "dlrm-serve");
    let (status, meta) = http(&s, "GET", "/v2/models/dlrm", b"");
    assert_eq!(status, 200);
    let names: Vec<&str> = meta["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["dense_x", "offsets", "indices_0", "indices_1", "indices_2"]
    );
    assert_eq!(meta["inputs"][1]["shape"], json!([3, -1]));
    assert_eq!(
        meta["outputs"][0],
        json!({"name": "pred", "datatype": "FP32", "shape": [-1, 1]})
    );

    let (status, out) = http(
        &s,
        "POST",
        "/v2/models/dlrm/infer",
        request().to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["id"], "r1");
    let want = dlrm_onnx::npz::read(&case().join("outputs_7.npz")).unwrap();
    let got: Vec<f32> = out["outputs"][0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(out["outputs"][0]["shape"], json!([7, 1]));
    let worst = got
        .iter()
        .zip(want[0].1.to_f32_vec())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 1e-5, "differs from PyTorch by {worst}");
}

#[test]
fn bad_requests_get_4xx_naming_the_input_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(&plan(dir.path()), &["--max-body-bytes", "100000"]);
    let good = request();
    let with = |f: &dyn Fn(&mut Value)| {
        let mut r = good.clone();
        f(&mut r);
        r.to_string()
    };
    let cases: Vec<(String, u16, &str)> = vec![
        ("{not json".into(), 400, "malformed request"),
        (
            with(&|r| r["inputs"][0]["name"] = json!("bogus")),
            400,
            "array `bogus` is not an input of the model",
        ),
        (
            with(&|r| {
                r["inputs"].as_array_mut().unwrap().remove(1);
            }),
            400,
            "no array for the model input `offsets`",
        ),
        (
            with(&|r| r["inputs"][0]["shape"] = json!([7, 12])),
            400,
            "input `dense_x`: `data` holds more than the shape's 84 elements",
        ),
        (
            with(&|r| r["inputs"][2]["data"][0] = json!(1000)),
            400,
            "1000",
        ),
        (
            with(&|r| r["inputs"][2]["datatype"] = json!("STRING")),
            400,
            "datatype `STRING`",
        ),
        ("x".repeat(200_000), 413, ""),
    ];
    for (body, want_status, want) in cases {
        let (status, out) = http(&s, "POST", "/v2/models/dlrm/infer", body.as_bytes());
        assert_eq!(status, want_status, "{want}: {out}");
        let msg = out["error"].as_str().unwrap_or("");
        assert!(msg.contains(want), "wanted `{want}` in {msg}");
        // The server still answers a good request.
        assert_eq!(
            http(
                &s,
                "POST",
                "/v2/models/dlrm/infer",
                good.to_string().as_bytes()
            )
            .0,
            200
        );
    }
    let (status, out) = http(&s, "GET", "/v2/models/other", b"");
    assert_eq!(status, 404);
    assert!(out["error"].as_str().unwrap().contains("serves `dlrm`"));
}
