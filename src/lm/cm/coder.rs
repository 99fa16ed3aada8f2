//! Bytes <-> bits <-> range coder under the predictor (docs/INTEGER_GPT2.md §13.2). Bits are
//! coded most significant first; a bit with probability `p / 4096` of being 1 takes the
//! interval `[0, p * 2^20)` of the coder's 2^32 total for a 1 and the rest for a 0.
//!
//! The input is coded in order ([`encode`]), in independent blocks ([`decode_blocks`]) or in
//! strands that share the models and the range coder (`strands.rs`).

use super::super::range_coder::{Decoder, Encoder};
use rayon::prelude::*;

use super::lm_bits::{Call, Lm};
use super::predictor::{Parts, Predictor};
use crate::backend::lm::LmKernels;
use crate::format::lm::model_file::Model;
use crate::{Error, Result};

/// Which models the coder mixes.
#[derive(Clone, Copy)]
pub struct Setup<'m> {
    /// The language model and the device kernels it runs on, when it takes part.
    pub lm: Option<(&'m Model, &'m dyn LmKernels)>,
    pub match_model: bool,
}

struct Models<'m> {
    p: Predictor,
    lm: Option<Lm<'m>>,
}

impl<'m> Models<'m> {
    /// The models for coding `len` bytes.
    fn new(len: u64, match_model: bool, lm: Option<Lm<'m>>) -> Self {
        Models {
            p: Predictor::new(len, Parts { match_model }),
            lm,
        }
    }
    fn p(&mut self) -> i32 {
        let (c0, bit) = self.p.partial();
        let outside = self.lm.as_mut().and_then(|l| l.p_bit(c0, bit));
        self.p.p(outside)
    }
    fn update(&mut self, y: u32) -> Result<()> {
        self.p.update(y);
        if self.p.partial().1 == 0 {
            if let Some(lm) = self.lm.as_mut() {
                lm.byte(self.p.history())?;
            }
        }
        Ok(())
    }
    fn lm_tokens(&self) -> u64 {
        self.lm.as_ref().map_or(0, |l| l.tokens)
    }
}

/// Progress callback: (bytes done, bytes in all).
pub type Progress<'a> = &'a dyn Fn(u64, u64);

/// How often progress is reported, in bytes.
pub(super) const REPORT_EVERY: usize = 4096;

/// Code `data`; returns the coded bytes and the tokens the LM ran.
pub fn encode(data: &[u8], setup: Setup, progress: Progress) -> Result<(Vec<u8>, u64)> {
    let lm = setup
        .lm
        .map(|(model, kernels)| Lm::planned(model, kernels, data))
        .transpose()?;
    let mut m = Models::new(data.len() as u64, setup.match_model, lm);
    let mut enc = Encoder::new();
    for (i, &b) in data.iter().enumerate() {
        for k in (0..8).rev() {
            let y = ((b >> k) & 1) as u32;
            let p = m.p() as u64;
            if y == 1 {
                enc.encode(0, p << 20);
            } else {
                enc.encode(p << 20, (4096 - p) << 20);
            }
            m.update(y)?;
        }
        if i % REPORT_EVERY == REPORT_EVERY - 1 {
            progress(i as u64 + 1, data.len() as u64);
        }
    }
    Ok((enc.finish(), m.lm_tokens()))
}

/// One block's decoder: its models, its range decoder, and how far it has come.
struct Block<'a> {
    m: Models<'a>,
    dec: Decoder<&'a [u8]>,
    payload: &'a [u8],
    len: u64,
    done: u64,
}

impl<'a> Block<'a> {
    fn new(payload: &'a [u8], len: u64, setup: Setup<'a>) -> Result<Self> {
        let lm = setup
            .lm
            .map(|(model, _)| Lm::for_decoder(model))
            .transpose()?;
        Ok(Block {
            m: Models::new(len, setup.match_model, lm),
            dec: Decoder::new(payload),
            payload,
            len,
            done: 0,
        })
    }

    /// The LM call this block waits on, if it is not finished.
    fn call(&mut self) -> Option<Call> {
        if self.done == self.len {
            return None;
        }
        self.m.lm.as_mut().and_then(Lm::take_call)
    }

