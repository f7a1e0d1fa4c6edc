//! Writes a Criteo-like `.ds` dataset for measurements: `N` samples over 7 days, 13
//! dense and 26 categorical features with dlrm-kaggle's table sizes, power-law ids
//! (log-uniform over each table: id = ⌊rows^u⌋ - 1), and labels from a hidden
//! teacher (a linear function of the dense features plus a per-id value of every
//! table, thresholded at ~25% positives). Splits: days 1-6 `train`, day 7 halved into
//! `val` and `test`.
//!
//! `cargo run --release -p dlrm-runtime --example gen_dataset -- OUT.ds [N]`

use dlrm_data::{DatasetMeta, DatasetWriter, Split, TableInfo};
use std::path::PathBuf;

const ROWS: [u64; 26] = [
    1460, 583, 200000, 200000, 305, 24, 12517, 633, 3, 93145, 5683, 200000, 3194, 27, 14992,
    200000, 10, 5652, 2173, 4, 200000, 18, 15, 200000, 105, 142572,
];
const DAYS: u64 = 7;

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(args.next().ok_or("usage: gen_dataset OUT.ds [SAMPLES]")?);
    let n: u64 = args.next().map_or(Ok(2_100_000), |s| s.parse())?;
    let mut w = DatasetWriter::create(&out, 13, ROWS.len())?;
    let dense_w: Vec<f64> = (0..13).map(|j| 2.0 * unit(mix(1000 + j)) - 1.0).collect();
    let mut dense = [0f32; 13];
    let mut ids = [0u32; 26];
    for i in 0..n {
        let mut logit = 0.0;
        for (j, d) in dense.iter_mut().enumerate() {
            // A heavy-tailed count, then ln(1 + x) as the converter does.
            let x = (1.0 / (1.0 - unit(mix(i * 64 + j as u64))).max(1e-9) - 1.0) * 4.0;
            *d = (1.0 + x).ln() as f32;
            logit += 0.35 * dense_w[j] * (f64::from(*d) - 1.2);
        }
        for (t, id) in ids.iter_mut().enumerate() {
            let rows = ROWS[t] as f64;
            let u = unit(mix(i * 64 + 20 + t as u64));
            *id = ((rows.powf(u) - 1.0).floor() as u64).min(ROWS[t] - 1) as u32;
            let v = 2.0 * unit(mix((t as u64) << 40 ^ u64::from(*id) ^ 0xABCD)) - 1.0;
            logit += 0.45 * v;
        }
        logit += 0.8 * (2.0 * unit(mix(i ^ 0xFEED_F00D)) - 1.0);
        w.push(u8::from(logit > 1.3), &dense, &ids)?;
    }
    let day = n / DAYS;
    let train_end = day * (DAYS - 1);
    let val_end = train_end + (n - train_end) / 2;
    let split = |name: &str, start, end| Split {
        name: name.into(),
        start,
        end,
    };
    let m = w.finish(DatasetMeta {
        dense_transform: "log1p".into(),
        tables: ROWS
            .iter()
            .enumerate()
            .map(|(t, &rows)| TableInfo {
                name: format!("C{}", t + 1),
                rows,
            })
            .collect(),
        splits: vec![
            split("train", 0, train_end),
            split("val", train_end, val_end),
            split("test", val_end, n),
        ],
        days: (0..DAYS)
            .map(|d| if d + 1 == DAYS { n - d * day } else { day })
            .collect(),
        source: serde_json::json!({"generator": "runtime/examples/gen_dataset.rs", "samples": n}),
    })?;
    eprintln!("wrote {} ({} samples)", out.display(), m.samples);
    Ok(())
}
