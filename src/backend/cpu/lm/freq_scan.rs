//! The passes over the vocabulary behind one frequency table (freq.rs), per instruction-set
//! level: the top logit, the weight sum `W = sum EXP40[top - l]` (0 past the table), and the
//! running sums of the floors `by_gap[min(top - l, n)]`. The portable functions are the
//! definition; the AVX2 and AVX-512 ones gather 8 / 16 tokens at a time and give the same
//! integers (`W` in exact u64 lanes; the running sums wrap in u32 as the portable ones do).
//! `W` at AVX2 is the portable loop's.
//!
//! The gap `top - l` of a logit at most `top` lies in `0..2^32`, so it is exact as the
//! wrapping u32 difference whatever the i32 logits are.

use std::mem::MaybeUninit;

use crate::backend::cpu::Isa;

/// The largest logit (`i32::MIN` for none).
pub fn top(isa: Isa, logits: &[i32]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        // SAFETY: levels from `Avx2` up imply AVX2 (`Isa::available`, checked when the
        // `CpuLm` was made); the body is safe code compiled with AVX2 enabled.
        return unsafe { x86::top_avx2(logits) };
    }
    let _ = isa;
    top_portable(logits)
}

#[inline(always)]
fn top_portable(logits: &[i32]) -> i32 {
    logits.iter().fold(i32::MIN, |a, &l| a.max(l))
}

/// The gap of `l` below `top` (`l <= top`).
#[inline(always)]
fn gap(top: i32, l: i32) -> u32 {
    (top as u32).wrapping_sub(l as u32)
}

/// `W`: the sum of `exp40[top - l]` over the logits, 0 for gaps past the table, and the
/// positions of the logits equal to `top`, in order, appended to `at_top` (the remainder's
/// token is one of them: found here, the caller needs no pass of its own). Exact: with at most
/// 2^16 logits and weights at most 2^40, `W < 2^56`.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub fn weight_sum(
    isa: Isa,
    logits: &[i32],
    top: i32,
    exp40: &[u64],
    at_top: &mut Vec<usize>,
) -> u64 {
    debug_assert!(exp40.len() < 1 << 31 && logits.len() <= 1 << 16);
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512 {
            // SAFETY: the `Avx512` level implies F, BW and VL (`Isa::available`); the gathers
            // read only indices below `exp40.len()` (masked).
            return unsafe { x86::weight_sum_avx512(logits, top, exp40, at_top) };
        }
        if isa == Isa::Avx2 && !exp40.is_empty() {
            // SAFETY: as in `top`; every index is clamped to `exp40.len() - 1`.
            return unsafe { x86::weight_sum_avx2(logits, top, exp40, at_top) };
        }
    }
    weight_sum_portable(logits, 0, top, exp40, at_top)
}

/// [`weight_sum`] of `logits`, which start at position `from` of the table.
fn weight_sum_portable(
    logits: &[i32],
    from: usize,
    top: i32,
    exp40: &[u64],
    at_top: &mut Vec<usize>,
) -> u64 {
    let mut w = 0;
    for (i, &l) in logits.iter().enumerate() {
        let g = gap(top, l);
        w += exp40.get(g as usize).copied().unwrap_or(0);
        if g == 0 {
            at_top.push(from + i);
        }
    }
    w
}

/// The positions `from + i` of the set bits `i` of `mask`, in order.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn push_bits(mut mask: u32, from: usize, at_top: &mut Vec<usize>) {
    while mask != 0 {
        at_top.push(from + mask.trailing_zeros() as usize);
        mask &= mask - 1;
    }
}

/// `out[i] = by_gap[min(top - l_0, n)] + ... + by_gap[min(top - l_i, n)]` (wrapping u32),
/// `n = by_gap.len() - 1` (the entry shared by every gap past the table); returns the last sum
/// (0 for no logits). `out` and `logits` have the same length; every element of `out` is
/// written (so it may start uninitialised).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub fn floor_sums(
    isa: Isa,
    logits: &[i32],
    top: i32,
    by_gap: &[u32],
    out: &mut [MaybeUninit<u32>],
) -> u32 {
    assert!(!by_gap.is_empty() && by_gap.len() <= 1 << 31 && out.len() == logits.len());
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512 {
            // SAFETY: as in `weight_sum`; every index is clamped to `by_gap.len() - 1`.
            return unsafe { x86::floor_sums_avx512(logits, top, by_gap, out) };
        }
        if isa == Isa::Avx2 {
            // SAFETY: as in `top`; every index is clamped to `by_gap.len() - 1`.
            return unsafe { x86::floor_sums_avx2(logits, top, by_gap, out) };
        }
    }
    floor_sums_portable(logits, top, by_gap, out, 0)
}

