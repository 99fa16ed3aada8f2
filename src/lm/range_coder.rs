//! 64-bit range coder with a frequency total of 2^32 (docs/INTEGER_GPT2.md §8).
//!
//! `range / total` is `range >> 32`. After renormalization `range >= 2^56`, so `r >= 2^24` and a
//! symbol of frequency 1 still leaves `range >= 2^24 > 0`.
//!
//! Carry handling: `low` is the low 64 bits of the interval start; the bytes already written
//! are the higher digits. When `low + r*cum` overflows 2^64 the carry is added to the written
//! bytes: trailing 0xFF bytes become 0x00 and the byte before them is incremented. The
//! interval always lies inside [0, 1) of the whole output, so the carry never runs past the
//! first byte.

pub const TOTAL_BITS: u32 = 32;
const TOP: u64 = 1 << 56;

/// Range encoder writing into a byte vector.
pub struct Encoder {
    low: u64,
    range: u64,
    out: Vec<u8>,
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Encoder {
    pub fn new() -> Self {
        Encoder {
            low: 0,
            range: u64::MAX,
            out: Vec::new(),
        }
    }

    /// Encode a symbol occupying `[cum, cum + freq)` of the 2^32 total (`freq >= 1`).
    pub fn encode(&mut self, cum: u64, freq: u64) {
        debug_assert!(freq >= 1 && cum + freq <= 1 << TOTAL_BITS);
        let r = self.range >> TOTAL_BITS;
        let (low, carry) = self.low.overflowing_add(r * cum);
        self.low = low;
        if carry {
            self.propagate_carry();
        }
        self.range = r * freq;
        while self.range < TOP {
            self.out.push((self.low >> 56) as u8);
            self.low <<= 8;
            self.range <<= 8;
        }
    }

    fn propagate_carry(&mut self) {
        for b in self.out.iter_mut().rev() {
            if *b == 0xff {
                *b = 0;
            } else {
                *b += 1;
                return;
            }
        }
        // Unreachable for a well-formed interval (it stays inside [0, 1)).
        debug_assert!(false, "range coder carry ran past the first byte");
    }

    /// The bytes written so far that no later carry can change: those before the last one
    /// below 0xFF (a carry stops at the first such byte from the end and changes nothing
    /// before it). A decoder may read them while the encoder is still running.
    pub fn settled(&self) -> &[u8] {
        let end = self.out.iter().rposition(|&b| b != 0xff).unwrap_or(0);
        &self.out[..end]
    }

    /// Flush the final 8 bytes of `low` and return the stream.
    pub fn finish(mut self) -> Vec<u8> {
        self.out.extend_from_slice(&self.low.to_be_bytes());
        self.out
    }
}

/// Where a [`Decoder`] reads the coded bytes: a slice, or a stream still being written.
pub trait Source {
    /// Byte `pos` of the coded data; `None` past its end (waiting, for a stream being
    /// written, until the byte or the end is known).
    fn byte(&mut self, pos: usize) -> Option<u8>;
    /// How many of the bytes before `pos` lie past the end: 0 while the end is unknown (a
    /// stream's reader has then not read past what was written).
    fn past_end(&self, pos: usize) -> usize;
}

impl Source for &[u8] {
    #[inline]
    fn byte(&mut self, pos: usize) -> Option<u8> {
        self.get(pos).copied()
    }
    fn past_end(&self, pos: usize) -> usize {
        pos.saturating_sub(self.len())
    }
}

/// Range decoder over a byte source (a slice unless told otherwise); reading past the end
/// yields zero bytes.
pub struct Decoder<S: Source> {
    value: u64,
    range: u64,
    data: S,
    pos: usize,
}

impl<'a> Decoder<&'a [u8]> {
    pub fn new(data: &'a [u8]) -> Self {
        Decoder::from_source(data)
    }
}

impl<S: Source> Decoder<S> {
    pub fn from_source(data: S) -> Self {
        let mut d = Decoder {
            value: 0,
            range: u64::MAX,
            data,
            pos: 0,
        };
        for _ in 0..8 {
            d.value = (d.value << 8) | d.next_byte() as u64;
        }
        d
    }

    fn next_byte(&mut self) -> u8 {
        let b = self.data.byte(self.pos).unwrap_or(0);
        self.pos += 1;
        b
    }

