//! The integer GPT-2's kernels on a device: what the CPU implements today and what a CUDA or
//! wgpu implementation has to provide (docs/BACKENDS.md, "Language model").
//!
//! The interface is shaped for a GPU: a [`LmSession`] holds the model's weights and every
//! sequence's KV cache on the device for its whole life; one [`LmSession::step`] runs a batch
//! of tokens (many sequences, many positions) and answers each position's question with three
//! integers ([`Coded`]), so no 50,257-entry table crosses back to the host per token. The full
//! stage-by-stage integers (per-layer values, logits, frequency tables) come back only when a
//! caller asks for a [`Trace`] (parity tests, calibration).
//!
//! Every device must give the integers of the CPU's scalar reference (docs/INTEGER_GPT2.md):
//! the same tokens give the same [`Coded`] answers whatever the batch, the order of items or
//! the thread count.

use crate::format::lm::model_file::{Config, Model};
use crate::Result;

/// A device's language-model kernels ([`super::Device::lm`]).
pub trait LmKernels: Send + Sync {
    /// What runs them, for people ("CPU, AVX2").
    fn describe(&self) -> String;
    /// Make `model` resident (weights uploaded once) with `sequences` empty KV caches, each
    /// for up to `positions` positions (at most the model's context; a device may size its
    /// caches by it, and then refuses a step past it).
    fn load<'m>(
        &self,
        model: &'m Model,
        sequences: usize,
        positions: usize,
    ) -> Result<Box<dyn LmSession + 'm>>;
    /// How many sequences of up to `positions` tokens a decoder should run in lockstep on
    /// this device: one KV cache each. The bytes never depend on it; a GPU with gigabytes
    /// to spare takes many more than the CPU, whose default keeps the caches to 512 MiB.
    fn lockstep_sequences(&self, model: &Model, positions: usize) -> usize {
        sequences_within(model, positions, 512 << 20, 64)
    }
    /// How many segments of `positions` tokens the encoder should run in one step (one
    /// sequence each). One on the CPU, whose kernels are busy with one segment's positions;
    /// a GPU needs the rows of many to fill itself. The bytes never depend on it.
    fn compress_sequences(&self, _model: &Model, _positions: usize) -> usize {
        1
    }
}

/// Sequences whose KV caches (`positions` per sequence, keys and values, 4 bytes each per
/// layer and channel) fit in `bytes`, between 1 and `max`.
pub fn sequences_within(model: &Model, positions: usize, bytes: usize, max: usize) -> usize {
    let c = &model.config;
    let per = (c.n_layer as usize * positions * c.n_embd as usize * 8).max(1);
    (bytes / per).clamp(1, max)
}

