//! AVX2 lanes of the Joint layout: `super::super::avx512::joint` on four 8-lane vectors,
//! with this module's refill (a byte shuffle keyed by the refill mask) and flush (a byte
//! shuffle keyed by the flush mask, block stores ending at the cursor).

#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;
use std::any::TypeId;

use super::super::decode::{no_row, Stream};
use super::super::encode::Scratch;
use super::super::joint::{context, small_codes, stores_j, JointDec, JointFlat, FLAT_STRIDE};
use super::super::word::Word;
use super::super::Isa;
use super::decode::{overrun, refill, u_of_joint8, AfterStep};
use super::encode::{
    codes_and_tails, first, flat_slots16, flat_slots32, gather_flat, load_u32, put4, SLACK,
};
use super::gather::gather8;
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::entropy::rans::RANS_L;
use crate::format::chunk::{EncodedChunk, LANES};
use crate::Result;

/// 8-lane vectors per chunk.
const NV: usize = LANES / 8;

/// Per-element codes of 8 joint symbols (as the AVX-512 `code_of`): by shifts of
/// `J + 17` above J = 6, from `small` (`small_codes()[..8]`) below 8.
#[inline(always)]
pub(super) unsafe fn code_of(j: __m256i, small: __m256i) -> __m256i {
    let u = _mm256_add_epi32(j, _mm256_set1_epi32(17));
    let c = _mm256_or_si256(
        _mm256_or_si256(
            _mm256_srli_epi32::<3>(u),
            _mm256_slli_epi32::<5>(_mm256_and_si256(u, _mm256_set1_epi32(4))),
        ),
        _mm256_or_si256(
            _mm256_slli_epi32::<7>(_mm256_and_si256(u, _mm256_set1_epi32(2))),
            _mm256_slli_epi32::<9>(_mm256_and_si256(u, _mm256_set1_epi32(1))),
        ),
    );
    // J < 8 (J is below 256: the signed compare is exact).
    let lt8 = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), j);
    _mm256_blendv_epi8(c, _mm256_permutevar8x32_epi32(small, j), lt8)
}

/// Whether a lane of `m` (the largest entries read) is `JointDec::POISON`.
#[inline(always)]
unsafe fn any_poison(m: __m256i) -> bool {
    let p = _mm256_cmpeq_epi32(m, _mm256_set1_epi32(JointDec::POISON as i32));
    _mm256_testz_si256(p, p) == 0
}

/// The states after decoding the slots' entries `e` (`J | (freq - 1) << 8 | (slot - start)
/// << 20`), refilled: vectors refill in lane order, as the portable lanes do.
///
/// # Safety
/// AVX2; 8 words readable at `words + pos` (`LANES` left, or padding).
#[inline(always)]
pub(super) unsafe fn step_state(
    x: __m256i,
    e: __m256i,
    words: *const u16,
    pos: &mut usize,
) -> __m256i {
    let f = _mm256_add_epi32(
        _mm256_and_si256(_mm256_srli_epi32::<8>(e), _mm256_set1_epi32(0xFFF)),
        _mm256_set1_epi32(1),
    );
    let xs = _mm256_add_epi32(
        _mm256_mullo_epi32(f, _mm256_srli_epi32::<{ PROB_BITS as i32 }>(x)),
        _mm256_srli_epi32::<20>(e),
    );
    refill(xs, words, pos)
}

/// [`step_state`] from `window_slots` entries (`J | (slot - start) << 8 | (freq - 1) <<
/// 20`): `freq·(x >> 12) + bias` as `(freq - 1)·(x >> 12) + ((x >> 12) + bias)`, the
/// frequency by one shift, so that the state waits on the gather for a shift, the multiply
/// and an add (on a Zen 5, where simple vector operations take 2 cycles, 4 cycles less
/// than the shift, mask and add before the multiply).
///
/// # Safety
/// As [`step_state`].
#[inline(always)]
unsafe fn step_window(x: __m256i, e: __m256i, words: *const u16, pos: &mut usize) -> __m256i {
    let hi = _mm256_srli_epi32::<{ PROB_BITS as i32 }>(x);
    let bias = _mm256_and_si256(_mm256_srli_epi32::<8>(e), _mm256_set1_epi32(0xFFF));
    let xs = _mm256_add_epi32(
        _mm256_mullo_epi32(_mm256_srli_epi32::<20>(e), hi),
        _mm256_add_epi32(hi, bias),
    );
    refill(xs, words, pos)
}

