//! The CUDA backend: every per-element stage of the delta codec as a CUDA kernel
//! (kernels/*.cu, the WGSL shaders' design: same buffers, same prefix sums, same bytes).
//! The host code here is written once against [`launch::Launcher`] and runs on two devices:
//!
//! - [`driver::CudaDriver`]: a real GPU through cudarc's driver API, loaded at run time (the
//!   crate builds and runs without CUDA); kernels compiled by NVRTC for the device's
//!   architecture, with the chunk geometry prepended from the Rust constants.
//! - [`emulated::HostEmulation`]: the same sources compiled as C for the CPU (build.rs), so
//!   the parity suite runs the kernels' logic in CI. An emulation: it proves the integer
//!   logic and indexing, not the CUDA compiler or the hardware. `auto` never picks it.
//!
//! Inputs go up in pieces through pinned staging buffers on a copy stream, each piece's
//! kernels overlapping the next pieces' copies ([`stream`]). Residuals, codes and the
//! reference stay on the device between stages; data comes back only as histograms,
//! per-chunk totals and the coded output. [`trajectory`] times all of it for gpu-check.
//!
//! Several tensors are in flight at once: each operation (residuals and the resident tensor
//! they give, a decode) runs on an engine of its own, a [`Launcher::fork`] (on a GPU, a
//! kernel stream and a copy stream of its own) with its own staging ring, taken from a pool
//! that grows to as many engines as operations were ever in flight together. One tensor's
//! lanes are one warp per chunk, a few warps; the CLI's rayon threads (a batch's tensors)
//! fill the device together.

mod crc;
mod decode;
pub mod driver;
#[cfg(cuda_emulation)]
pub mod emulated;
mod encode;
pub mod launch;
pub mod lm;
pub mod nvrtc;
pub mod profile;
pub mod stream;
#[cfg(all(test, cuda_emulation))]
mod tests;
pub mod trajectory;

use super::wgpu::check_len;
use super::wgpu::params::Params;
use super::{Backend, Checked, DecodeJob, EncodeJob, Resident};
use crate::format::chunk::{CHUNK_ELEMS, LANES};
use crate::Result;
use encode::CudaResident;
use launch::{Kernel, Launcher};

const LOCKSTEP_CUH: &str = include_str!("../../../kernels/lockstep.cuh");
const RESIDUAL_CU: &str = include_str!("../../../kernels/residual.cu");
const ENCODE_CU: &str = include_str!("../../../kernels/encode.cu");
const DECODE_CU: &str = include_str!("../../../kernels/decode.cu");
const CRC32_CU: &str = include_str!("../../../kernels/crc32.cu");

/// Every kernel module as NVRTC compiles it: `(file name, full source, kernels it defines)`.
/// The chunk geometry is prepended from the Rust constants, so kernels and host cannot
/// disagree on it.
pub fn kernel_sources() -> Vec<(&'static str, String, Vec<&'static str>)> {
    let head = format!(
        "#define CHUNK {CHUNK_ELEMS}u\n#define GROUPS {}u\n",
        CHUNK_ELEMS / LANES * 4
    );
    [
        ("residual.cu", RESIDUAL_CU),
        ("encode.cu", ENCODE_CU),
        ("decode.cu", DECODE_CU),
        ("crc32.cu", CRC32_CU),
    ]
    .into_iter()
    .map(|(file, body)| {
        let kernels = Kernel::ALL
            .iter()
            .filter(|k| k.module() == file)
            .map(|k| k.symbol())
            .collect();
        (file, format!("{head}{LOCKSTEP_CUH}\n{body}"), kernels)
    })
    .collect()
}

/// The delta codec's kernels on a [`Launcher`].
pub struct CudaBackend<L: Launcher> {
    dev: L,
    name: &'static str,
    /// Bytes per piece of every engine's staging ring.
    piece_bytes: usize,
    /// The engines no operation holds, for the next ones to take (see [`Engine`]).
    idle: std::sync::Mutex<Vec<Engine<L>>>,
    /// Engines made so far: as many as operations were ever in flight at once.
    engines: std::sync::atomic::AtomicUsize,
    /// Each operation's start and end marks, while gpu-check's timed trajectory asks for
    /// them (trajectory.rs); `None` otherwise.
    marks: std::sync::Mutex<Option<Vec<StageMarks<L>>>>,
}

