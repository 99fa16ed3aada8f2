//! wgpu backend (placeholder while the shaders are written).

use super::{Backend, DecodeJob, EncodeJob, Resident};
use crate::{Error, Result};

pub struct WgpuBackend;

impl WgpuBackend {
    pub fn new(_discrete: bool) -> Result<Self> {
        Err(Error::Unsupported("wgpu backend not built yet".into()))
    }
}

pub fn adapters() -> Vec<String> {
    Vec::new()
}

impl Backend for WgpuBackend {
    fn name(&self) -> &'static str {
        "wgpu"
    }
    fn device(&self) -> String {
        String::new()
    }
    fn residuals<'a>(&'a self, _job: &EncodeJob<'a>) -> Result<Box<dyn Resident + 'a>> {
        Err(Error::Unsupported("wgpu".into()))
    }
    fn decode(&self, _job: &DecodeJob) -> Result<Vec<u8>> {
        Err(Error::Unsupported("wgpu".into()))
    }
}
