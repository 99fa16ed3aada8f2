//! Integer LayerNorm and the per-row int8 quantization that feeds every matmul
//! (docs/INTEGER_GPT2.md §4). LayerNorm is plain Rust on every level (rows are short and the
//! square root and reciprocal dominate); the quantization's per-element division by the row's
//! largest magnitude has an AVX-512 version (with the shipped model it cost as much as a
//! layer's matmuls).

use rayon::prelude::*;

use super::split::Split;

use crate::backend::cpu::Isa;
use crate::format::lm::fixed::{isqrt_u128, quantize_row, recip};
use crate::format::lm::model_file::{LayerNorm, FZ, LN_G};

/// Integer LayerNorm of each row of `h` (Q12) to Q26 (docs §4).
pub fn layer_norm(h: &[i32], d: usize, ln: &LayerNorm, eps_q: i64, split: Split) -> Vec<i64> {
    let mut y = vec![0i64; h.len()];
    // Rows are cheap: at least 8 per task, so small batches stay on one thread.
    y.par_chunks_mut(d)
        .zip(h.par_chunks(d))
        .with_min_len(split.min_len(8))
        .for_each(|(out, row)| layer_norm_row(row, ln, eps_q, out));
    y
}

pub fn layer_norm_row(row: &[i32], ln: &LayerNorm, eps_q: i64, out: &mut [i64]) {
    let n = row.len() as i64;
    let s: i64 = row.iter().map(|&x| x as i64).sum();
    let mut sq: i128 = 0;
    for &x in row {
        let dv = (n * x as i64 - s) as i128;
        sq += dv * dv;
    }
    let u = (sq << (2 * LN_G)) / n as i128 + eps_q as i128 * (n as i128 * n as i128);
    let dd = isqrt_u128(u as u128) as i128;
    if dd == 0 {
        // Every d_i is 0: z = 0.
        for (o, &b) in out.iter_mut().zip(&ln.beta) {
            *o = b;
        }
        return;
    }
    // z = div_recip(dv * 2^22, recip(dd)) = (dv * 2^22 * r + 2^(s-1)) >> s. The product's low
    // 22 bits are zero and s = floor(log2 dd) + 30 > 22, so the same floor is
    // (dv * r + 2^(s-23)) >> (s - 22): one 64 x 64 -> 128-bit multiply (|dv| <= 2^40,
    // r <= 2^30) instead of a 128-bit one. |z| <= 2^21 and |gamma| < 2^31, so
    // gamma * z + beta fits i64 (<= 2^51 + 2^40).
    let (r, sr) = recip(dd);
    let sh = sr - (FZ + LN_G);
    debug_assert!(sh >= 1 && r < 1 << 31);
    let (r, half) = (r as i64, 1i128 << (sh - 1));
    for ((o, &x), (&g, &b)) in out.iter_mut().zip(row).zip(ln.gamma.iter().zip(&ln.beta)) {
        let dv = n * x as i64 - s;
        let z = ((dv as i128 * r as i128 + half) >> sh) as i64;
        *o = g as i64 * z + b;
    }
}

/// Per-row int8 quantization with integer scales ([`quantize_row`] at level `isa`).
pub fn quantize(
    isa: Isa,
    y: &[i64],
    d: usize,
    frac: i32,
    split: Split,
) -> (Vec<i8>, Vec<(i64, i32)>) {
    let mut q = vec![0i8; y.len()];
    let scales = q
        .par_chunks_mut(d)
        .zip(y.par_chunks(d))
        .with_min_len(split.min_len(8))
        .map(|(qr, yr)| quantize_row_at(isa, yr, frac, qr))
        .collect();
    (q, scales)
}

