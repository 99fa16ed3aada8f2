//! Decoding one chunk: lanes step by step, stage by stage, then tails and the inverse
//! transform in one forward pass.

use std::mem::MaybeUninit;

use super::joint::JointDec;
use super::tables::DecStage;
use super::word::{self, b_context, neighbor_b, rs, up, InfoFn, Word};
use super::Isa;
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::entropy::rans::RANS_L;
use crate::format::bits::BitReader;
use crate::format::chunk::{DecodeChunk, LANES};
use crate::{Error, Result};

fn bad(detail: &str) -> Error {
    Error::format("tensor blob chunk", detail.to_string())
}

const SLOT_MASK: u32 = PROB_TOTAL - 1;

/// The stream every lane of a chunk reads from, in decoding order, padded with `LANES` zero
/// words so a refill never needs a bounds check; overruns are detected after each stage.
pub struct Stream<'a> {
    pub words: &'a [u16],
    pub len: usize,
    pub pos: usize,
}

impl<'a> Stream<'a> {
    /// A stream over a copy of `words` in `buf`, padded with `LANES` zero words: the vector
    /// refills read a step's worth of words past the cursor without a bounds check.
    pub fn padded(words: &[u16], buf: &'a mut Vec<u16>) -> Stream<'a> {
        buf.clear();
        buf.extend_from_slice(words);
        buf.resize(words.len() + LANES, 0);
        Stream {
            words: buf,
            len: words.len(),
            pos: 0,
        }
    }

    /// Refill every lane whose state fell below `RANS_L`, in lane order: the only serial
    /// part of a stage (the table lookups that produced `states` are independent per lane).
    #[inline(always)]
    pub fn refill(&mut self, states: &mut [u32]) -> Result<()> {
        for x in states.iter_mut() {
            let need = *x < RANS_L;
            let w = self.words[self.pos] as u32;
            *x = if need { (*x << 16) | w } else { *x };
            self.pos += need as usize;
        }
        if self.pos > self.len {
            return Err(bad("rANS word stream ended early"));
        }
        Ok(())
    }
}

/// Advance `x` past a binary symbol under `f0` (0 with the state unchanged when `f0` is the
/// identity row's `PROB_TOTAL`); returns the symbol.
#[inline(always)]
fn binary(x: &mut u32, f0: u32) -> u32 {
    let slot = *x & SLOT_MASK;
    let sym = (slot >= f0) as u32;
    let (f, s) = if sym == 0 {
        (f0, 0)
    } else {
        (PROB_TOTAL - f0, f0)
    };
    *x = f * (*x >> PROB_BITS) + slot - s;
    sym
}

pub fn no_row() -> Error {
    bad("a symbol's context has no frequency row")
}

/// One chunk's decoding context for the portable step.
struct Lanes<'a> {
    info: &'a [u16],
    stages: &'a [DecStage<'a>],
    w1: usize,
    /// Neighbor distance of the B stage and of the S stage (`usize::MAX`: none).
    d: usize,
    d_s: usize,
}

impl Lanes<'_> {
    /// Decode step `step` (its up to `LANES` elements, every stage) into `codes`.
    #[inline(always)]
    fn step<T: Word>(
        &self,
        step: usize,
        codes: &mut [u32],
        states: &mut [u32; LANES],
        st: &mut Stream,
    ) -> Result<()> {
        let (info, stages, w1, d, d_s) = (self.info, self.stages, self.w1, self.d, self.d_s);
        let n = codes.len();
        let (bt, q1t, q2t) = (&stages[0], &stages[1], &stages[2]);
        let mut b_ctx = [0usize; LANES];
        let base = step * LANES;
        let lanes = LANES.min(n - base);
        let inf = &info[base..base + lanes];
        // The neighbor (d >= LANES back) was decoded in an earlier step.
        for lane in 0..lanes {
            let nb = if bt.neighbor {
                neighbor_b(codes, base + lane, d, w1)
            } else {
                0
            };
            b_ctx[lane] = b_context(inf[lane], nb, w1, bt.neighbor);
        }
        let code = &mut codes[base..base + lanes];
        let xs = &mut states[..lanes];
        for lane in 0..lanes {
            let ri = bt.map[b_ctx[lane]];
            if ri == u32::MAX {
                return Err(no_row());
            }
            let x = &mut xs[lane];
            let slot = *x & SLOT_MASK;
            // Starts are nondecreasing, so the count is the last symbol starting at or
            // below `slot`: the one whose range holds it (`bt.starts`). Its length is the
            // constant `T::BITS`, so the count compiles to a few vector compares.
            let row = &bt.starts[ri as usize * T::BITS as usize..][..T::BITS as usize];
            let sym = row
                .iter()
                .map(|&s| (s as u32 <= slot) as usize)
                .sum::<usize>();
            let (f, s) = bt.fs[ri as usize * bt.alphabet + sym];
            *x = f * (*x >> PROB_BITS) + slot - s;
            code[lane] = sym as u32;
        }
        st.refill(xs)?;
        for lane in 0..lanes {
            let b = code[lane] as usize;
            let eb = (inf[lane] & 255) as usize * w1 + b;
            let f0 = q1t.f0(b >= 2, eb).ok_or_else(no_row)?;
            code[lane] |= binary(&mut xs[lane], f0) << 7;
        }
        st.refill(xs)?;
        for lane in 0..lanes {
            let c = code[lane];
            let b = (c & 127) as usize;
            let ctx = ((inf[lane] & 255) as usize * w1 + b) * 2 + ((c >> 7) & 1) as usize;
            let f0 = q2t.f0(b >= 3, ctx).ok_or_else(no_row)?;
            code[lane] |= binary(&mut xs[lane], f0) << 8;
        }
        st.refill(xs)?;
        if let Some(s_t) = stages.get(3) {
            for lane in 0..lanes {
                let j = base + lane;
                let b = (codes[j] & 127) as usize;
                let eb = (info[j] & 255) as usize * w1 + b;
                let ctx = (eb * 3 + up(codes, j, d_s) as usize) * 2 + rs(info[j]);
                let f0 = s_t.f0(b >= 1, ctx).ok_or_else(no_row)?;
                codes[j] |= binary(&mut states[lane], f0) << 9;
            }
            st.refill(&mut states[..lanes])?;
        }
        Ok(())
    }
}

