//! Per-thread buffers for the attention's scores and weights, reused from call to call.
//!
//! A decode step runs the attention once per (sequence, head, layer): a few hundred calls per
//! step, each needing two buffers of `items x positions` values, a few KiB. Fresh `Vec`s for
//! them cost malloc / calloc / free on every call, and the calloc of a block that size makes
//! glibc consolidate its fast bins first (`malloc_consolidate`): ~3% of a tinygpt2 decode's
//! samples (docs/BENCHMARKS.md, lmstep). The calls run on the pool's threads, so the buffers
//! live with the thread, not with the session. Their contents between calls are whatever the
//! last call left: every user writes each element it reads first.

use std::cell::Cell;

thread_local! {
    static SCORES: Cell<Vec<i64>> = const { Cell::new(Vec::new()) };
    static WEIGHTS: Cell<Vec<i32>> = const { Cell::new(Vec::new()) };
}

/// This thread's score buffer (i64) and weight buffer (i32), taken until the guard drops;
/// their elements hold arbitrary earlier values. A second guard taken meanwhile on the same
/// thread (none today) gets fresh buffers, not the first one's.
pub struct Buffers {
    pub scores: Vec<i64>,
    pub weights: Vec<i32>,
}

impl Buffers {
    /// The buffers with at least `scores` and `weights` elements.
    pub fn take(scores: usize, weights: usize) -> Buffers {
        let mut b = Buffers {
            scores: SCORES.with(Cell::take),
            weights: WEIGHTS.with(Cell::take),
        };
        if b.scores.len() < scores {
            b.scores.resize(scores, 0);
        }
        if b.weights.len() < weights {
            b.weights.resize(weights, 0);
        }
        b
    }
}

impl Drop for Buffers {
    fn drop(&mut self) {
        SCORES.with(|c| c.set(std::mem::take(&mut self.scores)));
        WEIGHTS.with(|c| c.set(std::mem::take(&mut self.weights)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buffers are at least as long as asked, keep their storage between guards, and a
    /// guard taken while another lives gets buffers of its own.
    #[test]
    fn buffers_are_reused_and_not_shared_when_nested() {
        let first = {
            let mut b = Buffers::take(100, 50);
            assert!(b.scores.len() >= 100 && b.weights.len() >= 50);
            (b.scores[99], b.weights[49]) = (7, 9);
            {
                let mut inner = Buffers::take(10, 10);
                assert!(inner.scores.len() >= 10 && inner.weights.len() >= 10);
                inner.scores.fill(-1);
                inner.weights.fill(-1);
            }
            assert_eq!((b.scores[99], b.weights[49]), (7, 9));
            b.scores.as_ptr() as usize
        };
        // The outer guard's storage came back last (it replaced the inner one's).
        let b = Buffers::take(80, 20);
        assert_eq!(b.scores.as_ptr() as usize, first);
        assert_eq!((b.scores[99], b.weights[49]), (7, 9));
    }
}
