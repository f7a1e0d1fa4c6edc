//! numpy's `.npy` arrays and `.npz` archives, read with every count and size checked
//! before anything is allocated: shared by the reference-`.npz` reader
//! ([`crate::processed`]) and the ONNX front end's `--inputs` archives.
//!
//! - The header is parsed by a small bounded reader of its own (not a general
//!   Python-literal parser): at most [`MAX_HEADER_BYTES`] bytes, one flat dict with
//!   the keys `descr` (a plain type string such as `<f4`), `fortran_order` and
//!   `shape` (a tuple of at most [`MAX_DIMS`] integers); anything else (nested
//!   containers, structured dtypes) is refused in time linear in the header length.
//! - The element count is the checked product of the shape, and its byte size the
//!   checked product with the element size; it must equal the bytes the archive
//!   holds for the member (neither fewer nor more) before a value is read, and the
//!   payload is read in bounded chunks, so a short or long stream is an error too.
//! - [`duplicate_member`] finds two members of one name (the zip reader keeps only
//!   one of them).

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

/// The longest `.npy` header read (numpy's own reader refuses longer ones too).
pub const MAX_HEADER_BYTES: usize = 10_000;
/// The most dimensions an array may declare.
pub const MAX_DIMS: usize = 32;
/// The most elements preallocated before values are read (vectors grow past it as
/// the payload really arrives).
pub const PREALLOC_ELEMENTS: usize = 1 << 22;
const MAGIC: &[u8] = b"\x93NUMPY";
const CHUNK: usize = 1 << 16;

/// What is wrong with an array (the caller names the file and the member).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NpyError(String);

fn fail<T>(reason: impl Into<String>) -> Result<T, NpyError> {
    Err(NpyError(reason.into()))
}

/// The kind of an element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `b1`.
    Bool,
    /// `i1` .. `i8`.
    Int,
    /// `u1` .. `u8`.
    Uint,
    /// `f4`, `f8`.
    Float,
}

/// A parsed `.npy` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The type string as written (`<f4`).
    pub descr: String,
    /// The element kind.
    pub kind: Kind,
    /// Bytes per element.
    pub size: usize,
    /// Big-endian elements.
    pub big_endian: bool,
    /// Column-major (Fortran) order.
    pub fortran: bool,
    /// The declared shape.
    pub shape: Vec<u64>,
    /// Bytes of the preamble and header, before the payload.
    pub header_bytes: u64,
}

/// One element, widened.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// A bool or integer element.
    Int(i128),
    /// A float element.
    Float(f64),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(x) => write!(f, "{x}"),
            Value::Float(x) => write!(f, "{x}"),
        }
    }
}

impl Header {
    /// The element count: the checked product of the shape.
    pub fn elements(&self) -> Result<u64, NpyError> {
        self.shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .map_or_else(
                || fail(format!("shape {:?} overflows 64 bits", self.shape)),
                Ok,
            )
    }

    /// The payload's byte size: elements times element size, checked.
    pub fn payload_bytes(&self) -> Result<u64, NpyError> {
        let n = self.elements()?;
        n.checked_mul(self.size as u64).map_or_else(
            || {
                fail(format!(
                    "shape {:?} of {} overflows 64 bits in bytes",
                    self.shape, self.descr
                ))
            },
            Ok,
        )
    }

    /// Checks that the payload the header declares is exactly the `present` bytes
    /// the archive holds after the header; returns the element count.
    pub fn check_present(&self, present: u64) -> Result<usize, NpyError> {
        let want = self.payload_bytes()?;
        if want != present {
            let how = if want > present {
                "the payload is shorter"
            } else {
                "bytes past the declared shape"
            };
            return fail(format!(
                "shape {:?} of {} declares {want} payload bytes, {present} present ({how})",
                self.shape, self.descr
            ));
        }
        usize::try_from(self.elements()?).map_or_else(
            |_| {
                fail(format!(
                    "shape {:?} is too large for this machine",
                    self.shape
                ))
            },
            Ok,
        )
    }
}

