//! The Joint layout (`--fast`) on the CPU: one symbol per weight, (b, q1, q2, sign) together,
//! under the reference's exponent class and sign. Same per-element codes and raw tails as the
//! other layouts (`encode::codes`, `decode::finish`); only the lanes differ, and they are
//! simpler: one table lookup per weight, no neighbor, so every lane is independent.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::decode::{no_row, Stream};
use super::encode::{codes, Scratch};
use super::residuals::Residuals;
use super::tables::{put_lanes, EncStage, EncSym, IDENTITY, PACKED_IDENTITY};
use super::word::{rs, InfoFn, Word};
use super::Isa;
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::entropy::rans::RANS_L;
#[cfg(target_arch = "x86_64")]
use crate::format::chunk::CHUNK_ELEMS;
use crate::format::chunk::{chunk_ranges, EncodedChunk, LANES};
use crate::format::symbols::{joint_parts, joint_symbol, Sym};
use crate::format::tables::{Hist, Space, Stage, StageTable};
use crate::Result;

/// Joint symbol of every per-element code (`b | q1 << 7 | q2 << 8 | neg << 9`, b <= 32).
pub fn joint_of_code() -> &'static [u8; 1024] {
    static LUT: std::sync::OnceLock<[u8; 1024]> = std::sync::OnceLock::new();
    LUT.get_or_init(|| {
        let mut lut = [0u8; 1024];
        for (c, j) in lut.iter_mut().enumerate() {
            let b = (c & 127) as u8;
            if b > 32 {
                continue;
            }
            let s = Sym {
                b,
                q1: (c >> 7) as u8 & 1 & (b >= 2) as u8,
                q2: (c >> 8) as u8 & 1 & (b >= 3) as u8,
                neg: (c >> 9) as u8 & 1 & (b >= 1) as u8,
                tail: 0,
            };
            *j = joint_symbol(&s) as u8;
        }
        lut
    })
}

/// [`joint_of_code`] widened to dwords, for gathers.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn joint_of_code_wide() -> &'static [u32; 1024] {
    static LUT: std::sync::OnceLock<[u32; 1024]> = std::sync::OnceLock::new();
    LUT.get_or_init(|| joint_of_code().map(u32::from))
}

/// Per-element code of every joint symbol (the inverse of [`joint_of_code`]).
pub fn code_of_joint() -> &'static [u32; 256] {
    static LUT: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    LUT.get_or_init(|| {
        let mut lut = [0u32; 256];
        for (j, c) in lut.iter_mut().enumerate() {
            let (b, q1, q2, neg) = joint_parts(j);
            *c = b as u32 | (q1 as u32) << 7 | (q2 as u32) << 8 | (neg as u32) << 9;
        }
        lut
    })
}

/// `u = 8·b + 4·q1 + 2·q2 + neg` of joint symbol `j`: one number that gives b, the top bits
/// and the sign by shifts (it is `j + 17` from j = 7, b = 3, on). What the AVX2 lanes store
/// for 16-bit floats (below 2^8 there: b <= 16), so that their tail pass starts from it.
pub const fn u_of_joint(j: usize) -> u32 {
    let (b, q1, q2, neg) = joint_parts(j);
    8 * b as u32 + 4 * q1 as u32 + 2 * q2 as u32 + neg as u32
}

/// The per-element code (`b | q1 << 7 | q2 << 8 | neg << 9`, as [`code_of_joint`]) of `u`.
/// (Only the AVX2 lanes store `u`.)
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn code_of_u(u: u32) -> u32 {
    u >> 3 | (u >> 2 & 1) << 7 | (u >> 1 & 1) << 8 | (u & 1) << 9
}

/// The J context of an element's reference facts: `er·2 + rs`.
#[inline(always)]
pub fn context(info: u16) -> usize {
    (info & 255) as usize * 2 + rs(info)
}

