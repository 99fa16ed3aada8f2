//! Encoding on the device: a tensor's residuals stay resident between the histogram and
//! lane stages (shaders/residual.wgsl, shaders/encode.wgsl).

use super::gpu::Gpu;
use super::params::{flatten_tables, Params};
use super::{groups, u32s, WgpuBackend};
use crate::backend::{HistRequest, Resident};
use crate::format::chunk::{EncodedChunk, CHUNK_ELEMS, LANES};
use crate::format::layout_spaces;
use crate::format::symbols::Layout;
use crate::format::tables::{Hist, Tables};
use crate::{Error, Result};

pub struct WgpuResident<'a> {
    pub b: &'a WgpuBackend,
    pub base: Params,
    pub n: usize,
    pub size: usize,
    pub refs: wgpu::Buffer,
    pub tgts: wgpu::Buffer,
    pub resid: wgpu::Buffer,
    pub codes: wgpu::Buffer,
}

impl WgpuResident<'_> {
    fn gpu(&self) -> &Gpu {
        &self.b.gpu
    }

    /// Record the symbol codes of `layout` (recomputed each time: cheaper than two buffers).
    fn record_codes(&self, enc: &mut wgpu::CommandEncoder, p: &Params, counts: &wgpu::Buffer) {
        let g = self.gpu();
        enc.clear_buffer(&self.codes, 0, None);
        let params = g.params(&p.words());
        let bind = g.bind(
            &g.residual,
            &params,
            &[&self.refs, &self.tgts, &self.resid, &self.codes, counts],
        );
        g.dispatch(enc, &g.residual, "symbols", &bind, groups(self.n));
    }
}

impl Resident for WgpuResident<'_> {
    fn residual_bytes(&self) -> Result<Vec<u8>> {
        self.gpu()
            .checked("readback", || self.residual_bytes_inner())
    }

    fn histograms_for(&self, requests: &[HistRequest]) -> Result<Vec<Vec<Hist>>> {
        requests
            .iter()
            .map(|r| {
                self.gpu()
                    .checked("histograms", || self.histograms_inner(r.layout, r.distance))
            })
            .collect()
    }

    fn encode(
        &self,
        layout: Layout,
        tables: &Tables,
        distance: Option<usize>,
    ) -> Result<Vec<EncodedChunk>> {
        self.gpu()
            .checked("encode", || self.encode_inner(layout, tables, distance))
    }
}