/// Reads and checks a `.npy` preamble and header.
pub fn read_header(r: &mut impl Read) -> Result<Header, NpyError> {
    let mut pre = [0u8; 8];
    r.read_exact(&mut pre)
        .or_else(|e| fail(format!("not a .npy array (no preamble: {e})")))?;
    if &pre[..6] != MAGIC {
        return fail("not a .npy array (bad magic)");
    }
    let (len, pre_len) = match pre[6] {
        1 => {
            let mut b = [0u8; 2];
            r.read_exact(&mut b)
                .or_else(|e| fail(format!("truncated .npy preamble: {e}")))?;
            (usize::from(u16::from_le_bytes(b)), 10u64)
        }
        2 | 3 => {
            let mut b = [0u8; 4];
            r.read_exact(&mut b)
                .or_else(|e| fail(format!("truncated .npy preamble: {e}")))?;
            let n = u32::from_le_bytes(b);
            (usize::try_from(n).unwrap_or(usize::MAX), 12u64)
        }
        v => return fail(format!(".npy format version {v} is not supported")),
    };
    if len > MAX_HEADER_BYTES {
        return fail(format!(
            ".npy header of {len} bytes (at most {MAX_HEADER_BYTES} read)"
        ));
    }
    let mut text = vec![0u8; len];
    r.read_exact(&mut text)
        .or_else(|e| fail(format!(".npy header of {len} bytes is truncated: {e}")))?;
    let text = std::str::from_utf8(&text).or_else(|_| fail(".npy header is not text"))?;
    let mut h = parse_dict(text)?;
    h.header_bytes = pre_len + len as u64;
    Ok(h)
}

/// A cursor over the header text: no recursion, one pass.
struct Lex<'a> {
    s: &'a [u8],
    i: usize,
}

impl Lex<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        let hit = self.s.get(self.i) == Some(&c);
        self.i += usize::from(hit);
        hit
    }

    fn expect(&mut self, c: u8) -> Result<(), NpyError> {
        if self.eat(c) {
            return Ok(());
        }
        let got = self.s.get(self.i).map_or("the end".into(), |&b| {
            format!("`{}` at byte {}", char::from(b), self.i)
        });
        fail(format!(
            ".npy header: expected `{}`, found {got}",
            char::from(c)
        ))
    }

    fn string(&mut self) -> Result<&str, NpyError> {
        self.ws();
        let q = match self.s.get(self.i) {
            Some(&q @ (b'\'' | b'"')) => q,
            _ => return fail(format!(".npy header: expected a string at byte {}", self.i)),
        };
        let start = self.i + 1;
        let len = self.s[start..].iter().position(|&b| b == q);
        let Some(len) = len else {
            return fail(".npy header: unterminated string");
        };
        self.i = start + len + 1;
        std::str::from_utf8(&self.s[start..start + len]).or_else(|_| fail(".npy header: bad text"))
    }

    fn word(&mut self) -> &str {
        self.ws();
        let start = self.i;
        while self
            .s
            .get(self.i)
            .is_some_and(|b| b.is_ascii_alphanumeric() || b"-+._".contains(b))
        {
            self.i += 1;
        }
        std::str::from_utf8(&self.s[start..self.i]).unwrap_or("")
    }

    fn shape(&mut self) -> Result<Vec<u64>, NpyError> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        while !self.eat(b')') {
            let w = self.word();
            let digits = w.strip_suffix('L').unwrap_or(w);
            let d = digits
                .parse::<u64>()
                .or_else(|_| fail(format!(".npy header: shape dimension `{w}` is not a count")))?;
            if dims.len() == MAX_DIMS {
                return fail(format!(".npy header: more than {MAX_DIMS} dimensions"));
            }
            dims.push(d);
            if !self.eat(b',') {
                self.expect(b')')?;
                break;
            }
        }
        Ok(dims)
    }
}