/// Decode chunk `c` against `reference` (this chunk's elements) into `out` (same size):
/// on success every byte of `out` is written, and `crc` (where given) has hashed `out`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn chunk<T: Word>(
    c: &DecodeChunk,
    reference: &[u8],
    out: &mut [MaybeUninit<u8>],
    isa: Isa,
    info_fn: InfoFn,
    signed: bool,
    w1: usize,
    stages: &[DecStage],
    joint: Option<&JointDec>,
    distance: Option<usize>,
    scratch: &mut (Vec<u16>, Vec<u32>, Vec<u16>),
    crc: Option<&mut crc32fast::Hasher>,
) -> Result<()> {
    if let (Some(table), Some(d)) = (joint.filter(|t| t.near.is_some()), distance) {
        return joint_near_chunk::<T>(c, reference, out, isa, info_fn, table, d, w1, scratch, crc);
    }
    #[cfg(target_arch = "x86_64")]
    if let (Some(table), Isa::Avx2, 16 | 32) = (joint, isa, T::BITS) {
        return joint_blocked::<T>(c, reference, out, isa, info_fn, signed, table, scratch, crc);
    }
    let n = reference.len() / T::SIZE;
    let (info, codes, padded) = (&mut scratch.0, &mut scratch.1, &mut scratch.2);
    // Every lane writes its element's code before anything reads it: no clearing memset
    // when the buffer is already as long (every chunk but a tensor's first).
    codes.truncate(n);
    codes.resize(n, 0);
    // Where the joint lanes leave joint symbols for the tail pass to expand.
    #[cfg(target_arch = "x86_64")]
    let j_codes = joint.is_some() && super::joint::stores_j::<T>(isa);
    #[cfg(not(target_arch = "x86_64"))]
    let j_codes = false;
    if let Some(table) = joint {
        joint_lanes::<T>(
            c, reference, isa, info_fn, table, codes, info, padded, j_codes,
        )?;
    } else {
        info_fn.fill::<T>(reference, info);
        let mut states = c.states;
        let mut st = Stream::padded(&c.words, padded);
        let d = distance.unwrap_or(usize::MAX);
        let d_s = match stages.get(3) {
            Some(t) if t.neighbor => d,
            _ => usize::MAX,
        };
        chain_lanes::<T>(info, codes, &mut states, &mut st, isa, stages, w1, d, d_s)?;
        check_end(&st, &states)?;
    }
    finish::<T>(c, codes, j_codes, reference, out, isa, signed, crc)
}

