//! The language model as one more input of the bit predictor (docs/INTEGER_GPT2.md §13.3).
//!
//! The LM predicts tokens; the coder codes bits. The vocabulary is sorted once by byte string,
//! so the tokens that begin with a given byte prefix form one contiguous range, and with
//! prefix sums of the LM's integer frequencies (in that order) the probability of the next bit
//! is a ratio of two range masses.
//!
//! The LM can only condition on text whose tokens the decoder knows. The text is cut into
//! chunks where whitespace follows a word or a word follows a line break (spaces belong to
//! the word after them, as in GPT-2's pre-tokenizer), or after 32 bytes. A chunk
//! is final once the first byte of the next one is seen; its tokens (GPT-2 BPE of the chunk
//! alone) then go through the model, which predicts the first token of the next chunk. Past
//! that token's bytes the LM has no opinion until the next chunk begins.
//!
//! This is the one place the coder reaches the model. The encoder knows every chunk in
//! advance: [`Plan`] replays the LM's context (restarts included) over the whole input and
//! asks for many words' tables per call, so the model runs batched, and of each table only
//! the sums its bytes will read ([`Reads`], [`LmSession::step_prefix_sums_at`]). The decoder learns each chunk only as it decodes it: its [`Lm`] hands the call it
//! needs ([`Lm::take_call`]) to the block decoder of `coder.rs`, which runs the calls of many
//! independent blocks as one batch and hands each its table back ([`Lm::supply`]). Both give
//! the integers of one call per word on one sequence (docs/INTEGER_GPT2.md §13.3).

use std::collections::VecDeque;
use std::sync::LazyLock;

use super::super::tokenizer::{self, EOT, VOCAB};
use super::logistic::stretch;
use crate::backend::lm::{Find, Item, LmKernels, LmSession, Query};
use crate::format::lm::model_file::Model;
use crate::{Error, Result};

/// Longest chunk, in bytes.
const MAX_CHUNK: usize = 32;

/// A token's bytes and its id.
type Entry = (&'static [u8], u32);

/// Token ids (EOT excluded) sorted by their bytes, and those bytes.
static SORTED: LazyLock<Result<Vec<Entry>>> = LazyLock::new(|| {
    let mut v = Vec::with_capacity(VOCAB as usize);
    for id in 0..VOCAB {
        if id == EOT {
            continue;
        }
        let b = tokenizer::token_bytes(id)
            .ok_or_else(|| Error::Invalid(format!("tokenizer: no bytes for token {id}")))?;
        v.push((b, id));
    }
    v.sort();
    Ok(v)
});

/// The token ids of [`SORTED`] alone: the prefix sums' gather reads 4 bytes per token, not 24.
static SORTED_IDS: LazyLock<Vec<u32>> = LazyLock::new(|| match SORTED.as_ref() {
    Ok(v) => v.iter().map(|e| e.1).collect(),
    Err(_) => Vec::new(),
});

/// The first 8 bytes of each token of [`SORTED`] (zero-padded), the first big-endian: the
/// range searches read byte `d < 8` from one dense array instead of through each token's slice.
static PREFIX8: LazyLock<Vec<u64>> = LazyLock::new(|| match SORTED.as_ref() {
    Ok(v) => v
        .iter()
        .map(|e| {
            let mut k = [0u8; 8];
            let n = e.0.len().min(8);
            k[..n].copy_from_slice(&e.0[..n]);
            u64::from_be_bytes(k)
        })
        .collect(),
    Err(_) => Vec::new(),
});

fn sorted() -> Result<&'static [Entry]> {
    SORTED
        .as_ref()
        .map(|v| v.as_slice())
        .map_err(|e| Error::Invalid(e.to_string()))
}

/// 0: a space, 1: other whitespace, 2: anything else.
fn class(b: u8) -> u8 {
    match b {
        b' ' => 0,
        b'\n' | b'\r' | b'\t' | 0x0b | 0x0c => 1,
        _ => 2,
    }
}

