//! The interleaved rANS coding of one chunk: the sequence of operations every backend must
//! reproduce exactly (docs/FORMAT.md, "chunk coding order").
//!
//! A chunk holds up to `CHUNK_ELEMS` consecutive elements; element `j` of the chunk belongs to
//! lane `j % LANES`, and `j / LANES` is its *step*. Decoding runs step by step; inside a step,
//! stage by stage (B, Q1, Q2, S); inside a stage, lane by lane. All lanes share one stream of
//! 16-bit words. The encoder performs the mirror image (steps, stages and lanes all reversed)
//! and reverses its words. Raw tails are bit-packed separately, in element order, LSB first.

use super::bits::{BitReader, BitWriter};
use super::symbols::{neighbor, RefInfo, Sym};
use super::tables::{Space, Tables};
use crate::entropy::freq::PROB_BITS;
use crate::entropy::rans::{dec_advance, dec_get, enc_put, RANS_L};
use crate::{Error, Result};

/// Interleaved rANS states per chunk.
pub const LANES: usize = 32;
/// Elements per chunk (the last chunk of a tensor may be shorter).
pub const CHUNK_ELEMS: usize = 1 << 18;

/// The element ranges of a tensor's chunks.
pub fn chunk_ranges(n: usize) -> Vec<std::ops::Range<usize>> {
    (0..n.div_ceil(CHUNK_ELEMS))
        .map(|c| c * CHUNK_ELEMS..((c + 1) * CHUNK_ELEMS).min(n))
        .collect()
}

/// One chunk's coded output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedChunk {
    pub words: Vec<u16>,
    pub states: [u32; LANES],
    pub tail: Vec<u8>,
    pub tail_bits: u64,
}

/// One chunk's coded input to a decoder, borrowed from the blob where it can be: the tail
/// always (bytes), the words where the blob's bytes happen to be aligned on a little-endian
/// host (copied otherwise). Copying whole tails and streams was 10% of an fp32 decode.
#[derive(Clone, Debug)]
pub struct DecodeChunk<'a> {
    pub words: std::borrow::Cow<'a, [u16]>,
    pub states: [u32; LANES],
    pub tail: &'a [u8],
    pub tail_bits: u64,
}

impl EncodedChunk {
    /// This chunk as a decoder's input.
    pub fn view(&self) -> DecodeChunk<'_> {
        DecodeChunk {
            words: std::borrow::Cow::Borrowed(&self.words),
            states: self.states,
            tail: &self.tail,
            tail_bits: self.tail_bits,
        }
    }
}

/// [`EncodedChunk::view`] of every chunk.
pub fn views(chunks: &[EncodedChunk]) -> Vec<DecodeChunk<'_>> {
    chunks.iter().map(EncodedChunk::view).collect()
}

pub fn encode_chunk(
    syms: &[Sym],
    info: &[RefInfo],
    tables: &Tables,
    distance: Option<usize>,
) -> EncodedChunk {
    let n = syms.len();
    let mut states = [RANS_L; LANES];
    let mut words = Vec::with_capacity(n);
    for step in (0..n.div_ceil(LANES)).rev() {
        let lanes = LANES.min(n - step * LANES);
        for table in tables.stages.iter().rev() {
            let space = table.space;
            for lane in (0..lanes).rev() {
                let j = step * LANES + lane;
                let s = &syms[j];
                if !space.present(s) {
                    continue;
                }
                let ctx = space.context(s, info[j], neighbor(syms, j, distance));
                let row = table.row(table.row_of(ctx));
                let sym = space.symbol(s);
                enc_put(&mut states[lane], &mut words, row.start[sym], row.freq[sym]);
            }
        }
    }
    words.reverse();

    let mut tail = BitWriter::default();
    for s in syms.iter().filter(|s| s.b >= 4) {
        tail.put(s.tail, (s.b - 3) as u32);
    }
    let tail_bits = tail.bits();
    EncodedChunk {
        words,
        states,
        tail: tail.finish(),
        tail_bits,
    }
}

/// Decode a chunk of `info.len()` elements. Any inconsistency (a context without a table, the
/// word stream running dry or left over, lanes not returning to their initial state, a tail of
/// the wrong length) is reported as a format error.
pub fn decode_chunk(
    info: &[RefInfo],
    tables: &Tables,
    distance: Option<usize>,
    chunk: &DecodeChunk,
) -> Result<Vec<Sym>> {
    let bad = |detail: &str| Error::format("tensor blob chunk", detail.to_string());
    let n = info.len();
    let mut syms = vec![Sym::default(); n];
    let mut states = chunk.states;
    let mut pos = 0usize;
    let words = &chunk.words;
    for step in 0..n.div_ceil(LANES) {
        let lanes = LANES.min(n - step * LANES);
        for table in &tables.stages {
            let space: Space = table.space;
            for lane in 0..lanes {
                let j = step * LANES + lane;
                if !space.present(&syms[j]) {
                    continue;
                }
                let ctx = space.context(&syms[j], info[j], neighbor(&syms, j, distance));
                let ri = table.row_of(ctx);
                if ri == u32::MAX {
                    return Err(bad("a symbol's context has no frequency row"));
                }
                let row = table.row(ri);
                let state = &mut states[lane];
                let sym = row.lookup(dec_get(*state));
                if !dec_advance(state, words, &mut pos, row.start[sym], row.freq[sym]) {
                    return Err(bad("rANS word stream ended early"));
                }
                let s = &mut syms[j];
                match space.stage {
                    super::tables::Stage::B => s.b = sym as u8,
                    super::tables::Stage::Q1 => s.q1 = sym as u8,
                    super::tables::Stage::Q2 => s.q2 = sym as u8,
                    super::tables::Stage::S => s.neg = sym as u8,
                    super::tables::Stage::J => {
                        (s.b, s.q1, s.q2, s.neg) = super::symbols::joint_parts(sym)
                    }
                }
            }
        }
    }
    if pos != words.len() || states.iter().any(|&s| s != RANS_L) {
        return Err(bad("rANS lanes did not end in their initial state"));
    }
    let mut tail = BitReader::new(chunk.tail);
    for s in syms.iter_mut().filter(|s| s.b >= 4) {
        s.tail = tail
            .get((s.b - 3) as u32, chunk.tail_bits)
            .ok_or_else(|| bad("raw tail shorter than the bit lengths require"))?;
    }
    if tail.consumed != chunk.tail_bits {
        return Err(bad("raw tail longer than the bit lengths require"));
    }
    Ok(syms)
}

const _: () = assert!(PROB_BITS <= 16);
