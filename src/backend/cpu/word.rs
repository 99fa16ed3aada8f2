//! Element widths as types, so each inner loop is compiled once per width with constant
//! shifts and masks, and the per-element arithmetic shared by the fast passes.

use crate::dtype::FloatLayout;

pub trait Word: bytemuck::Pod + Default + Send + Sync + 'static {
    const BITS: u32;
    const SIZE: usize = (Self::BITS / 8) as usize;
    /// Element from `SIZE` little-endian bytes.
    fn read(b: &[u8]) -> u64;
    fn write(v: u64, out: &mut [u8]);
    fn from_u64(v: u64) -> Self;
    fn get(self) -> u64;
}

macro_rules! word {
    ($t:ty) => {
        impl Word for $t {
            const BITS: u32 = <$t>::BITS;
            #[inline(always)]
            fn read(b: &[u8]) -> u64 {
                <$t>::from_le_bytes(b.try_into().unwrap()) as u64
            }
            #[inline(always)]
            fn write(v: u64, out: &mut [u8]) {
                out.copy_from_slice(&(v as $t).to_le_bytes());
            }
            #[inline(always)]
            fn from_u64(v: u64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn get(self) -> u64 {
                self as u64
            }
        }
    };
}
word!(u8);
word!(u16);
word!(u32);
word!(u64);

#[inline(always)]
pub fn mask<T: Word>() -> u64 {
    u64::MAX >> (64 - T::BITS)
}

/// Ordered-integer key (src/float.rs `to_key`), branch-free.
#[inline(always)]
pub fn key<T: Word>(u: u64) -> u64 {
    let h = 1u64 << (T::BITS - 1);
    let neg = ((u >> (T::BITS - 1)) & 1).wrapping_neg() & mask::<T>();
    u ^ (neg | h)
}

/// Inverse of [`key`].
#[inline(always)]
pub fn from_key<T: Word>(k: u64) -> u64 {
    let h = 1u64 << (T::BITS - 1);
    let pos = ((k >> (T::BITS - 1)) & 1).wrapping_sub(1) & mask::<T>();
    k ^ (pos | h)
}

#[inline(always)]
pub fn sign_extend<T: Word>(d: u64) -> i64 {
    ((d << (64 - T::BITS)) as i64) >> (64 - T::BITS)
}

/// The coded value of displacement `d` and whether the update is negative (Signed layout),
/// or its ZigZag fold with the sign inside (Paper layout).
#[inline(always)]
pub fn value<T: Word>(d: u64, signed: bool) -> (u64, u32) {
    let sd = sign_extend::<T>(d);
    if signed {
        (sd.unsigned_abs(), (sd < 0) as u32)
    } else {
        ((((sd as u64) << 1) ^ ((sd >> 63) as u64)) & mask::<T>(), 0)
    }
}

/// Inverse of [`value`]: the w-bit displacement.
#[inline(always)]
pub fn displacement<T: Word>(v: u64, neg: bool, signed: bool) -> u64 {
    let d = if signed {
        if neg {
            v.wrapping_neg()
        } else {
            v
        }
    } else {
        (v >> 1) ^ (v & 1).wrapping_neg()
    };
    d & mask::<T>()
}

/// Packed per-element symbols: b in bits 0..7, q1 bit 7, q2 bit 8, neg bit 9.
#[inline(always)]
pub fn code(v: u64, neg: u32) -> u32 {
    let b = 64 - v.leading_zeros();
    let q1 = ((v >> b.saturating_sub(2)) & 1) as u32 & (b >= 2) as u32;
    let q2 = ((v >> b.saturating_sub(3)) & 1) as u32 & (b >= 3) as u32;
    b | q1 << 7 | q2 << 8 | neg << 9
}

/// Rebuild the coded value from b, q1, q2 and the raw tail.
#[inline(always)]
pub fn compose(c: u32, tail: u64) -> u64 {
    // The leading one and q1, q2 as three bits `1 q1 q2`, moved to the top of a b-bit value
    // (b = 0, 1, 2 shift them down and out; their absent q bits decoded as 0).
    let b = c & 127;
    let top = (4 | ((c >> 7) & 1) << 1 | ((c >> 8) & 1)) as u64;
    let v = if b >= 3 {
        top << (b - 3)
    } else {
        top >> (3 - b)
    };
    v | tail
}

/// Decoder-side facts of a reference element: exponent class (bits 0..8), sign (bit 8), the
/// two mantissa bits below the exponent field (bits 9..11).
#[derive(Clone, Copy)]
pub struct InfoFn {
    mant: u32,
    emask: u64,
    wide: bool,
    condition: bool,
}

impl InfoFn {
    pub fn new(fl: FloatLayout, condition: bool) -> Self {
        InfoFn {
            mant: fl.mantissa_bits,
            emask: (1u64 << fl.exponent_bits) - 1,
            wide: fl.exponent_bits > 8,
            condition,
        }
    }
    /// `info` of every element of `reference` into `out` (16-bit elements in 32-bit
    /// arithmetic with the exponent mask zeroed when not conditioning, so it vectorizes).
    #[inline(always)]
    pub fn fill<T: Word>(&self, reference: &[u8], out: &mut Vec<u16>) {
        out.clear();
        out.resize(reference.len() / T::SIZE, 0);
        if T::BITS == 16 && !self.wide {
            let (mant, emask) = (self.mant, self.emask as u32 * self.condition as u32);
            for (o, b) in out.iter_mut().zip(reference.chunks_exact(2)) {
                let r = u16::from_le_bytes([b[0], b[1]]) as u32;
                *o = ((r >> mant) & emask | (r >> 15) << 8 | ((r >> (mant - 2)) & 3) << 9) as u16;
            }
        } else {
            for (o, r) in out.iter_mut().zip(reference.chunks_exact(T::SIZE)) {
                *o = self.info::<T>(T::read(r)) as u16;
            }
        }
    }

    /// [`InfoFn::fill`] for elements `range` only: `out` holds at least the reference's
    /// elements afterwards (grown with zeros where shorter), those outside `range` as they
    /// were.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn fill_range<T: Word>(
        &self,
        reference: &[u8],
        out: &mut Vec<u16>,
        range: std::ops::Range<usize>,
    ) {
        let n = reference.len() / T::SIZE;
        if out.len() < n {
            out.resize(n, 0);
        }
        for j in range {
            out[j] = self.info::<T>(T::read(&reference[j * T::SIZE..(j + 1) * T::SIZE])) as u16;
        }
    }

    /// `(mant, emask)` with which an element `r` of a float up to 32 bits wide has the J
    /// context `((r >> mant) & emask)·2 + sign` (`joint::context` of its facts): for the
    /// vector joint decoders, which read contexts straight from the reference.
    pub fn joint_params(&self) -> (u32, u32) {
        debug_assert!(!self.wide);
        (self.mant, self.emask as u32 * self.condition as u32)
    }

    /// Whether the exponent class is used (`COND` of [`InfoFn::info_as`]).
    pub fn condition(&self) -> bool {
        self.condition
    }
    /// Whether the exponent field is wider than a class (`WIDE` of [`InfoFn::info_as`]).
    pub fn wide(&self) -> bool {
        self.wide
    }
    /// [`InfoFn::info`] with `condition` and `wide` as constants, for vectorized loops.
    #[inline(always)]
    pub fn info_as<T: Word, const COND: bool, const WIDE: bool>(&self, r: u64) -> u32 {
        let e = (r >> self.mant) & self.emask;
        let er = if !COND {
            0
        } else if WIDE {
            (e as i64 - 1023 + 128).clamp(0, 255) as u32
        } else {
            e as u32
        };
        er | (((r >> (T::BITS - 1)) & 1) as u32) << 8 | (((r >> (self.mant - 2)) & 3) as u32) << 9
    }
    #[inline(always)]
    pub fn info<T: Word>(&self, r: u64) -> u32 {
        let e = (r >> self.mant) & self.emask;
        let er = if !self.condition {
            0
        } else if self.wide {
            (e as i64 - 1023 + 128).clamp(0, 255) as u32
        } else {
            e as u32
        };
        er | (((r >> (T::BITS - 1)) & 1) as u32) << 8 | (((r >> (self.mant - 2)) & 3) as u32) << 9
    }
}

