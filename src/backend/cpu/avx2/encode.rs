//! AVX2 rANS lane encoding (see the module above).
//!
//! The chunk's 32 lanes are four vectors of 8 `u32` states; otherwise the structure is
//! `super::super::avx512::encode`'s, function for function, with the same flat per-tensor
//! tables ([`Flat`]). Per step and stage (in the encoder's reversed order) the contexts of
//! all lanes are computed at once from the packed codes, each lane's symbol is gathered, and
//! the flushed words are written from the output's end backwards: vector 3's words land above
//! vector 2's, and so on, and every later (stage, step) below the earlier ones, so the buffer
//! read forwards is exactly the reference's reversed word stream, with no reversal pass.
//!
//! What AVX2 lacks, and what stands in for it:
//! - mask registers: compare results (all-ones lanes), `movemask` where a bit mask is needed;
//! - the compressing store: the flushed lanes' words are narrowed to 16 bits, moved to the
//!   top of an 8-word block by one byte shuffle from a 256-entry table indexed by the flush
//!   mask, and the whole block is stored so that it *ends* at the cursor's old position; the
//!   (at most 7) words it writes below the new cursor are scratch that later stores overwrite
//!   or that stays outside the stream ([`SLACK`] words below it keep them in the buffer);
//! - `vplzcntd`: the bit length of a 16-bit value from the exponent of its (exact) float;
//! - unsigned compares: every value compared is below 2^31, so signed compares are exact;
//! - `vcvtudq2ps`: the signed conversion, plus 2^32 where the sign bit was set;
//! - `vrcp14ps` and FMA: `vrcpps` (12 bits) and a Newton step with separate multiply and
//!   subtract (FMA is not among the features `Isa::Avx2` checks).
//!
//! The division `x / freq` runs in single precision and is then made exact, as in AVX-512:
//! with `q < 2^20` a float quotient off by less than one is corrected with the integer
//! remainder `x - q·freq`, which lies in `[-freq, 2·freq)` (bound in [`put4`]).

#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;
use std::any::TypeId;

use super::super::avx512::encode::Flat;
use super::super::encode::{codes, Scratch};
use super::super::joint::{flat_index, FLAT_STRIDE};
use super::super::tables::{EncStage, PACKED_IDENTITY};
use super::super::word::{self, Word};
use super::gather::{gather4_u64, gather8_or};
use super::hist::{contexts16, exp_q, slot_ctx, slot_of};
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::entropy::rans::RANS_L;
use crate::format::bits::BitWriter;
use crate::format::chunk::{EncodedChunk, LANES};

/// Words kept below the stream in the word buffer: [`put4`] stores 8-word blocks that end at
/// the cursor, so up to 7 words under the lowest stream word are written too.
pub(in crate::backend::cpu) const SLACK: usize = 8;

/// A chunk's per-element codes into `s.codes` and raw tails into `s.tail` (every layout's
/// first encoding step): 16-bit elements by the vector pass, others by the portable one.
///
/// # Safety
/// The CPU must support the features this level is compiled for.
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
pub unsafe fn codes_and_tails<T: Word>(d: &[T], signed: bool, s: &mut Scratch) {
    s.tail.clear();
    if TypeId::of::<T>() == TypeId::of::<u16>() {
        // SAFETY: `T` is `u16`: same layout. Features: the caller's.
        unsafe {
            let d = std::slice::from_raw_parts(d.as_ptr() as *const u16, d.len());
            codes16(d, signed, &mut s.codes, &mut s.tail);
        }
    } else if TypeId::of::<T>() == TypeId::of::<u32>() {
        // SAFETY: `T` is `u32`: same layout. Features: the caller's.
        unsafe {
            let d = std::slice::from_raw_parts(d.as_ptr() as *const u32, d.len());
            codes32(d, signed, &mut s.codes, &mut s.tail);
        }
    } else {
        codes(d, signed, &mut s.codes, Some(&mut s.tail));
    }
}

/// One chunk, as `super::super::encode::chunk` codes it, with explicit AVX2 lanes.
///
/// # Safety
/// The CPU must support AVX2, BMI1, BMI2, LZCNT, POPCNT (`Isa::Avx2` available).
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn chunk<T: Word>(
    d: &[T],
    info: &[u16],
    signed: bool,
    w1: usize,
    stages: &[EncStage],
    flat: &Flat,
    distance: Option<usize>,
    s: &mut Scratch,
) -> EncodedChunk {
    // SAFETY: the caller guarantees the features.
    unsafe { codes_and_tails(d, signed, s) };
    // SAFETY: the caller guarantees the features.
    let (states, at) = unsafe { lanes(&s.codes, info, w1, stages, flat, distance, &mut s.words) };
    s.chunk(at..SLACK + s.codes.len() * stages.len(), states)
}

/// All-ones in lanes `0..cnt`, zero above.
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::backend::cpu) fn first(cnt: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(cnt as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// `s[at..at + cnt]` (`cnt <= 8`), zeros above. Partial vectors occur only at a tensor's
/// end, so they take a copy rather than masked loads (AVX2 has none for 16-bit elements).
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::backend::cpu) fn load_u16(s: &[u16], at: usize, cnt: usize) -> __m128i {
    let mut tmp = [0u16; 8];
    let src = if cnt == 8 {
        &s[at..at + 8]
    } else {
        tmp[..cnt].copy_from_slice(&s[at..at + cnt]);
        &tmp[..]
    };
    // SAFETY: `src` holds 8 `u16`.
    unsafe { _mm_loadu_si128(src.as_ptr() as *const _) }
}

/// `s[at..at + cnt]` (`cnt <= 8`), zeros above.
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::backend::cpu) fn load_u32(s: &[u32], at: usize, cnt: usize) -> __m256i {
    let mut tmp = [0u32; 8];
    let src = if cnt == 8 {
        &s[at..at + 8]
    } else {
        tmp[..cnt].copy_from_slice(&s[at..at + cnt]);
        &tmp[..]
    };
    // SAFETY: `src` holds 8 `u32`.
    unsafe { _mm256_loadu_si256(src.as_ptr() as *const _) }
}

