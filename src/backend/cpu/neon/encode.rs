//! NEON codes and raw tails: every layout's first encoding step,
//! `super::super::encode::codes` with the tail (the function each one here must equal, code
//! for code and bit for bit), four elements per vector.
//!
//! The portable pass puts one tail at a time into the bit writer, a serial chain of shifts
//! per element. Here the bit length is one `clz` per lane (NEON has a vector count of
//! leading zeros, where AVX2 goes through a float conversion), Q1 and Q2 come from variable
//! shifts (`vshlq_u32` by a negative count shifts right), and the raw tails are merged
//! pairwise in 64-bit lanes so the writer takes one value per two elements (16-bit floats:
//! one per four).

#![cfg(target_arch = "aarch64")]

use core::arch::aarch64::*;
use std::any::TypeId;

use super::super::encode::{codes, Scratch};
use super::super::tables::{EncStage, PACKED_IDENTITY};
use super::super::word::{b_context, neighbor_b, rs, up, Word};
use super::joint::{put, NV, RECIP, SLACK};
use crate::entropy::freq::PROB_TOTAL;
use crate::entropy::rans::RANS_L;
use crate::format::bits::BitWriter;
use crate::format::chunk::{EncodedChunk, LANES};

/// A chunk's per-element codes into `s.codes` and raw tails into `s.tail`, as
/// `super::super::encode::codes(d, signed, &mut s.codes, Some(&mut s.tail))` gives them:
/// 16- and 32-bit elements by the vector passes, others by the portable one.
///
/// # Safety
/// The CPU must have NEON (`Isa::Neon` available).
#[target_feature(enable = "neon")]
pub unsafe fn codes_and_tails<T: Word>(d: &[T], signed: bool, s: &mut Scratch) {
    s.tail.clear();
    if TypeId::of::<T>() == TypeId::of::<u16>() {
        // SAFETY: `T` is `u16`: same layout.
        let d = unsafe { std::slice::from_raw_parts(d.as_ptr() as *const u16, d.len()) };
        // SAFETY: the caller guarantees NEON.
        unsafe { codes16(d, signed, &mut s.codes, &mut s.tail) };
    } else if TypeId::of::<T>() == TypeId::of::<u32>() {
        // SAFETY: `T` is `u32`: same layout.
        let d = unsafe { std::slice::from_raw_parts(d.as_ptr() as *const u32, d.len()) };
        // SAFETY: the caller guarantees NEON.
        unsafe { codes32(d, signed, &mut s.codes, &mut s.tail) };
    } else {
        codes(d, signed, &mut s.codes, Some(&mut s.tail));
    }
}

/// One chunk of the Paper or Signed layout, as `super::super::encode::chunk` codes it: the
/// NEON codes and tails, then the NEON lanes ([`lanes`]).
///
/// # Safety
/// The CPU must have NEON (`Isa::Neon` available).
#[target_feature(enable = "neon")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn chunk<T: Word>(
    d: &[T],
    info: &[u16],
    signed: bool,
    w1: usize,
    stages: &[EncStage],
    distance: Option<usize>,
    s: &mut Scratch,
) -> EncodedChunk {
    // SAFETY: the caller guarantees NEON.
    unsafe { codes_and_tails(d, signed, s) };
    // SAFETY: the caller guarantees NEON.
    let (states, at) = unsafe { lanes(&s.codes, info, w1, stages, distance, &mut s.words) };
    s.chunk(at..SLACK + s.codes.len() * stages.len(), states)
}

