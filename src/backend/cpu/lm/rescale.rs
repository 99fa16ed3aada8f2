//! Rescaling the matmul's i32 sums to the next stage's fixed point (docs/INTEGER_GPT2.md §4):
//! the definition, and the branch-free loop (plain and compiled for AVX-512) that computes
//! the same integers when every shift is in range.

use crate::backend::cpu::Isa;
use crate::format::lm::fixed::round_shift64;
use crate::format::lm::model_file::Linear;

/// The largest `k` the fused VNNI rescale takes: a dot of `k` products of int8 weights and
/// activations in [-127, 127] is then at most `2^14 k <= 2^30` in magnitude, the headroom its
/// i64 rounding add with the bias needs (`VnniRows::dots_rescaled`). GPT-2's largest is 3,072.
pub const FUSED_MAX_K: usize = 1 << 16;

/// A layer's per-row rescale factors as the kernels read them, prepared once per session:
/// the 16-bit multipliers ([`Linear::m16`]: mapped per call, they cost as much as a one-item
/// GEMV's dots), their exponents and the biases, padded to whole groups of 16 rows (the VNNI
/// layout's) with multiplier 0 (those outputs are never stored); and the bounds that decide
/// the exact fast path once per call ([`RowScales::fast`]) instead of by a scan per item.
#[derive(Clone, Debug, Default)]
pub struct RowScales {
    pub ms: Vec<i64>,
    pub es: Vec<i32>,
    pub bias: Vec<i32>,
    /// Per group of 16 rows, the fused VNNI rescale's operands as 64-bit lanes: the even
    /// rows' multipliers, the odd rows', then the exponents and `2 bias + 1` likewise (48
    /// values per group; the bias folded into the rounding add).
    pub lanes: Vec<i64>,
    /// The least and largest exponent of the real rows, whether every multiplier lies in
    /// `0..2^16`, and whether `k <= 2^16` (the fused rescale's bound on the sums).
    e_range: (i32, i32),
    ms_small: bool,
    k_small: bool,
}

impl RowScales {
    /// Where rows `r..r + 8` (`r` a multiple of 8) start in [`RowScales::lanes`]: their even
    /// rows' multipliers, the odd rows' 8 values on, exponents 16 on, `2b + 1` 32 on.
    #[cfg(target_arch = "x86_64")]
    pub fn lanes8(&self, r: usize) -> *const i64 {
        debug_assert!(r.is_multiple_of(8) && r < self.ms.len());
        self.lanes[r / 16 * 48 + r % 16 / 2..].as_ptr()
    }

    pub fn new(lin: &Linear) -> RowScales {
        let (mut ms, mut es): (Vec<i64>, Vec<i32>) = (0..lin.rows).map(|j| lin.m16(j)).unzip();
        let small = |m: i64| (0..1 << 16).contains(&m);
        let e_range = es
            .iter()
            .fold((i32::MAX, i32::MIN), |(lo, hi), &e| (lo.min(e), hi.max(e)));
        let ms_small = ms.iter().all(|&m| small(m));
        let padded = lin.rows.next_multiple_of(16);
        let mut bias = lin.bias.clone();
        ms.resize(padded, 0);
        es.resize(padded, e_range.0.max(0));
        bias.resize(padded, 0);
        let mut lanes = Vec::with_capacity(padded * 3);
        for g in 0..padded / 16 {
            let rows = |parity: usize| (0..8).map(move |i| 16 * g + 2 * i + parity);
            lanes.extend(rows(0).chain(rows(1)).map(|r| ms[r]));
            lanes.extend(rows(0).chain(rows(1)).map(|r| es[r] as i64));
            lanes.extend(rows(0).chain(rows(1)).map(|r| 2 * bias[r] as i64 + 1));
        }
        RowScales {
            ms,
            es,
            bias,
            lanes,
            e_range,
            ms_small,
            k_small: lin.k <= FUSED_MAX_K,
        }
    }