/// Whether byte `b` after byte `a` begins a new chunk: whitespace after a word, or a word
/// after a line break (GPT-2 puts a space in front of the word it precedes, so a word and the
/// spaces before it are one chunk). Finer chunks (at every character-class change) were
/// measured: half the speed (one LM call per chunk) for about the same size.
fn starts_chunk(a: u8, b: u8) -> bool {
    let ws = |c: u8| class(c) <= 1;
    (ws(b) && !ws(a)) || (class(a) == 1 && !ws(b))
}

/// Whether byte `p` of `hist` closes the chunk that starts at `chunk`.
fn closes_chunk(hist: &[u8], p: usize, chunk: usize) -> bool {
    p > chunk && (starts_chunk(hist[p - 1], hist[p]) || p - chunk >= MAX_CHUNK)
}

/// One LM call of the coder: after clearing the sequence (a fresh context, or one cut to its
/// last half) or not, run `run` and take the table of the token after it.
#[derive(Debug, PartialEq, Eq)]
pub struct Call {
    pub restart: bool,
    pub run: Vec<u32>,
}

impl Call {
    /// The call as items of sequence `seq`, the last one asking for the table.
    pub fn items(&self, seq: usize) -> impl Iterator<Item = Item> + '_ {
        let last = self.run.len() - 1;
        self.run.iter().enumerate().map(move |(i, &token)| Item {
            seq,
            token,
            query: (i == last).then_some(Query {
                find: Find::Symbol(0),
                mix: None,
            }),
        })
    }
}

/// The LM's context as chunks are appended: the call each append makes. When the context
/// would overflow, it restarts from its last half (as the segment windows do).
struct Context {
    n_ctx: usize,
    tokens: Vec<u32>,
}

impl Context {
    fn append(&mut self, new: &[u32]) -> Call {
        let c = self.n_ctx;
        let fresh = self.tokens.is_empty();
        self.tokens.extend_from_slice(new);
        if self.tokens.len() > c {
            let keep = (c / 2).max(1);
            self.tokens.drain(..self.tokens.len() - keep);
            Call {
                restart: true,
                run: self.tokens.clone(),
            }
        } else {
            Call {
                restart: fresh,
                run: new.to_vec(),
            }
        }
    }
}

/// The coder reads the LM's table as prefix sums in sorted order, which cover the whole
/// table (but `<|endoftext|>`) only for the tokenizer's own vocabulary.
fn check_vocab(model: &Model) -> Result<()> {
    if model.config.vocab != VOCAB {
        return Err(Error::Invalid(format!(
            "LM table of {} tokens, the tokenizer has {VOCAB}",
            model.config.vocab
        )));
    }
    Ok(())
}

/// The calls an [`Lm`] makes while `data` is coded, in order: the first token's, then one
/// per byte of `data` that closes a chunk (its call is made once that byte is coded).
pub fn calls(model: &Model, data: &[u8]) -> Result<Vec<Call>> {
    check_vocab(model)?;
    let mut ctx = Context {
        n_ctx: model.config.n_ctx as usize,
        tokens: Vec::new(),
    };
    let mut calls = vec![ctx.append(&[EOT])];
    let mut chunk = 0;
    for p in 0..data.len() {
        if closes_chunk(data, p, chunk) {
            calls.push(ctx.append(&tokenizer::encode(&data[chunk..p])?));
            chunk = p;
        }
    }
    Ok(calls)
}

/// Tables asked for per batched call: enough items to share each weight load across many
/// of them, few enough that the tables in flight on the device stay small (64 x 200 KB).
const PLAN_BATCH: usize = 64;
/// Sequences the planned encoder cycles through: a restart starts on the next one, so a
/// batch can hold the end of one context and the start of the next.
const PLAN_SEQS: usize = 4;

