//! The int8 matmul with integer rescale (docs/INTEGER_GPT2.md §4): the readable dot product,
//! then its AVX2 and AVX-512 VNNI versions, all giving the same i32 sums.

use rayon::prelude::*;

use super::rescale::rescale;
use crate::backend::cpu::Isa;
use crate::format::lm::model_file::Linear;

/// Reference dot product: int8 x int8 summed in i32 (exact in any order for k <= 2^17).
#[inline(always)]
pub fn dot_generic(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as i16 as i32) * (y as i16 as i32))
        .sum()
}

/// `out[t] = dot(w, xs[t*k..(t+1)*k])`: one weight row against every item (reference).
pub fn dot_rows_generic(w: &[i8], xs: &[i8], k: usize, out: &mut [i32]) {
    for (o, x) in out.iter_mut().zip(xs.chunks_exact(k)) {
        *o = dot_generic(w, x);
    }
}

/// AVX2: |w| (u8) times sign(x, w) (i8) with `maddubs` gives exact i16 pair sums
/// (|w| <= 128, |x| <= 127: 2 * 128 * 127 = 32512 < 2^15), widened by `madd` into i32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_rows_avx2(w: &[i8], xs: &[i8], k: usize, out: &mut [i32]) {
    use std::arch::x86_64::*;
    let body = k / 32 * 32;
    let ones = _mm256_set1_epi16(1);
    let hsum = |v: __m256i| -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        _mm_cvtsi128_si32(s)
    };
    let n = out.len();
    let mut t = 0;
    while t + 4 <= n {
        let x0 = xs.as_ptr().add(t * k);
        let (x1, x2, x3) = (x0.add(k), x0.add(2 * k), x0.add(3 * k));
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
            _mm256_setzero_si256(),
        );
        let mut c = 0;
        while c < body {
            let wv = _mm256_loadu_si256(w.as_ptr().add(c) as *const __m256i);
            let aw = _mm256_abs_epi8(wv);
            macro_rules! step {
                ($acc:ident, $x:ident) => {
                    let xv = _mm256_loadu_si256($x.add(c) as *const __m256i);
                    let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv));
                    $acc = _mm256_add_epi32($acc, _mm256_madd_epi16(p, ones));
                };
            }
            step!(a0, x0);
            step!(a1, x1);
            step!(a2, x2);
            step!(a3, x3);
            c += 32;
        }
        let tail = |x: *const i8| -> i32 {
            dot_generic(
                &w[body..k],
                std::slice::from_raw_parts(x.add(body), k - body),
            )
        };
        out[t] = hsum(a0) + tail(x0);
        out[t + 1] = hsum(a1) + tail(x1);
        out[t + 2] = hsum(a2) + tail(x2);
        out[t + 3] = hsum(a3) + tail(x3);
        t += 4;
    }
    while t < n {
        let x0 = xs.as_ptr().add(t * k);
        let mut a0 = _mm256_setzero_si256();
        let mut c = 0;
        while c < body {
            let wv = _mm256_loadu_si256(w.as_ptr().add(c) as *const __m256i);
            let xv = _mm256_loadu_si256(x0.add(c) as *const __m256i);
            let p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(p, ones));
            c += 32;
        }
        out[t] = hsum(a0)
            + dot_generic(
                &w[body..k],
                std::slice::from_raw_parts(x0.add(body), k - body),
            );
        t += 1;
    }
}

