//! Bits-per-weight accounting by stage, from real (verified) encodes, for `lockstep delta stats`,
//! the demo and the benchmark tables.

use std::collections::BTreeMap;

use super::analysis::BitlenExponent;
use super::{encode_batched, EncodeOptions, LayoutChoice, Report, TensorPair, DEFAULT_BATCH_BYTES};
use crate::backend::Device;
use crate::baseline;
use crate::checkpoint::Checkpoint;
use crate::dtype::DType;
use crate::Result;

/// Sums of [`Report`]s.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub weights: u64,
    pub raw_bytes: u64,
    pub blob_bytes: u64,
    /// Ideal bits of B, Q1, Q2, S (the Joint layout: J, 0, 0, 0).
    pub stage_bits: [f64; 4],
    pub tail_bits: u64,
    pub table_bytes: u64,
}

impl Totals {
    pub fn add(&mut self, r: &Report) {
        self.weights += r.n_elements;
        self.raw_bytes += r.raw_bytes;
        self.blob_bytes += r.blob_bytes;
        for (a, b) in self.stage_bits.iter_mut().zip(r.stage_bits) {
            *a += b;
        }
        self.tail_bits += r.tail_bits;
        self.table_bytes += r.table_bytes;
    }
    /// Bits per weight of a bit count.
    pub fn bpw(&self, bits: f64) -> f64 {
        bits / self.weights.max(1) as f64
    }
    pub fn total_bpw(&self) -> f64 {
        self.bpw(8.0 * self.blob_bytes as f64)
    }
    /// Everything that is neither a modeled stage's ideal code length nor raw tail: tables,
    /// headers, chunk index, lane states, rANS overhead, raw-stored tensors.
    pub fn framing_bits(&self) -> f64 {
        8.0 * self.blob_bytes as f64 - self.stage_bits.iter().sum::<f64>() - self.tail_bits as f64
    }
}

/// The encoder configurations compared by `delta stats`: the paper's layout and the Signed
/// layout stage by stage (each with and without the reference-exponent context), `--fast`,
/// and the default (`auto`: the neighbor form on large tensors, Signed or Paper on small).
pub const CONFIGS: [(&str, LayoutChoice, bool); 6] = [
    ("paper", LayoutChoice::Paper, true),
    ("paper, no e_r", LayoutChoice::Paper, false),
    ("signed", LayoutChoice::Signed, true),
    ("signed, no e_r", LayoutChoice::Signed, false),
    ("--fast", LayoutChoice::Fast, true),
    ("default", LayoutChoice::Auto, true),
];

/// Index in [`CONFIGS`] of the fast (Joint) layout, whose one stage's bits are in
/// `stage_bits[0]`.
pub const FAST_CONFIG: usize = 4;

/// Index in [`CONFIGS`] of the default, whose tensors mix layouts (its stage bits are not
/// one layout's stages).
pub const DEFAULT_CONFIG: usize = 5;

/// Stats of one dtype within a checkpoint pair.
#[derive(Clone, Debug, Default)]
pub struct DtypeStats {
    /// One entry per [`CONFIGS`] row.
    pub configs: Vec<Totals>,
    /// zstd -19 on byte-grouped XOR, bytes (None if skipped).
    pub zstd_grouped_xor: Option<usize>,
    pub h_b: f64,
    pub i_b_er: f64,
}

/// Per-tensor comparison of paper and default.
#[derive(Clone, Debug)]
pub struct TensorLine {
    pub name: String,
    pub dtype: DType,
    pub paper: Report,
    pub default: Report,
}

pub struct PairStats {
    pub by_dtype: BTreeMap<String, DtypeStats>,
    pub tensors: Vec<TensorLine>,
}

/// Encode every tensor of `target` against `reference` in every configuration (each encode
/// verified) and collect the table.
pub fn pair_stats(
    reference: &Checkpoint,
    target: &Checkpoint,
    baseline_zstd: bool,
    device: &Device,
) -> Result<PairStats> {
    super::file::check_compatible(reference, target)?;
    let backend = device.delta()?;
    let pairs: Vec<(String, TensorPair)> = target
        .tensors
        .iter()
        .map(|t| {
            let r = reference.get(&t.name).unwrap();
            (
                t.name.clone(),
                TensorPair {
                    dtype: t.dtype,
                    shape: &t.shape,
                    reference: reference.data(r),
                    target: target.data(t),
                },
            )
        })
        .collect();
    let just_pairs: Vec<TensorPair> = pairs.iter().map(|(_, p)| *p).collect();
    let mut by_dtype: BTreeMap<String, DtypeStats> = BTreeMap::new();
    let mut per_config = Vec::new();
    for (_, layout, cond) in CONFIGS {
        let opts = EncodeOptions {
            layout,
            condition_on_exponent: cond,
        };
        per_config.push(encode_batched(
            &just_pairs,
            &opts,
            DEFAULT_BATCH_BYTES,
            backend,
        )?);
    }
    for (ci, coded) in per_config.iter().enumerate() {
        for ((_, p), (_, rep)) in pairs.iter().zip(coded) {
            let e = by_dtype.entry(p.dtype.to_string()).or_default();
            e.configs.resize_with(CONFIGS.len(), Totals::default);
            e.configs[ci].add(rep);
        }
    }
    let dtypes: Vec<DType> = {
        let mut d: Vec<DType> = pairs.iter().map(|(_, p)| p.dtype).collect();
        d.dedup();
        d.sort_by_key(|d| d.code());
        d.dedup();
        d
    };
    for dtype in dtypes {
        let mut planes = Vec::new();
        let mut mi = BitlenExponent::default();
        for (_, p) in pairs.iter().filter(|(_, p)| p.dtype == dtype) {
            if baseline_zstd {
                baseline::push_planes(
                    &mut planes,
                    &baseline::xor(p.reference, p.target),
                    dtype.size(),
                );
            }
            mi.add(dtype, p.reference, p.target);
        }
        let e = by_dtype.get_mut(&dtype.to_string()).unwrap();
        if baseline_zstd {
            e.zstd_grouped_xor = Some(baseline::zstd_planes(&planes, 19)?);
        }
        (e.h_b, e.i_b_er) = mi.entropy_and_information();
    }
    let tensors = pairs
        .iter()
        .enumerate()
        .map(|(i, (name, p))| TensorLine {
            name: name.clone(),
            dtype: p.dtype,
            paper: per_config[0][i].1.clone(),
            default: per_config[DEFAULT_CONFIG][i].1.clone(),
        })
        .collect();
    Ok(PairStats { by_dtype, tensors })
}
