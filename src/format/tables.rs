//! Context models, per-tensor histograms, table selection and the table byte format.
//!
//! Each coded stage has a *primary* context (the paper's models, plus the update-sign stage) and
//! a *backoff* context obtained by dropping the reference exponent:
//!
//! | stage | symbol | primary context id | backoff id (= primary % n_backoff) |
//! |---|---|---|---|
//! | B  | b (0..=w)  | er                                 | 0 (one row) |
//! | B, neighbor form | b | (m2·(W1+1) + nb)·256 + er  | er |
//! | Q1 | q1         | er·W1 + b                          | b |
//! | Q2 | q2         | (er·W1 + b)·2 + q1                 | b·2 + q1 |
//! | S  | neg        | ((er·W1 + b)·3 + up)·2 + rs        | up·2 + rs |
//! | J (Joint layout) | (b, q1, q2, neg) joint | er·2 + rs          | rs |
//! | J, neighbor form | J | ((m2·(W1+1) + nb)·3 + up)·512 + er·2 + rs | er·2 + rs |
//!
//! with W1 = w + 1, er the reference exponent class (0 when conditioning is off), rs the
//! reference sign, m2 the reference's top two mantissa bits, and, of the already-decoded
//! element one row up, nb its bit length (W1 if none) and up its update's sign state (0 none,
//! 1 up, 2 down). Whether B and S (Signed) or J (Joint) use their neighbor forms is chosen
//! per tensor (`neighbor`); without it S sees up = 0. J's neighbor form backs off to the
//! plain J context, so the plain Joint layout's rows are its backoff rows.
//!
//! Paper mode transmits a row for every occupied primary context. The default *prunes*: a
//! primary context gets its own row only when that saves more bits than the row costs; the rest
//! share their backoff row. Decisions use integer cost estimates only (see entropy::freq).

use rayon::prelude::*;

use super::symbols::{joint_alphabet, joint_symbol, Neighbor, RefInfo, Sym, EXP_CLASSES};

use crate::bytes::{varint_len, ByteReader, ByteWriter};
use crate::entropy::freq::{
    cost, entropy_floor, full_quotients, normalize_from_quotients, normalize_into, normalize_to,
    COST_ONE_BIT, PROB_BITS, PROB_TOTAL,
};
use crate::Result;

/// The coded stages, in decoding order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    B = 0,
    Q1 = 1,
    Q2 = 2,
    S = 3,
    /// The Joint layout's only stage: b, q1, q2 and the sign as one symbol.
    J = 4,
}

/// The stages of the Paper (first three) and Signed (all four) layouts, in decoding order.
pub const STAGES: [Stage; 4] = [Stage::B, Stage::Q1, Stage::Q2, Stage::S];

/// Sizes of one stage's context space for a float width.
#[derive(Clone, Copy, Debug)]
pub struct Space {
    pub stage: Stage,
    /// b alphabet size, w + 1.
    pub w1: usize,
    /// Whether the stage's context includes the neighbor one row up (B: its bit length and
    /// the reference mantissa; S: its update sign; J: all three). Always false for Q1 and
    /// Q2.
    pub neighbor: bool,
}

impl Space {
    pub fn new(stage: Stage, width: u32, neighbor: bool) -> Self {
        Space {
            stage,
            w1: width as usize + 1,
            neighbor: neighbor && matches!(stage, Stage::B | Stage::S | Stage::J),
        }
    }
    /// Neighbor bit-length classes: 0 ..= w, and w + 1 for "no neighbor".
    fn nb_classes(&self) -> usize {
        self.w1 + 1
    }

    pub fn alphabet(&self) -> usize {
        match self.stage {
            Stage::B => self.w1,
            Stage::J => joint_alphabet(self.w1 as u32 - 1),
            _ => 2,
        }
    }
    pub fn n_primary(&self) -> usize {
        let e = EXP_CLASSES;
        match self.stage {
            Stage::B if self.neighbor => 4 * self.nb_classes() * e,
            Stage::B => e,
            Stage::Q1 => e * self.w1,
            Stage::Q2 => e * self.w1 * 2,
            Stage::S => e * self.w1 * 6,
            Stage::J if self.neighbor => 4 * self.nb_classes() * 3 * e * 2,
            Stage::J => e * 2,
        }
    }
    pub fn n_backoff(&self) -> usize {
        match self.stage {
            Stage::B if self.neighbor => EXP_CLASSES,
            Stage::B => 1,
            Stage::Q1 => self.w1,
            Stage::Q2 => self.w1 * 2,
            Stage::S => 6,
            Stage::J if self.neighbor => EXP_CLASSES * 2,
            Stage::J => 2,
        }
    }
    /// Does element `s` carry a symbol in this stage?
    #[inline]
    pub fn present(&self, s: &Sym) -> bool {
        match self.stage {
            Stage::B | Stage::J => true,
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
            Stage::J => joint_symbol(s),
        }
    }
    /// Primary context id; only fields already decoded when this stage runs are read.
    #[inline]
    pub fn context(&self, s: &Sym, r: RefInfo, nb: Neighbor) -> usize {
        let er = r.er as usize;
        match self.stage {
            Stage::B if self.neighbor => {
                let nb_class = (nb.b as usize).min(self.w1);
                (r.m2 as usize * self.nb_classes() + nb_class) * EXP_CLASSES + er
            }
            Stage::B => er,
            Stage::Q1 => er * self.w1 + s.b as usize,
            Stage::Q2 => (er * self.w1 + s.b as usize) * 2 + s.q1 as usize,
            Stage::S => {
                let up = if self.neighbor { nb.sign as usize } else { 0 };
                ((er * self.w1 + s.b as usize) * 3 + up) * 2 + r.rs as usize
            }
            Stage::J if self.neighbor => {
                let nb_class = (nb.b as usize).min(self.w1);
                let near = (r.m2 as usize * self.nb_classes() + nb_class) * 3 + nb.sign as usize;
                (near * EXP_CLASSES + er) * 2 + r.rs as usize
            }
            Stage::J => er * 2 + r.rs as usize,
        }
    }
}

/// One stage's histogram, sparse twice over: the rows of the occupied contexts only (a
/// context space can be large, e.g. 18k contexts for B in its neighbor form, and mostly
/// empty), each row stored from its first seen symbol to its last (a J row of 247 symbols
/// sees a few dozen in a narrow range; a small tensor of the neighbor form occupies some
/// 1,800 contexts, and passes over their whole rows were most of choosing its tables).
#[derive(Clone, Debug)]
pub struct Hist {
    pub space: Space,
    /// Occupied contexts, ascending.
    ctxs: Vec<u32>,
    /// Per row: its first stored symbol and where its counts start in `counts` (they run
    /// to the next row's start). Binary rows are stored whole.
    spans: Vec<(u32, usize)>,
    /// Every row's stored counts; a row's first and last are non-zero (binary rows: not
    /// both zero).
    counts: Vec<u64>,
}

/// One row of a [`Hist`]: the counts of symbols `lo..lo + counts.len()` of an alphabet of
/// `alphabet`; every other symbol's count is 0.
#[derive(Clone, Copy, Debug)]
pub struct RowCounts<'a> {
    pub lo: usize,
    pub counts: &'a [u64],
    pub alphabet: usize,
}

