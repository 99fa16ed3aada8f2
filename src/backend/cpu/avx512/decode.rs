//! AVX-512 rANS lane decoding: the portable step of `cpu::decode` on two 16-lane vectors.
//!
//! Per stage, every lane's symbol is decoded from its state first (they are independent);
//! then the lanes whose state fell below `RANS_L` take the next words of the shared stream in
//! lane order, which is one expanding load per vector (`vpexpandd`): the k-th refilling lane
//! of a vector gets the k-th word after the cursor. That is exactly the portable refill loop.

#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::super::decode::{no_row, Stream};
use super::super::joint::code_of_joint;
use super::super::tables::{vector_tables_fit, DecStage, NO_ROW};
use super::super::word::Word;
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::entropy::rans::RANS_L;
use crate::format::chunk::LANES;
use crate::{Error, Result};

const SLOT_MASK: i32 = PROB_TOTAL as i32 - 1;

pub(in crate::backend::cpu) fn overrun() -> Error {
    Error::format(
        "tensor blob chunk",
        "rANS word stream ended early".to_string(),
    )
}

/// How many of `row`'s `N` starts are `<= slot`: the B symbol whose range holds `slot`.
#[inline(always)]
unsafe fn count_le<const N: usize>(row: *const u16, slot: u32) -> u32 {
    let s = slot as i16;
    match N {
        8 => _mm_cmple_epu16_mask(_mm_loadu_si128(row.cast()), _mm_set1_epi16(s)).count_ones(),
        16 => _mm256_cmple_epu16_mask(_mm256_loadu_si256(row.cast()), _mm256_set1_epi16(s))
            .count_ones(),
        32 => _mm512_cmple_epu16_mask(_mm512_loadu_si512(row.cast()), _mm512_set1_epi16(s))
            .count_ones(),
        _ => {
            let mut c = 0;
            for k in (0..N).step_by(32) {
                c += _mm512_cmple_epu16_mask(
                    _mm512_loadu_si512(row.add(k).cast()),
                    _mm512_set1_epi16(s),
                )
                .count_ones();
            }
            c
        }
    }
}

/// Refill the lanes of `x` below `RANS_L` from the stream, in lane order.
#[inline(always)]
pub(in crate::backend::cpu) unsafe fn refill(
    x: __m512i,
    words: *const u16,
    pos: &mut usize,
) -> __m512i {
    let need = _mm512_cmplt_epu32_mask(x, _mm512_set1_epi32(RANS_L as i32));
    // The stream is padded with LANES words, and `pos <= len` held after the last stage, so
    // these 16 words are in bounds; the caller checks `pos` against `len` after the stage.
    let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(words.add(*pos).cast()));
    let w = _mm512_maskz_expand_epi32(need, w);
    *pos += need.count_ones() as usize;
    _mm512_mask_or_epi32(x, need, _mm512_slli_epi32::<16>(x), w)
}

/// Refill both vectors (lanes 0..16, then 16..32) and check the stream did not run dry.
#[inline(always)]
unsafe fn refill2(
    x: &mut [__m512i; 2],
    words: *const u16,
    pos: &mut usize,
    len: usize,
) -> Result<()> {
    x[0] = refill(x[0], words, pos);
    x[1] = refill(x[1], words, pos);
    if *pos > len {
        return Err(overrun());
    }
    Ok(())
}

/// The codes `d` elements before lanes `j0..j0 + 16` (decoded in an earlier step, as
/// `d >= LANES`), masked by `mask`; `none` for lanes before the chunk's first row.
#[inline(always)]
unsafe fn neighbor(
    cp: *const u32,
    j0: usize,
    d: usize,
    none: __m512i,
    lane_ids: __m512i,
    mask: i32,
) -> __m512i {
    let have = _mm512_cmpge_epu32_mask(
        _mm512_add_epi32(_mm512_set1_epi32(j0 as i32), lane_ids),
        _mm512_set1_epi32(d.min(i32::MAX as usize) as i32),
    );
    let m = _mm512_set1_epi32(mask);
    if have == 0xFFFF {
        _mm512_and_si512(_mm512_loadu_si512(cp.add(j0 - d).cast()), m)
    } else if have == 0 {
        none
    } else {
        // Straddling the first row: only the lanes past it have a neighbor, and their
        // addresses are in bounds (`j >= d`).
        let mut a = [0u32; 16];
        _mm512_storeu_si512(a.as_mut_ptr().cast(), none);
        for (l, v) in a.iter_mut().enumerate().skip(d - j0) {
            *v = *cp.add(j0 + l - d) & mask as u32;
        }
        _mm512_loadu_si512(a.as_ptr().cast())
    }
}

