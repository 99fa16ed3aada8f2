//! The wgpu backend: every per-element stage as a WGSL compute shader (shaders/*.wgsl), on
//! any Vulkan, Metal, DX12 or GL adapter, including Mesa's lavapipe on a CPU. The residuals,
//! codes and reference stay on the device between stages; data comes back only through
//! [`gpu::Gpu::finish_and_read`]: histograms, per-chunk totals, and the coded output.

mod decode;
mod encode;
mod gpu;
pub mod lm;
pub(crate) mod params;

use std::sync::Arc;

use super::{Backend, DecodeJob, EncodeJob, Resident};
use crate::{Error, Result};
use encode::WgpuResident;
use gpu::Gpu;
use params::Params;

pub struct WgpuBackend {
    gpu: Arc<Gpu>,
}

/// Adapters wgpu can see, described for people.
pub fn adapters() -> Vec<String> {
    gpu::enumerate()
        .iter()
        .map(|a| gpu::describe(&a.get_info()))
        .collect()
}

impl WgpuBackend {
    /// Open the first adapter (discrete GPUs first; with `discrete_only`, nothing else).
    pub fn new(discrete_only: bool) -> Result<Self> {
        let mut found = gpu::enumerate();
        found.sort_by_key(|a| match a.get_info().device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu => 2,
            wgpu::DeviceType::Other => 3,
            wgpu::DeviceType::Cpu => 4,
        });
        let names: Vec<String> = found.iter().map(|a| gpu::describe(&a.get_info())).collect();
        let adapter = found
            .into_iter()
            .find(|a| !discrete_only || a.get_info().device_type == wgpu::DeviceType::DiscreteGpu)
            .ok_or_else(|| {
                Error::Unsupported(if names.is_empty() {
                    "no wgpu adapter found (on Linux: apt-get install mesa-vulkan-drivers libvulkan1)"
                        .to_string()
                } else {
                    format!("no discrete GPU among wgpu adapters: {}", names.join("; "))
                })
            })?;
        Ok(WgpuBackend {
            gpu: Arc::new(Gpu::new(adapter)?),
        })
    }

    /// The language model's kernels on the same adapter and device.
    pub fn lm(&self) -> lm::WgpuLm {
        lm::WgpuLm::new(self.gpu.clone())
    }
}

pub(crate) fn groups(n: usize) -> u32 {
    n.div_ceil(256) as u32
}

pub(crate) fn u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub(crate) fn check_len(n: usize) -> Result<()> {
    if n >= 1 << 31 {
        return Err(Error::Unsupported(format!(
            "{n} elements in one tensor (the wgpu backend takes fewer than 2^31)"
        )));
    }
    Ok(())
}

impl Backend for WgpuBackend {
    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn device(&self) -> String {
        gpu::describe(&self.gpu.info)
    }

    fn residuals<'a>(&'a self, job: &EncodeJob<'a>) -> Result<Box<dyn Resident + 'a>> {
        self.gpu.checked("residuals", || self.residuals_inner(job))
    }

    fn decode(&self, job: &DecodeJob) -> Result<Vec<u8>> {
        self.gpu.checked("decode", || self.decode_inner(job))
    }
}

impl WgpuBackend {
    fn residuals_inner<'a>(&'a self, job: &EncodeJob<'a>) -> Result<Box<dyn Resident + 'a>> {
        let size = (job.fl.width / 8) as usize;
        let n = job.reference.len() / size;
        check_len(n)?;
        let g = &self.gpu;
        let r = WgpuResident {
            b: self,
            base: Params::new(job.fl, n, job.condition),
            n,
            size,
            refs: g.upload(job.reference, 2)?,
            tgts: g.upload(job.target, 2)?,
            resid: g.zeroed(n * size + 8)?,
            codes: g.zeroed(n.div_ceil(2) * 4)?,
        };
        let counts = g.zeroed(4)?;
        let params = g.params(&r.base.words());
        let bind = g.bind(
            &g.residual,
            &params,
            &[&r.refs, &r.tgts, &r.resid, &r.codes, &counts],
        );
        let mut enc = g.encoder();
        g.dispatch(&mut enc, &g.residual, "residuals", &bind, groups(n));
        g.queue.submit([enc.finish()]);
        Ok(Box::new(r))
    }
}
