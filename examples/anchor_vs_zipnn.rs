//! Anchor codec against the ZipNN-style peer and byte-grouped zstd on every tensor of the
//! given checkpoints: `cargo run --release --example anchor_vs_zipnn -- A.safetensors ...`

use lockstep::anchor;
use lockstep::checkpoint::Checkpoint;

fn main() -> lockstep::Result<()> {
    for path in std::env::args().skip(1) {
        let ck = Checkpoint::open(&path)?;
        let (mut raw, mut ours, mut zipnn, mut zstd) = (0u64, 0u64, 0u64, 0u64);
        let start = std::time::Instant::now();
        let mut o1 = 0;
        let mut heads = [0usize; 5];
        for t in &ck.tensors {
            let data = ck.data(t);
            let (_, r) = anchor::encode(t.dtype, &t.shape, data)?;
            raw += data.len() as u64;
            ours += r.blob_bytes;
            o1 += (r.context != anchor::ExpContext::None) as usize;
            heads[r.head_bits as usize] += 1;
            zipnn += anchor::zipnn::size(t.dtype, data);
            let z = anchor::zipnn::zstd_grouped_size(t.dtype, data, 19);
            zstd += z;
            if std::env::var("PER_TENSOR").is_ok() && data.len() > 100_000 {
                println!(
                    "  {:<40} {:>9} anchor {:>9} zstd {:>9} head {} ctx {:?}",
                    t.name,
                    data.len(),
                    r.blob_bytes,
                    z,
                    r.head_bits,
                    r.context
                );
            }
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{path}: raw {raw}, anchor {ours} ({:.4}), zipnn-style {zipnn} ({:.4}), grouped zstd-19 {zstd} ({:.4}); anchor {:.2}% smaller than zipnn-style; order1 {o1}/{}, head bits {heads:?}; {:.1} s total",
            ours as f64 / raw as f64,
            zipnn as f64 / raw as f64,
            zstd as f64 / raw as f64,
            100.0 * (1.0 - ours as f64 / zipnn as f64),
            ck.tensors.len(),
            secs
        );
    }
    Ok(())
}
