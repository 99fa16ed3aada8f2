//! The bit predictor of the context-mixing coder (docs/INTEGER_GPT2.md §13.2): adaptive
//! counters under hashed byte contexts, a byte match model, an optional outside input (the
//! language model), two integer logistic mixers and two APM (secondary estimation) stages.
//!
//! Everything is integer arithmetic on state that encoder and decoder update with the same
//! bits, so both compute the same probability for every bit on every machine.

use super::logistic::{squash, stretch, LIMIT};
use crate::memory::{HugeTable, HUGE_PAGE};

/// The predictor's big tables (counter slots, the second APM), in huge pages from 2 MiB:
/// every coded bit reads about ten slots at random in tables of megabytes (§13.2 fixes the
/// hashing, so the reads cannot be made local without changing the bytes).
fn slots<T: bytemuck::Pod>(len: usize, fill: T) -> HugeTable<T> {
    HugeTable::new(len, fill, HUGE_PAGE)
}

/// Hashed contexts: order 0, orders 1-4 and 6, the current word, the word pair.
const ORDERS: [usize; 5] = [1, 2, 3, 4, 6];
const N_CTX: usize = 1 + ORDERS.len() + 2;
/// Mixer inputs: one per context, two from the match model, one outside input, a bias.
const N_IN: usize = N_CTX + 2 + 1 + 1;
/// Adaptation limit of a context counter (the rate never falls below 1/(LIMIT + 1.5)).
const COUNT_LIMIT: u32 = 255;
/// Shortest match the match model follows, in bytes.
const MIN_MATCH: usize = 5;
/// Match lengths are counted up to this.
const MAX_MATCH: u32 = 65535;
/// Starting mixer weights: 0.3 for the adaptive models, which know nothing yet, and
/// LM_WEIGHT for the language model, which knows the language from the start.
const INIT: [i32; N_IN] = {
    let mut w = [19660; N_IN];
    w[N_CTX + 2] = LM_WEIGHT;
    w
};
const LM_WEIGHT: i32 = 19660;
/// Mixer learning rate (see `Mixer::update`).
const MIXER_RATE: i64 = 6;

/// `RECIP[n] = round(2^17 / (2n + 3))`: the step `1 / (n + 1.5)` of a counter seen n times.
fn recip(n: u32) -> i64 {
    ((1i64 << 17) + (2 * n as i64 + 3) / 2) / (2 * n as i64 + 3)
}

/// A probability (22 bits) and a count (10 bits) packed in a u32; new slots hold p = 1/2, n = 0.
#[derive(Clone, Copy)]
struct Counter;

const NEW_SLOT: u32 = 1 << 31;

impl Counter {
    fn p12(s: u32) -> i32 {
        (s >> 20) as i32
    }
    fn count(s: u32) -> u32 {
        s & 1023
    }
    fn update(s: &mut u32, y: u32, limit: u32, rates: &[i64]) {
        let n = Counter::count(*s);
        let p = (*s >> 10) as i64;
        let target = if y == 1 { (1i64 << 22) - 1 } else { 0 };
        let p = p + (((target - p) * rates[n as usize]) >> 16);
        *s = ((p as u32) << 10) | (n + 1).min(limit);
    }
}

/// Logistic mixer: `n` inputs, `sets` weight vectors (one chosen per bit by a context).
struct Mixer {
    n: usize,
    w: Vec<i32>,
    set: usize,
    dot: i32,
    pr: i32,
}

impl Mixer {
    /// `init`: the starting weight of each input (1.0 is 2^16), copied to every set.
    fn new(init: &[i32], sets: usize) -> Self {
        let n = init.len();
        Mixer {
            n,
            w: init.iter().copied().cycle().take(n * sets).collect(),
            set: 0,
            dot: 0,
            pr: 2048,
        }
    }
    /// Log-odds of a 1 for inputs `x` under weight set `set`.
    fn mix(&mut self, x: &[i32], set: usize) -> i32 {
        self.set = set * self.n;
        let w = &self.w[self.set..self.set + self.n];
        let s: i64 = x.iter().zip(w).map(|(&a, &b)| a as i64 * b as i64).sum();
        self.dot = (s >> 16).clamp(-LIMIT as i64, LIMIT as i64) as i32;
        self.pr = squash(self.dot);
        self.dot
    }
    /// Gradient step on the coding cost: `w += x * err * rate / 2^16`, err in 1/4096.
    fn update(&mut self, x: &[i32], y: u32) {
        let err = ((y as i64) << 12) - self.pr as i64;
        let w = &mut self.w[self.set..self.set + self.n];
        for (wi, &xi) in w.iter_mut().zip(x) {
            let d = (xi as i64 * err * MIXER_RATE) >> 16;
            *wi = (*wi as i64 + d).clamp(-(1 << 22), 1 << 22) as i32;
        }
    }
}

