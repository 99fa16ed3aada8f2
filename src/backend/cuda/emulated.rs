//! The host emulation of the CUDA kernels: kernels/*.cu compiled as C by build.rs, with
//! kernels/host/emulate.h standing in for CUDA's built-ins. An emulation: it proves the
//! kernels' integer logic and indexing on any machine (CI runs the whole parity suite on
//! it), not the CUDA compiler or a GPU. Never chosen by `auto`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use rayon::prelude::*;

use super::launch::{Kernel, Launcher};
use super::lm::kernels::{LmKernel, LmParams};
use crate::backend::wgpu::params::Params;
use crate::format::chunk::{CHUNK_ELEMS, LANES};
use crate::{Error, Result};

extern "C" {
    fn ls_emu_init(chunk: u32, groups: u32);
    fn ls_emu_launch(
        kernel: u32,
        grid: u32,
        block: u32,
        first: u32,
        end: u32,
        p: *const u32,
        bufs: *const *mut u32,
    ) -> i32;
    fn ls_emu_launch_lm(
        kernel: u32,
        grid: u32,
        block: u32,
        first: u32,
        end: u32,
        p: *const u32,
        bufs: *const *mut u32,
    ) -> i32;
}

/// The emulated device.
pub struct HostEmulation(());

/// A "device" buffer: atomics, because the kernels write it from several threads.
pub struct HostBuf(Box<[AtomicU32]>);

impl Default for HostEmulation {
    fn default() -> Self {
        Self::new()
    }
}

impl HostEmulation {
    pub fn new() -> HostEmulation {
        static INIT: std::sync::Once = std::sync::Once::new();
        // SAFETY: sets two plain integers before any launch.
        INIT.call_once(|| unsafe {
            ls_emu_init(CHUNK_ELEMS as u32, (CHUNK_ELEMS / LANES * 4) as u32)
        });
        HostEmulation(())
    }
}

/// Raw buffer pointers, shared by the threads that run a launch's blocks.
struct Ptrs<const N: usize>([*mut u32; N]);
// SAFETY: the kernels write these buffers only through atomics or at indices no other thread
// of the launch touches, exactly as on a GPU.
unsafe impl<const N: usize> Sync for Ptrs<N> {}

/// The emulated device's own threads, as many as the process's pool has (one per core,
/// `RAYON_NUM_THREADS`, or the CLI's `--threads`). A launch runs
/// its blocks here, never on the caller's rayon pool: a rayon worker that waits for its own
/// pool steals that pool's other jobs, such as another tensor's whole operation, which would
/// then run nested inside this launch. (When the backend ran one operation at a time under a
/// lock, CI hung on that at stop 23, in the batch test's 7-thread pool: the stolen operation
/// waited for the lock its own thread held.)
fn device_threads() -> Result<&'static rayon::ThreadPool> {
    static POOL: OnceLock<std::result::Result<rayon::ThreadPool, String>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(rayon::current_num_threads())
            .thread_name(|i| format!("cuda-emulation-{i}"))
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| Error::Invalid(format!("CUDA emulation: cannot start its threads: {e}")))
}

