//! Rescaling the matmul's i32 sums to the next stage's fixed point (docs/INTEGER_GPT2.md §4):
//! the definition, and the branch-free loop (plain and compiled for AVX-512) that computes
//! the same integers when every shift is in range.

use crate::backend::cpu::Isa;
use crate::format::lm::fixed::round_shift64;

/// `res[r][t] = clamp(round_shift(acc[r][t] * m[r] * t_m[t], e[r] + t_e[t] - out_frac) + b[r])`
/// (docs §4). When every shift is in 1..=63 (always, for real scales) a branch-free loop
/// the compiler vectorizes computes exactly the same integers as `round_shift64`.
#[allow(clippy::too_many_arguments)]
pub fn rescale(
    isa: Isa,
    acc: &[i32],
    n: usize,
    ms: &[i64],
    es: &[i32],
    bias: &[i32],
    tms: &[i64],
    tes: &[i32],
    out_frac: i32,
    clamp: i64,
    res: &mut [i32],
) {
    let (emin, emax) = (
        es.iter().min().copied().unwrap_or(0),
        es.iter().max().copied().unwrap_or(0),
    );
    let (tmin, tmax) = (
        tes.iter().min().copied().unwrap_or(0),
        tes.iter().max().copied().unwrap_or(0),
    );
    let fast = emin + tmin - out_frac >= 1 && emax + tmax - out_frac <= 63;
    if !fast {
        return rescale_reference(acc, n, ms, es, bias, tms, tes, out_frac, clamp, res);
    }
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512 && std::is_x86_feature_detected!("avx512dq") {
            // SAFETY: the `Avx512` level implies F and VL (`Isa::available`), DQ is checked;
            // the body is safe code compiled with them.
            unsafe { rescale_fast_avx512(acc, n, ms, es, bias, tms, tes, out_frac, clamp, res) };
            return;
        }
    }
    let _ = isa;
    rescale_fast(acc, n, ms, es, bias, tms, tes, out_frac, clamp, res)
}

/// The definition: every element through `round_shift64`.
#[allow(clippy::too_many_arguments)]
fn rescale_reference(
    acc: &[i32],
    n: usize,
    ms: &[i64],
    es: &[i32],
    bias: &[i32],
    tms: &[i64],
    tes: &[i32],
    out_frac: i32,
    clamp: i64,
    res: &mut [i32],
) {
    for r in 0..ms.len() {
        for t in 0..n {
            let prod = acc[r * n + t] as i64 * ms[r] * tms[t];
            let v = round_shift64(prod, es[r] + tes[t] - out_frac) + bias[r] as i64;
            res[r * n + t] = v.clamp(-clamp, clamp) as i32;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl")]
#[allow(clippy::too_many_arguments)]
unsafe fn rescale_fast_avx512(
    acc: &[i32],
    n: usize,
    ms: &[i64],
    es: &[i32],
    bias: &[i32],
    tms: &[i64],
    tes: &[i32],
    out_frac: i32,
    clamp: i64,
    res: &mut [i32],
) {
    rescale_fast(acc, n, ms, es, bias, tms, tes, out_frac, clamp, res)
}

/// The fast path of [`rescale`]: every shift is in 1..=63.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn rescale_fast(
    acc: &[i32],
    n: usize,
    ms: &[i64],
    es: &[i32],
    bias: &[i32],
    tms: &[i64],
    tes: &[i32],
    out_frac: i32,
    clamp: i64,
    res: &mut [i32],
) {
    if n == 1 {
        // One item (the decoder's steps): one pass down the rows, no per-row inner loop.
        let (tm, te) = (tms[0], tes[0] as i64);
        for ((((o, &a), &m), &e), &b) in res.iter_mut().zip(acc).zip(ms).zip(es).zip(bias) {
            let prod = a as i64 * m * tm;
            let s = (e - out_frac) as i64 + te;
            let v = ((prod + (1i64 << (s - 1))) >> s) + b as i64;
            *o = v.clamp(-clamp, clamp) as i32;
        }
        return;
    }
    for r in 0..ms.len() {
        let (m, b) = (ms[r], bias[r] as i64);
        let base = (es[r] - out_frac) as i64;
        let a = &acc[r * n..(r + 1) * n];
        let o = &mut res[r * n..(r + 1) * n];
        for t in 0..n {
            // |acc| <= 2^27, m < 2^16, t_m < 2^16: the product is below 2^59 (i64).
            let prod = a[t] as i64 * m * tms[t];
            let s = base + tes[t] as i64;
            let v = ((prod + (1i64 << (s - 1))) >> s) + b;
            o[t] = v.clamp(-clamp, clamp) as i32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_equals_the_definition() {
        for n in [1, 37] {
            every_level_equals_the_definition_at(n);
        }
    }

    fn every_level_equals_the_definition_at(n: usize) {
        let acc: Vec<i32> = (0..5 * n as i32)
            .map(|i| (i * 7919 % 20001 - 10000) * 3001)
            .collect();
        let ms = vec![32768i64, 40000, 65535, 50000, 33333];
        let es = vec![20, 30, 25, 41, 33];
        let bias = vec![0, 5, -7, 1 << 20, -3];
        let tms: Vec<i64> = (0..n as i64).map(|t| 32768 + t * 887).collect();
        let tes: Vec<i32> = (0..n as i32).map(|t| 10 + t % 9).collect();
        let mut want = vec![0; 5 * n];
        rescale_reference(&acc, n, &ms, &es, &bias, &tms, &tes, 12, 1 << 26, &mut want);
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            let mut got = vec![0; 5 * n];
            rescale(
                isa,
                &acc,
                n,
                &ms,
                &es,
                &bias,
                &tms,
                &tes,
                12,
                1 << 26,
                &mut got,
            );
            assert_eq!(got, want, "{isa:?}");
        }
    }
}