/// Reference sign of packed facts.
#[inline(always)]
pub fn rs(info: u16) -> usize {
    ((info >> 8) & 1) as usize
}

/// Bit-length class of the neighbor `d` elements before `j` in the chunk: its b, or `w1`
/// when there is none (`Neighbor::NONE` clamped to the space, as `Space::context` does).
#[inline(always)]
pub fn neighbor_b(codes: &[u32], j: usize, d: usize, w1: usize) -> usize {
    if j >= d {
        (codes[j - d] & 127) as usize
    } else {
        w1
    }
}

/// B context: `er`, or in the neighbor form `(m2·(W1+1) + nb)·256 + er`.
#[inline(always)]
pub fn b_context(info: u16, nb: usize, w1: usize, neighbor: bool) -> usize {
    let er = (info & 255) as usize;
    if neighbor {
        ((((info >> 9) & 3) as usize * (w1 + 1) + nb) << 8) + er
    } else {
        er
    }
}

/// Sign state of the neighbor `d` elements before `j` (0 when there is none).
#[inline(always)]
pub fn up(codes: &[u32], j: usize, d: usize) -> u32 {
    if j >= d {
        sign_state(codes[j - d])
    } else {
        0
    }
}

/// Sign state another element's S context sees: 0 no update, 1 up, 2 down.
#[inline(always)]
pub fn sign_state(c: u32) -> u32 {
    if c & 127 == 0 {
        0
    } else {
        1 + ((c >> 9) & 1)
    }
}
