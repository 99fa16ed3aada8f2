//! Causal attention of one item over its cached keys and values (docs/INTEGER_GPT2.md §4):
//! integer scores, the exp table, an exact reciprocal. One body, compiled plain, for AVX2 and
//! for AVX-512 (whose 64-bit lanes and multiplies the i64 score and value sums use).

use crate::backend::cpu::Isa;
use crate::format::lm::fixed::{div_recip, recip, round_shift};
use crate::format::lm::model_file::Tables;

/// Causal attention of one item over `len` cached positions (docs §4).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    isa: Isa,
    q: &[i32],
    kc: &[i32],
    vc: &[i32],
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
            unsafe { attention_avx512(q, kc, vc, len, d, hd, tables, out) };
            return;
        }
        if isa >= Isa::Avx2 {
            // SAFETY: levels from `Avx2` up imply AVX2 (`Isa::available`, checked when the
            // `CpuLm` was made); the body is safe code compiled with AVX2 enabled.
            unsafe { attention_avx2(q, kc, vc, len, d, hd, tables, out) };
            return;
        }
    }
    let _ = isa;
    attention_body(q, kc, vc, len, d, hd, tables, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn attention_avx2(
    q: &[i32],
    kc: &[i32],
    vc: &[i32],
    len: usize,
    d: usize,
    hd: usize,
    tables: &Tables,
    out: &mut [i64],
) {
    attention_body(q, kc, vc, len, d, hd, tables, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn attention_avx512(
    q: &[i32],
    kc: &[i32],
    vc: &[i32],
    len: usize,
    d: usize,
    hd: usize,
    tables: &Tables,
    out: &mut [i64],
) {
    attention_body(q, kc, vc, len, d, hd, tables, out)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attention_body(
    q: &[i32],
    kc: &[i32],
    vc: &[i32],
    len: usize,
    d: usize,
    hd: usize,
    tables: &Tables,
    out: &mut [i64],
) {
    let mut sc = vec![0i64; len];
    let mut p = vec![0i32; len]; // <= 2^24
    let mut acc = vec![0i64; hd];
    for h in 0..d / hd {
        let off = h * hd;
        let qh = &q[off..off + hd];
        for (s, scs) in sc.iter_mut().enumerate() {
            let kh = &kc[s * d + off..s * d + off + hd];
            // |q|, |k| <= 2^20: each product <= 2^40, the sum <= hd * 2^40 (i64).
            let dot: i64 = qh.iter().zip(kh).map(|(&a, &b)| a as i64 * b as i64).sum();
            *scs = round_shift(dot as i128 * tables.attn_m as i128, 52) as i64;
        }
        let mx = *sc.iter().max().unwrap_or(&0);
        let mut total: i64 = 0;
        for (ps, &s) in p.iter_mut().zip(&sc) {
            let gap = (mx - s) as usize;
            *ps = tables.exp24.get(gap).copied().unwrap_or(0) as i32;
            total += *ps as i64;
        }
        weighted_values(&p, vc, d, off, &mut acc);
        let rc = recip(total as i128);
        for (o, &a) in out[off..off + hd].iter_mut().zip(&acc) {
            // |a| <= 2^57, r <= 2^30
            *o = div_recip(a as i128, rc) as i64;
        }
    }
}

/// `acc[c] = sum_s p[s] * v[s][off + c]` over the positions of `p`, one head's channels
/// (`acc.len()` of them).
#[inline(always)]
fn weighted_values(p: &[i32], vc: &[i32], d: usize, off: usize, acc: &mut [i64]) {
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
            let v8: &[i32; 8] = vc[at..at + 8].try_into().expect("8 channels");
            for (x, &v) in a.iter_mut().zip(v8) {
                *x += ps as i64 * v as i64;
            }
        }
        a8.copy_from_slice(&a);
    }
}

/// [`weighted_values`] position by position (the definition).
fn weighted_values_reference(p: &[i32], vc: &[i32], d: usize, off: usize, acc: &mut [i64]) {
    acc.iter_mut().for_each(|a| *a = 0);
    let hd = acc.len();
    for (s, &ps) in p.iter().enumerate() {
        let vh = &vc[s * d + off..s * d + off + hd];
        for (a, &v) in acc.iter_mut().zip(vh) {
            *a += ps as i64 * v as i64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_values_equal_the_definition() {
        let mut x = 5u64;
        let mut rnd = |m: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        for (len, d, hd) in [(1, 8, 8), (7, 128, 32), (256, 128, 32), (33, 96, 12)] {
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
            for off in (0..d).step_by(hd) {
                let (mut got, mut want) = (vec![7i64; hd], vec![0i64; hd]);
                weighted_values(&p, &vc, d, off, &mut got);
                weighted_values_reference(&p, &vc, d, off, &mut want);
                assert_eq!(got, want, "len={len} d={d} hd={hd} off={off}");
            }
        }
    }
}
