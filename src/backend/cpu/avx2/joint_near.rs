//! AVX2 lanes of the Joint layout's neighbor form (`super::super::joint_near`): four 8-lane
//! state vectors per step, as the `--fast` lanes (`joint`), with each lane's context made
//! from its facts and the code of the element `d` back (an earlier step's, stored).

#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;

use super::super::decode::{no_row, Stream};
use super::super::encode::Scratch;
use super::super::joint::joint_of_code_wide;
use super::super::joint::JointDec;
use super::super::joint_near::NearSlots;
use super::super::joint_near::{packed_index, packed_indices};
use super::super::tables::EncStage;
use super::super::word::Word;
use super::decode::{overrun, refill, u_of_joint8, AfterStep};
use super::encode::{codes_and_tails, SLACK};
use super::gather::{gather8_as, gather8_by};
use super::joint::lanes;
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::format::chunk::EncodedChunk;
use crate::format::chunk::LANES;
use crate::format::tables::Window;
use crate::Result;

/// The map indices of 8 elements over a window (`Window::index`), as the portable
/// `joint_near::index_of(near_of(..))` forms them: what the decode lanes and the encoder's
/// entries share (the AVX-512 level's `MapIndex` on 16).
struct MapIndex {
    lo: __m256i,
    m2_mul: __m256i,
    span: __m256i,
}

impl MapIndex {
    #[inline(always)]
    unsafe fn new(window: Window, w1: usize) -> Self {
        MapIndex {
            lo: _mm256_set1_epi32(window.lo as i32),
            m2_mul: _mm256_set1_epi32(w1 as i32 + 1),
            span: _mm256_set1_epi32(2 * window.n as i32),
        }
    }

    /// `(k, index)` from the facts' parts (exponent class, reference sign, the two mantissa
    /// bits below the class) and the bit length `nb` and sign `neg` of the elements `d`
    /// back: each element's exponent class less the window's first (wrapped below it: above
    /// `n - 1` unsigned where outside, for the callers to refuse), and its map index.
    #[inline(always)]
    unsafe fn of_parts(
        &self,
        (er, rs, m2): (__m256i, __m256i, __m256i),
        (nb, neg): (__m256i, __m256i),
    ) -> (__m256i, __m256i) {
        // Sign state: 0 for b = 0, else 1 + neg (neg is 0 where b = 0).
        let up = _mm256_add_epi32(_mm256_min_epu32(nb, _mm256_set1_epi32(1)), neg);
        let near = _mm256_add_epi32(_mm256_mullo_epi32(m2, self.m2_mul), nb);
        let near = _mm256_add_epi32(_mm256_add_epi32(near, _mm256_add_epi32(near, near)), up);
        let k = _mm256_sub_epi32(er, self.lo);
        let index = _mm256_add_epi32(
            _mm256_mullo_epi32(near, self.span),
            _mm256_add_epi32(_mm256_add_epi32(k, k), rs),
        );
        (k, index)
    }
}