/// The first `s.len()` (at most 8) lanes of `v` into `s`. Not a masked store, which is
/// microcoded and slow on AMD CPUs (measured: a third of `codes16`'s time on Zen 4).
#[inline]
#[target_feature(enable = "avx2")]
fn store_u32(s: &mut [u32], v: __m256i) {
    if s.len() == 8 {
        // SAFETY: `s` has room for 8 `u32`.
        unsafe { _mm256_storeu_si256(s.as_mut_ptr() as *mut _, v) };
    } else {
        let mut tmp = [0u32; 8];
        // SAFETY: 8 `u32` into `tmp`.
        unsafe { _mm256_storeu_si256(tmp.as_mut_ptr() as *mut _, v) };
        s.copy_from_slice(&tmp[..s.len()]);
    }
}

/// `super::super::encode::codes` with the tail for 16-bit elements, 16 at a time: b, Q1 and
/// Q2 of each magnitude from its float conversion (`4·e + 2·q1 + q2` in the float's top
/// bits, as in `super::hist`), the raw tails merged in the vector four by four (at most 52
/// bits) so the bit writer takes one value per four elements; the last partial step as the
/// portable pass does it.
///
/// # Safety
/// The CPU must support AVX2 and POPCNT.
#[target_feature(enable = "avx2,popcnt")]
pub(in crate::backend::cpu) unsafe fn codes16(
    d: &[u16],
    signed: bool,
    out: &mut Vec<u32>,
    tail: &mut BitWriter,
) {
    // SAFETY: the caller's features.
    unsafe { codes16_as::<false>(d, signed, &[], 0, out, tail) }
}

/// [`codes16`] for the Joint layout (signed): instead of each element's code, its slot in
/// `joint::JointFlat` (`joint::flat_index` of its displacement and facts `info`, `lo2` the
/// table's lowest context), so the lanes gather their symbols without context arithmetic.
/// Contexts and slots are computed 16 to a vector here, where the lanes would take 8.
///
/// # Safety
/// The CPU must support AVX2 and POPCNT; `info` holds at least `d.len()` facts.
#[target_feature(enable = "avx2,popcnt")]
pub(in crate::backend::cpu) unsafe fn flat_slots16(
    d: &[u16],
    info: &[u16],
    lo2: u32,
    out: &mut Vec<u32>,
    tail: &mut BitWriter,
) {
    assert!(info.len() >= d.len());
    // SAFETY: the caller's features; `info` checked above.
    unsafe { codes16_as::<true>(d, true, info, lo2, out, tail) }
}

