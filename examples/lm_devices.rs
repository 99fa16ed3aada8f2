//! The version-1 text codec's speed per device, in paired rounds: each round compresses
//! (without the verifying decode) and decompresses the same text on every device in turn,
//! checks the streams are the same bytes, and the medians and ranges are printed per device.
//!
//! `cargo run --release --example lm_devices -- FILE [--rounds N] [--gpt2-small]
//! [--devices cpu,wgpu]` (`cpu-avx2`, `cpu-portable`, ...: the CPU pinned to one level): the shipped tinygpt2 model, or with `--gpt2-small` a random model
//! of GPT-2-small's shape (12 x 768, vocab 50257; segments of 255 tokens).
//! `--int8-rate MACS_PER_S` also prints the floor: the model's int8 matmul MACs per token
//! (every token is coded, so the head counts for each; attention's 2 pos d per layer is left
//! out) at that rate, and each device's measured/floor. `--profile` times every kernel launch
//! and host round trip of the CUDA devices (`cuda`, `cuda-emulated`) and prints where their
//! time went in the last round's compress and its decompress, one row per kernel
//! (src/backend/cuda/profile.rs); their speed rows then include the profiling's cost.
//! `--compress-only` skips the decompressions (for a profile of the compressor alone).
//! `--write-model PATH` writes the model to PATH and stops (for `lockstep text compress
//! --model PATH`, the command's end-to-end time with the GPT-2-small shape).

use std::time::Instant;

use lockstep::backend::cpu::Isa;
use lockstep::backend::cuda::profile::Report;
use lockstep::backend::{select, BackendChoice, Device};
use lockstep::format::lm::model_file::Model;
use lockstep::lm::text_codec::{compress_unverified, decompress, Options};
use lockstep::lm::tokenizer;
#[path = "../tests/lm_common/random_model.rs"]
mod random_model;