    /// The target in `[0, 2^32)`: the decoder finds the symbol with `cum <= target < cum+freq`.
    pub fn target(&self) -> u64 {
        let r = self.range >> TOTAL_BITS;
        (self.value / r).min((1 << TOTAL_BITS) - 1)
    }

    /// Consume the symbol `[cum, cum + freq)` found for `target()`.
    pub fn consume(&mut self, cum: u64, freq: u64) {
        let r = self.range >> TOTAL_BITS;
        // For a valid stream value >= r*cum; a corrupt one may violate it: wrap, never panic.
        self.value = self.value.wrapping_sub(r * cum);
        self.range = r * freq;
        if self.value >= self.range {
            // Corrupt stream: keep the invariant value < range so the decoder stays total.
            self.value %= self.range.max(1);
        }
        while self.range < TOP {
            self.value = (self.value << 8) | self.next_byte() as u64;
            self.range <<= 8;
        }
    }

    /// Bytes consumed so far (past the end included).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes consumed so far beyond the end of the data (a sign of truncation).
    pub fn overrun(&self) -> usize {
        self.data.past_end(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Find the symbol whose cumulative interval holds `target`: `cum[s] <= target < cum[s+1]`,
    /// `cum` having `n + 1` entries from 0 to 2^32. Binary search.
    fn find_symbol(cum: &[u64], target: u64) -> usize {
        // partition_point gives the first index with cum[i] > target; the symbol is one before.
        let i = cum.partition_point(|&c| c <= target);
        i.saturating_sub(1).min(cum.len().saturating_sub(2))
    }

    fn cum_of(freqs: &[u64]) -> Vec<u64> {
        let mut c = vec![0u64];
        for f in freqs {
            c.push(c.last().unwrap() + f);
        }
        c
    }

    #[test]
    fn roundtrip_skewed_and_extreme() {
        // One huge symbol, several frequency-1 symbols: exercises carries and long runs.
        let mut freqs = vec![1u64; 10];
        freqs[3] = (1u64 << 32) - 9;
        let cum = cum_of(&freqs);
        let mut seq = Vec::new();
        let mut x = 12345u64;
        for _ in 0..20000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            seq.push(if (x >> 60) < 13 {
                3
            } else {
                ((x >> 33) % 10) as usize
            });
        }
        let mut e = Encoder::new();
        for &s in &seq {
            e.encode(cum[s], freqs[s]);
        }
        let bytes = e.finish();
        let mut d = Decoder::new(&bytes);
        for &s in &seq {
            let t = d.target();
            let got = find_symbol(&cum, t);
            assert_eq!(got, s);
            d.consume(cum[got], freqs[got]);
        }
        assert_eq!(d.overrun(), 0);
    }

    #[test]
    fn settled_bytes_never_change() {
        // Runs of 0xFF bytes and carries into them (symbols at the top of the interval, then
        // anywhere): each byte as `settled` first gave it out is the final stream's byte.
        let mut x = 7u64;
        let mut e = Encoder::new();
        let (mut given, mut carries) = (Vec::new(), 0);
        for i in 0..100_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let (cum, freq) = match (x >> 61, i % 400 < 200) {
                (0, _) => (0, 1 + (x >> 40) % 1000),
                (_, true) => ((1 << 32) - 2, 2),
                _ => ((x >> 33) % (1 << 31), 1 << 30),
            };
            let before = e.out.clone();
            e.encode(cum, freq);
            carries += (e.out[..before.len()] != before[..]) as u32;
            let now = e.settled();
            given.extend_from_slice(&now[given.len().min(now.len())..]);
        }
        let bytes = e.finish();
        assert!(carries > 100, "{carries} carries");
        assert!(given.len() > 1000 && bytes.starts_with(&given));
    }

    #[test]
    fn corrupt_stream_never_panics() {
        let freqs = [1u64 << 31, 1 << 30, (1 << 30) - 1, 1];
        let cum = cum_of(&freqs);
        for seed in 0..50u8 {
            let data: Vec<u8> = (0..40)
                .map(|i| (i as u8).wrapping_mul(seed) ^ 0xa5)
                .collect();
            let mut d = Decoder::new(&data);
            for _ in 0..200 {
                let s = find_symbol(&cum, d.target());
                assert!(s < 4);
                d.consume(cum[s], freqs[s]);
            }
        }
    }
}
