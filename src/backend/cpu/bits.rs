//! Raw-tail bit packing, LSB first in element order (docs/FORMAT.md), 64 bits at a time.

#[derive(Default)]
pub struct BitWriter {
    out: Vec<u8>,
    acc: u128,
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
        self.acc |= (v as u128) << self.n;
        self.n += nbits;
        self.bits += nbits as u64;
        if self.n >= 64 {
            self.out.extend_from_slice(&(self.acc as u64).to_le_bytes());
            self.acc >>= 64;
            self.n -= 64;
        }
    }
    pub fn bits(&self) -> u64 {
        self.bits
    }
    /// The packed bytes so far, the last one zero-padded.
    pub fn bytes(&self) -> Vec<u8> {
        let rest = self.n.div_ceil(8) as usize;
        let mut out = Vec::with_capacity(self.out.len() + rest);
        out.extend_from_slice(&self.out);
        out.extend_from_slice(&(self.acc as u64).to_le_bytes()[..rest]);
        out
    }
}

/// Reads what [`BitWriter`] wrote; every read is checked against the declared bit count.
pub struct BitReader {
    /// The tail, padded with 16 zero bytes so every read is one unaligned 16-byte load.
    buf: Vec<u8>,
    limit: u64,
    pub consumed: u64,
}

impl BitReader {
    pub fn new(tail: &[u8], limit: u64) -> Self {
        let mut buf = Vec::with_capacity(tail.len() + 16);
        buf.extend_from_slice(tail);
        buf.resize(tail.len() + 16, 0);
        BitReader {
            buf,
            limit: limit.min(tail.len() as u64 * 8),
            consumed: 0,
        }
    }
    /// The next `nbits` (at most 61) bits, or `None` past the end.
    #[inline(always)]
    pub fn get(&mut self, nbits: u32) -> Option<u64> {
        let end = self.consumed + nbits as u64;
        if end > self.limit {
            return None;
        }
        let at = (self.consumed / 8) as usize;
        let word = u128::from_le_bytes(self.buf[at..at + 16].try_into().unwrap());
        let v = (word >> (self.consumed % 8)) as u64 & ((1u64 << nbits) - 1);
        self.consumed = end;
        Some(v)
    }
}
