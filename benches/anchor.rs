//! Anchor codec throughput on the embedded demo checkpoint (transformer-block tensors, bf16),
//! single thread: `cargo bench --bench anchor`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lockstep::anchor;
use lockstep::checkpoint::Checkpoint;

fn bench(c: &mut Criterion) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/demo/step0800_blocks_bf16.safetensors"
    );
    let ck = Checkpoint::open(path).expect("demo checkpoint");
    let tensors: Vec<_> = ck
        .tensors
        .iter()
        .map(|t| (t.dtype, t.shape.clone(), ck.data(t).to_vec()))
        .collect();
    let raw: u64 = tensors.iter().map(|t| t.2.len() as u64).sum();
    let blobs: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(d, s, b)| anchor::encode(*d, s, b).unwrap().0)
        .collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let mut g = c.benchmark_group("anchor bf16 (demo blocks)");
    g.throughput(Throughput::Bytes(raw));
    g.sample_size(10);
    g.bench_function("encode + verify, 1 thread", |b| {
        b.iter(|| {
            pool.install(|| {
                tensors
                    .iter()
                    .map(|(d, s, x)| anchor::encode(*d, s, x).unwrap().0.len())
                    .sum::<usize>()
            })
        })
    });
    g.bench_function("decode, 1 thread", |b| {
        b.iter(|| {
            pool.install(|| {
                blobs
                    .iter()
                    .map(|x| anchor::decode(x).unwrap().len())
                    .sum::<usize>()
            })
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
