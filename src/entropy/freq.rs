//! Integer frequency normalization and cost estimation.
//!
//! Every backend produces integer histograms; this host-side code turns them into the tables
//! that are transmitted. It is integer-only so that two machines given the same counts make the
//! same tables and the same encoder decisions, bit for bit.

/// Probability precision of the rANS tables: every row sums to `1 << PROB_BITS`.
pub const PROB_BITS: u32 = 12;
/// Sum of every normalized row.
pub const PROB_TOTAL: u32 = 1 << PROB_BITS;

/// Scale `counts` to frequencies summing to [`PROB_TOTAL`], giving every symbol seen at least 1
/// and unseen symbols 0.
///
/// Rule (deterministic, documented in docs/FORMAT.md): `f = max(1, floor(c * TOTAL / N))` for each
/// seen symbol; then the shortfall is added to the symbol with the largest count (ties: lowest
/// index), or an excess is removed one unit at a time from the symbol with the largest
/// frequency above 1 (ties: lowest index). Returns all zeros when `counts` are all zero.
pub fn normalize(counts: &[u64]) -> Vec<u32> {
    normalize_to(counts, PROB_BITS)
}

/// [`normalize`] to a total of `1 << bits` (`bits <= PROB_BITS`; needs at least as many slots
/// as seen symbols). Coarser rows are cheaper to transmit: the table format scales them up.
pub fn normalize_to(counts: &[u64], bits: u32) -> Vec<u32> {
    let mut freqs = Vec::new();
    normalize_into(counts, bits, &mut freqs);
    freqs
}

/// [`normalize_to`] into `freqs` (resized to `counts.len()`): table selection normalizes
/// every context at every candidate precision, thousands of small rows per tensor, where
/// an allocation per row cost as much as the row.
pub fn normalize_into(counts: &[u64], bits: u32, freqs: &mut Vec<u32>) {
    let n: u64 = counts.iter().sum();
    let total = 1u64 << bits;
    normalize_by(counts, n, bits, freqs, |_, c| quotient(c, total, n));
}

/// `floor(c · total / n)` (`n > 0`): c·total fits in u64 unless c is huge; the quotient is
/// the same either way.
#[inline(always)]
fn quotient(c: u64, total: u64, n: u64) -> u64 {
    match c.checked_mul(total) {
        Some(p) => p / n,
        None => (c as u128 * total as u128 / n as u128) as u64,
    }
}

/// `floor(c · PROB_TOTAL / N)` of every count `c` (N their sum) into `out`: what
/// [`normalize_from_quotients`] needs for every precision at once.
pub fn full_quotients(counts: &[u64], out: &mut Vec<u64>) {
    let n: u64 = counts.iter().sum();
    out.clear();
    if n > 0 {
        out.extend(counts.iter().map(|&c| quotient(c, PROB_TOTAL as u64, n)));
    } else {
        out.resize(counts.len(), 0);
    }
}

/// [`normalize_into`] from the counts' [`full_quotients`]: a precision's quotient
/// `floor(c · 2^bits / N)` is the full one shifted right by `PROB_BITS - bits` (a floor of a
/// floor divided by an integer is the floor of the whole quotient), so a row priced at
/// several precisions divides once per count instead of once per count and precision.
pub fn normalize_from_quotients(
    counts: &[u64],
    quotients: &[u64],
    bits: u32,
    freqs: &mut Vec<u32>,
) {
    debug_assert_eq!(counts.len(), quotients.len());
    let n: u64 = counts.iter().sum();
    let shift = PROB_BITS - bits;
    normalize_by(counts, n, bits, freqs, |i, _| quotients[i] >> shift);
}

/// The rule of [`normalize`] to `1 << bits`, with `q(i, c)` = `floor(c · 2^bits / n)` for
/// the seen symbols.
#[inline(always)]
fn normalize_by(
    counts: &[u64],
    n: u64,
    bits: u32,
    freqs: &mut Vec<u32>,
    q: impl Fn(usize, u64) -> u64,
) {
    freqs.clear();
    freqs.resize(counts.len(), 0);
    if n == 0 {
        return;
    }
    let total = 1u64 << bits;
    let mut sum: i64 = 0;
    for (i, (f, &c)) in freqs.iter_mut().zip(counts).enumerate() {
        if c > 0 {
            *f = (q(i, c) as u32).max(1);
            sum += *f as i64;
        }
    }
    let target = total as i64;
    if sum < target {
        let best = argmax(counts.iter().copied());
        freqs[best] += (target - sum) as u32;
    }
    if sum > target {
        remove_excess(freqs, (sum - target) as u64);
    }
}

