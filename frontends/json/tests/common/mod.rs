//! Helpers shared by the integration tests: example paths and edited descriptions.

#![allow(dead_code)]

use serde_json::Value;
use std::path::PathBuf;

/// Path of `examples/<name>.json` in the workspace.
pub fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(format!("{name}.json"))
}

/// The tiny example as a JSON value.
pub fn tiny_value() -> Value {
    let src = std::fs::read_to_string(example("dlrm-tiny")).expect("read dlrm-tiny.json");
    serde_json::from_str(&src).expect("dlrm-tiny.json is JSON")
}

/// The tiny example with `edit` applied, as text.
pub fn tiny_with(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> String {
    let mut v = tiny_value();
    edit(v.as_object_mut().expect("an object"));
    serde_json::to_string_pretty(&v).expect("serialise")
}

/// The tiny example with one field set.
pub fn tiny_set(field: &str, value: Value) -> String {
    tiny_with(|m| {
        m.insert(field.to_string(), value);
    })
}
