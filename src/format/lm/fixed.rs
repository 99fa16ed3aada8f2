//! Integer arithmetic shared by the converter and the forward pass: the rounding rules, the
//! integer square root, exact float32 decomposition and the fixed-point exponential used to
//! build the tables. No floating-point operation anywhere (docs/INTEGER_GPT2.md §1, §6).

/// `round(x / 2^s)` with ties toward +inf: `(x + 2^(s-1)) >> s`. For `s <= 0`, `x << -s`
/// (saturating; callers clamp the result).
#[inline(always)]
pub fn round_shift(x: i128, s: i32) -> i128 {
    if s >= 1 {
        if s >= 127 {
            return 0;
        }
        (x + (1i128 << (s - 1))) >> s
    } else {
        let l = (-s).min(126) as u32;
        x.checked_mul(1i128 << l)
            .unwrap_or(if x < 0 { i128::MIN } else { i128::MAX })
    }
}

/// `round(n / d)` for `d > 0`, ties toward +inf: `floor((2n + d) / (2d))`.
#[inline(always)]
pub fn rdiv(n: i128, d: i128) -> i128 {
    debug_assert!(d > 0);
    let (num, den) = (2 * n + d, 2 * d);
    // A non-negative quotient of numbers below 2^64: the same floor by the 64-bit division
    // (the row scales of quantize_row take this path; a 128-bit one is a library call).
    if let (Ok(num), Ok(den)) = (u64::try_from(num), u64::try_from(den)) {
        return (num / den) as i128;
    }
    num.div_euclid(den)
}

/// Reciprocal for division by multiplication: `(r, s)` with `s = floor(log2 d) + 30` and
/// `r = floor(2^s / d)`, so `r ∈ (2^29, 2^30]`. `d > 0`, `d < 2^96`.
#[inline(always)]
pub fn recip(d: i128) -> (i128, i32) {
    debug_assert!(d > 0);
    let s = 127 - d.leading_zeros() as i32 + 30;
    if s < 64 {
        // 2^s and d fit u64: the same quotient by the 64-bit division.
        return (((1u64 << s) / d as u64) as i128, s);
    }
    ((1i128 << s) / d, s)
}

/// The run-time division `x / d` of the spec: `round_shift(x * r, s)` with `(r, s) = recip(d)`
/// (one division per row, a multiply per element). |x| must be below 2^96. It differs from the
/// exact rounding of x/d by less than |x/d| * 2^-29 + 1/2: below one unit for the quotients the
/// forward pass divides (|x/d| <= 2^22).
#[inline(always)]
pub fn div_recip(x: i128, (r, s): (i128, i32)) -> i128 {
    round_shift(x * r, s)
}

/// Round the exact rational `n / d` (`d > 0`) to the nearest integer, ties to even.
pub fn round_half_even(n: i128, d: i128) -> i128 {
    debug_assert!(d > 0);
    let q = n.div_euclid(d);
    let r = n - q * d; // 0 <= r < d
    let twice = 2 * r;
    if twice > d || (twice == d && q & 1 == 1) {
        q + 1
    } else {
        q
    }
}

/// Floor of the square root of `x`.
pub fn isqrt_u128(x: u128) -> u128 {
    if x < 2 {
        return x;
    }
    // Initial guess above the root: 2^(ceil(bits/2)).
    let bits = 128 - x.leading_zeros();
    let mut r: u128 = 1u128 << bits.div_ceil(2);
    loop {
        let next = (r + x / r) >> 1;
        if next >= r {
            break;
        }
        r = next;
    }
    while r * r > x {
        r -= 1;
    }
    while (r + 1) * (r + 1) <= x {
        r += 1;
    }
    r
}

/// An exact float32 value: `(-1)^neg * mant * 2^exp` (`mant < 2^24`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExactF32 {
    pub neg: bool,
    pub mant: u32,
    pub exp: i32,
}

impl ExactF32 {
    /// Decompose float32 bits. `None` for NaN and infinities.
    pub fn from_bits(bits: u32) -> Option<ExactF32> {
        let neg = bits >> 31 == 1;
        let e = ((bits >> 23) & 0xff) as i32;
        let f = bits & 0x7f_ffff;
        match e {
            0xff => None,
            0 => Some(ExactF32 {
                neg,
                mant: f,
                exp: -149,
            }),
            _ => Some(ExactF32 {
                neg,
                mant: f | 0x80_0000,
                exp: e - 150,
            }),
        }
    }

    pub fn is_zero(&self) -> bool {
        self.mant == 0
    }

