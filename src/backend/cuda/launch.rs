//! What the CUDA backend's host code needs from a device: buffers, copies and kernel
//! launches. Two implementations: the real GPU through cudarc (`driver.rs`) and the host
//! emulation of the same kernel sources (`emulated.rs`), so one host code drives both.

use super::lm::kernels::{LmKernel, LmParams};
use crate::backend::wgpu::params::Params;
use crate::Result;

/// The kernels, in the order of the emulation's table (kernels/host/emulate.c).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    Residuals,
    Symbols,
    Histogram,
    ErRange,
    EncLanes,
    EncScan,
    EncTail,
    DecLanes,
    DecTail,
    Crc32,
}

/// Threads per block of the element-wise kernels and of the per-chunk prefix sums
/// (SCAN_THREADS in kernels/lockstep.cuh).
pub const BLOCK: u32 = 256;

impl Kernel {
    pub const ALL: [Kernel; 10] = [
        Kernel::Residuals,
        Kernel::Symbols,
        Kernel::Histogram,
        Kernel::ErRange,
        Kernel::EncLanes,
        Kernel::EncScan,
        Kernel::EncTail,
        Kernel::DecLanes,
        Kernel::DecTail,
        Kernel::Crc32,
    ];

    /// The `extern "C"` name in kernels/*.cu.
    pub fn symbol(self) -> &'static str {
        match self {
            Kernel::Residuals => "ls_residuals",
            Kernel::Symbols => "ls_symbols",
            Kernel::Histogram => "ls_histogram",
            Kernel::ErRange => "ls_er_range",
            Kernel::EncLanes => "ls_enc_lanes",
            Kernel::EncScan => "ls_enc_scan",
            Kernel::EncTail => "ls_enc_tail",
            Kernel::DecLanes => "ls_dec_lanes",
            Kernel::DecTail => "ls_dec_tail",
            Kernel::Crc32 => "ls_crc32",
        }
    }

    /// The source file (module) that defines it.
    pub fn module(self) -> &'static str {
        match self {
            Kernel::Residuals | Kernel::Symbols | Kernel::Histogram | Kernel::ErRange => {
                "residual.cu"
            }
            Kernel::EncLanes | Kernel::EncScan | Kernel::EncTail => "encode.cu",
            Kernel::DecLanes | Kernel::DecTail => "decode.cu",
            Kernel::Crc32 => "crc32.cu",
        }
    }

    /// Threads per block: one warp per chunk for the lanes (one thread per lane).
    pub fn block(self) -> u32 {
        match self {
            Kernel::EncLanes | Kernel::DecLanes => 32,
            _ => BLOCK,
        }
    }
}

/// A device that runs the kernels of kernels/*.cu.
pub trait Launcher: Send + Sync + 'static {
    /// A device buffer of u32 words.
    type Buf: Send + Sync;
    /// What it runs on, for people.
    fn describe(&self) -> String;
    /// The same device and compiled kernels on new streams of its own (a kernel stream and
    /// a copy stream on a GPU), sharing nothing ordered with `self`: what lets several
    /// tensors' operations be in flight at once ([`super::CudaBackend`] gives each operation
    /// one such launcher). A tensor's kernels are latency-bound (one warp per chunk and a
    /// few chunks per tensor), so a GPU is busy only with many tensors on it together.
    /// Buffers belong to the launcher that made them: only its streams may use them.
    fn fork(&self) -> Result<Self>
    where
        Self: Sized;
    /// A buffer holding `words`.
    fn upload(&self, words: &[u32]) -> Result<Self::Buf>;
    /// A zeroed buffer of `words` words.
    fn zeroed(&self, words: usize) -> Result<Self::Buf>;
    /// Overwrite `words.len()` words from word `at`.
    fn write(&self, buf: &mut Self::Buf, at: usize, words: &[u32]) -> Result<()>;
    /// The first `words` words, after every launch before it has finished.
    fn read(&self, buf: &Self::Buf, words: usize) -> Result<Vec<u32>>;
    /// Launch `kernel` on `grid` blocks of `kernel.block()` threads.
    fn launch(&self, kernel: Kernel, grid: u32, p: &Params, bufs: [&Self::Buf; 6]) -> Result<()> {
        self.launch_at(kernel, grid, p, bufs, [0; 6])
    }
    /// [`Launcher::launch`] with each buffer seen from word `at[i]` on (a piece of a tensor
    /// whose other pieces are still copying in).
    fn launch_at(
        &self,
        kernel: Kernel,
        grid: u32,
        p: &Params,
        bufs: [&Self::Buf; 6],
        at: [usize; 6],
    ) -> Result<()>;

    // Streaming (src/backend/cuda/stream.rs decides what goes where and when; these are its
    // operations). A launcher on a GPU has two streams: kernels, and reads, run in order on
    // one; the copies that `copy_in` starts run on the other, ordered against the kernels
    // only by the waits below (a fork has two more, unordered with these). The emulation
    // does everything at once, in call order.

    /// Host memory the device copies from asynchronously (page-locked on a GPU).
    type Staging: Send;
    /// A point in a stream's work: to wait for, or (from [`Launcher::mark`]) to time.
    type Event: Send;
    /// A staging buffer of `words` words.
    fn staging(&self, words: usize) -> Result<Self::Staging>;
    /// Its words, for the host to fill (the caller has waited for copies out of it).
    fn staging_words<'s>(&self, s: &'s mut Self::Staging) -> Result<&'s mut [u32]>;
    /// Start copying the first `words` words of `src` into `dst` from word `at` on the copy
    /// stream; the event is the copy's end.
    fn copy_in(
        &self,
        src: &Self::Staging,
        words: usize,
        dst: &mut Self::Buf,
        at: usize,
    ) -> Result<Self::Event>;
    /// Copies started from now on wait for every kernel launched so far (buffers are
    /// allocated and cleared in kernel order).
    fn copies_after_kernels(&self) -> Result<()>;
    /// Kernels and reads started from now on wait for `e`.
    fn kernels_after(&self, e: &Self::Event) -> Result<()>;
    /// The host waits for `e`.
    fn wait(&self, e: &Self::Event) -> Result<()>;
    /// A timing mark after the kernels launched so far (CUDA events on a GPU, the CPU clock
    /// in the emulation, whose launches return when done).
    fn mark(&self) -> Result<Self::Event>;
    /// Seconds from mark `from` to mark `to` (waits for `to`).
    fn seconds(&self, from: &Self::Event, to: &Self::Event) -> Result<f64>;
    /// Copy `words` words from `src` to `dst` on the device, in kernel order (to measure the
    /// device's copy bandwidth, the floor of every stage).
    fn copy_on_device(&self, src: &Self::Buf, dst: &mut Self::Buf, words: usize) -> Result<()>;
    /// Launch language-model kernel `kernel` (kernels/lm/) on `grid` blocks of
    /// `kernel.block()` threads.
    fn launch_lm(
        &self,
        kernel: LmKernel,
        grid: u32,
        p: &LmParams,
        bufs: [&Self::Buf; 8],
    ) -> Result<()>;
    /// Free device memory in bytes, where the device says (how many KV caches the
    /// language model may hold at once); `None` where it does not (the emulation).
    fn free_memory(&self) -> Option<usize> {
        None
    }
}

