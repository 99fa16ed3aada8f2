//! Parity of every device's delta kernels with the reference, stage by stage and end to end.
//! Each check is written once as `fn check(backend)` and instantiated per device by
//! `parity_tests!` (after candle's `test_device!`; `tests/devices` says which are present and
//! which `LOCKSTEP_REQUIRE` makes mandatory). Exact means exact: bytes are compared, never
//! tolerances.

mod common;
mod devices;

use lockstep::backend::reference::ReferenceBackend;
use lockstep::backend::{Backend, DecodeJob, Device, EncodeJob};
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::blob::encode_modeled_only;
use lockstep::delta::parity::{first_difference, stages};
use lockstep::delta::{
    decode_tensor, decode_tensor_pieces, encode_batched, encode_tensor, EncodeOptions, Layout,
    LayoutChoice, TensorPair, CHUNK_ELEMS, LANES,
};
use lockstep::dtype::{DType, FloatLayout};
use lockstep::format::chunk::EncodedChunk;
use lockstep::format::tables::{StageTable, Tables};

const DATA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/data/trajectory-gpt2"
);
const FLOATS: [DType; 6] = [
    DType::F64,
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F8E4M3,
    DType::F8E5M2,
];

/// xorshift64*: deterministic test data without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A reference tensor of plausible weights and a target that mostly moved by a few ULPs with
/// a sign and a magnitude that follow the column, plus some wild and special values.
fn pair_bytes(dtype: DType, n: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    pair_bytes_with(dtype, n, cols, seed, false)
}

/// [`pair_bytes`], with `m2_by_column` the reference's top two mantissa bits set by the column
/// too (random m2 splits the Joint layout's neighbor-form contexts four ways for nothing,
/// so on such data that form never pays).
fn pair_bytes_with(
    dtype: DType,
    n: usize,
    cols: usize,
    seed: u64,
    m2_by_column: bool,
) -> (Vec<u8>, Vec<u8>) {
    let size = dtype.size();
    let w = size as u32 * 8;
    let fl = dtype.float_layout().unwrap();
    let mut rng = Rng(seed | 1);
    let (mut r, mut x) = (Vec::with_capacity(n * size), Vec::with_capacity(n * size));
    let mask = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
    let bias = (1u64 << (fl.exponent_bits - 1)) - 1;
    for j in 0..n {
        let k = rng.next();
        let exp = (bias - 1 - (k % 6)) << fl.mantissa_bits;
        let mut mant = rng.next() & ((1u64 << fl.mantissa_bits) - 1);
        if m2_by_column {
            let m2 = (j % cols.max(1) % 4) as u64;
            mant = mant & ((1u64 << (fl.mantissa_bits - 2)) - 1) | m2 << (fl.mantissa_bits - 2);
        }
        let rv = ((k >> 63) << (w - 1)) | exp | mant;
        let kind = rng.next() % 100;
        let col = j % cols.max(1);
        let col_sign = col.is_multiple_of(3);
        // Update magnitudes that follow the column, so an element's bit length is predicted by
        // the one a row up (the B stage's neighbor form pays).
        let col_scale = 1u64 << (2 + 3 * (col % 4));
        let xv = match kind {
            0..=9 => rv,
            10..=93 => {
                let step = rng.next() % (1 + (rng.next() % col_scale));
                // Negative floats move the other way in key order: follow the column there too.
                if col_sign ^ kind.is_multiple_of(5) ^ (k >> 63 == 1) {
                    rv.wrapping_add(step)
                } else {
                    rv.wrapping_sub(step)
                }
            }
            94..=96 => rng.next(),
            97 => 0,
            98 => 1u64 << (w - 1),
            _ => mask ^ (rng.next() & 3),
        } & mask;
        r.extend_from_slice(&rv.to_le_bytes()[..size]);
        x.extend_from_slice(&xv.to_le_bytes()[..size]);
    }
    (r, x)
}

fn shape_for(n: usize) -> Vec<u64> {
    // Rows of 48 when that divides n, so the sign stage's one-row-up context is exercised.
    if n.is_multiple_of(48) && n > 0 {
        vec![(n / 48) as u64, 48]
    } else if n.is_multiple_of(40) && n > 0 {
        // A row length that is not a multiple of 16 (vector lanes straddle the first row).
        vec![(n / 40) as u64, 40]
    } else if n.is_multiple_of(36) && n > 0 {
        // Nor of 8 (AVX2 vectors straddle every row start, a partial neighbor vector).
        vec![(n / 36) as u64, 36]
    } else {
        vec![n as u64]
    }
}

/// Which neighbor context forms the checked blobs used: (B, S).
#[derive(Default)]
struct Forms(bool, bool);

fn assert_same_stages(
    backend: &dyn Backend,
    pair: &TensorPair,
    opts: &EncodeOptions,
    what: &str,
) -> Forms {
    let want = stages(&ReferenceBackend, pair, opts).unwrap().unwrap();
    let got = stages(backend, pair, opts)
        .unwrap_or_else(|e| panic!("{what}: {} failed: {e}", backend.name()))
        .unwrap();
    assert_eq!(want.decoded, pair.target, "{what}: reference decode");
    assert_eq!(
        want.fast_decoded, pair.target,
        "{what}: reference fast decode"
    );
    if let Some(stage) = first_difference(&want, &got) {
        panic!(
            "{what}: {} differs from the reference at stage {stage}",
            backend.name()
        );
    }
    Forms(want.b_neighbor, want.s_neighbor)
}