/// The encoder's LM: every call the coder will make, known from the input, run in batches.
pub struct Plan<'m> {
    session: Box<dyn LmSession + 'm>,
    calls: Vec<Call>,
    /// Which sums of each call's table the coder will read (the calls in order).
    reads: Reads,
    next: usize,
    seq: usize,
    ready: VecDeque<Table>,
}

impl<'m> Plan<'m> {
    /// The calls for coding `data`: the first token, then each finished chunk.
    fn new(model: &'m Model, kernels: &dyn LmKernels, data: &[u8]) -> Result<Self> {
        Ok(Plan {
            calls: calls(model, data)?,
            reads: Reads::new(data)?,
            session: kernels.load(model, PLAN_SEQS, model.config.n_ctx as usize)?,
            next: 0,
            seq: 0,
            ready: VecDeque::new(),
        })
    }

    /// The next call's table (the prefix sums in sorted order that the coder reads).
    fn next_table(&mut self) -> Result<Table> {
        if self.ready.is_empty() {
            self.run_batch()?;
        }
        self.ready
            .pop_front()
            .ok_or_else(|| Error::Invalid("LM plan: more chunks than planned".into()))
    }

    /// Run the next calls, up to [`PLAN_BATCH`] of them, as one batch.
    fn run_batch(&mut self) -> Result<()> {
        let mut items = Vec::new();
        let mut in_batch = [false; PLAN_SEQS];
        let mut wanted = Vec::new();
        while wanted.len() < PLAN_BATCH {
            let Some(call) = self.calls.get(self.next) else {
                break;
            };
            if call.restart {
                let s = (self.seq + 1) % PLAN_SEQS;
                if in_batch[s] {
                    // Its cache still serves this batch's items.
                    break;
                }
                self.session.clear(s)?;
                self.seq = s;
            }
            in_batch[self.seq] = true;
            items.extend(call.items(self.seq));
            wanted.push(self.reads.next_call()?);
            self.next += 1;
        }
        let sums = self
            .session
            .step_prefix_sums_at(&items, &SORTED_IDS, &wanted)?;
        if sums.len() != wanted.len() {
            return Err(Error::Invalid("LM: fewer tables than calls".into()));
        }
        self.ready.extend(
            wanted
                .into_iter()
                .zip(sums)
                .map(|(at, sums)| Table::At { at, sums }),
        );
        Ok(())
    }

    /// Tokens the plan runs in all.
    fn tokens(&self) -> u64 {
        self.calls.iter().map(|c| c.run.len() as u64).sum()
    }
}

/// Where the LM's tables come from.
enum Source<'m> {
    /// The decoder: each finished chunk is a call for the caller to run.
    Caller { ctx: Context, call: Option<Call> },
    /// The encoder: the tables of every chunk, computed ahead in batches.
    Planned(Plan<'m>),
    /// [`Reads`]' dry run: no table at all, only whether a call was made since last asked.
    Dry { called: bool },
}

/// A call's answer as the LM takes it: the whole table's prefix sums (the decoder), or the
/// sums at the indices its bytes will read, ascending ([`Reads`]; the encoder).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Table {
    Whole(Vec<u32>),
    At { at: Vec<u32>, sums: Vec<u32> },
}

impl Table {
    /// Whether this answer holds `whole`'s sums (at its indices, for [`Table::At`]).
    pub fn agrees_with(&self, whole: &[u32]) -> bool {
        match self {
            Table::Whole(c) => c == whole,
            Table::At { at, sums } => {
                at.len() == sums.len()
                    && at
                        .iter()
                        .zip(sums)
                        .all(|(&i, &v)| whole.get(i as usize) == Some(&v))
            }
        }
    }
}

/// The encoder's dry run of an [`Lm`] over bytes it knows: for each call the LM makes, in
/// order, the indices of the prefix sums that coding those bytes reads from its table (every
/// bit's range bounds `a`, `m`, `e`). The positions depend only on the bytes, so the encoder
/// can ask the device for those few hundred sums instead of the 50,258
/// ([`LmSession::step_prefix_sums_at`]). The same [`Lm`] code narrows the ranges here as
/// when coding ([`Lm::split`], [`Lm::byte`]), so the two cannot drift apart.
pub struct Reads {
    /// (Boxed: an `Lm` can hold a `Plan`, which holds `Reads`.)
    lm: Box<Lm<'static>>,
    data: Vec<u8>,
    /// The next byte to run.
    next: usize,
}

