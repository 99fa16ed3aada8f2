//! Decoding on the device (kernels/decode.cu): one warp per chunk runs its lanes in
//! lockstep, then tails and the inverse transform (the host side of
//! src/backend/wgpu/decode.rs, on a [`Launcher`]).

use super::launch::{Kernel, Launcher};
use super::{check_len, words_of, CudaBackend};
use crate::backend::wgpu::params::{flatten_tables, Params};
use crate::backend::DecodeJob;
use crate::format::chunk::chunk_ranges;
use crate::{Error, Result};

impl<L: Launcher> CudaBackend<L> {
    pub(super) fn decode_inner(&self, job: &DecodeJob) -> Result<Vec<u8>> {
        let size = (job.fl.width / 8) as usize;
        let n = job.reference.len() / size;
        check_len(n)?;
        let nc = chunk_ranges(n).len();
        if nc != job.chunks.len() {
            return Err(Error::format(
                "tensor blob",
                format!("{} chunks for {n} elements", job.chunks.len()),
            ));
        }
        if nc == 0 {
            return Ok(Vec::new());
        }
        let mut p = Params::new(job.fl, n, job.condition).layout(job.layout, job.distance)?;
        if job.tables.stages.len() != p.n_stages as usize {
            return Err(Error::Invalid(
                "stage tables do not match the layout".into(),
            ));
        }
        let d = &self.dev;
        let flat = d.upload(&flatten_tables(job.tables, &mut p, true))?;

        // One stream buffer: every chunk's words (u32-aligned), then every chunk's tail.
        let mut meta = vec![0u32; nc * 36 + 1];
        let mut words: Vec<u16> = Vec::new();
        for (c, ch) in job.chunks.iter().enumerate() {
            meta[c * 36] = words.len() as u32;
            meta[c * 36 + 1] = ch.words.len() as u32;
            meta[c * 36 + 4..c * 36 + 36].copy_from_slice(&ch.states);
            words.extend_from_slice(&ch.words);
            if words.len() % 2 == 1 {
                words.push(0);
            }
        }
        let mut stream: Vec<u8> = bytemuck::cast_slice(&words).to_vec();
        let tail_off = stream.len() / 4;
        for (c, ch) in job.chunks.iter().enumerate() {
            meta[c * 36 + 2] = ((stream.len() - tail_off * 4) * 8) as u32;
            meta[c * 36 + 3] = ch.tail_bits as u32;
            stream.extend_from_slice(ch.tail);
            stream.resize(stream.len().div_ceil(4) * 4, 0);
        }
        p.pad = tail_off as u32;
        let mut refs = words_of(job.reference);
        refs.extend([0, 0]);
        let mut stream = words_of(&stream);
        stream.extend([0, 0, 0, 0]);
        let refs = d.upload(&refs)?;
        let stream = d.upload(&stream)?;
        let meta_buf = d.upload(&meta)?;
        let codes = d.zeroed(n.div_ceil(2))?;
        let out_words = (n * size).div_ceil(4);
        let out = d.zeroed(out_words + 2)?;
        let bufs = [&refs, &flat, &stream, &meta_buf, &codes, &out];
        d.launch(Kernel::DecLanes, nc as u32, &p, bufs)?;
        d.launch(Kernel::DecTail, nc as u32, &p, bufs)?;
        let err = d.read(&meta_buf, nc * 36 + 1)?[nc * 36];
        let bad = |d: &str| Err(Error::format("tensor blob chunk", d.to_string()));
        match err.trailing_zeros() {
            32 => {
                let w = d.read(&out, out_words)?;
                let mut bytes: Vec<u8> = bytemuck::cast_slice(&w).to_vec();
                bytes.truncate(n * size);
                Ok(bytes)
            }
            1 => bad("a symbol's context has no frequency row"),
            2 => bad("rANS word stream ended early"),
            3 => bad("rANS lanes did not end in their initial state"),
            4 => bad("raw tail shorter than the bit lengths require"),
            _ => bad("raw tail longer than the bit lengths require"),
        }
    }
}
