//! Writing a plan directory atomically (the invariants are in the module docs of
//! [`crate::plan`]).

use super::{
    FORMAT, FileRef, GraphFiles, INFER_FILE, MANIFEST_FILE, Manifest, ParamEntry, Plan, TRAIN_FILE,
    VERSION, WEIGHTS_FILE, check_graph_params, param_err, sha256_file, stored_len,
};
use crate::error::{Result, RuntimeError};
use dlrm_data::durable;
use dlrm_ir::{DType, Data, ParamValue, Tensor};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::path::Path;

/// Writes `plan` as a plan directory at `dir`, atomically (see the module docs).
/// The parent directory is created if needed.
pub fn write_plan(dir: &Path, plan: &Plan) -> Result<()> {
    write_plan_impl(dir, plan, None)
}

/// Points where a test can make [`write_plan`] fail, to check that a failure never
/// damages an existing plan. Not part of the stable API.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailPoint {
    /// After the weights are written into the temporary directory.
    AfterWeights,
    /// After the manifest is written, before any rename.
    BeforeSwap,
    /// After the existing plan was renamed aside, before the new one is renamed in.
    AfterOldMovedAside,
}

/// [`write_plan`] with an injected failure (tests only).
#[doc(hidden)]
pub fn write_plan_failing_at(dir: &Path, plan: &Plan, at: FailPoint) -> Result<()> {
    write_plan_impl(dir, plan, Some(at))
}

fn injected(dir: &Path, fail: Option<FailPoint>, here: FailPoint) -> Result<()> {
    if fail == Some(here) {
        Err(RuntimeError::plan(
            dir,
            format!("injected failure at {here:?}"),
        ))
    } else {
        Ok(())
    }
}

fn write_plan_impl(dir: &Path, plan: &Plan, fail: Option<FailPoint>) -> Result<()> {
    // 1. Everything that can be checked in memory, before touching the disk.
    let (infer_text, train_text) = validate_for_write(dir, plan)?;
    let replace_existing = check_target(dir)?;

    // 2. Write into a temporary directory beside the target.
    let parent = durable::parent_of(dir);
    let base = dir
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .ok_or_else(|| RuntimeError::plan(dir, "the plan path has no final component"))?;
    let tmp = durable::temp_dir_beside(dir).map_err(|e| RuntimeError::io(&parent, e))?;
    let t = tmp.path();

    let infer_ref = write_synced(&t.join(INFER_FILE), INFER_FILE, infer_text.as_bytes())?;
    let train_ref = match &train_text {
        Some(text) => Some(write_synced(
            &t.join(TRAIN_FILE),
            TRAIN_FILE,
            text.as_bytes(),
        )?),
        None => None,
    };
    let weights_ref = write_weights(&t.join(WEIGHTS_FILE), &plan.params)?;
    injected(dir, fail, FailPoint::AfterWeights)?;
    let manifest = Manifest {
        format: FORMAT.to_string(),
        version: VERSION,
        name: plan.name.clone(),
        created_by: format!("{} {}", env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION")),
        precision: plan.precision.clone(),
        training: plan.training.clone(),
        pass_log: plan.pass_log.clone(),
        graphs: GraphFiles {
            infer: infer_ref,
            train: train_ref,
        },
        params: plan
            .params
            .iter()
            .map(|(name, v)| ParamEntry {
                name: name.clone(),
                dtype: v.dtype().mnemonic().to_string(),
                shape: v.shape().to_vec(),
                init: match v {
                    ParamValue::Described(d) => Some(d.clone()),
                    ParamValue::Stored(_) | ParamValue::OnDemand(_) => None,
                },
            })
            .collect(),
        weights: weights_ref,
        contract: plan.contract.clone(),
        seal: None,
        read_seal: String::new(),
    };
    let manifest = Manifest {
        seal: Some(super::seal::seal_of_manifest(&manifest)?),
        ..manifest
    };
    let json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| RuntimeError::plan(dir, format!("cannot encode the manifest: {e}")))?;
    write_synced(&t.join(MANIFEST_FILE), MANIFEST_FILE, &json)?;
    sync_dir(t)?;
    injected(dir, fail, FailPoint::BeforeSwap)?;

    // 3. Swap into place. Until `keep`, dropping `tmp` removes the new directory.
    let new_dir = tmp.keep();
    let result = swap_into_place(&new_dir, dir, &parent, &base, replace_existing, fail);
    if result.is_err() {
        let _ = fs::remove_dir_all(&new_dir);
    }
    result?;
    sync_dir(&parent)
}

/// Checks the plan's consistency; returns the graphs' text forms.
fn validate_for_write(dir: &Path, plan: &Plan) -> Result<(String, Option<String>)> {
    let mut seen = HashSet::new();
    for (name, v) in &plan.params {
        if !seen.insert(name.as_str()) {
            return Err(param_err(name, "listed twice"));
        }
        let ParamValue::Stored(t) = v else { continue };
        let stored = stored_len(t);
        if stored != t.numel() {
            return Err(param_err(
                name,
                format!(
                    "holds {stored} elements but its shape {:?} has {}",
                    t.shape,
                    t.numel()
                ),
            ));
        }
    }
    let by_name: HashMap<&str, &ParamValue> =
        plan.params.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let mut texts = Vec::new();
    for g in std::iter::once(&plan.infer).chain(&plan.train) {
        check_graph_params(g, |n| {
            by_name.get(n).map(|v| (v.dtype(), v.shape().to_vec()))
        })?;
        let text = dlrm_ir::text::print(g);
        // A plan that cannot be read back must not be written.
        match dlrm_ir::text::parse(&text) {
            Ok(back) if back == *g => texts.push(text),
            Ok(_) => {
                return Err(RuntimeError::plan(
                    dir,
                    format!(
                        "graph `{}` does not survive its text form unchanged",
                        g.name
                    ),
                ));
            }
            Err(e) => {
                return Err(RuntimeError::plan(
                    dir,
                    format!(
                        "graph `{}` does not read back from its text form: {e}",
                        g.name
                    ),
                ));
            }
        }
    }
    let mut texts = texts.into_iter();
    let infer = texts.next().unwrap_or_default();
    Ok((infer, texts.next()))
}

