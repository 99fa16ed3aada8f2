//! The tensor blob: one self-contained, checksummed unit per tensor (docs/FORMAT.md).

use std::borrow::Cow;

use super::{EncodeOptions, LayoutChoice, Report, TensorPair};
use crate::backend::{Backend, DecodeJob, EncodeJob, HistRequest};
use crate::bytes::{ByteReader, ByteWriter};
use crate::dtype::{DType, FloatLayout};
use crate::entropy::freq::{entropy_floor, COST_ONE_BIT, PROB_BITS};
use crate::format::chunk::{chunk_ranges, DecodeChunk, EncodedChunk, CHUNK_ELEMS, LANES};
use crate::format::layout_stages;
use crate::format::neighbor_distance;
use crate::format::symbols::{joint_parts, Layout, JOINT_MAX_WIDTH};
use crate::format::tables::{least_row_bytes, Hist, Selection, Space, Stage, StageTable, Tables};
use crate::{Error, Result};

pub const MAGIC: &[u8; 4] = b"LSDB";
pub const VERSION: u8 = 1;
/// Largest number of dimensions a blob may record.
pub const MAX_NDIM: usize = 32;
/// zstd level of the generic (non-float) path.
const GENERIC_ZSTD_LEVEL: i32 = 9;

/// How a blob's payload is coded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Target equals reference; no payload.
    Identical = 0,
    /// Target bytes verbatim (the fallback that bounds every blob's size).
    Raw = 1,
    /// The ULP-residual model: tables, chunk index, rANS words, raw tails.
    Modeled = 2,
    /// Generic path for non-float types: zstd of target XOR reference.
    ZstdXor = 3,
}

impl Mode {
    fn from_u8(v: u8) -> Result<Mode> {
        Ok(match v {
            0 => Mode::Identical,
            1 => Mode::Raw,
            2 => Mode::Modeled,
            3 => Mode::ZstdXor,
            _ => return Err(Error::format("tensor blob", format!("unknown mode {v}"))),
        })
    }
    fn uses_reference(self) -> bool {
        self != Mode::Raw
    }
}

/// The fixed part of every blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobHeader {
    pub mode: Mode,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub n_elements: u64,
    /// CRC-32 of the reference tensor's bytes (0 for Raw blobs, which do not need one).
    pub reference_crc: u32,
    /// CRC-32 of the decoded target tensor's bytes.
    pub target_crc: u32,
}

/// Elements in a shape, or an error if the product overflows.
pub fn element_count(shape: &[u64]) -> Result<u64> {
    shape.iter().try_fold(1u64, |acc, &d| {
        acc.checked_mul(d)
            .ok_or_else(|| Error::format("tensor shape", format!("{shape:?} overflows")))
    })
}

fn write_header(w: &mut ByteWriter, h: &BlobHeader) {
    w.bytes(MAGIC);
    w.u8(VERSION);
    w.u8(h.mode as u8);
    w.u8(h.dtype.code());
    w.u8(h.shape.len() as u8);
    for &d in &h.shape {
        w.varint(d);
    }
    if h.mode.uses_reference() {
        w.u32(h.reference_crc);
    }
    w.u32(h.target_crc);
}

/// Check the trailing checksum and parse the header; returns the header and the payload.
pub fn read_header(bytes: &[u8]) -> Result<(BlobHeader, &[u8])> {
    let mut r = crate::bytes::open_checked(bytes, MAGIC, "tensor blob")?;
    let version = r.u8()?;
    if version != VERSION {
        return Err(Error::Unsupported(format!(
            "tensor blob format version {version} (this build reads {VERSION})"
        )));
    }
    let mode = Mode::from_u8(r.u8()?)?;
    let dtype = DType::from_code(r.u8()?)?;
    let ndim = r.u8()? as usize;
    if ndim > MAX_NDIM {
        return Err(r.err(format!("{ndim} dimensions (at most {MAX_NDIM})")));
    }
    let shape = (0..ndim).map(|_| r.varint()).collect::<Result<Vec<_>>>()?;
    let n_elements = element_count(&shape)?;
    let header = BlobHeader {
        mode,
        dtype,
        shape,
        n_elements,
        reference_crc: if mode.uses_reference() { r.u32()? } else { 0 },
        target_crc: r.u32()?,
    };
    Ok((header, r.rest()))
}

