//! `cargo xtask <task>`: project chores that need more than one cargo command.
//!
//! - `ci`: everything CI checks, in the order a failure is cheapest to find.
//! - `bench delta [DIR] [--zipnn]`: the speed and ratio table of docs/BENCHMARKS.md: every
//!   lockstep backend present and zstd -19 on byte-grouped XOR, in one run; with `--zipnn`,
//!   also ZipNN from PyPI, installed on first use into target/zipnn-venv (it pulls in torch,
//!   several GB).

use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map(String::as_str).unwrap_or("help");
    let result = match task {
        "ci" => ci(),
        "bench" if args.get(1).map(String::as_str) == Some("delta") => bench_delta(&args[2..]),
        _ => {
            eprintln!("usage: cargo xtask ci | cargo xtask bench delta [DIR] [--zipnn]");
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
    Ok(())
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
    let dir = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_else(|| TRAJECTORY.to_string());
    run(
        "cargo",
        &[
            "run",
            "--release",
            "--quiet",
            "--example",
            "bench_table",
            "--",
            &dir,
        ],
    )?;
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
    Ok(())
}
