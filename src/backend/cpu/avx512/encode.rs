//! AVX-512 rANS lane encoding (see the module above).
//!
//! The chunk's 32 lanes are two vectors of 16 `u32` states. Per step and stage (in the
//! encoder's reversed order) the contexts of all lanes are computed at once from the packed
//! codes, each lane's symbol is gathered from the stage's packed table
//! ([`EncStage::packed`]), and the flushed words are written with compressing stores, the
//! output filled from its end backwards: lanes 16..31 of a stage land above lanes 0..15, and
//! every later (stage, step) below the earlier ones, so the buffer read forwards is exactly the
//! reference's reversed word stream, with no reversal pass. The codes the lanes read come
//! from the AVX2 level's passes (`avx2::encode::codes_and_tails`, and for `--fast` the slots
//! of `avx2::joint::slots_and_tails`), which this level implies.
//!
//! The division `x / freq` runs in single precision and is then made exact: with `q < 2^20`
//! (rANS normalization: `x < freq << 20` once flushed) a float quotient off by less than one
//! is corrected with the integer remainder `x - q·freq`, which lies in `[-freq, 2·freq)`.

#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;

use super::super::encode::Scratch;
use super::super::tables::{EncStage, PACKED_IDENTITY};
use super::super::word::Word;
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::entropy::rans::RANS_L;
use crate::format::chunk::{EncodedChunk, LANES};

/// One chunk, as `super::super::encode::chunk` codes it, with explicit AVX-512 lanes.
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL, CD (`Isa::Avx512` available).
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vl,avx512cd")]
pub unsafe fn chunk<T: Word>(
    d: &[T],
    info: &[u16],
    signed: bool,
    w1: usize,
    stages: &[EncStage],
    flat: &Flat,
    distance: Option<usize>,
    s: &mut Scratch,
) -> EncodedChunk {
    // The codes by the AVX2 level's pass (this level implies its features): vector passes
    // for 16- and 32-bit floats from the float conversion (avx2c), where this level had a
    // leading-zero-count pass for 16-bit floats and the portable loop for 32-bit ones.
    // SAFETY: the caller guarantees the features, AVX2's included (`Isa::available`).
    unsafe { super::super::avx2::encode::codes_and_tails(d, signed, s) };
    // SAFETY: the caller guarantees the features.
    let (states, at) = unsafe { lanes(&s.codes, info, w1, stages, flat, distance, &mut s.words) };
    s.chunk(at..s.codes.len() * stages.len(), states)
}

/// Bit `s` of each lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn bit(v: __m512i, s: u32) -> __m512i {
    _mm512_and_si512(
        _mm512_srlv_epi32(v, _mm512_set1_epi32(s as i32)),
        _mm512_set1_epi32(1),
    )
}

/// Per-tensor tables of packed symbols (`freq | start << 16`) indexed directly by what the
/// lanes know, presence folded in (the identity where a stage has no symbol), so each lane
/// needs one lookup per stage (two for B in its neighbor form). The AVX2 lanes
/// (`super::super::avx2::encode`) use the same tables.
pub struct Flat {
    /// The lowest exponent class covered; `er` below stands for `er - lo`.
    pub(in crate::backend::cpu) lo: u32,
    /// Q1 (low half) and Q2 (high half) by `(er·w1 + b)·4 + q2·2 + q1` (code bits 7, 8).
    pub(in crate::backend::cpu) q12: Vec<u64>,
    /// S by `ctx·2 + neg`, `ctx` its primary context (empty without an S stage).
    pub(in crate::backend::cpu) s: Vec<u32>,
    /// B by `er·w1 + b`, for the plain (non-neighbor) B context (else empty).
    pub(in crate::backend::cpu) b: Vec<u32>,
    /// B in its neighbor form by `((er·4 + m2)·(w1 + 1) + nb)·w1 + b`: one lookup instead of
    /// context → row → symbol. Empty (the two lookups then) without the neighbor form, or
    /// where the table would not be small next to the tensor.
    pub(in crate::backend::cpu) bn: Vec<u32>,
}

