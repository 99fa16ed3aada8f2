//! [`Device`]: what `--backend` selects, offering each codec the kernels it has.

use std::sync::Arc;

use super::cpu::lm::CpuLm;
use super::cpu::{CpuAt, CpuBackend, Isa};
use super::cuda::launch::Launcher;
use super::cuda::lm::CudaLm;
use super::cuda::profile::{Profiled, Report};
use super::cuda::CudaBackend;
use super::lm::LmKernels;
use super::reference::ReferenceBackend;
use super::wgpu::WgpuBackend;
use super::Backend;
use crate::{Error, Result};

/// One compute device and the kernels it offers: the delta codec's ([`Backend`]) and the
/// integer GPT-2's ([`LmKernels`]). A device lacking one says why ([`Device::lm`]). Cheap to
/// clone; passed explicitly to every codec entry point that computes.
#[derive(Clone)]
pub struct Device {
    name: String,
    delta: std::result::Result<Arc<dyn Backend>, String>,
    lm: std::result::Result<Arc<dyn LmKernels>, String>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.describe())
    }
}

impl Default for Device {
    /// The CPU at its best instruction-set level.
    fn default() -> Self {
        Device::cpu()
    }
}

impl Device {
    /// The CPU at the best instruction-set level it runs ([`Isa::detect`]), for both codecs.
    pub fn cpu() -> Device {
        let isa = Isa::detect();
        Device {
            name: "cpu".into(),
            delta: Ok(Arc::new(CpuBackend)),
            lm: Ok(Arc::new(CpuLm::new(isa).expect("the detected level runs"))),
        }
    }

    /// The CPU pinned to `isa` for both codecs, if this CPU runs it.
    pub fn cpu_at(isa: Isa) -> Option<Device> {
        Some(Device {
            name: format!("cpu-{}", isa.tag()),
            delta: Ok(Arc::new(CpuAt::new(isa)?)),
            lm: Ok(Arc::new(CpuLm::new(isa)?)),
        })
    }

    /// The readable references: the delta codec's oracle and the LM's scalar kernels.
    pub fn reference() -> Device {
        Device {
            name: "reference".into(),
            delta: Ok(Arc::new(ReferenceBackend)),
            lm: Ok(Arc::new(
                CpuLm::new(Isa::Portable).expect("the portable level runs"),
            )),
        }
    }

    /// A wgpu adapter (`discrete_only`: refuse software and integrated adapters).
    pub fn wgpu(discrete_only: bool) -> Result<Device> {
        Ok(Device::wgpu_from(WgpuBackend::new(discrete_only)?))
    }

    pub(super) fn wgpu_from(b: WgpuBackend) -> Device {
        Device {
            name: "wgpu".into(),
            lm: Ok(Arc::new(b.lm())),
            delta: Ok(Arc::new(b)),
        }
    }

    /// The first CUDA GPU, its kernels compiled by NVRTC for it; "no CUDA driver" and the
    /// like when there is none.
    pub fn cuda() -> Result<Device> {
        let dev = super::cuda::driver::CudaDriver::open()?;
        Ok(Device::on_cuda(Arc::new(dev), "cuda"))
    }

    /// [`Device::cuda`] (or, with `emulated`, [`Device::cuda_emulated`]) with every kernel
    /// launch and host round trip timed: the device, and the handle whose `report` says
    /// where its time went (src/backend/cuda/profile.rs).
    pub fn cuda_profiled(emulated: bool) -> Result<(Device, Arc<dyn Report>)> {
        fn profiled<L: Launcher>(dev: L, name: &'static str) -> (Device, Arc<dyn Report>) {
            let dev = Arc::new(Profiled::new(dev));
            (Device::on_cuda(dev.clone(), name), dev)
        }
        if !emulated {
            return Ok(profiled(super::cuda::driver::CudaDriver::open()?, "cuda"));
        }
        #[cfg(cuda_emulation)]
        {
            let dev = super::cuda::emulated::HostEmulation::new();
            Ok(profiled(dev, "cuda-emulated"))
        }
        #[cfg(not(cuda_emulation))]
        Err(no_emulation())
    }

    /// The CUDA kernels run on the CPU by their host emulation (kernels/host/emulate.h):
    /// slow, for tests of the kernels' logic on machines without a GPU; never chosen by
    /// `auto`.
    pub fn cuda_emulated() -> Result<Device> {
        #[cfg(cuda_emulation)]
        {
            let dev = super::cuda::emulated::HostEmulation::new();
            Ok(Device::on_cuda(Arc::new(dev), "cuda-emulated"))
        }
        #[cfg(not(cuda_emulation))]
        Err(no_emulation())
    }

    /// Both codecs' CUDA host code on one launcher.
    fn on_cuda<L: Launcher>(dev: Arc<L>, name: &'static str) -> Device {
        Device {
            name: name.into(),
            lm: Ok(Arc::new(CudaLm::new(dev.clone()))),
            delta: Ok(Arc::new(CudaBackend::new(dev, name))),
        }
    }

    /// Short name for the command line and parity tables ("cpu", "cpu-avx2", "wgpu", ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What it runs on, per codec, for people.
    pub fn describe(&self) -> String {
        let delta = match &self.delta {
            Ok(b) => b.device(),
            Err(why) => format!("none ({why})"),
        };
        let lm = match &self.lm {
            Ok(k) => k.describe(),
            Err(why) => format!("none ({why})"),
        };
        if delta == lm {
            delta
        } else {
            format!("delta codec: {delta}; language model: {lm}")
        }
    }

    /// The delta codec's kernels, or why this device has none.
    pub fn delta(&self) -> Result<&dyn Backend> {
        match &self.delta {
            Ok(b) => Ok(b.as_ref()),
            Err(why) => Err(Error::Unsupported(why.clone())),
        }
    }

    /// The language model's kernels, or why this device has none.
    pub fn lm(&self) -> Result<&dyn LmKernels> {
        match &self.lm {
            Ok(k) => Ok(k.as_ref()),
            Err(why) => Err(Error::Unsupported(why.clone())),
        }
    }

    /// Every device this build can run here, CPU levels included, for tests and `parity`:
    /// the reference, each CPU level this CPU runs, a CUDA GPU if there is one, and wgpu if
    /// an adapter answers (`Err` says why it did not). The CUDA host emulation is not here:
    /// it is for tests, and slow.
    pub fn all_here() -> (Vec<Device>, std::result::Result<(), String>) {
        let mut out = vec![Device::reference()];
        out.extend(Isa::ALL.into_iter().filter_map(Device::cpu_at));
        out.extend(Device::cuda().ok());
        let wgpu = match Device::wgpu(false) {
            Ok(d) => {
                out.push(d);
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        };
        (out, wgpu)
    }
}

#[cfg(not(cuda_emulation))]
fn no_emulation() -> Error {
    Error::Unsupported("the CUDA host emulation is built on Linux only".into())
}