/// Store 8 entries' symbols at `to`: for 32-bit floats J itself (`stores_j`), for the tail
/// pass to expand; for 16-bit floats `u_of_joint` of J (`window` entries hold it already);
/// else their per-element codes.
///
/// # Safety
/// AVX2; 8 `u32` writable at `to`.
#[inline(always)]
unsafe fn store<T: Word>(to: *mut u32, e: __m256i, small: __m256i, window: bool) {
    let j = _mm256_and_si256(e, _mm256_set1_epi32(255));
    let c = if T::BITS == 16 && !window {
        u_of_joint8(j)
    } else if stores_j::<T>(Isa::Avx2) {
        j
    } else {
        code_of(j, small)
    };
    _mm256_storeu_si256(to.cast(), c);
}

/// The J contexts of elements `j..j + 8` of `reference` (as the AVX-512 `ref_contexts`).
#[inline(always)]
unsafe fn ref_contexts<T: Word>(rp: *const u8, j: usize, mant: __m128i, emask: __m256i) -> __m256i {
    let r = match T::BITS {
        8 => _mm256_cvtepu8_epi32(_mm_loadl_epi64(rp.add(j).cast())),
        16 => _mm256_cvtepu16_epi32(_mm_loadu_si128(rp.add(2 * j).cast())),
        _ => _mm256_loadu_si256(rp.add(4 * j).cast()),
    };
    let er = _mm256_and_si256(_mm256_srl_epi32(r, mant), emask);
    let sign = _mm256_srl_epi32(r, _mm_cvtsi32_si128(T::BITS as i32 - 1));
    _mm256_or_si256(_mm256_slli_epi32::<1>(er), sign)
}

/// The J contexts of elements `j..j + LANES` of `reference`, their offsets from the window's
/// first (`lo`), and whether every one falls in the window's 64.
#[inline(always)]
unsafe fn contexts<T: Word>(
    rp: *const u8,
    j: usize,
    (mant, emask): (__m128i, __m256i),
    lo: __m256i,
) -> ([__m256i; NV], [__m256i; NV], bool) {
    let mut ctx = [_mm256_setzero_si256(); NV];
    let mut rel = [_mm256_setzero_si256(); NV];
    let mut any = _mm256_setzero_si256();
    for v in 0..NV {
        ctx[v] = ref_contexts::<T>(rp, j + 8 * v, mant, emask);
        rel[v] = _mm256_sub_epi32(ctx[v], lo);
        any = _mm256_or_si256(any, rel[v]);
    }
    let in_window = _mm256_testz_si256(any, _mm256_set1_epi32(!63)) != 0;
    (ctx, rel, in_window)
}

/// The error of a step that read past the stream: a context without a row where one was
/// read (the largest entry `POISON`), which decoding on past it may have caused, else the
/// overrun itself.
#[inline(always)]
unsafe fn past_end(poisoned: __m256i) -> crate::Error {
    if any_poison(poisoned) {
        no_row()
    } else {
        overrun()
    }
}