    /// Signed mantissa.
    pub fn signed_mant(&self) -> i128 {
        if self.neg {
            -(self.mant as i128)
        } else {
            self.mant as i128
        }
    }

    /// floor(log2(|v|)) for a nonzero value.
    pub fn log2_floor(&self) -> i32 {
        debug_assert!(self.mant != 0);
        31 - self.mant.leading_zeros() as i32 + self.exp
    }

    /// Compare magnitudes exactly.
    pub fn abs_cmp(&self, other: &ExactF32) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        match (self.is_zero(), other.is_zero()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            _ => {}
        }
        let (a, b) = (self.log2_floor(), other.log2_floor());
        if a != b {
            return a.cmp(&b);
        }
        // Same binade: align mantissas to the same exponent.
        let sa = (self.mant as u64) << (self.exp - self.exp.min(other.exp)) as u32;
        let sb = (other.mant as u64) << (other.exp - self.exp.min(other.exp)) as u32;
        sa.cmp(&sb)
    }
}

/// Round `num_scale * v * 2^shift / den` (v exact float32) half to even, saturating into i128
/// range for absurd magnitudes (the caller range-checks). `den > 0`.
pub fn round_scaled(v: ExactF32, num_scale: i128, shift: i32, den: i128) -> i128 {
    if v.is_zero() {
        return 0;
    }
    let e = v.exp + shift;
    let n = v.signed_mant() * num_scale;
    if e >= 0 {
        let e = e.min(80) as u32;
        round_half_even(n << e, den)
    } else {
        let ne = (-e) as u32;
        // |n| < 2^24 * |num_scale|; if the divisor exceeds it by far the result is 0.
        if ne >= 100 {
            return 0;
        }
        match den.checked_mul(1i128 << ne) {
            Some(d) => round_half_even(n, d),
            None => 0,
        }
    }
}

/// ln 2 in Q62.
pub const LN2_Q62: i128 = 3196577161300663915;
/// sqrt(2/pi) in Q62.
pub const SQRT_2_OVER_PI_Q62: i128 = 3679593073373651226;
const ONE_Q62: i128 = 1 << 62;

/// e^(-x) in Q62 for x >= 0 given in Q62. Deterministic integer algorithm (§6).
pub fn exp_neg_q62(x: i128) -> i128 {
    debug_assert!(x >= 0);
    let k = x / LN2_Q62;
    if k >= 63 {
        return 0;
    }
    let r = x - k * LN2_Q62; // [0, ln2)
                             // Taylor series of e^(-r): sum (-r)^n / n!
    let mut term = ONE_Q62;
    let mut sum = ONE_Q62;
    let mut n = 1i128;
    loop {
        term = -((term * r) >> 62) / n;
        if term == 0 {
            break;
        }
        sum += term;
        n += 1;
    }
    sum >> k
}

/// tanh(u) in Q62 for u given in Q62 (any sign).
pub fn tanh_q62(u: i128) -> i128 {
    let a = u.abs();
    let e = exp_neg_q62(2 * a); // e^(-2|u|)
    let t = ONE_Q62 - ((2 * e) << 62) / (ONE_Q62 + e);
    if u < 0 {
        -t
    } else {
        t
    }
}

/// GPT-2 `gelu_new` table: index i in [0, 65536) is input (i - 32768) / 1024 (Q10 i16); the value
/// is the output in Q10.
pub fn gelu_table() -> Vec<i32> {
    (0..65536i64)
        .map(|i| {
            let xi = (i - 32768) as i128; // x = xi / 1024
                                          // x in Q62: xi << 52
            let x = xi << 52;
            // x^3 in Q62: xi^3 / 2^30 * 2^62 = xi^3 << 32
            let x3 = (xi * xi * xi) << 32;
            let inner = x + x3 * 44715 / 1_000_000;
            let u = (inner >> 31) * (SQRT_2_OVER_PI_Q62 >> 31);
            let t = tanh_q62(u);
            // 0.5 * x * (1 + t) * 1024 = xi * (2^62 + t) / 2^63
            round_half_even(xi * (ONE_Q62 + t), 1i128 << 63) as i32
        })
        .collect()
}

/// `round(2^bits * e^(-i/256))` for i = 0.. until it rounds to 0 (the 0 is not included).
pub fn exp_table(bits: u32) -> Vec<u64> {
    let mut out = Vec::new();
    let mut i: i128 = 0;
    loop {
        let e = exp_neg_q62((i << 62) / 256);
        let v = round_half_even(e << bits, 1i128 << 62) as u64;
        if v == 0 {
            break;
        }
        out.push(v);
        i += 1;
    }
    out
}

