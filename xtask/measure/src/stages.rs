//! `measure stages`: single-thread speed of the Joint (`--fast`) layout against the Signed
//! layout (neighbor contexts; `--layout signed`) on the CPU device, per instruction-set
//! level, in one process with the layouts' runs alternating, so a noisy machine hits both
//! alike. Times CPU seconds of the process (`CLOCK_PROCESS_CPUTIME_ID`; wall time where that
//! is missing) and prints MB/s of target bytes for:
//!
//! - `hist`: the histogram pass (`Resident::histograms`);
//! - `lanes`: the encoder's lanes, codes and tails (`Resident::encode`);
//! - `encode`: residuals + histograms + table selection + lanes (no blob framing, no layout
//!   trial: what one layout costs on its own), with the residual and selection times;
//! - `decode`: `Backend::decode` (tables, lanes, tails, inverse transform);
//! - `blob enc` / `blob dec`: the whole per-tensor pipeline, `encode_unverified` (with its
//!   `--layout signed` or `--fast` as the CLI takes them) and `decode_tensor`.
//!
//! Each round's figures, then the best and median of `--rounds` (default 5).

use std::time::Instant;

use lockstep::backend::cpu::{CpuAt, Isa};
use lockstep::backend::{Backend, DecodeJob, EncodeJob};
use lockstep::delta::blob::encode_unverified;
use lockstep::delta::{decode_tensor, EncodeOptions, Layout, LayoutChoice, TensorPair};
use lockstep::format::neighbor_distance;
use lockstep::format::tables::{StageTable, Tables};

use crate::Opts;

const LAYOUTS: [(Layout, &str); 2] = [(Layout::Signed, "signed"), (Layout::Joint, "fast")];

/// Process CPU seconds (all threads; the timed passes run on one rayon thread while the
/// main thread sleeps in the pool), or wall seconds where unavailable.
fn cpu_now() -> f64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid timespec to write.
        if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) } == 0 {
            return t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9;
        }
    }
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

pub fn timed<R>(f: impl FnOnce() -> R) -> (R, f64) {
    let c = cpu_now();
    let r = f();
    (r, cpu_now() - c)
}

struct Tensor<'a> {
    pair: TensorPair<'a>,
    fl: lockstep::dtype::FloatLayout,
    reference: &'a [u8],
    target: &'a [u8],
    d: usize,
}

