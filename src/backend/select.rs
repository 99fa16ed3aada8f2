//! Choosing a device: `--backend auto|cpu|wgpu|cuda|reference`, and what `lockstep backends`
//! lists. A requested device that is missing is an error; `auto` falls back, and says so.

use super::cpu::CpuBackend;
use super::reference::ReferenceBackend;
use super::wgpu::{self as gpu, WgpuBackend};
use super::{Backend, Device};
use crate::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// A discrete wgpu adapter for the delta codec, else the CPU; the language model on the
    /// CPU (no GPU has LM kernels yet; there is no CUDA device in this build).
    Auto,
    Cpu,
    Wgpu,
    Cuda,
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

const NO_CUDA: &str = "CUDA is not built into this version of lockstep (no CUDA kernels yet): \
use --backend wgpu for a GPU, or --backend cpu";

/// The device for `choice`, and what a person should be told about the choice (a fallback).
pub fn select(choice: BackendChoice) -> Result<(Device, Option<String>)> {
    match choice {
        BackendChoice::Cpu => Ok((Device::cpu(), None)),
        BackendChoice::Reference => Ok((Device::reference(), None)),
        BackendChoice::Cuda => Err(Error::Unsupported(NO_CUDA.into())),
        BackendChoice::Wgpu => Ok((Device::wgpu(false)?, None)),
        BackendChoice::Auto => match WgpuBackend::new(true) {
            Ok(b) => {
                let note = format!(
                    "auto: no CUDA in this build; using wgpu on {} for checkpoints (the text \
                     codec's auto is the CPU)",
                    b.device()
                );
                Ok((Device::wgpu_from(b), Some(note)))
            }
            Err(e) => {
                let why = match e {
                    Error::Unsupported(m) => m,
                    other => other.to_string(),
                };
                Ok((
                    Device::cpu(),
                    Some(format!(
                        "auto: no CUDA in this build; {why}; using the CPU backend"
                    )),
                ))
            }
        },
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
        Found {
            name: "cuda",
            usable: false,
            detail: NO_CUDA.into(),
        },
    ];
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