/// [`codes16`] (`FLAT` false) or [`flat_slots16`] (`FLAT` true: `signed` and `info.len() >=
/// d.len()`).
#[inline]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn codes16_as<const FLAT: bool>(
    d: &[u16],
    signed: bool,
    info: &[u16],
    lo2: u32,
    out: &mut Vec<u32>,
    tail: &mut BitWriter,
) {
    let n = d.len();
    // Every slot is written below; no clearing memset when the buffer is already as long.
    out.truncate(n);
    out.resize(n, 0);
    let zero = _mm256_setzero_si256();
    let (one, three) = (_mm256_set1_epi32(1), _mm256_set1_epi32(3));
    let bias = _mm256_set1_epi32(4 * 126);
    let lo32 = _mm256_set1_epi64x(0xFFFF_FFFF);
    let lo2_v = _mm256_set1_epi16(lo2 as i16);
    let mut vals = [[0u64; 4]; 2];
    let mut lens = [[0u64; 4]; 2];
    let (dp, ip, op) = (d.as_ptr(), info.as_ptr(), out.as_mut_ptr());
    let full = n / 16 * 16;
    for at in (0..full).step_by(16) {
        // SAFETY: `at + 16 <= n` elements of `d` and `out`.
        let dv = unsafe { _mm256_loadu_si256(dp.add(at).cast()) };
        let (v, neg) = if signed {
            // -2^15 gives 2^15 as unsigned: the right magnitude.
            (_mm256_abs_epi16(dv), _mm256_srli_epi16::<15>(dv))
        } else {
            let z = _mm256_xor_si256(_mm256_slli_epi16::<1>(dv), _mm256_srai_epi16::<15>(dv));
            (z, zero)
        };
        // 32-bit lanes in the in-lane unpack order: elements 0..4 and 8..12, then 4..8 and
        // 12..16.
        let halves = [
            (
                _mm256_unpacklo_epi16(v, zero),
                _mm256_unpacklo_epi16(neg, zero),
            ),
            (
                _mm256_unpackhi_epi16(v, zero),
                _mm256_unpackhi_epi16(neg, zero),
            ),
        ];
        let mut c = [zero; 2];
        let mut e = [zero; 2];
        for (h, &(v, neg)) in halves.iter().enumerate() {
            // `4·b + 2·q1 + q2` (0 for v = 0: its float is 0).
            e[h] = exp_q(v);
            let t = _mm256_max_epi32(_mm256_sub_epi32(e[h], bias), zero);
            let b = _mm256_srli_epi32::<2>(t);
            if !FLAT {
                c[h] = _mm256_or_si256(
                    _mm256_or_si256(
                        b,
                        _mm256_slli_epi32::<6>(_mm256_and_si256(t, _mm256_set1_epi32(2))),
                    ),
                    _mm256_or_si256(
                        _mm256_slli_epi32::<8>(_mm256_and_si256(t, one)),
                        _mm256_slli_epi32::<9>(neg),
                    ),
                );
            }
            // The raw tail: the low `b - 3` bits (none for b < 4), merged pairwise, then
            // the pairs of each 128-bit half (elements 4k..4k + 4, in order).
            let len = _mm256_max_epi32(_mm256_sub_epi32(b, three), zero);
            let val = _mm256_and_si256(v, _mm256_sub_epi32(_mm256_sllv_epi32(one, len), one));
            let (v_lo, l_lo) = (_mm256_and_si256(val, lo32), _mm256_and_si256(len, lo32));
            let v2 = _mm256_or_si256(v_lo, _mm256_sllv_epi64(_mm256_srli_epi64::<32>(val), l_lo));
            let l2 = _mm256_add_epi64(l_lo, _mm256_srli_epi64::<32>(len));
            let v4 = _mm256_or_si256(v2, _mm256_sllv_epi64(_mm256_bsrli_epi128::<8>(v2), l2));
            let l4 = _mm256_add_epi64(l2, _mm256_bsrli_epi128::<8>(l2));
            // SAFETY: 4 `u64` each into `vals[h]` and `lens[h]`.
            unsafe {
                _mm256_storeu_si256(vals[h].as_mut_ptr().cast(), v4);
                _mm256_storeu_si256(lens[h].as_mut_ptr().cast(), l4);
            }
        }
        if FLAT {
            // The slot and the context in 16-bit lanes, joined by one multiply-add per
            // pair into the same unpack order as the codes above.
            // SAFETY: `at + 16 <= n <= info.len()`.
            let inf = unsafe { _mm256_loadu_si256(ip.add(at).cast()) };
            let tq = _mm256_subs_epu16(_mm256_packus_epi32(e[0], e[1]), _mm256_set1_epi16(4 * 126));
            let slot = slot_of(tq, _mm256_srli_epi16::<15>(dv));
            let ctx = _mm256_sub_epi16(contexts16(inf), lo2_v);
            (c[0], c[1]) = slot_ctx(slot, ctx);
        }
        // SAFETY: 16 `u32` at `at` of `out`; the permutes put elements 0..8 and 8..16
        // back in order.
        unsafe {
            _mm256_storeu_si256(
                op.add(at).cast(),
                _mm256_permute2x128_si256::<0x20>(c[0], c[1]),
            );
            _mm256_storeu_si256(
                op.add(at + 8).cast(),
                _mm256_permute2x128_si256::<0x31>(c[0], c[1]),
            );
        }
        tail.put_many(
            [vals[0][0], vals[1][0], vals[0][2], vals[1][2]],
            [lens[0][0], lens[1][0], lens[0][2], lens[1][2]].map(|l| l as u32),
        );
    }
    for (j, (o, &d)) in out[full..].iter_mut().zip(&d[full..]).enumerate() {
        let (v, neg) = word::value::<u16>(d as u64, signed);
        let c = word::code(v, neg);
        let len = (c & 127).saturating_sub(3);
        tail.put(v & ((1u64 << len) - 1), len);
        *o = if FLAT {
            flat_index(d, info[full + j], lo2)
        } else {
            c
        };
    }
}

/// [`codes16`] for 32-bit elements (the portable pass put one tail at a time and was a third
/// of an fp32 `--fast` encode): codes by bit lengths, the raw tails (at most 29 bits) merged
/// pairwise in the vector, so the bit writer takes one value per two elements.
///
/// # Safety
/// The CPU must support AVX2 and POPCNT.
#[target_feature(enable = "avx2,popcnt")]
pub(in crate::backend::cpu) unsafe fn codes32(
    d: &[u32],
    signed: bool,
    out: &mut Vec<u32>,
    tail: &mut BitWriter,
) {
    // SAFETY: the caller's features.
    unsafe { codes32_as::<false>(d, signed, &[], 0, out, tail) }
}

/// [`flat_slots16`] for 32-bit elements.
///
/// # Safety
/// The CPU must support AVX2 and POPCNT; `info` holds at least `d.len()` facts.
#[target_feature(enable = "avx2,popcnt")]
pub(in crate::backend::cpu) unsafe fn flat_slots32(
    d: &[u32],
    info: &[u16],
    lo2: u32,
    out: &mut Vec<u32>,
    tail: &mut BitWriter,
) {
    assert!(info.len() >= d.len());
    // SAFETY: the caller's features; `info` checked above.
    unsafe { codes32_as::<true>(d, true, info, lo2, out, tail) }
}