impl Flat {
    /// The tables for the exponent classes `lo..=hi` of a tensor's `n` elements (the
    /// resident's cached range: a pass of its own over the facts here was 2% of a
    /// default-layout encode).
    pub fn new(stages: &[EncStage], w1: usize, n: usize, (lo, hi): (usize, usize)) -> Flat {
        let sym = |t: &EncStage, ctx: usize, s: usize| -> u32 {
            match t.map[ctx] {
                u32::MAX => PACKED_IDENTITY,
                r => t.packed[r as usize * t.alphabet + s],
            }
        };
        let id = PACKED_IDENTITY;
        let n_eb = (hi - lo + 1) * w1;
        let mut q12 = Vec::with_capacity(n_eb * 4);
        let mut s = Vec::with_capacity(n_eb * 12);
        let mut bt = Vec::new();
        for er in lo..=hi {
            for b in 0..w1 {
                let eb = er * w1 + b;
                for q in 0..4 {
                    let (q1, q2) = (q & 1, q >> 1);
                    let lo = if b >= 2 { sym(&stages[1], eb, q1) } else { id };
                    let hi = if b >= 3 {
                        sym(&stages[2], eb * 2 + q1, q2)
                    } else {
                        id
                    };
                    q12.push(lo as u64 | (hi as u64) << 32);
                }
                if let Some(t) = stages.get(3) {
                    for ctx in eb * 6..eb * 6 + 6 {
                        for neg in 0..2 {
                            s.push(if b >= 1 { sym(t, ctx, neg) } else { id });
                        }
                    }
                }
                if !stages[0].neighbor {
                    bt.push(sym(&stages[0], er, b));
                }
            }
        }
        // Built only where it stays small next to the tensor (one entry per 8 elements at
        // most): its construction then costs far less than the lookups it saves.
        let t = &stages[0];
        let n_bn = (hi - lo + 1) * 4 * (w1 + 1) * w1;
        let mut bn = Vec::new();
        if t.neighbor && !t.map.is_empty() && !t.packed.is_empty() && n_bn * 8 <= n {
            bn.reserve_exact(n_bn);
            // The two lookups exactly as `gather` makes them, clamps included.
            let last = t.packed.len() - 1;
            for er in lo..=hi {
                for m2 in 0..4 {
                    for nb in 0..=w1 {
                        let ctx = (((m2 * (w1 + 1) + nb) << 8) + er).min(t.map.len() - 1);
                        let row = t.map[ctx];
                        for b in 0..w1 {
                            bn.push(match row {
                                u32::MAX => PACKED_IDENTITY,
                                r => {
                                    let idx =
                                        r.wrapping_mul(t.alphabet as u32).wrapping_add(b as u32);
                                    t.packed[(idx as usize).min(last)]
                                }
                            });
                        }
                    }
                }
            }
        }
        Flat {
            lo: lo as u32,
            q12,
            s,
            b: bt,
            bn,
        }
    }
}

/// The packed symbols of the four stages (B, Q1, Q2, S) of one step, per half.
type StepSyms = [[__m512i; 2]; 4];

/// `f` itself: lets a closure carry `#[inline(always)]`.
#[inline(always)]
fn inlined<F: Fn(usize) -> StepSyms>(f: F) -> F {
    f
}

