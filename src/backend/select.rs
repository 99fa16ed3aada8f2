//! Choosing a backend: `--backend auto|cpu|wgpu|cuda|reference`, and what `lockstep backends`
//! lists. A requested device that is missing is an error; `auto` falls back, and says so.

use std::sync::Arc;

use super::cpu::CpuBackend;
use super::reference::ReferenceBackend;
use super::wgpu::{self as gpu, WgpuBackend};
use super::Backend;
use crate::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// CUDA, then a discrete wgpu adapter, then the fast CPU backend.
    Auto,
    Cpu,
    Wgpu,
    Cuda,
    /// The readable oracle (slow; for checks).
    Reference,
}

/// A chosen backend, and what a person should be told about the choice (a fallback).
pub struct Selected {
    pub backend: Arc<dyn Backend>,
    pub note: Option<String>,
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

pub fn select(choice: BackendChoice) -> Result<Selected> {
    let plain = |backend: Arc<dyn Backend>| Selected {
        backend,
        note: None,
    };
    match choice {
        BackendChoice::Cpu => Ok(plain(Arc::new(CpuBackend))),
        BackendChoice::Reference => Ok(plain(Arc::new(ReferenceBackend))),
        BackendChoice::Cuda => Err(Error::Unsupported(NO_CUDA.into())),
        BackendChoice::Wgpu => Ok(plain(Arc::new(WgpuBackend::new(false)?))),
        BackendChoice::Auto => match WgpuBackend::new(true) {
            Ok(b) => Ok(Selected {
                note: Some(format!(
                    "auto: no CUDA in this build; using wgpu on {}",
                    b.device()
                )),
                backend: Arc::new(b),
            }),
            Err(e) => {
                let why = match e {
                    Error::Unsupported(m) => m,
                    other => other.to_string(),
                };
                Ok(Selected {
                    backend: Arc::new(CpuBackend),
                    note: Some(format!(
                        "auto: no CUDA in this build; {why}; using the CPU backend"
                    )),
                })
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
