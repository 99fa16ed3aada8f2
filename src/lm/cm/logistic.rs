//! Integer logistic functions: `squash` (stretch domain -> 12-bit probability) and its inverse
//! `stretch` (docs/INTEGER_GPT2.md §13.1).
//!
//! The stretch domain has 8 fractional bits: `d` stands for the log-odds `d / 256`, clamped to
//! [-2047, 2047]. `squash` interpolates linearly between 33 knots, `4096 / (1 + e^-(k - 16) / 2)`
//! rounded, which are constants (the same as lpaq1's); `stretch` is the table that inverts it,
//! built by integer code at first use. No floating point anywhere.

use std::sync::LazyLock;

/// Knots of the logistic curve at d = -2048, -1920, ..., 2048.
const KNOTS: [i32; 33] = [
    1, 2, 3, 6, 10, 16, 27, 45, 73, 120, 194, 310, 488, 747, 1101, 1546, 2047, 2549, 2994, 3348,
    3607, 3785, 3901, 3975, 4022, 4050, 4068, 4079, 4085, 4089, 4092, 4093, 4094,
];

/// Largest magnitude in the stretch domain.
pub const LIMIT: i32 = 2047;

/// Probability (of a 1, in 1/4096) for log-odds `d` (8 fractional bits).
pub fn squash(d: i32) -> i32 {
    if d > LIMIT {
        return 4095;
    }
    if d < -LIMIT {
        return 1;
    }
    let w = d & 127;
    let i = ((d >> 7) + 16) as usize;
    (KNOTS[i] * (128 - w) + KNOTS[i + 1] * w + 64) >> 7
}

static STRETCH: LazyLock<Vec<i16>> = LazyLock::new(|| {
    // stretch(p) is the smallest d with squash(d) >= p (LIMIT where none is).
    let mut t = vec![LIMIT as i16; 4096];
    let mut next = 0usize;
    for d in -LIMIT..=LIMIT {
        let v = squash(d) as usize;
        while next <= v {
            t[next] = d as i16;
            next += 1;
        }
    }
    t
});

/// Log-odds (8 fractional bits) of probability `p` in 1/4096; `p` is clamped to [0, 4095].
pub fn stretch(p: i32) -> i32 {
    STRETCH[p.clamp(0, 4095) as usize] as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretch_inverts_squash() {
        assert_eq!(squash(0), 2047);
        assert_eq!(squash(5000), 4095);
        assert_eq!(squash(-5000), 1);
        for d in -LIMIT..=LIMIT {
            let p = squash(d);
            assert!((1..=4095).contains(&p));
            // squash is monotone, so stretch(squash(d)) is the first d' with the same value.
            assert!(stretch(p) <= d && squash(stretch(p)) == p);
        }
        for p in 1..4096 {
            assert!(stretch(p) >= stretch(p - 1));
        }
    }
}