/// `super::super::encode::lanes` (the function this must equal, word for word and state
/// for state) with the state arithmetic, the flush and the division on eight 4-lane
/// vectors, as the Joint layout's NEON lanes do: per step and stage (reversed, as there)
/// each lane's context and symbol are computed as the portable loop computes them and its
/// packed symbol (`freq | start << 16`) looked up (scalar loads: NEON has no gathers), then
/// the 32 lanes are coded by `super::joint::put`, which stores each stage's flushed words
/// below the previous ones, so the buffer read forwards is the stream with no reversal
/// pass. The words are left in `words[at..SLACK + codes.len() · stages]`, `at` returned
/// with the final states.
///
/// # Safety
/// The CPU must have NEON.
#[target_feature(enable = "neon")]
unsafe fn lanes(
    codes: &[u32],
    info: &[u16],
    w1: usize,
    stages: &[EncStage],
    distance: Option<usize>,
    words: &mut Vec<u16>,
) -> ([u32; LANES], usize) {
    let n = codes.len();
    assert!(info.len() >= n);
    // At most one word per coded symbol, and the slack below. Grown, never cleared: every
    // slot from the final cursor up is written.
    let end = SLACK + n * stages.len();
    if words.len() < end {
        words.resize(end, 0);
    }
    let out = words.as_mut_ptr();
    let mut pos = end;
    let d = distance.unwrap_or(usize::MAX);
    let d_s = match stages.get(3) {
        Some(t) if t.neighbor => d,
        _ => usize::MAX,
    };
    let b_nb = stages[0].neighbor;
    let mut x = [vdupq_n_u32(RANS_L); NV];
    for step in (0..n.div_ceil(LANES)).rev() {
        let base = step * LANES;
        let lanes = LANES.min(n - base);
        let (c, inf) = (&codes[base..base + lanes], &info[base..base + lanes]);
        // Lanes past the chunk's end code the identity (their states stay as they are).
        let mut p = [PACKED_IDENTITY; LANES];
        // `pos` never drops below `SLACK`: one word at most per symbol.
        if let Some(s_t) = stages.get(3) {
            for lane in 0..lanes {
                let b = (c[lane] & 127) as usize;
                let eb = (inf[lane] & 255) as usize * w1 + b;
                let ctx = (eb * 3 + up(codes, base + lane, d_s) as usize) * 2 + rs(inf[lane]);
                p[lane] = packed(s_t, b >= 1, ctx, ((c[lane] >> 9) & 1) as usize);
            }
            code_step(&mut x, &p, out, &mut pos);
        }
        for lane in 0..lanes {
            let b = (c[lane] & 127) as usize;
            let eb = (inf[lane] & 255) as usize * w1 + b;
            let ctx = eb * 2 + ((c[lane] >> 7) & 1) as usize;
            p[lane] = packed(&stages[2], b >= 3, ctx, ((c[lane] >> 8) & 1) as usize);
        }
        code_step(&mut x, &p, out, &mut pos);
        for lane in 0..lanes {
            let b = (c[lane] & 127) as usize;
            let eb = (inf[lane] & 255) as usize * w1 + b;
            p[lane] = packed(&stages[1], b >= 2, eb, ((c[lane] >> 7) & 1) as usize);
        }
        code_step(&mut x, &p, out, &mut pos);
        for lane in 0..lanes {
            let b = (c[lane] & 127) as usize;
            let nb = if b_nb {
                neighbor_b(codes, base + lane, d, w1)
            } else {
                0
            };
            p[lane] = packed(&stages[0], true, b_context(inf[lane], nb, w1, b_nb), b);
        }
        code_step(&mut x, &p, out, &mut pos);
    }
    let mut states = [0u32; LANES];
    for (v, x) in x.iter().enumerate() {
        vst1q_u32(states.as_mut_ptr().add(4 * v), *x);
    }
    (states, pos)
}

/// `EncStage::get(present, ctx, sym)` as a packed symbol: the identity where the element is
/// absent from the stage or its context has no row (same indexing, so the same panics on a
/// context outside the map).
#[inline(always)]
fn packed(t: &EncStage, present: bool, ctx: usize, sym: usize) -> u32 {
    if !present {
        return PACKED_IDENTITY;
    }
    let at = (t.map[ctx] as usize) * t.alphabet + sym;
    t.packed.get(at).copied().unwrap_or(PACKED_IDENTITY)
}

/// Code one stage of one step: the 32 lanes' packed symbols `p` through `put`.
///
/// # Safety
/// As `put`'s: room for 32 words and the slack below `*pos`.
#[inline(always)]
unsafe fn code_step(x: &mut [uint32x4_t; NV], p: &[u32; LANES], out: *mut u16, pos: &mut usize) {
    let r: [u32; LANES] =
        std::array::from_fn(|k| RECIP[((p[k] & 0xFFFF) as usize).min(PROB_TOTAL as usize)]);
    let pv: [uint32x4_t; NV] = std::array::from_fn(|v| vld1q_u32(p.as_ptr().add(4 * v)));
    let rv: [uint32x4_t; NV] = std::array::from_fn(|v| vld1q_u32(r.as_ptr().add(4 * v)));
    put(x, pv, rv, out, pos);
}

