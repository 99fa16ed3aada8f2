//! From a (reference, target) element pair to the symbols the entropy coder sees, and back.
//!
//! Two layouts of the same exact transform (src/float.rs):
//!
//! - **Paper** (ULPack): the coded value is the ZigZag residual `z`; its sign lives in the raw
//!   tail as z's lowest bit.
//! - **Signed** (lockstep's default where it wins): the coded value is the magnitude `|delta|`
//!   and the sign of every non-zero update becomes its own modeled stage, because in real
//!   training the sign is predictable from what the decoder already holds.
//!
//! - **Joint** (the fast layout, `--fast`): the Signed layout's symbols, but b, q1, q2 and the
//!   sign are coded as one joint symbol ([`joint_symbol`]) under the reference's exponent class
//!   and sign only. One table lookup per weight instead of up to four, and no context reads a
//!   neighbor, so every lane decodes independently: about 2.5x faster decoding for a few
//!   percent more bytes (docs/BENCHMARKS.md). Defined for widths up to 32 bits.
//!
//! Either way the value `v` is split into its bit length `b`, the two bits `q1`, `q2` below
//! the leading one, and a raw tail of `max(b - 3, 0)` bits.

use crate::dtype::FloatLayout;
use crate::float;

/// Which value is decomposed and whether the sign is modeled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    Paper = 0,
    Signed = 1,
    Joint = 2,
}

impl Layout {
    /// Whether the coded value is the magnitude with a separate sign (Signed, Joint) rather
    /// than the ZigZag fold (Paper).
    #[inline]
    pub fn signed(self) -> bool {
        self != Layout::Paper
    }
}

/// Widest float the Joint layout is defined for (its alphabet must fit a byte).
pub const JOINT_MAX_WIDTH: u32 = 32;

/// Size of the joint (b, q1, q2, sign) alphabet for `w`-bit floats: b = 0 alone, b = 1 with
/// a sign, b = 2 with q1 and a sign, b >= 3 with q1, q2 and a sign.
#[inline]
pub fn joint_alphabet(w: u32) -> usize {
    7 + 8 * (w as usize).saturating_sub(2)
}

/// The joint symbol of an element (Joint layout): compact, in order of b, then q1, q2, sign.
///
/// | b | symbol |
/// |---|---|
/// | 0 | 0 |
/// | 1 | 1 + neg |
/// | 2 | 3 + 2·q1 + neg |
/// | ≥ 3 | 7 + 8·(b − 3) + 4·q1 + 2·q2 + neg |
#[inline]
pub fn joint_symbol(s: &Sym) -> usize {
    let (q1, q2, neg) = (s.q1 as usize, s.q2 as usize, s.neg as usize);
    match s.b {
        0 => 0,
        1 => 1 + neg,
        2 => 3 + 2 * q1 + neg,
        b => 7 + 8 * (b as usize - 3) + 4 * q1 + 2 * q2 + neg,
    }
}

/// Inverse of [`joint_symbol`]: (b, q1, q2, neg).
#[inline]
pub const fn joint_parts(j: usize) -> (u8, u8, u8, u8) {
    match j {
        0 => (0, 0, 0, 0),
        1 | 2 => (1, 0, 0, (j - 1) as u8),
        3..=6 => (2, ((j - 3) >> 1) as u8, 0, ((j - 3) & 1) as u8),
        _ => {
            let k = j - 7;
            (
                (3 + (k >> 3)) as u8,
                ((k >> 2) & 1) as u8,
                ((k >> 1) & 1) as u8,
                (k & 1) as u8,
            )
        }
    }
}

/// The decoder-side facts about one element that contexts may use: all from the reference.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RefInfo {
    /// Exponent class of the reference value (its exponent field, see [`exp_class`]).
    pub er: u8,
    /// Sign bit of the reference value.
    pub rs: u8,
    /// The two mantissa bits of the reference just below its exponent field.
    pub m2: u8,
}

/// What a later element may see of an already-decoded neighbor: its update's sign state and
/// its bit length. `b = NO_NEIGHBOR` when there is no neighbor in the chunk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Neighbor {
    pub sign: u8,
    pub b: u8,
}

/// Bit-length class of a missing neighbor: above every real bit length (<= 64).
pub const NO_NEIGHBOR: u8 = 65;

impl Neighbor {
    pub const NONE: Neighbor = Neighbor {
        sign: 0,
        b: NO_NEIGHBOR,
    };
    #[inline]
    pub fn of(s: &Sym) -> Neighbor {
        Neighbor {
            sign: sign_state(s),
            b: s.b,
        }
    }
}

/// The neighbor `distance` places before element `j` of a chunk's symbols, if in the chunk.
#[inline]
pub fn neighbor(syms: &[Sym], j: usize, distance: Option<usize>) -> Neighbor {
    match distance {
        Some(d) if j >= d => Neighbor::of(&syms[j - d]),
        _ => Neighbor::NONE,
    }
}