/// Every float dtype, odd lengths around the lane count and the chunk size; rows of 48
/// where the length allows, so both neighbor context forms are chosen somewhere (checked).
pub fn random_every_dtype(backend: &dyn Backend, max_len: usize) {
    let lens = [
        0,
        1,
        LANES - 1,
        LANES,
        LANES + 1,
        48 * 40,
        40 * 1001,
        36 * 1001,
        CHUNK_ELEMS - 1,
        CHUNK_ELEMS + 1,
        // Two chunks, the second shorter than a row: no element there has a neighbor.
        48 * (CHUNK_ELEMS / 48 + 1),
    ];
    let mut seen = Forms::default();
    // The neighbor forms on rows of 36, whose starts are not vector aligned.
    let mut seen_36 = false;
    for (i, dtype) in FLOATS.into_iter().enumerate() {
        for (k, &n) in lens.iter().enumerate() {
            if n > max_len {
                continue;
            }
            let shape = shape_for(n);
            // Data whose columns follow rows of 36 there, so the neighbor forms pay.
            let cols = if shape.last() == Some(&36) { 36 } else { 48 };
            let (r, x) = pair_bytes(dtype, n, cols, (i * 100 + k) as u64 + 7);
            let pair = TensorPair {
                dtype,
                shape: &shape,
                reference: &r,
                target: &x,
            };
            for opts in options() {
                let what = format!("{dtype} n={n} {opts:?}");
                let f = assert_same_stages(backend, &pair, &opts, &what);
                seen_36 |= cols == 36 && (f.0 || f.1);
                seen = Forms(seen.0 | f.0, seen.1 | f.1);
            }
        }
    }
    assert!(
        seen.0 && seen.1,
        "the matrix never chose B's ({}) or S's ({}) neighbor form",
        seen.0,
        seen.1
    );
    assert!(
        seen_36 || max_len < 36 * 1001,
        "no neighbor form on rows of 36"
    );
}

fn options() -> [EncodeOptions; 5] {
    [
        EncodeOptions::default(),
        EncodeOptions {
            layout: LayoutChoice::Fast,
            condition_on_exponent: true,
        },
        EncodeOptions {
            layout: LayoutChoice::Fast,
            condition_on_exponent: false,
        },
        EncodeOptions {
            layout: LayoutChoice::Paper,
            condition_on_exponent: true,
        },
        EncodeOptions {
            layout: LayoutChoice::Signed,
            condition_on_exponent: false,
        },
    ]
}

/// Encode on one backend, decode on the other, both ways.
pub fn cross_decode(backend: &dyn Backend) {
    for (i, dtype) in FLOATS.into_iter().enumerate() {
        // Rows of 48: the neighbor context forms are in play.
        let n = 48 * (100 + i);
        let (r, x) = pair_bytes(dtype, n, 48, 99 + i as u64);
        let shape = [(n / 48) as u64, 48];
        let pair = TensorPair {
            dtype,
            shape: &shape,
            reference: &r,
            target: &x,
        };
        for layout in [LayoutChoice::Auto, LayoutChoice::Fast] {
            let opts = EncodeOptions {
                layout,
                ..EncodeOptions::default()
            };
            let (ours, _) = encode_tensor(&pair, &opts, backend).unwrap();
            let (theirs, _) = encode_tensor(&pair, &opts, &ReferenceBackend).unwrap();
            assert_eq!(ours, theirs, "{dtype} {layout:?}");
            assert_eq!(decode_tensor(&ours, &r, &ReferenceBackend).unwrap(), x);
            assert_eq!(decode_tensor(&theirs, &r, backend).unwrap(), x);
        }
    }
}

/// The entropy coder over every 16-bit target pattern (bf16, f16) and every 8-bit pair (fp8),
/// in the Modeled mode even where raw would win: the reference's blob, and its decode.
pub fn every_pattern_modeled(backend: &dyn Backend) {
    let mut cases: Vec<(DType, Vec<u8>, Vec<u8>)> = Vec::new();
    for dtype in [DType::BF16, DType::F16] {
        let t: Vec<u8> = (0..65536u32)
            .flat_map(|i| (i as u16).to_le_bytes())
            .collect();
        let r: Vec<u8> = (0..65536u32)
            .flat_map(|i| ((i * 40503) as u16).to_le_bytes())
            .collect();
        cases.push((dtype, r, t));
    }
    for dtype in [DType::F8E4M3, DType::F8E5M2] {
        let r: Vec<u8> = (0..65536u32).map(|i| (i >> 8) as u8).collect();
        let t: Vec<u8> = (0..65536u32).map(|i| i as u8).collect();
        cases.push((dtype, r, t));
    }
    let shape = [256u64, 256];
    for (dtype, r, t) in &cases {
        let pair = TensorPair {
            dtype: *dtype,
            shape: &shape,
            reference: r,
            target: t,
        };
        for opts in options() {
            let (want, _) = encode_modeled_only(&pair, &opts, &ReferenceBackend).unwrap();
            let (got, _) = encode_modeled_only(&pair, &opts, backend).unwrap();
            assert!(
                want == got,
                "{dtype} {opts:?}: {} blob differs",
                backend.name()
            );
            assert_eq!(
                &decode_tensor(&got, r, backend).unwrap(),
                t,
                "{dtype} {opts:?}"
            );
        }
    }
}