/// Histogram of the J stage, counted per chunk by (context, code slot) as [`JointFlat`]
/// lays them out (no per-element table lookup), in four interleaved tables (a run of one
/// symbol does not wait on its own increments), then folded into J rows once per tensor.
#[inline(always)]
pub fn histogram<T: Word>(
    isa: Isa,
    res: &impl Residuals<T>,
    (lo, hi): (usize, usize),
    width: u32,
) -> Hist {
    // Wider floats never get here (`check_layout`); the indices below assume b <= 32.
    debug_assert!(T::BITS <= 32);
    let space = Space::new(Stage::J, width, false);
    let n_ctx = (hi - lo + 1) * 2;
    let size = n_ctx * FLAT_STRIDE;
    let lo2 = 2 * lo as u32;
    let count = |mut acc: Vec<u64>, r: std::ops::Range<usize>| {
        COUNT_SCRATCH.with(|s| {
            // Not re-entered: nothing below yields to the rayon pool.
            let (idx, sub) = &mut *s.borrow_mut();
            // Grown with zeros, and left zeroed by every count.
            if sub.len() < 4 * size {
                sub.resize(4 * size, 0);
            }
            let sub = &mut sub[..4 * size];
            // (The level's code inside the chunk's closure: `chunk` itself is not compiled
            // for it.)
            res.chunk(r, |d, info| {
                super::hist::simd(
                    isa,
                    #[inline(always)]
                    || count_chunk(d, info, lo2, size, &mut acc, idx, sub),
                )
            });
        });
        acc
    };
    let acc = chunk_ranges(res.elements())
        .into_par_iter()
        .fold(|| vec![0u64; size], count)
        .reduce_with(add_counts)
        .unwrap_or_else(|| vec![0u64; size]);
    fold_rows(&acc, lo2, space)
}

/// Two threads' counts by (context, code slot), summed.
fn add_counts(mut a: Vec<u64>, b: Vec<u64>) -> Vec<u64> {
    a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
    a
}

/// The J histogram of `acc`, counts by (context from `lo2`, code slot) as [`JointFlat`] lays
/// them out.
fn fold_rows(acc: &[u64], lo2: u32, space: Space) -> Hist {
    let a = space.alphabet();
    let n_ctx = acc.len() / FLAT_STRIDE;
    // Code slots -> J, for the contexts that occur (slots of codes the passes never make
    // count nothing). Small tensors see few of the contexts their exponent range spans:
    // rows for all of them were most of the per-tensor cost.
    let lut = joint_of_code();
    let ctxs: Vec<u32> = (0..n_ctx)
        .filter(|&c| {
            acc[c * FLAT_STRIDE..][..FLAT_STRIDE]
                .iter()
                .any(|&n| n != 0)
        })
        .map(|c| lo2 + c as u32)
        .collect();
    let mut rows = vec![0u64; ctxs.len() * a];
    for (row, &ctx) in rows.chunks_exact_mut(a).zip(&ctxs) {
        let slots = &acc[(ctx - lo2) as usize * FLAT_STRIDE..][..FLAT_STRIDE];
        for (k, &c) in slots.iter().enumerate() {
            if c != 0 {
                row[lut[(k >> 3) | (k & 7) << 7] as usize] += c;
            }
        }
    }
    // Ascending contexts, each with a count (some slot of it is not zero).
    Hist::from_sorted(space, ctxs, rows)
}

