//! Criteo's raw TSV, as both data sets ship it, and the reference DLRM's
//! preprocessing of one line.
//!
//! A line is `label \t I1 .. I13 \t C1 .. C26`: exactly 40 tab-separated fields.
//!
//! - The label is `0` or `1`. (The reference reads an empty label as 0; a Criteo file
//!   never has one, so an empty label here is a bad line.)
//! - `I1` .. `I13` are decimal integers, possibly negative; empty means missing and
//!   reads as 0, as the reference's `line[j] = '0'` does. Values are read as `i64`.
//! - `C1` .. `C26` are 32-bit hashes printed as (up to) 8 hex digits; empty means
//!   missing and reads as id 0, exactly as the reference's `int('0', 16)`: a missing
//!   value is one more category (id 0), not a special row.
//!
//! The dense transform is the reference's `np.log(X_int.astype(np.float32) + 1)`
//! after `X_int[X_int < 0] = 0`: computed in f32 ([`log1p_clamped`]).
//!
//! Files are read as plain text or gzip (detected by the magic bytes `1f 8b`, so
//! `day_0` and `day_0.gz` both work; concatenated gzip members are read through).

use crate::error::{DataError, Result};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Dense (integer) features per sample.
pub const DENSE: usize = 13;
/// Categorical features (tables) per sample.
pub const SPARSE: usize = 26;
/// Fields per line: label, dense, categorical.
pub const FIELDS: usize = 1 + DENSE + SPARSE;

/// The name of dense feature `i` (0-based): `I1` .. `I13`.
pub fn dense_name(i: usize) -> String {
    format!("I{}", i + 1)
}

/// The name of categorical feature `t` (0-based): `C1` .. `C26`.
pub fn sparse_name(t: usize) -> String {
    format!("C{}", t + 1)
}

/// The reference's dense transform: `ln(1 + max(x, 0))`, with `x` first converted to
/// f32 and the sum and logarithm in f32, as `np.log(x.astype(np.float32) + 1)` does.
pub fn log1p_clamped(x: i64) -> f32 {
    (x.max(0) as f32 + 1.0).ln()
}

/// One sample before the id mapping: label, raw integers, raw 32-bit ids.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawSample {
    /// 0 or 1.
    pub label: u8,
    /// The integer features (missing = 0), not yet transformed.
    pub dense: [i64; DENSE],
    /// The categorical ids (missing = 0).
    pub sparse: [u32; SPARSE],
}

/// Why a line is bad: the key under which `--skip-bad-lines` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BadLine {
    /// Not exactly 40 fields.
    FieldCount,
    /// A label other than `0` or `1`.
    Label,
    /// An integer feature that does not parse.
    Integer,
    /// A categorical feature that is not hex of at most 8 digits.
    Categorical,
}

impl BadLine {
    /// The counting key (`field-count`, `label`, `integer`, `categorical`).
    pub fn key(self) -> &'static str {
        match self {
            BadLine::FieldCount => "field-count",
            BadLine::Label => "label",
            BadLine::Integer => "integer",
            BadLine::Categorical => "categorical",
        }
    }
}

/// A bad line: its kind and a message naming the field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    /// The kind.
    pub kind: BadLine,
    /// What is wrong, naming the field (`field I5: ...`).
    pub message: String,
}

fn shown(field: &[u8]) -> String {
    let s = String::from_utf8_lossy(field);
    if s.chars().count() > 24 {
        format!("{}...", s.chars().take(24).collect::<String>())
    } else {
        s.into_owned()
    }
}

/// Parses one line (with or without its `\n` / `\r\n`) into `out`.
pub fn parse_line(line: &[u8], out: &mut RawSample) -> Result<(), LineError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut fields: [&[u8]; FIELDS] = [&[]; FIELDS];
    let mut n = 0usize;
    for f in line.split(|&b| b == b'\t') {
        if n < FIELDS {
            fields[n] = f;
        }
        n += 1;
    }
    if n != FIELDS {
        return Err(LineError {
            kind: BadLine::FieldCount,
            message: format!("expected {FIELDS} tab-separated fields, found {n}"),
        });
    }
    out.label = match fields[0] {
        b"0" => 0,
        b"1" => 1,
        other => {
            return Err(LineError {
                kind: BadLine::Label,
                message: format!("field label: `{}` is not 0 or 1", shown(other)),
            });
        }
    };
    for (i, f) in fields[1..=DENSE].iter().enumerate() {
        out.dense[i] = parse_int(f).ok_or_else(|| LineError {
            kind: BadLine::Integer,
            message: format!("field {}: `{}` is not an integer", dense_name(i), shown(f)),
        })?;
    }
    for (t, f) in fields[1 + DENSE..].iter().enumerate() {
        out.sparse[t] = parse_hex(f).ok_or_else(|| LineError {
            kind: BadLine::Categorical,
            message: format!(
                "field {}: `{}` is not a hex id of at most 8 digits",
                sparse_name(t),
                shown(f)
            ),
        })?;
    }
    Ok(())
}

