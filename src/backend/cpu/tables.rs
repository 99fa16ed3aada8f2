//! Transmitted tables turned into what the inner loops want: per row and symbol, the
//! encoder's division replaced by an exact multiply, and the decoder's slot lookup as a table.

use crate::entropy::freq::{PROB_BITS, PROB_TOTAL};
use crate::format::tables::{StageTable, Window};

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

/// A symbol of probability 1: encoding it leaves the state unchanged and flushes nothing.
/// Elements absent from a stage use it, so the lane loops need no branch on presence.
pub const IDENTITY: EncSym = EncSym {
    x_max: u64::MAX,
    m: (1 << 32) + 1,
    start: 0,
    cmpl: 0,
};

/// One (step, stage) of rANS encoding over lanes `LANES-1..=0`, identical in effect to
/// `entropy::rans::enc_put` per lane. The flush decisions read the tables for every lane at
/// once; then the only serial chain, the word cursor `pos`, runs on values already loaded:
/// every lane stores its low word at `out[*pos]` and keeps it only if its state flushed.
#[inline(always)]
pub fn put_lanes(states: &mut [u64], syms: &[&EncSym], out: &mut [u16], pos: &mut usize) {
    let mut flush = [false; 32];
    for ((f, x), e) in flush.iter_mut().zip(states.iter()).zip(syms) {
        *f = *x >= e.x_max;
    }
    for (x, &f) in states.iter().zip(&flush).rev() {
        out[*pos] = *x as u16;
        *pos += f as usize;
    }
    for ((x, e), &f) in states.iter_mut().zip(syms).zip(&flush) {
        let y = if f { *x >> 16 } else { *x };
        let q = ((y as u128 * e.m as u128) >> 44) as u64;
        *x = y + e.start as u64 + q * e.cmpl as u64;
    }
}

/// A symbol packed for the vector lanes: `freq | start << 16`.
#[inline]
fn pack(start: u32, freq: u32) -> u32 {
    if freq == 0 {
        // Never used (as in `EncSym::new`).
        return PACKED_IDENTITY;
    }
    freq | start << 16
}

/// The identity symbol packed: probability 1, start 0.
pub const PACKED_IDENTITY: u32 = PROB_TOTAL;

/// One stage's table for the encoder: context -> row, row -> symbols.
pub struct EncStage<'a> {
    pub map: &'a [u32],
    /// The exponent classes `map` covers in J's neighbor form (`StageTable::window`).
    pub window: Window,
    /// The stage uses its neighbor context form (B, S).
    pub neighbor: bool,
    pub alphabet: usize,
    pub syms: Vec<EncSym>,
    /// The same symbols as [`pack`]ed `u32`s (the AVX-512 lanes gather them).
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    pub packed: Vec<u32>,
    /// Index of the identity row (absent elements).
    identity_row: usize,
}

impl<'a> EncStage<'a> {
    pub fn new(t: &'a StageTable) -> Self {
        let a = t.space.alphabet();
        let n_rows = t.explicit.len() + t.backoff.len();
        let mut syms = Vec::with_capacity(n_rows * a);
        let mut packed = Vec::with_capacity(n_rows * a);
        for ri in 0..n_rows {
            let row = t.row(ri as u32);
            syms.extend((0..a).map(|s| EncSym::new(row.start[s], row.freq[s])));
            packed.extend((0..a).map(|s| pack(row.start[s], row.freq[s])));
        }
        // Row `n_rows`: absent elements.
        syms.extend((0..a).map(|_| IDENTITY));
        packed.extend((0..a).map(|_| PACKED_IDENTITY));
        EncStage {
            map: &t.map,
            window: t.window,
            neighbor: t.space.neighbor,
            alphabet: a,
            syms,
            packed,
            identity_row: n_rows,
        }
    }
    /// The symbol to code: `sym` under context `ctx`'s row, or the identity when the
    /// element is absent from this stage (or, never for tables built from the same counts,
    /// when the context has no row).
    #[inline(always)]
    pub fn get(&self, present: bool, ctx: usize, sym: usize) -> &EncSym {
        let ri = if present {
            self.map[ctx] as usize
        } else {
            self.identity_row
        };
        self.syms.get(ri * self.alphabet + sym).unwrap_or(&IDENTITY)
    }
}

/// One stage's table for the decoder.
pub struct DecStage<'a> {
    pub map: &'a [u32],
    /// The stage uses its neighbor context form (B, S).
    pub neighbor: bool,
    /// Binary stages: frequency of symbol 0 per row.
    pub f0: Vec<u32>,
    /// B stage: `(freq, start)` per row and symbol.
    pub fs: Vec<(u32, u32)>,
    /// B stage: the starts of symbols `1..alphabet` per row (`alphabet - 1` values, in
    /// order). A slot's symbol is how many of them are `<= slot`: 32 bytes a row for bf16
    /// where a slot->symbol table takes 4 KiB and, with hundreds of rows, misses the cache.
    pub starts: Vec<u16>,
    /// B stage, AVX-512 path: `freq | start << 13 | symbol << 25` per row and symbol, with
    /// one more row of zeros (freq 0: "no row") that `map_padded` sends missing contexts to.
    pub fs_packed: Vec<u32>,
    /// B stage: `map` with missing contexts sent to the zero row at index `rows`, so the
    /// AVX-512 path looks rows up without a branch and detects a missing one by `freq == 0`
    /// (a decoded symbol never has frequency 0: a count of starts skips empty ranges).
    pub map_padded: Vec<u32>,
    /// Binary stages: `f0` per primary context, [`NO_ROW`] where the context has no row (the
    /// AVX-512 path's one gather instead of map, then row).
    pub f0_by_ctx: Vec<u32>,
    /// Binary stages: `f0` of contexts `2k` and `2k + 1` as the low and high halves of entry
    /// `k` (`0xFFFF`: no row): Q2's contexts for q1 = 0 and 1, in one gather.
    pub f0_pairs: Vec<u32>,
    pub alphabet: usize,
}

