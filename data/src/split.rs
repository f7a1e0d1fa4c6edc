//! Train / validation / test splits, as the reference DLRM makes them.
//!
//! - `kaggle`: the one `train.txt` is cut into 7 "days" with
//!   `divmod(total, 7)` (the first `total % 7` days get one sample more); days 0-5
//!   are `train`, day 6 is halved with `np.array_split(day6, 2)`: the first half
//!   (the larger when odd) is `test`, the second `val`.
//! - `terabyte`: one input file per day; every day but the last is `train`, the last
//!   (day 23) is halved the same way into `test` then `val` (the reference's
//!   `test_size = ceil(n / 2)`).
//! - fractions, e.g. `train=0.8,val=0.1,test=0.1`: consecutive ranges in that order,
//!   each `floor(fraction × total)` samples but the last, which takes the rest.

use crate::ds::Split;
use crate::error::{DataError, Result};
use std::str::FromStr;

/// How to split a converted dataset.
#[derive(Clone, Debug, PartialEq)]
pub enum SplitSpec {
    /// 7 equal days, day 6 halved into test and val.
    Kaggle,
    /// One day per input file, the last halved into test and val.
    Terabyte,
    /// Named fractions in order.
    Fractions(Vec<(String, f64)>),
}

impl FromStr for SplitSpec {
    type Err = DataError;
    fn from_str(s: &str) -> Result<SplitSpec> {
        match s {
            "kaggle" => return Ok(SplitSpec::Kaggle),
            "terabyte" => return Ok(SplitSpec::Terabyte),
            _ => {}
        }
        let bad = |why: String| {
            DataError::Usage(format!(
                "--split `{s}`: {why} (expected `kaggle`, `terabyte` or fractions like `train=0.8,val=0.1,test=0.1`)"
            ))
        };
        let mut parts = Vec::new();
        for part in s.split(',') {
            let (name, frac) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("`{part}` is not name=fraction")))?;
            let name = name.trim();
            let frac: f64 = frac
                .trim()
                .parse()
                .map_err(|_| bad(format!("`{frac}` is not a number")))?;
            if name.is_empty() || !(0.0..=1.0).contains(&frac) {
                return Err(bad(format!("`{part}` needs a name and a fraction in 0..1")));
            }
            if parts.iter().any(|(n, _): &(String, f64)| n == name) {
                return Err(bad(format!("`{name}` appears twice")));
            }
            parts.push((name.to_string(), frac));
        }
        let sum: f64 = parts.iter().map(|p| p.1).sum();
        if (sum - 1.0).abs() > 1e-6 {
            return Err(bad(format!("the fractions add up to {sum}, not 1")));
        }
        if !parts.iter().any(|(n, _)| n == "train") {
            let names: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
            return Err(bad(format!(
                "a dataset needs a `train` split; the splits given are {}",
                names.join(", ")
            )));
        }
        Ok(SplitSpec::Fractions(parts))
    }
}

impl SplitSpec {
    /// The default for `files` input files: `kaggle` for one, `terabyte` for several.
    pub fn default_for(files: usize) -> SplitSpec {
        if files > 1 {
            SplitSpec::Terabyte
        } else {
            SplitSpec::Kaggle
        }
    }

    /// The spec's name for the manifest (`kaggle`, `terabyte`, or the fractions).
    pub fn describe(&self) -> String {
        match self {
            SplitSpec::Kaggle => "kaggle".into(),
            SplitSpec::Terabyte => "terabyte".into(),
            SplitSpec::Fractions(p) => p
                .iter()
                .map(|(n, f)| format!("{n}={f}"))
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// The splits and the samples per day for data whose input files held
    /// `per_file` samples each.
    pub fn plan(&self, per_file: &[u64]) -> Result<(Vec<Split>, Vec<u64>)> {
        let total: u64 = per_file.iter().sum();
        let split = |name: &str, start: u64, end: u64| Split {
            name: name.into(),
            start,
            end,
        };
        match self {
            SplitSpec::Kaggle => {
                let days = kaggle_days(total, 7);
                let day6 = total - days[6];
                Ok((halve_last(split("train", 0, day6), total), days))
            }
            SplitSpec::Terabyte => {
                if per_file.len() < 2 {
                    return Err(DataError::Usage(
                        "--split terabyte needs one input file per day (at least 2); \
                         use --split kaggle or fractions for one file"
                            .into(),
                    ));
                }
                let last = total - per_file[per_file.len() - 1];
                Ok((
                    halve_last(split("train", 0, last), total),
                    per_file.to_vec(),
                ))
            }
            SplitSpec::Fractions(parts) => {
                let mut out = Vec::new();
                let mut start = 0u64;
                for (i, (name, f)) in parts.iter().enumerate() {
                    let end = if i + 1 == parts.len() {
                        total
                    } else {
                        (start + (f * total as f64).floor() as u64).min(total)
                    };
                    out.push(split(name, start, end));
                    start = end;
                }
                let days = if per_file.len() > 1 {
                    per_file.to_vec()
                } else {
                    Vec::new()
                };
                Ok((out, days))
            }
        }
    }
}

/// `days` day sizes as the reference's `divmod(total, days)`: the first `total % days`
/// days get one sample more.
pub fn kaggle_days(total: u64, days: u64) -> Vec<u64> {
    let (q, r) = (total / days, total % days);
    (0..days).map(|d| q + u64::from(d < r)).collect()
}

/// `train` then the samples after it halved: `test` first (`ceil(n / 2)`), `val` after.
fn halve_last(train: Split, total: u64) -> Vec<Split> {
    let n = total - train.end;
    let mid = train.end + n.div_ceil(2);
    let (a, b) = (train.end, mid);
    vec![
        train,
        Split {
            name: "val".into(),
            start: b,
            end: total,
        },
        Split {
            name: "test".into(),
            start: a,
            end: b,
        },
    ]
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests fail loudly")]
mod tests {
    use super::SplitSpec;

    #[test]
    fn fractions_need_a_train_split() {
        let e = "x=1".parse::<SplitSpec>().unwrap_err().to_string();
        assert!(
            e.contains("--split `x=1`")
                && e.contains("needs a `train` split; the splits given are x"),
            "{e}"
        );
        let e = "val=0.5,test=0.5"
            .parse::<SplitSpec>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("the splits given are val, test"), "{e}");
        assert!("train=0.5,test=0.5".parse::<SplitSpec>().is_ok());
    }
}
