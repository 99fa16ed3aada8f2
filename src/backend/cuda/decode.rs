//! Decoding on the device (kernels/decode.cu): one warp per chunk runs its lanes in
//! lockstep, then tails and the inverse transform (the host side of
//! src/backend/wgpu/decode.rs, on a [`Launcher`]).

use super::launch::{Kernel, Launcher};
use super::{check_len, words_of, CudaBackend};
use crate::backend::wgpu::params::{decode_error, decode_input};
use crate::backend::DecodeJob;
use crate::Result;

impl<L: Launcher> CudaBackend<L> {
    pub(super) fn decode_inner(&self, job: &DecodeJob) -> Result<Vec<u8>> {
        let size = (job.fl.width / 8) as usize;
        let n = job.reference.len() / size;
        check_len(n)?;
        let Some(input) = decode_input(job, n)? else {
            return Ok(Vec::new());
        };
        let (p, nc) = (input.p, input.chunks);
        let d = &self.dev;
        let flat = d.upload(&input.tables)?;
        let mut refs = words_of(job.reference);
        refs.extend([0, 0]);
        let mut stream = words_of(&input.stream);
        stream.extend([0, 0, 0, 0]);
        let refs = d.upload(&refs)?;
        let stream = d.upload(&stream)?;
        let meta_buf = d.upload(&input.meta)?;
        let codes = d.zeroed(n.div_ceil(2))?;
        let out_words = (n * size).div_ceil(4);
        let out = d.zeroed(out_words + 2)?;
        let bufs = [&refs, &flat, &stream, &meta_buf, &codes, &out];
        d.launch(Kernel::DecLanes, nc as u32, &p, bufs)?;
        d.launch(Kernel::DecTail, nc as u32, &p, bufs)?;
        let err = d.read(&meta_buf, nc * 36 + 1)?[nc * 36];
        decode_error(err)?;
        let w = d.read(&out, out_words)?;
        let mut bytes: Vec<u8> = bytemuck::cast_slice(&w).to_vec();
        bytes.truncate(n * size);
        Ok(bytes)
    }
}