impl<'a> RowCounts<'a> {
    /// A whole row (`lo` = 0, every symbol's count).
    pub fn full(counts: &'a [u64]) -> Self {
        RowCounts {
            lo: 0,
            counts,
            alphabet: counts.len(),
        }
    }
    /// `(symbol, count)` of every stored count.
    pub fn iter(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .map(|(i, &c)| (self.lo + i, c))
    }
    /// Add this row's counts into a whole row of `alphabet` counts.
    fn add_to(&self, row: &mut [u64]) {
        for (d, &c) in row[self.lo..].iter_mut().zip(self.counts) {
            *d += c;
        }
    }
}

impl Hist {
    /// An empty histogram.
    pub fn new(space: Space) -> Self {
        Self::with_capacity(space, 0, 0)
    }
    /// An empty histogram with room for `rows` rows of `counts` stored counts in all.
    fn with_capacity(space: Space, rows: usize, counts: usize) -> Self {
        Hist {
            space,
            ctxs: Vec::with_capacity(rows),
            spans: Vec::with_capacity(rows),
            counts: Vec::with_capacity(counts),
        }
    }
    /// The part of a whole row that is stored, `lo..hi`: from its first non-zero count to
    /// its last (binary rows whole); `None` for an all-zero row.
    fn stored<C: Copy + Into<u64>>(row: &[C]) -> Option<(usize, usize)> {
        let nonzero = |c: &C| (*c).into() != 0;
        let first = row.iter().position(nonzero)?;
        Some(if row.len() == 2 {
            (0, 2)
        } else {
            (first, row.iter().rposition(nonzero).unwrap_or(first) + 1)
        })
    }
    /// Append context `ctx`'s whole row (greater than every context so far), trimmed; an
    /// all-zero row is dropped.
    fn push<C: Copy + Into<u64>>(&mut self, ctx: u32, row: &[C]) {
        let Some((lo, hi)) = Self::stored(row) else {
            return;
        };
        self.ctxs.push(ctx);
        self.spans.push((lo as u32, self.counts.len()));
        self.counts.extend(row[lo..hi].iter().map(|&c| c.into()));
    }
    /// From dense counts, `counts[context * alphabet + symbol]`.
    pub fn from_dense(space: Space, counts: &[u64]) -> Self {
        let a = space.alphabet();
        assert_eq!(counts.len(), space.n_primary() * a);
        let mut h = Hist::new(space);
        for (ctx, row) in counts.chunks_exact(a).enumerate() {
            h.push(ctx as u32, row);
        }
        h
    }
    /// From the occupied contexts in ascending order and their rows, none all zero (a
    /// pass that makes them in order: no sort, the rows trimmed where they lie).
    ///
    /// # Panics
    /// If a context repeats, is out of order or out of range, or a row is all zero.
    pub fn from_sorted(space: Space, ctxs: Vec<u32>, rows: Vec<u64>) -> Self {
        let a = space.alphabet();
        assert_eq!(ctxs.len() * a, rows.len());
        assert!(
            ctxs.windows(2).all(|p| p[0] < p[1])
                && ctxs
                    .last()
                    .is_none_or(|&c| (c as usize) < space.n_primary()),
            "contexts out of order or range"
        );
        let mut counts = rows;
        let mut spans = Vec::with_capacity(ctxs.len());
        let mut end = 0;
        for k in 0..ctxs.len() {
            let (lo, hi) = Self::stored(&counts[k * a..][..a]).expect("an all-zero row");
            spans.push((lo as u32, end));
            // The stored part moves down only (`end <= k·a + lo`); element by element, as
            // most rows are binary and a `copy_within` per row was a call each.
            for i in 0..hi - lo {
                counts[end + i] = counts[k * a + lo + i];
            }
            end += hi - lo;
        }
        counts.truncate(end);
        Hist {
            space,
            ctxs,
            spans,
            counts,
        }
    }
    /// From whole rows in any order, `rows[k * alphabet..][..alphabet]` the counts of
    /// `ctxs[k]`; rows of one context add up, all-zero rows are dropped.
    pub fn from_rows<C: Copy + Into<u64>>(space: Space, ctxs: &[u32], rows: &[C]) -> Self {
        let a = space.alphabet();
        assert_eq!(ctxs.len() * a, rows.len());
        let mut order: Vec<usize> = (0..ctxs.len()).collect();
        order.sort_unstable_by_key(|&k| ctxs[k]);
        let mut h = Hist::with_capacity(space, ctxs.len(), rows.len());
        let mut sum = vec![0u64; a];
        let mut i = 0;
        while i < order.len() {
            let ctx = ctxs[order[i]];
            assert!(
                (ctx as usize) < space.n_primary(),
                "context {ctx} out of range"
            );
            let same = order[i..].iter().take_while(|&&k| ctxs[k] == ctx).count();
            if same == 1 {
                h.push(ctx, &rows[order[i] * a..][..a]);
            } else {
                sum.fill(0);
                for &k in &order[i..i + same] {
                    for (d, &c) in sum.iter_mut().zip(&rows[k * a..][..a]) {
                        *d += c.into();
                    }
                }
                h.push(ctx, &sum);
            }
            i += same;
        }
        h
    }
    /// From stored rows in any order; rows of one context add up.
    fn from_parts(space: Space, mut parts: Vec<(u32, RowCounts)>) -> Self {
        let a = space.alphabet();
        parts.sort_unstable_by_key(|&(ctx, _)| ctx);
        let stored = parts.iter().map(|(_, r)| r.counts.len()).sum();
        let mut h = Hist::with_capacity(space, parts.len(), stored);
        let mut sum = vec![0u64; a];
        for group in parts.chunk_by(|x, y| x.0 == y.0) {
            sum.fill(0);
            for (_, r) in group {
                r.add_to(&mut sum);
            }
            h.push(group[0].0, &sum);
        }
        h
    }
    /// Dense counts, `counts[context * alphabet + symbol]`.
    pub fn dense(&self) -> Vec<u64> {
        let a = self.space.alphabet();
        let mut out = vec![0; self.space.n_primary() * a];
        for (ctx, row) in self.rows() {
            row.add_to(&mut out[ctx * a..][..a]);
        }
        out
    }
    /// `(context, counts)` of every occupied context, ascending.
    pub fn rows(&self) -> impl Iterator<Item = (usize, RowCounts<'_>)> {
        let alphabet = self.space.alphabet();
        let ends = self.spans.iter().skip(1).map(|&(_, at)| at);
        let ends = ends.chain(std::iter::once(self.counts.len()));
        self.ctxs
            .iter()
            .zip(&self.spans)
            .zip(ends)
            .map(move |((&ctx, &(lo, at)), end)| {
                let counts = &self.counts[at..end];
                (
                    ctx as usize,
                    RowCounts {
                        lo: lo as usize,
                        counts,
                        alphabet,
                    },
                )
            })
    }
    pub fn add(&mut self, other: &Hist) {
        let parts = self.rows().chain(other.rows());
        let parts = parts.map(|(ctx, r)| (ctx as u32, r)).collect();
        *self = Hist::from_parts(self.space, parts);
    }
    /// Contexts with at least one count, ascending.
    pub fn occupied(&self) -> Vec<usize> {
        self.ctxs.iter().map(|&c| c as usize).collect()
    }
    /// The same counts as the stage would see without its neighbor context.
    pub fn without_neighbor(&self) -> Hist {
        let sp = self.space;
        let plain = Space {
            neighbor: false,
            ..sp
        };
        let parts = self
            .rows()
            .map(|(ctx, r)| {
                let ctx = ctx as u32;
                let ctx = match sp.stage {
                    // (m2, nb, er) -> er
                    Stage::B if sp.neighbor => ctx % EXP_CLASSES as u32,
                    // (.., up, rs) -> (.., 0, rs)
                    Stage::S if sp.neighbor => ctx / 6 * 6 + ctx % 2,
                    // (m2, nb, up, er, rs) -> (er, rs)
                    Stage::J if sp.neighbor => ctx % (2 * EXP_CLASSES as u32),
                    _ => ctx,
                };
                (ctx, r)
            })
            .collect();
        Hist::from_parts(plain, parts)
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
    /// `PROB_TOTAL` entries: the symbol owning each slot (a decoder's lookup table).
    pub fn slots(&self) -> Vec<u16> {
        let mut s = Vec::with_capacity(PROB_TOTAL as usize);
        for (sym, &f) in self.freq.iter().enumerate() {
            s.extend(std::iter::repeat_n(sym as u16, f as usize));
        }
        s
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
    /// Context → index into `rows()`; `u32::MAX` when no row covers it. Indexed by the
    /// primary context id, except in J's neighbor form: there by [`Window::index`] (a
    /// dense map over its 110,592 to 208,896 contexts per tensor cost more to build than
    /// the lanes it served).
    pub map: Vec<u32>,
    /// The exponent classes J's neighbor-form map covers (empty for every other stage).
    pub window: Window,
}

/// The exponent classes `lo..lo + n` of a J neighbor-form map: every row's context lies in
/// them, so a context outside has no row. Map index `near·2n + (er - lo)·2 + rs` for the
/// context `near·512 + er·2 + rs`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub lo: u32,
    pub n: u32,
}

impl Window {
    /// Neighbor parts of a J neighbor-form context (`ctx / 512`).
    pub fn nears(space: Space) -> usize {
        space.n_primary() / (2 * EXP_CLASSES)
    }
    /// The exponent classes of these rows' contexts.
    fn of(explicit: &[(u32, Row)], backoff: &[(u32, Row)]) -> Window {
        let ers = explicit
            .iter()
            .chain(backoff)
            .map(|(id, _)| id % (2 * EXP_CLASSES as u32) / 2);
        match ers.clone().min().zip(ers.max()) {
            Some((lo, hi)) => Window { lo, n: hi - lo + 1 },
            None => Window::default(),
        }
    }
    /// The map index of primary context `ctx`, if its exponent class is in the window.
    #[inline]
    pub fn index(&self, ctx: usize) -> Option<usize> {
        let (near, e2) = (ctx / (2 * EXP_CLASSES), ctx % (2 * EXP_CLASSES));
        let k = (e2 / 2).checked_sub(self.lo as usize)?;
        (k < self.n as usize).then(|| near * 2 * self.n as usize + 2 * k + e2 % 2)
    }
}

impl StageTable {
    fn build(space: Space, explicit: Vec<(u32, Row)>, backoff: Vec<(u32, Row)>) -> StageTable {
        let (map, window) = if space.stage == Stage::J && space.neighbor {
            let window = Window::of(&explicit, &backoff);
            (windowed_map(space, window, &explicit, &backoff), window)
        } else {
            let map = rows_per_context(space, &explicit, &backoff, |ri| ri);
            (map, Window::default())
        };
        StageTable {
            space,
            explicit,
            backoff,
            map,
            window,
        }
    }

