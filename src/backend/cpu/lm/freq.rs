//! Logits (Q8) to a frequency table with total 2^32 (docs/INTEGER_GPT2.md §5).
//!
//! `w_j = EXP40[L - l_j]` (0 past the table), `f_j = 1 + floor(w_j * (2^32 - V) / W)`, the
//! remainder to the largest weight (lowest id on ties). Since `f_j` depends only on the gap
//! `L - l_j`, each distinct gap is divided once.

use rayon::prelude::*;

use super::split::Split;
use crate::backend::lm::{Coded, Find};
use crate::{Error, Result};

pub const TOTAL: u64 = 1 << 32;

/// A frequency table before it is laid out: every token's frequency depends only on its gap
/// below the top logit, plus the remainder that goes to one token.
///
/// One pass over the vocabulary after the maximum counts the tokens at each gap (so `W` and
/// the sum of the floors come from the counts, one division per distinct gap); the table is
/// then a branch-free lookup by gap per token (gaps past the table share one last entry
/// holding 1), in whatever order the caller lays it out.
struct ByGap {
    top: i32,
    /// `1 + floor(w * (2^32 - V) / W)` per gap, then 1 for every gap past the table.
    by_gap: Vec<u64>,
    /// The lowest id of the largest weight, and what it gets on top of its floor.
    arg: usize,
    rem: u64,
}

impl ByGap {
    fn new(logits: &[i32], exp40: &[u64]) -> Result<ByGap> {
        let v = logits.len();
        if !(2..=1 << 16).contains(&v) {
            return Err(Error::Invalid(format!("frequencies: vocabulary of {v}")));
        }
        let top = logits.iter().fold(i32::MIN, |a, &l| a.max(l));
        // The remainder goes to the lowest id of the largest weight.
        let arg = logits.iter().position(|&l| l == top).unwrap_or(0);
        let n = exp40.len();
        let mut g = ByGap {
            top,
            by_gap: Vec::new(),
            arg,
            rem: 0,
        };
        let mut count = vec![0u32; n + 1];
        for &l in logits {
            count[g.gap(l, n)] += 1;
        }
        // count <= 2^16 and w <= 2^40: W < 2^56.
        let total_w: u64 = count[..n]
            .iter()
            .zip(exp40)
            .map(|(&c, &w)| c as u64 * w)
            .sum();
        let r = TOTAL - v as u64;
        let mut by_gap = vec![1u64; n + 1];
        let mut sum = count[n] as u64;
        for (i, &c) in count[..n].iter().enumerate() {
            if c > 0 {
                by_gap[i] = 1 + ((exp40[i] as u128 * r as u128) / total_w as u128) as u64;
                sum += c as u64 * by_gap[i];
            }
        }
        debug_assert!(sum <= TOTAL);
        g.by_gap = by_gap;
        g.rem = TOTAL - sum;
        Ok(g)
    }

    /// The gap of logit `l` below the top, capped at `n` (the table's length).
    #[inline(always)]
    fn gap(&self, l: i32, n: usize) -> usize {
        ((self.top as i64 - l as i64) as u64).min(n as u64) as usize
    }

    /// The frequency of a token with logit `l`, without the remainder.
    #[inline(always)]
    fn floor(&self, l: i32) -> u64 {
        self.by_gap[self.gap(l, self.by_gap.len() - 1)]
    }
}

/// Frequencies of every token; `u64` because a one-sided table can hold up to 2^32 - V + 1.
pub fn frequencies(logits: &[i32], exp40: &[u64]) -> Result<Vec<u64>> {
    let g = ByGap::new(logits, exp40)?;
    let mut f: Vec<u64> = logits.iter().map(|&l| g.floor(l)).collect();
    f[g.arg] += g.rem;
    Ok(f)
}

/// Prefix sums of the frequency table of `logits` in the order `order`, as
/// [`crate::backend::lm::prefix_sums`] of [`frequencies`] gives them, without the table in
/// between: each token's frequency is looked up from its logit where the sum reaches it.
pub fn prefix_sums(logits: &[i32], exp40: &[u64], order: &[u32], split: Split) -> Result<Vec<u32>> {
    let g = ByGap::new(logits, exp40)?;
    if order.iter().fold(0, |a, &id| a.max(id)) as usize >= logits.len() {
        return Err(Error::Invalid(format!(
            "prefix sums: a token beyond the table of {}",
            logits.len()
        )));
    }
    // A random read of the logits per token (the head's rows are in token order).
    sums_in_order(&g, order.len(), split, |i| {
        let id = order[i] as usize;
        (logits[id], id == g.arg)
    })
}

