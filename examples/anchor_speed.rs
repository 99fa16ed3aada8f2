//! Anchor codec encode (including its verifying decode) and decode speed on every tensor of a
//! checkpoint: `cargo run --release --example anchor_speed -- A.safetensors`
//! (set RAYON_NUM_THREADS=1 for single-thread numbers).

use lockstep::anchor;
use lockstep::checkpoint::Checkpoint;
use std::time::Instant;

fn main() -> lockstep::Result<()> {
    for path in std::env::args().skip(1) {
        let ck = Checkpoint::open(&path)?;
        let raw: u64 = ck.tensors.iter().map(|t| (t.end - t.start) as u64).sum();
        let t0 = Instant::now();
        let blobs: Vec<Vec<u8>> = ck
            .tensors
            .iter()
            .map(|t| anchor::encode(t.dtype, &t.shape, ck.data(t)).map(|b| b.0))
            .collect::<lockstep::Result<_>>()?;
        let enc = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        for b in &blobs {
            anchor::decode(b)?;
        }
        let dec = t1.elapsed().as_secs_f64();
        let stored: u64 = blobs.iter().map(|b| b.len() as u64).sum();
        println!(
            "{path}: ratio {:.4}, encode+verify {:.1} MB/s, decode {:.1} MB/s",
            stored as f64 / raw as f64,
            raw as f64 / enc / 1e6,
            raw as f64 / dec / 1e6
        );
    }
    Ok(())
}
