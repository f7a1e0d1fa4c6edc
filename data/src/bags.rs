//! Multi-hot tables of the `.ds` format: how a table's bags are stored, the
//! per-table writer, and the checks of a table's offsets (see the crate docs).

use crate::error::{DataError, Result};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

/// How a table stores its samples' bags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bags {
    /// One id per sample: `sparse.<t>.u32` has `samples` ids (format version 1).
    #[default]
    OneHot,
    /// A bag of ids per sample: `sparse.<t>.u32` holds every sample's ids in sample
    /// order and `sparse.<t>.off.u64` the `samples + 1` bag starts (0 first, the id
    /// count last; format version 2).
    MultiHot,
}

impl Bags {
    /// Whether it is [`Bags::OneHot`] (the manifest leaves it out then).
    pub fn is_one_hot(&self) -> bool {
        *self == Bags::OneHot
    }
}

/// The ids file of table `t`.
pub(crate) fn ids_file(t: usize) -> String {
    format!("sparse.{t}.u32")
}

/// The offsets file of multi-hot table `t`.
pub(crate) fn offsets_file(t: usize) -> String {
    format!("sparse.{t}.off.u64")
}

/// One table's column files while a dataset is written.
pub(crate) struct TableOut {
    pub(crate) ids: BufWriter<File>,
    /// The bag starts (multi-hot tables only); the first, 0, is written at creation.
    pub(crate) offsets: Option<BufWriter<File>>,
    /// Ids written so far.
    pub(crate) count: u64,
    /// The smallest and largest bag so far (`u64::MAX`, 0 before the first).
    pub(crate) min: u64,
    pub(crate) max: u64,
}

impl TableOut {
    /// Table `t`'s files in `dir`, stored as `bags`.
    pub(crate) fn create(dir: &Path, t: usize, bags: Bags) -> Result<TableOut> {
        let open = |name: &str| -> Result<BufWriter<File>> {
            let p = dir.join(name);
            File::create(&p)
                .map(|f| BufWriter::with_capacity(1 << 20, f))
                .map_err(|e| DataError::io(p, e))
        };
        let offsets = match bags {
            Bags::OneHot => None,
            Bags::MultiHot => {
                let mut w = open(&offsets_file(t))?;
                w.write_all(&0u64.to_le_bytes())
                    .map_err(|e| DataError::io(dir.join(offsets_file(t)), e))?;
                Some(w)
            }
        };
        Ok(TableOut {
            ids: open(&ids_file(t))?,
            offsets,
            count: 0,
            min: u64::MAX,
            max: 0,
        })
    }

    /// How the table is stored.
    pub(crate) fn bags(&self) -> Bags {
        if self.offsets.is_some() {
            Bags::MultiHot
        } else {
            Bags::OneHot
        }
    }

    /// Appends the bags of `ends.len()` samples: `ids` in sample order, sample `i`'s
    /// bag ending at `ends[i]` (exclusive, into `ids`). A one-hot table takes bags
    /// of exactly one id. `dir` and `t` name the files in errors.
    pub(crate) fn push(&mut self, dir: &Path, t: usize, ids: &[u32], ends: &[u64]) -> Result<()> {
        let mut start = 0u64;
        for (i, &end) in ends.iter().enumerate() {
            if end < start || end > ids.len() as u64 {
                return Err(DataError::Usage(format!(
                    "table {t}: bag {i} ends at {end}, before its start {start} or past the {} ids",
                    ids.len()
                )));
            }
            let len = end - start;
            if self.offsets.is_none() && len != 1 {
                return Err(DataError::Usage(format!(
                    "table {t} is one-hot: bag {i} has {len} ids, not 1"
                )));
            }
            self.min = self.min.min(len);
            self.max = self.max.max(len);
            start = end;
        }
        if start != ids.len() as u64 {
            return Err(DataError::Usage(format!(
                "table {t}: the bags end at {start} of {} ids",
                ids.len()
            )));
        }
        self.ids
            .write_all(bytemuck::cast_slice(ids))
            .map_err(|e| DataError::io(dir.join(ids_file(t)), e))?;
        if let Some(w) = &mut self.offsets {
            let abs: Vec<u64> = ends.iter().map(|&e| self.count + e).collect();
            w.write_all(bytemuck::cast_slice(&abs))
                .map_err(|e| DataError::io(dir.join(offsets_file(t)), e))?;
        }
        self.count += ids.len() as u64;
        Ok(())
    }

