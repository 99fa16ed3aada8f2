//! The uniform parameter block and the tables as the shaders read them.

use crate::dtype::FloatLayout;
use crate::entropy::freq::PROB_TOTAL;
use crate::format::check_layout;
use crate::format::chunk::{EncodedChunk, CHUNK_ELEMS, LANES};
use crate::format::layout_stages;
use crate::format::symbols::{Layout, EXP_CLASSES};
use crate::format::tables::{Hist, Space, Stage, Tables, Window};
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
    /// Per stage: uses its neighbor context form (B, S, J).
    pub nb_form: [u32; 4],
    /// The exponent classes `win_lo..win_lo + win_n` of J's neighbor-form map (its
    /// `StageTable::window`) or of the histogram pass counting it (0 otherwise).
    pub win_lo: u32,
    pub win_n: u32,
}

/// Words of the parameter block: 12 scalars, 5 vec4s, the window and two words of padding
/// (a WGSL uniform struct is a multiple of 16 bytes).
pub const PARAM_WORDS: usize = 36;

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
    pub fn words(&self) -> [u32; PARAM_WORDS] {
        let mut w = [0u32; PARAM_WORDS];
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
        w[32] = self.win_lo;
        w[33] = self.win_n;
        w
    }
    /// Layout and neighbor distance; the stages' context forms are set by [`Params::forms`].
    pub fn layout(mut self, layout: Layout, distance: Option<usize>) -> Result<Params> {
        // The decoder's slot tables hold one byte per symbol; the format stops the Joint
        // layout at 32-bit floats for the same reason.
        check_layout(layout, self.fl_width)?;
        self.layout_id = layout as u32;
        self.n_stages = layout_stages(layout).len() as u32;
        // The Signed (B, S) and Joint (J) layouts have neighbor contexts, the Paper none.
        self.neighbor = match distance {
            Some(d) if layout != Layout::Paper => u32::try_from(d)
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
/// `slots`: the encoder does not read them). Also sets the stages' context forms, and J's
/// window: its neighbor form's map is over that window's exponent classes only
/// (`StageTable::window`), which the kernels' `context` indexes by.
pub fn flatten_tables(tables: &Tables, p: &mut Params, slots: bool) -> Vec<u32> {
    *p = p.forms(tables.stages.iter().map(|t| t.space));
    let mut out = Vec::new();
    for (s, t) in tables.stages.iter().enumerate() {
        if t.space.stage == Stage::J {
            (p.win_lo, p.win_n) = (t.window.lo, t.window.n);
        }
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

/// Where a GPU's histogram pass counts (shaders/residual.wgsl and kernels/residual.cu):
/// every stage of one request in one buffer of `total` words, stage `s` from `p.hist_off[s]`,
/// context-major.
pub struct HistLayout {
    pub p: Params,
    pub spaces: Vec<Space>,
    pub total: usize,
}

/// The histogram layout of one request (B and S in their neighbor forms with a `distance`,
/// Signed only; the Joint layout's neighbor form is [`NearHist`]'s) over the tensor of
/// `base`.
pub fn hist_layout(base: Params, layout: Layout, distance: Option<usize>) -> Result<HistLayout> {
    if near_distance(layout, distance).is_some() {
        return Err(Error::Invalid(
            "J's neighbor form is counted by NearHist, not densely".into(),
        ));
    }
    let distance = distance.filter(|_| layout != Layout::Paper);
    let spaces = crate::format::layout_spaces(layout, base.fl_width, distance);
    let mut p = base.layout(layout, distance)?.forms(spaces.iter().copied());
    let mut total = 0usize;
    for (s, sp) in spaces.iter().enumerate() {
        p.hist_off[s] = total as u32;
        p.alpha[s] = sp.alphabet() as u32;
        total += sp.n_primary() * sp.alphabet();
    }
    Ok(HistLayout { p, spaces, total })
}

impl HistLayout {
    /// The stages' histograms from the counts read back.
    pub fn hists(&self, words: &[u32]) -> Vec<Hist> {
        self.spaces
            .iter()
            .enumerate()
            .map(|(s, &sp)| {
                let at = self.p.hist_off[s] as usize;
                let n = sp.n_primary() * sp.alphabet();
                let counts: Vec<u64> = words[at..at + n].iter().map(|&w| w as u64).collect();
                Hist::from_dense(sp, &counts)
            })
            .collect()
    }
}

/// The Joint layout's neighbor form, the one request [`hist_layout`] does not take: the
/// distance of its neighbor, where `layout` and `distance` ask for it.
pub fn near_distance(layout: Layout, distance: Option<usize>) -> Option<usize> {
    distance.filter(|_| layout == Layout::Joint)
}

/// Most words of one pass's dense counts of J's neighbor form (64 MiB; a wgpu adapter binds
/// at least 128 MiB).
const NEAR_PIECE_WORDS: usize = 1 << 24;

/// J's neighbor form counted on a GPU. Its context space (up to 208,896 contexts of 247
/// symbols) is far too large to count densely, but every context of a tensor lies in its
/// window of exponent classes `lo..=hi` (a range pass finds it): the histogram pass counts
/// densely over that window, at the index its map uses (`context` in the kernels: near·2n +
/// (er - lo)·2 + rs), in pieces of the window where one would take more than
/// `NEAR_PIECE_WORDS` words (fp32 over more than 83 classes); the occupied rows then go to
/// the `Hist` under their primary ids. The CPU counts the same contexts (`joint_near.rs`),
/// so the histograms are equal.
pub struct NearHist {
    /// The parameter block of the symbol codes and the range pass (shaders/residual.wgsl's
    /// `er_range`, kernels/residual.cu's `ls_er_range`).
    pub p: Params,
    space: Space,
    ctxs: Vec<u32>,
    rows: Vec<u64>,
}

impl NearHist {
    pub fn new(base: Params, distance: usize) -> Result<NearHist> {
        let space = Space::new(Stage::J, base.fl_width, true);
        let mut p = base.layout(Layout::Joint, Some(distance))?.forms([space]);
        p.alpha[0] = space.alphabet() as u32;
        Ok(NearHist {
            p,
            space,
            ctxs: Vec::new(),
            rows: Vec::new(),
        })
    }

    /// The histogram passes over the window that the range pass left in `range` (the
    /// largest `255 - er` and the largest `er`: zero is the identity of both, so the buffer
    /// starts zeroed): each pass's parameter block and words of counts. None for a tensor
    /// without elements.
    pub fn pieces(&self, range: &[u32]) -> Vec<(Params, usize)> {
        let (lo, hi) = (255u32.saturating_sub(range[0]), range[1]);
        let per_class = 2 * Window::nears(self.space) * self.space.alphabet();
        let step = (NEAR_PIECE_WORDS / per_class).max(1) as u32;
        (lo..=hi)
            .step_by(step as usize)
            .map(|at| {
                let mut p = self.p;
                (p.win_lo, p.win_n) = (at, step.min(hi + 1 - at));
                (p, p.win_n as usize * per_class)
            })
            .collect()
    }

    /// Take the counts of the pass of parameter block `p`: its occupied rows.
    pub fn add(&mut self, p: &Params, counts: &[u32]) {
        let (a, span) = (self.space.alphabet(), 2 * p.win_n as usize);
        for (k, row) in counts.chunks_exact(a).enumerate() {
            if row.iter().any(|&c| c != 0) {
                let ctx = k / span * 2 * EXP_CLASSES + 2 * p.win_lo as usize + k % span;
                self.ctxs.push(ctx as u32);
                self.rows.extend(row.iter().map(|&c| c as u64));
            }
        }
    }

    pub fn hist(self) -> Hist {
        Hist::from_rows(self.space, &self.ctxs, &self.rows)
    }
}

/// The parameter block and flattened tables of an encode (no slot tables: the encoder does
/// not search).
pub fn encode_input(
    base: Params,
    layout: Layout,
    tables: &Tables,
    distance: Option<usize>,
) -> Result<(Params, Vec<u32>)> {
    let mut p = base.layout(layout, distance)?;
    if tables.stages.len() != p.n_stages as usize {
        return Err(Error::Invalid(
            "stage tables do not match the layout".into(),
        ));
    }
    let flat = flatten_tables(tables, &mut p, false);
    Ok((p, flat))
}

/// A GPU encoder's ledger (shaders/encode.wgsl and kernels/encode.cu share it), in words:
/// lane masks [nc * GROUPS] | their prefix sums [nc * GROUPS] | word totals [nc] | tail
/// totals [nc] | word bases [nc] | tail bases [nc] | final lane states [nc * 32].
pub struct EncodeLedger {
    pub chunks: usize,
}

/// Mask groups per chunk: steps of 32 lanes x 4 stage slots.
const GROUPS: usize = CHUNK_ELEMS / LANES * 4;

/// Where pass 1 writes: chunk bases (word bases, then tail bit bases), and the output's size.
pub struct Placement {
    pub bases: Vec<u32>,
    /// u32 index of the tails in the output (`Params::pad` of pass 1).
    pub tail_off: usize,
    pub out_words: usize,
}

impl EncodeLedger {
    pub fn len(&self) -> usize {
        2 * self.chunks * GROUPS + 4 * self.chunks + LANES * self.chunks
    }
    /// Word offset of the per-chunk totals (word totals, then tail totals).
    pub fn totals_at(&self) -> usize {
        2 * self.chunks * GROUPS
    }
    /// Word offset of the chunk bases, which the host writes between the passes.
    pub fn bases_at(&self) -> usize {
        self.totals_at() + 2 * self.chunks
    }
    fn states_at(&self) -> usize {
        self.totals_at() + 4 * self.chunks
    }

    /// Chunk bases from pass 0's totals (word totals, then tail totals): each chunk starts on
    /// a u32 boundary in both regions.
    pub fn place(&self, totals: &[u32], device: &str) -> Result<Placement> {
        let nc = self.chunks;
        let mut bases = vec![0u32; 2 * nc];
        let (mut wpos, mut tpos) = (0u64, 0u64);
        for c in 0..nc {
            bases[c] = wpos as u32;
            bases[nc + c] = tpos as u32;
            wpos += (totals[c] as u64).div_ceil(2) * 2;
            tpos += (totals[nc + c] as u64).div_ceil(32) * 32;
        }
        if wpos >= 1 << 32 || tpos >= 1 << 32 {
            return Err(Error::Unsupported(format!(
                "tensor too large for the {device} backend"
            )));
        }
        let tail_off = (wpos / 2) as usize;
        Ok(Placement {
            bases,
            tail_off,
            out_words: tail_off + (tpos / 32) as usize + 2,
        })
    }

    /// Every chunk's coded output, from pass 1's output and ledger.
    pub fn chunks(&self, at: &Placement, out_bytes: &[u8], ledger: &[u32]) -> Vec<EncodedChunk> {
        let nc = self.chunks;
        let totals = &ledger[self.totals_at()..];
        (0..nc)
            .map(|c| {
                let w0 = at.bases[c] as usize * 2;
                let words = out_bytes[w0..w0 + totals[c] as usize * 2]
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .collect();
                let t0 = at.tail_off * 4 + at.bases[nc + c] as usize / 8;
                let tail_bits = totals[nc + c] as u64;
                let mut states = [0u32; LANES];
                let s0 = self.states_at() + c * LANES;
                states.copy_from_slice(&ledger[s0..s0 + LANES]);
                EncodedChunk {
                    words,
                    states,
                    tail: out_bytes[t0..t0 + tail_bits.div_ceil(8) as usize].to_vec(),
                    tail_bits,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    /// The passes of J's neighbor form cover the tensor's window of exponent classes once,
    /// in order, each within the bound; a tensor without elements has none.
    #[test]
    fn near_pieces_cover_the_window_once_within_the_bound() {
        let fl = DType::F32.float_layout().unwrap();
        let h = NearHist::new(Params::new(fl, 1000, true), 64).unwrap();
        // (largest 255 - er, largest er) -> classes lo..=hi
        for (range, lo, hi) in [
            ([255, 255], 0, 255),
            ([248, 7], 7, 7),
            ([200, 100], 55, 100),
        ] {
            let pieces = h.pieces(&range);
            let classes: Vec<u32> = pieces
                .iter()
                .flat_map(|(p, _)| p.win_lo..p.win_lo + p.win_n)
                .collect();
            assert_eq!(classes, (lo..=hi).collect::<Vec<_>>(), "{range:?}");
            assert!(pieces.iter().all(|&(_, w)| w <= NEAR_PIECE_WORDS));
        }
        // fp32 over every class does not fit one pass.
        assert!(h.pieces(&[255, 255]).len() > 1);
        assert!(h.pieces(&[0, 0]).is_empty());
    }
}
