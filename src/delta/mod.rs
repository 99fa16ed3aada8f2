//! The checkpoint delta codec (ULPack method, extended): code a target tensor against the
//! co-located reference tensor of the previous checkpoint, losslessly, as a self-contained blob.
//!
//! Pipeline for a float tensor (read top to bottom; the byte layout is in docs/FORMAT.md):
//!
//! 1. [`crate::format::symbols`]: every element pair becomes (b, q1, q2, sign, raw tail), from
//!    the exact ordered-integer residual of src/float.rs.
//! 2. [`crate::format::tables`]: per-tensor histograms of each stage under its context;
//!    integer table selection (which contexts get their own row) and normalization.
//! 3. [`crate::format::chunk`]: chunks of `CHUNK_ELEMS` elements, each coded by `LANES`
//!    interleaved rANS states in a fixed order, raw tails bit-packed beside them.
//! 4. [`blob`]: header, tables, chunk index, streams, checksum. If that is not smaller than the
//!    raw tensor, the raw tensor is stored instead.
//!
//! Steps 1–3 run on a device's delta kernels ([`crate::backend::Backend`], passed in by the
//! caller); this module decides tables and assembles bytes on the host.
//!
//! Every encode is decoded again and compared with the target before it is returned.

pub mod analysis;
pub mod blob;
pub mod file;
pub mod parity;
pub mod stats;

use crate::backend::Backend;
use crate::dtype::DType;
pub use crate::format::chunk::{CHUNK_ELEMS, LANES};
pub use crate::format::symbols::Layout;
use crate::{Error, Result};
pub use blob::{BlobHeader, Mode};

/// Which symbol layout to use for float tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LayoutChoice {
    /// The default. Tensors of [`blob::AUTO_NEIGHBOR_MIN`] elements or more (where the
    /// time and most bytes go), floats up to 32 bits: the Joint layout's neighbor form
    /// (`FastNeighbor`), smaller than Signed there and faster to decode. Smaller tensors
    /// and wider floats: whichever of Signed and Paper is estimated smaller.
    #[default]
    Auto,
    /// The paper's layout and models, every occupied context with its own row (the control).
    Paper,
    /// Modeled update sign, neighbor context where it pays, pruned tables.
    Signed,
    /// The Joint layout: one symbol per weight, decoding about 2.5x faster for a few percent
    /// more bytes (`--fast`). Floats wider than 32 bits use Signed.
    Fast,
    /// The Joint layout with its neighbor context (the element one row up and the
    /// reference's top mantissa bits) where it pays. Every device codes it (the CPU, the
    /// reference, wgpu and CUDA).
    FastNeighbor,
}

/// Encoder settings. None of them is needed to decode: the blob records what was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeOptions {
    pub layout: LayoutChoice,
    /// Condition every model on the reference exponent (off = the paper's Table 10 ablation).
    pub condition_on_exponent: bool,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            layout: LayoutChoice::Auto,
            condition_on_exponent: true,
        }
    }
}

/// One tensor to encode: the target and its co-located reference, same dtype and shape.
#[derive(Clone, Copy, Debug)]
pub struct TensorPair<'a> {
    pub dtype: DType,
    pub shape: &'a [u64],
    pub reference: &'a [u8],
    pub target: &'a [u8],
}

/// What an encode produced, for stats tables.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub n_elements: u64,
    /// Size of the target tensor in bytes.
    pub raw_bytes: u64,
    /// Size of the blob in bytes.
    pub blob_bytes: u64,
    pub mode: Option<Mode>,
    pub layout: Option<Layout>,
    /// Whether the update-sign stage uses the neighbor context.
    pub neighbor: bool,
    /// Whether the bit-length stage uses the neighbor/mantissa context.
    pub b_neighbor: bool,
    /// Whether the Joint layout's stage uses its neighbor/mantissa context.
    pub j_neighbor: bool,
    /// Ideal code length per stage (B, Q1, Q2, S) under the transmitted tables, in bits.
    pub stage_bits: [f64; 4],
    /// Raw tail bits.
    pub tail_bits: u64,
    /// Bytes of frequency tables.
    pub table_bytes: u64,
    /// rANS words plus tail bytes (everything that is not framing).
    pub stream_bytes: u64,
}

