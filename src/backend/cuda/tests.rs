//! Several tensors in flight at once through one [`CudaBackend`], on the host emulation:
//! each operation on an engine of its own must give the CPU's bytes, as one at a time does.
//!
//! What the emulation can prove: that engines are not shared (a staging ring or a buffer
//! mixed between two operations would change bytes), that the pool grows instead of
//! deadlocking, and that launches of different tensors really are in flight together (the
//! emulated kernels of concurrent callers run at once on its device threads: the profiler's
//! marks show them overlapping).
//! What it cannot: its copies are synchronous and it has no streams, so the GPU's ordering
//! between one engine's streams and the absence of ordering between engines are proven only
//! on a GPU (gpu-check's timed trajectory compares every blob coded in flight with the one
//! coded alone).

use std::sync::Barrier;

use super::emulated::HostEmulation;
use super::profile::Profiled;
use super::CudaBackend;
use crate::backend::{Backend, Device, EncodeJob};
use crate::delta::{blob, decode_tensor, EncodeOptions, TensorPair};
use crate::dtype::DType;
use crate::format::chunk::CHUNK_ELEMS;

/// A pseudo-random reference of `n` elements and a target near it (low bits moved, as in
/// training).
fn tensor(dtype: DType, n: usize, seed: u32) -> (Vec<u8>, Vec<u8>) {
    let size = dtype.size();
    let r: Vec<u8> = (0..(n * size) as u32)
        .map(|i| (i ^ seed).wrapping_mul(2_654_435_761).rotate_right(11) as u8)
        .collect();
    let x = r
        .iter()
        .enumerate()
        .map(|(j, &b)| if j % size == 0 { b ^ (j % 5) as u8 } else { b })
        .collect();
    (r, x)
}

#[test]
fn emulated_tensors_in_flight_at_once_give_the_cpu_bytes() {
    // The profiler records every launch's start and end marks, the forks' too.
    let dev = Profiled::new(HostEmulation::new());
    // Small pieces, so every tensor goes through its engine's ring many times.
    let cuda = CudaBackend::with_piece_bytes(dev, "cuda-emulated", 4096);
    let cpu = Device::cpu();
    let cpu = cpu.delta().unwrap();
    // Different widths and lengths; the bf16 one is over two chunks.
    let tensors = [
        (DType::BF16, 2 * CHUNK_ELEMS + 4099),
        (DType::F32, CHUNK_ELEMS / 2 + 17),
        (DType::F16, CHUNK_ELEMS + 1),
        (DType::F8E4M3, 3 * 1000 + 1),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (dtype, n))| {
        let (r, x) = tensor(dtype, n, 11 + i as u32);
        (dtype, [n as u64], r, x)
    })
    .collect::<Vec<_>>();
    let opts = EncodeOptions::default();
    let start = Barrier::new(tensors.len());
    std::thread::scope(|s| {
        for (i, (dtype, shape, r, x)) in tensors.iter().enumerate() {
            let (cuda, start, opts) = (&cuda, &start, &opts);
            s.spawn(move || {
                let pair = TensorPair {
                    dtype: *dtype,
                    shape,
                    reference: r,
                    target: x,
                };
                // The first thread holds a resident (and so its engine) across its encode:
                // the pool must give it a second engine, not wait for the first.
                let held = (i == 0).then(|| {
                    let job = EncodeJob {
                        fl: dtype.float_layout().unwrap(),
                        reference: r,
                        target: x,
                        condition: true,
                    };
                    cuda.residuals(&job).unwrap()
                });
                start.wait();
                let (ours, _) = blob::encode_unverified(&pair, opts, cuda).unwrap();
                assert_eq!(decode_tensor(&ours, r, cuda).unwrap(), *x, "{dtype}");
                drop(held);
                let (theirs, _) = blob::encode_unverified(&pair, opts, cpu).unwrap();
                assert_eq!(ours, theirs, "{dtype}: the CUDA blob is not the CPU's");
            });
        }
    });
    // At most one engine per operation in flight: four tensors and one held resident.
    let engines = cuda.engines();
    assert!((2..=5).contains(&engines), "{engines} engines");
    // Launches of different tensors were in progress together (the emulation's device
    // threads ran them at once), so the pool did not serialize them.
    let most = cuda.launcher().most_at_once().unwrap();
    assert!(most > 1, "at most {most} launch in progress at a time");
}