/// Decode a binary symbol under `f0` (`PROB_TOTAL`: absent, state unchanged).
#[inline(always)]
unsafe fn binary(x: &mut __m512i, f0: __m512i) -> __mmask16 {
    let slot = _mm512_and_si512(*x, _mm512_set1_epi32(SLOT_MASK));
    let one = _mm512_cmpge_epu32_mask(slot, f0);
    let f = _mm512_mask_sub_epi32(f0, one, _mm512_set1_epi32(PROB_TOTAL as i32), f0);
    let s = _mm512_maskz_mov_epi32(one, f0);
    *x = _mm512_sub_epi32(
        _mm512_add_epi32(
            _mm512_mullo_epi32(f, _mm512_srli_epi32::<{ PROB_BITS }>(*x)),
            slot,
        ),
        s,
    );
    one
}

/// Decode every full step of the chunk (all but a last partial one), exactly as the
/// portable step would; returns the number of elements done. Returns 0 (leaving the work to
/// the portable step) when the tables do not have the shapes the contexts assume.
///
/// # Safety
/// The CPU must have AVX-512 F, BW and VL, and `st.words` must hold `LANES` padding
/// words past `st.len`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,popcnt,bmi2")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn full_steps<T: Word>(
    info: &[u16],
    codes: &mut [u32],
    states: &mut [u32; LANES],
    st: &mut Stream,
    stages: &[DecStage],
    w1: usize,
    d: usize,
    d_s: usize,
) -> Result<usize> {
    let n = codes.len().min(info.len());
    let full = n / LANES * LANES;
    if full == 0 || !vector_tables_fit(stages, w1, T::BITS as usize) || d < LANES || d_s < LANES {
        return Ok(0);
    }
    assert!(st.words.len() >= st.len + LANES && st.pos <= st.len);
    let (bt, q1t, q2t) = (&stages[0], &stages[1], &stages[2]);
    let s_t = stages.get(3);
    let words = st.words.as_ptr();
    let mut pos = st.pos;
    let mut x = [
        _mm512_loadu_si512(states.as_ptr().cast()),
        _mm512_loadu_si512(states.as_ptr().add(16).cast()),
    ];
    let w1v = _mm512_set1_epi32(w1 as i32);
    let ff = _mm512_set1_epi32(255);
    let lane_ids = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    // Per-lane values between the vector code and the plain-load pass.
    let (mut ctx_a, mut slot_a, mut erw_a, mut us_a) =
        ([0u32; LANES], [0u32; LANES], [0u32; LANES], [0u32; LANES]);
    let mut fs_a = [0u32; LANES];
    let cp = codes.as_mut_ptr();
    let ip = info.as_ptr();

    for base in (0..full).step_by(LANES) {
        // B per lane, in one pass of plain loads: the row from the context, the symbol by
        // counting the row's starts at or below the slot, its frequency and start. Then, in
        // the vector, everything the step's later stages look up, as it depends only on b
        // (Q1's and S's rows, Q2's for both values of q1): gathers, issued before the chain
        // of state updates and refills. (All-gathers and all-plain-loads both measured
        // slower than this split on Zen 4.)
        let mut inf = [_mm512_setzero_si512(); 2];
        let mut slot = [_mm512_setzero_si512(); 2];
        for h in 0..2 {
            let j0 = base + 16 * h;
            inf[h] = _mm512_cvtepu16_epi32(_mm256_loadu_si256(ip.add(j0).cast()));
            let er = _mm512_and_si512(inf[h], ff);
            let ctx = if bt.neighbor {
                // The neighbor is d >= LANES elements back: decoded in an earlier step.
                // Lanes before the chunk's first row see W1 ("none").
                let nb = neighbor(cp, j0, d, w1v, lane_ids, 127);
                let m2 = _mm512_and_si512(_mm512_srli_epi32::<9>(inf[h]), _mm512_set1_epi32(3));
                let row =
                    _mm512_add_epi32(_mm512_mullo_epi32(m2, _mm512_set1_epi32(w1 as i32 + 1)), nb);
                _mm512_add_epi32(_mm512_slli_epi32::<8>(row), er)
            } else {
                er
            };
            slot[h] = _mm512_and_si512(x[h], _mm512_set1_epi32(SLOT_MASK));
            _mm512_storeu_si512(ctx_a.as_mut_ptr().add(16 * h).cast(), ctx);
            _mm512_storeu_si512(slot_a.as_mut_ptr().add(16 * h).cast(), slot[h]);
            _mm512_storeu_si512(
                erw_a.as_mut_ptr().add(16 * h).cast(),
                _mm512_mullo_epi32(er, w1v),
            );
            if s_t.is_some() {
                // S: context ((er·W1 + b)·3 + up)·2 + rs = (er·W1 + b)·6 + (2·up + rs).
                let up = if d_s == usize::MAX {
                    _mm512_setzero_si512()
                } else {
                    // Sign state of the neighbor: 0 no update, 1 up, 2 down.
                    let c = neighbor(cp, j0, d_s, _mm512_setzero_si512(), lane_ids, -1);
                    let nz = _mm512_test_epi32_mask(c, _mm512_set1_epi32(127));
                    let neg = _mm512_and_si512(_mm512_srli_epi32::<9>(c), _mm512_set1_epi32(1));
                    _mm512_maskz_add_epi32(nz, neg, _mm512_set1_epi32(1))
                };
                let rs = _mm512_and_si512(_mm512_srli_epi32::<8>(inf[h]), _mm512_set1_epi32(1));
                _mm512_storeu_si512(
                    us_a.as_mut_ptr().add(16 * h).cast(),
                    _mm512_add_epi32(_mm512_slli_epi32::<1>(up), rs),
                );
            }
        }
        let (map, starts, fsp) = (
            bt.map_padded.as_ptr(),
            bt.starts.as_ptr(),
            bt.fs_packed.as_ptr(),
        );
        let (q1p, q2p) = (q1t.f0_by_ctx.as_ptr(), q2t.f0_pairs.as_ptr());
        for l in 0..LANES {
            // In bounds: contexts are below the map's checked length, its entries below the
            // row count (the zero row included), symbols below W1 (`tables_fit`).
            let ri = *map.add(ctx_a[l] as usize) as usize;
            let row = starts.add(ri * T::BITS as usize);
            let sym = match T::BITS {
                8 => count_le::<8>(row, slot_a[l]),
                16 => count_le::<16>(row, slot_a[l]),
                32 => count_le::<32>(row, slot_a[l]),
                _ => count_le::<64>(row, slot_a[l]),
            } as usize;
            fs_a[l] = *fsp.add(ri * w1 + sym);
        }
        let mut code = [_mm512_setzero_si512(); 2];
        let mut fs = [_mm512_setzero_si512(); 2];
        let mut f0_q1 = [_mm512_setzero_si512(); 2];
        let mut f0_q2 = [_mm512_setzero_si512(); 2];
        let mut f0_s = [_mm512_setzero_si512(); 2];
        let mut present = [[0 as __mmask16; 3]; 2];
        let total = _mm512_set1_epi32(PROB_TOTAL as i32);
        let no_row_v = _mm512_set1_epi32(NO_ROW as i32);
        for h in 0..2 {
            fs[h] = _mm512_loadu_si512(fs_a.as_ptr().add(16 * h).cast());
            // The zero row: a context without a row.
            if _mm512_testn_epi32_mask(fs[h], _mm512_set1_epi32(0x1FFF)) != 0 {
                return Err(no_row());
            }
            let sym = _mm512_srli_epi32::<25>(fs[h]);
            code[h] = sym;
            // Q1: present when b >= 2; Q2 when b >= 3 (both rows, chosen by q1 later); S
            // when b >= 1. Absent lanes code the identity (`PROB_TOTAL`).
            present[h][0] = _mm512_cmpge_epu32_mask(sym, _mm512_set1_epi32(2));
            present[h][1] = _mm512_cmpge_epu32_mask(sym, _mm512_set1_epi32(3));
            present[h][2] = _mm512_cmpge_epu32_mask(sym, _mm512_set1_epi32(1));
            let eb = _mm512_add_epi32(_mm512_loadu_si512(erw_a.as_ptr().add(16 * h).cast()), sym);
            let q1 = _mm512_mask_i32gather_epi32::<4>(total, present[h][0], eb, q1p.cast());
            if _mm512_mask_cmpeq_epi32_mask(present[h][0], q1, no_row_v) != 0 {
                return Err(no_row());
            }
            f0_q1[h] = _mm512_mask_mov_epi32(total, present[h][0], q1);
            f0_q2[h] = _mm512_mask_mov_epi32(
                _mm512_set1_epi32((PROB_TOTAL | PROB_TOTAL << 16) as i32),
                present[h][1],
                _mm512_mask_i32gather_epi32::<4>(total, present[h][1], eb, q2p.cast()),
            );
            if let Some(s_t) = s_t {
                let sctx = _mm512_add_epi32(
                    _mm512_mullo_epi32(eb, _mm512_set1_epi32(6)),
                    _mm512_loadu_si512(us_a.as_ptr().add(16 * h).cast()),
                );
                let sv = _mm512_mask_i32gather_epi32::<4>(
                    total,
                    present[h][2],
                    sctx,
                    s_t.f0_by_ctx.as_ptr().cast(),
                );
                if _mm512_mask_cmpeq_epi32_mask(present[h][2], sv, no_row_v) != 0 {
                    return Err(no_row());
                }
                f0_s[h] = _mm512_mask_mov_epi32(total, present[h][2], sv);
            }
        }
        // B: the state updates.
        for h in 0..2 {
            let f = _mm512_and_si512(fs[h], _mm512_set1_epi32(0x1FFF));
            let s = _mm512_and_si512(_mm512_srli_epi32::<13>(fs[h]), _mm512_set1_epi32(0xFFF));
            x[h] = _mm512_sub_epi32(
                _mm512_add_epi32(
                    _mm512_mullo_epi32(f, _mm512_srli_epi32::<{ PROB_BITS }>(x[h])),
                    slot[h],
                ),
                s,
            );
        }
        refill2(&mut x, words, &mut pos, st.len)?;
        for h in 0..2 {
            let one = binary(&mut x[h], f0_q1[h]);
            code[h] = _mm512_mask_or_epi32(code[h], one, code[h], _mm512_set1_epi32(1 << 7));
        }
        refill2(&mut x, words, &mut pos, st.len)?;
        for h in 0..2 {
            let q1 = _mm512_test_epi32_mask(code[h], _mm512_set1_epi32(1 << 7));
            let f0 = _mm512_and_si512(
                _mm512_mask_srli_epi32::<16>(f0_q2[h], q1, f0_q2[h]),
                _mm512_set1_epi32(0xFFFF),
            );
            if _mm512_mask_cmpeq_epi32_mask(present[h][1], f0, _mm512_set1_epi32(0xFFFF)) != 0 {
                return Err(no_row());
            }
            let one = binary(&mut x[h], f0);
            code[h] = _mm512_mask_or_epi32(code[h], one, code[h], _mm512_set1_epi32(1 << 8));
        }
        refill2(&mut x, words, &mut pos, st.len)?;
        if s_t.is_some() {
            for h in 0..2 {
                let one = binary(&mut x[h], f0_s[h]);
                code[h] = _mm512_mask_or_epi32(code[h], one, code[h], _mm512_set1_epi32(1 << 9));
            }
            refill2(&mut x, words, &mut pos, st.len)?;
        }
        _mm512_storeu_si512(cp.add(base).cast(), code[0]);
        _mm512_storeu_si512(cp.add(base + 16).cast(), code[1]);
    }
    _mm512_storeu_si512(states.as_mut_ptr().cast(), x[0]);
    _mm512_storeu_si512(states.as_mut_ptr().add(16).cast(), x[1]);
    st.pos = pos;
    Ok(full)
}