thread_local! {
    /// Per-thread scratch of [`count_chunk`]: slot indices, and its four counting tables
    /// (kept zeroed between counts). Reused across tensors: allocating and zeroing them per
    /// tensor (16 bytes a slot, about a megabyte for a bf16 tensor's exponent range) cost
    /// more than counting a small tensor.
    static COUNT_SCRATCH: std::cell::RefCell<(Vec<u32>, Vec<u32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Count one chunk into `acc` (see [`histogram`]); `idx` and `sub` are scratch, `sub` four
/// zeroed tables of `size` slots, left zeroed.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn count_chunk<T: Word>(
    d: &[T],
    info: &[u16],
    lo2: u32,
    size: usize,
    acc: &mut [u64],
    idx: &mut Vec<u32>,
    sub: &mut [u32],
) {
    // Every slot is written below: no clearing memset when the buffer is already as long.
    idx.truncate(d.len());
    idx.resize(d.len(), 0);
    for ((o, &d), &i) in idx.iter_mut().zip(d).zip(info) {
        *o = flat_index(d, i, lo2);
    }
    let (s01, s23) = sub.split_at_mut(2 * size);
    let (s0, s1) = s01.split_at_mut(size);
    let (s2, s3) = s23.split_at_mut(size);
    let mut q = idx.chunks_exact(4);
    for k in &mut q {
        s0[k[0] as usize] += 1;
        s1[k[1] as usize] += 1;
        s2[k[2] as usize] += 1;
        s3[k[3] as usize] += 1;
    }
    for &k in q.remainder() {
        s0[k as usize] += 1;
    }
    if idx.len() >= size {
        drain(sub, acc);
    } else {
        // Fewer elements than slots (small tensors): move only the slots they hit.
        for &k in idx.iter() {
            let k = k as usize;
            acc[k] += (s0[k] + s1[k] + s2[k] + s3[k]) as u64;
            (s0[k], s1[k], s2[k], s3[k]) = (0, 0, 0, 0);
        }
    }
}

/// An element's slot in the counting tables and [`JointFlat`]: `(context - lo2)·FLAT_STRIDE
/// + b·8 + q1 + 2·q2 + 4·neg` of its displacement `d` and facts `i` (widths <= 32).
#[inline(always)]
pub(super) fn flat_index<T: Word>(d: T, i: u16, lo2: u32) -> u32 {
    // `word::value` and `word::code` in 32 bits.
    let sd = ((d.get() as u32) << (32 - T::BITS)) as i32 >> (32 - T::BITS);
    let (v, neg) = (sd.unsigned_abs(), (sd < 0) as u32);
    let b = 32 - v.leading_zeros();
    let q1 = (v >> b.saturating_sub(2)) & 1 & (b >= 2) as u32;
    let q2 = (v >> b.saturating_sub(3)) & 1 & (b >= 3) as u32;
    let ctx = ((i & 255) as u32 * 2 + ((i >> 8) & 1) as u32).wrapping_sub(lo2);
    ctx * FLAT_STRIDE as u32 + b * 8 + q1 + q2 * 2 + neg * 4
}

/// Add the four counting tables `sub` (each `acc.len()` slots) into `acc`, and zero them.
#[inline(always)]
fn drain(sub: &mut [u32], acc: &mut [u64]) {
    let size = acc.len();
    drain_part(sub, size, 0, acc);
}

/// Add slots `from..from + acc.len()` of the four counting tables `sub` (`stride` slots
/// each) into `acc`, and zero them.
#[inline(always)]
fn drain_part(sub: &mut [u32], stride: usize, from: usize, acc: &mut [u64]) {
    let size = acc.len();
    let (s01, s23) = sub[..4 * stride].split_at_mut(2 * stride);
    let (s0, s1) = s01.split_at_mut(stride);
    let (s2, s3) = s23.split_at_mut(stride);
    let [s0, s1, s2, s3] = [s0, s1, s2, s3].map(|t| &mut t[from..from + size]);
    for (j, acc) in acc.iter_mut().enumerate() {
        *acc += (s0[j] + s1[j] + s2[j] + s3[j]) as u64;
    }
    for t in [s0, s1, s2, s3] {
        t.fill(0);
    }
}

/// [`histogram`] straight from the inputs, where the level has a kernel for it (AVX2, also
/// at the AVX-512 level; 16- and 32-bit floats, tensors of at least twice as many elements
/// as counting slots): each piece of a chunk has its displacements and facts computed and
/// its slots counted while it is in L1, and the exponent range is found on the way
/// (counted by absolute context, the chunk's classes drained); the pieces are hashed there
/// too, so the blob's CRC-32s of the reference and the target (returned with the histogram
/// and the exponent range) need no pass of their own. `None` where not taken (the caller
/// finds the range, then counts).
pub fn residual_histogram<T: Word>(
    isa: Isa,
    reference: &[u8],
    target: &[u8],
    info_fn: InfoFn,
    width: u32,
) -> Option<(Hist, [u32; 2], (usize, usize))> {
    #[cfg(target_arch = "x86_64")]
    {
        use super::avx2::crc::Running;
        use super::avx2::hist::{er_range_of, residual_count};
        use super::residuals::with_room;
        let n = reference.len() / T::SIZE;
        // The AVX-512 level takes the AVX2 kernel too (it implies AVX2: `Isa::available`).
        if isa < Isa::Avx2
            || !(T::BITS == 16 || T::BITS == 32)
            || info_fn.wide()
            // Whole elements only, so the CRC-32s cover the whole inputs.
            || reference.len() != n * T::SIZE
            || target.len() != n * T::SIZE
        {
            return None;
        }
        let params = info_fn.joint_params();
        let size_of = |(lo, hi): (usize, usize)| (hi - lo + 1) * CLASS_SLOTS;
        if n < 2 * size_of((0, 255)) {
            // Small enough that the counting tables could outweigh the elements: the
            // tensor's exponent range first, to decide.
            // SAFETY: `isa` (AVX2 or AVX-512, each implying the AVX2 features) is only ever a
            // level `Isa::available` confirmed on this CPU.
            let (lo, hi) = reference
                .par_chunks(CHUNK_ELEMS * T::SIZE)
                .map(|r| unsafe { er_range_of::<T>(r, params) })
                .reduce(|| (usize::MAX, 0), |a, b| (a.0.min(b.0), a.1.max(b.1)));
            if lo > hi || n < 2 * size_of((lo, hi)) {
                return None;
            }
        }
        type Acc = (ClassCounts, Vec<(usize, [crc32fast::Hasher; 2])>);
        let (acc, mut hashes) = reference
            .par_chunks(CHUNK_ELEMS * T::SIZE)
            .zip(target.par_chunks(CHUNK_ELEMS * T::SIZE))
            .enumerate()
            .fold(
                || -> Acc { (ClassCounts::default(), Vec::new()) },
                |(mut acc, mut hashes), (c, (r, x))| {
                    // Counted by absolute context (every class's rows, only those of
                    // the chunk's classes touched), its exponent classes found on the way
                    // and only their rows drained: no pass over the reference first.
                    let size = size_of((0, 255));
                    // SAFETY: SSE2.
                    let mut h = unsafe { [Running::new(), Running::new()] };
                    COUNT_SCRATCH.with(|s| {
                        // Not re-entered: nothing below yields to the rayon pool.
                        let (_, sub) = &mut *s.borrow_mut();
                        // Grown with zeros, and left zeroed by every count.
                        if sub.len() < 4 * size {
                            sub.resize(4 * size, 0);
                        }
                        let (mut lo, mut hi) = (u8::MAX, 0u8);
                        let b = FUSED_BLOCK;
                        // A piece's residuals are only counted: room for one piece.
                        with_room::<T, _>(b, |d, i| {
                            for (r, x) in r.chunks(b * T::SIZE).zip(x.chunks(b * T::SIZE)) {
                                let m = r.len() / T::SIZE;
                                // SAFETY: AVX2 as above; contexts are below 512, so every
                                // one of them is inside the tables from context 0.
                                // The inputs' CRC-32s too (folded from the loaded vectors).
                                let (l, h_) = unsafe {
                                    let sub = &mut sub[..4 * size];
                                    let (d, i) = (&mut d[..m], &mut i[..m]);
                                    residual_count::<T>(r, x, d, i, info_fn, 0, sub, &mut h)
                                };
                                (lo, hi) = (lo.min(l), hi.max(h_));
                            }
                        });
                        // Chunks are never empty: `lo <= hi`.
                        let (lo, hi) = (lo as usize, hi as usize);
                        drain_part(sub, size, lo * CLASS_SLOTS, acc.classes(lo, hi));
                    });
                    // SAFETY: SSE2.
                    hashes.push((c, h.map(|h| unsafe { h.finish() })));
                    (acc, hashes)
                },
            )
            .reduce_with(|(a, mut ha), (b, hb)| {
                ha.extend(hb);
                (a.merge(b), ha)
            })?;
        // The chunks' hashes combined in order, whatever order the threads finished in.
        hashes.sort_unstable_by_key(|&(c, _)| c);
        let mut crcs = [crc32fast::Hasher::new(), crc32fast::Hasher::new()];
        for (_, [r, x]) in &hashes {
            crcs[0].combine(r);
            crcs[1].combine(x);
        }
        let crcs = crcs.map(|h| h.finalize());
        let (lo, hi) = acc.range();
        Some((
            fold_rows(
                &acc.counts,
                2 * lo as u32,
                Space::new(Stage::J, width, false),
            ),
            crcs,
            (lo, hi),
        ))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, reference, target, info_fn, width);
        None
    }
}

