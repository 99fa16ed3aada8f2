//! Per-tensor cost of the small tensors: every float tensor of the bf16 600 -> 800 pair
//! below 2^16 elements (43 of its 52: layer norms, biases, attention weights, position embeddings) encoded
//! and decoded one after another, one thread, best CPU level; prints microseconds per
//! tensor for `--fast` and the default layout (best of `ROUNDS`, default 20; wall time).
//! What a checkpoint of many small tensors pays per tensor: table building and selection
//! rather than coding. `DTYPE=fp32` for the fp32 pair.
//!
//! `cargo run --release --example tensor_overhead`
use lockstep::backend::cpu::CpuBackend;
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::blob::encode_unverified;
use lockstep::delta::{decode_tensor, EncodeOptions, LayoutChoice, TensorPair};

fn main() {
    lockstep::memory::reuse_freed_memory();
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build_global()
        .unwrap();
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/data/trajectory-gpt2"
    );
    let dt = std::env::var("DTYPE").unwrap_or_else(|_| "bf16".into());
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let r = Checkpoint::open(format!("{dir}/gpt2_step000600_{dt}.safetensors")).unwrap();
    let t = Checkpoint::open(format!("{dir}/gpt2_step000800_{dt}.safetensors")).unwrap();
    let pairs: Vec<TensorPair> = t
        .tensors
        .iter()
        .filter(|e| e.dtype.is_float() && e.shape.iter().product::<u64>() < 1 << 16)
        .map(|e| TensorPair {
            dtype: e.dtype,
            shape: &e.shape,
            reference: r.data(r.get(&e.name).unwrap()),
            target: t.data(e),
        })
        .collect();
    let elems: usize = pairs.iter().map(|p| p.target.len()).sum::<usize>() / pairs[0].dtype.size();
    for (layout, name) in [
        (LayoutChoice::Fast, "--fast"),
        (LayoutChoice::Auto, "default"),
    ] {
        let opts = EncodeOptions {
            layout,
            ..EncodeOptions::default()
        };
        let (mut enc, mut dec) = (f64::MAX, f64::MAX);
        for _ in 0..rounds {
            let start = std::time::Instant::now();
            let blobs: Vec<Vec<u8>> = pairs
                .iter()
                .map(|p| encode_unverified(p, &opts, &CpuBackend).unwrap().0)
                .collect();
            enc = enc.min(start.elapsed().as_secs_f64());
            let start = std::time::Instant::now();
            for (p, b) in pairs.iter().zip(&blobs) {
                let out = decode_tensor(b, p.reference, &CpuBackend).unwrap();
                assert!(out == p.target, "decoded other bytes");
            }
            dec = dec.min(start.elapsed().as_secs_f64());
        }
        let us = |s: f64| s * 1e6 / pairs.len() as f64;
        println!(
            "{dt} {name}: {} tensors, {elems} elements: encode {:.0} µs, decode {:.0} µs per tensor",
            pairs.len(),
            us(enc),
            us(dec)
        );
    }
}