/// Raw tails and the inverse transform for 16-bit elements, 32 at a time in 16-bit lanes
/// (half the instructions per element of 32-bit lanes; a 16-bit element's tail has at most
/// 13 bits, and 32 of them fit a 64-byte window): each element's tail offset is a prefix sum
/// of the tail lengths, its bits picked from the two 16-bit words of the window it spans, then
/// the value is rebuilt from b, q1, q2 and the tail, turned back into a displacement and
/// added to the reference's ordered key. Does every whole group of 32 and returns how many
/// elements and tail bits it used; the caller finishes the rest.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL; `tail` must hold the `need` bits the codes' lengths
/// sum to (checked by the caller; the window's load is masked to `tail`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn finish_u16(
    codes: &[u32],
    j_codes: bool,
    reference: &[u8],
    out: &mut [MaybeUninit<u8>],
    tail: &[u8],
    signed: bool,
) -> (usize, u64) {
    let n = codes.len().min(reference.len() / 2).min(out.len() / 2);
    let full = n / 32 * 32;
    let one = _mm512_set1_epi16(1);
    let three = _mm512_set1_epi16(3);
    // Word 2i of the pair (c0, c1): the low halves of 32 codes (every code fits 16 bits).
    let lows = _mm512_loadu_si512(LOW_WORDS.as_ptr().cast());
    let small_a: [u16; 32] = std::array::from_fn(|j| code_of_joint()[j] as u16);
    let small = _mm512_loadu_si512(small_a.as_ptr().cast());
    let mut bits = 0u64;
    for j in (0..full).step_by(32) {
        let c0 = _mm512_loadu_si512(codes.as_ptr().add(j).cast());
        let c1 = _mm512_loadu_si512(codes.as_ptr().add(j + 16).cast());
        let c = _mm512_permutex2var_epi16(c0, lows, c1);
        let c = if j_codes { code_of_j16(c, small) } else { c };
        let b = _mm512_and_si512(c, _mm512_set1_epi16(127));
        let len = _mm512_subs_epu16(b, three); // b <= 16: max(b - 3, 0) <= 13
        let (off, total) = tail_offsets16(len);
        let at = (bits / 8) as usize;
        let rest = tail.len().saturating_sub(at);
        let m = if rest >= 64 {
            u64::MAX
        } else {
            (1u64 << rest) - 1
        };
        // 7 + 32 × 13 bits: the 32 tails lie in the 64 bytes from the first one's byte.
        let window = _mm512_maskz_loadu_epi8(m, tail.as_ptr().add(at).cast());
        let off = _mm512_add_epi16(off, _mm512_set1_epi16((bits % 8) as i16));
        let w = _mm512_srli_epi16::<4>(off);
        let s = _mm512_and_si512(off, _mm512_set1_epi16(15));
        let lo = _mm512_permutexvar_epi16(w, window);
        let hi = _mm512_permutexvar_epi16(_mm512_add_epi16(w, one), window);
        // A shift by 16 (s = 0) gives 0, as the tail then lies in `lo` alone.
        let raw = _mm512_or_si512(
            _mm512_srlv_epi16(lo, s),
            _mm512_sllv_epi16(hi, _mm512_sub_epi16(_mm512_set1_epi16(16), s)),
        );
        let t = _mm512_and_si512(raw, _mm512_sub_epi16(_mm512_sllv_epi16(one, len), one));
        bits += total as u64;
        let delta = displacement16(c, b, t, signed);
        let r = _mm512_loadu_si512(reference.as_ptr().add(2 * j).cast());
        // key(r) = r ^ (negative ? 0xFFFF : 0x8000), and back.
        let h = _mm512_set1_epi16(i16::MIN);
        let ffff = _mm512_set1_epi16(-1);
        let key = _mm512_xor_si512(r, _mm512_mask_blend_epi16(_mm512_movepi16_mask(r), h, ffff));
        let k = _mm512_add_epi16(key, delta);
        let x = _mm512_xor_si512(k, _mm512_mask_blend_epi16(_mm512_movepi16_mask(k), ffff, h));
        _mm512_storeu_si512(out.as_mut_ptr().add(2 * j).cast(), x);
    }
    (full, bits)
}

