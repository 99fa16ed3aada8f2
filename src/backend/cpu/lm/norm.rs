//! Integer LayerNorm and the per-row int8 quantization that feeds every matmul
//! (docs/INTEGER_GPT2.md §4). Plain Rust on every level: rows are short and the square root
//! and reciprocal dominate.

use rayon::prelude::*;

use super::split::Split;

use crate::format::lm::fixed::{div_recip, isqrt_u128, quantize_row, recip};
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
    let rc = if dd == 0 { (0, 0) } else { recip(dd) };
    for (i, &x) in row.iter().enumerate() {
        let dv = (n * x as i64 - s) as i128;
        // |dv| <= 2^40: dv * 2^22 * r <= 2^92.
        let z = if dd == 0 {
            0
        } else {
            div_recip(dv << (FZ + LN_G), rc)
        };
        out[i] = (ln.gamma[i] as i128 * z + ln.beta[i] as i128) as i64; // <= 2^51 + 2^40
    }
}

/// Per-row int8 quantization with integer scales.
pub fn quantize(y: &[i64], d: usize, frac: i32, split: Split) -> (Vec<i8>, Vec<(i64, i32)>) {
    let mut q = vec![0i8; y.len()];
    let scales = q
        .par_chunks_mut(d)
        .zip(y.par_chunks(d))
        .with_min_len(split.min_len(8))
        .map(|(qr, yr)| quantize_row(yr, frac, qr))
        .collect();
    (q, scales)
}
