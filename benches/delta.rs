//! Criterion benches of the delta codec, per backend present: encode (no verify) and decode
//! of the bf16 transformer-block deltas shipped in demo/, one thread for the CPU backends.
//! The side-by-side table with zstd is `cargo xtask bench delta` (docs/BENCHMARKS.md).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lockstep::backend::cpu::{CpuAt, CpuBackend, Isa};
use lockstep::backend::reference::ReferenceBackend;
use lockstep::backend::wgpu::WgpuBackend;
use lockstep::backend::Backend;
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::blob::encode_unverified;
use lockstep::delta::{decode_tensor, EncodeOptions, LayoutChoice, TensorPair};

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/demo");

fn checkpoints() -> (Checkpoint, Checkpoint) {
    let mut files: Vec<_> = std::fs::read_dir(DEMO)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    let n = files.len();
    (
        Checkpoint::open(&files[n - 2]).unwrap(),
        Checkpoint::open(&files[n - 1]).unwrap(),
    )
}

fn bench_backend(
    c: &mut Criterion,
    b: &dyn Backend,
    label: &str,
    threads: usize,
    layout: LayoutChoice,
) {
    let (r, t) = checkpoints();
    let pairs: Vec<TensorPair> = t
        .tensors
        .iter()
        .filter(|e| e.dtype.is_float())
        .map(|e| TensorPair {
            dtype: e.dtype,
            shape: &e.shape,
            reference: r.data(r.get(&e.name).unwrap()),
            target: t.data(e),
        })
        .collect();
    let raw: usize = pairs.iter().map(|p| p.target.len()).sum();
    let opts = EncodeOptions {
        layout,
        ..EncodeOptions::default()
    };
    let fast = if layout == LayoutChoice::Fast {
        "-fast"
    } else {
        ""
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let blobs: Vec<Vec<u8>> = pairs
        .iter()
        .map(|p| encode_unverified(p, &opts, b).unwrap().0)
        .collect();
    let mut g = c.benchmark_group(format!("delta-bf16/{label}-{threads}t{fast}"));
    g.throughput(Throughput::Bytes(raw as u64));
    g.sample_size(10);
    g.bench_function("encode", |bench| {
        bench.iter(|| {
            pool.install(|| {
                for p in &pairs {
                    encode_unverified(p, &opts, b).unwrap();
                }
            })
        })
    });
    g.bench_function("decode", |bench| {
        bench.iter(|| {
            pool.install(|| {
                for (p, blob) in pairs.iter().zip(&blobs) {
                    decode_tensor(blob, p.reference, b).unwrap();
                }
            })
        })
    });
    g.finish();
}

fn backends(c: &mut Criterion) {
    // The default layout and `--fast` (one symbol per weight).
    for layout in [LayoutChoice::Auto, LayoutChoice::Fast] {
        bench_backend(c, &CpuBackend, "cpu", 1, layout);
        bench_backend(c, &CpuBackend, "cpu", 2, layout);
        // Every instruction-set level this CPU runs, one thread (same bytes, different speed).
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            let label = format!("cpu-{}", isa.name().to_lowercase().replace('-', ""));
            bench_backend(c, &CpuAt::new(isa).unwrap(), &label, 1, layout);
        }
        bench_backend(c, &ReferenceBackend, "reference", 1, layout);
        match WgpuBackend::new(false) {
            Ok(w) => bench_backend(c, &w, "wgpu", 1, layout),
            Err(e) => eprintln!("wgpu bench skipped: {e}"),
        }
    }
}

criterion_group!(benches, backends);
criterion_main!(benches);
