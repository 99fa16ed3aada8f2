//! The int8 matmul with integer rescale (docs/INTEGER_GPT2.md §4): the readable dot product,
//! then its AVX2, AVX-VNNI and AVX-512 VNNI versions, all giving the same i32 sums.

// The VNNI and AMX paths are x86 code: elsewhere their fields and helpers go unused.
#![cfg_attr(not(target_arch = "x86_64"), allow(unused_imports, dead_code))]

use rayon::prelude::*;

use std::borrow::Cow;
use std::sync::atomic::{AtomicI32, Ordering};

use super::amx;
use super::rescale::{rescale, rescale_item_fast, RowScales};
#[cfg(target_arch = "x86_64")]
use super::rescale::{rescale8_avx2, Item8};
use super::split::Split;
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
#[cfg(test)]
pub fn dot_rows_generic(w: &[i8], xs: &[i8], k: usize, out: &mut [i32]) {
    for (o, x) in out.iter_mut().zip(xs.chunks_exact(k)) {
        *o = dot_generic(w, x);
    }
}

/// AVX2: |w| (u8) times sign(x, w) (i8) with `maddubs` gives exact i16 pair sums
/// (|w| <= 128, |x| <= 127: 2 * 128 * 127 = 32512 < 2^15), widened by `madd` into i32.
///
/// Register-blocked: `R` weight rows against `T` items per pass over `k`, so each weight load
/// (and its `abs`) serves `T` items and each activation load `R` rows. `acc[t * rows + r]`
/// receives row `r`'s dot with item `t` (item-major: the matmul's output layout, rescaled
/// item by item with no transpose); `w` holds whole rows of `k`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dots_avx2(w: &[i8], xs: &[i8], k: usize, n: usize, acc: &mut [i32]) {
    let rows = w.len() / k;
    let mut t = 0;
    // Four items at a time, two rows per block: 8 accumulators, 4 weight registers, their
    // eight sums reduced together.
    while t + 4 <= n {
        let mut r = 0;
        while r + 2 <= rows {
            block8_avx2::<2, 4>(w, xs, k, rows, r, t, acc);
            r += 2;
        }
        if r < rows {
            block_avx2::<1, 4>(w, xs, k, rows, r, t, acc);
        }
        t += 4;
    }
    // The last items one at a time (the decoder's one-item steps, the LM head's GEMV): eight
    // rows per block, whose eight sums are reduced together.
    while t < n {
        let mut r = 0;
        while r + 8 <= rows {
            block8_avx2::<8, 1>(w, xs, k, rows, r, t, acc);
            r += 8;
        }
        while r + 4 <= rows {
            block_avx2::<4, 1>(w, xs, k, rows, r, t, acc);
            r += 4;
        }
        while r < rows {
            block_avx2::<1, 1>(w, xs, k, rows, r, t, acc);
            r += 1;
        }
        t += 1;
    }
}

/// The `R x T` accumulators of `R` rows (from `wp`) against `T` items (from `xp`) over the
/// rows' whole 32-byte pieces: lane sums, not yet reduced.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn sums_avx2<const R: usize, const T: usize>(
    wp: *const i8,
    xp: *const i8,
    k: usize,
) -> [[std::arch::x86_64::__m256i; T]; R] {
    use std::arch::x86_64::*;
    let body = k / 32 * 32;
    let ones = _mm256_set1_epi16(1);
    let mut a = [[_mm256_setzero_si256(); T]; R];
    let mut c = 0;
    while c < body {
        if T == 1 {
            // One item: its bytes first, then each row streamed through (eight rows would
            // not fit the sixteen registers with their `abs` beside them).
            let xv = _mm256_loadu_si256(xp.add(c) as *const __m256i);
            for (r, ar) in a.iter_mut().enumerate() {
                let wv = _mm256_loadu_si256(wp.add(r * k + c) as *const __m256i);
                let p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
                ar[0] = _mm256_add_epi32(ar[0], _mm256_madd_epi16(p, ones));
            }
            c += 32;
            continue;
        }
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
    a
}

/// The eight lane sums of `a`, in its order (one transposing `hadd` tree: i32 adds wrap,
/// and the exact sums fit, so the order of the additions does not matter).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn reduce8(a: [std::arch::x86_64::__m256i; 8]) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let h01 = _mm256_hadd_epi32(a[0], a[1]);
    let h23 = _mm256_hadd_epi32(a[2], a[3]);
    let h45 = _mm256_hadd_epi32(a[4], a[5]);
    let h67 = _mm256_hadd_epi32(a[6], a[7]);
    let h0123 = _mm256_hadd_epi32(h01, h23);
    let h4567 = _mm256_hadd_epi32(h45, h67);
    _mm256_add_epi32(
        _mm256_permute2x128_si256(h0123, h4567, 0x20),
        _mm256_permute2x128_si256(h0123, h4567, 0x31),
    )
}

/// The dot of the bytes past the last whole 32 of rows `r` (from `wp`) and item `t`.
#[inline(always)]
unsafe fn tail(wp: *const i8, xp: *const i8, k: usize, r: usize, t: usize) -> i32 {
    let body = k / 32 * 32;
    dot_generic(
        std::slice::from_raw_parts(wp.add(r * k + body), k - body),
        std::slice::from_raw_parts(xp.add(t * k + body), k - body),
    )
}

/// Rows `r0..r0 + R` against items `t0..t0 + T` (see [`dots_avx2`]), each sum reduced on
/// its own (the blocks at the rows' and items' ends).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn block_avx2<const R: usize, const T: usize>(
    w: &[i8],
    xs: &[i8],
    k: usize,
    rows: usize,
    r0: usize,
    t0: usize,
    acc: &mut [i32],
) {
    use std::arch::x86_64::*;
    let (wp, xp) = (w.as_ptr().add(r0 * k), xs.as_ptr().add(t0 * k));
    let a = sums_avx2::<R, T>(wp, xp, k);
    for (r, ar) in a.iter().enumerate() {
        for (t, &v) in ar.iter().enumerate() {
            let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
            acc[(t0 + t) * rows + r0 + r] = _mm_cvtsi128_si32(s) + tail(wp, xp, k, r, t);
        }
    }
}

/// Rows `r0..r0 + R` against items `t0..t0 + T` with `R * T = 8` (see [`dots_avx2`]): as
/// [`block_avx2`], but the eight sums are reduced by one transposing `hadd` tree instead of
/// eight horizontal sums (with k = 128 those cost as much as the dot products themselves)
/// and stored item by item, `R` rows at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn block8_avx2<const R: usize, const T: usize>(
    w: &[i8],
    xs: &[i8],
    k: usize,
    rows: usize,
    r0: usize,
    t0: usize,
    acc: &mut [i32],
) {
    use std::arch::x86_64::*;
    debug_assert_eq!(R * T, 8);
    let (wp, xp) = (w.as_ptr().add(r0 * k), xs.as_ptr().add(t0 * k));
    let a = sums_avx2::<R, T>(wp, xp, k);
    // Item-major: sum `i` is row `i % R` of item `i / R`.
    let s = reduce8(std::array::from_fn(|i| a[i % R][i / R]));
    let mut sums = [0i32; 8];
    _mm256_storeu_si256(sums.as_mut_ptr() as *mut __m256i, s);
    if !k.is_multiple_of(32) {
        for (i, v) in sums.iter_mut().enumerate() {
            *v += tail(wp, xp, k, i % R, i / R);
        }
    }
    for (t, item) in sums.chunks_exact(R).enumerate() {
        acc[(t0 + t) * rows + r0..][..R].copy_from_slice(item);
    }
}

/// A layer's weights laid out for the AVX-512 VNNI kernel, built once per session.
///
/// `dpbusd` sums four u8 x i8 products into each of sixteen i32 lanes. With the rows in
/// groups of 16 and, inside a group, block `q` holding bytes `4q..4q + 4` of each of its 16
/// rows (64 bytes), one `dpbusd` of a block against an item's four activations broadcast to
/// every lane advances sixteen rows at once: lane `r` accumulates row `16g + r` and no
/// horizontal sum is needed (with k = 128 the per-row reductions of a row-major layout cost
/// as much as the products). `k` is padded to a multiple of 4 and the rows to a multiple of
/// 16 with zero weights, which add nothing.
///
/// The activations go in as `x + 128` (u8, `dpbusd` wants them unsigned) and `128 * sum(w)`
/// is subtracted per row afterwards: exact, and no saturation (`dpbusd` without `s` wraps,
/// and |sum| stays far below 2^31).
///
/// `k` is padded to a multiple of 64, so that 16 quads of a group are one AMX weight tile
/// ([`amx`]): calls of the item counts where the tiles win ([`amx_wins`]) run on them where
/// the CPU has them.
#[derive(Clone, Debug)]
pub struct VnniRows {
    w: Vec<i8>,
    /// `k` rounded up to a multiple of 64: the activations' stride in `xu`.
    pub kp: usize,
    /// `128 * row_sum` per row, padded with zeros to whole groups.
    bias: Vec<i32>,
    /// Which calls run on AMX tiles.
    amx: AmxUse,
    /// Read by the 256-bit AVX-VNNI kernel ([`Dot::AvxVnni`]) rather than the AVX-512 one.
    narrow: bool,
}

impl Default for VnniRows {
    fn default() -> VnniRows {
        VnniRows {
            w: Vec::new(),
            kp: 0,
            bias: Vec::new(),
            amx: AmxUse::Never,
            narrow: false,
        }
    }
}