/// [`floor_sums`] starting from `sum`.
fn floor_sums_portable(
    logits: &[i32],
    top: i32,
    by_gap: &[u32],
    out: &mut [MaybeUninit<u32>],
    sum: u32,
) -> u32 {
    let n = (by_gap.len() - 1) as u32;
    let mut s = sum;
    for (o, &l) in out.iter_mut().zip(logits) {
        s = s.wrapping_add(by_gap[gap(top, l).min(n) as usize]);
        o.write(s);
    }
    s
}

/// Tokens per block of [`block_sums`].
pub const BLOCK: usize = 256;

/// The sums of `lut[min(top - l, n)]` (wrapping u32, `n = lut.len() - 1`) over each block of
/// [`BLOCK`] logits (the last block shorter), appended to `out`: one pass that stores nothing
/// per token, from which a coder's question is answered by a walk through at most one block.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub fn block_sums(isa: Isa, logits: &[i32], top: i32, lut: &[u32], out: &mut Vec<u32>) {
    assert!(!lut.is_empty() && lut.len() <= 1 << 31);
    out.reserve(logits.len().div_ceil(BLOCK));
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512 {
            // SAFETY: as in `weight_sum`; every index is clamped to `lut.len() - 1`.
            return unsafe { x86::block_sums_avx512(logits, top, lut, out) };
        }
        if isa == Isa::Avx2 {
            // SAFETY: as in `top`; every index is clamped to `lut.len() - 1`.
            return unsafe { x86::block_sums_avx2(logits, top, lut, out) };
        }
    }
    block_sums_portable(logits, top, lut, out)
}

fn block_sums_portable(logits: &[i32], top: i32, lut: &[u32], out: &mut Vec<u32>) {
    for b in logits.chunks(BLOCK) {
        out.push(lut_sum_portable(b, top, lut));
    }
}

