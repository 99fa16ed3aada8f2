//! Bytes <-> bits <-> range coder under the predictor (docs/INTEGER_GPT2.md §13.2). Bits are
//! coded most significant first; a bit with probability `p / 4096` of being 1 takes the
//! interval `[0, p * 2^20)` of the coder's 2^32 total for a 1 and the rest for a 0.

use super::super::range_coder::{Decoder, Encoder};
use super::lm_bits::Lm;
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
    fn new(len: u64, setup: Setup<'m>) -> Result<Self> {
        Ok(Models {
            p: Predictor::new(
                len,
                Parts {
                    match_model: setup.match_model,
                },
            ),
            lm: setup.lm.map(|(m, k)| Lm::new(m, k)).transpose()?,
        })
    }
    fn p(&mut self) -> i32 {
        let (c0, bit) = self.p.partial();
        let outside = self.lm.as_ref().and_then(|l| l.p_bit(c0, bit));
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
const REPORT_EVERY: usize = 4096;

/// Code `data`; returns the coded bytes and the tokens the LM ran.
pub fn encode(data: &[u8], setup: Setup, progress: Progress) -> Result<(Vec<u8>, u64)> {
    let mut m = Models::new(data.len() as u64, setup)?;
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

/// Decode `len` bytes from `payload`.
pub fn decode(payload: &[u8], len: u64, setup: Setup, progress: Progress) -> Result<Vec<u8>> {
    let mut m = Models::new(len, setup)?;
    let mut dec = Decoder::new(payload);
    for i in 0..len {
        for _ in 0..8 {
            let p = m.p() as u64;
            let y = (dec.target() < p << 20) as u32;
            if y == 1 {
                dec.consume(0, p << 20);
            } else {
                dec.consume(p << 20, (4096 - p) << 20);
            }
            m.update(y)?;
        }
        // The encoder's last bytes flush its state: needing more means the payload is cut.
        if dec.overrun() > 0 {
            return Err(Error::format(
                "text stream",
                format!(
                    "the coded bytes end after {i} of {len} bytes (corrupt or truncated stream)"
                ),
            ));
        }
        if i as usize % REPORT_EVERY == REPORT_EVERY - 1 {
            progress(i + 1, len);
        }
    }
    // The decoder reads exactly the bytes the encoder wrote: more is padding or damage.
    if dec.position() != payload.len() {
        return Err(Error::format(
            "text stream",
            format!(
                "{} bytes follow the coded data (corrupt or padded stream)",
                payload.len() - dec.position()
            ),
        ));
    }
    Ok(m.p.history().to_vec())
}