/// A chunk of the Joint layout's neighbor form (`joint_near`): its lanes into per-element
/// codes (the level's vector lanes where it has them, the portable ones around them), then
/// the tail pass every layout shares.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn joint_near_chunk<T: Word>(
    c: &DecodeChunk,
    reference: &[u8],
    out: &mut [MaybeUninit<u8>],
    isa: Isa,
    info_fn: InfoFn,
    table: &JointDec,
    distance: usize,
    w1: usize,
    scratch: &mut (Vec<u16>, Vec<u32>, Vec<u16>),
    crc: Option<&mut crc32fast::Hasher>,
) -> Result<()> {
    let n = reference.len() / T::SIZE;
    let (info, codes, padded) = (&mut scratch.0, &mut scratch.1, &mut scratch.2);
    codes.truncate(n);
    codes.resize(n, 0);
    let Some(near_slots) = table.near.as_ref() else {
        return Err(no_row());
    };
    let steps = n.div_ceil(LANES);
    // The steps before the first whole step with neighbors, portable; then the vector
    // lanes where the level has them; the portable lanes finish what they leave.
    let first = distance.div_ceil(LANES).min(steps);
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) && matches!(T::BITS, 16 | 32) && !info_fn.wide() {
        // SAFETY: `isa` is only ever a level `Isa::available` confirmed on this CPU.
        return unsafe {
            joint_near_x86::<T>(
                c,
                reference,
                out,
                isa,
                info_fn,
                table,
                near_slots,
                (distance, w1),
                (info, codes, padded),
                first,
                crc,
            )
        };
    }
    info_fn.fill::<T>(reference, info);
    let mut states = c.states;
    let mut st = Stream::padded(&c.words, padded);
    let near = super::joint_near::decode_steps;
    near(
        table,
        near_slots,
        info,
        codes,
        &mut states,
        &mut st,
        distance,
        w1,
        0..first,
    )?;
    #[cfg(target_arch = "aarch64")]
    let first = if isa == Isa::Neon {
        // SAFETY: `Isa::Neon` is only used where `Isa::available` confirmed it; `padded`
        // holds `LANES` words past the stream.
        unsafe {
            super::neon::joint_near::decode_steps(
                table,
                near_slots,
                info,
                codes,
                &mut states,
                &mut st,
                distance,
                w1,
                first,
            )?
        }
    } else {
        first
    };
    #[cfg(not(target_arch = "aarch64"))]
    let _ = isa;
    near(
        table,
        near_slots,
        info,
        codes,
        &mut states,
        &mut st,
        distance,
        w1,
        first..steps,
    )?;
    check_end(&st, &states)?;
    // Plain codes in the shared tail pass, whatever the level's Joint lanes store.
    finish::<T>(c, codes, false, reference, out, isa, true, crc)
}

/// [`joint_near_chunk`] at AVX2 and AVX-512: the steps before `first` portable, then the
/// vector lanes ([`near_x86_lanes`]: facts from the reference, words in place) and the
/// portable lanes on what they leave, then the tail pass. At AVX2 the tail pass runs inside
/// the lanes' loop (`Fused16`, `Fused32`, over the codes they store, a step behind: the
/// lanes wait on their lookups and the tail pass's work fills the gaps) and finishes from
/// where it stopped; the same bytes as the lanes then [`finish`], which AVX-512 runs: the
/// tails' bit order does not depend on which pass reads them.
///
/// # Safety
/// `isa` (AVX2 or AVX-512) available; `T` of 16 or 32 bits, `info_fn` not wide.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn joint_near_x86<T: Word>(
    c: &DecodeChunk,
    reference: &[u8],
    out: &mut [MaybeUninit<u8>],
    isa: Isa,
    info_fn: InfoFn,
    table: &JointDec,
    near_slots: &super::joint_near::NearSlots,
    (distance, w1): (usize, usize),
    (info, codes, padded): (&mut Vec<u16>, &mut [u32], &mut Vec<u16>),
    first: usize,
    crc: Option<&mut crc32fast::Hasher>,
) -> Result<()> {
    use super::avx2::decode::{AfterStep, Fused16, Fused32};
    debug_assert!(matches!(T::BITS, 16 | 32) && !info_fn.wide());
    let n = reference.len() / T::SIZE;
    let mut states = c.states;
    // The portable steps before `first`: each lane reads at most a word a step, so a padded
    // copy of that many words serves them (their facts from `info`, filled where they run).
    info_fn.fill_range::<T>(reference, info, 0..(first * LANES).min(n));
    let at = {
        let head = &c.words[..c.words.len().min(first * LANES)];
        let mut st = Stream::padded(head, padded);
        super::joint_near::decode_steps(
            table,
            near_slots,
            info,
            codes,
            &mut states,
            &mut st,
            distance,
            w1,
            0..first,
        )?;
        st.pos
    };
    let lanes = (isa, info_fn, table, near_slots, (distance, w1));
    if isa == Isa::Avx512 {
        let scratch = (info, &mut *codes, padded);
        near_x86_lanes::<T, ()>(
            &mut (),
            c,
            reference,
            lanes,
            scratch,
            (&mut states, at, first),
        )?;
        return finish::<T>(c, codes, false, reference, out, isa, true, crc);
    }
    let mut unused = crc32fast::Hasher::new();
    let h = crc.unwrap_or(&mut unused);
    let mut fold = super::avx2::crc::Fold::new(h);
    // The AVX2 lanes store what the `--fast` ones do (`avx2::joint_near::stored`): the
    // portable steps' codes before them in that form, and back after them.
    let lut = super::joint::joint_of_code();
    for c in &mut codes[..(first * LANES).min(n)] {
        let j = lut[*c as usize & 1023];
        *c = if T::BITS == 16 {
            super::joint::u_of_joint(j as usize)
        } else {
            j as u32
        };
    }
    let scratch = (info, &mut *codes, padded);
    let (done, bits) = if T::BITS == 16 {
        let mut f = Fused16::new(reference, out, c.tail, 0, true, &mut fold);
        near_x86_lanes::<T, _>(
            &mut f,
            c,
            reference,
            lanes,
            scratch,
            (&mut states, at, first),
        )?;
        f.progress()
    } else {
        let mut f = Fused32::<true>::new(reference, out, c.tail, 0, &mut fold);
        near_x86_lanes::<T, _>(
            &mut f,
            c,
            reference,
            lanes,
            scratch,
            (&mut states, at, first),
        )?;
        f.progress()
    };
    let mut tail = BitReader::new(c.tail);
    tail.consumed = bits;
    let avail = c.tail_bits.min(c.tail.len() as u64 * 8);
    avx2_tail_rest::<T>(
        &mut codes[done..],
        false,
        &reference[done * T::SIZE..],
        &mut out[done * T::SIZE..],
        (&mut tail, avail),
        true,
        &mut fold,
        h,
    )?;
    avx2_chunk_end::<T>(c, out, n, &tail, &mut fold, h)
}

