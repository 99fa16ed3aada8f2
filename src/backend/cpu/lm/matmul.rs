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
///
/// Register-blocked: `R` weight rows against `T` items per pass over `k`, so each weight load
/// (and its `abs`) serves `T` items and each activation load `R` rows. `acc[r * n + t]`
/// receives row `r`'s dot with item `t`; `w` holds whole rows of `k`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dots_avx2(w: &[i8], xs: &[i8], k: usize, n: usize, acc: &mut [i32]) {
    let rows = w.len() / k;
    let mut t = 0;
    // Four items at a time, two rows per block: 8 accumulators, 4 weight registers.
    while t + 4 <= n {
        let mut r = 0;
        while r + 2 <= rows {
            block_avx2::<2, 4>(w, xs, k, n, r, t, acc);
            r += 2;
        }
        if r < rows {
            block_avx2::<1, 4>(w, xs, k, n, r, t, acc);
        }
        t += 4;
    }
    // The last items one at a time (the decoder's one-item steps, the LM head's GEMV): eight
    // rows per block, whose eight sums are reduced together.
    while t < n {
        let mut r = 0;
        while r + 8 <= rows {
            rows8_avx2(w, xs, k, n, r, t, acc);
            r += 8;
        }
        while r + 4 <= rows {
            block_avx2::<4, 1>(w, xs, k, n, r, t, acc);
            r += 4;
        }
        while r < rows {
            block_avx2::<1, 1>(w, xs, k, n, r, t, acc);
            r += 1;
        }
        t += 1;
    }
}

/// Rows `r0..r0 + R` against items `t0..t0 + T` (see [`dots_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn block_avx2<const R: usize, const T: usize>(
    w: &[i8],
    xs: &[i8],
    k: usize,
    n: usize,
    r0: usize,
    t0: usize,
    acc: &mut [i32],
) {
    use std::arch::x86_64::*;
    let body = k / 32 * 32;
    let ones = _mm256_set1_epi16(1);
    let wp = w.as_ptr().add(r0 * k);
    let xp = xs.as_ptr().add(t0 * k);
    let mut a = [[_mm256_setzero_si256(); T]; R];
    let mut c = 0;
    while c < body {
        let mut wv = [_mm256_setzero_si256(); R];
        let mut aw = [_mm256_setzero_si256(); R];
        for r in 0..R {
            wv[r] = _mm256_loadu_si256(wp.add(r * k + c) as *const __m256i);
            aw[r] = _mm256_abs_epi8(wv[r]);
        }
        for t in 0..T {
            let xv = _mm256_loadu_si256(xp.add(t * k + c) as *const __m256i);
            for r in 0..R {
                let p = _mm256_maddubs_epi16(aw[r], _mm256_sign_epi8(xv, wv[r]));
                a[r][t] = _mm256_add_epi32(a[r][t], _mm256_madd_epi16(p, ones));
            }
        }
        c += 32;
    }
    for r in 0..R {
        let wr = std::slice::from_raw_parts(wp.add(r * k + body), k - body);
        for t in 0..T {
            let v = a[r][t];
            let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
            let tail = dot_generic(
                wr,
                std::slice::from_raw_parts(xp.add(t * k + body), k - body),
            );
            acc[(r0 + r) * n + t0 + t] = _mm_cvtsi128_si32(s) + tail;
        }
    }
}