/// A corrupted stream (valid checksum, wrong content) is an error on every backend; so is
/// the joint layout asked of floats wider than it is defined for.
pub fn corrupt_streams_error(backend: &dyn Backend) {
    let (r, x) = pair_bytes(DType::F64, 100, 50, 3);
    let fl = DType::F64.float_layout().unwrap();
    let job = EncodeJob {
        fl,
        reference: &r,
        target: &x,
        condition: true,
    };
    let resident = backend.residuals(&job).unwrap();
    let e = resident
        .histograms(Layout::Joint, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("joint (fast) layout for 64-bit floats"), "{e}");
    let e = resident
        .encode(Layout::Joint, &Tables { stages: vec![] }, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("joint (fast) layout for 64-bit floats"), "{e}");

    // One block of the AVX2 level's blocked decode, and several (its checks run per block).
    for n in [3000, 9000] {
        corrupt_bf16(backend, n);
    }
}

/// Flip one bit at a time in `n`-element bf16 blobs of both layouts: `backend` must fail
/// where the reference fails and decode the same bytes where it does not.
fn corrupt_bf16(backend: &dyn Backend, n: usize) {
    let (r, x) = pair_bytes(DType::BF16, n, 48, 5);
    let shape = [n as u64];
    let pair = TensorPair {
        dtype: DType::BF16,
        shape: &shape,
        reference: &r,
        target: &x,
    };
    let fast = EncodeOptions {
        layout: LayoutChoice::Fast,
        ..EncodeOptions::default()
    };
    let (blob, _) = encode_tensor(&pair, &EncodeOptions::default(), backend).unwrap();
    let (fast_blob, _) = encode_tensor(&pair, &fast, backend).unwrap();
    let mut rng = Rng(77);
    for i in 0..80 {
        let blob = if i % 2 == 0 { &blob } else { &fast_blob };
        let mut bad = blob.clone();
        let body = bad.len() - 4;
        let at = 20 + (rng.next() as usize % (body - 20));
        bad[at] ^= 1 << (rng.next() % 8);
        let crc = crc32fast::hash(&bad[..body]);
        bad[body..].copy_from_slice(&crc.to_le_bytes());
        let want = decode_tensor(&bad, &r, &ReferenceBackend);
        let got = decode_tensor(&bad, &r, backend);
        assert_eq!(want.is_ok(), got.is_ok(), "byte {at}: {want:?} vs {got:?}");
        if let (Ok(a), Ok(b)) = (want, got) {
            assert_eq!(a, b);
        }
    }
}

/// The Joint layout's tables and lanes of `backend` for one pair, coded directly (no blob).
fn joint_lanes(
    backend: &dyn Backend,
    fl: FloatLayout,
    r: &[u8],
    x: &[u8],
) -> (Tables, Vec<EncodedChunk>) {
    let resident = backend
        .residuals(&EncodeJob {
            fl,
            reference: r,
            target: x,
            condition: true,
        })
        .unwrap();
    let hist = resident.histograms(Layout::Joint, None).unwrap();
    let tables = Tables {
        stages: hist.iter().map(|h| StageTable::select(h, true)).collect(),
    };
    let chunks = resident.encode(Layout::Joint, &tables, None).unwrap();
    (tables, chunks)
}

