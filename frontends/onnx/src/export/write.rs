//! Encoding and atomic writing of an exported model, with optional external data.
//!
//! External data (ONNX's `data_location = EXTERNAL`): initializers of at least
//! [`EXTERNAL_MIN_BYTES`] go, 64-byte aligned, into one file `<model file>.data`
//! next to the model, each with its `location`, `offset` and `length`; smaller
//! ones stay inline. Both files are written to a temporary name in the target
//! folder, fsynced and renamed (the data file first), so an interrupted export
//! never leaves a truncated model behind.

use super::builder::Init;
use crate::error::{OnnxError, Result};
use crate::proto::{ModelProto, StringStringEntryProto, tensor_proto::DataLocation};
use prost::Message;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Initializers smaller than this stay inline with external data.
pub const EXTERNAL_MIN_BYTES: usize = 1024;

/// What [`super::Exported::write`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportSummary {
    /// The model file.
    pub path: PathBuf,
    /// Its size in bytes.
    pub model_bytes: u64,
    /// The external data file and its size, if any.
    pub external: Option<(PathBuf, u64)>,
    /// ONNX nodes in the graph.
    pub nodes: usize,
    /// Initializers.
    pub initializers: usize,
}

fn io_err(path: &Path, source: std::io::Error) -> OnnxError {
    OnnxError::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// The model with all initializers inline.
pub(crate) fn inline_bytes(model: &ModelProto, inits: &[Init<'_>]) -> Vec<u8> {
    let mut m = model.clone();
    if let Some(g) = m.graph.as_mut() {
        g.initializer = inits.iter().map(Init::inline).collect();
    }
    m.encode_to_vec()
}

/// A temporary path beside `path`.
fn temp_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.tmp.{}", std::process::id()))
}

/// Writes a file atomically: `fill` writes the contents to a temporary file, which
/// is fsynced then renamed over `path`.
fn atomic(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<u64> {
    let tmp = temp_beside(path);
    let run = || -> std::io::Result<u64> {
        let f = File::create(&tmp)?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        fill(&mut w)?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        let len = f.metadata()?.len();
        drop(f);
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            // Persist the rename (best effort: not every platform opens folders).
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(len)
    };
    run().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_err(path, e)
    })
}

/// Writes the model (and its external data) to `path`.
pub(crate) fn write(
    model: &ModelProto,
    inits: &[Init<'_>],
    external: bool,
    path: &Path,
) -> Result<ExportSummary> {
    let nodes = model.graph.as_ref().map_or(0, |g| g.node.len());
    let mut m = model.clone();
    if external {
        let file = path
            .file_name()
            .map_or_else(|| "model.onnx".into(), |n| n.to_string_lossy().into_owned());
        let data_name = format!("{file}.data");
        let data_path = path.with_file_name(&data_name);
        let mut protos = Vec::with_capacity(inits.len());
        let mut big: Vec<&Init<'_>> = Vec::new();
        let mut offset = 0u64;
        for i in inits {
            let len = i.data.byte_len();
            if len < EXTERNAL_MIN_BYTES {
                protos.push(i.inline());
                continue;
            }
            offset = offset.div_ceil(64) * 64;
            let mut t = i.header();
            let kv = |k: &str, v: String| StringStringEntryProto {
                key: Some(k.into()),
                value: Some(v),
            };
            t.external_data = vec![
                kv("location", data_name.clone()),
                kv("offset", offset.to_string()),
                kv("length", len.to_string()),
            ];
            t.data_location = Some(DataLocation::External as i32);
            protos.push(t);
            big.push(i);
            offset += len as u64;
        }
        let size = atomic(&data_path, |w| {
            let mut at = 0u64;
            let mut buf = Vec::new();
            for i in &big {
                let pad = at.div_ceil(64) * 64 - at;
                w.write_all(&vec![0u8; pad as usize])?;
                at += pad;
                buf.clear();
                i.data.write_le(&mut buf);
                w.write_all(&buf)?;
                at += buf.len() as u64;
            }
            Ok(())
        })?;
        if let Some(g) = m.graph.as_mut() {
            g.initializer = protos;
        }
        let bytes = m.encode_to_vec();
        let model_bytes = atomic(path, |w| w.write_all(&bytes))?;
        return Ok(ExportSummary {
            path: path.to_path_buf(),
            model_bytes,
            external: Some((data_path, size)),
            nodes,
            initializers: inits.len(),
        });
    }
    let bytes = inline_bytes(model, inits);
    let model_bytes = atomic(path, |w| w.write_all(&bytes))?;
    Ok(ExportSummary {
        path: path.to_path_buf(),
        model_bytes,
        external: None,
        nodes,
        initializers: inits.len(),
    })
}