    /// Whether the items with multipliers `tms` and exponents `tes` take the branch-free
    /// path at output fraction `out_frac` with every row: every shift `e + t_e - out_frac`
    /// in 1..=63 and every `m * t_m` below 2^32 (both multipliers non-negative and below 2^16,
    /// as real scales are), so that `|acc| * m * t_m` is one unsigned 32 x 32 -> 64 multiply
    /// of a 32 x 32 -> 64 product; and the layer's `k` at most [`FUSED_MAX_K`].
    pub fn fast(&self, tms: &[i64], tes: &[i32], out_frac: i32) -> bool {
        let (emin, emax) = self.e_range;
        let (tmin, tmax) = tes
            .iter()
            .fold((i32::MAX, i32::MIN), |(lo, hi), &e| (lo.min(e), hi.max(e)));
        !tes.is_empty()
            && emin <= emax
            && emin as i64 + tmin as i64 - out_frac as i64 >= 1
            && emax as i64 + tmax as i64 - out_frac as i64 <= 63
            && self.ms_small
            && self.k_small
            && tms.iter().all(|&m| (0..1 << 16).contains(&m))
    }
}

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
    // Folds without early exit, so that they vectorize: with one item these scans cost as
    // much as the rescale itself.
    let range = |v: &[i32]| {
        v.iter()
            .fold((i32::MAX, i32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)))
    };
    if es.is_empty() || tes.is_empty() {
        return; // no element
    }
    let ((emin, emax), (tmin, tmax)) = (range(es), range(tes));
    let fast = emin as i64 + tmin as i64 - out_frac as i64 >= 1
        && emax as i64 + tmax as i64 - out_frac as i64 <= 63;
    if !fast {
        return rescale_reference(acc, n, ms, es, bias, tms, tes, out_frac, clamp, res);
    }
    // AVX2 has no 64-bit multiply, but `m * t_m` fits 32 bits for real scales (both are
    // below 2^16), and then one 32 x 32 -> 64 multiply per element is the whole product.
    let small = |v: &[i64]| v.iter().fold(0u64, |a, &x| a | x as u64) < 1 << 16;
    let args = (ms, es, bias, tms, tes);
    rescale_fast_at(isa, acc, n, args, out_frac, clamp, res, || {
        small(ms) && small(tms)
    })
}

/// [`rescale`] of one item's sums (`n = 1`, multiplier `tm`, exponent `te`) for rows
/// `j0..j0 + acc.len()` of `rows` (`j0` a multiple of 16) in a call whose items
/// [`RowScales::fast`] admitted: the branch-free path straight away, without `rescale`'s
/// scans of the exponents (per item of a batched call, those scans cost half as much as the
/// rescale).
#[allow(clippy::too_many_arguments)]
pub fn rescale_item_fast(
    isa: Isa,
    acc: &[i32],
    rows: &RowScales,
    j0: usize,
    tm: i64,
    te: i32,
    out_frac: i32,
    clamp: i64,
    res: &mut [i32],
) {
    let j1 = j0 + acc.len();
    assert!(j0.is_multiple_of(16) && j1 <= rows.ms.len() && res.len() >= acc.len());
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: the level implies AVX2 (`Isa::available`); `RowScales::fast` admitted the
        // call (shifts in 1..=63, multipliers below 2^16, k <= FUSED_MAX_K); the rows lie
        // inside `rows` (asserted), whose lanes cover every group of its padded rows.
        unsafe { rescale_lanes_avx2(acc, rows, j0, tm, te - out_frac, clamp, res) };
        return;
    }
    let (ms, es, bias) = (&rows.ms[j0..j1], &rows.es[j0..j1], &rows.bias[j0..j1]);
    // `RowScales::fast` checked that every multiplier is below 2^16.
    let args = (ms, es, bias, &[tm][..], &[te][..]);
    rescale_fast_at(isa, acc, 1, args, out_frac, clamp, res, || true)
}

