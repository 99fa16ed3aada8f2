//! AVX-512 rANS lane encoding (see the module above).
//!
//! The chunk's 32 lanes are two vectors of 16 `u32` states. Per step and stage (in the
//! encoder's reversed order) the contexts of all lanes are computed at once from the packed
//! codes, each lane's symbol is gathered from the stage's packed table
//! ([`EncStage::packed`]), and the flushed words are written with compressing stores, the
//! output filled from its end backwards: lanes 16..31 of a stage land above lanes 0..15, and
//! every later (stage, step) below the earlier ones, so the buffer read forwards is exactly the
//! reference's reversed word stream, with no reversal pass.
//!
//! The division `x / freq` runs in single precision and is then made exact: with `q < 2^20`
//! (rANS normalization: `x < freq << 20` once flushed) a float quotient off by less than one
//! is corrected with the integer remainder `x - q·freq`, which lies in `[-freq, 2·freq)`.

#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;

use super::super::encode::{codes, Scratch};
use super::super::tables::{EncStage, PACKED_IDENTITY};
use super::super::word::Word;
use crate::delta::chunk::{EncodedChunk, LANES};
use crate::entropy::freq::PROB_TOTAL;
use crate::entropy::rans::RANS_L;

/// One chunk, as `super::super::encode::chunk` codes it, with explicit AVX-512 lanes.
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL, VBMI2 (`Isa::Avx512` available).
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vl,avx512vbmi2")]
pub unsafe fn chunk<T: Word>(
    d: &[T],
    info: &[u16],
    signed: bool,
    w1: usize,
    stages: &[EncStage],
    distance: Option<usize>,
    s: &mut Scratch,
) -> EncodedChunk {
    s.tail.clear();
    codes(d, signed, &mut s.codes, Some(&mut s.tail));
    // SAFETY: the caller guarantees the features.
    let (states, at) = unsafe { lanes(&s.codes, info, w1, stages, distance, &mut s.words) };
    EncodedChunk {
        words: s.words[at..s.codes.len() * stages.len()].to_vec(),
        states,
        tail: s.tail.bytes(),
        tail_bits: s.tail.bits(),
    }
}

/// Per-half facts of one step, shared by the stages.
#[derive(Clone, Copy)]
struct Half {
    valid: __mmask16,
    c: __m512i,
    i: __m512i,
    b: __m512i,
    eb: __m512i,
    /// Codes of the neighbors `d` elements back, and which lanes have one.
    nc: __m512i,
    knb: __mmask16,
}

