//! Reading a checkpoint: resolving a root to its newest complete checkpoint,
//! checking the manifest, memory-mapping the part files, and reassembling whole
//! parameters or just a row range of one (a rank loads only what it owns).

use super::{FORMAT, LATEST_FILE, Manifest, Piece, TensorEntry, VERSION, parse_step_dir};
use crate::error::{Result, RuntimeError};
use crate::plan::write::st_dtype;
use crate::plan::{FileRef, MANIFEST_FILE, Plan, check_graph_params};
use dlrm_data::durable;
use dlrm_ir::init::try_alloc;
use dlrm_ir::{DType, Data, Graph, IrError, OnDemand, ParamValue, RowSource, Tensor};
use memmap2::Mmap;
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

fn ckpt_err(path: &Path, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Checkpoint {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The checkpoint directory `path` names: `path` itself if it holds a
/// manifest; else, for a checkpoint root, the checkpoint its `latest` file names,
/// or without one the newest complete `step-<n>` directory. An unfinished write
/// (`.step-<n>.tmp`) is refused with the root's newest complete checkpoint named.
pub fn resolve(path: &Path) -> Result<PathBuf> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name.ends_with(".tmp") {
        let root = durable::parent_of(path);
        let hint = match newest_complete(&root) {
            Some(p) => format!("; the newest complete checkpoint is {}", p.display()),
            None => String::new(),
        };
        return Err(ckpt_err(
            path,
            format!("is an unfinished checkpoint write (left by an interrupted run){hint}"),
        ));
    }
    match fs::metadata(path) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(ckpt_err(path, "is not a directory")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ckpt_err(path, "no such checkpoint directory"));
        }
        Err(e) => return Err(RuntimeError::io(path, e)),
    }
    if path.join(MANIFEST_FILE).is_file() {
        return Ok(path.to_path_buf());
    }
    let latest = path.join(LATEST_FILE);
    if let Some(text) = read_latest(&latest)? {
        let n = text.trim();
        if parse_step_dir(n).is_none() {
            return Err(ckpt_err(
                &latest,
                format!("names {n:?}, which is not a checkpoint (step-<n>)"),
            ));
        }
        let dir = path.join(n);
        if dir.join(MANIFEST_FILE).is_file() {
            return Ok(dir);
        }
        return Err(ckpt_err(
            &latest,
            format!("names {n}, which is missing or has no {MANIFEST_FILE}"),
        ));
    }
    newest_complete(path).ok_or_else(|| {
        ckpt_err(
            path,
            format!(
                "holds no checkpoint (no {MANIFEST_FILE}, no `{LATEST_FILE}` file, no \
                 complete step-<n> directory)"
            ),
        )
    })
}

/// The longest `latest` file read: a step directory's name is far shorter.
const MAX_LATEST_BYTES: u64 = 4096;

