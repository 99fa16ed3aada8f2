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
    pub const ALL: [Kernel; 9] = [
        Kernel::Residuals,
        Kernel::Symbols,
        Kernel::Histogram,
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
            Kernel::Residuals | Kernel::Symbols | Kernel::Histogram => "residual.cu",
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
    /// A buffer holding `words`.
    fn upload(&self, words: &[u32]) -> Result<Self::Buf>;
    /// A zeroed buffer of `words` words.
    fn zeroed(&self, words: usize) -> Result<Self::Buf>;
    /// Overwrite `words.len()` words from word `at`.
    fn write(&self, buf: &mut Self::Buf, at: usize, words: &[u32]) -> Result<()>;
    /// The first `words` words, after every launch before it has finished.
    fn read(&self, buf: &Self::Buf, words: usize) -> Result<Vec<u32>>;
    /// Launch `kernel` on `grid` blocks of `kernel.block()` threads.
    fn launch(&self, kernel: Kernel, grid: u32, p: &Params, bufs: [&Self::Buf; 6]) -> Result<()>;
    /// Launch language-model kernel `kernel` (kernels/lm/) on `grid` blocks of
    /// `kernel.block()` threads.
    fn launch_lm(
        &self,
        kernel: LmKernel,
        grid: u32,
        p: &LmParams,
        bufs: [&Self::Buf; 8],
    ) -> Result<()>;
}

/// A shared device: the delta codec's backend and the language model hold one each.
impl<L: Launcher> Launcher for std::sync::Arc<L> {
    type Buf = L::Buf;
    fn describe(&self) -> String {
        (**self).describe()
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
    fn launch(&self, kernel: Kernel, grid: u32, p: &Params, bufs: [&Self::Buf; 6]) -> Result<()> {
        (**self).launch(kernel, grid, p, bufs)
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
}