impl Reads {
    /// The dry run over `data` (a whole strand or block, from its first byte).
    pub fn new(data: &[u8]) -> Result<Self> {
        let mut lm = Lm::start(Source::Dry { called: false })?;
        // The first call (`<|endoftext|>`) is the one `next_call` answers first.
        lm.dry_called();
        Ok(Reads {
            lm: Box::new(lm),
            data: data.to_vec(),
            next: 0,
        })
    }

    /// The indices (ascending, each at most [`Lm::order`]'s length) read from the next
    /// call's table: the bits of every byte from where the previous call's ended up to the
    /// byte that makes the call after this one (the bits of a byte that closes a chunk are
    /// predicted before it closes). Empty for a call past the data's end.
    pub fn next_call(&mut self) -> Result<Vec<u32>> {
        let mut at = Vec::new();
        while let Some(&b) = self.data.get(self.next) {
            for bit in 0..8 {
                let c0 = (b as u32 | 256) >> (8 - bit);
                if let Some(h) = self.lm.split(c0, bit) {
                    at.extend([h.a as u32, h.m as u32, h.e as u32]);
                }
            }
            self.next += 1;
            self.lm.byte(&self.data[..self.next])?;
            if self.lm.dry_called() {
                break;
            }
        }
        at.sort_unstable();
        at.dedup();
        Ok(at)
    }
}

/// The LM's running state: its table source and the token prefix the coded bytes agree with.
pub struct Lm<'m> {
    sorted: &'static [Entry],
    source: Source<'m>,
    /// Prefix sums of the frequencies in sorted order (`len + 1` entries).
    cum: Vec<u32>,
    /// Start (in the history) of the chunk whose first token the LM predicts.
    chunk: usize,
    /// Tokens in `[lo, hi)` (sorted order) begin with the chunk's bytes so far, `depth` of them.
    lo: usize,
    hi: usize,
    depth: usize,
    /// The split of the range at the last bit predicted in this byte, if any.
    halves: Option<Halves>,
    /// Tokens run through the model (for throughput reports).
    pub tokens: u64,
    /// Every `cum` index [`Lm::p_bit`] read, for the test that [`Reads`] covers them.
    #[cfg(test)]
    read_log: Vec<usize>,
}

impl<'m> Lm<'m> {
    /// The decoder's LM: each finished chunk leaves a call ([`Lm::take_call`]) that must be
    /// run and answered ([`Lm::supply`]) before the next bit's prediction.
    pub fn for_decoder(model: &Model) -> Result<Self> {
        check_vocab(model)?;
        Self::start(Source::Caller {
            ctx: Context {
                n_ctx: model.config.n_ctx as usize,
                tokens: Vec::new(),
            },
            call: None,
        })
    }

    /// The encoder's LM for coding `data`: the same tables, computed in batches.
    pub fn planned(model: &'m Model, kernels: &dyn LmKernels, data: &[u8]) -> Result<Self> {
        let plan = Plan::new(model, kernels, data)?;
        let tokens = plan.tokens();
        let mut lm = Self::start(Source::Planned(plan))?;
        lm.tokens = tokens;
        Ok(lm)
    }

    fn start(source: Source<'m>) -> Result<Self> {
        let sorted = sorted()?;
        let mut lm = Lm {
            sorted,
            source,
            cum: Vec::new(),
            chunk: 0,
            lo: 0,
            hi: sorted.len(),
            depth: 0,
            halves: None,
            tokens: 0,
            #[cfg(test)]
            read_log: Vec::new(),
        };
        lm.advance(&[EOT])?;
        Ok(lm)
    }

