//! The one bit packer of the formats: fields LSB first, in order, the last byte zero-padded
//! (the delta codec's raw tails, docs/FORMAT.md, and the anchor codec's mantissa tails).
//! Written 64 bits at a time because the CPU device's tail passes are hot; the readable
//! reference (`format::chunk`) uses the same writer and reader.

#[derive(Default)]
pub struct BitWriter {
    out: Vec<u8>,
    /// The pending bits, `n < 64` of them.
    acc: u64,
    n: u32,
    bits: u64,
}

impl BitWriter {
    pub fn clear(&mut self) {
        self.out.clear();
        self.acc = 0;
        self.n = 0;
        self.bits = 0;
    }
    /// Append the low `nbits` (at most 64) of `v`, which has no bits above them.
    #[inline(always)]
    pub fn put(&mut self, v: u64, nbits: u32) {
        debug_assert!(nbits >= 64 || v >> nbits == 0, "bits above the field");
        self.put_many([v], [nbits]);
    }
    /// `put(v[i], nbits[i])` for each `i` in order, the writer's state kept in registers.
    ///
    /// Branch-free but for the (predictable) capacity check: the accumulator is stored every
    /// time and kept only when it has filled.
    #[inline(always)]
    pub fn put_many<const N: usize>(&mut self, v: [u64; N], nbits: [u32; N]) {
        self.out.reserve(8 * N);
        let (mut acc, mut n, mut len) = (self.acc, self.n, self.out.len());
        let ptr = self.out.as_mut_ptr();
        let mut bits = 0;
        for i in 0..N {
            let total = n + nbits[i];
            bits += nbits[i] as u64;
            let a = acc | v[i] << n;
            // SAFETY: `reserve(8 * N)` leaves room for 8 bytes at `len` (at most `8 * i`
            // past the length on entry).
            unsafe {
                ptr.add(len)
                    .cast::<[u8; 8]>()
                    .write_unaligned(a.to_le_bytes())
            };
            let full = total >= 64;
            len += 8 * full as usize;
            // Filled: what did not fit of `v` (`v >> (64 - n)`, 0 for `n == 0`).
            acc = if full { (v[i] >> 1) >> (63 - n) } else { a };
            n = total & 63;
        }
        // SAFETY: every byte below `len` was written (above, or before this call).
        unsafe { self.out.set_len(len) };
        (self.acc, self.n, self.bits) = (acc, n, self.bits + bits);
    }
    pub fn bits(&self) -> u64 {
        self.bits
    }
    /// The packed bytes, the last one zero-padded.
    pub fn finish(self) -> Vec<u8> {
        let mut out = self.out;
        out.extend_from_slice(&self.acc.to_le_bytes()[..self.n.div_ceil(8) as usize]);
        out
    }
    /// The packed bytes so far, the last one zero-padded.
    pub fn bytes(&self) -> Vec<u8> {
        let rest = self.n.div_ceil(8) as usize;
        let mut out = Vec::with_capacity(self.out.len() + rest);
        out.extend_from_slice(&self.out);
        out.extend_from_slice(&self.acc.to_le_bytes()[..rest]);
        out
    }
}

/// Reads what [`BitWriter`] wrote, in place. Fast callers check the total length first (the
/// bit lengths say how long the tail must be), so [`BitReader::take`] needs no error path:
/// past the end it gives zeros, never undefined behavior or a panic. [`BitReader::get`] is
/// the checked read, for the reference.
pub struct BitReader<'a> {
    tail: &'a [u8],
    pub consumed: u64,
}

impl<'a> BitReader<'a> {
    pub fn new(tail: &'a [u8]) -> Self {
        BitReader { tail, consumed: 0 }
    }
    /// The whole tail (for the vector tail passes).
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub fn bytes(&self) -> &'a [u8] {
        self.tail
    }
    /// The next `nbits` bits: at most 57, or 61 with `WIDE` (a 16-byte load).
    #[inline(always)]
    pub fn take<const WIDE: bool>(&mut self, nbits: u32) -> u64 {
        let at = (self.consumed / 8) as usize;
        let shift = self.consumed % 8;
        let v = if WIDE {
            (u128::from_le_bytes(self.load(at)) >> shift) as u64
        } else {
            u64::from_le_bytes(self.load(at)) >> shift
        };
        self.consumed += nbits as u64;
        v & ((1u64 << nbits) - 1)
    }
    /// The next `nbits` (at most 61) bits, or `None` if they would pass `limit` bits.
    pub fn get(&mut self, nbits: u32, limit: u64) -> Option<u64> {
        if self.consumed + nbits as u64 > limit {
            return None;
        }
        Some(self.take::<true>(nbits))
    }
    /// `N` bytes from `at`, zeros past the end (one unaligned load but near the end).
    #[inline(always)]
    fn load<const N: usize>(&self, at: usize) -> [u8; N] {
        match self.tail.get(at..at + N) {
            Some(b) => b.try_into().unwrap(),
            None => {
                let mut b = [0u8; N];
                let rest = self.tail.get(at..).unwrap_or(&[]);
                b[..rest.len()].copy_from_slice(rest);
                b
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, one bit at a time: field bits in order, each byte filled from its
    /// least significant bit.
    fn naive(fields: &[(u64, u32)]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = 0usize;
        for &(v, n) in fields {
            for i in 0..n {
                if at.is_multiple_of(8) {
                    out.push(0);
                }
                out[at / 8] |= (((v >> i) & 1) as u8) << (at % 8);
                at += 1;
            }
        }
        out
    }

    #[test]
    fn packs_lsb_first_and_reads_back() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut fields = Vec::new();
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = (x % 62) as u32;
            let v = if n == 0 {
                0
            } else {
                (x >> 3) & ((1u64 << n) - 1)
            };
            fields.push((v, n));
        }
        let mut w = BitWriter::default();
        for &(v, n) in &fields {
            w.put(v, n);
        }
        let total: u64 = fields.iter().map(|f| f.1 as u64).sum();
        assert_eq!(w.bits(), total);
        assert_eq!(w.bytes(), naive(&fields));
        let bytes = w.finish();
        assert_eq!(bytes, naive(&fields));

        let (mut fast, mut checked) = (BitReader::new(&bytes), BitReader::new(&bytes));
        for &(v, n) in &fields {
            if n <= 57 {
                assert_eq!(fast.take::<false>(n), v);
            } else {
                assert_eq!(fast.take::<true>(n), v);
            }
            assert_eq!(checked.get(n, total), Some(v));
        }
        assert_eq!(
            checked.get(1, total),
            None,
            "reading past the limit is refused"
        );
        assert_eq!(fast.take::<false>(8), 0, "past the end reads zeros");
    }
}