/// Per-element codes (`b | q1 << 7 | q2 << 8 | neg << 9`) of 32 joint symbols in 16-bit
/// lanes: from `u = J + 17 = 8·b + 4·q1 + 2·q2 + neg` by shifts from J = 7 on, from `small`
/// (the codes of J < 32) below.
#[inline(always)]
unsafe fn code_of_j16(j: __m512i, small: __m512i) -> __m512i {
    let u = _mm512_add_epi16(j, _mm512_set1_epi16(17));
    let c = _mm512_or_si512(
        _mm512_or_si512(
            _mm512_srli_epi16::<3>(u),
            _mm512_slli_epi16::<5>(_mm512_and_si512(u, _mm512_set1_epi16(4))),
        ),
        _mm512_or_si512(
            _mm512_slli_epi16::<7>(_mm512_and_si512(u, _mm512_set1_epi16(2))),
            _mm512_slli_epi16::<9>(_mm512_and_si512(u, _mm512_set1_epi16(1))),
        ),
    );
    let lt7 = _mm512_cmplt_epu16_mask(j, _mm512_set1_epi16(7));
    _mm512_mask_permutexvar_epi16(c, lt7, j, small)
}

/// `2i` for word `i`: [`finish_u16`]'s selection of the codes' low halves.
static LOW_WORDS: [u16; 32] = {
    let mut a = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        a[i] = 2 * i as u16;
        i += 1;
    }
    a
};

