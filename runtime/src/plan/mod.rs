//! Plans on disk: a compiled model as a directory.
//!
//! ```text
//! PLAN/
//!   manifest.json          format "dlrmc-plan", version 2, name, created_by, precision,
//!                          training hyper-parameters, pass log, graph files and weights
//!                          file with their sha256, the parameter list {name, dtype, shape,
//!                          init?}
//!   infer.ir               the inference graph (IR text form)
//!   train.ir               the training step (absent for an inference-only plan)
//!   weights.safetensors    the stored parameters' initial values (f32, bf16, i64, i32)
//! ```
//!
//! A parameter's initial value ([`ParamValue`]) is either stored in the weights
//! file or *described*: its manifest entry carries `init`, a
//! [`dlrm_ir::Described`] (distribution, seed, random stream, which part of the f32
//! values), and the weights file does not hold it. A description is a pure function
//! of the element index ([`dlrm_ir::init`]), so any rows of the parameter can be
//! created alone with the values the whole tensor has: every rank creates only the
//! rows it owns ([`crate::driver`]), and a plan of a 100 GB model is a few
//! megabytes. The JSON frontend describes every embedding table and every MLP
//! parameter above `dlrmc compile --describe-above` (default 64 MiB; a blocked
//! weight with its blocking, [`dlrm_ir::Blocking`]), and the passes derive their
//! bf16 parts and optimizer accumulators (`dlrm_passes::described`); smaller MLP
//! parameters and ONNX initializers are stored. Version-1 manifests (every
//! parameter stored, no `init`) are still read.
//!
//! Invariants:
//! - [`write_plan`] is atomic: everything is written into a temporary directory beside
//!   the target (same parent, so the renames stay on one file system), each file and
//!   the directory are fsynced, then the directory is renamed into place. An existing
//!   plan is renamed aside first, the new one renamed in, and only then is the old
//!   one removed; if the second rename fails, the old plan is put back. A crash
//!   leaves either the old plan, the new plan, or (between the two renames) no plan
//!   at the target and both complete directories beside it — never a half plan. A
//!   failed write never modifies an existing plan. Anything at the target that is
//!   not a plan (a file, a non-empty directory without a plan manifest) is refused.
//! - [`read_plan`] checks the format and version, the enumerated fields, every
//!   file's sha256 (a corrupted file is named), the manifest's seal (`seal.rs`), parses the graphs (parse errors carry the file name) and checks
//!   that every parameter the graphs declare is in the plan (stored or described)
//!   with its declared dtype and shape. Stored weights are streamed from the file
//!   straight into the tensors' storage while being hashed: one read, no
//!   intermediate copy. A described parameter is not created by reading a plan:
//!   [`ParamValue::materialize`] / [`ParamValue::rows`] (or [`Plan::tensors`] for
//!   the whole set) create it, allocating fallibly (too large is an error naming
//!   it and the bytes).
//! - Tensors are stored little-endian (safetensors' rule); big-endian hosts are not
//!   supported.

use crate::error::{Result, RuntimeError};
use dlrm_data::durable;
use dlrm_ir::contract::InputContract;
use dlrm_ir::{DType, Described, Graph, ParamValue, Tensor, TensorType};
use half::bf16;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

#[cfg(target_endian = "big")]
compile_error!("plans store little-endian tensors; big-endian hosts are not supported");

/// The manifest's `format` value.
pub const FORMAT: &str = "dlrmc-plan";
/// The manifest version this crate writes (it reads this one and [`VERSION_1`]).
pub const VERSION: u32 = 2;
/// The first manifest version (every parameter stored), still read.
pub const VERSION_1: u32 = 1;
/// The manifest's file name.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The inference graph's file name.
pub const INFER_FILE: &str = "infer.ir";
/// The training graph's file name.
pub const TRAIN_FILE: &str = "train.ir";
/// The weights' file name.
pub const WEIGHTS_FILE: &str = "weights.safetensors";

