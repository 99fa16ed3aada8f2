//! A cheap token-level match model mixed into the GPT-2 frequencies, in integers.
//!
//! It finds the last earlier place where the current 3-token context occurred and predicts the
//! token that followed it there. Its confidence `lambda / 2^16` is an adaptive hit rate, kept
//! per match-length bucket as integer counts. Mixing moves that share of every other token's
//! frequency (floor 1 kept) to the predicted token, so the total stays 2^32. Encoder and decoder
//! run the same updates on the same tokens, so they hold the same state.

use std::collections::HashMap;

const MIN_LEN: usize = 3;
const MAX_LEN: u32 = 32;
const BUCKETS: usize = 16;

#[derive(Clone, Debug)]
pub struct MatchModel {
    table: HashMap<[u32; MIN_LEN], usize>,
    /// Index (in the history) of the predicted token's earlier occurrence.
    ptr: Option<usize>,
    len: u32,
    hits: [u32; BUCKETS],
    total: [u32; BUCKETS],
}

impl Default for MatchModel {
    fn default() -> Self {
        Self::new()
    }
}

impl MatchModel {
    pub fn new() -> Self {
        MatchModel {
            table: HashMap::new(),
            ptr: None,
            len: 0,
            hits: [1; BUCKETS],
            total: [2; BUCKETS],
        }
    }

    fn bucket(&self) -> usize {
        (self.len as usize).min(BUCKETS - 1)
    }

    /// The predicted next token for history `s` and its weight `lambda` in [0, 2^16).
    pub fn predict(&self, s: &[u32]) -> Option<(u32, u64)> {
        let p = self.ptr?;
        let tok = *s.get(p)?;
        let b = self.bucket();
        let lambda = (self.hits[b] as u64) * 65536 / (self.total[b] as u64 + 1);
        Some((tok, lambda))
    }

    /// Update after the history grew by one token (the last element of `s`).
    pub fn update(&mut self, s: &[u32]) {
        let n = s.len();
        if n == 0 {
            return;
        }
        let t = s[n - 1];
        if let Some(p) = self.ptr {
            let b = self.bucket();
            let hit = s.get(p) == Some(&t);
            self.total[b] += 1;
            self.hits[b] += hit as u32;
            if self.total[b] >= 1024 {
                self.total[b] /= 2;
                self.hits[b] /= 2;
            }
            if hit {
                self.ptr = Some(p + 1);
                self.len = (self.len + 1).min(MAX_LEN);
            } else {
                self.ptr = None;
                self.len = 0;
            }
        }
        // Remember the context that preceded the new token.
        if n > MIN_LEN {
            let key: [u32; MIN_LEN] = s[n - 1 - MIN_LEN..n - 1].try_into().unwrap();
            self.table.insert(key, n - 1);
        }
        if self.ptr.is_none() && n >= MIN_LEN {
            let key: [u32; MIN_LEN] = s[n - MIN_LEN..n].try_into().unwrap();
            if let Some(&q) = self.table.get(&key) {
                // Length of the match, counted backward (at most MAX_LEN).
                let mut len = 0;
                while (len as usize) < q && (len as usize) < n && len < MAX_LEN {
                    if s[q - 1 - len as usize] != s[n - 1 - len as usize] {
                        break;
                    }
                    len += 1;
                }
                self.ptr = Some(q);
                self.len = len;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::lm::freq::mix;

    #[test]
    fn predicts_repeats_and_keeps_the_total() {
        let seq: Vec<u32> = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 8, 9].to_vec();
        let mut m = MatchModel::new();
        let mut s = Vec::new();
        let mut preds = Vec::new();
        for &t in &seq {
            preds.push(m.predict(&s).map(|p| p.0));
            s.push(t);
            m.update(&s);
        }
        // After "5 6 7" repeats, the model predicts 8 then 9.
        assert_eq!(preds[10], Some(8));
        assert_eq!(preds[11], Some(9));
        let mut f = vec![1u64 << 30; 4];
        mix(&mut f, 2, 40000);
        assert_eq!(f.iter().sum::<u64>(), 1 << 32);
        assert!(f[2] > 1 << 31 && f.iter().all(|&v| v >= 1));
    }
}
