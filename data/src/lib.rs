//! dlrmc's data: the memory-mapped `.ds` dataset (and, built on it, the Criteo
//! readers, the converter and the loader).
//!
//! A `.ds` dataset is a directory: `manifest.json` (the schema, row counts per table,
//! splits, and a size and SHA-256 per file) beside one file per column, each a flat
//! little-endian array read by memory map without parsing:
//!
//! | file | type | elements |
//! | --- | --- | --- |
//! | `label.u8` | u8 (0 or 1) | samples |
//! | `dense.f32` | f32, sample-major | samples × dense width (values already transformed) |
//! | `sparse.<t>.u32` | u32 | one-hot table: samples (table `t`'s row of each sample); multi-hot: every sample's bag, in sample order |
//! | `sparse.<t>.off.u64` | u64 | multi-hot tables only: samples + 1 bag starts (0 first, non-decreasing, the id count last) |
//!
//! The manifest's table entry says which ([`TableInfo::bags`], `"one_hot"` when
//! absent) and, for a multi-hot table, its id count and its hotness when every bag
//! has the same size. A dataset with a multi-hot table is format version 2; one whose
//! tables are all one-hot is written as version 1, byte for byte as before, and every
//! version-1 dataset reads unchanged. [`Dataset::open`] checks every file's size and
//! each offsets file's first and last entry; [`Dataset::bag`] checks a bag's bounds
//! where it is read and [`Dataset::verify`] every offset's order.
//!
//! [`DatasetWriter`] writes one atomically: into a temporary directory beside the
//! target, every file synced, then renamed into place; a failed or interrupted write
//! leaves nothing under the target's name and never damages a dataset already there.
//! [`Dataset::open`] maps one and checks it against its manifest.
//!
//! Built on it:
//!
//! - [`criteo`]: Criteo's raw TSV (plain or gzip) and the reference DLRM's
//!   preprocessing of a line (dense `ln(1 + max(x, 0))` in f32, hex ids, missing = 0);
//! - [`vocab`]: raw ids to table rows (the reference's first-appearance dictionary
//!   with an optional modulo and frequency threshold, or plain hashing);
//! - [`split`]: the reference's Kaggle and Terabyte splits, or fractions;
//! - [`processed`]: the reference's `.npz` and MLPerf's binary records;
//! - [`npy`]: `.npy`/`.npz` read with every declared size checked first;
//! - [`ragged`]: multi-hot bags per table from `.npz` (ids + lengths or offsets);
//! - [`mlperf_multihot`]: MLPerf DLRM-DCNv2's per-day multi-hot arrays;
//! - [`convert()`]: the streaming, atomic conversion of any of them to `.ds`;
//! - [`mod@generate`]: synthetic Criteo-format TSV with the real data's character;
//! - [`mod@inspect`]: a dataset's summary (splits, per-feature statistics);
//! - [`learnable`]: small learnable datasets of any schema, for tests and benches.
//! - [`durable`]: the atomic-write helpers (temp beside the target, fsync, rename)
//!   that datasets, plans and checkpoints share.
#![warn(missing_docs)]

mod bags;
pub mod convert;
pub mod criteo;
mod ds;
pub mod durable;
mod error;
pub mod generate;
pub mod inspect;
pub mod learnable;
pub mod mapped;
pub mod mlperf_multihot;
pub mod npy;
pub mod processed;
pub mod ragged;
pub mod split;
pub mod vocab;

pub use bags::{BagSizes, Bags};
pub use convert::{ConvertOptions, ConvertReport, Format, Progress, convert};
pub use ds::{
    Dataset, DatasetMeta, DatasetWriter, FORMAT, FileEntry, Manifest, Split, TableInfo, VERSION,
};
pub use error::{DataError, Result};
pub use generate::{GenerateOptions, GenerateReport, generate};
pub use inspect::{Inspection, inspect};
pub use learnable::{Learnable, parse_pooling, write_learnable, write_learnable_bags};
pub use split::SplitSpec;
pub use vocab::IdMapping;
