//! `cargo xtask <task>`: project chores that need more than one cargo command.
//!
//! - `ci`: everything CI checks, in the order a failure is cheapest to find, ending with
//!   `cross` where its tools are installed.
//! - `cross`: the same bytes on another architecture: lockstep built for aarch64 and run
//!   under qemu must write byte-identical delta and text files to the host build's, decode
//!   the host's files, and pass `lockstep parity` (tools missing: it says which, and skips).
//! - `gpu-check [--prebuilt BINDIR] [--only STEP,..] [DIR]`: the one script to run where a GPU is lent, in
//!   the order that keeps the most important results if the lease runs out: lists the
//!   devices, builds, runs the CUDA tests with `LOCKSTEP_REQUIRE=cuda,nvrtc` (parity on the
//!   GPU), a delta encode on CUDA and on the CPU that must write the same file, the timed
//!   trajectory (DIR's bf16 tensors tiled to 3 GB, encode and decode per stage and end to
//!   end with CUDA events, floors and measured/floor: examples/cuda_trajectory.rs), the
//!   bench table (its wgpu rows then time a real GPU), the language model on CUDA
//!   (tokens/s and KB/s for the shipped tinygpt2 beside the CPU and for a GPT-2-small-shaped
//!   random model, with the int8 floor and measured/floor), each one's time per CUDA
//!   kernel (`--profile`); then the wgpu tests with `CI=true` (no adapter is a failure),
//!   `lockstep parity` with every backend on the trajectory in DIR (default
//!   ../shared/data/trajectory-gpt2, else the demo), and wgpu's LM rows.
//!   Logs go to `$OUT` when set. Each step runs even if one before failed; the exit status
//!   says whether all passed. With `--prebuilt BINDIR` it runs `gpu-pack`'s binaries
//!   instead of cargo (no build, no bench table), each step under a time limit.
//! - `gpu-pack [DIR]`: for a GPU machine without a Rust toolchain (the lent one has none):
//!   builds here and writes DIR (default .gpu) with the stripped binaries `gpu-check
//!   --prebuilt` runs and the trajectory's steps 200 and 400, each one .tar.xz;
//!   scripts/gpu_remote.sh is the other machine's side.
//! - `bench delta [DIR] [--zipnn] [--rounds N]`: the speed and ratio table of
//!   docs/BENCHMARKS.md: every lockstep backend present and zstd -19 on byte-grouped XOR, in
//!   one run; with `--zipnn`, also ZipNN from PyPI, installed on first use into
//!   target/zipnn-venv (without torch, which its byte path never uses); with `--rounds N`,
//!   then N rounds alternating lockstep `--fast` (best CPU level, one thread) and ZipNN,
//!   with each round's speed ratios and their medians (a shared machine's noise hits
//!   both sides of a round alike); `--layout default` pairs the default layout instead of
//!   `--fast`, `--isa L` (portable, avx2, avx512, neon) runs lockstep's side at that level.
//!   `bench delta [DIR] --scaling [--rounds N]`: thread scaling instead, N rounds
//!   (default 3) of both layouts at one thread and at two (best CPU level; within a round
//!   the two alternate, pass by pass), with each round's two-thread speedups and their
//!   medians (needs both cores free to mean much). `bench delta [DIR] --cli [--rounds N]`:
//!   the CLI as a user runs it, one process per file (bench_cli.rs), `zstd -3` beside it.
//! - `bench text [--quick]`: bits per byte of the text codec (default and ablations) beside
//!   xz, zstd, brotli, PPMd and zpaq on benches/text (bench_text.rs).

use std::process::{Command, ExitCode};

mod bench_cli;
mod bench_text;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map(String::as_str).unwrap_or("help");
    let result = match task {
        "ci" => ci(),
        "cross" => cross(),
        "gpu-check" => gpu_check(&args[1..]),
        "gpu-pack" => gpu_pack(&args[1..]),
        "bench" if args.get(1).map(String::as_str) == Some("delta") => bench_delta(&args[2..]),
        "bench" if args.get(1).map(String::as_str) == Some("text") => {
            bench_text::bench_text(&args[2..])
        }
        _ => {
            eprintln!(
                "usage: cargo xtask ci | cross | gpu-check [--prebuilt BINDIR] [DIR] | gpu-pack [DIR] | bench delta [DIR] [--zipnn] [--rounds N] [--layout default|signed|fast-neighbor] [--isa L] [--scaling] [--cli] | bench text [--quick]"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {task} failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    eprintln!("+ {cmd} {}", args.join(" "));
    let status = Command::new(cmd)
        .args(args)
        .status()
        .map_err(|e| format!("could not start {cmd}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{cmd} {}` exited with {status}", args.join(" ")))
    }
}

/// `cargo` arguments that run the profiling tool (xtask/measure/) with `args`.
fn measure<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec![
        "run",
        "--release",
        "--quiet",
        "--package",
        "lockstep-measure",
        "--",
    ];
    all.extend_from_slice(args);
    all
}