/// Decode whole steps from `from` (whose first element has its neighbor: `from·LANES >=
/// d`); returns the step it stopped at, for the portable lanes to finish. Each element's
/// facts come straight from the reference (`(mant, emask)`: `InfoFn::joint_params`), not
/// from a facts array written by a pass before. Where `guarded`, the words are read in place
/// and it stops while less than a step's worth is left; otherwise `st` must be padded with
/// `LANES` words past its length and it runs while whole steps remain. The three lookups
/// per element by `vpgatherdd` where `GATHER`, else by scalar loads (`super::gather`;
/// `super::super::avx2_gathers` chooses). Before each step, `after` gets the codes stored so
/// far (the tail pass, fused: its work fills the gaps while the lanes wait on lookups).
///
/// # Safety
/// AVX2, BMI1, BMI2, LZCNT, POPCNT and PCLMULQDQ (`Isa::Avx2` available); `T` of 16 or 32
/// bits.
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn decode_steps<T: Word, const GATHER: bool, const BUCKETS: bool, A: AfterStep>(
    after: &mut A,
    table: &JointDec,
    near: &NearSlots,
    reference: &[u8],
    (mant, emask): (u32, u32),
    codes: &mut [u32],
    states: &mut [u32; LANES],
    st: &mut Stream,
    guarded: bool,
    (d, w1): (usize, usize),
    from: usize,
) -> Result<usize> {
    debug_assert!(matches!(T::BITS, 16 | 32));
    let n = codes.len().min(reference.len() / T::SIZE);
    let window = near.window;
    // Every index below stays in its table (`NearSlots::lane_shapes`; rows are checked
    // against `JointDec::NONE` per step, slots are below `PROB_TOTAL`).
    // (And in the form this build of the loop reads.)
    let Some((_, span)) = near
        .lane_shapes(table, w1, d)
        .filter(|_| near.bucketed() == BUCKETS)
    else {
        return Ok(from);
    };
    assert!(st.words.len() >= st.len + if guarded { 0 } else { LANES } && st.pos <= st.len);
    let words = st.words.as_ptr();
    let mut pos = st.pos;
    let mut x = [_mm256_setzero_si256(); 4];
    for (v, xv) in x.iter_mut().enumerate() {
        *xv = _mm256_loadu_si256(states.as_ptr().add(8 * v).cast());
    }
    let (map, syms, fs) = (table.map.as_ptr(), near.syms.as_ptr(), near.fs.as_ptr());
    let (buckets, ords) = (near.buckets.as_ptr(), near.ords.as_ptr());
    let popcount4 = _mm256_setr_epi8(
        0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4, //
        0, 1, 1, 2, 1, 2, 2, 3, 1, 2, 2, 3, 2, 3, 3, 4,
    );
    let (rp, cp) = (reference.as_ptr(), codes.as_mut_ptr());
    let (mant, mant2, emask) = (
        _mm_cvtsi32_si128(mant as i32),
        _mm_cvtsi32_si128(mant as i32 - 2),
        _mm256_set1_epi32(emask as i32),
    );
    debug_assert_eq!(span, 2 * window.n as usize);
    let index = MapIndex::new(window, w1);
    let last_class = _mm256_set1_epi32(window.n as i32 - 1);
    let none = _mm256_set1_epi32(JointDec::NONE as i32);
    // Each step's rows (and whether any is refused), from the facts and earlier steps'
    // codes, not from the states. With gathers they are formed a step ahead, at the end of
    // the step before, so they issue before the next step's tail-pass work (bf16 decode
    // 1.01-1.05 on an Intel Xeon); with scalar loads that order was slower (0.93-1.00).
    let rows_at = |base: usize| -> ([__m256i; 4], __m256i) {
        let mut rows = [_mm256_setzero_si256(); 4];
        let mut bad = _mm256_setzero_si256();
        for (v, row) in rows.iter_mut().enumerate() {
            let j = base + 8 * v;
            // The element's facts (`InfoFn::info`): exponent class, sign, the two mantissa
            // bits below the class.
            let r = if T::BITS == 16 {
                _mm256_cvtepu16_epi32(_mm_loadu_si128(rp.add(2 * j).cast()))
            } else {
                _mm256_loadu_si256(rp.add(4 * j).cast())
            };
            let rs = if T::BITS == 16 {
                _mm256_srli_epi32::<15>(r)
            } else {
                _mm256_srli_epi32::<31>(r)
            };
            // What the lanes stored d back (`u`, or J for 32-bit floats), as `u = 8·b + 4·q1
            // + 2·q2 + neg`.
            let c = _mm256_loadu_si256(cp.add(j - d).cast());
            let u = if T::BITS == 16 { c } else { u_of_joint8(c) };
            let nb_neg = (
                _mm256_srli_epi32::<3>(u),
                _mm256_and_si256(u, _mm256_set1_epi32(1)),
            );
            let m2 = _mm256_and_si256(_mm256_srl_epi32(r, mant2), _mm256_set1_epi32(3));
            let er = _mm256_and_si256(_mm256_srl_epi32(r, mant), emask);
            let (k, idx) = index.of_parts((er, rs, m2), nb_neg);
            // Outside the window (k above the last class, unsigned): no row covers it.
            let outside = _mm256_xor_si256(
                _mm256_cmpeq_epi32(_mm256_max_epu32(k, last_class), last_class),
                _mm256_set1_epi32(-1),
            );
            // An outside lane reads entry 0 instead (its row is refused below).
            let idx = _mm256_andnot_si256(outside, idx);
            let r = gather8_as::<GATHER>(map, idx);
            bad = _mm256_or_si256(bad, _mm256_or_si256(outside, _mm256_cmpeq_epi32(r, none)));
            *row = r;
        }
        (rows, bad)
    };
    let mut step = from;
    let mut ahead = if GATHER && (step + 1) * LANES <= n {
        rows_at(step * LANES)
    } else {
        ([_mm256_setzero_si256(); 4], _mm256_setzero_si256())
    };
    while (step + 1) * LANES <= n {
        if guarded && st.len - pos < LANES {
            break;
        }
        let base = step * LANES;
        debug_assert!(base >= d);
        after.after(cp, base);
        let (rows, bad) = if GATHER { ahead } else { rows_at(base) };
        if _mm256_testz_si256(bad, bad) == 0 {
            return Err(no_row());
        }
        // Every vector's lookups before any state update (as the `--fast` lanes,
        // `super::joint::decode`): the loads of a step sit together in program order, not
        // each vector's behind the previous vector's refill. On a Zen 3, passes alternated
        // in one process: bf16 decode 1.21× by scalar loads, 1.19× by gathers; fp32 1.00×
        // and 1.18× (docs/BENCHMARKS.md).
        let mut slot = [_mm256_setzero_si256(); 4];
        let mut j = [_mm256_setzero_si256(); 4];
        let mut e = [_mm256_setzero_si256(); 4];
        if BUCKETS {
            // The slot's bucket, then its ordinal's entry (`NearSlots::bucketed`).
            for v in 0..4 {
                slot[v] = _mm256_and_si256(x[v], _mm256_set1_epi32(PROB_TOTAL as i32 - 1));
                e[v] = gather8_as::<GATHER>(
                    buckets,
                    _mm256_or_si256(
                        _mm256_slli_epi32::<8>(rows[v]),
                        _mm256_srli_epi32::<4>(slot[v]),
                    ),
                );
            }
            for v in 0..4 {
                let ord = ordinal8(e[v], slot[v], popcount4);
                e[v] = gather8_as::<GATHER>(
                    ords,
                    _mm256_add_epi32(_mm256_slli_epi32::<8>(rows[v]), ord),
                );
            }
            for v in 0..4 {
                // `(freq - 1) | start << 12 | J << 24`.
                let hi = _mm256_srli_epi32::<{ PROB_BITS as i32 }>(x[v]);
                let f1 = _mm256_and_si256(e[v], _mm256_set1_epi32(0xFFF));
                let start =
                    _mm256_and_si256(_mm256_srli_epi32::<12>(e[v]), _mm256_set1_epi32(0xFFF));
                let xs = _mm256_add_epi32(
                    _mm256_add_epi32(_mm256_mullo_epi32(f1, hi), hi),
                    _mm256_sub_epi32(slot[v], start),
                );
                x[v] = refill(xs, words, &mut pos);
                let j = _mm256_srli_epi32::<24>(e[v]);
                _mm256_storeu_si256(cp.add(base + 8 * v).cast(), stored::<T>(j));
            }
        } else {
            for v in 0..4 {
                slot[v] = _mm256_and_si256(x[v], _mm256_set1_epi32(PROB_TOTAL as i32 - 1));
                // The slot's symbol (a 4-byte load of its byte: `syms` is padded).
                j[v] = gather8_bytes::<GATHER>(
                    syms,
                    _mm256_or_si256(_mm256_slli_epi32::<12>(rows[v]), slot[v]),
                );
            }
            for v in 0..4 {
                // Its frequency and start from the row's array.
                e[v] = gather8_as::<GATHER>(
                    fs,
                    _mm256_or_si256(_mm256_slli_epi32::<8>(rows[v]), j[v]),
                );
            }
            for v in 0..4 {
                let hi = _mm256_srli_epi32::<{ PROB_BITS as i32 }>(x[v]);
                let xs = _mm256_add_epi32(
                    _mm256_mullo_epi32(_mm256_and_si256(e[v], _mm256_set1_epi32(0xFFFF)), hi),
                    _mm256_sub_epi32(slot[v], _mm256_srli_epi32::<16>(e[v])),
                );
                x[v] = refill(xs, words, &mut pos);
                _mm256_storeu_si256(cp.add(base + 8 * v).cast(), stored::<T>(j[v]));
            }
        }
        if pos > st.len {
            return Err(overrun());
        }
        step += 1;
        if GATHER && (step + 1) * LANES <= n {
            ahead = rows_at(step * LANES);
        }
    }
    for (v, xv) in x.iter().enumerate() {
        _mm256_storeu_si256(states.as_mut_ptr().add(8 * v).cast(), *xv);
    }
    st.pos = pos;
    Ok(step)
}

