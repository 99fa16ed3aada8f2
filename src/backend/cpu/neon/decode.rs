//! The NEON tail pass: raw tails and the inverse transform, from the per-element codes every
//! layout decodes to. Each function here must equal the portable loop at the end of
//! `super::super::decode::finish` (`BitReader::take`, `word::compose`,
//! `word::displacement`, the key addition) element for element, and use as many tail bits.
//!
//! Four elements per vector: each tail's bit offset is an exclusive prefix sum of the
//! lengths (two lane shifts, `vextq_u32`), its bits are gathered from a 16-byte window that
//! holds the whole group's tails by one byte table lookup (`vqtbl1q_u8`, where x86 uses a
//! byte shuffle), and the value is rebuilt with one signed variable shift (`vshlq_u32`
//! shifts left by `b - 3`, or right where that is negative: `compose`'s two cases at once).

#![cfg(target_arch = "aarch64")]

use core::arch::aarch64::*;
use std::mem::MaybeUninit;

/// Bit offsets of 4 consecutive raw tails of lengths `len`, relative to the first (an
/// exclusive prefix sum across the lanes), and their total length.
#[inline(always)]
unsafe fn tail_offsets(len: uint32x4_t) -> (uint32x4_t, u32) {
    let zero = vdupq_n_u32(0);
    // Inclusive sums: add the lanes one, then two below.
    let p = vaddq_u32(len, vextq_u32::<3>(zero, len));
    let p = vaddq_u32(p, vextq_u32::<2>(zero, p));
    (vsubq_u32(p, len), vgetq_lane_u32::<3>(p))
}

/// `vqtbl1q_u8` indices of the four bytes from each lane's byte offset `byte` (below 16):
/// the offset copied to the lane's four bytes, plus 0, 1, 2, 3 (plus `add`).
#[inline(always)]
unsafe fn spread(byte: uint32x4_t, add: u32) -> uint8x16_t {
    vreinterpretq_u8_u32(vmlaq_u32(vdupq_n_u32(add), byte, vdupq_n_u32(0x0101_0101)))
}

/// The displacements of 4 elements (32-bit lanes, before masking to the element width)
/// from their codes `c`, bit lengths `b` and raw tails `t`: `word::compose`, then
/// `word::displacement`.
#[inline(always)]
unsafe fn displacement(c: uint32x4_t, b: uint32x4_t, t: uint32x4_t, signed: bool) -> uint32x4_t {
    let one = vdupq_n_u32(1);
    // The leading one and q1, q2 as `1 q1 q2`, moved to the top of a b-bit value: left by
    // b - 3, or right by 3 - b below b = 3 (a negative count shifts right).
    let top = vorrq_u32(
        vdupq_n_u32(4),
        vorrq_u32(
            vandq_u32(vshrq_n_u32::<6>(c), vdupq_n_u32(2)),
            vandq_u32(vshrq_n_u32::<8>(c), one),
        ),
    );
    let sh = vsubq_s32(vreinterpretq_s32_u32(b), vdupq_n_s32(3));
    let v = vorrq_u32(vshlq_u32(top, sh), t);
    if signed {
        let neg = vtstq_u32(c, vdupq_n_u32(1 << 9));
        vbslq_u32(
            neg,
            vreinterpretq_u32_s32(vnegq_s32(vreinterpretq_s32_u32(v))),
            v,
        )
    } else {
        // ZigZag: (v >> 1) ^ -(v & 1)
        veorq_u32(
            vshrq_n_u32::<1>(v),
            vreinterpretq_u32_s32(vnegq_s32(vreinterpretq_s32_u32(vandq_u32(v, one)))),
        )
    }
}

