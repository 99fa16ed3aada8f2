//! Transmitted tables turned into what the inner loops want: per row and symbol, the
//! encoder's division replaced by an exact multiply, and the decoder's slot lookup as a table.

use crate::delta::model::StageTable;
use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};

/// One symbol of one row, ready to encode (after ryg_rans' `RansEncSymbol`).
#[derive(Clone, Copy, Default)]
pub struct EncSym {
    /// Flush a word first when the state is at least this.
    pub x_max: u64,
    /// `floor(2^44 / freq) + 1`: for every state x < 2^32, `(x * m) >> 44 == x / freq`
    /// (the error term stays below 2^-12 <= 1 / freq).
    pub m: u64,
    pub start: u32,
    /// `PROB_TOTAL - freq`: `C(x) = x + start + (x / freq) * cmpl`.
    pub cmpl: u32,
}

impl EncSym {
    fn new(start: u32, freq: u32) -> Self {
        if freq == 0 {
            // Never used: the table was built from the same counts the encoder codes.
            return EncSym::default();
        }
        EncSym {
            x_max: (freq as u64) << (32 - PROB_BITS),
            m: (1u64 << 44) / freq as u64 + 1,
            start,
            cmpl: PROB_TOTAL - freq,
        }
    }
}

/// rANS encode step, identical in effect to `entropy::rans::enc_put`.
#[inline(always)]
pub fn put(state: &mut u32, out: &mut Vec<u16>, e: &EncSym) {
    let mut x = *state as u64;
    if x >= e.x_max {
        out.push(x as u16);
        x >>= 16;
    }
    let q = ((x as u128 * e.m as u128) >> 44) as u64;
    *state = (x + e.start as u64 + q * e.cmpl as u64) as u32;
}

/// One stage's table for the encoder: context -> row, row -> symbols.
pub struct EncStage<'a> {
    pub map: &'a [u32],
    pub alphabet: usize,
    pub syms: Vec<EncSym>,
}

impl<'a> EncStage<'a> {
    pub fn new(t: &'a StageTable) -> Self {
        let a = t.space.alphabet();
        let n_rows = t.explicit.len() + t.backoff.len();
        let mut syms = Vec::with_capacity(n_rows * a);
        for ri in 0..n_rows {
            let row = t.row(ri as u32);
            syms.extend((0..a).map(|s| EncSym::new(row.start[s], row.freq[s])));
        }
        EncStage {
            map: &t.map,
            alphabet: a,
            syms,
        }
    }
    #[inline(always)]
    pub fn get(&self, ctx: usize, sym: usize) -> &EncSym {
        &self.syms[self.map[ctx] as usize * self.alphabet + sym]
    }
}

/// One stage's table for the decoder.
pub struct DecStage<'a> {
    pub map: &'a [u32],
    /// Binary stages: frequency of symbol 0 per row.
    pub f0: Vec<u32>,
    /// B stage: `(freq, start)` per row and symbol, and the symbol of every slot per row.
    pub fs: Vec<(u32, u32)>,
    pub slot: Vec<u8>,
    pub alphabet: usize,
}

impl<'a> DecStage<'a> {
    pub fn new(t: &'a StageTable) -> Self {
        let a = t.space.alphabet();
        let n_rows = t.explicit.len() + t.backoff.len();
        let mut d = DecStage {
            map: &t.map,
            f0: Vec::new(),
            fs: Vec::new(),
            slot: Vec::new(),
            alphabet: a,
        };
        for ri in 0..n_rows {
            let row = t.row(ri as u32);
            if a == 2 {
                d.f0.push(row.freq[0]);
            } else {
                for s in 0..a {
                    d.fs.push((row.freq[s], row.start[s]));
                    let (lo, hi) = (row.start[s], row.start[s] + row.freq[s]);
                    d.slot.extend((lo..hi).map(|_| s as u8));
                }
            }
        }
        d
    }
}
