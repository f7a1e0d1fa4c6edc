//! The manifest's meaning sealed by a checksum, and its enumerated fields read as
//! enums.
//!
//! - `seal` is the sha256 of the manifest's canonical JSON (keys sorted, compact)
//!   without `seal` itself and the cosmetic `created_by`: the name, precision,
//!   training hyper-parameters, pass log, file checksums and every parameter entry
//!   (a described parameter's initializer, seed included). [`super::read_plan`]
//!   checks it after every other check (so a more specific error wins); a manifest
//!   written before seals existed has none and still reads, as does a version-1
//!   manifest (seals came with version 2's writers).
//! - `precision`, `training.loss`, `training.optimizer` and each parameter's
//!   `dtype` are read through serde enums: a value this dlrmc does not know is
//!   refused naming the field and the value, not carried along as free text.

use super::Manifest;
use crate::error::{Result, RuntimeError};
use serde::de::{Deserializer, Error as _};
use serde::{Deserialize, de::value::StrDeserializer};
use std::path::Path;

/// The fields the seal leaves out.
const UNSEALED: [&str; 2] = ["seal", "created_by"];

/// The seal of a manifest as JSON (lower-case hex sha256). It is taken over the
/// manifest as parsed from its text, at write and at read alike, so a number reads
/// back to the same value whatever the float parser's last-bit rounding.
pub(super) fn seal_of(v: &serde_json::Value) -> String {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        for k in UNSEALED {
            o.remove(k);
        }
    }
    dlrm_data::durable::sha256_hex(v.to_string().as_bytes())
}

/// The seal of `m` as written: over `m` encoded and parsed back.
pub(super) fn seal_of_manifest(m: &Manifest) -> Result<String> {
    let bad = |e: serde_json::Error| RuntimeError::Job {
        reason: format!("cannot encode a plan manifest: {e}"),
    };
    let text = serde_json::to_vec(m).map_err(bad)?;
    Ok(seal_of(&serde_json::from_slice(&text).map_err(bad)?))
}

/// Checks `m`'s seal, when it has one, against `contents` (the seal of the text it
/// was read from; `path`: the manifest, for the error).
pub(super) fn check_seal(m: &Manifest, contents: &str, path: &Path) -> Result<()> {
    // Version-1 manifests predate seals: one rewritten as version 1 is read as
    // one (the checks of files and parameters still apply).
    let Some(want) = m.seal.as_ref().filter(|_| m.version != super::VERSION_1) else {
        return Ok(());
    };
    if contents != want {
        return Err(RuntimeError::plan(
            path,
            format!(
                "its contents do not match its seal (seal {want}, contents hash to \
                 {contents}): the manifest was edited or corrupted; recompile the plan"
            ),
        ));
    }
    Ok(())
}

/// Reads a string field through the enum `E`, keeping the string.
fn one_of<'de, D: Deserializer<'de>, E: Deserialize<'de>>(
    d: D,
    field: &str,
) -> std::result::Result<String, D::Error> {
    let s = String::deserialize(d)?;
    E::deserialize(StrDeserializer::<D::Error>::new(&s))
        .map_err(|e| D::Error::custom(format!("{field} `{s}`: {e}")))?;
    Ok(s)
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum PrecisionName {
    #[serde(alias = "f32")]
    Fp32,
    Bf16,
    Mixed,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum LossName {
    Bce,
    Mse,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum OptimizerName {
    Sgd,
    Adagrad,
    RowwiseAdagrad,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum DTypeName {
    F32,
    Bf16,
    I64,
    I32,
    U8,
}

/// `precision`: `fp32`, `bf16` or `mixed`.
pub(super) fn precision<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    one_of::<D, PrecisionName>(d, "precision")
}

/// `training.loss`: `bce` or `mse`.
pub(super) fn loss<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    one_of::<D, LossName>(d, "training.loss")
}

/// `training.optimizer`: `sgd`, `adagrad` or `rowwise_adagrad`.
pub(super) fn optimizer<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    one_of::<D, OptimizerName>(d, "training.optimizer")
}

/// A parameter's `dtype`: `f32`, `bf16`, `i64`, `i32` or `u8`.
pub(super) fn dtype<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    one_of::<D, DTypeName>(d, "dtype")
}
