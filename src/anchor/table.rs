//! Context-modeled frequency tables of the anchor codec: one shared row per stage plus an own
//! row for each context where it pays for itself (integer cost estimate, docs/FORMAT.md).

use crate::bytes::{ByteReader, ByteWriter};
use crate::entropy::freq::{cost, normalize, COST_ONE_BIT, PROB_BITS, PROB_TOTAL};

use crate::Result;

/// Histogram of one stage: `n_ctx` contexts of `alphabet` symbols each.
#[derive(Clone, Debug)]
pub struct Hist {
    pub n_ctx: usize,
    pub alphabet: usize,
    pub counts: Vec<u64>,
}

impl Hist {
    pub fn new(n_ctx: usize, alphabet: usize) -> Hist {
        Hist {
            n_ctx,
            alphabet,
            counts: vec![0; n_ctx * alphabet],
        }
    }
    #[inline]
    pub fn inc(&mut self, ctx: usize, sym: usize) {
        self.counts[ctx * self.alphabet + sym] += 1;
    }
    pub fn add(&mut self, other: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }
    pub fn row(&self, ctx: usize) -> &[u64] {
        &self.counts[ctx * self.alphabet..(ctx + 1) * self.alphabet]
    }
    /// All contexts summed into one row.
    pub fn marginal(&self) -> Vec<u64> {
        let mut m = vec![0u64; self.alphabet];
        for ctx in 0..self.n_ctx {
            for (a, &c) in m.iter_mut().zip(self.row(ctx)) {
                *a += c;
            }
        }
        m
    }
}

pub use crate::format::tables::Row;

/// The transmitted table of one stage.
#[derive(Clone, Debug)]
pub struct Table {
    pub n_ctx: usize,
    pub alphabet: usize,
    /// Rows; index 0 is the shared row (absent when every occupied context has its own).
    pub rows: Vec<Row>,
    /// Context → index into `rows` (`u32::MAX`: no row, the context never occurs).
    pub map: Vec<u32>,
    /// `(context, row index)` of the own rows, for serialization.
    own: Vec<u32>,
    has_shared: bool,
}

/// Bytes of a row as [`write_row`] writes it.
fn row_len(freq: &[u32]) -> u64 {
    use crate::bytes::varint_len;
    let nz = freq.iter().filter(|&&f| f > 0).count();
    let mut len = varint_len(nz as u64);
    let (mut next, mut seen) = (0usize, 0usize);
    for (s, &f) in freq.iter().enumerate().filter(|(_, &f)| f > 0) {
        seen += 1;
        len += varint_len((s - next) as u64);
        next = s + 1;
        if seen < nz {
            len += varint_len(f as u64);
        }
    }
    len as u64
}

fn row_cost_bits(freq: &[u32]) -> u64 {
    (row_len(freq) + 1) * 8 * COST_ONE_BIT
}

impl Table {
    /// Choose rows: a context keeps its own row when its data cost under the shared row exceeds
    /// its data cost under its own row plus that row's bytes. Integer-only, deterministic.
    pub fn select(h: &Hist) -> Table {
        let shared = normalize(&h.marginal());
        let mut own = Vec::new();
        let mut rows = Vec::new();
        let mut rest = vec![0u64; h.alphabet];
        for ctx in 0..h.n_ctx {
            let counts = h.row(ctx);
            if counts.iter().all(|&c| c == 0) {
                continue;
            }
            let mine = normalize(counts);
            if cost(counts, &mine) + row_cost_bits(&mine) < cost(counts, &shared) {
                own.push(ctx as u32);
                rows.push(Row::from_freqs(mine));
            } else {
                for (a, &c) in rest.iter_mut().zip(counts) {
                    *a += c;
                }
            }
        }
        let has_shared = rest.iter().any(|&c| c > 0);
        if has_shared {
            rows.insert(0, Row::from_freqs(normalize(&rest)));
        }
        Table::build(h.n_ctx, h.alphabet, rows, own, has_shared, Some(h))
    }

    fn build(
        n_ctx: usize,
        alphabet: usize,
        rows: Vec<Row>,
        own: Vec<u32>,
        has_shared: bool,
        hist: Option<&Hist>,
    ) -> Table {
        let base = has_shared as u32;
        // Contexts without an own row use the shared row; with a histogram at hand, contexts
        // that never occur get no row at all (only matters for cost estimates).
        let mut map = vec![if has_shared { 0 } else { u32::MAX }; n_ctx];
        if let Some(h) = hist {
            for (ctx, m) in map.iter_mut().enumerate() {
                if h.row(ctx).iter().all(|&c| c == 0) {
                    *m = u32::MAX;
                }
            }
        }
        for (i, &ctx) in own.iter().enumerate() {
            map[ctx as usize] = base + i as u32;
        }
        Table {
            n_ctx,
            alphabet,
            rows,
            map,
            own,
            has_shared,
        }
    }