    /// The row of primary context `ctx` (an index into `rows()`), `u32::MAX` where none.
    #[inline]
    pub fn row_of(&self, ctx: usize) -> u32 {
        let at = if self.window.n > 0 {
            self.window.index(ctx)
        } else {
            Some(ctx)
        };
        at.and_then(|i| self.map.get(i))
            .copied()
            .unwrap_or(u32::MAX)
    }

    /// `f(map[ctx])` for every primary context, made as the map is ([`rows_per_context`]):
    /// decoders' tables per context (a default-layout tensor's have some 120,000 entries)
    /// filled one lookup at a time took about 6% of an fp32 default-layout decode on a Zen 2.
    pub fn per_context<T: Copy>(&self, f: impl Fn(u32) -> T) -> Vec<T> {
        rows_per_context(self.space, &self.explicit, &self.backoff, f)
    }

    pub fn row(&self, index: u32) -> &Row {
        let i = index as usize;
        if i < self.explicit.len() {
            &self.explicit[i].1
        } else {
            &self.backoff[i - self.explicit.len()].1
        }
    }

    /// Choose rows from a histogram: [`Selection::of`] with its context map.
    pub fn select(hist: &Hist, prune: bool) -> StageTable {
        Selection::of(hist, prune).table()
    }

    /// Bytes [`StageTable::write`] writes, without writing them.
    pub fn bytes(&self) -> usize {
        lists_bytes(&self.explicit, &self.backoff)
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

/// What a row of `space` costs its decoders beyond its bytes in the file, in COST_ONE_BIT
/// units, for a tensor of `elements`: a row of the Joint layout's neighbor form is a 4 KiB
/// slot table (1 KiB of buckets in the AVX2 lanes that gather) plus 1 KiB of frequencies in
/// every decoder (`backend::cpu::joint_near`'s `NearSlots`, and the GPU ones), whose vector
/// lanes read it at random; the fewer rows, the
/// more of them stay in cache. Priced at one bit per 8,192 elements (98 bytes for the GPT-2
/// trajectory's 6.4M-element embedding), so a large tensor's rows must save as much more as
/// its many elements read them: on that embedding 407 rows became 245 for 0.097% more bytes
/// (bf16; fp32 314 became 237 for 0.011%), and its decode ran about 1.1x faster at AVX2
/// (docs/BENCHMARKS.md, 2026-12-06). Other stages' rows decode from small tables: 0.
pub fn decode_table_price(space: Space, elements: u64) -> u64 {
    if space.stage == Stage::J && space.neighbor {
        (elements >> 13) * COST_ONE_BIT
    } else {
        0
    }
}

/// Rows chosen for a histogram, and the data's cost under them: what candidate layouts and
/// context forms are compared by. Only the chosen ones become [`StageTable`]s, whose context
/// maps (up to 50,688 entries for stage S) were a good part of building the candidates.
#[derive(Clone, Debug)]
pub struct Selection {
    pub space: Space,
    pub explicit: Vec<(u32, Row)>,
    pub backoff: Vec<(u32, Row)>,
    /// Ideal code length of the histogram under these rows, in COST_ONE_BIT units: each
    /// context's counts priced under the row the table's map gives it.
    pub data_cost: u64,
}

impl Selection {
    /// Choose rows from a histogram. `prune = false` gives every occupied context its own row
    /// (the paper); `prune = true` keeps a context's own row only where it pays for itself.
    pub fn of(hist: &Hist, prune: bool) -> Selection {
        let decoding = decode_table_price(hist.space, hist.counts.iter().sum());
        Self::of_priced(hist, prune, decoding)
    }

    /// [`Selection::of`] with each own row also charged `decoding` ([`decode_table_price`]).
    fn of_priced(hist: &Hist, prune: bool, decoding: u64) -> Selection {
        let space = hist.space;
        let a = space.alphabet();
        let nb = space.n_backoff();

        // Only the groups that hold counts, ascending, each with a compact number (`at`):
        // a neighbor-form J has 512 groups of 247 symbols and a small tensor fills a few
        // dozen; summing into all of them zeroed a megabyte twice per selection.
        let rows: Vec<(usize, RowCounts)> = hist.rows().collect();
        let mut at = vec![u32::MAX; nb];
        for &(ctx, _) in &rows {
            at[ctx % nb] = 0;
        }
        let groups: Vec<usize> = (0..nb).filter(|&g| at[g] == 0).collect();
        for (k, &g) in groups.iter().enumerate() {
            at[g] = k as u32;
        }
        let slot = |ctx: usize| at[ctx % nb] as usize * a..(at[ctx % nb] as usize + 1) * a;

        let mut group = vec![0u64; groups.len() * a];
        // Without pruning no row is priced against its group's: no group rows to make.
        for (ctx, row) in rows.iter().filter(|_| prune) {
            row.add_to(&mut group[slot(*ctx)]);
        }
        let mut scratch = RowScratch::default();
        let group_freqs: Vec<Vec<u32>> = if prune {
            group
                .chunks_exact(a)
                .map(|counts| best_row(RowCounts::full(counts), &mut scratch))
                .collect()
        } else {
            Vec::new()
        };

        // Each row priced on the pool: for a large tensor, choosing its tables is serial
        // work of a few percent of its encode, which a second thread could not share.
        // Whether a row keeps its own row, and at which precision (None: pooled). Pruning,
        // a row whose pooled cost is within the least its own row could cost (its bytes,
        // `least_row_bytes`, a byte of id, and its data at their entropy) is pooled without
        // pricing it: the decision pricing would make, for most rows of a small tensor
        // (their pricing was a fifth of a small tensor's default-layout encode on a Zen 2).
        let decide = |ctx: usize, counts: RowCounts, s: &mut RowScratch| -> Option<u32> {
            if !prune {
                return Some(row_price(counts, s).1);
            }
            let pooled = cost(
                counts.counts,
                &group_freqs[at[ctx % nb] as usize][counts.lo..],
            );
            let least = (least_row_bytes(counts) as u64 + 1) * 8 * COST_ONE_BIT + decoding;
            // Nor where its own row could not pay even at its entropy (`row_price` is at
            // least that plus the row's least bytes): the same decision, unpriced (the
            // first test spares most rows the floor's logarithms).
            if pooled <= least || pooled <= least + entropy_floor(counts.counts) {
                return None;
            }
            // The row's own cost: its data, its bytes, one byte of context id and what its
            // decode table costs the decoders.
            let (own, bits) = row_price(counts, s);
            (own + 8 * COST_ONE_BIT + decoding < pooled).then_some(bits)
        };
        // A small tensor's few rows on this thread: the pool's dispatch cost more than them.
        let decided: Vec<Option<u32>> = if rows.len() < 64 {
            rows.iter()
                .map(|&(ctx, counts)| decide(ctx, counts, &mut scratch))
                .collect()
        } else {
            rows.par_iter()
                .with_min_len(8)
                .map_init(RowScratch::default, |s, &(ctx, counts)| {
                    decide(ctx, counts, s)
                })
                .collect()
        };
        let mut explicit = Vec::new();
        let mut data_cost = 0;
        let mut rest = group;
        rest.fill(0);
        for ((ctx, counts), keep) in rows.into_iter().zip(decided) {
            if let Some(bits) = keep {
                let row = Row::from_freqs(row_at(counts, bits));
                data_cost += cost(counts.counts, &row.freq[counts.lo..]);
                explicit.push((ctx as u32, row));
            } else {
                counts.add_to(&mut rest[slot(ctx)]);
            }
        }
        // The pooled rows' cost under their group's row: `cost` is linear in the counts,
        // so the group's summed counts price them all at once.
        let backoff = groups
            .iter()
            .zip(rest.chunks_exact(a))
            .filter(|(_, counts)| counts.iter().any(|&c| c > 0))
            .map(|(&g, counts)| {
                let row = Row::from_freqs(best_row(RowCounts::full(counts), &mut scratch));
                data_cost += cost(counts, &row.freq);
                (g as u32, row)
            })
            .collect();
        Selection {
            space,
            explicit,
            backoff,
            data_cost,
        }
    }

    /// Bytes the table of these rows takes ([`StageTable::bytes`]).
    pub fn bytes(&self) -> usize {
        lists_bytes(&self.explicit, &self.backoff)
    }

    /// The table of these rows, with its context map.
    pub fn table(self) -> StageTable {
        StageTable::build(self.space, self.explicit, self.backoff)
    }
}

/// `f(row index)` for every primary context of `space` under these rows (`u32::MAX` where no
/// row covers it): the backoff rows' period (`ctx % n_backoff`), its first `n_backoff`
/// entries then the filled prefix copied after itself (a multiple of the period long, so
/// the period holds), then the explicit rows written over it. Selection builds several
/// tables per tensor, up to 50,688 contexts each: filling them element by element after a
/// clearing memset was a tenth of a small tensor's encode.
fn rows_per_context<T: Copy>(
    space: Space,
    explicit: &[(u32, Row)],
    backoff: &[(u32, Row)],
    f: impl Fn(u32) -> T,
) -> Vec<T> {
    let (n, nb) = (space.n_primary(), space.n_backoff());
    let mut period = vec![f(u32::MAX); nb.min(n)];
    for (i, (id, _)) in backoff.iter().enumerate() {
        if let Some(p) = period.get_mut(*id as usize) {
            *p = f((explicit.len() + i) as u32);
        }
    }
    let mut out = Vec::with_capacity(n);
    out.extend_from_slice(&period);
    while out.len() < n {
        out.extend_from_within(..out.len().min(n - out.len()));
    }
    for (i, (id, _)) in explicit.iter().enumerate() {
        out[*id as usize] = f(i as u32);
    }
    out
}

/// J's neighbor-form map over `window` ([`Window::index`]): each neighbor part's span of
/// backoff rows (the plain J contexts er·2 + rs), the explicit rows written over them.
fn windowed_map(
    space: Space,
    window: Window,
    explicit: &[(u32, Row)],
    backoff: &[(u32, Row)],
) -> Vec<u32> {
    let span = 2 * window.n as usize;
    let mut period = vec![u32::MAX; span];
    for (i, (id, _)) in backoff.iter().enumerate() {
        if let Some(k) = window.index(*id as usize) {
            period[k] = (explicit.len() + i) as u32;
        }
    }
    let mut map = Vec::with_capacity(span * Window::nears(space));
    for _ in 0..Window::nears(space) {
        map.extend_from_slice(&period);
    }
    for (i, (id, _)) in explicit.iter().enumerate() {
        if let Some(k) = window.index(*id as usize) {
            map[k] = i as u32;
        }
    }
    map
}

/// Bytes of a table's two row lists in the table format.
fn lists_bytes(explicit: &[(u32, Row)], backoff: &[(u32, Row)]) -> usize {
    [explicit, backoff]
        .iter()
        .map(|list| {
            let mut next = 0u32;
            varint_len(list.len() as u64)
                + list
                    .iter()
                    .map(|(id, row)| {
                        let gap = id - next;
                        next = id + 1;
                        varint_len(gap as u64) + row_bytes(&row.freq)
                    })
                    .sum::<usize>()
        })
        .sum()
}

/// Precisions a multi-symbol row may be transmitted at (bits of its total).
const ROW_PRECISIONS: [u32; 4] = [PROB_BITS, 10, 8, 6];

/// The cheapest normalized row for `counts`: each candidate precision is priced as the data's
/// code length under it plus the row's bytes (integer estimates only). Binary rows are always
/// sent at full precision. `s`: buffers kept across a selection's rows.
fn best_row(counts: RowCounts, s: &mut RowScratch) -> Vec<u32> {
    row_at(counts, row_price(counts, s).1)
}

/// `counts` normalized at `bits` of precision, scaled to the full total (as sent): the
/// whole row's normalization is its stored counts', the symbols outside them at 0 (they
/// have no count: no frequency, never the largest, and ties between the others go the same
/// way in either numbering).
fn row_at(counts: RowCounts, bits: u32) -> Vec<u32> {
    let mut row = normalize_to(counts.counts, bits);
    if row.len() < counts.alphabet {
        row.splice(0..0, std::iter::repeat_n(0, counts.lo));
        row.resize(counts.alphabet, 0);
    }
    for f in row.iter_mut() {
        *f <<= PROB_BITS - bits;
    }
    row
}

/// Buffers of [`row_price`], kept across the rows of a selection.
#[derive(Default)]
struct RowScratch {
    seen_at: Vec<usize>,
    seen: Vec<u64>,
    /// The seen counts' quotients at full precision (every precision's, shifted).
    quotients: Vec<u64>,
    row: Vec<u32>,
}

/// The price of [`best_row`] (the data's code length under it plus the row's bytes, in
/// COST_ONE_BIT units) and the precision that gives it, for [`row_at`].
///
/// Priced on the row's seen symbols only: a J row of 119 or 247 symbols sees a few dozen,
/// and every context of every candidate precision is priced (table selection was about a
/// tenth of a bf16 `--fast` encode on a Zen 2). Unseen symbols change nothing but the
/// row's bytes: each inside the row's symbol range is one zero byte (see [`row_bytes`]).
/// [`normalize_into`] of the seen counts is the full row's normalization at the seen
/// symbols: unseen ones get no frequency, are never the largest count, and never hold
/// the units an excess removes.
fn row_price(counts: RowCounts, s: &mut RowScratch) -> (u64, u32) {
    if counts.alphabet == 2 {
        let mut whole = [0; 2];
        counts.add_to(&mut whole);
        normalize_into(&whole, PROB_BITS, &mut s.row);
        let p = cost(&whole, &s.row) + row_bytes(&s.row) as u64 * 8 * COST_ONE_BIT;
        return (p, PROB_BITS);
    }
    s.seen_at.clear();
    s.seen.clear();
    for (i, c) in counts.iter() {
        if c > 0 {
            s.seen_at.push(i);
            s.seen.push(c);
        }
    }
    let (Some(&lo), Some(&hi)) = (s.seen_at.first(), s.seen_at.last()) else {
        // An empty row: all zeros (its bytes: the shift, the start and a span of one).
        let zero = vec![0; counts.alphabet];
        return (row_bytes(&zero) as u64 * 8 * COST_ONE_BIT, PROB_BITS);
    };
    // `row_bytes` of the full row from its seen frequencies: the range's zeros take a byte
    // each, and the last seen frequency is implied.
    let bytes = |f: &[u32]| {
        let shift = row_shift(f);
        let extra: usize = f[..f.len() - 1]
            .iter()
            .map(|&f| varint_extra(f >> shift))
            .sum();
        wide_row_bytes(lo, hi, shift, extra)
    };
    let mut best = (u64::MAX, PROB_BITS);
    full_quotients(&s.seen, &mut s.quotients);
    for bits in ROW_PRECISIONS
        .iter()
        .copied()
        .filter(|&b| b == PROB_BITS || 1u64 << b >= s.seen.len() as u64)
    {
        normalize_from_quotients(&s.seen, &s.quotients, bits, &mut s.row);
        for f in s.row.iter_mut() {
            *f <<= PROB_BITS - bits;
        }
        let p = cost(&s.seen, &s.row) + bytes(&s.row) as u64 * 8 * COST_ONE_BIT;
        // The first (finest) of equal prices.
        if p < best.0 {
            best = (p, bits);
        }
    }
    best
}

/// The fewest bytes a row normalized from `counts` (not all zero) can take, whatever its
/// precision: a binary row's one; a wider row's shift, start and span (a byte each at least)
/// and a byte per symbol from its first seen symbol to its last (every seen symbol has a
/// frequency, so its range covers theirs), the last implied.
pub fn least_row_bytes(counts: RowCounts) -> usize {
    if counts.alphabet == 2 {
        return 1;
    }
    let c = counts.counts;
    let lo = c.iter().position(|&c| c > 0).unwrap_or(0);
    let hi = c.iter().rposition(|&c| c > 0).unwrap_or(lo);
    3 + (hi - lo)
}

/// Bytes a row takes in the table format (what [`write_row`] writes), without writing it.
/// Rows are priced for every context of every candidate precision, so each pass here is a
/// plain loop the compiler vectorizes (a per-frequency `varint_len` with its bit scan was
/// 3–4% of a `--fast` encode on a Zen 2).
pub fn row_bytes(freq: &[u32]) -> usize {
    if freq.len() == 2 {
        return varint_len(freq[0] as u64);
    }
    // The symbol range and the shift, as `write_row` finds them.
    let (lo, hi) = match freq.iter().position(|&f| f > 0) {
        Some(lo) => (lo, freq.iter().rposition(|&f| f > 0).unwrap_or(lo)),
        None => (0, 0),
    };
    let shift = row_shift(freq);
    let extra: usize = freq[lo..hi].iter().map(|&f| varint_extra(f >> shift)).sum();
    wide_row_bytes(lo, hi, shift, extra)
}

/// The shift `write_row` finds: the fewest trailing zeros of a non-zero frequency (those of
/// all of them or'ed), 0 for an empty row.
fn row_shift(freq: &[u32]) -> u32 {
    let all = freq.iter().fold(0u32, |a, &f| a | f);
    if all == 0 {
        0
    } else {
        all.trailing_zeros().min(PROB_BITS)
    }
}

/// Bytes of `varint(v)` past its first, as compares (one more at each 7 bits passed):
/// rows are sized for every context of every candidate precision, and this form keeps
/// those loops plain enough to vectorize.
#[inline(always)]
fn varint_extra(v: u32) -> usize {
    (v >= 1 << 7) as usize
        + (v >= 1 << 14) as usize
        + (v >= 1 << 21) as usize
        + (v >= 1 << 28) as usize
}

/// Bytes of a wide row with symbol range `lo..=hi` and `shift`, whose sent frequencies (the
/// `hi - lo` in `lo..hi`, zeros included) take one byte each plus `extra`.
fn wide_row_bytes(lo: usize, hi: usize, shift: u32, extra: usize) -> usize {
    varint_len(shift as u64)
        + varint_len(lo as u64)
        + varint_len((hi - lo + 1) as u64)
        + (hi - lo)
        + extra
}

/// Binary rows: `varint f0`. Wider rows: `varint shift` (every frequency is a multiple of
/// 2^shift), `varint lo`, `varint span` (symbols lo .. lo+span-1 hold every non-zero
/// frequency), then the first span-1 frequencies >> shift; the last is implied by the total.
fn write_row(w: &mut ByteWriter, freq: &[u32]) {
    if freq.len() == 2 {
        w.varint(freq[0] as u64);
        return;
    }
    let lo = freq.iter().position(|&f| f > 0).unwrap_or(0);
    let hi = freq.iter().rposition(|&f| f > 0).unwrap_or(0);
    let shift = freq
        .iter()
        .filter(|&&f| f > 0)
        .map(|f| f.trailing_zeros())
        .min()
        .unwrap_or(0)
        .min(PROB_BITS);
    w.varint(shift as u64);
    w.varint(lo as u64);
    w.varint((hi - lo + 1) as u64);
    for &f in &freq[lo..hi] {
        w.varint((f >> shift) as u64);
    }
}

fn read_row(r: &mut ByteReader, alphabet: usize) -> Result<Vec<u32>> {
    let total = PROB_TOTAL as u64;
    if alphabet == 2 {
        let f0 = r.varint_max(total, "binary frequency")? as u32;
        return Ok(vec![f0, PROB_TOTAL - f0]);
    }
    let shift = r.varint_max(PROB_BITS as u64, "row precision shift")? as u32;
    let lo = r.varint_max(alphabet as u64 - 1, "first symbol")? as usize;
    let span = r.varint_max((alphabet - lo) as u64, "symbol span")? as usize;
    if span == 0 {
        return Err(r.err("empty frequency row"));
    }
    let scaled_total = total >> shift;
    let mut freq = vec![0u32; alphabet];
    let mut sum = 0u64;
    for f in freq[lo..lo + span - 1].iter_mut() {
        let v = r.varint_max(scaled_total, "frequency")?;
        sum += v;
        *f = (v << shift) as u32;
    }
    if sum >= scaled_total {
        return Err(r.err("frequency row over-full"));
    }
    freq[lo + span - 1] = ((scaled_total - sum) << shift) as u32;
    Ok(freq)
}

/// Every stage's table, as chosen for one tensor.
#[derive(Clone, Debug)]
pub struct Tables {
    /// B, Q1, Q2 and, in the Signed layout, S; J alone in the Joint layout.
    pub stages: Vec<StageTable>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What lets selection pool a row unpriced: no row made from the counts, at any
    /// precision, takes fewer bytes than `least_row_bytes` says, so its own price (those
    /// bytes and a data cost >= 0) is at least that.
    #[test]
    fn no_row_is_smaller_than_its_least_bytes() {
        let mut lcg = crate::test_lcg(0xB0B5_1EDD_0C0F_FEE5);
        let mut next = || lcg() >> 33;
        for _ in 0..4000 {
            let len = [2usize, 9, 17, 33, 119, 247][next() as usize % 6];
            let mut counts: Vec<u64> = (0..len)
                .map(|_| match next() % 5 {
                    0 | 1 => 0,
                    2 => next() % 100_000,
                    _ => next() % 7,
                })
                .collect();
            if counts.iter().all(|&c| c == 0) {
                counts[next() as usize % len] = 1;
            }
            let seen = counts.iter().filter(|&&c| c > 0).count() as u64;
            let full = RowCounts::full(&counts);
            let (price, _) = row_price(full, &mut RowScratch::default());
            assert!(price >= least_row_bytes(full) as u64 * 8 * COST_ONE_BIT);
            for bits in ROW_PRECISIONS.into_iter().filter(|&b| 1u64 << b >= seen) {
                let row = row_at(full, bits);
                assert!(
                    row_bytes(&row) >= least_row_bytes(full),
                    "{counts:?} {bits}"
                );
            }
        }
    }

    /// The map is its definition: a context's explicit row, else its backoff group's row,
    /// else none.
    #[test]
    fn the_map_is_explicit_rows_over_backoff_rows() {
        let space = Space::new(Stage::S, 16, true);
        let row = || Row::from_freqs(vec![2048, 2048]);
        let explicit = vec![(3, row()), (700, row()), (20_000, row())];
        let backoff = vec![(1, row()), (4, row())];
        let t = StageTable::build(space, explicit, backoff);
        assert_eq!(t.map.len(), space.n_primary());
        for (ctx, &ri) in t.map.iter().enumerate() {
            let want = match ctx {
                3 => 0,
                700 => 1,
                20_000 => 2,
                _ => match ctx % space.n_backoff() {
                    1 => 3,
                    4 => 4,
                    _ => u32::MAX,
                },
            };
            assert_eq!(ri, want, "context {ctx}");
        }
    }

    /// J's neighbor-form map, over its exponent window only, reads as the definition at
    /// every primary context: explicit row, else the backoff row of `ctx % 512`, else none.
    #[test]
    fn the_windowed_map_is_explicit_rows_over_backoff_rows() {
        let space = Space::new(Stage::J, 16, true);
        let row = || Row::from_freqs(vec![4096]);
        let ctx = |near: u32, er: u32, rs: u32| near * 512 + er * 2 + rs;
        let explicit = vec![
            (ctx(0, 101, 1), row()),
            (ctx(7, 103, 0), row()),
            (ctx(215, 110, 1), row()),
        ];
        let backoff = vec![(ctx(0, 102, 0), row()), (ctx(0, 104, 1), row())];
        let t = StageTable::build(space, explicit, backoff);
        assert_eq!(t.window, Window { lo: 101, n: 10 });
        assert_eq!(t.map.len(), 216 * 20);
        for c in 0..space.n_primary() as u32 {
            let want = match c {
                _ if c == ctx(0, 101, 1) => 0,
                _ if c == ctx(7, 103, 0) => 1,
                _ if c == ctx(215, 110, 1) => 2,
                _ if c % 512 == ctx(0, 102, 0) => 3,
                _ if c % 512 == ctx(0, 104, 1) => 4,
                _ => u32::MAX,
            };
            assert_eq!(t.row_of(c as usize), want, "context {c}");
        }
    }

    #[test]
    fn a_selections_data_cost_is_every_context_priced_under_its_rows() {
        let mut lcg = crate::test_lcg(0x5EED_0F5E_1EC7_10A5);
        let mut next = || lcg() >> 33;
        for (stage, w, neighbor) in [
            (Stage::B, 16, true),
            (Stage::B, 32, false),
            (Stage::Q1, 16, false),
            (Stage::S, 16, true),
            (Stage::J, 16, false),
            (Stage::J, 8, false),
        ] {
            let space = Space::new(stage, w, neighbor);
            let a = space.alphabet();
            let mut counts = vec![0u64; space.n_primary() * a];
            for _ in 0..400 {
                let at = next() as usize % counts.len();
                counts[at] += match next() % 3 {
                    0 => next() % 100_000,
                    _ => next() % 10,
                };
            }
            let h = Hist::from_dense(space, &counts);
            for prune in [true, false] {
                let sel = Selection::of(&h, prune);
                let (want, t) = (sel.data_cost, sel.table());
                let got: u64 = h
                    .rows()
                    .map(|(ctx, c)| cost(c.counts, &t.row(t.map[ctx]).freq[c.lo..]))
                    .sum();
                assert_eq!(
                    got, want,
                    "{stage:?} w{w} neighbor {neighbor} prune {prune}"
                );
            }
        }
    }

    /// A neighbor-form J row must also pay for its decode table: only J's neighbor form is
    /// charged (one bit per 8,192 elements); charged, a selection keeps a subset of the rows
    /// it keeps uncharged, at no lower data cost, and a charge above any saving pools every
    /// context.
    #[test]
    fn the_decode_table_price_pools_rows_that_do_not_pay_for_it() {
        for (stage, w, neighbor) in [
            (Stage::B, 16, true),
            (Stage::S, 16, true),
            (Stage::J, 16, false),
            (Stage::Q1, 16, false),
        ] {
            let space = Space::new(stage, w, neighbor);
            assert_eq!(
                decode_table_price(space, 1 << 30),
                0,
                "{stage:?} {neighbor}"
            );
        }
        let space = Space::new(Stage::J, 16, true);
        assert_eq!(decode_table_price(space, 6_432_896), 785 * COST_ONE_BIT);
        assert_eq!(decode_table_price(space, 8191), 0);
        let mut lcg = crate::test_lcg(0xDEC0_DE7A_B1E5_0001);
        let mut next = || lcg() >> 33;
        let a = space.alphabet();
        let mut counts = vec![0u64; space.n_primary() * a];
        // Contexts of a few exponent classes and neighbors; symbols narrow and skewed in
        // some rows, spread over most of the alphabet in others (rows of many bytes, priced
        // well above their floor).
        for _ in 0..40_000 {
            let ctx = (next() % 40) as usize * 512 + 200 + (next() % 8) as usize;
            let sym = if ctx.is_multiple_of(3) {
                (next() % 16 + next() % 16) as usize
            } else {
                (next() % 200) as usize
            };
            counts[ctx * a + sym] += 1 + next() % 50;
        }
        let h = Hist::from_dense(space, &counts);
        let ids = |s: &Selection| s.explicit.iter().map(|&(c, _)| c).collect::<Vec<_>>();
        // The rows the definition keeps: own cost (data, bytes, an id byte) plus the price
        // below the cost under the group's row.
        let nb = space.n_backoff();
        let mut group = vec![0u64; nb * a];
        for (ctx, row) in h.rows() {
            row.add_to(&mut group[ctx % nb * a..][..a]);
        }
        let mut scratch = RowScratch::default();
        // Per context: what its own row saves beyond its data, bytes and id byte.
        let margins: Vec<(u32, i128)> = h
            .rows()
            .map(|(ctx, c)| {
                let g = best_row(RowCounts::full(&group[ctx % nb * a..][..a]), &mut scratch);
                let pooled = cost(c.counts, &g[c.lo..]) as i128;
                let own = (row_price(c, &mut scratch).0 + 8 * COST_ONE_BIT) as i128;
                (ctx as u32, pooled - own)
            })
            .collect();
        let definition = |price: u64| -> Vec<u32> {
            let kept = margins.iter().filter(|&&(_, m)| m > price as i128);
            kept.map(|&(ctx, _)| ctx).collect()
        };
        let free = Selection::of_priced(&h, true, 0);
        assert_eq!(ids(&free), definition(0));
        // Prices at rows' exact margins (the row just no longer pays) and round ones.
        let mut paying: Vec<u64> = margins
            .iter()
            .filter(|m| m.1 > 0)
            .map(|m| m.1 as u64)
            .collect();
        paying.sort_unstable();
        let at_margins = [0, paying.len() / 2, paying.len() - 1].map(|i| paying[i]);
        let mut kept = 0;
        for price in at_margins
            .into_iter()
            .chain([1, 8, 64, 512, 4096].map(|b| b * COST_ONE_BIT))
        {
            let charged = Selection::of_priced(&h, true, price);
            assert_eq!(ids(&charged), definition(price), "price {price}");
            assert!(ids(&charged).iter().all(|c| ids(&free).contains(c)));
            assert!(charged.data_cost >= free.data_cost);
            kept = charged.explicit.len();
        }
        assert!(free.explicit.len() > kept, "{} rows either way", kept);
        let all = Selection::of_priced(&h, true, u64::MAX / 4);
        assert!(all.explicit.is_empty());
    }

    /// The trimmed rows hold the counts they were given: rows of one context added up, a
    /// neighbor form folded to its plain contexts, and two histograms added, all as their
    /// dense definitions (wide and binary alphabets, rows seen at either end or not at all).
    #[test]
    fn stored_rows_are_the_dense_counts() {
        let mut lcg = crate::test_lcg(0x7A11_0FC0_DE5E_ED00);
        let mut next = || lcg() >> 33;
        for space in [
            Space::new(Stage::J, 16, true),
            Space::new(Stage::B, 32, true),
            Space::new(Stage::S, 16, true),
        ] {
            let (a, n) = (space.alphabet(), space.n_primary());
            let mut rows_of = |k: usize| {
                let ctxs: Vec<u32> = (0..k)
                    .map(|_| (next() as usize % 40 * 97 % n) as u32)
                    .collect();
                let rows: Vec<u32> = (0..k * a)
                    .map(|i| match next() % 6 {
                        _ if i % a == 0 && (i / a) % 3 == 0 => 3,
                        0 => (next() % 1000) as u32,
                        _ => 0,
                    })
                    .collect();
                (ctxs, rows)
            };
            let dense_of = |ctxs: &[u32], rows: &[u32]| {
                let mut d = vec![0u64; n * a];
                for (&c, r) in ctxs.iter().zip(rows.chunks_exact(a)) {
                    for (x, &y) in d[c as usize * a..][..a].iter_mut().zip(r) {
                        *x += y as u64;
                    }
                }
                d
            };
            let (c1, r1) = rows_of(60);
            let (c2, r2) = rows_of(30);
            let mut h = Hist::from_rows(space, &c1, &r1);
            assert_eq!(h.dense(), dense_of(&c1, &r1), "{space:?}");
            for (_, r) in h.rows() {
                let (first, last) = (r.counts[0], r.counts[r.counts.len() - 1]);
                assert!(a == 2 || (first > 0 && last > 0), "{space:?}: untrimmed");
            }
            let plain = h.without_neighbor();
            let mut want = vec![0u64; plain.space.n_primary() * a];
            for (ctx, row) in dense_of(&c1, &r1).chunks_exact(a).enumerate() {
                let p = match space.stage {
                    Stage::B => ctx % EXP_CLASSES,
                    Stage::S => ctx / 6 * 6 + ctx % 2,
                    _ => ctx % (2 * EXP_CLASSES),
                };
                for (x, &y) in want[p * a..][..a].iter_mut().zip(row) {
                    *x += y;
                }
            }
            assert_eq!(plain.dense(), want, "{space:?} without neighbor");
            h.add(&Hist::from_rows(space, &c2, &r2));
            let both: Vec<u64> = dense_of(&c1, &r1)
                .iter()
                .zip(dense_of(&c2, &r2))
                .map(|(x, y)| x + y)
                .collect();
            assert_eq!(h.dense(), both, "{space:?} added");
        }
    }

    #[test]
    fn from_sorted_is_from_rows_of_sorted_rows_and_refuses_any_other_order() {
        let space = Space::new(Stage::Q1, 16, false);
        let (ctxs, rows) = (vec![3u32, 7, 40], vec![1u64, 0, 0, 5, 9, 9]);
        let sorted = Hist::from_sorted(space, ctxs.clone(), rows.clone());
        let any = Hist::from_rows(space, &[40, 3, 7, 9], &[9u64, 9, 1, 0, 0, 5, 0, 0]);
        assert_eq!(sorted.occupied(), any.occupied());
        assert_eq!(sorted.dense(), any.dense());
        for (c, r) in [
            (vec![7u32, 3], vec![1u64, 0, 0, 5]),
            (vec![3, 3], vec![1, 0, 0, 5]),
            (vec![3, 7], vec![1, 0, 0, 0]),
            (vec![3, space.n_primary() as u32], vec![1, 0, 0, 5]),
        ] {
            let r = std::panic::catch_unwind(|| Hist::from_sorted(space, c, r));
            assert!(r.is_err());
        }
    }

    #[test]
    fn row_bytes_and_cost_match_their_slow_definitions() {
        let rows: Vec<Vec<u32>> = vec![
            vec![4096, 0],
            vec![1, 4095],
            vec![0, 4096, 0],
            vec![4000, 0, 0, 90, 6],
            (0..65).map(|i| if i % 3 == 0 { 0 } else { 64 }).collect(),
            // Coarse rows as best_row sends them (a shift > 0, a symbol range inside).
            vec![0, 1024, 0, 2048, 1024, 0],
            best_row(
                RowCounts::full(&[0, 0, 5, 900, 3, 0, 1, 0, 0]),
                &mut RowScratch::default(),
            ),
            best_row(
                RowCounts::full(&(0..66).map(|i| (i * 7 % 13) as u64).collect::<Vec<_>>()),
                &mut RowScratch::default(),
            ),
        ];
        // And rows as the encoder prices them: every precision, frequencies past one varint
        // byte, gaps inside the range, wide alphabets.
        let mut lcg = crate::test_lcg(0x1234_5678_9ABC_DEF1);
        let mut next = || lcg() >> 33;
        let mut random = Vec::new();
        for _ in 0..2000 {
            let len = 3 + next() as usize % 245;
            let counts: Vec<u64> = (0..len)
                .map(|_| match next() % 4 {
                    0 => 0,
                    1 => next() % 100_000,
                    _ => next() % 20,
                })
                .collect();
            let seen = counts.iter().filter(|&&c| c > 0).count() as u64;
            for bits in ROW_PRECISIONS.into_iter().filter(|&b| 1u64 << b >= seen) {
                let row = normalize_to(&counts, bits);
                random.push(row.iter().map(|f| f << (PROB_BITS - bits)).collect());
            }
        }
        // Frequencies beyond a row's total, for the general varint lengths.
        random.push(vec![0, 1 << 14, 3 << 21, 0, 1 << 28, u32::MAX, 5]);
        for freq in rows.into_iter().chain(random) {
            let mut w = ByteWriter::new();
            write_row(&mut w, &freq);
            assert_eq!(row_bytes(&freq), w.len(), "{freq:?}");
        }
    }

    /// [`row_price`] and [`row_at`] as first written: every precision normalized, priced
    /// and sized over the whole alphabet.
    fn priced_row_dense(counts: &[u64]) -> (Vec<u32>, u64) {
        let price = |f: &[u32]| cost(counts, f) + row_bytes(f) as u64 * 8 * COST_ONE_BIT;
        if counts.iter().all(|&c| c == 0) {
            let zero = vec![0; counts.len()];
            let p = price(&zero);
            return (zero, p);
        }
        let full = normalize_to(counts, PROB_BITS);
        let mut best_price = price(&full);
        if counts.len() == 2 {
            return (full, best_price);
        }
        let seen = counts.iter().filter(|&&c| c > 0).count() as u64;
        let mut best = full;
        for bits in ROW_PRECISIONS[1..]
            .iter()
            .copied()
            .filter(|&b| 1u64 << b >= seen)
        {
            let row: Vec<u32> = normalize_to(counts, bits)
                .into_iter()
                .map(|f| f << (PROB_BITS - bits))
                .collect();
            let p = price(&row);
            if p < best_price {
                best_price = p;
                best = row;
            }
        }
        (best, best_price)
    }

    #[test]
    fn row_price_is_its_dense_definition() {
        // Rows that take each precision, shortfalls and excesses, a single symbol at
        // either end, binary and empty rows, alphabets up to J's 247 with counts large and
        // small (an excess bigger than one level), and a symbol seen at every index.
        let mut rows: Vec<Vec<u64>> = vec![
            vec![0, 0],
            vec![0, 7],
            vec![5, 0, 0],
            vec![0, 0, 9],
            vec![0; 119],
            (0..247).map(|i| (i % 2) as u64).collect(),
            (0..247).map(|i| 1 + i as u64).collect(),
            (0..119)
                .map(|i| {
                    if i == 60 {
                        1 << 40
                    } else {
                        (i % 3 == 0) as u64
                    }
                })
                .collect(),
        ];
        let mut lcg = crate::test_lcg(0x5EED_F0B0_B5A1);
        let mut next = || lcg() >> 33;
        for _ in 0..4000 {
            let len = 2 + next() as usize % 246;
            let density = 1 + next() % 8;
            let scale = [3, 50, 5_000, 1 << 30][next() as usize % 4];
            rows.push(
                (0..len)
                    .map(|_| match next() % density {
                        0 => next() % scale,
                        _ => 0,
                    })
                    .collect(),
            );
        }
        let mut precisions = std::collections::BTreeSet::new();
        let mut scratch = RowScratch::default();
        for counts in &rows {
            let want = priced_row_dense(counts);
            let (price, bits) = row_price(RowCounts::full(counts), &mut scratch);
            let got = (row_at(RowCounts::full(counts), bits), price);
            assert_eq!(got, want, "{counts:?}");
            // The same row as a histogram stores it: from its first seen symbol to its last.
            let h = Hist::from_rows(Space::new(Stage::J, 32, false), &[0], &{
                let mut whole = counts.clone();
                whole.resize(247, 0);
                whole
            });
            if let (Some((_, stored)), true) = (h.rows().next(), counts.len() > 2) {
                let stored = RowCounts {
                    alphabet: counts.len(),
                    ..stored
                };
                assert!(stored.counts.len() < counts.len() || counts[0] > 0);
                let (price, bits) = row_price(stored, &mut scratch);
                assert_eq!((row_at(stored, bits), price), want, "{counts:?} stored");
                assert_eq!(
                    least_row_bytes(stored),
                    least_row_bytes(RowCounts::full(counts))
                );
            }
            let all = got.0.iter().fold(0u32, |a, &f| a | f);
            precisions.insert(all.trailing_zeros().min(PROB_BITS));
        }
        // Every precision won somewhere (a shift of 0 is the full one).
        assert!(
            [0, 2, 4, 6].iter().all(|s| precisions.contains(s)),
            "{precisions:?}"
        );
    }

    #[test]
    fn table_bytes_are_what_write_writes() {
        // Q1 rows (binary) and B rows of the neighbor space: explicit rows with id gaps
        // past one varint byte, backoff rows, and an empty table.
        let mut counts = vec![0u64; Space::new(Stage::B, 16, true).n_primary() * 17];
        for ctx in [0usize, 3, 200, 4000, 18000] {
            for s in 0..17 {
                counts[ctx * 17 + s] = ((ctx * 31 + s * 7) % 50) as u64;
            }
        }
        let b = Hist::from_dense(Space::new(Stage::B, 16, true), &counts);
        let q1 = Hist::from_dense(
            Space::new(Stage::Q1, 16, false),
            &(0..256 * 17 * 2)
                .map(|i| (i % 5) as u64)
                .collect::<Vec<_>>(),
        );
        let empty = Hist::new(Space::new(Stage::S, 16, true));
        for h in [&b, &q1, &empty] {
            for prune in [false, true] {
                let t = StageTable::select(h, prune);
                let mut w = ByteWriter::new();
                t.write(&mut w);
                assert_eq!(t.bytes(), w.len());
            }
        }
    }
}