/// [`codes32`] (`FLAT` false) or [`flat_slots32`] (`FLAT` true: `signed` and `info.len() >=
/// d.len()`).
#[inline]
#[target_feature(enable = "avx2,popcnt")]
unsafe fn codes32_as<const FLAT: bool>(
    d: &[u32],
    signed: bool,
    info: &[u16],
    lo2: u32,
    out: &mut Vec<u32>,
    tail: &mut BitWriter,
) {
    let n = d.len();
    // Every slot is written below; no clearing memset when the buffer is already as long.
    out.truncate(n);
    out.resize(n, 0);
    let zero = _mm256_setzero_si256();
    let mut vals = [0u64; 4];
    let mut lens = [0u64; 4];
    // `slot + ctx·FLAT_STRIDE` from `slot | ctx << 16` by one multiply-add.
    let w = _mm256_set1_epi32(1 | (FLAT_STRIDE as i32) << 16);
    let lo2_v = _mm256_set1_epi32(lo2 as i32);
    for at in (0..n).step_by(8) {
        let cnt = (n - at).min(8);
        // Lanes past `cnt` are zero: code 0, no tail bits.
        let sd = load_u32(d, at, cnt);
        let (v, neg) = if signed {
            // |i32::MIN| stays 2^31: as unsigned, the right magnitude.
            (_mm256_abs_epi32(sd), _mm256_cmpgt_epi32(zero, sd))
        } else {
            let z = _mm256_xor_si256(_mm256_slli_epi32::<1>(sd), _mm256_srai_epi32::<31>(sd));
            (z, zero)
        };
        // Bit length from the float exponent. Conversion rounds, and rounding up could carry
        // into the exponent, so convert `v & !(v >> 1)`: same top bit, no two adjacent ones
        // below it, so no carry reaches it. Values with the top bit set (2^31 and up) convert
        // as negatives: their length is 32 whatever the exponent says.
        let t = _mm256_andnot_si256(_mm256_srli_epi32::<1>(v), v);
        let e = _mm256_and_si256(
            _mm256_srli_epi32::<23>(_mm256_castps_si256(_mm256_cvtepi32_ps(t))),
            _mm256_set1_epi32(255),
        );
        let b = _mm256_max_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(126)), zero);
        let b = _mm256_blendv_epi8(b, _mm256_set1_epi32(32), _mm256_srai_epi32::<31>(v));
        let (c, val, len) = code_and_tail(v, b, neg);
        let c = if FLAT {
            // `8·b + q1 + 2·q2 + 4·neg` (the code's bits 7..10) at the context's row; the
            // contexts of `info`, all at least `lo2`, are below 2^9 (and the slots 2^9).
            let i = _mm256_cvtepu16_epi32(load_u16(info, at, cnt));
            let ctx = _mm256_sub_epi32(
                _mm256_or_si256(
                    _mm256_slli_epi32::<1>(_mm256_and_si256(i, _mm256_set1_epi32(255))),
                    _mm256_and_si256(_mm256_srli_epi32::<8>(i), _mm256_set1_epi32(1)),
                ),
                lo2_v,
            );
            let slot = _mm256_or_si256(
                _mm256_slli_epi32::<3>(b),
                _mm256_and_si256(_mm256_srli_epi32::<7>(c), _mm256_set1_epi32(7)),
            );
            _mm256_madd_epi16(_mm256_or_si256(slot, _mm256_slli_epi32::<16>(ctx)), w)
        } else {
            c
        };
        store_u32(&mut out[at..at + cnt], c);
        let lo32 = _mm256_set1_epi64x(0xFFFF_FFFF);
        let (v_lo, l_lo) = (_mm256_and_si256(val, lo32), _mm256_and_si256(len, lo32));
        let v2 = _mm256_or_si256(v_lo, _mm256_sllv_epi64(_mm256_srli_epi64::<32>(val), l_lo));
        let l2 = _mm256_add_epi64(l_lo, _mm256_srli_epi64::<32>(len));
        // SAFETY: 4 `u64` each into `vals` and `lens`.
        unsafe {
            _mm256_storeu_si256(vals.as_mut_ptr() as *mut _, v2);
            _mm256_storeu_si256(lens.as_mut_ptr() as *mut _, l2);
        }
        tail.put_many(vals, lens.map(|l| l as u32));
    }
}

/// Each lane's code from its magnitude `v`, bit length `b` and sign mask `neg` (`b`, Q1 and
/// Q2 at bits 7 and 8, the sign at bit 9, as `super::super::encode::codes`), and its raw
/// tail: the low `b - 3` bits and their count (none for `b < 4`).
#[inline]
#[target_feature(enable = "avx2")]
fn code_and_tail(v: __m256i, b: __m256i, neg: __m256i) -> (__m256i, __m256i, __m256i) {
    let zero = _mm256_setzero_si256();
    let one = _mm256_set1_epi32(1);
    let two = _mm256_set1_epi32(2);
    let three = _mm256_set1_epi32(3);
    let sh1 = _mm256_max_epi32(_mm256_sub_epi32(b, two), zero);
    let sh2 = _mm256_max_epi32(_mm256_sub_epi32(b, three), zero);
    let q1 = _mm256_and_si256(
        _mm256_cmpgt_epi32(b, one),
        _mm256_and_si256(_mm256_srlv_epi32(v, sh1), one),
    );
    let q2 = _mm256_and_si256(
        _mm256_cmpgt_epi32(b, two),
        _mm256_and_si256(_mm256_srlv_epi32(v, sh2), one),
    );
    let c = _mm256_or_si256(
        b,
        _mm256_or_si256(_mm256_slli_epi32::<7>(q1), _mm256_slli_epi32::<8>(q2)),
    );
    let c = _mm256_or_si256(c, _mm256_and_si256(neg, _mm256_set1_epi32(1 << 9)));
    let len = sh2;
    let val = _mm256_and_si256(v, _mm256_sub_epi32(_mm256_sllv_epi32(one, len), one));
    (c, val, len)
}