    /// Ideal code length of `h` under this table plus the table's own bytes, in
    /// `COST_ONE_BIT` units.
    pub fn total_cost(&self, h: &Hist) -> u64 {
        let data: u64 = (0..h.n_ctx)
            .filter(|&c| self.map[c] != u32::MAX)
            .map(|c| cost(h.row(c), &self.rows[self.map[c] as usize].freq))
            .sum();
        let mut w = ByteWriter::new();
        self.write(&mut w);
        data + w.len() as u64 * 8 * COST_ONE_BIT
    }

    /// Serialize: `has_shared` u8, [shared row], own count varint, then per own row the
    /// context-id gap (varint) and the row.
    pub fn write(&self, w: &mut ByteWriter) {
        w.u8(self.has_shared as u8);
        let base = self.has_shared as usize;
        if self.has_shared {
            write_row(w, &self.rows[0].freq);
        }
        w.varint(self.own.len() as u64);
        let mut next = 0u32;
        for (i, &ctx) in self.own.iter().enumerate() {
            w.varint((ctx - next) as u64);
            next = ctx + 1;
            write_row(w, &self.rows[base + i].freq);
        }
    }

    pub fn read(r: &mut ByteReader, n_ctx: usize, alphabet: usize) -> Result<Table> {
        let has_shared = match r.u8()? {
            0 => false,
            1 => true,
            v => return Err(r.err(format!("table flag {v} (expected 0 or 1)"))),
        };
        let mut rows = Vec::new();
        if has_shared {
            rows.push(Row::from_freqs(read_row(r, alphabet)?));
        }
        let n = r.varint_max(n_ctx as u64, "own row count")? as usize;
        let mut own = Vec::with_capacity(n);
        let mut next = 0u64;
        for _ in 0..n {
            let ctx = next + r.varint_max(n_ctx as u64, "context gap")?;
            if ctx >= n_ctx as u64 {
                return Err(r.err(format!("context {ctx} out of range (< {n_ctx})")));
            }
            next = ctx + 1;
            own.push(ctx as u32);
            rows.push(Row::from_freqs(read_row(r, alphabet)?));
        }
        Ok(Table::build(n_ctx, alphabet, rows, own, has_shared, None))
    }
}

/// A row: occupied-symbol count, then per occupied symbol its gap from the previous one and,
/// except for the last, its frequency (the last takes what is left of `PROB_TOTAL`).
fn write_row(w: &mut ByteWriter, freq: &[u32]) {
    let nz: Vec<usize> = (0..freq.len()).filter(|&s| freq[s] > 0).collect();
    w.varint(nz.len() as u64);
    let mut next = 0;
    for (i, &s) in nz.iter().enumerate() {
        w.varint((s - next) as u64);
        next = s + 1;
        if i + 1 < nz.len() {
            w.varint(freq[s] as u64);
        }
    }
}

fn read_row(r: &mut ByteReader, alphabet: usize) -> Result<Vec<u32>> {
    let total = PROB_TOTAL as u64;
    let k = r.varint_max(alphabet as u64, "occupied symbols")? as usize;
    if k == 0 {
        return Err(r.err("empty frequency row"));
    }
    let mut freq = vec![0u32; alphabet];
    let (mut next, mut sum) = (0u64, 0u64);
    for i in 0..k {
        let s = next + r.varint_max(alphabet as u64, "symbol gap")?;
        if s >= alphabet as u64 {
            return Err(r.err(format!("symbol {s} outside alphabet of {alphabet}")));
        }
        next = s + 1;
        let f = if i + 1 < k {
            r.varint_max(total, "frequency")?
        } else {
            total.saturating_sub(sum)
        };
        if f == 0 {
            return Err(r.err("zero or over-full frequency in a row"));
        }
        sum += f;
        freq[s as usize] = f as u32;
    }
    if sum != total {
        return Err(r.err(format!("row sums to {sum}, not {total}")));
    }
    Ok(freq)
}

const _: () = assert!(PROB_BITS <= 16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_roundtrip() {
        let mut h = Hist::new(5, 40);
        for i in 0..5000u64 {
            h.inc((i % 5) as usize, ((i * i + i / 7) % 40) as usize);
        }
        h.inc(2, 39);
        for ctx in 0..5 {
            let f = normalize(h.row(ctx));
            let mut w = ByteWriter::new();
            write_row(&mut w, &f);
            assert_eq!(w.len() as u64, row_len(&f));
        }
        let t = Table::select(&h);
        let mut w = ByteWriter::new();
        t.write(&mut w);
        let back = Table::read(&mut ByteReader::new(&w.buf, "test"), 5, 40).unwrap();
        assert_eq!(back.rows, t.rows);
        for (ctx, &m) in t.map.iter().enumerate() {
            assert_eq!(back.map[ctx], m);
        }
    }
}