/// What one operation runs on: a launcher with streams of its own and the staging ring its
/// inputs stream through. Operations on different engines overlap on the device (several
/// tensors in flight: one tensor's kernels leave most of a GPU idle); an engine runs one
/// operation at a time. A resident tensor holds its engine until it is dropped, since its
/// buffers live on that engine's streams. Engines are made on demand, never more than the
/// operations in flight at once (so a thread holding a resident that also decodes simply
/// gets a second one), and kept for reuse: a fork's streams and pinned staging cost far
/// more than an operation's wait for the pool's lock.
struct Engine<L: Launcher> {
    /// `None`: the backend's own launcher (the first engine); otherwise a fork of it.
    fork: Option<L>,
    ring: stream::Ring<L>,
}

/// An engine taken from the pool for one operation; back in the pool when dropped.
pub(crate) struct Engaged<'a, L: Launcher> {
    b: &'a CudaBackend<L>,
    /// Always `Some` until dropped.
    engine: Option<Engine<L>>,
}

impl<L: Launcher> Engaged<'_, L> {
    /// The engine's launcher.
    fn dev(&self) -> &L {
        let e = self.engine.as_ref().expect("an engaged engine");
        e.fork.as_ref().unwrap_or(&self.b.dev)
    }

    /// The engine's launcher and its staging ring.
    fn parts(&mut self) -> (&L, &mut stream::Ring<L>) {
        let e = self.engine.as_mut().expect("an engaged engine");
        (e.fork.as_ref().unwrap_or(&self.b.dev), &mut e.ring)
    }
}

impl<L: Launcher> Drop for Engaged<'_, L> {
    fn drop(&mut self) {
        if let Some(e) = self.engine.take() {
            self.b
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(e);
        }
    }
}

/// One operation of the codec on the device, between two timing marks.
pub struct StageMarks<L: Launcher> {
    pub stage: Stage,
    pub from: L::Event,
    pub to: L::Event,
}

/// The device operations the codec calls, as timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Reference and target streamed in, residuals computed piece by piece.
    Residuals,
    /// Symbol codes and histograms of every requested layout, counts read back.
    Histograms,
    /// Lanes (both passes), prefix sums, tails, coded chunks read back.
    Encode,
    /// Reference and stream streamed in, lanes, tails, CRCs, the tensor read back.
    Decode,
    /// Within [`Stage::Decode`]: the lane and tail kernels alone, on resident data.
    DecodeKernels,
}

impl<L: Launcher> CudaBackend<L> {
    pub fn new(dev: L, name: &'static str) -> Self {
        Self::with_piece_bytes(dev, name, stream::PIECE_BYTES)
    }

    /// The same with pieces of `piece_bytes` (tests: many pieces from small tensors).
    pub fn with_piece_bytes(dev: L, name: &'static str, piece_bytes: usize) -> Self {
        CudaBackend {
            dev,
            name,
            piece_bytes,
            idle: std::sync::Mutex::new(vec![Engine {
                fork: None,
                ring: stream::Ring::new(piece_bytes),
            }]),
            engines: std::sync::atomic::AtomicUsize::new(1),
            marks: std::sync::Mutex::new(None),
        }
    }

    /// An idle engine (the backend's own launcher first, so that one caller at a time runs
    /// where [`CudaBackend::launcher`]'s marks are), or a new fork when every engine is busy.
    fn engage(&self) -> Result<Engaged<'_, L>> {
        let idle = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            match idle.iter().position(|e| e.fork.is_none()) {
                Some(first) => Some(idle.swap_remove(first)),
                None => idle.pop(),
            }
        };
        let engine = match idle {
            Some(e) => e,
            // Forked outside the lock: making streams takes a while.
            None => {
                let fork = self.dev.fork()?;
                self.engines
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Engine {
                    fork: Some(fork),
                    ring: stream::Ring::new(self.piece_bytes),
                }
            }
        };
        Ok(Engaged {
            b: self,
            engine: Some(engine),
        })
    }

    /// Engines made so far: the most operations that were in flight at once (at least 1).
    pub fn engines(&self) -> usize {
        self.engines.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Start (or stop) recording each operation's marks.
    pub fn record_stages(&self, on: bool) {
        *self.marks.lock().unwrap_or_else(|e| e.into_inner()) = on.then(Vec::new);
    }

    /// The marks recorded since the last call.
    pub fn take_stages(&self) -> Vec<StageMarks<L>> {
        let mut m = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        m.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// `op` on engine launcher `dev`, between two of its marks when recording. The marks
    /// lock is never held across `op`.
    fn timed<T>(&self, dev: &L, stage: Stage, op: impl FnOnce() -> Result<T>) -> Result<T> {
        let from = self.inner_mark(dev)?;
        let v = op()?;
        self.inner_stage(dev, stage, from)?;
        Ok(v)
    }

    /// A mark on `dev`, when recording (an operation's, or a stage's within one).
    fn inner_mark(&self, dev: &L) -> Result<Option<L::Event>> {
        let on = self
            .marks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        on.then(|| dev.mark()).transpose()
    }

    /// Record `stage` from an [`CudaBackend::inner_mark`] to a mark on `dev` now.
    fn inner_stage(&self, dev: &L, stage: Stage, from: Option<L::Event>) -> Result<()> {
        let Some(from) = from else { return Ok(()) };
        let to = dev.mark()?;
        if let Some(m) = self
            .marks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            m.push(StageMarks { stage, from, to });
        }
        Ok(())
    }

    /// Copy `sources` into fresh device buffers through the staging ring and nothing else:
    /// the host-to-device copy alone, for the timed trajectory.
    pub fn copy_in_only(&self, sources: &[&[u8]]) -> Result<()> {
        let mut engine = self.engage()?;
        let (d, ring) = engine.parts();
        let len = sources.first().map_or(0, |s| s.len());
        let mut bufs = sources
            .iter()
            .map(|_| d.zeroed(len.div_ceil(4)))
            .collect::<Result<Vec<_>>>()?;
        let mut dsts: Vec<&mut L::Buf> = bufs.iter_mut().collect();
        stream::stream_in(d, ring, sources, &mut dsts, |_, _| Ok(()))
    }

    /// The device (the first engine's launcher).
    pub fn launcher(&self) -> &L {
        &self.dev
    }
}