/// Adaptive probability map: refines a probability under a context by interpolating between
/// 33 knots over the stretch domain; the nearer knot learns.
struct Apm {
    t: HugeTable<u16>,
    idx: usize,
}

impl Apm {
    fn new(contexts: usize) -> Self {
        let row: Vec<u16> = (0..33)
            .map(|k| (squash((k - 16) * 128) * 16) as u16)
            .collect();
        let mut t = slots(33 * contexts, 0);
        for r in t.chunks_exact_mut(33) {
            r.copy_from_slice(&row);
        }
        Apm { t, idx: 0 }
    }
    fn refine(&mut self, pr: i32, cx: usize) -> i32 {
        let s = stretch(pr) + 2048; // 1..4095
        let lo = (s >> 7) as usize;
        let w = s & 127;
        let base = cx * 33 + lo;
        self.idx = base + (w >> 6) as usize;
        let p = (self.t[base] as i32 * (128 - w) + self.t[base + 1] as i32 * w) >> 11;
        p.clamp(1, 4095)
    }
    /// The 33 knots of context `cx`.
    fn row(&self, cx: usize) -> &[u16] {
        &self.t[cx * 33..cx * 33 + 33]
    }
    fn update(&mut self, y: u32) {
        let g = ((y as i32) << 16) + ((y as i32) << 6) - y as i32 - y as i32;
        let t = &mut self.t[self.idx];
        *t = (*t as i32 + ((g - *t as i32) >> 6)) as u16;
    }
}

