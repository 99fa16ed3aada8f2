//! Encoding on the device: a tensor's residuals stay resident between the histogram and
//! lane stages (kernels/residual.cu, kernels/encode.cu; the host side of
//! src/backend/wgpu/encode.rs, on a [`Launcher`]).

use super::launch::{Kernel, Launcher};
use super::{blocks, CudaBackend, Engaged, Stage};
use crate::backend::wgpu::params::{
    encode_input, hist_layout, near_distance, EncodeLedger, NearHist, Params,
};
use crate::backend::{HistRequest, Resident};
use crate::format::chunk::EncodedChunk;
use crate::format::symbols::Layout;
use crate::format::tables::{Hist, Tables};
use crate::Result;

/// Elements per block of the histogram kernel (any split counts the same): enough that
/// clearing and merging the block's shared histogram stays a small part of its work.
const HIST_SPAN: usize = 16384;

/// A tensor's residuals on the device, on the engine that computed them: every later stage
/// runs on that engine's launcher (its buffers belong to it), one at a time (the residents
/// are not shared between threads).
pub struct CudaResident<'a, L: Launcher> {
    pub b: &'a CudaBackend<L>,
    pub base: Params,
    pub n: usize,
    pub size: usize,
    pub refs: L::Buf,
    pub tgts: L::Buf,
    pub resid: L::Buf,
    pub codes: L::Buf,
    /// Last: fields drop in order, so the buffers are freed (on the engine's stream) before
    /// the engine goes back to the pool.
    pub(super) engine: Engaged<'a, L>,
}

impl<L: Launcher> CudaResident<'_, L> {
    /// The symbol codes of `p`'s layout (recomputed each time: cheaper than two buffers).
    fn codes(&self, p: &Params) -> Result<()> {
        let r = &self.resid;
        self.engine.dev().launch(
            Kernel::Symbols,
            blocks(self.n.div_ceil(2)),
            p,
            [&self.refs, &self.tgts, r, &self.codes, r, r],
        )
    }
}

impl<L: Launcher> Resident for CudaResident<'_, L> {
    fn residual_bytes(&self) -> Result<Vec<u8>> {
        let len = self.n * self.size;
        let words = self.engine.dev().read(&self.resid, len.div_ceil(4))?;
        let mut out: Vec<u8> = bytemuck::cast_slice(&words).to_vec();
        out.truncate(len);
        Ok(out)
    }

    fn histograms_for(&self, requests: &[HistRequest]) -> Result<Vec<Vec<Hist>>> {
        self.b.timed(self.engine.dev(), Stage::Histograms, || {
            requests
                .iter()
                .map(|r| self.histograms(r.layout, r.distance))
                .collect()
        })
    }

    fn encode(
        &self,
        layout: Layout,
        tables: &Tables,
        distance: Option<usize>,
    ) -> Result<Vec<EncodedChunk>> {
        self.b.timed(self.engine.dev(), Stage::Encode, || {
            self.encode_inner(layout, tables, distance)
        })
    }
}

impl<L: Launcher> CudaResident<'_, L> {
    fn histograms(&self, layout: Layout, distance: Option<usize>) -> Result<Vec<Hist>> {
        if let Some(d) = near_distance(layout, distance) {
            return Ok(vec![self.near_histogram(d)?]);
        }
        let d = self.engine.dev();
        let h = hist_layout(self.base, layout, distance)?;
        let counts = d.zeroed(h.total)?;
        self.codes(&h.p)?;
        let r = &self.resid;
        d.launch(
            Kernel::Histogram,
            self.n.div_ceil(HIST_SPAN) as u32,
            &h.p,
            [&self.refs, &self.tgts, r, &self.codes, &counts, r],
        )?;
        Ok(h.hists(&d.read(&counts, h.total)?))
    }

    /// J's neighbor form ([`NearHist`]): the codes and the range pass, read back; then a
    /// histogram pass per piece of the window, each read back.
    fn near_histogram(&self, distance: usize) -> Result<Hist> {
        let d = self.engine.dev();
        let mut h = NearHist::new(self.base, distance)?;
        self.codes(&h.p)?;
        let r = &self.resid;
        let grid = self.n.div_ceil(HIST_SPAN) as u32;
        let range = d.zeroed(2)?;
        d.launch(
            Kernel::ErRange,
            grid,
            &h.p,
            [&self.refs, &self.tgts, r, &self.codes, &range, r],
        )?;
        for (p, words) in h.pieces(&d.read(&range, 2)?) {
            let counts = d.zeroed(words)?;
            d.launch(
                Kernel::Histogram,
                grid,
                &p,
                [&self.refs, &self.tgts, r, &self.codes, &counts, r],
            )?;
            h.add(&p, &d.read(&counts, words)?);
        }
        Ok(h.hist())
    }

    fn encode_inner(
        &self,
        layout: Layout,
        tables: &Tables,
        distance: Option<usize>,
    ) -> Result<Vec<EncodedChunk>> {
        let d = self.engine.dev();
        let nc = self.base.n_chunks as usize;
        if nc == 0 {
            return Ok(Vec::new());
        }
        let (mut p, flat) = encode_input(self.base, layout, tables, distance)?;
        let flat = d.upload(&flat)?;
        let ledger = EncodeLedger { chunks: nc };
        let mut meta = d.zeroed(ledger.len())?;

        // Pass 0: which lanes flush a word in each group; prefix sums; tail lengths.
        self.codes(&p)?;
        let dummy_out = d.zeroed(4)?;
        let bufs0 = [
            &self.refs,
            &self.resid,
            &self.codes,
            &flat,
            &meta,
            &dummy_out,
        ];
        d.launch(Kernel::EncLanes, nc as u32, &p, bufs0)?;
        d.launch(Kernel::EncScan, nc as u32, &p, bufs0)?;
        d.launch(Kernel::EncTail, nc as u32, &p, bufs0)?;
        let totals = d.read(&meta, ledger.bases_at())?;
        let at = ledger.place(&totals[ledger.totals_at()..], "CUDA")?;
        let out = d.zeroed(at.out_words)?;
        d.write(&mut meta, ledger.bases_at(), &at.bases)?;

        // Pass 1: the same lanes, now writing words where the prefix sums put them; tails.
        p.pass = 1;
        p.pad = at.tail_off as u32;
        let bufs1 = [&self.refs, &self.resid, &self.codes, &flat, &meta, &out];
        d.launch(Kernel::EncLanes, nc as u32, &p, bufs1)?;
        d.launch(Kernel::EncTail, nc as u32, &p, bufs1)?;
        let out_w = d.read(&out, at.out_words)?;
        let ledger_words = d.read(&meta, ledger.len())?;
        Ok(ledger.chunks(&at, bytemuck::cast_slice(&out_w), &ledger_words))
    }
}