/// A model resident on a device, with one KV cache per sequence.
pub trait LmSession: Send {
    /// Empty sequence `seq`'s cache: its next token goes to position 0.
    fn clear(&mut self, seq: usize) -> Result<()>;
    /// Run `items` in order (each appends its token to its sequence at the next position)
    /// and answer the queries, one [`Coded`] per item that has one, in item order.
    fn step(&mut self, items: &[Item]) -> Result<Vec<Coded>>;
    /// [`LmSession::step`], also filling `trace` with the integers of every stage.
    fn step_traced(&mut self, items: &[Item], trace: &mut Trace) -> Result<Vec<Coded>>;
    /// Run `items` (their queries ignored) and return the whole frequency table (total 2^32,
    /// no match mix) of the token after the last one. This is the one call that sends a
    /// `vocab`-entry table back to the host: the context-mixing coder (stream version 2,
    /// docs/INTEGER_GPT2.md §13) needs every token's mass in byte order and makes one such
    /// call per word, not per token.
    fn step_table(&mut self, items: &[Item]) -> Result<Vec<u64>>;
    /// Run `items` and return, for each item that has a query (its `find` and `mix`
    /// ignored), the whole frequency table (total 2^32, no match mix) of the token after it,
    /// in item order. The context-mixing encoder knows every word in advance and asks for
    /// many words' tables in one call (sequences and positions batched as in
    /// [`LmSession::step`]); the default runs one [`LmSession::step_table`] per query, so a
    /// device that has only that still answers, unbatched.
    fn step_tables(&mut self, items: &[Item]) -> Result<Vec<Vec<u64>>> {
        let mut tables = Vec::new();
        let mut start = 0;
        for (i, it) in items.iter().enumerate() {
            if it.query.is_some() {
                tables.push(self.step_table(&items[start..=i])?);
                start = i + 1;
            }
        }
        if start < items.len() {
            let rest: Vec<Item> = items[start..]
                .iter()
                .map(|it| Item { query: None, ..*it })
                .collect();
            self.step(&rest)?;
        }
        Ok(tables)
    }
    /// [`LmSession::step_tables`], each table handed back as its [`prefix_sums`] in the order
    /// `order`: what the context-mixing coder reads (tokens in byte order, docs/INTEGER_GPT2.md
    /// §13.3). A device may compute the sums from its logits without the table in between;
    /// the default lays out the tables of [`LmSession::step_tables`].
    fn step_prefix_sums(&mut self, items: &[Item], order: &[u32]) -> Result<Vec<Vec<u32>>> {
        use rayon::prelude::*;
        self.step_tables(items)?
            .par_iter()
            .map(|f| prefix_sums(f, order))
            .collect()
    }
    /// [`LmSession::step_prefix_sums`], each table handed back only at its `wanted` indices
    /// (one list per query, in item order; each strictly ascending, every index at most
    /// `order.len()`): `out[t][i] = sums[t][wanted[t][i]]`. The mixing encoder knows which
    /// sums its bit predictor will read (a few hundred of the 50,258 per word: the bounds of
    /// the token ranges its bytes narrow to), so a device computes the sums where the table
    /// is and sends those values back, not the table. The default gathers them from
    /// [`LmSession::step_prefix_sums`], so every device answers; one that implements it must
    /// give exactly the default's integers.
    fn step_prefix_sums_at(
        &mut self,
        items: &[Item],
        order: &[u32],
        wanted: &[Vec<u32>],
    ) -> Result<Vec<Vec<u32>>> {
        check_wanted(items, order, wanted)?;
        Ok(gather_sums(&self.step_prefix_sums(items, order)?, wanted))
    }
}

/// Each table of `sums` at its `wanted` indices (checked by [`check_wanted`]): the default of
/// [`LmSession::step_prefix_sums_at`].
pub fn gather_sums(sums: &[Vec<u32>], wanted: &[Vec<u32>]) -> Vec<Vec<u32>> {
    sums.iter()
        .zip(wanted)
        .map(|(cum, at)| at.iter().map(|&i| cum[i as usize]).collect())
        .collect()
}

/// Check the `wanted` lists of [`LmSession::step_prefix_sums_at`] before anything runs: one
/// per query of `items`, each strictly ascending and within the `order.len() + 1` sums.
pub fn check_wanted(items: &[Item], order: &[u32], wanted: &[Vec<u32>]) -> Result<()> {
    let queries = items.iter().filter(|it| it.query.is_some()).count();
    if wanted.len() != queries {
        return Err(crate::Error::Invalid(format!(
            "prefix sums at: {} index lists for {queries} queries",
            wanted.len()
        )));
    }
    for at in wanted {
        let ascending = at.windows(2).all(|w| w[0] < w[1]);
        if !ascending || at.last().is_some_and(|&i| i as usize > order.len()) {
            return Err(crate::Error::Invalid(
                "prefix sums at: indices not ascending or beyond the sums".into(),
            ));
        }
    }
    Ok(())
}

/// Prefix sums (`order.len() + 1` entries, the first 0) of the frequency table `f` taken in
/// the order `order` (token ids, each at most once). Every sum must stay below 2^32, which
/// holds when a token is left out (each has at least 1 and the table sums to 2^32); checked
/// once, on the last, since the sums only grow.
pub fn prefix_sums(f: &[u64], order: &[u32]) -> Result<Vec<u32>> {
    let mut cum = Vec::with_capacity(order.len() + 1);
    let mut s = 0u64;
    cum.push(0);
    for &id in order {
        let v = *f.get(id as usize).ok_or_else(|| {
            crate::Error::Invalid(format!(
                "prefix sums: token {id} beyond the table of {}",
                f.len()
            ))
        })?;
        s = s.saturating_add(v);
        cum.push(s as u32);
    }
    if s >> 32 != 0 {
        return Err(crate::Error::Invalid("LM table sums past 2^32".into()));
    }
    Ok(cum)
}

