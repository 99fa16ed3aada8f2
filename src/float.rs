//! The exact float transform of the ULP-residual codec (ULPack, Appendix A).
//!
//! Every function here is a bijection on w-bit patterns, with w the float's width, and uses
//! only integer arithmetic: signed zeros, subnormals, infinities and NaN payloads all round-trip.
//! Values are carried in a `u64` whatever the width; only the low `w` bits are meaningful.
//!
//! ```text
//!   key(u)    = u ^ h            if the sign bit of u is clear   (h = 2^(w-1))
//!             = !u (mod 2^w)     otherwise
//!   delta     = key(x) - key(r)  mod 2^w, read as a w-bit two's-complement integer
//!   zigzag(d) = 2d for d >= 0, -2d - 1 for d < 0   (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...)
//! ```

/// All-ones mask of the low `w` bits.
#[inline]
pub fn mask(w: u32) -> u64 {
    if w == 64 {
        u64::MAX
    } else {
        (1u64 << w) - 1
    }
}

/// Map a float bit pattern to its ordered-integer key: numerically larger floats get larger keys.
#[inline]
pub fn to_key(u: u64, w: u32) -> u64 {
    let h = 1u64 << (w - 1);
    if u & h == 0 {
        u ^ h
    } else {
        !u & mask(w)
    }
}

/// Inverse of [`to_key`].
#[inline]
pub fn from_key(k: u64, w: u32) -> u64 {
    let h = 1u64 << (w - 1);
    if k & h != 0 {
        k ^ h
    } else {
        !k & mask(w)
    }
}

/// The signed rank displacement from reference `r` to target `x`, as a w-bit two's-complement
/// value sign-extended into an `i64`... except at w = 64 where it is the wrapped i64 itself.
#[inline]
pub fn displacement(r: u64, x: u64, w: u32) -> i64 {
    let d = to_key(x, w).wrapping_sub(to_key(r, w)) & mask(w);
    sign_extend(d, w)
}

/// Apply a displacement to a reference: the inverse of [`displacement`].
#[inline]
pub fn apply_displacement(r: u64, d: i64, w: u32) -> u64 {
    from_key(to_key(r, w).wrapping_add(d as u64) & mask(w), w)
}

#[inline]
fn sign_extend(v: u64, w: u32) -> i64 {
    let shift = 64 - w;
    ((v << shift) as i64) >> shift
}

/// ZigZag fold of a w-bit signed value into a w-bit unsigned one (the paper's ULP residual z).
#[inline]
pub fn zigzag(d: i64, w: u32) -> u64 {
    (((d as u64) << 1) ^ ((d >> 63) as u64)) & mask(w)
}

/// Inverse of [`zigzag`], returning the sign-extended w-bit signed value.
#[inline]
pub fn unzigzag(z: u64, w: u32) -> i64 {
    let d = (z >> 1) ^ (z & 1).wrapping_neg();
    sign_extend(d & mask(w), w)
}

/// Magnitude of a w-bit signed displacement as an unsigned number (|-2^(w-1)| = 2^(w-1) fits).
#[inline]
pub fn magnitude(d: i64, w: u32) -> u64 {
    let _ = w;
    d.unsigned_abs()
}

/// Rebuild a displacement from magnitude and sign (`negative`); inverse of [`magnitude`].
#[inline]
pub fn with_sign(m: u64, negative: bool, w: u32) -> i64 {
    let d = if negative { m.wrapping_neg() } else { m };
    sign_extend(d & mask(w), w)
}

/// Raw exponent field of a float bit pattern.
#[inline]
pub fn exponent_field(u: u64, mantissa_bits: u32, exponent_bits: u32) -> u32 {
    ((u >> mantissa_bits) & ((1u64 << exponent_bits) - 1)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_monotone_on_f32() {
        let vals = [
            f32::NEG_INFINITY,
            -1.5,
            -0.0,
            0.0,
            1e-45,
            1.0,
            f32::INFINITY,
        ];
        let keys: Vec<u64> = vals
            .iter()
            .map(|v| to_key(v.to_bits() as u64, 32))
            .collect();
        assert!(keys.windows(2).all(|p| p[0] < p[1]), "{keys:?}");
    }

    #[test]
    fn every_8bit_pair_roundtrips() {
        for r in 0..256u64 {
            for x in 0..256u64 {
                let d = displacement(r, x, 8);
                assert_eq!(apply_displacement(r, d, 8), x);
                let z = zigzag(d, 8);
                assert!(z < 256);
                assert_eq!(unzigzag(z, 8), d);
                let m = magnitude(d, 8);
                assert!(m <= 128);
                assert_eq!(with_sign(m, d < 0, 8), d);
            }
        }
    }

    #[test]
    fn extremes_at_64_bits() {
        for (r, x) in [
            (0u64, u64::MAX),
            (u64::MAX, 0),
            (1 << 63, 0),
            (0x7ff8_0000_0000_0001, 3),
        ] {
            let d = displacement(r, x, 64);
            assert_eq!(apply_displacement(r, d, 64), x);
            assert_eq!(unzigzag(zigzag(d, 64), 64), d);
            assert_eq!(with_sign(magnitude(d, 64), d < 0, 64), d);
        }
    }

    #[test]
    fn zigzag_small_values() {
        assert_eq!(zigzag(0, 16), 0);
        assert_eq!(zigzag(-1, 16), 1);
        assert_eq!(zigzag(1, 16), 2);
        assert_eq!(zigzag(-32768, 16), 65535);
    }
}
