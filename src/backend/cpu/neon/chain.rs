//! NEON lane decode of the Paper and Signed layouts (the default layout's B, Q1, Q2 and S
//! stages): every whole step of a chunk as `super::super::decode::Lanes::step` decodes it,
//! on eight 4-lane `u32` vectors. Same tables, same contexts, same order of state updates and
//! refills as the portable step, so the same codes, states and stream position.
//!
//! Shaped for a 4-lane core rather than copied from the x86 decoders:
//! - B's symbol is how many of the lane's row of starts are at or below its slot. Each lane
//!   compares its row (one to eight 8 × `u16` registers) with its own slot, duplicated from
//!   the slot vector's lane (`vdupq_lane_u16`, no trip through a general register); the four
//!   lanes' all-ones results are then folded by pairwise adds (`vpaddq_u16`) into one vector
//!   that holds each lane's count, ready for the state arithmetic. x86 turns each lane's
//!   compare into a bit mask and counts its bits in a general register, one lane at a time.
//! - Lookups by index (B's frequency and start, the f0 of Q1, Q2 and S): NEON has no gather,
//!   so four lane loads (`vld1q_lane_u32`). Every index a context can form is inside the
//!   tables (`vector_tables_fit`), so lanes absent from a stage load too and are blended to
//!   the identity afterwards: no branch per lane.
//! - The refill is the Joint lanes' ([`super::joint::refill`]): the next four words moved to
//!   the refilling lanes by one byte table lookup (`vqtbl1q_u8`) keyed by the 4-bit mask.

#![cfg(target_arch = "aarch64")]

use core::arch::aarch64::*;

use super::super::decode::{no_row, Stream};
use super::super::tables::{vector_tables_fit, DecStage, NO_ROW};
use super::super::word::Word;
use super::joint::{overrun, refill, NV};
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::format::chunk::LANES;
use crate::Result;

const SLOT_MASK: u32 = PROB_TOTAL - 1;

/// `[table[idx[0]], .., table[idx[3]]]`: NEON's gather, one lane load each.
///
/// # Safety
/// Every index must be inside the table.
#[inline(always)]
unsafe fn gather(table: *const u32, idx: uint32x4_t) -> uint32x4_t {
    let v = vdupq_n_u32(0);
    let v = vld1q_lane_u32::<0>(table.add(vgetq_lane_u32::<0>(idx) as usize), v);
    let v = vld1q_lane_u32::<1>(table.add(vgetq_lane_u32::<1>(idx) as usize), v);
    let v = vld1q_lane_u32::<2>(table.add(vgetq_lane_u32::<2>(idx) as usize), v);
    vld1q_lane_u32::<3>(table.add(vgetq_lane_u32::<3>(idx) as usize), v)
}

/// Whether any lane of `m` (all-ones lanes) is set.
#[inline(always)]
unsafe fn any(m: uint32x4_t) -> bool {
    vmaxvq_u32(m) != 0
}

/// Minus the number of `row`'s `N` starts at or below `slot` (all lanes equal), spread over
/// the eight `u16` lanes (each lane sums the compares of its position, -1 for each start
/// counted; the count is at most 64, so nothing wraps past the final negation).
#[inline(always)]
unsafe fn minus_count<const N: usize>(row: *const u16, slot: uint16x8_t) -> uint16x8_t {
    let mut acc = vdupq_n_u16(0);
    for k in (0..N).step_by(8) {
        acc = vaddq_u16(acc, vcleq_u16(vld1q_u16(row.add(k)), slot));
    }
    acc
}

