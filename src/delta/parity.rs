//! Stage-by-stage outputs of a backend on one tensor pair, for parity checks: the tests
//! compare them byte for byte, `lockstep parity` prints their hashes per backend.

use super::{decode_tensor, encode_tensor, EncodeOptions, LayoutChoice, TensorPair};
use crate::backend::{Backend, EncodeJob, HistRequest};
use crate::format::chunk::EncodedChunk;
use crate::format::neighbor_distance;
use crate::format::symbols::{Layout, JOINT_MAX_WIDTH};
use crate::format::tables::{Hist, StageTable, Tables};
use crate::Result;

/// Names of the stages, in pipeline order.
pub const STAGE_NAMES: [&str; 6] = [
    "residuals",
    "histograms",
    "lanes",
    "tail",
    "blob",
    "decoded",
];

/// Everything one backend produced for one tensor pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stages {
    pub residuals: Vec<u8>,
    /// Counts of every stage of every layout (Signed with B and S in their neighbor forms,
    /// then the Joint layout's neighbor form, sparse).
    pub histograms: Vec<Vec<u64>>,
    /// Signed layout under tables selected from the histograms: B and S in their neighbor
    /// forms, then B folded to its plain form, then S folded (three runs, concatenated);
    /// then, for floats up to 32 bits, the Joint layout and its neighbor form.
    pub chunks: Vec<EncodedChunk>,
    /// The verified blob (default options).
    pub blob: Vec<u8>,
    /// This backend's decode of its own blob.
    pub decoded: Vec<u8>,
    /// The blob with the fast (Joint) layout asked for, and its decode.
    pub fast_blob: Vec<u8>,
    pub fast_decoded: Vec<u8>,
    /// The blob's B and S stages use their neighbor context forms (`Report::b_neighbor`,
    /// `Report::neighbor`); implied by the blob, kept so tests can see what was covered.
    pub b_neighbor: bool,
    pub s_neighbor: bool,
}

impl Stages {
    /// One BLAKE3 hash per entry of [`STAGE_NAMES`], fed into `hashers`.
    pub fn hash_into(&self, hashers: &mut [blake3::Hasher; 6]) {
        hashers[0].update(&self.residuals);
        for h in &self.histograms {
            for c in h {
                hashers[1].update(&c.to_le_bytes());
            }
        }
        for c in &self.chunks {
            hashers[2].update(&(c.words.len() as u64).to_le_bytes());
            for w in &c.words {
                hashers[2].update(&w.to_le_bytes());
            }
            for s in &c.states {
                hashers[2].update(&s.to_le_bytes());
            }
            hashers[3].update(&c.tail_bits.to_le_bytes());
            hashers[3].update(&c.tail);
        }
        hashers[4].update(&(self.blob.len() as u64).to_le_bytes());
        hashers[4].update(&self.blob);
        hashers[4].update(&(self.fast_blob.len() as u64).to_le_bytes());
        hashers[4].update(&self.fast_blob);
        hashers[5].update(&self.decoded);
        hashers[5].update(&self.fast_decoded);
    }
}