    /// Flushes and syncs the files (in `dir`, table `t`).
    pub(crate) fn sync(&mut self, dir: &Path, t: usize) -> Result<()> {
        let mut ws = vec![(&mut self.ids, ids_file(t))];
        if let Some(o) = &mut self.offsets {
            ws.push((o, offsets_file(t)));
        }
        for (w, name) in ws {
            let p = dir.join(name);
            w.flush().map_err(|e| DataError::io(&p, e))?;
            w.get_ref().sync_all().map_err(|e| DataError::io(&p, e))?;
        }
        Ok(())
    }
}

/// Checks the bag starts of multi-hot table `t` (file `path`, over `ids` ids):
/// 0 first, non-decreasing, the id count last; names the first bad position.
pub(crate) fn check_offsets(path: &Path, t: usize, offsets: &[u64], ids: u64) -> Result<()> {
    let bad = |reason: String| Err(DataError::dataset(path, format!("table {t}: {reason}")));
    match (offsets.first(), offsets.last()) {
        (Some(0), Some(&last)) if last == ids => {}
        (first, last) => {
            return bad(format!(
                "offsets must start at 0 and end at the {ids} ids of the table; they start at {first:?} and end at {last:?}"
            ));
        }
    }
    if let Some(i) = offsets.windows(2).position(|w| w[1] < w[0]) {
        return bad(format!(
            "offsets decrease at sample {i}: {} then {}",
            offsets[i],
            offsets[i + 1]
        ));
    }
    Ok(())
}

/// Sample `s`'s bag bounds from `offsets` of table `t` (file `path`) over `ids` ids,
/// checked: a range within the ids, start before end.
pub(crate) fn bag_range(
    path: &Path,
    t: usize,
    offsets: &[u64],
    ids: usize,
    s: usize,
) -> Result<std::ops::Range<usize>> {
    let (a, b) = match (offsets.get(s), offsets.get(s + 1)) {
        (Some(&a), Some(&b)) => (a, b),
        _ => {
            return Err(DataError::dataset(
                path,
                format!(
                    "table {t}: sample {s} has no bag (offsets hold {} entries)",
                    offsets.len()
                ),
            ));
        }
    };
    if a > b || b > ids as u64 {
        return Err(DataError::dataset(
            path,
            format!(
                "table {t}: sample {s}'s bag is ids {a}..{b}, not a range within the {ids} ids"
            ),
        ));
    }
    Ok(a as usize..b as usize)
}

/// How many ids the bags of a table hold: synthetic bags (`dlrm-run --pooling`) and
/// generated datasets (`dlrmc data generate --pooling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BagSizes {
    /// Every bag holds this many ids.
    Fixed(usize),
    /// Each bag's size is drawn uniformly from `lo..=hi`.
    Uniform(usize, usize),
}

impl std::fmt::Display for BagSizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BagSizes::Fixed(n) => write!(f, "{n}"),
            BagSizes::Uniform(lo, hi) => write!(f, "{lo}-{hi}"),
        }
    }
}

impl BagSizes {
    /// The largest bag size that may be asked for: a sample's bag is created whole.
    pub const MAX: usize = 1 << 16;

    /// Parses `N` or `A-B` (`A <= B`, both at most [`BagSizes::MAX`]).
    pub fn parse(s: &str) -> std::result::Result<BagSizes, String> {
        let num = |t: &str| -> std::result::Result<usize, String> {
            let n: usize = t
                .trim()
                .parse()
                .map_err(|_| format!("`{t}` is not a bag size (a count, or a range A-B)"))?;
            if n > BagSizes::MAX {
                return Err(format!(
                    "bag size {n} is above the limit of {}",
                    BagSizes::MAX
                ));
            }
            Ok(n)
        };
        match s.split_once('-') {
            None => Ok(BagSizes::Fixed(num(s)?)),
            Some((a, b)) => {
                let (lo, hi) = (num(a)?, num(b)?);
                if lo > hi {
                    return Err(format!("bag sizes `{s}`: the range is empty ({lo} > {hi})"));
                }
                Ok(if lo == hi {
                    BagSizes::Fixed(lo)
                } else {
                    BagSizes::Uniform(lo, hi)
                })
            }
        }
    }

    /// Parses a comma list of [`BagSizes::parse`] items (one for every table, or
    /// one per table).
    pub fn parse_list(s: &str) -> std::result::Result<Vec<BagSizes>, String> {
        s.split(',').map(BagSizes::parse).collect()
    }

    /// The size for a draw `h` (uniform over the range).
    pub fn pick(self, h: u64) -> usize {
        match self {
            BagSizes::Fixed(n) => n,
            BagSizes::Uniform(lo, hi) => lo + (h % (hi - lo + 1) as u64) as usize,
        }
    }
}
