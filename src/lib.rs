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
