//! Host-to-device streaming: a large input goes to the device in pieces, each through one of
//! a ring of staging buffers (page-locked on a GPU) on the copy stream, and each piece's
//! kernels start as soon as that piece has landed, while the next pieces are on the bus and
//! the host fills the one after. Written once above [`Launcher`], so the emulation runs this
//! order and reuse logic in CI (its copies happen at once, in call order).
//!
//! ```text
//!   host fills slot  | p0 | p1 | p2 | p3 (waits for p0's copy: slot 0 again) ...
//!   copy stream      |    | p0 | p1 | p2 | p3
//!   kernel stream    |         | k0 | k1 | k2 | k3
//! ```
//!
//! Bytes cannot change: a piece is the same words at the same place as a whole upload, and
//! an element-wise kernel on a piece is the same kernel on a range of elements.

use super::launch::Launcher;
use crate::Result;

/// Bytes per piece: a multiple of 8, so every element width starts a piece on a word (and
/// element) boundary; large enough that a copy's fixed cost (~10 µs) is small beside its
/// transfer (8 MiB at 50 GB/s: 170 µs), small enough that a tensor of a few hundred MB
/// still splits into enough pieces to overlap.
pub const PIECE_BYTES: usize = 8 << 20;

/// Staging buffers: one being filled by the host, one on the bus, one spare so that the
/// host never waits for the copy it just started.
pub const SLOTS: usize = 3;

/// The staging ring: its buffers are allocated on first use and kept (page-locking costs
/// far more than a copy), each with the event of the last copy out of it.
pub struct Ring<L: Launcher> {
    slots: Vec<(L::Staging, Option<L::Event>)>,
    next: usize,
    piece_bytes: usize,
}

impl<L: Launcher> Default for Ring<L> {
    fn default() -> Self {
        Self::new(PIECE_BYTES)
    }
}

impl<L: Launcher> Ring<L> {
    /// A ring of pieces of `piece_bytes` (a multiple of 8; tests use small ones).
    pub fn new(piece_bytes: usize) -> Self {
        assert!(piece_bytes >= 8 && piece_bytes.is_multiple_of(8));
        Ring {
            slots: Vec::new(),
            next: 0,
            piece_bytes,
        }
    }

    /// Bytes per piece.
    pub fn piece_bytes(&self) -> usize {
        self.piece_bytes
    }

    /// Start copying `bytes` (zero-padded to whole words) into `dst` from word `at`, through
    /// the next staging buffer; that buffer keeps the copy's end event.
    fn put(&mut self, dev: &L, bytes: &[u8], dst: &mut L::Buf, at: usize) -> Result<()> {
        debug_assert!(bytes.len() <= self.piece_bytes);
        if self.slots.len() < SLOTS && self.next == self.slots.len() {
            self.slots.push((dev.staging(self.piece_bytes / 4)?, None));
        }
        let (staging, last) = &mut self.slots[self.next];
        self.next = (self.next + 1) % SLOTS;
        // The copy that last read this buffer must be done before the host overwrites it.
        if let Some(e) = last.take() {
            dev.wait(&e)?;
        }
        let words = bytes.len().div_ceil(4);
        let dst_words = &mut dev.staging_words(staging)?[..words];
        let whole = bytes.len() / 4;
        bytemuck::cast_slice_mut::<u32, u8>(&mut dst_words[..whole])
            .copy_from_slice(&bytes[..whole * 4]);
        if whole < words {
            let mut last_word = [0u8; 4];
            last_word[..bytes.len() - whole * 4].copy_from_slice(&bytes[whole * 4..]);
            dst_words[whole] = u32::from_le_bytes(last_word);
        }
        *last = Some(dev.copy_in(staging, words, dst, at)?);
        Ok(())
    }

    /// The end of the last copy started (the copy stream runs in order: of every copy).
    fn last_copy(&self) -> Option<&L::Event> {
        let i = (self.next + SLOTS - 1) % SLOTS;
        self.slots.get(i).and_then(|(_, e)| e.as_ref())
    }
}

/// Copy each source's bytes into the destination buffer of the same index (from word 0),
/// piece by piece: the pieces at the same offset of every source (sources are equally long),
/// then `piece(bytes, dsts)` with that byte range, to launch the kernels that need just those
/// pieces; they wait for the copies, the next pieces' copies do not wait for them. When this
/// returns, every later kernel and read sees all the bytes.
pub fn stream_in<L: Launcher>(
    dev: &L,
    ring: &mut Ring<L>,
    sources: &[&[u8]],
    dsts: &mut [&mut L::Buf],
    mut piece: impl FnMut(std::ops::Range<usize>, &[&mut L::Buf]) -> Result<()>,
) -> Result<()> {
    let len = sources.first().map_or(0, |b| b.len());
    assert!(sources.len() == dsts.len() && sources.iter().all(|b| b.len() == len));
    // Destinations were allocated (and cleared) in kernel order; copies start after that.
    dev.copies_after_kernels()?;
    let mut run = || -> Result<()> {
        let step = ring.piece_bytes();
        for start in (0..len).step_by(step) {
            let range = start..(start + step).min(len);
            for (bytes, dst) in sources.iter().zip(dsts.iter_mut()) {
                ring.put(dev, &bytes[range.clone()], dst, start / 4)?;
            }
            if let Some(e) = ring.last_copy() {
                dev.kernels_after(e)?;
            }
            piece(range, dsts)?;
        }
        Ok(())
    };
    let done = run();
    // Whatever happened, nothing later (a read, a free of a destination: kernel-stream work)
    // may overtake a copy still on the bus.
    if let Some(e) = ring.last_copy() {
        dev.kernels_after(e)?;
    }
    done
}