    /// Append `new` tokens to the context; the table for the next token comes from the plan
    /// (which ignores `new`: it has them) or from the caller.
    fn advance(&mut self, new: &[u32]) -> Result<()> {
        match &mut self.source {
            Source::Caller { ctx, call } => {
                let c = ctx.append(new);
                self.tokens += c.run.len() as u64;
                // The old table stays until the answer comes (no bit is predicted before:
                // `waits`), so that `supply_at` can write into its buffer.
                *call = Some(c);
            }
            Source::Planned(plan) => {
                let t = plan.next_table()?;
                self.supply_table(t)?;
            }
            Source::Dry { called } => *called = true,
        }
        Ok(())
    }

    /// For [`Reads`]: whether a call was made since the last time asked.
    fn dry_called(&mut self) -> bool {
        match &mut self.source {
            Source::Dry { called } => std::mem::take(called),
            _ => false,
        }
    }

    /// The call the decoder's LM waits on, if it waits.
    pub fn take_call(&mut self) -> Option<Call> {
        match &mut self.source {
            Source::Caller { call, .. } => call.take(),
            Source::Planned(_) | Source::Dry { .. } => None,
        }
    }

    /// Whether a call waits to be taken and answered (no bit can be predicted before).
    pub fn waits(&self) -> bool {
        matches!(self.source, Source::Caller { call: Some(_), .. })
    }

    /// The answer to the last call taken: its frequency table's prefix sums in the order
    /// [`Lm::order`] (`LmSession::step_prefix_sums`).
    pub fn supply(&mut self, cum: Vec<u32>) -> Result<()> {
        if cum.len() != self.sorted.len() + 1 {
            return Err(Error::Invalid(format!(
                "LM: {} prefix sums for {} tokens",
                cum.len(),
                self.sorted.len()
            )));
        }
        self.cum = cum;
        Ok(())
    }

    /// The answer to the last call taken as its sums at the indices `at` only (strictly
    /// ascending, as [`Reads`] gives them for this call): they go into a full-length buffer
    /// kept across calls, whose other entries (an older table's, or 0) the coder never reads
    /// for this call's bytes.
    pub fn supply_at(&mut self, at: &[u32], sums: &[u32]) -> Result<()> {
        let n = self.sorted.len() + 1;
        if at.len() != sums.len() || at.last().is_some_and(|&i| i as usize >= n) {
            return Err(Error::Invalid(format!(
                "LM: {} prefix sums for {} indices up to {:?}",
                sums.len(),
                at.len(),
                at.last()
            )));
        }
        if self.cum.len() != n {
            self.cum = vec![0; n];
        }
        for (&i, &v) in at.iter().zip(sums) {
            self.cum[i as usize] = v;
        }
        Ok(())
    }

    /// [`Lm::supply`] or [`Lm::supply_at`], as the table came.
    pub fn supply_table(&mut self, t: Table) -> Result<()> {
        match t {
            Table::Whole(cum) => self.supply(cum),
            Table::At { at, sums } => self.supply_at(&at, &sums),
        }
    }

