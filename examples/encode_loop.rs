//! Encode-only loop for A/B runs and profiles: every float tensor of the 600 -> 800 pair
//! encoded with `--fast` (`LAYOUT=default` for the default layout), without the verifying
//! decode, tensors in parallel as `encode_batched` does; prints the best of `ROUNDS`
//! (default 10) passes in MB/s of target bytes (wall time). `DTYPE=fp32`, `THREADS=n`
//! (default 1).
//!
//! `cargo run --release --example encode_loop`
use lockstep::backend::cpu::CpuBackend;
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::blob::encode_unverified;
use lockstep::delta::{EncodeOptions, LayoutChoice, TensorPair};
use rayon::prelude::*;

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
    let layout = match std::env::var("LAYOUT").as_deref() {
        Ok("default") => LayoutChoice::Auto,
        _ => LayoutChoice::Fast,
    };
    let opts = EncodeOptions {
        layout,
        ..EncodeOptions::default()
    };
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
    let mb = pairs.iter().map(|p| p.target.len()).sum::<usize>() as f64 / 1e6;
    let mut best = f64::MAX;
    for _ in 0..env("ROUNDS", 10) {
        let start = std::time::Instant::now();
        let blobs: Vec<Vec<u8>> = pairs
            .par_iter()
            .map(|p| encode_unverified(p, &opts, &CpuBackend).unwrap().0)
            .collect();
        best = best.min(start.elapsed().as_secs_f64());
        assert_eq!(blobs.len(), pairs.len());
    }
    println!("{dt} encode best {:.1} MB/s", mb / best);
}
