//! The CPU device's language-model kernels: one file per operation, each readable reference
//! beside its fast versions (matmul: generic, AVX2, AVX-VNNI, AVX-512 VNNI dot products, AMX-INT8 tiles
//! for batched calls; rescale; LayerNorm and quantization; attention, one item or a run of a
//! sequence's items; logits to frequencies), chosen by the same
//! instruction-set level as the delta codec's ([`Isa`]), so pinning a level pins both codecs.

mod amx;
mod attention;
mod attention_many;
mod forward;
pub mod freq;
mod freq_scan;
mod matmul;
mod norm;
mod rescale;
mod scratch;
mod split;

use rayon::prelude::*;

use super::Isa;
use crate::backend::lm::{
    check_wanted, gather_sums, query_last, Coded, Item, LmKernels, LmSession, Trace,
};
use crate::format::lm::model_file::Model;
use crate::{Error, Result};
use std::sync::Arc;

use forward::{CpuWeights, KvCaches};
use matmul::CpuLinear;
use split::Split;

/// The integer GPT-2 on the CPU at one instruction-set level.
#[derive(Clone, Copy, Debug)]
pub struct CpuLm(Isa);

impl CpuLm {
    /// The kernels at `isa`, if this CPU runs it.
    pub fn new(isa: Isa) -> Option<CpuLm> {
        isa.available().then_some(CpuLm(isa))
    }
    pub fn isa(&self) -> Isa {
        self.0
    }
}

impl LmKernels for CpuLm {
    fn describe(&self) -> String {
        format!(
            "CPU, {} threads, {}{}",
            rayon::current_num_threads(),
            self.0.name(),
            if matmul::amx_at(self.0) {
                " + AMX-INT8"
            } else if matmul::avx_vnni_at(self.0) {
                " + AVX-VNNI"
            } else {
                ""
            }
        )
    }

    /// Caches of `positions` each, mapped at once and filled in as positions arrive
    /// ([`KvCaches`]); a step past them is an error.
    fn load<'m>(
        &self,
        model: &'m Model,
        sequences: usize,
        positions: usize,
    ) -> Result<Box<dyn LmSession + 'm>> {
        Ok(Box::new(CpuSession::new(
            self.0, model, sequences, positions,
        )))
    }
}

/// On the CPU the "resident" weights are the model in memory, borrowed, with what the
/// kernels of the session's level read in their own layout.
struct CpuSession<'m> {
    isa: Isa,
    model: &'m Model,
    weights: CpuWeights<'m>,
    caches: KvCaches,
    /// Every step with this split instead of its own (the tests' way to run both).
    forced: Option<Split>,
    /// The order of the head's rows when a prefix-sum order set it ([`CpuSession::order_head`]):
    /// the order's tokens, then the tokens it leaves out by id; and the order's length.
    head_order: Option<(Arc<Vec<u32>>, usize)>,
    /// The last step's logits (the head's output), kept so that the next step reuses the
    /// storage.
    logits: Vec<i32>,
    /// The layers' matmul outputs, likewise.
    bufs: forward::StepBuffers,
}

