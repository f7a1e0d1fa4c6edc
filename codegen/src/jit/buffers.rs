//! Buffers of the kernels that are not zeroed before use:
//! - [`Fresh`]: a result the kernels write whole, allocated but not
//!   initialised (zeroing a multi-MiB result is a serial pass over memory: it
//!   took ~12% of a 2048×512×512 `brgemm`);
//! - [`Scratch`]: reusable per-thread f32 buffers for the operands the GEMM ops
//!   pack on every call (`wᵀ` panels, `dz` panels, `xᵀ` tiles, weight panels).
//!   Once a step has run, taking one allocates nothing and zeroes nothing — so
//!   whoever fills a [`Scratch`] writes every element it hands to a kernel
//!   (padding included).

use super::gemm::{Elt, OutBuf};
use dlrm_ir::{Data, Tensor};
use half::bf16;
use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::ops::{Deref, DerefMut};

/// A float result (f32 or bf16 elements).
pub(crate) enum Floats {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
}

impl Floats {
    pub(crate) fn zeros(elt: Elt, n: usize) -> Floats {
        match elt {
            Elt::F32 => Floats::F32(vec![0.0; n]),
            Elt::BF16 => Floats::BF16(vec![bf16::ZERO; n]),
        }
    }

    pub(crate) fn data(self) -> Data {
        match self {
            Floats::F32(v) => Data::F32(v),
            Floats::BF16(v) => Data::BF16(v),
        }
    }

    pub(crate) fn tensor(self, shape: Vec<usize>) -> Tensor {
        Tensor {
            shape,
            data: self.data(),
        }
    }
}

/// A result not yet written: handed to kernels as an uninitialised
/// [`OutBuf`], and back as [`Floats`] once they have written every element
/// ([`Fresh::assume_init`]). Debug builds fill it with NaN, so an element a
/// kernel left unwritten shows in the tests.
pub(crate) enum Fresh {
    F32(Vec<MaybeUninit<f32>>),
    BF16(Vec<MaybeUninit<bf16>>),
}

impl Fresh {
    pub(crate) fn new(elt: Elt, n: usize) -> Fresh {
        fn uninit<T: Copy>(n: usize, debug_fill: T) -> Vec<MaybeUninit<T>> {
            let mut v = Vec::with_capacity(n);
            if cfg!(debug_assertions) {
                v.resize(n, MaybeUninit::new(debug_fill));
            } else {
                // SAFETY: `MaybeUninit` needs no initialisation; the capacity is `n`.
                unsafe { v.set_len(n) };
            }
            v
        }
        match elt {
            Elt::F32 => Fresh::F32(uninit(n, f32::NAN)),
            Elt::BF16 => Fresh::BF16(uninit(n, bf16::NAN)),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Fresh::F32(v) => v.len(),
            Fresh::BF16(v) => v.len(),
        }
    }

    pub(crate) fn buf(&mut self) -> OutBuf<'_> {
        match self {
            Fresh::F32(v) => OutBuf::F32Uninit(v),
            Fresh::BF16(v) => OutBuf::BF16Uninit(v),
        }
    }

    /// The buffer as initialised.
    ///
    /// # Safety
    /// Every element has been written.
    pub(crate) unsafe fn assume_init(self) -> Floats {
        fn init<T>(v: Vec<MaybeUninit<T>>) -> Vec<T> {
            let mut v = std::mem::ManuallyDrop::new(v);
            // SAFETY: the caller's promise: all `len` elements are initialised;
            // `MaybeUninit<T>` has `T`'s layout, so the allocation is reused as is.
            unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<T>(), v.len(), v.capacity()) }
        }
        match self {
            Fresh::F32(v) => Floats::F32(init(v)),
            Fresh::BF16(v) => Floats::BF16(init(v)),
        }
    }
}

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

/// A [`Fresh`] result that parallel tasks write in disjoint ranges: a GEMM
/// epilogue's second result, written chunk by chunk at the offsets of the
/// product's own chunks, which the GEMM drivers hand to one task each.
pub(crate) struct Disjoint<'a> {
    ptr: DisjointPtr,
    len: usize,
    _buf: std::marker::PhantomData<&'a mut Fresh>,
}

#[derive(Clone, Copy)]
enum DisjointPtr {
    F32(*mut MaybeUninit<f32>),
    BF16(*mut MaybeUninit<bf16>),
}

// SAFETY: the pointers are into a buffer borrowed mutably for `'a`, and the
// only access, [`Disjoint::range`], requires its callers' ranges not to overlap.
unsafe impl Send for Disjoint<'_> {}
// SAFETY: as above.
unsafe impl Sync for Disjoint<'_> {}

impl<'a> Disjoint<'a> {
    pub(crate) fn new(buf: &'a mut Fresh) -> Disjoint<'a> {
        let len = buf.len();
        let ptr = match buf {
            Fresh::F32(v) => DisjointPtr::F32(v.as_mut_ptr()),
            Fresh::BF16(v) => DisjointPtr::BF16(v.as_mut_ptr()),
        };
        Disjoint {
            ptr,
            len,
            _buf: std::marker::PhantomData,
        }
    }

    /// Elements `at..at + len` to write.
    ///
    /// # Safety
    /// No other range of this buffer that overlaps it is in use at the same time.
    ///
    /// # Panics
    /// If the range is not inside the buffer (a caller's arithmetic error).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn range(&self, at: usize, len: usize) -> crate::reference::cross::Out<'_> {
        use crate::reference::cross::Out;
        assert!(
            at.checked_add(len).is_some_and(|end| end <= self.len),
            "range {at}+{len} outside a result of {}",
            self.len
        );
        // SAFETY: in bounds (checked); not aliased (the caller's promise).
        unsafe {
            match self.ptr {
                DisjointPtr::F32(p) => Out::F32(std::slice::from_raw_parts_mut(p.add(at), len)),
                DisjointPtr::BF16(p) => Out::BF16(std::slice::from_raw_parts_mut(p.add(at), len)),
            }
        }
    }
}