/// The B symbols of four lanes: how many of lane `l`'s row of `N` starts (`rows[l]`) are at
/// or below its slot (lane `l` of `slot`). Equals the portable step's count
/// (`row.iter().map(|&s| (s as u32 <= slot) as usize).sum()`): starts are at most
/// `PROB_TOTAL` and slots below it, so 16-bit unsigned compares are exact.
#[inline(always)]
unsafe fn count_le4<const N: usize>(rows: [*const u16; 4], slot: uint32x4_t) -> uint32x4_t {
    let s = vmovn_u32(slot);
    let a0 = minus_count::<N>(rows[0], vdupq_lane_u16::<0>(s));
    let a1 = minus_count::<N>(rows[1], vdupq_lane_u16::<1>(s));
    let a2 = minus_count::<N>(rows[2], vdupq_lane_u16::<2>(s));
    let a3 = minus_count::<N>(rows[3], vdupq_lane_u16::<3>(s));
    // Pairwise adds: four partial sums per lane, then two, then one, in lane order.
    let p = vpaddq_u16(vpaddq_u16(a0, a1), vpaddq_u16(a2, a3));
    let p = vpaddq_u16(p, p);
    vmovl_u16(vget_low_u16(vsubq_u16(vdupq_n_u16(0), p)))
}

/// The codes `d` elements before lanes `j0..j0 + 4` (decoded in an earlier step, as
/// `d >= LANES`), masked by `mask`; `none` for lanes before the chunk's first row
/// (`word::neighbor_b` and `word::up` per lane).
#[inline(always)]
unsafe fn neighbor(cp: *const u32, j0: usize, d: usize, none: uint32x4_t, mask: u32) -> uint32x4_t {
    let m = vdupq_n_u32(mask);
    if j0 >= d {
        vandq_u32(vld1q_u32(cp.add(j0 - d)), m)
    } else if j0 + 4 <= d {
        none
    } else {
        // Straddling the first row (a row length not a multiple of 4): only the lanes past
        // it have a neighbor, and their addresses are in bounds (`j >= d`).
        let mut a = [0u32; 4];
        vst1q_u32(a.as_mut_ptr(), none);
        for (l, v) in a.iter_mut().enumerate().skip(d - j0) {
            *v = *cp.add(j0 + l - d) & mask;
        }
        vld1q_u32(a.as_ptr())
    }
}

/// `super::super::decode::binary` on four lanes: advance past a binary symbol under `f0`
/// (`PROB_TOTAL`: absent, state unchanged); returns the lanes that decoded 1 (all ones).
#[inline(always)]
unsafe fn binary(x: &mut uint32x4_t, f0: uint32x4_t) -> uint32x4_t {
    let slot = vandq_u32(*x, vdupq_n_u32(SLOT_MASK));
    let one = vcgeq_u32(slot, f0);
    let f = vbslq_u32(one, vsubq_u32(vdupq_n_u32(PROB_TOTAL), f0), f0);
    let s = vandq_u32(one, f0);
    *x = vsubq_u32(
        vmlaq_u32(slot, f, vshrq_n_u32::<{ PROB_BITS as i32 }>(*x)),
        s,
    );
    one
}

