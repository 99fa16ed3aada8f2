//! Diagnostics the paper reports: how much the reference exponent tells about the residual's
//! bit length. Floating point is fine here: nothing in this module shapes coded bytes.

use crate::dtype::DType;
use crate::float;
use crate::format::symbols::{bitlen, exp_class};

/// Joint counts of (paper-layout b, reference exponent class).
#[derive(Clone, Debug, Default)]
pub struct BitlenExponent {
    counts: std::collections::HashMap<(u8, u8), u64>,
}

impl BitlenExponent {
    pub fn add(&mut self, dtype: DType, reference: &[u8], target: &[u8]) {
        let Some(fl) = dtype.float_layout() else {
            return;
        };
        let size = dtype.size();
        for (r, x) in reference.chunks_exact(size).zip(target.chunks_exact(size)) {
            let load = |c: &[u8]| {
                let mut v = [0u8; 8];
                v[..size].copy_from_slice(c);
                u64::from_le_bytes(v)
            };
            let (r, x) = (load(r), load(x));
            let b = bitlen(float::zigzag(float::displacement(r, x, fl.width), fl.width));
            *self.counts.entry((b, exp_class(r, fl))).or_default() += 1;
        }
    }

    /// (H(b), I(b; e_r)) in bits per weight.
    pub fn entropy_and_information(&self) -> (f64, f64) {
        use std::collections::HashMap;
        let n: u64 = self.counts.values().sum();
        if n == 0 {
            return (0.0, 0.0);
        }
        let nf = n as f64;
        let mut pb: HashMap<u8, u64> = HashMap::new();
        let mut pe: HashMap<u8, u64> = HashMap::new();
        for (&(b, e), &c) in &self.counts {
            *pb.entry(b).or_default() += c;
            *pe.entry(e).or_default() += c;
        }
        let h_b: f64 = pb
            .values()
            .map(|&c| -(c as f64 / nf) * (c as f64 / nf).log2())
            .sum();
        let i: f64 = self
            .counts
            .iter()
            .map(|(&(b, e), &c)| {
                let p = c as f64 / nf;
                p * (p / ((pb[&b] as f64 / nf) * (pe[&e] as f64 / nf))).log2()
            })
            .sum();
        (h_b, i)
    }
}