/// `--fast` on tensors of a million elements and more, where the AVX2 lanes index their
/// slots by context (`JointDec::window_slots`): the reference's blob and bytes, and decoded
/// against a reference with exponent classes the blob has no rows for, inside the lanes'
/// window of contexts and below it: the reference backend's error or bytes.
pub fn large_fast(backend: &dyn Backend, max_len: usize) {
    let n = (1 << 20) + 37;
    if n > max_len {
        return;
    }
    let fast = EncodeOptions {
        layout: LayoutChoice::Fast,
        ..EncodeOptions::default()
    };
    for (i, dtype) in [DType::BF16, DType::F32].into_iter().enumerate() {
        let (r, x) = pair_bytes(dtype, n, 48, 31 + i as u64);
        let shape = [n as u64];
        let pair = TensorPair {
            dtype,
            shape: &shape,
            reference: &r,
            target: &x,
        };
        let (blob, _) = encode_tensor(&pair, &fast, backend).unwrap();
        let (want, _) = encode_tensor(&pair, &fast, &ReferenceBackend).unwrap();
        assert!(
            blob == want,
            "{dtype}: {} coded another blob",
            backend.name()
        );
        assert!(decode_tensor(&blob, &r, backend).unwrap() == x, "{dtype}");
        // The lanes straight from the reference's tables and chunks (a blob would refuse the
        // other reference by its CRC-32 before decoding).
        let fl = dtype.float_layout().unwrap();
        let (tables, chunks) = joint_lanes(&ReferenceBackend, fl, &r, &x);
        let views = lockstep::format::chunk::views(&chunks);
        let size = dtype.size();
        // Only the explicit rows mapped (no backoff): a context they do not cover has no row.
        let mut tables = tables;
        let t = &mut tables.stages[0];
        let explicit: Vec<u32> = t.explicit.iter().map(|&(c, _)| c).collect();
        for (c, r) in t.map.iter_mut().enumerate() {
            if !explicit.contains(&(c as u32)) {
                *r = u32::MAX;
            }
        }
        // Exponents 4 and 40 below the lowest the pair has (inside the lanes' window of
        // contexts and below it), so not among the explicit rows.
        let mut errors = 0;
        for below in [4u64, 40] {
            let mut other = r.clone();
            let bias = (1u64 << (fl.exponent_bits - 1)) - 1;
            let m = (1u64 << fl.mantissa_bits) - 1;
            for e in other.chunks_exact_mut(size).step_by(997) {
                let mut v = [0u8; 8];
                v[..size].copy_from_slice(e);
                let v = u64::from_le_bytes(v);
                let sign = v & (1 << (size * 8 - 1));
                let v = sign | (bias - 6 - below) << fl.mantissa_bits | (v & m);
                e.copy_from_slice(&v.to_le_bytes()[..size]);
            }
            let job = DecodeJob {
                fl,
                layout: Layout::Joint,
                condition: true,
                distance: None,
                tables: &tables,
                chunks: &views,
                reference: &other,
            };
            let want = ReferenceBackend.decode(&job);
            let got = backend.decode(&job);
            assert_eq!(
                want.is_ok(),
                got.is_ok(),
                "{dtype} {below}: {want:?} vs {got:?}"
            );
            errors += want.is_err() as usize;
            if let (Ok(a), Ok(b)) = (want, got) {
                assert!(a == b, "{dtype} {below}: other bytes");
            }
        }
        assert!(errors > 0, "{dtype}: no missing row was met");
    }
}

/// The piecewise decode (`decode_tensor_pieces`, what the CLI's decode and every encode's
/// verify use): over a tensor of four chunks (the last short) in every layout a large
/// tensor takes, pieces of 1, 2, 3 and 5 chunks join to the target, and the pieces are
/// those sizes (where the device splits at all: by default a device hands over one piece);
/// an identical and a raw blob too; a damaged chunk is an error however the pieces fall
/// (nothing taken for good), and an error of the sink's own comes back as it is.
pub fn pieces(backend: &dyn Backend, max_len: usize) {
    let n = 3 * CHUNK_ELEMS + 48;
    if n > max_len {
        return;
    }
    for (i, dtype) in [DType::BF16, DType::F32].into_iter().enumerate() {
        let (r, x) = pair_bytes(dtype, n, 48, 61 + i as u64);
        let shape = [(n / 48) as u64, 48];
        let chunk_bytes = CHUNK_ELEMS * dtype.size();
        let pair = TensorPair {
            dtype,
            shape: &shape,
            reference: &r,
            target: &x,
        };
        for layout in [
            LayoutChoice::Auto,
            LayoutChoice::Fast,
            LayoutChoice::FastNeighbor,
        ] {
            let opts = EncodeOptions {
                layout,
                ..EncodeOptions::default()
            };
            let (blob, _) = encode_tensor(&pair, &opts, backend).unwrap();
            for per in [1, 2, 3, 5] {
                let mut got = Vec::new();
                let mut sizes = Vec::new();
                decode_tensor_pieces(&blob, &r, backend, Some(per), &mut |p| {
                    got.extend_from_slice(p);
                    sizes.push(p.len());
                    Ok(())
                })
                .unwrap();
                assert!(got == x, "{dtype} {layout:?} {per}: other bytes");
                let whole = sizes == [x.len()];
                let split = sizes.iter().rev().skip(1).all(|&s| s == per * chunk_bytes);
                assert!(whole || split, "{dtype} {layout:?} {per}: pieces {sizes:?}");
            }
            // A bit flipped in the middle of the chunks' data (the blob's own CRC-32
            // mended, so the decode meets it): an error, whatever the pieces.
            let mut bad = blob.clone();
            let at = bad.len() / 2;
            bad[at] ^= 0x10;
            let body = bad.len() - 4;
            let crc = crc32fast::hash(&bad[..body]);
            bad[body..].copy_from_slice(&crc.to_le_bytes());
            assert!(
                decode_tensor(&bad, &r, backend).is_err(),
                "{dtype} {layout:?}"
            );
            for per in [1, 3] {
                let r = decode_tensor_pieces(&bad, &r, backend, Some(per), &mut |_| Ok(()));
                assert!(r.is_err(), "{dtype} {layout:?} {per}: damage not found");
            }
            // The sink's own error, not the blob's.
            let e = decode_tensor_pieces(&blob, &r, backend, Some(1), &mut |_| {
                Err(lockstep::Error::Invalid("the sink is full".into()))
            })
            .unwrap_err();
            assert_eq!(e.to_string(), "the sink is full", "{dtype} {layout:?}");
        }
    }
    // Identical and raw blobs hand over their bytes in one piece.
    let (r, _) = pair_bytes(DType::BF16, 1000, 50, 7);
    let noise: Vec<u8> = {
        let mut g = Rng(77);
        (0..2000).map(|_| g.next() as u8).collect()
    };
    for (x, what) in [(r.clone(), "identical"), (noise, "raw")] {
        let shape = [1000u64];
        let pair = TensorPair {
            dtype: DType::BF16,
            shape: &shape,
            reference: &r,
            target: &x,
        };
        let (blob, report) = encode_tensor(&pair, &EncodeOptions::default(), backend).unwrap();
        assert_eq!(format!("{:?}", report.mode.unwrap()).to_lowercase(), what);
        let mut got = Vec::new();
        decode_tensor_pieces(&blob, &r, backend, None, &mut |p| {
            got.extend_from_slice(p);
            Ok(())
        })
        .unwrap();
        assert!(got == x, "{what}");
    }
}