/// Run a command, its stderr shown, and return its stdout.
fn capture(cmd: &str, args: &[&str]) -> Result<String, String> {
    eprintln!("+ {cmd} {}", args.join(" "));
    let out = Command::new(cmd)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not start {cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{cmd} {}` exited with {}",
            args.join(" "),
            out.status
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("{cmd} printed non-UTF-8: {e}"))
}

/// The enc and dec MB/s (columns 3 and 4) of the Markdown table rows in `text`, in order.
fn speeds(text: &str) -> Vec<(f64, f64)> {
    text.lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            let num = |i: usize| cols.get(i)?.parse::<f64>().ok();
            Some((num(3)?, num(4)?))
        })
        .collect()
}

/// The (encode, decode) medians of each `two threads over one per alternation` line that
/// `measure table --scaling` prints, in order, each with its line.
fn per_alternation(text: &str) -> Vec<((f64, f64), &str)> {
    text.lines()
        .filter(|l| l.starts_with("two threads over one per alternation"))
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let after = |w: &str| {
                let at = words.iter().position(|x| *x == w)?;
                words.get(at + 1)?.parse::<f64>().ok()
            };
            Some(((after("encode")?, after("decode")?), l))
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn have(cmd: &str, arg: &str) -> bool {
    Command::new(cmd)
        .arg(arg)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn ci() -> Result<(), String> {
    run("cargo", &["fmt", "--all", "--", "--check"])?;
    run("cargo", &["build", "--release", "--all-targets"])?;
    if have("cargo-nextest", "--version") {
        run("cargo", &["nextest", "run", "--release", "--no-fail-fast"])?;
    } else {
        eprintln!("cargo-nextest not found; using cargo test");
        run(
            "cargo",
            &["test", "--release", "--tests", "--lib", "--bins"],
        )?;
    }
    // nextest does not run doc tests; they are part of the documented API.
    run("cargo", &["test", "--release", "--doc"])?;
    cross()
}

const CROSS_TARGET: &str = "aarch64-unknown-linux-gnu";

/// Byte identity across architectures, the promise every file format here makes: the host
/// build and an aarch64 build (under qemu-user) must write the same delta file and the same
/// text file for the same inputs, each must decode the other's, and `parity` must pass there
/// (reference against the portable CPU code, the only level an aarch64 CPU runs).
fn cross() -> Result<(), String> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(CROSS_TARGET))
        .unwrap_or(false);
    let missing: Vec<&str> = [
        (!installed).then_some("rustup target aarch64-unknown-linux-gnu"),
        (!have("aarch64-linux-gnu-gcc", "--version")).then_some("aarch64-linux-gnu-gcc"),
        (!have("qemu-aarch64", "--version")).then_some("qemu-aarch64"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !missing.is_empty() {
        eprintln!(
            "SKIP cross-architecture check: missing {} (apt-get install gcc-aarch64-linux-gnu \
             libc6-dev-arm64-cross qemu-user; rustup target add {CROSS_TARGET})",
            missing.join(", ")
        );
        return Ok(());
    }
    let status = Command::new("cargo")
        .args([
            "build",
            "--release",
            "--bin",
            "lockstep",
            "--target",
            CROSS_TARGET,
        ])
        .env(
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
            "aarch64-linux-gnu-gcc",
        )
        .env("CC_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-gcc")
        .status()
        .map_err(|e| format!("could not start cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cross build for {CROSS_TARGET} failed"));
    }
    run("cargo", &["build", "--release", "--bin", "lockstep"])?;
    let host = "target/release/lockstep".to_string();
    let arm = format!("target/{CROSS_TARGET}/release/lockstep");
    let dir = "target/cross-check";
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("{dir}: {e}"))?;
    // `lockstep` on the host, or the aarch64 build under qemu.
    let on = |arch: &str, args: &[&str]| -> Result<(), String> {
        if arch == "host" {
            run(&host, args)
        } else {
            let mut a = vec!["-L", "/usr/aarch64-linux-gnu", arm.as_str()];
            a.extend_from_slice(args);
            run("qemu-aarch64", &a)
        }
    };
    let same = |a: &str, b: &str| -> Result<(), String> {
        let (x, y) = (std::fs::read(a), std::fs::read(b));
        match (x, y) {
            (Ok(x), Ok(y)) if x == y => Ok(()),
            (Ok(_), Ok(_)) => Err(format!("{a} and {b} differ")),
            (x, y) => Err(format!(
                "cannot read {a} or {b}: {:?} {:?}",
                x.err(),
                y.err()
            )),
        }
    };
    // `--backend cpu` runs the best level the CPU has: on aarch64 that must be the NEON
    // level, so the byte comparisons below check its lanes (every layout) against the host's.
    let listed = Command::new("qemu-aarch64")
        .args(["-L", "/usr/aarch64-linux-gnu", arm.as_str(), "backends"])
        .output()
        .map_err(|e| format!("could not start qemu-aarch64: {e}"))?;
    let listed = String::from_utf8_lossy(&listed.stdout);
    if !listed
        .lines()
        .any(|l| l.starts_with("cpu") && l.ends_with("NEON"))
    {
        return Err(format!(
            "the aarch64 build's cpu backend is not at the NEON level:\n{listed}"
        ));
    }
    let (r, t) = (
        "demo/step0200_blocks_bf16.safetensors",
        "demo/step0400_blocks_bf16.safetensors",
    );
    // The default layouts and the fast one (`--layout fast`) on the demo; the fast one's
    // neighbor form (`--layout fast-neighbor`, a hidden value: the NEON level's own decode
    // lanes for that form) on a generated pair, as it never pays on the demo's small tensors.
    let (nr, nt) = neighbor_pair(dir)?;
    for (layout, r, t) in [
        ("auto", r, t),
        ("fast", r, t),
        ("fast-neighbor", nr.as_str(), nt.as_str()),
    ] {
        for arch in ["host", "aarch64"] {
            let out = format!("{dir}/{arch}-{layout}.lsd");
            on(
                arch,
                &[
                    "--backend",
                    "cpu",
                    "delta",
                    "encode",
                    "--layout",
                    layout,
                    "--reference",
                    r,
                    "--target",
                    t,
                    "-o",
                    &out,
                ],
            )?;
        }
        let host = format!("{dir}/host-{layout}.lsd");
        same(&host, &format!("{dir}/aarch64-{layout}.lsd"))?;
        let back = format!("{dir}/host-{layout}-lsd-on-aarch64.safetensors");
        on(
            "aarch64",
            &["delta", "decode", "--reference", r, &host, "-o", &back],
        )?;
        same(&back, t)?;
    }
    // Chosen where it pays only: the generated pair's `--fast` file must differ, or the
    // comparison above never reached the neighbor form's lanes.
    let plain = format!("{dir}/host-fast-neighbor-pair-as-fast.lsd");
    on(
        "host",
        &[
            "--backend",
            "cpu",
            "delta",
            "encode",
            "--fast",
            "--reference",
            &nr,
            "--target",
            &nt,
            "-o",
            &plain,
        ],
    )?;
    if same(&plain, &format!("{dir}/host-fast-neighbor.lsd")).is_ok() {
        return Err(format!(
            "the neighbor form was not chosen for {nt}: the check did not reach its lanes"
        ));
    }
    // Text: a fixed excerpt of a shipped document, long enough (2.6 kB) to be coded as two
    // strands (docs/INTEGER_GPT2.md §13.5), short enough to keep the emulated run short.
    let doc =
        std::fs::read("docs/INTEGER_GPT2.md").map_err(|e| format!("docs/INTEGER_GPT2.md: {e}"))?;
    let text = format!("{dir}/sample.txt");
    std::fs::write(&text, &doc[..doc.len().min(2600)]).map_err(|e| format!("{text}: {e}"))?;
    for arch in ["host", "aarch64"] {
        let out = format!("{dir}/{arch}.lst");
        on(
            arch,
            &["--backend", "cpu", "text", "compress", &text, "-o", &out],
        )?;
    }
    same(&format!("{dir}/host.lst"), &format!("{dir}/aarch64.lst"))?;
    let back = format!("{dir}/host-lst-on-aarch64.txt");
    on(
        "aarch64",
        &[
            "text",
            "decompress",
            &format!("{dir}/host.lst"),
            "-o",
            &back,
        ],
    )?;
    same(&back, &text)?;
    on("aarch64", &["parity", r, t])?;
    eprintln!(
        "cross-architecture check: {CROSS_TARGET} (NEON level) under qemu writes and reads the \
         host's bytes"
    );
    Ok(())
}

/// A BF16 pair in `dir` on which the Joint layout's neighbor form pays: 1024 rows of 64
/// (one chunk), where the column sets the reference's top two mantissa bits (the context's
/// m2) and the update's size and direction, so the element one row up predicts an
/// element's symbol; a tenth unchanged and a few wild values, as in the parity suite's
/// pairs. Two one-tensor safetensors files; returns their paths.
fn neighbor_pair(dir: &str) -> Result<(String, String), String> {
    let (rows, cols) = (1024usize, 64u64);
    // xorshift64*: the same files on every machine.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let (mut r, mut t) = (Vec::new(), Vec::new());
    for j in 0..rows as u64 * cols {
        let (col, k) = (j % cols, next());
        // Sign, an exponent a few below 1.0's (biased 127), the column's top mantissa bits.
        let rv = (k >> 63) << 15 | (126 - k % 6) << 7 | (col % 4) << 5 | (next() & 31);
        // 1..=1, 4..=7, 16..=31 or 64..=127 steps in key order, up or down by column
        // (negative floats move the other way in their bits).
        let scale = 1u64 << (1 + 2 * (col % 4));
        let step = scale / 2 + next() % (scale / 2);
        let up = (col % 3 == 0) ^ (k >> 63 == 1);
        let tv = match next() % 100 {
            0..=9 => rv,
            10..=93 if up => rv.wrapping_add(step),
            10..=93 => rv.wrapping_sub(step),
            94..=96 => next(),
            97 => 0,
            98 => 1 << 15,
            _ => 0xffff ^ (next() & 3),
        };
        r.extend_from_slice(&(rv as u16).to_le_bytes());
        t.extend_from_slice(&(tv as u16).to_le_bytes());
    }
    let write = |name: &str, data: &[u8]| -> Result<String, String> {
        let path = format!("{dir}/{name}");
        let mut header = format!(
            r#"{{"w":{{"dtype":"BF16","shape":[{rows},{cols}],"data_offsets":[0,{}]}}}}"#,
            data.len()
        );
        // The data 8-byte aligned, as safetensors writers leave it.
        while header.len() % 8 != 0 {
            header.push(' ');
        }
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(data);
        std::fs::write(&path, bytes).map_err(|e| format!("{path}: {e}"))?;
        Ok(path)
    };
    Ok((
        write("neighbor-ref.safetensors", &r)?,
        write("neighbor-target.safetensors", &t)?,
    ))
}

const TRAJECTORY: &str = "../shared/data/trajectory-gpt2";
const PAIRS: [(&str, &str); 2] = [
    (
        "gpt2_step000600_bf16.safetensors",
        "gpt2_step000800_bf16.safetensors",
    ),
    (
        "gpt2_step000600_fp32.safetensors",
        "gpt2_step000800_fp32.safetensors",
    ),
];

fn bench_delta(args: &[String]) -> Result<(), String> {
    let zipnn = args.iter().any(|a| a == "--zipnn");
    // The one argument that is neither a flag nor the value after `--rounds`, `--layout` or
    // `--isa`.
    let dir = args
        .iter()
        .enumerate()
        .find(|&(i, a)| {
            !a.starts_with("--")
                && (i == 0 || !["--rounds", "--layout", "--isa"].contains(&&*args[i - 1]))
        })
        .map(|(_, a)| a.clone())
        .unwrap_or_else(|| TRAJECTORY.to_string());
    let rounds: Option<usize> = match args.iter().position(|a| a == "--rounds") {
        Some(i) => Some(
            args.get(i + 1)
                .and_then(|n| n.parse().ok())
                .ok_or("--rounds needs a number")?,
        ),
        None => None,
    };
    if args.iter().any(|a| a == "--scaling") {
        return scaling(&dir, rounds.unwrap_or(3));
    }
    if args.iter().any(|a| a == "--cli") {
        return bench_cli::bench_cli(&dir, rounds.unwrap_or(7));
    }
    // `--isa L`: the paired rounds run lockstep at that CPU level instead of the best.
    let isa = match args.iter().position(|a| a == "--isa") {
        Some(i) => args.get(i + 1).ok_or("--isa needs a level")?.as_str(),
        None => "",
    };
    let layout = match args.iter().position(|a| a == "--layout") {
        Some(i) => match args.get(i + 1).map(String::as_str) {
            Some(l @ ("default" | "signed" | "fast" | "fast-neighbor")) => l,
            _ => {
                return Err("--layout needs `default`, `signed`, `fast` or `fast-neighbor`".into())
            }
        },
        None => "fast",
    };
    run("cargo", &measure(&["table", "--dir", &dir]))?;
    if !zipnn {
        eprintln!("(ZipNN not run: add --zipnn to install it into target/zipnn-venv and compare)");
        return Ok(());
    }
    let py = "target/zipnn-venv/bin/python";
    if !std::path::Path::new(py).exists() {
        // ZipNN imports torch at module level but its byte path never uses it: install it
        // without its dependencies (torch is 5.6 GB) and put a stand-in torch on the path.
        run("python3", &["-m", "venv", "target/zipnn-venv"])?;
        let pip = "target/zipnn-venv/bin/pip";
        run(pip, &["install", "-q", "numpy", "zstandard", "safetensors"])?;
        run(pip, &["install", "-q", "--no-deps", "zipnn"])?;
    }
    std::env::set_var("PYTHONPATH", "scripts/torch_stub");
    let rounds = rounds.unwrap_or(0);
    for (a, b) in PAIRS {
        println!("\nZipNN on {a} -> {b}:");
        run(
            py,
            &[
                "xtask/zipnn_bench.py",
                &format!("{dir}/{a}"),
                &format!("{dir}/{b}"),
            ],
        )?;
    }
    if rounds > 0 {
        paired_rounds(&dir, py, rounds, layout, isa)?;
    }
    Ok(())
}

/// `rounds` runs of the bench table's `--scaling` rows (both layouts, one thread then two,
/// best CPU level): each round's speeds and two-thread speedups, then the medians.
fn scaling(dir: &str, rounds: usize) -> Result<(), String> {
    let mut table = Vec::new();
    for round in 1..=rounds {
        let text = capture("cargo", &measure(&["table", "--dir", dir, "--scaling"]))?;
        let rows = speeds(&text);
        let ratios = per_alternation(&text);
        // Per pair: --fast 1 thread, --fast 2, default 1, default 2; a speedup line after
        // each layout's two.
        for (k, (_, b)) in PAIRS.iter().enumerate() {
            for (l, layout) in ["--fast", "default"].into_iter().enumerate() {
                let (Some(&one), Some(&two), Some((x, line))) = (
                    rows.get(4 * k + 2 * l),
                    rows.get(4 * k + 2 * l + 1),
                    ratios.get(2 * k + l),
                ) else {
                    return Err(format!("round {round}: no speeds parsed for {b}"));
                };
                // With its quartiles, as measured.
                println!("round {round}, {b}, {layout}: {line}");
                table.push((round, *b, layout, one, two, *x));
            }
        }
    }
    println!("\nThread scaling, lockstep on the best CPU level: each row's best MB/s, and the");
    println!("two-thread speedup as the median over alternations (× columns):");
    println!("| round | target | layout | enc 1 thr | enc 2 thr | enc × | dec 1 thr | dec 2 thr | dec × |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for &(round, b, layout, one, two, x) in &table {
        println!(
            "| {round} | {b} | {layout} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.2} |",
            one.0, two.0, x.0, one.1, two.1, x.1
        );
    }
    for (_, b) in PAIRS {
        for layout in ["--fast", "default"] {
            let of = |f: fn(&(f64, f64)) -> f64| {
                table
                    .iter()
                    .filter(|r| r.1 == b && r.2 == layout)
                    .map(|r| f(&r.5))
                    .collect::<Vec<_>>()
            };
            println!(
                "median over {rounds} rounds of the per-alternation medians, {b}, {layout}: two threads encode {:.2}×, decode {:.2}× one thread",
                median(of(|s| s.0)),
                median(of(|s| s.1))
            );
        }
    }
    Ok(())
}

/// `rounds` rounds of lockstep in `layout` (best CPU level, one thread) then ZipNN, on every
/// pair: each round's speeds and lockstep/ZipNN ratios, then the ratios' medians.
fn paired_rounds(
    dir: &str,
    py: &str,
    rounds: usize,
    layout: &str,
    isa: &str,
) -> Result<(), String> {
    let mut table = Vec::new();
    let mut table_args = measure(&["table", "--dir", dir, "--paired", "--layout", layout]);
    if !isa.is_empty() {
        table_args.extend(["--isa", isa]);
    }
    for round in 1..=rounds {
        let ours = speeds(&capture("cargo", &table_args)?);
        for (k, (a, b)) in PAIRS.iter().enumerate() {
            let theirs = speeds(&capture(
                py,
                &[
                    "xtask/zipnn_bench.py",
                    &format!("{dir}/{a}"),
                    &format!("{dir}/{b}"),
                ],
            )?);
            let (Some(&l), Some(&z)) = (ours.get(k), theirs.first()) else {
                return Err(format!("round {round}: no speeds parsed for {a}"));
            };
            table.push((round, *b, l, z));
        }
    }
    println!(
        "\nPaired rounds: lockstep, {} layout ({} CPU level, 1 thread), then ZipNN (1 thread), MB/s:",
        match layout {
            "fast" => "--fast",
            l => l,
        },
        if isa.is_empty() { "best" } else { isa }
    );
    println!(
        "| round | target | lockstep enc | ZipNN enc | enc × | lockstep dec | ZipNN dec | dec × |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for &(round, b, l, z) in &table {
        println!(
            "| {round} | {b} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.2} |",
            l.0,
            z.0,
            l.0 / z.0,
            l.1,
            z.1,
            l.1 / z.1
        );
    }
    for (_, b) in PAIRS {
        let of = |f: fn(&(f64, f64)) -> f64| {
            table
                .iter()
                .filter(|r| r.1 == b)
                .map(|r| f(&r.2) / f(&r.3))
                .collect::<Vec<_>>()
        };
        println!(
            "median over {rounds} rounds, {b}: encode {:.2}× ZipNN, decode {:.2}× ZipNN",
            median(of(|s| s.0)),
            median(of(|s| s.1))
        );
    }
    Ok(())
}

/// The test binaries that hold the GPU tests (`cuda::` and `wgpu::` modules), the examples
/// that time the GPU, and the CLI: what `gpu-pack` carries to a machine without cargo.
const GPU_TESTS: [&str; 3] = ["backend_parity", "lm_codec", "lm_strands"];
const GPU_EXAMPLES: [&str; 3] = ["cuda_trajectory", "lm_devices", "lm_sums_at"];

/// `gpu-pack [DIR]`: for a GPU machine without a Rust toolchain (the lent one has none):
/// builds here, then writes DIR (default .gpu) with `bin.tar.xz` (lockstep, this xtask, the
/// GPU test binaries and examples, stripped) and `data.tar.xz` (the trajectory's steps 200
/// and 400 in bf16, when ../shared/data has them). There, unpacked, `xtask gpu-check
/// --prebuilt BINDIR [DIR]` runs the same steps as `gpu-check` on those binaries (see
/// scripts/gpu_remote.sh). The tests find the repository's files at the path they were
/// built in, so the checkout must be reachable there under the same path.
fn gpu_pack(args: &[String]) -> Result<(), String> {
    let dir = std::path::PathBuf::from(args.first().map_or(".gpu", String::as_str));
    let stage = dir.join("bin");
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(&stage).map_err(|e| format!("{}: {e}", stage.display()))?;
    run(
        "cargo",
        &["build", "--release", "--bin", "lockstep", "--examples"],
    )?;
    run("cargo", &["build", "--release", "--package", "xtask"])?;
    // The test binaries' names carry a hash: cargo names each executable it builds.
    let out = Command::new("cargo")
        .args(["test", "--release", "--no-run", "--message-format=json"])
        .args(GPU_TESTS.iter().flat_map(|t| ["--test", t]))
        .output()
        .map_err(|e| format!("cargo test --no-run: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let json = String::from_utf8_lossy(&out.stdout);
    let mut files: Vec<(String, String)> = Vec::new();
    for t in GPU_TESTS {
        let line = json
            .lines()
            .find(|l| l.contains(&format!("\"name\":\"{t}\"")) && l.contains("\"executable\":\""))
            .ok_or(format!("cargo built no test binary {t}"))?;
        let exe = line.split("\"executable\":\"").nth(1).unwrap();
        files.push((exe[..exe.find('"').unwrap()].to_string(), t.to_string()));
    }
    for e in GPU_EXAMPLES {
        files.push((format!("target/release/examples/{e}"), e.to_string()));
    }
    files.push(("target/release/lockstep".into(), "lockstep".into()));
    files.push(("target/release/xtask".into(), "xtask".into()));
    for (from, name) in &files {
        let to = stage.join(name);
        std::fs::copy(from, &to).map_err(|e| format!("{from}: {e}"))?;
        run("strip", &[&to.display().to_string()])?;
    }
    // One archive, one large window: the binaries share most of their code.
    // (The shell's redirect runs in this folder; `tar -C` only moves where tar reads.)
    let tar = |name: &str, base: &std::path::Path, what: &[String]| {
        let script = format!(
            "tar -C '{}' -cf - {} | xz -T0 -9e --lzma2=dict=192MiB > '{}'",
            base.display(),
            what.join(" "),
            dir.join(name).display()
        );
        run("sh", &["-c", &script])
    };
    let names: Vec<String> = files.iter().map(|f| f.1.clone()).collect();
    tar("bin.tar.xz", &stage, &names)?;
    std::fs::remove_dir_all(&stage).map_err(|e| e.to_string())?;
    let traj = std::path::Path::new(TRAJECTORY);
    let steps = ["200", "400"].map(|s| format!("gpt2_step000{s}_bf16.safetensors"));
    if steps.iter().all(|s| traj.join(s).exists()) {
        // Inside the archive: trajectory-gpt2/<file>.
        let paths = steps.map(|s| format!("trajectory-gpt2/{s}"));
        tar("data.tar.xz", traj.parent().unwrap(), &paths)?;
    } else {
        eprintln!("no trajectory in {TRAJECTORY}: the GPU run will use the demo checkpoints");
    }
    for f in ["bin.tar.xz", "data.tar.xz"] {
        if let Ok(m) = std::fs::metadata(dir.join(f)) {
            println!("{}: {:.1} MB", dir.join(f).display(), m.len() as f64 / 1e6);
        }
    }
    Ok(())
}

/// See the module docs: everything a lent GPU machine should check, in one call.
fn gpu_check(args: &[String]) -> Result<(), String> {
    let out_dir = std::env::var("OUT").ok();
    let log = |name: &str, text: &str| {
        print!("{text}");
        if let Some(d) = &out_dir {
            let _ = std::fs::write(format!("{d}/{name}.log"), text);
        }
    };
    // `--prebuilt BINDIR`: the binaries of `gpu-pack`, each step under a time limit (a
    // lent machine's minutes are few); otherwise cargo builds and runs them here.
    let mut args = args.to_vec();
    let prebuilt = args.iter().position(|a| a == "--prebuilt").map(|i| {
        let d = args.get(i + 1).cloned().unwrap_or_default();
        args.drain(i..(i + 2).min(args.len()));
        d
    });
    // `--only A,B`: just the steps whose names start with A or B (a short first call on a
    // lent machine, e.g. `--only backends,cuda-trajectory-profile,lm-profile`).
    let only: Option<Vec<String>> = args.iter().position(|a| a == "--only").map(|i| {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        args.drain(i..(i + 2).min(args.len()));
        v.split(',').map(String::from).collect()
    });
    // What the machine has (informational: missing tools are not failures).
    for (cmd, a) in [("nvidia-smi", ""), ("vulkaninfo", "--summary")] {
        match Command::new(cmd)
            .args((!a.is_empty()).then_some(a))
            .output()
        {
            Ok(o) => log(cmd, &String::from_utf8_lossy(&o.stdout)),
            Err(e) => eprintln!("({cmd} not available: {e})"),
        }
    }
    let dir = args
        .first()
        .cloned()
        .unwrap_or_else(|| TRAJECTORY.to_string());
    let files: Vec<String> = {
        let mut f: Vec<String> = ["200", "400", "600", "800"]
            .iter()
            .map(|s| format!("{dir}/gpt2_step000{s}_bf16.safetensors"))
            .filter(|p| std::path::Path::new(p).exists())
            .collect();
        if f.len() < 2 {
            eprintln!("no trajectory in {dir}: using the demo checkpoints");
            f = ["0200", "0400", "0600", "0800"]
                .iter()
                .map(|s| format!("demo/step{s}_blocks_bf16.safetensors"))
                .collect();
        }
        f
    };
    let mut failed = Vec::new();
    let mut step = |name: &str, cmd: &str, args: &[&str], env: &[(&str, &str)], limit: u32| {
        if let Some(only) = &only {
            if !only.iter().any(|p| name.starts_with(p.as_str())) {
                return;
            }
        }
        // Prebuilt: under `timeout` (coreutils), so one hung step cannot eat the lease.
        let limit = limit.to_string();
        let (cmd, args): (&str, Vec<&str>) = match &prebuilt {
            Some(_) => ("timeout", [&["-k", "5", &limit, cmd], args].concat()),
            None => (cmd, args.to_vec()),
        };
        eprintln!("+ {cmd} {}", args.join(" "));
        let t = std::time::Instant::now();
        match Command::new(cmd)
            .args(&args)
            .envs(env.iter().copied())
            .output()
        {
            Ok(o) => {
                let text = format!(
                    "{}{}\n({name}: {} in {:.1} s)\n",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr),
                    o.status,
                    t.elapsed().as_secs_f64()
                );
                log(name, &text);
                if !o.status.success() {
                    failed.push(name.to_string());
                }
            }
            Err(e) => {
                eprintln!("could not start {cmd}: {e}");
                failed.push(name.to_string());
            }
        }
    };
    let bin = |name: &str| match &prebuilt {
        Some(d) => format!("{d}/{name}"),
        None => format!("target/release/{name}"),
    };
    let lockstep = bin("lockstep");
    if prebuilt.is_none() {
        step(
            "build",
            "cargo",
            &["build", "--release", "--all-targets"],
            &[],
            0,
        );
    }
    step("backends", &lockstep, &["backends"], &[], 60);
    // The GPU tests, CUDA's first (`LOCKSTEP_REQUIRE=cuda,nvrtc`: without a driver that is
    // a failure here, not a skip), wgpu's after the CUDA timings (`CI=true`: no adapter is
    // a failure).
    // One test is left out on wgpu: `random_tensors_every_dtype_and_odd_length` did not
    // finish within 150 s on the H200's Vulkan driver in three sessions (wgpu's lanes are
    // slow there), so it ate half the check's five minutes without a verdict; it passes on
    // lavapipe in every CI run and on CUDA here. The step's log names it.
    const WGPU_LEFT_OUT: &str = "wgpu::random_tensors_every_dtype_and_odd_length";
    let tests = |device: &str| -> Vec<(String, Vec<String>)> {
        let left_out = device == "wgpu";
        match &prebuilt {
            // libtest's filters: the device's module, and the cross-decode tests.
            Some(d) => GPU_TESTS
                .iter()
                .map(|t| {
                    let mut filters = vec![format!("{device}::"), "cross_decode".into()];
                    if left_out {
                        filters.extend(["--skip".into(), WGPU_LEFT_OUT.into()]);
                    }
                    (format!("{d}/{t}"), filters)
                })
                .collect(),
            None => {
                let a = ["nextest", "run", "--release", "--no-fail-fast", "-E"];
                let mut a: Vec<String> = a.map(String::from).to_vec();
                a.push(match left_out {
                    true => format!("test(/{device}/) - test(={WGPU_LEFT_OUT})"),
                    false => format!("test(/{device}/)"),
                });
                vec![("cargo".into(), a)]
            }
        }
    };
    for (i, (cmd, a)) in tests("cuda").iter().enumerate() {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        step(
            &format!("cuda-tests-{i}"),
            cmd,
            &a,
            &[("CI", "true"), ("LOCKSTEP_REQUIRE", "cuda,nvrtc")],
            150,
        );
    }
    let tmp = std::env::temp_dir();
    let lsd = |b: &str| tmp.join(format!("gpu-check-{b}.lsd")).display().to_string();
    for b in ["cuda", "cpu"] {
        step(
            &format!("delta-encode-{b}"),
            &lockstep,
            &[
                "delta",
                "encode",
                "--backend",
                b,
                "--reference",
                &files[0],
                "--target",
                &files[1],
                "-o",
                &lsd(b),
                "-f",
            ],
            &[],
            60,
        );
    }
    step(
        "delta-same-file",
        "cmp",
        &[&lsd("cuda"), &lsd("cpu")],
        &[],
        10,
    );
    // Each example run through cargo here, or its prebuilt binary.
    let example = |name: &str| -> (String, Vec<&'static str>) {
        match &prebuilt {
            Some(d) => (format!("{d}/{name}"), vec![]),
            None => (
                "cargo".into(),
                vec![
                    "run",
                    "--release",
                    "--quiet",
                    "--example",
                    Box::leak(name.into()),
                    "--",
                ],
            ),
        }
    };
    // The timed trajectory (src/backend/cuda/trajectory.rs): DIR's bf16 tensors tiled to
    // 3 GB, encoded and decoded on the GPU, per stage and end to end with CUDA events, the
    // host-to-device copy alone and within, the floor of each stage and measured/floor; the
    // first 4 blobs compared with the CPU's bytes. (Its emulated mode is a CI test.)
    let (cmd, mut a) = example("cuda_trajectory");
    a.extend(["--dir", &dir, "--gb", "3", "--check-cpu", "4"]);
    step("cuda-trajectory", &cmd, &a, &[], 150);
    if prebuilt.is_none() {
        step(
            "bench",
            "cargo",
            &measure(&["table", "--dir", &dir]),
            &[],
            0,
        );
    }
    // The language model on the GPUs: its parity ran with the tests; here its throughput,
    // the shipped model beside the CPU (the example checks that every device writes the
    // same stream), GPT-2-small's shape on the GPU alone (the CPU would take minutes). The
    // floor assumes the H200's dense int8 tensor-core rate, 1979 TOPS = 989.5e12 MAC/s (the
    // matmul's mma.sync, which reaches a fraction of it).
    let (tiny, small) = (
        "benches/text/prose-genesis.txt",
        "benches/text/code-forward.rs",
    );
    // And every file of benches/text as one input (165 KB, about 80K tokens): a step of
    // hundreds of sequences, where a GPU's throughput shows (the small files make a few).
    let all_text: &'static str = {
        let path = tmp.join("gpu-check-all-text.txt");
        let mut all = Vec::new();
        let mut names: Vec<_> = std::fs::read_dir("benches/text")
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        names.sort();
        for f in names.iter().filter(|f| !f.ends_with("README.md")) {
            all.extend(std::fs::read(f).unwrap_or_default());
        }
        let _ = std::fs::write(&path, all);
        String::leak(path.display().to_string())
    };
    let lm_rows = [
        ("lm-speed-tinygpt2", tiny, "cuda,cpu", 120),
        ("lm-speed-gpt2-small", small, "cuda", 120),
        ("lm-speed-gpt2-small-all-text", all_text, "cuda", 120),
        ("lm-speed-tinygpt2-wgpu", tiny, "wgpu", 60),
        ("lm-speed-gpt2-small-wgpu", small, "wgpu", 60),
    ];
    let lm_args = |file: &'static str, devices: &'static str, small: bool, rounds| {
        let (cmd, mut a) = example("lm_devices");
        a.extend([
            file,
            "--rounds",
            rounds,
            "--devices",
            devices,
            "--int8-rate",
            "989.5e12",
        ]);
        if small {
            a.push("--gpt2-small");
        }
        (cmd, a)
    };
    for (name, file, devices, limit) in &lm_rows[..3] {
        let (cmd, a) = lm_args(file, devices, name.contains("gpt2-small"), "2");
        step(name, &cmd, &a, &[], *limit);
    }
    // The CLI end to end on the same input (tinygpt2, built in; verified by decompressing
    // first): the default mixing stream (v2) and the model alone (v1, `--no-mix`), on CUDA
    // and on the host's CPU, then each file decompressed.
    for (b, limit) in [("cuda", 120), ("cpu", 120)] {
        for (v, extra) in [("v2", None), ("v1", Some("--no-mix"))] {
            let out = tmp
                .join(format!("gpu-check-{b}-{v}.lst"))
                .display()
                .to_string();
            let back = tmp
                .join(format!("gpu-check-{b}-{v}.txt"))
                .display()
                .to_string();
            let mut a = vec!["text", "compress", "--backend", b, "-f", "-o", &out];
            a.extend(extra);
            a.push(all_text);
            step(
                &format!("lm-cli-{b}-{v}-compress"),
                &lockstep,
                &a,
                &[],
                limit,
            );
            let a = [
                "text",
                "decompress",
                "--backend",
                b,
                "-f",
                "-o",
                &back,
                &out,
            ];
            step(
                &format!("lm-cli-{b}-{v}-decompress"),
                &lockstep,
                &a,
                &[],
                limit,
            );
        }
    }
    // The mixing encoder's LM call in both forms on the same input (examples/lm_sums_at.rs):
    // whole prefix sums read back and picked on the host, against the sums at the indices
    // the coder reads made on the device (`step_prefix_sums_at`, what `text compress` now
    // asks), paired rounds on CUDA and on the host's CPU.
    let (cmd, mut a) = example("lm_sums_at");
    a.extend([all_text, "--rounds", "3", "--devices", "cuda,cpu"]);
    step("lm-sums-at", &cmd, &a, &[], 120);
    // Where CUDA's time goes, per kernel (src/backend/cuda/profile.rs: a few lines of log,
    // where a profiler's raw output outgrew what a lease returns): the trajectory at 0.5
    // GB, and GPT-2-small's shape on one round.
    let (cmd, mut a) = example("cuda_trajectory");
    a.extend([
        "--dir",
        &dir,
        "--gb",
        "0.5",
        "--check-cpu",
        "0",
        "--profile",
    ]);
    step("cuda-trajectory-profile", &cmd, &a, &[], 90);
    let (cmd, mut a) = lm_args(small, "cuda", true, "1");
    a.push("--profile");
    step("lm-profile-gpt2-small", &cmd, &a, &[], 90);
    // Then wgpu on the GPU's Vulkan driver, apart, so a missing adapter costs only its own
    // steps: its tests, every backend's parity, its LM rows.
    for (i, (cmd, a)) in tests("wgpu").iter().enumerate() {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        step(
            &format!("wgpu-tests-{i}"),
            cmd,
            &a,
            &[("CI", "true"), ("LOCKSTEP_REQUIRE", "wgpu")],
            150,
        );
    }
    let mut parity = vec!["parity"];
    parity.extend(files.iter().map(String::as_str));
    step("parity", &lockstep, &parity, &[], 90);
    for (name, file, devices, limit) in &lm_rows[3..] {
        let (cmd, a) = lm_args(file, devices, name.contains("gpt2-small"), "2");
        step(name, &cmd, &a, &[], *limit);
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("failed steps: {}", failed.join(", ")))
    }
}
