//! The anchor codec: standalone (reference-free) lossless coding of one tensor, for the
//! keyframes of a trajectory archive and for tensors that have no predecessor.
//!
//! A float element is split into its exponent field `e`, a *head* made of the sign and the top
//! `t` mantissa bits, and a raw *tail* of the remaining mantissa bits:
//!
//! - stage E codes `e` with static rANS, under the exponent of the previous element as context
//!   (order 1) or under one row (order 0), whichever the integer cost estimate says is smaller;
//! - stage H codes the head under the element's own exponent as context (within a binade the
//!   density of trained weights is not flat, and norms/biases often have one sign), or, for
//!   matrices, under its column and exponent class (embedding rows that moved together share
//!   their leading mantissa bits column by column);
//! - the tail is bit-packed.
//!
//! `t` (0..=4) is chosen per tensor by the same integer cost estimate. Rows are per tensor and
//! pruned: a context keeps its own row only when that pays for the row's bytes. Coding uses the
//! delta codec's chunk geometry ([`CHUNK_ELEMS`] elements, [`LANES`] interleaved rANS states),
//! so chunks encode and decode independently. Non-float tensors go through zstd; anything that
//! does not shrink is stored raw. Every encode is decoded and compared before it is returned.
//!
//! ```
//! use lockstep::anchor;
//! use lockstep::dtype::DType;
//! let values: Vec<u8> = (0..4096u32)
//!     .flat_map(|i| half::bf16::from_f32(((i * 7919 % 1000) as f32 - 500.0) * 1e-4).to_le_bytes())
//!     .collect();
//! let (blob, report) = anchor::encode(DType::BF16, &[64, 64], &values).unwrap();
//! assert!(blob.len() < values.len());
//! assert_eq!(anchor::decode(&blob).unwrap(), values);
//! assert_eq!(report.raw_bytes, values.len() as u64);
//! ```

pub mod table;
pub mod zipnn;

use rayon::prelude::*;

use crate::bytes::{ByteReader, ByteWriter};
use crate::delta::blob::element_count;
use crate::dtype::{DType, FloatLayout};
use crate::entropy::freq::COST_ONE_BIT;
use crate::entropy::rans::{dec_advance, dec_get, enc_put, RANS_L};
use crate::format::bits::{BitReader, BitWriter};
use crate::format::chunk::{chunk_ranges, CHUNK_ELEMS, LANES};
use crate::{Error, Result};
use table::{Hist, Table};

pub const MAGIC: &[u8; 4] = b"LSAB";
pub const VERSION: u8 = 1;
/// Largest number of modeled mantissa bits.
pub const MAX_HEAD_BITS: u32 = 4;
const ZSTD_LEVEL: i32 = 9;
const MAX_NDIM: usize = 32;

/// How an anchor blob's payload is coded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AnchorMode {
    Raw = 0,
    Modeled = 1,
    Zstd = 2,
}

/// What an encode produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnchorReport {
    pub n_elements: u64,
    pub raw_bytes: u64,
    pub blob_bytes: u64,
    pub mode: Option<AnchorMode>,
    /// Modeled mantissa bits (Modeled mode).
    pub head_bits: u32,
    /// What stage E is conditioned on.
    pub context: ExpContext,
    /// What stage H is conditioned on.
    pub head_context: HeadContext,
}

/// The fixed part of an anchor blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnchorHeader {
    pub mode: AnchorMode,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub n_elements: u64,
    /// CRC-32 of the decoded tensor bytes.
    pub crc: u32,
}

