//! lockstep: lossless compression of checkpoint trajectories (ULP-residual delta codec) and of
//! text (integer-only GPT-2 driving a range coder), producing identical bytes on every backend.
//!
//! Start reading at [`delta`]: the CPU reference codec every other backend must match.

// The coding kernels index several parallel per-lane arrays with one lane index, and their
// entry points take each stream explicitly: rewriting either as clippy suggests hides the
// lane structure the format documents.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

pub mod error;
pub mod lm;

pub use error::{Error, Result};
pub mod anchor;
pub mod archive;
pub mod backend;
pub mod baseline;
pub mod bytes;
pub mod checkpoint;
pub mod delta;
pub mod dtype;
pub mod entropy;
pub mod float;
pub mod format;
pub mod memory;
pub mod output;

/// The unit tests' random numbers: Knuth's MMIX linear congruential generator from `seed`,
/// its whole state after each step (callers take the bits they want).
#[cfg(test)]
pub(crate) fn test_lcg(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x
    }
}