/// What the lanes store for joint symbols `j`: what the `--fast` AVX2 lanes store
/// (`joint::stores_j`), [`u_of_joint8`] for 16-bit floats and J itself for 32-bit ones, so
/// the fused tail passes read them as they read those, and the next rows' contexts take the
/// bit length and sign from `u` by a shift and a mask: no per-element code.
///
/// # Safety
/// AVX2 (inlined into code built for it).
#[inline(always)]
unsafe fn stored<T: Word>(j: __m256i) -> __m256i {
    if T::BITS == 16 {
        u_of_joint8(j)
    } else {
        j
    }
}

/// The ordinals of 8 slots from their buckets `b` (`NearSlots::bucketed`, the portable
/// `joint_near::ordinal`): the base plus the mask's bits up to the slot's place, counted by
/// nibble lookups (AVX2 has no vector popcount). Below `256 + 16` whatever `b` holds.
///
/// # Safety
/// AVX2 (inlined into code built for it).
#[inline(always)]
unsafe fn ordinal8(b: __m256i, slot: __m256i, popcount4: __m256i) -> __m256i {
    let within = _mm256_and_si256(slot, _mm256_set1_epi32(15));
    // Bits 16 ..= 16 + within.
    let upto = _mm256_sub_epi32(
        _mm256_sllv_epi32(_mm256_set1_epi32(2 << 16), within),
        _mm256_set1_epi32(1 << 16),
    );
    let m = _mm256_and_si256(b, upto);
    let lo = _mm256_and_si256(m, _mm256_set1_epi8(15));
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(m), _mm256_set1_epi8(15));
    let c = _mm256_add_epi8(
        _mm256_shuffle_epi8(popcount4, lo),
        _mm256_shuffle_epi8(popcount4, hi),
    );
    // Bytes 2 and 3 (the mask's) summed into byte 2, then alone.
    let c = _mm256_add_epi8(c, _mm256_srli_epi32::<8>(c));
    let count = _mm256_srli_epi32::<24>(_mm256_slli_epi32::<8>(c));
    _mm256_add_epi32(_mm256_and_si256(b, _mm256_set1_epi32(255)), count)
}

