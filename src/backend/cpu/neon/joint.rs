//! NEON lanes of the Joint layout (`--fast`): `super::super::joint`'s decode and encode
//! lanes, eight 4-lane vectors per chunk (the encode lanes also code the layout's neighbor
//! form, over its packed-table entries). The encoder's division by the frequency is exact
//! integer arithmetic: a 32-bit reciprocal, one widening multiply (`vmull_u32`), one
//! correction by the remainder.

#![cfg(target_arch = "aarch64")]

use core::arch::aarch64::*;

use super::super::decode::{no_row, Stream};
use super::super::encode::Scratch;
use super::super::joint::{code_of_joint, context, JointDec, JointFlat, FLAT_STRIDE};
use super::super::joint_near::packed_indices;
use super::super::tables::{EncStage, PACKED_IDENTITY};
use super::super::word::Word;
use super::encode::codes_and_tails;
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::entropy::rans::RANS_L;
use crate::format::chunk::{EncodedChunk, LANES};
use crate::{Error, Result};

/// 4-lane vectors per chunk.
pub(super) const NV: usize = LANES / 4;

/// Words kept below the stream in the encoder's word buffer: [`put`] stores 4-word blocks
/// that end at the cursor, so up to 3 words under the lowest stream word are written too.
pub(super) const SLACK: usize = 4;

pub(super) fn overrun() -> Error {
    Error::format(
        "tensor blob chunk",
        "rANS word stream ended early".to_string(),
    )
}

/// The lane bits of a 4-lane compare result: 1, 2, 4, 8 (NEON has no `movemask`).
#[inline(always)]
unsafe fn mask4(m: uint32x4_t) -> usize {
    const BITS: [u32; 4] = [1, 2, 4, 8];
    vaddvq_u32(vandq_u32(m, vld1q_u32(BITS.as_ptr()))) as usize
}

/// For each 4-bit refill mask, `vqtbl1q_u8` indices that move word `k` of the next four
/// (widened to `u32`) to the `k`-th refilling lane; other lanes read zeros (index 255) and
/// are blended away.
static EXPAND: [[u8; 16]; 16] = {
    let mut t = [[255u8; 16]; 16];
    let mut m = 0;
    while m < 16 {
        let (mut k, mut l) = (0u8, 0);
        while l < 4 {
            if (m >> l) & 1 == 1 {
                let mut b = 0;
                while b < 4 {
                    t[m][4 * l + b] = 4 * k + b as u8;
                    b += 1;
                }
                k += 1;
            }
            l += 1;
        }
        m += 1;
    }
    t
};

/// Refill the lanes of `x` whose state fell below `RANS_L` (= 2^16: its top half is zero)
/// from the stream, in lane order.
///
/// # Safety
/// `words[*pos..*pos + 4]` must be readable.
#[inline(always)]
pub(super) unsafe fn refill(x: uint32x4_t, words: *const u16, pos: &mut usize) -> uint32x4_t {
    let need = vceqzq_u32(vshrq_n_u32::<16>(x));
    let m = mask4(need);
    let w = vreinterpretq_u8_u32(vmovl_u16(vld1_u16(words.add(*pos))));
    let w = vreinterpretq_u32_u8(vqtbl1q_u8(w, vld1q_u8(EXPAND[m].as_ptr())));
    *pos += m.count_ones() as usize;
    vbslq_u32(need, vorrq_u32(vshlq_n_u32::<16>(x), w), x)
}

