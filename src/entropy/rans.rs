//! Static rANS with a 32-bit state and 16-bit output words (after ryg_rans / DietGPU).
//!
//! Read me first:
//! - rANS is last-in, first-out. The encoder visits symbols in the reverse of decoding order and
//!   its output words are reversed at the end, so the decoder reads forward.
//! - Interleaving needs no signalling: several states share one word stream, and as long as the
//!   decoder performs the exact mirror image of the encoder's sequence of operations, each state
//!   pulls the words its encoder pushed. The codec fixes that sequence (docs/FORMAT.md).
//! - State invariant: `x` in `[RANS_L, RANS_L << 16)`. Encoding a symbol of frequency `f` first
//!   flushes one word if `x >= f << (32 - PROB_BITS)`; one flush always suffices. Decoding reads
//!   one word if the state fell below `RANS_L`. A symbol with `f == PROB_TOTAL` costs nothing.

use super::freq::PROB_BITS;

/// Lower bound of the normalized state interval.
pub const RANS_L: u32 = 1 << 16;

/// Encode one symbol `(start, freq)` onto `state`, pushing at most one word onto `out`.
#[inline]
pub fn enc_put(state: &mut u32, out: &mut Vec<u16>, start: u32, freq: u32) {
    let x_max = (freq as u64) << (32 - PROB_BITS);
    let mut x = *state;
    if x as u64 >= x_max {
        out.push(x as u16);
        x >>= 16;
    }
    *state = ((x / freq) << PROB_BITS) + (x % freq) + start;
}

/// The slot (`0..PROB_TOTAL`) the decoder looks up to find the next symbol.
#[inline]
pub fn dec_get(state: u32) -> u32 {
    state & ((1 << PROB_BITS) - 1)
}

/// Remove the decoded symbol `(start, freq)` from the state and refill it from `words` at `*pos`.
/// Returns `false` if a word was needed but the stream is exhausted (corrupt input).
#[inline]
pub fn dec_advance(state: &mut u32, words: &[u16], pos: &mut usize, start: u32, freq: u32) -> bool {
    let x = *state;
    let mut x = freq * (x >> PROB_BITS) + (x & ((1 << PROB_BITS) - 1)) - start;
    if x < RANS_L {
        match words.get(*pos) {
            Some(&w) => {
                x = (x << 16) | w as u32;
                *pos += 1;
            }
            None => return false,
        }
    }
    *state = x;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entropy::freq::{normalize, PROB_TOTAL};

    #[test]
    fn two_interleaved_states_roundtrip() {
        let counts = [50u64, 30, 15, 5];
        let freqs = normalize(&counts);
        let starts: Vec<u32> = freqs
            .iter()
            .scan(0, |s, &f| {
                let v = *s;
                *s += f;
                Some(v)
            })
            .collect();
        let symbols: Vec<usize> = (0..10_000).map(|i| (i * 7 + i / 3) % 4).collect();
        let mut states = [RANS_L; 2];
        let mut words = Vec::new();
        for (i, &s) in symbols.iter().enumerate().rev() {
            enc_put(&mut states[i % 2], &mut words, starts[s], freqs[s]);
        }
        words.reverse();
        let mut pos = 0;
        for (i, &want) in symbols.iter().enumerate() {
            let st = &mut states[i % 2];
            let slot = dec_get(*st);
            let s = (0..4).find(|&s| slot < starts[s] + freqs[s]).unwrap();
            assert_eq!(s, want);
            assert!(dec_advance(st, &words, &mut pos, starts[s], freqs[s]));
        }
        assert_eq!(states, [RANS_L; 2]);
        assert_eq!(pos, words.len());
        let _ = PROB_TOTAL;
    }
}