use common::golden_cases as golden;

/// Encode every golden case on `backend`: exactly the golden bytes; decode every golden blob
/// on `backend`: exactly the target.
pub fn golden_blobs(backend: &dyn Backend) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");
    for c in golden::cases() {
        let blob = std::fs::read(format!("{dir}/{}.lsdb", c.name)).unwrap();
        let pair = TensorPair {
            dtype: c.dtype,
            shape: &c.shape,
            reference: &c.reference,
            target: &c.target,
        };
        let (ours, _) = encode_tensor(&pair, &c.opts, backend).unwrap();
        assert!(
            ours == blob,
            "{}: {} does not emit the golden bytes",
            c.name,
            backend.name()
        );
        assert_eq!(
            decode_tensor(&blob, &c.reference, backend).unwrap(),
            c.target,
            "{}: {} decode of the golden blob",
            c.name,
            backend.name()
        );
    }
}

fn open(name: &str) -> Option<Checkpoint> {
    let path = format!("{DATA}/{name}");
    if !std::path::Path::new(&path).exists() {
        eprintln!("SKIP: {path} is absent (the shared trajectory is not checked out here)");
        return None;
    }
    Some(Checkpoint::open(&path).unwrap())
}

fn real_pairs<'a>(
    r: &'a Checkpoint,
    t: &'a Checkpoint,
    max_elems: usize,
) -> Vec<(String, TensorPair<'a>)> {
    t.tensors
        .iter()
        .filter(|e| e.shape.iter().product::<u64>() as usize <= max_elems)
        .map(|e| {
            (
                e.name.clone(),
                TensorPair {
                    dtype: e.dtype,
                    shape: &e.shape,
                    reference: r.data(r.get(&e.name).unwrap()),
                    target: t.data(e),
                },
            )
        })
        .collect()
}

/// The real trajectory, bf16 and fp32, every tensor up to `max_elems`, stage by stage.
pub fn real_trajectory(backend: &dyn Backend, max_elems: usize) {
    for (a, b) in [
        (
            "gpt2_step000200_bf16.safetensors",
            "gpt2_step000400_bf16.safetensors",
        ),
        (
            "gpt2_step000600_fp32.safetensors",
            "gpt2_step000800_fp32.safetensors",
        ),
    ] {
        let (Some(r), Some(t)) = (open(a), open(b)) else {
            return;
        };
        for (name, pair) in real_pairs(&r, &t, max_elems) {
            if pair.dtype.is_float() {
                let _ = assert_same_stages(backend, &pair, &EncodeOptions::default(), &name);
            }
        }
    }
}

/// Thread counts 1, 2, 7 and several batch budgets give the same blobs.
pub fn threads_and_budgets(backend: &dyn Backend, max_elems: usize) {
    let Some(r) = open("gpt2_step000600_bf16.safetensors") else {
        return;
    };
    let Some(t) = open("gpt2_step000800_bf16.safetensors") else {
        return;
    };
    let pairs: Vec<TensorPair> = real_pairs(&r, &t, max_elems)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    let opts = EncodeOptions::default();
    let want = encode_batched(&pairs, &opts, usize::MAX, &ReferenceBackend).unwrap();
    for threads in [1, 2, 7] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for budget in [1 << 16, 1 << 20, 64 << 20] {
            let got = pool.install(|| encode_batched(&pairs, &opts, budget, backend).unwrap());
            assert!(
                got.iter().map(|g| &g.0).eq(want.iter().map(|w| &w.0)),
                "threads={threads} budget={budget}"
            );
        }
    }
}