/// Streaming on the host emulation (its copies happen at once, so this checks the order and
/// reuse logic and the pieces' offsets, not a GPU's overlap): pieces far smaller than the
/// tensors, so the ring wraps many times, must leave every byte where a whole upload would,
/// and give the CPU's bytes at every stage.
#[cfg(all(test, cuda_emulation))]
mod tests {
    use super::super::emulated::HostEmulation;
    use super::super::CudaBackend;
    use super::*;
    use crate::backend::{Backend, Device};
    use crate::delta::{decode_tensor, encode_tensor, EncodeOptions, LayoutChoice, TensorPair};
    use crate::dtype::DType;

    fn bytes(len: usize, seed: u32) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i ^ seed).wrapping_mul(2_654_435_761).rotate_right(11) as u8)
            .collect()
    }

    #[test]
    fn emulated_stream_in_tiles_every_length_in_order() {
        let dev = HostEmulation::new();
        let mut ring = Ring::<HostEmulation>::new(16);
        for len in [0, 1, 3, 4, 15, 16, 17, 47, 48, 49, 1000] {
            let (a, b) = (bytes(len, 1), bytes(len, 2));
            let words = len.div_ceil(4) + 2;
            let (mut da, mut db) = (dev.zeroed(words).unwrap(), dev.zeroed(words).unwrap());
            let mut seen = Vec::new();
            stream_in(
                &dev,
                &mut ring,
                &[&a, &b],
                &mut [&mut da, &mut db],
                |r, up| {
                    // Each piece has landed in both buffers when its kernels would start.
                    let got = dev.read(up[1], r.end.div_ceil(4)).unwrap();
                    let got: &[u8] = bytemuck::cast_slice(&got);
                    assert_eq!(&got[r.clone()], &b[r.clone()], "{len}: piece {r:?}");
                    seen.push(r);
                    Ok(())
                },
            )
            .unwrap();
            let want: Vec<_> = (0..len).step_by(16).map(|s| s..(s + 16).min(len)).collect();
            assert_eq!(seen, want, "{len}");
            for (buf, src) in [(&da, &a), (&db, &b)] {
                let got = dev.read(buf, words).unwrap();
                let mut want = src.clone();
                want.resize(words * 4, 0);
                assert_eq!(bytemuck::cast_slice::<u32, u8>(&got), &want[..], "{len}");
            }
        }
    }

    #[test]
    fn emulated_small_pieces_give_the_cpu_bytes() {
        // 40-byte pieces: 5 words, so pieces also start off any 8-word alignment.
        let streamed = CudaBackend::with_piece_bytes(HostEmulation::new(), "cuda-emulated", 40);
        let cpu = Device::cpu();
        let cpu = cpu.delta().unwrap();
        for (i, dtype) in [DType::F64, DType::F32, DType::BF16, DType::F8E4M3]
            .into_iter()
            .enumerate()
        {
            // Rows of 49: an odd length, so 8-bit tensors end inside a word.
            let n = 49 * 37;
            let size = dtype.size();
            let r = bytes(n * size, 7 + i as u32);
            // A target near the reference: low bits moved, as in training.
            let x: Vec<u8> = r
                .iter()
                .enumerate()
                .map(|(j, &b)| if j % size == 0 { b ^ (j % 5) as u8 } else { b })
                .collect();
            let shape = [37, 49];
            let pair = TensorPair {
                dtype,
                shape: &shape,
                reference: &r,
                target: &x,
            };
            let job = crate::backend::EncodeJob {
                fl: dtype.float_layout().unwrap(),
                reference: &r,
                target: &x,
                condition: true,
            };
            assert_eq!(
                streamed.residuals(&job).unwrap().residual_bytes().unwrap(),
                cpu.residuals(&job).unwrap().residual_bytes().unwrap(),
                "{dtype} residuals"
            );
            for layout in [LayoutChoice::Auto, LayoutChoice::Fast] {
                let opts = EncodeOptions {
                    layout,
                    ..EncodeOptions::default()
                };
                let (ours, _) = encode_tensor(&pair, &opts, &streamed).unwrap();
                let (theirs, _) = encode_tensor(&pair, &opts, cpu).unwrap();
                assert_eq!(ours, theirs, "{dtype} {layout:?}");
                assert_eq!(decode_tensor(&theirs, &r, &streamed).unwrap(), x);
            }
        }
    }
}