/// The interleaved lanes of one chunk (as `super::super::encode::lanes`); the words are left
/// in `words[at..codes.len() * stages.len()]` in stream order, `at` returned with the final
/// states.
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL, VBMI2.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi2")]
pub unsafe fn lanes(
    codes: &[u32],
    info: &[u16],
    w1: usize,
    stages: &[EncStage],
    distance: Option<usize>,
    words: &mut Vec<u16>,
) -> ([u32; LANES], usize) {
    let n = codes.len();
    assert!(info.len() >= n && (3..=4).contains(&stages.len()));
    // At most one word per coded symbol. Grown, never cleared: every slot from the final
    // cursor up is written.
    let end = n * stages.len();
    if words.len() < end {
        words.resize(end, 0);
    }
    let out = words.as_mut_ptr();
    let mut pos = end;
    let s_nb = stages.get(3).is_some_and(|t| t.neighbor);
    let b_nb = stages[0].neighbor;
    let d = match distance {
        Some(d) if b_nb || s_nb => d,
        _ => usize::MAX,
    };
    let w1v = _mm512_set1_epi32(w1 as i32);
    let m127 = _mm512_set1_epi32(127);
    let one = _mm512_set1_epi32(1);
    let mut x = [_mm512_set1_epi32(RANS_L as i32); 2];
    for step in (0..n.div_ceil(LANES)).rev() {
        let base = step * LANES;
        let lanes = LANES.min(n - base);
        let mut h = [None::<Half>; 2];
        for (k, slot) in h.iter_mut().enumerate() {
            // Lanes of the upper half past the chunk's end have `cnt == 0`, `at == n`.
            let at = (base + 16 * k).min(n);
            let cnt = lanes.saturating_sub(16 * k).min(16);
            let valid: __mmask16 = ((1u32 << cnt) - 1) as __mmask16;
            // SAFETY: lanes `< cnt` are elements `at..at + cnt <= n` of `codes` and `info`;
            // the masked-off lanes are not accessed (and `at <= n` keeps the pointers inside
            // or one past the end of the slices).
            let (c, i) = unsafe {
                (
                    _mm512_maskz_loadu_epi32(valid, codes.as_ptr().add(at) as *const _),
                    _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                        valid,
                        info.as_ptr().add(at) as *const _,
                    )),
                )
            };
            let (nc, knb) = if at >= d {
                // SAFETY: as above, `at - d + cnt <= n`.
                let nc = unsafe {
                    _mm512_maskz_loadu_epi32(valid, codes.as_ptr().add(at - d) as *const _)
                };
                (nc, valid)
            } else if at + 16 <= d {
                (_mm512_setzero_si512(), 0)
            } else {
                let mut tmp = [0u32; 16];
                let mut knb = 0u16;
                for (l, t) in tmp.iter_mut().enumerate().take(cnt) {
                    if at + l >= d {
                        *t = codes[at + l - d];
                        knb |= 1 << l;
                    }
                }
                // SAFETY: reads the 16 `u32` of `tmp`.
                (unsafe { _mm512_loadu_si512(tmp.as_ptr() as *const _) }, knb)
            };
            let b = _mm512_and_si512(c, m127);
            let er = _mm512_and_si512(i, _mm512_set1_epi32(255));
            let eb = _mm512_add_epi32(_mm512_mullo_epi32(er, w1v), b);
            *slot = Some(Half {
                valid,
                c,
                i,
                b,
                eb,
                nc,
                knb,
            });
        }
        let h = h.map(|h| h.unwrap());
        let bit = |v: __m512i, s: u32| -> __m512i {
            _mm512_and_si512(_mm512_srlv_epi32(v, _mm512_set1_epi32(s as i32)), one)
        };
        let present = |hf: &Half, min_b: i32| -> __mmask16 {
            _mm512_mask_cmpge_epu32_mask(hf.valid, hf.b, _mm512_set1_epi32(min_b))
        };
        if let Some(t) = stages.get(3) {
            let p = h.map(|hf| {
                // up: the neighbor's sign state (0 none / no update, 1 up, 2 down).
                let nz =
                    _mm512_mask_test_epi32_mask(hf.knb & (s_nb as u16).wrapping_neg(), hf.nc, m127);
                let up = _mm512_maskz_add_epi32(nz, one, bit(hf.nc, 9));
                let rs = bit(hf.i, 8);
                let three = _mm512_add_epi32(_mm512_slli_epi32::<1>(hf.eb), hf.eb);
                let ctx = _mm512_add_epi32(_mm512_slli_epi32::<1>(_mm512_add_epi32(three, up)), rs);
                // SAFETY: features as this function's.
                unsafe { gather(t, present(&hf, 1), ctx, bit(hf.c, 9)) }
            });
            // SAFETY: `pos` never drops below 0: one word at most per coded symbol.
            unsafe { put2(&mut x, p, out, &mut pos) };
        }
        let p = h.map(|hf| {
            let ctx = _mm512_add_epi32(_mm512_slli_epi32::<1>(hf.eb), bit(hf.c, 7));
            // SAFETY: features as this function's.
            unsafe { gather(&stages[2], present(&hf, 3), ctx, bit(hf.c, 8)) }
        });
        // SAFETY: as above.
        unsafe { put2(&mut x, p, out, &mut pos) };
        let p = h.map(|hf| {
            // SAFETY: features as this function's.
            unsafe { gather(&stages[1], present(&hf, 2), hf.eb, bit(hf.c, 7)) }
        });
        // SAFETY: as above.
        unsafe { put2(&mut x, p, out, &mut pos) };
        let p = h.map(|hf| {
            let er = _mm512_and_si512(hf.i, _mm512_set1_epi32(255));
            let ctx = if b_nb {
                let nb = _mm512_mask_and_epi32(w1v, hf.knb, hf.nc, m127);
                let m2 = _mm512_and_si512(_mm512_srli_epi32::<9>(hf.i), _mm512_set1_epi32(3));
                let row = _mm512_add_epi32(_mm512_mullo_epi32(m2, _mm512_add_epi32(w1v, one)), nb);
                _mm512_add_epi32(_mm512_slli_epi32::<8>(row), er)
            } else {
                er
            };
            // SAFETY: features as this function's.
            unsafe { gather(&stages[0], hf.valid, ctx, hf.b) }
        });
        // SAFETY: as above.
        unsafe { put2(&mut x, p, out, &mut pos) };
    }
    let mut states = [0u32; LANES];
    // SAFETY: 2 × 16 `u32` into the 32 of `states`.
    unsafe {
        _mm512_storeu_si512(states.as_mut_ptr() as *mut _, x[0]);
        _mm512_storeu_si512(states.as_mut_ptr().add(16) as *mut _, x[1]);
    }
    (states, pos)
}