/// Bit offsets of 32 consecutive raw tails of lengths `len` (16-bit lanes), relative to the
/// first (an exclusive prefix sum), and their total length (at most 32 × 13).
#[inline(always)]
unsafe fn tail_offsets16(len: __m512i) -> (__m512i, u32) {
    // Within each 128-bit lane by byte shifts, then the lanes' totals carried across.
    let mut p = len;
    p = _mm512_add_epi16(p, _mm512_bslli_epi128::<2>(p));
    p = _mm512_add_epi16(p, _mm512_bslli_epi128::<4>(p));
    p = _mm512_add_epi16(p, _mm512_bslli_epi128::<8>(p));
    // Word 7 of the previous 128-bit lane (lanes 1..4), then of the one two before (2..4).
    let prev1 = _mm512_set_epi64(
        0x0017_0017_0017_0017,
        0x0017_0017_0017_0017,
        0x000F_000F_000F_000F,
        0x000F_000F_000F_000F,
        0x0007_0007_0007_0007,
        0x0007_0007_0007_0007,
        0,
        0,
    );
    p = _mm512_add_epi16(p, _mm512_maskz_permutexvar_epi16(!0xFF, prev1, p));
    let prev2 = _mm512_set_epi64(
        0x000F_000F_000F_000F,
        0x000F_000F_000F_000F,
        0x0007_0007_0007_0007,
        0x0007_0007_0007_0007,
        0,
        0,
        0,
        0,
    );
    p = _mm512_add_epi16(p, _mm512_maskz_permutexvar_epi16(!0xFFFF, prev2, p));
    let total = _mm_extract_epi16::<7>(_mm512_extracti32x4_epi32::<3>(p)) as u32;
    (_mm512_sub_epi16(p, len), total)
}