/// The interleaved lanes of one chunk (as `super::super::encode::lanes`); the words are left
/// in `words[at..codes.len() * stages.len()]` in stream order, `at` returned with the final
/// states.
///
/// # Safety
/// The CPU must support AVX-512 F, BW, VL.
#[target_feature(enable = "popcnt,avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn lanes(
    codes: &[u32],
    info: &[u16],
    w1: usize,
    stages: &[EncStage],
    flat: &Flat,
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
    // Every stage's symbols for the lanes of step `step` (a closure: inlined here, with this
    // function's features).
    let lo_v = _mm512_set1_epi32(flat.lo as i32);
    let step_syms = inlined(
        #[inline(always)]
        |step: usize| -> StepSyms {
            let n = codes.len();
            let base = step * LANES;
            let lanes = LANES.min(n - base);
            let w1v = _mm512_set1_epi32(w1 as i32);
            let m127 = _mm512_set1_epi32(127);
            let one = _mm512_set1_epi32(1);
            let ident = _mm512_set1_epi32(PACKED_IDENTITY as i32);
            let mut out = [[ident; 2]; 4];
            for k in 0..2 {
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
                // Codes of the neighbors `d` elements back, and which lanes have one.
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
                // Flat-table form: `(er - lo)·w1 + b` (huge, and clamped, in invalid lanes).
                let eb = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_sub_epi32(er, lo_v), w1v), b);

                // B.
                out[0][k] = if stages[0].neighbor && !flat.bn.is_empty() {
                    let nb = _mm512_mask_and_epi32(w1v, knb, nc, m127);
                    let m2 = _mm512_and_si512(_mm512_srli_epi32::<9>(i), _mm512_set1_epi32(3));
                    let em =
                        _mm512_add_epi32(_mm512_slli_epi32::<2>(_mm512_sub_epi32(er, lo_v)), m2);
                    let row =
                        _mm512_add_epi32(_mm512_mullo_epi32(em, _mm512_add_epi32(w1v, one)), nb);
                    let idx = _mm512_add_epi32(_mm512_mullo_epi32(row, w1v), b);
                    // SAFETY: features as this function's.
                    unsafe { gather_flat(&flat.bn, valid, idx) }
                } else if stages[0].neighbor {
                    let nb = _mm512_mask_and_epi32(w1v, knb, nc, m127);
                    let m2 = _mm512_and_si512(_mm512_srli_epi32::<9>(i), _mm512_set1_epi32(3));
                    let row =
                        _mm512_add_epi32(_mm512_mullo_epi32(m2, _mm512_add_epi32(w1v, one)), nb);
                    let ctx = _mm512_add_epi32(_mm512_slli_epi32::<8>(row), er);
                    // SAFETY: features as this function's.
                    unsafe { gather(&stages[0], valid, ctx, b) }
                } else {
                    // SAFETY: features as this function's.
                    unsafe { gather_flat(&flat.b, valid, eb) }
                };

                // Q1, Q2: one 64-bit lookup.
                let idx = _mm512_add_epi32(
                    _mm512_slli_epi32::<2>(eb),
                    _mm512_and_si512(_mm512_srli_epi32::<7>(c), _mm512_set1_epi32(3)),
                );
                let idx = _mm512_min_epu32(idx, _mm512_set1_epi32(flat.q12.len() as i32 - 1));
                let ident64 = _mm512_set1_epi64(
                    (PACKED_IDENTITY as u64 | (PACKED_IDENTITY as u64) << 32) as i64,
                );
                // SAFETY: the lanes in the masks read `q12[idx]` with `idx < q12.len()`.
                let (g0, g1) = unsafe {
                    (
                        _mm512_mask_i32gather_epi64::<8>(
                            ident64,
                            valid as u8,
                            _mm512_castsi512_si256(idx),
                            flat.q12.as_ptr() as *const _,
                        ),
                        _mm512_mask_i32gather_epi64::<8>(
                            ident64,
                            (valid >> 8) as u8,
                            _mm512_extracti64x4_epi64::<1>(idx),
                            flat.q12.as_ptr() as *const _,
                        ),
                    )
                };
                let even =
                    _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
                out[1][k] = _mm512_permutex2var_epi32(g0, even, g1);
                out[2][k] = _mm512_permutex2var_epi32(g0, _mm512_add_epi32(even, one), g1);

                // S.
                if stages.len() == 4 {
                    // up: the neighbor's sign state (0 none / no update, 1 up, 2 down).
                    let nz =
                        _mm512_mask_test_epi32_mask(knb & (s_nb as u16).wrapping_neg(), nc, m127);
                    let up = _mm512_maskz_add_epi32(nz, one, bit(nc, 9));
                    let three = _mm512_add_epi32(_mm512_slli_epi32::<1>(eb), eb);
                    let ctx = _mm512_add_epi32(
                        _mm512_slli_epi32::<1>(_mm512_add_epi32(three, up)),
                        bit(i, 8),
                    );
                    let idx = _mm512_add_epi32(_mm512_slli_epi32::<1>(ctx), bit(c, 9));
                    // SAFETY: features as this function's.
                    out[3][k] = unsafe { gather_flat(&flat.s, valid, idx) };
                }
            }
            out
        },
    );
    let mut x = [_mm512_set1_epi32(RANS_L as i32); 2];
    let steps = n.div_ceil(LANES);
    if steps == 0 {
        return ([RANS_L; LANES], end);
    }
    let mut next = step_syms(steps - 1);
    for step in (0..steps).rev() {
        // The next step's lookups are issued before this step's state chain, so they run
        // under it.
        let cur = next;
        if step > 0 {
            next = step_syms(step - 1);
        }
        for p in cur[..stages.len()].iter().rev() {
            // SAFETY: `pos` never drops below 0: one word at most per coded symbol.
            unsafe { put2(&mut x, *p, out, &mut pos) };
        }
    }
    let mut states = [0u32; LANES];
    // SAFETY: 2 × 16 `u32` into the 32 of `states`.
    unsafe {
        _mm512_storeu_si512(states.as_mut_ptr() as *mut _, x[0]);
        _mm512_storeu_si512(states.as_mut_ptr().add(16) as *mut _, x[1]);
    }
    (states, pos)
}