/// Blocks for one thread per element (or per `per` elements).
fn blocks(n: usize) -> u32 {
    n.div_ceil(launch::BLOCK as usize) as u32
}

impl<L: Launcher> Backend for CudaBackend<L> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn device(&self) -> String {
        self.dev.describe()
    }

    /// The reference and target stream in piece by piece (stream.rs); each piece's
    /// residuals are computed while the next pieces copy.
    fn residuals<'a>(&'a self, job: &EncodeJob<'a>) -> Result<Box<dyn Resident + 'a>> {
        let engine = self.engage()?;
        let from = self.inner_mark(engine.dev())?;
        let resident = self.residuals_inner(engine, job)?;
        self.inner_stage(resident.engine.dev(), Stage::Residuals, from)?;
        Ok(Box::new(resident))
    }

    fn decode(&self, job: &DecodeJob) -> Result<Vec<u8>> {
        let mut engine = self.engage()?;
        let (d, ring) = engine.parts();
        self.timed(d, Stage::Decode, || {
            Ok(self.decode_inner(d, ring, job, false)?.out)
        })
    }

    /// The CRCs of the output and the reference are computed on the device
    /// (kernels/crc32.cu), where both tensors are.
    fn decode_checked(&self, job: &DecodeJob) -> Result<Checked> {
        let mut engine = self.engage()?;
        let (d, ring) = engine.parts();
        self.timed(d, Stage::Decode, || self.decode_inner(d, ring, job, true))
    }
}

impl<L: Launcher> CudaBackend<L> {
    fn residuals_inner<'a>(
        &'a self,
        mut engine: Engaged<'a, L>,
        job: &EncodeJob<'a>,
    ) -> Result<CudaResident<'a, L>> {
        let size = (job.fl.width / 8) as usize;
        let n = job.reference.len() / size;
        check_len(n)?;
        let (d, ring) = engine.parts();
        let bytes = n * size;
        // Two zero words past the end, as the kernels' wide loads expect.
        let mut refs = d.zeroed(bytes.div_ceil(4) + 2)?;
        let mut tgts = d.zeroed(bytes.div_ceil(4) + 2)?;
        let resid = d.zeroed(bytes.div_ceil(4) + 2)?;
        let codes = d.zeroed(n.div_ceil(2))?;
        stream::stream_in(
            d,
            ring,
            &[&job.reference[..bytes], &job.target[..bytes]],
            &mut [&mut refs, &mut tgts],
            |piece, up| {
                // Pieces start on word and element boundaries; the displacements are packed
                // like the input, so every buffer is seen from the same word.
                let count = piece.len() / size;
                let at = piece.start / 4;
                d.launch_at(
                    Kernel::Residuals,
                    blocks(count),
                    &Params::new(job.fl, count, job.condition),
                    [up[0], up[1], &resid, &codes, &codes, &codes],
                    [at, at, at, 0, 0, 0],
                )
            },
        )?;
        Ok(CudaResident {
            b: self,
            base: Params::new(job.fl, n, job.condition),
            n,
            size,
            refs,
            tgts,
            resid,
            codes,
            engine,
        })
    }
}
