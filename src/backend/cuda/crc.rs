//! CRC-32 of a tensor resident on the device (kernels/crc32.cu): one CRC per block of
//! `BLOCK` threads of `PIECE` bytes each, combined here in order. For a 2 GB tensor that is
//! 2048 combines on the host instead of 2 GB copied back and hashed.

use super::launch::{Kernel, Launcher, BLOCK};
use crate::backend::wgpu::params::Params;
use crate::Result;

/// Bytes each thread hashes (a multiple of 4: threads start on word boundaries).
const PIECE: u32 = 4096;

/// CRC-32 (`crc32fast::hash`) of the first `n` elements of `width` bits in `buf`.
pub fn crc32<L: Launcher>(dev: &L, buf: &L::Buf, width: u32, n: usize) -> Result<u32> {
    let bytes = n as u64 * (width / 8) as u64;
    let span = (BLOCK * PIECE) as u64;
    let grid = bytes.div_ceil(span) as usize;
    if grid == 0 {
        return Ok(0);
    }
    let p = Params {
        n: n as u32,
        fl_width: width,
        pad: PIECE,
        ..Default::default()
    };
    let out = dev.zeroed(grid)?;
    dev.launch(
        Kernel::Crc32,
        grid as u32,
        &p,
        [buf, &out, &out, &out, &out, &out],
    )?;
    let crcs = dev.read(&out, grid)?;
    let mut h = crc32fast::Hasher::new_with_initial_len(crcs[0], span.min(bytes));
    for (b, &crc) in crcs.iter().enumerate().skip(1) {
        let len = span.min(bytes - b as u64 * span);
        h.combine(&crc32fast::Hasher::new_with_initial_len(crc, len));
    }
    Ok(h.finalize())
}

/// The kernel against crc32fast on the host emulation, at lengths around a thread's piece
/// and a block's span, and for every element width (an emulation, not a GPU).
#[cfg(all(test, cuda_emulation))]
mod tests {
    use super::super::emulated::HostEmulation;
    use super::*;

    #[test]
    fn emulated_crc32_kernel_is_crc32fast() {
        let dev = HostEmulation::new();
        let span = (BLOCK * PIECE) as usize;
        let data: Vec<u8> = (0..2 * span + 4 * PIECE as usize + 24)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_right(13) as u8)
            .collect();
        // (a whole number of words)
        let mut words = crate::backend::wgpu::u32s(&data);
        words.extend([0, 0]);
        let buf = dev.upload(&words).unwrap();
        for width in [8u32, 16, 32, 64] {
            let size = (width / 8) as usize;
            for bytes in [
                0,
                8,
                PIECE as usize - 8,
                PIECE as usize + 8,
                span,
                span + 3 * PIECE as usize + 16,
                data.len() - 8,
            ] {
                let n = bytes / size;
                let want = crc32fast::hash(&data[..n * size]);
                assert_eq!(
                    crc32(&dev, &buf, width, n).unwrap(),
                    want,
                    "{n} x {width} bits"
                );
            }
        }
    }
}