/// The wrapping u32 sum of `lut[min(top - l, n)]` over `logits`.
#[inline(always)]
fn lut_sum_portable(logits: &[i32], top: i32, lut: &[u32]) -> u32 {
    let n = (lut.len() - 1) as u32;
    logits.iter().fold(0u32, |s, &l| {
        s.wrapping_add(lut[gap(top, l).min(n) as usize])
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    #[target_feature(enable = "avx2")]
    pub unsafe fn top_avx2(logits: &[i32]) -> i32 {
        super::top_portable(logits)
    }

    /// [`super::weight_sum`] at AVX2: the gaps, the top's positions and the clamped indices
    /// eight at a time, the 64-bit weights by scalar loads into four sums (no gathers: a
    /// Zen 2's `vpgatherdq` was no faster than its four loads). A gap past the table looks
    /// up its last entry; the lanes where that happened are counted, and that entry times
    /// their count is taken back at the end (the scalar loop it replaces tested each gap).
    /// The chunks holding the top are noted in the loop and their positions pushed after
    /// it: a call inside the loop made the compiler keep its vectors on the stack.
    #[target_feature(enable = "avx2")]
    pub unsafe fn weight_sum_avx2(
        logits: &[i32],
        top: i32,
        exp40: &[u64],
        at_top: &mut Vec<usize>,
    ) -> u64 {
        let last = exp40.len() - 1;
        let (top_v, last_v) = (_mm256_set1_epi32(top), _mm256_set1_epi32(last as i32));
        let zero = _mm256_setzero_si256();
        // Minus the count of lanes whose gap lies inside the table (at most 2^13 per lane).
        let mut inside = zero;
        let mut sums = [0u64; 4];
        let mut idx = [0u32; 8];
        // (chunk, mask) of the first chunks that hold the top: a few in a real table.
        const NOTED: usize = 32;
        let mut noted = [(0u32, 0u32); NOTED];
        let mut hits = 0;
        let chunks = logits.chunks_exact(8);
        let rest = chunks.remainder();
        for (i, c) in chunks.enumerate() {
            let g = _mm256_sub_epi32(top_v, _mm256_loadu_si256(c.as_ptr().cast()));
            let at = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(g, zero)));
            if at != 0 {
                if hits < NOTED {
                    noted[hits] = (i as u32, at as u32);
                }
                hits += 1;
            }
            let ix = _mm256_min_epu32(g, last_v);
            inside = _mm256_add_epi32(inside, _mm256_cmpeq_epi32(ix, g));
            _mm256_storeu_si256(idx.as_mut_ptr().cast(), ix);
            for (j, &x) in idx.iter().enumerate() {
                sums[j % 4] += *exp40.get_unchecked(x as usize);
            }
        }
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(inside),
            _mm256_extracti128_si256::<1>(inside),
        );
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        let whole = logits.len() - rest.len();
        if hits <= NOTED {
            for &(i, at) in &noted[..hits] {
                super::push_bits(at, 8 * i as usize, at_top);
            }
        } else {
            at_top.extend((0..whole).filter(|&i| logits[i] == top));
        }
        let past = whole - (-_mm_cvtsi128_si32(s)) as usize;
        // Exact: the sums hold `past` copies of the last entry, so no wrap.
        let sum = sums.iter().sum::<u64>() - past as u64 * exp40[last];
        sum + super::weight_sum_portable(rest, whole, top, exp40, at_top)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn weight_sum_avx512(
        logits: &[i32],
        top: i32,
        exp40: &[u64],
        at_top: &mut Vec<usize>,
    ) -> u64 {
        let (top_v, n_v) = (
            _mm512_set1_epi32(top),
            _mm512_set1_epi32(exp40.len() as i32),
        );
        let mut acc = [_mm512_setzero_si512(); 2];
        let chunks = logits.chunks_exact(16);
        let rest = chunks.remainder();
        for (i, c) in chunks.enumerate() {
            let l = _mm512_loadu_si512(c.as_ptr().cast());
            let g = _mm512_sub_epi32(top_v, l);
            // The top's positions: in a few of the chunks only.
            let zero = _mm512_cmpeq_epi32_mask(g, _mm512_setzero_si512());
            if zero != 0 {
                super::push_bits(zero as u32, 16 * i, at_top);
            }
            // Gaps inside the table: below n < 2^31, so the signed gather indices are right.
            let inside = _mm512_cmplt_epu32_mask(g, n_v);
            for (h, a) in acc.iter_mut().enumerate() {
                let idx = if h == 0 {
                    _mm512_castsi512_si256(g)
                } else {
                    _mm512_extracti64x4_epi64::<1>(g)
                };
                let m = (inside >> (8 * h)) as u8;
                let w = _mm512_mask_i32gather_epi64::<8>(
                    _mm512_setzero_si512(),
                    m,
                    idx,
                    exp40.as_ptr().cast(),
                );
                *a = _mm512_add_epi64(*a, w);
            }
        }
        let sum = _mm512_reduce_add_epi64(_mm512_add_epi64(acc[0], acc[1])) as u64;
        let from = logits.len() - rest.len();
        sum + super::weight_sum_portable(rest, from, top, exp40, at_top)
    }

    /// Sixteen lookups per step into two accumulators (the gathers' latency overlapped),
    /// reduced once per block.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn block_sums_avx512(logits: &[i32], top: i32, lut: &[u32], out: &mut Vec<u32>) {
        let top_v = _mm512_set1_epi32(top);
        let n_v = _mm512_set1_epi32((lut.len() - 1) as i32);
        let look = |c: &[i32]| {
            let l = _mm512_loadu_si512(c.as_ptr().cast());
            let idx = _mm512_min_epu32(_mm512_sub_epi32(top_v, l), n_v);
            _mm512_i32gather_epi32::<4>(idx, lut.as_ptr().cast())
        };
        let whole = logits.len() / super::BLOCK * super::BLOCK;
        for b in logits[..whole].chunks_exact(super::BLOCK) {
            let mut acc = [_mm512_setzero_si512(); 2];
            for c in b.chunks_exact(32) {
                acc[0] = _mm512_add_epi32(acc[0], look(&c[..16]));
                acc[1] = _mm512_add_epi32(acc[1], look(&c[16..]));
            }
            out.push(_mm512_reduce_add_epi32(_mm512_add_epi32(acc[0], acc[1])) as u32);
        }
        if whole < logits.len() {
            let rest = &logits[whole..];
            let full = rest.len() / 16 * 16;
            let mut acc = _mm512_setzero_si512();
            for c in rest[..full].chunks_exact(16) {
                acc = _mm512_add_epi32(acc, look(c));
            }
            let s = _mm512_reduce_add_epi32(acc) as u32;
            out.push(s.wrapping_add(super::lut_sum_portable(&rest[full..], top, lut)));
        }
    }

    /// Eight lookups per step, as [`block_sums_avx512`].
    #[target_feature(enable = "avx2")]
    pub unsafe fn block_sums_avx2(logits: &[i32], top: i32, lut: &[u32], out: &mut Vec<u32>) {
        let top_v = _mm256_set1_epi32(top);
        let n_v = _mm256_set1_epi32((lut.len() - 1) as i32);
        let look = |c: &[i32]| {
            let l = _mm256_loadu_si256(c.as_ptr().cast());
            let idx = _mm256_min_epu32(_mm256_sub_epi32(top_v, l), n_v);
            _mm256_i32gather_epi32::<4>(lut.as_ptr().cast(), idx)
        };
        let reduce = |v: __m256i| {
            let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
            _mm_cvtsi128_si32(s) as u32
        };
        let whole = logits.len() / super::BLOCK * super::BLOCK;
        for b in logits[..whole].chunks_exact(super::BLOCK) {
            let mut acc = [_mm256_setzero_si256(); 2];
            for c in b.chunks_exact(16) {
                acc[0] = _mm256_add_epi32(acc[0], look(&c[..8]));
                acc[1] = _mm256_add_epi32(acc[1], look(&c[8..]));
            }
            out.push(reduce(_mm256_add_epi32(acc[0], acc[1])));
        }
        if whole < logits.len() {
            let rest = &logits[whole..];
            let full = rest.len() / 8 * 8;
            let mut acc = _mm256_setzero_si256();
            for c in rest[..full].chunks_exact(8) {
                acc = _mm256_add_epi32(acc, look(c));
            }
            out.push(reduce(acc).wrapping_add(super::lut_sum_portable(&rest[full..], top, lut)));
        }
    }

    /// Sixteen floors per step: gathered, summed within the vector in four shifted adds, then
    /// the running total (every lane of `carry`) added.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn floor_sums_avx512(
        logits: &[i32],
        top: i32,
        by_gap: &[u32],
        out: &mut [MaybeUninit<u32>],
    ) -> u32 {
        let top_v = _mm512_set1_epi32(top);
        let n_v = _mm512_set1_epi32((by_gap.len() - 1) as i32);
        let (zero, last) = (_mm512_setzero_si512(), _mm512_set1_epi32(15));
        let mut carry = zero;
        let len = logits.len() / 16 * 16;
        for (c, o) in logits[..len]
            .chunks_exact(16)
            .zip(out[..len].chunks_exact_mut(16))
        {
            let l = _mm512_loadu_si512(c.as_ptr().cast());
            let idx = _mm512_min_epu32(_mm512_sub_epi32(top_v, l), n_v);
            let mut x = _mm512_i32gather_epi32::<4>(idx, by_gap.as_ptr().cast());
            x = _mm512_add_epi32(x, _mm512_alignr_epi32::<15>(x, zero));
            x = _mm512_add_epi32(x, _mm512_alignr_epi32::<14>(x, zero));
            x = _mm512_add_epi32(x, _mm512_alignr_epi32::<12>(x, zero));
            x = _mm512_add_epi32(x, _mm512_alignr_epi32::<8>(x, zero));
            x = _mm512_add_epi32(x, carry);
            _mm512_storeu_si512(o.as_mut_ptr().cast(), x);
            carry = _mm512_permutexvar_epi32(last, x);
        }
        let sum = _mm_cvtsi128_si32(_mm512_castsi512_si128(carry)) as u32;
        super::floor_sums_portable(&logits[len..], top, by_gap, &mut out[len..], sum)
    }

    /// Eight floors per step, as [`floor_sums_avx512`] (the in-vector sum crosses the two
    /// 128-bit halves with a broadcast of the low half's total).
    #[target_feature(enable = "avx2")]
    pub unsafe fn floor_sums_avx2(
        logits: &[i32],
        top: i32,
        by_gap: &[u32],
        out: &mut [MaybeUninit<u32>],
    ) -> u32 {
        let top_v = _mm256_set1_epi32(top);
        let n_v = _mm256_set1_epi32((by_gap.len() - 1) as i32);
        let (zero, third, last) = (
            _mm256_setzero_si256(),
            _mm256_set1_epi32(3),
            _mm256_set1_epi32(7),
        );
        let mut carry = zero;
        let len = logits.len() / 8 * 8;
        for (c, o) in logits[..len]
            .chunks_exact(8)
            .zip(out[..len].chunks_exact_mut(8))
        {
            let l = _mm256_loadu_si256(c.as_ptr().cast());
            let idx = _mm256_min_epu32(_mm256_sub_epi32(top_v, l), n_v);
            let mut x = _mm256_i32gather_epi32::<4>(by_gap.as_ptr().cast(), idx);
            x = _mm256_add_epi32(x, _mm256_slli_si256::<4>(x));
            x = _mm256_add_epi32(x, _mm256_slli_si256::<8>(x));
            let low = _mm256_permutevar8x32_epi32(x, third);
            x = _mm256_add_epi32(x, _mm256_blend_epi32::<0xF0>(zero, low));
            x = _mm256_add_epi32(x, carry);
            _mm256_storeu_si256(o.as_mut_ptr().cast(), x);
            carry = _mm256_permutevar8x32_epi32(x, last);
        }
        let sum = _mm_cvtsi128_si32(_mm256_castsi256_si128(carry)) as u32;
        super::floor_sums_portable(&logits[len..], top, by_gap, &mut out[len..], sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::lm::fixed::exp_table;

    /// Logits of every kind the passes meet: spreads inside and far past the table, the i32
    /// extremes (gaps up to 2^32 - 1), ties on the top, lengths off the vector widths.
    fn cases() -> Vec<Vec<i32>> {
        let mut x = 3u64;
        let mut rnd = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            x >> 33
        };
        let mut out = Vec::new();
        for (v, spread) in [
            (0usize, 1i64),
            (1, 1),
            (7, 100),
            (15, 3000),
            (16, 3000),
            (17, 8000),
            (33, 1 << 20),
            (9000, 600),
            (50257, 3000),
            (50257, 40000),
            (65536, 1 << 33),
        ] {
            out.push(
                (0..v)
                    .map(|_| (rnd() as i64 % spread - spread / 2) as i32)
                    .collect(),
            );
        }
        out.push(vec![i32::MAX, i32::MIN, 0, i32::MAX, -1, i32::MIN + 1, 7]);
        out.push(vec![i32::MIN; 19]);
        // The top in more chunks than the AVX2 pass notes (its rescan).
        out.push((0..1000).map(|i| 5 - (i % 9 == 4) as i32).collect());
        // Ties on the top inside and across the vector widths, and in the tail.
        out.push(
            (0..100)
                .map(|i| {
                    if i % 13 == 3 || i == 16 || i == 99 {
                        50
                    } else {
                        i % 7
                    }
                })
                .collect(),
        );
        out
    }

    /// Every level this CPU runs gives the portable passes' integers.
    #[test]
    fn each_level_equals_the_portable_passes() {
        let exp40 = exp_table(40);
        let mut by_gap: Vec<u32> = exp40.iter().map(|&w| (w >> 9) as u32 | 1).collect();
        by_gap.push(1);
        // Large entries too, so the u32 sums wrap.
        by_gap[0] = u32::MAX - 5;
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            for logits in cases() {
                let t = top(isa, &logits);
                let at = format!("{isa:?} v={}", logits.len());
                assert_eq!(t, top_portable(&logits), "{at}: top");
                let (mut got, mut want) = (Vec::new(), Vec::new());
                assert_eq!(
                    weight_sum(isa, &logits, t, &exp40, &mut got),
                    weight_sum_portable(&logits, 0, t, &exp40, &mut want),
                    "{at}: W"
                );
                assert_eq!(got, want, "{at}: the top's positions");
                let tops = (0..logits.len()).filter(|&i| logits[i] == t);
                assert!(tops.eq(want), "{at}: the top's positions");
                let n = logits.len();
                let (mut got, mut want) =
                    (vec![MaybeUninit::new(7); n], vec![MaybeUninit::new(0); n]);
                let s = floor_sums(isa, &logits, t, &by_gap, &mut got);
                let w = floor_sums_portable(&logits, t, &by_gap, &mut want, 0);
                // SAFETY: initialised above (and rewritten by the passes).
                let read = |v: Vec<MaybeUninit<u32>>| -> Vec<u32> {
                    v.into_iter().map(|x| unsafe { x.assume_init() }).collect()
                };
                assert_eq!((s, read(got)), (w, read(want)), "{at}: floor sums");
                let (mut got, mut want) = (vec![9], vec![9]);
                block_sums(isa, &logits, t, &by_gap, &mut got);
                block_sums_portable(&logits, t, &by_gap, &mut want);
                assert_eq!(got, want, "{at}: block sums");
                assert_eq!(got.len(), 1 + n.div_ceil(BLOCK), "{at}: blocks");
            }
        }
    }
}
