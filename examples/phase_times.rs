//! Where encode time goes, per phase, on one checkpoint pair (CPU backend, one thread).
use std::time::Instant;

use lockstep::backend::cpu::CpuBackend;
use lockstep::backend::{Backend, EncodeJob};
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::Layout;
use lockstep::format::neighbor_distance;
use lockstep::format::tables::{StageTable, Tables};

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
    let mut times = [0f64; 6];
    let names = [
        "residuals",
        "hist signed",
        "hist paper",
        "select",
        "encode",
        "decode",
    ];
    for _ in 0..3 {
        for e in t.tensors.iter().filter(|e| e.dtype.is_float()) {
            let fl = e.dtype.float_layout().unwrap();
            let rd = r.data(r.get(&e.name).unwrap());
            let mut clock = Instant::now();
            let mut lap = |i: usize, c: &mut Instant| {
                times[i] += c.elapsed().as_secs_f64();
                *c = Instant::now();
            };
            let res = CpuBackend
                .residuals(&EncodeJob {
                    fl,
                    reference: rd,
                    target: t.data(e),
                    condition: true,
                })
                .unwrap();
            lap(0, &mut clock);
            let d = neighbor_distance(&e.shape);
            let hs = res.histograms(Layout::Signed, Some(d)).unwrap();
            lap(1, &mut clock);
            let _hp = res.histograms(Layout::Paper, None).unwrap();
            lap(2, &mut clock);
            let tables = Tables {
                stages: hs.iter().map(|h| StageTable::select(h, true)).collect(),
            };
            let _ = (hs[0].without_neighbor(), hs[3].without_neighbor());
            lap(3, &mut clock);
            let chunks = res.encode(Layout::Signed, &tables, Some(d)).unwrap();
            lap(4, &mut clock);
            let job = lockstep::backend::DecodeJob {
                fl,
                layout: Layout::Signed,
                condition: true,
                distance: Some(d),
                tables: &tables,
                chunks: &lockstep::format::chunk::views(&chunks),
                reference: rd,
            };
            CpuBackend.decode(&job).unwrap();
            lap(5, &mut clock);
        }
    }
    let mb = 3.0 * t.tensors.iter().map(|e| e.end - e.start).sum::<usize>() as f64 / 1e6;
    for (n, s) in names.iter().zip(times) {
        println!("{n:<12} {s:>7.3} s  {:>8.1} MB/s", mb / s);
    }
}
