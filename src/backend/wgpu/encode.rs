//! Encoding on the device: a tensor's residuals stay resident between the histogram and
//! lane stages (shaders/residual.wgsl, shaders/encode.wgsl).

use super::gpu::Gpu;
use super::params::{encode_input, hist_layout, near_distance, EncodeLedger, NearHist, Params};
use super::{groups, u32s, WgpuBackend};
use crate::backend::{HistRequest, Resident};
use crate::format::chunk::EncodedChunk;
use crate::format::symbols::Layout;
use crate::format::tables::{Hist, Tables};
use crate::Result;

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
        if let Some(d) = near_distance(layout, distance) {
            return Ok(vec![self.near_histogram(d)?]);
        }
        let g = self.gpu();
        let h = hist_layout(self.base, layout, distance)?;
        let counts = g.zeroed(h.total * 4)?;
        let mut enc = g.encoder();
        self.record_codes(&mut enc, &h.p, &counts);
        let params = g.params(&h.p.words());
        let bind = g.bind(
            &g.residual,
            &params,
            &[&self.refs, &self.tgts, &self.resid, &self.codes, &counts],
        );
        g.dispatch(&mut enc, &g.residual, "histogram", &bind, groups(self.n));
        let raw = g.finish_and_read(enc, &[(&counts, (h.total * 4) as u64)])?;
        Ok(h.hists(&u32s(&raw[0])))
    }

    /// J's neighbor form ([`NearHist`]): the codes and the range pass, read back; then a
    /// histogram pass per piece of the window, each read back.
    fn near_histogram(&self, distance: usize) -> Result<Hist> {
        let g = self.gpu();
        let mut h = NearHist::new(self.base, distance)?;
        let range = g.zeroed(8)?;
        let mut enc = g.encoder();
        self.record_codes(&mut enc, &h.p, &range);
        let params = g.params(&h.p.words());
        let bind = g.bind(
            &g.residual,
            &params,
            &[&self.refs, &self.tgts, &self.resid, &self.codes, &range],
        );
        g.dispatch(&mut enc, &g.residual, "er_range", &bind, groups(self.n));
        let range = g.finish_and_read(enc, &[(&range, 8)])?;
        for (p, words) in h.pieces(&u32s(&range[0])) {
            let counts = g.zeroed(words * 4)?;
            let params = g.params(&p.words());
            let bind = g.bind(
                &g.residual,
                &params,
                &[&self.refs, &self.tgts, &self.resid, &self.codes, &counts],
            );
            let mut enc = g.encoder();
            g.dispatch(&mut enc, &g.residual, "histogram", &bind, groups(self.n));
            let raw = g.finish_and_read(enc, &[(&counts, (words * 4) as u64)])?;
            h.add(&p, &u32s(&raw[0]));
        }
        Ok(h.hist())
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
        let (mut p, flat) = encode_input(self.base, layout, tables, distance)?;
        let flat = g.upload_u32(&flat)?;
        let ledger = EncodeLedger { chunks: nc };
        let meta = g.zeroed(ledger.len() * 4)?;
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
        let totals = g.finish_and_read(enc, &[(&meta, (ledger.bases_at() * 4) as u64)])?;
        let at = ledger.place(&u32s(&totals[0][ledger.totals_at() * 4..]), "wgpu")?;
        let out = g.zeroed(at.out_words * 4)?;
        g.queue.write_buffer(
            &meta,
            (ledger.bases_at() * 4) as u64,
            bytemuck::cast_slice(&at.bases),
        );

        // Pass 1: the same lanes, now writing words where the prefix sums put them; tails.
        p.pass = 1;
        p.pad = at.tail_off as u32;
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
                (&out, (at.out_words * 4) as u64),
                (&meta, (ledger.len() * 4) as u64),
            ],
        )?;
        Ok(ledger.chunks(&at, &back[0], &u32s(&back[1])))
    }
}
