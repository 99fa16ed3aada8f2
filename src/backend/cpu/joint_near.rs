//! The Joint layout's neighbor form on the CPU: the one symbol per weight of `--fast`
//! (`joint.rs`), under a context that adds what the default layout's B and S stages see of
//! the element one row up (its bit length and update sign) and the reference's top two
//! mantissa bits: `near·512 + er·2 + rs` with `near = (m2·(W1+1) + nb)·3 + up`
//! (docs/FORMAT.md, flag bit 3). The neighbor is `d >= LANES` elements back, so it is
//! always decoded in an earlier step and the lanes stay independent within one.
//!
//! Portable code, run at every level (compiled with AVX2 enabled where the CPU has it);
//! same per-element codes and raw tails as the other layouts.

use rayon::prelude::*;

use super::decode::{no_row, Stream};
use super::encode::{codes, Scratch};
#[cfg(target_arch = "x86_64")]
use super::joint::joint_of_code_wide;
use super::joint::{code_of_joint, joint_of_code, JointDec};
use super::residuals::Residuals;
use super::tables::{put_lanes, EncStage, EncSym, IDENTITY};
use super::word::Word;
use super::Isa;
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::entropy::rans::RANS_L;
use crate::format::chunk::{chunk_ranges, EncodedChunk, LANES};
use crate::format::symbols::EXP_CLASSES;
use crate::format::tables::{Hist, Row, Space, Stage, StageTable, Window};
use crate::memory::{HugeTable, HUGE_PAGE};
use crate::Result;

/// The neighbor part of a context, `(m2·(W1+1) + nb)·3 + up`, of facts `i` and the code `c`
/// of the element `d` before: branch-free, so the loops over many elements vectorize (a
/// code's neg bit is 0 where b = 0, so up = min(b, 1) + neg).
#[inline(always)]
fn near_of(i: u32, c: u32, w1: u32) -> u32 {
    let (nb, m2) = (c & 127, (i >> 9) & 3);
    (m2 * (w1 + 1) + nb) * 3 + nb.min(1) + ((c >> 9) & 1)
}

/// The neighbor part of element `j`'s context: [`near_of`] its neighbor's code, or nb = W1
/// and up = 0 where it has none.
#[inline(always)]
fn near(info: u16, codes: &[u32], j: usize, d: usize, w1: usize) -> u32 {
    let (i, w1) = (info as u32, w1 as u32);
    if j >= d {
        near_of(i, codes[j - d], w1)
    } else {
        (((i >> 9) & 3) * (w1 + 1) + w1) * 3
    }
}

/// The map index over `window` ([`Window::index`]) of the context with neighbor part `nr`
/// and facts `i`: `nr·2n + (er - lo)·2 + rs`, or `u32::MAX` (in no map) where the exponent
/// class is outside.
#[inline(always)]
fn index_of(nr: u32, i: u32, window: Window) -> u32 {
    let k = class_of(i, window);
    if k < 2 * window.n {
        nr * 2 * window.n + k
    } else {
        u32::MAX
    }
}

/// `(er - lo)·2 + rs` of facts `i` (wrapped, so above `2n`, where the class is below `lo`).
#[inline(always)]
fn class_of(i: u32, window: Window) -> u32 {
    ((i & 255) * 2 + ((i >> 8) & 1)).wrapping_sub(2 * window.lo)
}

/// Element `j`'s map index over `window` ([`index_of`]).
#[inline(always)]
fn map_index(info: &[u16], codes: &[u32], j: usize, d: usize, w1: usize, window: Window) -> u32 {
    index_of(near(info[j], codes, j, d, w1), info[j] as u32, window)
}

/// Histogram of the J stage in its neighbor form. The context space (up to 208,896
/// contexts of 247 symbols) is far too large to count densely; a tensor's elements fall in
/// a few thousand contexts: each thread gives an occupied context a row when it first sees
/// it, through a map over the tensor's exponent classes (`lo..=hi`) only, and keeps its
/// rows across the chunks it counts (rows per chunk, widened and merged by sorting: their
/// `Hist::from_rows` alone was 6% of an encode's samples on the GPT-2 trajectory).
#[inline(always)]
pub fn histogram<T: Word>(
    isa: Isa,
    res: &impl Residuals<T>,
    (lo, hi): (usize, usize),
    width: u32,
    distance: usize,
) -> Hist {
    // Counts are 32-bit: tensors of 2^31 elements or more are counted in such pieces
    // (chunk-aligned) and their histograms added.
    const PIECE: usize = 1 << 31;
    let n = res.elements();
    if n <= PIECE {
        return piece_histogram(isa, res, 0..n, (lo, hi), width, distance);
    }
    let mut h = Hist::new(Space::new(Stage::J, width, true));
    for at in (0..n).step_by(PIECE) {
        let piece = at..(at + PIECE).min(n);
        h.add(&piece_histogram(isa, res, piece, (lo, hi), width, distance));
    }
    h
}