/// Both layouts (or `--layout`'s), alternating round by round, per CPU level.
pub fn run(o: &Opts) -> Result<(), String> {
    let isas: Vec<Isa> = match o.isa {
        Some(isa) => vec![isa],
        None => Isa::ALL.into_iter().filter(|i| i.available()).collect(),
    };
    let rounds = o.rounds.unwrap_or(5);
    let dt = &o.dtype;
    let (r, t) = o.open_pair(dt)?;
    let tensors: Vec<Tensor> = t
        .tensors
        .iter()
        .filter(|e| e.dtype.is_float())
        .map(|e| Tensor {
            pair: TensorPair {
                dtype: e.dtype,
                shape: &e.shape,
                reference: r.data(r.get(&e.name).unwrap()),
                target: t.data(e),
            },
            fl: e.dtype.float_layout().unwrap(),
            reference: r.data(r.get(&e.name).unwrap()),
            target: t.data(e),
            d: neighbor_distance(&e.shape),
        })
        .collect();
    let mb = tensors.iter().map(|t| t.target.len()).sum::<usize>() as f64 / 1e6;
    println!(
        "{dt} 600 -> 800: {} float tensors, {mb:.1} MB, {} thread(s), {rounds} rounds, MB/s of CPU time",
        tensors.len(),
        o.threads
    );
    // `--layout`: one layout (for profiling).
    let only = o.layout.map(|l| match l {
        LayoutChoice::Fast => "fast",
        _ => "signed",
    });
    let distance = |layout: Layout, t: &Tensor| (layout == Layout::Signed).then_some(t.d);
    for isa in isas {
        let cpu = CpuAt::new(isa).ok_or(format!("{} is not available on this CPU", isa.name()))?;
        // [layout][metric] -> per-round MB/s; metrics: hist, lanes, encode, decode.
        let mut rates = vec![vec![Vec::new(); 6]; LAYOUTS.len()];
        let mut sizes = [0usize; 2];
        for round in 0..rounds {
            for (li, &(layout, name)) in LAYOUTS.iter().enumerate() {
                if only.is_some_and(|o| o != name) {
                    continue;
                }
                // Whole encode of this layout: residuals, histograms, tables, lanes.
                let (mut t_res, mut t_hist, mut t_sel, mut t_lanes) = (0.0, 0.0, 0.0, 0.0);
                let mut coded = Vec::with_capacity(tensors.len());
                for t in &tensors {
                    let job = EncodeJob {
                        fl: t.fl,
                        reference: t.reference,
                        target: t.target,
                        condition: true,
                    };
                    let (res, s) = timed(|| cpu.residuals(&job).unwrap());
                    t_res += s;
                    let (hs, s) = timed(|| res.histograms(layout, distance(layout, t)).unwrap());
                    t_hist += s;
                    let (tables, s) = timed(|| Tables {
                        stages: hs.iter().map(|h| StageTable::select(h, true)).collect(),
                    });
                    t_sel += s;
                    let (chunks, s) =
                        timed(|| res.encode(layout, &tables, distance(layout, t)).unwrap());
                    t_lanes += s;
                    coded.push((tables, chunks));
                }
                sizes[li] = coded
                    .iter()
                    .flat_map(|(_, c)| c)
                    .map(|c| c.words.len() * 2 + c.tail.len() + 4 * c.states.len())
                    .sum();
                // Decode every tensor; compare outside the timed region.
                let mut t_dec = 0.0;
                for (t, (tables, chunks)) in tensors.iter().zip(&coded) {
                    let job = DecodeJob {
                        fl: t.fl,
                        layout,
                        condition: true,
                        distance: distance(layout, t),
                        tables,
                        chunks: &lockstep::format::chunk::views(chunks),
                        reference: t.reference,
                    };
                    let (got, s) = timed(|| cpu.decode(&job).unwrap());
                    t_dec += s;
                    assert!(got == t.target, "{name} decode differs");
                }
                // The whole pipeline, blobs in and out.
                let opts = EncodeOptions {
                    layout: if layout == Layout::Joint {
                        LayoutChoice::Fast
                    } else {
                        LayoutChoice::Signed
                    },
                    ..EncodeOptions::default()
                };
                let (mut t_benc, mut t_bdec) = (0.0, 0.0);
                for t in &tensors {
                    let (blob, s) = timed(|| encode_unverified(&t.pair, &opts, &cpu).unwrap().0);
                    t_benc += s;
                    let (got, s) = timed(|| decode_tensor(&blob, t.reference, &cpu).unwrap());
                    t_bdec += s;
                    assert!(got == t.target, "{name} blob decode differs");
                }
                let enc = t_res + t_hist + t_sel + t_lanes;
                for (m, s) in [t_hist, t_lanes, enc, t_dec, t_benc, t_bdec]
                    .into_iter()
                    .enumerate()
                {
                    rates[li][m].push(mb / s);
                }
                println!(
                    "{:>8} {:>7} round {round}: hist {:7.1}  lanes {:7.1}  encode {:7.1} (res {:.1} ms, select {:.1} ms)  decode {:7.1}  blob enc {:7.1}  blob dec {:7.1}",
                    isa.name(),
                    name,
                    mb / t_hist,
                    mb / t_lanes,
                    mb / enc,
                    t_res * 1e3,
                    t_sel * 1e3,
                    mb / t_dec,
                    mb / t_benc,
                    mb / t_bdec
                );
            }
        }
        println!("{} summary, MB/s best / median of {rounds}:", isa.name());
        for (li, &(_, name)) in LAYOUTS.iter().enumerate() {
            if rates[li][0].is_empty() {
                continue;
            }
            let stat = |m: usize| {
                let mut v = rates[li][m].clone();
                v.sort_by(|a: &f64, b| a.partial_cmp(b).unwrap());
                (v[v.len() - 1], v[v.len() / 2])
            };
            let [h, l, e, d, be, bd] = [0, 1, 2, 3, 4, 5].map(stat);
            println!(
                "  {name:>7}: hist {:7.1} / {:7.1}  lanes {:7.1} / {:7.1}  encode {:7.1} / {:7.1}  decode {:7.1} / {:7.1}  blob enc {:7.1} / {:7.1}  blob dec {:7.1} / {:7.1}  (payload ratio {:.4}, tables excluded)",
                h.0, h.1, l.0, l.1, e.0, e.1, d.0, d.1, be.0, be.1, bd.0, bd.1,
                sizes[li] as f64 / (mb * 1e6)
            );
        }
    }
    Ok(())
}
