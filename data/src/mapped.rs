//! Files read through memory maps, guarded: a mapped file truncated under the
//! running job would make the next read of a page past its new end raise
//! `SIGBUS`, which kills the process without a word. Two guards:
//!
//! - [`Watched`]: the mapped files' sizes, checked with one `fstat` each by
//!   [`Watched::check`] (the dataset calls it before every batch it builds), so a
//!   changed file is an error naming it and both sizes;
//! - [`guard_sigbus`]: for a truncation that lands inside the short window of one
//!   batch's reads, a `SIGBUS` handler (installed once, process-wide) that writes
//!   one line naming the cause to stderr and exits with status 74 (`EX_IOERR`),
//!   instead of the signal's silent death.

use crate::error::{DataError, Result};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Once;

/// Open files and the sizes they were mapped at.
#[derive(Debug, Default)]
pub struct Watched {
    files: Vec<(PathBuf, File, u64)>,
}

impl Watched {
    /// Watches `file` at `path`, mapped at `bytes`.
    pub fn add(&mut self, path: &Path, file: File, bytes: u64) {
        self.files.push((path.to_path_buf(), file, bytes));
    }

    /// An error naming the first file whose size is no longer the mapped one.
    pub fn check(&self) -> Result<()> {
        for (p, f, bytes) in &self.files {
            let now = f.metadata().map_err(|e| DataError::io(p, e))?.len();
            if now != *bytes {
                return Err(DataError::dataset(
                    p,
                    format!(
                        "changed under the running job: mapped at {bytes} bytes, now {now} \
                         (a dataset must not be rewritten or truncated while a job reads it)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The line the `SIGBUS` handler writes.
const SIGBUS_MESSAGE: &[u8] = b"\nerror: a memory-mapped input file (a dataset or checkpoint) was \
truncated or rewritten while this job read it (SIGBUS); rerun once the file is whole\n";

extern "C" fn on_sigbus(_: libc::c_int) {
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is static.
    unsafe {
        libc::write(
            2,
            SIGBUS_MESSAGE.as_ptr().cast(),
            SIGBUS_MESSAGE.len() as libc::size_t,
        );
        libc::_exit(74);
    }
}

/// Installs the `SIGBUS` handler (see the module docs), once per process.
pub fn guard_sigbus() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed `sigaction` is a valid empty one; the handler only
        // calls async-signal-safe functions.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
    });
}