/// Which calls of a [`VnniRows`] take the AMX tiles rather than the VNNI registers.
#[derive(Clone, Copy, Debug)]
enum AmxUse {
    /// None (no AMX here, or a layout for the other kernels).
    Never,
    /// Those of the item counts where the tiles are faster ([`amx_wins`]).
    ByShape,
    /// Those of at least this many items (tests of either kernel).
    #[cfg(test)]
    From(usize),
}

/// Whether `n` items against rows of `kp` bytes (padded `k`) run faster on the AMX tiles than
/// on the VNNI registers. Measured on a Sapphire-Rapids-class Xeon (`amx_vs_vnni_timing`,
/// one thread, the matmul's row tiles; AMX / VNNI time at k = 128 for the tinygpt2 shapes
/// and k = 768 / 3072 for GPT-2 small's): one item is VNNI's GEMV (AMX 1.1–3.9x slower); at
/// four items VNNI's 4 x 4 block fits exactly and a 16-item tile is used at a quarter (AMX
/// 0.92–1.69x, never clearly ahead); two items at k = 128 are a tie or VNNI (1.02–1.26x,
/// 0.63–0.71x at k = 768). Every other count runs VNNI's one-item remainder loop, where the
/// tiles win (0.23–0.93x at 3 and 5..16 items; 8 items at k = 128 is a tie, 0.85–1.11x).
fn amx_wins(n: usize, kp: usize) -> bool {
    !(n == 1 || n == 4 || (n == 2 && kp <= 128))
}

/// Rows (k, padded) longer than this take the VNNI kernel's long-row blocks
/// ([`VnniRows::each_block`]).
const LONG_ROWS: usize = 256;

impl VnniRows {
    /// The layout for `kernel` ([`Dot::Vnni`] or [`Dot::AvxVnni`]: the same bytes, read 16 or
    /// 8 rows per register; only the AVX-512 kernel's calls may go to AMX tiles).
    pub fn new(w: &[i8], row_sum: &[i32], k: usize, kernel: Dot) -> VnniRows {
        assert!(matches!(kernel, Dot::Vnni | Dot::AvxVnni));
        let rows = row_sum.len();
        let kp = k.next_multiple_of(64);
        let (groups, quads) = (rows.div_ceil(16), kp / 4);
        let mut p = vec![0i8; groups * quads * 64];
        // Four bytes at a time, groups on the pool (a session packs a GPT-2-small shape's
        // 124M weights).
        p.par_chunks_mut(quads * 64)
            .zip(w.par_chunks(16 * k))
            .for_each(|(dst, rows)| {
                for (lane, row) in rows.chunks_exact(k).enumerate() {
                    for (q, quad) in row.chunks(4).enumerate() {
                        let at = q * 64 + lane * 4;
                        dst[at..at + quad.len()].copy_from_slice(quad);
                    }
                }
            });
        let mut bias: Vec<i32> = row_sum.iter().map(|&s| 128 * s).collect();
        bias.resize(groups * 16, 0);
        let narrow = kernel == Dot::AvxVnni;
        let amx = if amx::available() && !narrow {
            AmxUse::ByShape
        } else {
            AmxUse::Never
        };
        VnniRows {
            w: p,
            kp,
            bias,
            amx,
            narrow,
        }
    }

    /// The same layout with calls of at least `items` items on AMX tiles (`usize::MAX`:
    /// never), where the CPU has them: for tests of either kernel.
    #[cfg(test)]
    pub fn with_amx_from(mut self, items: usize) -> VnniRows {
        self.amx = if amx::available() && items < usize::MAX && !self.narrow {
            AmxUse::From(items)
        } else {
            AmxUse::Never
        };
        self
    }

    /// `xu[t * kp + c] = xs[t * k + c] + 128` as u8, padded with 128 (x = 0).
    pub fn activations(&self, xs: &[i8], k: usize) -> Vec<u8> {
        let mut xu = vec![0x80u8; xs.len() / k.max(1) * self.kp];
        for (d, s) in xu.chunks_exact_mut(self.kp).zip(xs.chunks_exact(k)) {
            for (o, &v) in d.iter_mut().zip(s) {
                *o = v as u8 ^ 0x80;
            }
        }
        xu
    }

    /// `acc[t * (r1 - r0) + r - r0] = dot(row r, item t)` for rows `r0..r1` (`r0` a multiple
    /// of 16) and the `n` items of `xu` (from [`VnniRows::activations`]): item-major, the
    /// layout of the matmul's output, so a lane group is stored whole, not transposed.
    pub fn dots(&self, r0: usize, r1: usize, xu: &[u8], n: usize, acc: &mut [i32]) {
        assert!(r0.is_multiple_of(16) && r0 <= r1 && r1 <= self.bias.len());
        assert!(xu.len() >= n * self.kp && acc.len() >= (r1 - r0) * n);
        if self.narrow {
            assert!(avx_vnni());
            // SAFETY: AVX2 and AVX-VNNI are present (asserted); every access lies inside the
            // groups of rows r0..r1 (padded), the n items of `xu` and `acc` (asserted).
            return unsafe { self.dots_avx_vnni(r0, r1, xu, n, acc) };
        }
        assert!(vnni());
        // SAFETY: AVX-512 F/BW/VNNI are present (asserted); every access lies inside the
        // groups of rows r0..r1 (padded), the n items of `xu` and `acc` (asserted).
        unsafe { self.dots_vnni(r0, r1, xu, n, acc) }
    }

    /// [`VnniRows::dots`] on 256-bit registers (AVX-VNNI: the `vpdpbusd` of CPUs with
    /// AVX2 but no AVX-512, such as Intel's since Alder Lake): each group of 16 rows read
    /// as two halves of 8, a block's low and high 32 bytes. Sixteen registers instead of
    /// 32, so smaller blocks than the AVX-512 kernel's: four items against two halves (8
    /// accumulators beside the 4 broadcasts), one item against eight halves.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avxvnni")]
    unsafe fn dots_avx_vnni(&self, r0: usize, r1: usize, xu: &[u8], n: usize, acc: &mut [i32]) {
        use std::arch::x86_64::*;
        let mut store = |h: usize, t: usize, v: __m256i| {
            let row = h * 8;
            let dst = acc.as_mut_ptr().add(t * (r1 - r0) + row - r0);
            if r1 - row >= 8 {
                _mm256_storeu_si256(dst.cast(), v);
            } else {
                // The rows of the last half that exist (the rest is padding).
                let mut all = [0i32; 8];
                _mm256_storeu_si256(all.as_mut_ptr().cast(), v);
                std::ptr::copy_nonoverlapping(all.as_ptr(), dst, r1 - row);
            }
        };
        self.each_block_avx_vnni((r0 / 8, r1.div_ceil(8)), xu, n, &mut store);
    }

    /// The loop over items and halves of [`VnniRows::dots_avx_vnni`], each half's sums given
    /// to `store(half, item, sums)`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avxvnni")]
    #[inline]
    unsafe fn each_block_avx_vnni(
        &self,
        (h0, h1): (usize, usize),
        xu: &[u8],
        n: usize,
        store: &mut impl FnMut(usize, usize, std::arch::x86_64::__m256i),
    ) {
        let mut t = 0;
        while t + 4 <= n {
            let mut h = h0;
            while h + 2 <= h1 {
                self.block_avx_vnni::<2, 4>(h, t, xu, store);
                h += 2;
            }
            if h < h1 {
                self.block_avx_vnni::<1, 4>(h, t, xu, store);
            }
            t += 4;
        }
        while t < n {
            let mut h = h0;
            while h + 8 <= h1 {
                self.block_avx_vnni::<8, 1>(h, t, xu, store);
                h += 8;
            }
            while h < h1 {
                self.block_avx_vnni::<1, 1>(h, t, xu, store);
                h += 1;
            }
            t += 1;
        }
    }

