//! Decoding on the device (kernels/decode.cu): one warp per chunk runs its lanes in
//! lockstep, then tails and the inverse transform (the host side of
//! src/backend/wgpu/decode.rs, on a [`Launcher`]).

use super::launch::{Kernel, Launcher};
use super::stream::{stream_in, Ring};
use super::{check_len, crc, CudaBackend, Stage};
use crate::backend::wgpu::params::{decode_error, decode_input};
use crate::backend::{Checked, DecodeJob};
use crate::Result;

/// A decoded tensor, with its device buffer (for its CRC-32).
struct Decoded<B> {
    out: Vec<u8>,
    on_device: Option<B>,
}

impl<L: Launcher> CudaBackend<L> {
    /// Decode `job` on engine launcher `d` and its staging ring; with `checked`, also the
    /// CRC-32 of the output, computed on the device.
    pub(super) fn decode_inner(
        &self,
        d: &L,
        ring: &mut Ring<L>,
        job: &DecodeJob,
        checked: bool,
    ) -> Result<Checked> {
        let size = (job.fl.width / 8) as usize;
        let n = job.reference.len() / size;
        let decoded = self.decode_resident(d, ring, job, n)?;
        let crc = match (&decoded.on_device, checked) {
            (Some(out), true) => crc::crc32(d, out, job.fl.width, n)?,
            // An empty tensor (whose CRC-32 is 0 either way), or no checks asked.
            _ => 0,
        };
        Ok(Checked {
            out: decoded.out,
            crc,
        })
    }

    /// The reference and the coded stream stream in through the staging ring (stream.rs).
    fn decode_resident(
        &self,
        d: &L,
        ring: &mut Ring<L>,
        job: &DecodeJob,
        n: usize,
    ) -> Result<Decoded<L::Buf>> {
        let size = (job.fl.width / 8) as usize;
        check_len(n)?;
        let Some(input) = decode_input(job, n)? else {
            return Ok(Decoded {
                out: Vec::new(),
                on_device: None,
            });
        };
        let (p, nc) = (input.p, input.chunks);
        let flat = d.upload(&input.tables)?;
        // Zero words past each end, as the kernels' wide loads expect.
        let refs_bytes = &job.reference[..n * size];
        let mut refs = d.zeroed(refs_bytes.len().div_ceil(4) + 2)?;
        let mut stream = d.zeroed(input.stream.len().div_ceil(4) + 4)?;
        stream_in(d, ring, &[refs_bytes], &mut [&mut refs], |_, _| Ok(()))?;
        stream_in(d, ring, &[&input.stream], &mut [&mut stream], |_, _| Ok(()))?;
        let meta_buf = d.upload(&input.meta)?;
        let codes = d.zeroed(n.div_ceil(2))?;
        let out_words = (n * size).div_ceil(4);
        let out = d.zeroed(out_words + 2)?;
        let bufs = [&refs, &flat, &stream, &meta_buf, &codes, &out];
        let from = self.inner_mark(d)?;
        d.launch(Kernel::DecLanes, nc as u32, &p, bufs)?;
        d.launch(Kernel::DecTail, nc as u32, &p, bufs)?;
        self.inner_stage(d, Stage::DecodeKernels, from)?;
        let err = d.read(&meta_buf, nc * 36 + 1)?[nc * 36];
        decode_error(err)?;
        let w = d.read(&out, out_words)?;
        let mut bytes: Vec<u8> = bytemuck::cast_slice(&w).to_vec();
        bytes.truncate(n * size);
        Ok(Decoded {
            out: bytes,
            on_device: Some(out),
        })
    }
}