/// [`quantize`] of `table[clamp(x) + 32768]` for every `x` of `f` (the GELU lookup of the
/// MLP's first matmul), each row's lookups made in a row-sized buffer of the worker's: the
/// same integers without a step-sized i64 copy of the whole (6 MB for a GPT-2-small compress
/// step, fresh pages every layer).
pub fn lookup_quantize(
    isa: Isa,
    f: &[i32],
    table: &[i32],
    d: usize,
    frac: i32,
    split: Split,
) -> (Vec<i8>, Vec<(i64, i32)>) {
    assert_eq!(table.len(), 1 << 16);
    let mut q = vec![0i8; f.len()];
    let scales = q
        .par_chunks_mut(d)
        .zip(f.par_chunks(d))
        .with_min_len(split.min_len(8))
        .map_init(Vec::new, |row: &mut Vec<i64>, (qr, fr)| {
            row.clear();
            row.extend(
                fr.iter()
                    .map(|&x| table[(x.clamp(-32768, 32767) + 32768) as usize] as i64),
            );
            quantize_row_at(isa, row, frac, qr)
        })
        .collect();
    (q, scales)
}

/// [`quantize_row`] at level `isa`: the same integers.
fn quantize_row_at(isa: Isa, y: &[i64], frac: i32, q: &mut [i8]) -> (i64, i32) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && q.len() == y.len() {
        // SAFETY: the `Avx512` level implies AVX-512 F (`Isa::available`); the loads and
        // stores cover whole pieces of 8 inside `y` and `q` (same length, checked).
        if let Some(scale) = unsafe { x86::quantize_row_avx512(y, frac, q) } {
            return scale;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && q.len() == y.len() {
        // SAFETY: the `Avx2` level implies AVX2 (`Isa::available`); the loads and stores
        // cover whole pieces of 8 inside `y` and `q` (same length, checked).
        if let Some(scale) = unsafe { x86::quantize_row_avx2(y, frac, q) } {
            return scale;
        }
    }
    let _ = isa;
    quantize_row(y, frac, q)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::format::lm::fixed::{quantize_scale, recip};

    /// [`quantize_row`](crate::format::lm::fixed::quantize_row) eight elements per step, for
    /// rows whose largest magnitude `a` lies in `8..2^55` (`None` for the others: the caller
    /// runs the definition). There `(r, s) = recip(a)` has `33 <= s <= 84` and
    /// `r <= 2^30`, and the definition's `x = floor((u r + 2^(s-1)) / 2^s)` of `u = 127 v`
    /// (|u| < 2^62, a 92-bit product) is computed from its 32-bit halves: with
    /// `u = uh 2^32 + ul` (`uh = u >> 32` signed, |uh| < 2^30; `0 <= ul < 2^32`),
    /// `H = uh r` (|H| < 2^60) and `L = ul r` (< 2^62) are exact 32 x 32 -> 64 products, and
    /// `x = floor((H + floor(L / 2^32) + 2^(s-33)) / 2^(s-32))` exactly (floor of a floor of
    /// powers of two), every term in i64.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn quantize_row_avx512(y: &[i64], frac: i32, q: &mut [i8]) -> Option<(i64, i32)> {
        let n8 = y.len() / 8 * 8;
        let mut mx = _mm512_setzero_si512();
        for c in y[..n8].chunks_exact(8) {
            let v = _mm512_loadu_si512(c.as_ptr().cast());
            // |i64::MIN| is 2^63 as u64, as `unsigned_abs` gives it.
            mx = _mm512_max_epu64(mx, _mm512_abs_epi64(v));
        }
        let a = y[n8..]
            .iter()
            .fold(_mm512_reduce_max_epu64(mx), |m, v| m.max(v.unsigned_abs()));
        if !(8..1 << 55).contains(&a) {
            return None;
        }
        let (r, s) = recip(a as i128);
        let (r, s) = (r as i64, s);
        let rv = _mm512_set1_epi64(r);
        let half = _mm512_set1_epi64(1i64 << (s - 33));
        let shift = _mm_cvtsi64_si128((s - 32) as i64);
        let (lo, hi) = (_mm512_set1_epi64(-127), _mm512_set1_epi64(127));
        for (c, o) in y[..n8].chunks_exact(8).zip(q[..n8].chunks_exact_mut(8)) {
            let v = _mm512_loadu_si512(c.as_ptr().cast());
            let u = _mm512_sub_epi64(_mm512_slli_epi64::<7>(v), v);
            let h = _mm512_mul_epi32(_mm512_srai_epi64::<32>(u), rv);
            let l = _mm512_srli_epi64::<32>(_mm512_mul_epu32(u, rv));
            let x = _mm512_sra_epi64(_mm512_add_epi64(_mm512_add_epi64(h, l), half), shift);
            let x = _mm512_min_epi64(_mm512_max_epi64(x, lo), hi);
            _mm512_mask_cvtepi64_storeu_epi8(o.as_mut_ptr().cast(), 0xff, x);
        }
        for (o, &v) in q[n8..].iter_mut().zip(&y[n8..]) {
            let x = ((127 * v) as i128 * r as i128 + (1i128 << (s - 1))) >> s;
            *o = x.clamp(-127, 127) as i8;
        }
        Some(quantize_scale(a as i128, frac))
    }

    /// [`quantize_row_avx512`] at AVX2, four elements per register, for the same rows.
    /// AVX2 has no 64-bit arithmetic shift, minimum or maximum, so the shift is a logical
    /// one of `t + 2^(s-24)`: exact, as `x` lies in `-128..=128` (`r <= 2^s / a + 1` and
    /// `|v| <= a`, so `|127 v r| / 2^s <= 127 + 127 a / 2^s < 128`), which makes `t +
    /// 2^(s-24)` positive and adds exactly 256 to the quotient (a multiple of the divisor
    /// `2^(s-32)`; `2^(s-24) <= 2^60`, no overflow). The clamp then runs on the 32-bit
    /// quotients `x + 256`, and the high dword `u >> 32` needs no sign extension: `vpmuldq`
    /// reads its low dword signed.
    #[target_feature(enable = "avx2")]
    pub unsafe fn quantize_row_avx2(y: &[i64], frac: i32, q: &mut [i8]) -> Option<(i64, i32)> {
        let a = y.iter().fold(0u64, |m, v| m.max(v.unsigned_abs()));
        if !(8..1 << 55).contains(&a) {
            return None;
        }
        let (r, s) = recip(a as i128);
        let (r, s) = (r as i64, s);
        let rv = _mm256_set1_epi64x(r);
        let bias = _mm256_set1_epi64x((1i64 << (s - 33)) + (1i64 << (s - 24)));
        let shift = _mm_cvtsi64_si128((s - 32) as i64);
        let (lo, hi) = (_mm256_set1_epi32(256 - 127), _mm256_set1_epi32(256 + 127));
        // The low dwords of the four 64-bit lanes, in order, in the low half.
        let low_dwords = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
        let quotients = |c: &[i64]| {
            let v = _mm256_loadu_si256(c.as_ptr().cast());
            let u = _mm256_sub_epi64(_mm256_slli_epi64::<7>(v), v);
            let h = _mm256_mul_epi32(_mm256_srli_epi64::<32>(u), rv);
            let l = _mm256_srli_epi64::<32>(_mm256_mul_epu32(u, rv));
            let t = _mm256_add_epi64(_mm256_add_epi64(h, l), bias);
            let x = _mm256_srl_epi64(t, shift);
            let x = _mm256_min_epi32(_mm256_max_epi32(x, lo), hi);
            let x = _mm256_sub_epi32(x, _mm256_set1_epi32(256));
            _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(x, low_dwords))
        };
        let n8 = y.len() / 8 * 8;
        for (c, o) in y[..n8].chunks_exact(8).zip(q[..n8].chunks_exact_mut(8)) {
            let w = _mm_packs_epi32(quotients(&c[..4]), quotients(&c[4..]));
            _mm_storel_epi64(o.as_mut_ptr().cast(), _mm_packs_epi16(w, w));
        }
        for (o, &v) in q[n8..].iter_mut().zip(&y[n8..]) {
            let x = ((127 * v) as i128 * r as i128 + (1i128 << (s - 1))) >> s;
            *o = x.clamp(-127, 127) as i8;
        }
        Some(quantize_scale(a as i128, frac))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::lm::fixed::div_recip;

    /// LayerNorm as docs/INTEGER_GPT2.md §4 writes it (128-bit `div_recip` per element).
    fn layer_norm_spec(row: &[i32], ln: &LayerNorm, eps_q: i64) -> Vec<i64> {
        let n = row.len() as i64;
        let s: i64 = row.iter().map(|&x| x as i64).sum();
        let d: Vec<i128> = row.iter().map(|&x| (n * x as i64 - s) as i128).collect();
        let sq: i128 = d.iter().map(|v| v * v).sum();
        let u = (sq << (2 * LN_G)) / n as i128 + eps_q as i128 * (n as i128 * n as i128);
        let dd = isqrt_u128(u as u128) as i128;
        d.iter()
            .enumerate()
            .map(|(i, &dv)| {
                let z = if dd == 0 {
                    0
                } else {
                    div_recip(dv << (FZ + LN_G), recip(dd))
                };
                (ln.gamma[i] as i128 * z + ln.beta[i] as i128) as i64
            })
            .collect()
    }

    /// The row loop's 64-bit form gives the specification's integers: rows of every
    /// magnitude up to the residual's bound (2^26), constant rows with and without eps, a
    /// lone outlier, gammas and betas at their bounds.
    #[test]
    fn layer_norm_equals_the_specification() {
        let mut next = super::super::test_lcg(41);
        let mut rnd = move || next() >> 11;
        for len in [1usize, 2, 7, 128, 768, 8192] {
            let ln = LayerNorm {
                gamma: (0..len)
                    .map(|i| match i % 3 {
                        0 => i32::MAX,
                        1 => i32::MIN + 1,
                        _ => (rnd() as i32) >> 8,
                    })
                    .collect(),
                beta: (0..len).map(|_| rnd() as i64 % (1 << 40)).collect(),
            };
            for bits in [0u32, 1, 5, 12, 20, 26] {
                let m = 1i64 << bits;
                let mut rows: Vec<Vec<i32>> = vec![(0..len)
                    .map(|_| ((rnd() as i64 % (2 * m + 1)) - m) as i32)
                    .collect()];
                rows.push(vec![m as i32; len]);
                let mut outlier = vec![0i32; len];
                outlier[len / 2] = -m as i32;
                rows.push(outlier);
                for row in rows {
                    for eps_q in [0i64, 1, 1 << 30] {
                        let mut got = vec![0; len];
                        layer_norm_row(&row, &ln, eps_q, &mut got);
                        let want = layer_norm_spec(&row, &ln, eps_q);
                        assert_eq!(got, want, "len {len} bits {bits} eps {eps_q}");
                    }
                }
            }
        }
    }

    /// Every level quantizes as the definition: rows of every magnitude class (the fast
    /// path's bounds 8 and 2^55 on both sides, zero, i64 extremes), lengths off the width.
    #[test]
    fn each_level_quantizes_as_the_definition() {
        let mut rnd = super::super::test_lcg(29);
        let mut rows: Vec<Vec<i64>> = Vec::new();
        for len in [1usize, 7, 8, 9, 128, 515, 3072] {
            for bits in [0u32, 2, 3, 4, 20, 40, 51, 54, 55, 56, 62, 63] {
                let row: Vec<i64> = (0..len)
                    .map(|_| {
                        let v = rnd() as i64;
                        if bits >= 63 {
                            v
                        } else {
                            v % (1i64 << bits).max(1)
                        }
                    })
                    .collect();
                rows.push(row);
            }
            // The largest magnitude at each bound exactly, with rounding ties around it.
            for a in [7i64, 8, (1 << 55) - 1, 1 << 55] {
                let mut row: Vec<i64> = (0..len as i64).map(|i| (i * 977 - 300) % a).collect();
                row[len / 2] = if len % 2 == 0 { a } else { -a };
                rows.push(row);
            }
            rows.push(vec![0; len]);
            rows.push(
                (0..len)
                    .map(|i| if i % 2 == 0 { i64::MIN } else { i64::MAX })
                    .collect(),
            );
        }
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            for (i, row) in rows.iter().enumerate() {
                for frac in [12, 26] {
                    let (mut want, mut got) = (vec![0i8; row.len()], vec![5i8; row.len()]);
                    let w = quantize_row(row, frac, &mut want);
                    let g = quantize_row_at(isa, row, frac, &mut got);
                    assert_eq!((g, &got), (w, &want), "{isa:?} row {i} len {}", row.len());
                }
            }
        }
    }
}
