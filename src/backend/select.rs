//! Choosing a device: `--backend auto|cpu|wgpu|cuda|cuda-emulated|reference`, and what
//! `lockstep backends` lists. A requested device that is missing is an error; `auto` falls back, and says so.

use super::cpu::CpuBackend;
use super::reference::ReferenceBackend;
use super::wgpu as gpu;
use super::{Backend, Device};
use crate::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// The CPU for both codecs (the GPU paths are slower today; see `auto` below).
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

/// `auto`: the CPU, for both codecs. The GPU paths write the same bytes, but on the one GPU
/// machine measured (an NVIDIA H200 beside 16 CPU threads, docs/BENCHMARKS.md, 2026-12-04)
/// they were slower than the CPU: a CUDA delta encode at 20 MB/s against the CPU's 298, the
/// timed trajectory's resident CUDA encode at 0.17 GB/s. Until their kernels are fast, a GPU
/// runs only where it is asked for by name.
fn auto() -> Result<(Device, Option<String>)> {
    Ok((
        Device::cpu(),
        Some(
            "auto: the CPU (faster than this build's GPU paths where measured; \
             --backend cuda or wgpu asks for a GPU)"
                .into(),
        ),
    ))
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