/// The bytes at 8 indices of `table`, as dwords (a 4-byte load each, its low byte kept:
/// one insert with the load folded in, as [`gather8`]; or one `vpgatherdd` where `GATHER`).
///
/// # Safety
/// AVX2; every index `i` of `idx` with `i + 4` bytes readable at `table`.
#[inline(always)]
unsafe fn gather8_bytes<const GATHER: bool>(table: *const u8, idx: __m256i) -> __m256i {
    let v = if GATHER {
        _mm256_i32gather_epi32::<1>(table.cast(), idx)
    } else {
        gather8_by(idx, |i| {
            (table.add(i) as *const u32).read_unaligned() as i32
        })
    };
    _mm256_and_si256(v, _mm256_set1_epi32(255))
}

/// Code one chunk of the neighbor form: codes and tails by the AVX2 pass, each element's
/// entry in `table.packed` (its row's, from its context, and its symbol), then the `--fast`
/// AVX2 lanes over those entries. Where `GATHER` (`super::super::avx2_gathers`), the
/// entries by one vector pass of gathers ([`entries_by_gathers`]) and the lanes' lookups by
/// gathers; otherwise by the two passes of [`packed_indices`] and scalar loads, which suit
/// CPUs with slow gathers.
///
/// # Safety
/// AVX2, BMI1, BMI2, LZCNT, POPCNT (`Isa::Avx2` available).
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
pub unsafe fn encode_chunk<T: Word, const GATHER: bool>(
    d: &[T],
    info: &[u16],
    table: &EncStage,
    distance: usize,
    w1: usize,
    s: &mut Scratch,
) -> EncodedChunk {
    // SAFETY (all): the caller guarantees the features.
    unsafe { codes_and_tails(d, true, s) };
    if GATHER && !table.map.is_empty() {
        unsafe { entries_by_gathers(info, table, distance, w1, &s.codes, &mut s.idx) };
        let (states, at) = unsafe { lanes(&s.idx, &table.packed, true, &mut s.words) };
        return s.chunk(at..SLACK + s.idx.len(), states);
    }
    packed_indices(info, table, distance, w1, &mut s.codes, &mut s.idx);
    let (states, at) = unsafe { lanes(&s.codes, &table.packed, false, &mut s.words) };
    s.chunk(at..SLACK + s.codes.len(), states)
}

