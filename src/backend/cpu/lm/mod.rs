//! The CPU device's language-model kernels: one file per operation, each readable reference
//! beside its fast versions (matmul: generic, AVX2, AVX-512 VNNI dot products; rescale;
//! LayerNorm and quantization; attention; logits to frequencies), chosen by the same
//! instruction-set level as the delta codec's ([`Isa`]), so pinning a level pins both codecs.

mod attention;
mod forward;
pub mod freq;
mod matmul;
mod norm;
mod rescale;

use rayon::prelude::*;

use super::Isa;
use crate::backend::lm::{query_last, Coded, Item, LmKernels, LmSession, Trace};
use crate::format::lm::model_file::Model;
use crate::{Error, Result};
use forward::{CpuWeights, KvCache};

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
            "CPU, {} threads, {}",
            rayon::current_num_threads(),
            self.0.name()
        )
    }

    fn load<'m>(&self, model: &'m Model, sequences: usize) -> Result<Box<dyn LmSession + 'm>> {
        let nl = model.config.n_layer as usize;
        Ok(Box::new(CpuSession {
            isa: self.0,
            model,
            weights: CpuWeights::new(self.0, model),
            caches: vec![KvCache::new(nl); sequences],
        }))
    }
}

/// On the CPU the "resident" weights are the model in memory, borrowed, with what the
/// kernels of the session's level read in their own layout.
struct CpuSession<'m> {
    isa: Isa,
    model: &'m Model,
    weights: CpuWeights<'m>,
    caches: Vec<KvCache>,
}

impl CpuSession<'_> {
    /// The forward pass of `items`: `vocab` logits per item that carries a query.
    fn logits(&mut self, items: &[Item]) -> Result<Vec<i32>> {
        forward::forward(
            self.isa,
            self.model,
            &self.weights,
            &mut self.caches,
            items,
            None,
        )
    }

    fn run(&mut self, items: &[Item], mut trace: Option<&mut Trace>) -> Result<Vec<Coded>> {
        let logits = forward::forward(
            self.isa,
            self.model,
            &self.weights,
            &mut self.caches,
            items,
            trace.as_deref_mut(),
        )?;
        let v = self.model.config.vocab as usize;
        let exp40 = &self.model.tables.exp40;
        let queries: Vec<_> = items.iter().filter_map(|it| it.query).collect();
        let traced = trace.is_some();
        let answered: Vec<(Coded, Option<Vec<u64>>)> = logits
            .par_chunks(v)
            .zip(queries.par_iter())
            .map(|(l, q)| {
                let f = freq::table(l, exp40, q.mix)?;
                let coded = freq::answer(&f, q.find)?;
                Ok((coded, traced.then_some(f)))
            })
            .collect::<Result<_>>()?;
        if let Some(t) = trace.as_deref_mut() {
            t.logits = logits;
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

impl LmSession for CpuSession<'_> {
    fn clear(&mut self, seq: usize) -> Result<()> {
        self.caches
            .get_mut(seq)
            .ok_or_else(|| Error::Invalid(format!("no sequence {seq} in this session")))?
            .clear();
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
        let logits = self.logits(&run)?;
        freq::frequencies(&logits, &self.model.tables.exp40)
    }

    fn step_tables(&mut self, items: &[Item]) -> Result<Vec<Vec<u64>>> {
        let logits = self.logits(items)?;
        let v = self.model.config.vocab as usize;
        let exp40 = &self.model.tables.exp40;
        logits
            .par_chunks(v)
            .map(|l| freq::frequencies(l, exp40))
            .collect()
    }

    fn step_prefix_sums(&mut self, items: &[Item], order: &[u32]) -> Result<Vec<Vec<u32>>> {
        let logits = self.logits(items)?;
        let v = self.model.config.vocab as usize;
        let exp40 = &self.model.tables.exp40;
        // Tables in parallel when there are several (the encoder's batches), and each one's
        // sums on every thread when there is one (a one-block decode).
        logits
            .par_chunks(v)
            .map(|l| freq::prefix_sums(l, exp40, order))
            .collect()
    }
}