/// Run a launch's blocks in ranges on the device's threads through `run(first, end)` (the C
/// entry point's return code, 0 for done): a few ranges per thread, since blocks differ in
/// cost (a short last chunk). The caller waits without running anything else.
fn run_blocks(grid: u32, symbol: &str, run: impl Fn(u32, u32) -> i32 + Sync) -> Result<()> {
    let pool = device_threads()?;
    let blocks = || {
        let per = grid.div_ceil(pool.current_num_threads() as u32 * 4).max(1);
        (0..grid.div_ceil(per))
            .into_par_iter()
            .map(|r| run(r * per, ((r + 1) * per).min(grid)))
            .find_any(|&rc| rc != 0)
    };
    let failed = if rayon::current_thread_index().is_some() {
        // From a worker of another pool, `install` would steal that pool's jobs while it
        // waits; a plain thread just blocks.
        std::thread::scope(|s| {
            s.spawn(|| pool.install(blocks))
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    } else {
        pool.install(blocks)
    };
    match failed {
        None => Ok(()),
        Some(rc) => Err(Error::Invalid(format!(
            "CUDA emulation refused {symbol} (code {rc})"
        ))),
    }
}

/// The C entry points' shared signature (`ls_emu_launch`, `ls_emu_launch_lm`): kernel,
/// grid, block, blocks [first, end), parameter words, buffer pointers.
type Entry = unsafe extern "C" fn(u32, u32, u32, u32, u32, *const u32, *const *mut u32) -> i32;

/// Launch kernel `id` of `entry` (its Params or LmParams as `words`) on `grid` blocks of
/// `block` threads, over the buffers `ptrs`.
fn run_launch<const N: usize>(
    entry: Entry,
    id: u32,
    symbol: &str,
    block: u32,
    grid: u32,
    words: &[u32],
    ptrs: Ptrs<N>,
) -> Result<()> {
    run_blocks(grid, symbol, |first, end| {
        let ptrs = &ptrs;
        // SAFETY: the parameter block is the kernels' whole (`Params` or `LmParams`); the
        // buffers live until this call returns and are as large as the host code sized them
        // for the kernel (the same sizes the GPU gets).
        unsafe { entry(id, grid, block, first, end, words.as_ptr(), ptrs.0.as_ptr()) }
    })
}

impl Launcher for HostEmulation {
    type Buf = HostBuf;

    fn describe(&self) -> String {
        "CUDA kernels, host emulation on the CPU (not a GPU)".into()
    }

    /// Another handle on the same emulated device: it has no streams to separate (every
    /// call is done when it returns) and no state but the device's threads, which are
    /// shared. Forks' launches from different threads do run at once, their blocks
    /// interleaved on those threads, as several streams' kernels share a GPU.
    fn fork(&self) -> Result<HostEmulation> {
        Ok(HostEmulation(()))
    }

    fn upload(&self, words: &[u32]) -> Result<HostBuf> {
        let mut v: Vec<AtomicU32> = words.iter().map(|&w| AtomicU32::new(w)).collect();
        v.resize_with(v.len().max(4), || AtomicU32::new(0));
        Ok(HostBuf(v.into_boxed_slice()))
    }

    fn zeroed(&self, words: usize) -> Result<HostBuf> {
        Ok(HostBuf(
            (0..words.max(4)).map(|_| AtomicU32::new(0)).collect(),
        ))
    }

    fn write(&self, buf: &mut HostBuf, at: usize, words: &[u32]) -> Result<()> {
        let dst = buf
            .0
            .get(at..at + words.len())
            .ok_or_else(|| Error::Invalid("CUDA emulation: write past a buffer's end".into()))?;
        for (d, &w) in dst.iter().zip(words) {
            d.store(w, Ordering::Relaxed);
        }
        Ok(())
    }

    fn read(&self, buf: &HostBuf, words: usize) -> Result<Vec<u32>> {
        let src = buf
            .0
            .get(..words)
            .ok_or_else(|| Error::Invalid("CUDA emulation: read past a buffer's end".into()))?;
        Ok(src.iter().map(|a| a.load(Ordering::Relaxed)).collect())
    }

    fn launch_at(
        &self,
        kernel: Kernel,
        grid: u32,
        p: &Params,
        bufs: [&HostBuf; 6],
        at: [usize; 6],
    ) -> Result<()> {
        let words = p.words();
        if bufs.iter().zip(at).any(|(b, at)| at > b.0.len()) {
            return Err(Error::Invalid(format!(
                "CUDA emulation: {} launched past a buffer's end",
                kernel.symbol()
            )));
        }
        // SAFETY: each offset is within its buffer (checked above).
        let ptrs: Ptrs<6> = Ptrs(std::array::from_fn(|i| unsafe {
            bufs[i].0.as_ptr().add(at[i]) as *mut u32
        }));
        run_launch(
            ls_emu_launch,
            kernel as u32,
            kernel.symbol(),
            kernel.block(),
            grid,
            &words,
            ptrs,
        )
    }

    // Streaming in call order: a copy is done when `copy_in` returns, so the events are
    // only the CPU clock's readings (for `mark` and `seconds`).
    type Staging = Vec<u32>;
    type Event = Instant;

    fn staging(&self, words: usize) -> Result<Vec<u32>> {
        Ok(vec![0; words])
    }

    fn staging_words<'s>(&self, s: &'s mut Vec<u32>) -> Result<&'s mut [u32]> {
        Ok(s)
    }

    fn copy_in(
        &self,
        src: &Vec<u32>,
        words: usize,
        dst: &mut HostBuf,
        at: usize,
    ) -> Result<Instant> {
        let src = src
            .get(..words)
            .ok_or_else(|| Error::Invalid("CUDA emulation: copy past a staging buffer".into()))?;
        self.write(dst, at, src)?;
        Ok(Instant::now())
    }

    fn copies_after_kernels(&self) -> Result<()> {
        Ok(())
    }

    fn kernels_after(&self, _: &Instant) -> Result<()> {
        Ok(())
    }

    fn wait(&self, _: &Instant) -> Result<()> {
        Ok(())
    }

    fn mark(&self) -> Result<Instant> {
        Ok(Instant::now())
    }

    fn seconds(&self, from: &Instant, to: &Instant) -> Result<f64> {
        Ok(to.saturating_duration_since(*from).as_secs_f64())
    }

    fn copy_on_device(&self, src: &HostBuf, dst: &mut HostBuf, words: usize) -> Result<()> {
        let words = self.read(src, words)?;
        self.write(dst, 0, &words)
    }

    fn launch_lm(
        &self,
        kernel: LmKernel,
        grid: u32,
        p: &LmParams,
        bufs: [&HostBuf; 8],
    ) -> Result<()> {
        let words = p.words();
        let ptrs = Ptrs(bufs.map(|b| b.0.as_ptr() as *mut u32));
        run_launch(
            ls_emu_launch_lm,
            kernel as u32,
            kernel.symbol(),
            kernel.block(),
            grid,
            &words,
            ptrs,
        )
    }
}