impl Report {
    /// Framing overhead: everything but the coded streams (header, tables, chunk index, lane
    /// states, checksum).
    pub fn framing_bytes(&self) -> u64 {
        self.blob_bytes - self.stream_bytes
    }
}

/// Encode one tensor into a self-contained, verified blob on `backend` (the bytes do not
/// depend on which).
pub fn encode_tensor(
    pair: &TensorPair,
    opts: &EncodeOptions,
    backend: &dyn Backend,
) -> Result<(Vec<u8>, Report)> {
    let (bytes, report) = blob::encode_unverified(pair, opts, backend)?;
    // Compared piece by piece as the decode hands them over (no whole second copy of a
    // large tensor).
    let mut at = 0;
    decode_tensor_pieces(&bytes, pair.reference, backend, None, &mut |piece| {
        if pair.target.get(at..at + piece.len()) != Some(piece) {
            return Err(Error::Invalid(
                "internal error: encoded tensor did not decode to the target (nothing written)"
                    .into(),
            ));
        }
        at += piece.len();
        Ok(())
    })?;
    if at != pair.target.len() {
        return Err(Error::Invalid(
            "internal error: encoded tensor decoded short of the target (nothing written)".into(),
        ));
    }
    Ok((bytes, report))
}

/// Decode a blob against its reference tensor's bytes, on `backend`.
pub fn decode_tensor(bytes: &[u8], reference: &[u8], backend: &dyn Backend) -> Result<Vec<u8>> {
    blob::decode(bytes, reference, backend)
}

/// [`decode_tensor`] handing the output to `sink` in order, a piece of `piece_chunks`
/// chunks at a time (None: as many as suit this machine, `blob::piece_chunks`), so a large
/// tensor's output never exists whole; every check of the blob is made once the last piece
/// is out, so on an error what `sink` got is to be discarded.
pub fn decode_tensor_pieces(
    bytes: &[u8],
    reference: &[u8],
    backend: &dyn Backend,
    piece_chunks: Option<usize>,
    sink: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    blob::decode_pieces(bytes, reference, backend, piece_chunks, sink)
}

/// Encode many tensors, batch by batch under a byte budget, tensors within a batch in parallel.
/// Blobs are tensor-local: neither the budget nor the thread count changes a single byte.
pub fn encode_batched(
    pairs: &[TensorPair],
    opts: &EncodeOptions,
    budget_bytes: usize,
    backend: &dyn Backend,
) -> Result<Vec<(Vec<u8>, Report)>> {
    use rayon::prelude::*;
    let mut out = Vec::with_capacity(pairs.len());
    for batch in batches(pairs.iter().map(|p| p.target.len()), budget_bytes) {
        let coded: Vec<_> = pairs[batch]
            .par_iter()
            .map(|p| encode_tensor(p, opts, backend))
            .collect::<Result<_>>()?;
        out.extend(coded);
    }
    Ok(out)
}

/// Split items of the given sizes into consecutive ranges of at most `budget` bytes (an item
/// larger than the budget gets a batch of its own).
pub fn batches(
    sizes: impl IntoIterator<Item = usize>,
    budget: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut acc, mut i) = (0, 0usize, 0);
    for size in sizes {
        if i > start && acc + size > budget {
            out.push(start..i);
            start = i;
            acc = 0;
        }
        acc += size;
        i += 1;
    }
    if i > start {
        out.push(start..i);
    }
    out
}

/// The paper's default batch budget.
pub const DEFAULT_BATCH_BYTES: usize = 64 << 20;