/// Remove `excess` units as the rule does, one at a time from the largest frequency above 1
/// (ties: lowest index), without doing them one at a time: that was an argmax over the
/// alphabet per unit, and an excess of up to one unit per seen symbol (each symbol forced up
/// to 1 adds less than one), so quadratic in the alphabet: 247 symbols for 32-bit floats,
/// most of `normalize_to`'s time, which table selection runs for every context of every
/// candidate precision. One at a time, the units come off the top: every frequency above
/// some level `l` ends at `l`, and the few units left after that come off the lowest-index
/// frequencies at `l`, one each. `l` is the lowest level whose units above it do not exceed
/// the excess (found by bisection).
fn remove_excess(freqs: &mut [u32], excess: u64) {
    let above = |l: u32| -> u64 { freqs.iter().map(|&f| f.saturating_sub(l) as u64).sum() };
    // The rule only takes from frequencies above 1, and their units above 1 cover any excess
    // (`normalize_to` needs at least as many slots as seen symbols), so `l >= 1` suffices.
    let (mut lo, mut hi) = (1u32, freqs.iter().copied().max().unwrap_or(1).max(1));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if above(mid) <= excess {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let level = lo;
    // Fewer than the frequencies at `level` after clipping (`above(level - 1)` exceeds the
    // excess), and none when `level` is 1.
    let mut left = excess - above(level);
    for f in freqs.iter_mut() {
        if *f > level {
            *f = level;
        }
    }
    for f in freqs.iter_mut() {
        if left == 0 {
            break;
        }
        if *f == level {
            *f -= 1;
            left -= 1;
        }
    }
    debug_assert_eq!(left, 0);
}

fn argmax(values: impl Iterator<Item = u64>) -> usize {
    let mut best = 0;
    let mut best_v = 0;
    for (i, v) in values.enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

/// Fixed-point scale of cost estimates: 1 bit = 65536 units.
pub const COST_ONE_BIT: u64 = 1 << 16;

/// `log2(x)` in 16.16 fixed point for `x >= 1`, computed with integers only (bit-by-bit
/// squaring), so every machine gets the same value and the same encoder decisions.
pub fn log2_fixed(x: u64) -> u64 {
    debug_assert!(x >= 1);
    let n = 63 - x.leading_zeros() as u64;
    // y in [2^31, 2^32) represents the mantissa x / 2^n in [1, 2) with 31 fractional bits.
    let mut y: u64 = if n >= 31 {
        x >> (n - 31)
    } else {
        x << (31 - n)
    };
    let mut frac = 0u64;
    for _ in 0..16 {
        y = (y * y) >> 31;
        frac <<= 1;
        if y >= 1 << 32 {
            y >>= 1;
            frac |= 1;
        }
    }
    (n << 16) | frac
}

/// Cost in [`COST_ONE_BIT`] units of coding symbols with `counts` under `freqs` (each symbol
/// costs `PROB_BITS - log2(freq)` bits). Every counted symbol must have a non-zero frequency.
/// The per-symbol cost of every possible frequency is looked up, not recomputed: table
/// selection runs this for every context of every candidate.
pub fn cost(counts: &[u64], freqs: &[u32]) -> u64 {
    static BITS: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    let bits = BITS.get_or_init(|| {
        (0..=PROB_TOTAL as u64)
            .map(|f| PROB_BITS as u64 * COST_ONE_BIT - log2_fixed(f.max(1)))
            .collect()
    });
    counts
        .iter()
        .zip(freqs)
        .filter(|(&c, _)| c > 0)
        .map(|(&c, &f)| c * bits[f as usize])
        .sum()
}

/// How far [`log2_fixed`] may fall below `log2(x)·COST_ONE_BIT`: it truncates and never
/// overestimates (test `log2_fixed_brackets_log2`).
const LOG2_SLACK: u64 = 8;

/// A floor, in [`COST_ONE_BIT`] units, under [`cost`] of `counts` for every row of
/// frequencies summing to at most `PROB_TOTAL`: their empirical entropy `Σ c·log2(n/c)`
/// (Gibbs' inequality), each `log2(c)` taken [`LOG2_SLACK`] high so the rounding of
/// `log2_fixed` cannot lift it above the true entropy; `cost`'s own per-symbol bits are
/// never below the exact ones. Lets table selection pool a row without pricing it where
/// even its entropy would not pay for its own row.
pub fn entropy_floor(counts: &[u64]) -> u64 {
    static LOG2: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    let small = LOG2.get_or_init(|| {
        (0..=PROB_TOTAL as u64)
            .map(|x| log2_fixed(x.max(1)))
            .collect()
    });
    let log2 = |x: u64| {
        small
            .get(x as usize)
            .copied()
            .unwrap_or_else(|| log2_fixed(x))
    };
    let n: u64 = counts.iter().sum();
    if n == 0 {
        return 0;
    }
    let ln = log2(n) as i128;
    let sum: i128 = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| c as i128 * (ln - (log2(c) + LOG2_SLACK) as i128))
        .sum();
    sum.clamp(0, u64::MAX as i128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizing_from_full_quotients_is_normalizing() {
        let mut lcg = crate::test_lcg(0x0DDB_A11C_0FFE_E123);
        let mut next = || lcg() >> 33;
        let (mut q, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3000 {
            let len = 1 + next() as usize % 120;
            let counts: Vec<u64> = (0..len)
                .map(|_| match next() % 4 {
                    0 => 0,
                    1 => next() % 1_000_000,
                    2 => 1,
                    _ => next() % 30,
                })
                .collect();
            let seen = counts.iter().filter(|&&c| c > 0).count() as u64;
            full_quotients(&counts, &mut q);
            for bits in [PROB_BITS, 11, 10, 8, 6, 1] {
                if 1u64 << bits < seen {
                    continue;
                }
                normalize_into(&counts, bits, &mut a);
                normalize_from_quotients(&counts, &q, bits, &mut b);
                assert_eq!(a, b, "{counts:?} at {bits} bits");
            }
        }
    }

    #[test]
    fn looked_up_cost_is_the_definition() {
        let freqs: Vec<u32> = (1..=PROB_TOTAL).step_by(37).collect();
        let counts: Vec<u64> = (0..freqs.len() as u64).map(|i| i % 5).collect();
        let direct: u64 = counts
            .iter()
            .zip(&freqs)
            .filter(|(&c, _)| c > 0)
            .map(|(&c, &f)| c * (PROB_BITS as u64 * COST_ONE_BIT - log2_fixed(f as u64)))
            .sum();
        assert_eq!(cost(&counts, &freqs), direct);
    }

    /// The rule as docs/FORMAT.md states it, one unit at a time; and the units it removed.
    fn normalize_one_unit_at_a_time(counts: &[u64], bits: u32) -> (Vec<u32>, u64) {
        let n: u64 = counts.iter().sum();
        let total = 1u64 << bits;
        let mut freqs: Vec<u32> = counts
            .iter()
            .map(|&c| match c {
                0 => 0,
                c => ((c as u128 * total as u128 / n as u128) as u32).max(1),
            })
            .collect();
        let mut sum: i64 = freqs.iter().map(|&f| f as i64).sum();
        if n > 0 && sum < total as i64 {
            freqs[argmax(counts.iter().copied())] += (total as i64 - sum) as u32;
        }
        let mut removed = 0;
        while sum > total as i64 {
            let best = argmax(freqs.iter().map(|&f| if f > 1 { f as u64 } else { 0 }));
            freqs[best] -= 1;
            sum -= 1;
            removed += 1;
        }
        (freqs, removed)
    }

    #[test]
    fn excess_removed_as_one_unit_at_a_time() {
        let mut lcg = crate::test_lcg(0x9E37_79B9_7F4A_7C15);
        let mut next = || lcg() >> 33;
        let (mut with_excess, mut units) = (0, 0);
        for case in 0..3000 {
            // Skewed counts over alphabets up to 247 (the 32-bit Joint alphabet): a few large
            // counts and many rare symbols, which are what create an excess.
            let len = 2 + next() as usize % 246;
            let counts: Vec<u64> = (0..len)
                .map(|_| match next() % 8 {
                    0 => 0,
                    1 => next() % 1_000_000,
                    2 => next() % 3,
                    _ => next() % (1 + case as u64 % 50),
                })
                .collect();
            let seen = counts.iter().filter(|&&c| c > 0).count() as u64;
            for bits in [12, 10, 8, 6, 4, 2] {
                if 1u64 << bits < seen {
                    continue;
                }
                let (want, removed) = normalize_one_unit_at_a_time(&counts, bits);
                with_excess += (removed > 0) as usize;
                units += removed;
                assert_eq!(
                    normalize_to(&counts, bits),
                    want,
                    "{counts:?} at {bits} bits"
                );
            }
        }
        // Most cases remove units, many of them more than one per level.
        assert!(
            with_excess > 5000 && units > 100_000,
            "{with_excess} rows, {units} units"
        );
    }

    #[test]
    fn rows_sum_to_total_and_keep_seen_symbols() {
        let cases: Vec<Vec<u64>> = vec![
            vec![1],
            vec![0, 5, 0],
            vec![1_000_000, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
            (0..65).map(|i| 1 + i * i).collect(),
            vec![7, 0, 3, 4096, 1],
            vec![1; 4096],
        ];
        for counts in cases {
            let f = normalize(&counts);
            assert_eq!(f.iter().sum::<u32>(), PROB_TOTAL, "{counts:?}");
            for (c, f) in counts.iter().zip(&f) {
                assert_eq!(*c > 0, *f > 0);
            }
        }
        assert!(normalize(&[0, 0]).iter().all(|&f| f == 0));
    }

    #[test]
    fn log2_fixed_brackets_log2() {
        // Never above log2(x) (its squarings truncate), at most LOG2_SLACK units below:
        // what `entropy_floor` relies on. Every x up to 2^16, then a spread to 2^64.
        let mut lcg = crate::test_lcg(0x0001_062F_1EED);
        let xs = (1u64..=1 << 16).chain((0..20_000).map(|_| {
            let v = lcg();
            (v >> (v % 64)).max(1)
        }));
        for x in xs {
            let got = log2_fixed(x) as f64;
            let exact = (x as f64).log2() * COST_ONE_BIT as f64;
            // (f64's own error at 64 · 2^16 is far below 0.01 units.)
            assert!(got <= exact + 0.01, "{x}: {got} above {exact}");
            assert!(
                got >= exact - LOG2_SLACK as f64,
                "{x}: {got} too far below {exact}"
            );
        }
    }

    #[test]
    fn entropy_floor_is_below_every_rows_cost() {
        // Rows normalized at every precision (scaled to PROB_BITS, as selection prices
        // them) and rows of one symbol, for counts small and large: never below the floor,
        // and the floor within a bit per symbol of the best of them (it is not zero).
        let mut lcg = crate::test_lcg(0x00F1_004E);
        let mut next = || lcg() >> 33;
        let mut row = Vec::new();
        for _ in 0..3000 {
            let len = 1 + next() as usize % 120;
            let scale = [2, 40, 5_000, 1 << 30][next() as usize % 4];
            let counts: Vec<u64> = (0..len)
                .map(|_| if next() % 3 == 0 { 0 } else { next() % scale })
                .collect();
            let floor = entropy_floor(&counts);
            let n: u64 = counts.iter().sum();
            let seen = counts.iter().filter(|&&c| c > 0).count() as u64;
            if n == 0 {
                assert_eq!(floor, 0);
                continue;
            }
            let mut best = u64::MAX;
            for bits in [PROB_BITS, 10, 8, 6] {
                if bits < PROB_BITS && 1u64 << bits < seen {
                    continue;
                }
                normalize_into(&counts, bits, &mut row);
                row.iter_mut().for_each(|f| *f <<= PROB_BITS - bits);
                let c = cost(&counts, &row);
                assert!(
                    floor <= c,
                    "{counts:?} at {bits} bits: floor {floor} above {c}"
                );
                best = best.min(c);
            }
            assert!(
                best - floor <= n * COST_ONE_BIT,
                "{counts:?}: floor {floor} vs {best}"
            );
        }
    }

    #[test]
    fn log2_fixed_is_close_to_log2() {
        for x in [1u64, 2, 3, 5, 1000, 4095, 4096, 1 << 40, u64::MAX] {
            let got = log2_fixed(x) as f64 / 65536.0;
            let want = (x as f64).log2();
            assert!((got - want).abs() < 1e-4, "{x}: {got} vs {want}");
        }
    }
}
