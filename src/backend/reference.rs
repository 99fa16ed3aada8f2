//! The reference backend: the readable codec of `format::symbols` and `format::chunk`, one
//! `Sym` per element, exactly as docs/FORMAT.md describes it. It is the oracle every other
//! backend is checked against, stage by stage; it is not meant to be fast.

use rayon::prelude::*;

use super::{Backend, DecodeJob, EncodeJob, HistRequest, Resident};
use crate::dtype::FloatLayout;
use crate::float;
use crate::format::chunk::{chunk_ranges, decode_chunk, encode_chunk, EncodedChunk, CHUNK_ELEMS};
use crate::format::symbols::{
    self, decode_element, encode_element, ref_info, Layout, RefInfo, Sym,
};
use crate::format::tables::{Hist, Space, Tables};
use crate::format::{check_layout, layout_spaces};
use crate::Result;

pub struct ReferenceBackend;

/// Little-endian elements of `size` bytes, widened to u64.
pub fn elements(bytes: &[u8], size: usize) -> Vec<u64> {
    bytes
        .chunks_exact(size)
        .map(|c| {
            let mut v = [0u8; 8];
            v[..size].copy_from_slice(c);
            u64::from_le_bytes(v)
        })
        .collect()
}

fn store_elements(values: &[u64], size: usize, out: &mut [u8]) {
    for (dst, v) in out.chunks_exact_mut(size).zip(values) {
        dst.copy_from_slice(&v.to_le_bytes()[..size]);
    }
}

/// Reference facts per element; the exponent class is zeroed when conditioning is off.
fn reference_info(refs: &[u64], fl: FloatLayout, condition: bool) -> Vec<RefInfo> {
    refs.par_iter()
        .map(|&r| {
            let mut i = ref_info(r, fl);
            if !condition {
                i.er = 0;
            }
            i
        })
        .collect()
}

/// Histograms of the given stage spaces; chunk-local like the coder (the neighbor context
/// never reaches into the previous chunk). A chunk's `(context, symbol)` pairs are sorted and
/// counted: a dense count would not fit the Joint layout's neighbor form (up to 208,896
/// contexts × 247 symbols).
pub fn histograms(
    syms: &[Sym],
    info: &[RefInfo],
    spaces: &[Space],
    distance: Option<usize>,
) -> Vec<Hist> {
    let empty = || spaces.iter().map(|&sp| Hist::new(sp)).collect::<Vec<_>>();
    chunk_ranges(syms.len())
        .into_par_iter()
        .map(|range| {
            let (syms, info) = (&syms[range.clone()], &info[range]);
            spaces
                .iter()
                .map(|&sp| {
                    let mut pairs: Vec<(u32, usize)> = (0..syms.len())
                        .filter(|&j| sp.present(&syms[j]))
                        .map(|j| {
                            let nb = symbols::neighbor(syms, j, distance);
                            (
                                sp.context(&syms[j], info[j], nb) as u32,
                                sp.symbol(&syms[j]),
                            )
                        })
                        .collect();
                    pairs.sort_unstable();
                    let a = sp.alphabet();
                    let (mut ctxs, mut rows) = (Vec::new(), Vec::new());
                    for (ctx, sym) in pairs {
                        if ctxs.last() != Some(&ctx) {
                            ctxs.push(ctx);
                            rows.resize(rows.len() + a, 0u64);
                        }
                        let at = rows.len() - a + sym;
                        rows[at] += 1;
                    }
                    Hist::from_sorted(sp, ctxs, rows)
                })
                .collect()
        })
        .reduce(empty, |mut a, b| {
            for (x, y) in a.iter_mut().zip(&b) {
                x.add(y);
            }
            a
        })
}

struct RefResident {
    fl: FloatLayout,
    refs: Vec<u64>,
    tgts: Vec<u64>,
    info: Vec<RefInfo>,
}

impl RefResident {
    fn syms(&self, layout: Layout) -> Vec<Sym> {
        let w = self.fl.width;
        self.refs
            .par_iter()
            .zip(self.tgts.par_iter())
            .map(|(&r, &x)| encode_element(r, x, w, layout))
            .collect()
    }
}

impl Resident for RefResident {
    fn residual_bytes(&self) -> Result<Vec<u8>> {
        let w = self.fl.width;
        let d: Vec<u64> = self
            .refs
            .iter()
            .zip(&self.tgts)
            .map(|(&r, &x)| float::displacement(r, x, w) as u64 & float::mask(w))
            .collect();
        let size = (w / 8) as usize;
        let mut out = vec![0u8; d.len() * size];
        store_elements(&d, size, &mut out);
        Ok(out)
    }

    fn histograms_for(&self, requests: &[HistRequest]) -> Result<Vec<Vec<Hist>>> {
        requests
            .iter()
            .map(|&HistRequest { layout, distance }| {
                check_layout(layout, self.fl.width)?;
                let syms = self.syms(layout);
                let distance = distance.filter(|_| layout != Layout::Paper);
                let spaces = layout_spaces(layout, self.fl.width, distance);
                Ok(histograms(&syms, &self.info, &spaces, distance))
            })
            .collect()
    }

    fn encode(
        &self,
        layout: Layout,
        tables: &Tables,
        distance: Option<usize>,
    ) -> Result<Vec<EncodedChunk>> {
        check_layout(layout, self.fl.width)?;
        let syms = self.syms(layout);
        Ok(chunk_ranges(syms.len())
            .into_par_iter()
            .map(|r| encode_chunk(&syms[r.clone()], &self.info[r], tables, distance))
            .collect())
    }
}

impl Backend for ReferenceBackend {
    fn name(&self) -> &'static str {
        "reference"
    }

    fn device(&self) -> String {
        format!(
            "CPU, readable reference codec, {}",
            super::threads_phrase(rayon::current_num_threads())
        )
    }

    fn residuals<'a>(&'a self, job: &EncodeJob<'a>) -> Result<Box<dyn Resident + 'a>> {
        let size = (job.fl.width / 8) as usize;
        let refs = elements(job.reference, size);
        let info = reference_info(&refs, job.fl, job.condition);
        Ok(Box::new(RefResident {
            fl: job.fl,
            tgts: elements(job.target, size),
            refs,
            info,
        }))
    }

    fn decode(&self, job: &DecodeJob) -> Result<Vec<u8>> {
        check_layout(job.layout, job.fl.width)?;
        let fl = job.fl;
        let size = (fl.width / 8) as usize;
        let refs = elements(job.reference, size);
        let n = refs.len();
        let info = reference_info(&refs, fl, job.condition);
        let ranges = chunk_ranges(n);
        if ranges.len() != job.chunks.len() {
            return Err(crate::Error::format(
                "tensor blob",
                format!("{} chunks for {} elements", job.chunks.len(), n),
            ));
        }
        let decoded: Vec<Vec<u64>> = ranges
            .into_par_iter()
            .zip(job.chunks.par_iter())
            .map(|(range, chunk)| {
                let syms = decode_chunk(&info[range.clone()], job.tables, job.distance, chunk)?;
                Ok(refs[range]
                    .iter()
                    .zip(&syms)
                    .map(|(&rv, s)| decode_element(rv, s, fl.width, job.layout))
                    .collect())
            })
            .collect::<Result<_>>()?;
        let mut out = vec![0u8; n * size];
        for (values, dst) in decoded.iter().zip(out.chunks_mut(CHUNK_ELEMS * size)) {
            store_elements(values, size, dst);
        }
        Ok(out)
    }
}
