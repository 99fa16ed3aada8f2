//! Context models, per-tensor histograms, table selection and the table byte format.
//!
//! Each coded stage has a *primary* context (the paper's models, plus the update-sign stage) and
//! a *backoff* context obtained by dropping the reference exponent:
//!
//! | stage | symbol | primary context id | backoff id (= primary % n_backoff) |
//! |---|---|---|---|
//! | B  | b (0..=w)  | er                            | 0 (one row) |
//! | Q1 | q1         | er·W1 + b                     | b |
//! | Q2 | q2         | (er·W1 + b)·2 + q1            | b·2 + q1 |
//! | S  | neg        | ((er·W1 + b)·3 + up)·2 + rs   | up·2 + rs |
//!
//! with W1 = w + 1, er the reference exponent class (0 when conditioning is off), rs the
//! reference sign and up the sign state (0 none, 1 up, 2 down) of the already-decoded update
//! one row up (0 when the tensor does not use that context).
//!
//! Paper mode transmits a row for every occupied primary context. The default *prunes*: a
//! primary context gets its own row only when that saves more bits than the row costs; the rest
//! share their backoff row. Decisions use integer cost estimates only (see entropy::freq).

use super::symbols::{RefInfo, Sym, EXP_CLASSES};
use std::sync::OnceLock;

use crate::bytes::{varint_len, ByteReader, ByteWriter};
use crate::entropy::freq::{log2_fixed, normalize, COST_ONE_BIT, PROB_BITS, PROB_TOTAL};
use crate::Result;

/// The coded stages, in decoding order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    B = 0,
    Q1 = 1,
    Q2 = 2,
    S = 3,
}

pub const STAGES: [Stage; 4] = [Stage::B, Stage::Q1, Stage::Q2, Stage::S];

/// Sizes of one stage's context space for a float width.
#[derive(Clone, Copy, Debug)]
pub struct Space {
    pub stage: Stage,
    /// b alphabet size, w + 1.
    pub w1: usize,
}

impl Space {
    pub fn new(stage: Stage, width: u32) -> Self {
        Space {
            stage,
            w1: width as usize + 1,
        }
    }
    pub fn alphabet(&self) -> usize {
        match self.stage {
            Stage::B => self.w1,
            _ => 2,
        }
    }
    pub fn n_primary(&self) -> usize {
        let e = EXP_CLASSES;
        match self.stage {
            Stage::B => e,
            Stage::Q1 => e * self.w1,
            Stage::Q2 => e * self.w1 * 2,
            Stage::S => e * self.w1 * 6,
        }
    }
    pub fn n_backoff(&self) -> usize {
        match self.stage {
            Stage::B => 1,
            Stage::Q1 => self.w1,
            Stage::Q2 => self.w1 * 2,
            Stage::S => 6,
        }
    }
    /// Does element `s` carry a symbol in this stage?
    #[inline]
    pub fn present(&self, s: &Sym) -> bool {
        match self.stage {
            Stage::B => true,
            Stage::Q1 => s.b >= 2,
            Stage::Q2 => s.b >= 3,
            Stage::S => s.b >= 1,
        }
    }
    /// The symbol element `s` codes in this stage.
    #[inline]
    pub fn symbol(&self, s: &Sym) -> usize {
        match self.stage {
            Stage::B => s.b as usize,
            Stage::Q1 => s.q1 as usize,
            Stage::Q2 => s.q2 as usize,
            Stage::S => s.neg as usize,
        }
    }
    /// Primary context id; only fields already decoded when this stage runs are read.
    #[inline]
    pub fn context(&self, s: &Sym, r: RefInfo, up: u8) -> usize {
        let er = r.er as usize;
        match self.stage {
            Stage::B => er,
            Stage::Q1 => er * self.w1 + s.b as usize,
            Stage::Q2 => (er * self.w1 + s.b as usize) * 2 + s.q1 as usize,
            Stage::S => ((er * self.w1 + s.b as usize) * 3 + up as usize) * 2 + r.rs as usize,
        }
    }
}

/// One stage's histogram: `counts[context * alphabet + symbol]`.
#[derive(Clone, Debug)]
pub struct Hist {
    pub space: Space,
    pub counts: Vec<u64>,
}

impl Hist {
    pub fn new(space: Space) -> Self {
        Hist {
            space,
            counts: vec![0; space.n_primary() * space.alphabet()],
        }
    }
    pub fn add(&mut self, other: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }
    fn row(&self, ctx: usize) -> &[u64] {
        let a = self.space.alphabet();
        &self.counts[ctx * a..(ctx + 1) * a]
    }
    /// Contexts with at least one count, ascending.
    pub fn occupied(&self) -> Vec<usize> {
        let a = self.space.alphabet();
        self.counts
            .chunks_exact(a)
            .enumerate()
            .filter(|(_, row)| row.iter().fold(0, |acc, &c| acc | c) != 0)
            .map(|(ctx, _)| ctx)
            .collect()
    }
    /// The same counts with the neighbor-sign context folded away (every `up` becomes 0).
    pub fn without_neighbor(&self) -> Hist {
        debug_assert_eq!(self.space.stage, Stage::S);
        let mut out = Hist::new(self.space);
        for ctx in 0..self.space.n_primary() {
            let rs = ctx % 2;
            let base = ctx / 6;
            let dst = base * 6 + rs;
            for s in 0..2 {
                out.counts[dst * 2 + s] += self.counts[ctx * 2 + s];
            }
        }
        out
    }
}

