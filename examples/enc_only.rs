//! Profiling driver: only the encode phase (lanes, codes, tail) on the bf16 600 -> 800 pair.
use std::time::Instant;

use lockstep::backend::cpu::{CpuAt, Isa};
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
    let isa = match std::env::args().nth(1).as_deref() {
        Some("avx2") => Isa::Avx2,
        Some("portable") => Isa::Portable,
        _ => Isa::Avx512,
    };
    let be = CpuAt::new(isa).unwrap();
    let mut prepared = Vec::new();
    for e in t.tensors.iter().filter(|e| e.dtype.is_float()) {
        let fl = e.dtype.float_layout().unwrap();
        let rd = r.data(r.get(&e.name).unwrap());
        let res = be
            .residuals(&EncodeJob {
                fl,
                reference: rd,
                target: t.data(e),
                condition: true,
            })
            .unwrap();
        let d = neighbor_distance(&e.shape);
        let hs = res.histograms(Layout::Signed, Some(d)).unwrap();
        let tables = Tables {
            stages: hs.iter().map(|h| StageTable::select(h, true)).collect(),
        };
        prepared.push((res, tables, d, e.end - e.start));
    }
    let mb = prepared.iter().map(|p| p.3).sum::<usize>() as f64 / 1e6;
    for _ in 0..5 {
        let c = Instant::now();
        let mut words = 0;
        for (res, tables, d, _) in &prepared {
            let ch = res.encode(Layout::Signed, tables, Some(*d)).unwrap();
            words += ch.iter().map(|c| c.words.len()).sum::<usize>();
        }
        let s = c.elapsed().as_secs_f64();
        println!("{} encode {:.1} MB/s ({words} words)", isa.name(), mb / s);
    }
}
