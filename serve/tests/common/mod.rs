//! Helpers of the server's tests: the binary started on a real export's plan
//! (`ts17_dot_stacked`, the reference DLRM's stacked `[T, B]` offsets), plain
//! HTTP/1.1 requests over TCP, the case's inputs as a request.

#![allow(dead_code, reason = "each test file uses some of the helpers")]

use dlrm_compiler::compile::{CompileOptions, compile};
use dlrm_compiler::model::{Overrides, load_model};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

pub fn case() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../frontends/onnx/test_cases/real/ts17_dot_stacked")
}

/// A running server, killed when dropped.
pub struct Server {
    child: Child,
    pub addr: String,
    /// Its stderr so far (read on a thread, so that the server's writes never
    /// meet a closed pipe).
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start(plan: &Path, extra: &[&str]) -> Server {
    let mut args = vec![plan.to_str().unwrap()];
    args.extend_from_slice(extra);
    start_args(&args)
}

/// The server started with `args` (and `--port 0 --model-name dlrm`).
pub fn start_args(args: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dlrm-serve"))
        .args(args)
        .args(["--port", "0", "--model-name", "dlrm"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Lines before the address (e.g. `--quantize-tables`' report) go to the log.
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut before = String::new();
    let mut line = String::new();
    while err.read_line(&mut line).unwrap() > 0 && !line.contains("http://") {
        before.push_str(&line);
        line.clear();
    }
    let log = Arc::new(Mutex::new(before + &line));
    let sink = Arc::clone(&log);
    std::thread::spawn(move || {
        let mut l = String::new();
        while matches!(err.read_line(&mut l), Ok(n) if n > 0) {
            if let Ok(mut s) = sink.lock() {
                s.push_str(&l);
            }
            l.clear();
        }
    });
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    Server { child, addr, log }
}

/// One request with extra header lines; the status, the header block and the body.
pub fn raw(
    s: &Server,
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let mut c = TcpStream::connect(&s.addr).unwrap();
    // A server that stops answering fails the test instead of hanging it.
    c.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n",
        s.addr,
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    let _ = c.write_all(body);
    let mut out = Vec::new();
    c.read_to_end(&mut out).unwrap();
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(out.len());
    let head = String::from_utf8_lossy(&out[..end]).to_string();
    let status = head[9..12].parse().unwrap();
    (status, head, out[(end + 4).min(out.len())..].to_vec())
}

/// One request; the status and the body as JSON (`Null` when empty).
pub fn http(s: &Server, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let (status, _, body) = raw(s, method, path, "Content-Type: application/json\r\n", body);
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

pub fn plan(dir: &Path) -> PathBuf {
    let model = load_model(&case().join("model.onnx"), Overrides::default()).unwrap();
    let plan = compile(model, &CompileOptions::default(), &mut |_, _| {}).unwrap();
    let path = dir.join("stacked.plan");
    dlrm_runtime::write_plan(&path, &plan).unwrap();
    path
}

/// The case's inputs of batch 7 (name and tensor, in the case's order).
pub fn case_inputs() -> Vec<(String, dlrm_ir::Tensor)> {
    dlrm_onnx::npz::read(&case().join("inputs_7.npz")).unwrap()
}

/// Tensors as a request's JSON inputs.
pub fn json_inputs(inputs: &[(String, dlrm_ir::Tensor)]) -> Vec<Value> {
    inputs
        .iter()
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
        .collect()
}

/// The case's inputs of batch 7 as a request.
pub fn request() -> Value {
    json!({"id": "r1", "inputs": json_inputs(&case_inputs())})
}

/// The f32 elements of a JSON response's output `i`.
pub fn floats(out: &Value, i: usize) -> Vec<f32> {
    out["outputs"][i]["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no data in {out}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}