fn device(name: &str, profile: bool) -> (Device, Option<std::sync::Arc<dyn Report>>) {
    if profile && name.starts_with("cuda") {
        let (d, r) = Device::cuda_profiled(name == "cuda-emulated")
            .unwrap_or_else(|e| panic!("device {name}: {e}"));
        return (d, Some(r));
    }
    // `cpu-avx2`, `cpu-portable`, ...: the CPU pinned to one level (a level of a lower CPU
    // measured on this one, both codecs' kernels at it).
    if let Some(isa) = Isa::ALL.iter().find(|i| name == format!("cpu-{}", i.tag())) {
        let d = Device::cpu_at(*isa).unwrap_or_else(|| panic!("this CPU does not run {name}"));
        return (d, None);
    }
    let choice = match name {
        "cpu" => BackendChoice::Cpu,
        "reference" => BackendChoice::Reference,
        "wgpu" => BackendChoice::Wgpu,
        "cuda" => BackendChoice::Cuda,
        "cuda-emulated" => BackendChoice::CudaEmulated,
        other => panic!("unknown device {other}"),
    };
    let d = select(choice)
        .unwrap_or_else(|e| panic!("device {name}: {e}"))
        .0;
    (d, None)
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
        .expect("usage: lm_devices FILE [--rounds N] [--gpt2-small]");
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].clone())
    };
    let rounds: usize = flag("--rounds").map_or(3, |r| r.parse().unwrap());
    let names = flag("--devices").unwrap_or_else(|| "cpu,wgpu".into());
    let data = std::fs::read(file).unwrap();
    let mut model = if args.iter().any(|a| a == "--gpt2-small") {
        random_model::random_model(12, 768, 12, 1024, 50257, 1)
    } else {
        Model::from_bytes(include_bytes!("../models/tinygpt2.lsm")).unwrap()
    };
    if let Some(path) = flag("--write-model") {
        std::fs::write(&path, model.to_bytes()).unwrap();
        eprintln!("wrote {path}");
        return;
    }
    let opts = Options {
        segment_tokens: Some(255),
        ..Default::default()
    };
    let tokens = tokenizer::encode(&data).unwrap().len() as f64;
    let profile = args.iter().any(|a| a == "--profile");
    let compress_only = args.iter().any(|a| a == "--compress-only");
    let (devices, reports): (Vec<(String, Device)>, Vec<_>) = names
        .split(',')
        .map(|n| {
            let (d, r) = device(n, profile);
            ((n.to_string(), d), (n, r))
        })
        .unzip();
    for (n, d) in &devices {
        eprintln!("{n}: {}", d.lm().unwrap().describe());
    }
    eprintln!(
        "{file}: {} bytes, {tokens} tokens, model {}",
        data.len(),
        &model.hash_hex()[..16]
    );
    let mut times = vec![(Vec::new(), Vec::new()); devices.len()];
    let mut first: Option<Vec<u8>> = None;
    // With --profile, the last round's compress and decompress each get their own table.
    let mut phases = Vec::new();
    let take = |i: usize, round: usize, phase: &str, phases: &mut Vec<String>| {
        if let Some(r) = &reports[i].1 {
            let t = r.take_report().unwrap();
            if round + 1 == rounds {
                phases.push(format!("{}, {phase}:\n{t}", reports[i].0));
            }
        }
    };
    for round in 0..rounds {
        for (i, (name, d)) in devices.iter().enumerate() {
            take(i, round, "before", &mut Vec::new());
            let t = Instant::now();
            let c = compress_unverified(&model, &data, &opts, d).unwrap();
            let tc = t.elapsed().as_secs_f64();
            take(i, round, "compress", &mut phases);
            let t = Instant::now();
            if !compress_only {
                assert_eq!(decompress(&model, &c, d).unwrap(), data, "{name}");
            }
            let td = t.elapsed().as_secs_f64();
            take(i, round, "decompress", &mut phases);
            match &first {
                Some(f) => assert_eq!(&c, f, "{name}: the stream differs"),
                None => first = Some(c),
            }
            eprintln!("round {round} {name}: compress {tc:.2}s, decompress {td:.2}s");
            times[i].0.push(tc);
            times[i].1.push(td);
        }
    }
    println!(
        "| device | compress tokens/s | compress KB/s | decompress tokens/s | decompress KB/s |"
    );
    println!("|---|---|---|---|---|");
    let kb = data.len() as f64 / 1000.0;
    for ((name, _), (c, d)) in devices.iter().zip(&mut times) {
        let (cm, clo, chi) = median_range(c);
        let (dm, dlo, dhi) = median_range(d);
        println!(
            "| {name} | {:.0} ({:.0}–{:.0}) | {:.2} | {:.0} ({:.0}–{:.0}) | {:.2} |",
            tokens / cm,
            tokens / chi,
            tokens / clo,
            kb / cm,
            tokens / dm,
            tokens / dhi,
            tokens / dlo,
            kb / dm
        );
    }
    if let Some(rate) = flag("--int8-rate") {
        let rate: f64 = rate.parse().expect("--int8-rate: MACs per second");
        let macs = model
            .blocks
            .iter()
            .flat_map(|b| [&b.qkv, &b.attn_proj, &b.fc, &b.proj])
            .chain([&model.wte])
            .map(|l| (l.rows * l.k) as f64)
            .sum::<f64>();
        let floor = macs / rate;
        println!(
            "floor: {:.1}M int8 MACs per token at {rate:.3e} MAC/s = {:.0} tokens/s ({:.0} KB/s)",
            macs / 1e6,
            1.0 / floor,
            data.len() as f64 / tokens / floor / 1000.0
        );
        for ((name, _), (c, d)) in devices.iter().zip(&mut times) {
            let (cm, _, _) = median_range(c);
            let (dm, _, _) = median_range(d);
            println!(
                "{name}: measured/floor compress {:.2e}, decompress {:.2e}",
                tokens / cm * floor,
                tokens / dm * floor
            );
        }
    }
    for p in phases {
        println!("\n{p}");
    }
}
