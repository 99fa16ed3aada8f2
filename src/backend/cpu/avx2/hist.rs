//! The encoder's residuals at AVX2 (`residuals`, `displacements`: a chunk's where a pass
//! uses them), and the `--fast` encoder's first pass (`super::super::joint::residual_histogram`):
//! displacements, reference facts and the Joint histogram's counts in one pass, 16 elements
//! a step for 16-bit floats, 8 for 32-bit ones. Before, the residual pass (compiled from the
//! portable loop, it ran in 64-bit lanes) wrote both buffers and the count read them back,
//! with a bit length built from nibble lookups and bounds-checked increments: 27% of a bf16
//! encode on an Intel Xeon.
//!
//! Each element's slot (`joint::flat_index`) from its displacement's float conversion: for
//! `v < 2^24` the bits of `v as f32` shifted right by 21 are `4·e + 2·q1 + q2`, with the
//! biased exponent `e = 126 + b` (0 for `v = 0`), so one conversion gives b, Q1 and Q2.
//! 32-bit displacements convert with rounding, so there b comes from the conversion of
//! `v & !(v >> 1)` (as in `super::encode::codes32`) and the top three bits from shifts.

#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;
use std::any::TypeId;

use super::super::joint::{flat_index, FLAT_STRIDE};
use super::super::word::{self, InfoFn, Word};
use super::crc::Running;

/// The lowest and highest exponent class of `reference`'s elements (`(0, 0)` when empty),
/// as `joint::er_range` finds them in the facts: `(r >> mant) & emask` of each element.
/// (The loop over `T::read` compiled to 64-bit lanes: 3% of a bf16 encode.)
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn er_range_of<T: Word>(reference: &[u8], (mant, emask): (u32, u32)) -> (usize, usize) {
    let n = reference.len() / T::SIZE;
    let rp = reference.as_ptr();
    let sh = _mm_cvtsi32_si128(mant as i32);
    // Classes are at most 8 bits (16- and 32-bit floats are not `wide`).
    let (mut lo, mut hi) = (u8::MAX, 0u8);
    let full = if T::BITS == 16 || T::BITS == 32 {
        n / 16 * 16
    } else {
        0
    };
    let m = _mm256_set1_epi32(emask as i32 | (emask as i32) << 16);
    let (mut vlo, mut vhi) = (_mm256_set1_epi8(-1), _mm256_setzero_si256());
    for at in (0..full).step_by(16) {
        // SAFETY: `at + 16 <= n` elements of `reference`.
        let e = unsafe {
            if T::BITS == 16 {
                _mm256_and_si256(
                    _mm256_srl_epi16(_mm256_loadu_si256(rp.add(2 * at).cast()), sh),
                    m,
                )
            } else {
                let a = _mm256_srl_epi32(_mm256_loadu_si256(rp.add(4 * at).cast()), sh);
                let b = _mm256_srl_epi32(_mm256_loadu_si256(rp.add(4 * at + 32).cast()), sh);
                // Masked to at most 8 bits, so the pack's saturation never applies; its
                // order does not matter here.
                _mm256_and_si256(_mm256_packus_epi32(a, b), m)
            }
        };
        vlo = _mm256_min_epu16(vlo, e);
        vhi = _mm256_max_epu16(vhi, e);
    }
    let (mut l, mut h) = ([0u16; 16], [0u16; 16]);
    // SAFETY: 16 `u16` each.
    unsafe {
        _mm256_storeu_si256(l.as_mut_ptr().cast(), vlo);
        _mm256_storeu_si256(h.as_mut_ptr().cast(), vhi);
    }
    if full > 0 {
        lo = l.iter().map(|&v| v as u8).min().unwrap_or(lo);
        hi = h.iter().map(|&v| v as u8).max().unwrap_or(hi);
    }
    for r in reference[full * T::SIZE..].chunks_exact(T::SIZE) {
        let e = ((T::read(r) as u32) >> mant & emask) as u8;
        lo = lo.min(e);
        hi = hi.max(e);
    }
    if lo > hi {
        (0, 0)
    } else {
        (lo as usize, hi as usize)
    }
}