/// Raw tails and the inverse transform for 16-bit elements, 4 at a time: the group's tails
/// (at most 7 + 4 × 13 bits) lie in the 16 bytes from the first one's byte, each lane's
/// 7 + 13 bits in the 4 bytes from its own (byte offset at most 5). Does every whole group
/// of 4 while 16 tail bytes are left and returns how many elements and tail bits it used.
///
/// # Safety
/// The CPU must have NEON; `tail` must hold the `need` bits the codes' lengths sum to
/// (checked by the caller).
#[target_feature(enable = "neon")]
pub unsafe fn finish_u16(
    codes: &[u32],
    reference: &[u8],
    out: &mut [MaybeUninit<u8>],
    tail: &[u8],
    signed: bool,
) -> (usize, u64) {
    let n = codes.len().min(reference.len() / 2).min(out.len() / 2);
    let full = n / 4 * 4;
    let one = vdupq_n_u32(1);
    let mut bits = 0u64;
    for j in (0..full).step_by(4) {
        // The tail is not padded: where the window could pass its end, the caller's scalar
        // pass does the rest.
        let at = (bits / 8) as usize;
        if tail.len().saturating_sub(at) < 16 {
            return (j, bits);
        }
        let c = vld1q_u32(codes.as_ptr().add(j));
        let b = vandq_u32(c, vdupq_n_u32(127));
        // max(b - 3, 0), at most 13 (never more than the caller's `need` counts).
        let len = vminq_u32(vqsubq_u32(b, vdupq_n_u32(3)), vdupq_n_u32(13));
        let (off, total) = tail_offsets(len);
        let off = vaddq_u32(off, vdupq_n_u32((bits % 8) as u32));
        let window = vld1q_u8(tail.as_ptr().add(at));
        let raw = vreinterpretq_u32_u8(vqtbl1q_u8(
            window,
            spread(vshrq_n_u32::<3>(off), 0x0302_0100),
        ));
        let sh = vreinterpretq_s32_u32(vandq_u32(off, vdupq_n_u32(7)));
        let raw = vshlq_u32(raw, vnegq_s32(sh));
        let t = vandq_u32(
            raw,
            vsubq_u32(vshlq_u32(one, vreinterpretq_s32_u32(len)), one),
        );
        bits += total as u64;
        // In 16-bit lanes the key arithmetic wraps at the element width by itself.
        let delta = vmovn_u32(displacement(c, b, t, signed));
        let r = vld1_u16(reference.as_ptr().add(2 * j).cast());
        // key(r) = r ^ (negative ? 0xFFFF : 0x8000), and back.
        let h = vdup_n_u16(0x8000);
        let r_neg = vreinterpret_u16_s16(vshr_n_s16::<15>(vreinterpret_s16_u16(r)));
        let k = vadd_u16(veor_u16(r, vorr_u16(r_neg, h)), delta);
        let k_pos = vreinterpret_u16_s16(vshr_n_s16::<15>(vreinterpret_s16_u16(k)));
        let x = veor_u16(k, vorr_u16(vmvn_u16(k_pos), h));
        vst1_u16(out.as_mut_ptr().add(2 * j).cast(), x);
    }
    (full, bits)
}

/// [`finish_u16`] for 32-bit elements: the group's tails (at most 7 + 4 × 29 bits) still
/// lie in 16 bytes, each lane's 7 + 29 bits in the five bytes from its own (byte offset at
/// most 11): the first four by one lookup, the fifth by another.
///
/// # Safety
/// The CPU must have NEON; `tail` must hold the `need` bits the codes' lengths sum to
/// (checked by the caller).
#[target_feature(enable = "neon")]
pub unsafe fn finish_u32(
    codes: &[u32],
    reference: &[u8],
    out: &mut [MaybeUninit<u8>],
    tail: &[u8],
    signed: bool,
) -> (usize, u64) {
    let n = codes.len().min(reference.len() / 4).min(out.len() / 4);
    let full = n / 4 * 4;
    let one = vdupq_n_u32(1);
    let mut bits = 0u64;
    for j in (0..full).step_by(4) {
        let at = (bits / 8) as usize;
        if tail.len().saturating_sub(at) < 16 {
            return (j, bits);
        }
        let c = vld1q_u32(codes.as_ptr().add(j));
        let b = vandq_u32(c, vdupq_n_u32(127));
        // max(b - 3, 0): at most 29 for b <= 32 (and never more than `need` counts).
        let len = vminq_u32(vqsubq_u32(b, vdupq_n_u32(3)), vdupq_n_u32(29));
        let (off, total) = tail_offsets(len);
        let off = vaddq_u32(off, vdupq_n_u32((bits % 8) as u32));
        let window = vld1q_u8(tail.as_ptr().add(at));
        let byte = vshrq_n_u32::<3>(off);
        let low4 = vreinterpretq_u32_u8(vqtbl1q_u8(window, spread(byte, 0x0302_0100)));
        // The fifth byte alone in the lane's low byte: indices 4, then three out of range
        // (255 + the offset stays at or above 16: zeros).
        let fifth = vreinterpretq_u32_u8(vqtbl1q_u8(window, spread(byte, 0xF0F0_F004)));
        let sh = vreinterpretq_s32_u32(vandq_u32(off, vdupq_n_u32(7)));
        // A left shift by 32 (sh = 0) gives 0: the tail then lies in `low4` alone.
        let raw = vorrq_u32(
            vshlq_u32(low4, vnegq_s32(sh)),
            vshlq_u32(fifth, vsubq_s32(vdupq_n_s32(32), sh)),
        );
        let t = vandq_u32(
            raw,
            vsubq_u32(vshlq_u32(one, vreinterpretq_s32_u32(len)), one),
        );
        bits += total as u64;
        let delta = displacement(c, b, t, signed);
        let r = vld1q_u32(reference.as_ptr().add(4 * j).cast());
        // key(r) = r ^ (negative ? !0 : 1 << 31), and back.
        let h = vdupq_n_u32(1 << 31);
        let r_neg = vreinterpretq_u32_s32(vshrq_n_s32::<31>(vreinterpretq_s32_u32(r)));
        let k = vaddq_u32(veorq_u32(r, vorrq_u32(r_neg, h)), delta);
        let k_pos = vreinterpretq_u32_s32(vshrq_n_s32::<31>(vreinterpretq_s32_u32(k)));
        let x = veorq_u32(k, vorrq_u32(vmvnq_u32(k_pos), h));
        vst1q_u32(out.as_mut_ptr().add(4 * j).cast(), x);
    }
    (full, bits)
}

