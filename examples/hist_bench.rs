//! Min-of-N times of the non-lane encoder phases (CPU backend, one thread), per tensor group.
use std::time::Instant;

use lockstep::backend::cpu::CpuBackend;
use lockstep::backend::{Backend, EncodeJob};
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::Layout;
use lockstep::format::neighbor_distance;
use lockstep::format::tables::StageTable;

fn main() {
    // As the `lockstep` binary does (src/main.rs).
    lockstep::memory::reuse_freed_memory();
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/data/trajectory-gpt2"
    );
    let r = Checkpoint::open(format!("{dir}/gpt2_step000600_bf16.safetensors")).unwrap();
    let t = Checkpoint::open(format!("{dir}/gpt2_step000800_bf16.safetensors")).unwrap();
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build_global()
        .unwrap();
    for big in [true, false] {
        if std::env::var("ONLY").is_ok_and(|o| (o == "big") != big) {
            continue;
        }
        let es: Vec<_> = t
            .tensors
            .iter()
            .filter(|e| e.dtype.is_float() && ((e.end - e.start) > 4_000_000) == big)
            .collect();
        let mb = es.iter().map(|e| e.end - e.start).sum::<usize>() as f64 / 1e6;
        let mut best = [f64::MAX; 4];
        for _ in 0..7 {
            let mut times = [0f64; 4];
            for e in &es {
                let fl = e.dtype.float_layout().unwrap();
                let rd = r.data(r.get(&e.name).unwrap());
                let c = Instant::now();
                let res = CpuBackend
                    .residuals(&EncodeJob {
                        fl,
                        reference: rd,
                        target: t.data(e),
                        condition: true,
                    })
                    .unwrap();
                times[0] += c.elapsed().as_secs_f64();
                let c = Instant::now();
                let hs = res
                    .histograms(Layout::Signed, Some(neighbor_distance(&e.shape)))
                    .unwrap();
                times[1] += c.elapsed().as_secs_f64();
                let c = Instant::now();
                let _hp = res.histograms(Layout::Paper, None).unwrap();
                times[2] += c.elapsed().as_secs_f64();
                let c = Instant::now();
                let _: Vec<_> = hs.iter().map(|h| StageTable::select(h, true)).collect();
                let _ = (hs[0].without_neighbor(), hs[3].without_neighbor());
                times[3] += c.elapsed().as_secs_f64();
            }
            for (b, t) in best.iter_mut().zip(times) {
                *b = b.min(t);
            }
        }
        println!(
            "{} ({} tensors, {mb:.1} MB):",
            if big { "big" } else { "small" },
            es.len()
        );
        for (n, s) in ["residuals", "hist signed", "hist paper", "select"]
            .iter()
            .zip(best)
        {
            println!("  {n:<12} {:>8.3} ms  {:>8.1} MB/s", s * 1e3, mb / s);
        }
    }
}