/// The neighbor form's AVX2 or AVX-512 lanes from step `first` (the words from `at`) to
/// the chunk's end, `after` run before each AVX2 vector step: the vector lanes (AVX2's by
/// gathers or scalar loads, `super::avx2_gathers`) read each element's facts from the
/// reference (no facts pass) and the words in place while a step's worth is left, then
/// from a padded copy of the rest; the portable lanes finish what they leave.
///
/// # Safety
/// `isa` (AVX2 or AVX-512) available; `T` of 16 or 32 bits, `info_fn` not wide.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::type_complexity)]
unsafe fn near_x86_lanes<T: Word, A: super::avx2::decode::AfterStep>(
    after: &mut A,
    c: &DecodeChunk,
    reference: &[u8],
    (isa, info_fn, table, near_slots, (distance, w1)): (
        Isa,
        InfoFn,
        &JointDec,
        &super::joint_near::NearSlots,
        (usize, usize),
    ),
    (info, codes, padded): (&mut Vec<u16>, &mut [u32], &mut Vec<u16>),
    (states, at, first): (&mut [u32; LANES], usize, usize),
) -> Result<()> {
    use super::avx2::joint_near::decode_steps;
    let n = reference.len() / T::SIZE;
    let params = info_fn.joint_params();
    let gathers = super::avx2_gathers();
    let mut lanes = |st: &mut Stream, guarded: bool, from: usize| {
        let (s, dw) = (&mut *states, (distance, w1));
        // SAFETY: the caller's; unless `guarded`, `st` is padded.
        unsafe {
            if isa == Isa::Avx512 {
                super::avx512::joint_near::decode_steps::<T>(
                    table, near_slots, reference, params, codes, s, st, guarded, dw, from,
                )
            } else {
                let f = match (gathers, near_slots.bucketed()) {
                    (true, true) => decode_steps::<T, true, true, A>,
                    (true, false) => decode_steps::<T, true, false, A>,
                    (false, true) => decode_steps::<T, false, true, A>,
                    (false, false) => decode_steps::<T, false, false, A>,
                };
                f(
                    after, table, near_slots, reference, params, codes, s, st, guarded, dw, from,
                )
            }
        }
    };
    let mut st = Stream {
        words: &c.words,
        len: c.words.len(),
        pos: at,
    };
    let k = lanes(&mut st, true, first)?;
    let mut st = Stream::padded(&c.words[st.pos..], padded);
    let k = lanes(&mut st, false, k)?;
    if isa == Isa::Avx2 {
        // Per-element codes again for the portable lanes' neighbors and the scalar tail
        // pass, from where the fused one stopped.
        let end = (k * LANES).min(n);
        let from = after.progress().0.min(end.saturating_sub(distance));
        let ours = &mut codes[from..end];
        if T::BITS == 16 {
            ours.iter_mut()
                .for_each(|u| *u = super::joint::code_of_u(*u));
        } else {
            let lut = super::joint::code_of_joint();
            ours.iter_mut().for_each(|j| *j = lut[*j as usize & 255]);
        }
    }
    info_fn.fill_range::<T>(reference, info, k * LANES..n);
    let steps = n.div_ceil(LANES);
    super::joint_near::decode_steps(
        table,
        near_slots,
        info,
        codes,
        states,
        &mut st,
        distance,
        w1,
        k..steps,
    )?;
    check_end(&st, states)
}

/// Every lane back in its initial state and every word read: what the encoder started from.
fn check_end(st: &Stream, states: &[u32; LANES]) -> Result<()> {
    if st.pos != st.len || states.iter().any(|&s| s != RANS_L) {
        return Err(bad("rANS lanes did not end in their initial state"));
    }
    Ok(())
}