/// Counting slots per exponent class: both reference signs' contexts.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const CLASS_SLOTS: usize = 2 * FLAT_STRIDE;

/// [`residual_histogram`]'s counts by (context, code slot) over the exponent classes from
/// `lo`, grown as chunks with other classes come.
#[derive(Default)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct ClassCounts {
    lo: usize,
    counts: Vec<u64>,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl ClassCounts {
    /// The lowest and highest class covered (meaningless while empty).
    fn range(&self) -> (usize, usize) {
        (
            self.lo,
            (self.lo + self.counts.len() / CLASS_SLOTS).wrapping_sub(1),
        )
    }

    /// The slots of classes `lo..=hi`, covering them first.
    fn classes(&mut self, lo: usize, hi: usize) -> &mut [u64] {
        let (old_lo, old_hi) = self.range();
        if self.counts.is_empty() {
            self.lo = lo;
            self.counts = vec![0; (hi - lo + 1) * CLASS_SLOTS];
        } else if lo < old_lo || hi > old_hi {
            let (new_lo, new_hi) = (lo.min(old_lo), hi.max(old_hi));
            let mut c = vec![0; (new_hi - new_lo + 1) * CLASS_SLOTS];
            c[(old_lo - new_lo) * CLASS_SLOTS..][..self.counts.len()].copy_from_slice(&self.counts);
            (self.lo, self.counts) = (new_lo, c);
        }
        &mut self.counts[(lo - self.lo) * CLASS_SLOTS..][..(hi - lo + 1) * CLASS_SLOTS]
    }

    /// Two threads' counts, summed.
    fn merge(mut self, other: ClassCounts) -> ClassCounts {
        if !other.counts.is_empty() {
            let (lo, hi) = other.range();
            self.classes(lo, hi)
                .iter_mut()
                .zip(&other.counts)
                .for_each(|(a, b)| *a += b);
        }
        self
    }
}