/// Estimated cost of a stage (data + table) in COST_ONE_BIT units.
fn stage_cost(s: &Selection) -> u64 {
    s.data_cost + s.bytes() as u64 * 8 * COST_ONE_BIT
}

/// One way of coding a float tensor, with its estimated size.
struct Candidate {
    layout: Layout,
    /// Neighbor distance, if any stage's context uses the neighbor.
    distance: Option<usize>,
    /// Each stage's rows and their estimated data cost; the chosen candidate's become its
    /// tables.
    stages: Vec<Selection>,
    /// Estimated payload cost in COST_ONE_BIT units: data + tables + raw tail.
    cost: u64,
}

/// Raw tail bits implied by the first stage's histogram (B, or J in the Joint layout):
/// `max(b - 3, 0)` per element.
fn tail_bits(b_hist: &Hist) -> u64 {
    let a = b_hist.space.alphabet();
    let b_of = |sym: usize| match b_hist.space.stage {
        Stage::J => joint_parts(sym).0 as u64,
        _ => sym as u64,
    };
    let per_b: Vec<u64> = (0..a).map(|sym| b_of(sym).saturating_sub(3)).collect();
    b_hist
        .rows()
        .map(|(_, row)| row.iter().map(|(sym, c)| c * per_b[sym]).sum::<u64>())
        .sum()
}

/// The histogram request of one layout for a tensor of `shape`: Signed always with its
/// neighbor forms counted, Joint with its neighbor form where asked (`joint_neighbor`).
fn request(layout: Layout, shape: &[u64], joint_neighbor: bool) -> HistRequest {
    let neighbor = match layout {
        Layout::Signed => true,
        Layout::Joint => joint_neighbor,
        Layout::Paper => false,
    };
    let distance = neighbor.then(|| neighbor_distance(shape));
    HistRequest { layout, distance }
}

/// The best tables of one layout for its histograms (`req` says what they count).
fn candidate(req: HistRequest, mut hists: Vec<Hist>) -> Result<Candidate> {
    let (layout, distance) = (req.layout, req.distance);
    // The Paper layout is the paper's control: every occupied context keeps its own row.
    let prune = layout != Layout::Paper;
    let mut stages: Vec<Selection> = hists.iter().map(|h| Selection::of(h, prune)).collect();
    hists.truncate(stages.len());
    // Where a neighbor context does not pay for its larger tables, fold it away.
    for i in 0..stages.len() {
        if stages[i].space.neighbor {
            let plain_hist = hists[i].without_neighbor();
            let plain = Selection::of(&plain_hist, true);
            if stage_cost(&plain) <= stage_cost(&stages[i]) {
                stages[i] = plain;
                hists[i] = plain_hist;
            }
        }
    }
    let distance = distance.filter(|_| stages.iter().any(|t| t.space.neighbor));
    let cost = tail_bits(&hists[0]) * COST_ONE_BIT + stages.iter().map(stage_cost).sum::<u64>();
    Ok(Candidate {
        layout,
        distance,
        stages,
        cost,
    })
}

/// A floor under the Paper candidate's cost ([`candidate`] of its histograms): its raw
/// tails, and per occupied context (the Paper layout keeps every one's own row) its data at
/// their entropy ([`entropy_floor`], below the cost under any row), its row's least bytes
/// ([`least_row_bytes`]) and a byte of context id. Where it is no lower than the Signed
/// candidate's cost, Paper cannot be chosen (Signed wins ties) and its selection, which
/// prices every row, is skipped: 46 of the GPT-2 trajectory's 51 tensors below 2^20
/// elements, whose selections were a quarter of their encode.
fn paper_floor(hists: &[Hist]) -> u64 {
    let Some(first) = hists.first() else {
        return 0;
    };
    let rows: u64 = hists
        .iter()
        .flat_map(|h| h.rows())
        .map(|(_, row)| {
            entropy_floor(row.counts) + (least_row_bytes(row) as u64 + 1) * 8 * COST_ONE_BIT
        })
        .sum();
    tail_bits(first) * COST_ONE_BIT + rows
}

