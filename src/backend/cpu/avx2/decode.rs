//! AVX2 rANS lane decoding: the AVX-512 design (`super::super::avx512::decode`) on four
//! 8-lane vectors per chunk, for the many CPUs without AVX-512 (AMD Zen 2/3, Intel client
//! cores). What AVX2 lacks is rebuilt from its parts:
//!
//! - no mask registers: masks are vectors of all-ones lanes, turned into bits by
//!   `movemask` where a count or a table index is needed;
//! - no expanding load: the refill's "k-th refilling lane takes the k-th next word" is a
//!   byte shuffle of the next 8 words (in both 128-bit halves), looked up by the 8-bit
//!   refill mask ([`EXPAND`], 32 bytes per mask);
//! - no unsigned compares: every compared value here is below 2^31 (states are compared
//!   through their top half, slots and frequencies are 12–13-bit).
//!
//! The result is exactly the portable step's (`super::super::decode`), so the same bytes
//! decode to the same tensors at every level.

#![cfg(target_arch = "x86_64")]

use core::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::super::decode::{no_row, Stream};
use super::super::joint::u_of_joint;
use super::super::tables::{vector_tables_fit, DecStage, NO_ROW};
use super::super::word::Word;
use super::crc::Fold;
use super::gather::gather8_or;
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::format::chunk::LANES;
use crate::{Error, Result};

const SLOT_MASK: i32 = PROB_TOTAL as i32 - 1;
/// 8-lane vectors per chunk.
const NV: usize = LANES / 8;

pub(in crate::backend::cpu) fn overrun() -> Error {
    Error::format(
        "tensor blob chunk",
        "rANS word stream ended early".to_string(),
    )
}

/// For each 8-bit refill mask, the byte shuffle that puts the k-th next word (k the number
/// of refilling lanes below the lane) in the low half of each refilling lane and zeros
/// everywhere else, from the 8 next words in both 128-bit halves (one 32-byte load; the
/// 8 KiB stay in L1).
#[repr(C, align(32))]
struct Expand([[u8; 32]; 256]);

static EXPAND: Expand = {
    let mut t = [[0x80u8; 32]; 256];
    let mut m = 0;
    while m < 256 {
        let (mut k, mut l) = (0u8, 0);
        while l < 8 {
            if (m >> l) & 1 == 1 {
                t[m][4 * l] = 2 * k;
                t[m][4 * l + 1] = 2 * k + 1;
                k += 1;
            }
            l += 1;
        }
        m += 1;
    }
    Expand(t)
};

/// Refill the lanes of `x` whose state fell below `RANS_L` (= 2^16: its top half is zero)
/// from the stream, in lane order.
#[inline(always)]
pub(in crate::backend::cpu) unsafe fn refill(
    x: __m256i,
    words: *const u16,
    pos: &mut usize,
) -> __m256i {
    // A lane's top 16-bit half is zero: the sign bit of its dword (all `movemask_ps`
    // reads) is that half's compare, one operation where a 32-bit test took two.
    let need = _mm256_cmpeq_epi16(x, _mm256_setzero_si256());
    let m = _mm256_movemask_ps(_mm256_castsi256_ps(need)) as usize;
    // The stream is padded with LANES words and `pos <= len` held after the last stage, so
    // these 8 words are in bounds; the caller checks `pos` against `len` after the stage.
    let w = _mm256_broadcastsi128_si256(_mm_loadu_si128(words.add(*pos).cast()));
    // An in-lane byte shuffle that also zeros the lanes that do not refill: on a Zen 5
    // (2-cycle vector operations) two cycles less on the state chain than the dword
    // permute and mask it replaced (avx2 branches before zen5dec), and one operation fewer.
    let w = _mm256_shuffle_epi8(w, _mm256_load_si256(EXPAND.0[m].as_ptr().cast()));
    *pos += m.count_ones() as usize;
    // Refilling lanes take their state shifted left by 16 (a dword blend on the compare's
    // sign bits: one operation, where turning the compare into shift counts took one more
    // on a Zen 5; on Intel cores `vblendvps` is two or three micro-ops, not measured here)
    // and OR their word; the others OR 0.
    let up = _mm256_castps_si256(_mm256_blendv_ps(
        _mm256_castsi256_ps(x),
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x)),
        _mm256_castsi256_ps(need),
    ));
    _mm256_or_si256(up, w)
}

/// Refill the chunk's four vectors in lane order and check the stream did not run dry.
#[inline(always)]
unsafe fn refill_all(
    x: &mut [__m256i; NV],
    words: *const u16,
    pos: &mut usize,
    len: usize,
) -> Result<()> {
    for v in x.iter_mut() {
        *v = refill(*v, words, pos);
    }
    if *pos > len {
        return Err(overrun());
    }
    Ok(())
}

/// The codes `d` elements before lanes `j0..j0 + 8` (decoded in an earlier step, as
/// `d >= LANES`), masked by `mask`; `none` for lanes before the chunk's first row.
#[inline(always)]
unsafe fn neighbor(cp: *const u32, j0: usize, d: usize, none: __m256i, mask: i32) -> __m256i {
    let m = _mm256_set1_epi32(mask);
    if j0 >= d {
        _mm256_and_si256(_mm256_loadu_si256(cp.add(j0 - d).cast()), m)
    } else if j0 + 8 <= d {
        none
    } else {
        // Straddling the first row: only the lanes past it have a neighbor (`j >= d`).
        let mut a = [0u32; 8];
        _mm256_storeu_si256(a.as_mut_ptr().cast(), none);
        for (l, v) in a.iter_mut().enumerate().skip(d - j0) {
            *v = *cp.add(j0 + l - d) & mask as u32;
        }
        _mm256_loadu_si256(a.as_ptr().cast())
    }
}

/// How many of `row`'s `N` starts are `<= slot`: the B symbol whose range holds `slot`.
/// Starts are at most `PROB_TOTAL` and slots below it, so signed 16-bit compares are exact.
#[inline(always)]
unsafe fn count_le<const N: usize>(row: *const u16, slot: u32) -> u32 {
    if N == 8 {
        let gt = _mm_cmpgt_epi16(_mm_loadu_si128(row.cast()), _mm_set1_epi16(slot as i16));
        return 8 - _mm_movemask_epi8(gt).count_ones() / 2;
    }
    let s = _mm256_set1_epi16(slot as i16);
    let mut above = 0;
    for k in (0..N).step_by(16) {
        let gt = _mm256_cmpgt_epi16(_mm256_loadu_si256(row.add(k).cast()), s);
        above += _mm256_movemask_epi8(gt).count_ones();
    }
    N as u32 - above / 2
}

