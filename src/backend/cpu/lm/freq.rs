//! Logits (Q8) to a frequency table with total 2^32 (docs/INTEGER_GPT2.md §5).
//!
//! `w_j = EXP40[L - l_j]` (0 past the table), `f_j = 1 + floor(w_j * (2^32 - V) / W)`, the
//! remainder to the largest weight (lowest id on ties). Since `f_j` depends only on the gap
//! `L - l_j`, each distinct gap is divided once.

use crate::backend::lm::{Coded, Find};
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