/// Rows `r0..r0 + 8` against item `t`: as [`block_avx2`] with `R = 8, T = 1`, but the eight
/// row sums are reduced by one transposing `hadd` tree instead of eight horizontal sums (with
/// k = 128 those cost as much as the dot products themselves).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn rows8_avx2(
    w: &[i8],
    xs: &[i8],
    k: usize,
    n: usize,
    r0: usize,
    t: usize,
    acc: &mut [i32],
) {
    use std::arch::x86_64::*;
    let body = k / 32 * 32;
    let ones = _mm256_set1_epi16(1);
    let wp = w.as_ptr().add(r0 * k);
    let xp = xs.as_ptr().add(t * k);
    let mut a = [_mm256_setzero_si256(); 8];
    let mut c = 0;
    while c < body {
        let xv = _mm256_loadu_si256(xp.add(c) as *const __m256i);
        for (r, ar) in a.iter_mut().enumerate() {
            let wv = _mm256_loadu_si256(wp.add(r * k + c) as *const __m256i);
            let p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
            *ar = _mm256_add_epi32(*ar, _mm256_madd_epi16(p, ones));
        }
        c += 32;
    }
    // Lane i of `s` ends up as the sum of a[i]'s eight lanes (i32 adds wrap, and the exact
    // sums fit, so the order does not matter).
    let h01 = _mm256_hadd_epi32(a[0], a[1]);
    let h23 = _mm256_hadd_epi32(a[2], a[3]);
    let h45 = _mm256_hadd_epi32(a[4], a[5]);
    let h67 = _mm256_hadd_epi32(a[6], a[7]);
    let h0123 = _mm256_hadd_epi32(h01, h23);
    let h4567 = _mm256_hadd_epi32(h45, h67);
    let s = _mm256_add_epi32(
        _mm256_permute2x128_si256(h0123, h4567, 0x20),
        _mm256_permute2x128_si256(h0123, h4567, 0x31),
    );
    let mut sums = [0i32; 8];
    _mm256_storeu_si256(sums.as_mut_ptr() as *mut __m256i, s);
    let xt = std::slice::from_raw_parts(xp.add(body), k - body);
    for (r, &v) in sums.iter().enumerate() {
        let wr = std::slice::from_raw_parts(wp.add(r * k + body), k - body);
        acc[(r0 + r) * n + t] = v + dot_generic(wr, xt);
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

    /// `acc[r * n + t] = dot(w row r, item t)` for the whole rows in `w` (`k` each) and `n`
    /// items; `xu` is `xs` with the sign bit flipped (x + 128 as u8) and `row_sums` the rows'
    /// weight sums, both used by the VNNI kernel only. Activations must lie in [-127, 127], as
    /// `quantize_row` makes them (the AVX2 sign trick cannot negate -128).
    #[allow(clippy::too_many_arguments)]
    pub fn dots(
        self,
        w: &[i8],
        row_sums: &[i32],
        xs: &[i8],
        xu: &[u8],
        k: usize,
        n: usize,
        acc: &mut [i32],
    ) {
        let rows = w.len() / k.max(1);
        assert!(k > 0 && w.len() == rows * k && xs.len() >= n * k && acc.len() >= rows * n);
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (row_sums, xu);
        match self {
            #[cfg(target_arch = "x86_64")]
            Dot::Vnni => {
                assert!(xu.len() >= n * k && row_sums.len() >= rows && vnni());
                for (r, a) in acc.chunks_mut(n).take(rows).enumerate() {
                    // SAFETY: AVX-512 VNNI/BW are present (asserted); slices are in bounds.
                    unsafe { dot_rows_vnni(&w[r * k..(r + 1) * k], row_sums[r], xu, k, a) }
                }
            }
            #[cfg(target_arch = "x86_64")]
            Dot::Avx2 => {
                assert!(Isa::Avx2.available());
                // SAFETY: AVX2 is present (asserted); slices are in bounds (asserted above).
                unsafe { dots_avx2(w, xs, k, n, acc) }
            }
            _ => {
                for (r, a) in acc.chunks_mut(n).take(rows).enumerate() {
                    dot_rows_generic(&w[r * k..(r + 1) * k], xs, k, a);
                }
            }
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

/// Multiply-adds below which a matmul stays on the calling thread (the decoder's one-item
/// steps through the small layers cost less than waking the pool).
const SERIAL_MACS: usize = 1 << 18;

/// int8 x int8 -> i32 matmul with integer rescale: `n` items (rows of `xq`), output `n x rows`.
///
/// The weight rows are cut into tiles, one rayon task each; a tile's rows (at most 64 KiB of
/// weights for the LM head) stay in cache while every item passes over them.
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
    let rows = lin.rows;
    debug_assert_eq!(xq.len(), n * k);
    let mut out = vec![0i32; n * rows];
    if n == 0 || rows == 0 {
        return out;
    }
    let kernel = Dot::at(isa);
    let xu: Vec<u8> = if kernel == Dot::Vnni {
        xq.iter().map(|&v| v as u8 ^ 0x80).collect()
    } else {
        Vec::new()
    };
    let tms: Vec<i64> = sc.iter().map(|s| s.0).collect();
    let tes: Vec<i32> = sc.iter().map(|s| s.1).collect();
    // Tiles: at most 64 KiB of weights, at least 4 per thread when there is enough work.
    let threads = rayon::current_num_threads().max(1);
    let tile = if rows * k * n <= SERIAL_MACS {
        rows
    } else {
        rows.div_ceil(4 * threads)
            .min((1 << 16) / k)
            .max(SERIAL_MACS.div_ceil(n * k))
            .clamp(4, rows)
            .next_multiple_of(4)
    };
    let run_tile = |ti: usize, dst: &mut [i32]| {
        let j0 = ti * tile;
        let j1 = (j0 + tile).min(rows);
        // acc[r * n + t]: the dots of rows j0.. against every item.
        let mut acc = vec![0i32; (j1 - j0) * n];
        kernel.dots(
            &lin.w[j0 * k..j1 * k],
            &lin.row_sum[j0..j1],
            xq,
            &xu,
            k,
            n,
            &mut acc,
        );
        // The rows' `Linear::m16`, mapped over slices: per index (bounds checks, `unzip`)
        // these cost 7% of a one-item decode, as much as the dots of the tile.
        let ms: Vec<i64> = lin.m[j0..j1].iter().map(|&m| m >> 15).collect();
        let es: Vec<i32> = lin.e[j0..j1].iter().map(|&e| e - 15).collect();
        debug_assert!((j0..j1).all(|j| lin.m16(j) == (ms[j - j0], es[j - j0])));
        let bias = &lin.bias[j0..j1];
        if n == 1 {
            // One item: row-major and item-major are the same layout.
            rescale(
                isa, &acc, n, &ms, &es, bias, &tms, &tes, out_frac, clamp, dst,
            );
            return;
        }
        let mut res = vec![0i32; (j1 - j0) * n];
        rescale(
            isa, &acc, n, &ms, &es, bias, &tms, &tes, out_frac, clamp, &mut res,
        );
        // dst[t * (j1 - j0) + r]: item-major, as the caller lays the output out.
        for (r, row) in res.chunks_exact(n).enumerate() {
            for (t, &v) in row.iter().enumerate() {
                dst[t * (j1 - j0) + r] = v;
            }
        }
    };
    let tiles = rows.div_ceil(tile);
    if tiles == 1 {
        run_tile(0, &mut out);
        return out;
    }
    let outp = SyncPtr(out.as_mut_ptr());
    (0..tiles).into_par_iter().for_each(|ti| {
        let outp = &outp;
        let j0 = ti * tile;
        let w = (j0 + tile).min(rows) - j0;
        let mut part = vec![0i32; n * w];
        run_tile(ti, &mut part);
        for (t, src) in part.chunks_exact(w).enumerate() {
            // SAFETY: t < n and j0..j0 + w lie inside row t of `out`; tiles are disjoint, so
            // each element is written by exactly one task.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), outp.0.add(t * rows + j0), w) };
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
        // Row and item counts that reach every block shape and remainder of the tiles.
        for k in [1usize, 31, 32, 64, 128, 200, 768] {
            for (rows, n) in [
                (1, 1),
                (7, 1),
                (7, 4),
                (9, 7),
                (4, 9),
                (5, 13),
                (21, 1),
                (17, 6),
            ] {
                let w: Vec<i8> = (0..rows * k).map(|_| (rnd() % 256) as i32 as i8).collect();
                let xs: Vec<i8> = (0..n * k)
                    .map(|_| ((rnd() % 255) as i32 - 127) as i8)
                    .collect();
                let mut want = vec![0; rows * n];
                for (r, a) in want.chunks_mut(n).enumerate() {
                    dot_rows_generic(&w[r * k..(r + 1) * k], &xs, k, a);
                }
                let xu: Vec<u8> = xs.iter().map(|&v| v as u8 ^ 0x80).collect();
                let rs = Linear::row_sums(&w, k);
                for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                    let mut got = vec![0; rows * n];
                    Dot::at(isa).dots(&w, &rs, &xs, &xu, k, n, &mut got);
                    assert_eq!(got, want, "k={k} rows={rows} n={n} {isa:?}");
                }
            }
        }
    }
}