/// A hint that `*p` will be read soon (x86-64 only; elsewhere nothing).
#[inline(always)]
fn prefetch<T>(p: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and cannot fault; SSE is part of
    // x86-64's baseline.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((p as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

fn hash(a: u32, b: u32) -> u32 {
    let h = a.wrapping_mul(0x9E37_79B1) ^ b.wrapping_mul(0x85EB_CA6B).rotate_left(13);
    h ^ (h >> 15)
}

/// The coded text: one history per strand, each the bytes coded so far of a contiguous part of
/// the input that starts at `starts[j]` (docs/INTEGER_GPT2.md §13.5). A position is global (in
/// the input); the byte there is readable once its strand has coded it.
struct Text {
    starts: Vec<usize>,
    hists: Vec<Vec<u8>>,
}

impl Text {
    /// The strand that holds position `p` (the last one starting at or before it: an empty
    /// strand owns nothing).
    fn strand_of(&self, p: usize) -> usize {
        if self.starts.len() == 1 {
            return 0;
        }
        self.starts.partition_point(|&s| s <= p) - 1
    }
    /// The byte at position `p`, if its strand has coded it.
    fn at(&self, p: usize) -> Option<u8> {
        let j = self.strand_of(p);
        self.hists[j].get(p - self.starts[j]).copied()
    }
}

/// Byte match model: follows the most recent earlier occurrence of the last MIN_MATCH bytes and
/// predicts the bits of the byte that came next there. Its table holds global positions, so
/// with strands it also follows text that another strand has coded.
struct MatchModel {
    table: Vec<u32>,
    shift: u32,
    /// Expected bit this step, when a match is live.
    expect: Option<u32>,
    sm: Vec<u32>,
}

/// A strand's match: the global position of the predicted byte and the length matched.
#[derive(Clone, Copy, Default)]
struct Follow {
    ptr: usize,
    len: u32,
}

impl Follow {
    fn bucket(&self) -> usize {
        let l = self.len as usize;
        if l < 16 {
            l
        } else {
            (16 + (l - 16) / 16).min(63)
        }
    }
}

impl MatchModel {
    fn new(bits: u32) -> Self {
        MatchModel {
            table: vec![0; 1 << bits],
            shift: 32 - bits,
            expect: None,
            sm: vec![NEW_SLOT; 64 * 2],
        }
    }
    /// After a whole byte of strand `s` (whose next byte is at global position `pos`): extend
    /// the match or look for a new one, remember this context.
    fn byte(&mut self, text: &Text, s: usize, pos: usize, f: &mut Follow) {
        let hist = &text.hists[s];
        let n = hist.len();
        if f.len > 0 {
            f.len = (f.len + 1).min(MAX_MATCH);
            f.ptr += 1;
        }
        if n < MIN_MATCH {
            return;
        }
        let h = hist[n - MIN_MATCH..]
            .iter()
            .fold(0u32, |h, &b| hash(h, b as u32 + 1));
        let slot = (h >> self.shift) as usize;
        if f.len == 0 {
            let cand = self.table[slot] as usize;
            if cand > 0 {
                // The candidate's context lies in one strand's coded bytes: compare back to
                // that strand's start at most, and to this strand's start.
                // (A position past 2^32 wraps in the table: such a candidate may point at
                // bytes not coded yet, and then it is no candidate.)
                let j = text.strand_of(cand - 1);
                let there = text.hists[j]
                    .get(..cand - text.starts[j])
                    .unwrap_or_default();
                let mut l = 0;
                while l < 32
                    && l < there.len()
                    && l < n
                    && there[there.len() - 1 - l] == hist[n - 1 - l]
                {
                    l += 1;
                }
                if l >= MIN_MATCH {
                    f.ptr = cand;
                    f.len = l as u32;
                }
            }
        }
        self.table[slot] = pos as u32;
    }
    /// Inputs for the next bit (`c0`: the byte so far with a leading 1, `bit`: its bit index).
    /// A match whose next byte is not coded yet (another strand's frontier) dies.
    fn inputs(&mut self, text: &Text, f: &mut Follow, c0: u32, bit: u32, out: &mut [i32]) {
        self.expect = None;
        if f.len > 0 {
            match text.at(f.ptr) {
                Some(b) if (b as u32 | 256) >> (8 - bit) == c0 => {
                    self.expect = Some(((b as u32 | 256) >> (7 - bit)) & 1);
                }
                _ => f.len = 0,
            }
        }
        match self.expect {
            Some(e) => {
                let s = self.sm[f.bucket() * 2 + e as usize];
                let st = stretch(Counter::p12(s));
                out[0] = st;
                let conf = (f.len.min(32) as i32) * 32;
                out[1] = if e == 1 { conf } else { -conf };
            }
            None => {
                out[0] = 0;
                out[1] = 0;
            }
        }
    }
    fn update(&mut self, f: &mut Follow, y: u32, rates: &[i64]) {
        if let Some(e) = self.expect {
            let i = f.bucket() * 2 + e as usize;
            Counter::update(&mut self.sm[i], y, 1023, rates);
            if y != e {
                f.len = 0;
            }
        }
    }
    /// 0: no match, 1: short, 2: long.
    fn state(&self, f: &Follow) -> usize {
        match (self.expect, f.len) {
            (None, _) => 0,
            (Some(_), l) if l < 16 => 1,
            _ => 2,
        }
    }
}

/// Which models take part (the ablations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parts {
    pub match_model: bool,
}

/// Where one strand stands between its turns: its index, its byte contexts, its word hashes
/// and its match. The statistics (tables, mixers, APMs, match table) are shared by all.
#[derive(Clone)]
struct Cursor {
    strand: usize,
    base: [u32; N_CTX],
    word: u32,
    prev_word: u32,
    follow: Follow,
}

/// The predictor: call [`Predictor::p`] for the next bit, then [`Predictor::update`] with it.
/// With strands, [`Predictor::select`] picks the strand whose next byte is coded.
pub struct Predictor {
    parts: Parts,
    shift: u32,
    /// Log2 of the slots per context; context k's table is `tables[k << bits..][..1 << bits]`.
    bits: u32,
    tables: HugeTable<u32>,
    slot: [usize; N_CTX],
    rates: Vec<i64>,
    text: Text,
    /// The strand being coded, and the others where they stopped (`parked[cur.strand]` is a
    /// stale copy).
    cur: Cursor,
    parked: Vec<Cursor>,
    c0: u32,
    bit: u32,
    mm: MatchModel,
    x: [i32; N_IN],
    m1: Mixer,
    m2: Mixer,
    a1: Apm,
    a2: Apm,
    pr_mix: i32,
}

