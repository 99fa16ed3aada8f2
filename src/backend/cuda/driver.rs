//! A real GPU through cudarc's driver API, loaded at run time: the crate builds and runs on
//! machines without CUDA. The driver library is probed before a context is created (cudarc
//! panics when it is missing), so its absence is a plain "no CUDA driver" error.
//!
//! [`Launcher::fork`] gives the same context and compiled kernels on two new streams: the
//! backend runs each tensor's operation on one fork (src/backend/cuda/mod.rs), so several
//! tensors' kernels and copies are on the GPU at once.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, CudaView, DevicePtrMut,
    LaunchConfig, PinnedHostSlice, PushKernelArg,
};

use super::launch::{Kernel, Launcher};
use super::lm::kernels::{LmKernel, LmParams};
use super::nvrtc::Nvrtc;
use crate::backend::wgpu::params::Params;
use crate::{Error, Result};

/// One CUDA device (ordinal 0) with the kernels compiled for its architecture.
///
/// Two streams: `stream` runs the kernels and every read and allocation in order; `copies`
/// runs the staged host-to-device copies of src/backend/cuda/stream.rs, ordered against the
/// kernels only by the events that code asks for. cudarc's own per-buffer event tracking is
/// off: it orders whole buffers, so a copy into piece k+1 of a tensor would wait for the
/// kernel still reading piece k, which is the overlap streaming is for. A fork
/// ([`Launcher::fork`]) has two streams of its own and shares the context and the compiled
/// functions; nothing orders its streams with another fork's, so a buffer is only ever used
/// by the driver (fork) that allocated it.
pub struct CudaDriver {
    stream: Arc<CudaStream>,
    copies: Arc<CudaStream>,
    functions: Vec<CudaFunction>,
    /// The language model's kernels, compiled on first use (a delta-only run never does);
    /// shared with every fork, so they are compiled once.
    lm: Arc<LmFunctions>,
    arch: String,
    describe: String,
}

/// The language model's compiled kernels, or why they did not compile.
type LmFunctions = std::sync::OnceLock<std::result::Result<Vec<CudaFunction>, String>>;

fn driver_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::Invalid(format!("CUDA {what}: {e:?}"))
}

/// Whether the CUDA driver library can be loaded, before anything asks cudarc for it.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library by its usual names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

impl CudaDriver {
    /// Open device 0 and compile the kernels for it, or say why not.
    pub fn open() -> Result<CudaDriver> {
        if !driver_present() {
            return Err(Error::Unsupported(
                "no CUDA driver (libcuda.so not found)".into(),
            ));
        }
        // cudarc panics on a driver without the symbols it expects; that is this device's
        // absence too, not the process's end.
        std::panic::catch_unwind(Self::open_inner).unwrap_or_else(|p| {
            let why = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(Error::Unsupported(format!("the CUDA driver failed: {why}")))
        })
    }

    fn open_inner() -> Result<CudaDriver> {
        let ctx = CudaContext::new(0)
            .map_err(|e| Error::Unsupported(format!("no usable CUDA device: {e:?}")))?;
        // SAFETY: before any buffer exists. From here on this driver and its forks order
        // their streams themselves: a buffer is allocated, used by kernels and freed on the
        // `stream` of the driver (or fork) that allocated it, and no other driver's streams
        // touch it (CudaBackend gives each operation one fork; a resident tensor keeps its
        // fork until it is dropped; the LM uses only the first driver); `copies` writes
        // into it only between a `copies_after_kernels` and a `kernels_after` of the copy's
        // event (stream.rs), so nothing is freed or read while a copy is pending.
        unsafe { ctx.disable_event_tracking() };
        keep_freed_memory(&ctx);
        // Non-blocking streams: the legacy default stream would serialize the two.
        let stream = ctx.new_stream().map_err(driver_err("stream"))?;
        let copies = ctx.new_stream().map_err(driver_err("stream"))?;
        let name = ctx.name().map_err(driver_err("device name"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver_err("compute capability"))?;
        let nvrtc = Nvrtc::open(None)?;
        let arch = format!("compute_{major}{minor}");
        let mut functions = Vec::new();
        let mut modules = Vec::new();
        for (file, ptx) in compile_all(&nvrtc, super::kernel_sources(), &arch) {
            let m = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx?))
                .map_err(driver_err("module load"))?;
            modules.push((file, m));
        }
        for k in Kernel::ALL {
            let m = &modules.iter().find(|(f, _)| *f == k.module()).unwrap().1;
            functions.push(
                m.load_function(k.symbol())
                    .map_err(driver_err("kernel lookup"))?,
            );
        }
        Ok(CudaDriver {
            stream,
            copies,
            functions,
            lm: Arc::new(std::sync::OnceLock::new()),
            arch,
            describe: format!("{name} (CUDA, sm_{major}{minor})"),
        })
    }
}

