//! `dlrm-serve` as a client sees it: the binary started on a real export's plan
//! (the reference DLRM's stacked `[T, B]` offsets, `ts17_dot_stacked`), driven
//! over TCP with plain HTTP/1.1 requests in the Open Inference Protocol's JSON:
//! health, metadata in the model's own names (-1 for varying axes), inference on
//! the case's inputs within 1e-5 of PyTorch's outputs, and bad requests answered
//! 4xx naming the input while the server keeps serving.

#![expect(clippy::unwrap_used, reason = "tests fail loudly")]

mod common;

use common::{case, floats, http, plan, request, start};
use serde_json::{Value, json};

#[test]
fn a_client_drives_health_metadata_and_inference() {
    let dir = tempfile::tempdir().unwrap();
    let path = plan(dir.path());
    let s = start(&path, &[]);
    assert_eq!(http(&s, "GET", "/v2/health/live", b"").0, 200);
    // Ready (200) once warmed up; 503 naming the warm-up before.
    let t = std::time::Instant::now();
    loop {
        let (status, out) = http(&s, "GET", "/v2/health/ready", b"");
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{out}");
        assert!(
            out["error"].as_str().unwrap().contains("warming up"),
            "{out}"
        );
        assert!(t.elapsed().as_secs() < 60, "not ready after 60 s");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(http(&s, "GET", "/v2/models/dlrm/ready", b"").0, 200);
    let cold = start(&path, &["--no-warm-up"]);
    assert_eq!(http(&cold, "GET", "/v2/health/ready", b"").0, 200);
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
    let got = floats(&out, 0);
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

/// `--quantize-tables int8`: the plan's tables quantized as it loads (logged),
/// answers within the quantization's error of PyTorch's f32 outputs.
#[test]
fn int8_tables_serve_within_their_quantization_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = plan(dir.path());
    let s = start(&path, &["--quantize-tables", "int8", "--no-warm-up"]);
    let (status, out) = http(
        &s,
        "POST",
        "/v2/models/dlrm/infer",
        request().to_string().as_bytes(),
    );
    assert_eq!(status, 200, "{out}");
    let want = dlrm_onnx::npz::read(&case().join("outputs_7.npz")).unwrap()[0]
        .1
        .to_f32_vec();
    let got = floats(&out, 0);
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 0.02 && got != want, "int8 vs PyTorch: {worst}");
    assert!(s.log().contains("int8 row-wise tables"), "{}", s.log());
}