/// Elements per piece of [`residual_histogram`]: its inputs (16 or 32 KiB for 16-bit floats)
/// stay in L1 for their hashes.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const FUSED_BLOCK: usize = 4096;

/// The exponent classes `info` spans, `(0, 0)` when empty (the AVX2 kernels' tests).
#[cfg(all(test, target_arch = "x86_64"))]
pub fn er_range(info: &[u16]) -> (usize, usize) {
    // Chunk by chunk on the pool: one serial pass over a large tensor's facts was a few
    // percent of its encode, and serial work is what keeps a second thread from helping.
    merge_ranges(
        chunk_ranges(info.len())
            .into_par_iter()
            .map(|r| byte_range(&info[r])),
    )
}

/// The least and greatest exponent class over the parts' [`byte_range`]s, (0, 0) where
/// there are none.
pub(super) fn merge_ranges(parts: impl ParallelIterator<Item = (u8, u8)>) -> (usize, usize) {
    let (lo, hi) = parts.reduce(|| (u8::MAX, 0), |a, b| (a.0.min(b.0), a.1.max(b.1)));
    if lo > hi {
        (0, 0)
    } else {
        (lo as usize, hi as usize)
    }
}

/// Minimum and maximum of the low bytes of `info`, `(255, 0)` when empty.
#[inline(always)]
pub(super) fn byte_range(info: &[u16]) -> (u8, u8) {
    // As bytes (an exponent class is the low byte): unsigned byte minima and maxima
    // vectorize even at baseline x86-64.
    let (mut lo, mut hi) = (u8::MAX, 0u8);
    for &i in info {
        lo = lo.min(i as u8);
        hi = hi.max(i as u8);
    }
    (lo, hi)
}

/// Code one chunk: per-element codes and raw tails as in the other layouts, then one joint
/// symbol per element through the lanes (steps and lanes reversed, words reversed at the end:
/// the mirror of `format::chunk`'s decoding order).
#[inline(always)]
pub fn encode_chunk<T: Word>(
    d: &[T],
    info: &[u16],
    table: &EncStage,
    s: &mut Scratch,
) -> EncodedChunk {
    s.tail.clear();
    codes(d, true, &mut s.codes, Some(&mut s.tail));
    let lut = joint_of_code();
    let n = d.len();
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
            let (c, i) = (s.codes[base + lane], info[base + lane]);
            e[lane] = table.get(true, context(i), lut[c as usize] as usize);
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

/// Decoder tables: per row, a dense slot table, so a lane finds its symbol, frequency and
/// offset in one load (two for the vector decoders: context -> row, then the slot). (Small
/// tensors searching the rows' starts instead of filling slots gained nothing measurable.)
pub struct JointDec<'a> {
    /// Context -> row, [`JointDec::NONE`] where no row covers it.
    pub map: &'a [u32],
    /// The neighbor form's own slot tables (`joint_near`), where the table is of that form:
    /// then `map` is indexed by its window (`Window::index`), nothing else here is filled,
    /// and none of the `--fast` vector paths apply.
    pub near: Option<super::joint_near::NearSlots>,
    /// `J | (freq - 1) << 8 | (slot - start) << 20` per row and slot.
    pub slots: Vec<u32>,
    /// Whether every context the vector decoders compute (`er·2 + rs < 512`) indexes `map`,
    /// and every row in it `slots`: checked once here, so their gathers need no per-lane
    /// bounds checks.
    pub vector_ok: bool,
    /// The first of 64 contexts whose rows the vector decoders keep in registers: the 64
    /// up to the highest context with a row of its own (a tensor's exponent classes are
    /// few; the top ones hold most weights).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub window: u32,
    /// The slots of the 64 window contexts in context order (`(context - window)·PROB_TOTAL +
    /// slot`), [`JointDec::POISON`] in every slot of a context without a row; empty unless
    /// [`JointDec::with_window_slots`] built it. The AVX2 lanes then index it by context
    /// straight away: no row lookup (two permutes, a blend and shifts per vector). Its
    /// entries are `J | (slot - start) << 8 | (freq - 1) << 20` (`u` of J in place of J for
    /// 16-bit floats): the frequency by one shift, two vector operations fewer on the state
    /// chain than `slots`' order (see `avx2::joint::step_window`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub window_slots: Vec<u32>,
}