/// The text of a checkpoint root's `latest` file, `None` when there is none; one
/// that is too long or not UTF-8 is an error naming it.
fn read_latest(latest: &Path) -> Result<Option<String>> {
    let file = match fs::File::open(latest) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(_) if latest.is_dir() => return Ok(None),
        Err(e) => return Err(RuntimeError::io(latest, e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_LATEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| RuntimeError::io(latest, e))?;
    if bytes.len() as u64 > MAX_LATEST_BYTES {
        return Err(ckpt_err(
            latest,
            format!("is more than {MAX_LATEST_BYTES} bytes; it should name a step-<n> directory"),
        ));
    }
    String::from_utf8(bytes).map(Some).map_err(|e| {
        ckpt_err(
            latest,
            format!(
                "is not UTF-8 text (invalid byte at offset {}); it should name a step-<n> \
                 directory",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

/// The complete `step-<n>` directory of `root` with the highest step.
fn newest_complete(root: &Path) -> Option<PathBuf> {
    fs::read_dir(root)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let s = parse_step_dir(&e.file_name().to_string_lossy())?;
            e.path()
                .join(MANIFEST_FILE)
                .is_file()
                .then(|| (s, e.path()))
        })
        .max_by_key(|(s, _)| *s)
        .map(|(_, p)| p)
}

/// True if `path` is a checkpoint or a checkpoint root (a directory with a
/// checkpoint manifest, a `latest` file, or `step-<n>` directories) rather than a
/// plan.
pub fn is_checkpoint(path: &Path) -> bool {
    let manifest = path.join(MANIFEST_FILE);
    if manifest.is_file() {
        return fs::read(&manifest)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v.get("format").and_then(|f| f.as_str()) == Some(FORMAT));
    }
    path.join(LATEST_FILE).is_file() || newest_complete(path).is_some()
}

/// Reads what a command that takes a plan was given: a plan directory, or a
/// checkpoint (or checkpoint root) as the plan of its graphs and trained
/// parameters ([`Checkpoint::to_plan`]).
pub fn read_plan_or_checkpoint(path: &Path) -> Result<Plan> {
    if is_checkpoint(path) {
        Checkpoint::open(path)?.to_plan()
    } else {
        crate::plan::read_plan(path)
    }
}

/// An opened checkpoint: its manifest, its part files mapped, headers checked.
/// Piece checksums are checked on first use.
pub struct Checkpoint {
    dir: PathBuf,
    manifest: Manifest,
    /// file name -> (map, start of the data section).
    files: HashMap<String, (Mmap, usize, safetensors::tensor::Metadata)>,
    verified: Mutex<HashSet<(String, String)>>,
}

/// Two handles are equal if they open the same checkpoint (directory and manifest).
impl PartialEq for Checkpoint {
    fn eq(&self, other: &Checkpoint) -> bool {
        self.dir == other.dir && self.manifest == other.manifest
    }
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("step", &self.manifest.step)
            .finish_non_exhaustive()
    }
}

/// Opens the checkpoint `path` names ([`resolve`]) and reads every parameter,
/// checking every checksum; returns it as a plan (its graphs and the trained
/// parameters) with the opened checkpoint.
pub fn read_checkpoint(path: &Path) -> Result<(Checkpoint, Plan)> {
    let c = Checkpoint::open(path)?;
    let plan = c.to_plan()?;
    Ok((c, plan))
}

/// Reads and checks a checkpoint's manifest (format, version).
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST_FILE);
    let bytes = fs::read(&path).map_err(|e| RuntimeError::io(&path, e))?;
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| ckpt_err(&path, format!("not valid JSON: {e}")))?;
    match value.get("format").and_then(|f| f.as_str()) {
        Some(FORMAT) => {}
        other => {
            return Err(ckpt_err(
                &path,
                format!("not a dlrmc checkpoint (format is {other:?}, expected \"{FORMAT}\")"),
            ));
        }
    }
    match value.get("version").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(VERSION) => {}
        Some(v) if v > u64::from(VERSION) => {
            return Err(ckpt_err(
                &path,
                format!(
                    "checkpoint format version {v} was written by a newer dlrmc; this one \
                     reads version {VERSION}"
                ),
            ));
        }
        other => {
            return Err(ckpt_err(
                &path,
                format!(
                    "checkpoint format version {other:?} is not supported (this dlrmc reads {VERSION})"
                ),
            ));
        }
    }
    serde_json::from_value(value).map_err(|e| ckpt_err(&path, format!("bad manifest: {e}")))
}

fn plain_file(dir: &Path, name: &str) -> Result<PathBuf> {
    let p = Path::new(name);
    let plain = p.components().count() == 1
        && matches!(p.components().next(), Some(std::path::Component::Normal(_)));
    if plain {
        Ok(dir.join(p))
    } else {
        Err(ckpt_err(
            dir,
            format!("the manifest names file {name:?}, which is not a plain file name"),
        ))
    }
}

