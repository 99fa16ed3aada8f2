//! Table lookups of 8 lanes by scalar loads, where they sit on the lanes' hot path. On a
//! Zen 2 (AMD EPYC Rome, the CPU of many GPU servers) a `vpgatherdd` of 8 dwords measured
//! about 16.5 cycles of throughput and 25 of latency; eight scalar loads, their indices
//! taken out of the vector by `vmovq` / `vpextrq`, leave the vector units to the rest of
//! the step. There the Joint decode ran 9–13% faster and the default layout's 2–7%.
//!
//! The values go back in by `vpinsrd` with the load folded in, one instruction a value:
//! pairing two values in a 64-bit register first (a shift and an or) and inserting the
//! pair took three for two, and the lookups were some 40% of the Joint decode's lane
//! instructions (docs/BENCHMARKS.md). With that, the default layout's encoder, which had
//! measured no change from scalar loads, takes its flat-table lookups this way too
//! (`encode::lookup_flat`); its two-level lookups keep `vpgatherdd` (no gain measured).

#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;

/// `_mm256_i32gather_epi32::<4>(table, idx)`.
///
/// # Safety
/// AVX2 (inlined into code built for it); every lane of `idx` a valid `u32` index from
/// `table`.
#[inline(always)]
pub(in crate::backend::cpu) unsafe fn gather8(table: *const u32, idx: __m256i) -> __m256i {
    gather8_by(idx, |i| *table.add(i) as i32)
}

/// [`gather8`], or a `vpgatherdd` where `GATHER` (faster on CPUs whose gathers are fast:
/// `super::super::avx2_gathers`).
///
/// # Safety
/// As [`gather8`].
#[inline(always)]
pub(in crate::backend::cpu) unsafe fn gather8_as<const GATHER: bool>(
    table: *const u32,
    idx: __m256i,
) -> __m256i {
    if GATHER {
        _mm256_i32gather_epi32::<4>(table.cast(), idx)
    } else {
        gather8(table, idx)
    }
}

/// 8 lanes of `load(index)` for the lanes of `idx`, as [`gather8`] does them.
///
/// # Safety
/// AVX2 (inlined into code built for it); `load` sound for every lane of `idx`.
#[inline(always)]
pub(in crate::backend::cpu) unsafe fn gather8_by(
    idx: __m256i,
    load: impl Fn(usize) -> i32,
) -> __m256i {
    let (lo, hi) = (
        _mm256_castsi256_si128(idx),
        _mm256_extracti128_si256::<1>(idx),
    );
    // Two indices per 64-bit move; each value loaded into its lane by one insert.
    let pairs = [
        _mm_cvtsi128_si64(lo),
        _mm_extract_epi64::<1>(lo),
        _mm_cvtsi128_si64(hi),
        _mm_extract_epi64::<1>(hi),
    ];
    let load = |i: u64| load(i as u32 as usize);
    let half = |a: i64, b: i64| {
        let v = _mm_cvtsi32_si128(load(a as u64));
        let v = _mm_insert_epi32::<1>(v, load(a as u64 >> 32));
        let v = _mm_insert_epi32::<2>(v, load(b as u64));
        _mm_insert_epi32::<3>(v, load(b as u64 >> 32))
    };
    let v0 = half(pairs[0], pairs[1]);
    let v1 = half(pairs[2], pairs[3]);
    _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(v0), v1)
}

/// `_mm256_i32gather_epi64::<8>(table, idx)`: four 64-bit values, one `vmovq` or `vpinsrq`
/// that loads each.
///
/// # Safety
/// As [`gather8`], for the four lanes of `idx`.
#[inline(always)]
pub(in crate::backend::cpu) unsafe fn gather4_u64(table: *const u64, idx: __m128i) -> __m256i {
    let (a, b) = (_mm_cvtsi128_si64(idx), _mm_extract_epi64::<1>(idx));
    let load = |i: i64| *table.add(i as u32 as usize) as i64;
    let lo = _mm_insert_epi64::<1>(_mm_cvtsi64_si128(load(a)), load(a >> 32));
    let hi = _mm_insert_epi64::<1>(_mm_cvtsi64_si128(load(b)), load(b >> 32));
    _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi)
}

/// `_mm256_mask_i32gather_epi32::<4>(src, table, idx, mask)` where every lane's index is
/// valid, masked in or not: all 8 read, the lanes outside `mask` keep `src`.
///
/// # Safety
/// As [`gather8`].
#[inline(always)]
pub(in crate::backend::cpu) unsafe fn gather8_or(
    src: __m256i,
    table: *const u32,
    idx: __m256i,
    mask: __m256i,
) -> __m256i {
    _mm256_blendv_epi8(src, gather8(table, idx), mask)
}