/// [`prefix_sums`] of logits that come out of the head already in the order: `logits[p]` is
/// token `ids[p]`'s (`ids` a permutation of the vocabulary) and the sums run over the first
/// `len` of them, the order's tokens (the rest are the tokens it leaves out). A sequential
/// read instead of a random one per token.
pub fn prefix_sums_in_order(
    logits: &[i32],
    ids: &[u32],
    len: usize,
    exp40: &[u64],
    split: Split,
) -> Result<Vec<u32>> {
    if ids.len() != logits.len() || len > ids.len() {
        return Err(Error::Invalid(
            "prefix sums: order and logits differ".into(),
        ));
    }
    let mut g = ByGap::new(logits, exp40)?;
    // The remainder goes to the lowest id of the largest weight: here a position.
    g.arg = (0..logits.len())
        .filter(|&p| logits[p] == g.top)
        .min_by_key(|&p| ids[p])
        .unwrap_or(0);
    sums_in_order(&g, len, split, |p| (logits[p], p == g.arg))
}

/// The `len + 1` prefix sums of the frequencies of the tokens `at(0..len)` gives (each token's
/// logit, and whether it is the one that takes the remainder). In a parallel step the sums run
/// on every thread: each sums its share, then the shares are offset by the totals before them
/// (u32 sums wrap; the last is checked exactly, as the sums only grow).
fn sums_in_order(
    g: &ByGap,
    len: usize,
    split: Split,
    at: impl Fn(usize) -> (i32, bool) + Sync,
) -> Result<Vec<u32>> {
    let mut cum = vec![0u32; len + 1];
    let share = len.div_ceil(split.threads()).max(4096);
    let totals: Vec<u64> = cum[1..]
        .par_chunks_mut(share)
        .enumerate()
        .map(|(c, dst)| {
            let mut s = 0u64;
            for (i, out) in dst.iter_mut().enumerate() {
                let (l, arg) = at(c * share + i);
                s += g.floor(l);
                if arg {
                    s += g.rem;
                }
                *out = s as u32;
            }
            s
        })
        .collect();
    let mut before = 0u64;
    for (dst, t) in cum[1..].chunks_mut(share).zip(totals) {
        if before > 0 {
            let b = before as u32;
            dst.iter_mut().for_each(|c| *c = c.wrapping_add(b));
        }
        before += t;
    }
    if before >> 32 != 0 {
        return Err(Error::Invalid("LM table sums past 2^32".into()));
    }
    Ok(cum)
}

/// Move `lambda / 2^16` of every other token's frequency to `x` (each keeps at least 1), so the
/// total is unchanged.
pub fn mix(f: &mut [u64], x: usize, lambda: u64) {
    if x >= f.len() || lambda == 0 || lambda >= 1 << 16 {
        return;
    }
    let total: u64 = f.iter().sum();
    let mut rest = 0u64;
    for (j, v) in f.iter_mut().enumerate() {
        if j != x {
            // v <= 2^32 and lambda < 2^16: the product fits u64.
            *v = (*v - ((*v * lambda) >> 16)).max(1);
            rest += *v;
        }
    }
    f[x] = total - rest;
}

/// The coder's table for one position: the model's frequencies with the match prediction
/// mixed in.
pub fn table(logits: &[i32], exp40: &[u64], mix_in: Option<(u32, u64)>) -> Result<Vec<u64>> {
    let mut f = frequencies(logits, exp40)?;
    if let Some((x, lambda)) = mix_in {
        mix(&mut f, x as usize, lambda);
    }
    Ok(f)
}