/// The Joint layout's lanes. The vector decoders read the contexts straight from the
/// reference (no per-element facts written and read back) and the words straight from the
/// chunk, while a whole step's worth (`LANES` words) is left; then from a padded copy of the
/// few words left (copying whole streams was 5% of a decode). The portable lanes decode the
/// last partial step, or all of them where no vector level runs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn joint_lanes<T: Word>(
    c: &DecodeChunk,
    reference: &[u8],
    isa: Isa,
    info_fn: InfoFn,
    table: &JointDec,
    codes: &mut [u32],
    info: &mut Vec<u16>,
    padded: &mut Vec<u16>,
    j_codes: bool,
) -> Result<()> {
    let mut states = c.states;
    let mut st = Stream {
        words: &c.words,
        len: c.words.len(),
        pos: 0,
    };
    let first = joint_vector::<T>(
        isa,
        table,
        reference,
        info_fn,
        codes,
        &mut states,
        &mut st,
        true,
    )?;
    let left = &c.words[st.pos..];
    let mut st = Stream::padded(left, padded);
    let (r, codes) = (&reference[first * T::SIZE..], &mut codes[first..]);
    let then = joint_vector::<T>(isa, table, r, info_fn, codes, &mut states, &mut st, false)?;
    info_fn.fill::<T>(&r[then * T::SIZE..], info);
    super::joint::decode_lanes(
        table,
        info,
        &mut codes[then..],
        &mut states,
        &mut st,
        j_codes,
    )?;
    check_end(&st, &states)
}

/// The AVX2 Joint lanes of a block while a step's worth of words is left (`guarded`),
/// with the tail pass `f` fused into their loop: the elements the lanes did, and `f`'s
/// [`progress`](super::avx2::decode::AfterStep::progress).
///
/// # Safety
/// The CPU must have AVX2 (`Isa::Avx2` available).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn avx2_lanes<T: Word, A: super::avx2::decode::AfterStep>(
    mut f: A,
    table: &JointDec,
    reference: &[u8],
    info_fn: InfoFn,
    codes: &mut [u32],
    states: &mut [u32; LANES],
    st: &mut Stream,
) -> Result<(usize, usize, u64)> {
    let k = super::avx2::joint::decode::<T, A>(
        table,
        reference,
        info_fn.joint_params(),
        codes,
        states,
        st,
        true,
        &mut f,
    )?;
    let (done, bits) = f.progress();
    Ok((k, done, bits))
}

/// Elements per block of [`joint_blocked`]: a multiple of `LANES` and of the tail passes'
/// groups; the block's codes (16 KiB), reference and output stay in L1 from the lanes to
/// the tail pass (which folds the output's CRC-32 from its registers).
#[cfg(target_arch = "x86_64")]
const BLOCK: usize = 4096;

/// A Joint-layout chunk at AVX2, lanes and tail pass block by block: a chunk's codes (1 MiB
/// of `u32` for its 2^18 elements) went to L2 or beyond between the two passes, and were read
/// a third time to sum the tail lengths before the tail pass. Here the vector tail pass reads
/// inside the tail whatever the codes, so only what it leaves to the scalar pass needs its
/// lengths summed first; the total is checked against the chunk's tail length at the end.
/// The vector tail pass runs inside the lanes' loop (`Fused16`, `Fused32`: on a Zen 5 the
/// lanes wait on their state chain, and the tail pass's work fills the gaps; as a pass of
/// its own it was a third of the decode), then on whatever the loop left. The same bytes as
/// [`joint_lanes`] then [`finish`]: the lanes' order and the tails' bit order do not depend
/// on where a block ends.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn joint_blocked<T: Word>(
    c: &DecodeChunk,
    reference: &[u8],
    out: &mut [MaybeUninit<u8>],
    isa: Isa,
    info_fn: InfoFn,
    signed: bool,
    table: &JointDec,
    scratch: &mut (Vec<u16>, Vec<u32>, Vec<u16>),
    crc: Option<&mut crc32fast::Hasher>,
) -> Result<()> {
    let n = reference.len() / T::SIZE;
    let (info, codes, padded) = (&mut scratch.0, &mut scratch.1, &mut scratch.2);
    let j_codes = super::joint::stores_j::<T>(isa);
    // The output's CRC-32: the vector tail passes fold what they write (`avx2::crc`), the
    // scalar pass's elements go to the hasher. (Without `crc`, folded and dropped.)
    let mut unused = crc32fast::Hasher::new();
    let h = crc.unwrap_or(&mut unused);
    // SAFETY: SSE2.
    let mut fold = unsafe { super::avx2::crc::Fold::new(h) };
    // Every block's lanes write its codes before the tail pass reads them.
    codes.truncate(BLOCK.min(n));
    codes.resize(BLOCK.min(n), 0);
    let mut states = c.states;
    // The words in place while a step's worth is left, then a padded copy of the rest (as
    // in `joint_lanes`).
    let mut st = Stream {
        words: &c.words,
        len: c.words.len(),
        pos: 0,
    };
    let mut near_end: Option<Stream> = None;
    let avail = c.tail_bits.min(c.tail.len() as u64 * 8);
    let mut tail = BitReader::new(c.tail);
    for at in (0..n).step_by(BLOCK) {
        let m = BLOCK.min(n - at);
        let r = &reference[at * T::SIZE..(at + m) * T::SIZE];
        let o = &mut out[at * T::SIZE..(at + m) * T::SIZE];
        let codes = &mut codes[..m];
        let mut k = 0;
        // Elements whose tails the lanes' loop already did (`Fused16`, `Fused32`: from the
        // joint symbols the AVX2 lanes store).
        debug_assert!(j_codes);
        let mut fused = 0;
        if near_end.is_none() {
            // SAFETY: `Isa::Avx2` is only used where `Isa::available` confirmed it; the words
            // are read in place only while a step's worth is left (`guarded`).
            unsafe {
                use super::avx2::decode::{Fused16, Fused32};
                let (tb, bits) = (tail.bytes(), tail.consumed);
                let (s, c) = (&mut states, &mut st);
                let fo = &mut fold;
                (k, fused, tail.consumed) = match (T::BITS, signed) {
                    (16, _) => {
                        let f = Fused16::new(r, o, tb, bits, signed, fo);
                        avx2_lanes::<T, _>(f, table, r, info_fn, codes, s, c)?
                    }
                    (_, true) => {
                        let f = Fused32::<true>::new(r, o, tb, bits, fo);
                        avx2_lanes::<T, _>(f, table, r, info_fn, codes, s, c)?
                    }
                    (_, false) => {
                        let f = Fused32::<false>::new(r, o, tb, bits, fo);
                        avx2_lanes::<T, _>(f, table, r, info_fn, codes, s, c)?
                    }
                };
            }
            if k < m {
                near_end = Some(Stream::padded(&c.words[st.pos..], padded));
            }
        }
        if let Some(st) = near_end.as_mut() {
            let r = &r[k * T::SIZE..];
            k += joint_vector::<T>(
                isa,
                table,
                r,
                info_fn,
                &mut codes[k..],
                &mut states,
                st,
                false,
            )?;
            info_fn.fill::<T>(&reference[(at + k) * T::SIZE..(at + m) * T::SIZE], info);
            super::joint::decode_lanes(table, info, &mut codes[k..], &mut states, st, j_codes)?;
            if T::BITS == 16 {
                // What the AVX2 lanes store for 16-bit floats (`avx2::joint::decode`).
                for c in &mut codes[k..] {
                    *c = super::joint::u_of_joint(*c as usize & 255);
                }
            }
        }
        // The rest of the block: what the lanes' loop left.
        // SAFETY: `Isa::Avx2` is only used where `Isa::available` confirmed it.
        unsafe {
            avx2_tail_rest::<T>(
                &mut codes[fused..],
                j_codes,
                &r[fused * T::SIZE..],
                &mut o[fused * T::SIZE..],
                (&mut tail, avail),
                signed,
                &mut fold,
                h,
            )?
        };
    }
    check_end(near_end.as_ref().unwrap_or(&st), &states)?;
    // SAFETY: as above.
    unsafe { avx2_chunk_end::<T>(c, out, n, &tail, &mut fold, h) }
}