impl Checkpoint {
    /// Opens the checkpoint `path` names ([`resolve`]): checks the manifest's
    /// format and version, maps every part file and checks its size, header
    /// checksum and that it holds every piece the manifest lists with the right
    /// dtype and shape.
    pub fn open(path: &Path) -> Result<Checkpoint> {
        let dir = resolve(path)?;
        let manifest = read_manifest(&dir)?;
        let mut files = HashMap::new();
        for f in &manifest.files {
            let p = plain_file(&dir, &f.file)?;
            let file = fs::File::open(&p).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => ckpt_err(
                    &p,
                    "missing (listed in the manifest): the checkpoint is incomplete",
                ),
                _ => RuntimeError::io(&p, e),
            })?;
            dlrm_data::mapped::guard_sigbus();
            // SAFETY: the map is read-only; checkpoints are written into a new
            // directory and renamed in, never modified in place, so the file does
            // not change while it is mapped (a user editing it by hand is caught by
            // the checksums, at worst as garbage values, never as unsafety in Rust
            // code that copies bytes out of it).
            let map = unsafe { Mmap::map(&file) }.map_err(|e| RuntimeError::io(&p, e))?;
            if map.len() as u64 != f.bytes {
                return Err(ckpt_err(
                    &p,
                    format!("is {} bytes, the manifest says {}", map.len(), f.bytes),
                ));
            }
            let (n, meta) = safetensors::SafeTensors::read_metadata(&map)
                .map_err(|e| ckpt_err(&p, format!("bad safetensors file: {e}")))?;
            let header = durable::sha256_hex(&map[..8 + n]);
            if header != f.header_sha256 {
                return Err(ckpt_err(
                    &p,
                    format!(
                        "header checksum mismatch (manifest says sha256 {}, file has {header}): \
                         the file is corrupted or was modified",
                        f.header_sha256
                    ),
                ));
            }
            files.insert(f.file.clone(), (map, 8 + n, meta));
        }
        let c = Checkpoint {
            dir,
            manifest,
            files,
            verified: Mutex::new(HashSet::new()),
        };
        for t in &c.manifest.tensors {
            c.check_entry(t)?;
        }
        Ok(c)
    }

    /// The checkpoint's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The training steps it holds the state after.
    pub fn step(&self) -> u64 {
        self.manifest.step
    }

    fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.manifest
            .tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| RuntimeError::Param {
                name: name.to_string(),
                reason: format!("not in checkpoint {}", self.dir.display()),
            })
    }

    /// Checks a tensor's pieces: they tile its rows, and each is in its file with
    /// the right dtype and shape.
    fn check_entry(&self, t: &TensorEntry) -> Result<()> {
        let bad = |reason: String| RuntimeError::Param {
            name: t.name.clone(),
            reason: format!("{reason} (checkpoint {})", self.dir.display()),
        };
        let dtype = DType::from_mnemonic(&t.dtype)
            .ok_or_else(|| bad(format!("unknown dtype {}", t.dtype)))?;
        let mut next = 0;
        for p in &t.pieces {
            if p.rows[0] != next || p.rows[1] < p.rows[0] {
                return Err(bad(format!(
                    "piece rows {}..{} do not continue at row {next}",
                    p.rows[0], p.rows[1]
                )));
            }
            next = p.rows[1];
            let (_, _, meta) = self
                .files
                .get(&p.file)
                .ok_or_else(|| bad(format!("its piece is in {}, not listed as a file", p.file)))?;
            let info = meta
                .info(&p.tensor)
                .ok_or_else(|| bad(format!("{} has no tensor `{}`", p.file, p.tensor)))?;
            let mut want = t.shape.clone();
            if let Some(r) = want.first_mut() {
                *r = p.rows[1] - p.rows[0];
            }
            if st_dtype(dtype) != info.dtype || info.shape != want {
                return Err(bad(format!(
                    "tensor `{}` of {} is {:?}{:?}, expected {dtype}{want:?}",
                    p.tensor, p.file, info.dtype, info.shape
                )));
            }
        }
        if next != t.rows() {
            return Err(bad(format!(
                "its pieces cover rows 0..{next} of {}",
                t.rows()
            )));
        }
        Ok(())
    }

    /// The data bytes of a piece, checked against its sha256 on first use.
    fn piece_bytes(&self, p: &Piece) -> Result<&[u8]> {
        let (map, start, meta) = self
            .files
            .get(&p.file)
            .ok_or_else(|| ckpt_err(&self.dir, format!("no file {}", p.file)))?;
        let info = meta.info(&p.tensor).ok_or_else(|| {
            ckpt_err(&self.dir.join(&p.file), format!("no tensor `{}`", p.tensor))
        })?;
        let (a, b) = info.data_offsets;
        let bytes = map
            .get(start + a..start + b)
            .ok_or_else(|| ckpt_err(&self.dir.join(&p.file), "tensor data out of bounds"))?;
        let key = (p.file.clone(), p.tensor.clone());
        let seen = self
            .verified
            .lock()
            .map(|v| v.contains(&key))
            .unwrap_or(false);
        if !seen {
            let actual = durable::sha256_hex(bytes);
            if actual != p.sha256 {
                return Err(ckpt_err(
                    &self.dir.join(&p.file),
                    format!(
                        "tensor `{}` (rows {}..{}): checksum mismatch (manifest says sha256 {}, \
                         data has {actual}): the file is corrupted or was modified",
                        p.tensor, p.rows[0], p.rows[1], p.sha256
                    ),
                ));
            }
            if let Ok(mut v) = self.verified.lock() {
                v.insert(key);
            }
        }
        Ok(bytes)
    }

    /// Rows `rows` of parameter `name` (every piece it touches checksummed).
    pub fn read_rows(&self, name: &str, rows: Range<usize>) -> Result<Tensor> {
        let t = self.entry(name)?;
        let total = t.rows();
        if rows.start > rows.end || rows.end > total {
            return Err(RuntimeError::Param {
                name: name.to_string(),
                reason: format!(
                    "rows {}..{} asked of a checkpointed tensor of {total} rows",
                    rows.start, rows.end
                ),
            });
        }
        let dtype = DType::from_mnemonic(&t.dtype).ok_or_else(|| RuntimeError::Param {
            name: name.to_string(),
            reason: format!("unknown dtype {}", t.dtype),
        })?;
        let numel: usize = t.shape.iter().product();
        let row_bytes = numel.checked_div(total).unwrap_or(0) * dtype.size_bytes();
        let mut shape = t.shape.clone();
        if let Some(r) = shape.first_mut() {
            *r = rows.len();
        }
        let mut data = zeroed(name, dtype, shape.iter().product())?;
        let out = data_bytes_mut(&mut data);
        for p in &t.pieces {
            let (lo, hi) = (p.rows[0].max(rows.start), p.rows[1].min(rows.end));
            if lo >= hi {
                continue;
            }
            let src = self.piece_bytes(p)?;
            let s = (lo - p.rows[0]) * row_bytes..(hi - p.rows[0]) * row_bytes;
            let d = (lo - rows.start) * row_bytes..(hi - rows.start) * row_bytes;
            let (Some(src), Some(dst)) = (src.get(s), out.get_mut(d)) else {
                return Err(RuntimeError::Param {
                    name: name.to_string(),
                    reason: format!("piece `{}` is shorter than its rows", p.tensor),
                });
            };
            dst.copy_from_slice(src);
        }
        Ok(Tensor { shape, data })
    }

    /// The whole parameter `name`, reassembled from its pieces.
    pub fn read_param(&self, name: &str) -> Result<Tensor> {
        let rows = self.entry(name)?.rows();
        self.read_rows(name, 0..rows)
    }

    /// Checks that the checkpoint holds exactly the parameters `params` (name,
    /// dtype, full shape, in the plan's order), naming the first that does not
    /// match.
    pub fn check_params<'a>(
        &self,
        params: impl IntoIterator<Item = (&'a str, DType, &'a [usize])>,
    ) -> Result<()> {
        let m = &self.manifest;
        let whose = format!("checkpoint {} of model `{}`", self.dir.display(), m.name);
        let mut names = HashSet::new();
        for (name, dtype, shape) in params {
            names.insert(name);
            let Some(t) = m.tensors.iter().find(|t| t.name == name) else {
                return Err(RuntimeError::Param {
                    name: name.to_string(),
                    reason: format!("the plan has {dtype}{shape:?}; {whose} does not hold it"),
                });
            };
            if t.dtype != dtype.mnemonic() || t.shape != shape {
                return Err(RuntimeError::Param {
                    name: name.to_string(),
                    reason: format!(
                        "the plan has {dtype}{shape:?}; {whose} holds {}{:?}",
                        t.dtype, t.shape
                    ),
                });
            }
        }
        if let Some(t) = m.tensors.iter().find(|t| !names.contains(t.name.as_str())) {
            return Err(RuntimeError::Param {
                name: t.name.clone(),
                reason: format!("held by {whose} but not a parameter of the plan"),
            });
        }
        Ok(())
    }

    /// The plan's graphs stored in the checkpoint (checksummed, parsed).
    pub fn graphs(&self) -> Result<(Graph, Option<Graph>)> {
        let g = &self.manifest.plan.graphs;
        let infer = self.graph(&g.infer)?;
        let train = g.train.as_ref().map(|f| self.graph(f)).transpose()?;
        Ok((infer, train))
    }

    fn graph(&self, f: &FileRef) -> Result<Graph> {
        let path = plain_file(&self.dir, &f.file)?;
        let bytes = fs::read(&path).map_err(|e| RuntimeError::io(&path, e))?;
        let actual = durable::sha256_hex(&bytes);
        if actual != f.sha256 {
            return Err(RuntimeError::Checksum {
                file: path,
                expected: f.sha256.clone(),
                actual,
            });
        }
        let text = String::from_utf8(bytes)
            .map_err(|e| ckpt_err(&path, format!("not UTF-8 text: {e}")))?;
        dlrm_ir::text::parse(&text).map_err(|source| RuntimeError::Parse { file: path, source })
    }

    /// The checkpoint as a plan whose parameters are read on demand
    /// ([`ParamValue::OnDemand`]): nothing is read now; a rank given the plan reads
    /// just the rows it holds straight from the mapped part files (checksummed on
    /// first use), once. [`Checkpoint::to_plan`] reads every parameter now.
    pub fn to_plan_on_demand(self: &Arc<Checkpoint>) -> Result<Plan> {
        let (infer, train) = self.graphs()?;
        let mut params = Vec::with_capacity(self.manifest.tensors.len());
        for t in &self.manifest.tensors {
            let dtype = DType::from_mnemonic(&t.dtype).ok_or_else(|| RuntimeError::Param {
                name: t.name.clone(),
                reason: format!("unknown dtype {}", t.dtype),
            })?;
            let source: Arc<dyn RowSource> = Arc::clone(self) as Arc<dyn RowSource>;
            params.push((
                t.name.clone(),
                ParamValue::OnDemand(OnDemand {
                    dtype,
                    shape: t.shape.clone(),
                    key: t.name.clone(),
                    source,
                }),
            ));
        }
        let by_name: HashMap<&str, &ParamValue> =
            params.iter().map(|(n, v)| (n.as_str(), v)).collect();
        for g in std::iter::once(&infer).chain(&train) {
            check_graph_params(g, |n| {
                by_name.get(n).map(|v| (v.dtype(), v.shape().to_vec()))
            })?;
        }
        let m = &self.manifest;
        Ok(Plan {
            name: m.name.clone(),
            infer,
            train,
            params,
            training: m.plan.training.clone(),
            precision: m.plan.precision.clone(),
            pass_log: m.plan.pass_log.clone(),
            contract: m.plan.contract.clone(),
        })
    }

    /// The checkpoint as a plan: its graphs and every parameter reassembled
    /// (checksummed, in parallel).
    pub fn to_plan(&self) -> Result<Plan> {
        let (infer, train) = self.graphs()?;
        let params = self
            .manifest
            .tensors
            .par_iter()
            .map(|t| -> Result<(String, Tensor)> {
                Ok((t.name.clone(), self.read_param(&t.name)?))
            })
            .collect::<Result<Vec<_>>>()?;
        let by_name: HashMap<&str, &Tensor> = params.iter().map(|(n, t)| (n.as_str(), t)).collect();
        for g in std::iter::once(&infer).chain(&train) {
            check_graph_params(g, |n| by_name.get(n).map(|t| (t.dtype(), t.shape.clone())))?;
        }
        let m = &self.manifest;
        Ok(Plan {
            name: m.name.clone(),
            infer,
            train,
            params: params
                .into_iter()
                .map(|(n, t)| (n, ParamValue::Stored(t)))
                .collect(),
            training: m.plan.training.clone(),
            precision: m.plan.precision.clone(),
            pass_log: m.plan.pass_log.clone(),
            contract: m.plan.contract.clone(),
        })
    }
}