/// AVX-512 VNNI: `dpbusd` multiplies unsigned by signed bytes, so the activations go in as
/// `x + 128` (`xu`, u8) and `128 * sum(w)` is subtracted afterwards: exact, and no saturation
/// (`dpbusd` without `s` wraps, and |sum| stays far below 2^31).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dot_rows_vnni(w: &[i8], row_sum: i32, xu: &[u8], k: usize, out: &mut [i32]) {
    use std::arch::x86_64::*;
    let body = k / 64 * 64;
    // sum(w * x) = sum(w * (x + 128)) - 128 * sum(w), over the whole row.
    let bias = 128 * row_sum;
    let tail = |t: usize| -> i32 {
        w[body..k]
            .iter()
            .zip(&xu[t * k + body..(t + 1) * k])
            .map(|(&a, &b)| a as i32 * b as i32)
            .sum()
    };
    let n = out.len();
    let mut t = 0;
    while t + 4 <= n {
        let x0 = xu.as_ptr().add(t * k);
        let (x1, x2, x3) = (x0.add(k), x0.add(2 * k), x0.add(3 * k));
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
            _mm512_setzero_si512(),
        );
        let mut c = 0;
        while c < body {
            let wv = _mm512_loadu_si512(w.as_ptr().add(c) as *const _);
            a0 = _mm512_dpbusd_epi32(a0, _mm512_loadu_si512(x0.add(c) as *const _), wv);
            a1 = _mm512_dpbusd_epi32(a1, _mm512_loadu_si512(x1.add(c) as *const _), wv);
            a2 = _mm512_dpbusd_epi32(a2, _mm512_loadu_si512(x2.add(c) as *const _), wv);
            a3 = _mm512_dpbusd_epi32(a3, _mm512_loadu_si512(x3.add(c) as *const _), wv);
            c += 64;
        }
        out[t] = _mm512_reduce_add_epi32(a0) - bias + tail(t);
        out[t + 1] = _mm512_reduce_add_epi32(a1) - bias + tail(t + 1);
        out[t + 2] = _mm512_reduce_add_epi32(a2) - bias + tail(t + 2);
        out[t + 3] = _mm512_reduce_add_epi32(a3) - bias + tail(t + 3);
        t += 4;
    }
    while t < n {
        // One item: four independent accumulators hide the dpbusd latency.
        let x0 = xu.as_ptr().add(t * k);
        let mut acc = [_mm512_setzero_si512(); 4];
        let mut c = 0;
        while c + 256 <= body {
            for (u, a) in acc.iter_mut().enumerate() {
                let off = c + 64 * u;
                let wv = _mm512_loadu_si512(w.as_ptr().add(off) as *const _);
                *a = _mm512_dpbusd_epi32(*a, _mm512_loadu_si512(x0.add(off) as *const _), wv);
            }
            c += 256;
        }
        while c < body {
            let wv = _mm512_loadu_si512(w.as_ptr().add(c) as *const _);
            acc[0] = _mm512_dpbusd_epi32(acc[0], _mm512_loadu_si512(x0.add(c) as *const _), wv);
            c += 64;
        }
        let sum = _mm512_add_epi32(
            _mm512_add_epi32(acc[0], acc[1]),
            _mm512_add_epi32(acc[2], acc[3]),
        );
        out[t] = _mm512_reduce_add_epi32(sum) - bias + tail(t);
        t += 1;
    }
}

/// The dot-product kernel an instruction-set level runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dot {
    Generic,
    Avx2,
    /// AVX-512 VNNI (the `Avx512` level where the CPU has VNNI; AVX2 where it has not).
    Vnni,
}

impl Dot {
    /// The kernel of level `isa` (a level the CPU runs: `CpuLm` is only built for those).
    pub fn at(isa: Isa) -> Dot {
        match isa {
            Isa::Portable | Isa::Neon => Dot::Generic,
            Isa::Avx2 => Dot::Avx2,
            Isa::Avx512 if vnni() => Dot::Vnni,
            Isa::Avx512 => Dot::Avx2,
        }
    }

    /// One weight row against every item; `xu` is `xs` with the sign bit flipped
    /// (x + 128 as u8) and `row_sum` the sum of `w[..k]`, both used by the VNNI kernel only.
    /// Activations must lie in [-127, 127], as `quantize_row` makes them (the AVX2 sign trick
    /// cannot negate -128).
    #[allow(clippy::too_many_arguments)]
    pub fn rows(self, w: &[i8], row_sum: i32, xs: &[i8], xu: &[u8], k: usize, out: &mut [i32]) {
        assert!(w.len() >= k && xs.len() >= out.len() * k);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (row_sum, xu);
        match self {
            #[cfg(target_arch = "x86_64")]
            Dot::Vnni => {
                assert!(xu.len() >= out.len() * k);
                assert!(vnni());
                // SAFETY: AVX-512 VNNI/BW are present (asserted); slices are in bounds.
                unsafe { dot_rows_vnni(w, row_sum, xu, k, out) }
            }
            #[cfg(target_arch = "x86_64")]
            Dot::Avx2 => {
                assert!(Isa::Avx2.available());
                // SAFETY: AVX2 is present (asserted); slices are in bounds.
                unsafe { dot_rows_avx2(w, xs, k, out) }
            }
            _ => dot_rows_generic(w, xs, k, out),
        }
    }
}