/// The end of an AVX2 chunk decode whose tail passes folded the output's CRC-32: the fold
/// handed to the hasher, the bytes past the reference's `n` whole elements (none for a
/// well-formed reference) written as zeros and hashed, and the tail checked read to its end.
///
/// # Safety
/// SSE2 and PCLMULQDQ (`Isa::Avx2` available); `out`'s first `n` elements written.
#[cfg(target_arch = "x86_64")]
unsafe fn avx2_chunk_end<T: Word>(
    c: &DecodeChunk,
    out: &mut [MaybeUninit<u8>],
    n: usize,
    tail: &BitReader,
    fold: &mut super::avx2::crc::Fold,
    h: &mut crc32fast::Hasher,
) -> Result<()> {
    // SAFETY: the caller's.
    unsafe { fold.flush(h) };
    for o in &mut out[n * T::SIZE..] {
        o.write(0);
    }
    // SAFETY: just written.
    let past = &out[n * T::SIZE..];
    h.update(unsafe { std::slice::from_raw_parts(past.as_ptr().cast::<u8>(), past.len()) });
    if tail.consumed != c.tail_bits {
        return Err(bad("raw tail longer than the bit lengths require"));
    }
    Ok(())
}

/// The AVX2 tail pass over what a fused one left (`Fused16`, `Fused32`): the vector pass
/// from `tail.consumed` while its windows fit, then the scalar pass, its lengths checked
/// against `avail` first (the vector pass reads inside the tail whatever the codes). Codes
/// as the lanes stored them: `u` of joint symbols for 16-bit floats or joint symbols where
/// `j_codes`, else per-element codes.
///
/// # Safety
/// AVX2 (`Isa::Avx2` available).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_tail_rest<T: Word>(
    codes: &mut [u32],
    j_codes: bool,
    r: &[u8],
    o: &mut [MaybeUninit<u8>],
    (tail, avail): (&mut BitReader, u64),
    signed: bool,
    fold: &mut super::avx2::crc::Fold,
    h: &mut crc32fast::Hasher,
) -> Result<()> {
    // SAFETY: the caller's; the passes read inside the tail whatever the codes.
    let (done, bits) = unsafe {
        if T::BITS == 16 {
            super::avx2::decode::finish_u16(
                codes,
                j_codes,
                r,
                o,
                tail.bytes(),
                tail.consumed,
                signed,
                fold,
            )
        } else {
            super::avx2::decode::finish_u32(
                codes,
                j_codes,
                r,
                o,
                tail.bytes(),
                tail.consumed,
                signed,
                fold,
            )
        }
    };
    tail.consumed = bits;
    let rest = &mut codes[done..];
    if j_codes && T::BITS == 16 {
        // u back to per-element codes for the scalar pass.
        for c in rest.iter_mut() {
            *c = super::joint::code_of_u(*c);
        }
    }
    let rest_j = j_codes && T::BITS != 16;
    if tail.consumed + tail_need(rest, rest_j) > avail {
        return Err(bad("raw tail shorter than the bit lengths require"));
    }
    if !rest.is_empty() {
        let o = &mut o[done * T::SIZE..];
        finish_scalar::<T>(rest, rest_j, &r[done * T::SIZE..], o, tail, signed);
        // SAFETY: SSE2; the fold continued `h`.
        unsafe { fold.flush(h) };
        // SAFETY: just written.
        h.update(unsafe { std::slice::from_raw_parts(o.as_ptr().cast::<u8>(), o.len()) });
    }
    Ok(())
}