/// Decode whole steps of the chunk from its start, as the AVX2 `decode` does (same
/// arguments, same result): the number of elements decoded (0 where this path does not
/// apply), their per-element codes in `codes`, the lanes' states and the stream's position
/// moved past them.
///
/// # Safety
/// The CPU must have NEON; unless `guarded`, `st.words` must hold `LANES` padding words past
/// `st.len`.
#[target_feature(enable = "neon")]
pub unsafe fn decode<T: Word>(
    table: &JointDec,
    reference: &[u8],
    (mant, emask): (u32, u32),
    codes: &mut [u32],
    states: &mut [u32; LANES],
    st: &mut Stream,
    guarded: bool,
) -> Result<usize> {
    let n = codes.len().min(reference.len() / T::SIZE);
    let full = n / LANES * LANES;
    if full == 0 || !table.vector_ok || T::BITS > 32 {
        return Ok(0);
    }
    assert!(st.words.len() >= st.len + if guarded { 0 } else { LANES } && st.pos <= st.len);
    let words = st.words.as_ptr();
    let mut pos = st.pos;
    let mut x = [vdupq_n_u32(0); NV];
    for (v, xv) in x.iter_mut().enumerate() {
        *xv = vld1q_u32(states.as_ptr().add(4 * v));
    }
    let lut = code_of_joint();
    let (map, slots) = (table.map, &table.slots[..]);
    let mut done = 0;
    while done < full {
        if guarded && st.len - pos < LANES {
            break;
        }
        let base = done;
        // Each lane's row, from the J context of its reference element (`er·2 + rs`).
        let mut row = [0u32; LANES];
        for (k, r) in row.iter_mut().enumerate() {
            let e = T::read(&reference[(base + k) * T::SIZE..][..T::SIZE]) as u32;
            let ctx = ((e >> mant) & emask) << 1 | e >> (T::BITS - 1);
            // In bounds: contexts are below 512 <= `map.len()` (`vector_ok`).
            *r = *map.get_unchecked(ctx as usize);
        }
        if row.contains(&JointDec::NONE) {
            return Err(no_row());
        }
        for v in 0..NV {
            let mut slot = [0u32; 4];
            vst1q_u32(
                slot.as_mut_ptr(),
                vandq_u32(x[v], vdupq_n_u32(PROB_TOTAL - 1)),
            );
            let mut e = [0u32; 4];
            for l in 0..4 {
                // In bounds: rows are below the row count (`vector_ok`), slots below 2^12.
                let at = (row[4 * v + l] as usize) << PROB_BITS | slot[l] as usize;
                e[l] = *slots.get_unchecked(at);
                codes[base + 4 * v + l] = lut[(e[l] & 255) as usize];
            }
            let e = vld1q_u32(e.as_ptr());
            let f = vaddq_u32(
                vandq_u32(vshrq_n_u32::<8>(e), vdupq_n_u32(0xFFF)),
                vdupq_n_u32(1),
            );
            let xs = vmlaq_u32(
                vshrq_n_u32::<20>(e),
                f,
                vshrq_n_u32::<{ PROB_BITS as i32 }>(x[v]),
            );
            // Vectors refill in lane order, as the portable lanes do. In bounds: `LANES`
            // words are left (`guarded`) or padded.
            x[v] = refill(xs, words, &mut pos);
        }
        if pos > st.len {
            return Err(overrun());
        }
        done += LANES;
    }
    for (v, xv) in x.iter().enumerate() {
        vst1q_u32(states.as_mut_ptr().add(4 * v), *xv);
    }
    st.pos = pos;
    Ok(done)
}

/// One chunk, as `super::super::joint::encode_chunk` codes it, with NEON lanes.
///
/// # Safety
/// The CPU must have NEON (`Isa::Neon` available).
#[target_feature(enable = "neon")]
pub unsafe fn encode_chunk<T: Word>(
    d: &[T],
    info: &[u16],
    flat: &JointFlat,
    s: &mut Scratch,
) -> EncodedChunk {
    codes_and_tails(d, true, s);
    let (states, at) = lanes(&s.codes, info, flat, &mut s.words);
    s.chunk(at..SLACK + s.codes.len(), states)
}

/// One chunk of the Joint layout's neighbor form (`super::super::joint_near`): codes and
/// tails by the NEON pass, each element's entry in `table.packed` by the portable
/// `packed_indices` (map indices by a loop that vectorizes, then rows and symbols), then
/// these lanes over those entries, as the AVX2 encoder does.
///
/// # Safety
/// The CPU must have NEON (`Isa::Neon` available).
#[target_feature(enable = "neon")]
pub unsafe fn encode_near_chunk<T: Word>(
    d: &[T],
    info: &[u16],
    table: &EncStage,
    distance: usize,
    w1: usize,
    s: &mut Scratch,
) -> EncodedChunk {
    codes_and_tails(d, true, s);
    packed_indices(info, table, distance, w1, &mut s.codes, &mut s.idx);
    let packed = &table.packed;
    let (states, at) = lanes_by(s.codes.len(), &mut s.words, |j| {
        // An entry past the table codes the identity (the last row's), as on x86.
        packed
            .get(s.codes[j] as usize)
            .copied()
            .unwrap_or(PACKED_IDENTITY)
    });
    s.chunk(at..SLACK + s.codes.len(), states)
}