/// Training hyper-parameters recorded in a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Training {
    /// Loss: `bce` or `mse`.
    #[serde(deserialize_with = "seal::loss")]
    pub loss: String,
    /// Optimizer: `sgd`, `adagrad` or `rowwise_adagrad`.
    #[serde(deserialize_with = "seal::optimizer")]
    pub optimizer: String,
    /// Learning rate: the base rate of the training graph's update ops (a run may
    /// change each step's rate without recompiling, [`crate::lr_schedule`]).
    pub learning_rate: f32,
    /// Batch size (the global batch of a multi-rank run).
    pub batch_size: usize,
    /// Seed of the initial weights and the default data seed.
    pub seed: u64,
}

/// A compiled model: graphs, initial parameters, hyper-parameters, provenance.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The model's name.
    pub name: String,
    /// The inference graph (unpartitioned).
    pub infer: Graph,
    /// The training step (unpartitioned), if the plan can train.
    pub train: Option<Graph>,
    /// Initial parameter values (stored or described), in manifest order.
    pub params: Vec<(String, ParamValue)>,
    /// Training hyper-parameters.
    pub training: Training,
    /// Precision policy, e.g. `fp32`.
    pub precision: String,
    /// The compiler's pass log (opaque to the runtime).
    pub pass_log: serde_json::Value,
    /// How the graphs' inputs come from the model's own ([`InputContract`]).
    pub contract: InputContract,
}

/// A file of the plan with its checksum.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileRef {
    /// File name inside the plan directory.
    pub file: String,
    /// Lower-case hex sha256 of the file's bytes.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
}

/// The graph files of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphFiles {
    /// The inference graph.
    pub infer: FileRef,
    /// The training graph, if any.
    pub train: Option<FileRef>,
}

/// One parameter as listed in the manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamEntry {
    /// Name (as in the graphs and the weights file).
    pub name: String,
    /// Element type mnemonic (`f32`, `bf16`, `i64`, `i32`).
    #[serde(deserialize_with = "seal::dtype")]
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// The initializer of a described parameter (not in the weights file); absent
    /// for a stored one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<Described>,
}

/// The contents of `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`] when written by this crate ([`VERSION_1`] is still read).
    pub version: u32,
    /// The model's name.
    pub name: String,
    /// Who wrote the plan, e.g. `dlrm-runtime 0.1.0`.
    pub created_by: String,
    /// Precision policy: `fp32`, `bf16` or `mixed`.
    #[serde(deserialize_with = "seal::precision")]
    pub precision: String,
    /// Training hyper-parameters.
    pub training: Training,
    /// The compiler's pass log (opaque).
    pub pass_log: serde_json::Value,
    /// The graph files.
    pub graphs: GraphFiles,
    /// The parameters, in order.
    pub params: Vec<ParamEntry>,
    /// The weights file.
    pub weights: FileRef,
    /// The model's input contract (absent: the identity).
    #[serde(default, skip_serializing_if = "InputContract::is_identity")]
    pub contract: InputContract,
    /// The sha256 of everything above but `created_by` (see `seal.rs`); absent in
    /// manifests written before seals existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
    /// The seal of the text this manifest was read from (empty when written).
    #[serde(skip)]
    pub read_seal: String,
}

mod quantize;
mod seal;
pub(crate) mod write;

pub use quantize::QuantizeReport;
pub use write::{FailPoint, write_plan, write_plan_failing_at};
pub(crate) use write::{View, tensor_bytes};

// ----------------------------------------------------------------------- read