impl<'a> JointDec<'a> {
    pub const NONE: u32 = u32::MAX;

    /// The decode tables of `t`; the neighbor form's slots `bucketed` where asked
    /// (`joint_near::NearSlots`).
    pub fn new(t: &'a StageTable, bucketed: bool) -> Self {
        if t.space.neighbor {
            return JointDec {
                map: &t.map,
                near: Some(super::joint_near::NearSlots::new(t, bucketed)),
                slots: Vec::new(),
                vector_ok: false,
                window: 0,
                window_slots: Vec::new(),
            };
        }
        let n_rows = t.explicit.len() + t.backoff.len();
        // Written in slot order, without zeroing first (a row's symbols cover its slots in
        // order: starts are the running sums of the frequencies); rows on the pool, as
        // this was serial work of a few percent of a large tensor's decode.
        let total = PROB_TOTAL as usize;
        let mut slots: Vec<u32> = Vec::with_capacity(n_rows * total);
        slots.spare_capacity_mut()[..n_rows * total]
            .par_chunks_mut(total)
            .with_min_len(4)
            .enumerate()
            .for_each(|(ri, out)| {
                let row = t.row(ri as u32);
                let mut at = 0;
                for (j, &f) in row.freq.iter().enumerate() {
                    // A row's frequencies sum to at most its slots (`StageTable` checks
                    // them); `take` keeps a bad row inside its own slots regardless.
                    let entries = (0..f).map(|k| j as u32 | (f - 1) << 8 | k << 20);
                    for (o, e) in out[at..].iter_mut().zip(entries) {
                        o.write(e);
                    }
                    at = (at + f as usize).min(total);
                }
                // Exactly one row's slots whatever the frequencies.
                out[at..].iter_mut().for_each(|o| {
                    o.write(0);
                });
            });
        // SAFETY: every row's task wrote all `total` of its slots above.
        unsafe { slots.set_len(n_rows * total) };
        let vector_ok = t.map.len() >= 2 * 256
            && n_rows < (1 << 18)
            && t.map
                .iter()
                .all(|&r| r == Self::NONE || (r as usize) < n_rows);
        let window = match (t.explicit.first(), t.explicit.last()) {
            (Some(&(first, _)), Some(&(last, _))) => first.max(last.saturating_sub(63)),
            _ => 0,
        };
        JointDec {
            map: &t.map,
            near: None,
            slots,
            vector_ok,
            window,
            window_slots: Vec::new(),
        }
    }

    /// No entry of a row: every row's entries have a J below 2^8 - 1 (in both orders).
    pub const POISON: u32 = u32::MAX;