/// [`histogram`] of the elements in `piece` (fewer than 2^32, chunk-aligned).
#[inline(always)]
fn piece_histogram<T: Word>(
    isa: Isa,
    res: &impl Residuals<T>,
    piece: std::ops::Range<usize>,
    (lo, hi): (usize, usize),
    width: u32,
    distance: usize,
) -> Hist {
    debug_assert!(T::BITS <= 32);
    let space = Space::new(Stage::J, width, true);
    let (w1, a) = (width as usize + 1, space.alphabet());
    let window = Window {
        lo: lo as u32,
        n: (hi - lo + 1) as u32,
    };
    let per_near = 2 * window.n as usize;
    let new = || Counts::new(4 * (w1 + 1) * 3 * per_near);
    // Every piece rayon splits off starts a fold of its own, and a fold's rows grow to the
    // tensor's (2,858 rows of 247 counts on the GPT-2 embedding: 2.8 MB, zeroed, then
    // merged): unbounded, two threads split the embedding's 25 chunks into 10-11 folds,
    // and more threads into more. About two pieces per thread keep the stealing (two
    // threads' encode 1.01-1.04x faster on a Zen 3, docs/BENCHMARKS.md).
    let ranges: Vec<_> = chunk_ranges(piece.len())
        .into_iter()
        .map(|r| piece.start + r.start..piece.start + r.end)
        .collect();
    let min_len = (ranges.len() / (2 * rayon::current_num_threads())).max(1);
    let counts = ranges
        .into_par_iter()
        .with_min_len(min_len)
        .fold(new, |mut acc, r| {
            // (The level's code inside the chunk's closure: `chunk` itself is not compiled
            // for it.)
            res.chunk(r, |d, info| {
                super::hist::simd(
                    isa,
                    #[inline(always)]
                    || {
                        // The codes in 32-bit arithmetic (`encode::codes` works in 64: half the
                        // vector lanes).
                        // Written in place, not zeroed first (the zeroing was 2% of a bf16
                        // encode's samples at AVX2).
                        acc.codes.clear();
                        acc.codes.reserve(d.len());
                        let spare = &mut acc.codes.spare_capacity_mut()[..d.len()];
                        for (o, &x) in spare.iter_mut().zip(d) {
                            o.write(super::hist::code_of(x, true));
                        }
                        // SAFETY: the loop wrote all `d.len()`.
                        unsafe { acc.codes.set_len(d.len()) };
                        let lut = joint_of_code();
                        // (Out of `acc` while its rows grow.)
                        let all = std::mem::take(&mut acc.codes);
                        const BLOCK: usize = 1024;
                        let mut at = [0u32; BLOCK];
                        for b in (0..d.len()).step_by(BLOCK) {
                            let m = BLOCK.min(d.len() - b);
                            // At AVX-512 each element's counter (its row's start plus its
                            // symbol) in the vector, map lookups by gathers; a context without
                            // a row yet sends the block to the loops below.
                            #[cfg(target_arch = "x86_64")]
                            if isa >= Isa::Avx512 && b >= distance {
                                // SAFETY: the level's features (`hist::simd` runs this closure
                                // with them); every element of the block has its neighbor.
                                let found = unsafe {
                                    super::avx512::joint_near::counters(
                                        &info[b..b + m],
                                        &all[b - distance..b - distance + m],
                                        &all[b..b + m],
                                        (w1, window),
                                        &acc.slot,
                                        joint_of_code_wide(),
                                        &mut at[..m],
                                    )
                                };
                                if found {
                                    increment(&mut acc.rows, &at[..m]);
                                    continue;
                                }
                            }
                            // Map indices: a branch-free loop (it vectorizes) where every element
                            // of the block has its neighbor. Every class is in the window.
                            if b >= distance {
                                let (info, nbs) = (&info[b..b + m], &all[b - distance..]);
                                for ((o, &i), &c) in at[..m].iter_mut().zip(info).zip(nbs) {
                                    // (No outside check: the window is the data's classes.)
                                    let nr = near_of(i as u32, c, w1 as u32);
                                    *o = nr * 2 * window.n + class_of(i as u32, window);
                                }
                            } else {
                                for (o, j) in at[..m].iter_mut().zip(b..) {
                                    *o = map_index(info, &all, j, distance, w1, window);
                                }
                            }
                            // Then the counts: one loop, the row's start straight from the map,
                            // the block's halves interleaved: neighbors often share a counter,
                            // and an increment waits for the one before it to the same counter
                            // (bf16 +5-10%). The tables are held as slices (in registers, not
                            // reloaded after every increment) until a pair meets a context
                            // without a row, which the cold path makes before going on.
                            let h = m / 2;
                            let (a0, a1) = at[..m].split_at(h);
                            let (c0, c1) = all[b..b + m].split_at(h);
                            let mut p = 0;
                            while p < h {
                                let (slot, rows) = (&acc.slot[..], &mut acc.rows[..]);
                                while p < h {
                                    let (s0, s1) = (slot[a0[p] as usize], slot[a1[p] as usize]);
                                    if s0 == u32::MAX || s1 == u32::MAX {
                                        break;
                                    }
                                    rows[s0 as usize + lut[c0[p] as usize & 1023] as usize] += 1;
                                    rows[s1 as usize + lut[c1[p] as usize & 1023] as usize] += 1;
                                    p += 1;
                                }
                                if p < h {
                                    acc.make_rows(&[a0[p], a1[p]], a, per_near, lo);
                                }
                            }
                            if m % 2 == 1 {
                                let k = at[m - 1];
                                acc.make_rows(&[k], a, per_near, lo);
                                let start = acc.slot[k as usize] as usize;
                                acc.rows[start + lut[all[b + m - 1] as usize & 1023] as usize] += 1;
                            }
                        }
                        acc.codes = all;
                    },
                )
            });
            acc
        })
        .reduce_with(|mut x, y| {
            for (&k, row) in y.ks.iter().zip(y.rows.chunks_exact(a)) {
                let at = x.row(k as usize, a, || {
                    y.ctxs[y.slot[k as usize] as usize / a] as usize
                });
                x.rows[at..at + a]
                    .iter_mut()
                    .zip(row)
                    .for_each(|(x, y)| *x += y);
            }
            x
        })
        .unwrap_or_else(new);
    Hist::from_rows(space, &counts.ctxs, &counts.rows)
}

