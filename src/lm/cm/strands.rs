//! Strands (docs/INTEGER_GPT2.md §13.5): the input cut into S contiguous parts that are coded
//! interleaved, so that the decoder's LM calls carry S words at once.
//!
//! Each strand has its own LM context (its own sequence of the LM session, from
//! `<|endoftext|>`) and its own byte contexts, word hashes and match; all strands share the
//! learned statistics (context tables, mixers, APMs, the match model's counters and table, so
//! a strand follows text another strand has already coded) and one range coder. The schedule
//! needs nothing the decoder does not know: every unfinished strand's LM waits for a table;
//! one batched LM call answers them all; then strand 0, 1, ..., S-1 in turn codes bytes until
//! its LM waits again (it finished a word) or it ends; and round again. Encoder and decoder
//! run this same loop ([`code`]), one with the input's bits, the other with the coded ones;
//! the encoder, which knows every strand's words, computes the tables of several rounds in
//! one batch (`strand_tables.rs`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use super::super::range_coder::{Decoder, Encoder, Source};
use super::coder::{Progress, Setup, REPORT_EVERY};
use super::lm_bits::Lm;
use super::predictor::{Parts, Predictor};
use super::strand_tables::{Ahead, PerRound, Tables};
use crate::format::lm::model_file::Model;
use crate::{Error, Result};

/// Most strands a stream may declare.
pub const MAX_STRANDS: usize = 64;
/// Cap on the strands' KV caches together (as the lockstep blocks' groups).
const STRANDS_CACHE_BYTES: usize = 512 << 20;

/// Most strands for `model`: [`MAX_STRANDS`], fewer where their KV caches would pass 512 MiB
/// (a GPT-2-small shape: 7). Encoder and decoder apply the same rule.
pub fn max_strands(model: &Model) -> usize {
    let c = &model.config;
    let kv = (c.n_layer as usize * c.n_ctx as usize * c.n_embd as usize * 8).max(1);
    (STRANDS_CACHE_BYTES / kv).clamp(1, MAX_STRANDS)
}

/// Where each of `count` strands starts in an input of `len` bytes: strand i holds
/// `[⌊i·len/count⌋, ⌊(i+1)·len/count⌋)` (empty when count > len).
pub fn starts(len: u64, count: usize) -> Vec<usize> {
    (0..count)
        .map(|i| (i as u128 * len as u128 / count as u128) as usize)
        .collect()
}

/// The range coder's side of the loop.
trait Bits {
    /// Code bit `k` (7: the most significant) of byte `at` of the input, a 1 having
    /// probability `p / 4096`; returns the bit.
    fn bit(&mut self, p: u64, at: usize, k: u32) -> u32;
    /// After a byte (`done` of `len` coded): an error if the coded bytes ran out.
    fn check(&self, done: u64, len: u64) -> Result<()>;
    /// After a byte: an encoder shows a verifying reader what it has settled.
    fn byte_done(&mut self) {}
    /// The input, where it is known before it is coded (the encoder).
    fn input(&self) -> Option<&[u8]>;
}

struct Enc<'a> {
    data: &'a [u8],
    enc: Encoder,
    /// Where a verifying decoder reads the settled bytes as they come, if one does.
    written: Option<&'a Written>,
}

/// Settled bytes are handed to the verifying reader in pieces of at least this many (one
/// lock per piece); it runs behind the encoder anyway.
const HAND_OVER: usize = 8;

impl Bits for Enc<'_> {
    fn bit(&mut self, p: u64, at: usize, k: u32) -> u32 {
        let y = ((self.data[at] >> k) & 1) as u32;
        if y == 1 {
            self.enc.encode(0, p << 20);
        } else {
            self.enc.encode(p << 20, (4096 - p) << 20);
        }
        y
    }
    fn check(&self, _: u64, _: u64) -> Result<()> {
        Ok(())
    }
    fn input(&self) -> Option<&[u8]> {
        Some(self.data)
    }
    fn byte_done(&mut self) {
        if let Some(w) = self.written {
            let settled = self.enc.settled();
            if settled.len() >= w.seen() + HAND_OVER {
                w.extend(settled);
            }
        }
    }
}