/// [`displacement`] of 32 16-bit elements in 16-bit lanes (values and keys of 16-bit floats
/// wrap the same way there).
#[inline(always)]
unsafe fn displacement16(c: __m512i, b: __m512i, t: __m512i, signed: bool) -> __m512i {
    let (zero, one, three) = (
        _mm512_setzero_si512(),
        _mm512_set1_epi16(1),
        _mm512_set1_epi16(3),
    );
    let top = _mm512_or_si512(
        _mm512_set1_epi16(4),
        _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16::<6>(c), _mm512_set1_epi16(2)),
            _mm512_and_si512(_mm512_srli_epi16::<8>(c), one),
        ),
    );
    let ge3 = _mm512_cmpge_epu16_mask(b, three);
    let up = _mm512_sllv_epi16(top, _mm512_sub_epi16(b, three));
    let down = _mm512_srlv_epi16(top, _mm512_sub_epi16(three, b));
    let v = _mm512_or_si512(_mm512_mask_blend_epi16(ge3, down, up), t);
    if signed {
        let neg = _mm512_test_epi16_mask(c, _mm512_set1_epi16(1 << 9));
        _mm512_mask_sub_epi16(v, neg, zero, v)
    } else {
        // ZigZag: (v >> 1) ^ -(v & 1)
        _mm512_xor_si512(
            _mm512_srli_epi16::<1>(v),
            _mm512_sub_epi16(zero, _mm512_and_si512(v, one)),
        )
    }
}

