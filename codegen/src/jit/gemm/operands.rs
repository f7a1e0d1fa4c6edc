//! The GEMM core's operand views: [`Operand`] (an `A` or mask, f32 or bf16)
//! and [`OutBuf`] (a result, possibly not yet initialised).

use super::Elt;
use half::bf16;
use std::mem::MaybeUninit;

/// A GEMM operand: f32 or bf16 elements.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// bf16 elements.
    BF16(&'a [bf16]),
}

impl Operand<'_> {
    /// The element type.
    pub(crate) fn elt(&self) -> Elt {
        match self {
            Operand::F32(_) => Elt::F32,
            Operand::BF16(_) => Elt::BF16,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Operand::F32(v) => v.len(),
            Operand::BF16(v) => v.len(),
        }
    }

    pub(crate) fn ptr_at(&self, elem: usize) -> *const u8 {
        match self {
            Operand::F32(v) => v[elem..].as_ptr().cast(),
            Operand::BF16(v) => v[elem..].as_ptr().cast(),
        }
    }
}

/// A GEMM result: f32 or bf16 elements, initialised or not. The kernels only
/// ever write it, so an uninitialised buffer is as good as a zeroed one for a
/// kernel that writes all of it (the blocked GEMM ops, [`crate::jit::brgemm`], skip
/// zeroing their results this way).
#[derive(Debug)]
pub enum OutBuf<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// bf16 elements.
    BF16(&'a mut [bf16]),
    /// f32 elements not yet initialised.
    F32Uninit(&'a mut [MaybeUninit<f32>]),
    /// bf16 elements not yet initialised.
    BF16Uninit(&'a mut [MaybeUninit<bf16>]),
}

impl<'a> OutBuf<'a> {
    pub(crate) fn elt(&self) -> Elt {
        match self {
            OutBuf::F32(_) | OutBuf::F32Uninit(_) => Elt::F32,
            OutBuf::BF16(_) | OutBuf::BF16Uninit(_) => Elt::BF16,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            OutBuf::F32(v) => v.len(),
            OutBuf::BF16(v) => v.len(),
            OutBuf::F32Uninit(v) => v.len(),
            OutBuf::BF16Uninit(v) => v.len(),
        }
    }

    /// The first element, for the generated code to write through.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            OutBuf::F32(v) => v.as_mut_ptr().cast(),
            OutBuf::BF16(v) => v.as_mut_ptr().cast(),
            OutBuf::F32Uninit(v) => v.as_mut_ptr().cast(),
            OutBuf::BF16Uninit(v) => v.as_mut_ptr().cast(),
        }
    }

    /// The buffer as initialised, in its element type.
    ///
    /// # Safety
    /// Every element has been written.
    pub(crate) unsafe fn written(&mut self) -> crate::jit::brgemm::Written<'_> {
        use crate::jit::brgemm::Written;
        match self {
            OutBuf::F32(v) => Written::F32(v),
            OutBuf::BF16(v) => Written::BF16(v),
            // SAFETY: the caller's promise: every element is initialised, and
            // `MaybeUninit<T>` has `T`'s layout.
            OutBuf::F32Uninit(v) => Written::F32(unsafe {
                &mut *(std::ptr::from_mut::<[MaybeUninit<f32>]>(*v) as *mut [f32])
            }),
            // SAFETY: as above.
            OutBuf::BF16Uninit(v) => Written::BF16(unsafe {
                &mut *(std::ptr::from_mut::<[MaybeUninit<bf16>]>(*v) as *mut [bf16])
            }),
        }
    }

    /// The same buffer, borrowed for a shorter time.
    pub(crate) fn reborrow(&mut self) -> OutBuf<'_> {
        match self {
            OutBuf::F32(v) => OutBuf::F32(v),
            OutBuf::BF16(v) => OutBuf::BF16(v),
            OutBuf::F32Uninit(v) => OutBuf::F32Uninit(v),
            OutBuf::BF16Uninit(v) => OutBuf::BF16Uninit(v),
        }
    }

    /// The first `len` elements (all of them if fewer).
    pub(crate) fn prefix(self, len: usize) -> OutBuf<'a> {
        let len = len.min(self.len());
        match self {
            OutBuf::F32(v) => OutBuf::F32(&mut v[..len]),
            OutBuf::BF16(v) => OutBuf::BF16(&mut v[..len]),
            OutBuf::F32Uninit(v) => OutBuf::F32Uninit(&mut v[..len]),
            OutBuf::BF16Uninit(v) => OutBuf::BF16Uninit(&mut v[..len]),
        }
    }

    /// Consecutive disjoint chunks of the given lengths (each at most what is
    /// left; the rest, if any, is dropped).
    pub(crate) fn split_lens(self, lens: &[usize]) -> Vec<OutBuf<'a>> {
        fn cut<'a, T>(
            mut v: &'a mut [T],
            lens: &[usize],
            f: fn(&'a mut [T]) -> OutBuf<'a>,
        ) -> Vec<OutBuf<'a>> {
            lens.iter()
                .map(|&l| {
                    let mid = l.min(v.len());
                    let (head, rest) = std::mem::take(&mut v).split_at_mut(mid);
                    v = rest;
                    f(head)
                })
                .collect()
        }
        match self {
            OutBuf::F32(v) => cut(v, lens, OutBuf::F32),
            OutBuf::BF16(v) => cut(v, lens, OutBuf::BF16),
            OutBuf::F32Uninit(v) => cut(v, lens, OutBuf::F32Uninit),
            OutBuf::BF16Uninit(v) => cut(v, lens, OutBuf::BF16Uninit),
        }
    }

    /// Consecutive disjoint chunks of `len` elements (the last may be shorter).
    pub(crate) fn chunks(self, len: usize) -> Vec<OutBuf<'a>> {
        let len = len.max(1);
        match self {
            OutBuf::F32(v) => v.chunks_mut(len).map(OutBuf::F32).collect(),
            OutBuf::BF16(v) => v.chunks_mut(len).map(OutBuf::BF16).collect(),
            OutBuf::F32Uninit(v) => v.chunks_mut(len).map(OutBuf::F32Uninit).collect(),
            OutBuf::BF16Uninit(v) => v.chunks_mut(len).map(OutBuf::BF16Uninit).collect(),
        }
    }
}