/// True if `dir` holds a plan to replace; `Ok(false)` if nothing (or an empty
/// directory) is there; an error for anything else.
fn check_target(dir: &Path) -> Result<bool> {
    let meta = match fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(RuntimeError::io(dir, e)),
    };
    if !meta.is_dir() {
        return Err(RuntimeError::plan(
            dir,
            "exists and is not a directory: refusing to replace it with a plan",
        ));
    }
    let manifest = dir.join(MANIFEST_FILE);
    if manifest.is_file() {
        let is_plan = fs::read(&manifest)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v.get("format").and_then(|f| f.as_str()) == Some(FORMAT));
        if is_plan {
            return Ok(true);
        }
    }
    let empty = fs::read_dir(dir)
        .map_err(|e| RuntimeError::io(dir, e))?
        .next()
        .is_none();
    if empty {
        Ok(true)
    } else {
        Err(RuntimeError::plan(
            dir,
            "is a directory that is not a dlrmc plan: refusing to replace it",
        ))
    }
}

fn swap_into_place(
    new_dir: &Path,
    dir: &Path,
    parent: &Path,
    base: &str,
    replace_existing: bool,
    fail: Option<FailPoint>,
) -> Result<()> {
    if !replace_existing {
        return fs::rename(new_dir, dir).map_err(|e| RuntimeError::io(dir, e));
    }
    // A unique holder beside the target; the old plan moves inside it.
    let holder = tempfile::Builder::new()
        .prefix(&format!(".{base}.old-"))
        .tempdir_in(parent)
        .map_err(|e| RuntimeError::io(parent, e))?;
    let aside = holder.path().join("plan");
    fs::rename(dir, &aside).map_err(|e| RuntimeError::io(dir, e))?;
    let moved_in = injected(dir, fail, FailPoint::AfterOldMovedAside)
        .and_then(|()| fs::rename(new_dir, dir).map_err(|e| RuntimeError::io(dir, e)));
    if let Err(e) = moved_in {
        // Put the old plan back; if even that fails, keep it beside the target.
        if fs::rename(&aside, dir).is_err() {
            let kept = holder.keep();
            return Err(RuntimeError::plan(
                dir,
                format!(
                    "{e}; the previous plan could not be moved back and is kept at {}",
                    kept.join("plan").display()
                ),
            ));
        }
        return Err(e);
    }
    // `holder` (with the old plan inside) is removed when dropped.
    drop(holder);
    Ok(())
}

fn write_synced(path: &Path, name: &str, bytes: &[u8]) -> Result<FileRef> {
    durable::write_synced(path, bytes).map_err(|e| RuntimeError::io(path, e))?;
    Ok(FileRef {
        file: name.to_string(),
        sha256: durable::sha256_hex(bytes),
        bytes: bytes.len() as u64,
    })
}

fn sync_dir(dir: &Path) -> Result<()> {
    durable::sync_dir(dir).map_err(|e| RuntimeError::io(dir, e))
}

/// A borrowed view of a tensor for safetensors (no copy of the data).
pub(crate) struct View<'a>(pub(crate) &'a Tensor);

impl safetensors::View for View<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        st_dtype(self.0.dtype())
    }
    fn shape(&self) -> &[usize] {
        &self.0.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(tensor_bytes(self.0))
    }
    fn data_len(&self) -> usize {
        self.0.size_bytes()
    }
}

/// The safetensors dtype of an element type.
pub(crate) fn st_dtype(d: DType) -> safetensors::Dtype {
    match d {
        DType::F32 => safetensors::Dtype::F32,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::I64 => safetensors::Dtype::I64,
        DType::I32 => safetensors::Dtype::I32,
        DType::U8 => safetensors::Dtype::U8,
    }
}

/// A tensor's elements as little-endian bytes (no copy).
pub(crate) fn tensor_bytes(t: &Tensor) -> &[u8] {
    match &t.data {
        Data::F32(v) => bytemuck::cast_slice(v),
        Data::BF16(v) => bytemuck::cast_slice(v),
        Data::I64(v) => bytemuck::cast_slice(v),
        Data::I32(v) => bytemuck::cast_slice(v),
        Data::U8(v) => v,
    }
}

fn write_weights(path: &Path, params: &[(String, ParamValue)]) -> Result<FileRef> {
    // Values read on demand (a checkpoint's) are stored: read them now.
    let read = params
        .iter()
        .filter(|(_, v)| matches!(v, ParamValue::OnDemand(_)))
        .map(|(n, v)| -> Result<(&str, Tensor)> { Ok((n.as_str(), v.materialize(n)?)) })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(
        params
            .iter()
            .filter_map(|(n, v)| match v {
                ParamValue::Stored(t) => Some((n.as_str(), View(t))),
                ParamValue::Described(_) | ParamValue::OnDemand(_) => None,
            })
            .chain(read.iter().map(|(n, t)| (*n, View(t)))),
        None,
        path,
    )
    .map_err(|e| RuntimeError::plan(path, format!("cannot write the weights: {e}")))?;
    // Hash what is in the file (streamed), then make it durable.
    let (sha256, bytes) = sha256_file(path)?;
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| RuntimeError::io(path, e))?;
    Ok(FileRef {
        file: WEIGHTS_FILE.to_string(),
        sha256,
        bytes,
    })
}