    /// The order of the tokens in the prefix sums the LM reads: ids sorted by their bytes,
    /// `<|endoftext|>` left out.
    pub fn order() -> &'static [u32] {
        &SORTED_IDS
    }

    /// After a byte was appended to `hist`: close the chunk if this byte starts a new one,
    /// then narrow the token range by the byte.
    pub fn byte(&mut self, hist: &[u8]) -> Result<()> {
        let p = hist.len() - 1;
        let b = hist[p];
        // The last bit's halves already bound the tokens whose next byte is `b`.
        let known = self.halves.take().filter(|h| h.c0 == (b as u32 | 256) >> 1);
        if closes_chunk(hist, p, self.chunk) {
            let toks = match self.source {
                Source::Caller { .. } => tokenizer::encode(&hist[self.chunk..p])?,
                Source::Planned(_) | Source::Dry { .. } => Vec::new(),
            };
            self.advance(&toks)?;
            self.chunk = p;
            self.lo = 0;
            self.hi = self.sorted.len();
            self.depth = 0;
        } else if let Some(h) = known {
            (self.lo, self.hi) = if b & 1 == 1 { (h.m, h.e) } else { (h.a, h.m) };
            self.depth += 1;
            return Ok(());
        }
        // Tokens of exactly `depth` bytes sort first in the range and cannot continue.
        let (lo, hi) = self.continuing();
        self.lo = self.first(lo, hi, b as u32);
        self.hi = self.first(self.lo, hi, b as u32 + 1);
        self.depth += 1;
        Ok(())
    }

    fn continuing(&self) -> (usize, usize) {
        let mut lo = self.lo;
        while lo < self.hi && self.sorted[lo].0.len() <= self.depth {
            lo += 1;
        }
        (lo, self.hi)
    }

    /// The first position in `[lo, hi)` (a range of [`Lm::continuing`]) whose token's byte at
    /// `depth` is `v` or more (`hi` if none is): those bytes are non-decreasing there.
    fn first(&self, lo: usize, hi: usize, v: u32) -> usize {
        let d = self.depth;
        lo + if d < 8 {
            let shift = 56 - 8 * d;
            PREFIX8[lo..hi].partition_point(|&k| ((k >> shift) & 255) < v as u64)
        } else {
            self.sorted[lo..hi].partition_point(|t| (t.0[d] as u32) < v)
        }
    }

    /// The tokens of the range whose next byte has the top `bit` bits of `c0` (with its
    /// leading 1), as [`Halves`]: from the previous bit's halves when `c0` extends them, else
    /// searched in the whole range.
    fn halves(&self, lo: usize, hi: usize, c0: u32, bit: u32) -> Halves {
        let width = 1u32 << (8 - bit);
        let v0 = (c0 << (8 - bit)) & 255;
        let (a, e) = match self.halves {
            Some(h) if h.c0 == c0 => return h,
            Some(h) if h.c0 == c0 >> 1 => {
                if c0 & 1 == 1 {
                    (h.m, h.e)
                } else {
                    (h.a, h.m)
                }
            }
            _ => {
                let a = self.first(lo, hi, v0);
                (a, self.first(a, hi, v0 + width))
            }
        };
        Halves {
            c0,
            a,
            m: self.first(a, e, v0 + width / 2),
            e,
        }
    }

    /// The split of the range that the bit after `c0` (with a leading 1; `bit` bits of the
    /// byte known) is predicted from, kept for the next bit and byte; `None` where no token
    /// agrees. Its `a`, `m` and `e` are the only sums [`Lm::p_bit`] reads, which is what
    /// [`Reads`] records.
    fn split(&mut self, c0: u32, bit: u32) -> Option<Halves> {
        debug_assert_eq!(c0 >> bit, 1, "c0 holds `bit` bits after a leading 1");
        let (lo, hi) = self.continuing();
        if lo >= hi {
            return None;
        }
        let h = self.halves(lo, hi, c0, bit);
        self.halves = Some(h);
        Some(h)
    }

    /// The LM's log-odds (stretch domain) that the next bit is 1, given the bits `c0` (with a
    /// leading 1) of a byte of which `bit` bits are known; `None` where no token agrees.
    pub fn p_bit(&mut self, c0: u32, bit: u32) -> Option<i32> {
        let h = self.split(c0, bit)?;
        debug_assert!(!self.cum.is_empty(), "the LM's call was not answered");
        #[cfg(test)]
        self.read_log.extend([h.a, h.e]);
        let total = (self.cum[h.e] - self.cum[h.a]) as u64;
        if total == 0 {
            return None;
        }
        #[cfg(test)]
        self.read_log.push(h.m);
        // At most 2^32 * 4096: the quotient of u64s is exact.
        let ones = (self.cum[h.e] - self.cum[h.m]) as u64;
        let p = ((ones * 4096) / total) as i32;
        Some(stretch(p.clamp(1, 4095)))
    }
}