/// `f0_by_ctx` entry of a context without a row (above every real `f0`).
pub const NO_ROW: u32 = u32::MAX;

impl<'a> DecStage<'a> {
    pub fn new(t: &'a StageTable) -> Self {
        let a = t.space.alphabet();
        let n_rows = t.explicit.len() + t.backoff.len();
        let mut d = DecStage {
            map: &t.map,
            neighbor: t.space.neighbor,
            f0: Vec::new(),
            fs: Vec::new(),
            starts: Vec::new(),
            fs_packed: Vec::new(),
            map_padded: Vec::new(),
            f0_by_ctx: Vec::new(),
            f0_pairs: Vec::new(),
            alphabet: a,
        };
        for ri in 0..n_rows {
            let row = t.row(ri as u32);
            if a == 2 {
                d.f0.push(row.freq[0]);
            } else {
                for s in 0..a {
                    d.fs.push((row.freq[s], row.start[s]));
                    d.fs_packed.push(
                        row.freq[s].min(PROB_TOTAL)
                            | row.start[s].min(PROB_TOTAL - 1) << 13
                            | (s as u32) << 25,
                    );
                }
                // Starts never exceed PROB_TOTAL; absent trailing symbols start at
                // PROB_TOTAL, above every slot, so they are never counted.
                d.starts
                    .extend((1..a).map(|s| row.start[s].min(PROB_TOTAL) as u16));
            }
        }
        if a > 2 {
            // The zero row: starts 0 (every slot counts all of them), frequencies 0.
            d.starts.extend((1..a).map(|_| 0u16));
            d.fs_packed.extend((0..a).map(|_| 0u32));
            d.map_padded = t.per_context(|ri| ri.min(n_rows as u32));
        }
        // Row `n_rows` of a binary stage: absent elements decode symbol 0 at probability 1,
        // which leaves the state unchanged.
        if a == 2 {
            let f0 = &d.f0;
            d.f0_by_ctx = t.per_context(|ri| f0.get(ri as usize).copied().unwrap_or(NO_ROW));
            let pairs = d.f0_by_ctx.chunks_exact(2);
            let odd = pairs
                .remainder()
                .first()
                .map(|&f| f & 0xFFFF | 0xFFFF << 16);
            d.f0_pairs = pairs
                .map(|p| (p[0] & 0xFFFF) | (p[1] & 0xFFFF) << 16)
                .chain(odd)
                .collect();
            d.f0.push(PROB_TOTAL);
        }
        d
    }

    /// Row of a binary stage for an element: the identity row when absent; `None` when a
    /// present element's context has no row (a format error).
    #[inline(always)]
    pub fn f0(&self, present: bool, ctx: usize) -> Option<u32> {
        let ri = if present {
            self.map[ctx] as usize
        } else {
            self.f0.len() - 1
        };
        self.f0.get(ri).copied()
    }
}

/// Whether the decoder tables have the sizes every context the vector decoders compute can
/// index (B row starts of `n_bits` entries): checked once per chunk, so their table loads
/// need no per-lane bounds checks.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub fn vector_tables_fit(stages: &[DecStage], w1: usize, n_bits: usize) -> bool {
    let e = 256;
    let b_ctx = if stages[0].neighbor {
        4 * (w1 + 1) * e
    } else {
        e
    };
    // Rows of B, the zero row included.
    let rows_b = stages[0].fs_packed.len() / w1.max(1);
    // Symbols fit the 7 bits `fs_packed` gives them, frequencies 13, starts 12.
    w1 <= 65
        && rows_b >= 1
        && stages[0].map_padded.len() >= b_ctx
        && stages[0].alphabet == w1
        && stages[0].starts.len() == rows_b * n_bits
        && stages[0].map_padded[..b_ctx]
            .iter()
            .all(|&r| (r as usize) < rows_b)
        && stages[1].f0_by_ctx.len() >= e * w1
        && stages[2].f0_pairs.len() >= e * w1
        && stages
            .get(3)
            .is_none_or(|s| s.f0_by_ctx.len() >= e * w1 * 6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::tables::{Hist, Space, Stage};

    /// The per-context tables made from the period are the map's entries, for tables with
    /// and without backoff rows, pruned and not, in spaces of every shape.
    #[test]
    fn per_context_tables_are_the_maps_entries() {
        let mut lcg = crate::test_lcg(0xC0DE_FACE_B00C_1234);
        let mut next = || lcg() >> 33;
        for (stage, w, neighbor) in [
            (Stage::B, 16, true),
            (Stage::B, 8, false),
            (Stage::Q1, 32, false),
            (Stage::Q2, 16, false),
            (Stage::S, 16, true),
            (Stage::J, 16, false),
        ] {
            let space = Space::new(stage, w, neighbor);
            let a = space.alphabet();
            for fill in [3usize, 60, 600] {
                let mut counts = vec![0u64; space.n_primary() * a];
                for _ in 0..fill {
                    let at = next() as usize % counts.len();
                    counts[at] += 1 + next() % 1000;
                }
                for prune in [true, false] {
                    let t = StageTable::select(&Hist::from_dense(space, &counts), prune);
                    let f = |ri: u32| ri.wrapping_mul(7) ^ 0x55;
                    let want: Vec<u32> = t.map.iter().map(|&ri| f(ri)).collect();
                    assert_eq!(t.per_context(f), want, "{stage:?} {fill} {prune}");
                }
            }
        }
    }
}