/// [`finish_u16`] for 32-bit elements, 16 at a time in 32-bit lanes: a tail has at most 29
/// bits and 16 of them (with the first one's bit offset) fit a 64-byte window, so each lane
/// takes the three 16-bit words its tail spans by two word permutes, no gather (two 8-lane
/// 64-bit gathers here cost a third of an fp32 decode).
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL; `tail` must hold the `need` bits the codes'
/// lengths sum to (checked by the caller; the window's load is masked to `tail`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub unsafe fn finish_u32(
    codes: &[u32],
    reference: &[u8],
    out: &mut [MaybeUninit<u8>],
    tail: &[u8],
    signed: bool,
) -> (usize, u64) {
    let n = codes.len().min(reference.len() / 4).min(out.len() / 4);
    let full = n / 16 * 16;
    let three = _mm512_set1_epi32(3);
    let mut bits = 0u64;
    for j in (0..full).step_by(16) {
        let c = _mm512_loadu_si512(codes.as_ptr().add(j).cast());
        let b = _mm512_and_si512(c, _mm512_set1_epi32(127));
        // max(b - 3, 0): at most 29 for b <= 32 (and never more than the caller's `need`
        // counts, whatever the codes).
        let len = _mm512_min_epu32(_mm512_subs_epu16(b, three), _mm512_set1_epi32(29));
        let (off, total) = tail_offsets(len);
        let at = (bits / 8) as usize;
        let rest = tail.len().saturating_sub(at);
        let m = if rest >= 64 {
            u64::MAX
        } else {
            (1u64 << rest) - 1
        };
        // 7 + 16 × 29 bits: the 16 tails lie in the 64 bytes from the first one's byte.
        let window = _mm512_maskz_loadu_epi8(m, tail.as_ptr().add(at).cast());
        let off = _mm512_add_epi32(off, _mm512_set1_epi32((bits % 8) as i32));
        let w = _mm512_srli_epi32::<4>(off);
        let s = _mm512_and_si512(off, _mm512_set1_epi32(15));
        // Words w, w + 1 (the low 32 bits from the tail's word) and w + 2 (the rest).
        let lo = _mm512_permutexvar_epi16(
            _mm512_or_si512(
                w,
                _mm512_slli_epi32::<16>(_mm512_add_epi32(w, _mm512_set1_epi32(1))),
            ),
            window,
        );
        let hi = _mm512_permutexvar_epi16(_mm512_add_epi32(w, _mm512_set1_epi32(2)), window);
        // `hi`'s upper half shifts out; a shift by 32 (s = 0) gives 0.
        let raw = _mm512_or_si512(
            _mm512_srlv_epi32(lo, s),
            _mm512_sllv_epi32(hi, _mm512_sub_epi32(_mm512_set1_epi32(32), s)),
        );
        let one = _mm512_set1_epi32(1);
        let t = _mm512_and_si512(raw, _mm512_sub_epi32(_mm512_sllv_epi32(one, len), one));
        bits += total as u64;
        let delta = displacement(c, b, t, signed);
        let r = _mm512_loadu_si512(reference.as_ptr().add(4 * j).cast());
        // key(r) = r ^ (negative ? !0 : 1 << 31), and back.
        let h = _mm512_set1_epi32(i32::MIN);
        let ones = _mm512_set1_epi32(-1);
        let r_neg = _mm512_test_epi32_mask(r, h);
        let key = _mm512_xor_si512(r, _mm512_mask_blend_epi32(r_neg, h, ones));
        let k = _mm512_add_epi32(key, delta);
        let k_pos = _mm512_test_epi32_mask(k, h);
        let x = _mm512_xor_si512(k, _mm512_mask_blend_epi32(k_pos, ones, h));
        _mm512_storeu_si512(out.as_mut_ptr().add(4 * j).cast(), x);
    }
    (full, bits)
}

