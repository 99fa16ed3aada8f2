//! The text codec: tokens -> integer GPT-2 -> frequencies -> range coder (docs §9).
//!
//! Segments of a fixed token count (stored in the header) are coded independently, each
//! starting from `<|endoftext|>`. Compression runs a batched forward over each window of a
//! segment; decompression runs a group of segments in lockstep, one token of each per step,
//! each with its own KV cache. Both sides compute every table with the same integer code, so
//! the tables are identical by construction.

use super::match_model::MatchModel;
use super::range_coder::{Decoder, Encoder};
use super::tokenizer::{self, EOT};
use crate::backend::lm::{Find, Item, LmSession, Query};
use crate::backend::Device;
use crate::format::lm::model_file::{hex, Model};
use crate::{Error, Result};

pub const MAGIC: &[u8; 8] = b"LSTPTXT1";
pub const VERSION: u32 = 1;
const WHAT: &str = "text stream";
/// Longest segment, in tokens.
pub const MAX_SEGMENT_TOKENS: u32 = 1 << 16;

/// Header flag: the match model is mixed into the frequencies.
pub const FLAG_MATCH: u32 = 1;

#[derive(Clone, Debug)]
pub struct Options {
    /// Tokens per segment; `None` is `n_ctx - 1` (a segment fills the context exactly).
    pub segment_tokens: Option<u32>,
    /// Mix the token match model into the frequencies (default on).
    pub match_model: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            segment_tokens: None,
            match_model: true,
        }
    }
}

/// Header fields of a text stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub model_hash: [u8; 32],
    pub original_len: u64,
    pub original_hash: [u8; 32],
    pub segment_tokens: u32,
    pub flags: u32,
    pub n_tokens: u64,
    /// (tokens, bytes) of each segment
    pub segments: Vec<(u32, u32)>,
}

/// First position of the window that predicts `s[j + 1]` (docs §9): the window slides by
/// `h = c / 2` each time it fills the context `c`.
pub fn window_start(j: usize, c: usize) -> usize {
    let h = (c / 2).max(1);
    if j < c {
        0
    } else {
        ((j - c) / h + 1) * h
    }
}

pub(crate) fn check_model(model: &Model) -> Result<()> {
    if model.config.vocab < tokenizer::VOCAB {
        return Err(Error::Unsupported(format!(
            "the text codec needs GPT-2's {}-token vocabulary; this model has {}",
            tokenizer::VOCAB,
            model.config.vocab
        )));
    }
    Ok(())
}

/// `(cum, freq)` of every token of one segment under the model (the encoder's side), on a
/// session of `model` whose sequence 0 this uses (and clears).
pub fn segment_intervals(
    lm: &mut dyn LmSession,
    model: &Model,
    seg: &[u32],
    use_match: bool,
) -> Result<Vec<(u64, u64)>> {
    let c = model.config.n_ctx as usize;
    let mut s = Vec::with_capacity(seg.len() + 1);
    s.push(EOT);
    s.extend_from_slice(seg);
    let last = s.len() - 1; // predictions j in [0, last)
                            // The match model's predictions, in order (it only needs the tokens).
    let mut preds = vec![None; last];
    if use_match {
        let mut mm = MatchModel::new();
        mm.update(&s[..1]);
        for (j, p) in preds.iter_mut().enumerate() {
            *p = mm.predict(&s[..=j]);
            mm.update(&s[..j + 2]);
        }
    }
    let mut out = Vec::with_capacity(seg.len());
    let mut j = 0;
    while j < last {
        let a = window_start(j, c);
        // all j' >= j with the same window start
        let mut end = j;
        while end < last && window_start(end, c) == a {
            end += 1;
        }
        lm.clear(0)?;
        let items: Vec<Item> = (a..end)
            .map(|p| Item {
                seq: 0,
                token: s[p],
                query: (p >= j).then(|| Query {
                    find: Find::Symbol(s[p + 1]),
                    mix: preds[p],
                }),
            })
            .collect();
        out.extend(lm.step(&items)?.into_iter().map(|c| (c.cum, c.freq)));
        j = end;
    }
    Ok(out)
}

