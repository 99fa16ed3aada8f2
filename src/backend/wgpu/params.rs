//! The uniform parameter block and the tables as the shaders read them.

use crate::dtype::FloatLayout;
use crate::entropy::freq::PROB_TOTAL;
use crate::format::check_layout;
use crate::format::chunk::CHUNK_ELEMS;
use crate::format::layout_stages;
use crate::format::symbols::Layout;
use crate::format::tables::{Space, Tables};
use crate::{Error, Result};

/// The uniform parameter block (struct Params in shaders/prelude.wgsl).
#[derive(Clone, Copy, Default)]
pub struct Params {
    pub n: u32,
    pub fl_width: u32,
    pub mant: u32,
    pub ebits: u32,
    pub condition: bool,
    /// `Layout as u32`: 0 Paper, 1 Signed, 2 Joint (LAYOUT_* in prelude.wgsl).
    pub layout_id: u32,
    pub neighbor: u32,
    pub n_stages: u32,
    pub n_chunks: u32,
    pub pass: u32,
    pub pad: u32,
    pub map_off: [u32; 4],
    pub rows_off: [u32; 4],
    pub alpha: [u32; 4],
    pub hist_off: [u32; 4],
    /// Per stage: uses its neighbor context form (B, S).
    pub nb_form: [u32; 4],
}

impl Params {
    pub fn new(fl: FloatLayout, n: usize, condition: bool) -> Params {
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
    pub fn words(&self) -> [u32; 32] {
        let mut w = [0u32; 32];
        w[..12].copy_from_slice(&[
            self.n,
            self.fl_width,
            self.mant,
            self.ebits,
            self.condition as u32,
            self.layout_id,
            self.neighbor,
            self.n_stages,
            self.n_chunks,
            self.fl_width + 1,
            self.pass,
            self.pad,
        ]);
        for (k, v) in [
            self.map_off,
            self.rows_off,
            self.alpha,
            self.hist_off,
            self.nb_form,
        ]
        .iter()
        .enumerate()
        {
            w[12 + 4 * k..16 + 4 * k].copy_from_slice(v);
        }
        w
    }
    /// Layout and neighbor distance; the stages' context forms are set by [`Params::forms`].
    pub fn layout(mut self, layout: Layout, distance: Option<usize>) -> Result<Params> {
        // The decoder's slot tables hold one byte per symbol; the format stops the Joint
        // layout at 32-bit floats for the same reason.
        check_layout(layout, self.fl_width)?;
        self.layout_id = layout as u32;
        self.n_stages = layout_stages(layout).len() as u32;
        // Only the Signed layout has neighbor contexts.
        self.neighbor = match distance {
            Some(d) if layout == Layout::Signed => u32::try_from(d)
                .map_err(|_| Error::Unsupported(format!("neighbor distance {d}")))?,
            _ => 0,
        };
        Ok(self)
    }
}

impl Params {
    /// Which stages use their neighbor context form.
    pub fn forms(mut self, spaces: impl IntoIterator<Item = Space>) -> Params {
        self.nb_form = [0; 4];
        for (s, sp) in spaces.into_iter().enumerate() {
            self.nb_form[s] = sp.neighbor as u32;
        }
        self
    }
}

/// Tables flattened for the shaders: per stage the context -> row map, then `(freq, start)`
/// per row and symbol; for stages with more than two symbols also, at `hist_off`, the symbol
/// of every slot of every row (four per u32), so the decoder needs no search loop (only with
/// `slots`: the encoder does not read them). Also sets the stages' context forms.
pub fn flatten_tables(tables: &Tables, p: &mut Params, slots: bool) -> Vec<u32> {
    *p = p.forms(tables.stages.iter().map(|t| t.space));
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
        if a > 2 && slots {
            let mut row_slots = Vec::with_capacity(PROB_TOTAL as usize);
            for ri in 0..n_rows {
                let row = t.row(ri as u32);
                row_slots.clear();
                for (sym, &f) in row.freq.iter().enumerate() {
                    row_slots.extend(std::iter::repeat_n(sym as u8, f as usize));
                }
                debug_assert_eq!(row_slots.len(), PROB_TOTAL as usize);
                out.extend(
                    row_slots
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes(c.try_into().unwrap())),
                );
            }
        }
    }
    out
}

/// What a GPU decoder uploads, laid out as its kernels read it (shaders/decode.wgsl and
/// kernels/decode.cu share the layout): the checked parameter block, the flattened tables,
/// the ledger (per chunk: word offset, word count, tail bit offset, tail bits, the 32 lane
/// states; then one error word) and one stream of every chunk's words (u32-aligned), then
/// every chunk's tail.
pub struct DecodeInput {
    pub p: Params,
    pub tables: Vec<u32>,
    pub meta: Vec<u32>,
    pub stream: Vec<u8>,
    pub chunks: usize,
}

/// The decode inputs of `job` over `n` elements, or `None` for an empty tensor.
pub fn decode_input(job: &crate::backend::DecodeJob, n: usize) -> Result<Option<DecodeInput>> {
    let nc = crate::format::chunk::chunk_ranges(n).len();
    if nc != job.chunks.len() {
        return Err(Error::format(
            "tensor blob",
            format!("{} chunks for {n} elements", job.chunks.len()),
        ));
    }
    if nc == 0 {
        return Ok(None);
    }
    let mut p = Params::new(job.fl, n, job.condition).layout(job.layout, job.distance)?;
    if job.tables.stages.len() != p.n_stages as usize {
        return Err(Error::Invalid(
            "stage tables do not match the layout".into(),
        ));
    }
    let tables = flatten_tables(job.tables, &mut p, true);
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
    Ok(Some(DecodeInput {
        p,
        tables,
        meta,
        stream,
        chunks: nc,
    }))
}

/// The error word a GPU decoder leaves after its ledger, as the format error it stands for.
pub fn decode_error(err: u32) -> Result<()> {
    let bad = |d: &str| Err(Error::format("tensor blob chunk", d.to_string()));
    match err.trailing_zeros() {
        32 => Ok(()),
        1 => bad("a symbol's context has no frequency row"),
        2 => bad("rANS word stream ended early"),
        3 => bad("rANS lanes did not end in their initial state"),
        4 => bad("raw tail shorter than the bit lengths require"),
        _ => bad("raw tail longer than the bit lengths require"),
    }
}