/// One chunk: `d` and `info` of the elements whose bytes are `r` (reference) and `x`
/// (target), as `super::super::residual_chunk` writes them, and each element's slot
/// counted into the four tables of `sub` (`sub.len() / 4` slots each, `lo2` the lowest
/// context of the tensor's reference); returns the lowest and highest exponent class of
/// `r`'s elements (`(255, 0)` when none).
///
/// # Safety
/// The CPU must have AVX2; `T` is `u16` or `u32` (others return at once), `info_fn` not
/// `wide`; every context of `r` is at least `lo2` and below `lo2 + sub.len() / 4 /
/// FLAT_STRIDE` (indices are clamped into the tables whatever the input, so a violation
/// miscounts, never writes outside them).
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn residual_count<T: Word>(
    r: &[u8],
    x: &[u8],
    d: &mut [T],
    info: &mut [u16],
    info_fn: InfoFn,
    lo2: u32,
    sub: &mut [u32],
    crcs: &mut [Running; 2],
) -> (u8, u8) {
    residual_pass::<T, true, true>(r, x, d, info, info_fn, lo2, sub, crcs)
}

/// [`residual_count`] without the counting: the displacements, facts, exponent-class range
/// and the inputs' CRC-32s of the layouts whose histograms another pass counts.
///
/// # Safety
/// As [`residual_count`].
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
pub unsafe fn residuals<T: Word>(
    r: &[u8],
    x: &[u8],
    d: &mut [T],
    info: &mut [u16],
    info_fn: InfoFn,
    crcs: &mut [Running; 2],
) -> (u8, u8) {
    residual_pass::<T, false, true>(r, x, d, info, info_fn, 0, &mut [], crcs)
}

