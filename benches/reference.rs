//! Single-thread throughput of the CPU reference delta codec on a real bf16 delta (the demo's
//! step 600 -> 800 transformer blocks), encode with and without the verifying decode, and decode.
//! `cargo bench --bench reference`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::{blob, decode_tensor, encode_tensor, EncodeOptions, TensorPair};

fn bench(c: &mut Criterion) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/demo");
    let r = Checkpoint::open(format!("{dir}/step0600_blocks_bf16.safetensors")).unwrap();
    let t = Checkpoint::open(format!("{dir}/step0800_blocks_bf16.safetensors")).unwrap();
    let pairs: Vec<TensorPair> = t
        .tensors
        .iter()
        .map(|e| TensorPair {
            dtype: e.dtype,
            shape: &e.shape,
            reference: r.data(r.get(&e.name).unwrap()),
            target: t.data(e),
        })
        .collect();
    let bytes: usize = pairs.iter().map(|p| p.target.len()).sum();
    let opts = EncodeOptions::default();
    // The default backend, as encode_tensor uses (benches/delta.rs compares backends).
    let backend = lockstep::backend::default_backend();
    let blobs: Vec<Vec<u8>> = pairs
        .iter()
        .map(|p| encode_tensor(p, &opts).unwrap().0)
        .collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();

    let mut g = c.benchmark_group("reference_bf16_1thread");
    g.throughput(Throughput::Bytes(bytes as u64));
    g.sample_size(10);
    g.bench_function("encode", |b| {
        b.iter(|| {
            pool.install(|| {
                pairs
                    .iter()
                    .map(|p| {
                        blob::encode_unverified(p, &opts, &*backend)
                            .unwrap()
                            .0
                            .len()
                    })
                    .sum::<usize>()
            })
        })
    });
    g.bench_function("encode_verified", |b| {
        b.iter(|| {
            pool.install(|| {
                pairs
                    .iter()
                    .map(|p| encode_tensor(p, &opts).unwrap().0.len())
                    .sum::<usize>()
            })
        })
    });
    g.bench_function("decode", |b| {
        b.iter(|| {
            pool.install(|| {
                pairs
                    .iter()
                    .zip(&blobs)
                    .map(|(p, bl)| decode_tensor(bl, p.reference).unwrap().len())
                    .sum::<usize>()
            })
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