/// The whole steps a vector decoder does from the start of `codes` (0 where none runs);
/// `guarded`: `st.words` is not padded, so stop while a step's worth of words is left.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn joint_vector<T: Word>(
    isa: Isa,
    table: &JointDec,
    reference: &[u8],
    info_fn: InfoFn,
    codes: &mut [u32],
    states: &mut [u32; LANES],
    st: &mut Stream,
    guarded: bool,
) -> Result<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        let params = info_fn.joint_params();
        if isa == Isa::Avx512 {
            // SAFETY: `Isa::Avx512` is only used where `Isa::available` confirmed it; the
            // stream is padded with `LANES` words unless `guarded`.
            return unsafe {
                super::avx512::joint::decode::<T>(
                    table, reference, params, codes, states, st, guarded,
                )
            };
        }
        if isa == Isa::Avx2 {
            // SAFETY: as above, for `Isa::Avx2`.
            return unsafe {
                super::avx2::joint::decode::<T, ()>(
                    table,
                    reference,
                    params,
                    codes,
                    states,
                    st,
                    guarded,
                    &mut (),
                )
            };
        }
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        // SAFETY: `Isa::Neon` is only used where `Isa::available` confirmed it; the stream
        // is padded with `LANES` words unless `guarded`.
        return unsafe {
            super::neon::joint::decode::<T>(
                table,
                reference,
                info_fn.joint_params(),
                codes,
                states,
                st,
                guarded,
            )
        };
    }
    let _ = (isa, table, reference, info_fn, codes, states, st, guarded);
    Ok(0)
}

/// The B, Q1, Q2 (, S) lanes of the Paper and Signed layouts, vector steps first.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn chain_lanes<T: Word>(
    info: &[u16],
    codes: &mut [u32],
    states: &mut [u32; LANES],
    st: &mut Stream,
    isa: Isa,
    stages: &[DecStage],
    w1: usize,
    d: usize,
    d_s: usize,
) -> Result<()> {
    let n = codes.len();
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(unused_mut)
    )]
    let mut done = 0;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = isa;
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: `Isa::Avx512` is only used where `Isa::available` confirmed it.
        done = unsafe {
            super::avx512::decode::full_steps::<T>(info, codes, states, st, stages, w1, d, d_s)?
        };
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: `Isa::Avx2` is only used where `Isa::available` confirmed it.
        done = unsafe {
            super::avx2::decode::full_steps::<T>(info, codes, states, st, stages, w1, d, d_s)?
        };
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon {
        // SAFETY: `Isa::Neon` is only used where `Isa::available` confirmed it; `st` is
        // padded with `LANES` words.
        done = unsafe {
            super::neon::chain::full_steps::<T>(info, codes, states, st, stages, w1, d, d_s)?
        };
    }
    let lanes = Lanes {
        info,
        stages,
        w1,
        d,
        d_s,
    };
    for step in done / LANES..n.div_ceil(LANES) {
        lanes.step::<T>(step, codes, states, st)?;
    }
    Ok(())
}