/// `table[idx]` for the lanes in `k` (indices clamped to the table), the identity elsewhere.
#[inline]
#[target_feature(enable = "avx512f")]
pub(in crate::backend::cpu) unsafe fn gather_flat(
    table: &[u32],
    k: __mmask16,
    idx: __m512i,
) -> __m512i {
    let idx = _mm512_min_epu32(idx, _mm512_set1_epi32(table.len() as i32 - 1));
    // SAFETY: the lanes in `k` read `table[idx]` with `idx < table.len()`.
    unsafe {
        _mm512_mask_i32gather_epi32::<4>(
            _mm512_set1_epi32(PACKED_IDENTITY as i32),
            k,
            idx,
            table.as_ptr() as *const _,
        )
    }
}

/// The packed symbols (`freq | start << 16`) of 16 lanes: `sym` under context `ctx`'s row for
/// the lanes in `k`, the identity elsewhere. Contexts and rows are clamped to the tables, so
/// nothing is read outside them whatever the codes (in-range values, the only ones the
/// passes produce, are unchanged).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(in crate::backend::cpu) unsafe fn gather(
    t: &EncStage,
    k: __mmask16,
    ctx: __m512i,
    sym: __m512i,
) -> __m512i {
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
#[target_feature(enable = "popcnt,avx512f,avx512bw,avx512vl")]
pub(in crate::backend::cpu) unsafe fn put2(
    x: &mut [__m512i; 2],
    p: [__m512i; 2],
    out: *mut u16,
    pos: &mut usize,
) {
    let m16 = _mm512_set1_epi32(0xFFFF);
    let f = [_mm512_and_si512(p[0], m16), _mm512_and_si512(p[1], m16)];
    // x >= freq << 20, as x >> 20 >= freq: the identity's freq 2^12 never flushes.
    let k = [
        _mm512_cmpge_epu32_mask(_mm512_srli_epi32::<20>(x[0]), f[0]),
        _mm512_cmpge_epu32_mask(_mm512_srli_epi32::<20>(x[1]), f[1]),
    ];
    for h in [1, 0] {
        let cnt = k[h].count_ones();
        *pos -= cnt as usize;
        // Compress in a register and store under a mask: a compressing store to memory is
        // microcoded and slow on some CPUs (AMD Zen 4). The 32-bit compress (AVX-512 F)
        // then the narrowing, rather than a 16-bit compress, so no VBMI2 is needed.
        let w = _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(k[h], x[h]));
        // SAFETY: `out[*pos..*pos + cnt]` is inside the buffer (caller); only those `cnt`
        // words are written.
        unsafe { _mm256_mask_storeu_epi16(out.add(*pos) as *mut _, ((1u32 << cnt) - 1) as u16, w) };
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
        // C(y) = y + start + q·cmpl = q·2^PROB_BITS + (y - q·freq) + start (the same in
        // wrapping arithmetic, one multiply fewer); one quotient off shifts it by ±cmpl.
        let t = _mm512_add_epi32(
            _mm512_add_epi32(_mm512_slli_epi32::<PROB_BITS>(q0), rem),
            start,
        );
        let low = _mm512_cmplt_epi32_mask(rem, _mm512_setzero_si512());
        let high = _mm512_cmpge_epi32_mask(rem, f[h]);
        let t = _mm512_mask_sub_epi32(t, low, t, cmpl);
        x[h] = _mm512_mask_add_epi32(t, high, t, cmpl);
    }
}