impl WgpuResident<'_> {
    fn residual_bytes_inner(&self) -> Result<Vec<u8>> {
        let g = self.gpu();
        let out = g.finish_and_read(g.encoder(), &[(&self.resid, (self.n * self.size) as u64)])?;
        Ok(out.into_iter().next().unwrap())
    }

    fn histograms_inner(&self, layout: Layout, distance: Option<usize>) -> Result<Vec<Hist>> {
        let g = self.gpu();
        let distance = distance.filter(|_| layout == Layout::Signed);
        let spaces = layout_spaces(layout, self.base.fl_width, distance);
        let mut p = self
            .base
            .layout(layout, distance)?
            .forms(spaces.iter().copied());
        let mut total = 0usize;
        for (s, sp) in spaces.iter().enumerate() {
            p.hist_off[s] = total as u32;
            p.alpha[s] = sp.alphabet() as u32;
            total += sp.n_primary() * sp.alphabet();
        }
        let counts = g.zeroed(total * 4)?;
        let mut enc = g.encoder();
        self.record_codes(&mut enc, &p, &counts);
        let params = g.params(&p.words());
        let bind = g.bind(
            &g.residual,
            &params,
            &[&self.refs, &self.tgts, &self.resid, &self.codes, &counts],
        );
        g.dispatch(&mut enc, &g.residual, "histogram", &bind, groups(self.n));
        let raw = g.finish_and_read(enc, &[(&counts, (total * 4) as u64)])?;
        let words = u32s(&raw[0]);
        Ok(spaces
            .iter()
            .enumerate()
            .map(|(s, &sp)| {
                let at = p.hist_off[s] as usize;
                let n = sp.n_primary() * sp.alphabet();
                let counts: Vec<u64> = words[at..at + n].iter().map(|&w| w as u64).collect();
                Hist::from_dense(sp, &counts)
            })
            .collect())
    }

    fn encode_inner(
        &self,
        layout: Layout,
        tables: &Tables,
        distance: Option<usize>,
    ) -> Result<Vec<EncodedChunk>> {
        let g = self.gpu();
        let nc = self.base.n_chunks as usize;
        if nc == 0 {
            return Ok(Vec::new());
        }
        let mut p = self.base.layout(layout, distance)?;
        if tables.stages.len() != p.n_stages as usize {
            return Err(Error::Invalid(
                "stage tables do not match the layout".into(),
            ));
        }
        let flat = g.upload_u32(&flatten_tables(tables, &mut p, false))?;
        const GROUPS: usize = CHUNK_ELEMS / LANES * 4;
        let meta_len = 2 * nc * GROUPS + 4 * nc + 32 * nc;
        let (o_wtot, o_states) = (2 * nc * GROUPS, 2 * nc * GROUPS + 4 * nc);
        let meta = g.zeroed(meta_len * 4)?;
        let counts = g.zeroed(4)?;

        // Pass 0: which lanes flush a word in each group; prefix sums; tail lengths.
        let mut enc = g.encoder();
        self.record_codes(&mut enc, &p, &counts);
        let dummy_out = g.zeroed(16)?;
        let p0 = g.params(&p.words());
        let bind0 = g.bind(
            &g.encode,
            &p0,
            &[
                &self.refs,
                &self.resid,
                &self.codes,
                &flat,
                &meta,
                &dummy_out,
            ],
        );
        g.dispatch(&mut enc, &g.encode, "enc_lanes", &bind0, nc as u32);
        g.dispatch(&mut enc, &g.encode, "enc_scan", &bind0, nc as u32);
        g.dispatch(&mut enc, &g.encode, "enc_tail", &bind0, nc as u32);
        let totals = g.finish_and_read(enc, &[(&meta, ((o_wtot + 2 * nc) * 4) as u64)])?;
        let totals = u32s(&totals[0][o_wtot * 4..]);
        let (word_totals, tail_totals) = totals.split_at(nc);

        // Chunk bases: each chunk starts on a u32 boundary in both regions.
        let mut bases = vec![0u32; 2 * nc];
        let (mut wpos, mut tpos) = (0u64, 0u64);
        for c in 0..nc {
            bases[c] = wpos as u32;
            bases[nc + c] = tpos as u32;
            wpos += (word_totals[c] as u64).div_ceil(2) * 2;
            tpos += (tail_totals[c] as u64).div_ceil(32) * 32;
        }
        if wpos >= 1 << 32 || tpos >= 1 << 32 {
            return Err(Error::Unsupported(
                "tensor too large for the wgpu backend".into(),
            ));
        }
        let tail_off = (wpos / 2) as usize;
        let out_words = tail_off + (tpos / 32) as usize + 2;
        let out = g.zeroed(out_words * 4)?;
        g.queue.write_buffer(
            &meta,
            ((o_wtot + 2 * nc) * 4) as u64,
            bytemuck::cast_slice(&bases),
        );

        // Pass 1: the same lanes, now writing words where the prefix sums put them; tails.
        p.pass = 1;
        p.pad = tail_off as u32;
        let p1 = g.params(&p.words());
        let bind1 = g.bind(
            &g.encode,
            &p1,
            &[&self.refs, &self.resid, &self.codes, &flat, &meta, &out],
        );
        let mut enc = g.encoder();
        g.dispatch(&mut enc, &g.encode, "enc_lanes", &bind1, nc as u32);
        g.dispatch(&mut enc, &g.encode, "enc_tail", &bind1, nc as u32);
        let back = g.finish_and_read(
            enc,
            &[
                (&out, (out_words * 4) as u64),
                (&meta, (meta_len * 4) as u64),
            ],
        )?;
        let out_bytes = &back[0];
        let meta_words = u32s(&back[1]);

        Ok((0..nc)
            .map(|c| {
                let w0 = bases[c] as usize * 2;
                let words = out_bytes[w0..w0 + word_totals[c] as usize * 2]
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .collect();
                let t0 = tail_off * 4 + bases[nc + c] as usize / 8;
                let tail_bits = tail_totals[c] as u64;
                let mut states = [0u32; LANES];
                states
                    .copy_from_slice(&meta_words[o_states + c * LANES..o_states + (c + 1) * LANES]);
                EncodedChunk {
                    words,
                    states,
                    tail: out_bytes[t0..t0 + tail_bits.div_ceil(8) as usize].to_vec(),
                    tail_bits,
                }
            })
            .collect())
    }
}