/// [`residuals`] without the CRC-32s: a chunk's displacements and facts where a pass uses
/// them (the encoder computes them again per chunk rather than keep a whole tensor's).
///
/// # Safety
/// As [`residual_count`].
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
pub unsafe fn displacements<T: Word>(
    r: &[u8],
    x: &[u8],
    d: &mut [T],
    info: &mut [u16],
    info_fn: InfoFn,
) {
    let mut unused = [Running::new(), Running::new()];
    residual_pass::<T, false, false>(r, x, d, info, info_fn, 0, &mut [], &mut unused);
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn residual_pass<T: Word, const COUNT: bool, const CRC: bool>(
    r: &[u8],
    x: &[u8],
    d: &mut [T],
    info: &mut [u16],
    info_fn: InfoFn,
    lo2: u32,
    sub: &mut [u32],
    crcs: &mut [Running; 2],
) -> (u8, u8) {
    let n = d
        .len()
        .min(info.len())
        .min(r.len() / T::SIZE)
        .min(x.len() / T::SIZE);
    let size = sub.len() / 4;
    if (COUNT && size == 0) || !matches!(T::BITS, 16 | 32) {
        if CRC {
            crcs[0].update(r);
            crcs[1].update(x);
        }
        return (u8::MAX, 0);
    }
    let s = sub.as_mut_ptr();
    let tables = [s, s.add(size), s.add(2 * size), s.add(3 * size)];
    let (dp, ip) = (d.as_mut_ptr(), info.as_mut_ptr());
    // SAFETY (both): `n` elements of every buffer; `T` checked to be the width used.
    let (done, mut lo, mut hi) = if TypeId::of::<T>() == TypeId::of::<u16>() {
        unsafe { step16::<COUNT, CRC>(r, x, dp.cast(), ip, n, info_fn, lo2, size, tables, crcs) }
    } else if TypeId::of::<T>() == TypeId::of::<u32>() {
        unsafe { step32::<COUNT, CRC>(r, x, dp.cast(), ip, n, info_fn, lo2, size, tables, crcs) }
    } else {
        return (u8::MAX, 0);
    };
    // The inputs' CRC-32s: the steps folded theirs, the rest (and anything past the last
    // whole element) hashed here.
    if CRC {
        crcs[0].update(&r[done * T::SIZE..]);
        crcs[1].update(&x[done * T::SIZE..]);
    }
    // The last partial step, as the portable passes do it.
    let cond = info_fn.condition();
    for j in done..n {
        let (rv, xv) = (
            T::read(&r[j * T::SIZE..][..T::SIZE]),
            T::read(&x[j * T::SIZE..][..T::SIZE]),
        );
        let k = word::key::<T>(xv).wrapping_sub(word::key::<T>(rv)) & word::mask::<T>();
        let i = if cond {
            info_fn.info_as::<T, true, false>(rv)
        } else {
            info_fn.info_as::<T, false, false>(rv)
        } as u16;
        d[j] = T::from_u64(k);
        info[j] = i;
        (lo, hi) = (lo.min(i as u8), hi.max(i as u8));
        if COUNT {
            let slot = (flat_index(T::from_u64(k), i, lo2) as usize).min(size - 1);
            *tables[0].add(slot) += 1;
        }
    }
    (lo, hi)
}

/// The lowest and highest of the low bytes of `lo` and `hi` (16-bit lanes, `(255, 0)` before
/// any step).
#[inline]
#[target_feature(enable = "avx2")]
fn byte_min_max(lo: __m256i, hi: __m256i) -> (u8, u8) {
    let (mut l, mut h) = ([0u16; 16], [0u16; 16]);
    // SAFETY: 16 `u16` each.
    unsafe {
        _mm256_storeu_si256(l.as_mut_ptr().cast(), lo);
        _mm256_storeu_si256(h.as_mut_ptr().cast(), hi);
    }
    (
        l.iter().map(|&v| v as u8).min().unwrap_or(u8::MAX),
        h.iter().map(|&v| v as u8).max().unwrap_or(0),
    )
}

/// Count 16 slots (two vectors of 8 `u32`), four per table in turn, clamped to `size`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn count16(a: __m256i, b: __m256i, size: usize, t: [*mut u32; 4]) {
    let top = _mm256_set1_epi32(size as i32 - 1);
    let mut k = [0u32; 16];
    _mm256_storeu_si256(k.as_mut_ptr().cast(), _mm256_min_epu32(a, top));
    _mm256_storeu_si256(k.as_mut_ptr().add(8).cast(), _mm256_min_epu32(b, top));
    for q in k.chunks_exact(4) {
        *t[0].add(q[0] as usize) += 1;
        *t[1].add(q[1] as usize) += 1;
        *t[2].add(q[2] as usize) += 1;
        *t[3].add(q[3] as usize) += 1;
    }
}

/// `FLAT_STRIDE·(ctx) + slot` in 32-bit lanes from 16-bit `slot` and `ctx` (both below
/// 2^15): one multiply-add per pair, low and high halves in the in-lane unpack order.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn slot_ctx(slot: __m256i, ctx: __m256i) -> (__m256i, __m256i) {
    let w = _mm256_set1_epi32(1 | (FLAT_STRIDE as i32) << 16);
    (
        _mm256_madd_epi16(_mm256_unpacklo_epi16(slot, ctx), w),
        _mm256_madd_epi16(_mm256_unpackhi_epi16(slot, ctx), w),
    )
}

/// The J contexts `er·2 + rs` of 16 elements' reference facts (16-bit lanes).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn contexts16(inf: __m256i) -> __m256i {
    _mm256_or_si256(
        _mm256_slli_epi16::<1>(_mm256_and_si256(inf, _mm256_set1_epi16(255))),
        _mm256_and_si256(_mm256_srli_epi16::<8>(inf), _mm256_set1_epi16(1)),
    )
}

