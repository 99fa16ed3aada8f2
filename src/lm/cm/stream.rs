//! Stream version 2 (docs/INTEGER_GPT2.md §13.4): the context-mixing coding of the whole
//! input in order, or the input stored as it is when coding would not make it smaller.
//!
//! ```text
//! "LSTPTXT1" | version u32 = 2 | mode u8 | flags u8 | original_len u64 | blake3 [32]
//!            | model hash [32] (only with FLAG_LM)
//!            | block length u32, coded length u32 per block (only with FLAG_BLOCKS)
//!            | strand count u32 (only with FLAG_STRANDS)
//!            | CRC-32 of all the above | payload
//! ```
//! Mode 0 (stored): the payload is the input. Mode 1 (mixed): the payload is the range coder's
//! output; with FLAG_BLOCKS, the input cut into blocks of the block length (the last one
//! shorter), each coded on its own, one after the other; with FLAG_STRANDS, the input coded
//! as that many strands interleaved (`strands.rs`). Integers are little-endian. A stored
//! stream is 58 bytes longer than its input.

use super::super::text_codec::{Pass, Progress, MAGIC};
use super::coder::{decode, decode_blocks, encode, Setup};
use super::strands::{self, decode_strands, encode_strands, encode_strands_verified, MAX_STRANDS};
use crate::backend::Device;
use crate::format::lm::model_file::{hex, Model};
use crate::{Error, Result};

pub const VERSION: u32 = 2;
const WHAT: &str = "text stream";

/// The input as it is.
pub const MODE_STORED: u8 = 0;
/// The context-mixing coder's output.
pub const MODE_MIXED: u8 = 1;
/// Mode 1 flag: the language model is one of the mixer's inputs (its hash follows).
pub const FLAG_LM: u8 = 1;
/// Mode 1 flag: the byte match model is one of the mixer's inputs.
pub const FLAG_MATCH: u8 = 2;
/// Mode 1 flag: the input is coded in independent blocks (their lengths follow), so the
/// decoder can run them in lockstep, the LM's calls of every block batched.
pub const FLAG_BLOCKS: u8 = 4;
/// Mode 1 flag (with FLAG_LM, without FLAG_BLOCKS): the input is coded as strands that share
/// the models and the range coder (their count follows), so the decoder batches their LM
/// calls.
pub const FLAG_STRANDS: u8 = 8;

/// Bytes per strand the compressor aims at by default: an input shorter than twice this is
/// one strand. Measured on the held-out prose (docs/BENCHMARKS.md, "strands"): 5 strands
/// decoded at 0.73 of version 1's speed (user time), 16 at 0.87-0.94, 32 at 1.07, for
/// +0.6%, +1.0% and +1.5% in size.
pub const STRAND_BYTES: u64 = 1 << 10;
/// Most strands the compressor chooses by default.
pub const AUTO_STRANDS: usize = 32;

/// Block length the compressor uses with the LM by default: inputs up to this length are one
/// block. Each block relearns the file from nothing: a block boundary cost about 350 bytes on
/// English (docs/BENCHMARKS.md, "Blocks"), about 2.7% of a 64 KiB block of prose.
pub const BLOCK_LEN: u32 = 64 << 10;

#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Mix the language model in (off: the adaptive models alone, much faster).
    pub lm: bool,
    /// Mix the byte match model in.
    pub match_model: bool,
    /// With the LM and one strand, code the input in independent blocks of this many bytes
    /// (at least 1), so that decoding batches them; an input up to this length is one block.
    pub block_len: u32,
    /// With the LM, the number of strands: `None` chooses from the length (one per
    /// [`STRAND_BYTES`], at most [`AUTO_STRANDS`]); 1 codes in order (or in blocks).
    pub strands: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            lm: true,
            match_model: true,
            block_len: BLOCK_LEN,
            strands: None,
        }
    }
}

/// The strands the compressor uses for `len` bytes: `asked`, or one per [`STRAND_BYTES`] up
/// to [`AUTO_STRANDS`]; never more than the model allows, at least 1.
pub fn strand_count(len: u64, asked: Option<usize>, model: &Model) -> usize {
    let auto = (len / STRAND_BYTES).min(AUTO_STRANDS as u64) as usize;
    asked.unwrap_or(auto).clamp(1, strands::max_strands(model))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub mode: u8,
    pub flags: u8,
    pub original_len: u64,
    pub original_hash: [u8; 32],
    /// Present exactly when `flags` has FLAG_LM.
    pub model_hash: Option<[u8; 32]>,
    /// Present exactly when `flags` has FLAG_BLOCKS.
    pub blocks: Option<Blocks>,
    /// The strand count, present exactly when `flags` has FLAG_STRANDS.
    pub strands: Option<u32>,
}