/// Encode without the decode-and-compare check (callers outside benches want
/// [`super::encode_tensor`]).
pub fn encode_unverified(
    pair: &TensorPair,
    opts: &EncodeOptions,
    backend: &dyn Backend,
) -> Result<(Vec<u8>, Report)> {
    encode_with(pair, opts, backend, true)
}

/// Encode a float tensor in the Modeled mode even where the raw fallback would be smaller:
/// lets tests drive the entropy coder over every bit pattern. Not verified.
pub fn encode_modeled_only(
    pair: &TensorPair,
    opts: &EncodeOptions,
    backend: &dyn Backend,
) -> Result<(Vec<u8>, Report)> {
    encode_with(pair, opts, backend, false)
}

fn encode_with(
    pair: &TensorPair,
    opts: &EncodeOptions,
    backend: &dyn Backend,
    allow_fallback: bool,
) -> Result<(Vec<u8>, Report)> {
    let dtype = pair.dtype;
    let n = element_count(pair.shape)?;
    let raw_bytes = n
        .checked_mul(dtype.size() as u64)
        .ok_or_else(|| Error::Invalid("tensor too large".into()))?;
    for (what, b) in [("reference", pair.reference), ("target", pair.target)] {
        if b.len() as u64 != raw_bytes {
            return Err(Error::Mismatch(format!(
                "{what} has {} bytes but a {dtype} tensor of shape {:?} needs {raw_bytes}",
                b.len(),
                pair.shape
            )));
        }
    }
    if pair.shape.len() > MAX_NDIM {
        return Err(Error::Unsupported(format!(
            "{} dimensions",
            pair.shape.len()
        )));
    }
    let mut header = BlobHeader {
        mode: Mode::Identical,
        dtype,
        shape: pair.shape.to_vec(),
        n_elements: n,
        // Filled in below: the modeled pass may hash both on its way.
        reference_crc: 0,
        target_crc: 0,
    };
    let mut crcs = None;
    let mut report = Report {
        n_elements: n,
        raw_bytes,
        ..Report::default()
    };

    // The payload is written after room for the header it will most likely have (a
    // modeled or zstd blob's: the same length whatever the CRCs), filled in at the end, so
    // the payload is not copied behind the header.
    let mut w = ByteWriter::new();
    write_header(
        &mut w,
        &BlobHeader {
            mode: Mode::Modeled,
            ..header.clone()
        },
    );
    let head_len = w.len();
    let payload = &mut w;
    if pair.reference == pair.target && allow_fallback {
        header.mode = Mode::Identical;
    } else if let Some(fl) = dtype.float_layout() {
        header.mode = Mode::Modeled;
        crcs = encode_modeled(pair, fl, opts, backend, payload, &mut report)?;
    } else {
        header.mode = Mode::ZstdXor;
        let xor: Vec<u8> = pair
            .reference
            .iter()
            .zip(pair.target)
            .map(|(a, b)| a ^ b)
            .collect();
        let z = zstd::bulk::compress(&xor, GENERIC_ZSTD_LEVEL)
            .map_err(|e| Error::Invalid(format!("zstd failed: {e}")))?;
        payload.blob(&z);
        report.stream_bytes = z.len() as u64;
    }
    [header.reference_crc, header.target_crc] = crcs.unwrap_or_else(|| {
        [
            crate::bytes::crc32(pair.reference),
            crate::bytes::crc32(pair.target),
        ]
    });
    let fallback = allow_fallback || !dtype.is_float();
    if fallback && header.mode != Mode::Identical && (w.len() - head_len) as u64 >= raw_bytes {
        header.mode = Mode::Raw;
        header.reference_crc = 0;
        w = ByteWriter::new();
        write_header(&mut w, &header);
        w.bytes(pair.target);
        report = Report {
            n_elements: n,
            raw_bytes,
            stream_bytes: raw_bytes,
            ..Report::default()
        };
    } else {
        let mut head = ByteWriter::new();
        write_header(&mut head, &header);
        if head.len() == head_len {
            w.buf[..head_len].copy_from_slice(&head.buf);
        } else {
            // Only a raw blob's header differs in length (written above); kept correct
            // should another mode come to differ.
            head.bytes(&w.buf[head_len..]);
            w = head;
        }
    }
    let crc = crate::bytes::crc32(&w.buf);
    w.u32(crc);
    report.mode = Some(header.mode);
    report.blob_bytes = w.len() as u64;
    Ok((w.buf, report))
}