impl<'m> CpuSession<'m> {
    fn new(isa: Isa, model: &'m Model, sequences: usize, positions: usize) -> CpuSession<'m> {
        let c = &model.config;
        let positions = positions.clamp(1, c.n_ctx as usize);
        let caches = KvCaches::new(sequences, c.n_layer as usize, positions, c.n_embd as usize);
        CpuSession {
            isa,
            model,
            weights: CpuWeights::new(isa, model),
            caches,
            forced: None,
            head_order: None,
            logits: Vec::new(),
            bufs: Default::default(),
        }
    }

    /// Put the head's rows in `order` (then the tokens it leaves out, by id), so that the
    /// logits come out in the order the prefix sums read them; false when `order` is not a
    /// valid one (a token beyond the vocabulary or twice: the id-order path reports it).
    /// Done once per session for the one order the mixing coder uses; a different order
    /// redoes it (a copy of the head's weights).
    fn order_head(&mut self, order: &[u32]) -> bool {
        if let Some((perm, len)) = &self.head_order {
            if *len == order.len() && perm[..*len] == *order {
                return true;
            }
        }
        let v = self.model.config.vocab as usize;
        let mut seen = vec![false; v];
        for &id in order {
            match seen.get_mut(id as usize) {
                Some(s) if !*s => *s = true,
                _ => return false,
            }
        }
        let rest = (0..v as u32).filter(|&id| !seen[id as usize]);
        let perm: Vec<u32> = order.iter().copied().chain(rest).collect();
        self.weights.head = CpuLinear::rows_in_order(self.isa, &self.model.wte, &perm);
        self.head_order = Some((Arc::new(perm), order.len()));
        true
    }

    /// How the step of `items` spreads over the threads ([`Split::for_step`]).
    fn split(&self, items: &[Item]) -> Split {
        if let Some(s) = self.forced {
            return s;
        }
        Split::for_step(self.model, items, &self.caches.lens)
    }

    /// The forward pass of `items` then `each` of the logits of the items that carry a query
    /// (`vocab` each, in token order unless `head_order`: then as the head's rows are), with
    /// their largest logit where the head's kernel found it, in item order: the whole step on
    /// this thread, or as one job on the pool.
    ///
    /// The head runs over [`head_items`] items at a time, and their tables are made before
    /// the next call: a small head's weights and a call's logits then stay in the cache
    /// between the head and the passes over the logits, where all of a step's logits at once
    /// (51 MB for a compress step of 255 positions) went out to memory and back. With
    /// `keep_logits`, one call for all (the trace keeps them, in `self.logits`).
    fn tables<T: Send>(
        &mut self,
        items: &[Item],
        trace: Option<&mut Trace>,
        head_order: bool,
        each: impl Fn(usize, &[i32], Option<i32>, Split) -> Result<T> + Sync + Send,
    ) -> Result<Vec<T>> {
        let split = self.split(items);
        let (isa, model, weights) = (self.isa, self.model, &self.weights);
        let (caches, logits, bufs) = (&mut self.caches, &mut self.logits, &mut self.bufs);
        let v = model.config.vocab as usize;
        let perm = self.head_order.as_ref().map(|(p, _)| p.clone());
        let keep_logits = trace.is_some();
        split.run(|| {
            let input = forward::forward(isa, split, model, weights, caches, items, trace, bufs)?;
            let queries = input.sc.len();
            let per_call = match keep_logits {
                true => queries,
                false => head_items(weights.head.shape()).min(queries),
            }
            .max(1);
            let mut out = Vec::with_capacity(queries);
            logits.clear();
            for start in (0..queries).step_by(per_call) {
                let range = start..(start + per_call).min(queries);
                let tops = forward::head(isa, split, weights, &input, range.clone(), logits);
                if let (Some(perm), false) = (&perm, head_order) {
                    // Back to token order: row p of the head is token perm[p].
                    logits
                        .par_chunks_mut(v)
                        .with_min_len(split.min_len(1))
                        .for_each(|l| {
                            let by_row = l.to_vec();
                            for (&id, &x) in perm.iter().zip(&by_row) {
                                l[id as usize] = x;
                            }
                        });
                }
                // Several tables share the threads between them: each one's passes then run
                // on one thread, whole (a table cut into pieces costs a pass more, for the
                // pieces' offsets).
                let each_split = if queries > 1 { Split::SERIAL } else { split };
                let answers: Vec<T> = logits
                    .par_chunks(v)
                    .enumerate()
                    .with_min_len(split.min_len(1))
                    .map(|(i, l)| each(start + i, l, tops.as_ref().map(|t| t[i]), each_split))
                    .collect::<Result<_>>()?;
                out.extend(answers);
            }
            Ok(out)
        })
    }

    fn run(&mut self, items: &[Item], mut trace: Option<&mut Trace>) -> Result<Vec<Coded>> {
        let (isa, exp40) = (self.isa, &self.model.tables.exp40);
        let queries: Vec<_> = items.iter().filter_map(|it| it.query).collect();
        let traced = trace.is_some();
        let answered = self.tables(items, trace.as_deref_mut(), false, |i, l, top, _| {
            let q = queries[i];
            if !traced {
                // The coder needs one interval, not the table.
                return Ok((freq::coded(isa, l, top, exp40, q.mix, q.find)?, None));
            }
            let f = freq::table(isa, l, exp40, q.mix)?;
            Ok((freq::answer(&f, q.find)?, Some(f)))
        })?;
        if let Some(t) = trace.as_deref_mut() {
            t.logits = self.logits.clone();
            t.freqs = Vec::with_capacity(answered.len());
        }
        let mut out = Vec::with_capacity(answered.len());
        for (coded, f) in answered {
            out.push(coded);
            if let (Some(t), Some(f)) = (trace.as_deref_mut(), f) {
                t.freqs.push(f);
            }
        }
        Ok(out)
    }
}

/// Logit bytes per call of the LM head when its weights are small enough to stay in the last
/// level cache beside them (the shipped model's: 6.4 MB).
const HEAD_CALL_BYTES: usize = 4 << 20;
/// The largest head (bytes of weights) that is run in calls of [`HEAD_CALL_BYTES`]; a larger
/// head would be read from memory once per call, which costs more than its logits' trip out
/// and back (GPT-2 small's head is 38.6 MB).
const HEAD_IN_CACHE: usize = 12 << 20;

/// Items per call of a head of `(rows, k)` ([`CpuSession::tables`]).
fn head_items((rows, k): (usize, usize)) -> usize {
    match rows * k <= HEAD_IN_CACHE {
        true => (HEAD_CALL_BYTES / (4 * rows).max(1)).max(1),
        false => usize::MAX,
    }
}

impl LmSession for CpuSession<'_> {
    fn clear(&mut self, seq: usize) -> Result<()> {
        if seq >= self.caches.lens.len() {
            return Err(Error::Invalid(format!("no sequence {seq} in this session")));
        }
        self.caches.clear(seq);
        Ok(())
    }