/// A decimal integer; empty is 0 (missing).
fn parse_int(f: &[u8]) -> Option<i64> {
    let (neg, digits) = match f {
        [] => return Some(0),
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, f),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut v: i64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v * 10 + i64::from(b - b'0');
    }
    Some(if neg { -v } else { v })
}

/// Hex of 1 to 8 digits; empty is 0 (missing, as the reference's `int('0', 16)`).
fn parse_hex(f: &[u8]) -> Option<u32> {
    if f.len() > 8 {
        return None;
    }
    let mut v: u32 = 0;
    for &b in f {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => return None,
        };
        v = (v << 4) | u32::from(d);
    }
    Some(v)
}

/// Counts the bytes read from the underlying file (compressed bytes for gzip).
struct Counting<R> {
    inner: R,
    bytes: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// A batch of lines read from one file: the bytes and each line's range.
#[derive(Default)]
pub struct LineBatch {
    /// The lines' bytes, back to back (each with its `\n`, but perhaps the last).
    pub buf: Vec<u8>,
    /// Each line's range in `buf`.
    pub lines: Vec<(usize, usize)>,
    /// The 1-based number of the first line in the file.
    pub first_line: u64,
}

impl LineBatch {
    /// Line `i` of the batch.
    pub fn line(&self, i: usize) -> &[u8] {
        let (s, e) = self.lines[i];
        &self.buf[s..e]
    }
}

/// Reads a Criteo TSV file (plain or gzip) in batches of lines.
pub struct TsvReader {
    path: PathBuf,
    reader: Box<dyn BufRead + Send>,
    gzip: bool,
    lines: u64,
    bytes: Arc<AtomicU64>,
}

impl TsvReader {
    /// Opens `path`, detecting gzip by its magic bytes.
    pub fn open(path: &Path) -> Result<TsvReader> {
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        let bytes = Arc::new(AtomicU64::new(0));
        let mut raw = BufReader::with_capacity(
            1 << 20,
            Counting {
                inner: file,
                bytes: bytes.clone(),
            },
        );
        let head = raw.fill_buf().map_err(|e| DataError::io(path, e))?;
        let gzip = head.starts_with(&[0x1f, 0x8b]);
        let reader: Box<dyn BufRead + Send> = if gzip {
            Box::new(BufReader::with_capacity(
                1 << 20,
                flate2::bufread::MultiGzDecoder::new(raw),
            ))
        } else {
            Box::new(raw)
        };
        Ok(TsvReader {
            path: path.to_path_buf(),
            reader,
            gzip,
            lines: 0,
            bytes,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file is gzip.
    pub fn is_gzip(&self) -> bool {
        self.gzip
    }

    /// Lines read so far.
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// Bytes of the file read so far (compressed bytes for gzip).
    pub fn bytes_read(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Reads up to `max` lines into `batch` (cleared first); an empty batch is the
    /// end of the file. A read error (a truncated or corrupt gzip stream) names the
    /// file and the line being read.
    pub fn read_batch(&mut self, batch: &mut LineBatch, max: usize) -> Result<()> {
        batch.buf.clear();
        batch.lines.clear();
        batch.first_line = self.lines + 1;
        while batch.lines.len() < max {
            let start = batch.buf.len();
            let n = self
                .reader
                .read_until(b'\n', &mut batch.buf)
                .map_err(|e| self.read_error(e))?;
            if n == 0 {
                break;
            }
            self.lines += 1;
            batch.lines.push((start, batch.buf.len()));
        }
        Ok(())
    }

    fn read_error(&self, e: std::io::Error) -> DataError {
        let what = if self.gzip {
            "reading the gzip stream failed (a truncated or corrupt .gz file?)"
        } else {
            "reading failed"
        };
        DataError::Input {
            path: self.path.clone(),
            line: self.lines + 1,
            reason: format!("{what}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ints_and_hex() {
        assert_eq!(parse_int(b""), Some(0));
        assert_eq!(parse_int(b"-3"), Some(-3));
        assert_eq!(parse_int(b"+12"), Some(12));
        assert_eq!(parse_int(b"1x"), None);
        assert_eq!(parse_int(b"-"), None);
        assert_eq!(parse_int(b"1234567890123456789"), None);
        assert_eq!(parse_hex(b""), Some(0));
        assert_eq!(parse_hex(b"ffffffff"), Some(u32::MAX));
        assert_eq!(parse_hex(b"68fd1e64"), Some(0x68fd_1e64));
        assert_eq!(parse_hex(b"0A"), Some(10));
        assert_eq!(parse_hex(b"123456789"), None);
        assert_eq!(parse_hex(b"xyz"), None);
    }

    #[test]
    fn transform_is_the_reference_f32_log() {
        assert_eq!(log1p_clamped(0), 0.0);
        assert_eq!(log1p_clamped(-5), 0.0);
        assert_eq!(log1p_clamped(1), std::f32::consts::LN_2);
        // 2^24 + 1 rounds to 2^24 in f32 before the +1, as in numpy's float32 path.
        assert_eq!(
            log1p_clamped((1 << 24) + 1),
            ((1u32 << 24) as f32 + 1.0).ln()
        );
    }
}
