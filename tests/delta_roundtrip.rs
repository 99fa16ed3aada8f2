//! Round trips of the delta codec: every special value, every 16-bit pattern, every dtype at
//! awkward lengths, and both layouts with and without exponent conditioning.

mod common;

use common::Rng;
use lockstep::delta::blob::encode_modeled_only;
use lockstep::delta::{
    decode_tensor, encode_tensor, EncodeOptions, LayoutChoice, Mode, TensorPair, CHUNK_ELEMS, LANES,
};
use lockstep::dtype::DType;
use proptest::prelude::*;

/// Fixed cost of a raw-stored blob: magic, version, mode, dtype, rank, one dimension, target
/// CRC and blob CRC.
const RAW_OVERHEAD: usize = 4 + 1 + 1 + 1 + 1 + 3 + 4 + 4;

const FLOATS: [DType; 6] = [
    DType::F64,
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F8E4M3,
    DType::F8E5M2,
];

fn all_options() -> Vec<EncodeOptions> {
    let mut v = Vec::new();
    for layout in [
        LayoutChoice::Auto,
        LayoutChoice::Paper,
        LayoutChoice::Signed,
    ] {
        for condition_on_exponent in [true, false] {
            v.push(EncodeOptions {
                layout,
                condition_on_exponent,
            });
        }
    }
    v
}

fn roundtrip(
    dtype: DType,
    shape: &[u64],
    reference: &[u8],
    target: &[u8],
    opts: &EncodeOptions,
) -> Vec<u8> {
    let pair = TensorPair {
        dtype,
        shape,
        reference,
        target,
    };
    if dtype.is_float() {
        // The entropy coder itself, even where the raw fallback would win.
        let (blob, report) =
            encode_modeled_only(&pair, opts, &lockstep::backend::cpu::CpuBackend).unwrap();
        assert_eq!(report.mode, Some(Mode::Modeled));
        assert_eq!(
            decode_tensor(&blob, reference, &lockstep::backend::cpu::CpuBackend).unwrap(),
            target,
            "modeled {dtype} {shape:?} {opts:?}"
        );
    }
    let (blob, report) = encode_tensor(&pair, opts, &lockstep::backend::cpu::CpuBackend)
        .unwrap_or_else(|e| panic!("{dtype} {shape:?}: {e}"));
    assert_eq!(
        decode_tensor(&blob, reference, &lockstep::backend::cpu::CpuBackend).unwrap(),
        target,
        "{dtype} {shape:?} {opts:?}"
    );
    assert_eq!(report.blob_bytes as usize, blob.len());
    // The raw fallback bounds every blob: raw size plus header and checksum.
    assert!(
        blob.len() <= target.len() + RAW_OVERHEAD + 10 * shape.len(),
        "{dtype} {shape:?}: {} > raw {}",
        blob.len(),
        target.len()
    );
    blob
}

/// Bit patterns every float codec must survive, for a dtype of `size` bytes.
fn special_patterns(dtype: DType) -> Vec<u64> {
    let fl = dtype.float_layout().unwrap();
    let w = fl.width;
    let sign = 1u64 << (w - 1);
    let exp_all = ((1u64 << fl.exponent_bits) - 1) << fl.mantissa_bits;
    let mant_all = (1u64 << fl.mantissa_bits) - 1;
    let max = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
    let mut v = vec![
        0,                         // +0
        sign,                      // -0
        1,                         // smallest subnormal
        sign | 1,                  // negative subnormal
        mant_all,                  // largest subnormal
        exp_all,                   // +inf (or NaN/max for E4M3)
        sign | exp_all,            // -inf
        exp_all | 1,               // signalling NaN payload
        exp_all | mant_all,        // quiet NaN, all payload bits
        sign | exp_all | mant_all, // negative NaN
        exp_all - 1,               // largest finite
        sign | (exp_all - 1),      // most negative finite
        1u64 << fl.mantissa_bits,  // smallest normal
        max,
        sign - 1,
    ];
    v.dedup();
    v
}

fn to_bytes(values: &[u64], size: usize) -> Vec<u8> {
    values
        .iter()
        .flat_map(|v| v.to_le_bytes()[..size].to_vec())
        .collect()
}

#[test]
fn special_values_against_special_references() {
    for dtype in FLOATS {
        let sp = special_patterns(dtype);
        let (mut r, mut t) = (Vec::new(), Vec::new());
        for &a in &sp {
            for &b in &sp {
                r.push(a);
                t.push(b);
            }
        }
        let size = dtype.size();
        let (r, t) = (to_bytes(&r, size), to_bytes(&t, size));
        for opts in all_options() {
            roundtrip(dtype, &[(r.len() / size) as u64], &r, &t, &opts);
        }
    }
}

/// Every one of the 65,536 target patterns against a spread of reference patterns.
#[test]
fn every_16bit_target_pattern() {
    for dtype in [DType::BF16, DType::F16] {
        let targets: Vec<u64> = (0..65536).collect();
        let t = to_bytes(&targets, 2);
        let mut references: Vec<Vec<u64>> = special_patterns(dtype)
            .into_iter()
            .map(|r| vec![r; 65536])
            .collect();
        // Every reference pattern too, paired with a scrambled target order.
        references.push((0..65536u64).map(|i| (i * 40503) % 65536).collect());
        for (k, refs) in references.iter().enumerate() {
            let r = to_bytes(refs, 2);
            let opts = &all_options()[k % 6];
            roundtrip(dtype, &[256, 256], &r, &t, opts);
        }
    }
}