/// [`rescale_item_fast`] at AVX2, eight rows per step ([`rescale8_avx2`]); the rows past the
/// last whole eight one by one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn rescale_lanes_avx2(
    acc: &[i32],
    rows: &RowScales,
    j0: usize,
    tm: i64,
    sh: i32,
    clamp: i64,
    res: &mut [i32],
) {
    use std::arch::x86_64::*;
    let w = acc.len();
    let item = Item8::new(tm, sh, clamp);
    let mut r = 0;
    while r + 8 <= w {
        let v = _mm256_loadu_si256(acc.as_ptr().add(r).cast());
        let out = rescale8_avx2(v, rows.lanes8(j0 + r), &item);
        _mm256_storeu_si256(res.as_mut_ptr().add(r).cast(), out);
        r += 8;
    }
    for r in r..w {
        let (m, e, b) = (rows.ms[j0 + r], rows.es[j0 + r], rows.bias[j0 + r]);
        res[r] = rescale_one(acc[r], m * tm, (e + sh) as i64, b as i64, clamp);
    }
}

/// One item's operands of [`rescale8_avx2`], broadcast once per call: its multiplier, its
/// exponent less the output fraction less 1, and the clamp's bounds doubled (`[-2c, 2c+1]`).
#[cfg(target_arch = "x86_64")]
pub(super) struct Item8 {
    tm: std::arch::x86_64::__m256i,
    sh: std::arch::x86_64::__m256i,
    lo: std::arch::x86_64::__m256i,
    hi: std::arch::x86_64::__m256i,
}

#[cfg(target_arch = "x86_64")]
impl Item8 {
    /// `sh` is the item's exponent less the output fraction.
    #[target_feature(enable = "avx2")]
    pub(super) fn new(tm: i64, sh: i32, clamp: i64) -> Item8 {
        use std::arch::x86_64::*;
        Item8 {
            tm: _mm256_set1_epi64x(tm),
            sh: _mm256_set1_epi64x(sh as i64 - 1),
            lo: _mm256_set1_epi64x(-2 * clamp),
            hi: _mm256_set1_epi64x(2 * clamp + 1),
        }
    }
}

/// The rescale of eight consecutive rows' sums `v` of one item (a call [`RowScales::fast`]
/// admitted), from the rows' 64-bit lanes at `at` ([`RowScales::lanes8`], the fused VNNI
/// rescale's layout): the even rows' sums in the low halves of the 64-bit lanes, the odd
/// rows' in the high halves, so nothing is widened or packed (the four-row steps of
/// [`rescale_avx2`] spent a third of their instructions on that). The integers of
/// `VnniRows::dots_rescaled`: `clamp((q + 2b + 1) >> 1)` with `q = x >> (s - 1)`, `x = a m
/// t_m`, `s = e + t_e - out_frac`; the clamp is applied before the halving, as `[-2c, 2c +
/// 1]` (the same result), so that the halving's low 32 bits, all that is kept, need no
/// arithmetic shift, and AVX2's missing 64-bit arithmetic shift of `x` is `((x ^ g) >> s)
/// ^ g`, `g` its sign. Used by the AVX2 rescale and fused into the AVX-VNNI matmul.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn rescale8_avx2(
    v: std::arch::x86_64::__m256i,
    at: *const i64,
    item: &Item8,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let zero = _mm256_setzero_si256();
    // Four rows: magnitudes `mag` (low halves), signs `neg` (all ones where negative), the
    // rows' multipliers at `at`, exponents 16 and `2b + 1` 32 values on; the clamped
    // `q + 2b + 1`.
    let four = |mag: __m256i, neg: __m256i, at: *const i64| {
        let m = _mm256_loadu_si256(at.cast());
        let e = _mm256_loadu_si256(at.add(16).cast());
        let b21 = _mm256_loadu_si256(at.add(32).cast());
        let x = _mm256_mul_epu32(mag, _mm256_mul_epu32(m, item.tm));
        let x = _mm256_sub_epi64(_mm256_xor_si256(x, neg), neg);
        let g = _mm256_cmpgt_epi64(zero, x);
        let s = _mm256_add_epi64(e, item.sh);
        let q = _mm256_xor_si256(_mm256_srlv_epi64(_mm256_xor_si256(x, g), s), g);
        let y = _mm256_add_epi64(q, b21);
        let y = _mm256_blendv_epi8(y, item.hi, _mm256_cmpgt_epi64(y, item.hi));
        _mm256_blendv_epi8(y, item.lo, _mm256_cmpgt_epi64(item.lo, y))
    };
    // |i32::MIN| is 2^31 as u32: still exact.
    let mag = _mm256_abs_epi32(v);
    let even = four(
        mag,
        _mm256_cmpgt_epi64(zero, _mm256_slli_epi64::<32>(v)),
        at,
    );
    let odd = four(
        _mm256_srli_epi64::<32>(mag),
        _mm256_cmpgt_epi64(zero, v),
        at.add(8),
    );
    // Each halving's bits 1..=32 into its row's half of the lane.
    _mm256_blend_epi32::<0b1010_1010>(_mm256_srli_epi64::<1>(even), _mm256_slli_epi64::<31>(odd))
}

