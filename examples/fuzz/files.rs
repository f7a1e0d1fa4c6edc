//! The fuzz targets of the readers of data and tool files, each fed through the
//! call the binaries make: Criteo TSV (plain and gzip) and MLPerf's binary records
//! through `dlrmc data convert`'s `dlrm_data::convert` (into a small dataset),
//! calibration files through `dlrm_runtime::calibrate::read` (`--calibration`),
//! and metrics files through `dlrm_runtime::metrics::read_curves` (`dlrmc plot`).
//! Their seeds are made here: valid files of each format, small enough that a
//! case runs in milliseconds.

use super::Target;
use dlrm_data::convert::{ConvertOptions, Format, convert};
use dlrm_data::vocab::IdMapping;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `lines` Criteo TSV lines (label, 13 integers, 26 hex categoricals), some
/// fields empty as in the real files.
fn criteo_lines(lines: usize) -> Vec<u8> {
    let mut out = String::new();
    for i in 0..lines {
        out.push_str(if i % 3 == 0 { "1" } else { "0" });
        for j in 0..13 {
            out.push('\t');
            if (i + j) % 5 != 0 {
                out.push_str(&((i * 7 + j * 13) % 40).to_string());
            }
        }
        for j in 0..26 {
            out.push('\t');
            if (i + j) % 7 != 0 {
                out.push_str(&format!("{:08x}", (i * 2_654_435_761 + j * 97) as u32 % 5));
            }
        }
        out.push('\n');
    }
    out.into_bytes()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("gzip into memory");
    e.finish().expect("gzip into memory")
}

/// `records` MLPerf binary records: 40 little-endian int32 each (label, 13
/// integers, 26 categorical ids).
fn mlperf_records(records: usize) -> Vec<u8> {
    (0..records)
        .flat_map(|r| {
            (0..40).flat_map(move |k| {
                let v: i32 = match k {
                    0 => (r % 2) as i32,
                    1..=13 => ((r * 3 + k) % 50) as i32,
                    _ => ((r * 31 + k * 7) % 9) as i32,
                };
                v.to_le_bytes()
            })
        })
        .collect()
}

/// `input` (its bytes written first) converted into the dataset `output`;
/// `true` if the conversion succeeded.
fn converts(format: Format, input: &Path, output: &Path, bytes: &[u8]) -> bool {
    if std::fs::write(input, bytes).is_err() {
        return false;
    }
    let opts = ConvertOptions {
        format,
        inputs: vec![input.to_path_buf()],
        output: output.to_path_buf(),
        mapping: IdMapping::Vocabulary {
            modulo: None,
            min_count: 1,
        },
        split: None,
        skip_bad_lines: bytes.first().is_some_and(|b| b % 2 == 1),
    };
    convert(&opts, &mut |_| {}).is_ok()
}

/// A calibration file as `dlrmc calibrate` writes it.
fn calibration() -> Vec<u8> {
    let c = dlrm_runtime::calibrate::Calibration {
        format: dlrm_runtime::calibrate::FORMAT.into(),
        cpu: "fuzz".into(),
        threads: 2,
        ranks: 2,
        comm: "threads".into(),
        machine: dlrm_passes::shard::Machine::default(),
        network: dlrm_passes::shard::Network::default(),
        measured_at: 1_700_000_000,
    };
    serde_json::to_vec_pretty(&c).expect("a calibration as JSON")
}

/// A metrics file as `dlrm-run --metrics` writes it: training steps, two
/// evaluations and the summary line.
fn metrics() -> Vec<u8> {
    let mut s = String::new();
    for i in 1..=6 {
        s.push_str(&format!(
            "{{\"iter\": {i}, \"loss\": {:.4}, \"lr\": 0.1}}\n",
            0.7 - 0.01 * i as f64
        ));
        if i % 3 == 0 {
            s.push_str(&format!(
                "{{\"iter\": {i}, \"split\": \"test\", \"auc\": {:.3}, \"log_loss\": 0.6}}\n",
                0.6 + 0.01 * i as f64
            ));
        }
    }
    s.push_str("{\"summary\": {\"iters\": 6, \"samples_per_s\": 1000.0}}\n");
    s.into_bytes()
}

/// The file targets, working in `work`.
pub fn targets(work: &Path) -> Vec<Target> {
    let file = |name: &str| -> PathBuf { work.join(name) };
    let (tsv, tsv_ds) = (file("case.tsv"), file("tsv.ds"));
    let (bin, bin_ds) = (file("case.bin"), file("bin.ds"));
    let (calib, curves) = (file("calibration.json"), file("metrics.jsonl"));
    let lines = criteo_lines(24);
    vec![
        Target {
            name: "tsv",
            seeds: vec![lines.clone(), gzip(&lines), criteo_lines(3)],
            feed: Box::new(move |b| converts(Format::CriteoTsv, &tsv, &tsv_ds, b)),
        },
        Target {
            name: "mlperf",
            seeds: vec![mlperf_records(16), mlperf_records(3)],
            feed: Box::new(move |b| converts(Format::MlperfBin, &bin, &bin_ds, b)),
        },
        Target {
            name: "calib",
            seeds: vec![calibration()],
            feed: Box::new(move |b| {
                std::fs::write(&calib, b).is_ok() && dlrm_runtime::calibrate::read(&calib).is_ok()
            }),
        },
        Target {
            name: "metrics",
            seeds: vec![metrics()],
            feed: Box::new(move |b| {
                std::fs::write(&curves, b).is_ok()
                    && dlrm_runtime::metrics::read_curves(&curves, "test").is_ok()
            }),
        },
    ]
}