/// Decode a binary symbol under `f0` (`PROB_TOTAL`: absent, state unchanged); returns the
/// lanes that decoded 0 (all ones) — the complement of the symbol.
#[inline(always)]
unsafe fn binary(x: &mut __m256i, f0: __m256i) -> __m256i {
    let slot = _mm256_and_si256(*x, _mm256_set1_epi32(SLOT_MASK));
    let zero = _mm256_cmpgt_epi32(f0, slot);
    let f = _mm256_blendv_epi8(
        _mm256_sub_epi32(_mm256_set1_epi32(PROB_TOTAL as i32), f0),
        f0,
        zero,
    );
    let s = _mm256_andnot_si256(zero, f0);
    *x = _mm256_sub_epi32(
        _mm256_add_epi32(
            _mm256_mullo_epi32(f, _mm256_srli_epi32::<{ PROB_BITS as i32 }>(*x)),
            slot,
        ),
        s,
    );
    zero
}

/// Whether any lane of `m` (all-ones lanes) is set.
#[inline(always)]
unsafe fn any(m: __m256i) -> bool {
    _mm256_testz_si256(m, m) == 0
}

/// Decode every full step of the chunk (all but a last partial one), exactly as the
/// portable step would; returns the number of elements done. Returns 0 (leaving the work to
/// the portable step) when the tables do not have the shapes the contexts assume.
///
/// # Safety
/// The CPU must have AVX2, BMI1, BMI2, LZCNT, POPCNT and PCLMULQDQ, and `st.words` must
/// hold `LANES` padding words past `st.len`.
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
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
    let mut x = [_mm256_setzero_si256(); NV];
    for (v, xv) in x.iter_mut().enumerate() {
        *xv = _mm256_loadu_si256(states.as_ptr().add(8 * v).cast());
    }
    let w1v = _mm256_set1_epi32(w1 as i32);
    let ff = _mm256_set1_epi32(255);
    let total = _mm256_set1_epi32(PROB_TOTAL as i32);
    let no_row_v = _mm256_set1_epi32(NO_ROW as i32);
    // Per-lane values between the vector code and the plain-load pass.
    let (mut ctx_a, mut slot_a, mut erw_a, mut us_a) =
        ([0u32; LANES], [0u32; LANES], [0u32; LANES], [0u32; LANES]);
    let mut fs_a = [0u32; LANES];
    let cp = codes.as_mut_ptr();
    let ip = info.as_ptr();

    for base in (0..full).step_by(LANES) {
        // As in the AVX-512 decoder: B by plain loads and counting starts, then gathers of
        // every row the later stages need (they depend only on b), then the state chain.
        let mut slot = [_mm256_setzero_si256(); NV];
        for v in 0..NV {
            let j0 = base + 8 * v;
            let inf = _mm256_cvtepu16_epi32(_mm_loadu_si128(ip.add(j0).cast()));
            let er = _mm256_and_si256(inf, ff);
            let ctx = if bt.neighbor {
                // Lanes before the chunk's first row see W1 ("none").
                let nb = neighbor(cp, j0, d, w1v, 127);
                let m2 = _mm256_and_si256(_mm256_srli_epi32::<9>(inf), _mm256_set1_epi32(3));
                let row =
                    _mm256_add_epi32(_mm256_mullo_epi32(m2, _mm256_set1_epi32(w1 as i32 + 1)), nb);
                _mm256_add_epi32(_mm256_slli_epi32::<8>(row), er)
            } else {
                er
            };
            slot[v] = _mm256_and_si256(x[v], _mm256_set1_epi32(SLOT_MASK));
            _mm256_storeu_si256(ctx_a.as_mut_ptr().add(8 * v).cast(), ctx);
            _mm256_storeu_si256(slot_a.as_mut_ptr().add(8 * v).cast(), slot[v]);
            _mm256_storeu_si256(
                erw_a.as_mut_ptr().add(8 * v).cast(),
                _mm256_mullo_epi32(er, w1v),
            );
            if s_t.is_some() {
                // S: context ((er·W1 + b)·3 + up)·2 + rs = (er·W1 + b)·6 + (2·up + rs).
                let up = if d_s == usize::MAX {
                    _mm256_setzero_si256()
                } else {
                    // Sign state of the neighbor: 0 no update, 1 up, 2 down.
                    let c = neighbor(cp, j0, d_s, _mm256_setzero_si256(), -1);
                    let zero_b = _mm256_cmpeq_epi32(
                        _mm256_and_si256(c, _mm256_set1_epi32(127)),
                        _mm256_setzero_si256(),
                    );
                    let neg = _mm256_and_si256(_mm256_srli_epi32::<9>(c), _mm256_set1_epi32(1));
                    _mm256_andnot_si256(zero_b, _mm256_add_epi32(neg, _mm256_set1_epi32(1)))
                };
                let rs = _mm256_and_si256(_mm256_srli_epi32::<8>(inf), _mm256_set1_epi32(1));
                _mm256_storeu_si256(
                    us_a.as_mut_ptr().add(8 * v).cast(),
                    _mm256_add_epi32(_mm256_slli_epi32::<1>(up), rs),
                );
            }
        }
        let (map, starts, fsp) = (
            bt.map_padded.as_ptr(),
            bt.starts.as_ptr(),
            bt.fs_packed.as_ptr(),
        );
        for l in 0..LANES {
            // In bounds: contexts are below the map's checked length, its entries below the
            // row count (the zero row included), symbols below W1 (`vector_tables_fit`).
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
        let mut code = [_mm256_setzero_si256(); NV];
        let mut fs = [_mm256_setzero_si256(); NV];
        let mut f0_q1 = [_mm256_setzero_si256(); NV];
        let mut f0_q2 = [_mm256_setzero_si256(); NV];
        let mut f0_s = [_mm256_setzero_si256(); NV];
        let mut present_q2 = [_mm256_setzero_si256(); NV];
        let (q1p, q2p) = (q1t.f0_by_ctx.as_ptr(), q2t.f0_pairs.as_ptr());
        for v in 0..NV {
            fs[v] = _mm256_loadu_si256(fs_a.as_ptr().add(8 * v).cast());
            // The zero row: a context without a row.
            let f = _mm256_and_si256(fs[v], _mm256_set1_epi32(0x1FFF));
            if any(_mm256_cmpeq_epi32(f, _mm256_setzero_si256())) {
                return Err(no_row());
            }
            let sym = _mm256_srli_epi32::<25>(fs[v]);
            code[v] = sym;
            // Q1: present when b >= 2; Q2 when b >= 3 (both rows, chosen by q1 later); S
            // when b >= 1. Absent lanes keep the gather's source, the identity `PROB_TOTAL`.
            let p_q1 = _mm256_cmpgt_epi32(sym, _mm256_set1_epi32(1));
            present_q2[v] = _mm256_cmpgt_epi32(sym, _mm256_set1_epi32(2));
            let p_s = _mm256_cmpgt_epi32(sym, _mm256_setzero_si256());
            let eb = _mm256_add_epi32(_mm256_loadu_si256(erw_a.as_ptr().add(8 * v).cast()), sym);
            // Every lane's index is in its table (`vector_tables_fit`: er < 256, sym < W1).
            f0_q1[v] = gather8_or(total, q1p, eb, p_q1);
            if any(_mm256_cmpeq_epi32(f0_q1[v], no_row_v)) {
                return Err(no_row());
            }
            f0_q2[v] = gather8_or(
                _mm256_set1_epi32((PROB_TOTAL | PROB_TOTAL << 16) as i32),
                q2p,
                eb,
                present_q2[v],
            );
            if let Some(s_t) = s_t {
                let sctx = _mm256_add_epi32(
                    _mm256_mullo_epi32(eb, _mm256_set1_epi32(6)),
                    _mm256_loadu_si256(us_a.as_ptr().add(8 * v).cast()),
                );
                f0_s[v] = gather8_or(total, s_t.f0_by_ctx.as_ptr(), sctx, p_s);
                if any(_mm256_cmpeq_epi32(f0_s[v], no_row_v)) {
                    return Err(no_row());
                }
            }
        }
        // B: the state updates.
        for v in 0..NV {
            let f = _mm256_and_si256(fs[v], _mm256_set1_epi32(0x1FFF));
            let s = _mm256_and_si256(_mm256_srli_epi32::<13>(fs[v]), _mm256_set1_epi32(0xFFF));
            x[v] = _mm256_sub_epi32(
                _mm256_add_epi32(
                    _mm256_mullo_epi32(f, _mm256_srli_epi32::<{ PROB_BITS as i32 }>(x[v])),
                    slot[v],
                ),
                s,
            );
        }
        refill_all(&mut x, words, &mut pos, st.len)?;
        for v in 0..NV {
            let zero = binary(&mut x[v], f0_q1[v]);
            code[v] = _mm256_or_si256(
                code[v],
                _mm256_andnot_si256(zero, _mm256_set1_epi32(1 << 7)),
            );
        }
        refill_all(&mut x, words, &mut pos, st.len)?;
        for v in 0..NV {
            let q1 = _mm256_cmpeq_epi32(
                _mm256_and_si256(code[v], _mm256_set1_epi32(1 << 7)),
                _mm256_set1_epi32(1 << 7),
            );
            let f0 = _mm256_and_si256(
                _mm256_blendv_epi8(f0_q2[v], _mm256_srli_epi32::<16>(f0_q2[v]), q1),
                _mm256_set1_epi32(0xFFFF),
            );
            let missing = _mm256_and_si256(
                present_q2[v],
                _mm256_cmpeq_epi32(f0, _mm256_set1_epi32(0xFFFF)),
            );
            if any(missing) {
                return Err(no_row());
            }
            let zero = binary(&mut x[v], f0);
            code[v] = _mm256_or_si256(
                code[v],
                _mm256_andnot_si256(zero, _mm256_set1_epi32(1 << 8)),
            );
        }
        refill_all(&mut x, words, &mut pos, st.len)?;
        if s_t.is_some() {
            for v in 0..NV {
                let zero = binary(&mut x[v], f0_s[v]);
                code[v] = _mm256_or_si256(
                    code[v],
                    _mm256_andnot_si256(zero, _mm256_set1_epi32(1 << 9)),
                );
            }
            refill_all(&mut x, words, &mut pos, st.len)?;
        }
        for (v, c) in code.iter().enumerate() {
            _mm256_storeu_si256(cp.add(base + 8 * v).cast(), *c);
        }
    }
    for (v, xv) in x.iter().enumerate() {
        _mm256_storeu_si256(states.as_mut_ptr().add(8 * v).cast(), *xv);
    }
    st.pos = pos;
    Ok(full)
}