/// How the input is cut: blocks of `len` bytes (the last one shorter), and the coded length
/// of each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocks {
    pub len: u32,
    pub coded: Vec<u32>,
}

pub fn write_header(h: &Header) -> Vec<u8> {
    let mut o = Vec::with_capacity(94);
    o.extend_from_slice(MAGIC);
    o.extend_from_slice(&VERSION.to_le_bytes());
    o.push(h.mode);
    o.push(h.flags);
    o.extend_from_slice(&h.original_len.to_le_bytes());
    o.extend_from_slice(&h.original_hash);
    if let Some(m) = &h.model_hash {
        o.extend_from_slice(m);
    }
    if let Some(b) = &h.blocks {
        o.extend_from_slice(&b.len.to_le_bytes());
        for c in &b.coded {
            o.extend_from_slice(&c.to_le_bytes());
        }
    }
    if let Some(s) = h.strands {
        o.extend_from_slice(&s.to_le_bytes());
    }
    let crc = crc32fast::hash(&o);
    o.extend_from_slice(&crc.to_le_bytes());
    o
}

/// Whether `d` starts like a version-2 stream (magic and version; nothing else checked).
pub fn is_v2(d: &[u8]) -> bool {
    d.len() >= 12 && &d[..8] == MAGIC && d[8..12] == VERSION.to_le_bytes()
}

/// Parse and check a version-2 header; returns it and the payload offset.
pub fn read_header(d: &[u8]) -> Result<(Header, usize)> {
    let trunc = || Error::format(WHAT, "truncated header");
    if !is_v2(d) {
        return Err(Error::format(WHAT, "not a version-2 lockstep text stream"));
    }
    let get = |p: usize, n: usize| d.get(p..p + n).ok_or_else(trunc);
    let mode = get(12, 1)?[0];
    let flags = get(13, 1)?[0];
    let original_len = u64::from_le_bytes(get(14, 8)?.try_into().unwrap());
    let original_hash: [u8; 32] = get(22, 32)?.try_into().unwrap();
    let mut p = 54;
    let model_hash = if flags & FLAG_LM != 0 {
        p += 32;
        Some(get(54, 32)?.try_into().unwrap())
    } else {
        None
    };
    let blocks = if flags & FLAG_BLOCKS != 0 {
        let len = u32::from_le_bytes(get(p, 4)?.try_into().unwrap());
        if len == 0 {
            return Err(Error::format(WHAT, "block length 0"));
        }
        // The count follows from the length; the table must be in the file before anything
        // is allocated for it.
        let count = original_len.div_ceil(len as u64);
        let table = count
            .checked_mul(4)
            .and_then(|b| usize::try_from(b).ok())
            .and_then(|b| d.get(p + 4..(p + 4).checked_add(b)?))
            .ok_or_else(trunc)?;
        p += 4 + table.len();
        Some(Blocks {
            len,
            coded: table
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        })
    } else {
        None
    };
    let strands = if flags & FLAG_STRANDS != 0 {
        let count = u32::from_le_bytes(get(p, 4)?.try_into().unwrap());
        p += 4;
        Some(count)
    } else {
        None
    };
    let stored = u32::from_le_bytes(get(p, 4)?.try_into().unwrap());
    let computed = crc32fast::hash(&d[..p]);
    if stored != computed {
        return Err(Error::checksum32(
            "text stream header (CRC-32)",
            stored,
            computed,
        ));
    }
    let start = p + 4;
    match mode {
        MODE_STORED => {
            if flags != 0 {
                return Err(Error::format(
                    WHAT,
                    format!("stored mode with flags {flags:#x}"),
                ));
            }
            if (d.len() - start) as u64 != original_len {
                return Err(Error::format(
                    WHAT,
                    format!(
                        "stored payload is {} bytes, the header says {original_len}",
                        d.len() - start
                    ),
                ));
            }
        }
        MODE_MIXED => {
            if flags & !(FLAG_LM | FLAG_MATCH | FLAG_BLOCKS | FLAG_STRANDS) != 0 {
                return Err(Error::Unsupported(format!("text stream flags {flags:#x}")));
            }
            if let Some(count) = strands {
                if flags & FLAG_LM == 0 || flags & FLAG_BLOCKS != 0 {
                    return Err(Error::format(
                        WHAT,
                        format!("strands with flags {flags:#x} (they need the LM, not blocks)"),
                    ));
                }
                if !(2..=MAX_STRANDS as u32).contains(&count) {
                    return Err(Error::format(
                        WHAT,
                        format!("{count} strands (a stream has 2 to {MAX_STRANDS})"),
                    ));
                }
            }
            if let Some(b) = &blocks {
                let coded: u64 = b.coded.iter().map(|&c| c as u64).sum();
                if coded != (d.len() - start) as u64 {
                    return Err(Error::format(
                        WHAT,
                        format!(
                            "the blocks' coded lengths add up to {coded} bytes, the payload is {}",
                            d.len() - start
                        ),
                    ));
                }
            }
        }
        m => return Err(Error::Unsupported(format!("text stream mode {m}"))),
    }
    Ok((
        Header {
            mode,
            flags,
            original_len,
            original_hash,
            model_hash,
            blocks,
            strands,
        },
        start,
    ))
}