/// A shared device: the delta codec's backend and the language model hold one each.
impl<L: Launcher> Launcher for std::sync::Arc<L> {
    type Buf = L::Buf;
    fn describe(&self) -> String {
        (**self).describe()
    }
    /// A fork of the shared device, in an `Arc` of its own.
    fn fork(&self) -> Result<Self> {
        Ok(std::sync::Arc::new((**self).fork()?))
    }
    fn upload(&self, words: &[u32]) -> Result<Self::Buf> {
        (**self).upload(words)
    }
    fn zeroed(&self, words: usize) -> Result<Self::Buf> {
        (**self).zeroed(words)
    }
    fn write(&self, buf: &mut Self::Buf, at: usize, words: &[u32]) -> Result<()> {
        (**self).write(buf, at, words)
    }
    fn read(&self, buf: &Self::Buf, words: usize) -> Result<Vec<u32>> {
        (**self).read(buf, words)
    }
    fn launch_at(
        &self,
        kernel: Kernel,
        grid: u32,
        p: &Params,
        bufs: [&Self::Buf; 6],
        at: [usize; 6],
    ) -> Result<()> {
        (**self).launch_at(kernel, grid, p, bufs, at)
    }
    type Staging = L::Staging;
    type Event = L::Event;
    fn staging(&self, words: usize) -> Result<Self::Staging> {
        (**self).staging(words)
    }
    fn staging_words<'s>(&self, s: &'s mut Self::Staging) -> Result<&'s mut [u32]> {
        (**self).staging_words(s)
    }
    fn copy_in(
        &self,
        src: &Self::Staging,
        words: usize,
        dst: &mut Self::Buf,
        at: usize,
    ) -> Result<Self::Event> {
        (**self).copy_in(src, words, dst, at)
    }
    fn copies_after_kernels(&self) -> Result<()> {
        (**self).copies_after_kernels()
    }
    fn kernels_after(&self, e: &Self::Event) -> Result<()> {
        (**self).kernels_after(e)
    }
    fn wait(&self, e: &Self::Event) -> Result<()> {
        (**self).wait(e)
    }
    fn mark(&self) -> Result<Self::Event> {
        (**self).mark()
    }
    fn seconds(&self, from: &Self::Event, to: &Self::Event) -> Result<f64> {
        (**self).seconds(from, to)
    }
    fn copy_on_device(&self, src: &Self::Buf, dst: &mut Self::Buf, words: usize) -> Result<()> {
        (**self).copy_on_device(src, dst, words)
    }
    fn launch_lm(
        &self,
        kernel: LmKernel,
        grid: u32,
        p: &LmParams,
        bufs: [&Self::Buf; 8],
    ) -> Result<()> {
        (**self).launch_lm(kernel, grid, p, bufs)
    }
    fn free_memory(&self) -> Option<usize> {
        (**self).free_memory()
    }
}
