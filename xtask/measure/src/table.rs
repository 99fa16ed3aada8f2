//! `measure table`: the speed table behind `cargo xtask bench delta` (docs/BENCHMARKS.md):
//! lockstep's devices and zstd -19 on byte-grouped XOR, on the same checkpoint pairs, in one
//! run. `--paired`: only lockstep on the best CPU level (or `--isa`'s), one thread, `--fast` (or
//! the default layout with `--layout default`): the rows `cargo xtask bench delta --rounds`
//! alternates with ZipNN. `--scaling`: only the best CPU level, `--fast` then the default layout, each at one
//! thread and at two, their passes alternating, 10 each (the rows of `cargo xtask bench delta
//! --scaling`).

use rayon::prelude::*;

use lockstep::backend::cpu::{CpuAt, CpuBackend, Isa};
use lockstep::backend::reference::ReferenceBackend;
use lockstep::backend::wgpu::WgpuBackend;
use lockstep::backend::Backend;
use lockstep::baseline;
use lockstep::delta::blob::encode_unverified;
use lockstep::delta::{decode_tensor, EncodeOptions, LayoutChoice, TensorPair};

use crate::{best, pairs, Opts};

/// One table row; `dec_s` also gives the verified-encode speed (lockstep's encoders always
/// decode what they wrote and compare: encode time plus decode time).
fn row(name: &str, raw: usize, packed: usize, enc_s: f64, dec_s: Option<f64>) {
    let mbs = |s: f64| raw as f64 / s / 1e6;
    let fmt = |s: Option<f64>| s.map(|s| format!("{:.1}", mbs(s))).unwrap_or("—".into());
    println!(
        "| {name:<33} | {:>6.4} | {:>9.1} | {:>9} | {:>9} |",
        packed as f64 / raw as f64,
        mbs(enc_s),
        fmt(dec_s),
        fmt(dec_s.map(|d| d + enc_s)),
    );
}

fn lockstep_row(name: &str, b: &dyn Backend, threads: usize, pairs: &[TensorPair], reps: usize) {
    layout_row(name, b, threads, pairs, reps, LayoutChoice::Auto)
}

/// Every pair encoded on the current pool, tensors in parallel as well as chunks, as
/// `encode_batched` does.
fn encode_all(pairs: &[TensorPair], opts: &EncodeOptions, b: &dyn Backend) -> Vec<Vec<u8>> {
    pairs
        .par_iter()
        .map(|p| encode_unverified(p, opts, b).unwrap().0)
        .collect()
}

/// Every blob decoded against its pair's reference on the current pool.
fn decode_all(pairs: &[TensorPair], blobs: &[Vec<u8>], b: &dyn Backend) -> Vec<Vec<u8>> {
    pairs
        .par_iter()
        .zip(blobs)
        .map(|(p, blob)| decode_tensor(blob, p.reference, b).unwrap())
        .collect()
}

fn layout_row(
    name: &str,
    b: &dyn Backend,
    threads: usize,
    pairs: &[TensorPair],
    reps: usize,
    layout: LayoutChoice,
) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let opts = EncodeOptions {
        layout,
        ..EncodeOptions::default()
    };
    let raw: usize = pairs.iter().map(|p| p.target.len()).sum();
    pool.install(|| {
        let (enc_s, blobs) = best(reps, || encode_all(pairs, &opts, b));
        let (dec_s, decoded) = best(reps, || decode_all(pairs, &blobs, b));
        assert!(decoded.iter().zip(pairs).all(|(d, p)| d == p.target));
        let packed: usize = blobs.iter().map(|b| b.len()).sum();
        row(name, raw, packed, enc_s, Some(dec_s));
    });
}

/// The `--scaling` rows of one layout, one thread and two: their passes alternate (one
/// thread's encode, then two threads', likewise the decodes, `reps` times), so a VM whose
/// speed drifts from minute to minute (BENCHMARKS: 0.87-1.36 between runs of one binary)
/// slows both rows alike; each row the best of its passes. Then the two-thread speedup read
/// per alternation (one thread's time over two threads' in the same alternation): its median
/// and quartiles, on a line `cargo xtask bench delta --scaling` reads (the ratio of the
/// rows' bests can pair one row's best moment with the other's worst).
fn scaling_rows(name: &str, pairs: &[TensorPair], reps: usize, layout: LayoutChoice) {
    let pools = [1, 2].map(|t| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build()
            .unwrap()
    });
    let opts = EncodeOptions {
        layout,
        ..EncodeOptions::default()
    };
    let raw: usize = pairs.iter().map(|p| p.target.len()).sum();
    let (mut enc_s, mut dec_s) = ([f64::MAX; 2], [f64::MAX; 2]);
    let (mut enc_x, mut dec_x) = (Vec::new(), Vec::new());
    let mut blobs = Vec::new();
    for _ in 0..reps {
        let (mut enc, mut dec) = ([0.0; 2], [0.0; 2]);
        for (k, pool) in pools.iter().enumerate() {
            let (s, out) = pool.install(|| best(1, || encode_all(pairs, &opts, &CpuBackend)));
            enc[k] = s;
            blobs = out;
        }
        for (k, pool) in pools.iter().enumerate() {
            let (s, decoded) = pool.install(|| best(1, || decode_all(pairs, &blobs, &CpuBackend)));
            assert!(decoded.iter().zip(pairs).all(|(d, p)| d == p.target));
            dec[k] = s;
        }
        for k in 0..2 {
            enc_s[k] = enc_s[k].min(enc[k]);
            dec_s[k] = dec_s[k].min(dec[k]);
        }
        enc_x.push(enc[0] / enc[1]);
        dec_x.push(dec[0] / dec[1]);
    }
    let packed: usize = blobs.iter().map(|b| b.len()).sum();
    for (k, threads) in [1, 2].into_iter().enumerate() {
        row(
            &format!("{name}, {threads} thr"),
            raw,
            packed,
            enc_s[k],
            Some(dec_s[k]),
        );
    }
    let quartiles = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let at = |f: f64| v[((v.len() - 1) as f64 * f).round() as usize];
        (at(0.5), at(0.25), at(0.75))
    };
    let ((e, e1, e3), (d, d1, d3)) = (quartiles(enc_x), quartiles(dec_x));
    println!(
        "two threads over one per alternation ({reps}): encode {e:.3} ({e1:.3}-{e3:.3}) decode {d:.3} ({d1:.3}-{d3:.3})"
    );
}