/// Decode whole steps of the chunk from its start, as the AVX-512 `decode` does (same
/// arguments, same result: joint symbols where `stores_j`, else per-element codes), handing
/// `after` the codes stored before each step.
///
/// # Safety
/// The CPU must have AVX2, BMI1, BMI2, LZCNT, POPCNT and PCLMULQDQ (`Isa::Avx2`
/// available); `T` at most 32 bits; unless `guarded`, `st.words` must hold `LANES` padding
/// words past `st.len`.
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn decode<T: Word, A: AfterStep>(
    table: &JointDec,
    reference: &[u8],
    (mant, emask): (u32, u32),
    codes: &mut [u32],
    states: &mut [u32; LANES],
    st: &mut Stream,
    guarded: bool,
    after: &mut A,
) -> Result<usize> {
    let n = codes.len().min(reference.len() / T::SIZE);
    let full = n / LANES * LANES;
    if full == 0 || !table.vector_ok || T::BITS > 32 {
        return Ok(0);
    }
    assert!(st.words.len() >= st.len + if guarded { 0 } else { LANES } && st.pos <= st.len);
    let words = st.words.as_ptr();
    let mut pos = st.pos;
    let mut x = [_mm256_setzero_si256(); NV];
    for (v, xv) in x.iter_mut().enumerate() {
        *xv = _mm256_loadu_si256(states.as_ptr().add(8 * v).cast());
    }
    let small_a = small_codes();
    let small = _mm256_loadu_si256(small_a.as_ptr().cast());
    let (map, slots) = (table.map.as_ptr(), table.slots.as_ptr());
    let none = _mm256_set1_epi32(JointDec::NONE as i32);
    let (rp, cp) = (reference.as_ptr(), codes.as_mut_ptr());
    let emask_raw = emask;
    let (mant, emask) = (
        _mm_cvtsi32_si128(mant as i32),
        _mm256_set1_epi32(emask as i32),
    );
    // The rows of the 64 contexts from `table.window`, as bytes (255: none) in two 32-byte
    // registers, where every row number fits: a step whose contexts all fall in the window
    // finds each vector's rows by two dword permutes, a blend and a shift instead of a
    // gather (the map gathers were a fifth of these lanes' samples). Other steps gather.
    let lo = table.window as usize;
    let mut rows_b = [0u8; 64];
    let mut window_ok = true;
    for (k, r) in rows_b.iter_mut().enumerate() {
        *r = match table.map.get(lo + k).copied().unwrap_or(JointDec::NONE) {
            JointDec::NONE => 255,
            r if r < 255 => r as u8,
            _ => {
                window_ok = false;
                0
            }
        };
    }
    let rt = [
        _mm256_loadu_si256(rows_b.as_ptr().cast()),
        _mm256_loadu_si256(rows_b.as_ptr().add(32).cast()),
    ];
    let lo_v = _mm256_set1_epi32(lo as i32);
    let (lo16, emask16, outside16) = (
        _mm256_set1_epi16(lo as i16),
        _mm256_set1_epi16(emask_raw as i16),
        _mm256_set1_epi16(!63),
    );
    let byte_none = _mm256_set1_epi32(255);
    let (by_ctx, wslots) = (!table.window_slots.is_empty(), table.window_slots.as_ptr());
    // The largest entry read from `window_slots`, checked once at the end: `POISON`
    // (`u32::MAX`) where some lane's context had no row. Decoding on past one is safe (every
    // index stays in its table, `pos` is checked per step) and its result is dropped.
    let mut poisoned = _mm256_setzero_si256();
    let mut done = 0;
    while done < full {
        if guarded && st.len - pos < LANES {
            break;
        }
        after.after(cp, done);
        let base = done;
        // Rows first (they depend only on the reference): off the state chain.
        let (ctx, rel, in_window) = contexts::<T>(rp, base, (mant, emask), lo_v);
        if by_ctx && in_window {
            // Slots by context: no row lookup; a context without a row reads `POISON`.
            // Its own loop while the steps stay in the window: the states stay in
            // registers.
            let mut xs = x;
            let mut rel12 = [_mm256_setzero_si256(); NV];
            for v in 0..NV {
                rel12[v] = _mm256_slli_epi32::<{ PROB_BITS as i32 }>(rel[v]);
            }
            loop {
                let base = done;
                // The four vectors' lookups first, then their state updates, so that a
                // step's 32 scalar loads sit together in program order instead of each
                // vector's loads waiting behind the previous vector's update (a step is some
                // 500 instructions with the tail pass, more than the reorder window: likely
                // why it pays). On a Zen 2, over three code placements, +0–9% fp32 and
                // +0–7% bf16 (docs/BENCHMARKS.md).
                let mut e = [_mm256_setzero_si256(); NV];
                for v in 0..NV {
                    let slot = _mm256_and_si256(xs[v], _mm256_set1_epi32(PROB_TOTAL as i32 - 1));
                    // In bounds: `rel` < 64, slots below 2^12.
                    let idx = _mm256_or_si256(rel12[v], slot);
                    e[v] = gather8(wslots.cast(), idx);
                }
                for v in 0..NV {
                    poisoned = _mm256_max_epu32(poisoned, e[v]);
                    xs[v] = step_window(xs[v], e[v], words, &mut pos);
                    store::<T>(cp.add(base + 8 * v), e[v], small, true);
                }
                if pos > st.len {
                    return Err(past_end(poisoned));
                }
                done += LANES;
                if done >= full || (guarded && st.len - pos < LANES) {
                    break;
                }
                after.after(cp, done);
                if T::BITS == 16 {
                    // 16 contexts a vector in 16-bit lanes (every context is below 2^9),
                    // widened for the index: 11 operations a step fewer than 8 at a time.
                    let mut any = _mm256_setzero_si256();
                    let mut r16 = [_mm256_setzero_si256(); 2];
                    for (h, r16) in r16.iter_mut().enumerate() {
                        let r = _mm256_loadu_si256(rp.add(2 * (done + 16 * h)).cast());
                        let er = _mm256_and_si256(_mm256_srl_epi16(r, mant), emask16);
                        let ctx =
                            _mm256_add_epi16(_mm256_add_epi16(er, er), _mm256_srli_epi16::<15>(r));
                        *r16 = _mm256_sub_epi16(ctx, lo16);
                        any = _mm256_or_si256(any, *r16);
                    }
                    if _mm256_testz_si256(any, outside16) == 0 {
                        break;
                    }
                    for (h, r16) in r16.iter().enumerate() {
                        let lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(*r16));
                        let hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256::<1>(*r16));
                        rel12[2 * h] = _mm256_slli_epi32::<{ PROB_BITS as i32 }>(lo);
                        rel12[2 * h + 1] = _mm256_slli_epi32::<{ PROB_BITS as i32 }>(hi);
                    }
                } else {
                    let (_, rel, in_window) = contexts::<T>(rp, done, (mant, emask), lo_v);
                    if !in_window {
                        break;
                    }
                    for v in 0..NV {
                        rel12[v] = _mm256_slli_epi32::<{ PROB_BITS as i32 }>(rel[v]);
                    }
                }
            }
            x = xs;
            continue;
        }
        let mut row = [_mm256_setzero_si256(); NV];
        let mut missing = _mm256_setzero_si256();
        if window_ok && in_window {
            for v in 0..NV {
                // `rel` < 64: the dword holding its byte (`rel >> 2`, the permutes read the
                // low 3 bits) from both halves, bit 5 picking the half, then the byte.
                let q = _mm256_srli_epi32::<2>(rel[v]);
                let d = _mm256_castps_si256(_mm256_blendv_ps(
                    _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(rt[0], q)),
                    _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(rt[1], q)),
                    _mm256_castsi256_ps(_mm256_slli_epi32::<26>(rel[v])),
                ));
                let sh = _mm256_slli_epi32::<3>(_mm256_and_si256(rel[v], _mm256_set1_epi32(3)));
                row[v] = _mm256_and_si256(_mm256_srlv_epi32(d, sh), byte_none);
                missing = _mm256_or_si256(missing, _mm256_cmpeq_epi32(row[v], byte_none));
            }
        } else {
            for v in 0..NV {
                // In bounds: contexts are below 512 <= `map.len()` (`vector_ok`).
                row[v] = _mm256_i32gather_epi32::<4>(map.cast(), ctx[v]);
                missing = _mm256_or_si256(missing, _mm256_cmpeq_epi32(row[v], none));
            }
        }
        if _mm256_testz_si256(missing, missing) == 0 {
            return Err(no_row());
        }
        for v in 0..NV {
            let slot = _mm256_and_si256(x[v], _mm256_set1_epi32(PROB_TOTAL as i32 - 1));
            // In bounds: rows are below the row count (`vector_ok`), slots below 2^12.
            let idx = _mm256_or_si256(_mm256_slli_epi32::<{ PROB_BITS as i32 }>(row[v]), slot);
            let e = gather8(slots.cast(), idx);
            x[v] = step_state(x[v], e, words, &mut pos);
            store::<T>(cp.add(base + 8 * v), e, small, false);
        }
        if pos > st.len {
            return Err(past_end(poisoned));
        }
        done += LANES;
    }
    if any_poison(poisoned) {
        return Err(no_row());
    }
    for (v, xv) in x.iter().enumerate() {
        _mm256_storeu_si256(states.as_mut_ptr().add(8 * v).cast(), *xv);
    }
    st.pos = pos;
    Ok(done)
}