/// Encode one tensor standalone into a self-contained, checksummed, verified blob.
pub fn encode(dtype: DType, shape: &[u64], bytes: &[u8]) -> Result<(Vec<u8>, AnchorReport)> {
    let n = element_count(shape)?;
    if shape.len() > MAX_NDIM || n.checked_mul(dtype.size() as u64) != Some(bytes.len() as u64) {
        return Err(Error::Mismatch(format!(
            "tensor of {dtype} {shape:?} cannot hold {} bytes",
            bytes.len()
        )));
    }
    let mut report = AnchorReport {
        n_elements: n,
        raw_bytes: bytes.len() as u64,
        ..Default::default()
    };
    let mut best: Option<(AnchorMode, Vec<u8>)> = None;
    if let Some(fl) = dtype.float_layout().filter(|_| n > 0) {
        let (payload, t, ctx, hctx) = encode_modeled(bytes, fl, shape);
        report.head_bits = t;
        report.context = ctx;
        report.head_context = hctx;
        best = Some((AnchorMode::Modeled, payload));
    } else if !bytes.is_empty() {
        let z = zstd::bulk::compress(bytes, ZSTD_LEVEL)
            .map_err(|e| Error::Invalid(format!("zstd failed: {e}")))?;
        best = Some((AnchorMode::Zstd, z));
    }
    let (mode, payload) = match best {
        Some((m, p)) if p.len() < bytes.len() => (m, p),
        _ => (AnchorMode::Raw, bytes.to_vec()),
    };
    let mut w = ByteWriter::new();
    w.bytes(MAGIC);
    w.u8(VERSION);
    w.u8(mode as u8);
    w.u8(dtype.code());
    w.u8(shape.len() as u8);
    for &d in shape {
        w.varint(d);
    }
    w.u32(crc32fast::hash(bytes));
    w.bytes(&payload);
    let crc = crc32fast::hash(&w.buf);
    w.u32(crc);
    let blob = w.buf;
    if decode(&blob)? != bytes {
        return Err(Error::Invalid(
            "internal error: anchor blob did not decode to the tensor (nothing written)".into(),
        ));
    }
    report.mode = Some(mode);
    report.blob_bytes = blob.len() as u64;
    if mode != AnchorMode::Modeled {
        report.head_bits = 0;
        report.context = ExpContext::None;
        report.head_context = HeadContext::Exponent;
    }
    Ok((blob, report))
}

/// Check the checksum and parse the header; returns the header and the payload.
pub fn read_header(bytes: &[u8]) -> Result<(AnchorHeader, &[u8])> {
    let mut r = crate::bytes::open_checked(bytes, MAGIC, "anchor blob")?;
    let version = r.u8()?;
    if version != VERSION {
        return Err(Error::Unsupported(format!(
            "anchor blob version {version} (this build reads {VERSION})"
        )));
    }
    let mode = match r.u8()? {
        0 => AnchorMode::Raw,
        1 => AnchorMode::Modeled,
        2 => AnchorMode::Zstd,
        m => return Err(r.err(format!("unknown mode {m}"))),
    };
    let dtype = DType::from_code(r.u8()?)?;
    let ndim = r.u8()? as usize;
    if ndim > MAX_NDIM {
        return Err(r.err(format!("{ndim} dimensions (at most {MAX_NDIM})")));
    }
    let shape = (0..ndim).map(|_| r.varint()).collect::<Result<Vec<_>>>()?;
    let n_elements = element_count(&shape)?;
    let crc = r.u32()?;

    Ok((
        AnchorHeader {
            mode,
            dtype,
            shape,
            n_elements,
            crc,
        },
        r.rest(),
    ))
}

/// Decode an anchor blob to the tensor's bytes (checked against the stored CRC).
pub fn decode(bytes: &[u8]) -> Result<Vec<u8>> {
    decode_checked_len(bytes, None)
}

/// [`decode`] where the container says how many bytes the tensor has (an archive's commit
/// record): a blob whose own shape disagrees is refused before anything is allocated.
pub fn decode_sized(bytes: &[u8], expected_len: u64) -> Result<Vec<u8>> {
    decode_checked_len(bytes, Some(expected_len))
}