/// Buffers come from the device's default stream-ordered pool (cudarc allocates with
/// `cuMemAllocAsync`), whose release threshold is 0 by default: at every synchronization
/// (each read back: the LM reads once per step, the delta codec several times per tensor)
/// the pool hands its free memory back to the system and the next allocation maps it again,
/// which is known to be slow (NVIDIA/cuda-python#771 raised the threshold for the same
/// reason). Freed memory now stays in the pool, up to the process's peak use. Set before
/// any timing of ours; what it gains on a GPU is not measured yet. Best effort: where the
/// driver refuses, only speed differs.
fn keep_freed_memory(ctx: &CudaContext) {
    use cudarc::driver::sys;
    // SAFETY: the pool handle comes from the driver for this context's device and is only
    // passed back to it; the attribute's value is a u64, as the release threshold takes.
    let pools = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED;
    if ctx.attribute(pools).unwrap_or(0) == 0 {
        return; // (cudarc then allocates without a pool)
    }
    unsafe {
        let mut pool = std::mem::MaybeUninit::<sys::CUmemoryPool>::uninit();
        if ctx.bind_to_thread().is_err()
            || sys::cuDeviceGetDefaultMemPool(pool.as_mut_ptr(), ctx.cu_device())
                != sys::CUresult::CUDA_SUCCESS
        {
            return;
        }
        let mut keep = u64::MAX;
        let _ = sys::cuMemPoolSetAttribute(
            pool.assume_init(),
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut keep as *mut u64).cast(),
        );
    }
}

/// Every module's PTX, compiled at once on threads of their own (NVRTC compiles separate
/// programs concurrently): a process's first launch waits for the slowest module, not for
/// their sum.
fn compile_all(
    nvrtc: &Nvrtc,
    sources: Vec<(&'static str, String, Vec<&'static str>)>,
    arch: &str,
) -> Vec<(&'static str, Result<String>)> {
    std::thread::scope(|s| {
        let jobs: Vec<_> = sources
            .iter()
            .map(|(file, source, _)| (*file, s.spawn(move || nvrtc.compile(file, source, arch))))
            .collect();
        jobs.into_iter()
            .map(|(file, job)| {
                let ptx = job.join().unwrap_or_else(|_| {
                    Err(Error::Invalid(format!("NVRTC panicked compiling {file}")))
                });
                (file, ptx)
            })
            .collect()
    })
}

