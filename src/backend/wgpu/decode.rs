//! Decoding on the device (shaders/decode.wgsl): lanes in lockstep per chunk, then tails
//! and the inverse transform.

use super::params::{decode_error, decode_input};
use super::{check_len, WgpuBackend};
use crate::backend::DecodeJob;
use crate::Result;

impl WgpuBackend {
    pub(super) fn decode_inner(&self, job: &DecodeJob) -> Result<Vec<u8>> {
        let size = (job.fl.width / 8) as usize;
        let n = job.reference.len() / size;
        check_len(n)?;
        let Some(input) = decode_input(job, n)? else {
            return Ok(Vec::new());
        };
        let (p, nc) = (input.p, input.chunks);
        let g = &self.gpu;
        let flat = g.upload_u32(&input.tables)?;
        let refs = g.upload(job.reference, 2)?;
        let stream = g.upload(&input.stream, 4)?;
        let meta_buf = g.upload_u32(&input.meta)?;
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
        decode_error(err)?;
        Ok(back.into_iter().next().unwrap())
    }
}