fn decode_checked_len(bytes: &[u8], expected_len: Option<u64>) -> Result<Vec<u8>> {
    let (h, payload) = read_header(bytes)?;
    let raw_len = h
        .n_elements
        .checked_mul(h.dtype.size() as u64)
        .filter(|&l| l <= 1 << 46)
        .ok_or_else(|| Error::format("anchor blob", "tensor size out of range"))?;
    if let Some(want) = expected_len.filter(|&w| w != raw_len) {
        return Err(Error::format(
            "anchor blob",
            format!(
                "its {} {:?} tensor has {raw_len} bytes, the archive records {want}",
                h.dtype, h.shape
            ),
        ));
    }
    let raw_len = raw_len as usize;
    let out = match h.mode {
        AnchorMode::Raw => {
            if payload.len() != raw_len {
                return Err(Error::format(
                    "anchor blob",
                    "raw payload has the wrong length",
                ));
            }
            payload.to_vec()
        }
        AnchorMode::Zstd => {
            use std::io::Read;
            let mut out = Vec::new();
            zstd::stream::Decoder::new(payload)
                .and_then(|d| d.take(raw_len as u64 + 1).read_to_end(&mut out))
                .map_err(|e| Error::format("anchor blob zstd payload", e.to_string()))?;
            if out.len() != raw_len {
                return Err(Error::format(
                    "anchor blob",
                    "zstd payload has the wrong length",
                ));
            }
            out
        }
        AnchorMode::Modeled => {
            let fl = h.dtype.float_layout().ok_or_else(|| {
                Error::format("anchor blob", "modeled payload for a non-float dtype")
            })?;
            decode_modeled(payload, fl, h.n_elements as usize)?
        }
    };
    let crc = crc32fast::hash(&out);
    if crc != h.crc {
        return Err(Error::checksum32(
            "decoded anchor tensor (CRC-32)",
            h.crc,
            crc,
        ));
    }
    Ok(out)
}

/// Per-dtype constants of the float model.
#[derive(Clone, Copy)]
struct Geometry {
    size: usize,
    m: u32,
    e_bits: u32,
    /// Stage E contexts use the previous exponent (only for exponent fields of <= 8 bits).
    can_order1: bool,
}

impl Geometry {
    fn new(fl: FloatLayout) -> Geometry {
        Geometry {
            size: (fl.width / 8) as usize,
            m: fl.mantissa_bits,
            e_bits: fl.exponent_bits,
            can_order1: fl.exponent_bits <= 8,
        }
    }
    fn e_alphabet(&self) -> usize {
        1 << self.e_bits
    }
    /// Stage H contexts: the exponent itself for <= 8-bit fields, else one context.
    fn h_ctx(&self, e: u32) -> usize {
        if self.can_order1 {
            e as usize
        } else {
            0
        }
    }
    fn h_contexts(&self) -> usize {
        if self.can_order1 {
            self.e_alphabet()
        } else {
            1
        }
    }
    #[inline]
    fn split(&self, x: u64, t: u32) -> (u32, u32, u64) {
        let w = 8 * self.size as u32;
        let e = ((x >> self.m) & ((1u64 << self.e_bits) - 1)) as u32;
        let sign = (x >> (w - 1)) as u32 & 1;
        let mant = x & ((1u64 << self.m) - 1);
        let head = (sign << t) | (mant >> (self.m - t)) as u32;
        let tail = mant & ((1u64 << (self.m - t)) - 1);
        (e, head, tail)
    }
    #[inline]
    fn join(&self, e: u32, head: u32, tail: u64, t: u32) -> u64 {
        let w = 8 * self.size as u32;
        let sign = (head >> t) as u64 & 1;
        let top = (head & ((1 << t) - 1)) as u64;
        (sign << (w - 1)) | ((e as u64) << self.m) | (top << (self.m - t)) | tail
    }
}

#[inline]
fn load(bytes: &[u8], size: usize, j: usize) -> u64 {
    let mut v = [0u8; 8];
    v[..size].copy_from_slice(&bytes[j * size..(j + 1) * size]);
    u64::from_le_bytes(v)
}

/// What stage E is conditioned on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ExpContext {
    /// One row for every element (order 0).
    #[default]
    None,
    /// The exponent this many elements back in the same chunk (context 0 before it).
    Back(usize),
    /// The element's column (index modulo this many columns): embeddings and projections
    /// have a scale per column.
    Column(usize),
}

/// Largest column count the column context is tried for.
pub const MAX_COLUMN_CONTEXTS: u64 = 4096;

