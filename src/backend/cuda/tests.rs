//! Several tensors in flight at once through one [`CudaBackend`], on the host emulation:
//! each operation on an engine of its own must give the CPU's bytes, as one at a time does.
//!
//! What the emulation can prove: that engines are not shared (a staging ring or a buffer
//! mixed between two operations would change bytes), that the pool grows instead of
//! deadlocking, and that launches of different tensors really are in flight together (the
//! emulated kernels of concurrent callers run at once on its device threads, counted below).
//! What it cannot: its copies are synchronous and it has no streams, so the GPU's ordering
//! between one engine's streams and the absence of ordering between engines are proven only
//! on a GPU (gpu-check's timed trajectory compares every blob coded in flight with the one
//! coded alone).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use super::emulated::HostEmulation;
use super::launch::{Kernel, Launcher};
use super::lm::kernels::{LmKernel, LmParams};
use super::CudaBackend;
use crate::backend::wgpu::params::Params;
use crate::backend::{Backend, Device, EncodeJob};
use crate::delta::{blob, decode_tensor, EncodeOptions, TensorPair};
use crate::dtype::DType;
use crate::format::chunk::CHUNK_ELEMS;
use crate::Result;

/// The emulation, counting the delta kernels' launches in progress (entered, not yet
/// returned) across the launcher and all its forks, and the most at once.
struct Overlap {
    inner: HostEmulation,
    now: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Launcher for Overlap {
    type Buf = <HostEmulation as Launcher>::Buf;
    type Staging = <HostEmulation as Launcher>::Staging;
    type Event = <HostEmulation as Launcher>::Event;
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn fork(&self) -> Result<Self> {
        Ok(Overlap {
            inner: self.inner.fork()?,
            now: self.now.clone(),
            most: self.most.clone(),
        })
    }
    fn upload(&self, words: &[u32]) -> Result<Self::Buf> {
        self.inner.upload(words)
    }
    fn zeroed(&self, words: usize) -> Result<Self::Buf> {
        self.inner.zeroed(words)
    }
    fn write(&self, buf: &mut Self::Buf, at: usize, words: &[u32]) -> Result<()> {
        self.inner.write(buf, at, words)
    }
    fn read(&self, buf: &Self::Buf, words: usize) -> Result<Vec<u32>> {
        self.inner.read(buf, words)
    }
    fn launch_at(
        &self,
        kernel: Kernel,
        grid: u32,
        p: &Params,
        bufs: [&Self::Buf; 6],
        at: [usize; 6],
    ) -> Result<()> {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let done = self.inner.launch_at(kernel, grid, p, bufs, at);
        self.now.fetch_sub(1, Ordering::SeqCst);
        done
    }
    fn staging(&self, words: usize) -> Result<Self::Staging> {
        self.inner.staging(words)
    }
    fn staging_words<'s>(&self, s: &'s mut Self::Staging) -> Result<&'s mut [u32]> {
        self.inner.staging_words(s)
    }
    fn copy_in(
        &self,
        src: &Self::Staging,
        words: usize,
        dst: &mut Self::Buf,
        at: usize,
    ) -> Result<Self::Event> {
        self.inner.copy_in(src, words, dst, at)
    }
    fn copies_after_kernels(&self) -> Result<()> {
        self.inner.copies_after_kernels()
    }
    fn kernels_after(&self, e: &Self::Event) -> Result<()> {
        self.inner.kernels_after(e)
    }
    fn wait(&self, e: &Self::Event) -> Result<()> {
        self.inner.wait(e)
    }
    fn mark(&self) -> Result<Self::Event> {
        self.inner.mark()
    }
    fn seconds(&self, from: &Self::Event, to: &Self::Event) -> Result<f64> {
        self.inner.seconds(from, to)
    }
    fn copy_on_device(&self, src: &Self::Buf, dst: &mut Self::Buf, words: usize) -> Result<()> {
        self.inner.copy_on_device(src, dst, words)
    }
    fn launch_lm(
        &self,
        kernel: LmKernel,
        grid: u32,
        p: &LmParams,
        bufs: [&Self::Buf; 8],
    ) -> Result<()> {
        self.inner.launch_lm(kernel, grid, p, bufs)
    }
}

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
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let dev = Overlap {
        inner: HostEmulation::new(),
        now,
        most: most.clone(),
    };
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
    let most = most.load(Ordering::SeqCst);
    assert!(most > 1, "at most {most} launch in progress at a time");
}