/// Four elements' codes from their magnitudes `v` and sign masks `neg` (all-ones lanes):
/// `super::super::word::code` per lane, and the raw tails (the low `b - 3` bits of `v`,
/// none for `b < 4`) with their lengths.
#[inline(always)]
unsafe fn code_and_tail(v: uint32x4_t, neg: uint32x4_t) -> (uint32x4_t, uint32x4_t, uint32x4_t) {
    let one = vdupq_n_u32(1);
    // b = 32 - clz(v): 0 for v = 0.
    let b = vsubq_u32(vdupq_n_u32(32), vclzq_u32(v));
    // The bits below the leading one, by right shifts (negative counts); below b = 2 (or
    // 3) the bit is not there and the compare masks it.
    let sh1 = vreinterpretq_s32_u32(vqsubq_u32(b, vdupq_n_u32(2)));
    let len = vqsubq_u32(b, vdupq_n_u32(3));
    let q1 = vandq_u32(
        vcgtq_u32(b, one),
        vandq_u32(vshlq_u32(v, vnegq_s32(sh1)), one),
    );
    let q2 = vandq_u32(
        vcgtq_u32(b, vdupq_n_u32(2)),
        vandq_u32(vshlq_u32(v, vnegq_s32(vreinterpretq_s32_u32(len))), one),
    );
    let c = vorrq_u32(
        vorrq_u32(b, vshlq_n_u32::<7>(q1)),
        vorrq_u32(vshlq_n_u32::<8>(q2), vandq_u32(neg, vdupq_n_u32(1 << 9))),
    );
    // len <= 29: 1 << len does not overflow.
    let low = vsubq_u32(vshlq_u32(one, vreinterpretq_s32_u32(len)), one);
    (c, vandq_u32(v, low), len)
}

/// Two tails per 64-bit lane: `(t0 | t1 << l0, l0 + l1)` for lanes (0, 1) and (2, 3).
#[inline(always)]
unsafe fn pairs(t: uint32x4_t, len: uint32x4_t) -> (uint64x2_t, uint64x2_t) {
    let (t, len) = (vreinterpretq_u64_u32(t), vreinterpretq_u64_u32(len));
    let lo = vdupq_n_u64(0xFFFF_FFFF);
    let (t_lo, l_lo) = (vandq_u64(t, lo), vandq_u64(len, lo));
    let v = vorrq_u64(
        t_lo,
        vshlq_u64(vshrq_n_u64::<32>(t), vreinterpretq_s64_u64(l_lo)),
    );
    (v, vaddq_u64(l_lo, vshrq_n_u64::<32>(len)))
}

/// `d[at..at + cnt]` widened to 32 bits (`cnt <= 8`: two vectors), zeros past `cnt`: a
/// zero displacement has code 0 and no tail bits.
#[inline(always)]
unsafe fn load8<T: Copy + Default>(d: &[T], at: usize, cnt: usize) -> [T; 8] {
    let mut tmp = [T::default(); 8];
    tmp[..cnt].copy_from_slice(&d[at..at + cnt]);
    tmp
}

/// The first `cnt` of 8 codes into `out[at..]`.
#[inline(always)]
unsafe fn store8(out: &mut [u32], at: usize, cnt: usize, c: [uint32x4_t; 2]) {
    if cnt == 8 {
        vst1q_u32(out.as_mut_ptr().add(at), c[0]);
        vst1q_u32(out.as_mut_ptr().add(at + 4), c[1]);
    } else {
        let mut tmp = [0u32; 8];
        vst1q_u32(tmp.as_mut_ptr(), c[0]);
        vst1q_u32(tmp.as_mut_ptr().add(4), c[1]);
        out[at..at + cnt].copy_from_slice(&tmp[..cnt]);
    }
}

/// `codes(d, signed, out, Some(tail))` for 16-bit elements, 8 at a time: the tails (at most
/// 13 bits) merged to one value per four elements (at most 52 bits).
///
/// # Safety
/// The CPU must have NEON.
#[target_feature(enable = "neon")]
unsafe fn codes16(d: &[u16], signed: bool, out: &mut Vec<u32>, tail: &mut BitWriter) {
    let n = d.len();
    // Every slot is written below; no clearing memset when the buffer is already as long.
    out.truncate(n);
    out.resize(n, 0);
    for at in (0..n).step_by(8) {
        let cnt = (n - at).min(8);
        let raw = if cnt == 8 {
            vld1q_u16(d.as_ptr().add(at))
        } else {
            vld1q_u16(load8(d, at, cnt).as_ptr())
        };
        let mut c = [vdupq_n_u32(0); 2];
        let (mut vals, mut lens) = ([0u64; 2], [0u32; 2]);
        for (h, sd) in [
            vmovl_s16(vget_low_s16(vreinterpretq_s16_u16(raw))),
            vmovl_high_s16(vreinterpretq_s16_u16(raw)),
        ]
        .into_iter()
        .enumerate()
        {
            let (v, neg) = if signed {
                // |-32768| = 32768 fits: the 32-bit lanes hold the 16-bit magnitude exactly.
                (vreinterpretq_u32_s32(vabsq_s32(sd)), vcltzq_s32(sd))
            } else {
                // ZigZag of the 16-bit value, kept to 16 bits.
                let z = veorq_s32(vshlq_n_s32::<1>(sd), vshrq_n_s32::<31>(sd));
                (
                    vandq_u32(vreinterpretq_u32_s32(z), vdupq_n_u32(0xFFFF)),
                    vdupq_n_u32(0),
                )
            };
            let (code, t, len) = code_and_tail(v, neg);
            c[h] = code;
            let (v2, l2) = pairs(t, len);
            // Four tails of at most 13 bits: one value of at most 52.
            let (l0, l1) = (vgetq_lane_u64::<0>(l2), vgetq_lane_u64::<1>(l2));
            vals[h] = vgetq_lane_u64::<0>(v2) | vgetq_lane_u64::<1>(v2) << l0;
            lens[h] = (l0 + l1) as u32;
        }
        store8(out, at, cnt, c);
        tail.put_many(vals, lens);
    }
}