/// The tokens of the LM's range whose next byte agrees with the bits `c0` of the byte coded so
/// far, as positions in sorted order: `[a, m)` continue with a 0 bit, `[m, e)` with a 1. The
/// next bit's are one of those halves split again, so a byte costs one search per bit in a
/// range that halves (about 8 log2 of the range's size probes in all, against 24 full-range
/// searches), and the last bit's half is the range of the next byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Halves {
    c0: u32,
    a: usize,
    m: usize,
    e: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The LM's bit input as first specified: three searches of the whole range per bit.
    fn p_bit_searched(lm: &Lm, c0: u32, bit: u32) -> Option<i32> {
        let (lo, hi) = lm.continuing();
        if lo >= hi {
            return None;
        }
        let d = lm.depth;
        let r = &lm.sorted[lo..hi];
        let width = 1u32 << (8 - bit);
        let v0 = (c0 << (8 - bit)) & 255;
        let first = |v: u32| lo + r.partition_point(|t| (t.0[d] as u32) < v);
        let a = first(v0);
        let m = first(v0 + width / 2);
        let e = if v0 + width > 255 {
            hi
        } else {
            first(v0 + width)
        };
        let total = (lm.cum[e] - lm.cum[a]) as u64;
        if total == 0 {
            return None;
        }
        let ones = (lm.cum[e] - lm.cum[m]) as u64;
        let p = ((ones as u128 * 4096) / total as u128) as i32;
        Some(stretch(p.clamp(1, 4095)))
    }

    /// The range narrowed by byte `b` at `depth` as first specified.
    fn narrowed(lm: &Lm, lo: usize, hi: usize, depth: usize, b: u8) -> (usize, usize) {
        let mut lo = lo;
        while lo < hi && lm.sorted[lo].0.len() <= depth {
            lo += 1;
        }
        let r = &lm.sorted[lo..hi];
        (
            lo + r.partition_point(|t| t.0[depth] < b),
            lo + r.partition_point(|t| t.0[depth] <= b),
        )
    }

    /// Random prefix sums over the sorted vocabulary: many tokens with no mass (so that some
    /// ranges have none), the rest up to 2^16, one token sometimes holding most of it.
    /// Marsaglia's xorshift64 from `state`: the tests' random bytes and tables.
    fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    fn random_cum(len: usize, rnd: &mut impl FnMut() -> u64) -> Vec<u32> {
        let heavy = rnd().is_multiple_of(2).then(|| rnd() as usize % len);
        let mut cum = vec![0u32; len + 1];
        for i in 0..len {
            let f = match rnd() % 4 {
                0 => 0,
                _ if heavy == Some(i) => 1 << 30,
                _ => rnd() % (1 << 16),
            };
            cum[i + 1] = cum[i] + f as u32;
        }
        cum
    }

    /// The halved searches, the byte's range taken from the last bit's halves, and the
    /// fallback searches (bits whose prediction is skipped) against the reference, over text
    /// whose chunks close (words, line breaks, 32-byte runs) and random bytes.
    #[test]
    fn halved_searches_equal_full_searches() {
        let mut rnd = xorshift(0x9E37_79B9_7F4A_7C15u64);
        let mut text = b"The quick brown fox, jumps over\n\tthe lazy dog's back;  \
                         aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa def f(x):\n    return x"
            .to_vec();
        for _ in 0..300 {
            let b = rnd() as u8;
            text.push(if b < 128 { b } else { b' ' + b % 64 });
        }
        let mut lm = Lm::start(Source::Caller {
            ctx: Context {
                n_ctx: 64,
                tokens: Vec::new(),
            },
            call: None,
        })
        .unwrap();
        let n = lm.sorted.len();
        let (mut opinions, mut cached) = (0, 0);
        for (p, &b) in text.iter().enumerate() {
            if lm.take_call().is_some() {
                lm.supply(random_cum(n, &mut rnd)).unwrap();
            }
            let skip = rnd().is_multiple_of(5);
            for k in 0..8 {
                let c0 = (b as u32 | 256) >> (8 - k);
                if skip && rnd().is_multiple_of(3) {
                    continue;
                }
                let want = p_bit_searched(&lm, c0, k);
                assert_eq!(lm.p_bit(c0, k), want, "byte {p}, bit {k}");
                opinions += want.is_some() as usize;
            }
            let (lo, hi, depth) = (lm.lo, lm.hi, lm.depth);
            cached += lm.halves.is_some_and(|h| h.c0 == (b as u32 | 256) >> 1) as usize;
            lm.byte(&text[..=p]).unwrap();
            let want = if lm.depth == 1 {
                narrowed(&lm, 0, n, 0, b)
            } else {
                narrowed(&lm, lo, hi, depth, b)
            };
            assert_eq!((lm.lo, lm.hi), want, "range after byte {p}");
        }
        // The test reached both paths and predicted something.
        assert!(
            opinions > 300 && cached > 50,
            "{opinions} opinions, {cached} cached"
        );
    }

    /// [`Reads`]' dry run names every sum the coding reads: an LM given only those sums
    /// (into a buffer holding garbage and then older tables elsewhere) predicts every bit as
    /// one given whole tables, and every index `p_bit` read is in the call's list.
    #[test]
    fn the_dry_run_covers_every_sum_read() {
        let mut rnd = xorshift(0x2545_F491_4F6C_DD1Du64);
        let mut text = b"The quick brown fox, jumps over\n\tthe lazy dog's back;  \
                         aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa def f(x):\n    return x\r\n\
                         \x00\xff\xe2\x82\xac \xf0\x9f\x98\x80."
            .to_vec();
        for _ in 0..2000 {
            let b = rnd() as u8;
            text.push(match b % 4 {
                0 => b,
                1 => b' ' + b % 64,
                _ => b"etaoin shrdlu\n"[b as usize % 14],
            });
        }
        let fresh = || {
            Lm::start(Source::Caller {
                ctx: Context {
                    n_ctx: 64,
                    tokens: Vec::new(),
                },
                call: None,
            })
            .unwrap()
        };
        let (mut whole, mut part) = (fresh(), fresh());
        let n = whole.sorted.len();
        part.cum = (0..=n as u32)
            .map(|i| i.wrapping_mul(0x9E37_79B9))
            .collect();
        let mut reads = Reads::new(&text).unwrap();
        let (mut at, mut calls, mut read) = (Vec::new(), 0, 0);
        for (p, &b) in text.iter().enumerate() {
            if let (Some(c), Some(d)) = (whole.take_call(), part.take_call()) {
                assert_eq!(c, d);
                // What the last table served was all in its list.
                for i in whole.read_log.drain(..) {
                    assert!(
                        at.binary_search(&(i as u32)).is_ok(),
                        "call {calls}: sum {i}"
                    );
                    read += 1;
                }
                at = reads.next_call().unwrap();
                calls += 1;
                let cum = random_cum(n, &mut rnd);
                let sums: Vec<u32> = at.iter().map(|&i| cum[i as usize]).collect();
                whole.supply(cum).unwrap();
                part.supply_at(&at, &sums).unwrap();
            }
            for k in 0..8 {
                let c0 = (b as u32 | 256) >> (8 - k);
                assert_eq!(part.p_bit(c0, k), whole.p_bit(c0, k), "byte {p}, bit {k}");
            }
            whole.byte(&text[..=p]).unwrap();
            part.byte(&text[..=p]).unwrap();
        }
        for i in whole.read_log.drain(..) {
            assert!(at.binary_search(&(i as u32)).is_ok(), "last call: sum {i}");
        }
        // Past the data's end a call reads nothing.
        assert!(reads.next_call().unwrap().is_empty());
        assert!(calls > 200 && read > 3000, "{calls} calls, {read} reads");
    }
}
