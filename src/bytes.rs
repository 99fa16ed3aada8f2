//! Little-endian byte writing and bounds-checked reading, shared by every on-disk format.
//! Readers return `Error::Format` on truncation or impossible values; they never panic.

use crate::{Error, Result};

#[derive(Default)]
pub struct ByteWriter {
    pub buf: Vec<u8>,
}

impl ByteWriter {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    /// LEB128: 7 bits per byte, low groups first, high bit set on all but the last byte.
    pub fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }
    /// A varint length followed by the bytes.
    pub fn blob(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.bytes(b);
    }
}

/// Size in bytes of `v` as a varint.
pub fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

pub struct ByteReader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> ByteReader<'a> {
    /// `what` names the structure being read, for error messages.
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Self { buf, pos: 0, what }
    }
    pub fn pos(&self) -> usize {
        self.pos
    }
    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos..]
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    pub fn err(&self, detail: impl Into<String>) -> Error {
        Error::format(self.what, detail)
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated: needed {n} bytes at offset {}, {} left",
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            let bits = (b & 0x7f) as u64;
            if i == 9 && b > 1 {
                return Err(self.err("varint overflows 64 bits"));
            }
            v |= bits << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.err("varint longer than 10 bytes"))
    }
    /// A varint that must not exceed `max` (used for counts that size allocations).
    pub fn varint_max(&mut self, max: u64, field: &str) -> Result<u64> {
        let v = self.varint()?;
        if v > max {
            return Err(self.err(format!("{field} = {v} exceeds its limit {max}")));
        }
        Ok(v)
    }
    /// A count of items that follow, each at least `min_bytes` long: it must fit in the bytes
    /// left, so no count read from a file can size an allocation beyond the file itself.
    pub fn count(&mut self, min_bytes: usize, field: &str) -> Result<u64> {
        let max = (self.remaining() / min_bytes.max(1)) as u64;
        self.varint_max(max, field)
    }
    pub fn blob(&mut self) -> Result<&'a [u8]> {
        let n = self.varint_max(self.remaining() as u64, "length")?;
        self.take(n as usize)
    }
    pub fn expect_end(&self) -> Result<()> {
        if self.remaining() != 0 {
            return Err(self.err(format!("{} unexpected trailing bytes", self.remaining())));
        }
        Ok(())
    }
}

/// Open a blob framed as `magic (4 bytes) | body | CRC-32 of magic and body (u32)`: check the
/// magic and the checksum, and return a reader positioned after the magic. `what` names the
/// structure (e.g. "tensor blob") in errors.
pub fn open_checked<'a>(
    bytes: &'a [u8],
    magic: &[u8; 4],
    what: &'static str,
) -> Result<ByteReader<'a>> {
    if bytes.len() < 8 || &bytes[..4] != magic {
        return Err(Error::format(
            what,
            format!("not a lockstep {what} (bad magic)"),
        ));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_le_bytes(crc.try_into().unwrap());
    let computed = crc32(body);
    if stored != computed {
        return Err(Error::checksum32(
            format!("{what} (CRC-32)"),
            stored,
            computed,
        ));
    }
    let mut r = ByteReader::new(body, what);
    r.take(4)?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_roundtrip_and_sizes_match() {
        for v in [0u64, 1, 127, 128, 16383, 16384, u32::MAX as u64, u64::MAX] {
            let mut w = ByteWriter::new();
            w.varint(v);
            assert_eq!(w.len(), varint_len(v));
            let mut r = ByteReader::new(&w.buf, "test");
            assert_eq!(r.varint().unwrap(), v);
            r.expect_end().unwrap();
        }
    }

    #[test]
    fn truncation_is_an_error() {
        let mut r = ByteReader::new(&[0x80, 0x80], "test");
        assert!(r.varint().is_err());
        let mut r = ByteReader::new(&[1, 2, 3], "test");
        assert!(r.u32().is_err());
    }
}

/// Feed `bytes` to a BLAKE3 hasher, large inputs on the rayon pool (BLAKE3 is a tree:
/// `update_rayon` hashes subtrees on every thread, same hash). A delta file's header holds
/// the whole checkpoint's hash, made by one thread before any tensor is coded while the
/// other cores waited (one thread hashed the fp32 trajectory's 29 MB in 8-14 ms, timed in
/// a decode on a Zen 3 VM).
pub fn blake3_update(h: &mut blake3::Hasher, bytes: &[u8]) {
    // blake3's advice: below about 128 KiB the threads cost more than they save.
    if bytes.len() >= 1 << 20 && rayon::current_num_threads() > 1 {
        h.update_rayon(bytes);
    } else {
        h.update(bytes);
    }
}

/// The BLAKE3 hash of `bytes` ([`blake3_update`]: large inputs on the rayon pool).
pub fn blake3(bytes: &[u8]) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    blake3_update(&mut h, bytes);
    h.finalize()
}

/// CRC-32 (the `crc32fast::hash` value) of `bytes`: large inputs in 1 MiB pieces on the
/// rayon pool, their CRCs combined in order, so hashing a big tensor or blob does not hold
/// the other threads up.
pub fn crc32(bytes: &[u8]) -> u32 {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 20;
    if bytes.len() <= 2 * PIECE || rayon::current_num_threads() == 1 {
        return crc32fast::hash(bytes);
    }
    bytes
        .par_chunks(PIECE)
        .map(|c| {
            let mut h = crc32fast::Hasher::new();
            h.update(c);
            h
        })
        .reduce(crc32fast::Hasher::new, |mut a, b| {
            a.combine(&b);
            a
        })
        .finalize()
}

#[cfg(test)]
mod crc_tests {
    #[test]
    fn parallel_crc_is_the_serial_crc() {
        let data: Vec<u8> = (0..5 * (1u32 << 20) + 123)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for len in [0, 1, 2 << 20, (2 << 20) + 1, 3 << 20, data.len()] {
            let want = crc32fast::hash(&data[..len]);
            assert_eq!(pool.install(|| super::crc32(&data[..len])), want, "{len}");
            assert_eq!(super::crc32(&data[..len]), want, "{len}");
        }
    }
}