/// One increment per counter in `at`, the halves interleaved (as [`histogram`]'s loop).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn increment(rows: &mut [u32], at: &[u32]) {
    let (a0, a1) = at.split_at(at.len() / 2);
    for (&k0, &k1) in a0.iter().zip(a1) {
        rows[k0 as usize] += 1;
        rows[k1 as usize] += 1;
    }
    if a1.len() > a0.len() {
        rows[at[at.len() - 1] as usize] += 1;
    }
}

/// One thread's neighbor-form counts: a row per occupied context, in first-seen order.
struct Counts {
    /// Map index -> where its row starts in `rows`, `u32::MAX` for none yet.
    slot: Vec<u32>,
    /// Per row: its map index and its primary context id.
    ks: Vec<u32>,
    ctxs: Vec<u32>,
    /// `alphabet` counts per row.
    rows: Vec<u32>,
    /// The chunk's per-element codes.
    codes: Vec<u32>,
}

impl Counts {
    fn new(n: usize) -> Self {
        Counts {
            slot: vec![u32::MAX; n],
            ks: Vec::new(),
            ctxs: Vec::new(),
            rows: Vec::new(),
            codes: Vec::new(),
        }
    }
    /// Where the row of map index `k` starts, made (for context `ctx()`) if new.
    #[inline(always)]
    fn row(&mut self, k: usize, a: usize, ctx: impl FnOnce() -> usize) -> usize {
        if self.slot[k] == u32::MAX {
            self.new_row(k, a, ctx());
        }
        self.slot[k] as usize
    }
    /// Rows for those of map indices `ks` that have none (`per_near` and `lo` give their
    /// contexts, as [`histogram`]'s map lays them out).
    #[cold]
    #[inline(never)]
    fn make_rows(&mut self, ks: &[u32], a: usize, per_near: usize, lo: usize) {
        for &k in ks {
            let k = k as usize;
            if self.slot[k] == u32::MAX {
                let ctx = k / per_near * 2 * EXP_CLASSES + k % per_near + 2 * lo;
                self.new_row(k, a, ctx);
            }
        }
    }
    /// A row for map index `k` (context `ctx`), zeroed; where it starts.
    #[cold]
    #[inline(never)]
    fn new_row(&mut self, k: usize, a: usize, ctx: usize) -> u32 {
        let start = self.rows.len() as u32;
        self.slot[k] = start;
        self.ks.push(k as u32);
        self.ctxs.push(ctx as u32);
        self.rows.resize(self.rows.len() + a, 0);
        start
    }
}

