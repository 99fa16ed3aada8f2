//! Choosing a device: `--backend auto|cpu|wgpu|cuda|cuda-emulated|reference`, and what
//! `lockstep backends` lists. A requested device that is missing is an error; `auto` falls back, and says so.

use super::cpu::CpuBackend;
use super::reference::ReferenceBackend;
use super::wgpu::{self as gpu, WgpuBackend};
use super::{Backend, Device};
use crate::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// A CUDA GPU for the delta codec, else a discrete wgpu adapter, else the CPU; the
    /// language model on the CPU (no GPU has LM kernels yet).
    Auto,
    Cpu,
    Wgpu,
    Cuda,
    /// The CUDA kernels on the CPU through their host emulation (tests; never `auto`).
    CudaEmulated,
    /// The readable references (slow; for checks).
    Reference,
}

/// One line of `lockstep backends`.
#[derive(Clone, Debug)]
pub struct Found {
    pub name: &'static str,
    pub usable: bool,
    pub detail: String,
}

/// The device for `choice`, and what a person should be told about the choice (a fallback).
pub fn select(choice: BackendChoice) -> Result<(Device, Option<String>)> {
    match choice {
        BackendChoice::Cpu => Ok((Device::cpu(), None)),
        BackendChoice::Reference => Ok((Device::reference(), None)),
        BackendChoice::Cuda => Ok((Device::cuda()?, None)),
        BackendChoice::CudaEmulated => Ok((Device::cuda_emulated()?, None)),
        BackendChoice::Wgpu => Ok((Device::wgpu(false)?, None)),
        BackendChoice::Auto => auto(),
    }
}

/// `auto`: CUDA where it works, else a discrete GPU through wgpu, else the CPU.
fn auto() -> Result<(Device, Option<String>)> {
    let no_cuda = match Device::cuda() {
        Ok(d) => {
            let note = format!(
                "auto: using CUDA on {} for checkpoints, the CPU for the language model",
                d.describe()
            );
            // Text stays on the CPU until the CUDA LM's parity has run on a GPU.
            return Ok((d.lm_of(&Device::cpu()), Some(note)));
        }
        Err(Error::Unsupported(m)) => m,
        Err(other) => other.to_string(),
    };
    match WgpuBackend::new(true) {
        Ok(b) => {
            let note = format!(
                "auto: {no_cuda}; using wgpu on {} for checkpoints, the CPU \
                     for the language model",
                b.device()
            );
            Ok((Device::wgpu_from(b).lm_from(&Device::cpu()), Some(note)))
        }
        Err(e) => {
            let why = match e {
                Error::Unsupported(m) => m,
                other => other.to_string(),
            };
            Ok((
                Device::cpu(),
                Some(format!("auto: {no_cuda}; {why}; using the CPU backend")),
            ))
        }
    }
}

/// Every backend this build knows, whether it can run here, and on what.
pub fn available() -> Vec<Found> {
    let mut out = vec![
        Found {
            name: "cpu",
            usable: true,
            detail: CpuBackend.device(),
        },
        Found {
            name: "reference",
            usable: true,
            detail: ReferenceBackend.device(),
        },
    ];
    out.push(match Device::cuda() {
        Ok(d) => Found {
            name: "cuda",
            usable: true,
            detail: d.delta().map(|b| b.device()).unwrap_or_default(),
        },
        Err(e) => Found {
            name: "cuda",
            usable: false,
            detail: match e {
                Error::Unsupported(m) => m,
                other => other.to_string(),
            },
        },
    });
    out.push(match Device::cuda_emulated() {
        Ok(d) => Found {
            name: "cuda-emulated",
            usable: true,
            detail: format!(
                "{} (for tests; slow)",
                d.delta().map(|b| b.device()).unwrap_or_default()
            ),
        },
        Err(e) => Found {
            name: "cuda-emulated",
            usable: false,
            detail: e.to_string(),
        },
    });
    let adapters = gpu::adapters();
    if adapters.is_empty() {
        out.push(Found {
            name: "wgpu",
            usable: false,
            detail: "no adapter found (on Linux: apt-get install mesa-vulkan-drivers libvulkan1)"
                .into(),
        });
    }
    for a in adapters {
        out.push(Found {
            name: "wgpu",
            usable: true,
            detail: a,
        });
    }
    out
}
