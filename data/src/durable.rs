//! Durable, atomic file-system writes shared by every on-disk format of dlrmc
//! (datasets here; plans and checkpoints in dlrm-runtime).
//!
//! The pattern: write everything into a temporary directory (or file) beside the
//! target — same parent, so the final rename stays on one file system — fsync each
//! file and the directory, then rename into place and fsync the parent. A crash
//! leaves either the old target or the new one, never a half-written one.
//!
//! Errors are plain [`std::io::Error`]s; callers attach the path in their own
//! error type.

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// fsyncs a directory (its entries: creations, renames).
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir).and_then(|d| d.sync_all())
}

/// Creates (or truncates) `path`, writes `bytes` and fsyncs the file.
pub fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Writes `bytes` to `path` atomically: a synced temporary file beside it renamed
/// over it, then the parent directory synced.
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let parent = parent_of(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    write_synced(&tmp, bytes)?;
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(&parent)
}

/// The directory `path` lives in (`.` for a bare name).
pub fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A new, uniquely named temporary directory beside `target`
/// (`.<target name>.tmp-XXXX` in the same parent, created if needed); dropped, it
/// is removed with its contents.
pub fn temp_dir_beside(target: &Path) -> io::Result<tempfile::TempDir> {
    let parent = parent_of(target);
    std::fs::create_dir_all(&parent)?;
    let base = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "dir".into());
    tempfile::Builder::new()
        .prefix(&format!(".{base}.tmp-"))
        .tempdir_in(&parent)
}

/// Renames the finished directory `new_dir` to `target` (same parent). An existing
/// `target` is moved aside first and removed only once the new one is in place; if
/// the rename in fails, the old one is put back and `new_dir` stays where it was.
/// Syncs the parent directory at the end.
pub fn replace_dir(new_dir: &Path, target: &Path) -> io::Result<()> {
    let parent = parent_of(target);
    let old = if std::fs::symlink_metadata(target).is_ok() {
        let aside = tempfile::Builder::new()
            .prefix(".old-")
            .tempdir_in(&parent)?;
        let old = aside.path().join("old");
        std::fs::rename(target, &old)?;
        Some((aside, old))
    } else {
        None
    };
    if let Err(e) = std::fs::rename(new_dir, target) {
        if let Some((_, old)) = &old {
            let _ = std::fs::rename(old, target);
        }
        return Err(e);
    }
    sync_dir(&parent)?;
    // `aside` (and the old directory in it) is removed on drop.
    drop(old);
    Ok(())
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// SHA-256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Size and SHA-256 (lower-case hex) of a file, streamed.
pub fn hash_file(p: &Path) -> io::Result<(u64, String)> {
    let mut f = File::open(p)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok((bytes, hex(&h.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_dir_swaps_and_atomic_file_overwrites() {
        let root = tempfile::tempdir().expect("tempdir");
        let target = root.path().join("t");
        let a = temp_dir_beside(&target).expect("tmp");
        write_synced(&a.path().join("f"), b"one").expect("write");
        replace_dir(&a.keep(), &target).expect("first");
        let b = temp_dir_beside(&target).expect("tmp");
        write_synced(&b.path().join("f"), b"two").expect("write");
        replace_dir(&b.keep(), &target).expect("second");
        assert_eq!(std::fs::read(target.join("f")).expect("read"), b"two");
        let names: Vec<_> = std::fs::read_dir(root.path()).expect("ls").collect();
        assert_eq!(names.len(), 1, "only the target is left");
        let p = root.path().join("latest");
        write_file_atomic(&p, b"x").expect("atomic");
        write_file_atomic(&p, b"y").expect("atomic");
        assert_eq!(std::fs::read(&p).expect("read"), b"y");
        assert_eq!(hash_file(&p).expect("hash").0, 1);
    }
}