    /// Builds [`JointDec::window_slots`]: 64 × 16 KiB written, worth it for large tensors.
    /// With `u_codes` (16-bit floats), each entry's low byte is [`u_of_joint`] of its symbol
    /// instead of the symbol. `t` is the table [`JointDec::new`] was built from: the entries
    /// come from its rows' frequencies as `slots`' do (converting `slots` entry by entry was
    /// 2.1% of a bf16 `decode-loop`'s samples on a Zen 2), and a row's slots left over (none in a valid row) read
    /// as symbol 0, as in `slots`.
    pub fn with_window_slots(mut self, t: &StageTable, u_codes: bool) -> Self {
        let total = PROB_TOTAL as usize;
        let n_rows = self.slots.len() / total;
        let code = |j: usize| {
            if u_codes {
                u_of_joint(j)
            } else {
                j as u32
            }
        };
        // Each window written once, on the pool: filling the whole 1 MiB with the poison
        // first was a serial pass of its own.
        let mut ws: Vec<u32> = Vec::with_capacity(64 * total);
        ws.spare_capacity_mut()[..64 * total]
            .par_chunks_mut(total)
            .enumerate()
            .for_each(|(k, out)| {
                let fill = |out: &mut [MaybeUninit<u32>], v: u32| {
                    out.iter_mut().for_each(|o| {
                        o.write(v);
                    })
                };
                let r = match self.map.get(self.window as usize + k) {
                    Some(&r) if r != Self::NONE && (r as usize) < n_rows => r,
                    _ => return fill(out, Self::POISON),
                };
                let mut at = 0;
                for (j, &f) in t.row(r).freq.iter().enumerate() {
                    // As in `new`: `take` keeps a bad row inside its own slots.
                    let base = code(j) | f.saturating_sub(1) << 20;
                    for (o, k) in out[at..].iter_mut().zip(0..f) {
                        o.write(base | k << 8);
                    }
                    at = (at + f as usize).min(total);
                }
                fill(&mut out[at..], code(0));
            });
        // SAFETY: every window's `total` entries were written above, in one branch or the
        // other (a row's runs up to `at`, then the rest).
        unsafe { ws.set_len(64 * total) };
        self.window_slots = ws;
        self
    }
}

/// Decode the lanes of one chunk into per-element codes (`codes.len()` elements, `info` their
/// facts), or into joint symbols where `store_j`, from a step boundary: the steps a vector
/// decoder left, or all of them.
#[inline(always)]
pub fn decode_lanes(
    table: &JointDec,
    info: &[u16],
    codes: &mut [u32],
    states: &mut [u32; LANES],
    st: &mut Stream,
    store_j: bool,
) -> Result<()> {
    let lut = code_of_joint();
    let n = codes.len();
    for step in 0..n.div_ceil(LANES) {
        let base = step * LANES;
        let lanes = LANES.min(n - base);
        let xs = &mut states[..lanes];
        for lane in 0..lanes {
            let ri = table.map[context(info[base + lane])];
            if ri == JointDec::NONE {
                return Err(no_row());
            }
            let x = &mut xs[lane];
            let slot = *x & (PROB_TOTAL - 1);
            let e = table.slots[ri as usize * PROB_TOTAL as usize + slot as usize];
            *x = (((e >> 8) & 0xFFF) + 1) * (*x >> PROB_BITS) + (e >> 20);
            codes[base + lane] = if store_j {
                e & 255
            } else {
                lut[(e & 255) as usize]
            };
        }
        st.refill(xs)?;
    }
    Ok(())
}

/// Whether the x86 vector joint lanes (AVX2, AVX-512) store joint symbols rather than
/// per-element codes for `T`: for 16-bit floats, whose vector tail passes turn 16 or 32
/// symbols into codes in the instructions the lanes would spend on 8 or 16, off the lanes'
/// state chain (the lanes are bound by instruction count). AVX2 does the same for 32-bit
/// floats: there the tail pass reads b, the top bits and the sign off `J + 17` in fewer
/// instructions than it spent on the code, and the lanes skip `code_of`. For 16-bit floats
/// the AVX2 lanes store [`u_of_joint`] of J, which their tail pass reads as it is.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub const fn stores_j<T: Word>(isa: Isa) -> bool {
    match isa {
        Isa::Avx2 => T::BITS == 16 || T::BITS == 32,
        Isa::Avx512 => T::BITS == 16,
        _ => false,
    }
}

/// Per-element codes of joint symbols 0..16, for the vector decoders (above 6 the code
/// follows from `J + 17 = 8·b + 4·q1 + 2·q2 + neg` by shifts).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn small_codes() -> [u32; 16] {
    let lut = code_of_joint();
    std::array::from_fn(|j| lut[j])
}

/// Bit lengths' code slots per context in [`JointFlat`]: `b·8 + (code >> 7 & 7)`, b <= 32.
pub const FLAT_STRIDE: usize = 33 * 8;

