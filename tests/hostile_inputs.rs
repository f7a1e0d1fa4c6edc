//! Issue 42: hostile inputs (declared counts and sizes far beyond what is present,
//! headers built to be slow, flags asking for absurd counts) are clear errors
//! naming the input, the field and the value, in milliseconds, never an abort, a
//! panic or a hang.

mod common;

use common::{DLRM_RUN, DLRMC, compile, example, fails, s, tempdir};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A version-1 `.npy`: `dict` as its header, then `payload`.
fn npy(dict: &str, payload: &[u8]) -> Vec<u8> {
    dlrm_data::npy::raw_npy(dict, payload).expect("a short header")
}

/// A one-dimensional `.npy` header of `descr` and `n` elements.
fn vector(descr: &str, n: &str) -> String {
    format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({n},), }}")
}

/// An uncompressed npz of the members `(name, bytes)`, as `numpy.savez` writes.
fn npz(dir: &Path, file: &str, members: &[(&str, Vec<u8>)]) -> PathBuf {
    let path = dir.join(file);
    let f = std::fs::File::create(&path).expect("create");
    let mut zip = zip::ZipWriter::new(f);
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in members {
        zip.start_file(format!("{name}.npy"), opts).expect("member");
        zip.write_all(bytes).expect("write");
    }
    zip.finish().expect("finish");
    path
}

/// `dlrmc data convert --format reference-npz NPZ`, which must fail; its stderr.
fn convert_fails(npz: &Path) -> String {
    let out = npz.with_extension("ds");
    fails(
        DLRMC,
        &[
            "data",
            "convert",
            "--format",
            "reference-npz",
            s(npz),
            "-o",
            s(&out),
        ],
    )
}

#[test]
fn declared_shapes_larger_than_the_payload_are_refused_before_allocating() {
    let dir = tempdir();
    let tb = npz(
        dir.path(),
        "tb.npz",
        &[("y", npy(&vector("|u1", "1099511627776"), &[0; 8]))],
    );
    let err = convert_fails(&tb);
    common::assert_contains_all(
        &err,
        &[
            "tb.npz",
            "y.npy",
            "shape [1099511627776]",
            "1099511627776 payload bytes, 8 present",
        ],
    );
    let max = npz(
        dir.path(),
        "max.npz",
        &[("y", npy(&vector("<f8", "18446744073709551615"), &[]))],
    );
    let err = convert_fails(&max);
    common::assert_contains_all(
        &err,
        &["max.npz", "y.npy", "[18446744073709551615]", "overflows"],
    );
    // The ONNX front end's `--inputs` reader checks the same.
    let e = dlrm_onnx::npz::read(&tb).expect_err("refused").to_string();
    common::assert_contains_all(&e, &["tb.npz", "array `y`", "8 present"]);
}

#[test]
fn nested_braces_in_a_header_are_refused_at_once() {
    let dir = tempdir();
    let dict = format!("{{'descr': {}", "{".repeat(30));
    let p = npz(dir.path(), "braces.npz", &[("y", npy(&dict, &[]))]);
    let t = Instant::now();
    let e = dlrm_onnx::npz::read(&p).expect_err("refused").to_string();
    assert!(t.elapsed() < Duration::from_millis(10), "{:?}", t.elapsed());
    common::assert_contains_all(&e, &["braces.npz", "array `y`", "expected a string"]);
    let t = Instant::now();
    let err = convert_fails(&p);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    common::assert_contains_all(&err, &["braces.npz", "y.npy", "expected a string"]);
}

#[test]
fn duplicate_names_and_bytes_past_the_shape_are_refused() {
    let dir = tempdir();
    let y = || npy(&vector("|u1", "2"), &[0, 1]);
    // The zip writer refuses a second `y.npy`: write `z.npy` and rename it.
    let p = npz(dir.path(), "twice.npz", &[("y", y()), ("z", y())]);
    let mut bytes = std::fs::read(&p).expect("read");
    while let Some(i) = bytes.windows(5).position(|w| w == b"z.npy") {
        bytes[i] = b'y';
    }
    std::fs::write(&p, bytes).expect("write");
    let e = dlrm_onnx::npz::read(&p).expect_err("refused").to_string();
    common::assert_contains_all(&e, &["twice.npz", "two arrays named `y`"]);
    common::assert_contains_all(&convert_fails(&p), &["twice.npz", "two arrays named `y`"]);
    let long = npz(
        dir.path(),
        "long.npz",
        &[("y", npy(&vector("|u1", "2"), &[0, 1, 1]))],
    );
    let e = dlrm_onnx::npz::read(&long)
        .expect_err("refused")
        .to_string();
    common::assert_contains_all(
        &e,
        &[
            "long.npz",
            "2 payload bytes, 3 present",
            "past the declared shape",
        ],
    );
}

#[test]
fn absurd_counts_on_the_command_line_are_refused_naming_the_flag() {
    let dir = tempdir();
    let plan = dir.path().join("tiny.plan");
    compile(&example("dlrm-tiny.json"), &plan, &[]);
    let p = s(&plan);
    for (args, want) in [
        (
            &["--iters", "1000000000"][..],
            "--iters 1000000000 is more than the 100000000 steps",
        ),
        (
            &["--iters", "9223372036854775808"][..],
            "--iters 9223372036854775808",
        ),
        (
            &["--iters", "18446744073709551615"][..],
            "--iters 18446744073709551615",
        ),
        (
            &["--synthetic-batches", "1000000000"][..],
            "--synthetic-batches 1000000000 is more",
        ),
        (
            &["--synthetic-batches", "18446744073709551615"][..],
            "--synthetic-batches 18446744073709551615",
        ),
        (
            &["--eval-batches", "4294967296"][..],
            "--eval-batches 4294967296 is more than the 1048576",
        ),
        (
            &["--eval-batches", "18446744073709551615"][..],
            "--eval-batches 18446744073709551615",
        ),
        (
            &["--threads", "100000"][..],
            "--threads 100000 is more than the 1024 worker threads",
        ),
        (
            &["--ranks", "4294967296"][..],
            "--ranks 4294967296 is more than the 65536 ranks",
        ),
    ] {
        let t = Instant::now();
        let err = fails(DLRM_RUN, &[&[p][..], args].concat());
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{args:?}: {:?}",
            t.elapsed()
        );
    }
    let want = "--ranks 4294967296 is more than the 65536 ranks";
    let err = fails(DLRMC, &["plan-shards", p, "--ranks", "4294967296"]);
    assert!(err.contains(want), "{err}");
    let out = dir.path().join("again.plan");
    let model = example("dlrm-tiny.json");
    let args = [
        "compile",
        s(&model),
        "-o",
        s(&out),
        "--dump-ir",
        "partition",
    ];
    let err = fails(DLRMC, &[&args[..], &["--ranks", "4294967296"]].concat());
    assert!(err.contains(want), "{err}");
}

#[test]
fn a_split_without_train_is_refused() {
    let dir = tempdir();
    let y = npy(&vector("|u1", "1"), &[1]);
    let p = npz(dir.path(), "one.npz", &[("y", y)]);
    let out = dir.path().join("one.ds");
    let err = fails(
        DLRMC,
        &[
            "data",
            "convert",
            "--format",
            "reference-npz",
            s(&p),
            "-o",
            s(&out),
            "--split",
            "x=1",
        ],
    );
    common::assert_contains_all(
        &err,
        &["--split `x=1`", "needs a `train` split", "given are x"],
    );
    assert!(!out.exists());
}