/// The table's rows on both pairs (bf16 and fp32, 600 -> 800).
pub fn run(o: &Opts) -> Result<(), String> {
    let dir = &o.dir;
    let (quick, paired, scaling) = (o.quick, o.paired, o.scaling);
    let paired_layout = o.layout.unwrap_or(LayoutChoice::Fast);
    let reps = if quick { 1 } else { 3 };
    let wgpu = if paired || scaling {
        None
    } else {
        WgpuBackend::new(false).ok()
    };
    for dtype in ["bf16", "fp32"] {
        let (a, b) = (
            format!("gpt2_step000600_{dtype}.safetensors"),
            format!("gpt2_step000800_{dtype}.safetensors"),
        );
        let Ok((r, t)) = o.open_pair(dtype) else {
            eprintln!("skipping {a} -> {b}: not found in {dir}");
            continue;
        };
        let pairs = pairs(&r, &t, |_| true);
        let raw: usize = pairs.iter().map(|p| p.target.len()).sum();
        println!(
            "\n{a} -> {b}: {} float tensors, {:.1} MB",
            pairs.len(),
            raw as f64 / 1e6
        );
        println!(
            "| coder                             | ratio  | enc MB/s  | dec MB/s  | enc+verify |"
        );
        println!(
            "|-----------------------------------|--------|-----------|-----------|------------|"
        );
        let best_isa = Isa::detect();
        if paired {
            let name = match paired_layout {
                LayoutChoice::Fast => "--fast",
                LayoutChoice::FastNeighbor => "fast-neighbor",
                LayoutChoice::Signed => "signed",
                _ => "default",
            };
            let cpu = o.cpu()?;
            layout_row(
                &format!("lockstep {name} cpu {}, 1 thr", cpu.isa().name()),
                &cpu,
                1,
                &pairs,
                reps,
                paired_layout,
            );
            continue;
        }
        if scaling {
            for (layout, name) in [
                (LayoutChoice::Fast, "--fast"),
                (LayoutChoice::Auto, "default"),
            ] {
                let name = format!("lockstep {name} cpu {}", best_isa.name());
                scaling_rows(&name, &pairs, if quick { 1 } else { 10 }, layout);
            }
            continue;
        }
        lockstep_row(
            &format!("lockstep cpu {}, 1 thread", best_isa.name()),
            &CpuBackend,
            1,
            &pairs,
            reps,
        );
        lockstep_row(
            &format!("lockstep cpu {}, 2 threads", best_isa.name()),
            &CpuBackend,
            2,
            &pairs,
            reps,
        );
        // The fast (Joint) layout: one symbol per weight.
        for threads in [1, 2] {
            layout_row(
                &format!("lockstep --fast cpu {}, {threads} thr", best_isa.name()),
                &CpuBackend,
                threads,
                &pairs,
                reps,
                LayoutChoice::Fast,
            );
        }
        // The slower instruction-set levels this CPU also runs (same bytes).
        // (Only the levels this CPU has: NEON sorts below AVX2 but does not run on x86.)
        let slower = Isa::ALL.into_iter().filter(|&i| i < best_isa);
        for (isa, b) in slower.filter_map(|i| Some((i, CpuAt::new(i)?))) {
            lockstep_row(
                &format!("lockstep cpu {}, 1 thread", isa.name()),
                &b,
                1,
                &pairs,
                1,
            );
            layout_row(
                &format!("lockstep --fast cpu {}, 1 thr", isa.name()),
                &b,
                1,
                &pairs,
                1,
                LayoutChoice::Fast,
            );
        }
        lockstep_row(
            "lockstep reference, 1 thread",
            &ReferenceBackend,
            1,
            &pairs,
            1,
        );
        if let Some(w) = &wgpu {
            lockstep_row("lockstep wgpu (see note)", w, 2, &pairs, 1);
            layout_row(
                "lockstep --fast wgpu (see note)",
                w,
                2,
                &pairs,
                1,
                LayoutChoice::Fast,
            );
        }
        // zstd -19 on byte-grouped XOR: the paper's baseline row, one thread.
        let (enc_s, packed) = best(1, || {
            let mut planes = Vec::new();
            for p in &pairs {
                let x = baseline::xor(p.reference, p.target);
                baseline::push_planes(&mut planes, &x, p.dtype.size());
            }
            baseline::zstd_planes(&planes, 19).unwrap()
        });
        row("zstd -19, byte-grouped XOR", raw, packed, enc_s, None);
    }
    if let Some(w) = &wgpu {
        println!(
            "\nwgpu ran on {}: correctness only unless that is a real GPU.",
            w.device()
        );
    }
    Ok(())
}