    fn step(&mut self, items: &[Item]) -> Result<Vec<Coded>> {
        self.run(items, None)
    }

    fn step_traced(&mut self, items: &[Item], trace: &mut Trace) -> Result<Vec<Coded>> {
        self.run(items, Some(trace))
    }

    fn step_table(&mut self, items: &[Item]) -> Result<Vec<u64>> {
        // Only the last item's logits are wanted, so only it carries a query.
        let run = query_last(items)?;
        let (isa, exp40) = (self.isa, &self.model.tables.exp40);
        let mut tables = self.tables(&run, None, false, |_, l, _, _| {
            freq::frequencies(isa, l, exp40)
        })?;
        tables
            .pop()
            .ok_or_else(|| Error::Invalid("step_table: no table".into()))
    }

    fn step_tables(&mut self, items: &[Item]) -> Result<Vec<Vec<u64>>> {
        let (isa, exp40) = (self.isa, &self.model.tables.exp40);
        self.tables(items, None, false, |_, l, _, _| {
            freq::frequencies(isa, l, exp40)
        })
    }

    fn step_prefix_sums(&mut self, items: &[Item], order: &[u32]) -> Result<Vec<Vec<u32>>> {
        let (isa, exp40) = (self.isa, &self.model.tables.exp40);
        // In a parallel step: tables in parallel when there are several (the encoder's
        // batches), and each one's sums on every thread when there is one.
        if self.order_head(order) {
            let perm = self.head_order.as_ref().map(|(p, _)| p.clone());
            let perm = perm.expect("order_head set it");
            let sums = |_, l: &[i32], top, split| {
                freq::prefix_sums_in_order(isa, l, top, &perm, order.len(), exp40, split)
            };
            return self.tables(items, None, true, sums);
        }
        let sums = |_, l: &[i32], _, _| freq::prefix_sums(isa, l, exp40, order);
        self.tables(items, None, false, sums)
    }

    /// The sums the mixing encoder reads, from the logits as `step_prefix_sums` makes them
    /// but without writing every sum ([`freq::prefix_sums_in_order_at`]); an order that is
    /// not a permutation takes the default's way.
    fn step_prefix_sums_at(
        &mut self,
        items: &[Item],
        order: &[u32],
        wanted: &[Vec<u32>],
    ) -> Result<Vec<Vec<u32>>> {
        check_wanted(items, order, wanted)?;
        if !self.order_head(order) {
            return Ok(gather_sums(&self.step_prefix_sums(items, order)?, wanted));
        }
        let (isa, exp40) = (self.isa, &self.model.tables.exp40);
        let perm = self.head_order.as_ref().map(|(p, _)| p.clone());
        let perm = perm.expect("order_head set it");
        let sums = |i: usize, l: &[i32], top, _| {
            freq::prefix_sums_in_order_at(isa, l, top, &perm, order.len(), exp40, &wanted[i])
        };
        self.tables(items, None, true, sums)
    }
}

