//! The mixing encoder's LM call in its two forms, per device, in paired rounds: the calls of
//! coding FILE (stream version 2, one block: docs/INTEGER_GPT2.md §13.3), 64 per device call
//! as the encoder batches them, answered as whole prefix sums (`step_prefix_sums`, 50,258
//! u32 per call, then the few the coder reads picked out on the host) and as the sums at
//! the indices the coder reads (`step_prefix_sums_at`, what the encoder asks for). Both run
//! the same forward passes, so the difference is where the sums are made and what crosses
//! back. Each round runs both forms on every device, alternating which goes first, checks
//! they give the same integers, and the medians and ranges are printed.
//!
//! `cargo run --release --example lm_sums_at -- FILE [--rounds N] [--calls N]
//! [--devices cpu,cuda]` (the shipped tinygpt2 model; `--calls` limits the calls, default
//! all).

use std::time::Instant;

use lockstep::backend::lm::{Item, LmSession};
use lockstep::backend::{select, BackendChoice, Device};
use lockstep::format::lm::model_file::Model;
use lockstep::lm::cm::lm_bits::{calls, Lm, Reads};

/// Calls per device call and sequences cycled on a restart, as `lm_bits::Plan`.
const BATCH: usize = 64;
const SEQS: usize = 4;

/// One device call: the sequences to clear first, the items, and each query's wanted sums.
struct Batch {
    clear: Vec<usize>,
    items: Vec<Item>,
    wanted: Vec<Vec<u32>>,
}

/// The encoder's batches for `data` (its first `most` calls), as `Plan::run_batch` forms them.
fn batches(model: &Model, data: &[u8], most: usize) -> Vec<Batch> {
    let all = calls(model, data).unwrap();
    let mut reads = Reads::new(data).unwrap();
    let mut out = Vec::new();
    let (mut next, mut seq) = (0, 0);
    let all = &all[..all.len().min(most)];
    while next < all.len() {
        let mut b = Batch {
            clear: Vec::new(),
            items: Vec::new(),
            wanted: Vec::new(),
        };
        let mut in_batch = [false; SEQS];
        while b.wanted.len() < BATCH && next < all.len() {
            let call = &all[next];
            if call.restart {
                let s = (seq + 1) % SEQS;
                if in_batch[s] {
                    break;
                }
                b.clear.push(s);
                seq = s;
            }
            in_batch[seq] = true;
            b.items.extend(call.items(seq));
            b.wanted.push(reads.next_call().unwrap());
            next += 1;
        }
        out.push(b);
    }
    out
}

/// Run every batch on a fresh session of `d`, whole sums (then picked) or at the indices;
/// returns the seconds and the sums.
fn run(d: &Device, model: &Model, batches: &[Batch], at: bool) -> (f64, Vec<Vec<u32>>) {
    let mut s: Box<dyn LmSession> = d
        .lm()
        .unwrap()
        .load(model, SEQS, model.config.n_ctx as usize)
        .unwrap();
    let order = Lm::order();
    let mut out = Vec::new();
    let t = Instant::now();
    for b in batches {
        for &q in &b.clear {
            s.clear(q).unwrap();
        }
        if at {
            out.extend(s.step_prefix_sums_at(&b.items, order, &b.wanted).unwrap());
        } else {
            let whole = s.step_prefix_sums(&b.items, order).unwrap();
            out.extend(lockstep::backend::lm::gather_sums(&whole, &b.wanted));
        }
    }
    (t.elapsed().as_secs_f64(), out)
}

fn median_range(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    // As the command line does (src/main.rs): freed large buffers stay in the heap.
    lockstep::memory::reuse_freed_memory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let file = args
        .first()
        .expect("usage: lm_sums_at FILE [--rounds N] [--calls N] [--devices cpu,cuda]");
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].clone())
    };
    let rounds: usize = flag("--rounds").map_or(3, |r| r.parse().unwrap());
    let most: usize = flag("--calls").map_or(usize::MAX, |r| r.parse().unwrap());
    let names = flag("--devices").unwrap_or_else(|| "cpu".into());
    let data = std::fs::read(file).unwrap();
    let model = Model::from_bytes(include_bytes!("../models/tinygpt2.lsm")).unwrap();
    let batches = batches(&model, &data, most);
    let ncalls: usize = batches.iter().map(|b| b.wanted.len()).sum();
    let nsums: usize = batches.iter().flat_map(|b| &b.wanted).map(Vec::len).sum();
    let empty = batches
        .iter()
        .flat_map(|b| &b.wanted)
        .filter(|w| w.is_empty())
        .count();
    eprintln!("{empty} calls read no sum");
    eprintln!(
        "{file}: {} bytes, {ncalls} calls in {} device calls, {:.0} sums read per call (of {})",
        data.len(),
        batches.len(),
        nsums as f64 / ncalls.max(1) as f64,
        Lm::order().len() + 1
    );
    let devices: Vec<(String, Device)> = names
        .split(',')
        .map(|n| {
            let choice = match n {
                "cpu" => BackendChoice::Cpu,
                "reference" => BackendChoice::Reference,
                "wgpu" => BackendChoice::Wgpu,
                "cuda" => BackendChoice::Cuda,
                "cuda-emulated" => BackendChoice::CudaEmulated,
                other => panic!("unknown device {other}"),
            };
            let d = select(choice)
                .unwrap_or_else(|e| panic!("device {n}: {e}"))
                .0;
            eprintln!("{n}: {}", d.lm().unwrap().describe());
            (n.to_string(), d)
        })
        .collect();
    let mut times = vec![(Vec::new(), Vec::new()); devices.len()];
    let mut first: Option<Vec<Vec<u32>>> = None;
    for round in 0..rounds {
        for (i, (name, d)) in devices.iter().enumerate() {
            // Alternate which form goes first.
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for at in order {
                let (t, sums) = run(d, &model, &batches, at);
                match &first {
                    Some(f) => assert!(sums == *f, "{name}: the sums differ"),
                    None => first = Some(sums),
                }
                let form = if at { "at" } else { "whole" };
                eprintln!("round {round} {name} {form}: {t:.3}s");
                if at {
                    times[i].1.push(t);
                } else {
                    times[i].0.push(t);
                }
            }
        }
    }
    println!("| device | whole sums, s (median, range) | sums at the reads, s | at / whole |");
    println!("|---|---|---|---|");
    for ((name, _), (w, a)) in devices.iter().zip(&mut times) {
        let ratios: Vec<f64> = a.iter().zip(w.iter()).map(|(a, w)| a / w).collect();
        let mut ratios = ratios;
        let (wm, wl, wh) = median_range(w);
        let (am, al, ah) = median_range(a);
        let (rm, rl, rh) = median_range(&mut ratios);
        println!(
            "| {name} | {wm:.3} ({wl:.3}–{wh:.3}) | {am:.3} ({al:.3}–{ah:.3}) | {rm:.3} \
             ({rl:.3}–{rh:.3}) |"
        );
    }
}