/// Raw tails and the inverse transform for 16-bit elements, 16 at a time in 16-bit lanes,
/// as `avx512::decode::finish_u16` does them 32 at a time (in 32-bit lanes this pass was
/// 41% of a bf16 `--fast` decode's samples on a Zen 5 at this level, the lanes 38%): the
/// codes (or, where `u_codes`, what the Joint lanes store for 16-bit floats: `u` of each
/// joint symbol, `super::super::joint::u_of_joint`) narrowed to 16 bits; each tail's bit
/// offset a running sum of the lengths (by a multiply in the integer unit); its bits taken
/// from the four bytes around the offset's byte by byte shuffles of two 16-byte windows,
/// one per 128-bit half (8 tails of at most 13 bits and the 7 bits before the first lie in
/// 16 bytes, so each half shuffles inside its own lane: no lane-crossing picks); then the
/// value rebuilt, turned into a displacement and added to the reference's ordered key. AVX2
/// has no variable 16-bit shifts: every shift by a lane's own count is a multiply by a
/// power of two that a byte shuffle looks up (`mullo` shifts left, `mulhi` right). The
/// first tail starts at bit `bits` of `tail` (a block after the first continues where the
/// last one ended). Does every whole group of 16 while the windows fit the tail and returns
/// how many elements it did and the bit where their tails end; the caller finishes the
/// rest. Every read stays inside `tail` whatever the codes (each group checks its 32
/// bytes); whether the tail's length matches the codes is the caller's check.
///
/// # Safety
/// The CPU must have AVX2; the codes must be below 2^16 (every lane writes codes below
/// 2^10 and `u` below 2^8).
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
pub unsafe fn finish_u16(
    codes: &[u32],
    u_codes: bool,
    reference: &[u8],
    out: &mut [MaybeUninit<u8>],
    tail: &[u8],
    bits: u64,
    signed: bool,
    fold: &mut Fold,
) -> (usize, u64) {
    let n = codes.len().min(reference.len() / 2).min(out.len() / 2);
    let full = n / 16 * 16;
    let mut bits = bits;
    let k = Tails16::new();
    for j in (0..full).step_by(16) {
        if !group16(
            &k,
            codes.as_ptr().add(j),
            u_codes,
            reference.as_ptr().add(2 * j),
            out.as_mut_ptr().add(2 * j).cast(),
            tail,
            &mut bits,
            signed,
            fold,
        ) {
            return (j, bits);
        }
    }
    (full, bits)
}