/// Whether this CPU has the AVX-512 VNNI dot products.
fn vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512vnni") && std::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// int8 x int8 -> i32 matmul with integer rescale: `n` items (rows of `xq`), output `n x rows`.
pub fn matmul(
    isa: Isa,
    lin: &Linear,
    xq: &[i8],
    sc: &[(i64, i32)],
    out_frac: i32,
    clamp: i64,
) -> Vec<i32> {
    let k = lin.k;
    let n = sc.len();
    debug_assert_eq!(xq.len(), n * k);
    const CHUNK: usize = 64;
    let kernel = Dot::at(isa);
    let xu: Vec<u8> = if kernel == Dot::Vnni {
        xq.iter().map(|&v| v as u8 ^ 0x80).collect()
    } else {
        Vec::new()
    };
    let tms: Vec<i64> = sc.iter().map(|s| s.0).collect();
    let tes: Vec<i32> = sc.iter().map(|s| s.1).collect();
    let mut out = vec![0i32; n * lin.rows];
    let outp = SyncPtr(out.as_mut_ptr());
    let rows = lin.rows;
    (0..rows.div_ceil(CHUNK)).into_par_iter().for_each(|ci| {
        let outp = &outp;
        let j0 = ci * CHUNK;
        let j1 = (j0 + CHUNK).min(rows);
        // acc[r * n + t]: the dots of rows j0.. against every item.
        let mut acc = vec![0i32; (j1 - j0) * n];
        for (j, a) in (j0..j1).zip(acc.chunks_mut(n.max(1))) {
            let w = &lin.w[j * k..(j + 1) * k];
            kernel.rows(w, lin.row_sum[j], xq, &xu, k, a);
        }
        let (ms, es): (Vec<i64>, Vec<i32>) = (j0..j1).map(|j| lin.m16(j)).unzip();
        let bias = &lin.bias[j0..j1];
        let mut res = vec![0i32; (j1 - j0) * n];
        rescale(
            isa, &acc, n, &ms, &es, bias, &tms, &tes, out_frac, clamp, &mut res,
        );
        let mut row = vec![0i32; j1 - j0];
        for t in 0..n {
            for (r, o) in row.iter_mut().enumerate() {
                *o = res[r * n + t];
            }
            // SAFETY: t < n and j0..j1 lie inside row t of `out`; row chunks are disjoint, so
            // each element is written by exactly one task.
            unsafe {
                std::ptr::copy_nonoverlapping(row.as_ptr(), outp.0.add(t * rows + j0), j1 - j0)
            };
        }
    });
    out
}

/// A raw pointer that tasks writing disjoint elements may share.
struct SyncPtr(*mut i32);
// SAFETY: used only for writes to disjoint indices from rayon tasks that end before the
// owning vector is used again.
unsafe impl Sync for SyncPtr {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dot_kernel_equals_the_reference() {
        let mut x = 7u64;
        let mut rnd = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u32
        };
        for k in [1usize, 31, 32, 64, 128, 200, 768] {
            let w: Vec<i8> = (0..k).map(|_| (rnd() % 256) as i32 as i8).collect();
            let xs: Vec<i8> = (0..7 * k)
                .map(|_| ((rnd() % 255) as i32 - 127) as i8)
                .collect();
            let mut want = vec![0; 7];
            dot_rows_generic(&w, &xs, k, &mut want);
            let xu: Vec<u8> = xs.iter().map(|&v| v as u8 ^ 0x80).collect();
            let rs = w.iter().map(|&v| v as i32).sum();
            for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                let mut got = vec![0; 7];
                Dot::at(isa).rows(&w, rs, &xs, &xu, k, &mut got);
                assert_eq!(got, want, "k={k} {isa:?}");
            }
        }
    }
}