/// Log2 of the slots per context table for an input of `len` bytes: about two slots per coded
/// bit, between 2^16 and 2^22.
pub fn table_bits(len: u64) -> u32 {
    let need = len.saturating_mul(16).max(1);
    (64 - (need - 1).leading_zeros()).clamp(16, 22)
}

/// Bytes reserved up front per strand history (it grows as needed): a forged length must not
/// reserve memory before any byte decodes.
const HIST_RESERVE: u64 = 1 << 24;

impl Predictor {
    /// The predictor for coding `len` bytes in order (one strand).
    pub fn new(len: u64, parts: Parts) -> Self {
        Self::with_strands(len, parts, &[0])
    }

    /// The predictor for coding `len` bytes as strands starting at `starts` (non-decreasing,
    /// the first 0); strand 0 is selected.
    pub fn with_strands(len: u64, parts: Parts, starts: &[usize]) -> Self {
        let bits = table_bits(len);
        let reserve = (len / starts.len() as u64).min(HIST_RESERVE) as usize;
        let cursor = |strand| Cursor {
            strand,
            base: [0; N_CTX],
            word: 0,
            prev_word: 0,
            follow: Follow::default(),
        };
        let mut p = Predictor {
            parts,
            shift: 32 - bits,
            bits,
            tables: slots(N_CTX << bits, NEW_SLOT),
            slot: [0; N_CTX],
            rates: (0..1024).map(recip).collect(),
            text: Text {
                starts: starts.to_vec(),
                hists: starts.iter().map(|_| Vec::with_capacity(reserve)).collect(),
            },
            cur: cursor(0),
            parked: (0..starts.len()).map(cursor).collect(),
            c0: 1,
            bit: 0,
            mm: MatchModel::new(bits - 2),
            x: [0; N_IN],
            m1: Mixer::new(&INIT, 256),
            m2: Mixer::new(&INIT, (N_CTX + 1) * 3 * 3),
            a1: Apm::new(256),
            a2: Apm::new(1 << 16),
            pr_mix: 2048,
        };
        p.byte_contexts();
        for c in &mut p.parked {
            c.base = p.cur.base;
        }
        p
    }

    /// Continue with strand `s` (at a byte boundary).
    pub fn select(&mut self, s: usize) {
        debug_assert_eq!(self.bit, 0, "strands switch between bytes");
        if s != self.cur.strand {
            let from = self.cur.strand;
            std::mem::swap(&mut self.cur, &mut self.parked[from]);
            std::mem::swap(&mut self.cur, &mut self.parked[s]);
        }
    }

    /// The bytes the selected strand has coded.
    pub fn history(&self) -> &[u8] {
        &self.text.hists[self.cur.strand]
    }

    /// Bytes coded by strand `s`.
    pub fn done(&self, s: usize) -> usize {
        self.text.hists[s].len()
    }

    /// Every strand's bytes, in order: the input.
    pub fn into_text(self) -> Vec<u8> {
        self.text.hists.concat()
    }

    fn byte_contexts(&mut self) {
        let h = &self.text.hists[self.cur.strand];
        let n = h.len();
        let base = &mut self.cur.base;
        base[0] = 0;
        for (i, &k) in ORDERS.iter().enumerate() {
            let mut v = k as u32;
            for j in 0..k.min(n) {
                v = hash(v, h[n - 1 - j] as u32 + 1);
            }
            base[1 + i] = hash(v, 0x100 + i as u32);
        }
        base[N_CTX - 2] = hash(self.cur.word, 0x200);
        base[N_CTX - 1] = hash(hash(self.cur.word, self.cur.prev_word), 0x300);
    }

    /// The counter slot of context `k` for the bit after `c0` (an index into `tables`).
    fn slot_of(&self, k: usize, c0: u32) -> usize {
        (k << self.bits) | ((hash(self.cur.base[k], c0) ^ c0) >> self.shift) as usize
    }