/// One chunk, as `super::super::joint::encode_chunk` codes it, with AVX2 lanes.
///
/// # Safety
/// The CPU must support AVX2, BMI1, BMI2, LZCNT, POPCNT (`Isa::Avx2` available).
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
pub unsafe fn encode_chunk<T: Word>(
    d: &[T],
    info: &[u16],
    flat: &JointFlat,
    s: &mut Scratch,
) -> EncodedChunk {
    // SAFETY (both): the caller guarantees the features.
    unsafe { slots_and_tails(d, info, flat, s) };
    // Scalar loads even where gathers are fast: on an Intel with fast ones they measured
    // no gain here (unlike in the neighbor form's encoder, `joint_near::encode_chunk`).
    let (states, at) = unsafe { lanes(&s.codes, &flat.packed, false, &mut s.words) };
    s.chunk(at..SLACK + s.codes.len(), states)
}

/// Each element's slot in `flat` (not its code) into `s.codes`, and the raw tails into
/// `s.tail`: the lanes then only gather. The AVX-512 lanes take them too (that level
/// implies these features).
///
/// # Safety
/// The CPU must support AVX2, BMI1, BMI2, LZCNT, POPCNT (`Isa::Avx2` available).
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
pub(in crate::backend::cpu) unsafe fn slots_and_tails<T: Word>(
    d: &[T],
    info: &[u16],
    flat: &JointFlat,
    s: &mut Scratch,
) {
    s.tail.clear();
    let lo2 = 2 * flat.lo;
    // SAFETY (all three): the caller guarantees the features; `T` is the width cast to.
    unsafe {
        if TypeId::of::<T>() == TypeId::of::<u16>() {
            let d = std::slice::from_raw_parts(d.as_ptr().cast::<u16>(), d.len());
            flat_slots16(d, info, lo2, &mut s.codes, &mut s.tail);
        } else if TypeId::of::<T>() == TypeId::of::<u32>() {
            let d = std::slice::from_raw_parts(d.as_ptr().cast::<u32>(), d.len());
            flat_slots32(d, info, lo2, &mut s.codes, &mut s.tail);
        } else {
            codes_and_tails(d, true, s);
            for (c, &i) in s.codes.iter_mut().zip(info) {
                *c = (context(i) as u32).wrapping_sub(lo2) * FLAT_STRIDE as u32
                    + (*c & 127) * 8
                    + (*c >> 7 & 7);
            }
        }
    }
}