/// `round(2^40 / sqrt(dh))` as `(isqrt(2^82 / dh) + 1) >> 1`.
pub fn inv_sqrt_q40(dh: u32) -> i128 {
    ((isqrt_u128((1u128 << 82) / dh.max(1) as u128) + 1) >> 1) as i128
}

/// `round(x / 2^s)` in i64 with ties toward +inf, for the matmul rescale: `s` in 1..=63 is
/// `(x + 2^(s-1)) >> s`; `s >= 64` gives 0 (|x| < 2^62 there); `s <= 0` shifts left, saturating.
#[inline(always)]
pub fn round_shift64(x: i64, s: i32) -> i64 {
    if (1..=63).contains(&s) {
        (x + (1i64 << (s - 1))) >> s
    } else if s >= 64 {
        0
    } else {
        let l = (-s).min(62) as u32;
        x.checked_mul(1i64 << l)
            .unwrap_or(if x < 0 { i64::MIN } else { i64::MAX })
    }
}

/// Integer-only activation quantization of one row: returns `(q, t_m, t_e)` with
/// `real scale = t_m * 2^-t_e` per unit of q, given the input in Q`frac`; `t_m ∈ [2^15, 2^16)`.
pub fn quantize_row(y: &[i64], frac: i32, q: &mut [i8]) -> (i64, i32) {
    let a = y.iter().map(|v| v.unsigned_abs()).max().unwrap_or(0) as i128;
    if a == 0 {
        q.iter_mut().for_each(|v| *v = 0);
        return (0, 0);
    }
    let rc = recip(a);
    if a < 1 << 55 {
        // |127 v| < 2^62 and r <= 2^30 fit i64, so `div_recip` (s >= 30) is one 64 x 64 ->
        // 128-bit multiply, the rounding bit and a shift.
        let (r, s) = (rc.0 as i64, rc.1);
        for (o, &v) in q.iter_mut().zip(y) {
            let x = ((127 * v) as i128 * r as i128 + (1i128 << (s - 1))) >> s;
            *o = x.clamp(-127, 127) as i8;
        }
    } else {
        for (o, &v) in q.iter_mut().zip(y) {
            *o = div_recip(127 * v as i128, rc).clamp(-127, 127) as i8;
        }
    }
    quantize_scale(a, frac)
}