/// Elements from which `auto` codes a tensor in the Joint layout's neighbor form rather
/// than choosing between the Signed and Paper layouts. Where the time goes (the GPT-2
/// trajectory's 6.4M-element embedding) the neighbor form is the smaller and decodes
/// faster: with it the 600 -> 800 files are 1.7% (bf16), 0.3% (fp32) and 1.1% (fp16)
/// smaller than Signed's (docs/BENCHMARKS.md, 2026-12-06). Below, its contexts do not pay
/// for their tables (every tensor of 65,536 elements or fewer there folds back to the plain
/// Joint form, larger than Signed), so small tensors keep the Signed/Paper choice.
pub const AUTO_NEIGHBOR_MIN: usize = 1 << 20;

fn encode_modeled(
    pair: &TensorPair,
    fl: FloatLayout,
    opts: &EncodeOptions,
    backend: &dyn Backend,
    out: &mut ByteWriter,
    report: &mut Report,
) -> Result<Option<[u32; 2]>> {
    let resident = backend.residuals(&EncodeJob {
        fl,
        reference: pair.reference,
        target: pair.target,
        condition: opts.condition_on_exponent,
    })?;
    let joint = fl.width <= JOINT_MAX_WIDTH;
    let auto_near = joint && pair.target.len() / pair.dtype.size() >= AUTO_NEIGHBOR_MIN;
    let layouts: &[Layout] = match opts.layout {
        LayoutChoice::Paper => &[Layout::Paper],
        LayoutChoice::Signed => &[Layout::Signed],
        LayoutChoice::Fast | LayoutChoice::FastNeighbor if joint => &[Layout::Joint],
        // The Joint layout stops at 32-bit floats; wider ones take the Signed layout.
        LayoutChoice::Fast | LayoutChoice::FastNeighbor => &[Layout::Signed],
        LayoutChoice::Auto if auto_near => &[Layout::Joint],
        // Whichever is estimated smaller; Signed wins ties.
        LayoutChoice::Auto => &[Layout::Signed, Layout::Paper],
    };
    let joint_neighbor = match opts.layout {
        LayoutChoice::FastNeighbor => true,
        LayoutChoice::Auto => auto_near,
        _ => false,
    };
    let requests: Vec<HistRequest> = layouts
        .iter()
        .map(|&l| request(l, pair.shape, joint_neighbor))
        .collect();
    let hists = resident.histograms_for(&requests)?;
    if hists.len() != requests.len() {
        return Err(Error::Invalid(format!(
            "backend {} answered {} of {} histogram requests",
            backend.name(),
            hists.len(),
            requests.len()
        )));
    }
    let mut chosen: Option<Candidate> = None;
    for (req, h) in requests.into_iter().zip(hists) {
        if req.layout == Layout::Paper
            && chosen
                .as_ref()
                .is_some_and(|best| paper_floor(&h) >= best.cost)
        {
            continue;
        }
        let c = candidate(req, h)?;
        if chosen.as_ref().is_none_or(|best| c.cost < best.cost) {
            chosen = Some(c);
        }
    }
    let chosen = chosen.expect("at least one layout");
    let data_costs: Vec<u64> = chosen.stages.iter().map(|s| s.data_cost).collect();
    let tables = Tables {
        stages: chosen.stages.into_iter().map(Selection::table).collect(),
    };
    let chunks = resident.encode(chosen.layout, &tables, chosen.distance)?;
    if chunks.len() != chunk_ranges(pair.target.len() / pair.dtype.size()).len() {
        return Err(Error::Invalid(format!(
            "backend {} returned {} chunks",
            backend.name(),
            chunks.len()
        )));
    }

    out.u8(chosen.layout as u8);
    let uses = |stage: Stage| {
        tables
            .stages
            .iter()
            .any(|t| t.space.stage == stage && t.space.neighbor)
    };
    let flags = opts.condition_on_exponent as u8
        | (uses(Stage::S) as u8) << 1
        | (uses(Stage::B) as u8) << 2
        | (uses(Stage::J) as u8) << 3;
    out.u8(flags);
    if let Some(d) = chosen.distance {
        out.varint(d as u64);
    }
    out.varint(CHUNK_ELEMS as u64);
    out.u8(LANES as u8);
    out.u8(PROB_BITS as u8);
    let before_tables = out.len();
    for t in &tables.stages {
        t.write(out);
    }
    report.table_bytes = (out.len() - before_tables) as u64;
    for c in &chunks {
        out.varint(c.words.len() as u64);
        out.varint(c.tail_bits);
        for &s in &c.states {
            out.u32(s);
        }
    }
    let stream = put_streams(&mut out.buf, &chunks);
    report.layout = Some(chosen.layout);
    report.neighbor = uses(Stage::S);
    report.b_neighbor = uses(Stage::B);
    report.j_neighbor = uses(Stage::J);
    report.stream_bytes = stream;
    report.tail_bits = chunks.iter().map(|c| c.tail_bits).sum();
    for (i, d) in data_costs.iter().enumerate() {
        report.stage_bits[i] = *d as f64 / COST_ONE_BIT as f64;
    }
    Ok(resident.input_crcs())
}