/// [`segment_intervals`] of several segments in one step, segment `i` as sequence `i` of
/// `lm`, for segments that fit one window (`seg.len() < n_ctx`: every prediction sees its
/// whole segment, so a segment is one batch of positions either way). Each item is the one
/// `segment_intervals` would run, so the intervals are the same integers.
pub fn batch_intervals(
    lm: &mut dyn LmSession,
    model: &Model,
    segs: &[&[u32]],
    use_match: bool,
) -> Result<Vec<Vec<(u64, u64)>>> {
    let c = model.config.n_ctx as usize;
    let mut items = Vec::new();
    for (i, seg) in segs.iter().enumerate() {
        if seg.len() >= c {
            return Err(Error::Invalid(format!(
                "batch_intervals: a segment of {} tokens does not fit one window of {c}",
                seg.len()
            )));
        }
        let mut s = Vec::with_capacity(seg.len() + 1);
        s.push(EOT);
        s.extend_from_slice(seg);
        let mut mm = use_match.then(|| {
            let mut m = MatchModel::new();
            m.update(&s[..1]);
            m
        });
        lm.clear(i)?;
        for p in 0..seg.len() {
            let mix = mm.as_mut().and_then(|m| {
                let pred = m.predict(&s[..=p]);
                m.update(&s[..p + 2]);
                pred
            });
            items.push(Item {
                seq: i,
                token: s[p],
                query: Some(Query {
                    find: Find::Symbol(s[p + 1]),
                    mix,
                }),
            });
        }
    }
    let mut coded = lm.step(&items)?.into_iter().map(|c| (c.cum, c.freq));
    Ok(segs
        .iter()
        .map(|seg| coded.by_ref().take(seg.len()).collect())
        .collect())
}

/// Which pass a progress report is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Coding the tokens (the first pass of `compress`).
    Compress,
    /// The decode `compress` runs before it returns, to check the stream.
    Verify,
    /// `decompress`.
    Decompress,
}

/// Progress callback: (pass, tokens done, tokens in all). Called from the calling thread
/// between steps; it never changes the bytes.
pub type Progress<'a> = &'a dyn Fn(Pass, u64, u64);

fn no_progress(_: Pass, _: u64, _: u64) {}

/// Compress without the verifying decode (used by benches; `compress` is the public path).
pub fn compress_unverified(
    model: &Model,
    data: &[u8],
    opts: &Options,
    device: &Device,
) -> Result<Vec<u8>> {
    compress_unverified_with(model, data, opts, device, &no_progress)
}

fn compress_unverified_with(
    model: &Model,
    data: &[u8],
    opts: &Options,
    device: &Device,
    progress: Progress,
) -> Result<Vec<u8>> {
    check_model(model)?;
    let c = model.config.n_ctx;
    let seg_len = opts.segment_tokens.unwrap_or(c - 1);
    if seg_len == 0 || seg_len > 1 << 20 {
        return Err(Error::Invalid(format!(
            "segment length {seg_len} (1..=2^20)"
        )));
    }
    // Segments that fit one window run several to a step where the device wants that.
    let kernels = device.lm()?;
    let one_window = seg_len < c;
    let positions = match one_window {
        true => seg_len as usize + 1,
        false => c as usize,
    };
    let per_step = match one_window {
        true => kernels.compress_sequences(model, positions).max(1),
        false => 1,
    };
    let mut lm = kernels.load(model, per_step, positions)?;
    let tokens = tokenizer::encode(data)?;
    let mut payloads = Vec::new();
    let mut segments = Vec::new();
    let (mut done, total) = (0u64, tokens.len() as u64);
    progress(Pass::Compress, 0, total);
    let segs: Vec<&[u32]> = tokens.chunks(seg_len as usize).collect();
    for group in segs.chunks(per_step) {
        let ivs = match one_window {
            true => batch_intervals(lm.as_mut(), model, group, opts.match_model)?,
            false => vec![segment_intervals(
                lm.as_mut(),
                model,
                group[0],
                opts.match_model,
            )?],
        };
        for (seg, iv) in group.iter().zip(ivs) {
            done += seg.len() as u64;
            let mut enc = Encoder::new();
            for (cum, f) in iv {
                enc.encode(cum, f);
            }
            let bytes = enc.finish();
            segments.push((seg.len() as u32, bytes.len() as u32));
            payloads.push(bytes);
        }
        progress(Pass::Compress, done, total);
    }
    let header = Header {
        model_hash: model.hash,
        original_len: data.len() as u64,
        original_hash: *blake3::hash(data).as_bytes(),
        segment_tokens: seg_len,
        flags: if opts.match_model { FLAG_MATCH } else { 0 },
        n_tokens: tokens.len() as u64,
        segments,
    };
    let mut out = write_header(&header);
    for p in payloads {
        out.extend_from_slice(&p);
    }
    Ok(out)
}