/// `super::super::decode::Stream::refill` on the chunk's eight vectors, in lane order, then
/// the check that the stream did not run dry.
#[inline(always)]
unsafe fn refill_all(
    x: &mut [uint32x4_t; NV],
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

/// Decode every full step of the chunk (all but a last partial one), exactly as
/// `super::super::decode::Lanes::step` would; returns the number of elements done. Returns 0
/// (leaving the work to the portable step) when the tables do not have the shapes the
/// contexts assume, or the neighbor is nearer than a step. Same arguments and result as the
/// x86 `full_steps`.
///
/// # Safety
/// The CPU must have NEON, and `st.words` must hold `LANES` padding words past `st.len`.
#[target_feature(enable = "neon")]
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
    let mut x: [uint32x4_t; NV] = std::array::from_fn(|v| vld1q_u32(states.as_ptr().add(4 * v)));
    let w1v = vdupq_n_u32(w1 as u32);
    let total = vdupq_n_u32(PROB_TOTAL);
    // Q2's absent lanes: the identity in both halves (q1 = 0 and 1).
    let total_pair = vdupq_n_u32(PROB_TOTAL | PROB_TOTAL << 16);
    let no_row_v = vdupq_n_u32(NO_ROW);
    let (map, starts, fsp) = (
        bt.map_padded.as_ptr(),
        bt.starts.as_ptr(),
        bt.fs_packed.as_ptr(),
    );
    let (q1p, q2p) = (q1t.f0_by_ctx.as_ptr(), q2t.f0_pairs.as_ptr());
    let cp = codes.as_mut_ptr();
    let ip = info.as_ptr();

    for base in (0..full).step_by(LANES) {
        // Every table lookup of the step first (they depend on the states only through B's
        // slot, and later stages' rows only on b), then the chain of state updates and
        // refills, stage by stage as the portable step does them.
        let mut slot = [vdupq_n_u32(0); NV];
        let mut fs = [vdupq_n_u32(0); NV];
        let mut code = [vdupq_n_u32(0); NV];
        let mut f0_q1 = [total; NV];
        let mut f0_q2 = [total_pair; NV];
        let mut present_q2 = [vdupq_n_u32(0); NV];
        let mut f0_s = [total; NV];
        for v in 0..NV {
            let j0 = base + 4 * v;
            let inf = vmovl_u16(vld1_u16(ip.add(j0)));
            let er = vandq_u32(inf, vdupq_n_u32(255));
            // B's context (`word::b_context`): `er`, or `(m2·(W1+1) + nb)·256 + er` with the
            // neighbor's b (`W1` before the first row).
            let ctx = if bt.neighbor {
                let nb = neighbor(cp, j0, d, w1v, 127);
                let m2 = vandq_u32(vshrq_n_u32::<9>(inf), vdupq_n_u32(3));
                let row = vmlaq_u32(nb, m2, vdupq_n_u32(w1 as u32 + 1));
                vaddq_u32(vshlq_n_u32::<8>(row), er)
            } else {
                er
            };
            slot[v] = vandq_u32(x[v], vdupq_n_u32(SLOT_MASK));
            // Each lane's row: a plain load (the row's address is needed in a register to
            // load its starts anyway). In bounds: contexts are below the map's checked
            // length, its entries below the row count, the zero row included.
            let ri: [u32; 4] = [
                *map.add(vgetq_lane_u32::<0>(ctx) as usize),
                *map.add(vgetq_lane_u32::<1>(ctx) as usize),
                *map.add(vgetq_lane_u32::<2>(ctx) as usize),
                *map.add(vgetq_lane_u32::<3>(ctx) as usize),
            ];
            let rows = ri.map(|r| starts.add(r as usize * T::BITS as usize));
            let sym = match T::BITS {
                8 => count_le4::<8>(rows, slot[v]),
                16 => count_le4::<16>(rows, slot[v]),
                32 => count_le4::<32>(rows, slot[v]),
                _ => count_le4::<64>(rows, slot[v]),
            };
            // `fs_packed`: freq | start << 13 | symbol << 25. Symbols are below W1.
            fs[v] = gather(fsp, vmlaq_u32(sym, vld1q_u32(ri.as_ptr()), w1v));
            // The zero row (frequency 0): a context without a row.
            if any(vceqzq_u32(vandq_u32(fs[v], vdupq_n_u32(0x1FFF)))) {
                return Err(no_row());
            }
            code[v] = sym;
            // Q1 is present when b >= 2, Q2 when b >= 3 (both its rows, chosen by q1 later),
            // S when b >= 1; their contexts start from `er·W1 + b` (below 256·W1: in bounds
            // for absent lanes too, which take the identity `PROB_TOTAL` instead).
            let eb = vmlaq_u32(sym, er, w1v);
            let p_q1 = vcgtq_u32(sym, vdupq_n_u32(1));
            present_q2[v] = vcgtq_u32(sym, vdupq_n_u32(2));
            let q1 = gather(q1p, eb);
            if any(vandq_u32(p_q1, vceqq_u32(q1, no_row_v))) {
                return Err(no_row());
            }
            f0_q1[v] = vbslq_u32(p_q1, q1, total);
            f0_q2[v] = vbslq_u32(present_q2[v], gather(q2p, eb), total_pair);
            if let Some(s_t) = s_t {
                // S: ((er·W1 + b)·3 + up)·2 + rs = (er·W1 + b)·6 + (2·up + rs).
                let up = if d_s == usize::MAX {
                    vdupq_n_u32(0)
                } else {
                    // `word::sign_state` of the neighbor: 0 no update, 1 up, 2 down.
                    let c = neighbor(cp, j0, d_s, vdupq_n_u32(0), u32::MAX);
                    let nz = vtstq_u32(c, vdupq_n_u32(127));
                    let neg = vandq_u32(vshrq_n_u32::<9>(c), vdupq_n_u32(1));
                    vandq_u32(nz, vaddq_u32(neg, vdupq_n_u32(1)))
                };
                let rs = vandq_u32(vshrq_n_u32::<8>(inf), vdupq_n_u32(1));
                let sctx = vmlaq_u32(vaddq_u32(vshlq_n_u32::<1>(up), rs), eb, vdupq_n_u32(6));
                let p_s = vtstq_u32(sym, sym);
                let sv = gather(s_t.f0_by_ctx.as_ptr(), sctx);
                if any(vandq_u32(p_s, vceqq_u32(sv, no_row_v))) {
                    return Err(no_row());
                }
                f0_s[v] = vbslq_u32(p_s, sv, total);
            }
        }
        // B: x = freq·(x >> PROB_BITS) + slot - start.
        for v in 0..NV {
            let f = vandq_u32(fs[v], vdupq_n_u32(0x1FFF));
            let s = vandq_u32(vshrq_n_u32::<13>(fs[v]), vdupq_n_u32(0xFFF));
            x[v] = vsubq_u32(
                vmlaq_u32(slot[v], f, vshrq_n_u32::<{ PROB_BITS as i32 }>(x[v])),
                s,
            );
        }
        refill_all(&mut x, words, &mut pos, st.len)?;
        for v in 0..NV {
            let one = binary(&mut x[v], f0_q1[v]);
            code[v] = vorrq_u32(code[v], vandq_u32(one, vdupq_n_u32(1 << 7)));
        }
        refill_all(&mut x, words, &mut pos, st.len)?;
        for v in 0..NV {
            // Q2's row for the decoded q1: the pair's high half when q1 = 1.
            let q1 = vtstq_u32(code[v], vdupq_n_u32(1 << 7));
            let f0 = vandq_u32(
                vbslq_u32(q1, vshrq_n_u32::<16>(f0_q2[v]), f0_q2[v]),
                vdupq_n_u32(0xFFFF),
            );
            if any(vandq_u32(present_q2[v], vceqq_u32(f0, vdupq_n_u32(0xFFFF)))) {
                return Err(no_row());
            }
            let one = binary(&mut x[v], f0);
            code[v] = vorrq_u32(code[v], vandq_u32(one, vdupq_n_u32(1 << 8)));
        }
        refill_all(&mut x, words, &mut pos, st.len)?;
        if s_t.is_some() {
            for v in 0..NV {
                let one = binary(&mut x[v], f0_s[v]);
                code[v] = vorrq_u32(code[v], vandq_u32(one, vdupq_n_u32(1 << 9)));
            }
            refill_all(&mut x, words, &mut pos, st.len)?;
        }
        for (v, c) in code.iter().enumerate() {
            vst1q_u32(cp.add(base + 4 * v), *c);
        }
    }
    for (v, xv) in x.iter().enumerate() {
        vst1q_u32(states.as_mut_ptr().add(4 * v), *xv);
    }
    st.pos = pos;
    Ok(full)
}