/// Every chunk's words (little-endian) and then its tail, appended to `buf`; returns how many
/// bytes. Each chunk is copied into its own part of room reserved once, the parts on the
/// rayon pool: one thread's copy of a large tensor's stream (most of the fp32 GPT-2 pair's
/// 19.6 MB of blobs is the embedding's, its pages mostly new, each faulted in here: 2-15 ms
/// of its 48-73 ms one-thread encode on a Zen 3 VM) left the other threads idle (two
/// threads' `--fast` fp32 encode 1.04-1.05x faster in parallel, docs/BENCHMARKS.md).
fn put_streams(buf: &mut Vec<u8>, chunks: &[EncodedChunk]) -> u64 {
    use rayon::prelude::*;
    let sizes: Vec<usize> = chunks
        .iter()
        .map(|c| 2 * c.words.len() + c.tail.len())
        .collect();
    let total: usize = sizes.iter().sum();
    // (The blob's trailing CRC-32 too.)
    buf.reserve(total + 4);
    let mut parts = Vec::with_capacity(chunks.len());
    let mut rest = &mut buf.spare_capacity_mut()[..total];
    for &n in &sizes {
        let (part, r) = rest.split_at_mut(n);
        parts.push(part);
        rest = r;
    }
    let put = |(part, c): (&mut [std::mem::MaybeUninit<u8>], &EncodedChunk)| {
        let (words, tail) = part.split_at_mut(2 * c.words.len());
        if cfg!(target_endian = "little") {
            // The words as they lie in memory: one copy.
            copy_into(words, bytemuck::cast_slice(&c.words));
        } else {
            for (o, w) in words.chunks_exact_mut(2).zip(&c.words) {
                copy_into(o, &w.to_le_bytes());
            }
        }
        copy_into(tail, &c.tail);
    };
    parts.into_par_iter().zip(chunks).for_each(put);
    // SAFETY: the parts cover the `total` bytes after the length, and `put` wrote each
    // of them.
    unsafe { buf.set_len(buf.len() + total) };
    total as u64
}

/// `src` into `dst`, which is as long.
fn copy_into(dst: &mut [std::mem::MaybeUninit<u8>], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    // SAFETY: both `src.len()` bytes long, and a `&mut` does not overlap a `&`.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast(), src.len()) };
}

/// Decode a blob against the reference tensor's bytes.
pub fn decode(bytes: &[u8], reference: &[u8], backend: &dyn Backend) -> Result<Vec<u8>> {
    let (h, payload, raw_bytes) = open(bytes, reference)?;
    let mut out = Vec::new();
    let decoded = decode_payload(payload, &h, raw_bytes, reference, backend).map(|(o, crc)| {
        let crc = crc.unwrap_or_else(|| crate::bytes::crc32(&o));
        out = o;
        crc
    });
    judge(&h, reference, decoded)?;
    Ok(out)
}