/// Code one chunk: per-element codes and raw tails as in the other layouts, then
/// [`lanes`].
#[inline(always)]
pub fn encode_chunk<T: Word>(
    d: &[T],
    info: &[u16],
    table: &EncStage,
    distance: usize,
    w1: usize,
    s: &mut Scratch,
) -> EncodedChunk {
    s.tail.clear();
    codes(d, true, &mut s.codes, Some(&mut s.tail));
    lanes(info, table, distance, w1, s)
}

/// The lanes of a chunk whose codes and tails are in `s`: one joint symbol per element
/// under its neighbor-form context (the mirror of `format::chunk`'s decoding order, as
/// `joint::encode_chunk`).
#[inline(always)]
pub fn lanes(
    info: &[u16],
    table: &EncStage,
    distance: usize,
    w1: usize,
    s: &mut Scratch,
) -> EncodedChunk {
    let lut = joint_of_code();
    let n = s.codes.len();
    let mut states = [RANS_L as u64; LANES];
    if s.words.len() < n + 1 {
        s.words.resize(n + 1, 0);
    }
    let mut pos = 0usize;
    let mut e: [&EncSym; LANES] = [&IDENTITY; LANES];
    for step in (0..n.div_ceil(LANES)).rev() {
        let base = step * LANES;
        let lanes = LANES.min(n - base);
        for lane in 0..lanes {
            let j = base + lane;
            // Every element's context has a row (the tables were built from these counts);
            // a missing one would code the identity, which the encoder's verify catches.
            let ri = table
                .map
                .get(map_index(info, &s.codes, j, distance, w1, table.window) as usize)
                .map_or(usize::MAX / 512, |&ri| ri as usize);
            let sym = lut[s.codes[j] as usize] as usize;
            e[lane] = table
                .syms
                .get(ri * table.alphabet + sym)
                .unwrap_or(&IDENTITY);
        }
        put_lanes(&mut states[..lanes], &e[..lanes], &mut s.words, &mut pos);
    }
    EncodedChunk {
        words: s.words[..pos].iter().rev().copied().collect(),
        states: states.map(|x| x as u32),
        tail: s.tail.bytes(),
        tail_bits: s.tail.bits(),
    }
}

/// The neighbor form's decoder slots. A tensor has a few hundred rows (407 in the GPT-2
/// trajectory's embedding), each read by many elements: the `--fast` decoder's 16 KiB slot
/// table per row (6.5 MiB there) missed cache on most of the AVX2 lanes' lookups. Here a
/// slot holds only its symbol (4 KiB a row), and the symbol's frequency and start sit in a
/// per-row array beside it, whose few hot entries stay in cache. Or, where the lanes look
/// up by gathers (AVX2 on CPUs with fast gathers), a quarter of that: 16-slot buckets
/// ([`NearSlots::bucketed`]).
pub struct NearSlots {
    pub window: Window,
    pub n_rows: usize,
    /// The symbol of every slot, `PROB_TOTAL` per row (then 3 bytes of padding: the AVX2
    /// lanes load 4 bytes at a time). In huge pages from a quarter of one: the vector lanes'
    /// lookups land at random in it (1.7 MB for the GPT-2 trajectory's embedding; its bf16
    /// decode 1.04x at AVX2 on an Intel Xeon, docs/BENCHMARKS.md). Empty where bucketed.
    pub syms: HugeTable<u8>,
    /// `freq | start << 16` per row and symbol, 256 per row. Empty where bucketed.
    pub fs: Vec<u32>,
    /// Bucketed: 256 buckets of 16 slots per row, `base | mask << 16`: `base` the ordinal
    /// (among the row's symbols of nonzero frequency, in symbol order) of the symbol at the
    /// bucket's first slot, mask bit `i` set where a symbol starts at its slot `i >= 1`. A
    /// slot's ordinal is `base` plus the bits set up to its place in the bucket. 1 KiB a
    /// row, against the symbol per slot's 4 KiB: on a Zen 3 (L2 of 512 KiB) the default
    /// layout's AVX2 decode 1.02-1.04x (bf16) and 1.03-1.05x (fp32) by gathers, the
    /// popcount included; with scalar loads 0.97x (bf16), so only for gathers
    /// (docs/BENCHMARKS.md). Empty unless bucketed.
    pub buckets: Vec<u32>,
    /// Bucketed: `(freq - 1) | start << 12 | symbol << 24` per row and ordinal, 256 per
    /// row, then 16 entries of padding (a lane's ordinal is below 256 + 16 whatever the
    /// bucket says). Empty unless bucketed.
    pub ords: Vec<u32>,
}

