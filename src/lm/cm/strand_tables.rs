//! Where the strands' LM tables come from (docs/INTEGER_GPT2.md §13.5): the strand loop
//! (`strands.rs`) collects, each round, the call every unfinished strand's LM waits on and
//! asks a [`Tables`] source to answer them. The decoder learns its calls only as it decodes,
//! so [`PerRound`] runs each round's calls as one batch (about S items). The encoder knows
//! every strand's calls from the input, and in the schedule call k of a strand is answered
//! in round k, so [`Ahead`] runs the calls of several rounds in one batch and serves the
//! rounds from per-strand queues; knowing every strand's bytes, it asks only for the sums
//! they will read ([`Reads`], `LmSession::step_prefix_sums_at`). Tables do not depend on how calls are batched, so both
//! give the same bytes; [`Ahead`] checks that each call it planned is the call the loop made.

use std::collections::VecDeque;

use super::lm_bits::{calls, Call, Lm, Reads, Table};
use crate::backend::lm::{LmKernels, LmSession};
use crate::format::lm::model_file::Model;
use crate::{Error, Result};

/// The answers to one round's calls.
pub trait Tables {
    /// The table (prefix sums in [`Lm::order`], whole or those the strand will read) for
    /// each `(strand, call)` of `waiting`, in order.
    fn answer(&mut self, waiting: &[(usize, Call)]) -> Result<Vec<Table>>;
}

/// The decoder's source: one batched device call per round, one sequence per strand.
pub struct PerRound<'m> {
    session: Box<dyn LmSession + 'm>,
}

impl<'m> PerRound<'m> {
    pub fn new(model: &'m Model, kernels: &dyn LmKernels, count: usize) -> Result<Self> {
        Ok(PerRound {
            session: kernels.load(model, count, model.config.n_ctx as usize)?,
        })
    }
}

impl Tables for PerRound<'_> {
    fn answer(&mut self, waiting: &[(usize, Call)]) -> Result<Vec<Table>> {
        let mut items = Vec::new();
        for (s, call) in waiting {
            if call.restart {
                self.session.clear(*s)?;
            }
            items.extend(call.items(*s));
        }
        let tables = self.session.step_prefix_sums(&items, Lm::order())?;
        if tables.len() != waiting.len() {
            return Err(Error::Invalid("LM: fewer tables than calls".into()));
        }
        Ok(tables.into_iter().map(Table::Whole).collect())
    }
}

/// Calls per batched device call of the encoder: as the one-block encoder's plan, enough to
/// share each weight load across many items (about three rounds of 21 strands), few enough
/// that the tables in flight on the device stay small (64 x 200 KB; only the sums each call
/// reads come back).
const AHEAD_BATCH: usize = 64;
/// Spare sequences beyond one per strand (fewer where the KV bound of `max_strands` leaves
/// no room): a strand whose context restarts inside a batch moves to a spare, since its old
/// sequence still serves the batch's earlier items of that strand.
const SPARE_SEQS: usize = 4;

/// The encoder's source: every strand's calls, planned from the input, run in batches that
/// span rounds.
pub struct Ahead<'m> {
    session: Box<dyn LmSession + 'm>,
    /// Strand s's calls, in the order its LM makes them (call k answered in round k).
    calls: Vec<Vec<Call>>,
    /// Strand s's dry run: which sums of each call's table its bytes read, call after call
    /// (only those come back from the device).
    reads: Vec<Reads>,
    /// The next call to run: call `round` of strand `strand` (rounds in order, strands in
    /// order inside a round, strands that have finished skipped).
    round: usize,
    strand: usize,
    /// Per strand, the tables run ahead and the index of the call each answers.
    ready: Vec<VecDeque<(usize, Table)>>,
    /// The sequence each strand's context is on, and the sequences no strand holds.
    seq: Vec<usize>,
    free: Vec<usize>,
}

