//! Peers measured in the same run as lockstep: zstd on byte-grouped XOR deltas (LMC's front
//! end, the paper's baseline row) and ZipNN-style byte grouping for standalone tensors.

use crate::{Error, Result};

/// Byte planes of `size`-byte elements: all first bytes, then all second bytes, ...
/// Appends plane k of `data` to `planes[k]`.
pub fn push_planes(planes: &mut Vec<Vec<u8>>, data: &[u8], size: usize) {
    planes.resize_with(planes.len().max(size), Vec::new);
    for (k, plane) in planes.iter_mut().enumerate().take(size) {
        plane.extend(data.iter().skip(k).step_by(size));
    }
}

/// XOR of two equal-length byte strings.
pub fn xor(a: &[u8], b: &[u8]) -> Vec<u8> {
    a.iter().zip(b).map(|(x, y)| x ^ y).collect()
}

/// Compressed size of the concatenated planes with zstd at `level`.
pub fn zstd_planes(planes: &[Vec<u8>], level: i32) -> Result<usize> {
    let all: Vec<u8> = planes.concat();
    zstd::bulk::compress(&all, level)
        .map(|z| z.len())
        .map_err(|e| Error::Invalid(format!("zstd failed: {e}")))
}