#[cfg(test)]
mod tests {
    use super::super::super::{CpuAt, Isa};
    use super::*;
    use crate::backend::{Backend, DecodeJob, EncodeJob};
    use crate::dtype::DType;
    use crate::format::chunk::{views, DecodeChunk};
    use crate::format::neighbor_distance;
    use crate::format::symbols::Layout;
    use crate::format::tables::{StageTable, Tables};

    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// The four-lane count equals the portable step's count, for every row width, on
    /// nondecreasing rows (repeated starts: symbols of frequency 0; trailing `PROB_TOTAL`:
    /// absent symbols; the zero row) and slots on and around every start (on aarch64 only:
    /// under qemu, `cargo test --lib --target aarch64-unknown-linux-gnu neon`).
    #[test]
    fn count_le4_matches_portable_count() {
        fn check<const N: usize>(next: &mut impl FnMut() -> u64) {
            for _ in 0..300 {
                let rows: Vec<Vec<u16>> = (0..4)
                    .map(|_| {
                        let mut r: Vec<u16> = (0..N)
                            .map(|_| match next() % 8 {
                                0 => 0,
                                1 => PROB_TOTAL as u16,
                                _ => (next() % PROB_TOTAL as u64) as u16,
                            })
                            .collect();
                        r.sort_unstable();
                        r
                    })
                    .collect();
                let slots: [u32; 4] = std::array::from_fn(|l| {
                    let s = rows[l][(next() % N as u64) as usize] as u32;
                    (s + (next() % 3) as u32).saturating_sub(1).min(SLOT_MASK)
                });
                let ptrs = [0, 1, 2, 3].map(|l| rows[l].as_ptr());
                let mut got = [0u32; 4];
                // SAFETY: NEON is baseline on aarch64; each row holds N starts.
                unsafe {
                    vst1q_u32(
                        got.as_mut_ptr(),
                        count_le4::<N>(ptrs, vld1q_u32(slots.as_ptr())),
                    )
                };
                let want: [u32; 4] = std::array::from_fn(|l| {
                    rows[l].iter().filter(|&&s| s as u32 <= slots[l]).count() as u32
                });
                assert_eq!(got, want, "N {N}, rows {rows:?}, slots {slots:?}");
            }
        }
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        check::<8>(&mut next);
        check::<16>(&mut next);
        check::<32>(&mut next);
        check::<64>(&mut next);
    }

