//! The `.ds` dataset: manifest, atomic writer, memory-mapped reader (see the crate docs).

use crate::bags::{Bags, TableOut, bag_range, check_offsets, ids_file, offsets_file};
use crate::error::{DataError, Result};
use crate::mapped::Watched;
use memmap2::Mmap;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

#[cfg(not(target_endian = "little"))]
compile_error!("the .ds column files are little-endian and read by memory map");

/// The manifest's `format` field.
pub const FORMAT: &str = "dlrm-dataset";
/// The newest format version this build reads; it writes version 2 when a table is
/// multi-hot and version 1 (which every earlier build reads) when every table is
/// one-hot.
pub const VERSION: u32 = 2;
/// The version of datasets whose tables are all one-hot.
const VERSION_ONE_HOT: u32 = 1;
const MANIFEST: &str = "manifest.json";
const LABEL: &str = "label.u8";
const DENSE: &str = "dense.f32";

/// A table (categorical feature): its name, row count (every id is below it) and
/// how its bags are stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableInfo {
    /// The feature's name (`C1` .. `C26` for Criteo).
    pub name: String,
    /// Rows: one more than the largest id the table may hold.
    pub rows: u64,
    /// One id per sample, or a bag of ids per sample (set by the writer).
    #[serde(default, skip_serializing_if = "Bags::is_one_hot")]
    pub bags: Bags,
    /// A multi-hot table's ids in all samples (set by the writer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<u64>,
    /// A multi-hot table's bag size when every bag has the same (set by the writer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotness: Option<u64>,
}

impl TableInfo {
    /// A table called `name` of `rows` rows (its bags are filled in by the writer).
    pub fn new(name: impl Into<String>, rows: u64) -> TableInfo {
        TableInfo {
            name: name.into(),
            rows,
            bags: Bags::OneHot,
            ids: None,
            hotness: None,
        }
    }

    /// The bag size of every sample, if fixed: 1 for a one-hot table.
    pub fn fixed_hotness(&self) -> Option<u64> {
        match self.bags {
            Bags::OneHot => Some(1),
            Bags::MultiHot => self.hotness,
        }
    }
}

/// A named range of samples.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// `train`, `val`, `test`, or a user's name.
    pub name: String,
    /// First sample.
    pub start: u64,
    /// One past the last sample.
    pub end: u64,
}

impl Split {
    /// The samples, as a range.
    pub fn range(&self) -> Range<usize> {
        self.start as usize..self.end as usize
    }
}

/// A column file: its path in the dataset, size and SHA-256.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File name, relative to the dataset directory.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// SHA-256 of the contents, lower-case hex.
    pub sha256: String,
}

/// `manifest.json`: everything about a dataset but its values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// The format version ([`VERSION`] when written by this build).
    pub version: u32,
    /// Samples.
    pub samples: u64,
    /// Dense features per sample.
    pub dense: usize,
    /// What was applied to the raw dense values: `"log1p"` (`ln(1 + max(x, 0))`,
    /// missing as 0, the reference DLRM's transform) or `"none"`.
    pub dense_transform: String,
    /// The categorical features, in column order.
    pub tables: Vec<TableInfo>,
    /// Named sample ranges (`train`, `val`, `test`).
    pub splits: Vec<Split>,
    /// Samples per day, in order, when the source has days (Criteo); else empty.
    #[serde(default)]
    pub days: Vec<u64>,
    /// How the dataset was made (source format, files, id mapping, lines skipped).
    #[serde(default)]
    pub source: serde_json::Value,
    /// The column files.
    pub files: Vec<FileEntry>,
}

impl Manifest {
    /// The split called `name`.
    pub fn split(&self, name: &str) -> Result<&Split> {
        self.splits.iter().find(|s| s.name == name).ok_or_else(|| {
            let names: Vec<&str> = self.splits.iter().map(|s| s.name.as_str()).collect();
            DataError::Usage(format!(
                "the dataset has no split `{name}` (it has: {})",
                names.join(", ")
            ))
        })
    }