/// What the Joint lanes ([`super::joint::decode`]) do between steps with the codes they
/// stored: nothing, or the tail pass of the elements they finished ([`Fused16`]).
pub(in crate::backend::cpu) trait AfterStep {
    /// `codes[..ready]` are stored (a multiple of `LANES`).
    ///
    /// # Safety
    /// AVX2 (inlined into code built for it); `codes` valid for `ready` reads.
    unsafe fn after(&mut self, codes: *const u32, ready: usize);
    /// Elements whose tails are done, and where those tails end (none for `()`).
    fn progress(&self) -> (usize, u64);
}

impl AfterStep for () {
    #[inline(always)]
    unsafe fn after(&mut self, _: *const u32, _: usize) {}
    fn progress(&self) -> (usize, u64) {
        (0, 0)
    }
}

/// [`finish_u16`] run inside the lanes' loop, two groups per step, a step behind the lanes:
/// on a Zen 5 the lanes wait on their state chain (gathers, 2-cycle vector operations) and
/// the tail pass's independent work fills the gaps, where as a pass of its own it was a
/// third of a bf16 decode. Reads `u` of joint symbols, what both the `--fast` and the
/// neighbor-form lanes store. Stops where [`group16`] does; the caller finishes from `done`
/// and `bits` with [`finish_u16`].
pub(in crate::backend::cpu) struct Fused16<'a> {
    tb: Tails16,
    fold: &'a mut Fold,
    reference: &'a [u8],
    out: &'a mut [MaybeUninit<u8>],
    tail: &'a [u8],
    /// Elements done, and where their tails end in `tail`.
    pub done: usize,
    pub bits: u64,
    live: bool,
    signed: bool,
}

impl<'a> Fused16<'a> {
    /// # Safety
    /// AVX2 (inlined into code built for it).
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn new(
        reference: &'a [u8],
        out: &'a mut [MaybeUninit<u8>],
        tail: &'a [u8],
        bits: u64,
        signed: bool,
        fold: &'a mut Fold,
    ) -> Self {
        Fused16 {
            tb: Tails16::new(),
            fold,
            reference,
            out,
            tail,
            done: 0,
            bits,
            live: true,
            signed,
        }
    }
}

impl AfterStep for Fused16<'_> {
    fn progress(&self) -> (usize, u64) {
        (self.done, self.bits)
    }
    #[inline(always)]
    unsafe fn after(&mut self, codes: *const u32, ready: usize) {
        // A step behind: the groups of the step before the one the lanes just stored.
        let upto = ready
            .saturating_sub(LANES)
            .min(self.reference.len() / 2)
            .min(self.out.len() / 2);
        while self.live && self.done + 16 <= upto {
            let j = self.done;
            // In bounds: `j + 16 <= upto`, within the codes stored, the reference and the
            // output.
            self.live = group16(
                &self.tb,
                codes.add(j),
                true,
                self.reference.as_ptr().add(2 * j),
                self.out.as_mut_ptr().add(2 * j).cast(),
                self.tail,
                &mut self.bits,
                self.signed,
                self.fold,
            );
            self.done += 16 * self.live as usize;
        }
    }
}

/// The byte tables [`group16`] looks up by `_mm256_shuffle_epi8` (an index with bit 7 set
/// reads 0).
pub(in crate::backend::cpu) struct Tails16 {
    /// 2^i below 8, 0 above: the bytes of 2^e as entries e and e - 8.
    pow2: __m256i,
    /// 2^(8 - s) for s in 1..8 at entry s, and entry 8 + s its high byte (1 for s = 0).
    shift_m: __m256i,
    /// 0x0101 in every lane, opaque to the compiler: it would turn the multiply that copies
    /// a byte into both halves of a lane into a shift and an add (two operations for one).
    dup: __m256i,
    /// The high byte of 2^(13 + b) for b < 3 (b = 16 wraps to entry 0: harmless, below).
    down_hi: __m256i,
}

impl Tails16 {
    /// # Safety
    /// AVX2 (inlined into code built for it).
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn new() -> Self {
        let table = |f: fn(usize) -> u8| {
            let t: [u8; 16] = std::array::from_fn(f);
            _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr().cast()))
        };
        Tails16 {
            dup: _mm256_set1_epi16(std::hint::black_box(0x0101)),
            pow2: table(|i| if i < 8 { 1 << i } else { 0 }),
            shift_m: table(|i| match i {
                1..=7 => 1 << (8 - i),
                8 => 1,
                _ => 0,
            }),
            down_hi: table(|b| match b {
                0 => 0x20,
                1 => 0x40,
                2 => 0x80,
                _ => 0,
            }),
        }
    }
}