/// Reads and checks a plan directory's manifest only (format, version, fields).
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(RuntimeError::plan(dir, "is not a directory")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(RuntimeError::plan(dir, "no such plan directory"));
        }
        Err(e) => return Err(RuntimeError::io(dir, e)),
    }
    let path = dir.join(MANIFEST_FILE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(RuntimeError::plan(
                dir,
                format!("missing {MANIFEST_FILE} (is this a plan directory?)"),
            ));
        }
        Err(e) => return Err(RuntimeError::io(&path, e)),
    };
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| RuntimeError::plan(&path, format!("not valid JSON: {e}")))?;
    match value.get("format").and_then(|f| f.as_str()) {
        Some(FORMAT) => {}
        other => {
            return Err(RuntimeError::plan(
                &path,
                format!("not a dlrmc plan (format is {other:?}, expected \"{FORMAT}\")"),
            ));
        }
    }
    match value.get("version").and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(VERSION) || v == u64::from(VERSION_1) => {}
        other => {
            return Err(RuntimeError::plan(
                &path,
                format!(
                    "plan format version {} is not supported (this dlrmc reads versions \
                     {VERSION_1} and {VERSION})",
                    other.map_or_else(|| "(missing)".to_string(), |v| v.to_string())
                ),
            ));
        }
    }
    let read_seal = seal::seal_of(&value);
    let m: Manifest = serde_json::from_value(value)
        .map_err(|e| RuntimeError::plan(&path, format!("bad manifest: {e}")))?;
    Ok(Manifest { read_seal, ..m })
}

/// Reads a plan directory, checking everything listed in the module docs.
pub fn read_plan(dir: &Path) -> Result<Plan> {
    let m = read_manifest(dir)?;
    let infer = read_graph(dir, &m.graphs.infer)?;
    let train = m
        .graphs
        .train
        .as_ref()
        .map(|f| read_graph(dir, f))
        .transpose()?;
    let weights_path = plan_file(dir, &m.weights.file)?;
    let mut weights = read_weights(&weights_path, &m.weights.sha256)?;

    // The manifest's list and the weights file agree.
    let stored = m.params.iter().filter(|p| p.init.is_none()).count();
    if weights.len() != stored {
        return Err(RuntimeError::plan(
            &weights_path,
            format!(
                "holds {} tensors but the manifest lists {stored} stored parameters",
                weights.len(),
            ),
        ));
    }
    let mut params = Vec::with_capacity(m.params.len());
    for p in &m.params {
        if let Some(d) = &p.init {
            if m.version == VERSION_1 {
                return Err(RuntimeError::plan(
                    dir,
                    format!("a version-1 manifest describes parameter `{}`", p.name),
                ));
            }
            if d.shape != p.shape || d.part.dtype().mnemonic() != p.dtype {
                return Err(RuntimeError::plan(
                    dir,
                    format!(
                        "parameter `{}` is {}{:?} but its initializer gives {}{:?}",
                        p.name,
                        p.dtype,
                        p.shape,
                        d.part.dtype(),
                        d.shape
                    ),
                ));
            }
            params.push((p.name.clone(), ParamValue::Described(d.clone())));
            continue;
        }
        let t = weights.remove(&p.name).ok_or_else(|| {
            RuntimeError::plan(
                &weights_path,
                format!("has no tensor `{}` (listed in the manifest)", p.name),
            )
        })?;
        if t.dtype().mnemonic() != p.dtype || t.shape != p.shape {
            return Err(RuntimeError::plan(
                &weights_path,
                format!(
                    "tensor `{}` is {}{:?} but the manifest says {}{:?}",
                    p.name,
                    t.dtype(),
                    t.shape,
                    p.dtype,
                    p.shape
                ),
            ));
        }
        params.push((p.name.clone(), ParamValue::Stored(t)));
    }
    let by_name: HashMap<&str, &ParamValue> = params.iter().map(|(n, v)| (n.as_str(), v)).collect();
    for g in std::iter::once(&infer).chain(&train) {
        check_graph_params(g, |n| {
            by_name.get(n).map(|v| (v.dtype(), v.shape().to_vec()))
        })
        .map_err(|e| match e {
            RuntimeError::Param { name, reason } => RuntimeError::Param {
                name,
                reason: format!("{reason} (graph `{}` of plan {})", g.name, dir.display()),
            },
            other => other,
        })?;
    }
    seal::check_seal(&m, &m.read_seal, &dir.join(MANIFEST_FILE))?;
    Ok(Plan {
        name: m.name,
        infer,
        train,
        params,
        training: m.training,
        precision: m.precision,
        pass_log: m.pass_log,
        contract: m.contract,
    })
}