/// Compress `data`, then decompress the result and compare bytes before returning it.
pub fn compress(model: &Model, data: &[u8], opts: &Options, device: &Device) -> Result<Vec<u8>> {
    compress_with(model, data, opts, device, &no_progress)
}

/// [`compress`], reporting progress (the coding pass, then the verifying decode).
pub fn compress_with(
    model: &Model,
    data: &[u8],
    opts: &Options,
    device: &Device,
    progress: Progress,
) -> Result<Vec<u8>> {
    let out = compress_unverified_with(model, data, opts, device, progress)?;
    // Our own output, of an input we were given: no limit on what it may decode to.
    let back = decompress_pass(model, &out, device, Pass::Verify, u64::MAX, progress)?;
    if back != data {
        return Err(Error::Mismatch(
            "verification decode differs from the input; nothing written".into(),
        ));
    }
    Ok(out)
}

pub fn write_header(h: &Header) -> Vec<u8> {
    let mut o = Vec::new();
    o.extend_from_slice(MAGIC);
    o.extend_from_slice(&VERSION.to_le_bytes());
    o.extend_from_slice(&h.model_hash);
    o.extend_from_slice(&h.original_len.to_le_bytes());
    o.extend_from_slice(&h.original_hash);
    o.extend_from_slice(&h.segment_tokens.to_le_bytes());
    o.extend_from_slice(&h.flags.to_le_bytes());
    o.extend_from_slice(&h.n_tokens.to_le_bytes());
    o.extend_from_slice(&(h.segments.len() as u32).to_le_bytes());
    for &(t, b) in &h.segments {
        o.extend_from_slice(&t.to_le_bytes());
        o.extend_from_slice(&b.to_le_bytes());
    }
    let crc = crc32fast::hash(&o);
    o.extend_from_slice(&crc.to_le_bytes());
    o
}

/// Parse and validate a stream header; returns it and the payload offset.
pub fn read_header(d: &[u8]) -> Result<(Header, usize)> {
    let trunc = || Error::format(WHAT, "truncated header");
    let get = |p: usize, n: usize| d.get(p..p + n).ok_or_else(trunc);
    if d.len() < 8 || &d[..8] != MAGIC {
        return Err(Error::format(
            WHAT,
            "not a lockstep text stream (bad magic)",
        ));
    }
    let u32_at =
        |p: usize| -> Result<u32> { Ok(u32::from_le_bytes(get(p, 4)?.try_into().unwrap())) };
    let u64_at =
        |p: usize| -> Result<u64> { Ok(u64::from_le_bytes(get(p, 8)?.try_into().unwrap())) };
    let version = u32_at(8)?;
    if version != VERSION {
        return Err(Error::Unsupported(format!("text stream version {version}")));
    }
    let mut model_hash = [0u8; 32];
    model_hash.copy_from_slice(get(12, 32)?);
    let original_len = u64_at(44)?;
    let mut original_hash = [0u8; 32];
    original_hash.copy_from_slice(get(52, 32)?);
    let segment_tokens = u32_at(84)?;
    let flags = u32_at(88)?;
    let n_tokens = u64_at(92)?;
    let n_seg = u32_at(100)? as usize;
    let table_end = 104usize
        .checked_add(n_seg.checked_mul(8).ok_or_else(trunc)?)
        .ok_or_else(trunc)?;
    if table_end + 4 > d.len() {
        return Err(trunc());
    }
    let stored = u32_at(table_end)?;
    let computed = crc32fast::hash(&d[..table_end]);
    if stored != computed {
        return Err(Error::checksum32(
            "text stream header (CRC-32)",
            stored,
            computed,
        ));
    }
    let segments: Vec<(u32, u32)> = (0..n_seg)
        .map(|i| Ok((u32_at(104 + 8 * i)?, u32_at(108 + 8 * i)?)))
        .collect::<Result<_>>()?;
    let bad = |s: String| Err(Error::format(WHAT, s));
    if segment_tokens == 0 || segment_tokens > MAX_SEGMENT_TOKENS {
        return bad(format!("segment length {segment_tokens}"));
    }
    if flags & !FLAG_MATCH != 0 {
        return Err(Error::Unsupported(format!("text stream flags {flags:#x}")));
    }
    if n_tokens > original_len {
        return bad("more tokens than bytes".into());
    }
    if n_seg as u64 != n_tokens.div_ceil(segment_tokens as u64) {
        return bad("segment count does not match the token count".into());
    }
    let mut left = n_tokens;
    for &(t, _) in &segments {
        let expect = left.min(segment_tokens as u64);
        if t as u64 != expect {
            return bad("segment token count".into());
        }
        left -= expect;
    }
    let payload: u64 = segments.iter().map(|&(_, b)| b as u64).sum();
    let start = table_end + 4;
    if payload != (d.len() - start) as u64 {
        return bad(format!(
            "payload is {} bytes, the header says {payload} (truncated or padded)",
            d.len() - start
        ));
    }
    Ok((
        Header {
            model_hash,
            original_len,
            original_hash,
            segment_tokens,
            flags,
            n_tokens,
            segments,
        },
        start,
    ))
}