/// Chunks that barely change: a whole chunk's stream is shorter than one step's worth of
/// words (`LANES`), so a vector decoder that reads the stream unpadded must hand over to its
/// padded remainder at once, and the codes of thousands of steps still come out. The Joint
/// lanes (where the vector decoders read the stream unpadded), coded and decoded directly,
/// since the blob would pick another mode for so quiet a tensor.
pub fn quiet_chunks(backend: &dyn Backend) {
    for dtype in [DType::BF16, DType::F32, DType::F8E4M3] {
        let n = CHUNK_ELEMS + 3 * LANES + 5;
        let (r, _) = pair_bytes(dtype, n, 48, 5);
        let size = dtype.size();
        let mut x = r.clone();
        // One element in 50 000 moves by one ULP (the lowest byte, little-endian).
        for j in (17..n).step_by(50_000) {
            x[j * size] ^= 1;
        }
        let fl = dtype.float_layout().unwrap();
        let mut per_backend = Vec::new();
        // This backend's lanes and the reference's, each decoded by this backend.
        for b in [backend, &ReferenceBackend as &dyn Backend] {
            let (tables, chunks) = joint_lanes(b, fl, &r, &x);
            assert!(
                chunks[0].words.len() < LANES,
                "{dtype}: {} words, not a quiet chunk",
                chunks[0].words.len()
            );
            let decoded = backend
                .decode(&DecodeJob {
                    fl,
                    layout: Layout::Joint,
                    condition: true,
                    distance: None,
                    tables: &tables,
                    chunks: &lockstep::format::chunk::views(&chunks),
                    reference: &r,
                })
                .unwrap_or_else(|e| panic!("{dtype}: {} failed: {e}", backend.name()));
            assert!(
                decoded == x,
                "{dtype}: {} decoded other bytes",
                backend.name()
            );
            per_backend.push(chunks);
        }
        assert!(
            per_backend[0] == per_backend[1],
            "{dtype}: {} coded other lanes than the reference",
            backend.name()
        );
    }
}

/// The Joint layout's neighbor form (`LayoutChoice::FastNeighbor`), on the devices that code
/// it: the same verified blobs as the reference (histograms, row choice and lanes all show in
/// the bytes), each decoded by the other, on random tensors of every float dtype (rows of 48
/// and 36, odd lengths, two chunks) and the real trajectory; the neighbor form is chosen
/// somewhere (checked).
pub fn fast_neighbor(backend: &dyn Backend, max_len: usize) {
    let opts = EncodeOptions {
        layout: LayoutChoice::FastNeighbor,
        ..EncodeOptions::default()
    };
    let check = |pair: &TensorPair, what: &str| -> bool {
        let (ours, report) = encode_tensor(pair, &opts, backend)
            .unwrap_or_else(|e| panic!("{what}: {} failed: {e}", backend.name()));
        let (theirs, _) = encode_tensor(pair, &opts, &ReferenceBackend).unwrap();
        assert!(
            ours == theirs,
            "{what}: {} coded other bytes",
            backend.name()
        );
        let back = decode_tensor(&theirs, pair.reference, backend).unwrap();
        assert!(
            back == pair.target,
            "{what}: {} decoded other bytes",
            backend.name()
        );
        report.j_neighbor
    };
    let mut seen = false;
    let lens = [
        0,
        1,
        LANES + 1,
        48 * 40,
        36 * 1001,
        CHUNK_ELEMS + 1,
        48 * (CHUNK_ELEMS / 48 + 1),
    ];
    for (i, dtype) in FLOATS.into_iter().enumerate() {
        for (k, &n) in lens.iter().enumerate().filter(|&(_, &n)| n <= max_len) {
            let shape = shape_for(n);
            let cols = if shape.last() == Some(&36) { 36 } else { 48 };
            let (r, x) = pair_bytes_with(dtype, n, cols, (i * 100 + k) as u64 + 11, true);
            let pair = TensorPair {
                dtype,
                shape: &shape,
                reference: &r,
                target: &x,
            };
            seen |= check(&pair, &format!("{dtype} n={n}"));
        }
    }
    assert!(
        seen,
        "the matrix never chose the joint stage's neighbor form"
    );
    // Rows half a chunk wide: half of each chunk's elements have no neighbor, enough for
    // their contexts to get rows of their own, whose ids pin the no-neighbor context. The
    // fp32 rows 3 short of that: the second chunk ends in a partial step (the vector lanes
    // leave it to the portable ones).
    for (i, dtype) in [DType::BF16, DType::F32].into_iter().enumerate() {
        let cols = CHUNK_ELEMS / 2 - 3 * i;
        if 4 * cols > max_len {
            continue;
        }
        let shape = [4, cols as u64];
        let (r, x) = pair_bytes_with(dtype, 4 * cols, cols, 31 + i as u64, true);
        let pair = TensorPair {
            dtype,
            shape: &shape,
            reference: &r,
            target: &x,
        };
        let what = format!("{dtype} rows of {cols}");
        assert!(
            check(&pair, &what),
            "{what}: the neighbor form was not chosen"
        );
    }
    // Moves of at most 3 ULPs that follow the column: the neighbor form pays, and the raw
    // tails are (almost) empty, so the AVX2 tail pass fused into the lanes' loop stops (or
    // never starts) blocks before the chunk ends and the scalar pass does the rest from the
    // codes the lanes stored (through `decode::CodeWindow` at AVX2).
    for (i, dtype) in [DType::BF16, DType::F32].into_iter().enumerate() {
        // Two chunks, the second ending in a partial step.
        let cols = 40;
        let n = (2 * CHUNK_ELEMS - 5) / cols * cols;
        let (r, _) = pair_bytes_with(dtype, n, cols, 41 + i as u64, true);
        let size = dtype.size();
        let mut x = r.clone();
        for (j, e) in x.chunks_exact_mut(size).enumerate() {
            let col = j % cols;
            // 0..=3 ULPs, up or down by the column; one element in 997 moves far.
            let step = if j % 997 == 0 {
                1 << 20
            } else {
                col as u64 % 4
            };
            let mut v = [0u8; 8];
            v[..size].copy_from_slice(e);
            let v = u64::from_le_bytes(v);
            let v = if col % 3 == 0 {
                v.wrapping_add(step)
            } else {
                v.wrapping_sub(step)
            };
            e.copy_from_slice(&v.to_le_bytes()[..size]);
        }
        let shape = [(n / cols) as u64, cols as u64];
        let pair = TensorPair {
            dtype,
            shape: &shape,
            reference: &r,
            target: &x,
        };
        let what = format!("{dtype} moves of 0-3 ULPs");
        assert!(
            check(&pair, &what),
            "{what}: the neighbor form was not chosen"
        );
    }
    for name in [
        "gpt2_step000400_bf16.safetensors",
        "gpt2_step000800_fp32.safetensors",
    ] {
        let prev = name.replace("400", "200").replace("800", "600");
        let (Some(r), Some(t)) = (open(&prev), open(name)) else {
            return;
        };
        let mut chosen = 0;
        for (name, pair) in real_pairs(&r, &t, max_len) {
            if pair.dtype.is_float() {
                chosen += check(&pair, &name) as usize;
            }
        }
        assert!(chosen > 0, "{name}: no tensor chose the neighbor form");
    }
}

