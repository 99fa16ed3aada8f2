//! `cargo xtask <task>`: project chores that need more than one cargo command.
//!
//! - `ci`: everything CI checks, in the order a failure is cheapest to find.

use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map(String::as_str).unwrap_or("help");
    let result = match task {
        "ci" => ci(),
        _ => {
            eprintln!("usage: cargo xtask ci");
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