/// Each element's entry in `table.packed` into `out`, as [`packed_indices`] gives them
/// (`u32::MAX` where no row covers it), from the per-element `codes`: 8 elements at a time,
/// their map index formed in the vector, their row and symbol by gathers; the elements
/// without their neighbor and the last few by the portable [`packed_index`].
///
/// # Safety
/// AVX2 (inlined into code built for it); `table.map` not empty.
#[inline(always)]
unsafe fn entries_by_gathers(
    info: &[u16],
    table: &EncStage,
    distance: usize,
    w1: usize,
    codes: &[u32],
    out: &mut Vec<u32>,
) {
    let n = codes.len().min(info.len());
    out.clear();
    out.reserve(n);
    let head = distance.min(n);
    out.extend((0..head).map(|j| packed_index(info, table, distance, w1, codes, j)));
    let lut = joint_of_code_wide();
    let window = table.window;
    let index = MapIndex::new(window, w1);
    let last_class = _mm256_set1_epi32(window.n as i32 - 1);
    let alphabet = _mm256_set1_epi32(table.alphabet as i32);
    let last_index = _mm256_set1_epi32(table.map.len().min(i32::MAX as usize) as i32 - 1);
    let (ip, cp, op) = (info.as_ptr(), codes.as_ptr(), out.as_mut_ptr());
    let mut j = head;
    while j + 8 <= n {
        // SAFETY: elements `j..j + 8` below `n` and their neighbors (`j >= distance`) are
        // read, `out` has room for `n`; the gathers' indices are `& 1023` into the 1024 of
        // `lut`, and clamped into `map` (lanes outside it refused).
        unsafe {
            let i = _mm256_cvtepu16_epi32(_mm_loadu_si128(ip.add(j).cast()));
            let c = _mm256_loadu_si256(cp.add(j - distance).cast());
            let own = _mm256_loadu_si256(cp.add(j).cast());
            // The facts' parts as `InfoFn::info` packs them.
            let er = _mm256_and_si256(i, _mm256_set1_epi32(255));
            let rs = _mm256_and_si256(_mm256_srli_epi32::<8>(i), _mm256_set1_epi32(1));
            let m2 = _mm256_and_si256(_mm256_srli_epi32::<9>(i), _mm256_set1_epi32(3));
            let nb_neg = (
                _mm256_and_si256(c, _mm256_set1_epi32(127)),
                _mm256_and_si256(_mm256_srli_epi32::<9>(c), _mm256_set1_epi32(1)),
            );
            let (k, idx) = index.of_parts((er, rs, m2), nb_neg);
            // Inside the window and the map (unsigned compares).
            let inside = _mm256_and_si256(
                _mm256_cmpeq_epi32(_mm256_min_epu32(k, last_class), k),
                _mm256_cmpeq_epi32(_mm256_min_epu32(idx, last_index), idx),
            );
            let row = _mm256_mask_i32gather_epi32::<4>(
                _mm256_set1_epi32(-1),
                table.map.as_ptr().cast(),
                _mm256_min_epu32(idx, last_index),
                inside,
            );
            let sym = _mm256_i32gather_epi32::<4>(
                lut.as_ptr().cast(),
                _mm256_and_si256(own, _mm256_set1_epi32(1023)),
            );
            // No row (outside, or the map's none): `u32::MAX`, as `packed_index`.
            let none = _mm256_cmpeq_epi32(row, _mm256_set1_epi32(-1));
            let entry = _mm256_add_epi32(_mm256_mullo_epi32(row, alphabet), sym);
            _mm256_storeu_si256(op.add(j).cast(), _mm256_or_si256(entry, none));
        }
        j += 8;
    }
    // SAFETY: the loops above wrote `0..j`.
    unsafe { out.set_len(j) };
    out.extend((j..n).map(|j| packed_index(info, table, distance, w1, codes, j)));
}
