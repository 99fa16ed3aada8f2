//! Whether one LM step is worth a second thread, decided once per step from its size.
//!
//! A parallel region started from a thread outside rayon's pool (the coder's thread) injects a
//! job, wakes a pool thread and puts the caller to sleep until the job is done: two context
//! switches, a few tens of microseconds on a quiet machine and up to a scheduler time slice on
//! a busy one. A decoder's step with the shipped model (one word: 1–3 tokens, one table) does
//! about 7M multiply-adds and one 50,257-entry scan, a few hundred microseconds on one core;
//! with a region per operation it paid those switches a dozen times per word (a third of the
//! decode's time went to the kernel scheduler). So a step is either
//!
//! - **serial**: every kernel runs on the calling thread (rayon's iterators with a minimum
//!   length above their length never split, so they run in place and wake nobody), or
//! - **parallel**: the whole step runs as one job on the pool ([`Split::run`]), where the
//!   kernels' own regions are cheap local joins between pool threads.
//!
//! The choice only moves work between threads; every kernel gives the same integers either
//! way (the parity tests run both).

use crate::backend::lm::Item;
use crate::format::lm::model_file::Model;

/// Estimated multiply-adds (see [`Split::for_step`]) from which a step runs on every thread.
/// About two tables of the shipped model (d = 128), or one token of a GPT-2-small shape
/// (d = 768: 85M in its layers alone): measured in docs/BENCHMARKS.md, branch lmstep.
pub const PARALLEL_MACS: u64 = 12 << 20;

/// How one step spreads its work (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    parallel: bool,
}

impl Split {
    /// Everything on the calling thread.
    pub const SERIAL: Split = Split { parallel: false };
    /// Every kernel split over the pool.
    pub const PARALLEL: Split = Split { parallel: true };

    /// The split for running `items` (positions from `lens`, each sequence's cache length):
    /// parallel when the step's work reaches [`PARALLEL_MACS`] and the pool has more than one
    /// thread. The work counts each item's matmuls (12 d² per layer) and attention (2 d per
    /// cached position per layer), and each table's head (vocab × d) and scan over the
    /// vocabulary (weighted as 16 multiply-adds per token: ByGap and the prefix sums read each
    /// token's logit three times, at random in the sums).
    pub fn for_step(model: &Model, items: &[Item], lens: &[usize]) -> Split {
        if rayon::current_num_threads() < 2 {
            return Split::SERIAL;
        }
        let c = &model.config;
        let (d, nl, v) = (c.n_embd as u64, c.n_layer as u64, c.vocab as u64);
        let mut next: Vec<u64> = lens.iter().map(|&l| l as u64).collect();
        let mut macs = 0u64;
        for it in items {
            let pos = next.get_mut(it.seq).map_or(0, |p| {
                *p += 1;
                *p
            });
            macs += nl * (12 * d * d + 2 * d * pos);
            if it.query.is_some() {
                macs += v * (d + 16);
            }
            if macs >= PARALLEL_MACS {
                return Split::PARALLEL;
            }
        }
        Split::SERIAL
    }

    pub fn is_parallel(self) -> bool {
        self.parallel
    }

    /// The shortest piece a rayon iterator may be cut into: `min` in a parallel step, and
    /// more than any length in a serial one (the iterator then runs whole on this thread).
    pub fn min_len(self, min: usize) -> usize {
        if self.parallel {
            min.max(1)
        } else {
            usize::MAX
        }
    }

    /// The threads a kernel may divide its work between.
    pub fn threads(self) -> usize {
        if self.parallel {
            rayon::current_num_threads().max(1)
        } else {
            1
        }
    }

    /// Run the step `f`: on this thread when serial, as one job on the pool when parallel
    /// (in place if this thread is already one of the pool's).
    pub fn run<R: Send>(self, f: impl FnOnce() -> R + Send) -> R {
        if self.parallel {
            rayon::scope(|_| f())
        } else {
            f()
        }
    }
}