impl Plan {
    /// Every parameter's whole initial value, described ones created (fallibly:
    /// a parameter larger than this process can hold is an error naming it and the
    /// bytes). For the interpreter, an export, a one-rank inference; a run creates
    /// only each rank's parts ([`crate::driver`]).
    pub fn tensors(&self) -> Result<Vec<(String, Tensor)>> {
        Ok(dlrm_ir::init::materialize_all(&self.params)?)
    }

    /// The parameters' names, dtypes and shapes, in manifest order.
    pub fn param_types(&self) -> impl Iterator<Item = (&str, DType, &[usize])> {
        self.params
            .iter()
            .map(|(n, v)| (n.as_str(), v.dtype(), v.shape()))
    }
}

/// A file named by the manifest: a plain name inside the plan directory.
fn plan_file(dir: &Path, name: &str) -> Result<PathBuf> {
    let p = Path::new(name);
    let plain = p.components().count() == 1
        && matches!(p.components().next(), Some(std::path::Component::Normal(_)));
    if plain {
        Ok(dir.join(p))
    } else {
        Err(RuntimeError::plan(
            dir,
            format!("the manifest names file {name:?}, which is not a plain file name"),
        ))
    }
}

fn read_graph(dir: &Path, f: &FileRef) -> Result<Graph> {
    let path = plan_file(dir, &f.file)?;
    let bytes = fs::read(&path).map_err(|e| RuntimeError::io(&path, e))?;
    let actual = hex(&Sha256::digest(&bytes));
    if actual != f.sha256 {
        return Err(RuntimeError::Checksum {
            file: path,
            expected: f.sha256.clone(),
            actual,
        });
    }
    let text = String::from_utf8(bytes)
        .map_err(|e| RuntimeError::plan(&path, format!("not UTF-8 text: {e}")))?;
    dlrm_ir::text::parse(&text).map_err(|source| RuntimeError::Parse { file: path, source })
}

/// Reads the weights, streaming each tensor into its storage while hashing. A file
/// that does not parse is reported as a checksum mismatch when it is one.
fn read_weights(path: &Path, expected: &str) -> Result<HashMap<String, Tensor>> {
    let mismatch = |actual: String| RuntimeError::Checksum {
        file: path.to_path_buf(),
        expected: expected.to_string(),
        actual,
    };
    match stream_weights(path) {
        Ok((tensors, actual)) if actual == expected => Ok(tensors),
        Ok((_, actual)) => Err(mismatch(actual)),
        Err(e) => match sha256_file(path) {
            Ok((actual, _)) if actual != expected => Err(mismatch(actual)),
            _ => Err(e),
        },
    }
}