/// `8·b + q1 + 2·q2 + 4·neg` from `t = 4·b + 2·q1 + q2` and `neg` (0 or 1), 16-bit lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn slot_of(t: __m256i, neg: __m256i) -> __m256i {
    let one = _mm256_set1_epi16(1);
    _mm256_or_si256(
        _mm256_or_si256(
            _mm256_slli_epi16::<1>(_mm256_andnot_si256(_mm256_set1_epi16(3), t)),
            _mm256_and_si256(_mm256_srli_epi16::<1>(t), one),
        ),
        _mm256_or_si256(
            _mm256_slli_epi16::<1>(_mm256_and_si256(t, one)),
            _mm256_slli_epi16::<2>(neg),
        ),
    )
}

/// 16-bit floats, 16 elements a step; returns how many were done and the lowest and highest
/// exponent class among them.
#[inline]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
#[allow(clippy::too_many_arguments)]
unsafe fn step16<const COUNT: bool, const CRC: bool>(
    r: &[u8],
    x: &[u8],
    d: *mut u16,
    info: *mut u16,
    n: usize,
    info_fn: InfoFn,
    lo2: u32,
    size: usize,
    t: [*mut u32; 4],
    crcs: &mut [Running; 2],
) -> (usize, u8, u8) {
    let (mant, emask) = info_fn.joint_params();
    let (rp, xp) = (r.as_ptr(), x.as_ptr());
    let (mut vlo, mut vhi) = (_mm256_set1_epi16(255), _mm256_setzero_si256());
    let mant_v = _mm_cvtsi32_si128(mant as i32);
    let mant2_v = _mm_cvtsi32_si128(mant as i32 - 2);
    let emask_v = _mm256_set1_epi16(emask as i16);
    let (zero, three) = (_mm256_setzero_si256(), _mm256_set1_epi16(3));
    let lo2_v = _mm256_set1_epi16(lo2 as i16);
    // `4·126`: `4·e + 2·q1 + q2` less this (saturating) is `4·b + 2·q1 + q2`, 0 for v = 0.
    let bias = _mm256_set1_epi16(4 * 126);
    let full = n / 16 * 16;
    let mut j = 0;
    while j < full {
        let rv = _mm256_loadu_si256(rp.add(2 * j).cast());
        let xv = _mm256_loadu_si256(xp.add(2 * j).cast());
        if CRC {
            crcs[0].add32(rv);
            crcs[1].add32(xv);
        }
        let dv = _mm256_sub_epi16(key16(xv), key16(rv));
        _mm256_storeu_si256(d.add(j).cast(), dv);
        let er = _mm256_and_si256(_mm256_srl_epi16(rv, mant_v), emask_v);
        (vlo, vhi) = (_mm256_min_epu16(vlo, er), _mm256_max_epu16(vhi, er));
        let sign = _mm256_srli_epi16::<15>(rv);
        let m2 = _mm256_and_si256(_mm256_srl_epi16(rv, mant2_v), three);
        let inf = _mm256_or_si256(
            _mm256_or_si256(er, _mm256_slli_epi16::<8>(sign)),
            _mm256_slli_epi16::<9>(m2),
        );
        _mm256_storeu_si256(info.add(j).cast(), inf);
        // |sd| (-2^15 gives 2^15 as unsigned, b = 16) and the sign.
        let v = _mm256_abs_epi16(dv);
        let neg = _mm256_srli_epi16::<15>(dv);
        let tq = _mm256_packus_epi32(
            exp_q(_mm256_unpacklo_epi16(v, zero)),
            exp_q(_mm256_unpackhi_epi16(v, zero)),
        );
        if COUNT {
            let slot = slot_of(_mm256_subs_epu16(tq, bias), neg);
            let ctx = _mm256_sub_epi16(_mm256_or_si256(_mm256_slli_epi16::<1>(er), sign), lo2_v);
            let (a, b) = slot_ctx(slot, ctx);
            count16(a, b, size, t);
        }
        j += 16;
    }
    let (lo, hi) = byte_min_max(vlo, vhi);
    (full, lo, hi)
}