fn no_progress(_: Pass, _: u64, _: u64) {}

/// Compress without the verifying decode.
pub fn compress_unverified(
    model: &Model,
    data: &[u8],
    opts: &Options,
    device: &Device,
    progress: Progress,
) -> Result<Vec<u8>> {
    Ok(code_input(model, data, opts, device, progress, false)?.0)
}

/// The stream of `data`, and whether its payload was verified on the way: where `verify`
/// and the strands' stream is the one kept, a decoder ran beside the encoder
/// ([`strands::encode_strands_verified`]) and gave `data` back.
fn code_input(
    model: &Model,
    data: &[u8],
    opts: &Options,
    device: &Device,
    progress: Progress,
    verify: bool,
) -> Result<(Vec<u8>, bool)> {
    super::super::text_codec::check_model(model)?;
    let header = |mode, flags: u8, blocks, strands| Header {
        mode,
        flags,
        original_len: data.len() as u64,
        original_hash: *blake3::hash(data).as_bytes(),
        model_hash: (flags & FLAG_LM != 0).then_some(model.hash),
        blocks,
        strands,
    };
    let match_flag = if opts.match_model { FLAG_MATCH } else { 0 };
    // The adaptive models alone first: they cost little, and where they cannot shrink the
    // input (binary, already compressed) the LM would not either, so it is not run.
    let alone = Setup {
        lm: None,
        match_model: opts.match_model,
    };
    let (alone, _) = encode(data, alone, &|_, _| {})?;
    if alone.len() >= data.len() {
        let mut out = write_header(&header(MODE_STORED, 0, None, None));
        out.extend_from_slice(data);
        return Ok((out, false));
    }
    let mut best = write_header(&header(MODE_MIXED, match_flag, None, None));
    best.extend_from_slice(&alone);
    let mut verified = false;
    if opts.lm {
        let with = Setup {
            lm: Some((model, device.lm()?)),
            match_model: opts.match_model,
        };
        let count = strand_count(data.len() as u64, opts.strands, model);
        let report = |d, _| progress(Pass::Compress, d, data.len() as u64);
        let (out, checked) = if count > 1 {
            let (payload, _) = match verify {
                true => encode_strands_verified(data, count, with, &report)?,
                false => encode_strands(data, count, with, &report)?,
            };
            let flags = match_flag | FLAG_LM | FLAG_STRANDS;
            let mut out = write_header(&header(MODE_MIXED, flags, None, Some(count as u32)));
            out.extend_from_slice(&payload);
            (out, verify)
        } else {
            let out = blocks_stream(data, opts.block_len, with, match_flag, &header, progress)?;
            (out, false)
        };
        // The LM costs a 32-byte hash (and a block table or strand count) in the header; keep
        // it only where it pays for that.
        if out.len() < best.len() {
            best = out;
            verified = checked;
        }
    }
    Ok((best, verified))
}