impl CudaDriver {
    fn lm_functions(&self) -> Result<&[CudaFunction]> {
        self.lm
            .get_or_init(|| {
                let nvrtc = Nvrtc::open(None).map_err(|e| e.to_string())?;
                let ctx = self.stream.context();
                let mut modules = Vec::new();
                let sources = super::lm::kernels::kernel_sources();
                for (file, ptx) in compile_all(&nvrtc, sources, &self.arch) {
                    let ptx = ptx.map_err(|e| e.to_string())?;
                    let m = ctx
                        .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                        .map_err(|e| format!("CUDA module load: {e:?}"))?;
                    modules.push((file, m));
                }
                LmKernel::ALL
                    .iter()
                    .map(|k| {
                        let m = &modules.iter().find(|(f, _)| *f == k.module()).unwrap().1;
                        m.load_function(k.symbol())
                            .map_err(|e| format!("CUDA kernel lookup: {e:?}"))
                    })
                    .collect()
            })
            .as_deref()
            .map_err(|e| Error::Unsupported(e.clone()))
    }
}

impl Launcher for CudaDriver {
    type Buf = CudaSlice<u32>;

    fn describe(&self) -> String {
        self.describe.clone()
    }

    /// Two new non-blocking streams of the same context; the compiled functions (and the
    /// LM's, compiled or not yet) are shared, so a fork costs two streams, not a compile.
    fn fork(&self) -> Result<CudaDriver> {
        let ctx = self.stream.context();
        Ok(CudaDriver {
            stream: ctx.new_stream().map_err(driver_err("stream"))?,
            copies: ctx.new_stream().map_err(driver_err("stream"))?,
            functions: self.functions.clone(),
            lm: self.lm.clone(),
            arch: self.arch.clone(),
            describe: self.describe.clone(),
        })
    }

    fn upload(&self, words: &[u32]) -> Result<CudaSlice<u32>> {
        if words.len() < 4 {
            let mut w = words.to_vec();
            w.resize(4, 0);
            return self.upload(&w);
        }
        self.stream.clone_htod(words).map_err(driver_err("upload"))
    }

    fn zeroed(&self, words: usize) -> Result<CudaSlice<u32>> {
        self.stream
            .alloc_zeros::<u32>(words.max(4))
            .map_err(driver_err("allocation"))
    }

    fn write(&self, buf: &mut CudaSlice<u32>, at: usize, words: &[u32]) -> Result<()> {
        let mut dst = buf.slice_mut(at..at + words.len());
        self.stream
            .memcpy_htod(words, &mut dst)
            .map_err(driver_err("copy to the device"))
    }

    fn read(&self, buf: &CudaSlice<u32>, words: usize) -> Result<Vec<u32>> {
        self.stream
            .clone_dtoh(&buf.slice(..words))
            .map_err(driver_err("copy from the device"))
    }

