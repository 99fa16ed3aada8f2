//! Logits (Q8) to a frequency table with total 2^32 (docs/INTEGER_GPT2.md §5).
//!
//! `w_j = EXP40[L - l_j]` (0 past the table), `f_j = 1 + floor(w_j * (2^32 - V) / W)`, the
//! remainder to the largest weight (lowest id on ties). Since `f_j` depends only on the gap
//! `L - l_j`, each distinct gap is divided once.

use crate::{Error, Result};

pub const TOTAL: u64 = 1 << 32;

/// Frequencies of every token; `u64` because a one-sided table can hold up to 2^32 - V + 1.
pub fn frequencies(logits: &[i32], exp40: &[u64]) -> Result<Vec<u64>> {
    let v = logits.len();
    if !(2..=1 << 16).contains(&v) {
        return Err(Error::Invalid(format!("frequencies: vocabulary of {v}")));
    }
    let mut top = i32::MIN;
    let mut arg = 0;
    for (j, &l) in logits.iter().enumerate() {
        if l > top {
            top = l;
            arg = j;
        }
    }
    let gap = |l: i32| (top as i64 - l as i64) as usize;
    let w = |g: usize| exp40.get(g).copied().unwrap_or(0);
    let total_w: u64 = logits.iter().map(|&l| w(gap(l))).sum();
    let r = TOTAL - v as u64;
    let mut memo = vec![u64::MAX; exp40.len()];
    let mut f: Vec<u64> = logits
        .iter()
        .map(|&l| {
            let g = gap(l);
            if g >= exp40.len() {
                return 1;
            }
            if memo[g] == u64::MAX {
                memo[g] = 1 + ((exp40[g] as u128 * r as u128) / total_w as u128) as u64;
            }
            memo[g]
        })
        .collect();
    let sum: u64 = f.iter().sum();
    debug_assert!(sum <= TOTAL);
    f[arg] += TOTAL - sum;
    Ok(f)
}

/// `(cum, freq)` of one symbol without materializing the cumulative table.
pub fn symbol_interval(f: &[u64], sym: usize) -> (u64, u64) {
    (f[..sym].iter().sum(), f[sym])
}

/// Cumulative table with `len + 1` entries, from 0 to 2^32.
pub fn cumulative(f: &[u64]) -> Vec<u64> {
    let mut c = Vec::with_capacity(f.len() + 1);
    let mut s = 0u64;
    c.push(0);
    for &x in f {
        s += x;
        c.push(s);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lm::fixed::exp_table;

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
