//! The ONNX protobuf messages, generated at build time from `proto/onnx.proto`
//! (see `build.rs`). Only the importer's reader modules touch these types; op
//! builders see typed attribute helpers instead.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