/// 32-bit floats, 8 elements a step (two vectors per count); returns how many were done and
/// the lowest and highest exponent class among them.
#[inline]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
#[allow(clippy::too_many_arguments)]
unsafe fn step32<const COUNT: bool, const CRC: bool>(
    r: &[u8],
    x: &[u8],
    d: *mut u32,
    info: *mut u16,
    n: usize,
    info_fn: InfoFn,
    lo2: u32,
    size: usize,
    t: [*mut u32; 4],
    crcs: &mut [Running; 2],
) -> (usize, u8, u8) {
    let (mant, emask) = info_fn.joint_params();
    let (rp, xp) = (r.as_ptr(), x.as_ptr());
    let (mut vlo, mut vhi) = (_mm256_set1_epi16(255), _mm256_setzero_si256());
    let c = Consts32 {
        mant: _mm_cvtsi32_si128(mant as i32),
        mant2: _mm_cvtsi32_si128(mant as i32 - 2),
        emask: _mm256_set1_epi32(emask as i32),
        lo2: _mm256_set1_epi32(lo2 as i32),
    };
    let full = n / 16 * 16;
    let mut j = 0;
    while j < full {
        for k in (0..2).filter(|_| CRC) {
            crcs[0].add32(_mm256_loadu_si256(rp.add(4 * j + 32 * k).cast()));
            crcs[1].add32(_mm256_loadu_si256(xp.add(4 * j + 32 * k).cast()));
        }
        let (ia, sa) = vec32(rp.add(4 * j), xp.add(4 * j), d.add(j), &c);
        let (ib, sb) = vec32(rp.add(4 * j + 32), xp.add(4 * j + 32), d.add(j + 8), &c);
        // Facts of 16 elements as `u16`: the pack interleaves the 128-bit halves.
        let inf = _mm256_permute4x64_epi64::<0xD8>(_mm256_packus_epi32(ia, ib));
        _mm256_storeu_si256(info.add(j).cast(), inf);
        // The classes are the facts' low bytes.
        (vlo, vhi) = (_mm256_min_epu8(vlo, inf), _mm256_max_epu8(vhi, inf));
        if COUNT {
            count16(sa, sb, size, t);
        }
        j += 16;
    }
    let (lo, hi) = byte_min_max(vlo, vhi);
    (full, lo, hi)
}

/// The ordered-integer key (`word::key`) of 16 16-bit floats.
#[inline]
#[target_feature(enable = "avx2")]
fn key16(u: __m256i) -> __m256i {
    _mm256_xor_si256(
        u,
        _mm256_or_si256(_mm256_srai_epi16::<15>(u), _mm256_set1_epi16(i16::MIN)),
    )
}

/// The ordered-integer key of 8 32-bit floats.
#[inline]
#[target_feature(enable = "avx2")]
fn key32(u: __m256i) -> __m256i {
    _mm256_xor_si256(
        u,
        _mm256_or_si256(_mm256_srai_epi32::<31>(u), _mm256_set1_epi32(i32::MIN)),
    )
}

/// `4·e + 2·q1 + q2` of 8 values below 2^24 (32-bit lanes): their float's top bits.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn exp_q(v: __m256i) -> __m256i {
    _mm256_srli_epi32::<21>(_mm256_castps_si256(_mm256_cvtepi32_ps(v)))
}

/// [`step32`]'s loop constants.
struct Consts32 {
    mant: __m128i,
    mant2: __m128i,
    emask: __m256i,
    lo2: __m256i,
}

