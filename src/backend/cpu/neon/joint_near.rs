//! NEON lanes of the Joint layout's neighbor form (`super::super::joint_near`), decoding:
//! eight 4-lane state vectors per step, as the `--fast` lanes (`joint`), with each lane's
//! context made from its facts and the code of the element `d` back (an earlier step's,
//! stored).
//!
//! What is vector and what is not, and why:
//! - the map indices are arithmetic on facts and earlier codes, four lanes at a time
//!   (`vmlaq_u32` for the two multiply-adds, compares for the bounds), for all 32 lanes of
//!   a step before any lookup: they do not depend on the states;
//! - the three lookups per lane (context -> row, slot -> symbol, symbol -> frequency and
//!   start) are scalar loads: NEON has no gathers, and the tables are far larger than the
//!   64 bytes a `vqtbl4q_u8` reaches (a row's slots alone are 4 KiB);
//! - the state update (one `vmlaq_u32`) and the refill (`joint::refill`: a `vqtbl1q_u8`
//!   keyed by the refill mask moves the next words to the lanes that take them) are
//!   vectors, in the portable lane order.

#![cfg(target_arch = "aarch64")]

use core::arch::aarch64::*;

use super::super::decode::{no_row, Stream};
use super::super::joint::{code_of_joint, JointDec};
use super::super::joint_near::NearSlots;
use super::joint::{overrun, refill, NV};
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::format::chunk::LANES;
use crate::Result;