/// Raw tails and the inverse transform, from the per-element codes every layout decodes to.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn finish<T: Word>(
    c: &DecodeChunk,
    codes: &[u32],
    j_codes: bool,
    reference: &[u8],
    out: &mut [MaybeUninit<u8>],
    isa: Isa,
    signed: bool,
    crc: Option<&mut crc32fast::Hasher>,
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    let mut crc = crc;
    // The bit lengths say how long the tail is: check that once, then read it unchecked.
    // In 32 bits (twice the lanes of a 64-bit sum): whatever the codes, a chunk's lengths
    // sum to less than 2^18 × 128.
    const _: () = assert!(crate::format::chunk::CHUNK_ELEMS as u64 * 127 < 1 << 32);
    let need = tail_need(codes, j_codes);
    if need > c.tail_bits.min(c.tail.len() as u64 * 8) {
        return Err(bad("raw tail shorter than the bit lengths require"));
    }
    let mut tail = BitReader::new(c.tail);
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(unused_mut)
    )]
    let mut done = 0;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = isa;
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && T::BITS == 16 {
        // SAFETY: as above; `need` was checked.
        let (elems, bits) = unsafe {
            super::avx512::decode::finish_u16(codes, j_codes, reference, out, tail.bytes(), signed)
        };
        done = elems;
        tail.consumed = bits;
    }
    // Bytes of `out` that `crc` has hashed.
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut hashed = 0;
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && matches!(T::BITS, 16 | 32) {
        // The vector pass folds the CRC-32 of what it writes (`avx2::crc`).
        let mut unused = crc32fast::Hasher::new();
        let h = crc.as_deref_mut().unwrap_or(&mut unused);
        // SAFETY: as above; `need` was checked.
        let (elems, bits) = unsafe {
            let mut fold = super::avx2::crc::Fold::new(h);
            let r = if T::BITS == 16 {
                super::avx2::decode::finish_u16(
                    codes,
                    j_codes,
                    reference,
                    out,
                    tail.bytes(),
                    0,
                    signed,
                    &mut fold,
                )
            } else {
                super::avx2::decode::finish_u32(
                    codes,
                    j_codes,
                    reference,
                    out,
                    tail.bytes(),
                    0,
                    signed,
                    &mut fold,
                )
            };
            fold.flush(h);
            r
        };
        done = elems;
        hashed = elems * T::SIZE;
        tail.consumed = bits;
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && T::BITS == 32 {
        // SAFETY: as above; `need` was checked.
        let (elems, bits) = unsafe {
            super::avx512::decode::finish_u32(codes, reference, out, tail.bytes(), signed)
        };
        done = elems;
        tail.consumed = bits;
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon && matches!(T::BITS, 16 | 32) {
        // SAFETY: `Isa::Neon` is only used where `Isa::available` confirmed it; `need` was
        // checked.
        let (elems, bits) = unsafe {
            if T::BITS == 16 {
                super::neon::decode::finish_u16(codes, reference, out, tail.bytes(), signed)
            } else {
                super::neon::decode::finish_u32(codes, reference, out, tail.bytes(), signed)
            }
        };
        done = elems;
        tail.consumed = bits;
    }
    // The scalar pass finishes what the vector passes left.
    finish_scalar::<T>(
        &codes[done..],
        j_codes,
        &reference[done * T::SIZE..],
        &mut out[done * T::SIZE..],
        &mut tail,
        signed,
    );
    // Bytes past the last whole element (none for a well-formed reference) read as zeros.
    for o in &mut out[codes.len().min(reference.len() / T::SIZE) * T::SIZE..] {
        o.write(0);
    }
    if let Some(h) = crc {
        // SAFETY: every byte of `out` is written (above, or by the passes before).
        let rest = &out[hashed.min(out.len())..];
        h.update(unsafe { std::slice::from_raw_parts(rest.as_ptr().cast::<u8>(), rest.len()) });
    }
    if need != c.tail_bits {
        return Err(bad("raw tail longer than the bit lengths require"));
    }
    Ok(())
}

/// The tail bits `codes` take: their lengths' sum.
#[inline(always)]
fn tail_need(codes: &[u32], j_codes: bool) -> u64 {
    let sum = if j_codes {
        // Joint symbols (`j_codes`): `J + 17 = 8·b + …` from J = 7 (b = 3) on, so the tail
        // length max(b - 3, 0) is `max(J - 7, 0) >> 3`.
        codes.iter().map(|&j| j.saturating_sub(7) >> 3).sum::<u32>()
    } else {
        codes
            .iter()
            .map(|&c| (c & 127).saturating_sub(3))
            .sum::<u32>()
    };
    sum as u64
}

/// Raw tails and the inverse transform one element at a time, joint symbols included
/// (`j_codes`: see `joint::stores_j`); the caller checked that `tail` holds
/// the bits the codes need ([`tail_need`]).
#[inline(always)]
fn finish_scalar<T: Word>(
    codes: &[u32],
    j_codes: bool,
    reference: &[u8],
    out: &mut [MaybeUninit<u8>],
    tail: &mut BitReader,
    signed: bool,
) {
    let of_j = super::joint::code_of_joint();
    for ((&code, r), o) in codes
        .iter()
        .zip(reference.chunks_exact(T::SIZE))
        .zip(out.chunks_exact_mut(T::SIZE))
    {
        let code = if j_codes {
            of_j[code as usize & 255]
        } else {
            code
        };
        let len = (code & 127).saturating_sub(3);
        let t = if T::BITS > 32 {
            tail.take::<true>(len)
        } else {
            tail.take::<false>(len)
        };
        let v = word::compose(code, t);
        let delta = word::displacement::<T>(v, (code >> 9) & 1 != 0, signed);
        let x =
            word::from_key::<T>(word::key::<T>(T::read(r)).wrapping_add(delta) & word::mask::<T>());
        let mut b = [0u8; 8];
        T::write(x, &mut b[..T::SIZE]);
        for (o, &b) in o.iter_mut().zip(&b) {
            o.write(b);
        }
    }
}