/// One token to run: appended to sequence `seq` at its next position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Item {
    pub seq: usize,
    pub token: u32,
    /// What the coder needs to know about the next token, if anything.
    pub query: Option<Query>,
}

/// A question about the token after an item, under the model's frequency table (total 2^32,
/// docs/INTEGER_GPT2.md §5) with an optional match-model prediction mixed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Query {
    pub find: Find,
    /// `(token, lambda)`: move `lambda / 2^16` of every other token's frequency to `token`
    /// (floor 1 kept), as `cpu::lm::freq::mix` defines.
    pub mix: Option<(u32, u64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Find {
    /// The encoder's question: the interval of this symbol.
    Symbol(u32),
    /// The decoder's: the symbol whose interval holds this value (below 2^32).
    Target(u64),
}

/// The answer to a [`Query`]: a symbol and its interval `[cum, cum + freq)` of 2^32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coded {
    pub symbol: u32,
    pub cum: u64,
    pub freq: u64,
}

/// Every stage's integers, for parity tests and calibration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// Per layer, per channel: the largest |LayerNorm output| before attention and before
    /// the MLP, over every call traced into this value (calibration of outlier channels).
    pub ln1: Vec<Vec<i64>>,
    pub ln2: Vec<Vec<i64>>,
    /// The residual stream (Q12, items x n_embd) after each block, of the last call.
    pub resid: Vec<Vec<i32>>,
    /// Logits (Q8, `vocab` each) of the last call's items that have a query, in order.
    pub logits: Vec<i32>,
    /// Their frequency tables (total 2^32, the match prediction mixed in).
    pub freqs: Vec<Vec<u64>>,
}

impl Trace {
    /// A trace for a model with `n_layer` layers of width `d`.
    pub fn new(n_layer: usize, d: usize) -> Self {
        Trace {
            ln1: vec![vec![0; d]; n_layer],
            ln2: vec![vec![0; d]; n_layer],
            ..Trace::default()
        }
    }
}

/// `items` with a query on the last one only (an encoder's query for symbol 0, no match mix):
/// what a [`LmSession::step_table`] implementation runs, since only the last item's table is
/// wanted.
pub fn query_last(items: &[Item]) -> Result<Vec<Item>> {
    let last = items
        .len()
        .checked_sub(1)
        .ok_or_else(|| crate::Error::Invalid("step_table: no token to predict from".into()))?;
    Ok(items
        .iter()
        .enumerate()
        .map(|(i, it)| Item {
            query: (i == last).then_some(Query {
                find: Find::Symbol(0),
                mix: None,
            }),
            ..*it
        })
        .collect())
}

/// Which frequency tables a GPU step sends back to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tables {
    None,
    /// The last query's ([`LmSession::step_table`]).
    Last,
    /// Every query's, in order ([`LmSession::step_tables`]).
    All,
}

/// `items` with every query made a plain one (an encoder's query for symbol 0, no match
/// mix), so that its table is the unmixed one [`LmSession::step_tables`] returns: what a
/// device runs for that call as one batch.
pub fn unmixed_queries(items: &[Item]) -> Vec<Item> {
    items
        .iter()
        .map(|it| Item {
            query: it.query.map(|_| Query {
                find: Find::Symbol(0),
                mix: None,
            }),
            ..*it
        })
        .collect()
}

/// A GPU step's input, checked before anything runs: the sequences' lengths after the step
/// (a session keeps them, and so moves its caches, only when the step succeeds), four words
/// per item (sequence, position, token, 0) and each query's item with its words
/// ([`query_words`]), as the wgpu and CUDA kernels read them.
pub struct StepInput {
    pub next: Vec<usize>,
    pub words: Vec<u32>,
    pub queries: Vec<(usize, [u32; 4])>,
}