/// Bit offsets of 16 consecutive raw tails of lengths `len`, relative to the first (an
/// exclusive prefix sum across the lanes), and their total length.
#[inline(always)]
unsafe fn tail_offsets(len: __m512i) -> (__m512i, u32) {
    let zero = _mm512_setzero_si512();
    let mut p = len;
    p = _mm512_add_epi32(p, _mm512_alignr_epi32::<15>(p, zero));
    p = _mm512_add_epi32(p, _mm512_alignr_epi32::<14>(p, zero));
    p = _mm512_add_epi32(p, _mm512_alignr_epi32::<12>(p, zero));
    p = _mm512_add_epi32(p, _mm512_alignr_epi32::<8>(p, zero));
    (_mm512_sub_epi32(p, len), _mm512_extract_last(p))
}

/// The displacements of 16 elements (32-bit lanes, before masking to the element width)
/// from their codes `c`, bit lengths `b` and raw tails `t`: `1 q1 q2` moved to the top of a
/// b-bit value with the tail below it (`word::compose`), then the sign (Signed layout) or the
/// ZigZag fold (Paper) undone (`word::displacement`).
#[inline(always)]
unsafe fn displacement(c: __m512i, b: __m512i, t: __m512i, signed: bool) -> __m512i {
    let (zero, one, three) = (
        _mm512_setzero_si512(),
        _mm512_set1_epi32(1),
        _mm512_set1_epi32(3),
    );
    let top = _mm512_or_si512(
        _mm512_set1_epi32(4),
        _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32::<6>(c), _mm512_set1_epi32(2)),
            _mm512_and_si512(_mm512_srli_epi32::<8>(c), one),
        ),
    );
    let ge3 = _mm512_cmpge_epu32_mask(b, three);
    let up = _mm512_sllv_epi32(top, _mm512_sub_epi32(b, three));
    let down = _mm512_srlv_epi32(top, _mm512_sub_epi32(three, b));
    let v = _mm512_or_si512(_mm512_mask_blend_epi32(ge3, down, up), t);
    if signed {
        let neg = _mm512_test_epi32_mask(c, _mm512_set1_epi32(1 << 9));
        _mm512_mask_sub_epi32(v, neg, zero, v)
    } else {
        // ZigZag: (v >> 1) ^ -(v & 1)
        _mm512_xor_si512(
            _mm512_srli_epi32::<1>(v),
            _mm512_sub_epi32(zero, _mm512_and_si512(v, one)),
        )
    }
}

/// The last lane of `v`.
#[inline(always)]
unsafe fn _mm512_extract_last(v: __m512i) -> u32 {
    _mm_extract_epi32::<3>(_mm512_extracti32x4_epi32::<3>(v)) as u32
}