/// Decode whole steps from `from` (whose first element has its neighbor: `from·LANES >=
/// d`) to the chunk's last whole step; returns the step it stopped at, for the portable
/// lanes to finish (`from` itself where the tables do not have the shapes these lanes
/// assume, `NearSlots::lane_shapes`). A corrupt stream gives the portable lanes' errors: a
/// context without a row (its step decodes nothing), the word stream ended early (checked
/// after each step, as the portable refill does). `st` must be padded with `LANES` words
/// past its length.
///
/// # Safety
/// NEON (`Isa::Neon` available).
#[target_feature(enable = "neon")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn decode_steps(
    table: &JointDec,
    near: &NearSlots,
    info: &[u16],
    codes: &mut [u32],
    states: &mut [u32; LANES],
    st: &mut Stream,
    d: usize,
    w1: usize,
    from: usize,
) -> Result<usize> {
    let n = codes.len().min(info.len());
    // The neighbor loads below read `codes[j - d]` for every `j >= from·LANES`: without
    // a neighbor for every lane (only ever where no whole step is left), none decoded here.
    // (Symbol-per-slot tables: bucketed ones are AVX2's.)
    let Some((n_rows, span)) = near
        .lane_shapes(table, w1, d)
        .filter(|_| from * LANES >= d && !near.bucketed())
    else {
        return Ok(from);
    };
    assert!(st.words.len() >= st.len + LANES && st.pos <= st.len);
    let words = st.words.as_ptr();
    let mut pos = st.pos;
    let mut x: [uint32x4_t; NV] = std::array::from_fn(|v| vld1q_u32(states.as_ptr().add(4 * v)));
    let lut = code_of_joint();
    let (map, syms, fs) = (table.map, &near.syms[..], &near.fs[..]);
    let window = near.window;
    let lo = vdupq_n_u32(window.lo);
    // `span > 0` (`lane_shapes`), so the window has a class and this does not wrap.
    let last_class = vdupq_n_u32(window.n - 1);
    let (m2_mul, span_v) = (vdupq_n_u32(w1 as u32 + 1), vdupq_n_u32(span as u32));
    // Below 2^31 and 2^19 (`lane_shapes`): exact as u32.
    let (map_len, rows_v) = (vdupq_n_u32(map.len() as u32), vdupq_n_u32(n_rows as u32));
    let mut step = from;
    while (step + 1) * LANES <= n {
        let base = step * LANES;
        // Rows first, all 32: they depend on the facts and earlier steps' codes, not on the
        // states, so their loads overlap one another and the previous step's arithmetic.
        let mut row = [0u32; LANES];
        let mut bad = vdupq_n_u32(0);
        for v in 0..NV {
            let j = base + 4 * v;
            // In bounds: `j + 4 <= n`, and `j >= from·LANES >= d` (checked above).
            let i = vmovl_u16(vld1_u16(info.as_ptr().add(j)));
            let c = vld1q_u32(codes.as_ptr().add(j - d));
            let nb = vandq_u32(c, vdupq_n_u32(127));
            // Sign state: 0 for b = 0, else 1 + neg (a code's neg bit is 0 where b = 0).
            let up = vaddq_u32(
                vminq_u32(nb, vdupq_n_u32(1)),
                vandq_u32(vshrq_n_u32::<9>(c), vdupq_n_u32(1)),
            );
            let m2 = vandq_u32(vshrq_n_u32::<9>(i), vdupq_n_u32(3));
            // near = (m2·(W1+1) + nb)·3 + up
            let nr = vmlaq_u32(up, vmlaq_u32(nb, m2, m2_mul), vdupq_n_u32(3));
            // The class within the window, `er - lo` (wrapped where er < lo), and the map
            // index `near·span + (er - lo)·2 + rs` (`Window::index`).
            let k = vsubq_u32(vandq_u32(i, vdupq_n_u32(255)), lo);
            let rs = vandq_u32(vshrq_n_u32::<8>(i), vdupq_n_u32(1));
            let idx = vmlaq_u32(vaddq_u32(vaddq_u32(k, k), rs), nr, span_v);
            // Refused, not read: a class outside the window (k above the last class,
            // unsigned) has no row, and an index past the map (which codes this decoder
            // wrote never give) is none either; such a lane reads entry 0 instead.
            let refused = vorrq_u32(vcgtq_u32(k, last_class), vcgeq_u32(idx, map_len));
            bad = vorrq_u32(bad, refused);
            vst1q_u32(row.as_mut_ptr().add(4 * v), vbicq_u32(idx, refused));
        }
        for r in row.iter_mut() {
            // In bounds: below `map.len()` (refused lanes read entry 0; the map is not
            // empty: `span > 0`).
            *r = *map.get_unchecked(*r as usize);
        }
        for v in 0..NV {
            // A row past the rows (`JointDec::NONE` among them) is none.
            let r = vld1q_u32(row.as_ptr().add(4 * v));
            bad = vorrq_u32(bad, vcgeq_u32(r, rows_v));
        }
        if vmaxvq_u32(bad) != 0 {
            return Err(no_row());
        }
        for v in 0..NV {
            let slot = vandq_u32(x[v], vdupq_n_u32(PROB_TOTAL - 1));
            let mut s = [0u32; 4];
            vst1q_u32(s.as_mut_ptr(), slot);
            // Per lane, the slot's symbol from its row's slots (`syms`, a byte each), then
            // the symbol's frequency and start from the row's array (`fs`).
            let mut e = [0u32; 4];
            for l in 0..4 {
                let (r, j) = (row[4 * v + l] as usize, base + 4 * v + l);
                // In bounds: `r < n_rows` (checked above), the slot below `PROB_TOTAL`, and
                // `syms` holds `n_rows·PROB_TOTAL` (+ 3) bytes (`lane_shapes`).
                let sym = *syms.get_unchecked(r << PROB_BITS | s[l] as usize) as usize;
                // In bounds: `fs` holds 256 entries per row, `sym < 256`.
                e[l] = *fs.get_unchecked(r << 8 | sym);
                codes[j] = lut[sym];
            }
            let e = vld1q_u32(e.as_ptr());
            // x' = freq·(x >> PROB_BITS) + slot - start (a slot's symbol has a frequency
            // of at least one and a start at most the slot).
            let xs = vmlaq_u32(
                vsubq_u32(slot, vshrq_n_u32::<16>(e)),
                vandq_u32(e, vdupq_n_u32(0xFFFF)),
                vshrq_n_u32::<{ PROB_BITS as i32 }>(x[v]),
            );
            // Vectors refill in lane order, as the portable lanes do. In bounds: `pos <=
            // st.len` at the step's start, at most 28 words taken before the last vector's
            // refill reads 4, and `LANES` words of padding.
            x[v] = refill(xs, words, &mut pos);
        }
        if pos > st.len {
            return Err(overrun());
        }
        step += 1;
    }
    for (v, xv) in x.iter().enumerate() {
        vst1q_u32(states.as_mut_ptr().add(4 * v), *xv);
    }
    st.pos = pos;
    Ok(step)
}