    /// A reference and a target that moved by amounts that follow the column (so B's and S's
    /// neighbor contexts see real structure), with some wild values.
    fn pair(dtype: DType, n: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
        let size = dtype.size();
        let w = size as u32 * 8;
        let fl = dtype.float_layout().unwrap();
        let mut next = xorshift(seed | 1);
        let mask = u64::MAX >> (64 - w);
        let bias = (1u64 << (fl.exponent_bits - 1)) - 1;
        let (mut r, mut t) = (Vec::new(), Vec::new());
        for j in 0..n {
            let k = next();
            let rv = ((k >> 63) << (w - 1))
                | (bias - 1 - k % 6) << fl.mantissa_bits
                | (next() & ((1u64 << fl.mantissa_bits) - 1));
            let col = j % cols.max(1);
            let step = next() % (1 + next() % (1u64 << (1 + 3 * (col % 4) as u32).min(w - 2)));
            let tv = match next() % 50 {
                0 => next(),
                1 => rv,
                _ if col.is_multiple_of(3) => rv.wrapping_add(step),
                _ => rv.wrapping_sub(step),
            } & mask;
            r.extend_from_slice(&rv.to_le_bytes()[..size]);
            t.extend_from_slice(&tv.to_le_bytes()[..size]);
        }
        (r, t)
    }

