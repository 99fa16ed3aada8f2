//! Causal attention of several consecutive items of one sequence at once, one head per call:
//! the batched encoder's items of a sequence read the same cached keys and values, and one
//! item at a time each re-read the whole cache from memory (a GPT-2-small shape's 12 layers
//! hold 2 x 3 KiB per position: at 500 positions, 37 MB per item). Here each block of
//! positions' key and value rows of the head is read once and used for every item of the
//! call while it is in L1. Each item's integers are those of [`super::attention::attention`]:
//! the products are the same exact i64 sums (their order does not matter), the weights and
//! the normalization the same functions.

// Its kernels are AVX-512 code: elsewhere the module compiles to the checks alone.
#![cfg_attr(not(target_arch = "x86_64"), allow(unused_imports, unused_variables))]

use super::attention::{normalize, softmax_weights};
use super::scratch;
use crate::backend::cpu::Isa;
use crate::format::lm::model_file::Tables;

/// Items one call takes at most: the cache's traffic falls by this factor, and the scores
/// (`items x positions` i64, 256 KiB at 1,024 positions) stay in L2.
pub const MANY_ITEMS: usize = 32;

/// Whether [`attention_head_many`] runs at level `isa` for heads of `hd` channels (AVX-512,
/// whole vectors of 16 channels, at most 128 channels in registers).
pub fn many_supported(isa: Isa, hd: usize) -> bool {
    cfg!(target_arch = "x86_64")
        && isa == Isa::Avx512
        && hd.is_multiple_of(16)
        && (16..=128).contains(&hd)
}

/// A sequence's cached keys and values of one layer (`d` per position): as stored, or the
/// same integers as i16 where every one of them fits (`KvCache`'s narrow copy: half the
/// bytes to read).
#[derive(Clone, Copy)]
pub enum Kv<'a> {
    Wide(&'a [i32], &'a [i32]),
    Narrow(&'a [i16], &'a [i16]),
}

impl Kv<'_> {
    fn len(&self) -> (usize, usize) {
        match self {
            Kv::Wide(k, v) => (k.len(), v.len()),
            Kv::Narrow(k, v) => (k.len(), v.len()),
        }
    }
}

