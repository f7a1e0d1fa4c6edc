//! The vector operations the row kernels' loops are written on, one
//! implementation per vector width ([`super::avx512`]'s and
//! [`super::avx2`]'s): the bag loop ([`super::bag`]) and the update's run
//! loop ([`super::update`]) are generic over [`Width`], and each width
//! instantiates them inside its own `#[target_feature]` functions
//! ([`Width::cols`], [`Width::run_cols`]), so the operations
//! (`#[inline(always)]`) compile to that width's instructions there.

use super::{BagArgs, RunArgs};

/// One vector width's operations on f32 vectors.
///
/// # Safety (every method)
/// The CPU has the width's features, and the caller is compiled with them
/// (the methods are inlined into [`Width::cols`] and [`Width::run_cols`]).
pub(super) trait Width {
    /// Lanes per vector.
    const LANES: usize;
    /// A vector of [`Width::LANES`] f32.
    type V: Copy;
    /// The lanes a load or store touches (a mask, or a count).
    type Part: Copy;
    /// The first `n` lanes (`1 <= n <= LANES`).
    unsafe fn part(n: usize) -> Self::Part;
    /// All lanes 0.
    unsafe fn zero() -> Self::V;
    /// All lanes `x`.
    unsafe fn splat(x: f32) -> Self::V;
    /// `a + b`.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `a - b`.
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// `a · b`.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `a / b`.
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    /// `a · b + c`, rounded once.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// The `part` bytes at `p` as f32 (the others 0). `p` holds them.
    unsafe fn load_u8(p: *const u8, part: Self::Part) -> Self::V;
    /// The `part` elements at `p` as f32 (the others 0): bf16 (`BF`) widened
    /// exactly, else f32. `p` holds them.
    unsafe fn load<const BF: bool>(p: *const u8, part: Self::Part) -> Self::V;
    /// Stores `x`'s `part` lanes at `p`: rounded to bf16 (`bf`), else f32.
    /// `p` holds them.
    unsafe fn store(bf: bool, p: *mut u8, x: Self::V, part: Self::Part);
    /// The `part` stored weights at element `off` of a table row as f32 (the
    /// others 0): with `split`, each joined from its bf16 high half at `hi`
    /// and low half at `lo`, else the f32 at `hi`. The row holds them.
    unsafe fn load_w(
        split: bool,
        hi: *mut u8,
        lo: *mut u8,
        off: usize,
        part: Self::Part,
    ) -> Self::V;
    /// Stores the `part` lanes of `w` back where [`Width::load_w`] read them
    /// (`split`: the two halves, exact). The row holds them.
    unsafe fn store_w(
        split: bool,
        w: Self::V,
        hi: *mut u8,
        lo: *mut u8,
        off: usize,
        part: Self::Part,
    );
    /// [`super::bag::bag_cols`] of this width, `NV` vectors and table type
    /// `T`, compiled with the width's features; the contract is
    /// [`super::bag::bag_cols`]'s.
    unsafe fn cols<const NV: usize, const T: u8>(
        a: &BagArgs,
        se: (usize, usize),
        out: *mut u8,
        cc: (usize, usize),
    );
    /// [`super::update::run_cols`] of this width and `NV` vectors, compiled
    /// with the width's features; the contract is
    /// [`super::update::run_cols`]'s.
    unsafe fn run_cols<const NV: usize>(
        a: &RunArgs,
        ent: *const [i64; 2],
        run: (usize, usize, usize),
        bag: (usize, f32),
        cc: (usize, usize),
    );
    /// Does a pass of the update ([`super::update::run`]) in a way of the
    /// width's own when it has one for this table and returns true, else
    /// returns false ([`Width::run_cols`] does it). The arguments and the
    /// contract are [`Width::run_cols`]'s, with any `cols` up to
    /// `8·LANES`.
    unsafe fn own_pass(
        _a: &RunArgs,
        _ent: *const [i64; 2],
        _run: (usize, usize, usize),
        _bag: (usize, f32),
        _cc: (usize, usize),
    ) -> bool {
        false
    }
}