/// One vector of 8 32-bit floats at `rp` and `xp`: their displacements stored at `d`,
/// their facts (in 32-bit lanes) and slots returned.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn vec32(rp: *const u8, xp: *const u8, d: *mut u32, c: &Consts32) -> (__m256i, __m256i) {
    let (zero, one, three) = (
        _mm256_setzero_si256(),
        _mm256_set1_epi32(1),
        _mm256_set1_epi32(3),
    );
    let rv = _mm256_loadu_si256(rp.cast());
    let xv = _mm256_loadu_si256(xp.cast());
    let dv = _mm256_sub_epi32(key32(xv), key32(rv));
    _mm256_storeu_si256(d.cast(), dv);
    let er = _mm256_and_si256(_mm256_srl_epi32(rv, c.mant), c.emask);
    let sign = _mm256_srli_epi32::<31>(rv);
    let m2 = _mm256_and_si256(_mm256_srl_epi32(rv, c.mant2), three);
    let inf = _mm256_or_si256(
        _mm256_or_si256(er, _mm256_slli_epi32::<8>(sign)),
        _mm256_slli_epi32::<9>(m2),
    );
    // |sd| (i32::MIN gives 2^31 as unsigned, b = 32) and the sign.
    let v = _mm256_abs_epi32(dv);
    let neg = _mm256_srli_epi32::<31>(dv);
    // b from the conversion of `v & !(v >> 1)` (no rounding carry into the exponent); 2^31
    // and up convert as negatives: b = 32.
    let tb = _mm256_andnot_si256(_mm256_srli_epi32::<1>(v), v);
    let e = _mm256_and_si256(
        _mm256_srli_epi32::<23>(_mm256_castps_si256(_mm256_cvtepi32_ps(tb))),
        _mm256_set1_epi32(255),
    );
    let b = _mm256_max_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(126)), zero);
    let b = _mm256_blendv_epi8(b, _mm256_set1_epi32(32), _mm256_srai_epi32::<31>(v));
    // The top three bits `1 q1 q2` (for b < 3 fewer, shifted up; the other shift's count
    // wraps past 31 and gives 0).
    let top3 = _mm256_or_si256(
        _mm256_srlv_epi32(v, _mm256_sub_epi32(b, three)),
        _mm256_sllv_epi32(v, _mm256_sub_epi32(three, b)),
    );
    let slot = _mm256_or_si256(
        _mm256_or_si256(
            _mm256_slli_epi32::<3>(b),
            _mm256_and_si256(_mm256_srli_epi32::<1>(top3), one),
        ),
        _mm256_or_si256(
            _mm256_slli_epi32::<1>(_mm256_and_si256(top3, one)),
            _mm256_slli_epi32::<2>(neg),
        ),
    );
    let ctx = _mm256_sub_epi32(_mm256_or_si256(_mm256_slli_epi32::<1>(er), sign), c.lo2);
    let stride = _mm256_set1_epi32(FLAT_STRIDE as i32);
    (inf, _mm256_add_epi32(_mm256_mullo_epi32(ctx, stride), slot))
}

#[cfg(test)]
mod tests {
    use super::super::super::word::{InfoFn, Word};
    use super::super::super::{joint, residual_chunk, Isa};
    use super::Running;
    use crate::dtype::DType;

