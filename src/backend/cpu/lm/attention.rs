//! Causal attention of one item over its cached keys and values (docs/INTEGER_GPT2.md §4):
//! integer scores, the exp table, an exact reciprocal. One body, compiled plain, for AVX2 and
//! for AVX-512; at the AVX-512 level its two products (the scores' dot products and the
//! weighted sum of the values) are explicit: i32 lanes multiplied into exact i64 sums
//! (`vpmuldq`, even and odd channels), sixteen channels per load.

use super::scratch;
use crate::backend::cpu::Isa;
use crate::format::lm::fixed::{div_recip, recip, round_shift};
use crate::format::lm::model_file::Tables;

/// A KV cache's element: i32, or i16 where every value of the cache fits (`KvCaches`'s
/// narrow copy: half the bytes read per step). The kernels widen each to i32 as they load
/// it, so the integers are the same.
pub trait KvValue: Copy + Into<i64> + Sync {
    /// Stored as i16 (what the x86 kernels' loads widen).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    const NARROW: bool;
}

impl KvValue for i32 {
    const NARROW: bool = false;
}

impl KvValue for i16 {
    const NARROW: bool = true;
}

/// Causal attention of one item over `len` cached positions (docs §4).
#[allow(clippy::too_many_arguments)]
pub fn attention<T: KvValue>(
    isa: Isa,
    q: &[i32],
    kc: &[T],
    vc: &[T],
    len: usize,
    d: usize,
    hd: usize,
    tables: &Tables,
    out: &mut [i64],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512 && std::is_x86_feature_detected!("avx512dq") {
            // SAFETY: the `Avx512` level implies F and VL (`Isa::available`), DQ is checked;
            // the body is safe code compiled with them.
            unsafe { attention_avx512(isa, q, kc, vc, len, d, hd, tables, out) };
            return;
        }
        if isa >= Isa::Avx2 {
            // SAFETY: levels from `Avx2` up imply AVX2 (`Isa::available`, checked when the
            // `CpuLm` was made); the body is safe code compiled with AVX2 enabled.
            unsafe { attention_avx2(isa, q, kc, vc, len, d, hd, tables, out) };
            return;
        }
    }
    attention_body(isa, q, kc, vc, len, d, hd, tables, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn attention_avx2<T: KvValue>(
    isa: Isa,
    q: &[i32],
    kc: &[T],
    vc: &[T],
    len: usize,
    d: usize,
    hd: usize,
    tables: &Tables,
    out: &mut [i64],
) {
    attention_body(isa, q, kc, vc, len, d, hd, tables, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn attention_avx512<T: KvValue>(
    isa: Isa,
    q: &[i32],
    kc: &[T],
    vc: &[T],
    len: usize,
    d: usize,
    hd: usize,
    tables: &Tables,
    out: &mut [i64],
) {
    attention_body(isa, q, kc, vc, len, d, hd, tables, out)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attention_body<T: KvValue>(
    isa: Isa,
    q: &[i32],
    kc: &[T],
    vc: &[T],
    len: usize,
    d: usize,
    hd: usize,
    tables: &Tables,
    out: &mut [i64],
) {
    let nh = d / hd;
    // Head-major: every head's scores, then its weights, position by position.
    // In the thread's buffers: `dots` writes every score, `softmax_weights` every weight.
    let mut buf = scratch::Buffers::take(nh * len, nh * len);
    let (sc, p) = (&mut buf.scores[..nh * len], &mut buf.weights[..nh * len]); // p <= 2^24
    dots(isa, q, kc, d, hd, sc);
    let mut totals = vec![0i64; nh];
    for ((sc, p), total) in sc
        .chunks_exact_mut(len)
        .zip(p.chunks_exact_mut(len))
        .zip(&mut totals)
    {
        *total = softmax_weights(sc, p, tables);
    }
    let mut acc = vec![0i64; d];
    weighted_values(isa, p, vc, d, hd, &mut acc);
    for ((o, a), &total) in out
        .chunks_exact_mut(hd)
        .zip(acc.chunks_exact(hd))
        .zip(&totals)
    {
        normalize(a, total, o);
    }
}

/// One head's scores (`sc`, the dot products, scaled in place) to its integer weights
/// `p[s] = exp24[max - score]` (<= 2^24); returns their sum.
#[inline(always)]
pub(super) fn softmax_weights(sc: &mut [i64], p: &mut [i32], tables: &Tables) -> i64 {
    scale_scores(sc, tables.attn_m);
    let mx = *sc.iter().max().unwrap_or(&0);
    let mut total = 0i64;
    for (ps, &s) in p.iter_mut().zip(&*sc) {
        let gap = (mx - s) as usize;
        *ps = tables.exp24.get(gap).copied().unwrap_or(0) as i32;
        total += *ps as i64;
    }
    total
}

/// `round_shift(a * m, 52)` of every score `a`, in place (docs §4), exactly; in 64-bit
/// arithmetic where this head's scores allow, which the compiler vectorizes, else the 128-bit
/// product per score.
///
/// The 64-bit form splits `m = mh * 2^t + ml` (`0 <= ml < 2^t`, `t <= 52`) and computes
/// `(a * mh + ((a * ml + 2^51) >> t)) >> (52 - t)` (arithmetic shifts: floors). It is the same
/// integer: with `q = floor((a * ml + 2^51) / 2^t)` and `r = a * ml + 2^51 - q * 2^t` in
/// `0..2^t`, `a * m + 2^51 = (a * mh + q) * 2^t + r`, so `floor((a * m + 2^51) / 2^52) =
/// floor(floor(.. / 2^t) / 2^(52 - t)) = floor((a * mh + q) / 2^(52 - t))` (floors of
/// divisions by positive integers nest). No step overflows: with every `|a| < 2^A` and
/// `t = min(62 - A, 52)`, `|a * ml| < 2^(A + t) <= 2^62` (plus `2^51`: below 2^63), `|q| <=
/// 2^A`, and `|a * mh| < 2^(A + B - t)` for `0 <= m < 2^B`, at most 2^62 when `t = 62 - A`
/// and `B + 2A <= 124`, and below 2^62 when `t = 52` (`A <= 10`, `B <= 63`); so the sum
/// stays below 2^63. `|q|, |k| <= 2^20` (`QKV_MAX`) bound `|a|` by `hd * 2^40` (A <= 47)
/// and `attn_m < 2^38` for every head size: the fallback is for scores near that bound or a
/// model file's odd multiplier.
#[inline(always)]
pub(super) fn scale_scores(sc: &mut [i64], m: i64) {
    // One pass for the bound (vectorized): the largest magnitude's bit length A.
    let amax = sc.iter().map(|a| a.unsigned_abs()).fold(0, u64::max);
    let (a_bits, m_bits) = (
        64 - amax.leading_zeros(),
        64 - m.unsigned_abs().leading_zeros(),
    );
    if m < 0 || a_bits > 62 || m_bits + 2 * a_bits > 124 {
        for a in sc.iter_mut() {
            *a = round_shift(*a as i128 * m as i128, 52) as i64;
        }
        return;
    }
    let t = (62 - a_bits).min(52);
    let (mh, ml) = (m >> t, m & ((1i64 << t) - 1));
    for a in sc.iter_mut() {
        *a = (*a * mh + ((*a * ml + (1 << 51)) >> t)) >> (52 - t);
    }
}

/// One head's weighted sums of the values divided by the weights' `total`.
#[inline(always)]
pub(super) fn normalize(acc: &[i64], total: i64, out: &mut [i64]) {
    let rc = recip(total as i128);
    for (o, &a) in out.iter_mut().zip(acc) {
        // |a| <= 2^57, r <= 2^30
        *o = div_recip(a as i128, rc) as i64;
    }
}

/// Every head's score dot products, head-major: `dots[h * len + s] = sum_c q[h hd + c] *
/// k[s][h hd + c]` (`len = dots.len() / (d / hd)` cached positions). |q|, |k| <= 2^20: each
/// product <= 2^40, the sum <= hd * 2^40 (i64).
fn dots<T: KvValue>(isa: Isa, q: &[i32], kc: &[T], d: usize, hd: usize, dots: &mut [i64]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && hd.is_multiple_of(16) {
        // SAFETY: the `Avx512` level implies AVX-512 F (`Isa::available`); the vector loads
        // read bounds-checked slices of 16.
        return unsafe { x86::dots_avx512(q, kc, d, hd, dots) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && hd.is_multiple_of(8) {
        // SAFETY: levels from `Avx2` up imply AVX2 (`Isa::available`); the vector loads read
        // bounds-checked slices of 8.
        return unsafe { x86::dots_avx2(q, kc, d, hd, dots) };
    }
    let _ = isa;
    let len = dots.len() / (d / hd);
    for (h, dots) in dots.chunks_exact_mut(len).enumerate() {
        dots_reference(&q[h * hd..(h + 1) * hd], kc, d, h * hd, dots);
    }
}

/// One head's [`dots`] (channels `off..off + q.len()`), one position at a time (the
/// definition).
pub(super) fn dots_reference<T: KvValue>(
    q: &[i32],
    kc: &[T],
    d: usize,
    off: usize,
    dots: &mut [i64],
) {
    for (s, dot) in dots.iter_mut().enumerate() {
        let kh = &kc[s * d + off..s * d + off + q.len()];
        *dot = q.iter().zip(kh).map(|(&a, &b)| a as i64 * b.into()).sum();
    }
}

/// Every head's weighted sum of the values: `acc[c] = sum_s p[h * len + s] * v[s][c]` for
/// the channels `c` of head `h` (`p` head-major as [`dots`] gives the scores).
fn weighted_values<T: KvValue>(
    isa: Isa,
    p: &[i32],
    vc: &[T],
    d: usize,
    hd: usize,
    acc: &mut [i64],
) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && hd.is_multiple_of(16) {
        // SAFETY: as in `dots`.
        return unsafe { x86::weighted_values_avx512(p, vc, d, hd, acc) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && hd.is_multiple_of(8) {
        // SAFETY: as in `dots`.
        return unsafe { x86::weighted_values_avx2(p, vc, d, hd, acc) };
    }
    let _ = isa;
    let len = p.len() / (d / hd);
    for (h, (p, acc)) in p
        .chunks_exact(len)
        .zip(acc.chunks_exact_mut(hd))
        .enumerate()
    {
        weighted_values_by_8(p, vc, d, h * hd, acc);
    }
}

/// One head's [`weighted_values`] (channels `off..off + acc.len()`), for levels without
/// explicit kernels (compiled for each).
#[inline(always)]
fn weighted_values_by_8<T: KvValue>(p: &[i32], vc: &[T], d: usize, off: usize, acc: &mut [i64]) {
    if !acc.len().is_multiple_of(8) {
        return weighted_values_reference(p, vc, d, off, acc);
    }
    // Eight channels at a time down every position: their sums stay in registers instead of
    // a load and a store of `acc` per position. The same exact i64 sums in another order:
    // |p * v| <= 2^44, so none can overflow.
    for (c, a8) in acc.chunks_exact_mut(8).enumerate() {
        let mut a = [0i64; 8];
        for (s, &ps) in p.iter().enumerate() {
            let at = s * d + off + 8 * c;
            let v8: &[T; 8] = vc[at..at + 8].try_into().expect("8 channels");
            for (x, &v) in a.iter_mut().zip(v8) {
                *x += ps as i64 * v.into();
            }
        }
        a8.copy_from_slice(&a);
    }
}

/// [`weighted_values_by_8`] position by position (the definition).
fn weighted_values_reference<T: KvValue>(
    p: &[i32],
    vc: &[T],
    d: usize,
    off: usize,
    acc: &mut [i64],
) {
    acc.iter_mut().for_each(|a| *a = 0);
    let hd = acc.len();
    for (s, &ps) in p.iter().enumerate() {
        let vh = &vc[s * d + off..s * d + off + hd];
        for (a, &v) in acc.iter_mut().zip(vh) {
            *a += ps as i64 * v.into();
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::KvValue;
    use std::arch::x86_64::*;

    /// Sixteen cache values at `p` as i32 lanes (i16 ones sign-extended).
    macro_rules! load16 {
        ($t:ty, $p:expr) => {
            if <$t>::NARROW {
                _mm512_cvtepi16_epi32(_mm256_loadu_si256($p.cast()))
            } else {
                _mm512_loadu_si512($p.cast())
            }
        };
    }

    /// Each cached key row read once, in order, for every head (the cache streams instead
    /// of being walked once per head). Sixteen channels per load: `vpmuldq` multiplies the
    /// even channels (the low halves of the 64-bit lanes) into exact i64 products, and again
    /// after a shift the odd ones; one horizontal sum per head and position.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn dots_avx512<T: KvValue>(
        q: &[i32],
        kc: &[T],
        d: usize,
        hd: usize,
        dots: &mut [i64],
    ) {
        let len = dots.len() / (d / hd);
        for s in 0..len {
            let row = &kc[s * d..(s + 1) * d];
            for (h, (qh, kh)) in q[..d]
                .chunks_exact(hd)
                .zip(row.chunks_exact(hd))
                .enumerate()
            {
                let mut acc = _mm512_setzero_si512();
                for (qb, kb) in qh.chunks_exact(16).zip(kh.chunks_exact(16)) {
                    let qv = _mm512_loadu_si512(qb.as_ptr().cast());
                    let kv = load16!(T, kb.as_ptr());
                    acc = _mm512_add_epi64(acc, _mm512_mul_epi32(qv, kv));
                    let (qo, ko) = (_mm512_srli_epi64::<32>(qv), _mm512_srli_epi64::<32>(kv));
                    acc = _mm512_add_epi64(acc, _mm512_mul_epi32(qo, ko));
                }
                dots[h * len + s] = _mm512_reduce_add_epi64(acc);
            }
        }
    }

    /// Up to 128 channels at a time down every position (each value row read in long
    /// pieces, in order), their sums in registers (even and odd channels apart, as in
    /// [`dots_avx512`]), each channel's weight the one of its head.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn weighted_values_avx512<T: KvValue>(
        p: &[i32],
        vc: &[T],
        d: usize,
        hd: usize,
        acc: &mut [i64],
    ) {
        let len = p.len() / (d / hd);
        let mut c = 0;
        while c + 128 <= d {
            block::<T, 8>(p, len, hd, vc, d, c, &mut acc[c..c + 128]);
            c += 128;
        }
        while c < d {
            block::<T, 1>(p, len, hd, vc, d, c, &mut acc[c..c + 16]);
            c += 16;
        }
    }

    /// `16 * B` channels from column `col` (`hd` a multiple of 16: each 16 in one head).
    #[inline(always)]
    unsafe fn block<T: KvValue, const B: usize>(
        p: &[i32],
        len: usize,
        hd: usize,
        vc: &[T],
        d: usize,
        col: usize,
        acc: &mut [i64],
    ) {
        // Where each 16 channels' head's weights start in `p`.
        let at: [usize; B] = std::array::from_fn(|b| (col + 16 * b) / hd * len);
        let mut even = [_mm512_setzero_si512(); B];
        let mut odd = [_mm512_setzero_si512(); B];
        for s in 0..len {
            let row = &vc[s * d + col..s * d + col + 16 * B];
            for b in 0..B {
                let w = _mm512_set1_epi32(p[at[b] + s]);
                let v = load16!(T, row[16 * b..].as_ptr());
                even[b] = _mm512_add_epi64(even[b], _mm512_mul_epi32(v, w));
                let vo = _mm512_srli_epi64::<32>(v);
                odd[b] = _mm512_add_epi64(odd[b], _mm512_mul_epi32(vo, w));
            }
        }
        for b in 0..B {
            let (mut e, mut o) = ([0i64; 8], [0i64; 8]);
            _mm512_storeu_si512(e.as_mut_ptr().cast(), even[b]);
            _mm512_storeu_si512(o.as_mut_ptr().cast(), odd[b]);
            for i in 0..8 {
                acc[16 * b + 2 * i] = e[i];
                acc[16 * b + 2 * i + 1] = o[i];
            }
        }
    }

    /// Eight cache values at `p` as i32 lanes (i16 ones sign-extended).
    #[inline(always)]
    unsafe fn load8<T: KvValue>(p: *const T) -> __m256i {
        if T::NARROW {
            _mm256_cvtepi16_epi32(_mm_loadu_si128(p.cast()))
        } else {
            _mm256_loadu_si256(p.cast())
        }
    }

    /// The sum of the four i64 lanes.
    #[inline(always)]
    unsafe fn sum4(v: __m256i) -> i64 {
        let s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        _mm_cvtsi128_si64(_mm_add_epi64(s, _mm_unpackhi_epi64(s, s)))
    }

    /// [`dots_avx512`] eight channels per load.
    #[target_feature(enable = "avx2")]
    pub unsafe fn dots_avx2<T: KvValue>(
        q: &[i32],
        kc: &[T],
        d: usize,
        hd: usize,
        dots: &mut [i64],
    ) {
        let len = dots.len() / (d / hd);
        for s in 0..len {
            let row = &kc[s * d..(s + 1) * d];
            for (h, (qh, kh)) in q[..d]
                .chunks_exact(hd)
                .zip(row.chunks_exact(hd))
                .enumerate()
            {
                let mut acc = _mm256_setzero_si256();
                for (qb, kb) in qh.chunks_exact(8).zip(kh.chunks_exact(8)) {
                    let qv = _mm256_loadu_si256(qb.as_ptr().cast());
                    let kv = load8(kb.as_ptr());
                    acc = _mm256_add_epi64(acc, _mm256_mul_epi32(qv, kv));
                    let (qo, ko) = (_mm256_srli_epi64::<32>(qv), _mm256_srli_epi64::<32>(kv));
                    acc = _mm256_add_epi64(acc, _mm256_mul_epi32(qo, ko));
                }
                dots[h * len + s] = sum4(acc);
            }
        }
    }

    /// [`weighted_values_avx512`] eight channels per load, up to 32 at a time
    /// (their even and odd sums are eight of the sixteen registers).
    #[target_feature(enable = "avx2")]
    pub unsafe fn weighted_values_avx2<T: KvValue>(
        p: &[i32],
        vc: &[T],
        d: usize,
        hd: usize,
        acc: &mut [i64],
    ) {
        let len = p.len() / (d / hd);
        let mut c = 0;
        while c + 32 <= d {
            block8::<T, 4>(p, len, hd, vc, d, c, &mut acc[c..c + 32]);
            c += 32;
        }
        while c < d {
            block8::<T, 1>(p, len, hd, vc, d, c, &mut acc[c..c + 8]);
            c += 8;
        }
    }

    /// `8 * B` channels from column `col` (`hd` a multiple of 8: each 8 in one head).
    #[inline(always)]
    unsafe fn block8<T: KvValue, const B: usize>(
        p: &[i32],
        len: usize,
        hd: usize,
        vc: &[T],
        d: usize,
        col: usize,
        acc: &mut [i64],
    ) {
        // Where each 8 channels' head's weights start in `p`.
        let at: [usize; B] = std::array::from_fn(|b| (col + 8 * b) / hd * len);
        let mut even = [_mm256_setzero_si256(); B];
        let mut odd = [_mm256_setzero_si256(); B];
        for s in 0..len {
            let row = &vc[s * d + col..s * d + col + 8 * B];
            for b in 0..B {
                let w = _mm256_set1_epi32(p[at[b] + s]);
                let v = load8(row[8 * b..][..8].as_ptr());
                even[b] = _mm256_add_epi64(even[b], _mm256_mul_epi32(v, w));
                let vo = _mm256_srli_epi64::<32>(v);
                odd[b] = _mm256_add_epi64(odd[b], _mm256_mul_epi32(vo, w));
            }
        }
        for b in 0..B {
            let (mut e, mut o) = ([0i64; 4], [0i64; 4]);
            _mm256_storeu_si256(e.as_mut_ptr().cast(), even[b]);
            _mm256_storeu_si256(o.as_mut_ptr().cast(), odd[b]);
            for i in 0..4 {
                acc[8 * b + 2 * i] = e[i];
                acc[8 * b + 2 * i + 1] = o[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 64-bit score scale equals the 128-bit definition: scores at every bit length up
    /// to the GPT-2 bound (hd * 2^40, hd <= 128) and beyond (the fallback), both signs, the
    /// rounding ties, multipliers of every head size and the extremes of i64.
    #[test]
    fn scaled_scores_equal_the_128_bit_products() {
        let mut rnd = super::super::test_lcg(11);
        let ms: Vec<i64> = [1u32, 12, 16, 32, 64, 80, 128, 256]
            .iter()
            .map(|&hd| Tables::compute(hd).attn_m)
            .chain([
                0,
                1,
                3,
                (1 << 40) + 1,
                (1 << 52) - 1,
                1 << 61,
                i64::MAX,
                -5,
                i64::MIN,
            ])
            .collect();
        for &m in &ms {
            for bits in (0..=63).step_by(3).chain([46, 47, 48, 62]) {
                let top = if bits == 63 {
                    u64::MAX
                } else {
                    (1u64 << bits) - 1
                };
                let mut sc: Vec<i64> = (0..64).map(|_| (rnd() & top) as i64).collect();
                let n = sc.len();
                for i in 0..n / 2 {
                    sc[i] = sc[i].wrapping_neg();
                }
                // Both extremes of the range, and the scores whose products end in exactly
                // half a unit (ties) where m allows.
                sc[0] = top as i64;
                sc[1] = (top as i64).wrapping_neg();
                if m > 0 && m.trailing_zeros() < 52 {
                    let half = 1i64 << (51 - m.trailing_zeros());
                    sc[2] = half.min(top as i64);
                    sc[3] = -half.min(top as i64);
                }
                let want: Vec<i64> = sc
                    .iter()
                    .map(|&a| round_shift(a as i128 * m as i128, 52) as i64)
                    .collect();
                let mut got = sc.clone();
                scale_scores(&mut got, m);
                assert_eq!(got, want, "m={m} bits={bits}");
            }
        }
    }

    fn check_weighted_values<T: KvValue>(
        isa: Isa,
        p: &[i32],
        vc: &[T],
        d: usize,
        hd: usize,
        want: &[i64],
    ) {
        let mut got = vec![7i64; d];
        weighted_values(isa, p, vc, d, hd, &mut got);
        let (len, i16) = (p.len() / (d / hd), T::NARROW);
        assert_eq!(got, want, "{isa:?} i16 {i16}: len={len} d={d} hd={hd}");
    }

    /// [`dots`] at every level equals [`dots_reference`].
    fn check_dots<T: KvValue>(q: &[i32], kc: &[T], len: usize, d: usize, hd: usize) {
        let mut want = vec![0i64; len * d / hd];
        for (off, dots) in (0..d).step_by(hd).zip(want.chunks_exact_mut(len)) {
            dots_reference(&q[off..off + hd], kc, d, off, dots);
        }
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            let mut got = vec![7i64; len * d / hd];
            dots(isa, q, kc, d, hd, &mut got);
            let i16 = T::NARROW;
            assert_eq!(got, want, "{isa:?} i16 {i16}: len={len} d={d} hd={hd}");
        }
    }

    #[test]
    fn weighted_values_equal_the_definition() {
        let mut next = super::super::test_lcg(5);
        let mut rnd = |m: u64| (next() >> 33) % m;
        for (len, d, hd) in [
            (1, 8, 8),
            (7, 128, 32),
            (256, 128, 32),
            (33, 96, 12),
            (40, 768, 64),
            (5, 160, 80),
            (3, 256, 128),
            (4, 384, 32),
        ] {
            // |p| <= 2^24 and |v| <= 2^20, as in the model; extremes included.
            let p: Vec<i32> = (0..len)
                .map(|i| if i == 0 { 1 << 24 } else { rnd(1 << 25) as i32 })
                .collect();
            let vc: Vec<i32> = (0..len * d)
                .map(|i| match i % 5 {
                    0 => -(1 << 20),
                    1 => 1 << 20,
                    _ => rnd(1 << 21) as i32 - (1 << 20),
                })
                .collect();
            // Each head its own weights (head-major).
            let ph: Vec<i32> = (0..d / hd)
                .flat_map(|h| p.iter().map(move |&x| x >> h))
                .collect();
            let mut want = vec![0i64; d];
            for (off, acc) in (0..d).step_by(hd).zip(want.chunks_exact_mut(hd)) {
                let p = &ph[off / hd * len..(off / hd + 1) * len];
                weighted_values_reference(p, &vc, d, off, acc);
                let mut got = vec![7i64; hd];
                weighted_values_by_8(p, &vc, d, off, &mut got);
                assert_eq!(got, acc, "by 8: len={len} d={d} hd={hd} off={off}");
            }
            // Every level from the i32 cache, and from an i16 one (the narrow copy), its
            // extremes included, against the definition.
            for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                check_weighted_values(isa, &ph, &vc, d, hd, &want);
            }
            let v16: Vec<i16> = vc
                .iter()
                .map(|&v| (v >> 5).clamp(-32768, 32767) as i16)
                .collect();
            let mut want = vec![0i64; d];
            for (off, acc) in (0..d).step_by(hd).zip(want.chunks_exact_mut(hd)) {
                let p = &ph[off / hd * len..(off / hd + 1) * len];
                weighted_values_reference(p, &v16, d, off, acc);
            }
            for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                check_weighted_values(isa, &ph, &v16, d, hd, &want);
            }
        }
    }

    /// The scores' dot products at every level equal the definition, at the extremes of the
    /// keys and queries (|x| <= 2^20) and for random ones.
    #[test]
    fn dots_equal_the_definition() {
        let mut next = super::super::test_lcg(17);
        let mut rnd = |m: u64| (next() >> 33) % m;
        for (len, d, hd) in [
            (1, 16, 16),
            (9, 128, 32),
            (255, 128, 32),
            (40, 768, 64),
            (3, 96, 12),
        ] {
            let mut val = |i: usize| match i % 7 {
                0 => -(1 << 20),
                1 => 1 << 20,
                _ => rnd(1 << 21) as i32 - (1 << 20),
            };
            let kc: Vec<i32> = (0..len * d).map(&mut val).collect();
            let q: Vec<i32> = (0..d).map(|i| val(i / 2)).collect();
            // Every level against the definition, from the i32 cache and from an i16 one
            // (the narrow copy), its extremes included.
            check_dots(&q, &kc, len, d, hd);
            let k16: Vec<i16> = kc
                .iter()
                .map(|&k| (k >> 5).clamp(-32768, 32767) as i16)
                .collect();
            check_dots(&q, &k16, len, d, hd);
        }
    }
}