/// The encoder's settled bytes ([`Encoder::settled`]) as a verifying decoder on another
/// thread reads them: the bytes so far, and whether they are all.
#[derive(Default)]
struct Written {
    state: Mutex<(Vec<u8>, bool)>,
    more: Condvar,
    /// How many bytes `state` holds (read by the encoder without the lock's wait).
    seen: AtomicUsize,
}

impl Written {
    fn seen(&self) -> usize {
        self.seen.load(Ordering::Relaxed)
    }

    /// `bytes` (a longer prefix of the stream than before) are settled.
    fn extend(&self, bytes: &[u8]) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let have = s.0.len();
        if bytes.len() > have {
            s.0.extend_from_slice(&bytes[have..]);
            self.seen.store(s.0.len(), Ordering::Relaxed);
            self.more.notify_all();
        }
    }

    /// No more bytes will come (the stream is whole, or the encoder stopped).
    fn end(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.1 = true;
        self.more.notify_all();
    }
}

/// Ends a [`Written`] when dropped: the reader never waits on an encoder that returned early
/// or panicked.
struct EndOnDrop<'w>(&'w Written);

impl Drop for EndOnDrop<'_> {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// A decoder's [`Source`] over a [`Written`]: it waits for each byte until the encoder has
/// settled it or ended.
struct Reading<'w> {
    from: &'w Written,
    /// The bytes taken so far, and whether they are all.
    have: Vec<u8>,
    ended: bool,
}

impl Source for Reading<'_> {
    fn byte(&mut self, pos: usize) -> Option<u8> {
        if pos >= self.have.len() && !self.ended {
            let w = self.from;
            let mut s = w.state.lock().unwrap_or_else(|e| e.into_inner());
            while s.0.len() <= pos && !s.1 {
                s = w.more.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            self.have.extend_from_slice(&s.0[self.have.len()..]);
            self.ended = s.1;
        }
        self.have.get(pos).copied()
    }
    fn past_end(&self, pos: usize) -> usize {
        match self.ended {
            true => pos.saturating_sub(self.have.len()),
            false => 0,
        }
    }
}

/// The decoder's side. Its range decoder, which reads the first 8 coded bytes, is made at
/// the first bit: a verify reading a stream still being written sets up its models and LM
/// session while the encoder codes those bytes, not after.
struct Dec<S: Source> {
    src: Option<S>,
    dec: Option<Decoder<S>>,
}

impl<S: Source> Dec<S> {
    fn new(src: S) -> Self {
        Dec {
            src: Some(src),
            dec: None,
        }
    }

    fn dec(&mut self) -> &mut Decoder<S> {
        let src = &mut self.src;
        self.dec
            .get_or_insert_with(|| Decoder::from_source(src.take().expect("a source")))
    }
}

impl<S: Source> Bits for Dec<S> {
    fn bit(&mut self, p: u64, _: usize, _: u32) -> u32 {
        let dec = self.dec();
        let y = (dec.target() < p << 20) as u32;
        if y == 1 {
            dec.consume(0, p << 20);
        } else {
            dec.consume(p << 20, (4096 - p) << 20);
        }
        y
    }
    fn check(&self, done: u64, len: u64) -> Result<()> {
        // The encoder's last bytes flush its state: needing more means the payload is cut.
        if self.dec.as_ref().is_some_and(|d| d.overrun() > 0) {
            return Err(Error::format(
                "text stream",
                format!(
                    "the coded bytes end after {done} of {len} bytes (corrupt or truncated \
                     stream)"
                ),
            ));
        }
        Ok(())
    }
    fn input(&self) -> Option<&[u8]> {
        None
    }
}