/// A normalized frequency row with its cumulative starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub freq: Vec<u32>,
    pub start: Vec<u32>,
}

impl Row {
    pub fn from_freqs(freq: Vec<u32>) -> Row {
        let mut start = Vec::with_capacity(freq.len());
        let mut acc = 0;
        for &f in &freq {
            start.push(acc);
            acc += f;
        }
        Row { freq, start }
    }
    /// The symbol whose interval holds `slot`.
    #[inline]
    pub fn lookup(&self, slot: u32) -> usize {
        let mut s = 0;
        while s + 1 < self.freq.len() && slot >= self.start[s + 1] {
            s += 1;
        }
        s
    }
}

/// The transmitted table of one stage and the context → row map both sides derive from it.
#[derive(Clone, Debug)]
pub struct StageTable {
    pub space: Space,
    /// `(primary context id, row)` in ascending id order.
    pub explicit: Vec<(u32, Row)>,
    /// `(backoff id, row)` in ascending id order.
    pub backoff: Vec<(u32, Row)>,
    /// Primary context id → index into `rows()`; `u32::MAX` when no row covers it.
    pub map: Vec<u32>,
}

impl StageTable {
    fn build(space: Space, explicit: Vec<(u32, Row)>, backoff: Vec<(u32, Row)>) -> StageTable {
        let mut map = vec![u32::MAX; space.n_primary()];
        let nb = space.n_backoff();
        let mut backoff_index = vec![u32::MAX; nb];
        for (i, (id, _)) in backoff.iter().enumerate() {
            backoff_index[*id as usize] = (explicit.len() + i) as u32;
        }
        // map[ctx] = backoff_index[ctx % nb], without a division per context.
        for (m, &b) in map.iter_mut().zip(backoff_index.iter().cycle()) {
            *m = b;
        }
        for (i, (id, _)) in explicit.iter().enumerate() {
            map[*id as usize] = i as u32;
        }
        StageTable {
            space,
            explicit,
            backoff,
            map,
        }
    }

    pub fn row(&self, index: u32) -> &Row {
        let i = index as usize;
        if i < self.explicit.len() {
            &self.explicit[i].1
        } else {
            &self.backoff[i - self.explicit.len()].1
        }
    }

    /// Choose rows from a histogram. `prune = false` gives every occupied context its own row
    /// (the paper); `prune = true` keeps a context's own row only where it pays for itself.
    pub fn select(hist: &Hist, prune: bool) -> StageTable {
        let space = hist.space;
        let a = space.alphabet();
        let nb = space.n_backoff();
        let occupied = hist.occupied();

        let mut group = vec![0u64; nb * a];
        for &ctx in &occupied {
            let g = ctx % nb;
            for (acc, &c) in group[g * a..(g + 1) * a].iter_mut().zip(hist.row(ctx)) {
                *acc += c;
            }
        }
        let group_freqs: Vec<Vec<u32>> = (0..nb)
            .map(|g| normalize(&group[g * a..(g + 1) * a]))
            .collect();

        let mut explicit = Vec::new();
        let mut rest = vec![0u64; nb * a];
        for ctx in occupied {
            let counts = hist.row(ctx);
            let own = normalize(counts);
            let keep = !prune || {
                let own_cost = cost(counts, &own) + (row_bytes(&own) as u64 + 1) * 8 * COST_ONE_BIT;
                own_cost < cost(counts, &group_freqs[ctx % nb])
            };
            if keep {
                explicit.push((ctx as u32, Row::from_freqs(own)));
            } else {
                let g = ctx % nb;
                for (acc, &c) in rest[g * a..(g + 1) * a].iter_mut().zip(counts) {
                    *acc += c;
                }
            }
        }
        let backoff = (0..nb)
            .filter_map(|g| {
                let counts = &rest[g * a..(g + 1) * a];
                counts
                    .iter()
                    .any(|&c| c > 0)
                    .then(|| (g as u32, Row::from_freqs(normalize(counts))))
            })
            .collect();
        StageTable::build(space, explicit, backoff)
    }

    /// Ideal code length of `hist` under this table, in COST_ONE_BIT units.
    pub fn data_cost(&self, hist: &Hist) -> u64 {
        hist.occupied()
            .into_iter()
            .map(|ctx| cost(hist.row(ctx), &self.row(self.map[ctx]).freq))
            .sum()
    }

