//! A ZipNN-style peer for the anchor codec, measured in the same run: the sign bit is rotated
//! out of the exponent (so one byte holds the exponent), bytes are grouped into planes, and
//! each 256 KiB chunk of a plane is Huffman coded (or stored when that does not pay), as
//! ZipNN 0.5 does with huff0. Sizes are computed, not coded: optimal Huffman code lengths plus
//! a table estimate of half a byte per symbol of the alphabet, which flatters the peer slightly.

use crate::dtype::DType;

/// ZipNN's chunk size.
pub const CHUNK: usize = 256 << 10;

/// Byte planes after ZipNN's sign rotation (float types) or plain byte grouping (others).
pub fn planes(dtype: DType, bytes: &[u8]) -> Vec<Vec<u8>> {
    let size = dtype.size();
    let n = bytes.len() / size;
    let mut planes = vec![Vec::with_capacity(n); size];
    for c in bytes.chunks_exact(size) {
        let mut v = [0u8; 8];
        v[..size].copy_from_slice(c);
        let mut x = u64::from_le_bytes(v);
        if dtype.is_float() && size > 1 {
            let w = 8 * size as u32;
            let mask = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
            x = ((x << 1) | (x >> (w - 1))) & mask;
        }
        for (k, p) in planes.iter_mut().enumerate() {
            p.push((x >> (8 * k)) as u8);
        }
    }
    planes
}

/// Estimated ZipNN-style compressed size of a tensor in bytes.
pub fn size(dtype: DType, bytes: &[u8]) -> u64 {
    planes(dtype, bytes)
        .iter()
        .flat_map(|p| p.chunks(CHUNK))
        .map(|c| huffman_bytes(c).min(c.len() as u64 + 1))
        .sum()
}

/// Huffman-coded size of `data` (code lengths by the classic merge) plus the table estimate.
pub fn huffman_bytes(data: &[u8]) -> u64 {
    let mut counts = [0u64; 256];
    for &b in data {
        counts[b as usize] += 1;
    }
    let used: Vec<u64> = counts.iter().copied().filter(|&c| c > 0).collect();
    if used.len() <= 1 {
        return 2; // run-length special case in huff0
    }
    // Total code length = sum of the weights of every internal node of the Huffman tree.
    let mut heap: std::collections::BinaryHeap<std::cmp::Reverse<u64>> =
        used.iter().map(|&c| std::cmp::Reverse(c)).collect();
    let mut bits = 0u64;
    while heap.len() > 1 {
        let a = heap.pop().unwrap().0;
        let b = heap.pop().unwrap().0;
        bits += a + b;
        heap.push(std::cmp::Reverse(a + b));
    }
    let max_sym = counts.iter().rposition(|&c| c > 0).unwrap_or(0) as u64;
    bits.div_ceil(8) + max_sym.div_ceil(2) + 1
}

/// Byte grouping (with the sign rotation) and zstd at `level`: the generic half of the peer.
pub fn zstd_grouped_size(dtype: DType, bytes: &[u8], level: i32) -> u64 {
    let all: Vec<u8> = planes(dtype, bytes).concat();
    zstd::bulk::compress(&all, level)
        .map(|z| z.len() as u64)
        .unwrap_or(bytes.len() as u64)
}
