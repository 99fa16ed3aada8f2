//! AVX-512 lanes of the Joint layout (`super::super::joint`): per 16 lanes one gather for
//! the rows of the elements' contexts and one for their slots in the dense slot table, when
//! decoding; one gather from the flat table of packed symbols, when encoding. The refill
//! (expanding load) and the flush (compress, narrow, masked store) are the other layouts'.

#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;

use super::super::decode::{no_row, Stream};
use super::super::encode::Scratch;
use super::super::joint::{small_codes, stores_j, JointDec, JointFlat};
use super::super::word::Word;
use super::super::Isa;
use super::decode::{overrun, refill};
use super::encode::{gather_flat, put2};
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::entropy::rans::RANS_L;
use crate::format::chunk::{EncodedChunk, LANES};
use crate::Result;

/// Per-element codes (`b | q1 << 7 | q2 << 8 | neg << 9`) of 16 joint symbols: from
/// `u = J + 17 = 8·b + 4·q1 + 2·q2 + neg` by shifts above J = 6, from `small` below 16.
#[inline(always)]
pub(super) unsafe fn code_of(j: __m512i, small: __m512i) -> __m512i {
    let u = _mm512_add_epi32(j, _mm512_set1_epi32(17));
    let c = _mm512_or_si512(
        _mm512_or_si512(
            _mm512_srli_epi32::<3>(u),
            _mm512_slli_epi32::<5>(_mm512_and_si512(u, _mm512_set1_epi32(4))),
        ),
        _mm512_or_si512(
            _mm512_slli_epi32::<7>(_mm512_and_si512(u, _mm512_set1_epi32(2))),
            _mm512_slli_epi32::<9>(_mm512_and_si512(u, _mm512_set1_epi32(1))),
        ),
    );
    let lt16 = _mm512_cmplt_epu32_mask(j, _mm512_set1_epi32(16));
    _mm512_mask_permutexvar_epi32(c, lt16, j, small)
}

/// The J contexts of elements `j..j + 16` of `reference` (`joint_params`: the exponent
/// field's shift and mask, the mask zero when not conditioning).
#[inline(always)]
unsafe fn ref_contexts<T: Word>(rp: *const u8, j: usize, mant: __m128i, emask: __m512i) -> __m512i {
    let r = match T::BITS {
        8 => _mm512_cvtepu8_epi32(_mm_loadu_si128(rp.add(j).cast())),
        16 => _mm512_cvtepu16_epi32(_mm256_loadu_si256(rp.add(2 * j).cast())),
        _ => _mm512_loadu_si512(rp.add(4 * j).cast()),
    };
    let er = _mm512_and_si512(_mm512_srl_epi32(r, mant), emask);
    let sign = _mm512_srl_epi32(r, _mm_cvtsi32_si128(T::BITS as i32 - 1));
    _mm512_or_si512(_mm512_slli_epi32::<1>(er), sign)
}