/// Head `h` of the causal attention of items with queries `qs[i]` (`d` channels each) over
/// `lens[i]` cached positions of the keys and values `kv`: item `i`'s `hd` outputs go to
/// `out[i * hd..]`, equal to the head-`h` outputs of [`super::attention::attention`] for
/// that item. Requires [`many_supported`] and at most [`MANY_ITEMS`] items.
pub fn attention_head_many(
    isa: Isa,
    qs: &[&[i32]],
    lens: &[usize],
    kv: Kv,
    (d, hd, h): (usize, usize, usize),
    tables: &Tables,
    out: &mut [i64],
) {
    assert!(many_supported(isa, hd) && Isa::Avx512.available());
    assert!(qs.len() == lens.len() && out.len() >= qs.len() * hd && (h + 1) * hd <= d);
    assert!(qs.len() <= MANY_ITEMS);
    let lmax = lens.iter().copied().max().unwrap_or(0);
    let (kl, vl) = kv.len();
    assert!(qs.iter().all(|q| q.len() >= d) && kl >= lmax * d && vl >= lmax * d);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512 F is present (asserted: the level implies it); every row read lies
    // inside the keys / values (lmax rows, asserted), every query inside its slice (asserted).
    unsafe {
        let dims = (d, hd, h);
        match kv {
            Kv::Wide(k, v) => x86::head_many(qs, lens, (k.as_ptr(), v.as_ptr()), dims, tables, out),
            Kv::Narrow(k, v) => {
                x86::head_many(qs, lens, (k.as_ptr(), v.as_ptr()), dims, tables, out)
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// Positions per block: a block's key or value rows of one head (hd <= 128 channels,
    /// 512 B) stay in L1 while every item reads them.
    const BLOCK: usize = 16;

    /// A cached value as the kernels read it: 16 of them widened to i32 lanes.
    pub trait Cached: Copy {
        /// Bytes per value.
        const SIZE: usize;
        /// The 16 values from `p` as i32 lanes.
        unsafe fn load16(p: *const Self) -> __m512i;
        /// The 16 values from `p` as they are, where they are i16 (`SIZE == 2`).
        unsafe fn raw16(p: *const Self) -> __m256i;
    }

    impl Cached for i32 {
        const SIZE: usize = 4;
        #[inline(always)]
        unsafe fn load16(p: *const i32) -> __m512i {
            _mm512_loadu_si512(p.cast())
        }
        #[inline(always)]
        unsafe fn raw16(_: *const i32) -> __m256i {
            unreachable!("only an i16 cache is read as pairs")
        }
    }

    impl Cached for i16 {
        const SIZE: usize = 2;
        #[inline(always)]
        unsafe fn load16(p: *const i16) -> __m512i {
            _mm512_cvtepi16_epi32(_mm256_loadu_si256(p.cast()))
        }
        #[inline(always)]
        unsafe fn raw16(p: *const i16) -> __m256i {
            _mm256_loadu_si256(p.cast())
        }
    }

    /// The 16 query channels of `q` as i16 when each lies in `-32767..=32767`. Against keys in
    /// i16 `vpmaddwd` then gives each pair's sum exactly: `|q k| <= 32767 * 32768 < 2^30`, so
    /// a pair is below 2^31 (the one pair that wraps, -32768 four times, is excluded).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn query16(q: __m512i) -> Option<__m256i> {
        let (hi, lo) = (_mm512_set1_epi32(32767), _mm512_set1_epi32(-32767));
        let out = _mm512_cmpgt_epi32_mask(q, hi) | _mm512_cmplt_epi32_mask(q, lo);
        (out == 0).then(|| _mm512_cvtepi32_epi16(q))
    }

    /// Per-item values of one call, at most [`MANY_ITEMS`], on the stack: a call's vectors
    /// (queries, sums, totals) were five allocations per (run, head, layer), three of them
    /// 64-byte aligned (memalign), ~2% of a decode's samples; only the `m` used are written.
    struct PerItem<T: Copy> {
        items: [MaybeUninit<T>; MANY_ITEMS],
        m: usize,
    }

    impl<T: Copy> PerItem<T> {
        /// None yet; `fill` writes them in place (a filled array returned by value was
        /// copied whole, 4-11 KiB per call, by `memcpy`).
        #[inline(always)]
        fn uninit() -> Self {
            PerItem {
                items: [const { MaybeUninit::uninit() }; MANY_ITEMS],
                m: 0,
            }
        }

        #[inline(always)]
        fn fill(&mut self, m: usize, mut init: impl FnMut(usize) -> T) {
            assert!(m <= MANY_ITEMS);
            for (i, x) in self.items[..m].iter_mut().enumerate() {
                x.write(init(i));
            }
            self.m = m;
        }

        #[inline(always)]
        fn get(&self) -> &[T] {
            // SAFETY: `fill` wrote the first `m` (<= MANY_ITEMS) elements; `m` is 0 before it.
            unsafe { std::slice::from_raw_parts(self.items.as_ptr().cast(), self.m) }
        }

        #[inline(always)]
        fn get_mut(&mut self) -> &mut [T] {
            // SAFETY: as in `get`.
            unsafe { std::slice::from_raw_parts_mut(self.items.as_mut_ptr().cast(), self.m) }
        }
    }

    /// # Safety
    /// AVX-512 F; `kc` / `vc` hold `max(lens) * d` values; each query `d`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn head_many<C: Cached>(
        qs: &[&[i32]],
        lens: &[usize],
        (kc, vc): (*const C, *const C),
        (d, hd, h): (usize, usize, usize),
        tables: &Tables,
        out: &mut [i64],
    ) {
        let cache = (kc, vc);
        match hd / 16 {
            1 => head_many_n::<1, C>(qs, lens, cache, (d, h), tables, out),
            2 => head_many_n::<2, C>(qs, lens, cache, (d, h), tables, out),
            3 => head_many_n::<3, C>(qs, lens, cache, (d, h), tables, out),
            4 => head_many_n::<4, C>(qs, lens, cache, (d, h), tables, out),
            5 => head_many_n::<5, C>(qs, lens, cache, (d, h), tables, out),
            6 => head_many_n::<6, C>(qs, lens, cache, (d, h), tables, out),
            7 => head_many_n::<7, C>(qs, lens, cache, (d, h), tables, out),
            _ => head_many_n::<8, C>(qs, lens, cache, (d, h), tables, out),
        }
    }

    /// Asks for the head's rows of the next block (positions `s0..s0 + BLOCK` below `lmax`,
    /// `16 * N` channels from `at`, rows `d` apart) while this one is worked on: the rows are
    /// 3 KiB apart in a GPT-2-small cache, a stride the hardware prefetcher follows badly.
    #[inline(always)]
    unsafe fn prefetch_block<const N: usize, C: Cached>(
        at: *const C,
        d: usize,
        s0: usize,
        lmax: usize,
    ) {
        for s in s0..(s0 + BLOCK).min(lmax) {
            for line in 0..(16 * N * C::SIZE).div_ceil(64) {
                // Only a hint: an address past the cache is never dereferenced.
                let p = at.wrapping_add(s * d).cast::<u8>().wrapping_add(64 * line);
                _mm_prefetch::<_MM_HINT_T0>(p.cast());
            }
        }
    }

    /// Lane `j` of the result: the sum of the eight i64 lanes of `a[j]`. Pairs of vectors are
    /// added lane-pair-wise, then 128-bit and 256-bit halves: 21 instructions where eight
    /// reductions take about 56.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn reduce8(a: [__m512i; 8]) -> __m512i {
        // Each 128-bit lane of `pair(x, y)`: (sum of x's two i64, sum of y's).
        let pair =
            |x, y| _mm512_add_epi64(_mm512_unpacklo_epi64(x, y), _mm512_unpackhi_epi64(x, y));
        // 128-bit lanes (0, 2) and (1, 3) of x, then of y, added: lanes 0..1 are x's halves'
        // sums, 2..3 y's.
        let halves = |x, y| {
            _mm512_add_epi64(
                _mm512_shuffle_i64x2::<0b10_00_10_00>(x, y),
                _mm512_shuffle_i64x2::<0b11_01_11_01>(x, y),
            )
        };
        let (p01, p23) = (pair(a[0], a[1]), pair(a[2], a[3]));
        let (p45, p67) = (pair(a[4], a[5]), pair(a[6], a[7]));
        halves(halves(p01, p23), halves(p45, p67))
    }

    /// [`head_many`] with `16 * N` channels per head. Products as in the one-item kernels:
    /// `vpmuldq` of the even channels (low halves of the 64-bit lanes) and, after a shift,
    /// of the odd ones, into exact i64 sums.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn head_many_n<const N: usize, C: Cached>(
        qs: &[&[i32]],
        lens: &[usize],
        (kc, vc): (*const C, *const C),
        (d, h): (usize, usize),
        tables: &Tables,
        out: &mut [i64],
    ) {
        let (m, hd, off) = (qs.len(), 16 * N, 16 * N * h);
        let lmax = lens.iter().copied().max().unwrap_or(0);
        let (kp, vp) = (kc.add(off), vc.add(off));
        // Each item's query channels, prepared once for every block: even channels, odd
        // ones shifted down, and, against narrow keys, the channels as i16 where they fit.
        let mut queries = PerItem::uninit();
        queries.fill(m, |i| {
            let q = qs[i];
            let qp = q.as_ptr().add(off);
            let qe: [__m512i; N] =
                std::array::from_fn(|b| _mm512_loadu_si512(qp.add(16 * b).cast()));
            let qo: [__m512i; N] = std::array::from_fn(|b| _mm512_srli_epi64::<32>(qe[b]));
            // Narrow keys and queries: pairs of i16 products summed by `vpmaddwd` (exact,
            // see `query16`), widened to i64 lanes: half the instructions per position.
            let mut q16 = (C::SIZE == 2).then_some([_mm256_setzero_si256(); N]);
            if let Some(q16v) = q16.as_mut() {
                for (b, v) in q16v.iter_mut().enumerate() {
                    match query16(qe[b]) {
                        Some(x) => *v = x,
                        None => {
                            q16 = None;
                            break;
                        }
                    }
                }
            }
            (qe, qo, q16)
        });
        // Scores, item i's at i * lmax, then their weights, in the thread's buffers (each
        // element is written before it is read: positions below the item's length).
        let mut buf = scratch::Buffers::take(m * lmax, m * lmax);
        let (sc, p) = (&mut buf.scores[..m * lmax], &mut buf.weights[..m * lmax]);
        for s0 in (0..lmax).step_by(BLOCK) {
            prefetch_block::<N, C>(kp, d, s0 + BLOCK, lmax);
            for (i, &(qe, qo, q16)) in queries.get().iter().enumerate() {
                let end = (s0 + BLOCK).min(lens[i]);
                if end <= s0 {
                    continue;
                }
                let product = |s: usize| {
                    let kr = kp.add(s * d);
                    let mut acc = _mm512_setzero_si512();
                    if let Some(q16) = q16 {
                        for (b, &qb) in q16.iter().enumerate() {
                            let pairs = _mm256_madd_epi16(qb, C::raw16(kr.add(16 * b)));
                            acc = _mm512_add_epi64(acc, _mm512_cvtepi32_epi64(pairs));
                        }
                        return acc;
                    }
                    for b in 0..N {
                        let kv = C::load16(kr.add(16 * b));
                        acc = _mm512_add_epi64(acc, _mm512_mul_epi32(qe[b], kv));
                        let ko = _mm512_srli_epi64::<32>(kv);
                        acc = _mm512_add_epi64(acc, _mm512_mul_epi32(qo[b], ko));
                    }
                    acc
                };
                let mut s = s0;
                // Eight positions' lane sums reduced together (a third of the shuffles and
                // adds of eight reductions), stored as one vector.
                while s + 8 <= end {
                    let acc: [__m512i; 8] = std::array::from_fn(|j| product(s + j));
                    let sums = reduce8(acc);
                    _mm512_storeu_si512(sc.as_mut_ptr().add(i * lmax + s).cast(), sums);
                    s += 8;
                }
                for s in s..end {
                    sc[i * lmax + s] = _mm512_reduce_add_epi64(product(s));
                }
            }
        }
        // Weights, item by item, as the one-item path computes them.
        let mut totals = PerItem::uninit();
        totals.fill(m, |i| {
            let r = i * lmax..i * lmax + lens[i];
            softmax_weights(&mut sc[r.clone()], &mut p[r], tables)
        });
        // Weighted values: per item, even and odd channels' sums, kept in memory between
        // blocks and in registers within one.
        let (mut even, mut odd) = (PerItem::uninit(), PerItem::uninit());
        even.fill(m, |_| [_mm512_setzero_si512(); N]);
        odd.fill(m, |_| [_mm512_setzero_si512(); N]);
        let (even, odd) = (even.get_mut(), odd.get_mut());
        for s0 in (0..lmax).step_by(BLOCK) {
            prefetch_block::<N, C>(vp, d, s0 + BLOCK, lmax);
            for i in 0..m {
                let end = (s0 + BLOCK).min(lens[i]);
                if end <= s0 {
                    continue;
                }
                let (mut e, mut o) = (even[i], odd[i]);
                for s in s0..end {
                    let w = _mm512_set1_epi32(p[i * lmax + s]);
                    let vr = vp.add(s * d);
                    for b in 0..N {
                        let v = C::load16(vr.add(16 * b));
                        e[b] = _mm512_add_epi64(e[b], _mm512_mul_epi32(v, w));
                        let vo = _mm512_srli_epi64::<32>(v);
                        o[b] = _mm512_add_epi64(o[b], _mm512_mul_epi32(vo, w));
                    }
                }
                (even[i], odd[i]) = (e, o);
            }
        }
        // hd = 16 N <= 128 channels.
        let mut acc = [0i64; 128];
        for i in 0..m {
            for b in 0..N {
                let (mut e, mut o) = ([0i64; 8], [0i64; 8]);
                _mm512_storeu_si512(e.as_mut_ptr().cast(), even[i][b]);
                _mm512_storeu_si512(o.as_mut_ptr().cast(), odd[i][b]);
                for j in 0..8 {
                    acc[16 * b + 2 * j] = e[j];
                    acc[16 * b + 2 * j + 1] = o[j];
                }
            }
            normalize(&acc[..hd], totals.get()[i], &mut out[i * hd..(i + 1) * hd]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::lm::attention::attention;

    /// Every head of every item equals the one-item attention's, for runs of consecutive
    /// positions (as the encoder's batches hold them) and for arbitrary lengths, at the
    /// extremes of the keys, values and queries (|x| <= 2^20).
    #[test]
    fn many_items_equal_one_at_a_time() {
        if !many_supported(Isa::Avx512, 64) || !Isa::Avx512.available() {
            println!("skipped: the multi-item attention needs AVX-512 (per-item path used)");
            return;
        }
        let mut next = super::super::test_lcg(3);
        let mut rnd = |m: u64| (next() >> 33) % m;
        for (d, hd, lens) in [
            (128usize, 32usize, vec![1usize, 2, 3, 4, 5]),
            (768, 64, (90..106).collect::<Vec<_>>()),
            (192, 64, vec![17, 3, 40, 16, 33]),
            (96, 48, vec![1]),
            (256, 128, vec![31, 32, 33]),
            (80, 16, (1..20).collect()),
        ] {
            let tables = Tables::compute(hd as u32);
            let lmax = *lens.iter().max().unwrap();
            let mut val = |i: usize| match i % 9 {
                0 => -(1 << 20),
                1 => 1 << 20,
                // Small values too: many equal scores (ties in the max).
                2 => rnd(3) as i32 - 1,
                _ => rnd(1 << 21) as i32 - (1 << 20),
            };
            let kc: Vec<i32> = (0..lmax * d).map(&mut val).collect();
            let vc: Vec<i32> = (0..lmax * d).map(&mut val).collect();
            let qv: Vec<Vec<i32>> = lens
                .iter()
                .map(|_| (0..d).map(|c| val(c / 3) >> (c % 4)).collect())
                .collect();
            let qs: Vec<&[i32]> = qv.iter().map(Vec::as_slice).collect();
            // The cache as stored (i32), and a cache of values inside i16 (its extremes
            // included) read both ways: from i32 and from its i16 copy.
            let narrow = |c: &[i32]| -> Vec<i32> {
                c.iter()
                    .enumerate()
                    .map(|(i, &x)| match i % 7 {
                        0 => i16::MIN as i32,
                        1 => i16::MAX as i32,
                        _ => (x >> 5).clamp(i16::MIN as i32, i16::MAX as i32),
                    })
                    .collect()
            };
            let (kn, vn) = (narrow(&kc), narrow(&vc));
            let to16 = |c: &[i32]| -> Vec<i16> { c.iter().map(|&x| x as i16).collect() };
            let (k16, v16) = (to16(&kn), to16(&vn));
            for (kc, vc, kv) in [
                (&kc, &vc, Kv::Wide(&kc, &vc)),
                (&kn, &vn, Kv::Wide(&kn, &vn)),
                (&kn, &vn, Kv::Narrow(&k16, &v16)),
            ] {
                let want: Vec<Vec<i64>> = qs
                    .iter()
                    .zip(&lens)
                    .map(|(q, &len)| {
                        let mut o = vec![0i64; d];
                        attention(Isa::Portable, q, kc, vc, len, d, hd, &tables, &mut o);
                        o
                    })
                    .collect();
                for h in 0..d / hd {
                    let mut got = vec![7i64; lens.len() * hd];
                    let dims = (d, hd, h);
                    attention_head_many(Isa::Avx512, &qs, &lens, kv, dims, &tables, &mut got);
                    for (i, w) in want.iter().enumerate() {
                        assert_eq!(
                            &got[i * hd..(i + 1) * hd],
                            &w[h * hd..(h + 1) * hd],
                            "d={d} hd={hd} head {h} item {i} len {} narrow {}",
                            lens[i],
                            matches!(kv, Kv::Narrow(..))
                        );
                    }
                }
            }
        }
    }
}