/// Bit `S` of each lane.
#[inline]
#[target_feature(enable = "avx2")]
fn bit<const S: i32>(v: __m256i) -> __m256i {
    _mm256_and_si256(_mm256_srli_epi32::<S>(v), _mm256_set1_epi32(1))
}

/// The packed symbols of the four stages (B, Q1, Q2, S) of one step, per vector.
type StepSyms = [[__m256i; 4]; 4];

/// `f` itself: lets a closure carry `#[inline(always)]`.
#[inline(always)]
fn inlined<F: Fn(usize) -> StepSyms>(f: F) -> F {
    f
}

/// The interleaved lanes of one chunk (as `super::super::encode::lanes`); the words are left
/// in `words[at..SLACK + codes.len() * stages.len()]` in stream order, `at` returned with the
/// final states.
///
/// # Safety
/// The CPU must support AVX2 and POPCNT.
#[target_feature(enable = "avx2,popcnt")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn lanes(
    codes: &[u32],
    info: &[u16],
    w1: usize,
    stages: &[EncStage],
    flat: &Flat,
    distance: Option<usize>,
    words: &mut Vec<u16>,
) -> ([u32; LANES], usize) {
    let n = codes.len();
    assert!(info.len() >= n && (3..=4).contains(&stages.len()));
    // At most one word per coded symbol, and the slack below. Grown, never cleared: every
    // slot from the final cursor up is written.
    let end = SLACK + n * stages.len();
    if words.len() < end {
        words.resize(end, 0);
    }
    let out = words.as_mut_ptr();
    let mut pos = end;
    let s_nb = stages.get(3).is_some_and(|t| t.neighbor);
    let b_nb = stages[0].neighbor;
    let d = match distance {
        Some(d) if b_nb || s_nb => d,
        _ => usize::MAX,
    };
    // Every stage's symbols for the lanes of step `step` (a closure: inlined here, with this
    // function's features).
    let lo_v = _mm256_set1_epi32(flat.lo as i32);
    let s_nb_v = _mm256_set1_epi32(-(s_nb as i32));
    let step_syms = inlined(
        #[inline(always)]
        |step: usize| -> StepSyms {
            let n = codes.len();
            let base = step * LANES;
            let lanes = LANES.min(n - base);
            let zero = _mm256_setzero_si256();
            let w1v = _mm256_set1_epi32(w1 as i32);
            let m127 = _mm256_set1_epi32(127);
            let one = _mm256_set1_epi32(1);
            let ident = _mm256_set1_epi32(PACKED_IDENTITY as i32);
            let mut out = [[ident; 4]; 4];
            // `k` picks the vector in every stage's row of `out`.
            #[allow(clippy::needless_range_loop)]
            for k in 0..4 {
                // Vectors past the chunk's end code the identity in every lane.
                let at = base + 8 * k;
                let cnt = lanes.saturating_sub(8 * k).min(8);
                if cnt == 0 {
                    continue;
                }
                let valid = first(cnt);
                let (c, i) = (
                    load_u32(codes, at, cnt),
                    _mm256_cvtepu16_epi32(load_u16(info, at, cnt)),
                );
                // Codes of the neighbors `d` elements back, and which lanes have one.
                let (nc, knb) = if at >= d {
                    (load_u32(codes, at - d, cnt), valid)
                } else if at + 8 <= d {
                    (zero, zero)
                } else {
                    let (mut tmp, mut has) = ([0u32; 8], [0i32; 8]);
                    for (l, (t, h)) in tmp.iter_mut().zip(&mut has).enumerate().take(cnt) {
                        if at + l >= d {
                            (*t, *h) = (codes[at + l - d], -1);
                        }
                    }
                    // SAFETY: reads the 8 lanes of `tmp` and `has`.
                    unsafe {
                        (
                            _mm256_loadu_si256(tmp.as_ptr() as *const _),
                            _mm256_loadu_si256(has.as_ptr() as *const _),
                        )
                    }
                };
                let b = _mm256_and_si256(c, m127);
                let er = _mm256_and_si256(i, _mm256_set1_epi32(255));
                // Flat-table form: `(er - lo)·w1 + b` (huge, and clamped, in invalid lanes).
                let eb = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_sub_epi32(er, lo_v), w1v), b);
                let nb = _mm256_blendv_epi8(w1v, _mm256_and_si256(nc, m127), knb);
                let m2 = _mm256_and_si256(_mm256_srli_epi32::<9>(i), _mm256_set1_epi32(3));

                // B.
                out[0][k] = if stages[0].neighbor && !flat.bn.is_empty() {
                    let em =
                        _mm256_add_epi32(_mm256_slli_epi32::<2>(_mm256_sub_epi32(er, lo_v)), m2);
                    let row =
                        _mm256_add_epi32(_mm256_mullo_epi32(em, _mm256_add_epi32(w1v, one)), nb);
                    let idx = _mm256_add_epi32(_mm256_mullo_epi32(row, w1v), b);
                    // SAFETY: features as this function's.
                    unsafe { lookup_flat(&flat.bn, valid, idx) }
                } else if stages[0].neighbor {
                    let row =
                        _mm256_add_epi32(_mm256_mullo_epi32(m2, _mm256_add_epi32(w1v, one)), nb);
                    let ctx = _mm256_add_epi32(_mm256_slli_epi32::<8>(row), er);
                    // SAFETY: features as this function's.
                    unsafe { gather(&stages[0], valid, ctx, b) }
                } else {
                    // SAFETY: features as this function's.
                    unsafe { lookup_flat(&flat.b, valid, eb) }
                };

                // Q1, Q2: one 64-bit lookup a lane, by scalar loads four lanes at a time
                // (two `vpgatherdq` of four lanes each were 1–3.5% slower on a Zen 2).
                let idx = _mm256_add_epi32(
                    _mm256_slli_epi32::<2>(eb),
                    _mm256_and_si256(_mm256_srli_epi32::<7>(c), _mm256_set1_epi32(3)),
                );
                let idx = _mm256_min_epu32(idx, _mm256_set1_epi32(flat.q12.len() as i32 - 1));
                let ident64 = _mm256_set1_epi64x(
                    (PACKED_IDENTITY as u64 | (PACKED_IDENTITY as u64) << 32) as i64,
                );
                let hi = |v| _mm256_extracti128_si256::<1>(v);
                // SAFETY: every lane reads `q12[idx]` with `idx < q12.len()` (clamped
                // above); the lanes outside `valid` (sign-extended to 64 bits) are blended
                // away.
                let (g0, g1) = unsafe {
                    let four = |ix| gather4_u64(flat.q12.as_ptr(), ix);
                    (
                        _mm256_blendv_epi8(
                            ident64,
                            four(_mm256_castsi256_si128(idx)),
                            _mm256_cvtepi32_epi64(_mm256_castsi256_si128(valid)),
                        ),
                        _mm256_blendv_epi8(
                            ident64,
                            four(hi(idx)),
                            _mm256_cvtepi32_epi64(hi(valid)),
                        ),
                    )
                };
                // The low (Q1) and high (Q2) halves of lanes 0..3 (g0) and 4..7 (g1): the
                // shuffle takes them in the order 0 1 4 5 | 2 3 6 7, the permute restores it.
                let (g0, g1) = (_mm256_castsi256_ps(g0), _mm256_castsi256_ps(g1));
                let q1 = _mm256_castps_si256(_mm256_shuffle_ps::<0x88>(g0, g1));
                let q2 = _mm256_castps_si256(_mm256_shuffle_ps::<0xDD>(g0, g1));
                out[1][k] = _mm256_permute4x64_epi64::<0xD8>(q1);
                out[2][k] = _mm256_permute4x64_epi64::<0xD8>(q2);

                // S.
                if stages.len() == 4 {
                    // up: the neighbor's sign state (0 none / no update, 1 up, 2 down).
                    let nz = _mm256_andnot_si256(
                        _mm256_cmpeq_epi32(_mm256_and_si256(nc, m127), zero),
                        _mm256_and_si256(knb, s_nb_v),
                    );
                    let up = _mm256_and_si256(nz, _mm256_add_epi32(one, bit::<9>(nc)));
                    let three = _mm256_add_epi32(_mm256_slli_epi32::<1>(eb), eb);
                    let ctx = _mm256_add_epi32(
                        _mm256_slli_epi32::<1>(_mm256_add_epi32(three, up)),
                        bit::<8>(i),
                    );
                    let idx = _mm256_add_epi32(_mm256_slli_epi32::<1>(ctx), bit::<9>(c));
                    // SAFETY: features as this function's.
                    out[3][k] = unsafe { lookup_flat(&flat.s, valid, idx) };
                }
            }
            out
        },
    );
    let mut x = [_mm256_set1_epi32(RANS_L as i32); 4];
    let steps = n.div_ceil(LANES);
    if steps == 0 {
        return ([RANS_L; LANES], end);
    }
    let mut next = step_syms(steps - 1);
    for step in (0..steps).rev() {
        // The next step's lookups are issued before this step's state chain, so they run
        // under it.
        let cur = next;
        if step > 0 {
            next = step_syms(step - 1);
        }
        for p in cur[..stages.len()].iter().rev() {
            // SAFETY: `pos` never drops below `SLACK`: one word at most per coded symbol.
            unsafe { put4(&mut x, *p, out, &mut pos) };
        }
    }
    let mut states = [0u32; LANES];
    // SAFETY: 4 × 8 `u32` into the 32 of `states`.
    unsafe {
        for (h, x) in x.iter().enumerate() {
            _mm256_storeu_si256(states.as_mut_ptr().add(8 * h) as *mut _, *x);
        }
    }
    (states, pos)
}