impl NearSlots {
    /// The slots of `t`'s rows: a symbol per slot, or `bucketed`.
    pub fn new(t: &StageTable, bucketed: bool) -> Self {
        let n_rows = t.explicit.len() + t.backoff.len();
        let total = PROB_TOTAL as usize;
        let mut near = NearSlots {
            window: t.window,
            n_rows,
            syms: HugeTable::new(0, 0u8, HUGE_PAGE),
            fs: Vec::new(),
            buckets: Vec::new(),
            ords: Vec::new(),
        };
        if bucketed {
            near.buckets = vec![0u32; n_rows * 256];
            near.ords = vec![0u32; n_rows * 256 + 16];
            near.buckets
                .par_chunks_mut(256)
                .zip(near.ords.par_chunks_mut(256))
                .with_min_len(4)
                .enumerate()
                .for_each(|(ri, (buckets, ords))| bucket_row(t.row(ri as u32), buckets, ords));
            return near;
        }
        let mut syms = HugeTable::new(n_rows * total + 3, 0u8, HUGE_PAGE / 4);
        let mut fs = vec![0u32; n_rows * 256];
        syms[..n_rows * total]
            .par_chunks_mut(total)
            .zip(fs.par_chunks_mut(256))
            .with_min_len(4)
            .enumerate()
            .for_each(|(ri, (out, fs))| {
                let row = t.row(ri as u32);
                let mut at = 0;
                for (j, (&f, &start)) in row.freq.iter().zip(&row.start).enumerate().take(256) {
                    // A row's frequencies sum to its slots (`StageTable` checks them); the
                    // bound keeps a bad row inside its own slots regardless.
                    fs[j] = f | start.min(PROB_TOTAL) << 16;
                    let end = (at + f as usize).min(total);
                    out[at..end].fill(j as u8);
                    at = end;
                }
            });
        near.syms = syms;
        near.fs = fs;
        near
    }

    /// Whether the slots are in 16-slot buckets (`buckets`, `ords`).
    pub fn bucketed(&self) -> bool {
        !self.ords.is_empty()
    }

    /// Row `ri`'s symbol at `slot`, with its frequency and start: `(J, freq | start << 16)`
    /// (`None` past the rows).
    #[inline(always)]
    pub fn lookup(&self, ri: usize, slot: usize) -> Option<(u32, u32)> {
        if !self.bucketed() {
            let &sym = self.syms[..self.syms.len() - 3].get(ri * PROB_TOTAL as usize + slot)?;
            return Some((sym as u32, *self.fs.get(ri * 256 + sym as usize)?));
        }
        let b = *self.buckets.get(ri * 256 + slot / 16)?;
        let e = self.ords[ri * 256 + ordinal(b, slot as u32) as usize];
        Some((e >> 24, ((e & 0xFFF) + 1) | (e >> 12 & 0xFFF) << 16))
    }

