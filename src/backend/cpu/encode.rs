//! Encoder-side passes over one chunk: symbol codes, histograms, rANS lanes, raw tail.
//!
//! Per element the passes keep one `u32` code (b, q1, q2, neg) and one `u16` of reference
//! facts instead of a 16-byte `Sym`; contexts and tail are recomputed from them on the fly.

use super::tables::{put_lanes, EncStage, EncSym, IDENTITY};
use super::word::{self, b_context, neighbor_b, rs, up, Word};
use crate::entropy::rans::RANS_L;
use crate::format::bits::BitWriter;
use crate::format::chunk::{EncodedChunk, LANES};

/// Symbol codes of a chunk's elements; with `tail`, also pack their raw tails.
#[inline(always)]
pub fn codes<T: Word>(d: &[T], signed: bool, out: &mut Vec<u32>, tail: Option<&mut BitWriter>) {
    out.clear();
    match tail {
        None => {
            // A plain loop rather than `extend(map)`: the iterator's `fold` is a separate
            // function, not inlined into the AVX2 copy of the histogram pass (`super::fast`).
            // (With the tail the `extend` form measured faster, so it stays.)
            out.resize(d.len(), 0);
            for (o, &d) in out.iter_mut().zip(d) {
                let (v, neg) = word::value::<T>(d.get(), signed);
                *o = word::code(v, neg);
            }
        }
        Some(t) => {
            out.reserve(d.len());
            out.extend(d.iter().map(|&d| {
                let (v, neg) = word::value::<T>(d.get(), signed);
                let c = word::code(v, neg);
                // b < 4 puts nothing (zero bits), without a branch.
                let len = (c & 127).saturating_sub(3);
                t.put(v & ((1u64 << len) - 1), len);
                c
            }))
        }
    }
}

/// The interleaved lanes of one chunk: the exact mirror of the decoding order of
/// `format::chunk` (steps, stages and lanes reversed), words reversed at the end. Elements
/// absent from a stage code the identity symbol, so the inner loops are branch-free.
#[inline(always)]
pub fn lanes(
    codes: &[u32],
    info: &[u16],
    w1: usize,
    stages: &[EncStage],
    distance: Option<usize>,
    words: &mut Vec<u16>,
) -> ([u32; LANES], usize) {
    let n = codes.len();
    let mut states = [RANS_L as u64; LANES];
    // At most one word per coded symbol, plus one slot for the last unconditional store.
    // Grown, never cleared: every slot below `pos` is written before it is read.
    let need = n * stages.len() + 1;
    if words.len() < need {
        words.resize(need, 0);
    }
    let mut pos = 0usize;
    let d = distance.unwrap_or(usize::MAX);
    let d_s = match stages.get(3) {
        Some(t) if t.neighbor => d,
        _ => usize::MAX,
    };
    let b_nb = stages[0].neighbor;
    let mut e: [&EncSym; LANES] = [&IDENTITY; LANES];
    for step in (0..n.div_ceil(LANES)).rev() {
        let base = step * LANES;
        let lanes = LANES.min(n - base);
        let (c, inf) = (&codes[base..base + lanes], &info[base..base + lanes]);
        let st = &mut states[..lanes];
        if let Some(s_t) = stages.get(3) {
            for lane in 0..lanes {
                let b = (c[lane] & 127) as usize;
                let eb = (inf[lane] & 255) as usize * w1 + b;
                let ctx = (eb * 3 + up(codes, base + lane, d_s) as usize) * 2 + rs(inf[lane]);
                e[lane] = s_t.get(b >= 1, ctx, ((c[lane] >> 9) & 1) as usize);
            }
            put_lanes(st, &e[..lanes], words, &mut pos);
        }
        for lane in 0..lanes {
            let b = (c[lane] & 127) as usize;
            let eb = (inf[lane] & 255) as usize * w1 + b;
            let ctx = eb * 2 + ((c[lane] >> 7) & 1) as usize;
            e[lane] = stages[2].get(b >= 3, ctx, ((c[lane] >> 8) & 1) as usize);
        }
        put_lanes(st, &e[..lanes], words, &mut pos);
        for lane in 0..lanes {
            let b = (c[lane] & 127) as usize;
            let eb = (inf[lane] & 255) as usize * w1 + b;
            e[lane] = stages[1].get(b >= 2, eb, ((c[lane] >> 7) & 1) as usize);
        }
        put_lanes(st, &e[..lanes], words, &mut pos);
        for lane in 0..lanes {
            let b = (c[lane] & 127) as usize;
            let nb = if b_nb {
                neighbor_b(codes, base + lane, d, w1)
            } else {
                0
            };
            e[lane] = stages[0].get(true, b_context(inf[lane], nb, w1, b_nb), b);
        }
        put_lanes(st, &e[..lanes], words, &mut pos);
    }
    (states.map(|s| s as u32), pos)
}

/// Per-thread buffers reused from chunk to chunk (fresh ones cost page faults and memsets).
#[derive(Default)]
pub struct Scratch {
    pub codes: Vec<u32>,
    pub(super) words: Vec<u16>,
    pub(super) tail: BitWriter,
    /// Per-element map indices or packed-table entries (the Joint layout's neighbor form:
    /// the AVX2 and NEON encoders, the AVX-512 one's first elements).
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(super) idx: Vec<u32>,
}

impl Scratch {
    /// The chunk a vector encoder left here: `words` of the word buffer (in stream order),
    /// its final states and the packed tails.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub(super) fn chunk(
        &self,
        words: std::ops::Range<usize>,
        states: [u32; LANES],
    ) -> EncodedChunk {
        EncodedChunk {
            words: self.words[words].to_vec(),
            states,
            tail: self.tail.bytes(),
            tail_bits: self.tail.bits(),
        }
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// `f` with this thread's [`Scratch`], kept from tensor to tensor: a checkpoint's many small
/// tensors each took fresh buffers (their first chunk's memsets and page faults). Nothing a
/// chunk's encode calls runs on the pool, so no stolen job borrows it twice.
pub fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|s| f(&mut s.borrow_mut()))
}

/// Code one chunk of displacements.
#[inline(always)]
pub fn chunk<T: Word>(
    d: &[T],
    info: &[u16],
    signed: bool,
    w1: usize,
    stages: &[EncStage],
    distance: Option<usize>,
    s: &mut Scratch,
) -> EncodedChunk {
    s.tail.clear();
    codes(d, signed, &mut s.codes, Some(&mut s.tail));
    let (states, n_words) = lanes(&s.codes, info, w1, stages, distance, &mut s.words);
    EncodedChunk {
        words: s.words[..n_words].iter().rev().copied().collect(),
        states,
        tail: s.tail.bytes(),
        tail_bits: s.tail.bits(),
    }
}