/// Decode whole steps of the chunk from its start, exactly as
/// `super::super::joint::decode_lanes` would (storing J where [`stores_j`]), with contexts read from `reference` (the
/// chunk's elements from the first step on); returns the number of elements done: every
/// whole step, or when `guarded`, those before fewer than `LANES` words are left (0 when the
/// tables do not have the shapes the gathers assume).
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL; `T` at most 32 bits; unless `guarded`, `st.words`
/// must hold `LANES` padding words past `st.len`.
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vl")]
pub unsafe fn decode<T: Word>(
    table: &JointDec,
    reference: &[u8],
    (mant, emask): (u32, u32),
    codes: &mut [u32],
    states: &mut [u32; LANES],
    st: &mut Stream,
    guarded: bool,
) -> Result<usize> {
    let n = codes.len().min(reference.len() / T::SIZE);
    let full = n / LANES * LANES;
    if full == 0 || !table.vector_ok || T::BITS > 32 {
        return Ok(0);
    }
    assert!(st.words.len() >= st.len + if guarded { 0 } else { LANES } && st.pos <= st.len);
    let words = st.words.as_ptr();
    let mut pos = st.pos;
    let mut x = [
        _mm512_loadu_si512(states.as_ptr().cast()),
        _mm512_loadu_si512(states.as_ptr().add(16).cast()),
    ];
    let small_a = small_codes();
    let small = _mm512_loadu_si512(small_a.as_ptr().cast());
    let (map, slots) = (table.map.as_ptr(), table.slots.as_ptr());
    let none = _mm512_set1_epi32(JointDec::NONE as i32);
    let (rp, cp) = (reference.as_ptr(), codes.as_mut_ptr());
    let (mant, emask) = (
        _mm_cvtsi32_si128(mant as i32),
        _mm512_set1_epi32(emask as i32),
    );
    // The rows of the 64 contexts from `table.window` come from four registers by two
    // permutes and a blend instead of a gather: one gather per 16 lanes is left, the one on
    // the state chain. 16 lanes with a context outside gather their rows.
    let lo = table.window as usize;
    let mut rows_a = [JointDec::NONE; 64];
    for (k, r) in rows_a.iter_mut().enumerate() {
        *r = table.map.get(lo + k).copied().unwrap_or(JointDec::NONE);
    }
    let rt = [0, 16, 32, 48].map(|k| _mm512_loadu_si512(rows_a.as_ptr().add(k).cast()));
    let lo_v = _mm512_set1_epi32(lo as i32);
    let mut done = 0;
    while done < full {
        if guarded && st.len - pos < LANES {
            break;
        }
        let base = done;
        // Rows first (they depend only on the reference): off the state chain.
        let mut row = [_mm512_setzero_si512(); 2];
        for (h, r) in row.iter_mut().enumerate() {
            let ctx = ref_contexts::<T>(rp, base + 16 * h, mant, emask);
            let rel = _mm512_sub_epi32(ctx, lo_v);
            *r = if _mm512_cmpge_epu32_mask(rel, _mm512_set1_epi32(64)) == 0 {
                // `ctx - lo < 64`: the permutes read bits 0..5, the blend bit 5.
                let a = _mm512_permutex2var_epi32(rt[0], rel, rt[1]);
                let b = _mm512_permutex2var_epi32(rt[2], rel, rt[3]);
                _mm512_mask_blend_epi32(_mm512_test_epi32_mask(rel, _mm512_set1_epi32(32)), a, b)
            } else {
                // In bounds: contexts are below 512 <= `map.len()` (`vector_ok`).
                _mm512_i32gather_epi32::<4>(ctx, map.cast())
            };
            if _mm512_cmpeq_epi32_mask(*r, none) != 0 {
                return Err(no_row());
            }
        }
        for h in 0..2 {
            let slot = _mm512_and_si512(x[h], _mm512_set1_epi32(PROB_TOTAL as i32 - 1));
            // In bounds: rows are below the row count (`vector_ok`), slots below 2^12.
            let idx = _mm512_or_si512(_mm512_slli_epi32::<{ PROB_BITS }>(row[h]), slot);
            let e = _mm512_i32gather_epi32::<4>(idx, slots.cast());
            let f = _mm512_add_epi32(
                _mm512_and_si512(_mm512_srli_epi32::<8>(e), _mm512_set1_epi32(0xFFF)),
                _mm512_set1_epi32(1),
            );
            let xs = _mm512_add_epi32(
                _mm512_mullo_epi32(f, _mm512_srli_epi32::<{ PROB_BITS }>(x[h])),
                _mm512_srli_epi32::<20>(e),
            );
            // Lanes 0..16 refill before lanes 16..32: the portable lane order. In bounds:
            // `LANES` words are left (`guarded`) or padded.
            x[h] = refill(xs, words, &mut pos);
            let j = _mm512_and_si512(e, _mm512_set1_epi32(255));
            // 16-bit floats: J itself (`stores_j`), for the tail pass to expand 32 at a time.
            let c = if stores_j::<T>(Isa::Avx512) {
                j
            } else {
                code_of(j, small)
            };
            _mm512_storeu_si512(cp.add(base + 16 * h).cast(), c);
        }
        if pos > st.len {
            return Err(overrun());
        }
        done += LANES;
    }
    _mm512_storeu_si512(states.as_mut_ptr().cast(), x[0]);
    _mm512_storeu_si512(states.as_mut_ptr().add(16).cast(), x[1]);
    st.pos = pos;
    Ok(done)
}

/// One chunk, as `super::super::joint::encode_chunk` codes it, with AVX-512 lanes.
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL, CD (`Isa::Avx512` available).
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vl,avx512cd")]
pub unsafe fn encode_chunk<T: Word>(
    d: &[T],
    info: &[u16],
    flat: &JointFlat,
    s: &mut Scratch,
) -> EncodedChunk {
    // Each element's slot by the AVX2 level's pass (this level implies its features), so
    // the lanes only load and gather: on a Zen 5 the lanes that formed the slot themselves
    // (a context from the facts, a `vpmulld`) ran at 820-960 MB/s, AVX2's at 1,490.
    // SAFETY (both): the caller guarantees the features, AVX2's included (`Isa::available`).
    unsafe { super::super::avx2::joint::slots_and_tails(d, info, flat, s) };
    let (states, at) = unsafe { lanes(&s.codes, &flat.packed, &mut s.words) };
    s.chunk(at..s.codes.len(), states)
}