    fn launch_at(
        &self,
        kernel: Kernel,
        grid: u32,
        p: &Params,
        bufs: [&CudaSlice<u32>; 6],
        at: [usize; 6],
    ) -> Result<()> {
        let f = &self.functions[kernel as usize];
        let views = bufs
            .iter()
            .zip(at)
            .map(|(b, at)| b.try_slice(at..))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "CUDA {}: launched past a buffer's end",
                    kernel.symbol()
                ))
            })?;
        // SAFETY: every delta kernel takes (Params, six u32 pointers), sized by the host code.
        unsafe { self.run(f, grid, kernel.block(), &p.words(), &views, kernel.symbol()) }
    }

    fn free_memory(&self) -> Option<usize> {
        self.stream
            .context()
            .mem_get_info()
            .ok()
            .map(|(free, _)| free)
    }

    fn launch_lm(
        &self,
        kernel: LmKernel,
        grid: u32,
        p: &LmParams,
        bufs: [&CudaSlice<u32>; 8],
    ) -> Result<()> {
        let f = &self.lm_functions()?[kernel as usize];
        let views = bufs.map(|b| b.as_view());
        // SAFETY: every LM kernel takes (LmParams, eight u32 pointers), sized by the host code.
        unsafe { self.run(f, grid, kernel.block(), &p.words(), &views, kernel.symbol()) }
    }

    /// Page-locked and write-combined: the host only writes it, the device reads it over
    /// the bus at full speed (a pageable source goes through the driver's own staging copy).
    type Staging = PinnedHostSlice<u32>;
    type Event = CudaEvent;

    fn staging(&self, words: usize) -> Result<PinnedHostSlice<u32>> {
        // SAFETY: u32 has no invalid bit patterns; the host writes before any copy reads.
        unsafe { self.stream.context().alloc_pinned::<u32>(words.max(1)) }
            .map_err(driver_err("page-locked allocation"))
    }

    fn staging_words<'s>(&self, s: &'s mut PinnedHostSlice<u32>) -> Result<&'s mut [u32]> {
        s.as_mut_slice().map_err(driver_err("staging buffer"))
    }

    fn copy_in(
        &self,
        src: &PinnedHostSlice<u32>,
        words: usize,
        dst: &mut CudaSlice<u32>,
        at: usize,
    ) -> Result<CudaEvent> {
        if words > src.len() || at + words > dst.len() {
            return Err(Error::Invalid("CUDA: staged copy out of bounds".into()));
        }
        let ctx = self.copies.context();
        ctx.bind_to_thread().map_err(driver_err("context"))?;
        let host = src.as_ptr().map_err(driver_err("staging buffer"))?;
        // SAFETY: `words` words of the staging buffer (checked above); the caller does not
        // touch them again before waiting for the returned event.
        let host = unsafe { std::slice::from_raw_parts(host, words) };
        let mut view = dst.slice_mut(at..at + words);
        let (ptr, _record) = view.device_ptr_mut(&self.copies);
        // SAFETY: `ptr` is `words` words of `dst`; no kernel reads them before it waits for
        // the event recorded below (stream.rs).
        unsafe { cudarc::driver::result::memcpy_htod_async(ptr, host, self.copies.cu_stream()) }
            .map_err(driver_err("copy to the device"))?;
        self.copies.record_event(None).map_err(driver_err("event"))
    }

    fn copies_after_kernels(&self) -> Result<()> {
        self.copies
            .join(&self.stream)
            .map_err(driver_err("stream wait"))
    }

    fn kernels_after(&self, e: &CudaEvent) -> Result<()> {
        self.stream.wait(e).map_err(driver_err("stream wait"))
    }

    fn wait(&self, e: &CudaEvent) -> Result<()> {
        e.synchronize().map_err(driver_err("event wait"))
    }

    fn mark(&self) -> Result<CudaEvent> {
        self.stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver_err("timing event"))
    }

    fn seconds(&self, from: &CudaEvent, to: &CudaEvent) -> Result<f64> {
        from.elapsed_ms(to)
            .map(|ms| ms as f64 / 1e3)
            .map_err(driver_err("timing event"))
    }

    fn copy_on_device(
        &self,
        src: &CudaSlice<u32>,
        dst: &mut CudaSlice<u32>,
        words: usize,
    ) -> Result<()> {
        if words > src.len() || words > dst.len() {
            return Err(Error::Invalid("CUDA: device copy out of bounds".into()));
        }
        self.stream
            .memcpy_dtod(&src.slice(..words), &mut dst.slice_mut(..words))
            .map_err(driver_err("device copy"))
    }
}

impl CudaDriver {
    /// Launch `f` on `grid` blocks of `block` threads with the parameter words and buffers
    /// (nothing for an empty grid).
    ///
    /// # Safety
    /// `f` must take exactly a `[u32; N]` parameter block (`Params`: 36 words, `LmParams`:
    /// 32) and `bufs.len()` u32 pointers, and index them within the buffers' lengths.
    unsafe fn run<const N: usize>(
        &self,
        f: &CudaFunction,
        grid: u32,
        block: u32,
        words: &[u32; N],
        bufs: &[CudaView<'_, u32>],
        name: &str,
    ) -> Result<()> {
        if grid == 0 {
            return Ok(());
        }
        let mut b = self.stream.launch_builder(f);
        b.arg(words);
        for buf in bufs {
            b.arg(buf);
        }
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(driver_err(name))
    }
}