fn parse_dict(text: &str) -> Result<Header, NpyError> {
    let mut lx = Lex {
        s: text.as_bytes(),
        i: 0,
    };
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    lx.expect(b'{')?;
    while !lx.eat(b'}') {
        let key = lx.string()?.to_string();
        lx.expect(b':')?;
        match key.as_str() {
            "descr" => descr = Some(lx.string()?.to_string()),
            "fortran_order" => {
                fortran = Some(match lx.word() {
                    "True" => true,
                    "False" => false,
                    w => return fail(format!(".npy header: fortran_order `{w}` is not a bool")),
                })
            }
            "shape" => shape = Some(lx.shape()?),
            k => return fail(format!(".npy header: unknown key `{k}`")),
        }
        if !lx.eat(b',') {
            lx.expect(b'}')?;
            break;
        }
    }
    if !text[lx.i..].trim().is_empty() {
        return fail(".npy header: text after the dict");
    }
    let (Some(descr), Some(fortran), Some(shape)) = (descr, fortran, shape) else {
        return fail(".npy header: needs descr, fortran_order and shape");
    };
    let (kind, size, big_endian) = type_str(&descr)?;
    Ok(Header {
        descr,
        kind,
        size,
        big_endian,
        fortran,
        shape,
        header_bytes: 0,
    })
}

fn type_str(descr: &str) -> Result<(Kind, usize, bool), NpyError> {
    let b = descr.as_bytes();
    let unsupported = || fail(format!("unsupported dtype `{descr}`"));
    let (big, rest) = match b.first() {
        Some(b'<' | b'|' | b'=') => (false, &b[1..]),
        Some(b'>') => (true, &b[1..]),
        _ => (false, b),
    };
    let (kind, sizes): (Kind, &[usize]) = match rest.first() {
        Some(b'b') => (Kind::Bool, &[1]),
        Some(b'i') => (Kind::Int, &[1, 2, 4, 8]),
        Some(b'u') => (Kind::Uint, &[1, 2, 4, 8]),
        Some(b'f') => (Kind::Float, &[4, 8]),
        _ => return unsupported(),
    };
    let size = std::str::from_utf8(&rest[1..])
        .ok()
        .and_then(|s| s.parse::<usize>().ok());
    match size {
        Some(n) if sizes.contains(&n) => Ok((kind, n, big)),
        _ => unsupported(),
    }
}

fn decode(h: &Header, b: &[u8]) -> Value {
    macro_rules! num {
        ($t:ty) => {{
            let a = b.try_into().unwrap_or_default();
            if h.big_endian {
                <$t>::from_be_bytes(a)
            } else {
                <$t>::from_le_bytes(a)
            }
        }};
    }
    match (h.kind, h.size) {
        (Kind::Bool, _) => Value::Int(i128::from(b[0] != 0)),
        (Kind::Int, 1) => Value::Int(i128::from(num!(i8))),
        (Kind::Int, 2) => Value::Int(i128::from(num!(i16))),
        (Kind::Int, 4) => Value::Int(i128::from(num!(i32))),
        (Kind::Int, _) => Value::Int(i128::from(num!(i64))),
        (Kind::Uint, 1) => Value::Int(i128::from(b[0])),
        (Kind::Uint, 2) => Value::Int(i128::from(num!(u16))),
        (Kind::Uint, 4) => Value::Int(i128::from(num!(u32))),
        (Kind::Uint, _) => Value::Int(i128::from(num!(u64))),
        (Kind::Float, 4) => Value::Float(f64::from(num!(f32))),
        (Kind::Float, _) => Value::Float(num!(f64)),
    }
}

/// Reads the `count` elements of a payload (from [`Header::check_present`]) in
/// bounded chunks, calling `f` with each element's index and value; a stream that
/// ends early or goes on past them is an error.
pub fn read_payload<E>(
    r: &mut impl Read,
    h: &Header,
    count: usize,
    mut f: impl FnMut(usize, Value) -> Result<(), E>,
) -> Result<(), PayloadError<E>> {
    let per_chunk = CHUNK / h.size;
    let mut buf = vec![0u8; per_chunk * h.size];
    let mut done = 0usize;
    while done < count {
        let k = per_chunk.min(count - done);
        let bytes = &mut buf[..k * h.size];
        r.read_exact(bytes).map_err(|e| {
            PayloadError::Npy(NpyError(format!(
                "payload ends early: {e} (element {done} of {count})"
            )))
        })?;
        for (j, b) in bytes.chunks_exact(h.size).enumerate() {
            f(done + j, decode(h, b)).map_err(PayloadError::Value)?;
        }
        done += k;
    }
    let mut one = [0u8; 1];
    match r.read(&mut one) {
        Ok(0) => Ok(()),
        Ok(_) => Err(PayloadError::Npy(NpyError(format!(
            "bytes past the declared shape {:?}",
            h.shape
        )))),
        Err(e) => Err(PayloadError::Npy(NpyError(e.to_string()))),
    }
}