    /// Paper and Signed chunks encoded at the portable level decode at NEON to the target,
    /// with B and S in every mix of context forms, row lengths that straddle NEON's vectors
    /// (37, 33) or not (48), or no rows; and a stream with a flipped word decodes to the
    /// portable level's result (the same bytes, or an error on both).
    #[test]
    fn chain_decode_matches_portable() {
        let portable = CpuAt::new(Isa::Portable).unwrap();
        let neon = CpuAt::new(Isa::Neon).unwrap();
        let mut seed = 7;
        for dtype in [
            DType::BF16,
            DType::F16,
            DType::F32,
            DType::F64,
            DType::F8E4M3,
        ] {
            let fl = dtype.float_layout().unwrap();
            let w1 = fl.width as usize + 1;
            for (cols, rows, extra) in [
                (37usize, 60usize, 5usize),
                (33, 50, 31),
                (48, 40, 0),
                (0, 1, 2021),
            ] {
                seed += 1;
                let n = cols * rows + extra;
                // Whole rows of `cols` (the extra elements dropped), or flat.
                let shape = n
                    .checked_div(cols)
                    .map_or(vec![n as u64], |r| vec![r as u64, cols as u64]);
                let n = shape.iter().product::<u64>() as usize;
                let (reference, target) = pair(dtype, n, cols, seed);
                let resident = portable
                    .residuals(&EncodeJob {
                        fl,
                        reference: &reference,
                        target: &target,
                        condition: true,
                    })
                    .unwrap();
                let d = neighbor_distance(&shape);
                let signed = resident.histograms(Layout::Signed, Some(d)).unwrap();
                let paper = resident.histograms(Layout::Paper, None).unwrap();
                let mut cases = Vec::new();
                // Pruned tables send most contexts to shared rows; unpruned ones give every
                // occupied context its own, so a wrong neighbor shows.
                for prune in [true, false] {
                    for fold in [[false, false], [true, false], [false, true], [true, true]] {
                        let stages = signed
                            .iter()
                            .enumerate()
                            .map(|(i, h)| match i {
                                0 if fold[0] => StageTable::select(&h.without_neighbor(), prune),
                                3 if fold[1] => StageTable::select(&h.without_neighbor(), prune),
                                _ => StageTable::select(h, prune),
                            })
                            .collect();
                        cases.push((Layout::Signed, Tables { stages }, Some(d)));
                    }
                }
                let stages = paper.iter().map(|h| StageTable::select(h, false)).collect();
                cases.push((Layout::Paper, Tables { stages }, None));
                for (layout, tables, distance) in &cases {
                    let what = format!("{dtype:?}, cols {cols}, {layout:?}");
                    let dec: Vec<DecStage> = tables.stages.iter().map(DecStage::new).collect();
                    // The NEON steps run (they return 0 where the tables do not fit).
                    assert!(vector_tables_fit(&dec, w1, fl.width as usize), "{what}");
                    let chunks = resident.encode(*layout, tables, *distance).unwrap();
                    let decode = |backend: &CpuAt, chunks: &[DecodeChunk]| {
                        backend.decode(&DecodeJob {
                            fl,
                            layout: *layout,
                            condition: true,
                            distance: *distance,
                            tables,
                            chunks,
                            reference: &reference,
                        })
                    };
                    let mut views = views(&chunks);
                    assert_eq!(decode(&neon, &views).unwrap(), target, "{what}");
                    // A flipped bit in the stream's middle word.
                    let words = views[0].words.to_mut();
                    let k = words.len() / 2;
                    words[k] ^= 1 << (seed % 16);
                    match (decode(&portable, &views), decode(&neon, &views)) {
                        (Ok(a), Ok(b)) => assert_eq!(a, b, "{what}, corrupted"),
                        (Err(_), Err(_)) => {}
                        (a, b) => panic!(
                            "{what}, corrupted: portable {:?}, neon {:?}",
                            a.is_ok(),
                            b.is_ok()
                        ),
                    }
                }
            }
        }
    }
}