    /// Halves `h0..h0 + H` (8 rows each: half `h` is group `h / 2`'s low or high 32 bytes)
    /// against items `t0..t0 + T`, each half's sums stored by `store(half, item, sums)`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avxvnni")]
    #[inline]
    unsafe fn block_avx_vnni<const H: usize, const T: usize>(
        &self,
        h0: usize,
        t0: usize,
        xu: &[u8],
        store: &mut impl FnMut(usize, usize, std::arch::x86_64::__m256i),
    ) {
        use std::arch::x86_64::*;
        let quads = self.kp / 4;
        let xp = xu.as_ptr().add(t0 * self.kp);
        let half = |h: usize| self.w.as_ptr().add(h / 2 * quads * 64 + h % 2 * 32);
        let wp: [*const i8; H] = std::array::from_fn(|i| half(h0 + i));
        let mut a = [[_mm256_setzero_si256(); T]; H];
        for q in 0..quads {
            let mut xb = [_mm256_setzero_si256(); T];
            for (t, x) in xb.iter_mut().enumerate() {
                *x = _mm256_set1_epi32(std::ptr::read_unaligned(
                    xp.add(t * self.kp + 4 * q) as *const i32
                ));
            }
            for (ah, p) in a.iter_mut().zip(&wp) {
                let wv = _mm256_loadu_si256(p.add(q * 64) as *const _);
                for (at, &x) in ah.iter_mut().zip(&xb) {
                    *at = _mm256_dpbusd_avx_epi32(*at, x, wv);
                }
            }
        }
        for (i, ah) in a.iter().enumerate() {
            let bias = _mm256_loadu_si256(self.bias.as_ptr().add((h0 + i) * 8) as *const _);
            for (t, &v) in ah.iter().enumerate() {
                store(h0 + i, t0 + t, _mm256_sub_epi32(v, bias));
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn dots_vnni(&self, r0: usize, r1: usize, xu: &[u8], n: usize, acc: &mut [i32]) {
        use std::arch::x86_64::*;
        let mut store = |g: usize, t: usize, v: __m512i| {
            let row = g * 16;
            // The rows of the last group that exist (the rest is padding).
            let live: __mmask16 = if r1 - row >= 16 {
                !0
            } else {
                (1 << (r1 - row)) - 1
            };
            let dst = acc.as_mut_ptr().add(t * (r1 - r0) + row - r0);
            _mm512_mask_storeu_epi32(dst, live, v);
        };
        let groups = (r0 / 16, r1.div_ceil(16));
        match self.kp > LONG_ROWS {
            true => self.each_block::<true>(groups, xu, n, &mut store),
            false => self.each_block::<false>(groups, xu, n, &mut store),
        }
    }

    /// Groups `g0..g0 + G` against items `t0..t0 + T` (see [`VnniRows::dots`]), each
    /// group's sums stored by `store(group, item, sums)`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn block<const G: usize, const T: usize>(
        &self,
        g0: usize,
        t0: usize,
        xu: &[u8],
        store: &mut impl FnMut(usize, usize, std::arch::x86_64::__m512i),
    ) {
        use std::arch::x86_64::*;
        let quads = self.kp / 4;
        let wp = self.w.as_ptr().add(g0 * quads * 64);
        let xp = xu.as_ptr().add(t0 * self.kp);
        let mut a = [[_mm512_setzero_si512(); T]; G];
        // Up to four items, their broadcasts first and the weights loaded one group at a
        // time; more items (the long rows' blocks), the G weights first and the items
        // broadcast one at a time. Either way the block's live registers (G x T
        // accumulators and what they read) fit the 32 without spilling: 3 x 8 with the
        // broadcasts first spilled and ran at 350 GMAC/s instead of 425, while 4 x 4 on the
        // short rows runs faster the first way.
        if T <= 4 {
            for q in 0..quads {
                let mut xb = [_mm512_setzero_si512(); T];
                for (t, x) in xb.iter_mut().enumerate() {
                    *x = _mm512_set1_epi32(std::ptr::read_unaligned(
                        xp.add(t * self.kp + 4 * q) as *const i32
                    ));
                }
                for (g, ag) in a.iter_mut().enumerate() {
                    let wv = _mm512_loadu_si512(wp.add((g * quads + q) * 64) as *const _);
                    for (at, &x) in ag.iter_mut().zip(&xb) {
                        *at = _mm512_dpbusd_epi32(*at, x, wv);
                    }
                }
            }
        } else {
            for q in 0..quads {
                let mut wv = [_mm512_setzero_si512(); G];
                for (g, w) in wv.iter_mut().enumerate() {
                    *w = _mm512_loadu_si512(wp.add((g * quads + q) * 64) as *const _);
                }
                for t in 0..T {
                    let x = _mm512_set1_epi32(std::ptr::read_unaligned(
                        xp.add(t * self.kp + 4 * q) as *const i32,
                    ));
                    for g in 0..G {
                        a[g][t] = _mm512_dpbusd_epi32(a[g][t], x, wv[g]);
                    }
                }
            }
        }
        for (g, ag) in a.iter().enumerate() {
            let bias = _mm512_loadu_si512(self.bias.as_ptr().add((g0 + g) * 16) as *const _);
            for (t, &v) in ag.iter().enumerate() {
                store(g0 + g, t0 + t, _mm512_sub_epi32(v, bias));
            }
        }
    }

    /// The loop over items and groups of [`VnniRows::dots`], each group's sums given to
    /// `store(group, item, sums)`; `LONG`: rows of more than [`LONG_ROWS`] (a constant, so
    /// that each caller's copy holds one loop nest: with both in one function the short
    /// rows' loops ran 10-15% slower).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn each_block<const LONG: bool>(
        &self,
        (g0, g1): (usize, usize),
        xu: &[u8],
        n: usize,
        store: &mut impl FnMut(usize, usize, std::arch::x86_64::__m512i),
    ) {
        use std::arch::x86_64::*;
        let on_amx = match self.amx {
            AmxUse::Never => false,
            AmxUse::ByShape => amx_wins(n, self.kp),
            #[cfg(test)]
            AmxUse::From(items) => n >= items,
        };
        if on_amx {
            let bias = &self.bias;
            let mut each = |g: usize, t: usize, sums: &[i32; 16]| {
                let v = _mm512_loadu_si512(sums.as_ptr().cast());
                let b = _mm512_loadu_si512(bias.as_ptr().add(g * 16).cast());
                store(g, t, _mm512_sub_epi32(v, b));
            };
            // SAFETY: `amx` is `Never` where AMX is not available (`new`,
            // `with_amx_from`); the groups lie inside the layout (the callers' asserts) and
            // `kp` is a multiple of 64.
            amx::dots(&self.w, self.kp / 4, (g0, g1), xu, n, &mut each);
            return;
        }
        if LONG {
            self.each_block_long((g0, g1), xu, n, store);
            return;
        }
        // Short rows (the shipped model's k = 128): a tile's weights stay in L1 and the
        // rescale of each block's sums is a large share, which 16 accumulators leave
        // registers for. Four items at a time against four groups (64 rows), then one
        // item at a time against eight (eight independent accumulators hide the latency
        // of `dpbusd`).
        let mut t = 0;
        while t + 4 <= n {
            let mut g = g0;
            while g + 4 <= g1 {
                self.block::<4, 4>(g, t, xu, store);
                g += 4;
            }
            while g < g1 {
                self.block::<1, 4>(g, t, xu, store);
                g += 1;
            }
            t += 4;
        }
        while t < n {
            let mut g = g0;
            while g + 8 <= g1 {
                self.block::<8, 1>(g, t, xu, store);
                g += 8;
            }
            while g < g1 {
                self.block::<1, 1>(g, t, xu, store);
                g += 1;
            }
            t += 1;
        }
    }

    /// [`VnniRows::each_block`] for rows longer than [`LONG_ROWS`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn each_block_long(
        &self,
        (g0, g1): (usize, usize),
        xu: &[u8],
        n: usize,
        store: &mut impl FnMut(usize, usize, std::arch::x86_64::__m512i),
    ) {
        // Long rows: the items in blocks of up to eight, as even as possible (27 items: 7,
        // 7, 7, 6), each block against the rows G groups at a time: G x T accumulators, each
        // weight load serving T items and each broadcast item G groups. A tile's weights
        // stream from L2 (it is wider than L1), so items per weight load is what counts: on
        // a Zen 5, 3 x 8 ran GPT-2 small's 255-item calls at 420-450 GMAC/s a core where 4 x
        // 4 ran at 325-350, its 27-item calls at 425-440 instead of 250-260
        // (`gpt2_small_matmul_timing`). Fewer items take more groups.
        let blocks = n.div_ceil(8);
        let mut t = 0;
        for b in 0..blocks {
            let size = (n - t).div_ceil(blocks - b);
            match size {
                8 => self.items::<3, 8>((g0, g1), t, xu, store),
                7 => self.items::<3, 7>((g0, g1), t, xu, store),
                6 => self.items::<4, 6>((g0, g1), t, xu, store),
                5 => self.items::<4, 5>((g0, g1), t, xu, store),
                4 => self.items::<4, 4>((g0, g1), t, xu, store),
                3 => self.items::<5, 3>((g0, g1), t, xu, store),
                2 => self.items::<6, 2>((g0, g1), t, xu, store),
                _ => self.items::<8, 1>((g0, g1), t, xu, store),
            }
            t += size;
        }
    }