impl ExpContext {
    fn contexts(self, ea: usize) -> usize {
        match self {
            ExpContext::None => 1,
            ExpContext::Back(_) => ea + 1,
            ExpContext::Column(c) => c,
        }
    }
    /// Context of the element at global index `j`, chunk-local index `k`.
    #[inline]
    fn ctx(self, es: &[u32], k: usize, j: usize) -> usize {
        match self {
            ExpContext::None => 0,
            ExpContext::Back(d) if k >= d => es[k - d] as usize + 1,
            ExpContext::Back(_) => 0,
            ExpContext::Column(c) => j % c,
        }
    }
    fn write(self, w: &mut ByteWriter) {
        match self {
            ExpContext::None => w.u8(0),
            ExpContext::Back(d) => {
                w.u8(1);
                w.varint(d as u64)
            }
            ExpContext::Column(c) => {
                w.u8(2);
                w.varint(c as u64)
            }
        }
    }
    fn read(r: &mut ByteReader) -> Result<ExpContext> {
        Ok(match r.u8()? {
            0 => ExpContext::None,
            1 => ExpContext::Back(
                r.varint_max(CHUNK_ELEMS as u64, "context distance")?.max(1) as usize
            ),
            2 => ExpContext::Column(
                r.varint_max(MAX_COLUMN_CONTEXTS, "column count")?.max(1) as usize
            ),
            k => return Err(r.err(format!("unknown exponent context kind {k}"))),
        })
    }
}

/// What stage H (sign and top mantissa bits) is conditioned on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum HeadContext {
    /// The element's exponent field (for exponent fields of at most 8 bits; else one context).
    #[default]
    Exponent,
    /// The element's column and its exponent class: `col * 16 + clamp(e + 15 - top, 0, 15)`, where
    /// `top` is a frequent large exponent of the tensor. Rows of embeddings that moved together
    /// share their leading mantissa bits column by column.
    ColumnClass { cols: usize, top: u32 },
}

/// Exponent classes of [`HeadContext::ColumnClass`].
pub const HEAD_CLASSES: usize = 16;

impl HeadContext {
    fn contexts(self, g: &Geometry) -> usize {
        match self {
            HeadContext::Exponent => g.h_contexts(),
            HeadContext::ColumnClass { cols, .. } => cols * HEAD_CLASSES,
        }
    }
    #[inline]
    fn ctx(self, g: &Geometry, e: u32, j: usize) -> usize {
        match self {
            HeadContext::Exponent => g.h_ctx(e),
            HeadContext::ColumnClass { cols, top } => {
                let class = (e + HEAD_CLASSES as u32 - 1).saturating_sub(top);
                (j % cols) * HEAD_CLASSES + class.min(HEAD_CLASSES as u32 - 1) as usize
            }
        }
    }
    fn write(self, w: &mut ByteWriter) {
        match self {
            HeadContext::Exponent => w.u8(0),
            HeadContext::ColumnClass { cols, top } => {
                w.u8(1);
                w.varint(cols as u64);
                w.varint(top as u64);
            }
        }
    }
    fn read(r: &mut ByteReader, g: &Geometry) -> Result<HeadContext> {
        Ok(match r.u8()? {
            0 => HeadContext::Exponent,
            1 => {
                let cols = r.varint_max(MAX_COLUMN_CONTEXTS, "column count")?.max(1) as usize;
                let top = r.varint_max(g.e_alphabet() as u64 - 1, "top exponent")? as u32;
                HeadContext::ColumnClass { cols, top }
            }
            k => return Err(r.err(format!("unknown head context kind {k}"))),
        })
    }
}

/// Candidate contexts: none, the previous element and, for matrices, the element one row up
/// and the column.
fn candidates(shape: &[u64], can_order1: bool) -> Vec<ExpContext> {
    let mut d = vec![ExpContext::None];
    if can_order1 {
        d.push(ExpContext::Back(1));
        if let Some(&cols) = shape.last() {
            if shape.len() >= 2 && cols > 1 && cols < CHUNK_ELEMS as u64 {
                d.push(ExpContext::Back(cols as usize));
            }
            if shape.len() >= 2 && cols > 1 && cols <= MAX_COLUMN_CONTEXTS {
                d.push(ExpContext::Column(cols as usize));
            }
        }
    }
    d
}

