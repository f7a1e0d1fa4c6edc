//! Writing a checkpoint from every rank (see the module docs of
//! [`crate::checkpoint`]): each rank its own part file, rank 0 the manifest.

use super::{
    DataPosition, FORMAT, LATEST_FILE, Manifest, PartFile, Piece, PlanInfo, RowPiece, TensorEntry,
    VERSION, parse_step_dir, plan_identity, step_dir_name,
};
use crate::error::{Result, RuntimeError};
use crate::plan::{FileRef, GraphFiles, INFER_FILE, TRAIN_FILE, Training, View, tensor_bytes};
use dlrm_data::durable;
use dlrm_ir::{Communicator, DType, Graph, Tensor};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where and how often a training run writes checkpoints (`dlrm-run --checkpoint
/// DIR --checkpoint-every N --keep K`).
#[derive(Clone, Debug)]
pub struct CheckpointSpec {
    /// The checkpoint root.
    pub dir: PathBuf,
    /// Write after every `every`-th step (and after the last); 0: only after the
    /// last.
    pub every: u64,
    /// Keep the newest `keep` checkpoints (at least 1).
    pub keep: usize,
    /// What the manifest records about the run.
    pub info: RunInfo,
}

/// The run's description recorded in every checkpoint.
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// The model's name.
    pub name: String,
    /// The plan's precision policy.
    pub precision: String,
    /// The plan's training hyper-parameters.
    pub training: Training,
    /// The plan's pass log.
    pub pass_log: serde_json::Value,
    /// The plan's input contract.
    pub contract: dlrm_ir::contract::InputContract,
    /// The run's learning-rate schedule (`None`: every update at its compiled rate).
    pub lr_schedule: Option<crate::lr_schedule::LrSchedule>,
}

/// A checkpoint put in place (reported by rank 0).
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointWritten {
    /// The step it holds the state after.
    pub step: u64,
    /// Its directory.
    pub path: PathBuf,
    /// Bytes written (all files).
    pub bytes: u64,
    /// Wall time of the write, from the first rank's start to the rename.
    pub seconds: f64,
}

/// One piece a rank writes: its parameter `param` is rows `lo..hi` of `full`.
#[derive(Clone, Debug)]
struct PieceSpec {
    param: String,
    full: String,
    lo: usize,
    hi: usize,
}

/// Test hook: `DLRM_CKPT_FAIL_AT=<step>:part|manifest` aborts the process while
/// writing the checkpoint of that step (after a rank's part file, or after the
/// manifest, before the rename), like a `kill -9` mid-write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FailPoint {
    Part,
    Manifest,
}

fn fail_at_from_env() -> Option<(u64, FailPoint)> {
    let v = std::env::var("DLRM_CKPT_FAIL_AT").ok()?;
    let (step, point) = v.split_once(':')?;
    let point = match point {
        "part" => FailPoint::Part,
        "manifest" => FailPoint::Manifest,
        _ => return None,
    };
    Some((step.parse().ok()?, point))
}

/// What every rank knows to write checkpoints (built once per job).
pub(crate) struct Writer {
    spec: CheckpointSpec,
    ranks: usize,
    seed: u64,
    global_batch: usize,
    last_step: u64,
    infer_text: String,
    train_text: Option<String>,
    identity: String,
    /// Per rank: the pieces it writes.
    writes: Vec<Vec<PieceSpec>>,
    /// The plan's parameters in order: name, dtype, full shape.
    full: Vec<(String, DType, Vec<usize>)>,
    fail_at: Option<(u64, FailPoint)>,
}

/// Per rank, what it sends rank 0 after writing its part file.
#[derive(Default, Serialize, Deserialize)]
struct PartRecord {
    file: Option<PartFile>,
    /// sha256 of each piece, in the order of the rank's `writes`.
    shas: Vec<String>,
}

fn err(reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Checkpoint {
        path: PathBuf::new(),
        reason: reason.into(),
    }
}