#[test]
fn every_8bit_pair() {
    for dtype in [DType::F8E4M3, DType::F8E5M2] {
        let (mut r, mut t) = (Vec::new(), Vec::new());
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                r.push(a);
                t.push(b);
            }
        }
        for opts in all_options() {
            roundtrip(dtype, &[256, 256], &r, &t, &opts);
        }
    }
}

#[test]
fn non_float_tensors_use_the_generic_path() {
    let mut rng = Rng(7);
    // int64 position ids and a bool mask, changed a little.
    let ids: Vec<u8> = (0..1024i64).flat_map(|i| i.to_le_bytes()).collect();
    let mut ids2 = ids.clone();
    ids2[80] ^= 1;
    let blob = roundtrip(
        DType::I64,
        &[1, 1024],
        &ids,
        &ids2,
        &EncodeOptions::default(),
    );
    assert!(blob.len() < ids.len() / 10);
    let mask: Vec<u8> = (0..4096).map(|_| (rng.below(4) == 0) as u8).collect();
    let mask2: Vec<u8> = mask
        .iter()
        .map(|&m| m ^ (rng.below(50) == 0) as u8)
        .collect();
    roundtrip(
        DType::Bool,
        &[64, 64],
        &mask,
        &mask2,
        &EncodeOptions::default(),
    );
    for dtype in [
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
    ] {
        let n = 333;
        let a = rng.bytes(n * dtype.size());
        let b = rng.bytes(n * dtype.size());
        roundtrip(dtype, &[n as u64], &a, &b, &EncodeOptions::default());
    }
}

#[test]
fn identical_tensors_cost_only_a_header() {
    let (r, _) = common::bf16_pair(10_000, 3);
    let pair = TensorPair {
        dtype: DType::BF16,
        shape: &[100, 100],
        reference: &r,
        target: &r,
    };
    let (blob, rep) = encode_tensor(
        &pair,
        &EncodeOptions::default(),
        &lockstep::backend::cpu::CpuBackend,
    )
    .unwrap();
    assert_eq!(rep.mode, Some(Mode::Identical));
    assert!(blob.len() < 32, "{}", blob.len());
    assert_eq!(
        decode_tensor(&blob, &r, &lockstep::backend::cpu::CpuBackend).unwrap(),
        r
    );
}

#[test]
fn small_tensors_never_cost_more_than_raw_plus_a_few_bytes() {
    let mut rng = Rng(11);
    for n in [1usize, 2, 3, 7, 31, 64, 128, 384, 1000] {
        for dtype in FLOATS {
            let r = rng.bytes(n * dtype.size());
            let t = rng.bytes(n * dtype.size());
            let pair = TensorPair {
                dtype,
                shape: &[n as u64],
                reference: &r,
                target: &t,
            };
            let (blob, _) = encode_tensor(
                &pair,
                &EncodeOptions::default(),
                &lockstep::backend::cpu::CpuBackend,
            )
            .unwrap();
            assert!(
                blob.len() <= t.len() + RAW_OVERHEAD,
                "{dtype} n={n}: {} bytes for {} raw",
                blob.len(),
                t.len()
            );
        }
    }
}

fn odd_lengths() -> Vec<usize> {
    vec![
        0,
        1,
        LANES - 1,
        LANES,
        LANES + 1,
        CHUNK_ELEMS - 1,
        CHUNK_ELEMS,
        CHUNK_ELEMS + 1,
    ]
}

/// A target near the reference in rank space (what training produces), as raw bytes.
fn nearby(dtype: DType, reference: &[u8], rng: &mut Rng, spread: u64) -> Vec<u8> {
    let size = dtype.size();
    let w = dtype
        .float_layout()
        .map(|f| f.width)
        .unwrap_or(8 * size as u32);
    reference
        .chunks_exact(size)
        .flat_map(|c| {
            let mut v = [0u8; 8];
            v[..size].copy_from_slice(c);
            let r = u64::from_le_bytes(v);
            let d = rng.below(2 * spread + 1) as i64 - spread as i64;
            let x = if rng.below(100) == 0 {
                rng.next()
            } else {
                lockstep::float::apply_displacement(r, d, w)
            };
            x.to_le_bytes()[..size].to_vec()
        })
        .collect()
}

#[test]
fn awkward_lengths_every_dtype() {
    let mut rng = Rng(5);
    for dtype in FLOATS {
        for n in odd_lengths() {
            let r = rng.bytes(n * dtype.size());
            let t = nearby(dtype, &r, &mut rng, 40);
            let opts = &all_options()[(n + dtype.code() as usize) % 6];
            roundtrip(dtype, &[n as u64], &r, &t, opts);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn random_tensors_roundtrip(
        dtype_i in 0usize..6,
        rows in 1usize..40,
        cols in prop::sample::select(vec![1usize, 3, 31, 32, 33, 64, 100]),
        spread in prop::sample::select(vec![0u64, 1, 3, 100, 1 << 20]),
        seed in any::<u64>(),
        opt_i in 0usize..6,
    ) {
        let dtype = FLOATS[dtype_i];
        let mut rng = Rng(seed);
        let n = rows * cols;
        let r = rng.bytes(n * dtype.size());
        let t = nearby(dtype, &r, &mut rng, spread);
        roundtrip(dtype, &[rows as u64, cols as u64], &r, &t, &all_options()[opt_i]);
    }
}
