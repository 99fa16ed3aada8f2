//! Decode-only loop for A/B runs and profiles: encodes every float tensor of the 600 -> 800
//! pair once with `--fast` (AVX-512, or `ISA=avx2|portable`), then decodes all the blobs against their references
//! `ROUNDS` times (default 20) and prints the best pass's MB/s of target bytes (wall time).
//! `DTYPE=fp32` for the fp32 pair, `THREADS=n` for the rayon pool (default 1). Every pass's
//! output is compared with the target outside the timing.
//!
//! `cargo run --release --example decode_loop` (docs/BENCHMARKS.md, fourth speed pass).
use lockstep::backend::cpu::{CpuAt, Isa};
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::blob::encode_unverified;
use lockstep::delta::{decode_tensor, EncodeOptions, LayoutChoice, TensorPair};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    lockstep::memory::reuse_freed_memory();
    rayon::ThreadPoolBuilder::new()
        .num_threads(env("THREADS", 1))
        .build_global()
        .unwrap();
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/data/trajectory-gpt2"
    );
    let dt = std::env::var("DTYPE").unwrap_or_else(|_| "bf16".into());
    let r = Checkpoint::open(format!("{dir}/gpt2_step000600_{dt}.safetensors")).unwrap();
    let t = Checkpoint::open(format!("{dir}/gpt2_step000800_{dt}.safetensors")).unwrap();
    let isa = match std::env::var("ISA").as_deref() {
        Ok("avx2") => Isa::Avx2,
        Ok("portable") => Isa::Portable,
        _ => Isa::Avx512,
    };
    let cpu = CpuAt::new(isa).expect("that instruction-set level is not available here");
    let opts = EncodeOptions {
        layout: LayoutChoice::Fast,
        ..EncodeOptions::default()
    };
    let mut blobs = Vec::new();
    for e in t.tensors.iter().filter(|e| e.dtype.is_float()) {
        let reference = r.data(r.get(&e.name).unwrap());
        let pair = TensorPair {
            dtype: e.dtype,
            shape: &e.shape,
            reference,
            target: t.data(e),
        };
        let blob = encode_unverified(&pair, &opts, &cpu).unwrap().0;
        blobs.push((blob, reference, t.data(e)));
    }
    let mb = blobs.iter().map(|b| b.2.len()).sum::<usize>() as f64 / 1e6;
    let mut best = f64::MAX;
    for _ in 0..env("ROUNDS", 20) {
        let mut pass = 0.0;
        for (b, r, target) in &blobs {
            let start = std::time::Instant::now();
            let out = decode_tensor(b, r, &cpu).unwrap();
            pass += start.elapsed().as_secs_f64();
            assert!(out == *target, "decoded other bytes");
        }
        best = best.min(pass);
    }
    println!("{dt} blob dec best {:.1} MB/s", mb / best);
}