fn encode_modeled(
    bytes: &[u8],
    fl: FloatLayout,
    shape: &[u64],
) -> (Vec<u8>, u32, ExpContext, HeadContext) {
    let g = Geometry::new(fl);
    let n = bytes.len() / g.size;
    let t_max = g.m.min(MAX_HEAD_BITS);
    let ea = g.e_alphabet();
    let dists = candidates(shape, g.can_order1);
    let ranges = chunk_ranges(n);
    let fresh = || {
        (
            dists
                .iter()
                .map(|c| Hist::new(c.contexts(ea), ea))
                .collect::<Vec<_>>(),
            Hist::new(1, ea),
        )
    };

    // Pass 1: stage E under each candidate context, and the exponent counts.
    // fold: one set of histograms per worker thread, not per chunk.
    let (hes, e_counts) = ranges
        .par_iter()
        .fold(fresh, |(mut hes, mut e0), r| {
            let mut es = Vec::with_capacity(r.len());
            for (k, j) in r.clone().enumerate() {
                let (e, _, _) = g.split(load(bytes, g.size, j), t_max);
                es.push(e);
                for (h, &c) in hes.iter_mut().zip(&dists) {
                    h.inc(c.ctx(&es, k, j), e as usize);
                }
                e0.inc(0, e as usize);
            }
            (hes, e0)
        })
        .reduce(fresh, |(mut a, mut b), (x, y)| {
            for (p, q) in a.iter_mut().zip(&x) {
                p.add(q);
            }
            b.add(&y);
            (a, b)
        });

    // Pass 2: stage H at the largest head under each candidate context.
    let mut hcands = vec![HeadContext::Exponent];
    if let Some(&cols) = shape.last() {
        // Only where there are enough elements per context for own rows to pay.
        if shape.len() >= 2
            && cols > 1
            && cols <= MAX_COLUMN_CONTEXTS
            && n as u64 >= cols * HEAD_CLASSES as u64 * 16
        {
            // `top`: the largest exponent held by at least 1/1024 of the elements.
            let top = (0..ea)
                .rev()
                .find(|&e| e_counts.counts[e] * 1024 >= n as u64)
                .unwrap_or(0) as u32;
            hcands.push(HeadContext::ColumnClass {
                cols: cols as usize,
                top,
            });
        }
    }
    let fresh_h = || -> Vec<Hist> {
        hcands
            .iter()
            .map(|c| Hist::new(c.contexts(&g), 1 << (t_max + 1)))
            .collect()
    };
    let hhs = ranges
        .par_iter()
        .fold(fresh_h, |mut hs, r| {
            for j in r.clone() {
                let (e, head, _) = g.split(load(bytes, g.size, j), t_max);
                for (h, c) in hs.iter_mut().zip(&hcands) {
                    h.inc(c.ctx(&g, e, j), head as usize);
                }
            }
            hs
        })
        .reduce(fresh_h, |mut a, b| {
            for (p, q) in a.iter_mut().zip(&b) {
                p.add(q);
            }
            a
        });

    // Stage E: the cheapest context (ties: the earlier candidate).
    let mut best_e: Option<(u64, ExpContext, Table)> = None;
    for (h, &c) in hes.iter().zip(&dists) {
        let t = Table::select(h);
        let cost = t.total_cost(h);
        if best_e.as_ref().is_none_or(|(bc, _, _)| cost < *bc) {
            best_e = Some((cost, c, t));
        }
    }
    let (_, dist, e_table) = best_e.unwrap();

    // Stage H: the context and the number of modeled mantissa bits (ties: the earlier).
    let mut best: Option<(u64, u32, HeadContext, Table)> = None;
    for (hh, &hc) in hhs.iter().zip(&hcands) {
        for t in 0..=t_max {
            let mut h = Hist::new(hh.n_ctx, 1 << (t + 1));
            for ctx in 0..hh.n_ctx {
                for (sym, &c) in hh.row(ctx).iter().enumerate() {
                    let sign = (sym >> t_max) & 1;
                    let top = (sym & ((1 << t_max) - 1)) >> (t_max - t);
                    h.counts[ctx * h.alphabet + ((sign << t) | top)] += c;
                }
            }
            let table = Table::select(&h);
            let c = table.total_cost(&h) + (g.m - t) as u64 * n as u64 * COST_ONE_BIT;
            if best.as_ref().is_none_or(|(bc, _, _, _)| c < *bc) {
                best = Some((c, t, hc, table));
            }
        }
    }
    let (_, t, hctx, h_table) = best.unwrap();

    let chunks: Vec<(Vec<u16>, [u32; LANES], Vec<u8>)> = ranges
        .par_iter()
        .map(|r| {
            encode_chunk(
                &bytes[r.start * g.size..r.end * g.size],
                r.start,
                g,
                t,
                dist,
                hctx,
                &e_table,
                &h_table,
            )
        })
        .collect();

    let mut w = ByteWriter::new();
    w.u8(t as u8);
    dist.write(&mut w);
    hctx.write(&mut w);
    e_table.write(&mut w);
    h_table.write(&mut w);
    for (words, states, _) in &chunks {
        w.varint(words.len() as u64);
        for &s in states {
            w.u32(s);
        }
    }
    for (words, _, tail) in &chunks {
        for &x in words {
            w.u16(x);
        }
        w.bytes(tail);
    }
    (w.buf, t, dist, hctx)
}

