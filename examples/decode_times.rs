//! Decode-only timing (CPU backend, one thread) on one checkpoint pair, for profiling the
//! decoder without the encoder's phases: `cargo run --release --example decode_times [ISA]`
//! (ISA: portable, avx2; default the best). `DTYPE=fp32` times the fp32 pair; `ROWS=1`
//! prints each tensor's table row counts per stage.
use std::time::Instant;

use lockstep::backend::cpu::{CpuAt, Isa};
use lockstep::backend::{Backend, DecodeJob, EncodeJob};
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::Layout;
use lockstep::format::neighbor_distance;
use lockstep::format::tables::{StageTable, Tables};

fn main() {
    // As the `lockstep` binary does (src/main.rs).
    lockstep::memory::reuse_freed_memory();
    let isa = match std::env::args().nth(1).as_deref() {
        Some("portable") => Isa::Portable,
        Some("avx2") => Isa::Avx2,
        _ => Isa::detect(),
    };
    let cpu = CpuAt::new(isa).expect("ISA not available");
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/data/trajectory-gpt2"
    );
    // DTYPE=fp32 times the fp32 pair instead of the bf16 one.
    let dt = std::env::var("DTYPE").unwrap_or_else(|_| "bf16".into());
    let r = Checkpoint::open(format!("{dir}/gpt2_step000600_{dt}.safetensors")).unwrap();
    let t = Checkpoint::open(format!("{dir}/gpt2_step000800_{dt}.safetensors")).unwrap();
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build_global()
        .unwrap();
    let mut coded = Vec::new();
    for e in t.tensors.iter().filter(|e| e.dtype.is_float()) {
        let fl = e.dtype.float_layout().unwrap();
        let rd = r.data(r.get(&e.name).unwrap());
        let job = EncodeJob {
            fl,
            reference: rd,
            target: t.data(e),
            condition: true,
        };
        let res = cpu.residuals(&job).unwrap();
        let d = neighbor_distance(&e.shape);
        let hs = res.histograms(Layout::Signed, Some(d)).unwrap();
        let tables = Tables {
            stages: hs.iter().map(|h| StageTable::select(h, true)).collect(),
        };
        let chunks = res.encode(Layout::Signed, &tables, Some(d)).unwrap();
        if std::env::var("ROWS").is_ok() {
            let rows: Vec<usize> = tables
                .stages
                .iter()
                .map(|t| t.explicit.len() + t.backoff.len())
                .collect();
            println!("{} {:?} rows {rows:?}", e.name, e.shape);
        }
        coded.push((fl, rd, d, tables, chunks, t.data(e)));
    }
    let reps = 10;
    let cpu0 = cpu_seconds();
    let clock = Instant::now();
    for _ in 0..reps {
        for (fl, rd, d, tables, chunks, want) in &coded {
            let job = DecodeJob {
                fl: *fl,
                layout: Layout::Signed,
                condition: true,
                distance: Some(*d),
                tables,
                chunks: &lockstep::format::chunk::views(chunks),
                reference: rd,
            };
            let got = cpu.decode(&job).unwrap();
            assert!(got == *want);
        }
    }
    let s = clock.elapsed().as_secs_f64();
    let c = cpu_seconds() - cpu0;
    let mb = reps as f64 * coded.iter().map(|c| c.5.len()).sum::<usize>() as f64 / 1e6;
    println!(
        "decode ({}) wall {s:.3} s {:.1} MB/s; cpu {c:.2} s {:.1} MB/s",
        isa.name(),
        mb / s,
        mb / c
    );
}

/// User + system CPU time of this process (Linux, 100 Hz ticks), so a loaded machine's
/// waiting is not counted; 0 elsewhere.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // Fields 14 and 15 of stat (utime, stime) are 12 and 13 after the command name.
    (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / 100.0
}