/// One group of [`finish_u16`]: the 16 elements whose codes are at `codes`, reference at
/// `reference` and output at `out`, their tails from bit `*bits` of `tail` (advanced past
/// them). Returns false, writing nothing, where the group's 32 bytes of tail could pass its
/// end.
///
/// # Safety
/// AVX2 (inlined into code built for it); 16 codes (below 2^16), 32 bytes of reference
/// and of output at the pointers.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(in crate::backend::cpu) unsafe fn group16(
    tb: &Tails16,
    codes: *const u32,
    u_codes: bool,
    reference: *const u8,
    out: *mut u8,
    tail: &[u8],
    bits: &mut u64,
    signed: bool,
    fold: &mut Fold,
) -> bool {
    let (ffff, h) = (_mm256_set1_epi16(-1), _mm256_set1_epi16(i16::MIN));
    // The tail is not padded: where the group's 32 bytes could pass its end, the
    // caller's scalar pass does the rest.
    let bits_in = *bits;
    let at = (bits_in / 8) as usize;
    if tail.len().saturating_sub(at) < 32 {
        return false;
    }
    // Both halves narrowed (exact: below 2^16), then the 64-bit quarters back in order.
    let c = _mm256_permute4x64_epi64::<0xD8>(_mm256_packus_epi32(
        _mm256_loadu_si256(codes.cast()),
        _mm256_loadu_si256(codes.add(8).cast()),
    ));
    // u = 8·b + 4·q1 + 2·q2 + neg: what the Joint lanes store for 16-bit floats.
    let u = if u_codes {
        c
    } else {
        // From the code `b | q1 << 7 | q2 << 8 | neg << 9` (below 2^10).
        _mm256_or_si256(
            _mm256_or_si256(
                _mm256_slli_epi16::<3>(_mm256_and_si256(c, _mm256_set1_epi16(127))),
                _mm256_and_si256(_mm256_srli_epi16::<5>(c), _mm256_set1_epi16(4)),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<7>(c), _mm256_set1_epi16(2)),
                _mm256_and_si256(_mm256_srli_epi16::<9>(c), _mm256_set1_epi16(1)),
            ),
        )
    };
    let b = _mm256_srli_epi16::<3>(u);
    // max(b - 3, 0): b <= 16 in a valid stream.
    let len = _mm256_subs_epu16(b, _mm256_set1_epi16(3));
    // Each half's 8 lengths (at most 31 whatever the codes) as the bytes of a 64-bit word,
    // whose product with 0x0101_0101_0101_0101 holds their running sums (at most 8 × 31: no
    // carry between bytes), as in `tail_offsets` for 32-bit floats.
    const ONES: u64 = 0x0101_0101_0101_0101;
    let bytes = _mm256_packus_epi16(len, len);
    let lo = _mm_cvtsi128_si64(_mm256_castsi256_si128(bytes)) as u64;
    let hi = _mm_cvtsi128_si64(_mm256_extracti128_si256::<1>(bytes)) as u64;
    let (sum_lo, sum_hi) = (lo.wrapping_mul(ONES), hi.wrapping_mul(ONES));
    let lo_total = (sum_lo >> 56) as u32;
    let total = lo_total + (sum_hi >> 56) as u32;
    // Lanes 0..8 read the 16 bytes from `at`, lanes 8..16 the 16 from the byte of their
    // first tail (at most 13 bytes on: 7 + 8 × 13 bits; clamped whatever the codes, so
    // the load stays inside the 32 bytes checked above).
    let (s0, s1) = (bits_in % 8, bits_in % 8 + lo_total as u64);
    let w = _mm256_loadu2_m128i(
        tail.as_ptr().add(at + (s1 as usize / 8).min(16)).cast(),
        tail.as_ptr().add(at).cast(),
    );
    // Each lane's first bit in its half's window (below 2^8), in both bytes of the lane:
    // the byte shuffles' indices below without a shift and an or each.
    let o = _mm_set_epi64x(
        (sum_hi - hi + s1 % 8 * ONES) as i64,
        (sum_lo - lo + s0 * ONES) as i64,
    );
    let off2 = _mm256_set_m128i(_mm_unpackhi_epi8(o, o), _mm_unpacklo_epi8(o, o));
    // Bytes k - 1, k and k + 1, k + 2 of the lane's window (k its tail's first byte, at
    // most 12) as two 16-bit words; byte -1 (index 0xFF) reads 0.
    let kk = _mm256_and_si256(_mm256_srli_epi16::<3>(off2), _mm256_set1_epi16(0x1F1F));
    let w0 = _mm256_shuffle_epi8(w, _mm256_add_epi8(kk, _mm256_set1_epi16(0x00FF)));
    let w1 = _mm256_shuffle_epi8(w, _mm256_add_epi8(kk, _mm256_set1_epi16(0x0201)));
    // The 32 bits w1:w0 shifted right by 8 + s (s = off & 7, the tail's first bit in
    // byte k): w0 >> (8 + s) | w1 << (8 - s), both by multiplying with 2^(8 - s).
    let m = _mm256_shuffle_epi8(
        tb.shift_m,
        _mm256_or_si256(
            _mm256_and_si256(off2, _mm256_set1_epi16(0x0707)),
            _mm256_set1_epi16(0x0800),
        ),
    );
    let raw = _mm256_or_si256(_mm256_mulhi_epu16(w0, m), _mm256_mullo_epi16(w1, m));
    // 2^len (0 where b < 3, and len = 0), and from it (1 << len) - 1.
    let bb = _mm256_mullo_epi16(b, tb.dup);
    let up = _mm256_shuffle_epi8(
        tb.pow2,
        _mm256_add_epi8(bb, _mm256_set1_epi16(0xF5FD_u16 as i16)),
    );
    let t = _mm256_and_si256(raw, _mm256_subs_epu16(up, _mm256_set1_epi16(1)));
    *bits += total as u64;
    let delta = displacement16(u, b, up, t, signed, tb.down_hi);
    let r = _mm256_loadu_si256(reference.cast());
    // key(r) = r ^ (negative ? 0xFFFF : 0x8000), and back.
    let key = _mm256_xor_si256(r, _mm256_or_si256(_mm256_srai_epi16::<15>(r), h));
    let k = _mm256_add_epi16(key, delta);
    let x = _mm256_xor_si256(
        k,
        _mm256_or_si256(_mm256_andnot_si256(_mm256_srai_epi16::<15>(k), ffff), h),
    );
    _mm256_storeu_si256(out.cast(), x);
    fold.add32(x);
    true
}

/// `u_of_joint` below 16 as bytes, `u_of_joint(j) ^ (j + 17)` (0 from j = 7 on), twice.
static U_FIX: [u8; 32] = {
    let mut t = [0u8; 32];
    let mut j = 0;
    while j < 32 {
        t[j] = u_of_joint(j % 16) as u8 ^ ((j % 16) as u8 + 17);
        j += 1;
    }
    t
};

/// `u_of_joint` of 8 joint symbols (below 2^8) in 32-bit lanes: `J + 17` from J = 7 on;
/// below, its xor with [`U_FIX`] (index bytes 1..3 read 0 by their 0x80, byte 0 of
/// `J + 0x70` reads 0 from J = 16 on, its top bit set). What the Joint lanes store for
/// 16-bit floats, and what the 32-bit tail pass reads b, the top bits and the sign from.
///
/// # Safety
/// AVX2 (inlined into code built for it).
#[inline(always)]
pub(in crate::backend::cpu) unsafe fn u_of_joint8(j: __m256i) -> __m256i {
    let fix = _mm256_shuffle_epi8(
        _mm256_loadu_si256(U_FIX.as_ptr().cast()),
        _mm256_adds_epu8(j, _mm256_set1_epi32(0x8080_8070_u32 as i32)),
    );
    _mm256_xor_si256(_mm256_add_epi32(j, _mm256_set1_epi32(17)), fix)
}