/// Reads a member's header and checks its shape against the `declared` bytes the
/// archive holds for the whole member; returns the header and the element count.
pub fn read_checked_header(r: &mut impl Read, declared: u64) -> Result<(Header, usize), NpyError> {
    let h = read_header(r)?;
    let count = h.check_present(declared.saturating_sub(h.header_bytes))?;
    Ok((h, count))
}

/// Reads the `count` elements of a payload into a vector of `conv`'s results
/// (preallocating at most [`PREALLOC_ELEMENTS`]).
pub fn read_vec<T, E>(
    r: &mut impl Read,
    h: &Header,
    count: usize,
    mut conv: impl FnMut(usize, Value) -> Result<T, E>,
) -> Result<Vec<T>, PayloadError<E>> {
    let mut out = Vec::with_capacity(count.min(PREALLOC_ELEMENTS));
    read_payload(r, h, count, |i, v| {
        out.push(conv(i, v)?);
        Ok(())
    })?;
    Ok(out)
}

/// Why [`read_payload`] stopped: the array itself, or `f`'s error.
#[derive(Debug)]
pub enum PayloadError<E> {
    /// The stream is wrong.
    Npy(NpyError),
    /// `f` refused a value.
    Value(E),
}

/// The first name two central-directory entries of a zip archive share, if any
/// (`entries` is what the zip reader kept; `dir_start` where its central directory
/// starts in `r`). Reads at most `entries + 1` entries.
pub fn duplicate_member(
    r: &mut (impl Read + Seek),
    dir_start: u64,
    entries: usize,
) -> std::io::Result<Option<String>> {
    r.seek(SeekFrom::Start(dir_start))?;
    let mut seen = HashSet::new();
    let mut fixed = [0u8; 46];
    for _ in 0..=entries {
        if r.read_exact(&mut fixed).is_err() || fixed[..4] != [0x50, 0x4b, 0x01, 0x02] {
            break;
        }
        let le = |i: usize| u64::from(u16::from_le_bytes([fixed[i], fixed[i + 1]]));
        let mut name = vec![0u8; le(28) as usize];
        r.read_exact(&mut name)?;
        let name = String::from_utf8_lossy(&name).into_owned();
        r.seek(SeekFrom::Current((le(30) + le(32)) as i64))?;
        if !seen.insert(name.clone()) {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

/// A version-1 `.npy` of the header text `dict` (padded as numpy pads it) and
/// `payload`, unchecked: for tests and tools writing raw or deliberately odd arrays.
/// `None` when the header is longer than a version-1 header can be.
pub fn raw_npy(dict: &str, payload: &[u8]) -> Option<Vec<u8>> {
    let mut h = dict.to_string();
    while !(10 + h.len() + 1).is_multiple_of(64) {
        h.push(' ');
    }
    h.push('\n');
    let mut out = MAGIC.to_vec();
    out.extend([1, 0]);
    out.extend(u16::try_from(h.len()).ok()?.to_le_bytes());
    out.extend(h.as_bytes());
    out.extend(payload);
    Some(out)
}

/// Opens an `.npz` archive, refusing one with two members of one name.
pub fn open_npz(path: &Path) -> Result<zip::ZipArchive<BufReader<File>>, NpyError> {
    let open = || File::open(path).or_else(|e| fail(format!("cannot open: {e}")));
    let zip = zip::ZipArchive::new(BufReader::new(open()?))
        .or_else(|e| fail(format!("not a zip archive: {e}")))?;
    let mut r = BufReader::new(open()?);
    match duplicate_member(&mut r, zip.central_directory_start(), zip.len()) {
        Ok(None) => Ok(zip),
        Ok(Some(name)) => fail(format!(
            "two arrays named `{}` ({name} twice)",
            name.trim_end_matches(".npy")
        )),
        Err(e) => fail(format!("cannot read the zip directory: {e}")),
    }
}

#[cfg(test)]
#[path = "npy_tests.rs"]
mod tests;