/// The interleaved lanes of one chunk of slots in `packed` (a flat table's, or the neighbor
/// form's rows); the words are left in `words[at..slots.len()]` in stream order (filled from
/// the end backwards, as `super::encode::lanes` does), `at` returned with the final states.
/// A slot past the table codes its last entry (the neighbor form's is the identity's).
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL.
#[target_feature(enable = "popcnt,avx512f,avx512bw,avx512vl")]
pub(super) unsafe fn lanes(
    slots: &[u32],
    packed: &[u32],
    words: &mut Vec<u16>,
) -> ([u32; LANES], usize) {
    // SAFETY: features as this function's.
    unsafe {
        lanes_by(
            slots.len(),
            words,
            #[inline(always)]
            |at: usize, valid: __mmask16| {
                // SAFETY: the lanes in `valid` are elements `at..` below `slots.len()`;
                // indices clamped inside the gather.
                let idx = _mm512_maskz_loadu_epi32(valid, slots.as_ptr().add(at).cast());
                gather_flat(packed, valid, idx)
            },
        )
    }
}

/// The interleaved lanes of one chunk of `n` elements whose packed symbols (`freq | start
/// << 16`) `syms(at, valid)` gives 16 at a time: elements `at..` in the lanes of `valid`
/// (those below `n`), the identity elsewhere. Words and states as [`lanes`].
///
/// # Safety
/// Inlined into a function with the features of [`lanes`]; `syms` must be safe to call for
/// every `at < n` with its `valid` mask.
#[inline(always)]
pub(super) unsafe fn lanes_by(
    n: usize,
    words: &mut Vec<u16>,
    syms: impl Fn(usize, __mmask16) -> __m512i,
) -> ([u32; LANES], usize) {
    // At most one word per symbol. Grown, never cleared: every slot from the final cursor
    // up is written.
    if words.len() < n {
        words.resize(n, 0);
    }
    let out = words.as_mut_ptr();
    let mut pos = n;
    let step_syms = inlined(
        #[inline(always)]
        |step: usize| -> [__m512i; 2] {
            let base = step * LANES;
            let lanes = LANES.min(n - base);
            let mut p = [_mm512_setzero_si512(); 2];
            for (k, p) in p.iter_mut().enumerate() {
                // Lanes of the upper half past the chunk's end have `cnt == 0`, `at == n`.
                let at = (base + 16 * k).min(n);
                let cnt = lanes.saturating_sub(16 * k).min(16);
                let valid: __mmask16 = ((1u32 << cnt) - 1) as __mmask16;
                *p = syms(at, valid);
            }
            p
        },
    );
    let mut x = [_mm512_set1_epi32(RANS_L as i32); 2];
    let steps = n.div_ceil(LANES);
    if steps == 0 {
        return ([RANS_L; LANES], n);
    }
    let mut next = step_syms(steps - 1);
    for step in (0..steps).rev() {
        // The next step's lookups are issued before this step's state chain.
        let cur = next;
        if step > 0 {
            next = step_syms(step - 1);
        }
        // SAFETY: `pos` never drops below 0: one word at most per symbol.
        unsafe { put2(&mut x, cur, out, &mut pos) };
    }
    let mut states = [0u32; LANES];
    // SAFETY: 2 × 16 `u32` into the 32 of `states`.
    unsafe {
        _mm512_storeu_si512(states.as_mut_ptr().cast(), x[0]);
        _mm512_storeu_si512(states.as_mut_ptr().add(16).cast(), x[1]);
    }
    (states, pos)
}

/// `f` itself, for [`lanes_by`]'s callers (as [`inlined`]).
#[inline(always)]
pub(super) fn inlined_syms<F: Fn(usize, __mmask16) -> __m512i>(f: F) -> F {
    f
}

/// `f` itself: lets a closure carry `#[inline(always)]` (and so this module's features).
#[inline(always)]
fn inlined<F: Fn(usize) -> [__m512i; 2]>(f: F) -> F {
    f
}
