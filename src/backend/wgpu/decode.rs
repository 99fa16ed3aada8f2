//! Decoding on the device (shaders/decode.wgsl): lanes in lockstep per chunk, then tails
//! and the inverse transform.

use super::params::{flatten_tables, Params};
use super::{check_len, WgpuBackend};
use crate::backend::DecodeJob;
use crate::format::chunk::chunk_ranges;
use crate::{Error, Result};

impl WgpuBackend {
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
        let g = &self.gpu;
        let flat = g.upload_u32(&flatten_tables(job.tables, &mut p, true))?;

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
            stream.extend_from_slice(&ch.tail);
            stream.resize(stream.len().div_ceil(4) * 4, 0);
        }
        p.pad = tail_off as u32;
        let refs = g.upload(job.reference, 2)?;
        let stream = g.upload(&stream, 4)?;
        let meta_buf = g.upload_u32(&meta)?;
        let codes = g.zeroed(n.div_ceil(2) * 4)?;
        let out = g.zeroed(n * size)?;
        let params = g.params(&p.words());
        let bind = g.bind(
            &g.decode,
            &params,
            &[&refs, &flat, &stream, &meta_buf, &codes, &out],
        );
        let mut enc = g.encoder();
        g.dispatch(&mut enc, &g.decode, "dec_lanes", &bind, nc as u32);
        g.dispatch(&mut enc, &g.decode, "dec_tail", &bind, nc as u32);
        let err_at = (nc * 36 * 4) as u64;
        let back = g.finish_and_read(enc, &[(&out, (n * size) as u64), (&meta_buf, err_at + 4)])?;
        let err = u32::from_le_bytes(back[1][err_at as usize..].try_into().unwrap());
        let bad = |d: &str| Err(Error::format("tensor blob chunk", d.to_string()));
        match err.trailing_zeros() {
            32 => Ok(back.into_iter().next().unwrap()),
            1 => bad("a symbol's context has no frequency row"),
            2 => bad("rANS word stream ended early"),
            3 => bad("rANS lanes did not end in their initial state"),
            4 => bad("raw tail shorter than the bit lengths require"),
            _ => bad("raw tail longer than the bit lengths require"),
        }
    }
}
