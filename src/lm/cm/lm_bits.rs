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
//! This is the one place the coder reaches the model: [`Lm::advance`] runs a word's tokens on
//! the device's [`LmSession`] and takes back the integer frequency table of the next token
//! ([`LmSession::step_table`], one table per word).

use std::sync::LazyLock;

use super::super::tokenizer::{self, EOT, VOCAB};
use super::logistic::stretch;
use crate::backend::lm::{Item, LmKernels, LmSession};
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

/// The LM's running state: its context and the token prefix the coded bytes agree with.
pub struct Lm<'m> {
    model: &'m Model,
    sorted: &'static [Entry],
    ctx: Vec<u32>,
    /// The model resident on its device, with one sequence.
    session: Box<dyn LmSession + 'm>,
    /// Prefix sums of the frequencies in sorted order (`len + 1` entries).
    cum: Vec<u64>,
    /// Start (in the history) of the chunk whose first token the LM predicts.
    chunk: usize,
    /// Tokens in `[lo, hi)` (sorted order) begin with the chunk's bytes so far, `depth` of them.
    lo: usize,
    hi: usize,
    depth: usize,
    /// Tokens run through the model (for throughput reports).
    pub tokens: u64,
}

impl<'m> Lm<'m> {
    pub fn new(model: &'m Model, kernels: &dyn LmKernels) -> Result<Self> {
        let sorted = sorted()?;
        let mut lm = Lm {
            model,
            sorted,
            ctx: Vec::new(),
            session: kernels.load(model, 1)?,
            cum: Vec::new(),
            chunk: 0,
            lo: 0,
            hi: sorted.len(),
            depth: 0,
            tokens: 0,
        };
        lm.advance(&[EOT])?;
        Ok(lm)
    }

    /// Append `new` tokens to the context and take the model's table for the next token. When
    /// the context would overflow, it restarts from its last half (as the segment windows do).
    fn advance(&mut self, new: &[u32]) -> Result<()> {
        let c = self.model.config.n_ctx as usize;
        self.ctx.extend_from_slice(new);
        let run: &[u32] = if self.ctx.len() > c {
            let keep = (c / 2).max(1);
            self.ctx.drain(..self.ctx.len() - keep);
            self.session.clear(0)?;
            &self.ctx
        } else {
            &self.ctx[self.ctx.len() - new.len()..]
        };
        let items: Vec<Item> = run
            .iter()
            .map(|&t| Item {
                seq: 0,
                token: t,
                query: None,
            })
            .collect();
        self.tokens += items.len() as u64;
        let f = self.session.step_table(&items)?;
        self.cum.clear();
        self.cum.reserve(self.sorted.len() + 1);
        let mut s = 0u64;
        self.cum.push(0);
        for &(_, id) in self.sorted {
            s += f[id as usize];
            self.cum.push(s);
        }
        Ok(())
    }

    /// After a byte was appended to `hist`: close the chunk if this byte starts a new one,
    /// then narrow the token range by the byte.
    pub fn byte(&mut self, hist: &[u8]) -> Result<()> {
        let p = hist.len() - 1;
        let boundary =
            p > self.chunk && (starts_chunk(hist[p - 1], hist[p]) || p - self.chunk >= MAX_CHUNK);
        if boundary {
            let toks = tokenizer::encode(&hist[self.chunk..p])?;
            self.advance(&toks)?;
            self.chunk = p;
            self.lo = 0;
            self.hi = self.sorted.len();
            self.depth = 0;
        }
        // Tokens of exactly `depth` bytes sort first in the range and cannot continue.
        let (lo, hi) = self.continuing();
        let b = hist[p];
        let d = self.depth;
        let r = &self.sorted[lo..hi];
        self.lo = lo + r.partition_point(|t| t.0[d] < b);
        self.hi = lo + r.partition_point(|t| t.0[d] <= b);
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

    /// The LM's log-odds (stretch domain) that the next bit is 1, given the bits `c0` (with a
    /// leading 1) of a byte of which `bit` bits are known; `None` where no token agrees.
    pub fn p_bit(&self, c0: u32, bit: u32) -> Option<i32> {
        let (lo, hi) = self.continuing();
        if lo >= hi {
            return None;
        }
        let d = self.depth;
        let r = &self.sorted[lo..hi];
        // Byte values whose top `bit` bits are c0's: [v0, v0 + 2^(8-bit)); the 1-half starts
        // at the midpoint.
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
        let total = self.cum[e] - self.cum[a];
        if total == 0 {
            return None;
        }
        let ones = self.cum[e] - self.cum[m];
        let p = ((ones as u128 * 4096) / total as u128) as i32;
        Some(stretch(p.clamp(1, 4095)))
    }
}