/// A checkpoint is where its plan's on-demand parameters are read from
/// ([`Checkpoint::to_plan_on_demand`]).
impl RowSource for Checkpoint {
    fn read_rows(&self, key: &str, lo: usize, hi: usize) -> dlrm_ir::Result<Tensor> {
        Checkpoint::read_rows(self, key, lo..hi).map_err(|e| match e {
            RuntimeError::Ir(e) => e,
            e => IrError::Binding {
                name: key.to_string(),
                reason: format!("reading rows {lo}..{hi} from the checkpoint: {e}"),
            },
        })
    }

    fn describe(&self) -> String {
        format!("checkpoint {}", self.dir.display())
    }
}

/// `n` zero elements, allocated fallibly (too large is an error naming `name`).
fn zeroed(name: &str, d: DType, n: usize) -> Result<Data> {
    Ok(match d {
        DType::F32 => Data::F32(try_alloc(name, n)?),
        DType::BF16 => Data::BF16(try_alloc(name, n)?),
        DType::I64 => Data::I64(try_alloc(name, n)?),
        DType::I32 => Data::I32(try_alloc(name, n)?),
        DType::U8 => Data::U8(try_alloc(name, n)?),
    })
}

fn data_bytes_mut(d: &mut Data) -> &mut [u8] {
    match d {
        Data::F32(v) => bytemuck::cast_slice_mut(v),
        Data::BF16(v) => bytemuck::cast_slice_mut(v),
        Data::I64(v) => bytemuck::cast_slice_mut(v),
        Data::I32(v) => bytemuck::cast_slice_mut(v),
        Data::U8(v) => v,
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests fail loudly")]
mod latest_tests {
    #[test]
    fn a_latest_file_that_is_not_utf8_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let latest = dir.path().join("latest");
        std::fs::write(&latest, b"step-\xff\xfe").unwrap();
        let e = super::resolve(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains(&latest.display().to_string())
                && e.contains("not UTF-8 text (invalid byte at offset 5)"),
            "{e}"
        );
        std::fs::write(&latest, vec![b'x'; 5000]).unwrap();
        let e = super::resolve(dir.path()).unwrap_err().to_string();
        assert!(e.contains("more than 4096 bytes"), "{e}");
    }
}