    /// Decode bytes until the block is finished or its LM waits for a table.
    fn run(&mut self) -> Result<()> {
        while self.done < self.len && !self.m.lm.as_ref().is_some_and(Lm::waits) {
            for _ in 0..8 {
                let p = self.m.p() as u64;
                let y = (self.dec.target() < p << 20) as u32;
                if y == 1 {
                    self.dec.consume(0, p << 20);
                } else {
                    self.dec.consume(p << 20, (4096 - p) << 20);
                }
                self.m.update(y)?;
            }
            // The encoder's last bytes flush its state: needing more means the payload is cut.
            if self.dec.overrun() > 0 {
                return Err(Error::format(
                    "text stream",
                    format!(
                        "the coded bytes end after {} of {} bytes (corrupt or truncated \
                         stream)",
                        self.done, self.len
                    ),
                ));
            }
            self.done += 1;
        }
        Ok(())
    }

    fn finish(self) -> Result<Vec<u8>> {
        // The decoder reads exactly the bytes the encoder wrote: more is padding or damage.
        if self.dec.position() != self.payload.len() {
            return Err(Error::format(
                "text stream",
                format!(
                    "{} bytes follow the coded data (corrupt or padded stream)",
                    self.payload.len() - self.dec.position()
                ),
            ));
        }
        Ok(self.m.p.into_text())
    }
}

/// Blocks decoded together at most: each holds its own adaptive models (megabytes) and, with
/// the LM, one KV cache on the device.
const MAX_LOCKSTEP: usize = 32;

/// Decode independently coded blocks, `(payload, length)` each, in lockstep: every block
/// decodes until its LM needs the next word's table, then the LM runs the calls of all
/// waiting blocks as one batch (one sequence per block). The bytes are those of decoding each
/// block alone.
pub fn decode_blocks(blocks: &[(&[u8], u64)], setup: Setup, progress: Progress) -> Result<Vec<u8>> {
    let total: u64 = blocks.iter().map(|b| b.1).sum();
    let group = match setup.lm {
        // As many as the device holds KV caches for (its call: 512 MiB of them on the CPU).
        Some((model, kernels)) => kernels
            .lockstep_sequences(model, model.config.n_ctx as usize)
            .min(MAX_LOCKSTEP),
        None => MAX_LOCKSTEP,
    };
    let mut out = Vec::with_capacity(total.min(1 << 30) as usize);
    for wave in blocks.chunks(group) {
        let base = out.len() as u64;
        let mut decs: Vec<Block> = wave
            .iter()
            .map(|&(payload, len)| Block::new(payload, len, setup))
            .collect::<Result<_>>()?;
        let mut session = match setup.lm {
            Some((model, kernels)) => {
                Some(kernels.load(model, wave.len(), model.config.n_ctx as usize)?)
            }
            None => None,
        };
        let mut waiting = vec![false; decs.len()];
        let mut last_report = 0;
        loop {
            decs.par_iter_mut().try_for_each(Block::run)?;
            let Some(session) = session.as_mut() else {
                break;
            };
            // The calls of the blocks that wait, one sequence each, as one batch.
            let mut items = Vec::new();
            for (s, (d, w)) in decs.iter_mut().zip(waiting.iter_mut()).enumerate() {
                *w = false;
                if let Some(call) = d.call() {
                    if call.restart {
                        session.clear(s)?;
                    }
                    items.extend(call.items(s));
                    *w = true;
                }
            }
            if items.is_empty() {
                break;
            }
            let mut tables = session.step_prefix_sums(&items, Lm::order())?.into_iter();
            let answers: Vec<Option<Vec<u32>>> = waiting
                .iter()
                .map(|&w| w.then(|| tables.next()).flatten())
                .collect();
            decs.par_iter_mut()
                .zip(answers)
                .zip(&waiting)
                .try_for_each(|((d, f), &w)| match (w, f, d.m.lm.as_mut()) {
                    (false, _, _) => Ok(()),
                    (true, Some(cum), Some(lm)) => lm.supply(cum),
                    _ => Err(Error::Invalid("LM: fewer tables than calls".into())),
                })?;
            let done = base + decs.iter().map(|d| d.done).sum::<u64>();
            if done - last_report >= REPORT_EVERY as u64 {
                progress(done, total);
                last_report = done;
            }
        }
        for d in decs {
            out.extend(d.finish()?);
        }
    }
    Ok(out)
}

/// Decode `len` bytes from `payload` (one block).
pub fn decode(payload: &[u8], len: u64, setup: Setup, progress: Progress) -> Result<Vec<u8>> {
    decode_blocks(&[(payload, len)], setup, progress)
}