/// [`gather_flat`] by scalar loads (`gather8_or`), for the default layout's lanes: there,
/// on a Zen 2, its encode ran 2–5% faster this way than by
/// `vpgatherdd` (docs/BENCHMARKS.md). The Joint lanes keep `gather_flat` for their last,
/// partial vector: inlined into their loop, the scalar form made it 1–5% slower.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn lookup_flat(table: &[u32], k: __m256i, idx: __m256i) -> __m256i {
    let idx = _mm256_min_epu32(idx, _mm256_set1_epi32(table.len() as i32 - 1));
    // SAFETY: every lane reads `table[idx]` with `idx < table.len()`.
    unsafe {
        gather8_or(
            _mm256_set1_epi32(PACKED_IDENTITY as i32),
            table.as_ptr(),
            idx,
            k,
        )
    }
}

/// `table[idx]` for the lanes in `k` (indices clamped to the table), the identity elsewhere.
#[inline]
#[target_feature(enable = "avx2")]
pub(in crate::backend::cpu) unsafe fn gather_flat(
    table: &[u32],
    k: __m256i,
    idx: __m256i,
) -> __m256i {
    let idx = _mm256_min_epu32(idx, _mm256_set1_epi32(table.len() as i32 - 1));
    // SAFETY: the lanes in `k` read `table[idx]` with `idx < table.len()`.
    unsafe {
        _mm256_mask_i32gather_epi32::<4>(
            _mm256_set1_epi32(PACKED_IDENTITY as i32),
            table.as_ptr() as *const _,
            idx,
            k,
        )
    }
}

