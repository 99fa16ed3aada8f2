//! Where the encoder's passes find each chunk's residuals: the w-bit displacement of every
//! element and its reference facts (exponent class, sign, top two mantissa bits), two
//! bytes. The CPU encoder keeps no whole tensor's: each pass (histogram, lanes) computes a
//! chunk's into its thread's scratch as it comes to it. Two whole-tensor buffers (26 MB for
//! the bf16 GPT-2 embedding, 39 MB for fp32) were new memory in every one-shot encode (37%
//! of its page faults), written once and read twice; computing a chunk's again costs a few
//! vector operations per element over the two inputs, read in their place
//! (docs/BENCHMARKS.md).

use std::cell::RefCell;
use std::ops::Range;

use super::word::Word;

/// A tensor's residuals, chunk by chunk.
pub trait Residuals<T: Word>: Sync {
    /// How many elements.
    fn elements(&self) -> usize;
    /// `f` of the displacements and facts of elements `r` (a chunk of
    /// `format::chunk::chunk_ranges`).
    fn chunk<R>(&self, r: Range<usize>, f: impl FnOnce(&[T], &[u16]) -> R) -> R;
}

/// Residuals held whole (the tests' reference counts).
#[cfg(test)]
impl<T: Word> Residuals<T> for (&[T], &[u16]) {
    fn elements(&self) -> usize {
        self.0.len().min(self.1.len())
    }
    fn chunk<R>(&self, r: Range<usize>, f: impl FnOnce(&[T], &[u16]) -> R) -> R {
        f(&self.0[r.clone()], &self.1[r])
    }
}

thread_local! {
    /// Displacements (as 64-bit words, cast to the element width) and facts.
    static SCRATCH: RefCell<(Vec<u64>, Vec<u16>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `f` with room for `n` elements' displacements and facts: this thread's, kept from chunk
/// to chunk (taken out while `f` runs, so a nested use, should `f` ever yield to the pool,
/// gets room of its own instead of a borrow panic).
pub fn with_room<T: Word, R>(n: usize, f: impl FnOnce(&mut [T], &mut [u16]) -> R) -> R {
    let (mut words, mut info) = SCRATCH.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let need = (n * T::SIZE).div_ceil(8);
    if words.len() < need {
        words.resize(need, 0);
    }
    if info.len() < n {
        info.resize(n, 0);
    }
    let d = &mut bytemuck::cast_slice_mut::<u64, T>(&mut words)[..n];
    let out = f(d, &mut info[..n]);
    SCRATCH.with(|s| *s.borrow_mut() = (words, info));
    out
}