/// Answer a query from its table: the symbol's interval, or the symbol whose interval holds
/// the target (every frequency is at least 1, so there is exactly one).
pub fn answer(f: &[u64], find: Find) -> Result<Coded> {
    let mut cum = 0u64;
    match find {
        Find::Symbol(s) => {
            let s = s as usize;
            let freq = *f
                .get(s)
                .ok_or_else(|| Error::Invalid(format!("symbol {s} beyond the vocabulary")))?;
            cum = f[..s].iter().sum();
            Ok(Coded {
                symbol: s as u32,
                cum,
                freq,
            })
        }
        Find::Target(t) => {
            for (s, &freq) in f.iter().enumerate() {
                if t < cum + freq {
                    return Ok(Coded {
                        symbol: s as u32,
                        cum,
                        freq,
                    });
                }
                cum += freq;
            }
            Err(Error::Invalid(format!(
                "target {t} beyond the table's total"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::lm::fixed::exp_table;
    const LOGIT_MAX: i32 = crate::format::lm::model_file::LOGIT_MAX as i32;

    /// The definition, one token at a time (the kernel before the counting version).
    fn frequencies_definition(logits: &[i32], exp40: &[u64]) -> Vec<u64> {
        let top = *logits.iter().max().unwrap();
        let arg = logits.iter().position(|&l| l == top).unwrap();
        let w = |l: i32| {
            exp40
                .get((top as i64 - l as i64) as usize)
                .copied()
                .unwrap_or(0)
        };
        let total_w: u64 = logits.iter().map(|&l| w(l)).sum();
        let r = (TOTAL - logits.len() as u64) as u128;
        let mut f: Vec<u64> = logits
            .iter()
            .map(|&l| 1 + (w(l) as u128 * r / total_w as u128) as u64)
            .collect();
        let sum: u64 = f.iter().sum();
        f[arg] += TOTAL - sum;
        f
    }

    #[test]
    fn counting_by_gap_equals_the_definition() {
        let t = exp_table(40);
        let mut x = 11u64;
        for (v, spread) in [
            (2usize, 10i64),
            (50257, 3000),
            (50257, 40000),
            (1000, 1 << 24),
        ] {
            let logits: Vec<i32> = (0..v)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    ((x >> 33) as i64 % spread - spread / 2) as i32
                })
                .collect();
            assert_eq!(
                frequencies(&logits, &t).unwrap(),
                frequencies_definition(&logits, &t)
            );
        }
        // Ties on the top, and extremes of the logit range.
        let logits = vec![LOGIT_MAX, -LOGIT_MAX, LOGIT_MAX, 0, LOGIT_MAX - 1];
        assert_eq!(
            frequencies(&logits, &t).unwrap(),
            frequencies_definition(&logits, &t)
        );
    }

    #[test]
    fn prefix_sums_equal_those_of_the_table() {
        let t = exp_table(40);
        let mut x = 5u64;
        let mut rnd = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            x >> 33
        };
        for (v, spread) in [(2usize, 10i64), (50257, 3000), (50257, 40000), (9000, 600)] {
            let logits: Vec<i32> = (0..v)
                .map(|_| (rnd() as i64 % spread - spread / 2) as i32)
                .collect();
            // A shuffled order that leaves a token out (as lm_bits leaves out the EOT).
            let mut order: Vec<u32> = (0..v as u32).collect();
            for i in (1..v).rev() {
                order.swap(i, rnd() as usize % (i + 1));
            }
            order.pop();
            let want = crate::backend::lm::prefix_sums(&frequencies(&logits, &t).unwrap(), &order);
            let want = want.unwrap();
            for split in [Split::SERIAL, Split::PARALLEL] {
                assert_eq!(prefix_sums(&logits, &t, &order, split).unwrap(), want);
            }
        }
        assert!(prefix_sums(&[1, 2, 3], &t, &[0, 3], Split::SERIAL).is_err());
    }

    /// Logits that come out of the head in the order give the sums of the id-order path,
    /// ties on the top included (the remainder goes to the lowest id, wherever it sits).
    #[test]
    fn sums_of_ordered_logits_equal_those_in_token_order() {
        let t = exp_table(40);
        let mut x = 9u64;
        let mut rnd = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            x >> 33
        };
        for (v, spread, ties) in [(50257usize, 3000i64, 5usize), (9000, 600, 0), (3, 4, 3)] {
            let mut logits: Vec<i32> = (0..v)
                .map(|_| (rnd() as i64 % spread - spread / 2) as i32)
                .collect();
            for _ in 0..ties {
                let at = rnd() as usize % v;
                logits[at] = spread as i32;
            }
            let mut order: Vec<u32> = (0..v as u32).collect();
            for i in (1..v).rev() {
                order.swap(i, rnd() as usize % (i + 1));
            }
            let left_out = order.pop().unwrap();
            let want = prefix_sums(&logits, &t, &order, Split::SERIAL).unwrap();
            let mut ids = order.clone();
            ids.push(left_out);
            let by_row: Vec<i32> = ids.iter().map(|&id| logits[id as usize]).collect();
            for split in [Split::SERIAL, Split::PARALLEL] {
                let got = prefix_sums_in_order(&by_row, &ids, order.len(), &t, split).unwrap();
                assert_eq!(got, want, "v={v} ties={ties} {split:?}");
            }
        }
        assert!(prefix_sums_in_order(&[1, 2], &[0], 1, &t, Split::SERIAL).is_err());
    }

    #[test]
    fn total_floor_and_remainder() {
        let t = exp_table(40);
        let logits = vec![0, 256, 256, -100000, 10, 256];
        let f = frequencies(&logits, &t).unwrap();
        assert_eq!(f.iter().sum::<u64>(), TOTAL);
        assert!(f.iter().all(|&x| x >= 1));
        assert_eq!(f[3], 1);
        // ids 1, 2, 5 tie on the largest weight; the remainder goes to id 1
        assert!(f[1] > f[2] && f[2] == f[5]);
    }
}