    /// The rows and the classes per neighbor context (`span`) the vector decode lanes
    /// (AVX2, AVX-512, NEON) index by, where the tables have the shapes those lanes assume
    /// (`None`: the portable lanes decode the chunk). Every index then stays in its table:
    /// map indices below `4·(w1+1)·3·span`, the map's length (nb <= w, m2 <= 3, up <= 2 for
    /// codes this decoder wrote; the exponent class checked against the window per step);
    /// the map below 2^31 entries and the rows below 2^19, so map indices and `row·4096 +
    /// slot` are non-negative i32 (the gathers' indices); `syms` padded with 3 bytes for
    /// 4-byte loads; and `d >= LANES`, so a step's neighbors lie in earlier steps.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub fn lane_shapes(&self, table: &JointDec, w1: usize, d: usize) -> Option<(usize, usize)> {
        let n_rows = self.n_rows;
        let span = 2 * self.window.n as usize;
        let n_near = 4 * (w1 + 1) * 3;
        let slots = if self.bucketed() {
            self.buckets.len() == n_rows * 256 && self.ords.len() == n_rows * 256 + 16
        } else {
            self.syms.len() == n_rows * PROB_TOTAL as usize + 3 && self.fs.len() == n_rows * 256
        };
        let fits = table.map.len() == n_near * span
            && table.map.len() < 1 << 31
            && slots
            && n_rows < 1 << 19
            && span > 0
            && d >= LANES;
        fits.then_some((n_rows, span))
    }
}

/// A slot's ordinal from its bucket `b` (`NearSlots::buckets`): the base plus the symbols
/// starting in the bucket up to the slot's place (below `256 + 16` whatever `b` holds).
#[inline(always)]
fn ordinal(b: u32, slot: u32) -> u32 {
    let upto = ((2u32 << 16) << (slot % 16)).wrapping_sub(1 << 16);
    (b & 255) + (b & upto).count_ones()
}

/// One row's buckets and ordinal entries (`NearSlots::bucketed`). A row's frequencies sum to
/// its slots (`StageTable` checks them); the bounds keep a bad row inside its own slots and
/// entries regardless.
fn bucket_row(row: &Row, buckets: &mut [u32], ords: &mut [u32]) {
    let total = PROB_TOTAL as usize;
    let (mut at, mut ord) = (0usize, 0usize);
    for (j, &f) in row.freq.iter().enumerate().take(256) {
        if f == 0 || at >= total {
            continue;
        }
        let f = (f as usize).min(total - at);
        ords[ord] = (f as u32 - 1) | (at as u32) << 12 | (j as u32) << 24;
        if at % 16 == 0 {
            buckets[at / 16] = ord as u32;
        } else {
            buckets[at / 16] |= 1 << (16 + at % 16);
        }
        // The buckets whose first slot this symbol covers start with it.
        for b in at / 16 + 1..(at + f).div_ceil(16) {
            buckets[b] = ord as u32;
        }
        at += f;
        ord += 1;
    }
}

/// Each element's code in `codes` replaced by its entry in `table.packed`: its row's (by its
/// context, from the code `distance` back) times the alphabet, plus its symbol. The map
/// indices first, into `idx` (where an element has its neighbor, by arithmetic only: that
/// loop vectorizes), then the rows. An element whose context has no row (never, for tables
/// built from these counts) gets an index past the table, which the lanes clamp: the
/// encoder's verify catches what that codes.
#[inline(always)]
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub fn packed_indices(
    info: &[u16],
    table: &EncStage,
    distance: usize,
    w1: usize,
    codes: &mut [u32],
    idx: &mut Vec<u32>,
) {
    let n = codes.len().min(info.len());
    let w = table.window;
    // Written in place, not zeroed first.
    idx.clear();
    idx.reserve(n);
    let spare = &mut idx.spare_capacity_mut()[..n];
    let head = distance.min(n);
    for (j, o) in spare[..head].iter_mut().enumerate() {
        o.write(map_index(info, codes, j, distance, w1, w));
    }
    for ((o, &i), &c) in spare[head..].iter_mut().zip(&info[head..n]).zip(&codes[..]) {
        o.write(index_of(near_of(i as u32, c, w1 as u32), i as u32, w));
    }
    // SAFETY: the two loops wrote all `n` (the second's `codes` are at least `n - head`).
    unsafe { idx.set_len(n) };
    let lut = joint_of_code();
    for (c, &k) in codes[..n].iter_mut().zip(idx.iter()) {
        *c = packed_of(table, lut, k, *c);
    }
}