fn encode_chunk(
    bytes: &[u8],
    first: usize,
    g: Geometry,
    t: u32,
    dist: ExpContext,
    hctx: HeadContext,
    e_table: &Table,
    h_table: &Table,
) -> (Vec<u16>, [u32; LANES], Vec<u8>) {
    let n = bytes.len() / g.size;
    let mut es = Vec::with_capacity(n);
    let mut heads = Vec::with_capacity(n);
    let tail_bits = g.m - t;
    let mut tail = BitWriter::default();
    for j in 0..n {
        let (e, head, tl) = g.split(load(bytes, g.size, j), t);
        es.push(e);
        heads.push(head);
        tail.put(tl, tail_bits);
    }
    let mut states = [RANS_L; LANES];
    let mut words = Vec::with_capacity(n / 2);
    for step in (0..n.div_ceil(LANES)).rev() {
        let lanes = LANES.min(n - step * LANES);
        for lane in (0..lanes).rev() {
            let j = step * LANES + lane;
            let row = &h_table.rows[h_table.map[hctx.ctx(&g, es[j], first + j)] as usize];
            let s = heads[j] as usize;
            enc_put(&mut states[lane], &mut words, row.start[s], row.freq[s]);
        }
        for lane in (0..lanes).rev() {
            let j = step * LANES + lane;
            let row = &e_table.rows[e_table.map[dist.ctx(&es, j, first + j)] as usize];
            let s = es[j] as usize;
            enc_put(&mut states[lane], &mut words, row.start[s], row.freq[s]);
        }
    }
    words.reverse();
    (words, states, tail.finish())
}

fn decode_modeled(payload: &[u8], fl: FloatLayout, n: usize) -> Result<Vec<u8>> {
    let g = Geometry::new(fl);
    let mut r = ByteReader::new(payload, "anchor blob payload");
    let t = r.u8()? as u32;
    if t > g.m.min(MAX_HEAD_BITS) {
        return Err(r.err(format!(
            "{t} modeled mantissa bits (at most {})",
            g.m.min(MAX_HEAD_BITS)
        )));
    }
    let dist = ExpContext::read(&mut r)?;
    if dist != ExpContext::None && !g.can_order1 {
        return Err(r.err("exponent context for a dtype that has none"));
    }
    let hctx = HeadContext::read(&mut r, &g)?;
    let ea = g.e_alphabet();
    let e_table = Table::read(&mut r, dist.contexts(ea), ea)?;
    let h_table = Table::read(&mut r, hctx.contexts(&g), 1 << (t + 1))?;
    // Each chunk has at least a word count and LANES states: bound n before allocating.
    if n.div_ceil(CHUNK_ELEMS) > payload.len() / (1 + 4 * LANES) + 1 {
        return Err(r.err(format!(
            "{n} elements cannot fit in {} bytes",
            payload.len()
        )));
    }
    let ranges = chunk_ranges(n);
    let mut heads = Vec::with_capacity(ranges.len());
    for _ in &ranges {
        let nw = r.varint_max(payload.len() as u64 / 2, "chunk word count")? as usize;
        let mut states = [0u32; LANES];
        for s in states.iter_mut() {
            *s = r.u32()?;
        }
        heads.push((nw, states));
    }
    let tail_bits = (g.m - t) as usize;
    let mut streams = Vec::with_capacity(ranges.len());
    for (range, &(nw, _)) in ranges.iter().zip(&heads) {
        let words = r.take(nw * 2)?;
        let tail = r.take((range.len() * tail_bits).div_ceil(8))?;
        streams.push((words, tail));
    }
    r.expect_end()?;
    let e_slots = Lookup::new(&e_table);
    let h_slots = Lookup::new(&h_table);
    let mut out = vec![0u8; n * g.size];
    out.par_chunks_mut(CHUNK_ELEMS * g.size)
        .enumerate()
        .zip(streams.par_iter().zip(heads.par_iter()))
        .try_for_each(|((ci, dst), ((words, tail), (_, states)))| {
            let ctx = DecodeCtx {
                g,
                t,
                dist,
                hctx,
                e_table: &e_table,
                h_table: &h_table,
                e_slots: &e_slots,
                h_slots: &h_slots,
            };
            decode_chunk(&ctx, ci * CHUNK_ELEMS, words, tail, *states, dst)
        })?;
    Ok(out)
}