    /// Ask the cache for what [`Predictor::p`] will read at random for the bit after `c0`:
    /// its counter slots and its row of the second APM (the tables are megabytes; each read
    /// would otherwise wait on memory in turn). Only a hint: no result depends on it.
    fn prefetch(&self, c0: u32) {
        for k in 0..N_CTX {
            prefetch(&self.tables[self.slot_of(k, c0)]);
        }
        let last = self.history().last().copied().unwrap_or(0) as usize;
        let row = self.a2.row(c0 as usize | last << 8);
        prefetch(&row[0]);
        prefetch(&row[32]);
    }

    /// The second APM's context: the byte so far and the last byte.
    fn a2_context(&self) -> usize {
        let last = self.history().last().copied().unwrap_or(0) as usize;
        (self.c0 as usize) | (last << 8)
    }

    /// Probability (1/4096) that the next bit is 1. `outside`: an extra input in the stretch
    /// domain and whether it has an opinion (the language model; `None` when absent).
    pub fn p(&mut self, outside: Option<i32>) -> i32 {
        let c0 = self.c0;
        // All counters are read before any is looked at, so that their cache misses overlap.
        let mut v = [0u32; N_CTX];
        for (k, v) in v.iter_mut().enumerate() {
            let s = self.slot_of(k, c0);
            self.slot[k] = s;
            *v = self.tables[s];
        }
        let mut top = 0; // highest context seen before (0: none), for the mixer's weight set
        for (k, &v) in v.iter().enumerate() {
            self.x[k] = if Counter::count(v) == 0 {
                0
            } else {
                if k <= ORDERS.len() {
                    top = k + 1;
                }
                stretch(Counter::p12(v))
            };
        }
        // Both possible next bits of this byte: a bit's time ahead of their reads.
        if self.bit < 7 {
            self.prefetch(c0 << 1);
            self.prefetch(c0 << 1 | 1);
        }
        if self.parts.match_model {
            self.mm.inputs(
                &self.text,
                &mut self.cur.follow,
                c0,
                self.bit,
                &mut self.x[N_CTX..N_CTX + 2],
            );
        }
        let lm = match outside {
            Some(st) => {
                self.x[N_CTX + 2] = st;
                1 + (st.abs() >= 512) as usize
            }
            None => {
                self.x[N_CTX + 2] = 0;
                0
            }
        };
        self.x[N_IN - 1] = 256;
        let d1 = self.m1.mix(&self.x, c0 as usize);
        let set2 = (top * 3 + self.mm.state(&self.cur.follow)) * 3 + lm;
        let d2 = self.m2.mix(&self.x, set2);
        self.pr_mix = squash((d1 + d2) >> 1);
        let p1 = self.a1.refine(self.pr_mix, c0 as usize);
        let p2 = self.a2.refine(self.pr_mix, self.a2_context());
        ((self.pr_mix + p1 + 2 * p2 + 2) >> 2).clamp(1, 4095)
    }

    /// Learn bit `y` (0 or 1) and move to the next bit.
    pub fn update(&mut self, y: u32) {
        for k in 0..N_CTX {
            let limit = COUNT_LIMIT;
            Counter::update(&mut self.tables[self.slot[k]], y, limit, &self.rates);
        }
        if self.parts.match_model {
            self.mm.update(&mut self.cur.follow, y, &self.rates);
        }
        self.m1.update(&self.x, y);
        self.m2.update(&self.x, y);
        self.a1.update(y);
        self.a2.update(y);
        self.c0 = (self.c0 << 1) | y;
        self.bit += 1;
        if self.bit == 8 {
            let b = (self.c0 & 255) as u8;
            let s = self.cur.strand;
            self.text.hists[s].push(b);
            self.c0 = 1;
            self.bit = 0;
            let cur = &mut self.cur;
            if b.is_ascii_alphabetic() || b >= 128 {
                cur.word = hash(cur.word, b.to_ascii_lowercase() as u32);
            } else if cur.word != 0 {
                cur.prev_word = cur.word;
                cur.word = 0;
            }
            if self.parts.match_model {
                let pos = self.text.starts[s] + self.text.hists[s].len();
                self.mm.byte(&self.text, s, pos, &mut cur.follow);
            }
            self.byte_contexts();
            self.prefetch(1);
        }
    }

    /// The byte so far with a leading 1 (1 at a byte boundary) and the index of the next bit.
    pub fn partial(&self) -> (u32, u32) {
        (self.c0, self.bit)
    }
}