/// The encoders' flat table: the packed symbol (`freq | start << 16`) of every per-element
/// code under every context of the tensor's exponent classes, so a lane needs one lookup
/// (no context -> row -> code -> J chain).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub struct JointFlat {
    /// The lowest exponent class covered; entries are at `((er - lo)·2 + rs)·FLAT_STRIDE +
    /// b·8 + (code >> 7 & 7)`.
    pub lo: u32,
    pub packed: Vec<u32>,
}

#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
impl JointFlat {
    /// The table for the exponent classes `lo..=hi` of a tensor's `n` elements; `None` where
    /// it would have more entries than twice the elements (small tensors: building it would
    /// cost more than the lookups it saves).
    pub fn new(t: &EncStage, n: usize, (lo, hi): (usize, usize)) -> Option<JointFlat> {
        let size = (hi - lo + 1) * 2 * FLAT_STRIDE;
        if size > 2 * n {
            return None;
        }
        let lut = joint_of_code();
        // Codes the passes never make (q bits above b) are never looked up.
        let j_of: [usize; FLAT_STRIDE] =
            std::array::from_fn(|k| lut[(k >> 3) | (k & 7) << 7] as usize);
        let a = t.alphabet;
        let mut packed = Vec::with_capacity(size);
        for ctx in lo * 2..hi * 2 + 2 {
            let row = match t.map.get(ctx) {
                Some(&r) if r != u32::MAX => t.packed.get(r as usize * a..(r as usize + 1) * a),
                _ => None,
            };
            match row {
                Some(row) => packed.extend(
                    j_of.iter()
                        .map(|&j| row.get(j).copied().unwrap_or(PACKED_IDENTITY)),
                ),
                None => packed.extend([PACKED_IDENTITY; FLAT_STRIDE]),
            }
        }
        Some(JointFlat {
            lo: lo as u32,
            packed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::tables::Row;

    /// `with_window_slots`, built from the rows' frequencies, holds what converting `slots`
    /// entry by entry gives (`J | (freq - 1) << 8 | (slot - start) << 20` becomes `c(J) |
    /// (slot - start) << 8 | (freq - 1) << 20`), POISON where a window context has no row:
    /// both forms of the low byte, on a table with rows of many shapes and gaps, one of them
    /// short of its slots.
    #[test]
    fn window_slots_are_slots_reordered() {
        let space = Space::new(Stage::J, 16, false);
        let a = space.alphabet();
        let mut lcg = super::super::test_lcg(0x9E37_79B9_7F4A_7C15);
        let mut next = || lcg() >> 33;
        let mut counts = vec![0u64; space.n_primary() * a];
        for ctx in (200..300).filter(|c| c % 3 != 0) {
            for s in 0..a {
                if next() % 4 == 0 {
                    counts[ctx * a + s] = next() % 5000 + 1;
                }
            }
        }
        let mut t = StageTable::select(&Hist::from_dense(space, &counts), true);
        // A row whose frequencies fall short of the slots (a bad blob's, which
        // `StageTable::read` lets through): its last slots read as symbol 0 in both forms.
        let last = t.explicit.len() - 1;
        let row = &mut t.explicit[last].1;
        let f = row
            .freq
            .iter_mut()
            .rfind(|f| **f > 100)
            .expect("a frequency above 100");
        *f -= 100;
        *row = Row::from_freqs(row.freq.clone());
        for u_codes in [false, true] {
            let d = JointDec::new(&t, false).with_window_slots(&t, u_codes);
            let total = PROB_TOTAL as usize;
            let mut want = vec![JointDec::POISON; 64 * total];
            for (k, out) in want.chunks_exact_mut(total).enumerate() {
                match d.map.get(d.window as usize + k) {
                    Some(&r) if r != JointDec::NONE => {
                        for (o, &e) in out.iter_mut().zip(&d.slots[r as usize * total..]) {
                            let j = e & 255;
                            let c = if u_codes { u_of_joint(j as usize) } else { j };
                            *o = c | (e >> 20) << 8 | (e >> 8 & 0xFFF) << 20;
                        }
                    }
                    _ => {}
                }
            }
            assert!(
                want.iter().any(|&e| e != JointDec::POISON),
                "rows in the window"
            );
            assert!(want.contains(&JointDec::POISON), "contexts without a row");
            assert_eq!(d.window_slots, want, "u_codes {u_codes}");
        }
    }
}