/// Element `j`'s entry in `table.packed`, as [`packed_indices`] gives it.
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn packed_index(
    info: &[u16],
    table: &EncStage,
    distance: usize,
    w1: usize,
    codes: &[u32],
    j: usize,
) -> u32 {
    let k = map_index(info, codes, j, distance, w1, table.window);
    packed_of(table, joint_of_code(), k, codes[j])
}

/// The entry in `table.packed` of code `c` under the context of map index `k`
/// (`u32::MAX` where no row covers it).
#[inline(always)]
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
fn packed_of(table: &EncStage, lut: &[u8; 1024], k: u32, c: u32) -> u32 {
    let ri = table
        .map
        .get(k as usize)
        .map_or(u32::MAX as usize, |&r| r as usize);
    let at = ri * table.alphabet + lut[c as usize & 1023] as usize;
    at.min(u32::MAX as usize) as u32
}

/// Decode steps `steps` of one chunk's lanes into per-element codes (`info`: the chunk's
/// facts, `codes`: its codes, those of earlier steps already decoded): each element's
/// context from the code `distance` back, its row from `table.map`, its symbol from `near`
/// (`table.near`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn decode_steps(
    table: &JointDec,
    near: &NearSlots,
    info: &[u16],
    codes: &mut [u32],
    states: &mut [u32; LANES],
    st: &mut Stream,
    distance: usize,
    w1: usize,
    steps: std::ops::Range<usize>,
) -> Result<()> {
    let lut = code_of_joint();
    let n = codes.len();
    for step in steps {
        let base = step * LANES;
        let lanes = LANES.min(n - base);
        let xs = &mut states[..lanes];
        for lane in 0..lanes {
            let j = base + lane;
            let ri = table
                .map
                .get(map_index(info, codes, j, distance, w1, near.window) as usize)
                .copied()
                .unwrap_or(JointDec::NONE) as usize;
            let x = &mut xs[lane];
            let slot = (*x & (PROB_TOTAL - 1)) as usize;
            let Some((sym, e)) = near.lookup(ri, slot) else {
                return Err(no_row());
            };
            // A slot's symbol has a frequency of at least one and a start at most the slot.
            *x = (e & 0xFFFF) * (*x >> PROB_BITS) + slot as u32 - (e >> 16);
            codes[j] = lut[sym as usize];
        }
        st.refill(xs)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{bucket_row, ordinal};
    use crate::entropy::freq::PROB_TOTAL;
    use crate::format::tables::Row;

    /// A bucketed row answers every slot as the symbol per slot does: the symbol whose
    /// range holds it, with that symbol's frequency and start. Rows of one symbol, of 247
    /// (the 32-bit floats' alphabet) with most of frequency one, with unseen symbols
    /// between, and symbols starting on and off bucket boundaries.
    #[test]
    fn buckets_find_every_slots_symbol() {
        let total = PROB_TOTAL;
        let mut rows = vec![vec![0, 0, total], vec![total]];
        let mut many = vec![1u32; 247];
        many[100] = total - 246;
        rows.push(many);
        let mut gaps = vec![0u32; 247];
        for (i, f) in [(3, 16), (4, 1), (9, 15), (10, 17), (200, 2000), (246, 2047)] {
            gaps[i] = f;
        }
        rows.push(gaps);
        let mut seed = 7u64;
        for _ in 0..20 {
            let mut freq = vec![0u32; 119];
            let mut left = total;
            while left > 0 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let j = (seed >> 33) as usize % freq.len();
                let f = ((seed >> 13) as u32 % 300).clamp(1, left);
                freq[j] += f;
                left -= f;
            }
            rows.push(freq);
        }
        for freq in rows {
            assert_eq!(freq.iter().sum::<u32>(), total);
            let row = Row::from_freqs(freq);
            let (mut buckets, mut ords) = (vec![0u32; 256], vec![0u32; 256 + 16]);
            bucket_row(&row, &mut buckets, &mut ords);
            for slot in 0..total {
                let j = (0..row.freq.len())
                    .find(|&j| row.start[j] <= slot && slot < row.start[j] + row.freq[j])
                    .unwrap();
                let e = ords[ordinal(buckets[slot as usize / 16], slot) as usize];
                assert_eq!(
                    (e >> 24, (e & 0xFFF) + 1, e >> 12 & 0xFFF),
                    (j as u32, row.freq[j], row.start[j]),
                    "slot {slot}"
                );
            }
        }
    }
}
