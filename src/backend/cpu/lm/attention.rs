//! Causal attention of one item over its cached keys and values (docs/INTEGER_GPT2.md §4):
//! integer scores, the exp table, an exact reciprocal. One body, compiled plain and for AVX2.

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
        acc.iter_mut().for_each(|a| *a = 0);
        for (s, &ps) in p.iter().enumerate() {
            if ps == 0 {
                continue;
            }
            let vh = &vc[s * d + off..s * d + off + hd];
            for (a, &v) in acc.iter_mut().zip(vh) {
                *a += ps as i64 * v as i64;
            }
        }
        let rc = recip(total as i128);
        for (o, &a) in out[off..off + hd].iter_mut().zip(&acc) {
            // |a| <= 2^57, r <= 2^30
            *o = div_recip(a as i128, rc) as i64;
        }
    }
}