#[cfg(test)]
use super::test_lcg;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::lm::{Find, Query};

    /// A serial step and a parallel one give the same integers (trace, answers, tables and
    /// prefix sums) at every level this CPU runs: batches of several sequences and positions,
    /// then one-item steps, as the coders make them.
    #[test]
    fn serial_and_parallel_steps_agree() {
        let model = Model::from_bytes(include_bytes!("../../../../models/tinygpt2.lsm")).unwrap();
        let v = model.config.vocab;
        // A byte-order-like permutation that leaves a token out, as the mixing coder's does.
        let order: Vec<u32> = (0..v - 1).map(|i| (i * 7919 + 13) % v).collect();
        let q = |next: u32, i: u32| Query {
            find: if i.is_multiple_of(2) {
                Find::Symbol(next % v)
            } else {
                Find::Target((next as u64) << 18)
            },
            mix: i.is_multiple_of(3).then_some((next % v, 20_000)),
        };
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            let run = |split: Split| {
                let mut s = CpuSession::new(isa, &model, 3, usize::MAX);
                s.forced = Some(split);
                let mut out = Vec::new();
                // A batch over three sequences, several positions each, some queried.
                let items: Vec<Item> = (0..12u32)
                    .map(|i| Item {
                        seq: (i % 3) as usize,
                        token: (i * 977 + 5) % v,
                        query: (i % 2 == 1).then(|| q(i * 31, i)),
                    })
                    .collect();
                let mut t = Trace::default();
                let a = s.step_traced(&items, &mut t).unwrap();
                out.push((t.clone(), a));
                for i in 0..4u32 {
                    let item = Item {
                        seq: (i % 2) as usize,
                        token: 100 + i,
                        query: Some(q(i * 131, i)),
                    };
                    let a = s.step_traced(&[item], &mut t).unwrap();
                    out.push((t.clone(), a));
                }
                let two = [0, 2].map(|seq| Item {
                    seq,
                    token: 400,
                    query: Some(q(1, 0)),
                });
                let sums = s.step_prefix_sums(&two, &order).unwrap();
                let one = s.step_prefix_sums(&two[..1], &order).unwrap();
                let table = s.step_table(&two[1..]).unwrap();
                let tables = s.step_tables(&two).unwrap();
                (out, sums, one, table, tables)
            };
            let (serial, parallel) = (run(Split::SERIAL), run(Split::PARALLEL));
            for (step, ((ts, a), (tp, b))) in serial.0.iter().zip(&parallel.0).enumerate() {
                let at = format!("{isa:?} step {step}");
                assert_eq!(ts.ln1, tp.ln1, "{at}: LayerNorm 1");
                assert_eq!(ts.ln2, tp.ln2, "{at}: LayerNorm 2");
                assert_eq!(ts.resid, tp.resid, "{at}: residual streams");
                assert_eq!(ts.logits, tp.logits, "{at}: logits");
                assert_eq!(ts.freqs, tp.freqs, "{at}: tables");
                assert_eq!(a, b, "{at}: answers");
            }
            assert_eq!(serial.1, parallel.1, "{isa:?}: batched prefix sums");
            assert_eq!(serial.2, parallel.2, "{isa:?}: one table's prefix sums");
            assert_eq!(serial.3, parallel.3, "{isa:?}: step_table");
            assert_eq!(serial.4, parallel.4, "{isa:?}: step_tables");
            // The sums are those of the tables (fresh sessions in the same state).
            for split in [Split::SERIAL, Split::PARALLEL] {
                let (mut a, mut b) = (
                    CpuSession::new(isa, &model, 3, usize::MAX),
                    CpuSession::new(isa, &model, 3, usize::MAX),
                );
                (a.forced, b.forced) = (Some(split), Some(split));
                let two = [0, 2].map(|seq| Item {
                    seq,
                    token: 400 + seq as u32,
                    query: Some(q(1, 0)),
                });
                let sums = a.step_prefix_sums(&two, &order).unwrap();
                let tables = b.step_tables(&two).unwrap();
                assert_eq!(sums.len(), 2);
                assert_eq!(tables.len(), 2);
                for (s, f) in sums.iter().zip(&tables) {
                    let want = crate::backend::lm::prefix_sums(f, &order).unwrap();
                    assert_eq!(*s, want, "{isa:?} {split:?}: sums of the table");
                }
                // With its head in the order, a session still answers in token order.
                let next = [0, 2].map(|seq| Item {
                    seq,
                    token: 7,
                    query: Some(q(3, 1)),
                });
                let (mut ta, mut tb) = (Trace::default(), Trace::default());
                let got = a.step_traced(&next, &mut ta).unwrap();
                assert_eq!(got, b.step_traced(&next, &mut tb).unwrap(), "{isa:?}");
                assert_eq!(ta.logits, tb.logits, "{isa:?} {split:?}: logits");
                assert_eq!(ta.freqs, tb.freqs, "{isa:?} {split:?}: tables");
                assert_eq!(a.step_tables(&next).unwrap(), b.step_tables(&next).unwrap());
                // An order with a token twice is no permutation: the token-order path answers.
                let twice = [5, 9, 5];
                let (x, y) = (
                    a.step_prefix_sums(&next[..1], &twice),
                    b.step_prefix_sums(&next[..1], &twice),
                );
                assert_eq!(
                    x.unwrap(),
                    y.unwrap(),
                    "{isa:?} {split:?}: an order with a token twice"
                );
            }
        }
    }
}