fn ckpt_err(path: &Path, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Checkpoint {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

impl Writer {
    /// The writer of a job whose rank `r` holds the parameters of `rank_graphs[r]`
    /// (training graph and inference graph), `row_shards` naming the row-shard
    /// parameters. Checks that the ranks' pieces cover every parameter of the
    /// unpartitioned graphs exactly.
    pub(crate) fn new(
        spec: CheckpointSpec,
        (full_infer, full_train): (&Graph, Option<&Graph>),
        rank_graphs: &[Vec<&Graph>],
        row_shards: &[RowPiece],
        (seed, global_batch, last_step): (u64, usize, u64),
    ) -> Result<Writer> {
        if spec.keep == 0 {
            return Err(err("--keep must be at least 1"));
        }
        let mut full: Vec<(String, DType, Vec<usize>)> = Vec::new();
        let mut seen = HashSet::new();
        for g in full_train.into_iter().chain(std::iter::once(full_infer)) {
            for (name, ty) in g.param_types() {
                if !seen.insert(name.to_string()) {
                    continue;
                }
                let shape = ty
                    .shape
                    .iter()
                    .map(|d| d.fixed())
                    .collect::<Option<Vec<usize>>>()
                    .ok_or_else(|| RuntimeError::Param {
                        name: name.to_string(),
                        reason: format!("has a symbolic shape {ty}: cannot checkpoint it"),
                    })?;
                full.push((name.to_string(), ty.dtype, shape));
            }
        }
        let rows_of: HashMap<&str, usize> = full
            .iter()
            .map(|(n, _, s)| (n.as_str(), s.first().copied().unwrap_or(1)))
            .collect();
        let shard: HashMap<&str, &RowPiece> =
            row_shards.iter().map(|p| (p.param.as_str(), p)).collect();
        // The lowest rank holding each parameter writes it.
        let mut writer_of: HashMap<String, usize> = HashMap::new();
        for (r, graphs) in rank_graphs.iter().enumerate() {
            for g in graphs {
                for (n, _) in g.param_types() {
                    writer_of.entry(n.to_string()).or_insert(r);
                }
            }
        }
        let mut writes: Vec<Vec<PieceSpec>> = vec![Vec::new(); rank_graphs.len()];
        let mut names: Vec<(&String, &usize)> = writer_of.iter().collect();
        names.sort();
        let mut covered: HashMap<&str, Vec<(usize, usize)>> = HashMap::new();
        for (name, &r) in names {
            let piece = match shard.get(name.as_str()) {
                Some(p) => PieceSpec {
                    param: name.clone(),
                    full: p.table.clone(),
                    lo: p.lo,
                    hi: p.hi,
                },
                None => PieceSpec {
                    param: name.clone(),
                    full: name.clone(),
                    lo: 0,
                    hi: rows_of
                        .get(name.as_str())
                        .copied()
                        .ok_or_else(|| RuntimeError::Param {
                            name: name.clone(),
                            reason: format!(
                                "held by rank {r} but not a parameter of the plan's graphs"
                            ),
                        })?,
                },
            };
            let key = rows_of
                .get_key_value(piece.full.as_str())
                .map(|(k, _)| *k)
                .ok_or_else(|| RuntimeError::Param {
                    name: piece.full.clone(),
                    reason: "a row shard's table is not a parameter of the plan".into(),
                })?;
            covered.entry(key).or_default().push((piece.lo, piece.hi));
            writes[r].push(piece);
        }
        for (name, _, _) in &full {
            let mut parts = covered.remove(name.as_str()).unwrap_or_default();
            parts.sort_unstable();
            let rows = rows_of.get(name.as_str()).copied().unwrap_or(0);
            let mut next = 0;
            for (lo, hi) in parts {
                if lo != next {
                    break;
                }
                next = hi;
            }
            if next != rows {
                return Err(RuntimeError::Param {
                    name: name.clone(),
                    reason: format!(
                        "the ranks' parameters do not cover its {rows} rows exactly: cannot \
                         checkpoint it"
                    ),
                });
            }
        }
        let infer_text = dlrm_ir::text::print(full_infer);
        let train_text = full_train.map(dlrm_ir::text::print);
        Ok(Writer {
            identity: plan_identity(full_infer, full_train),
            spec,
            ranks: rank_graphs.len(),
            seed,
            global_batch,
            last_step,
            infer_text,
            train_text,
            writes,
            full,
            fail_at: fail_at_from_env(),
        })
    }

    /// True if a checkpoint is due after step `k` of a run ending at `last`.
    pub(crate) fn due(&self, k: u64, last: u64) -> bool {
        k == last || (self.spec.every > 0 && k.is_multiple_of(self.spec.every))
    }

    fn fail(&self, step: u64, here: FailPoint) {
        if self.fail_at == Some((step, here)) {
            eprintln!("DLRM_CKPT_FAIL_AT: aborting at step {step}, {here:?}");
            std::process::abort();
        }
    }

    /// Writes the checkpoint after `step` (every rank calls it; `lookup` finds this
    /// rank's current parameter values). Returns what rank 0 put in place.
    pub(crate) fn write<'t>(
        &self,
        rank: usize,
        comm: &dyn Communicator,
        step: u64,
        data: DataPosition,
        lookup: &dyn Fn(&str) -> Option<&'t Tensor>,
    ) -> Result<Option<CheckpointWritten>> {
        let t0 = Instant::now();
        let root = &self.spec.dir;
        let tmp = root.join(format!(".{}.tmp", step_dir_name(step)));
        if rank == 0 {
            fs::create_dir_all(root).map_err(|e| RuntimeError::io(root, e))?;
            if tmp.exists() {
                fs::remove_dir_all(&tmp).map_err(|e| RuntimeError::io(&tmp, e))?;
            }
            fs::create_dir(&tmp).map_err(|e| RuntimeError::io(&tmp, e))?;
        }
        comm.barrier()?;
        let record = self.write_part(rank, &tmp, lookup)?;
        self.fail(step, FailPoint::Part);
        let bytes = serde_json::to_vec(&record).map_err(|e| err(e.to_string()))?;
        let gathered = gather_bytes(comm, &bytes)?;
        let written = match gathered {
            Some(all) => {
                let records = all
                    .iter()
                    .map(|b| serde_json::from_slice::<PartRecord>(b))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| err(format!("a rank's part record does not decode: {e}")))?;
                Some(self.commit(step, &tmp, records, data, t0)?)
            }
            None => None,
        };
        comm.barrier()?;
        Ok(written)
    }

    /// Writes this rank's part file into `tmp` (if it writes anything).
    fn write_part<'t>(
        &self,
        rank: usize,
        tmp: &Path,
        lookup: &dyn Fn(&str) -> Option<&'t Tensor>,
    ) -> Result<PartRecord> {
        let mine = &self.writes[rank];
        if mine.is_empty() {
            return Ok(PartRecord::default());
        }
        let full: HashMap<&str, (DType, &Vec<usize>)> = self
            .full
            .iter()
            .map(|(n, d, s)| (n.as_str(), (*d, s)))
            .collect();
        let mut tensors = Vec::with_capacity(mine.len());
        for p in mine {
            let t = lookup(&p.param).ok_or_else(|| RuntimeError::Param {
                name: p.param.clone(),
                reason: format!("rank {rank} has no value for it to checkpoint"),
            })?;
            let (dtype, shape) =
                full.get(p.full.as_str())
                    .copied()
                    .ok_or_else(|| RuntimeError::Param {
                        name: p.full.clone(),
                        reason: "not a parameter of the plan".into(),
                    })?;
            let mut want = shape.clone();
            if let Some(r) = want.first_mut() {
                *r = p.hi - p.lo;
            }
            if t.dtype() != dtype || t.shape != want {
                return Err(RuntimeError::Param {
                    name: p.param.clone(),
                    reason: format!(
                        "rank {rank} holds {}{:?}, rows {}..{} of `{}` are {dtype}{want:?}",
                        t.dtype(),
                        t.shape,
                        p.lo,
                        p.hi,
                        p.full
                    ),
                });
            }
            tensors.push((p.param.as_str(), t));
        }
        let shas: Vec<String> = tensors
            .par_iter()
            .map(|(_, t)| durable::sha256_hex(tensor_bytes(t)))
            .collect();
        let name = format!("part-{rank:05}.safetensors");
        let path = tmp.join(&name);
        safetensors::serialize_to_file(tensors.iter().map(|(n, t)| (*n, View(t))), None, &path)
            .map_err(|e| ckpt_err(&path, format!("cannot write: {e}")))?;
        let file = fs::File::open(&path).map_err(|e| RuntimeError::io(&path, e))?;
        file.sync_all().map_err(|e| RuntimeError::io(&path, e))?;
        let bytes = file
            .metadata()
            .map_err(|e| RuntimeError::io(&path, e))?
            .len();
        let header_sha256 = header_sha(&path)?;
        Ok(PartRecord {
            file: Some(PartFile {
                file: name,
                bytes,
                header_sha256,
                rank,
            }),
            shas,
        })
    }

    /// Rank 0: the manifest and graphs, then the rename, `latest` and pruning.
    fn commit(
        &self,
        step: u64,
        tmp: &Path,
        records: Vec<PartRecord>,
        data: DataPosition,
        t0: Instant,
    ) -> Result<CheckpointWritten> {
        let mut pieces: HashMap<&str, Vec<Piece>> = HashMap::new();
        let mut files = Vec::new();
        let mut total = 0u64;
        for (r, rec) in records.into_iter().enumerate() {
            let mine = self.writes.get(r).map_or(&[][..], Vec::as_slice);
            if rec.shas.len() != mine.len() || (rec.file.is_none() && !mine.is_empty()) {
                return Err(err(format!(
                    "rank {r} reported {} pieces, it writes {}",
                    rec.shas.len(),
                    mine.len()
                )));
            }
            let Some(file) = rec.file else { continue };
            for (p, sha) in mine.iter().zip(rec.shas) {
                pieces.entry(p.full.as_str()).or_default().push(Piece {
                    file: file.file.clone(),
                    tensor: p.param.clone(),
                    rows: [p.lo, p.hi],
                    sha256: sha,
                });
            }
            total += file.bytes;
            files.push(file);
        }
        let tensors = self
            .full
            .iter()
            .map(|(name, dtype, shape)| {
                let mut ps = pieces.remove(name.as_str()).unwrap_or_default();
                ps.sort_by_key(|p| p.rows[0]);
                TensorEntry {
                    name: name.clone(),
                    dtype: dtype.mnemonic().to_string(),
                    shape: shape.clone(),
                    pieces: ps,
                }
            })
            .collect();
        let mut write_graph = |name: &str, text: &str| -> Result<FileRef> {
            let p = tmp.join(name);
            durable::write_synced(&p, text.as_bytes()).map_err(|e| RuntimeError::io(&p, e))?;
            total += text.len() as u64;
            Ok(FileRef {
                file: name.to_string(),
                sha256: durable::sha256_hex(text.as_bytes()),
                bytes: text.len() as u64,
            })
        };
        let infer = write_graph(INFER_FILE, &self.infer_text)?;
        let train = match &self.train_text {
            Some(t) => Some(write_graph(TRAIN_FILE, t)?),
            None => None,
        };
        let info = &self.spec.info;
        let manifest = Manifest {
            format: FORMAT.to_string(),
            version: VERSION,
            name: info.name.clone(),
            created_by: format!("{} {}", env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
            step,
            last_step: self.last_step,
            seed: self.seed,
            global_batch: self.global_batch,
            ranks: self.ranks,
            data,
            lr_schedule: info.lr_schedule,
            plan: PlanInfo {
                sha256: self.identity.clone(),
                precision: info.precision.clone(),
                training: info.training.clone(),
                pass_log: info.pass_log.clone(),
                graphs: GraphFiles { infer, train },
                contract: info.contract.clone(),
            },
            files,
            tensors,
        };
        let json = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| err(format!("cannot encode the manifest: {e}")))?;
        let mp = tmp.join(crate::plan::MANIFEST_FILE);
        durable::write_synced(&mp, &json).map_err(|e| RuntimeError::io(&mp, e))?;
        total += json.len() as u64;
        self.fail(step, FailPoint::Manifest);
        durable::sync_dir(tmp).map_err(|e| RuntimeError::io(tmp, e))?;
        let root = &self.spec.dir;
        let name = step_dir_name(step);
        let target = root.join(&name);
        durable::replace_dir(tmp, &target).map_err(|e| RuntimeError::io(&target, e))?;
        let latest = root.join(LATEST_FILE);
        durable::write_file_atomic(&latest, format!("{name}\n").as_bytes())
            .map_err(|e| RuntimeError::io(&latest, e))?;
        prune(root, step, self.spec.keep)?;
        Ok(CheckpointWritten {
            step,
            path: target,
            bytes: total,
            seconds: t0.elapsed().as_secs_f64(),
        })
    }
}