/// The packed symbols (`freq | start << 16`) of 16 lanes: `sym` under context `ctx`'s row for
/// the lanes in `k`, the identity elsewhere. Contexts and rows are clamped to the tables, so
/// nothing is read outside them whatever the codes (in-range values, the only ones the
/// passes produce, are unchanged).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn gather(t: &EncStage, k: __mmask16, ctx: __m512i, sym: __m512i) -> __m512i {
    let ctx = _mm512_min_epu32(ctx, _mm512_set1_epi32(t.map.len() as i32 - 1));
    // SAFETY: the lanes in `k` read `map[ctx]` with `ctx < map.len()`.
    let row = unsafe {
        _mm512_mask_i32gather_epi32::<4>(_mm512_setzero_si512(), k, ctx, t.map.as_ptr() as *const _)
    };
    // Contexts without a row (never for tables built from the codes' own counts) code the
    // identity, as `EncStage::get` does.
    let k = _mm512_mask_cmpneq_epu32_mask(k, row, _mm512_set1_epi32(-1));
    let idx = _mm512_add_epi32(
        _mm512_mullo_epi32(row, _mm512_set1_epi32(t.alphabet as i32)),
        sym,
    );
    let idx = _mm512_min_epu32(idx, _mm512_set1_epi32(t.packed.len() as i32 - 1));
    // SAFETY: the lanes in `k` read `packed[idx]` with `idx < packed.len()`.
    unsafe {
        _mm512_mask_i32gather_epi32::<4>(
            _mm512_set1_epi32(PACKED_IDENTITY as i32),
            k,
            idx,
            t.packed.as_ptr() as *const _,
        )
    }
}

/// One (step, stage) of rANS encoding over lanes 31..=0: per lane `enc_put`, the words
/// stored below `*pos` in lane order.
///
/// # Safety
/// `out[..*pos]` must have room for every word this call flushes (at most 32).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi2")]
unsafe fn put2(x: &mut [__m512i; 2], p: [__m512i; 2], out: *mut u16, pos: &mut usize) {
    let m16 = _mm512_set1_epi32(0xFFFF);
    let f = p.map(|p| _mm512_and_si512(p, m16));
    // x >= freq << 20, as x >> 20 >= freq: the identity's freq 2^12 never flushes.
    let k = [0, 1].map(|h| _mm512_cmpge_epu32_mask(_mm512_srli_epi32::<20>(x[h]), f[h]));
    for h in [1, 0] {
        *pos -= k[h].count_ones() as usize;
        // SAFETY: `out[*pos..]` has room for the `popcount(k)` words stored (caller).
        unsafe {
            _mm256_mask_compressstoreu_epi16(
                out.add(*pos) as *mut _,
                k[h],
                _mm512_cvtepi32_epi16(x[h]),
            )
        };
    }
    let total = _mm512_set1_epi32(PROB_TOTAL as i32);
    let two = _mm512_set1_ps(2.0);
    for h in 0..2 {
        let y = _mm512_mask_srli_epi32::<16>(x[h], k[h], x[h]);
        let start = _mm512_srli_epi32::<16>(p[h]);
        let cmpl = _mm512_sub_epi32(total, f[h]);
        // 1 / freq to within ~2^-23 (one Newton step on the 14-bit estimate).
        let ff = _mm512_cvtepi32_ps(f[h]);
        let r0 = _mm512_rcp14_ps(ff);
        let rcp = _mm512_mul_ps(r0, _mm512_fnmadd_ps(ff, r0, two));
        // q0 within one of y / freq: relative error < 2^-21, q < 2^20.
        let q0 = _mm512_cvttps_epu32(_mm512_mul_ps(_mm512_cvtepu32_ps(y), rcp));
        let rem = _mm512_sub_epi32(y, _mm512_mullo_epi32(q0, f[h]));
        // C(y) = y + start + q·cmpl; one quotient off shifts it by ±cmpl.
        let t = _mm512_add_epi32(_mm512_add_epi32(y, start), _mm512_mullo_epi32(q0, cmpl));
        let low = _mm512_cmplt_epi32_mask(rem, _mm512_setzero_si512());
        let high = _mm512_cmpge_epi32_mask(rem, f[h]);
        let t = _mm512_mask_sub_epi32(t, low, t, cmpl);
        x[h] = _mm512_mask_add_epi32(t, high, t, cmpl);
    }
}
