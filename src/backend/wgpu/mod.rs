//! The wgpu backend: every per-element stage as a WGSL compute shader (shaders/*.wgsl), on
//! any Vulkan, Metal, DX12 or GL adapter, including Mesa's lavapipe on a CPU. The residuals,
//! codes and reference stay on the device between stages; data comes back only through
//! [`gpu::Gpu::finish_and_read`]: histograms, per-chunk totals, and the coded output.

mod gpu;

use super::reference::layout_stages;
use super::{Backend, DecodeJob, EncodeJob, Resident};
use crate::delta::chunk::{chunk_ranges, EncodedChunk, CHUNK_ELEMS, LANES};
use crate::delta::model::{Hist, Space, Tables};
use crate::delta::symbols::Layout;
use crate::dtype::FloatLayout;
use crate::entropy::freq::PROB_TOTAL;
use crate::{Error, Result};
use gpu::Gpu;

pub struct WgpuBackend {
    gpu: Gpu,
}

/// Adapters wgpu can see, described for people.
pub fn adapters() -> Vec<String> {
    gpu::enumerate()
        .iter()
        .map(|a| gpu::describe(&a.get_info()))
        .collect()
}

impl WgpuBackend {
    /// Open the first adapter (discrete GPUs first; with `discrete_only`, nothing else).
    pub fn new(discrete_only: bool) -> Result<Self> {
        let mut found = gpu::enumerate();
        found.sort_by_key(|a| match a.get_info().device_type {
            wgpu::DeviceType::DiscreteGpu => 0,
            wgpu::DeviceType::IntegratedGpu => 1,
            wgpu::DeviceType::VirtualGpu => 2,
            wgpu::DeviceType::Other => 3,
            wgpu::DeviceType::Cpu => 4,
        });
        let names: Vec<String> = found.iter().map(|a| gpu::describe(&a.get_info())).collect();
        let adapter = found
            .into_iter()
            .find(|a| !discrete_only || a.get_info().device_type == wgpu::DeviceType::DiscreteGpu)
            .ok_or_else(|| {
                Error::Unsupported(if names.is_empty() {
                    "no wgpu adapter found (on Linux: apt-get install mesa-vulkan-drivers libvulkan1)"
                        .to_string()
                } else {
                    format!("no discrete GPU among wgpu adapters: {}", names.join("; "))
                })
            })?;
        Ok(WgpuBackend {
            gpu: Gpu::new(adapter)?,
        })
    }
}

/// The uniform parameter block (struct Params in shaders/prelude.wgsl).
#[derive(Clone, Copy, Default)]
struct Params {
    n: u32,
    fl_width: u32,
    mant: u32,
    ebits: u32,
    condition: bool,
    signed: bool,
    neighbor: u32,
    n_stages: u32,
    n_chunks: u32,
    pass: u32,
    pad: u32,
    map_off: [u32; 4],
    rows_off: [u32; 4],
    alpha: [u32; 4],
    hist_off: [u32; 4],
}

impl Params {
    fn new(fl: FloatLayout, n: usize, condition: bool) -> Params {
        Params {
            n: n as u32,
            fl_width: fl.width,
            mant: fl.mantissa_bits,
            ebits: fl.exponent_bits,
            condition,
            n_chunks: n.div_ceil(CHUNK_ELEMS) as u32,
            ..Default::default()
        }
    }
    fn words(&self) -> [u32; 28] {
        let mut w = [0u32; 28];
        w[..12].copy_from_slice(&[
            self.n,
            self.fl_width,
            self.mant,
            self.ebits,
            self.condition as u32,
            self.signed as u32,
            self.neighbor,
            self.n_stages,
            self.n_chunks,
            self.fl_width + 1,
            self.pass,
            self.pad,
        ]);
        for (k, v) in [self.map_off, self.rows_off, self.alpha, self.hist_off]
            .iter()
            .enumerate()
        {
            w[12 + 4 * k..16 + 4 * k].copy_from_slice(v);
        }
        w
    }
    fn layout(mut self, layout: Layout, neighbor: Option<usize>) -> Result<Params> {
        self.signed = layout == Layout::Signed;
        self.n_stages = layout_stages(layout).len() as u32;
        self.neighbor = match neighbor {
            Some(d) if self.signed => u32::try_from(d)
                .map_err(|_| Error::Unsupported(format!("neighbor distance {d}")))?,
            _ => 0,
        };
        Ok(self)
    }
}

/// Tables flattened for the shaders: per stage the context -> row map, then `(freq, start)`
/// per row and symbol; for stages with more than two symbols also, at `hist_off`, the symbol
/// of every slot of every row (four per u32), so the decoder needs no search loop.
fn flatten_tables(tables: &Tables, p: &mut Params) -> Vec<u32> {
    let mut out = Vec::new();
    for (s, t) in tables.stages.iter().enumerate() {
        let a = t.space.alphabet();
        let n_rows = t.explicit.len() + t.backoff.len();
        p.map_off[s] = out.len() as u32;
        out.extend_from_slice(&t.map);
        p.rows_off[s] = out.len() as u32;
        p.alpha[s] = a as u32;
        for ri in 0..n_rows {
            let row = t.row(ri as u32);
            for sym in 0..a {
                out.push(row.freq[sym]);
                out.push(row.start[sym]);
            }
        }
        p.hist_off[s] = out.len() as u32;
        if a > 2 {
            for ri in 0..n_rows {
                let row = t.row(ri as u32);
                let slots: Vec<u8> = (0..PROB_TOTAL).map(|x| row.lookup(x) as u8).collect();
                out.extend(
                    slots
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes(c.try_into().unwrap())),
                );
            }
        }
    }
    out
}