/// The scale `(t_m, t_e)` of a row quantized by [`quantize_row`] whose largest magnitude is
/// `a > 0`.
pub fn quantize_scale(a: i128, frac: i32) -> (i64, i32) {
    // t_m = rdiv(A * 2^k, 127) in [2^15, 2^16). A/127 ~ 2^(log2(A) - 7), so start from
    // k = 22 - floor(log2 A) and adjust.
    let lz = 127 - a.leading_zeros() as i32;
    let mut k = 22 - lz;
    loop {
        let tm = if k >= 0 {
            rdiv(a << k, 127)
        } else {
            rdiv(a, 127i128 << (-k))
        };
        if tm >= 1 << 16 {
            k -= 1;
        } else if tm < 1 << 15 {
            k += 1;
        } else {
            return (tm as i64, frac + k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_rules() {
        assert_eq!(round_shift(3, 1), 2); // 1.5 -> 2
        assert_eq!(round_shift(-3, 1), -1); // -1.5 -> -1 (toward +inf)
        assert_eq!(round_shift(5, 2), 1);
        assert_eq!(round_shift(5, 0), 5);
        assert_eq!(round_shift(5, -2), 20);
        assert_eq!(rdiv(7, 2), 4);
        assert_eq!(rdiv(-7, 2), -3);
        assert_eq!(round_half_even(5, 2), 2);
        assert_eq!(round_half_even(7, 2), 4);
        assert_eq!(round_half_even(-5, 2), -2);
        assert_eq!(round_half_even(-7, 2), -4);
    }

    #[test]
    fn reciprocal_division_is_close_to_exact() {
        for d in [
            1i128,
            3,
            7,
            127,
            1000,
            123456789,
            1 << 40,
            (1 << 50) + 12345,
        ] {
            for x in [0i128, 1, -1, 5, 1 << 20, -(1 << 33) + 7, 999_999_999] {
                if (x / d).abs() > 1 << 22 {
                    continue; // the spec uses it for quotients below 2^22
                }
                let a = div_recip(x, recip(d));
                assert!((a - rdiv(x, d)).abs() <= 1, "{x}/{d}");
            }
        }
        assert_eq!(div_recip(254, recip(127)), 2);
    }

    #[test]
    fn isqrt_exact() {
        for x in [
            0u128,
            1,
            2,
            3,
            4,
            15,
            16,
            17,
            1 << 100,
            (1 << 100) - 1,
            u128::MAX >> 2,
        ] {
            let r = isqrt_u128(x);
            assert!(r * r <= x && (r + 1) * (r + 1) > x, "{x}");
        }
    }

    #[test]
    fn f32_decomposition_is_exact() {
        let v = ExactF32::from_bits(0.1f32.to_bits()).unwrap();
        assert_eq!((v.mant, v.exp), (13421773, -27));
        assert!(ExactF32::from_bits(f32::NAN.to_bits()).is_none());
        let sub = ExactF32::from_bits(1).unwrap();
        assert_eq!((sub.mant, sub.exp), (1, -149));
        // 127 * 0.5 / 1.0 = 63.5 -> 64 (even)
        let half = ExactF32::from_bits(0.5f32.to_bits()).unwrap();
        assert_eq!(round_scaled(half, 127, 0, 1), 64);
    }

    #[test]
    fn exp_tables_match_known_values() {
        let t = exp_table(40);
        assert_eq!(t[0], 1 << 40);
        // e^-1 * 2^40 = 404487723188.4 -> 404487723188 (within one unit of rounding noise)
        assert!((t[256] as i64 - 404_487_723_188).abs() <= 1, "{}", t[256]);
        assert!(t.len() > 7000 && t.len() < 7400);
        let g = gelu_table();
        assert_eq!(g[32768], 0);
        // gelu(1) = 0.8411920 -> 861.38 -> 861
        assert_eq!(g[32768 + 1024], 861);
        // gelu(-1) = -0.158808 -> -162.6 -> -163
        assert_eq!(g[32768 - 1024], -163);
        assert_eq!(inv_sqrt_q40(64), 1 << 37);
    }

    /// The 64-bit paths of `rdiv`, `recip` and `quantize_row` give the 128-bit definitions'
    /// integers, across their boundaries.
    #[test]
    fn narrow_paths_equal_the_wide_definitions() {
        let mut x = 13u64;
        let mut rnd = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            x
        };
        let mut vals: Vec<i128> = (0..126)
            .flat_map(|b| [1i128 << b, (1i128 << b) - 1])
            .collect();
        vals.extend((0..2000).map(|i| (rnd() as i128) >> (i % 64)));
        for &n in &vals {
            for &d in vals.iter().step_by(7) {
                if d > 0 && n.unsigned_abs() < 1 << 100 && d < 1 << 100 {
                    assert_eq!(rdiv(n, d), (2 * n + d).div_euclid(2 * d), "{n} {d}");
                    assert_eq!(rdiv(-n, d), (-2 * n + d).div_euclid(2 * d), "{n} {d}");
                }
            }
            if n > 0 && n < 1 << 96 {
                let s = 127 - n.leading_zeros() as i32 + 30;
                assert_eq!(recip(n), ((1i128 << s) / n, s), "{n}");
            }
        }
        // Rows whose largest magnitude sits on each side of 2^55, extremes and random values.
        for top in [1i64, 127, 1 << 20, (1 << 55) - 1, 1 << 55, 1 << 57, 1 << 60] {
            let mut y: Vec<i64> = (0..67).map(|_| (rnd() as i64) % top).collect();
            y[3] = top;
            y[9] = -top;
            y[11] = top / 2;
            y[12] = -(top / 2) - 1;
            let (mut got, mut want) = (vec![0i8; y.len()], vec![0i8; y.len()]);
            let scale = quantize_row(&y, 5, &mut got);
            let rc = recip(top as i128);
            for (o, &v) in want.iter_mut().zip(&y) {
                *o = div_recip(127 * v as i128, rc).clamp(-127, 127) as i8;
            }
            assert_eq!(got, want, "top {top}");
            assert!((1 << 15..1 << 16).contains(&scale.0));
        }
    }

    #[test]
    fn quantize_row_scale() {
        let y = [1000i64, -500, 0, 250];
        let mut q = [0i8; 4];
        let (tm, te) = quantize_row(&y, 0, &mut q);
        assert_eq!(q, [127, -63, 0, 32]); // -63.5: the reciprocal lands just above, -> -63
        assert!((1 << 15..1 << 16).contains(&tm));
        // tm * 2^-te ~ 1000/127 = 7.874
        let approx = (tm as i128 * 1000) >> te;
        assert_eq!(approx, 7874);
    }
}
