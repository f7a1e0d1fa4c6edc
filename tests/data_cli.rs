//! `dlrmc data` as a user runs it: generate, convert, inspect; bad input is a clear
//! error on stderr with exit status 1 that damages nothing already written.

mod common;

use common::{DLRMC, fails_silently as fails, ok, s, tempdir};
use serde_json::Value;

#[test]
fn generate_convert_inspect() {
    let tmp = tempdir();
    let txt = tmp.path().join("train.txt");
    let ds = tmp.path().join("kaggle.ds");
    let out = ok(
        DLRMC,
        &[
            "data",
            "generate",
            "--rows",
            "7000",
            "--seed",
            "1",
            "-o",
            s(&txt),
        ],
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("wrote 7000 rows"));
    let out = ok(
        DLRMC,
        &[
            "data",
            "convert",
            "--format",
            "criteo-tsv",
            s(&txt),
            "-o",
            s(&ds),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("7000 samples") && err.contains("rows/s") && err.contains("train 6000"),
        "{err}"
    );
    let out = ok(DLRMC, &["data", "inspect", s(&ds), "--verify", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["samples"], 7000);
    assert_eq!(v["verified"], true);
    assert_eq!(v["days"].as_array().map(Vec::len), Some(7));
    assert_eq!(v["tables"].as_array().map(Vec::len), Some(26));
    assert_eq!(v["dense"].as_array().map(Vec::len), Some(13));
    let rate = v["positive_rate"].as_f64().unwrap_or(0.0);
    assert!((0.2..0.3).contains(&rate), "{rate}");
    let out = ok(DLRMC, &["data", "inspect", s(&ds)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("samples 7000") && text.contains("C26") && text.contains("test"));

    // Hashing with a row cap, and fraction splits.
    let hashed = tmp.path().join("h.ds");
    ok(
        DLRMC,
        &[
            "data",
            "convert",
            s(&txt),
            "-o",
            s(&hashed),
            "--max-ind-range",
            "1000",
            "--hash",
            "--split",
            "train=0.9,test=0.1",
            "--quiet",
        ],
    );
    let out = ok(DLRMC, &["data", "inspect", s(&hashed), "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["tables"][2]["rows"], 1000);
    assert_eq!(v["splits"][1]["start"], 6300);
}

#[test]
fn bad_input_is_an_error_that_damages_nothing() {
    let tmp = tempdir();
    let txt = tmp.path().join("train.txt");
    let ds = tmp.path().join("x.ds");
    ok(
        DLRMC,
        &[
            "data",
            "generate",
            "--rows",
            "100",
            "-o",
            s(&txt),
            "--quiet",
        ],
    );
    ok(
        DLRMC,
        &["data", "convert", s(&txt), "-o", s(&ds), "--quiet"],
    );
    let manifest = std::fs::read(ds.join("manifest.json")).expect("manifest");
    let mut text = std::fs::read_to_string(&txt).expect("read");
    text.push_str("1\t2\t3\n");
    std::fs::write(&txt, &text).expect("write");
    let err = fails(
        DLRMC,
        &["data", "convert", s(&txt), "-o", s(&ds), "--quiet"],
    );
    assert!(
        err.contains(&format!(
            "{}:101: expected 40 tab-separated fields, found 3",
            txt.display()
        )),
        "{err}"
    );
    assert_eq!(
        std::fs::read(ds.join("manifest.json")).expect("manifest"),
        manifest
    );
    let out = ok(
        DLRMC,
        &[
            "data",
            "convert",
            s(&txt),
            "-o",
            s(&ds),
            "--quiet",
            "--skip-bad-lines",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("skipped 1 bad lines (field-count 1)"), "{err}");

    let err = fails(
        DLRMC,
        &[
            "data",
            "convert",
            s(&txt),
            "-o",
            s(&ds),
            "--split",
            "train=2",
        ],
    );
    assert!(err.contains("--split"), "{err}");
    let err = fails(
        DLRMC,
        &["data", "convert", "/nonexistent/day_0", "-o", s(&ds)],
    );
    assert!(err.contains("/nonexistent/day_0"), "{err}");
    let err = fails(DLRMC, &["data", "inspect", s(&txt)]);
    assert!(err.contains("manifest.json"), "{err}");
}