fn groups(n: usize) -> u32 {
    n.div_ceil(256) as u32
}

fn u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn check_len(n: usize) -> Result<()> {
    if n >= 1 << 31 {
        return Err(Error::Unsupported(format!(
            "{n} elements in one tensor (the wgpu backend takes fewer than 2^31)"
        )));
    }
    Ok(())
}

struct WgpuResident<'a> {
    b: &'a WgpuBackend,
    base: Params,
    n: usize,
    size: usize,
    refs: wgpu::Buffer,
    tgts: wgpu::Buffer,
    resid: wgpu::Buffer,
    codes: wgpu::Buffer,
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

    fn histograms(&self, layout: Layout, neighbor: Option<usize>) -> Result<Vec<Hist>> {
        self.gpu()
            .checked("histograms", || self.histograms_inner(layout, neighbor))
    }

    fn encode(
        &self,
        layout: Layout,
        tables: &Tables,
        neighbor: Option<usize>,
    ) -> Result<Vec<EncodedChunk>> {
        self.gpu()
            .checked("encode", || self.encode_inner(layout, tables, neighbor))
    }
}

impl WgpuResident<'_> {
    fn residual_bytes_inner(&self) -> Result<Vec<u8>> {
        let g = self.gpu();
        let out = g.finish_and_read(g.encoder(), &[(&self.resid, (self.n * self.size) as u64)])?;
        Ok(out.into_iter().next().unwrap())
    }

    fn histograms_inner(&self, layout: Layout, neighbor: Option<usize>) -> Result<Vec<Hist>> {
        let g = self.gpu();
        let mut p = self.base.layout(layout, neighbor)?;
        let spaces: Vec<Space> = layout_stages(layout)
            .iter()
            .map(|&s| Space::new(s, p.fl_width))
            .collect();
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
                let mut h = Hist::new(sp);
                for (c, &w) in h.counts.iter_mut().zip(&words[at..]) {
                    *c = w as u64;
                }
                h
            })
            .collect())
    }

    fn encode_inner(
        &self,
        layout: Layout,
        tables: &Tables,
        neighbor: Option<usize>,
    ) -> Result<Vec<EncodedChunk>> {
        let g = self.gpu();
        let nc = self.base.n_chunks as usize;
        if nc == 0 {
            return Ok(Vec::new());
        }
        let mut p = self.base.layout(layout, neighbor)?;
        if tables.stages.len() != p.n_stages as usize {
            return Err(Error::Invalid(
                "stage tables do not match the layout".into(),
            ));
        }
        let flat = g.upload_u32(&flatten_tables(tables, &mut p))?;
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

impl Backend for WgpuBackend {
    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn device(&self) -> String {
        gpu::describe(&self.gpu.info)
    }

    fn residuals<'a>(&'a self, job: &EncodeJob<'a>) -> Result<Box<dyn Resident + 'a>> {
        self.gpu.checked("residuals", || self.residuals_inner(job))
    }

    fn decode(&self, job: &DecodeJob) -> Result<Vec<u8>> {
        self.gpu.checked("decode", || self.decode_inner(job))
    }
}

impl WgpuBackend {
    fn residuals_inner<'a>(&'a self, job: &EncodeJob<'a>) -> Result<Box<dyn Resident + 'a>> {
        let size = (job.fl.width / 8) as usize;
        let n = job.reference.len() / size;
        check_len(n)?;
        let g = &self.gpu;
        let r = WgpuResident {
            b: self,
            base: Params::new(job.fl, n, job.condition),
            n,
            size,
            refs: g.upload(job.reference, 2)?,
            tgts: g.upload(job.target, 2)?,
            resid: g.zeroed(n * size + 8)?,
            codes: g.zeroed(n.div_ceil(2) * 4)?,
        };
        let counts = g.zeroed(4)?;
        let params = g.params(&r.base.words());
        let bind = g.bind(
            &g.residual,
            &params,
            &[&r.refs, &r.tgts, &r.resid, &r.codes, &counts],
        );
        let mut enc = g.encoder();
        g.dispatch(&mut enc, &g.residual, "residuals", &bind, groups(n));
        g.queue.submit([enc.finish()]);
        Ok(Box::new(r))
    }

    fn decode_inner(&self, job: &DecodeJob) -> Result<Vec<u8>> {
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
        let mut p = Params::new(job.fl, n, job.condition).layout(job.layout, job.neighbor)?;
        if job.tables.stages.len() != p.n_stages as usize {
            return Err(Error::Invalid(
                "stage tables do not match the layout".into(),
            ));
        }
        let g = &self.gpu;
        let flat = g.upload_u32(&flatten_tables(job.tables, &mut p))?;

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