/// Check `items` against the sequences' current lengths `lens` and the model, and lay them
/// out for a GPU step.
pub fn step_input(items: &[Item], lens: &[usize], cfg: &Config) -> Result<StepInput> {
    let (ctx, vocab) = (cfg.n_ctx as usize, cfg.vocab as usize);
    let mut next = lens.to_vec();
    let mut words = Vec::with_capacity(items.len() * 4);
    let mut queries = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let p = next.get_mut(it.seq).ok_or_else(|| {
            crate::Error::Invalid(format!("no sequence {} in this session", it.seq))
        })?;
        if *p >= ctx {
            return Err(crate::Error::Invalid(format!(
                "forward: position {} beyond context {ctx}",
                *p
            )));
        }
        if it.token >= cfg.vocab {
            return Err(crate::Error::Invalid(format!(
                "forward: token {} beyond vocab",
                it.token
            )));
        }
        words.extend([it.seq as u32, *p as u32, it.token, 0]);
        *p += 1;
        if let Some(q) = it.query {
            queries.push((i, query_words(q, vocab)?));
        }
    }
    Ok(StepInput {
        next,
        words,
        queries,
    })
}

/// What a traced GPU step reads back besides the answers (a [`Trace`]'s parts of one call).
#[derive(Default)]
pub struct Readback {
    pub ln1: Vec<Vec<i64>>,
    pub ln2: Vec<Vec<i64>>,
    pub resid: Vec<Vec<i32>>,
    pub logits: Vec<i32>,
    pub freqs: Vec<Vec<u64>>,
}

impl Trace {
    /// Take in one traced call of a model with `n_layer` layers of width `d`: the LayerNorm
    /// outputs fold into the per-channel maxima, the rest is the last call's.
    pub fn absorb(&mut self, rb: Readback, n_layer: usize, d: usize) {
        if self.ln1.len() != n_layer || self.ln2.len() != n_layer {
            *self = Trace {
                ln1: vec![vec![0; d]; n_layer],
                ln2: vec![vec![0; d]; n_layer],
                ..std::mem::take(self)
            };
        }
        for (acc, y) in self.ln1.iter_mut().zip(&rb.ln1) {
            record(acc, y, d);
        }
        for (acc, y) in self.ln2.iter_mut().zip(&rb.ln2) {
            record(acc, y, d);
        }
        self.resid = rb.resid;
        self.logits = rb.logits;
        self.freqs = rb.freqs;
    }
}

/// Fold LayerNorm outputs (rows of `d`) into a trace's per-channel maxima.
pub fn record(acc: &mut [i64], y: &[i64], d: usize) {
    for row in y.chunks_exact(d) {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a = (*a).max(v.abs());
        }
    }
}

/// A query as the GPU frequency kernels read it (shaders/lm/freq.wgsl, kernels/lm/freq.cu): kind (0 symbol, 1 target), its value, the
/// mixed-in token (u32::MAX: none) and lambda. Out-of-range questions are refused here, as
/// the CPU's `freq::answer` refuses them.
pub fn query_words(q: Query, vocab: usize) -> Result<[u32; 4]> {
    let (kind, value) = match q.find {
        Find::Symbol(s) if (s as usize) < vocab => (0, s),
        Find::Symbol(s) => {
            return Err(crate::Error::Invalid(format!(
                "symbol {s} beyond the vocabulary"
            )));
        }
        Find::Target(t) if t < 1 << 32 => (1, t as u32),
        Find::Target(t) => {
            return Err(crate::Error::Invalid(format!(
                "target {t} beyond the table's total"
            )));
        }
    };
    // The mix is a no-op unless 0 < lambda < 2^16 and the token is in the vocabulary.
    let (x, lambda) = match q.mix {
        Some((x, l)) if (x as usize) < vocab && l > 0 && l < 1 << 16 => (x, l as u32),
        _ => (u32::MAX, 0),
    };
    Ok([kind, value, x, lambda])
}