/// [`codes16`] for 32-bit elements: the tails (at most 29 bits) merged pairwise, so the bit
/// writer takes one value per two elements.
///
/// # Safety
/// The CPU must have NEON.
#[target_feature(enable = "neon")]
unsafe fn codes32(d: &[u32], signed: bool, out: &mut Vec<u32>, tail: &mut BitWriter) {
    let n = d.len();
    out.truncate(n);
    out.resize(n, 0);
    for at in (0..n).step_by(8) {
        let cnt = (n - at).min(8);
        let tmp;
        let p = if cnt == 8 {
            d.as_ptr().add(at)
        } else {
            tmp = load8(d, at, cnt);
            tmp.as_ptr()
        };
        let mut c = [vdupq_n_u32(0); 2];
        let (mut vals, mut lens) = ([0u64; 4], [0u32; 4]);
        for h in 0..2 {
            let sd = vreinterpretq_s32_u32(vld1q_u32(p.add(4 * h)));
            let (v, neg) = if signed {
                // |i32::MIN| wraps to 2^31: as unsigned, the right magnitude.
                (vreinterpretq_u32_s32(vabsq_s32(sd)), vcltzq_s32(sd))
            } else {
                let z = veorq_s32(vshlq_n_s32::<1>(sd), vshrq_n_s32::<31>(sd));
                (vreinterpretq_u32_s32(z), vdupq_n_u32(0))
            };
            let (code, t, len) = code_and_tail(v, neg);
            c[h] = code;
            let (v2, l2) = pairs(t, len);
            vals[2 * h] = vgetq_lane_u64::<0>(v2);
            vals[2 * h + 1] = vgetq_lane_u64::<1>(v2);
            lens[2 * h] = vgetq_lane_u64::<0>(l2) as u32;
            lens[2 * h + 1] = vgetq_lane_u64::<1>(l2) as u32;
        }
        store8(out, at, cnt, c);
        tail.put_many(vals, lens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Codes and tail bytes equal to the portable pass's, for every 16-bit pattern and
    /// random 32-bit ones, both layouts, at lengths that leave partial groups (on aarch64
    /// only: under qemu, `cargo test --lib --target aarch64-unknown-linux-gnu neon`).
    #[test]
    fn codes_and_tails_match_portable() {
        fn check<T: Word>(d: &[T]) {
            for signed in [false, true] {
                for len in [0, 1, 7, 8, 9, 31, d.len()] {
                    let d = &d[..len.min(d.len())];
                    let (mut want, mut want_t) = (Vec::new(), BitWriter::default());
                    codes(d, signed, &mut want, Some(&mut want_t));
                    let mut s = Scratch::default();
                    // SAFETY: NEON is baseline on aarch64.
                    unsafe { codes_and_tails(d, signed, &mut s) };
                    assert_eq!(s.codes, want, "{} bits, signed {signed}", T::BITS);
                    assert_eq!(s.tail.bits(), want_t.bits());
                    assert_eq!(s.tail.bytes(), want_t.bytes());
                }
            }
        }
        let all16: Vec<u16> = (0..=u16::MAX).collect();
        check(&all16);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut r32 = Vec::new();
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Every bit length: values shifted down by a random amount.
            r32.push(((x >> 32) as u32) >> (x & 31));
        }
        r32.extend([0, 1, 0x7fff_ffff, 0x8000_0000, 0x8000_0001, 0xffff_ffff]);
        check(&r32);
    }
}