/// Run every stage of `backend` on a float tensor pair (`None` for other dtypes, which no
/// backend touches).
pub fn stages(
    backend: &dyn Backend,
    pair: &TensorPair,
    opts: &EncodeOptions,
) -> Result<Option<Stages>> {
    let Some(fl) = pair.dtype.float_layout() else {
        return Ok(None);
    };
    let resident = backend.residuals(&EncodeJob {
        fl,
        reference: pair.reference,
        target: pair.target,
        condition: opts.condition_on_exponent,
    })?;
    let residuals = resident.residual_bytes()?;
    let d = neighbor_distance(pair.shape);
    let paper = resident.histograms(Layout::Paper, None)?;
    let signed = resident.histograms(Layout::Signed, Some(d))?;
    // Asked together, as the encoder's `auto` asks (a backend may count both in one pass).
    let both = resident.histograms_for(&[
        HistRequest {
            layout: Layout::Signed,
            distance: Some(d),
        },
        HistRequest {
            layout: Layout::Paper,
            distance: None,
        },
    ])?;
    let (signed_again, paper_again) = match &both[..] {
        [s, p] => (s.clone(), p.clone()),
        _ => {
            return Err(crate::Error::Invalid(format!(
                "backend {} answered {} of 2 histogram requests",
                backend.name(),
                both.len()
            )))
        }
    };
    // Every mix of context forms: B and S both in their neighbor forms, then each folded.
    let mut chunks = Vec::new();
    for fold in [[false, false], [true, false], [false, true]] {
        let stages = signed
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let folded = match i {
                    0 => fold[0],
                    3 => fold[1],
                    _ => false,
                };
                if folded {
                    StageTable::select(&h.without_neighbor(), true)
                } else {
                    StageTable::select(h, true)
                }
            })
            .collect();
        chunks.extend(resident.encode(Layout::Signed, &Tables { stages }, Some(d))?);
    }
    // The Joint (fast) layout: its one stage's histogram and lanes; then its neighbor form
    // (the default's for large tensors), whose counts are compared sparse: its dense
    // space is hundreds of megabytes, and a count off by one often normalizes to the same
    // table, so the bytes alone would not show it.
    let (mut joint, mut near) = (Vec::new(), Vec::new());
    if fl.width <= JOINT_MAX_WIDTH {
        joint = resident.histograms(Layout::Joint, None)?;
        let stages = joint.iter().map(|h| StageTable::select(h, true)).collect();
        chunks.extend(resident.encode(Layout::Joint, &Tables { stages }, None)?);
        let hists = resident.histograms(Layout::Joint, Some(d))?;
        let stages = hists.iter().map(|h| StageTable::select(h, true)).collect();
        chunks.extend(resident.encode(Layout::Joint, &Tables { stages }, Some(d))?);
        near = hists.iter().map(sparse).collect();
    }
    drop(resident);
    let (blob, report) = encode_tensor(pair, opts, backend)?;
    let decoded = decode_tensor(&blob, pair.reference, backend)?;
    // And the whole blob of the fast layout, decoded on the same backend.
    let fast = EncodeOptions {
        layout: LayoutChoice::Fast,
        ..*opts
    };
    let (fast_blob, _) = encode_tensor(pair, &fast, backend)?;
    let fast_decoded = decode_tensor(&fast_blob, pair.reference, backend)?;
    Ok(Some(Stages {
        residuals,
        histograms: (paper
            .into_iter()
            .chain(signed)
            .chain(signed_again)
            .chain(paper_again)
            .chain(joint))
        .map(|h| h.dense())
        .chain(near)
        .collect(),
        chunks,
        blob,
        decoded,
        fast_blob,
        fast_decoded,
        b_neighbor: report.b_neighbor,
        s_neighbor: report.neighbor,
    }))
}

/// A histogram's occupied rows as numbers: per row its context, first stored symbol, number
/// of stored counts, then the counts.
fn sparse(h: &Hist) -> Vec<u64> {
    let mut out = Vec::new();
    for (ctx, row) in h.rows() {
        out.extend([ctx as u64, row.lo as u64, row.counts.len() as u64]);
        out.extend_from_slice(row.counts);
    }
    out
}

/// The first stage where two backends' outputs differ, if any.
pub fn first_difference(a: &Stages, b: &Stages) -> Option<&'static str> {
    if a.residuals != b.residuals {
        Some("residuals")
    } else if a.histograms != b.histograms {
        Some("histograms")
    } else if a
        .chunks
        .iter()
        .map(|c| (&c.words, c.states))
        .ne(b.chunks.iter().map(|c| (&c.words, c.states)))
    {
        Some("lanes")
    } else if a
        .chunks
        .iter()
        .map(|c| (&c.tail, c.tail_bits))
        .ne(b.chunks.iter().map(|c| (&c.tail, c.tail_bits)))
    {
        Some("tail")
    } else if a.blob != b.blob || a.fast_blob != b.fast_blob {
        Some("blob")
    } else if a.decoded != b.decoded || a.fast_decoded != b.fast_decoded {
        Some("decoded")
    } else {
        None
    }
}
