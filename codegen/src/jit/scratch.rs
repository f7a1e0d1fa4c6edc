//! Reusable per-thread f32 buffers for the operands the GEMM ops pack on every
//! call (`wᵀ` panels, `dz` panels, `xᵀ` tiles, weight panels). Once a step has
//! run, taking one allocates nothing and zeroes nothing — so whoever fills a
//! [`Scratch`] writes every element it hands to a kernel (padding included).

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

/// Buffers a thread keeps for reuse.
const KEEP: usize = 8;

thread_local! {
    static POOL: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// `len` f32 from this thread's pool, returned to the pool of the thread that
/// drops it. The contents are unspecified (zeros, or an earlier use's values).
pub(crate) struct Scratch {
    buf: Vec<f32>,
    len: usize,
}

impl Scratch {
    pub(crate) fn new(len: usize) -> Scratch {
        let mut buf = POOL.with_borrow_mut(|pool| {
            // The smallest buffer that holds `len`, else the largest (grown).
            let fit = (0..pool.len())
                .filter(|&i| pool[i].len() >= len)
                .min_by_key(|&i| pool[i].len())
                .or_else(|| (0..pool.len()).max_by_key(|&i| pool[i].len()));
            fit.map(|i| pool.swap_remove(i)).unwrap_or_default()
        });
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        Scratch { buf, len }
    }
}

impl Deref for Scratch {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.buf[..self.len]
    }
}

impl DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.buf[..self.len]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        // `try_with`: a thread being torn down just frees the buffer.
        let _ = POOL.try_with(|pool| {
            if let Ok(mut pool) = pool.try_borrow_mut() {
                if pool.len() < KEEP {
                    pool.push(buf);
                } else if let Some(small) = pool.iter_mut().min_by_key(|b| b.len())
                    && small.len() < buf.len()
                {
                    *small = buf;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::Scratch;

    #[test]
    fn buffers_are_reused_and_sized() {
        let first = {
            let mut s = Scratch::new(1000);
            s.fill(7.0);
            s.as_ptr()
        };
        let s = Scratch::new(600);
        assert_eq!(s.len(), 600);
        assert_eq!(s.as_ptr(), first, "the pooled buffer is reused");
        let t = Scratch::new(2000);
        assert_eq!(t.len(), 2000);
        assert_ne!(t.as_ptr(), s.as_ptr());
    }
}
