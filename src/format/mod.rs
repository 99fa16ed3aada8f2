//! Format facts shared by every device and by the host side of both codecs: what the bytes
//! mean, never how fast they are made. Backends (`crate::backend`) build on this module; the
//! codecs (`crate::delta`, `crate::lm`) build on backends and on this; nothing here imports
//! either (docs/ARCHITECTURE.md draws the direction).
//!
//! - [`symbols`]: element pair -> (b, q1, q2, sign, tail) in the Paper, Signed and Joint
//!   layouts, and back.
//! - [`tables`]: stages, context spaces, histograms, table selection and table bytes.
//! - [`bits`]: the one LSB-first bit packer (raw tails of both float codecs).
//! - [`chunk`]: chunk and lane constants, the fixed coding order of a chunk (the readable rANS
//!   lanes and raw tails), encoded and decoded chunk types.
//! - [`lm`]: the integer GPT-2's model file (`.lsm`) and fixed-point arithmetic.

pub mod bits;
pub mod chunk;
pub mod lm;
pub mod symbols;
pub mod tables;

use crate::Result;
use chunk::LANES;
use symbols::{Layout, JOINT_MAX_WIDTH};
use tables::{Space, Stage, STAGES};

/// The stages a layout codes, in decoding order.
pub fn layout_stages(layout: Layout) -> &'static [Stage] {
    match layout {
        Layout::Paper => &STAGES[..3],
        Layout::Signed => &STAGES,
        Layout::Joint => &[Stage::J],
    }
}

/// The stage spaces of `layout` for `width`-bit floats: B and S in their neighbor forms when
/// a neighbor `distance` is given.
pub fn layout_spaces(layout: Layout, width: u32, distance: Option<usize>) -> Vec<Space> {
    layout_stages(layout)
        .iter()
        .map(|&s| Space::new(s, width, distance.is_some()))
        .collect()
}

/// Whether `layout` is defined for `width`-bit floats: the Joint layout only up to 32 bits
/// (docs/FORMAT.md); every backend refuses it above, with this error.
pub fn check_layout(layout: Layout, width: u32) -> Result<()> {
    if layout == Layout::Joint && width > JOINT_MAX_WIDTH {
        return Err(crate::Error::Unsupported(format!(
            "the joint (fast) layout for {width}-bit floats"
        )));
    }
    Ok(())
}

/// The neighbor whose update sign is a context for the sign stage: one row up when rows are at
/// least `LANES` wide (so it is always decoded in an earlier step), else the same lane's
/// previous element.
pub fn neighbor_distance(shape: &[u64]) -> usize {
    match shape.last() {
        Some(&cols) if shape.len() >= 2 && cols >= LANES as u64 && cols <= u32::MAX as u64 => {
            cols as usize
        }
        _ => LANES,
    }
}