/// sha256 of a safetensors file's header (length and JSON).
fn header_sha(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path).map_err(|e| RuntimeError::io(path, e))?;
    let mut n8 = [0u8; 8];
    f.read_exact(&mut n8)
        .map_err(|e| RuntimeError::io(path, e))?;
    let n = usize::try_from(u64::from_le_bytes(n8)).unwrap_or(usize::MAX);
    if n > 100 << 20 {
        return Err(ckpt_err(path, "safetensors header too large"));
    }
    let mut buf = n8.to_vec();
    buf.resize(8 + n, 0);
    f.read_exact(&mut buf[8..])
        .map_err(|e| RuntimeError::io(path, e))?;
    Ok(durable::sha256_hex(&buf))
}

/// Removes the checkpoints of `root` older than the newest `keep` at or before
/// `step`, and unfinished `.tmp` writes of steps up to `step`. Checkpoints of later
/// steps (a run resumed from an older one) are left alone.
fn prune(root: &Path, step: u64, keep: usize) -> Result<()> {
    let mut done = Vec::new();
    for e in fs::read_dir(root).map_err(|e| RuntimeError::io(root, e))? {
        let e = e.map_err(|e| RuntimeError::io(root, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(s) = parse_step_dir(&name) {
            if s <= step {
                done.push((s, e.path()));
            }
        } else if let Some(s) = name
            .strip_prefix('.')
            .and_then(|n| n.strip_suffix(".tmp"))
            .and_then(parse_step_dir)
            && s <= step
        {
            let _ = fs::remove_dir_all(e.path());
        }
    }
    done.sort_by_key(|d| std::cmp::Reverse(d.0));
    for (_, p) in done.into_iter().skip(keep) {
        fs::remove_dir_all(&p).map_err(|e| RuntimeError::io(&p, e))?;
    }
    durable::sync_dir(root).map_err(|e| RuntimeError::io(root, e))
}

/// Sends `bytes` from every rank to rank 0 (one f32 per byte, exact); rank 0 gets
/// every rank's bytes in rank order, the others `None`.
fn gather_bytes(comm: &dyn Communicator, bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
    let n = comm.size();
    let mut send = vec![Vec::new(); n];
    send[0] = bytes.iter().map(|&b| f32::from(b)).collect();
    let recv = comm.all_to_all_v(send)?;
    if comm.rank() != 0 {
        return Ok(None);
    }
    Ok(Some(
        recv.into_iter()
            .map(|v| v.into_iter().map(|x| x as u8).collect())
            .collect(),
    ))
}