macro_rules! fast_neighbor_tests {
    ($($name:ident: $check:expr),* $(,)?) => {
        mod fast_neighbor {
            use super::*;
            $(
                #[test]
                fn $name() {
                    if let Some(d) = devices::device(stringify!($name)) {
                        #[allow(clippy::redundant_closure_call)]
                        ($check)(d.delta().unwrap());
                    }
                }
            )*
        }
    };
}

fast_neighbor_tests!(
    portable: |b| fast_neighbor(b, usize::MAX),
    neon: |b| fast_neighbor(b, usize::MAX),
    avx2: |b| fast_neighbor(b, usize::MAX),
    avx512: |b| fast_neighbor(b, usize::MAX),
    wgpu: |b| fast_neighbor(b, usize::MAX),
    cuda: |b| fast_neighbor(b, usize::MAX),
    cuda_emulated: |b| fast_neighbor(b, usize::MAX),
);

/// The AVX2 neighbor form (decode lanes, encoder's entries and lanes) looks its tables up
/// by gathers or by scalar loads, chosen per CPU (`Avx2Lookups`): both ways, whichever this
/// machine would pick.
#[test]
fn fast_neighbor_avx2_both_lookups() {
    use lockstep::backend::cpu::{set_avx2_lookups, Avx2Lookups};
    if let Some(d) = devices::device("avx2") {
        for l in [Avx2Lookups::ScalarLoads, Avx2Lookups::Gathers] {
            set_avx2_lookups(l);
            fast_neighbor(d.delta().unwrap(), usize::MAX);
        }
        set_avx2_lookups(Avx2Lookups::Auto);
    }
}

/// The AVX-512 level decodes the Joint layout with its own lanes or with the AVX2 ones,
/// chosen per CPU (`Avx512JointDecode`): both, whichever this machine would pick, on the
/// checks whose blobs use that layout (`--fast`, the neighbor form, damaged streams, pieces).
#[test]
fn avx512_joint_decode_both_lanes() {
    use lockstep::backend::cpu::{set_avx512_joint_decode, Avx512JointDecode};
    if let Some(d) = devices::device("avx512") {
        for l in [Avx512JointDecode::Avx512Lanes, Avx512JointDecode::Avx2Lanes] {
            set_avx512_joint_decode(l);
            let b = d.delta().unwrap();
            large_fast(b, usize::MAX);
            fast_neighbor(b, usize::MAX);
            corrupt_streams_error(b);
            pieces(b, usize::MAX);
        }
        set_avx512_joint_decode(Avx512JointDecode::Auto);
    }
}