    /// Checks the manifest's own consistency (format, version, splits within the
    /// samples, one file per column).
    fn check(&self, dir: &Path) -> Result<()> {
        let bad = |reason: String| Err(DataError::dataset(dir.join(MANIFEST), reason));
        if self.format != FORMAT {
            return bad(format!("format is `{}`, expected `{FORMAT}`", self.format));
        }
        if self.version > VERSION {
            return bad(format!(
                "format version {} is newer than this build reads ({VERSION}); upgrade dlrmc",
                self.version
            ));
        }
        if self.version == 0 {
            return bad("format version 0 does not exist".into());
        }
        if self.samples == 0 {
            return bad("the dataset has no samples".into());
        }
        for s in &self.splits {
            if s.start > s.end || s.end > self.samples {
                return bad(format!(
                    "split `{}` is samples {}..{}, outside 0..{}",
                    s.name, s.start, s.end, self.samples
                ));
            }
        }
        for (t, table) in self.tables.iter().enumerate() {
            if table.rows == 0 || table.rows > u64::from(u32::MAX) + 1 {
                return bad(format!(
                    "table {t} ({}) has {} rows (must be 1..=2^32)",
                    table.name, table.rows
                ));
            }
            self.check_bags(t, table).or_else(bad)?;
        }
        for (name, bytes) in self.expected_files() {
            match self.files.iter().find(|f| f.path == name) {
                None => return bad(format!("no entry for the column file {name}")),
                Some(f) if f.bytes != bytes => {
                    return bad(format!(
                        "{name} is listed with {} bytes, {bytes} expected for {} samples",
                        f.bytes, self.samples
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Table `t`'s bag description: a multi-hot table only in version 2, with its
    /// id count, and a hotness that accounts for every id.
    fn check_bags(&self, t: usize, table: &TableInfo) -> std::result::Result<(), String> {
        let name = &table.name;
        match (table.bags, table.ids, table.hotness) {
            (Bags::OneHot, None, None) => Ok(()),
            (Bags::OneHot, ..) => Err(format!(
                "table {t} ({name}) is one_hot but lists an id count or hotness"
            )),
            (Bags::MultiHot, _, _) if self.version < 2 => Err(format!(
                "table {t} ({name}) is multi_hot, which format version {} does not have (2 does)",
                self.version
            )),
            (Bags::MultiHot, None, _) => Err(format!(
                "table {t} ({name}) is multi_hot but lists no id count"
            )),
            (Bags::MultiHot, Some(ids), Some(h)) if h.checked_mul(self.samples) != Some(ids) => {
                Err(format!(
                    "table {t} ({name}) has hotness {h} but {ids} ids for {} samples",
                    self.samples
                ))
            }
            (Bags::MultiHot, Some(ids), _) if ids > u64::MAX / 8 => {
                Err(format!("table {t} ({name}) lists {ids} ids"))
            }
            (Bags::MultiHot, Some(_), _) => Ok(()),
        }
    }

    /// The column files this schema has, with their sizes.
    fn expected_files(&self) -> Vec<(String, u64)> {
        // Counts are claims from the manifest: a size past u64 saturates, and so
        // matches no file.
        let n = self.samples;
        let dense = (self.dense as u64).saturating_mul(4);
        let mut v = vec![
            (LABEL.to_string(), n),
            (DENSE.to_string(), n.saturating_mul(dense)),
        ];
        for (t, table) in self.tables.iter().enumerate() {
            v.push((ids_file(t), table.ids.unwrap_or(n).saturating_mul(4)));
            if table.bags == Bags::MultiHot {
                v.push((offsets_file(t), n.saturating_add(1).saturating_mul(8)));
            }
        }
        v
    }
}

/// What [`DatasetWriter::finish`] records beside the values.
#[derive(Clone, Debug, Default)]
pub struct DatasetMeta {
    /// See [`Manifest::dense_transform`].
    pub dense_transform: String,
    /// See [`Manifest::tables`] (as many as the writer's tables).
    pub tables: Vec<TableInfo>,
    /// See [`Manifest::splits`].
    pub splits: Vec<Split>,
    /// See [`Manifest::days`].
    pub days: Vec<u64>,
    /// See [`Manifest::source`].
    pub source: serde_json::Value,
}

/// Writes a dataset sample by sample into a temporary directory, then puts it in
/// place atomically ([`DatasetWriter::finish`]); dropped unfinished, it leaves
/// nothing behind.
pub struct DatasetWriter {
    target: PathBuf,
    tmp: tempfile::TempDir,
    dense: usize,
    label: BufWriter<File>,
    dense_f: BufWriter<File>,
    tables: Vec<TableOut>,
    samples: u64,
}

impl DatasetWriter {
    /// A writer of a dataset at `target` with `dense` dense features and `tables`
    /// one-hot categorical ones. `target` must not exist or be a dataset (which the
    /// finished write replaces).
    pub fn create(target: &Path, dense: usize, tables: usize) -> Result<DatasetWriter> {
        DatasetWriter::create_bags(target, dense, &vec![Bags::OneHot; tables])
    }

    /// A writer like [`DatasetWriter::create`] whose table `t` stores its bags as
    /// `bags[t]`.
    pub fn create_bags(target: &Path, dense: usize, bags: &[Bags]) -> Result<DatasetWriter> {
        if target.exists() && !target.join(MANIFEST).is_file() {
            return Err(DataError::dataset(
                target,
                "exists and is not a dataset (no manifest.json); refusing to replace it",
            ));
        }
        let tmp = crate::durable::temp_dir_beside(target)
            .map_err(|e| DataError::io(crate::durable::parent_of(target), e))?;
        let open = |name: &str| -> Result<BufWriter<File>> {
            let p = tmp.path().join(name);
            File::create(&p)
                .map(|f| BufWriter::with_capacity(1 << 20, f))
                .map_err(|e| DataError::io(p, e))
        };
        Ok(DatasetWriter {
            label: open(LABEL)?,
            dense_f: open(DENSE)?,
            tables: bags
                .iter()
                .enumerate()
                .map(|(t, &b)| TableOut::create(tmp.path(), t, b))
                .collect::<Result<_>>()?,
            target: target.to_path_buf(),
            tmp,
            dense,
            samples: 0,
        })
    }

    /// Samples written so far.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Appends one sample: its label (0 or 1), dense values and one id per table.
    pub fn push(&mut self, label: u8, dense: &[f32], sparse: &[u32]) -> Result<()> {
        let bags: Vec<&[u32]> = sparse.iter().map(std::slice::from_ref).collect();
        self.push_bags(label, dense, &bags)
    }

    /// Appends one sample: its label (0 or 1), dense values and one bag per table
    /// (exactly one id for a one-hot table).
    pub fn push_bags(&mut self, label: u8, dense: &[f32], bags: &[&[u32]]) -> Result<()> {
        if label > 1 || dense.len() != self.dense || bags.len() != self.tables.len() {
            return Err(DataError::Usage(format!(
                "sample {}: label {label}, {} dense values and {} bags; the dataset takes a 0/1 label, {} dense values and {} bags",
                self.samples,
                dense.len(),
                bags.len(),
                self.dense,
                self.tables.len()
            )));
        }
        let tmp = self.tmp.path();
        let io = |name: &str, e| DataError::io(tmp.join(name), e);
        self.label.write_all(&[label]).map_err(|e| io(LABEL, e))?;
        self.dense_f
            .write_all(bytemuck::cast_slice(dense))
            .map_err(|e| io(DENSE, e))?;
        for (t, (w, bag)) in self.tables.iter_mut().zip(bags).enumerate() {
            w.push(tmp, t, bag, &[bag.len() as u64])?;
        }
        self.samples += 1;
        Ok(())
    }

    /// Appends `labels.len()` samples column by column: their labels (0 or 1), dense
    /// values (sample-major) and one id column per table. The same as as many calls
    /// of [`DatasetWriter::push`], with one write per column.
    pub fn push_columns(
        &mut self,
        labels: &[u8],
        dense: &[f32],
        sparse: &[Vec<u32>],
    ) -> Result<()> {
        let ends: Vec<u64> = (1..=labels.len() as u64).collect();
        let bags: Vec<(&[u32], &[u64])> = sparse.iter().map(|c| (&c[..], &ends[..])).collect();
        self.push_bag_columns(labels, dense, &bags)
    }

    /// Appends `labels.len()` samples column by column like
    /// [`DatasetWriter::push_columns`], with per table the samples' ids in sample
    /// order and where each sample's bag ends in them (exclusive; `labels.len()`
    /// ends, non-decreasing, the last the id count).
    pub fn push_bag_columns(
        &mut self,
        labels: &[u8],
        dense: &[f32],
        sparse: &[(&[u32], &[u64])],
    ) -> Result<()> {
        let n = labels.len();
        if dense.len() != n * self.dense
            || sparse.len() != self.tables.len()
            || sparse.iter().any(|(_, ends)| ends.len() != n)
        {
            return Err(DataError::Usage(format!(
                "{n} samples need {} dense values and {} bag columns of {n} bags",
                n * self.dense,
                self.tables.len()
            )));
        }
        if let Some(i) = labels.iter().position(|&y| y > 1) {
            return Err(DataError::Usage(format!(
                "sample {}: label {} is not 0 or 1",
                self.samples + i as u64,
                labels[i]
            )));
        }
        let tmp = self.tmp.path();
        let io = |name: &str, e| DataError::io(tmp.join(name), e);
        self.label.write_all(labels).map_err(|e| io(LABEL, e))?;
        self.dense_f
            .write_all(bytemuck::cast_slice(dense))
            .map_err(|e| io(DENSE, e))?;
        for (t, (w, (ids, ends))) in self.tables.iter_mut().zip(sparse).enumerate() {
            w.push(tmp, t, ids, ends)?;
        }
        self.samples += n as u64;
        Ok(())
    }

    /// Rewrites every id of table `t` written so far through `f` (e.g. raw hashes to
    /// vocabulary rows once the vocabulary is known).
    pub fn map_sparse(&mut self, t: usize, f: impl Fn(u32) -> u32 + Sync) -> Result<()> {
        let name = ids_file(t);
        let w = self
            .tables
            .get_mut(t)
            .ok_or_else(|| DataError::Usage(format!("no table {t}")))?;
        let p = self.tmp.path().join(&name);
        w.ids.flush().map_err(|e| DataError::io(&p, e))?;
        if w.count == 0 {
            return Ok(());
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .map_err(|e| DataError::io(&p, e))?;
        // SAFETY: the file is this writer's own, in its private temporary directory;
        // nothing else maps or writes it while the map lives.
        let mut map =
            unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(|e| DataError::io(&p, e))?;
        let ids: &mut [u32] = bytemuck::try_cast_slice_mut(&mut map[..])
            .map_err(|e| DataError::dataset(&p, format!("not a u32 column: {e}")))?;
        for id in ids.iter_mut() {
            *id = f(*id);
        }
        map.flush().map_err(|e| DataError::io(&p, e))?;
        Ok(())
    }

    /// Syncs every file, writes the manifest and renames the directory into place
    /// (replacing a dataset already there only once the new one is complete). The
    /// tables' bag descriptions ([`TableInfo::bags`], `ids`, `hotness`) are the
    /// writer's.
    pub fn finish(mut self, mut meta: DatasetMeta) -> Result<Manifest> {
        if meta.tables.len() != self.tables.len() {
            return Err(DataError::Usage(format!(
                "{} table descriptions for {} tables",
                meta.tables.len(),
                self.tables.len()
            )));
        }
        let tmp = self.tmp.path().to_path_buf();
        for (w, name) in [(&mut self.label, LABEL), (&mut self.dense_f, DENSE)] {
            let p = tmp.join(name);
            w.flush().map_err(|e| DataError::io(&p, e))?;
            w.get_ref().sync_all().map_err(|e| DataError::io(&p, e))?;
        }
        let mut names = vec![LABEL.to_string(), DENSE.to_string()];
        for (t, (w, info)) in self.tables.iter_mut().zip(&mut meta.tables).enumerate() {
            w.sync(&tmp, t)?;
            names.push(ids_file(t));
            info.bags = w.bags();
            (info.ids, info.hotness) = (None, None);
            if info.bags == Bags::MultiHot {
                names.push(offsets_file(t));
                info.ids = Some(w.count);
                info.hotness = (w.min == w.max).then_some(w.max);
            }
        }
        let files = names
            .iter()
            .map(|name| {
                let (bytes, sha256) = hash_file(&tmp.join(name))?;
                Ok(FileEntry {
                    path: name.clone(),
                    bytes,
                    sha256,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let multi = meta.tables.iter().any(|t| t.bags == Bags::MultiHot);
        let manifest = Manifest {
            format: FORMAT.into(),
            version: if multi { VERSION } else { VERSION_ONE_HOT },
            samples: self.samples,
            dense: self.dense,
            dense_transform: meta.dense_transform,
            tables: meta.tables,
            splits: meta.splits,
            days: meta.days,
            source: meta.source,
            files,
        };
        manifest.check(&self.target)?;
        write_manifest(&tmp, &manifest)?;
        // A temporary directory is private (0700); a dataset is as readable as any
        // directory the user makes.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| DataError::io(&tmp, e))?;
        }
        sync_dir(&tmp)?;
        commit_dir(self.tmp, &self.target)?;
        Ok(manifest)
    }
}

/// Writes `manifest.json` in `dir`, synced.
fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<()> {
    let mp = dir.join(MANIFEST);
    let text = serde_json::to_string_pretty(manifest)
        .map_err(|e| DataError::dataset(&mp, e.to_string()))?;
    let mut f = File::create(&mp).map_err(|e| DataError::io(&mp, e))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.write_all(b"\n"))
        .and_then(|()| f.sync_all())
        .map_err(|e| DataError::io(&mp, e))
}

/// Renames the finished temporary directory to `target`; an existing dataset there
/// is moved aside first and removed only after the new one is in place
/// ([`crate::durable::replace_dir`]).
fn commit_dir(tmp: tempfile::TempDir, target: &Path) -> Result<()> {
    let tmp_path = tmp.keep();
    crate::durable::replace_dir(&tmp_path, target).map_err(|e| DataError::io(target, e))
}

fn sync_dir(dir: &Path) -> Result<()> {
    crate::durable::sync_dir(dir).map_err(|e| DataError::io(dir, e))
}

/// Size and SHA-256 (lower-case hex) of a file.
fn hash_file(p: &Path) -> Result<(u64, String)> {
    crate::durable::hash_file(p).map_err(|e| DataError::io(p, e))
}

/// A dataset, memory-mapped.
pub struct Dataset {
    dir: PathBuf,
    manifest: Manifest,
    label: Mmap,
    dense: Mmap,
    sparse: Vec<Mmap>,
    /// Per table: its bag starts, if multi-hot.
    offsets: Vec<Option<Mmap>>,
    /// The mapped files, for [`Dataset::check_unchanged`].
    watched: Watched,
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset")
            .field("dir", &self.dir)
            .field("samples", &self.manifest.samples)
            .finish_non_exhaustive()
    }
}

/// The ids of a mapped ids file (a page-aligned map whose size was checked to be a
/// multiple of 4 at open; an empty file, which has no page, holds none).
fn ids_of(m: &Mmap) -> &[u32] {
    if m.is_empty() {
        &[]
    } else {
        bytemuck::cast_slice(m)
    }
}

/// Maps `dir/name`, which must be `bytes` long, and watches its size.
fn map_file(dir: &Path, name: &str, bytes: u64, watched: &mut Watched) -> Result<Mmap> {
    let p = dir.join(name);
    let f = File::open(&p).map_err(|e| DataError::io(&p, e))?;
    let len = f.metadata().map_err(|e| DataError::io(&p, e))?.len();
    if len != bytes {
        return Err(DataError::dataset(
            &p,
            format!("is {len} bytes, the manifest says {bytes}"),
        ));
    }
    crate::mapped::guard_sigbus();
    // SAFETY: the map is read-only; a dataset is never written in place (the
    // writer renames a new directory over it), so the file does not change
    // under the map unless someone edits it by hand: the checksums of `verify`
    // catch an edit, `Dataset::check_unchanged` (before every batch) a
    // truncation, and the SIGBUS guard a truncation between two checks (every
    // bag's bounds are checked where they are read).
    let map = unsafe { Mmap::map(&f) }.map_err(|e| DataError::io(&p, e))?;
    watched.add(&p, f, bytes);
    Ok(map)
}

impl Dataset {
    /// Opens the dataset at `dir`: reads and checks the manifest, checks every column
    /// file's size and every multi-hot table's first and last offset, maps the files.
    /// Checksums, value ranges and the order of every offset are checked by
    /// [`Dataset::verify`]; a bag's bounds are checked again where it is read
    /// ([`Dataset::bag`]).
    pub fn open(dir: &Path) -> Result<Dataset> {
        let mp = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&mp).map_err(|e| DataError::io(&mp, e))?;
        let manifest: Manifest = serde_json::from_str(&text)
            .map_err(|e| DataError::dataset(&mp, format!("malformed manifest: {e}")))?;
        manifest.check(dir)?;
        let n = manifest.samples;
        let mut watched = Watched::default();
        let label = map_file(dir, LABEL, n, &mut watched)?;
        let dense = map_file(dir, DENSE, n * manifest.dense as u64 * 4, &mut watched)?;
        let mut sparse = Vec::with_capacity(manifest.tables.len());
        let mut offsets = Vec::with_capacity(manifest.tables.len());
        for (t, table) in manifest.tables.iter().enumerate() {
            let ids = table.ids.unwrap_or(n);
            sparse.push(map_file(dir, &ids_file(t), ids * 4, &mut watched)?);
            offsets.push(match table.bags {
                Bags::OneHot => None,
                Bags::MultiHot => {
                    let m = map_file(dir, &offsets_file(t), (n + 1) * 8, &mut watched)?;
                    let o: &[u64] = bytemuck::cast_slice(&m);
                    let ends = [o[0], o[o.len() - 1]];
                    check_offsets(&dir.join(offsets_file(t)), t, &ends, ids)?;
                    Some(m)
                }
            });
        }
        Ok(Dataset {
            dir: dir.to_path_buf(),
            manifest,
            label,
            dense,
            sparse,
            offsets,
            watched,
        })
    }

    /// An error naming the first of the dataset's files whose size changed since
    /// it was opened (truncated or rewritten under the running job): reading it
    /// would fault.
    pub fn check_unchanged(&self) -> Result<()> {
        self.watched.check()
    }

    /// Checks every file's SHA-256 against the manifest, every label is 0 or 1,
    /// every id below its table's rows and every multi-hot table's offsets in order;
    /// names the first mismatch.
    pub fn verify(&self) -> Result<()> {
        self.verify_with(true)
    }

    /// [`Dataset::verify`], the labels' check only if `labels` (a run that skips
    /// samples with bad labels checks them itself).
    pub fn verify_with(&self, labels: bool) -> Result<()> {
        for f in &self.manifest.files {
            let p = self.dir.join(&f.path);
            let (_, sha) = hash_file(&p)?;
            if sha != f.sha256 {
                return Err(DataError::dataset(
                    p,
                    format!(
                        "checksum mismatch (SHA-256 {sha}, the manifest says {})",
                        f.sha256
                    ),
                ));
            }
        }
        if let Some(i) = self.labels().iter().position(|&y| y > 1)
            && labels
        {
            return Err(DataError::dataset(
                self.dir.join(LABEL),
                format!("sample {i}: label {} is not 0 or 1", self.labels()[i]),
            ));
        }
        for (t, table) in self.manifest.tables.iter().enumerate() {
            let ids = self.sparse(t);
            if let Some(o) = self.bag_offsets(t) {
                check_offsets(&self.dir.join(offsets_file(t)), t, o, ids.len() as u64)?;
            }
            if let Some(i) = ids.iter().position(|&id| u64::from(id) >= table.rows) {
                return Err(DataError::dataset(
                    self.dir.join(ids_file(t)),
                    format!(
                        "{}: id {} of table {t} ({}) is beyond its {} rows",
                        match table.bags {
                            Bags::OneHot => format!("sample {i}"),
                            Bags::MultiHot => format!("id {i} of the bags"),
                        },
                        ids[i],
                        table.name,
                        table.rows
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The dataset's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Samples.
    pub fn len(&self) -> usize {
        self.manifest.samples as usize
    }

    /// Never true: a dataset has samples ([`Dataset::open`] refuses an empty one).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Dense features per sample.
    pub fn dense_width(&self) -> usize {
        self.manifest.dense
    }

    /// Categorical features (tables).
    pub fn num_tables(&self) -> usize {
        self.sparse.len()
    }

    /// Every sample's label (0 or 1).
    pub fn labels(&self) -> &[u8] {
        &self.label
    }

    /// Every sample's dense values, sample-major (`len() × dense_width()`).
    pub fn dense(&self) -> &[f32] {
        // Page-aligned map of a size checked at open: the cast cannot fail.
        bytemuck::cast_slice(&self.dense)
    }

    /// Table `t`'s ids: one per sample (one-hot), or every sample's bag in sample
    /// order (multi-hot; see [`Dataset::bag`]).
    ///
    /// # Panics
    /// If `t >= num_tables()`.
    pub fn sparse(&self, t: usize) -> &[u32] {
        ids_of(&self.sparse[t])
    }

    /// Multi-hot table `t`'s `len() + 1` bag starts (unchecked; [`Dataset::bag`]
    /// checks each bag it reads); `None` for a one-hot table or no table `t`.
    pub fn bag_offsets(&self, t: usize) -> Option<&[u64]> {
        self.offsets
            .get(t)?
            .as_ref()
            .map(|m| bytemuck::cast_slice(m))
    }

    /// Sample `s`'s bag of table `t`: a range of [`Dataset::sparse`], its bounds
    /// checked (an error names the offsets file, the table and the sample).
    pub fn bag(&self, t: usize, s: usize) -> Result<&[u32]> {
        let ids = self
            .sparse
            .get(t)
            .map(ids_of)
            .ok_or_else(|| DataError::Usage(format!("no table {t}")))?;
        let r = match self.bag_offsets(t) {
            Some(o) => bag_range(&self.dir.join(offsets_file(t)), t, o, ids.len(), s)?,
            None if s < ids.len() => s..s + 1,
            None => {
                return Err(DataError::Usage(format!(
                    "sample {s} is beyond the {} samples",
                    ids.len()
                )));
            }
        };
        Ok(&ids[r])
    }

    /// The samples of split `name`.
    pub fn split(&self, name: &str) -> Result<Range<usize>> {
        self.manifest.split(name).map(Split::range)
    }
}