/// Run the strand schedule over `len` bytes in `count` strands, the strands taking their
/// turns in `order` (0..count for a stream); returns the predictor (holding the text) and
/// the tokens the LM ran.
fn code<B: Bits>(
    len: u64,
    count: usize,
    order: &[usize],
    setup: Setup,
    io: &mut B,
    progress: Progress,
) -> Result<(Predictor, u64)> {
    let (model, kernels) = setup
        .lm
        .ok_or_else(|| Error::Invalid("strands need the language model".into()))?;
    let most = max_strands(model);
    if count == 0 || count > most {
        return Err(Error::format(
            "text stream",
            format!("{count} strands, this model allows 1 to {most}"),
        ));
    }
    let starts = starts(len, count);
    let ends: Vec<usize> = starts[1..].iter().copied().chain([len as usize]).collect();
    let lens: Vec<usize> = starts.iter().zip(&ends).map(|(s, e)| e - s).collect();
    let parts = Parts {
        match_model: setup.match_model,
    };
    let mut p = Predictor::with_strands(len, parts, &starts);
    let mut lms: Vec<Lm> = (0..count)
        .map(|_| Lm::for_decoder(model))
        .collect::<Result<_>>()?;
    let mut tables: Box<dyn Tables> = match io.input() {
        Some(data) => {
            let strands: Vec<&[u8]> = starts
                .iter()
                .zip(&ends)
                .map(|(&a, &e)| &data[a..e])
                .collect();
            Box::new(Ahead::new(model, kernels, &strands, most)?)
        }
        None => Box::new(PerRound::new(model, kernels, count)?),
    };
    let (mut total, mut last_report) = (0u64, 0u64);
    loop {
        // Every unfinished strand's LM waits for a table: the source answers them all.
        let mut waiting = Vec::new();
        for (s, lm) in lms.iter_mut().enumerate() {
            let call = lm.take_call();
            if p.done(s) == lens[s] {
                continue;
            }
            if let Some(call) = call {
                waiting.push((s, call));
            }
        }
        if waiting.is_empty() {
            break;
        }
        for ((s, _), table) in waiting.iter().zip(tables.answer(&waiting)?) {
            lms[*s].supply_table(table)?;
        }
        // Each strand in turn codes until its LM waits for the next word's table or it ends.
        for &s in order {
            let lm = &mut lms[s];
            if p.done(s) == lens[s] {
                continue;
            }
            p.select(s);
            while p.done(s) < lens[s] && !lm.waits() {
                let at = starts[s] + p.done(s);
                for k in (0..8).rev() {
                    let (c0, bit) = p.partial();
                    let pr = p.p(lm.p_bit(c0, bit)) as u64;
                    let y = io.bit(pr, at, k);
                    p.update(y);
                }
                io.check(total, len)?;
                io.byte_done();
                total += 1;
                lm.byte(p.history())?;
            }
        }
        if total - last_report >= REPORT_EVERY as u64 {
            progress(total, len);
            last_report = total;
        }
    }
    if (0..count).any(|s| p.done(s) != lens[s]) {
        return Err(Error::Invalid("strands: a strand stopped early".into()));
    }
    let tokens = lms.iter().map(|l| l.tokens).sum();
    Ok((p, tokens))
}

/// Code `data` in `count` strands (1 to [`max_strands`]); returns the coded bytes and the
/// tokens the LM ran. `setup` must have the LM.
pub fn encode_strands(
    data: &[u8],
    count: usize,
    setup: Setup,
    progress: Progress,
) -> Result<(Vec<u8>, u64)> {
    let order: Vec<usize> = (0..count).collect();
    encode_strands_in_order(data, count, &order, setup, progress)
}

/// [`encode_strands`] with the strands taking their turns in `order`. Only `0..count` gives a
/// stream: the decoder follows that schedule, and tests use another order to show that a
/// different schedule cannot pass for it.
#[doc(hidden)]
pub fn encode_strands_in_order(
    data: &[u8],
    count: usize,
    order: &[usize],
    setup: Setup,
    progress: Progress,
) -> Result<(Vec<u8>, u64)> {
    let mut io = Enc {
        data,
        enc: Encoder::new(),
        written: None,
    };
    let (_, tokens) = code(data.len() as u64, count, order, setup, &mut io, progress)?;
    Ok((io.enc.finish(), tokens))
}