/// The branch-free rescale at level `isa`, every shift known to lie in 1..=63; `small`
/// answers whether every multiplier is below 2^16 (asked only where AVX2 needs it).
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
fn rescale_fast_at(
    isa: Isa,
    acc: &[i32],
    n: usize,
    (ms, es, bias, tms, tes): (&[i64], &[i32], &[i32], &[i64], &[i32]),
    out_frac: i32,
    clamp: i64,
    res: &mut [i32],
    small: impl FnOnce() -> bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512 && std::is_x86_feature_detected!("avx512dq") {
            // SAFETY: the `Avx512` level implies F and VL (`Isa::available`), DQ is checked;
            // the body is safe code compiled with them.
            unsafe { rescale_fast_avx512(acc, n, ms, es, bias, tms, tes, out_frac, clamp, res) };
            return;
        }
        if isa >= Isa::Avx2 && small() {
            // SAFETY: levels from `Avx2` up imply AVX2 (`Isa::available`); shifts are in
            // 1..=63 (the caller's contract) and the multipliers below 2^16 (`small`).
            unsafe { rescale_avx2(acc, n, ms, es, bias, tms, tes, out_frac, clamp, res) };
            return;
        }
    }
    rescale_fast(acc, n, ms, es, bias, tms, tes, out_frac, clamp, res)
}

/// One element of [`rescale_fast`]: `clamp(((a * m * t_m + 2^(s-1)) >> s) + b)`.
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn rescale_one(a: i32, mt: i64, s: i64, b: i64, clamp: i64) -> i32 {
    let prod = a as i64 * mt;
    let v = ((prod + (1i64 << (s - 1))) >> s) + b;
    v.clamp(-clamp, clamp) as i32
}