impl<'m> Ahead<'m> {
    /// The source for coding the strands `strands` (each strand's bytes) of one input, with
    /// at most `most` sequences' KV caches (`strands::max_strands`).
    pub fn new(
        model: &'m Model,
        kernels: &dyn LmKernels,
        strands: &[&[u8]],
        most: usize,
    ) -> Result<Self> {
        // A strand's LM makes a call at each byte that closes a chunk, but the one its last
        // byte makes is never answered (the strand has ended): the calls of all but the
        // last byte. An empty strand makes none that count.
        let calls = strands
            .iter()
            .map(|d| match d.split_last() {
                Some((_, head)) => calls(model, head),
                None => Ok(Vec::new()),
            })
            .collect::<Result<Vec<_>>>()?;
        // The reads cover the last byte too: it is predicted from the last answered table.
        let reads = strands
            .iter()
            .map(|d| Reads::new(d))
            .collect::<Result<Vec<_>>>()?;
        let count = strands.len();
        let spare = SPARE_SEQS.min(most.saturating_sub(count));
        Ok(Ahead {
            session: kernels.load(model, count + spare, model.config.n_ctx as usize)?,
            calls,
            reads,
            round: 0,
            strand: 0,
            ready: (0..count).map(|_| VecDeque::new()).collect(),
            seq: (0..count).collect(),
            free: (count..count + spare).collect(),
        })
    }

    /// The next call to run, `(strand, index)`, if any is left.
    fn peek(&mut self) -> Option<(usize, usize)> {
        let rounds = self.calls.iter().map(Vec::len).max().unwrap_or(0);
        while self.round < rounds {
            if self.strand == self.calls.len() {
                self.round += 1;
                self.strand = 0;
            } else if self.round < self.calls[self.strand].len() {
                return Some((self.strand, self.round));
            } else {
                self.strand += 1;
            }
        }
        None
    }

    /// Run the next calls, up to [`AHEAD_BATCH`] of them, as one batch.
    fn run_batch(&mut self) -> Result<()> {
        let mut items = Vec::new();
        let mut asked = Vec::new();
        let mut wanted = Vec::new();
        let mut in_batch = vec![false; self.calls.len()];
        // Sequences a restart left in this batch: free once its items have run.
        let mut left = Vec::new();
        while asked.len() < AHEAD_BATCH {
            let Some((s, k)) = self.peek() else {
                break;
            };
            let call = &self.calls[s][k];
            if call.restart {
                if !in_batch[s] {
                    self.session.clear(self.seq[s])?;
                } else if let Some(fresh) = self.free.pop() {
                    self.session.clear(fresh)?;
                    left.push(self.seq[s]);
                    self.seq[s] = fresh;
                } else {
                    // Its cache still serves this batch's earlier items and no spare is left.
                    break;
                }
            }
            in_batch[s] = true;
            items.extend(call.items(self.seq[s]));
            // A strand's calls are asked in order, as its dry run gives their reads.
            wanted.push(self.reads[s].next_call()?);
            asked.push((s, k));
            self.strand += 1;
        }
        let sums = self
            .session
            .step_prefix_sums_at(&items, Lm::order(), &wanted)?;
        if sums.len() != asked.len() {
            return Err(Error::Invalid("LM: fewer tables than calls".into()));
        }
        for (((s, k), at), sums) in asked.into_iter().zip(wanted).zip(sums) {
            self.ready[s].push_back((k, Table::At { at, sums }));
        }
        self.free.extend(left);
        Ok(())
    }
}

impl Tables for Ahead<'_> {
    fn answer(&mut self, waiting: &[(usize, Call)]) -> Result<Vec<Table>> {
        let mut out = Vec::with_capacity(waiting.len());
        for (s, call) in waiting {
            while self.ready[*s].is_empty() {
                if self.peek().is_none() {
                    return Err(Error::Invalid(format!(
                        "strands: strand {s} made more LM calls than planned"
                    )));
                }
                self.run_batch()?;
            }
            let (k, table) = self.ready[*s]
                .pop_front()
                .ok_or_else(|| Error::Invalid("strands: no table ready".into()))?;
            // Cheap insurance that plan and loop agree: a table answers the call it was
            // computed for, or coding stops.
            if self.calls[*s][k] != *call {
                return Err(Error::Invalid(format!(
                    "strands: strand {s}'s LM call {k} differs from the planned one"
                )));
            }
            out.push(table);
        }
        Ok(out)
    }
}