/// [`encode_strands`], verified: a decoder on a second thread decodes the bytes as the
/// encoder settles them, with its own LM session, and the coded bytes are returned only if
/// it gives back `data` and reads exactly them. The pool's threads are shared out between
/// the two (one each on two cores), so each run's LM steps stay on its own threads: the
/// verify takes the second core the encoder's steps used, and costs little wall time
/// beyond the encode.
pub fn encode_strands_verified(
    data: &[u8],
    count: usize,
    setup: Setup,
    progress: Progress,
) -> Result<(Vec<u8>, u64)> {
    let threads = rayon::current_num_threads();
    if threads < 2 {
        // One thread asked for: the verify after the encode, on it.
        let (bytes, tokens) = encode_strands(data, count, setup, progress)?;
        return match decode_from(&bytes[..], data.len() as u64, count, setup, &|_, _| {}) {
            Ok((text, read)) if text == data && read == bytes.len() => Ok((bytes, tokens)),
            Ok(_) | Err(_) => Err(Error::Mismatch(
                "verification decode differs from the input; nothing written".into(),
            )),
        };
    }
    let pool = |n: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build()
            .map_err(|e| Error::Invalid(format!("a thread pool for the verify: {e}")))
    };
    let (encoding, verifying) = (pool(threads.div_ceil(2))?, pool(threads / 2)?);
    let written = Written::default();
    let len = data.len() as u64;
    // The encoder's progress, reported from this thread (the callback need not be Sync).
    let done = AtomicU64::new(0);
    let here = std::thread::current();
    std::thread::scope(|scope| {
        let reader = Reading {
            from: &written,
            have: Vec::new(),
            ended: false,
        };
        let verify = scope.spawn(move || {
            verifying.install(|| decode_from(reader, len, count, setup, &|_, _| {}))
        });
        let (written, done) = (&written, &done);
        let encode = scope.spawn(move || {
            let coded = encoding.install(|| {
                let _end = EndOnDrop(written);
                let mut io = Enc {
                    data,
                    enc: Encoder::new(),
                    written: Some(written),
                };
                let order: Vec<usize> = (0..count).collect();
                let report = |d: u64, _| done.store(d, Ordering::Relaxed);
                code(len, count, &order, setup, &mut io, &report).map(|(_, tokens)| {
                    let bytes = io.enc.finish();
                    written.extend(&bytes);
                    (bytes, tokens)
                })
            });
            here.unpark();
            coded
        });
        let mut told = 0;
        while !encode.is_finished() {
            let d = done.load(Ordering::Relaxed);
            if d != told {
                progress(d, len);
                told = d;
            }
            std::thread::park_timeout(std::time::Duration::from_millis(50));
        }
        let coded = encode
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let back = verify
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let (bytes, tokens) = coded?;
        // The verify read the handed-over copy; it vouches for the output only if that copy
        // is the output, byte for byte (a settled byte that later changed would show here).
        let handed = written.state.lock().unwrap_or_else(|e| e.into_inner()).0 == bytes;
        match back {
            Ok((text, read)) if handed && text == data && read == bytes.len() => {
                Ok((bytes, tokens))
            }
            Ok(_) | Err(_) => Err(Error::Mismatch(
                "verification decode differs from the input; nothing written".into(),
            )),
        }
    })
}

/// Decode `len` bytes coded in `count` strands from `payload`.
pub fn decode_strands(
    payload: &[u8],
    len: u64,
    count: usize,
    setup: Setup,
    progress: Progress,
) -> Result<Vec<u8>> {
    let (text, read) = decode_from(payload, len, count, setup, progress)?;
    // The decoder reads exactly the bytes the encoder wrote: more is padding or damage.
    if read != payload.len() {
        return Err(Error::format(
            "text stream",
            format!(
                "{} bytes follow the coded data (corrupt or padded stream)",
                payload.len() - read
            ),
        ));
    }
    Ok(text)
}

/// Decode `len` bytes coded in `count` strands from `src`; returns them and how many coded
/// bytes the decoder read.
fn decode_from<S: Source>(
    src: S,
    len: u64,
    count: usize,
    setup: Setup,
    progress: Progress,
) -> Result<(Vec<u8>, usize)> {
    let mut io = Dec::new(src);
    let order: Vec<usize> = (0..count).collect();
    let (p, _) = code(len, count, &order, setup, &mut io, progress)?;
    // (Made here where no bit was coded: it reads the 8 bytes every stream ends with.)
    Ok((p.into_text(), io.dec().position()))
}