#[cfg(test)]
mod tests {
    use super::super::super::word::{self, Word};
    use super::*;
    use crate::format::bits::BitReader;

    /// The portable loop of `decode::finish` from element `from` and tail bit `consumed` on.
    fn scalar<T: Word>(
        codes: &[u32],
        reference: &[u8],
        out: &mut [u8],
        tail: &[u8],
        signed: bool,
        from: usize,
        consumed: u64,
    ) -> u64 {
        let mut tail = BitReader::new(tail);
        tail.consumed = consumed;
        for j in from..codes.len() {
            let code = codes[j];
            let t = tail.take::<false>((code & 127).saturating_sub(3));
            let v = word::compose(code, t);
            let delta = word::displacement::<T>(v, (code >> 9) & 1 != 0, signed);
            let r = T::read(&reference[j * T::SIZE..][..T::SIZE]);
            let x = word::from_key::<T>(word::key::<T>(r).wrapping_add(delta) & word::mask::<T>());
            T::write(x, &mut out[j * T::SIZE..][..T::SIZE]);
        }
        tail.consumed
    }

    /// Random codes (every bit length of the width, random q and sign bits), tails and
    /// references: the NEON pass, finished by the portable loop where it stops, gives the
    /// portable loop's bytes and tail bit count (on aarch64 only: under qemu, `cargo test
    /// --lib --target aarch64-unknown-linux-gnu neon`).
    #[test]
    fn finish_matches_portable() {
        fn check<T: Word>(seed: u64) {
            let mut x = seed;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            for n in [0usize, 1, 3, 4, 5, 33, 1000, 4099] {
                let codes: Vec<u32> = (0..n)
                    .map(|_| {
                        let r = next();
                        (r % (T::BITS as u64 + 1)) as u32 | ((r >> 32) as u32 & 7) << 7
                    })
                    .collect();
                let need: u64 = codes
                    .iter()
                    .map(|&c| (c & 127).saturating_sub(3) as u64)
                    .sum();
                let tail: Vec<u8> = (0..need.div_ceil(8)).map(|_| next() as u8).collect();
                let reference: Vec<u8> = (0..n * T::SIZE).map(|_| next() as u8).collect();
                for signed in [false, true] {
                    let mut want = vec![0u8; n * T::SIZE];
                    let bits = scalar::<T>(&codes, &reference, &mut want, &tail, signed, 0, 0);
                    assert_eq!(bits, need);
                    let mut got = vec![MaybeUninit::new(0u8); n * T::SIZE];
                    // SAFETY: NEON is baseline on aarch64; `tail` holds `need` bits.
                    let (done, used) = unsafe {
                        if T::BITS == 16 {
                            finish_u16(&codes, &reference, &mut got, &tail, signed)
                        } else {
                            finish_u32(&codes, &reference, &mut got, &tail, signed)
                        }
                    };
                    assert!(n < 64 || done > 0, "the vector pass ran");
                    // SAFETY: `MaybeUninit<u8>` and `u8` share a layout; all initialized.
                    let mut got: Vec<u8> = got.iter().map(|b| unsafe { b.assume_init() }).collect();
                    let bits = scalar::<T>(&codes, &reference, &mut got, &tail, signed, done, used);
                    assert_eq!(bits, need, "{} bits, n {n}", T::BITS);
                    assert_eq!(got, want, "{} bits, n {n}, signed {signed}", T::BITS);
                }
            }
        }
        for seed in 1..20 {
            check::<u16>(0x9e37_79b9_7f4a_7c15 ^ seed);
            check::<u32>(0x2545_f491_4f6c_dd1d ^ seed);
        }
    }
}
