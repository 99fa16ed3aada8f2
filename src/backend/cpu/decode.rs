//! Decoding one chunk: lanes step by step, stage by stage, then tails and the inverse
//! transform in one forward pass.

use super::bits::BitReader;
use super::tables::DecStage;
use super::word::{self, sign_state, InfoFn, Word};
use crate::delta::chunk::{EncodedChunk, LANES};
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::entropy::rans::RANS_L;
use crate::{Error, Result};

fn bad(detail: &str) -> Error {
    Error::format("tensor blob chunk", detail.to_string())
}

const SLOT_MASK: u32 = PROB_TOTAL - 1;

/// The stream every lane of a chunk reads from, in decoding order.
struct Stream<'a> {
    words: &'a [u16],
    pos: usize,
}

impl Stream<'_> {
    /// Advance `state` past the symbol `(freq, start)` and refill it.
    #[inline(always)]
    fn advance(&mut self, state: &mut u32, freq: u32, start: u32) -> Result<()> {
        let x = *state;
        let mut x = freq * (x >> PROB_BITS) + (x & SLOT_MASK) - start;
        if x < RANS_L {
            let w = *self
                .words
                .get(self.pos)
                .ok_or_else(|| bad("rANS word stream ended early"))?;
            x = (x << 16) | w as u32;
            self.pos += 1;
        }
        *state = x;
        Ok(())
    }

    /// Decode one binary symbol (0 with the state unchanged when the element is absent
    /// from this stage), branch-free: the refill word is read whether needed or not.
    #[inline(always)]
    fn binary(&mut self, state: &mut u32, t: &DecStage, present: bool, ctx: usize) -> Result<u32> {
        let f0 = t
            .f0(present, ctx)
            .ok_or_else(|| bad("a symbol's context has no frequency row"))?;
        let x = *state;
        let slot = x & SLOT_MASK;
        let sym = (slot >= f0) as u32;
        let (f, s) = if sym == 0 {
            (f0, 0)
        } else {
            (PROB_TOTAL - f0, f0)
        };
        let x = f * (x >> PROB_BITS) + slot - s;
        let need = x < RANS_L;
        let w = self.words.get(self.pos).copied();
        if need && w.is_none() {
            return Err(bad("rANS word stream ended early"));
        }
        *state = if need {
            (x << 16) | w.unwrap_or(0) as u32
        } else {
            x
        };
        self.pos += need as usize;
        Ok(sym)
    }
}

/// Decode chunk `c` against `reference` (this chunk's elements) into `out` (same size).
pub fn chunk<T: Word>(
    c: &EncodedChunk,
    reference: &[u8],
    out: &mut [u8],
    info_fn: InfoFn,
    signed: bool,
    w1: usize,
    stages: &[DecStage],
    neighbor: Option<usize>,
    scratch: &mut (Vec<u16>, Vec<u32>),
) -> Result<()> {
    let n = reference.len() / T::SIZE;
    let (info, codes) = (&mut scratch.0, &mut scratch.1);
    info.clear();
    info.extend(
        reference
            .chunks_exact(T::SIZE)
            .map(|r| info_fn.info::<T>(T::read(r)) as u16),
    );
    codes.clear();
    codes.resize(n, 0);
    let mut states = c.states;
    let mut st = Stream {
        words: &c.words,
        pos: 0,
    };
    let d = neighbor.unwrap_or(usize::MAX);
    let (bt, q1t, q2t) = (&stages[0], &stages[1], &stages[2]);
    for step in 0..n.div_ceil(LANES) {
        let base = step * LANES;
        let lanes = LANES.min(n - base);
        let inf = &info[base..base + lanes];
        for lane in 0..lanes {
            let state = &mut states[lane];
            let ri = bt.map[(inf[lane] & 255) as usize];
            if ri == u32::MAX {
                return Err(bad("a symbol's context has no frequency row"));
            }
            let slot = (*state & SLOT_MASK) as usize;
            let sym = bt.slot[ri as usize * PROB_TOTAL as usize + slot] as usize;
            let (f, s) = bt.fs[ri as usize * bt.alphabet + sym];
            st.advance(state, f, s)?;
            codes[base + lane] = sym as u32;
        }
        for lane in 0..lanes {
            let b = codes[base + lane] as usize;
            let eb = (inf[lane] & 255) as usize * w1 + b;
            let q1 = st.binary(&mut states[lane], q1t, b >= 2, eb)?;
            codes[base + lane] |= q1 << 7;
        }
        for lane in 0..lanes {
            let c = codes[base + lane];
            let b = (c & 127) as usize;
            let ctx = ((inf[lane] & 255) as usize * w1 + b) * 2 + ((c >> 7) & 1) as usize;
            let q2 = st.binary(&mut states[lane], q2t, b >= 3, ctx)?;
            codes[base + lane] |= q2 << 8;
        }
        if let Some(s_t) = stages.get(3) {
            for lane in 0..lanes {
                let j = base + lane;
                let b = (codes[j] & 127) as usize;
                let up = if j >= d { sign_state(codes[j - d]) } else { 0 };
                let eb = (inf[lane] & 255) as usize * w1 + b;
                let ctx = (eb * 3 + up as usize) * 2 + (inf[lane] >> 8) as usize;
                let neg = st.binary(&mut states[lane], s_t, b >= 1, ctx)?;
                codes[j] |= neg << 9;
            }
        }
    }
    if st.pos != c.words.len() || states.iter().any(|&s| s != RANS_L) {
        return Err(bad("rANS lanes did not end in their initial state"));
    }

    let mut tail = BitReader::new(&c.tail, c.tail_bits);
    for ((&code, r), o) in codes
        .iter()
        .zip(reference.chunks_exact(T::SIZE))
        .zip(out.chunks_exact_mut(T::SIZE))
    {
        let b = code & 127;
        let t = if b >= 4 {
            tail.get(b - 3)
                .ok_or_else(|| bad("raw tail shorter than the bit lengths require"))?
        } else {
            0
        };
        let v = word::compose(code, t);
        let delta = word::displacement::<T>(v, (code >> 9) & 1 != 0, signed);
        let x =
            word::from_key::<T>(word::key::<T>(T::read(r)).wrapping_add(delta) & word::mask::<T>());
        T::write(x, o);
    }
    if tail.consumed != c.tail_bits {
        return Err(bad("raw tail longer than the bit lengths require"));
    }
    Ok(())
}