/// [`decode`] handing the output to `sink` in order, in pieces of `piece_chunks` chunks
/// (`Backend::decode_pieces`; default [`piece_chunks`]), so a large tensor's output need not
/// exist whole. The blob's checks are the same, made once the last piece is out: on an
/// error, what `sink` got is to be discarded. An error of `sink`'s own is returned as it is
/// (after the reference's check, as any error of the decode).
pub fn decode_pieces(
    bytes: &[u8],
    reference: &[u8],
    backend: &dyn Backend,
    piece_chunks: Option<usize>,
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let (h, payload, raw_bytes) = open(bytes, reference)?;
    let per = piece_chunks.unwrap_or_else(|| self::piece_chunks(h.dtype.size()));
    let decoded = (|| {
        let mut r = ByteReader::new(payload, "tensor blob payload");
        let whole: &[u8] = match h.mode {
            Mode::Identical => reference,
            Mode::Raw => r.take(raw_bytes as usize)?,
            Mode::ZstdXor => {
                let (out, _) = decode_payload(payload, &h, raw_bytes, reference, backend)?;
                sink(&out)?;
                return Ok(crate::bytes::crc32(&out));
            }
            Mode::Modeled => {
                let fl = modeled_layout(&r, &h)?;
                let parsed = parse_modeled(&mut r, &h, fl)?;
                r.expect_end()?;
                return backend.decode_pieces(&parsed.job(reference), per, sink);
            }
        };
        r.expect_end()?;
        sink(whole)?;
        Ok(crate::bytes::crc32(whole))
    })();
    judge(&h, reference, decoded)
}

/// Chunks per piece of a piecewise decode of elements of `size` bytes: two per thread, so
/// the pool has work to share out, and at least 4 MiB, so a piece's fork and join are
/// small beside its work; a piece's bytes stay in cache between its decode and its sink.
pub fn piece_chunks(size: usize) -> usize {
    (2 * rayon::current_num_threads()).max((4 << 20) / (CHUNK_ELEMS * size.max(1)))
}

/// A blob's header and payload and its output's length, checked against the reference's.
fn open<'b>(bytes: &'b [u8], reference: &[u8]) -> Result<(BlobHeader, &'b [u8], u64)> {
    let (h, payload) = read_header(bytes)?;
    let size = h.dtype.size() as u64;
    let raw_bytes = h
        .n_elements
        .checked_mul(size)
        .filter(|&b| b <= isize::MAX as u64)
        .ok_or_else(|| Error::format("tensor blob", "tensor size overflows"))?;
    if h.mode.uses_reference() && reference.len() as u64 != raw_bytes {
        return Err(Error::Mismatch(format!(
            "reference tensor has {} bytes, the blob's {} {:?} tensor needs {raw_bytes}",
            reference.len(),
            h.dtype,
            h.shape
        )));
    }
    Ok((h, payload, raw_bytes))
}

/// A decode's outcome (its output's CRC-32, or its error) as the blob's: checked against
/// the stored CRC-32. A wrong reference is named as such, before any other error of the
/// decode. Only a failed decode hashes the reference to tell: a wrong reference decodes to
/// a wrong output, which the target's CRC-32 catches, so a decode that checks out needs no
/// pass over the reference.
fn judge(h: &BlobHeader, reference: &[u8], decoded: Result<u32>) -> Result<()> {
    let check_reference = || -> Result<()> {
        if !h.mode.uses_reference() {
            return Ok(());
        }
        let crc = crate::bytes::crc32(reference);
        if crc != h.reference_crc {
            return Err(Error::Mismatch(format!(
                "wrong reference tensor: its CRC-32 is {crc:#010x}, the blob was coded against {:#010x}",
                h.reference_crc
            )));
        }
        Ok(())
    };
    match decoded {
        Err(e) => {
            check_reference()?;
            Err(e)
        }
        Ok(crc) if crc != h.target_crc => {
            check_reference()?;
            Err(Error::checksum32(
                "decoded tensor (CRC-32)",
                h.target_crc,
                crc,
            ))
        }
        Ok(_) => Ok(()),
    }
}