/// One element's coded symbols.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sym {
    /// Bit length of the coded value, 0 ..= w.
    pub b: u8,
    /// First bit below the leading one (valid when b >= 2).
    pub q1: u8,
    /// Second bit below the leading one (valid when b >= 3).
    pub q2: u8,
    /// 1 if the update is negative (Signed layout, valid when b >= 1).
    pub neg: u8,
    /// The `b - 3` raw bits below q2 (valid when b >= 4).
    pub tail: u64,
}

/// Number of exponent classes: contexts reserve this many whatever the dtype.
pub const EXP_CLASSES: usize = 256;

/// The reference's exponent class. For types with at most 8 exponent bits it is the exponent
/// field itself. f64's 11-bit field is clamped to 256 classes around the bias
/// (`clamp(e - 1023 + 128, 0, 255)`): magnitudes from 2^-128 to 2^127 keep their own class.
#[inline]
pub fn exp_class(u: u64, fl: FloatLayout) -> u8 {
    let e = float::exponent_field(u, fl.mantissa_bits, fl.exponent_bits);
    if fl.exponent_bits <= 8 {
        e as u8
    } else {
        (e as i64 - 1023 + 128).clamp(0, 255) as u8
    }
}

#[inline]
pub fn ref_info(r: u64, fl: FloatLayout) -> RefInfo {
    RefInfo {
        er: exp_class(r, fl),
        rs: (r >> (fl.width - 1)) as u8 & 1,
        m2: ((r >> (fl.mantissa_bits - 2)) & 3) as u8,
    }
}

/// Bit length: 0 for 0, else the position of the leading one plus one.
#[inline]
pub fn bitlen(v: u64) -> u8 {
    (64 - v.leading_zeros()) as u8
}

/// Split a coded value into (b, q1, q2, tail).
#[inline]
pub fn decompose(v: u64, neg: bool) -> Sym {
    let b = bitlen(v);
    let bit = |i: u8| ((v >> i) & 1) as u8;
    Sym {
        b,
        q1: if b >= 2 { bit(b - 2) } else { 0 },
        q2: if b >= 3 { bit(b - 3) } else { 0 },
        neg: neg as u8,
        tail: if b >= 4 {
            v & ((1u64 << (b - 3)) - 1)
        } else {
            0
        },
    }
}

/// Inverse of [`decompose`] (the value only; the sign is carried separately).
#[inline]
pub fn compose(s: &Sym) -> u64 {
    match s.b {
        0 => 0,
        1 => 1,
        2 => 2 | s.q1 as u64,
        b => {
            let top = (4 | (s.q1 as u64) << 1 | s.q2 as u64) << (b - 3);
            top | s.tail
        }
    }
}

/// Symbols of target element `x` against reference element `r`.
#[inline]
pub fn encode_element(r: u64, x: u64, w: u32, layout: Layout) -> Sym {
    let d = float::displacement(r, x, w);
    match layout {
        Layout::Paper => decompose(float::zigzag(d, w), false),
        Layout::Signed | Layout::Joint => decompose(float::magnitude(d, w), d < 0),
    }
}

/// Target element from its symbols and the reference element.
#[inline]
pub fn decode_element(r: u64, s: &Sym, w: u32, layout: Layout) -> u64 {
    let v = compose(s);
    let d = match layout {
        Layout::Paper => float::unzigzag(v, w),
        Layout::Signed | Layout::Joint => float::with_sign(v, s.neg != 0, w),
    };
    float::apply_displacement(r, d, w)
}

/// The sign state a later element sees of this one: 0 no update, 1 up, 2 down.
#[inline]
pub fn sign_state(s: &Sym) -> u8 {
    if s.b == 0 {
        0
    } else {
        1 + s.neg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decompose_compose_roundtrip() {
        for v in (0..5000u64).chain([u64::MAX, 1 << 63, (1 << 63) + 12345]) {
            let s = decompose(v, false);
            assert_eq!(compose(&s), v, "{v}");
            assert_eq!(s.b as u32, 64 - v.leading_zeros());
        }
    }

    #[test]
    fn joint_symbols_are_dense_and_invert() {
        for w in [8u32, 16, 32] {
            let mut seen = vec![false; joint_alphabet(w)];
            for v in 0..(1u64 << 12) {
                for neg in [false, true] {
                    let mut s = decompose(v, neg && v != 0);
                    if s.b as u32 > w {
                        continue;
                    }
                    s.tail = 0;
                    let j = joint_symbol(&s);
                    seen[j] = true;
                    assert_eq!(joint_parts(j), (s.b, s.q1, s.q2, s.neg), "w={w} v={v}");
                }
            }
            // Every b up to 12 is reached by the values above; wider b by the formula.
            let reached = joint_alphabet(12.min(w));
            assert!(seen[..reached].iter().all(|&x| x), "w={w}");
            let top = Sym {
                b: w as u8,
                q1: 1,
                q2: 1,
                neg: 1,
                tail: 0,
            };
            assert_eq!(joint_symbol(&top), joint_alphabet(w) - 1);
        }
        assert!(joint_alphabet(JOINT_MAX_WIDTH) <= 256);
    }
}