/// [`displacement`] of 16 16-bit elements in 16-bit lanes (values and keys of 16-bit
/// floats wrap the same way there), from `u` (see `u_of_joint`), `b = u >> 3` and the
/// raw tails `t`: `top << (b - 3)` (`top = 4 | q1 << 1 | q2`) as a multiply by 2^(b - 3)
/// (`pow2`'s entries b - 3 and b - 11 as its bytes; both negative, so 0, for b < 3) and
/// `top >> (3 - b)` as the high half of a multiply by 2^(13 + b) (`down_hi`; for b = 16
/// that reads 2^13, and `top >> 3` is 0 as it should be for b >= 3).
#[inline(always)]
unsafe fn displacement16(
    u: __m256i,
    b: __m256i,
    up: __m256i,
    t: __m256i,
    signed: bool,
    down_hi: __m256i,
) -> __m256i {
    let (zero, one) = (_mm256_setzero_si256(), _mm256_set1_epi16(1));
    let top = _mm256_or_si256(
        _mm256_set1_epi16(4),
        _mm256_and_si256(_mm256_srli_epi16::<1>(u), _mm256_set1_epi16(3)),
    );
    let down = _mm256_slli_epi16::<8>(_mm256_shuffle_epi8(down_hi, b));
    let v = _mm256_or_si256(
        _mm256_or_si256(_mm256_mullo_epi16(top, up), _mm256_mulhi_epu16(top, down)),
        t,
    );
    if signed {
        // -v where neg = u & 1 (the sign's operand negative), else v (positive).
        _mm256_sign_epi16(v, _mm256_or_si256(_mm256_slli_epi16::<15>(u), one))
    } else {
        // ZigZag: (v >> 1) ^ -(v & 1)
        _mm256_xor_si256(
            _mm256_srli_epi16::<1>(v),
            _mm256_sub_epi16(zero, _mm256_and_si256(v, one)),
        )
    }
}

/// [`finish_u16`] for 32-bit elements: a tail has at most 29 bits, so with the 31 bits
/// before it in its dword it lies in two dwords; the 8 tails of a group (with the 7 bits
/// before the first: 239 bits) lie in one 32-byte window, from which each lane picks its
/// two dwords by lane-crossing dword permutes (byte shuffles work inside 128-bit halves:
/// each half then needed its own window, whose address waited on the low half's sum).
/// Starts at tail bit `bits`; reads inside `tail` whatever the codes, which are joint
/// symbols where `j_codes` (below 2^8), else per-element codes.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
pub unsafe fn finish_u32(
    codes: &[u32],
    j_codes: bool,
    reference: &[u8],
    out: &mut [MaybeUninit<u8>],
    tail: &[u8],
    bits: u64,
    signed: bool,
    fold: &mut Fold,
) -> (usize, u64) {
    // One loop per form, so that neither flag is tested per 8 elements.
    let f = fold;
    match (j_codes, signed) {
        (true, true) => finish_u32_as::<true, true>(codes, reference, out, tail, bits, f),
        (true, false) => finish_u32_as::<true, false>(codes, reference, out, tail, bits, f),
        (false, true) => finish_u32_as::<false, true>(codes, reference, out, tail, bits, f),
        (false, false) => finish_u32_as::<false, false>(codes, reference, out, tail, bits, f),
    }
}

/// [`finish_u32`] with its flags as constants: its own function per form, not inlined
/// into the dispatch (inlined, LLVM merged the four loops back into one that tests both
/// flags per 8 elements).
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,pclmulqdq")]
#[inline(never)]
unsafe fn finish_u32_as<const J_CODES: bool, const SIGNED: bool>(
    codes: &[u32],
    reference: &[u8],
    out: &mut [MaybeUninit<u8>],
    tail: &[u8],
    bits: u64,
    fold: &mut Fold,
) -> (usize, u64) {
    let n = codes.len().min(reference.len() / 4).min(out.len() / 4);
    let full = n / 8 * 8;
    let mut bits = bits;
    let Some(k) = Tails32::new(tail) else {
        return (0, bits);
    };
    for j in (0..full).step_by(8) {
        if !group8::<J_CODES, SIGNED>(
            &k,
            lens8::<J_CODES>(&k, codes.as_ptr().add(j)),
            codes.as_ptr().add(j),
            reference.as_ptr().add(4 * j),
            out.as_mut_ptr().add(4 * j).cast(),
            tail,
            &mut bits,
            fold,
        ) {
            return (j, bits);
        }
    }
    (full, bits)
}

/// [`finish_u32`] run inside the lanes' loop, as [`Fused16`]: four groups per step, a step
/// behind the lanes, from joint symbols (what both the `--fast` and the neighbor-form lanes
/// store for 32-bit floats). Does nothing where the tail is shorter than a group's 32 bytes.
pub(in crate::backend::cpu) struct Fused32<'a, const SIGNED: bool> {
    k: Option<Tails32>,
    fold: &'a mut Fold,
    reference: &'a [u8],
    out: &'a mut [MaybeUninit<u8>],
    tail: &'a [u8],
    /// Elements done, and where their tails end in `tail`.
    pub done: usize,
    pub bits: u64,
}

impl<'a, const SIGNED: bool> Fused32<'a, SIGNED> {
    /// # Safety
    /// AVX2 (inlined into code built for it).
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn new(
        reference: &'a [u8],
        out: &'a mut [MaybeUninit<u8>],
        tail: &'a [u8],
        bits: u64,
        fold: &'a mut Fold,
    ) -> Self {
        Fused32 {
            k: Tails32::new(tail),
            fold,
            reference,
            out,
            tail,
            done: 0,
            bits,
        }
    }
}

impl<const SIGNED: bool> AfterStep for Fused32<'_, SIGNED> {
    fn progress(&self) -> (usize, u64) {
        (self.done, self.bits)
    }
    #[inline(always)]
    unsafe fn after(&mut self, codes: *const u32, ready: usize) {
        let Some(k) = &self.k else {
            return;
        };
        // A step behind: the groups of the step before the one the lanes just stored.
        let upto = ready
            .saturating_sub(LANES)
            .min(self.reference.len() / 4)
            .min(self.out.len() / 4);
        while self.done + 8 <= upto {
            // The lengths of the next groups' tails first: the way from their codes to
            // their offsets (a permute, a move to the integer unit and back) is the longest
            // in a group, and it does not wait on `bits`; in the group itself, it kept
            // the reorder buffer waiting.
            let groups = ((upto - self.done) / 8).min(4);
            let mut lens = [0u64; 4];
            for (g, l) in lens.iter_mut().enumerate().take(groups) {
                *l = lens8::<true>(k, codes.add(self.done + 8 * g));
            }
            for &l in &lens[..groups] {
                let j = self.done;
                // In bounds: `j + 8 <= upto`, within the codes stored, the reference and
                // the output.
                if !group8::<true, SIGNED>(
                    k,
                    l,
                    codes.add(j),
                    self.reference.as_ptr().add(4 * j),
                    self.out.as_mut_ptr().add(4 * j).cast(),
                    self.tail,
                    &mut self.bits,
                    self.fold,
                ) {
                    self.k = None;
                    return;
                }
                self.done += 8;
            }
        }
    }
}