/// The output of a blob's payload, with its CRC-32 where the decode computed it.
fn decode_payload(
    payload: &[u8],
    h: &BlobHeader,
    raw_bytes: u64,
    reference: &[u8],
    backend: &dyn Backend,
) -> Result<(Vec<u8>, Option<u32>)> {
    let mut r = ByteReader::new(payload, "tensor blob payload");
    let mut crc = None;
    let out = match h.mode {
        Mode::Identical => reference.to_vec(),
        Mode::Raw => r.take(raw_bytes as usize)?.to_vec(),
        Mode::ZstdXor => {
            let z = r.blob()?;
            let xor = zstd::bulk::decompress(z, raw_bytes as usize)
                .map_err(|e| Error::format("tensor blob zstd payload", e.to_string()))?;
            if xor.len() != reference.len() {
                return Err(r.err("zstd payload has the wrong length"));
            }
            xor.iter().zip(reference).map(|(a, b)| a ^ b).collect()
        }
        Mode::Modeled => {
            let fl = modeled_layout(&r, h)?;
            let parsed = parse_modeled(&mut r, h, fl)?;
            let checked = backend.decode_checked(&parsed.job(reference))?;
            crc = Some(checked.crc);
            checked.out
        }
    };
    r.expect_end()?;
    Ok((out, crc))
}

/// The float layout of a modeled blob's dtype.
fn modeled_layout(r: &ByteReader, h: &BlobHeader) -> Result<FloatLayout> {
    h.dtype
        .float_layout()
        .ok_or_else(|| r.err(format!("modeled blob of non-float dtype {}", h.dtype)))
}

/// Little-endian 16-bit words, copied in one go (an element-wise rebuild, or zeroing first,
/// cost 4% and 2% of a fast decode), swapped in place on a big-endian host.
fn le_words(bytes: &[u8]) -> Vec<u16> {
    let n = bytes.len() / 2;
    let mut words: Vec<u16> = Vec::with_capacity(n);
    // SAFETY: `2 * n` bytes of `bytes` fill the capacity exactly; every `u16` bit pattern is
    // valid, and the buffers are distinct allocations.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr().cast::<u8>(), 2 * n);
        words.set_len(n);
    }
    if cfg!(target_endian = "big") {
        words.iter_mut().for_each(|w| *w = u16::from_le(*w));
    }
    words
}

/// A modeled payload, parsed: what a backend's decode job needs but the reference.
struct Parsed<'b> {
    fl: FloatLayout,
    layout: Layout,
    condition: bool,
    distance: Option<usize>,
    tables: Tables,
    chunks: Vec<DecodeChunk<'b>>,
}

impl Parsed<'_> {
    fn job<'s>(&'s self, reference: &'s [u8]) -> DecodeJob<'s> {
        DecodeJob {
            fl: self.fl,
            layout: self.layout,
            condition: self.condition,
            distance: self.distance,
            tables: &self.tables,
            chunks: &self.chunks,
            reference,
        }
    }
}

