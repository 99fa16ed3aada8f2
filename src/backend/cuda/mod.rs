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
//! Residuals, codes and the reference stay on the device between stages; data comes back
//! only as histograms, per-chunk totals and the coded output.

mod crc;
mod decode;
pub mod driver;
#[cfg(cuda_emulation)]
pub mod emulated;
mod encode;
pub mod launch;
pub mod lm;
pub mod nvrtc;

use super::wgpu::params::Params;
use super::wgpu::{check_len, u32s};
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
    /// One operation at a time: a device is the parallel part.
    lock: std::sync::Mutex<()>,
}

impl<L: Launcher> CudaBackend<L> {
    pub fn new(dev: L, name: &'static str) -> Self {
        CudaBackend {
            dev,
            name,
            lock: std::sync::Mutex::new(()),
        }
    }

    fn one_at_a_time(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Blocks for one thread per element (or per `per` elements).
fn blocks(n: usize) -> u32 {
    n.div_ceil(launch::BLOCK as usize) as u32
}

/// A byte buffer as u32 words, zero-padded.
fn words_of(bytes: &[u8]) -> Vec<u32> {
    let mut w = u32s(bytes);
    let rest = &bytes[w.len() * 4..];
    if !rest.is_empty() {
        let mut last = [0u8; 4];
        last[..rest.len()].copy_from_slice(rest);
        w.push(u32::from_le_bytes(last));
    }
    w
}

impl<L: Launcher> Backend for CudaBackend<L> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn device(&self) -> String {
        self.dev.describe()
    }

    fn residuals<'a>(&'a self, job: &EncodeJob<'a>) -> Result<Box<dyn Resident + 'a>> {
        let _one = self.one_at_a_time();
        let size = (job.fl.width / 8) as usize;
        let n = job.reference.len() / size;
        check_len(n)?;
        let d = &self.dev;
        let mut refs = words_of(job.reference);
        refs.extend([0, 0]);
        let mut tgts = words_of(job.target);
        tgts.extend([0, 0]);
        let r = CudaResident {
            b: self,
            base: Params::new(job.fl, n, job.condition),
            n,
            size,
            refs: d.upload(&refs)?,
            tgts: d.upload(&tgts)?,
            resid: d.zeroed((n * size).div_ceil(4) + 2)?,
            codes: d.zeroed(n.div_ceil(2))?,
        };
        d.launch(
            Kernel::Residuals,
            blocks(n),
            &r.base,
            [&r.refs, &r.tgts, &r.resid, &r.codes, &r.codes, &r.codes],
        )?;
        Ok(Box::new(r))
    }

    fn decode(&self, job: &DecodeJob) -> Result<Vec<u8>> {
        let _one = self.one_at_a_time();
        Ok(self.decode_inner(job, false)?.out)
    }

    /// The CRCs of the output and the reference are computed on the device
    /// (kernels/crc32.cu), where both tensors are.
    fn decode_checked(&self, job: &DecodeJob) -> Result<Checked> {
        let _one = self.one_at_a_time();
        self.decode_inner(job, true)
    }
}