/// [`rescale_fast`] four elements per instruction: the rows of one item (`n == 1`, the
/// decoder's GEMV) or the items of one row. Each element's `m * t_m` is below 2^32, so
/// `|a| * (m * t_m)` is one unsigned 32 x 32 -> 64 multiply (below 2^63), negated back where
/// `a < 0`; the arithmetic shift AVX2 lacks for 64-bit lanes is `((x ^ s) >> n) ^ s` with
/// `s` the sign mask. Same integers as [`rescale_fast`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn rescale_avx2(
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
    use std::arch::x86_64::*;
    let rows = ms.len();
    assert!(acc.len() >= rows * n && res.len() >= rows * n);
    assert!(es.len() == rows && bias.len() == rows && tms.len() == n && tes.len() == n);
    let (lo, hi) = (_mm256_set1_epi64x(-clamp), _mm256_set1_epi64x(clamp));
    let load4 = |p: *const i32| _mm256_cvtepi32_epi64(_mm_loadu_si128(p as *const __m128i));
    if n == 1 {
        let (tm, sh) = (_mm256_set1_epi64x(tms[0]), (tes[0] - out_frac) as i64);
        let mut r = 0;
        while r + 4 <= rows {
            let mt = _mm256_mul_epu32(_mm256_loadu_si256(ms.as_ptr().add(r) as *const _), tm);
            let s = _mm256_add_epi64(load4(es.as_ptr().add(r)), _mm256_set1_epi64x(sh));
            let a = _mm_loadu_si128(acc.as_ptr().add(r) as *const __m128i);
            let v = rescale4(a, mt, s, load4(bias.as_ptr().add(r)), lo, hi);
            _mm_storeu_si128(res.as_mut_ptr().add(r) as *mut __m128i, v);
            r += 4;
        }
        for r in r..rows {
            let s = (es[r] - out_frac) as i64 + tes[0] as i64;
            res[r] = rescale_one(acc[r], ms[r] * tms[0], s, bias[r] as i64, clamp);
        }
        return;
    }
    for r in 0..rows {
        let (m, b) = (
            _mm256_set1_epi64x(ms[r]),
            _mm256_set1_epi64x(bias[r] as i64),
        );
        let sh = _mm256_set1_epi64x((es[r] - out_frac) as i64);
        let (a, o) = (&acc[r * n..(r + 1) * n], &mut res[r * n..(r + 1) * n]);
        let mut t = 0;
        while t + 4 <= n {
            let mt = _mm256_mul_epu32(m, _mm256_loadu_si256(tms.as_ptr().add(t) as *const _));
            let s = _mm256_add_epi64(load4(tes.as_ptr().add(t)), sh);
            let v = rescale4(
                _mm_loadu_si128(a.as_ptr().add(t) as *const _),
                mt,
                s,
                b,
                lo,
                hi,
            );
            _mm_storeu_si128(o.as_mut_ptr().add(t) as *mut __m128i, v);
            t += 4;
        }
        for t in t..n {
            let s = (es[r] - out_frac) as i64 + tes[t] as i64;
            o[t] = rescale_one(a[t], ms[r] * tms[t], s, bias[r] as i64, clamp);
        }
    }
}

/// Four lanes of [`rescale_avx2`]: i32 sums `a`, 64-bit `mt` (< 2^32), shifts `s` (1..=63),
/// biases `b`; returns the clamped results as four i32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn rescale4(
    a: std::arch::x86_64::__m128i,
    mt: std::arch::x86_64::__m256i,
    s: std::arch::x86_64::__m256i,
    b: std::arch::x86_64::__m256i,
    lo: std::arch::x86_64::__m256i,
    hi: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::*;
    let zero = _mm256_setzero_si256();
    let one = _mm256_set1_epi64x(1);
    let neg = _mm256_cmpgt_epi64(zero, _mm256_cvtepi32_epi64(a));
    // |i32::MIN| is 2^31 as u32: still exact.
    let mag = _mm256_cvtepu32_epi64(_mm_abs_epi32(a));
    let p = _mm256_mul_epu32(mag, mt);
    let prod = _mm256_sub_epi64(_mm256_xor_si256(p, neg), neg);
    let x = _mm256_add_epi64(prod, _mm256_sllv_epi64(one, _mm256_sub_epi64(s, one)));
    let sg = _mm256_cmpgt_epi64(zero, x);
    let q = _mm256_xor_si256(_mm256_srlv_epi64(_mm256_xor_si256(x, sg), s), sg);
    let v = _mm256_add_epi64(q, b);
    let v = _mm256_blendv_epi8(v, hi, _mm256_cmpgt_epi64(v, hi));
    let v = _mm256_blendv_epi8(v, lo, _mm256_cmpgt_epi64(lo, v));
    // The low halves of the four i64 lanes (the clamped values fit i32).
    let idx = _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0);
    _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(v, idx))
}

/// The definition: every element through `round_shift64`.
#[allow(clippy::too_many_arguments)]
pub(super) fn rescale_reference(
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
        for n in [1, 3, 4, 37] {
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
        // Ties of the rounding on both signs: the shift's half, exactly.
        let mut acc = acc;
        acc[0] = -(1 << 27);
        acc[5 * n - 1] = (1 << 27) - 1;
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