fn parse_modeled<'b>(
    r: &mut ByteReader<'b>,
    h: &BlobHeader,
    fl: FloatLayout,
) -> Result<Parsed<'b>> {
    let layout = match r.u8()? {
        0 => Layout::Paper,
        1 => Layout::Signed,
        2 if fl.width <= JOINT_MAX_WIDTH => Layout::Joint,
        2 => return Err(r.err(format!("joint layout for {}-bit floats", fl.width))),
        v => return Err(r.err(format!("unknown layout {v}"))),
    };
    let flags = r.u8()?;
    if flags & !15 != 0 {
        return Err(r.err(format!("unknown flags {flags:#x}")));
    }
    let condition = flags & 1 != 0;
    let (s_neighbor, b_neighbor, j_neighbor) = (flags & 2 != 0, flags & 4 != 0, flags & 8 != 0);
    if layout == Layout::Joint && (s_neighbor || b_neighbor) {
        return Err(r.err("neighbor contexts of stages B or S in the joint layout"));
    }
    if layout != Layout::Joint && j_neighbor {
        return Err(r.err("the joint stage's neighbor context outside the joint layout"));
    }
    let distance = if s_neighbor || b_neighbor || j_neighbor {
        let d = r.varint_max(u32::MAX as u64, "neighbor distance")? as usize;
        if d < LANES {
            return Err(r.err(format!("neighbor distance {d} below the lane count")));
        }
        Some(d)
    } else {
        None
    };
    let (chunk_elems, lanes, prob_bits) = (r.varint()?, r.u8()?, r.u8()?);
    if (chunk_elems, lanes as usize, prob_bits as u32) != (CHUNK_ELEMS as u64, LANES, PROB_BITS) {
        return Err(Error::Unsupported(format!(
            "stream geometry chunk={chunk_elems} lanes={lanes} prob_bits={prob_bits}"
        )));
    }
    let stages = layout_stages(layout)
        .iter()
        .map(|&s| {
            let nb = match s {
                Stage::B => b_neighbor,
                Stage::S => s_neighbor,
                Stage::J => j_neighbor,
                _ => false,
            };
            StageTable::read(r, Space::new(s, fl.width, nb))
        })
        .collect::<Result<Vec<_>>>()?;
    let tables = Tables { stages };

    let n = h.n_elements as usize;
    let ranges = chunk_ranges(n);
    let mut index = Vec::with_capacity(ranges.len().min(r.remaining() / 8));
    for range in &ranges {
        let n_words = r.varint_max(range.len() as u64 * 4, "chunk word count")? as usize;
        let tail_bits = r.varint_max(range.len() as u64 * 64, "chunk tail bits")?;
        let mut states = [0u32; LANES];
        for s in states.iter_mut() {
            *s = r.u32()?;
        }
        index.push((n_words, tail_bits, states));
    }
    let mut coded = Vec::with_capacity(index.len());
    for &(n_words, tail_bits, states) in &index {
        let bytes = r.take(
            n_words
                .checked_mul(2)
                .ok_or_else(|| r.err("word count overflows"))?,
        )?;
        let words = match bytemuck::try_cast_slice::<u8, u16>(bytes) {
            // Little-endian words in place, where the blob's bytes are aligned.
            Ok(w) if cfg!(target_endian = "little") => Cow::Borrowed(w),
            _ => Cow::Owned(le_words(bytes)),
        };
        let tail = r.take(tail_bits.div_ceil(8) as usize)?;
        coded.push(DecodeChunk {
            words,
            states,
            tail,
            tail_bits,
        });
    }

    Ok(Parsed {
        fl,
        layout,
        condition,
        distance,
        tables,
        chunks: coded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::{CpuAt, Isa};

    /// [`paper_floor`] never above the Paper candidate's cost (else a Paper layout that
    /// would win could be skipped), and not far below it (else it would skip nothing), on
    /// random walks of every float type and sizes from a few elements to many chunks.
    #[test]
    fn paper_floor_is_under_the_paper_cost() {
        let mut lcg = crate::test_lcg(0x9A9E_F100);
        let backend = CpuAt::new(Isa::Portable).unwrap();
        let mut tight = 0;
        for (k, dtype) in [DType::BF16, DType::F16, DType::F32, DType::F64]
            .into_iter()
            .enumerate()
        {
            let fl = dtype.float_layout().unwrap();
            for n in [1usize, 7, 300, 5_000, 70_000] {
                let size = dtype.size();
                let mut reference = vec![0u8; n * size];
                for b in reference.iter_mut() {
                    *b = (lcg() >> 56) as u8;
                }
                // Small moves of the low bytes: residuals of a few bits, as in training.
                let mut target = reference.clone();
                for e in target.chunks_exact_mut(size) {
                    let r = lcg() >> 40;
                    e[0] = e[0].wrapping_add((r % (3 + 5 * k as u64)) as u8);
                    if r.is_multiple_of(7) {
                        e[1] = e[1].wrapping_add(1);
                    }
                }
                let job = EncodeJob {
                    fl,
                    reference: &reference,
                    target: &target,
                    condition: true,
                };
                let resident = backend.residuals(&job).unwrap();
                let req = request(Layout::Paper, &[n as u64], false);
                let hists = resident.histograms_for(&[req]).unwrap().remove(0);
                let floor = paper_floor(&hists);
                let cost = candidate(req, hists).unwrap().cost;
                assert!(
                    floor <= cost,
                    "{dtype} n={n}: floor {floor} above the cost {cost}"
                );
                tight += (floor > cost / 2) as usize;
            }
        }
        assert!(
            tight >= 10,
            "the floor was within half the cost only {tight} times"
        );
    }
}