/// The packed symbols (`freq | start << 16`) of 8 lanes: `sym` under context `ctx`'s row for
/// the lanes in `k`, the identity elsewhere. Contexts and rows are clamped to the tables, so
/// nothing is read outside them whatever the codes (in-range values, the only ones the
/// passes produce, are unchanged; `Flat`'s neighbor-form B table assumes these clamps).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn gather(t: &EncStage, k: __m256i, ctx: __m256i, sym: __m256i) -> __m256i {
    let ctx = _mm256_min_epu32(ctx, _mm256_set1_epi32(t.map.len() as i32 - 1));
    // SAFETY: the lanes in `k` read `map[ctx]` with `ctx < map.len()`.
    let row = unsafe {
        _mm256_mask_i32gather_epi32::<4>(_mm256_setzero_si256(), t.map.as_ptr() as *const _, ctx, k)
    };
    // Contexts without a row (never for tables built from the codes' own counts) code the
    // identity, as `EncStage::get` does.
    let k = _mm256_andnot_si256(_mm256_cmpeq_epi32(row, _mm256_set1_epi32(-1)), k);
    let idx = _mm256_add_epi32(
        _mm256_mullo_epi32(row, _mm256_set1_epi32(t.alphabet as i32)),
        sym,
    );
    let idx = _mm256_min_epu32(idx, _mm256_set1_epi32(t.packed.len() as i32 - 1));
    // SAFETY: the lanes in `k` read `packed[idx]` with `idx < packed.len()`.
    unsafe {
        _mm256_mask_i32gather_epi32::<4>(
            _mm256_set1_epi32(PACKED_IDENTITY as i32),
            t.packed.as_ptr() as *const _,
            idx,
            k,
        )
    }
}

/// `_mm_shuffle_epi8` controls by flush mask: the words of the lanes set in the mask moved,
/// in lane order, to the top of the 8 words (the rest zeroed, and never part of the stream).
static COMPRESS: [[u8; 16]; 256] = compress_table();

const fn compress_table() -> [[u8; 16]; 256] {
    let mut t = [[0x80u8; 16]; 256];
    let mut m = 0;
    while m < 256 {
        let mut slot = 8 - (m as u32).count_ones() as usize;
        let mut lane = 0;
        while lane < 8 {
            if (m >> lane) & 1 == 1 {
                t[m][2 * slot] = 2 * lane as u8;
                t[m][2 * slot + 1] = 2 * lane as u8 + 1;
                slot += 1;
            }
            lane += 1;
        }
        m += 1;
    }
    t
}

