//! `cargo xtask <task>`: project chores that need more than one cargo command.
//!
//! - `ci`: everything CI checks, in the order a failure is cheapest to find, ending with
//!   `cross` where its tools are installed.
//! - `cross`: the same bytes on another architecture: lockstep built for aarch64 and run
//!   under qemu must write byte-identical delta and text files to the host build's, decode
//!   the host's files, and pass `lockstep parity` (tools missing: it says which, and skips).
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
        "cross" => cross(),
        "bench" if args.get(1).map(String::as_str) == Some("delta") => bench_delta(&args[2..]),
        _ => {
            eprintln!("usage: cargo xtask ci | cross | bench delta [DIR] [--zipnn]");
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
    let (r, t) = (
        "demo/step0200_blocks_bf16.safetensors",
        "demo/step0400_blocks_bf16.safetensors",
    );
    // Both the default layouts and the fast one (`--layout fast`).
    for layout in ["auto", "fast"] {
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
    // Text: a fixed excerpt of a shipped document (1.5 kB keeps the emulated run short).
    let doc =
        std::fs::read("docs/INTEGER_GPT2.md").map_err(|e| format!("docs/INTEGER_GPT2.md: {e}"))?;
    let text = format!("{dir}/sample.txt");
    std::fs::write(&text, &doc[..doc.len().min(1500)]).map_err(|e| format!("{text}: {e}"))?;
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
        "cross-architecture check: {CROSS_TARGET} under qemu writes and reads the host's bytes"
    );
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