/// `min(2^32 / f, 2^32 - 1)` for every frequency `f` (index 0 unused): `(y · r) >> 32` is
/// `y / f` or one below it for every `y < 2^32` (the error `y·(2^32/f - r) / 2^32` is
/// below one), which one remainder test corrects.
pub(super) static RECIP: [u32; PROB_TOTAL as usize + 1] = {
    let mut t = [u32::MAX; PROB_TOTAL as usize + 1];
    let mut f = 2;
    while f <= PROB_TOTAL as usize {
        t[f] = ((1u64 << 32) / f as u64) as u32;
        f += 1;
    }
    t
};

/// The interleaved lanes of one chunk; the words are left in `words[at..SLACK +
/// codes.len()]` in stream order, `at` returned with the final states.
#[target_feature(enable = "neon")]
unsafe fn lanes(
    codes: &[u32],
    info: &[u16],
    flat: &JointFlat,
    words: &mut Vec<u16>,
) -> ([u32; LANES], usize) {
    let n = codes.len();
    assert!(info.len() >= n);
    let lo2 = 2 * flat.lo as usize;
    lanes_by(n, words, |j| {
        let (c, i) = (codes[j] as usize, info[j]);
        // ((er - lo)·2 + rs)·FLAT_STRIDE + b·8 + (code >> 7 & 7)
        let idx = (context(i).wrapping_sub(lo2))
            .wrapping_mul(FLAT_STRIDE)
            .wrapping_add((c & 127) * 8 + (c >> 7 & 7));
        flat.packed.get(idx).copied().unwrap_or(PACKED_IDENTITY)
    })
}

/// The interleaved lanes of one chunk of `n` elements whose packed symbols (`freq | start
/// << 16`) `packed(j)` gives; words and states as [`lanes`].
#[inline(always)]
unsafe fn lanes_by(
    n: usize,
    words: &mut Vec<u16>,
    packed: impl Fn(usize) -> u32,
) -> ([u32; LANES], usize) {
    // At most one word per symbol, and the slack below. Grown, never cleared: every slot
    // from the final cursor up is written.
    let end = SLACK + n;
    if words.len() < end {
        words.resize(end, 0);
    }
    let out = words.as_mut_ptr();
    let mut pos = end;
    let mut x = [vdupq_n_u32(RANS_L); NV];
    for step in (0..n.div_ceil(LANES)).rev() {
        let base = step * LANES;
        let lanes = LANES.min(n - base);
        // Lanes past the chunk's end code the identity.
        let (mut p, mut r) = ([PACKED_IDENTITY; LANES], [0u32; LANES]);
        for (k, p) in p[..lanes].iter_mut().enumerate() {
            *p = packed(base + k);
        }
        for (r, &p) in r.iter_mut().zip(&p) {
            *r = RECIP[((p & 0xFFFF) as usize).min(PROB_TOTAL as usize)];
        }
        let pv: [uint32x4_t; NV] = std::array::from_fn(|v| vld1q_u32(p.as_ptr().add(4 * v)));
        let rv: [uint32x4_t; NV] = std::array::from_fn(|v| vld1q_u32(r.as_ptr().add(4 * v)));
        // `pos` never drops below `SLACK`: one word at most per symbol.
        put(&mut x, pv, rv, out, &mut pos);
    }
    let mut states = [0u32; LANES];
    for (v, x) in x.iter().enumerate() {
        vst1q_u32(states.as_mut_ptr().add(4 * v), *x);
    }
    (states, pos)
}

/// `(y / f, y % f)` per lane, exactly, for any `y` and `f` in `1..=PROB_TOTAL` (`r`:
/// `RECIP[f]`): the high half of `y·r` is the quotient or one below it, and the remainder
/// says which.
#[inline(always)]
unsafe fn divide(y: uint32x4_t, f: uint32x4_t, r: uint32x4_t) -> (uint32x4_t, uint32x4_t) {
    let lo = vmull_u32(vget_low_u32(y), vget_low_u32(r));
    let hi = vmull_high_u32(y, r);
    let q0 = vuzp2q_u32(vreinterpretq_u32_u64(lo), vreinterpretq_u32_u64(hi));
    let rem = vmlsq_u32(y, q0, f);
    let over = vcgeq_u32(rem, f);
    // All-ones lanes are -1: subtracting adds one.
    (vsubq_u32(q0, over), vsubq_u32(rem, vandq_u32(over, f)))
}

/// `vtbl1_u8` indices by flush mask: the words of the lanes set in the mask moved, in lane
/// order, to the top of the 4 words (the rest zeroed, and never part of the stream).
static COMPRESS: [[u8; 8]; 16] = {
    let mut t = [[255u8; 8]; 16];
    let mut m = 0;
    while m < 16 {
        let mut slot = 4 - (m as u32).count_ones() as usize;
        let mut lane = 0;
        while lane < 4 {
            if (m >> lane) & 1 == 1 {
                t[m][2 * slot] = 2 * lane as u8;
                t[m][2 * slot + 1] = 2 * lane as u8 + 1;
                slot += 1;
            }
            lane += 1;
        }
        m += 1;
    }
    t
};