/// One (step, stage) of rANS encoding over lanes 31..=0: per lane `enc_put`, the words
/// stored below `*pos` in lane order.
///
/// # Safety
/// `out[*pos - SLACK..*pos]` must be inside the buffer, with room below `*pos` for every word
/// this call flushes (at most 32) and the `SLACK` under them.
#[inline]
#[target_feature(enable = "avx2,popcnt")]
pub(in crate::backend::cpu) unsafe fn put4(
    x: &mut [__m256i; 4],
    p: [__m256i; 4],
    out: *mut u16,
    pos: &mut usize,
) {
    let m16 = _mm256_set1_epi32(0xFFFF);
    let f = p.map(|p| _mm256_and_si256(p, m16));
    // Lanes that keep their state: x < freq << 20, as x >> 20 < freq (both below 2^16, so
    // the signed compare is exact); the identity's freq 2^12 never flushes.
    let keep = [0, 1, 2, 3].map(|h| _mm256_cmpgt_epi32(f[h], _mm256_srli_epi32::<20>(x[h])));
    for h in [3, 2, 1, 0] {
        let k = !_mm256_movemask_ps(_mm256_castsi256_ps(keep[h])) as usize & 0xFF;
        let cnt = k.count_ones() as usize;
        *pos -= cnt;
        // The low words of all 8 lanes (no saturation: each is masked to 16 bits), the
        // flushed ones shuffled to the top, stored as a block ending at the old cursor.
        let w = _mm256_and_si256(x[h], m16);
        let w = _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w));
        // SAFETY: `COMPRESS[k]` holds 16 bytes; the block `out[*pos + cnt - 8..*pos + cnt]`
        // starts at or above `*pos - 8`, inside the buffer (caller), and what it writes
        // below `*pos` is overwritten by later words or left outside the stream.
        unsafe {
            let w = _mm_shuffle_epi8(w, _mm_loadu_si128(COMPRESS[k].as_ptr() as *const _));
            _mm_storeu_si128(out.add(*pos + cnt - 8) as *mut _, w);
        }
    }
    let total = _mm256_set1_epi32(PROB_TOTAL as i32);
    let zero = _mm256_setzero_si256();
    let one = _mm256_set1_epi32(1);
    let two = _mm256_set1_ps(2.0);
    let two32 = _mm256_set1_ps(4_294_967_296.0);
    for h in 0..4 {
        let y = _mm256_blendv_epi8(_mm256_srli_epi32::<16>(x[h]), x[h], keep[h]);
        let start = _mm256_srli_epi32::<16>(p[h]);
        let cmpl = _mm256_sub_epi32(total, f[h]);
        // 1 / freq: `vrcpps` is within 1.5·2^-12; one Newton step squares that to 2^-22.8,
        // plus three roundings: within 5.3·2^-24. Off the state chain (freq only).
        let ff = _mm256_cvtepi32_ps(f[h]);
        let r0 = _mm256_rcp_ps(ff);
        let rcp = _mm256_mul_ps(r0, _mm256_sub_ps(two, _mm256_mul_ps(ff, r0)));
        // y as an unsigned float (y reaches 2^32 - 1 for freqs near 2^12): the signed
        // conversion gives y - 2^32 for y >= 2^31, within 2^-24 of y, and adding 2^32
        // rounds once more.
        let yf = _mm256_add_ps(
            _mm256_cvtepi32_ps(y),
            _mm256_and_ps(_mm256_castsi256_ps(_mm256_srai_epi32::<31>(y)), two32),
        );
        // q0 within one of y / freq: relative error < 8.5·2^-24 < 2^-20, q < 2^20 (y <
        // freq << 20 once flushed), so the error is below one.
        let q0 = _mm256_cvttps_epi32(_mm256_mul_ps(yf, rcp));
        let rem = _mm256_sub_epi32(y, _mm256_mullo_epi32(q0, f[h]));
        // C(y) = y + start + q·cmpl = q·2^PROB_BITS + (y - q·freq) + start (the same in
        // wrapping arithmetic, one multiply fewer); one quotient off shifts it by ±cmpl.
        let t = _mm256_add_epi32(
            _mm256_add_epi32(_mm256_slli_epi32::<{ PROB_BITS as i32 }>(q0), rem),
            start,
        );
        let low = _mm256_cmpgt_epi32(zero, rem);
        let high = _mm256_cmpgt_epi32(rem, _mm256_sub_epi32(f[h], one));
        let t = _mm256_sub_epi32(t, _mm256_and_si256(low, cmpl));
        x[h] = _mm256_add_epi32(t, _mm256_and_si256(high, cmpl));
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::encode::codes;
    use super::codes32;
    use crate::format::bits::BitWriter;

    /// The vector pass gives the portable pass's codes and tail bits for every 16-bit
    /// pattern, both layouts, and lengths that leave a partial step.
    #[test]
    fn codes16_matches_portable() {
        if !super::super::super::Isa::Avx2.available() {
            eprintln!("SKIP: this CPU has no AVX2");
            return;
        }
        let mut d: Vec<u16> = (0..=u16::MAX).collect();
        // Runs of one length, and neighbors far apart, after the ordered patterns.
        d.extend((0..=u16::MAX).map(|k| k.wrapping_mul(40503)));
        for signed in [true, false] {
            for len in [d.len(), d.len() - 7, 15, 16, 17] {
                let d = &d[..len];
                let (mut want, mut want_t) = (Vec::new(), BitWriter::default());
                codes(d, signed, &mut want, Some(&mut want_t));
                let (mut got, mut got_t) = (Vec::new(), BitWriter::default());
                // SAFETY: AVX2 checked above.
                unsafe { super::codes16(d, signed, &mut got, &mut got_t) };
                assert_eq!(got, want, "codes, signed {signed}, {len} elements");
                assert_eq!(got_t.bits(), want_t.bits(), "tail bits, signed {signed}");
                assert_eq!(got_t.bytes(), want_t.bytes(), "tail, signed {signed}");
            }
        }
    }

    /// The vector pass gives the portable pass's codes and tail bits for every bit length,
    /// at and around each power of two (where a float conversion could round up), both
    /// signs, the extremes, both layouts, and lengths that leave a partial vector.
    #[test]
    fn codes32_matches_portable() {
        if !super::super::super::Isa::Avx2.available() {
            eprintln!("SKIP: this CPU has no AVX2");
            return;
        }
        let mut d: Vec<u32> = Vec::new();
        for k in 0..32 {
            for delta in [-2i64, -1, 0, 1, 2] {
                let v = ((1i64 << k) + delta) as u32;
                d.extend([v, v.wrapping_neg()]);
            }
        }
        d.extend([
            0,
            1,
            u32::MAX,
            1 << 31,
            (1 << 31) - 1,
            (1 << 31) + 1,
            0x00FF_FFFF,
        ]);
        // Every run of 24 ones below the top bit (the float mantissa's width) and beyond.
        for k in 20..32 {
            d.push(((1u64 << k) - 1) as u32);
            d.push(((1u64 << k) - 1) as u32 ^ 0x55);
        }
        let mut x = 0x9E37_79B9u32;
        for _ in 0..1000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            d.push(x >> (x % 32));
        }
        for signed in [true, false] {
            for len in [d.len(), d.len() - 3, 5] {
                let d = &d[..len];
                let (mut want, mut want_t) = (Vec::new(), BitWriter::default());
                codes(d, signed, &mut want, Some(&mut want_t));
                let (mut got, mut got_t) = (Vec::new(), BitWriter::default());
                // SAFETY: AVX2 checked above (POPCNT comes with it on every AVX2 CPU
                // `Isa::Avx2` accepts).
                unsafe { codes32(d, signed, &mut got, &mut got_t) };
                assert_eq!(got, want, "codes, signed {signed}, {len} elements");
                assert_eq!(got_t.bits(), want_t.bits(), "tail bits, signed {signed}");
                assert_eq!(got_t.bytes(), want_t.bytes(), "tail, signed {signed}");
            }
        }
    }
}