/// The text length a stream of either version declares (0 when its header is unreadable).
pub fn declared_len(d: &[u8]) -> u64 {
    if super::cm::stream::is_v2(d) {
        super::cm::stream::read_header(d).map_or(0, |(h, _)| h.original_len)
    } else {
        read_header(d).map_or(0, |(h, _)| h.original_len)
    }
}

struct SegState<'a> {
    s: Vec<u32>,
    target: usize,
    dec: Decoder<&'a [u8]>,
    mm: Option<MatchModel>,
}

/// Default for the most bytes a stream may decode to: 64 times its own size, at least 16 KiB.
/// The model costs work per token and a token is at least a byte, so this bounds the work a
/// small file can ask for; real text compresses 3-10 times, repetitive logs a few times more.
/// `--max-size` raises it for the legal exceptions.
pub fn default_max_output(stream_len: u64) -> u64 {
    stream_len.saturating_mul(64).max(16 << 10)
}

/// Decompress a stream written with this model, within [`default_max_output`].
pub fn decompress(model: &Model, data: &[u8], device: &Device) -> Result<Vec<u8>> {
    decompress_pass(
        model,
        data,
        device,
        Pass::Decompress,
        default_max_output(data.len() as u64),
        &no_progress,
    )
}

/// [`decompress`], refusing (before any model work) a stream that declares more than
/// `max_output` bytes.
pub fn decompress_limited(
    model: &Model,
    data: &[u8],
    max_output: u64,
    device: &Device,
) -> Result<Vec<u8>> {
    decompress_pass(
        model,
        data,
        device,
        Pass::Decompress,
        max_output,
        &no_progress,
    )
}

/// [`decompress_limited`], reporting progress.
pub fn decompress_with(
    model: &Model,
    data: &[u8],
    max_output: u64,
    device: &Device,
    progress: Progress,
) -> Result<Vec<u8>> {
    decompress_pass(model, data, device, Pass::Decompress, max_output, progress)
}