/// The constants of [`group8`] for one tail.
pub(in crate::backend::cpu) struct Tails32 {
    /// The tail is not padded: a group runs while its 32 bytes from `bits / 8` lie inside
    /// it (one compare of `bits` per group, with this, the last bit it may start at); the
    /// caller's scalar pass does the rest.
    last_bit: u64,
    low31: __m256i,
    /// The byte shuffle that puts each 128-bit half's four dwords' low bytes in its first
    /// dword, and the dword permute that brings those two dwords together.
    low_bytes: __m256i,
    pair: __m256i,
    thirty_two: __m256i,
}

impl Tails32 {
    /// None where the tail is shorter than a group's 32 bytes.
    ///
    /// # Safety
    /// AVX2 (inlined into code built for it).
    #[inline(always)]
    pub(in crate::backend::cpu) unsafe fn new(tail: &[u8]) -> Option<Self> {
        let last_at = tail.len().checked_sub(32)?;
        // Opaque to LLVM, so that it keeps the operations written here: with the constants
        // in sight it turned a shift by 32 - m into a shift and a mask of m > 0, and
        // `andnot(m, low31)` into a shift and two xors.
        let (low31, thirty_two) =
            std::hint::black_box((_mm256_set1_epi32(i32::MAX), _mm256_set1_epi32(32)));
        let z = -128i8;
        Some(Tails32 {
            last_bit: last_at as u64 * 8 + 7,
            low31,
            low_bytes: _mm256_setr_epi8(
                0, 4, 8, 12, z, z, z, z, z, z, z, z, z, z, z, z, //
                0, 4, 8, 12, z, z, z, z, z, z, z, z, z, z, z, z,
            ),
            pair: _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0),
            thirty_two,
        })
    }
}

/// One group of [`finish_u32`]: the 8 elements whose codes are at `codes`, reference at
/// `reference` and output at `out`, their tails from bit `*bits` of `tail` (advanced past
/// them), their lengths `lens` as [`lens8`] takes them from the same codes (taken apart so
/// that callers can take them early). From `lens8` each length is at most 29, so the 8
/// tails lie in the 32 bytes loaded; whatever the word holds, every read stays in them (the
/// permutes pick among their 8 dwords). Returns false, writing nothing, where the group's
/// 32 bytes of tail could pass its end.
///
/// # Safety
/// AVX2 (inlined into code built for it); 8 codes, 32 bytes of reference and of output at
/// the pointers; `k` built for `tail`.
#[inline(always)]
unsafe fn group8<const J_CODES: bool, const SIGNED: bool>(
    k: &Tails32,
    lens: u64,
    codes: *const u32,
    reference: *const u8,
    out: *mut u8,
    tail: &[u8],
    bits: &mut u64,
    fold: &mut Fold,
) -> bool {
    let bits_in = *bits;
    if bits_in > k.last_bit {
        return false;
    }
    let at = (bits_in / 8) as usize;
    let c = _mm256_loadu_si256(codes.cast());
    // b, the top bits `1 q1 q2` and the sign as a lane negative where the element's
    // displacement is (and never 0: `_mm256_sign_epi32` applies it).
    let (b, top, sgn) = if J_CODES {
        let u = u_of_joint8(c);
        let one = _mm256_set1_epi32(1);
        (
            _mm256_srli_epi32::<3>(u),
            _mm256_or_si256(
                _mm256_set1_epi32(4),
                _mm256_and_si256(_mm256_srli_epi32::<1>(u), _mm256_set1_epi32(3)),
            ),
            _mm256_or_si256(_mm256_slli_epi32::<31>(u), one),
        )
    } else {
        // The code `b | q1 << 7 | q2 << 8 | neg << 9`.
        (
            _mm256_and_si256(c, _mm256_set1_epi32(127)),
            _mm256_or_si256(
                _mm256_set1_epi32(4),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi32::<6>(c), _mm256_set1_epi32(2)),
                    _mm256_and_si256(_mm256_srli_epi32::<8>(c), _mm256_set1_epi32(1)),
                ),
            ),
            _mm256_or_si256(_mm256_slli_epi32::<22>(c), _mm256_set1_epi32(1)),
        )
    };
    // max(b - 3, 0), the shift of the top bits, and the tail's length: the same but at
    // most 29 (b <= 32 in a valid stream; never more than the caller's `need` counts,
    // whatever the codes).
    let b3 = _mm256_subs_epu16(b, _mm256_set1_epi32(3));
    let len = _mm256_min_epu32(b3, _mm256_set1_epi32(29));
    let (off, total) = tail_offsets(lens, bits_in % 8);
    // All 8 tails and the 7 bits before the first lie in the 32 bytes from `at` (7 + 8
    // × 29 bits): one load whose address waits only on `bits`. Each lane takes the two
    // dwords holding its tail's first bit and the next (dword 6 and 7 at most) by
    // lane-crossing permutes and shifts the 64 bits right by the bit in the dword.
    let w = _mm256_loadu_si256(tail.as_ptr().add(at).cast());
    let d = _mm256_srli_epi32::<5>(off);
    let lo = _mm256_permutevar8x32_epi32(w, d);
    let hi = _mm256_permutevar8x32_epi32(w, _mm256_add_epi32(d, _mm256_set1_epi32(1)));
    let m = _mm256_and_si256(off, _mm256_set1_epi32(31));
    // A shift by 32 (m = 0) gives 0, as the tail then lies in `lo` alone.
    let raw = _mm256_or_si256(
        _mm256_srlv_epi32(lo, m),
        _mm256_sllv_epi32(hi, _mm256_sub_epi32(k.thirty_two, m)),
    );
    let t = _mm256_andnot_si256(_mm256_sllv_epi32(_mm256_set1_epi32(-1), len), raw);
    *bits += total as u64;
    let v = compose(b, b3, top, t);
    let r = _mm256_loadu_si256(reference.cast());
    // In complements: the key is key(r) = r ^ (negative ? !0 : 1 << 31), so !key(r) =
    // r ^ (negative ? 0 : !0 >> 1); the value !k (k = key + delta) is !key - delta; and
    // the element from k, k ^ (k negative ? 1 << 31 : !0), is !k ^ (!k negative ? 0 :
    // !0 >> 1). One operation fewer than going through the key itself.
    let not_key = _mm256_xor_si256(r, _mm256_andnot_si256(_mm256_srai_epi32::<31>(r), k.low31));
    let not_k = if SIGNED {
        _mm256_sub_epi32(not_key, _mm256_sign_epi32(v, sgn))
    } else {
        // ZigZag: delta = (v >> 1) ^ -(v & 1).
        let one = _mm256_set1_epi32(1);
        let delta = _mm256_xor_si256(
            _mm256_srli_epi32::<1>(v),
            _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_and_si256(v, one)),
        );
        _mm256_sub_epi32(not_key, delta)
    };
    let x = _mm256_xor_si256(
        not_k,
        _mm256_andnot_si256(_mm256_srai_epi32::<31>(not_k), k.low31),
    );
    _mm256_storeu_si256(out.cast(), x);
    fold.add32(x);
    true
}