    /// Serialize (docs/FORMAT.md, "stage table").
    pub fn write(&self, w: &mut ByteWriter) {
        for list in [&self.explicit, &self.backoff] {
            w.varint(list.len() as u64);
            let mut next = 0u32;
            for (id, row) in list.iter() {
                w.varint((id - next) as u64);
                next = id + 1;
                write_row(w, &row.freq);
            }
        }
    }

    pub fn read(r: &mut ByteReader, space: Space) -> Result<StageTable> {
        let mut lists = Vec::with_capacity(2);
        for limit in [space.n_primary(), space.n_backoff()] {
            let n = r.varint_max(limit as u64, "table row count")? as usize;
            let mut list = Vec::with_capacity(n);
            let mut next = 0u64;
            for _ in 0..n {
                let id = next + r.varint_max(limit as u64, "context id gap")?;
                if id >= limit as u64 {
                    return Err(r.err(format!("context id {id} out of range (< {limit})")));
                }
                next = id + 1;
                list.push((id as u32, Row::from_freqs(read_row(r, space.alphabet())?)));
            }
            lists.push(list);
        }
        let backoff = lists.pop().unwrap();
        let explicit = lists.pop().unwrap();
        Ok(StageTable::build(space, explicit, backoff))
    }
}

/// `entropy::freq::cost`, with the per-symbol cost of every possible frequency looked up
/// instead of recomputed (same integers; table selection runs this for every context).
pub fn cost(counts: &[u64], freqs: &[u32]) -> u64 {
    static BITS: OnceLock<Vec<u64>> = OnceLock::new();
    let bits = BITS.get_or_init(|| {
        let one = PROB_BITS as u64 * COST_ONE_BIT;
        (0..=PROB_TOTAL as u64)
            .map(|f| one - log2_fixed(f.max(1)))
            .collect()
    });
    counts
        .iter()
        .zip(freqs)
        .filter(|(&c, _)| c > 0)
        .map(|(&c, &f)| c * bits[f as usize])
        .sum()
}

/// Bytes a row takes in the table format (what [`write_row`] writes), without writing it.
pub fn row_bytes(freq: &[u32]) -> usize {
    if freq.len() == 2 {
        return varint_len(freq[0] as u64);
    }
    let mut n = 0;
    let mut next = 0;
    let mut last_f = 0;
    let mut k = 0;
    for (s, &f) in freq.iter().enumerate().filter(|(_, &f)| f > 0) {
        n += varint_len((s - next) as u64) + varint_len(f as u64);
        next = s + 1;
        last_f = f;
        k += 1;
    }
    // The last occupied symbol's frequency is implied.
    varint_len(k as u64) + n - if k > 0 { varint_len(last_f as u64) } else { 0 }
}

fn write_row(w: &mut ByteWriter, freq: &[u32]) {
    if freq.len() == 2 {
        w.varint(freq[0] as u64);
        return;
    }
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
    if alphabet == 2 {
        let f0 = r.varint_max(total, "binary frequency")? as u32;
        return Ok(vec![f0, PROB_TOTAL - f0]);
    }
    let k = r.varint_max(alphabet as u64, "occupied symbols")? as usize;
    if k == 0 {
        return Err(r.err("empty frequency row"));
    }
    let mut freq = vec![0u32; alphabet];
    let mut next = 0u64;
    let mut sum = 0u64;
    for i in 0..k {
        let s = next + r.varint_max(alphabet as u64, "symbol gap")?;
        if s >= alphabet as u64 {
            return Err(r.err(format!("symbol {s} outside alphabet of {alphabet}")));
        }
        next = s + 1;
        let f = if i + 1 < k {
            r.varint_max(total, "frequency")?
        } else {
            total.checked_sub(sum).unwrap_or(0)
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

/// Every stage's table, as chosen for one tensor.
#[derive(Clone, Debug)]
pub struct Tables {
    /// B, Q1, Q2 and, in the Signed layout, S.
    pub stages: Vec<StageTable>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_bytes_and_cost_match_their_slow_definitions() {
        let rows: Vec<Vec<u32>> = vec![
            vec![4096, 0],
            vec![1, 4095],
            vec![0, 4096, 0],
            vec![4000, 0, 0, 90, 6],
            (0..65).map(|i| if i % 3 == 0 { 0 } else { 64 }).collect(),
        ];
        for freq in rows {
            let mut w = ByteWriter::new();
            write_row(&mut w, &freq);
            assert_eq!(row_bytes(&freq), w.len(), "{freq:?}");
            let counts: Vec<u64> = freq.iter().map(|&f| f as u64 * 3).collect();
            assert_eq!(
                cost(&counts, &freq),
                crate::entropy::freq::cost(&counts, &freq)
            );
        }
    }
}