/// The input coded with the LM in one block or in independent blocks of `block_len` bytes.
fn blocks_stream(
    data: &[u8],
    block_len: u32,
    with: Setup,
    match_flag: u8,
    header: &dyn Fn(u8, u8, Option<Blocks>, Option<u32>) -> Header,
    progress: Progress,
) -> Result<Vec<u8>> {
    // Blocks, each coded on its own, so that the decoder can batch them.
    let block_len = block_len.max(1);
    let parts: Vec<&[u8]> = data.chunks(block_len as usize).collect();
    let mut payload = Vec::new();
    let mut coded = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let base = i as u64 * block_len as u64;
        let (c, _) = encode(part, with, &|d, _| {
            progress(Pass::Compress, base + d, data.len() as u64)
        })?;
        coded.push(
            u32::try_from(c.len())
                .map_err(|_| Error::Limit("a block's coded length does not fit 32 bits".into()))?,
        );
        payload.extend_from_slice(&c);
    }
    let blocks = (parts.len() > 1).then_some(Blocks {
        len: block_len,
        coded,
    });
    let flags = match_flag | FLAG_LM | if blocks.is_some() { FLAG_BLOCKS } else { 0 };
    let mut out = write_header(&header(MODE_MIXED, flags, blocks, None));
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Compress `data`, then decompress the result and compare bytes before returning it.
pub fn compress(
    model: &Model,
    data: &[u8],
    opts: &Options,
    device: &Device,
    progress: Progress,
) -> Result<Vec<u8>> {
    let (out, verified) = code_input(model, data, opts, device, progress, true)?;
    if verified {
        // The payload decoded to `data` beside the encoder; what is left to check is that
        // the header reads back and leads a decoder to that payload as strands.
        let (h, _) = read_header(&out)?;
        let strands = h.strands.map(|s| s as usize);
        let want = strand_count(data.len() as u64, opts.strands, model);
        let match_flag = if opts.match_model { FLAG_MATCH } else { 0 };
        if h.mode != MODE_MIXED
            || h.flags != match_flag | FLAG_LM | FLAG_STRANDS
            || h.original_len != data.len() as u64
            || h.original_hash != *blake3::hash(data).as_bytes()
            || h.model_hash != Some(model.hash)
            || strands != Some(want)
        {
            return Err(Error::Mismatch(
                "verification: the stream's header differs from what was coded; nothing \
                 written"
                    .into(),
            ));
        }
        return Ok(out);
    }
    let back = decompress(model, &out, device, Pass::Verify, u64::MAX, progress)?;
    if back != data {
        return Err(Error::Mismatch(
            "verification decode differs from the input; nothing written".into(),
        ));
    }
    Ok(out)
}

/// Decompress a version-2 stream; refuses (before any work) one that declares more than
/// `max_output` bytes.
pub fn decompress(
    model: &Model,
    data: &[u8],
    device: &Device,
    pass: Pass,
    max_output: u64,
    progress: Progress,
) -> Result<Vec<u8>> {
    let (h, start) = read_header(data)?;
    if h.original_len > max_output {
        return Err(Error::Limit(format!(
            "the text stream declares {} B of text, over the limit of {max_output} B (by \
             default 64 times the stream's size, at least 16 KiB, so that a small damaged or \
             forged file cannot ask for hours of model work); pass --max-size {} if the file \
             is yours",
            h.original_len, h.original_len
        )));
    }
    let payload = &data[start..];
    let out = match h.mode {
        MODE_STORED => payload.to_vec(),
        _ => {
            let lm = match h.model_hash {
                Some(hash) if hash != model.hash => {
                    return Err(Error::Mismatch(format!(
                        "stream was compressed with model {}, but the model given is {}",
                        hex(&hash),
                        model.hash_hex()
                    )))
                }
                Some(_) => {
                    super::super::text_codec::check_model(model)?;
                    Some((model, device.lm()?))
                }
                None => None,
            };
            let setup = Setup {
                lm,
                match_model: h.flags & FLAG_MATCH != 0,
            };
            let report = |d, t| progress(pass, d, t);
            match (&h.blocks, h.strands) {
                (None, Some(count)) => {
                    decode_strands(payload, h.original_len, count as usize, setup, &report)?
                }
                (None, None) => decode(payload, h.original_len, setup, &report)?,
                (Some(b), _) => {
                    let mut parts = Vec::with_capacity(b.coded.len());
                    let (mut at, mut left) = (0usize, h.original_len);
                    for &c in &b.coded {
                        let len = left.min(b.len as u64);
                        parts.push((&payload[at..at + c as usize], len));
                        at += c as usize;
                        left -= len;
                    }
                    decode_blocks(&parts, setup, &report)?
                }
            }
        }
    };
    if blake3::hash(&out).as_bytes() != &h.original_hash {
        return Err(Error::format(
            WHAT,
            "decoded bytes do not match the stored hash (corrupt stream)",
        ));
    }
    Ok(out)
}

/// Compress with no progress reports.
pub fn compress_quiet(
    model: &Model,
    data: &[u8],
    opts: &Options,
    device: &Device,
) -> Result<Vec<u8>> {
    compress(model, data, opts, device, &no_progress)
}