fn stream_weights(path: &Path) -> Result<(HashMap<String, Tensor>, String)> {
    let bad = |reason: String| RuntimeError::plan(path, reason);
    let file = File::open(path).map_err(|e| RuntimeError::io(path, e))?;
    let total = file
        .metadata()
        .map_err(|e| RuntimeError::io(path, e))?
        .len();
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut hasher = Sha256::new();
    let mut n8 = [0u8; 8];
    r.read_exact(&mut n8)
        .map_err(|e| bad(format!("cannot read the safetensors header size: {e}")))?;
    hasher.update(n8);
    let n = u64::from_le_bytes(n8);
    if n > 100 << 20 || 8 + n > total {
        return Err(bad(format!(
            "safetensors header size {n} is impossible for a {total}-byte file"
        )));
    }
    let mut header = vec![0u8; n as usize];
    r.read_exact(&mut header)
        .map_err(|e| bad(format!("cannot read the safetensors header: {e}")))?;
    hasher.update(&header);
    let meta: safetensors::tensor::Metadata =
        serde_json::from_slice(&header).map_err(|e| bad(format!("bad safetensors header: {e}")))?;
    if 8 + n + meta.data_len() as u64 != total {
        return Err(bad(format!(
            "file size {total} does not match its header (8 + {n} + {} data bytes)",
            meta.data_len()
        )));
    }
    let mut out = HashMap::new();
    for name in meta.offset_keys() {
        let info = meta
            .info(&name)
            .ok_or_else(|| bad(format!("tensor `{name}` vanished from the header")))?;
        let numel: usize = info.shape.iter().product();
        let shape = info.shape.clone();
        let mut read_into = |bytes: &mut [u8]| -> Result<()> {
            r.read_exact(bytes)
                .map_err(|e| bad(format!("cannot read tensor `{name}`: {e}")))?;
            hasher.update(&*bytes);
            Ok(())
        };
        let t = match info.dtype {
            safetensors::Dtype::F32 => {
                let mut v = vec![0f32; numel];
                read_into(bytemuck::cast_slice_mut(&mut v))?;
                Tensor::f32(shape, v)
            }
            safetensors::Dtype::BF16 => {
                let mut v = vec![bf16::ZERO; numel];
                read_into(bytemuck::cast_slice_mut(&mut v))?;
                Tensor::bf16(shape, v)
            }
            safetensors::Dtype::I64 => {
                let mut v = vec![0i64; numel];
                read_into(bytemuck::cast_slice_mut(&mut v))?;
                Tensor::i64(shape, v)
            }
            safetensors::Dtype::I32 => {
                let mut v = vec![0i32; numel];
                read_into(bytemuck::cast_slice_mut(&mut v))?;
                Tensor::i32(shape, v)
            }
            safetensors::Dtype::U8 => {
                let mut v = vec![0u8; numel];
                read_into(&mut v)?;
                Tensor::u8(shape, v)
            }
            other => {
                return Err(bad(format!(
                    "tensor `{name}` has dtype {other}; plans hold F32, BF16, I64, I32 or U8"
                )));
            }
        };
        out.insert(name, t);
    }
    Ok((out, hex(&hasher.finalize())))
}

/// Checks that every parameter `g` declares is available (by `lookup`) with its
/// declared dtype and fixed shape.
pub(crate) fn check_graph_params(
    g: &Graph,
    lookup: impl Fn(&str) -> Option<(DType, Vec<usize>)>,
) -> Result<()> {
    for (name, ty) in g.param_types() {
        let Some((dtype, shape)) = lookup(name) else {
            return Err(param_err(
                name,
                format!(
                    "declared {ty} by graph `{}` but missing from the weights",
                    g.name
                ),
            ));
        };
        if !fits(ty, dtype, &shape) {
            return Err(param_err(
                name,
                format!(
                    "the weights hold {dtype}{shape:?} but graph `{}` declares {ty}",
                    g.name
                ),
            ));
        }
    }
    Ok(())
}

fn fits(ty: &TensorType, dtype: DType, shape: &[usize]) -> bool {
    ty.dtype == dtype
        && ty.shape.len() == shape.len()
        && ty
            .shape
            .iter()
            .zip(shape)
            .all(|(d, &n)| d.fixed() == Some(n))
}

fn param_err(name: &str, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Param {
        name: name.to_string(),
        reason: reason.into(),
    }
}

fn stored_len(t: &Tensor) -> usize {
    t.data.len()
}

fn sha256_file(path: &Path) -> Result<(String, u64)> {
    let (bytes, sha) = durable::hash_file(path).map_err(|e| RuntimeError::io(path, e))?;
    Ok((sha, bytes))
}

fn hex(bytes: &[u8]) -> String {
    durable::hex(bytes)
}