/// The tails' lengths of the 8 elements whose codes are at `codes`, as [`group8`] reads
/// them (its `len`), as the bytes of one 64-bit word for [`tail_offsets`] (a byte shuffle,
/// a dword permute, a `vmovq`).
///
/// # Safety
/// AVX2 (inlined into code built for it); 8 codes at `codes`.
#[inline(always)]
unsafe fn lens8<const J_CODES: bool>(k: &Tails32, codes: *const u32) -> u64 {
    let c = _mm256_loadu_si256(codes.cast());
    let b = if J_CODES {
        _mm256_srli_epi32::<3>(u_of_joint8(c))
    } else {
        _mm256_and_si256(c, _mm256_set1_epi32(127))
    };
    let len = _mm256_min_epu32(
        _mm256_subs_epu16(b, _mm256_set1_epi32(3)),
        _mm256_set1_epi32(29),
    );
    let bytes = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(len, k.low_bytes), k.pair);
    _mm_cvtsi128_si64(_mm256_castsi256_si128(bytes)) as u64
}

/// Bit offsets of 8 consecutive raw tails of lengths `lens` (at most 29, [`lens8`]) from
/// bit `s0` (below 8) on: `s0` plus the exclusive prefix sums; and their total. The
/// lengths' product with 0x0101_0101_0101_0101 holds the running sums in its bytes (at
/// most 7 + 8 × 29 = 239: no carry between bytes), and they come back by `vmovq` and a
/// zero extension: with [`lens8`], 5 vector operations where prefix sums in the vector
/// unit took 13 (on a Zen 5 the tail pass is bound by vector operations, two a cycle; the
/// integer units were idle).
#[inline(always)]
unsafe fn tail_offsets(lens: u64, s0: u64) -> (__m256i, u32) {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let sums = lens.wrapping_mul(ONES);
    let off = sums - lens + s0 * ONES;
    (
        _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(off as i64)),
        (sums >> 56) as u32,
    )
}

/// The magnitudes of 8 elements' displacements (`word::compose`, before the sign) from
/// their bit lengths `b`, `b3` = max(b - 3, 0), top bits `top` (`1 q1 q2`) and raw tails
/// `t`: `top << (b - 3) | t`, or `top >> (3 - b)` below b = 3 (where the tail is empty),
/// as one shift left by `b3` and one right by max(3 - b, 0) (a count of 32 or more gives
/// 0, as in the two shifts and OR this replaced).
#[inline(always)]
unsafe fn compose(b: __m256i, b3: __m256i, top: __m256i, t: __m256i) -> __m256i {
    // b is below 2^16 (codes below 2^10, joint symbols below 2^8): the saturating 16-bit
    // subtract sees it whole in each lane's low half and 0 - 0 in the high half.
    let down = _mm256_subs_epu16(_mm256_set1_epi32(3), b);
    _mm256_or_si256(_mm256_srlv_epi32(_mm256_sllv_epi32(top, b3), down), t)
}

#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;

    use super::super::super::joint::code_of_joint;
    use super::super::super::Isa;
    use super::super::crc::Fold;
    use super::finish_u32;

    /// The 32-bit tail pass from joint symbols writes what it writes from their per-element
    /// codes (the form checked against the portable pass by the parity tests): every J of
    /// 32-bit floats (b <= 32, J < 247) in order, then scrambled, both sign forms.
    #[test]
    fn finish_u32_from_j_matches_codes() {
        if !Isa::Avx2.available() {
            eprintln!("SKIP: this CPU has no AVX2 level");
            return;
        }
        let mut js: Vec<u32> = (0..247).collect();
        js.extend((0..4096u32).map(|k| (k.wrapping_mul(2_654_435_761) >> 7) % 247));
        let codes: Vec<u32> = js.iter().map(|&j| code_of_joint()[j as usize]).collect();
        let bytes = |n: usize, seed: u32| -> Vec<u8> {
            (0..n as u32)
                .map(|k| (k.wrapping_add(seed).wrapping_mul(2_246_822_519) >> 24) as u8)
                .collect()
        };
        let reference = bytes(js.len() * 4, 1);
        let tail = bytes(js.len() * 4 + 64, 7);
        for signed in [true, false] {
            let mut out = [
                vec![MaybeUninit::<u8>::uninit(); reference.len()],
                vec![MaybeUninit::<u8>::uninit(); reference.len()],
            ];
            let [a, b] = &mut out;
            let mut h = [crc32fast::Hasher::new(), crc32fast::Hasher::new()];
            // SAFETY: AVX2 checked above.
            let (ra, rb) = unsafe {
                let mut f = [Fold::new(&h[0]), Fold::new(&h[1])];
                let r = (
                    finish_u32(&js, true, &reference, a, &tail, 3, signed, &mut f[0]),
                    finish_u32(&codes, false, &reference, b, &tail, 3, signed, &mut f[1]),
                );
                f[0].flush(&mut h[0]);
                f[1].flush(&mut h[1]);
                r
            };
            assert_eq!(ra, rb, "elements done and tail bits, signed {signed}");
            assert!(ra.0 >= 256, "the vector pass ran ({} elements)", ra.0);
            // SAFETY: both passes wrote their first `ra.0` elements.
            let (a, b) = unsafe {
                (
                    std::slice::from_raw_parts(a.as_ptr().cast::<u8>(), ra.0 * 4),
                    std::slice::from_raw_parts(b.as_ptr().cast::<u8>(), ra.0 * 4),
                )
            };
            assert_eq!(a, b, "outputs, signed {signed}");
            // And the CRC-32 the pass folded is the output's.
            let [ha, hb] = h;
            assert_eq!(
                (ha.finalize(), hb.finalize()),
                (crc32fast::hash(a), crc32fast::hash(a))
            );
        }
    }
}