/// One (step) of rANS encoding over lanes 31..=0 (`p`: the packed symbols `freq | start <<
/// 16`, `r`: their frequencies' [`RECIP`]): per lane `enc_put`, the flushed words stored
/// below `*pos` in lane order.
///
/// # Safety
/// `out[*pos - SLACK..*pos]` must be inside the buffer, with room below `*pos` for every word
/// this call flushes (at most 32) and the `SLACK` under them.
#[inline(always)]
pub(super) unsafe fn put(
    x: &mut [uint32x4_t; NV],
    p: [uint32x4_t; NV],
    r: [uint32x4_t; NV],
    out: *mut u16,
    pos: &mut usize,
) {
    let f = p.map(|p| vandq_u32(p, vdupq_n_u32(0xFFFF)));
    // Lanes that keep their state: x < freq << 20, as x >> 20 < freq; the identity's freq
    // 2^12 never flushes.
    let keep: [uint32x4_t; NV] = std::array::from_fn(|h| vcgtq_u32(f[h], vshrq_n_u32::<20>(x[h])));
    for h in (0..NV).rev() {
        let k = mask4(vmvnq_u32(keep[h]));
        let cnt = k.count_ones() as usize;
        *pos -= cnt;
        // The low words of the 4 lanes, the flushed ones moved to the top, stored as a
        // block ending at the old cursor; what it writes below `*pos` is overwritten by
        // later words or left outside the stream.
        let w = vreinterpret_u8_u16(vmovn_u32(x[h]));
        let w = vtbl1_u8(w, vld1_u8(COMPRESS[k].as_ptr()));
        vst1_u16(out.add(*pos + cnt - 4), vreinterpret_u16_u8(w));
    }
    for h in 0..NV {
        let y = vbslq_u32(keep[h], x[h], vshrq_n_u32::<16>(x[h]));
        let (q, rem) = divide(y, f[h], r[h]);
        // C(y) = y + start + q·(2^PROB_BITS - freq) = q·2^PROB_BITS + (y - q·freq) + start
        // (below 2^32: q < 2^20 once flushed).
        x[h] = vaddq_u32(
            vaddq_u32(vshlq_n_u32::<{ PROB_BITS as i32 }>(q), rem),
            vshrq_n_u32::<16>(p[h]),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact division for every frequency, at the quotient's edges (multiples of `f` and
    /// one below them), at the largest state the encoder divides (`f << 20`, minus one) and
    /// at `u32::MAX` (on aarch64 only: under qemu, `cargo test --lib --target
    /// aarch64-unknown-linux-gnu neon`).
    #[test]
    fn divide_is_exact_for_every_frequency() {
        for f in 1..=PROB_TOTAL {
            let mut ys = vec![0u32, 1, f - 1, f, f + 1, u32::MAX, u32::MAX - 1];
            let top = ((f as u64) << 20).min(1 << 32) as u32 as u64;
            for k in [1u64, 2, 3, 1000, (1 << 20) - 1, 1 << 19] {
                for y in [k * f as u64 - 1, k * f as u64, k * f as u64 + 1] {
                    ys.push(y.min(u32::MAX as u64) as u32);
                }
            }
            ys.extend([top.wrapping_sub(1) as u32, top.wrapping_sub(2) as u32]);
            for y in ys.chunks(4) {
                let mut lanes = [0u32; 4];
                lanes[..y.len()].copy_from_slice(y);
                let (mut q, mut rem) = ([0u32; 4], [0u32; 4]);
                // SAFETY: NEON is baseline on aarch64; 4 lanes into 4-lane arrays.
                unsafe {
                    let (vq, vr) = divide(
                        vld1q_u32(lanes.as_ptr()),
                        vdupq_n_u32(f),
                        vdupq_n_u32(RECIP[f as usize]),
                    );
                    vst1q_u32(q.as_mut_ptr(), vq);
                    vst1q_u32(rem.as_mut_ptr(), vr);
                }
                for l in 0..4 {
                    assert_eq!(
                        (q[l], rem[l]),
                        (lanes[l] / f, lanes[l] % f),
                        "{} / {f}",
                        lanes[l]
                    );
                }
            }
        }
    }
}