macro_rules! parity_tests {
    ($name:ident, $max_len:expr, $batch_elems:expr) => {
        parity_tests!($name, $max_len, $batch_elems, usize::MAX);
    };
    ($name:ident, $max_len:expr, $batch_elems:expr, $trajectory_elems:expr) => {
        mod $name {
            use super::*;

            fn device() -> Option<Device> {
                devices::device(stringify!($name))
            }

            #[test]
            fn random_tensors_every_dtype_and_odd_length() {
                if let Some(d) = device() {
                    random_every_dtype(d.delta().unwrap(), $max_len);
                }
            }

            #[test]
            fn large_fast_layout() {
                if let Some(d) = device() {
                    large_fast(d.delta().unwrap(), $max_len);
                }
            }

            #[test]
            fn golden_blobs_encode_and_decode() {
                if let Some(d) = device() {
                    golden_blobs(d.delta().unwrap());
                }
            }

            #[test]
            fn every_bit_pattern_in_modeled_mode() {
                if let Some(d) = device() {
                    every_pattern_modeled(d.delta().unwrap());
                }
            }

            #[test]
            fn decode_in_pieces() {
                if let Some(d) = device() {
                    pieces(d.delta().unwrap(), $max_len);
                }
            }

            #[test]
            fn cross_backend_decode() {
                if let Some(d) = device() {
                    cross_decode(d.delta().unwrap());
                }
            }

            #[test]
            fn quiet_chunks_decode() {
                if let Some(d) = device() {
                    quiet_chunks(d.delta().unwrap());
                }
            }

            #[test]
            fn corrupt_streams_are_errors() {
                if let Some(d) = device() {
                    corrupt_streams_error(d.delta().unwrap());
                }
            }

            #[test]
            fn real_trajectory_stage_by_stage() {
                if let Some(d) = device() {
                    real_trajectory(d.delta().unwrap(), $trajectory_elems);
                }
            }

            #[test]
            fn thread_counts_and_batch_budgets() {
                if let Some(d) = device() {
                    threads_and_budgets(d.delta().unwrap(), $batch_elems);
                }
            }
        }
    };
}

// The auto-selected CPU backend is one of these levels (the best this CPU runs).
parity_tests!(portable, usize::MAX, usize::MAX);
// Absent on x86; on aarch64 (natively or under qemu: `cargo xtask cross`) it runs.
parity_tests!(neon, usize::MAX, usize::MAX);
parity_tests!(avx2, usize::MAX, usize::MAX);
parity_tests!(avx512, usize::MAX, usize::MAX);
// lavapipe is slow: the batch matrix runs on the tensors up to 1M elements (all but the
// embeddings); the stage-by-stage test above covers the whole checkpoint once.
parity_tests!(wgpu, usize::MAX, 1 << 20);
// A CUDA GPU: skipped without a driver, or a failure where LOCKSTEP_REQUIRE names it.
parity_tests!(cuda, usize::MAX, usize::MAX);
// The same CUDA kernels in their host emulation (kernels/host/emulate.h): runs everywhere,
// so CI checks the kernels' integer logic and indexing. An emulation, not a GPU, and slow
// (its lane decoder switches threads at every ballot): by default the random tensors stop
// at two chunks (2^18 + 1 elements) and the real trajectory and batch matrix take the
// tensors up to 1M and 64K elements; LOCKSTEP_CUDA_EMULATED_FULL=1 runs everything.
parity_tests!(
    cuda_emulated,
    emulated_limit(CHUNK_ELEMS + 1),
    emulated_limit(1 << 16),
    emulated_limit(1 << 20)
);

fn emulated_limit(n: usize) -> usize {
    match std::env::var("LOCKSTEP_CUDA_EMULATED_FULL").as_deref() {
        Ok("1") => usize::MAX,
        _ => n,
    }
}

/// CUDA-encoded blobs decode on the CPU and on wgpu, and theirs decode on CUDA, in both
/// layouts (the default and `--fast`), with rows of 48 so the neighbor contexts are in play.
/// CUDA here is every CUDA device present: the host emulation always (an emulation of the
/// kernels, not a GPU), a GPU where there is one.
#[test]
fn cuda_emulated_and_gpu_cross_decode_with_cpu_and_wgpu() {
    let mut cuda: Vec<Device> = devices::device("cuda_emulated").into_iter().collect();
    cuda.extend(devices::device("cuda"));
    let mut others = vec![Device::cpu()];
    others.extend(devices::device("wgpu"));
    for (i, dtype) in FLOATS.into_iter().enumerate() {
        let n = 48 * (1000 + i);
        let (r, x) = pair_bytes(dtype, n, 48, 1234 + i as u64);
        let shape = [(n / 48) as u64, 48];
        let pair = TensorPair {
            dtype,
            shape: &shape,
            reference: &r,
            target: &x,
        };
        for layout in [LayoutChoice::Auto, LayoutChoice::Fast] {
            let opts = EncodeOptions {
                layout,
                ..EncodeOptions::default()
            };
            for c in &cuda {
                let c = c.delta().unwrap();
                let (ours, _) = encode_tensor(&pair, &opts, c).unwrap();
                for o in &others {
                    let o = o.delta().unwrap();
                    let (theirs, _) = encode_tensor(&pair, &opts, o).unwrap();
                    let what = format!("{dtype} {layout:?} {} / {}", c.name(), o.name());
                    assert_eq!(ours, theirs, "{what}: different blobs");
                    assert_eq!(decode_tensor(&ours, &r, o).unwrap(), x, "{what}");
                    assert_eq!(decode_tensor(&theirs, &r, c).unwrap(), x, "{what}");
                }
            }
        }
    }
}
