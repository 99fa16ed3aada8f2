//! Blobs are tensor-local: batch boundaries and thread counts never change a byte.

mod common;

use lockstep::delta::{encode_batched, EncodeOptions, TensorPair, CHUNK_ELEMS};
use lockstep::dtype::DType;

/// dtype, shape, reference bytes, target bytes.
type Case = (DType, Vec<u64>, Vec<u8>, Vec<u8>);

#[test]
fn bytes_do_not_depend_on_batch_budget_or_threads() {
    // Mixed dtypes and sizes, one tensor spanning several chunks.
    let tensors: Vec<Case> = vec![
        {
            let (r, t) = common::bf16_pair(3 * CHUNK_ELEMS + 77, 1);
            (DType::BF16, vec![(3 * CHUNK_ELEMS + 77) as u64], r, t)
        },
        {
            let (r, t) = common::bf16_pair(5000, 2);
            (DType::BF16, vec![50, 100], r, t)
        },
        {
            let r: Vec<u8> = (0..4000)
                .flat_map(|i| ((i as f32).sin() * 0.1).to_le_bytes())
                .collect();
            let t: Vec<u8> = (0..4000)
                .flat_map(|i| ((i as f32).sin() * 0.1 + 1e-5).to_le_bytes())
                .collect();
            (DType::F32, vec![40, 100], r, t)
        },
        (
            DType::I64,
            vec![128],
            (0..128i64).flat_map(|i| i.to_le_bytes()).collect(),
            (0..128i64).flat_map(|i| (i + 1).to_le_bytes()).collect(),
        ),
        {
            let (r, t) = common::bf16_pair(17, 3);
            (DType::BF16, vec![17], r, t)
        },
    ];
    let pairs: Vec<TensorPair> = tensors
        .iter()
        .map(|(d, s, r, t)| TensorPair {
            dtype: *d,
            shape: s,
            reference: r,
            target: t,
        })
        .collect();
    let run = |threads: usize, budget: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            encode_batched(
                &pairs,
                &EncodeOptions::default(),
                budget,
                &lockstep::backend::cpu::CpuBackend,
            )
            .unwrap()
        })
        .into_iter()
        .map(|(blob, _)| blob)
        .collect::<Vec<_>>()
    };
    let baseline = run(1, usize::MAX);
    for threads in [1, 2, 7] {
        for budget in [1, 10_000, 1 << 20, 64 << 20] {
            assert!(
                run(threads, budget) == baseline,
                "threads={threads} budget={budget}"
            );
        }
    }
}

#[test]
fn batches_respect_the_budget() {
    let b = lockstep::delta::batches([10, 10, 10, 50, 5], 25);
    assert_eq!(b, vec![0..2, 2..3, 3..4, 4..5]);
    assert!(lockstep::delta::batches(Vec::<usize>::new(), 10).is_empty());
}

/// Whole `.lsd` files: one batch per tensor (each written while the next is coded), a few,
/// or one, on one thread or several: the same file, and it decodes.
#[test]
fn lsd_files_do_not_depend_on_batch_budget_or_threads() {
    use lockstep::checkpoint::Checkpoint;
    use lockstep::delta::file::{decode_file, encode_file};
    use lockstep::delta::DEFAULT_BATCH_BYTES;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = common::small_pair(dir.path());
    let (ra, rb) = (Checkpoint::open(&a).unwrap(), Checkpoint::open(&b).unwrap());
    let device = lockstep::backend::Device::cpu();
    let run = |threads: usize, budget: usize| {
        let out = dir.path().join(format!("{threads}-{budget}.lsd"));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            encode_file(&ra, &rb, &out, &EncodeOptions::default(), budget, &device).unwrap()
        });
        std::fs::read(&out).unwrap()
    };
    let baseline = run(1, DEFAULT_BATCH_BYTES);
    for threads in [1, 2, 5] {
        for budget in [1, 20_000, DEFAULT_BATCH_BYTES] {
            assert!(
                run(threads, budget) == baseline,
                "threads={threads} budget={budget}"
            );
        }
    }
    let back = dir.path().join("back.safetensors");
    decode_file(&ra, &baseline, &back, &device).unwrap();
    assert!(std::fs::read(&back).unwrap() == rb.bytes());
}
