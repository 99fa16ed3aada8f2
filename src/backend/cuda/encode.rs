//! Encoding on the device: a tensor's residuals stay resident between the histogram and
//! lane stages (kernels/residual.cu, kernels/encode.cu; the host side of
//! src/backend/wgpu/encode.rs, on a [`Launcher`]).

use super::launch::{Kernel, Launcher};
use super::{blocks, CudaBackend};
use crate::backend::wgpu::params::{flatten_tables, Params};
use crate::backend::{HistRequest, Resident};
use crate::format::chunk::{EncodedChunk, CHUNK_ELEMS, LANES};
use crate::format::layout_spaces;
use crate::format::symbols::Layout;
use crate::format::tables::{Hist, Tables};
use crate::{Error, Result};

pub struct CudaResident<'a, L: Launcher> {
    pub b: &'a CudaBackend<L>,
    pub base: Params,
    pub n: usize,
    pub size: usize,
    pub refs: L::Buf,
    pub tgts: L::Buf,
    pub resid: L::Buf,
    pub codes: L::Buf,
}

impl<L: Launcher> CudaResident<'_, L> {
    /// The symbol codes of `p`'s layout (recomputed each time: cheaper than two buffers).
    fn codes(&self, p: &Params) -> Result<()> {
        let r = &self.resid;
        self.b.dev.launch(
            Kernel::Symbols,
            blocks(self.n.div_ceil(2)),
            p,
            [&self.refs, &self.tgts, r, &self.codes, r, r],
        )
    }
}

impl<L: Launcher> Resident for CudaResident<'_, L> {
    fn residual_bytes(&self) -> Result<Vec<u8>> {
        let _one = self.b.one_at_a_time();
        let len = self.n * self.size;
        let words = self.b.dev.read(&self.resid, len.div_ceil(4))?;
        let mut out: Vec<u8> = bytemuck::cast_slice(&words).to_vec();
        out.truncate(len);
        Ok(out)
    }

    fn histograms_for(&self, requests: &[HistRequest]) -> Result<Vec<Vec<Hist>>> {
        let _one = self.b.one_at_a_time();
        requests
            .iter()
            .map(|r| self.histograms(r.layout, r.distance))
            .collect()
    }

    fn encode(
        &self,
        layout: Layout,
        tables: &Tables,
        distance: Option<usize>,
    ) -> Result<Vec<EncodedChunk>> {
        let _one = self.b.one_at_a_time();
        self.encode_inner(layout, tables, distance)
    }
}

impl<L: Launcher> CudaResident<'_, L> {
    fn histograms(&self, layout: Layout, distance: Option<usize>) -> Result<Vec<Hist>> {
        let d = &self.b.dev;
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
        let counts = d.zeroed(total)?;
        self.codes(&p)?;
        let r = &self.resid;
        d.launch(
            Kernel::Histogram,
            blocks(self.n),
            &p,
            [&self.refs, &self.tgts, r, &self.codes, &counts, r],
        )?;
        let words = d.read(&counts, total)?;
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
        let d = &self.b.dev;
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
        let flat = d.upload(&flatten_tables(tables, &mut p, false))?;
        const GROUPS: usize = CHUNK_ELEMS / LANES * 4;
        let meta_len = 2 * nc * GROUPS + 4 * nc + 32 * nc;
        let (o_wtot, o_states) = (2 * nc * GROUPS, 2 * nc * GROUPS + 4 * nc);
        let mut meta = d.zeroed(meta_len)?;

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
        let totals = d.read(&meta, o_wtot + 2 * nc)?;
        let (word_totals, tail_totals) = totals[o_wtot..].split_at(nc);

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
                "tensor too large for the CUDA backend".into(),
            ));
        }
        let tail_off = (wpos / 2) as usize;
        let out_words = tail_off + (tpos / 32) as usize + 2;
        let out = d.zeroed(out_words)?;
        d.write(&mut meta, o_wtot + 2 * nc, &bases)?;

        // Pass 1: the same lanes, now writing words where the prefix sums put them; tails.
        p.pass = 1;
        p.pad = tail_off as u32;
        let bufs1 = [&self.refs, &self.resid, &self.codes, &flat, &meta, &out];
        d.launch(Kernel::EncLanes, nc as u32, &p, bufs1)?;
        d.launch(Kernel::EncTail, nc as u32, &p, bufs1)?;
        let out_w = d.read(&out, out_words)?;
        let out_bytes: &[u8] = bytemuck::cast_slice(&out_w);
        let meta_words = d.read(&meta, meta_len)?;

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