fn decompress_pass(
    model: &Model,
    data: &[u8],
    device: &Device,
    pass: Pass,
    max_output: u64,
    progress: Progress,
) -> Result<Vec<u8>> {
    if super::cm::stream::is_v2(data) {
        return super::cm::stream::decompress(model, data, device, pass, max_output, progress);
    }
    let (h, start) = read_header(data)?;
    if h.original_len > max_output {
        return Err(Error::Limit(format!(
            "the text stream declares {} B of text ({} tokens), over the limit of {max_output} \
             B (by default 64 times the stream's size, at least 16 KiB, so that a small damaged \
             or forged file cannot ask for hours of model work); pass --max-size {} if the \
             file is yours",
            h.original_len, h.n_tokens, h.original_len
        )));
    }
    if h.model_hash != model.hash {
        return Err(Error::Mismatch(format!(
            "stream was compressed with model {}, but the model given is {}",
            hex(&h.model_hash),
            model.hash_hex()
        )));
    }
    check_model(model)?;
    let mut payloads = Vec::with_capacity(h.segments.len());
    let mut p = start;
    for &(_, b) in &h.segments {
        payloads.push(&data[p..p + b as usize]);
        p += b as usize;
    }
    let c = model.config.n_ctx as usize;
    let positions = (h.segment_tokens as usize + 1).min(c);
    let group = device.lm()?.lockstep_sequences(model, positions);
    // The header's counts are not trusted for allocation sizes.
    let mut tokens = Vec::with_capacity((h.n_tokens as usize).min(data.len().saturating_mul(8)));
    let total: u64 = h.segments.iter().map(|&(t, _)| t as u64).sum();
    progress(pass, 0, total);
    // One session for every group: its weights are prepared and its caches mapped once.
    let mut lm = device
        .lm()?
        .load(model, group.min(payloads.len()).max(1), positions)?;
    for (gi, chunk) in payloads.chunks(group).enumerate() {
        let segs = &h.segments[gi * group..gi * group + chunk.len()];
        let base = tokens.len() as u64;
        let report = |n: u64| progress(pass, base + n, total);
        let use_match = h.flags & FLAG_MATCH != 0;
        let dec = decode_group(lm.as_mut(), model, chunk, segs, use_match, &report)?;
        for s in dec {
            tokens.extend_from_slice(&s[1..]);
        }
    }
    let out = tokenizer::decode(&tokens)?;
    if out.len() as u64 != h.original_len || blake3::hash(&out).as_bytes() != &h.original_hash {
        return Err(Error::format(
            WHAT,
            "decoded bytes do not match the stored length/hash (corrupt stream)",
        ));
    }
    Ok(out)
}

fn decode_group(
    lm: &mut dyn LmSession,
    model: &Model,
    payloads: &[&[u8]],
    segs: &[(u32, u32)],
    use_match: bool,
    progress: &dyn Fn(u64),
) -> Result<Vec<Vec<u32>>> {
    let mut decoded = 0u64;
    let c = model.config.n_ctx as usize;
    for seq in 0..payloads.len() {
        lm.clear(seq)?;
    }
    let mut st: Vec<SegState> = payloads
        .iter()
        .zip(segs)
        .map(|(p, &(t, _))| SegState {
            s: vec![EOT],
            target: t as usize + 1,
            dec: Decoder::new(p),
            mm: use_match.then(|| {
                let mut m = MatchModel::new();
                m.update(&[EOT]);
                m
            }),
        })
        .collect();
    loop {
        let mut items = Vec::new();
        let mut who = Vec::new();
        for (i, s) in st.iter().enumerate() {
            if s.s.len() >= s.target {
                continue;
            }
            let j = s.s.len() - 1;
            let a = window_start(j, c);
            if j >= c && (j - c).is_multiple_of((c / 2).max(1)) {
                lm.clear(i)?;
                for p in a..j {
                    items.push(Item {
                        seq: i,
                        token: s.s[p],
                        query: None,
                    });
                }
            }
            items.push(Item {
                seq: i,
                token: s.s[j],
                query: Some(Query {
                    find: Find::Target(s.dec.target()),
                    mix: s.mm.as_ref().and_then(|m| m.predict(&s.s)),
                }),
            });
            who.push(i);
        }
        if who.is_empty() {
            break;
        }
        let coded = lm.step(&items)?;
        // One symbol per active segment: the device found it, the coder consumes it.
        let active = st.iter_mut().filter(|s| s.s.len() < s.target);
        active.zip(coded).try_for_each(|(s, c)| -> Result<()> {
            let sym = c.symbol;
            s.dec.consume(c.cum, c.freq);
            // The decoder reads exactly the bytes the encoder wrote: needing more means
            // the segment is corrupt or cut short. Stop now, not after all its tokens.
            if s.dec.overrun() > 0 {
                return Err(Error::format(
                    WHAT,
                    format!(
                        "a segment's coded bytes end after {} of its {} tokens (corrupt or \
                             truncated stream)",
                        s.s.len() - 1,
                        s.target - 1
                    ),
                ));
            }
            s.s.push(sym);
            if let Some(m) = s.mm.as_mut() {
                m.update(&s.s);
            }
            Ok(())
        })?;
        decoded += who.len() as u64;
        progress(decoded);
    }
    Ok(st.into_iter().map(|s| s.s).collect())
}