/// Slot → symbol: full tables for a few rows over large alphabets, else a binary search of
/// the cumulative starts (thousands of small rows would not fit in cache as tables).
struct Lookup {
    slots: Option<Vec<Vec<u16>>>,
}

impl Lookup {
    fn new(t: &Table) -> Lookup {
        let tables = t.alphabet > 32 && t.rows.len() <= 64;
        Lookup {
            slots: tables.then(|| t.rows.iter().map(|r| r.slots()).collect()),
        }
    }
    #[inline]
    fn find(&self, row: &table::Row, ri: u32, slot: u32) -> usize {
        match &self.slots {
            Some(s) => s[ri as usize][slot as usize] as usize,
            // The last symbol whose start is <= slot has a non-zero frequency.
            None => row.start.partition_point(|&st| st <= slot) - 1,
        }
    }
}

struct DecodeCtx<'a> {
    g: Geometry,
    t: u32,
    dist: ExpContext,
    hctx: HeadContext,
    e_table: &'a Table,
    h_table: &'a Table,
    e_slots: &'a Lookup,
    h_slots: &'a Lookup,
}

#[allow(clippy::needless_range_loop)]
fn decode_chunk(
    c: &DecodeCtx,
    first: usize,
    words: &[u8],
    tail: &[u8],
    mut states: [u32; LANES],
    dst: &mut [u8],
) -> Result<()> {
    let bad = |d: &str| Error::format("anchor blob chunk", d.to_string());
    let g = c.g;
    let n = dst.len() / g.size;
    let words: Vec<u16> = words
        .chunks_exact(2)
        .map(|w| u16::from_le_bytes([w[0], w[1]]))
        .collect();
    let mut pos = 0usize;
    let mut es = vec![0u32; n];
    let mut heads = vec![0u32; n];
    for step in 0..n.div_ceil(LANES) {
        let lanes = LANES.min(n - step * LANES);
        for lane in 0..lanes {
            let j = step * LANES + lane;
            let ri = c.e_table.map[c.dist.ctx(&es, j, first + j)];
            if ri == u32::MAX {
                return Err(bad("an exponent context has no frequency row"));
            }
            let row = &c.e_table.rows[ri as usize];
            let st = &mut states[lane];
            let s = c
                .e_slots
                .find(&c.e_table.rows[ri as usize], ri, dec_get(*st));
            if !dec_advance(st, &words, &mut pos, row.start[s], row.freq[s]) {
                return Err(bad("rANS word stream ended early"));
            }
            es[j] = s as u32;
        }
        for lane in 0..lanes {
            let j = step * LANES + lane;
            let ri = c.h_table.map[c.hctx.ctx(&g, es[j], first + j)];
            if ri == u32::MAX {
                return Err(bad("a head context has no frequency row"));
            }
            let row = &c.h_table.rows[ri as usize];
            let st = &mut states[lane];
            let s = c
                .h_slots
                .find(&c.h_table.rows[ri as usize], ri, dec_get(*st));
            if !dec_advance(st, &words, &mut pos, row.start[s], row.freq[s]) {
                return Err(bad("rANS word stream ended early"));
            }
            heads[j] = s as u32;
        }
    }
    if pos != words.len() || states.iter().any(|&s| s != RANS_L) {
        return Err(bad("rANS lanes did not end in their initial state"));
    }
    let tail_bits = g.m - c.t;
    let mut bits = BitReader::new(tail);
    for j in 0..n {
        let tl = bits.take::<false>(tail_bits);
        let x = g.join(es[j], heads[j], tl, c.t);
        dst[j * g.size..(j + 1) * g.size].copy_from_slice(&x.to_le_bytes()[..g.size]);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