    /// The fused pass (histogram, CRC-32s, exponent range) and the residual kernels with and
    /// without their CRC-32s (`residuals`, `displacements`) against the portable residual
    /// pass and the two-pass count, on tensors of two and a half chunks: displacements,
    /// facts, ranges, CRC-32s and histogram equal, for each 16- and 32-bit
    /// float type, conditioned or not, near references (the real case), random pairs (every
    /// exponent class, so the widest tables) and the extremes (the most negative
    /// displacement, zeros, infinities).
    #[test]
    fn fused_matches_two_passes() {
        if !Isa::Avx2.available() {
            eprintln!("SKIP: this CPU has no AVX2");
            return;
        }
        let n = 2 * crate::format::chunk::CHUNK_ELEMS + 12345;
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let fl = dtype.float_layout().unwrap();
            for case in 0..3 {
                for condition in [true, false] {
                    let (r, x) = pair(fl.width, n, case);
                    let info_fn = InfoFn::new(fl, condition);
                    let what = format!("{dtype:?}, case {case}, condition {condition}");
                    if fl.width == 16 {
                        check::<u16>(&r, &x, info_fn, fl.width, &what);
                    } else {
                        check::<u32>(&r, &x, info_fn, fl.width, &what);
                    }
                }
            }
        }
    }

    fn check<T: Word>(r: &[u8], x: &[u8], info_fn: InfoFn, width: u32, what: &str) {
        let n = r.len() / T::SIZE;
        let (got, crcs, er) = joint::residual_histogram::<T>(Isa::Avx2, r, x, info_fn, width)
            .unwrap_or_else(|| panic!("{what}: fused pass not taken"));
        assert_eq!(
            crcs,
            [crc32fast::hash(r), crc32fast::hash(x)],
            "{what}: CRC-32s"
        );
        let (mut wd, mut wi) = (vec![T::default(); n], vec![0u16; n]);
        residual_chunk::<T, true, false>(&mut wd, &mut wi, r, x, info_fn);
        let wi: Vec<u16> = if info_fn.condition() {
            wi
        } else {
            wi.iter().map(|&i| i & !255).collect()
        };
        assert_eq!(er, joint::er_range(&wi), "{what}: exponent range");
        // The same without the counting (`residuals`), in one call, and without the
        // CRC-32s (`displacements`).
        let (mut rd, mut ri) = (vec![T::default(); n], vec![0u16; n]);
        // SAFETY: AVX2 checked by the caller; `T` is u16 or u32, `info_fn` not wide.
        let (lo, hi, rcrcs) = unsafe {
            let mut h = [Running::new(), Running::new()];
            let (lo, hi) = super::residuals::<T>(r, x, &mut rd, &mut ri, info_fn, &mut h);
            (lo, hi, h.map(|h| h.finish().finalize()))
        };
        assert!(
            rd.iter().zip(&wd).all(|(a, b)| a.get() == b.get()),
            "{what}: residuals' displacements"
        );
        assert_eq!(ri, wi, "{what}: residuals' facts");
        assert_eq!((lo as usize, hi as usize), er, "{what}: residuals' range");
        assert_eq!(rcrcs, crcs, "{what}: residuals' CRC-32s");
        let (mut pd, mut pi) = (vec![T::default(); n], vec![0u16; n]);
        // SAFETY: as above.
        unsafe { super::displacements::<T>(r, x, &mut pd, &mut pi, info_fn) };
        assert!(
            pd.iter().zip(&wd).all(|(a, b)| a.get() == b.get()),
            "{what}: displacements"
        );
        assert_eq!(pi, wi, "{what}: displacements' facts");
        let want = joint::histogram::<T>(Isa::Portable, &(&wd[..], &wi[..]), er, width);
        assert_eq!(got.dense(), want.dense(), "{what}: histogram");
    }

    /// Reference and target bytes of `n` `width`-bit floats: 0 near pairs, 1 random pairs,
    /// 2 extremes mixed into near pairs.
    fn pair(width: u32, n: usize, case: u32) -> (Vec<u8>, Vec<u8>) {
        let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ (case as u64) << 32 ^ width as u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let (mut r, mut x) = (Vec::new(), Vec::new());
        for k in 0..n {
            let a = next();
            let (rv, xv): (u64, u64) = match case {
                0 => {
                    // A small weight and a small step: the low bits move.
                    let rv = if width == 16 {
                        0x3C00 ^ (a & 0x87FF)
                    } else {
                        0x3C00_0000 ^ (a & 0x87FF_FFFF)
                    };
                    (rv, rv ^ (next() & if width == 16 { 0x3F } else { 0x3FFF }))
                }
                1 => (a, next()),
                _ => {
                    let top = 1u64 << (width - 1);
                    match k % 7 {
                        0 => (0, top),
                        1 => (top, 0),
                        2 => (0, 0),
                        3 => (top - 1, top),
                        4 => (a, a ^ (top - 1)),
                        5 => (a, a),
                        _ => (a, next()),
                    }
                }
            };
            let m = u64::MAX >> (64 - width);
            r.extend_from_slice(&(rv & m).to_le_bytes()[..width as usize / 8]);
            x.extend_from_slice(&(xv & m).to_le_bytes()[..width as usize / 8]);
        }
        (r, x)
    }
}