    /// Items `t0..t0 + T` against groups `g0..g1`, `G` groups per block, the rest two and
    /// one at a time.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn items<const G: usize, const T: usize>(
        &self,
        (g0, g1): (usize, usize),
        t0: usize,
        xu: &[u8],
        store: &mut impl FnMut(usize, usize, std::arch::x86_64::__m512i),
    ) {
        let mut g = g0;
        while g + G <= g1 {
            self.block::<G, T>(g, t0, xu, store);
            g += G;
        }
        if G > 2 {
            while g + 2 <= g1 {
                self.block::<2, T>(g, t0, xu, store);
                g += 2;
            }
        }
        while g < g1 {
            self.block::<1, T>(g, t0, xu, store);
            g += 1;
        }
    }

    /// [`VnniRows::dots`] with the rescale fused: item `t`'s outputs of rows `r0..r1` (`r0` a
    /// multiple of 16) rescaled as [`rescale`] does ([`Fused`]) and written to
    /// `out[t * stride + r]`, straight from the accumulators (no buffer of sums, no second
    /// pass).
    ///
    /// # Safety
    /// `out` must be valid for writes at `t * stride + r` for every item `t < n` and row
    /// `r0 <= r < r1`, and no other thread may access those elements meanwhile.
    pub unsafe fn dots_rescaled(
        &self,
        (r0, r1): (usize, usize),
        xu: &[u8],
        f: &Fused,
        out: *mut i32,
        stride: usize,
    ) {
        let n = f.tms.len();
        assert!(r0.is_multiple_of(16) && r0 <= r1 && r1 <= self.bias.len());
        assert!(xu.len() >= n * self.kp && f.tes.len() == n);
        assert!(f.rows.ms.len() >= r1.next_multiple_of(16) && f.rows.es.len() >= f.rows.ms.len());
        assert!(f.rows.bias.len() >= f.rows.ms.len() && f.rows.lanes.len() >= 3 * f.rows.ms.len());
        assert!(f.tops.is_none_or(|t| t.len() == n));
        if self.narrow {
            assert!(avx_vnni());
            // SAFETY: AVX2 and AVX-VNNI are present (asserted); as below otherwise.
            return unsafe { self.dots_rescaled_avx_vnni((r0, r1), xu, f, out, stride) };
        }
        assert!(vnni());
        // SAFETY: AVX-512 F/BW/VNNI are present (asserted); reads lie inside the groups of
        // rows r0..r1 (padded, in this layout and in `f.rows`: asserted) and the n items of
        // `xu`; the writes are the caller's contract.
        unsafe {
            match self.kp > LONG_ROWS {
                true => self.dots_rescaled_vnni::<true>((r0, r1), xu, f, out, stride),
                false => self.dots_rescaled_vnni::<false>((r0, r1), xu, f, out, stride),
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn dots_rescaled_vnni<const LONG: bool>(
        &self,
        (r0, r1): (usize, usize),
        xu: &[u8],
        f: &Fused,
        out: *mut i32,
        stride: usize,
    ) {
        use std::arch::x86_64::*;
        let n = f.tms.len();
        // Item t's multiplier, and its exponent less the output fraction less 1, broadcast
        // where a group of its rows is rescaled: a broadcast load and a scalar subtraction
        // per 16 outputs instead of a vector of them allocated per call (99 calls per step
        // for the shipped model's head; the allocation is 64-byte aligned, so a memalign).
        let out_frac_1 = f.out_frac as i64 + 1;
        let item = |t: usize| {
            (
                _mm512_set1_epi64(f.tms[t]),
                _mm512_set1_epi64(f.tes[t] as i64 - out_frac_1),
            )
        };
        let (lo, hi) = (_mm512_set1_epi64(-f.clamp), _mm512_set1_epi64(f.clamp));
        let (zero, bit31) = (_mm512_setzero_si512(), _mm512_set1_epi64(1 << 31));
        // Each item's largest output so far, where the caller wants it: on the stack for the
        // calls of up to TOPS_ON_STACK items (the decoder's), else allocated.
        const TOPS_ON_STACK: usize = 32;
        let wanted = if f.tops.is_some() { n } else { 0 };
        let mut on_stack = [_mm512_set1_epi32(i32::MIN); TOPS_ON_STACK];
        let mut on_heap = Vec::new();
        let tops: &mut [__m512i] = if wanted <= TOPS_ON_STACK {
            &mut on_stack[..wanted]
        } else {
            on_heap.resize(wanted, _mm512_set1_epi32(i32::MIN));
            &mut on_heap
        };
        // Eight rows of one item (the even or the odd rows of a group: `a` holds their sums'
        // magnitudes in its low halves, `neg` their signs): `clamp(((a m t_m + 2^(s-1)) >>
        // s) + b)`, rescale_fast's integers, computed as `clamp((q + 2b + 1) >> 1)` with
        // `q = x >> (s-1)` (the same floor: the bits below s-1 cannot carry past the
        // halving, and `floor((q + 1) / 2) + b = floor((q + 1 + 2b) / 2)`; the lanes hold
        // `2b + 1`) of `x = |a| * (m * t_m)` (unsigned 32 x 32 -> 64 products, exact:
        // `m t_m < 2^32`), negated where `a < 0`. No i64 overflow: `|a| <= 2^14 k <= 2^30`
        // (`RowScales::fast` admits k <= 2^16 only), so `|q| <= |x| < 2^62`, and `|2b + 1|
        // <= 2^32`.
        let eight = |a: __m512i, neg: __mmask8, at: *const i64, (tm, sh): (__m512i, __m512i)| {
            let m = _mm512_loadu_si512(at.cast());
            let e = _mm512_loadu_si512(at.add(16).cast());
            let b21 = _mm512_loadu_si512(at.add(32).cast());
            let x = _mm512_mul_epu32(a, _mm512_mul_epu32(m, tm));
            let x = _mm512_mask_sub_epi64(x, neg, zero, x);
            let q = _mm512_srav_epi64(x, _mm512_add_epi64(e, sh));
            let v = _mm512_srai_epi64::<1>(_mm512_add_epi64(q, b21));
            _mm512_min_epi64(_mm512_max_epi64(v, lo), hi)
        };
        let mut store = |g: usize, t: usize, v: __m512i| {
            let row = g * 16;
            // Even rows in the low halves of the 64-bit lanes, odd rows in the high ones:
            // no widening, and the results interleave back with one blend.
            let at = f.rows.lanes.as_ptr().add(g * 48);
            let mag = _mm512_abs_epi32(v);
            let scale = item(t);
            let even = eight(mag, _mm512_test_epi64_mask(v, bit31), at, scale);
            let odd = eight(
                _mm512_srli_epi64::<32>(mag),
                _mm512_cmplt_epi64_mask(v, zero),
                at.add(8),
                scale,
            );
            let r = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64::<32>(odd));
            // The rows of the last group that exist (the rest is padding).
            let live: __mmask16 = if r1 - row >= 16 {
                !0
            } else {
                (1 << (r1 - row)) - 1
            };
            // A whole store where every row is live: a masked one costs more on AMD cores.
            if live == !0 {
                _mm512_storeu_si512(out.add(t * stride + row).cast(), r);
            } else {
                _mm512_mask_storeu_epi32(out.add(t * stride + row), live, r);
            }
            if let Some(top) = tops.get_mut(t) {
                // A whole register stored where every row is live (all groups but the
                // last): the masked store `mask_max` compiles to cannot forward to the next
                // group's load of the same top on AMD cores, which then waits for the store
                // to reach the cache (16% of this function's samples on a Zen 5).
                *top = if live == !0 {
                    _mm512_max_epi32(*top, r)
                } else {
                    _mm512_mask_max_epi32(*top, live, *top, r)
                };
            }
        };
        self.each_block::<LONG>((r0 / 16, r1.div_ceil(16)), xu, n, &mut store);
        if let Some(all) = f.tops {
            for (a, &t) in all.iter().zip(&*tops) {
                a.fetch_max(_mm512_reduce_max_epi32(t), Ordering::Relaxed);
            }
        }
    }

    /// [`VnniRows::dots_rescaled`] on the AVX-VNNI kernel: each half's eight sums rescaled
    /// in registers by [`rescale8_avx2`] (the AVX2 level's rescale) as they leave the block,
    /// stored, and each item's top kept where wanted.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avxvnni")]
    unsafe fn dots_rescaled_avx_vnni(
        &self,
        (r0, r1): (usize, usize),
        xu: &[u8],
        f: &Fused,
        out: *mut i32,
        stride: usize,
    ) {
        use std::arch::x86_64::*;
        let n = f.tms.len();
        // Each item's largest output so far, where the caller wants it: on the stack for the
        // calls of up to TOPS_ON_STACK items (the decoder's), else allocated.
        const TOPS_ON_STACK: usize = 32;
        let wanted = if f.tops.is_some() { n } else { 0 };
        let mut on_stack = [_mm256_set1_epi32(i32::MIN); TOPS_ON_STACK];
        let mut on_heap = Vec::new();
        let tops: &mut [__m256i] = if wanted <= TOPS_ON_STACK {
            &mut on_stack[..wanted]
        } else {
            on_heap.resize(wanted, _mm256_set1_epi32(i32::MIN));
            &mut on_heap
        };
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let mut store = |h: usize, t: usize, v: __m256i| {
            let row = h * 8;
            let item = Item8::new(f.tms[t], f.tes[t] - f.out_frac, f.clamp);
            let r = rescale8_avx2(v, f.rows.lanes8(row), &item);
            // The rows of the last half that exist (the rest is padding).
            let live = (r1 - row).min(8);
            let dst = out.add(t * stride + row);
            if live == 8 {
                _mm256_storeu_si256(dst.cast(), r);
            } else {
                let mut all = [0i32; 8];
                _mm256_storeu_si256(all.as_mut_ptr().cast(), r);
                std::ptr::copy_nonoverlapping(all.as_ptr(), dst, live);
            }
            if let Some(top) = tops.get_mut(t) {
                let r = if live == 8 {
                    r
                } else {
                    let alive = _mm256_cmpgt_epi32(_mm256_set1_epi32(live as i32), lane);
                    _mm256_blendv_epi8(_mm256_set1_epi32(i32::MIN), r, alive)
                };
                *top = _mm256_max_epi32(*top, r);
            }
        };
        self.each_block_avx_vnni((r0 / 8, r1.div_ceil(8)), xu, n, &mut store);
        if let Some(all) = f.tops {
            for (a, &t) in all.iter().zip(&*tops) {
                let m = _mm_max_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
                let m = _mm_max_epi32(m, _mm_shuffle_epi32::<0b01_00_11_10>(m));
                let m = _mm_max_epi32(m, _mm_shuffle_epi32::<0b10_11_00_01>(m));
                a.fetch_max(_mm_cvtsi128_si32(m), Ordering::Relaxed);
            }
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn dots_rescaled_avx_vnni(
        &self,
        _: (usize, usize),
        _: &[u8],
        _: &Fused,
        _: *mut i32,
        _: usize,
    ) {
        unreachable!("avx_vnni() is false off x86_64")
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn dots_rescaled_vnni<const LONG: bool>(
        &self,
        _: (usize, usize),
        _: &[u8],
        _: &Fused,
        _: *mut i32,
        _: usize,
    ) {
        unreachable!("vnni() is false off x86_64")
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn dots_vnni(&self, _: usize, _: usize, _: &[u8], _: usize, _: &mut [i32]) {
        unreachable!("vnni() is false off x86_64")
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn dots_avx_vnni(&self, _: usize, _: usize, _: &[u8], _: usize, _: &mut [i32]) {
        unreachable!("avx_vnni() is false off x86_64")
    }
}

/// The dot-product kernel an instruction-set level runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dot {
    Generic,
    Avx2,
    /// AVX-VNNI: `vpdpbusd` on 256-bit registers, for the `Avx2` level where the CPU has it
    /// (Intel since Alder Lake and Sapphire Rapids, AMD since Zen 5; laptops without AVX-512
    /// among them). The [`VnniRows`] layout, eight rows per register.
    AvxVnni,
    /// AVX-512 VNNI (the `Avx512` level where the CPU has VNNI; AVX-VNNI or AVX2 where it
    /// has not).
    Vnni,
}

impl Dot {
    /// The kernel of level `isa` (a level the CPU runs: `CpuLm` is only built for those).
    pub fn at(isa: Isa) -> Dot {
        match isa {
            Isa::Portable | Isa::Neon => Dot::Generic,
            Isa::Avx512 if vnni() => Dot::Vnni,
            Isa::Avx2 | Isa::Avx512 if avx_vnni() => Dot::AvxVnni,
            Isa::Avx2 | Isa::Avx512 => Dot::Avx2,
        }
    }

    /// Whether this kernel reads the [`VnniRows`] layout.
    fn vnni_layout(self) -> bool {
        matches!(self, Dot::Vnni | Dot::AvxVnni)
    }

    /// `acc[t * rows + r] = dot(w row r, item t)` for the whole rows in `w` (`k` each) and `n`
    /// items: item-major, the layout of the matmul's output. Activations must lie in [-127,
    /// 127], as `quantize_row` makes them (the AVX2 sign trick cannot negate -128). The VNNI
    /// kernel reads its own layout ([`VnniRows`]); here it stands in with the AVX2 one.
    pub fn dots(self, w: &[i8], xs: &[i8], k: usize, n: usize, acc: &mut [i32]) {
        let rows = w.len() / k.max(1);
        assert!(k > 0 && w.len() == rows * k && xs.len() >= n * k && acc.len() >= rows * n);
        match self {
            #[cfg(target_arch = "x86_64")]
            Dot::Avx2 | Dot::AvxVnni | Dot::Vnni => {
                assert!(Isa::Avx2.available());
                // SAFETY: AVX2 is present (asserted); slices are in bounds (asserted above).
                unsafe { dots_avx2(w, xs, k, n, acc) }
            }
            _ => {
                for (a, x) in acc.chunks_mut(rows).zip(xs.chunks_exact(k)).take(n) {
                    for (o, wr) in a.iter_mut().zip(w.chunks_exact(k)) {
                        *o = dot_generic(wr, x);
                    }
                }
            }
        }
    }
}

/// A linear layer prepared once per session for the kernel of one level: the VNNI layout
/// where that kernel runs, and the rows' 16-bit rescale multipliers ([`Linear::m16`]) as
/// the rescale reads them (mapped per call, they cost as much as a one-item GEMV's dots).
/// The layer is the model's, borrowed, or a copy with its rows reordered
/// ([`CpuLinear::rows_in_order`]).
pub struct CpuLinear<'m> {
    lin: Cow<'m, Linear>,
    kernel: Dot,
    vnni: VnniRows,
    scales: RowScales,
}

/// What [`VnniRows::dots_rescaled`] needs to rescale one call's sums in registers: the
/// layer's rows, the items' scales, the output's fraction and clamp (as [`rescale`] takes
/// them), for a call that [`RowScales::fast`] admits.
pub struct Fused<'a> {
    pub rows: &'a RowScales,
    pub tms: &'a [i64],
    pub tes: &'a [i32],
    pub out_frac: i32,
    pub clamp: i64,
    /// Where each item's largest output goes (`fetch_max`: tiles run in parallel), if wanted.
    pub tops: Option<&'a [AtomicI32]>,
}

impl<'m> CpuLinear<'m> {
    /// Output rows and inputs per row.
    pub fn shape(&self) -> (usize, usize) {
        (self.lin.rows, self.lin.k)
    }

    pub fn new(isa: Isa, lin: &'m Linear) -> CpuLinear<'m> {
        Self::prepare(isa, Cow::Borrowed(lin))
    }

    /// `lin` with row `p` holding row `rows[p]` (a permutation of its rows): the layer whose
    /// output `p` is the original's output `rows[p]`, exactly.
    pub fn rows_in_order(isa: Isa, lin: &Linear, rows: &[u32]) -> CpuLinear<'m> {
        let k = lin.k;
        let pick = |v: &[i32]| rows.iter().map(|&r| v[r as usize]).collect();
        let lin = Linear {
            rows: rows.len(),
            k,
            w: rows
                .iter()
                .flat_map(|&r| &lin.w[r as usize * k..(r as usize + 1) * k])
                .copied()
                .collect(),
            m: rows.iter().map(|&r| lin.m[r as usize]).collect(),
            e: pick(&lin.e),
            bias: pick(&lin.bias),
            row_sum: pick(&lin.row_sum),
        };
        Self::prepare(isa, Cow::Owned(lin))
    }

    fn prepare(isa: Isa, lin: Cow<'m, Linear>) -> CpuLinear<'m> {
        Self::with_kernel(Dot::at(isa), lin)
    }

    /// The layer prepared for `kernel` (tests: the AVX2 level's plain kernel on a CPU whose
    /// AVX2 level runs AVX-VNNI).
    fn with_kernel(kernel: Dot, lin: Cow<'m, Linear>) -> CpuLinear<'m> {
        let vnni = if kernel.vnni_layout() {
            VnniRows::new(&lin.w, &lin.row_sum, lin.k, kernel)
        } else {
            VnniRows::default()
        };
        let scales = RowScales::new(&lin);
        CpuLinear {
            lin,
            kernel,
            vnni,
            scales,
        }
    }

    /// The layer with calls of at least `items` items on AMX tiles, where the CPU has them
    /// ([`VnniRows::with_amx_from`]).
    #[cfg(test)]
    fn with_amx_from(mut self, items: usize) -> CpuLinear<'m> {
        self.vnni = std::mem::take(&mut self.vnni).with_amx_from(items);
        self
    }
}

/// Whether the matmul of level `isa` runs AMX-INT8 tiles for batched calls here.
pub fn amx_at(isa: Isa) -> bool {
    Dot::at(isa) == Dot::Vnni && amx::available()
}

/// Whether the matmul of level `isa` runs the 256-bit AVX-VNNI kernel here.
pub fn avx_vnni_at(isa: Isa) -> bool {
    Dot::at(isa) == Dot::AvxVnni
}

/// Whether this CPU has the 256-bit AVX-VNNI dot products (beside AVX2).
fn avx_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avxvnni") && Isa::Avx2.available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
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

/// The rows of one tile of a matmul of `n` items: at most 64 KiB of weights, at least 4
/// tiles per thread when there is enough work; whole groups of 16 rows, as the VNNI layout
/// holds them.
fn tile_rows(rows: usize, k: usize, n: usize, split: Split) -> usize {
    if rows * k * n <= SERIAL_MACS || (n == 1 && !split.is_parallel()) {
        rows
    } else {
        rows.div_ceil(4 * split.threads())
            .min((1 << 16) / k)
            .max(SERIAL_MACS.div_ceil(n * k))
            .clamp(16, rows.max(16))
            .next_multiple_of(16)
    }
}

/// [`matmul_tops`] into a new vector, without the tops (the tests' form).
#[cfg(test)]
pub fn matmul(
    isa: Isa,
    split: Split,
    cl: &CpuLinear,
    xq: &[i8],
    sc: &[(i64, i32)],
    out_frac: i32,
    clamp: i64,
) -> Vec<i32> {
    let mut out = Vec::new();
    matmul_tops(isa, split, cl, xq, sc, out_frac, clamp, false, &mut out);
    out
}

/// int8 x int8 -> i32 matmul with integer rescale: `n` items (rows of `xq`), output `n x rows`.
///
/// The weight rows are cut into tiles, one rayon task each in a parallel step (run in order
/// on this thread in a serial one); a tile's rows (at most 64 KiB of weights for the LM head)
/// stay in cache while every item passes over them. One item reads each weight once, so a
/// serial step gives it one tile (no per-tile buffers).
///
/// The output goes into `out` (its old contents replaced; its storage reused: the LM head's
/// logits are tens of MB a step, which fresh from the allocator are fresh pages, faulted in
/// and zeroed by the kernel every step). Each item's largest output is returned where
/// `want_tops` and the kernel found it on the way (the fused VNNI rescale: the LM head's
/// logits then need no pass for their top).
#[allow(clippy::too_many_arguments)]
pub fn matmul_tops(
    isa: Isa,
    split: Split,
    cl: &CpuLinear,
    xq: &[i8],
    sc: &[(i64, i32)],
    out_frac: i32,
    clamp: i64,
    want_tops: bool,
    out: &mut Vec<i32>,
) -> Option<Vec<i32>> {
    let lin = &*cl.lin;
    let k = lin.k;
    let n = sc.len();
    let rows = lin.rows;
    debug_assert_eq!(xq.len(), n * k);
    // The outputs are i32; the AVX2 rescale doubles the bound.
    assert!(
        (0..=i32::MAX as i64).contains(&clamp),
        "matmul clamp {clamp}"
    );
    if n == 0 || rows == 0 {
        out.clear();
        return None;
    }
    let xu: Vec<u8> = if cl.kernel.vnni_layout() {
        cl.vnni.activations(xq, k)
    } else {
        Vec::new()
    };
    let tms: Vec<i64> = sc.iter().map(|s| s.0).collect();
    let tes: Vec<i32> = sc.iter().map(|s| s.1).collect();
    let tile = tile_rows(rows, k, n, split);
    let tiles = rows.div_ceil(tile);
    // Once per call, not per item: whether every item's rescale takes the branch-free path.
    let fast = cl.scales.fast(&tms, &tes, out_frac);
    if cl.kernel.vnni_layout() && fast {
        // The rescale in the dot kernel's registers: every output written once, in place.
        let tops: Vec<AtomicI32> = match want_tops {
            true => (0..n).map(|_| AtomicI32::new(i32::MIN)).collect(),
            false => Vec::new(),
        };
        let f = Fused {
            rows: &cl.scales,
            tms: &tms,
            tes: &tes,
            out_frac,
            clamp,
            tops: want_tops.then_some(&tops[..]),
        };
        out.clear();
        out.reserve(n * rows);
        let outp = SyncPtr(out.as_mut_ptr());
        (0..tiles)
            .into_par_iter()
            .with_min_len(split.min_len(1))
            .for_each(|ti| {
                let j0 = ti * tile;
                let outp = &outp;
                // SAFETY: the tile writes item t's rows j0..j1 at t * rows + j of `out`'s
                // n * rows capacity; tiles are disjoint and end before `out` is used again.
                unsafe {
                    cl.vnni
                        .dots_rescaled((j0, (j0 + tile).min(rows)), &xu, &f, outp.0, rows)
                };
            });
        // SAFETY: the tiles cover every row of every item: all n * rows elements are written.
        unsafe { out.set_len(n * rows) };
        return want_tops.then(|| tops.into_iter().map(AtomicI32::into_inner).collect());
    }
    // Every element is written below: the old contents stay where they fit (zeroing the LM
    // head's logits, tens of MB a step, was a twentieth of a batched AVX2 encode).
    out.truncate(n * rows);
    out.resize(n * rows, 0);
    // `dst[t]` is where item t's outputs of the tile's rows go (w of them).
    let run_tile = |ti: usize, dst: &mut [&mut [i32]]| {
        let j0 = ti * tile;
        let j1 = (j0 + tile).min(rows);
        let w = j1 - j0;
        let (ms, es) = (&cl.scales.ms[j0..j1], &cl.scales.es[j0..j1]);
        let bias = &cl.scales.bias[j0..j1];
        let scales = &cl.scales;
        ACC.with(|acc| {
            let acc = &mut *acc.borrow_mut();
            // Only grown: the kernels write every sum they are asked for (a zeroed buffer per
            // tile was a twentieth of a batched AVX2 encode).
            if acc.len() < w * n {
                acc.resize(w * n, 0);
            }
            let acc = &mut acc[..w * n];
            // Item-major sums: each item's row of the output is rescaled on its own (a
            // transpose of row-major sums cost a fifth of a batched encode).
            if cl.kernel.vnni_layout() {
                cl.vnni.dots(j0, j1, &xu, n, acc);
            } else {
                cl.kernel.dots(&lin.w[j0 * k..j1 * k], xq, k, n, acc);
            }
            for (t, a) in acc.chunks_exact(w).enumerate() {
                let (tm, te) = (&tms[t..t + 1], &tes[t..t + 1]);
                if fast {
                    let (tm, te) = (tm[0], te[0]);
                    rescale_item_fast(isa, a, scales, j0, tm, te, out_frac, clamp, dst[t]);
                } else {
                    rescale(isa, a, 1, ms, es, bias, tm, te, out_frac, clamp, dst[t]);
                }
            }
        });
    };
    if tiles == 1 {
        run_tile(0, &mut out.chunks_exact_mut(rows).collect::<Vec<_>>());
        return None;
    }
    // Each tile writes its rows of every item's output in place (no tile-sized copy).
    let outp = SyncPtr(out.as_mut_ptr());
    (0..tiles)
        .into_par_iter()
        .with_min_len(split.min_len(1))
        .for_each(|ti| {
            let outp = &outp;
            let j0 = ti * tile;
            let w = (j0 + tile).min(rows) - j0;
            let mut dst: Vec<&mut [i32]> = (0..n)
                // SAFETY: t < n and j0..j0 + w lie inside row t of `out`; tiles are disjoint,
                // so no two slices of any task overlap; the tasks end before `out` is used
                // again.
                .map(|t| unsafe { std::slice::from_raw_parts_mut(outp.0.add(t * rows + j0), w) })
                .collect();
            run_tile(ti, &mut dst);
        });
    None
}

thread_local! {
    /// One tile's sums (item-major), kept per thread across calls.
    static ACC: std::cell::RefCell<Vec<i32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A raw pointer that tasks writing disjoint elements may share.
struct SyncPtr(*mut i32);
// SAFETY: used only for writes to disjoint indices from rayon tasks that end before the
// owning vector is used again.
unsafe impl Sync for SyncPtr {}

#[cfg(test)]
mod tests {
    use super::super::rescale::rescale_reference;
    use super::*;
    use crate::format::lm::fixed::quantize_row;

    /// Every level this CPU runs with its kernel, and the AVX2 level's plain kernel too
    /// where that level runs AVX-VNNI (the kernel of AVX2 CPUs without it).
    fn kernels_here() -> Vec<(Isa, Dot)> {
        let mut v: Vec<(Isa, Dot)> = Isa::ALL
            .into_iter()
            .filter(|i| i.available())
            .map(|i| (i, Dot::at(i)))
            .collect();
        if Dot::at(Isa::Avx2) == Dot::AvxVnni {
            v.push((Isa::Avx2, Dot::Avx2));
        }
        v
    }

    /// A `rows x k` layer of random int8 weights with real-like scales: multipliers in
    /// [2^30, 2^31), shifts `e_base + 0..9`, small biases (values drawn in that order).
    fn random_linear(rnd: &mut impl FnMut() -> u64, rows: usize, k: usize, e_base: i32) -> Linear {
        let w: Vec<i8> = (0..rows * k).map(|_| rnd() as u8 as i8).collect();
        Linear {
            rows,
            k,
            m: (0..rows)
                .map(|_| (1 << 30) + (rnd() as i64 % (1 << 30)))
                .collect(),
            e: (0..rows).map(|_| e_base + (rnd() % 9) as i32).collect(),
            bias: (0..rows).map(|_| rnd() as i32 % 5000 - 2500).collect(),
            row_sum: Linear::row_sums(&w, k),
            w,
        }
    }

    /// The whole matmul (dots, rescale, tiles) at every level, serial and parallel, equals
    /// the definition (the portable level included): real-like scales (the fused rescale of the VNNI kernel), scales
    /// whose shifts leave 1..=63 (the unfused path), row counts off the groups of 16, one
    /// item and many, rescale ties and clamps.
    #[test]
    fn matmul_at_every_level_equals_the_definition() {
        let mut next = super::super::test_lcg(41);
        let mut rnd = move || next() >> 33;
        for (rows, k, n, e_base) in [
            (50usize, 128usize, 1usize, 30i32),
            (1000, 128, 9, 30),
            (70, 64, 4, 30),
            (33, 768, 5, 34),
            (40, 32, 3, -20),
            (17, 32, 2, 90),
        ] {
            let lin = random_linear(&mut rnd, rows, k, e_base);
            let y: Vec<i64> = (0..n * k)
                .map(|i| (rnd() as i64 - (1 << 30)) >> (i % 11))
                .collect();
            let mut xq = vec![0i8; n * k];
            let sc: Vec<(i64, i32)> = xq
                .chunks_exact_mut(k)
                .zip(y.chunks_exact(k))
                .map(|(q, y)| quantize_row(y, 26, q))
                .collect();
            for clamp in [1 << 20, 3000] {
                // The definition (docs/INTEGER_GPT2.md §4): every dot in i32, rescaled by
                // `rescale_reference`; item-major.
                let (ms, es): (Vec<i64>, Vec<i32>) = (0..rows).map(|j| lin.m16(j)).unzip();
                let (tms, tes): (Vec<i64>, Vec<i32>) = sc.iter().copied().unzip();
                let acc: Vec<i32> = (0..rows * n)
                    .map(|i| dot_generic(&lin.w[i / n * k..][..k], &xq[i % n * k..][..k]))
                    .collect();
                let mut res = vec![0; rows * n];
                let args = (&ms, &es, &lin.bias, &tms, &tes);
                rescale_reference(
                    &acc, n, args.0, args.1, args.2, args.3, args.4, 12, clamp, &mut res,
                );
                let want: Vec<i32> = (0..n * rows)
                    .map(|i| res[i % rows * n + i / rows])
                    .collect();
                // Both kernels of the AVX-512 level for every item count: VNNI registers
                // and AMX tiles (where the CPU has them).
                let both = [1, usize::MAX].into_iter();
                for amx_from in both.filter(|_| Isa::Avx512.available()) {
                    for split in [Split::SERIAL, Split::PARALLEL] {
                        let cl = CpuLinear::new(Isa::Avx512, &lin).with_amx_from(amx_from);
                        let got = matmul(Isa::Avx512, split, &cl, &xq, &sc, 12, clamp);
                        assert_eq!(got, want, "amx from {amx_from} {split:?} rows={rows} n={n}");
                    }
                }
                for (isa, kernel) in kernels_here() {
                    for split in [Split::SERIAL, Split::PARALLEL] {
                        let cl = CpuLinear::with_kernel(kernel, Cow::Borrowed(&lin));
                        let got = matmul(isa, split, &cl, &xq, &sc, 12, clamp);
                        let at = format!("{isa:?} {kernel:?} {split:?} rows={rows} k={k} n={n}");
                        assert_eq!(got, want, "{at}");
                        // Tops, where the kernel gives them, are each item's largest output.
                        // Into a buffer that held more than this call writes.
                        let mut out = vec![-7; n * rows + 99];
                        let tops =
                            matmul_tops(isa, split, &cl, &xq, &sc, 12, clamp, true, &mut out);
                        assert_eq!(out, want, "{at}");
                        if let Some(tops) = tops {
                            let real: Vec<i32> = want
                                .chunks_exact(rows)
                                .map(|o| *o.iter().max().unwrap())
                                .collect();
                            assert_eq!(tops, real, "{at}: tops");
                        }
                    }
                }
            }
        }
    }

    /// The fused rescale at the edge of its i64 headroom equals the portable matmul: `k` at
    /// [`FUSED_MAX_K`] (and one group of 64 past it, which the fused path declines), every
    /// product at its extreme (weights -128 and 127, activations -127 and 127), the largest
    /// multipliers, the shortest shift (1) beside long ones, and biases at both ends of i32.
    #[test]
    fn fused_rescale_at_its_bounds() {
        use crate::backend::cpu::lm::rescale::FUSED_MAX_K;
        // The fused rescale of the AVX-512 VNNI kernel, and the AVX2 level's rescale from
        // the same 64-bit lanes, where this CPU runs them.
        let fused_here = Isa::Avx512.available() && vnni();
        if !fused_here && !Isa::Avx2.available() {
            println!("skipped: neither AVX-512 VNNI nor AVX2 here (only the portable rescale)");
            return;
        }
        let rows = 44;
        for k in [FUSED_MAX_K, FUSED_MAX_K + 64] {
            let w: Vec<i8> = (0..rows * k)
                .map(|i| if (i / k) % 2 == 0 { -128 } else { 127 })
                .collect();
            let lin = Linear {
                rows,
                k,
                m: vec![i32::MAX as i64; rows],
                // Shifts 1, 25 and 62 with the items' exponent 12 at output fraction 12.
                e: (0..rows).map(|r| [16, 40, 77][r % 3]).collect(),
                bias: (0..rows)
                    .map(|r| [i32::MAX, -i32::MAX, 0, 5][r % 4])
                    .collect(),
                row_sum: Linear::row_sums(&w, k),
                w,
            };
            let xq: Vec<i8> = [127i8, -127, 127, -127]
                .iter()
                .enumerate()
                .flat_map(|(t, &x)| (0..k).map(move |c| if t < 2 || c % 2 == 0 { x } else { -x }))
                .collect();
            let sc = vec![(65535i64, 12i32), (65535, 12), (40000, 12), (1, 12)];
            let fused = CpuLinear::new(Isa::Portable, &lin);
            let tms: Vec<i64> = sc.iter().map(|s| s.0).collect();
            let tes: Vec<i32> = sc.iter().map(|s| s.1).collect();
            assert_eq!(fused.scales.fast(&tms, &tes, 12), k <= FUSED_MAX_K, "k={k}");
            for clamp in [i32::MAX as i64, 3000] {
                let portable = CpuLinear::new(Isa::Portable, &lin);
                let want = matmul(Isa::Portable, Split::SERIAL, &portable, &xq, &sc, 12, clamp);
                let reached = want.iter().filter(|&&v| v.abs() as i64 >= clamp).count();
                assert!(
                    reached > 0 && reached < want.len(),
                    "clamped and unclamped outputs"
                );
                for amx_from in [1, usize::MAX].into_iter().filter(|_| fused_here) {
                    let cl = CpuLinear::new(Isa::Avx512, &lin).with_amx_from(amx_from);
                    for split in [Split::SERIAL, Split::PARALLEL] {
                        let got = matmul(Isa::Avx512, split, &cl, &xq, &sc, 12, clamp);
                        assert_eq!(got, want, "k={k} clamp={clamp} amx from {amx_from}");
                    }
                }
                for (isa, kernel) in kernels_here().into_iter().filter(|k| k.0 == Isa::Avx2) {
                    let cl = CpuLinear::with_kernel(kernel, Cow::Borrowed(&lin));
                    let got = matmul(isa, Split::SERIAL, &cl, &xq, &sc, 12, clamp);
                    assert_eq!(got, want, "k={k} clamp={clamp} {kernel:?}");
                }
            }
        }
    }

    /// The AMX tiles' sums equal the portable dot products: rows off the groups of 16, `k`
    /// off the tiles' 64 bytes, item counts off the tiles' 16 and 32 rows, every range of
    /// groups a matmul tile can ask for, and the extreme values (-128 weights, 127
    /// activations, the largest `k` of a GPT-2-small layer).
    #[test]
    fn amx_dots_equal_the_portable_ones() {
        if !amx::available() {
            println!("skipped: this CPU or OS has no AMX-INT8 (nothing to compare)");
            return;
        }
        let mut next = super::super::test_lcg(99);
        let mut rnd = || (next() >> 33) as u32;
        for (k, rows, ns) in [
            (1usize, 5usize, &[1usize, 17][..]),
            (60, 33, &[1, 2, 3, 15, 16, 17, 31, 32, 33, 47, 64, 70]),
            (64, 16, &[1, 16, 32]),
            // k = 128 and k padded to 128: the resident activation tiles, item blocks of
            // 16 + 0..16 items, several blocks, a last one of other sizes.
            (128, 50, &[1, 5, 16, 17, 21, 32, 33, 47, 64, 70]),
            (100, 33, &[3, 21, 40]),
            (130, 50, &[5, 20, 40]),
            (768, 70, &[1, 4, 9, 33]),
            (3072, 17, &[3, 18]),
        ] {
            for &n in ns {
                for extreme in [false, true] {
                    let w: Vec<i8> = (0..rows * k)
                        .map(|_| if extreme { -128 } else { rnd() as u8 as i8 })
                        .collect();
                    let xs: Vec<i8> = (0..n * k)
                        .map(|_| if extreme { 127 } else { (rnd() % 255) as i8 })
                        .map(|v| v.max(-127))
                        .collect();
                    let mut want = vec![0; rows * n];
                    for (r, a) in want.chunks_mut(n).enumerate() {
                        dot_rows_generic(&w[r * k..(r + 1) * k], &xs, k, a);
                    }
                    let v =
                        VnniRows::new(&w, &Linear::row_sums(&w, k), k, Dot::Vnni).with_amx_from(1);
                    let xu = v.activations(&xs, k);
                    for r0 in (0..rows).step_by(16) {
                        for r1 in [r0 + 1, (r0 + 17).min(rows), (r0 + 40).min(rows), rows] {
                            let r1 = r1.clamp(r0, rows);
                            let mut got = vec![0; (r1 - r0) * n];
                            v.dots(r0, r1, &xu, n, &mut got);
                            for (r, t) in (r0..r1).flat_map(|r| (0..n).map(move |t| (r, t))) {
                                assert_eq!(
                                    got[t * (r1 - r0) + r - r0],
                                    want[r * n + t],
                                    "amx k={k} rows {r0}..{r1} n={n} row {r} item {t}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Not a test: the time of the AMX and the VNNI dots per item count, one thread, on the
    /// row tiles a parallel matmul cuts (each tile one call, as the matmul makes them), for
    /// the tinygpt2 shapes (d = 128) and GPT-2 small's (d = 768), for [`amx_wins`]
    /// (`cargo test --release --lib amx_vs_vnni_timing -- --ignored --nocapture`). Prints
    /// AMX / VNNI time per item count, the best of five runs of each.
    #[test]
    #[ignore]
    fn amx_vs_vnni_timing() {
        if !amx::available() {
            println!("skipped: this CPU or OS has no AMX-INT8");
            return;
        }
        let shapes = [
            (384usize, 128usize),
            (512, 128),
            (128, 512),
            (50257, 128),
            (2304, 768),
            (768, 3072),
            (50257, 768),
        ];
        let split = Split::PARALLEL;
        for (rows, k) in shapes {
            let w: Vec<i8> = (0..rows * k).map(|i| (i * 7 % 251) as i8).collect();
            let v = VnniRows::new(&w, &Linear::row_sums(&w, k), k, Dot::Vnni);
            let mut line = format!("{rows:>5} x {k:<4} AMX/VNNI time, n = 1..16:");
            for n in 1usize..=16 {
                let xs: Vec<i8> = (0..n * k).map(|i| (i * 13 % 255) as i8).collect();
                let xu = v.activations(&xs, k);
                let tile = tile_rows(rows, k, n, split);
                let time = |from: usize| {
                    let v = v.clone().with_amx_from(from);
                    let reps = (1usize << 25) / (rows * k * n) + 1;
                    let mut acc = vec![0; rows * n];
                    (0..5)
                        .map(|_| {
                            let t = std::time::Instant::now();
                            for _ in 0..reps {
                                for r0 in (0..rows).step_by(tile) {
                                    let r1 = (r0 + tile).min(rows);
                                    v.dots(r0, r1, &xu, n, &mut acc[..(r1 - r0) * n]);
                                }
                            }
                            t.elapsed().as_secs_f64()
                        })
                        .fold(f64::MAX, f64::min)
                };
                let (amx, vnni) = (time(1), time(usize::MAX));
                line += &format!(" {:.2}", amx / vnni);
            }
            println!("{line}");
        }
    }

    /// Not a test: one thread's time of the LM head's fused dots and rescale (tinygpt2's
    /// shape, 50,257 x 128) per item count, over the row tiles the parallel matmul cuts
    /// (`cargo test --release --lib head_timing -- --ignored --nocapture`): the best of nine
    /// runs, in us per call of the whole head; called back to back ("hot"), then each call
    /// after a 32 MiB buffer is read and written ("swept", the sweep not timed), as in the
    /// codec, where the other stages (a decode step's KV caches alone are ~16 MB) stand
    /// between two calls of the head.
    #[test]
    #[ignore]
    fn head_timing() {
        if !vnni() {
            println!("skipped: no AVX-512 VNNI");
            return;
        }
        let (rows, k) = (50257usize, 128usize);
        let mut next = super::super::test_lcg(5);
        let mut rnd = move || next() >> 33;
        let lin = random_linear(&mut rnd, rows, k, 30);
        let cl = CpuLinear::new(Isa::Avx512, &lin);
        let mut line = String::from("head us/call:");
        for n in [8usize, 16, 21, 32, 64] {
            let xs: Vec<i8> = (0..n * k).map(|_| rnd() as u8 as i8).collect();
            let xu = cl.vnni.activations(&xs, k);
            let (tms, tes) = (vec![(1i64 << 15) + 4321; n], vec![20i32; n]);
            let tops: Vec<AtomicI32> = (0..n).map(|_| AtomicI32::new(i32::MIN)).collect();
            let f = Fused {
                rows: &cl.scales,
                tms: &tms,
                tes: &tes,
                out_frac: 16,
                clamp: 1 << 20,
                tops: Some(&tops),
            };
            assert!(cl.scales.fast(&tms, &tes, 16));
            let tile = tile_rows(rows, k, n, Split::PARALLEL);
            let mut out = vec![0i32; rows * n];
            let reps = 2000 / n + 1;
            let mut head = || {
                for r0 in (0..rows).step_by(tile) {
                    let r1 = (r0 + tile).min(rows);
                    // SAFETY: `out` holds n * rows outputs; one thread.
                    unsafe {
                        cl.vnni
                            .dots_rescaled((r0, r1), &xu, &f, out.as_mut_ptr(), rows)
                    };
                }
            };
            let mut sweep = vec![0u64; 32 << 17];
            let mut best = [f64::MAX; 2];
            for _ in 0..9 {
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    head();
                }
                best[0] = best[0].min(t.elapsed().as_secs_f64() / reps as f64);
                let mut swept = 0.0;
                for _ in 0..reps.min(50) {
                    // One read and one write per 64-byte line.
                    for l64 in sweep.chunks_exact_mut(8) {
                        l64[0] = l64[0].wrapping_add(l64[7] | 1);
                    }
                    std::hint::black_box(&mut sweep);
                    let t = std::time::Instant::now();
                    head();
                    swept += t.elapsed().as_secs_f64();
                }
                best[1] = best[1].min(swept / reps.min(50) as f64);
            }
            line += &format!(" n={n} hot {:.0} swept {:.0}", best[0] * 1e6, best[1] * 1e6);
        }
        println!("{line}");
    }

    /// Not a test: one thread's rate of the fused VNNI dots and rescale on GPT-2 small's
    /// shapes, over the row tiles a parallel matmul cuts, for the compressor's calls (255
    /// items: a segment's positions) and the decoder's (27 and 10 items: one per sequence),
    /// in GMAC/s, the best of five runs (`cargo test --release --lib gpt2_small_matmul_timing
    /// -- --ignored --nocapture`). Compare with the CPU's `vpdpbusd` peak.
    #[test]
    #[ignore]
    fn gpt2_small_matmul_timing() {
        if !vnni() {
            println!("skipped: no AVX-512 VNNI");
            return;
        }
        let mut next = super::super::test_lcg(5);
        let mut rnd = move || next() >> 33;
        let shapes = [
            (2304usize, 768usize),
            (768, 768),
            (3072, 768),
            (768, 3072),
            (50257, 768),
            (384, 128),
            (128, 128),
            (512, 128),
            (128, 512),
            (50257, 128),
        ];
        for (rows, k) in shapes {
            let lin = random_linear(&mut rnd, rows, k, 30);
            let cl = CpuLinear::new(Isa::Avx512, &lin);
            let mut line = format!("{rows:>5} x {k:<4} GMAC/s:");
            for n in [255usize, 27, 10] {
                let xs: Vec<i8> = (0..n * k).map(|_| (rnd() % 255) as u8 as i8).collect();
                let xu = cl.vnni.activations(&xs, k);
                let (tms, tes) = (vec![(1i64 << 15) + 4321; n], vec![20i32; n]);
                let f = Fused {
                    rows: &cl.scales,
                    tms: &tms,
                    tes: &tes,
                    out_frac: 16,
                    clamp: 1 << 20,
                    tops: None,
                };
                assert!(cl.scales.fast(&tms, &tes, 16));
                let tile = tile_rows(rows, k, n, Split::PARALLEL);
                let mut out = vec![0i32; rows * n];
                let reps = (1usize << 31) / (rows * k * n) + 1;
                let best = (0..5)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        for _ in 0..reps {
                            for r0 in (0..rows).step_by(tile) {
                                let r1 = (r0 + tile).min(rows);
                                // SAFETY: `out` holds n * rows outputs; one thread.
                                unsafe {
                                    cl.vnni
                                        .dots_rescaled((r0, r1), &xu, &f, out.as_mut_ptr(), rows)
                                };
                            }
                        }
                        t.elapsed().as_secs_f64()
                    })
                    .fold(f64::MAX, f64::min);
                let macs = (reps * rows * k * n) as f64;
                line += &format!(" n={n} {:.0} (tile {tile})", macs / best / 1e9);
            }
            println!("{line}");
        }
    }

    #[test]
    fn every_dot_kernel_equals_the_reference() {
        for (name, here) in [("AVX-512 VNNI", vnni()), ("AVX-VNNI", avx_vnni())] {
            if !here {
                println!("the {name} kernel is not checked: this CPU does not run it");
            }
        }
        let mut next = super::super::test_lcg(7);
        let mut rnd = || (next() >> 33) as u32;
        // Row and item counts that reach every block shape and remainder of the tiles, for
        // short rows and long ones (k > LONG_ROWS: blocks of 1 to 8 items, 1 to 8 groups).
        for k in [1usize, 31, 32, 64, 128, 200, 300, 768] {
            for (rows, n) in [
                (1, 1),
                (7, 1),
                (7, 4),
                (9, 7),
                (4, 9),
                (5, 13),
                (21, 1),
                (17, 6),
                (64, 4),
                (70, 5),
                (130, 1),
                (50, 8),
                (35, 3),
                (33, 2),
                (40, 17),
                (100, 24),
                (130, 27),
            ] {
                let w: Vec<i8> = (0..rows * k).map(|_| (rnd() % 256) as i32 as i8).collect();
                let xs: Vec<i8> = (0..n * k)
                    .map(|_| ((rnd() % 255) as i32 - 127) as i8)
                    .collect();
                let mut want = vec![0; rows * n];
                for (r, a) in want.chunks_mut(n).enumerate() {
                    dot_rows_generic(&w[r * k..(r + 1) * k], &xs, k, a);
                }
                let rs = Linear::row_sums(&w, k);
                // The kernels' output is item-major; i32::MIN (no dot reaches it) shows a
                // sum left unwritten.
                let items: Vec<i32> = (0..n * rows)
                    .map(|i| want[i % rows * n + i / rows])
                    .collect();
                for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                    let mut got = vec![i32::MIN; rows * n];
                    Dot::at(isa).dots(&w, &xs, k, n, &mut got);
                    assert_eq!(got, items, "k={k} rows={rows} n={n} {isa:?}");
                }
                // Both kernels of the VNNI layout this CPU runs; every range of whole
                // groups the tiles can ask for.
                let here = [(Dot::Vnni, vnni()), (Dot::AvxVnni, avx_vnni())];
                for kernel in here.into_iter().filter(|k| k.1).map(|k| k.0) {
                    let v = VnniRows::new(&w, &rs, k, kernel);
                    let xu = v.activations(&xs, k);
                    for r0 in (0..rows).step_by(16) {
                        for r1 in r0..=rows {
                            let mut got = vec![0; (r1 - r0) * n];
                            v.dots(r0, r1, &xu, n, &mut got);
                            for (r, t) in (r0..r1).flat_map(|r| (0..n).map(move |t| (r, t))) {
                                assert_eq!(
                                    got[t * (r1 - r0) + r - r0],
                                    want[r * n + t],
                                    "{kernel:?} k={k} rows {r0}..{r1} n={n} row {r} item {t}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