/// The interleaved lanes of one chunk of indices into `packed` (a flat table's, or the
/// Joint neighbor form's rows); the words are left in `words[at..SLACK + slots.len()]` in
/// stream order, `at` returned with the final states. Whole vectors' lookups by `vpgatherdd`
/// where `gathers`, else by scalar loads ([`gather8`]): a flag, not a const parameter, so
/// one copy of the loop keeps [`put4`] inlined (two copies left it a call).
///
/// # Safety
/// The CPU must support AVX2 and POPCNT.
#[target_feature(enable = "avx2,popcnt")]
pub(super) unsafe fn lanes(
    slots: &[u32],
    packed: &[u32],
    gathers: bool,
    words: &mut Vec<u16>,
) -> ([u32; LANES], usize) {
    let n = slots.len();
    // At most one word per symbol, and the slack below. Grown, never cleared: every slot
    // from the final cursor up is written.
    let end = SLACK + n;
    if words.len() < end {
        words.resize(end, 0);
    }
    let out = words.as_mut_ptr();
    let mut pos = end;
    let syms = inlined(
        #[inline(always)]
        |step: usize| -> [__m256i; NV] {
            let base = step * LANES;
            let lanes = LANES.min(n - base);
            let mut p = [_mm256_set1_epi32(PROB_TOTAL as i32); NV];
            for (k, p) in p.iter_mut().enumerate() {
                // Vectors past the chunk's end code the identity in every lane.
                let at = base + 8 * k;
                let cnt = lanes.saturating_sub(8 * k).min(8);
                if cnt == 0 {
                    continue;
                }
                let idx = load_u32(slots, at, cnt);
                // Whole vectors as `gathers` says (scalar loads: slow gathers on Zen 2); the
                // chunk's last, partial one by the masked gather that `gather_flat` shares
                // with the AVX-512 encoder, not changed here (not measurable here).
                // SAFETY: features as this function's; indices clamped to the table.
                *p = unsafe {
                    if cnt == 8 {
                        let last = _mm256_set1_epi32(packed.len() as i32 - 1);
                        let idx = _mm256_min_epu32(idx, last);
                        if gathers {
                            _mm256_i32gather_epi32::<4>(packed.as_ptr().cast(), idx)
                        } else {
                            gather8(packed.as_ptr(), idx)
                        }
                    } else {
                        gather_flat(packed, first(cnt), idx)
                    }
                };
            }
            p
        },
    );
    let mut x = [_mm256_set1_epi32(RANS_L as i32); NV];
    let steps = n.div_ceil(LANES);
    if steps == 0 {
        return ([RANS_L; LANES], end);
    }
    let mut next = syms(steps - 1);
    for step in (0..steps).rev() {
        let cur = next;
        if step > 0 {
            next = syms(step - 1);
        }
        // SAFETY: `pos` never drops below `SLACK`: one word at most per symbol.
        unsafe { put4(&mut x, cur, out, &mut pos) };
    }
    let mut states = [0u32; LANES];
    // SAFETY: 4 × 8 `u32` into the 32 of `states`.
    unsafe {
        for (h, x) in x.iter().enumerate() {
            _mm256_storeu_si256(states.as_mut_ptr().add(8 * h).cast(), *x);
        }
    }
    (states, pos)
}

/// `f` itself: lets a closure carry `#[inline(always)]` (and so this module's features).
#[inline(always)]
fn inlined<F: Fn(usize) -> [__m256i; NV]>(f: F) -> F {
    f
}
