//! The README's "Using lockstep" section, run command by command in a temporary directory
//! with small generated inputs for the files it names, so the section cannot drift from the
//! binary. `cargo` lines (installing) are skipped: the test runs the binary cargo built.

use std::path::Path;
use std::process::Command;

const README: &str = include_str!("../README.md");
const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/demo");

/// The shell lines of the section's ```sh blocks.
fn section_commands(readme: &str, heading: &str) -> Vec<String> {
    let start = readme
        .find(heading)
        .unwrap_or_else(|| panic!("README has no '{heading}'"));
    let rest = &readme[start + heading.len()..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in section.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_sh = !in_sh && t == "```sh";
            continue;
        }
        if in_sh && !t.is_empty() && !t.starts_with('#') {
            out.push(t.to_string());
        }
    }
    out
}

/// The files the section names: a short text, two consecutive checkpoints, a run directory.
fn inputs(dir: &Path) {
    std::fs::write(
        dir.join("notes.txt"),
        "Meeting notes.\nShip the archive format.\nWrite the README.\nCelebrate.\n",
    )
    .unwrap();
    std::fs::create_dir(dir.join("run")).unwrap();
    for s in [200, 400, 600, 800] {
        let src = format!("{DEMO}/step{s:04}_blocks_bf16.safetensors");
        std::fs::copy(&src, dir.join(format!("run/step{s}.safetensors"))).unwrap();
        if s >= 600 {
            std::fs::copy(&src, dir.join(format!("step{s}.safetensors"))).unwrap();
        }
    }
}

#[test]
fn using_lockstep_section_runs_as_written() {
    let commands = section_commands(README, "## Using lockstep");
    assert!(
        commands
            .iter()
            .filter(|c| c.starts_with("lockstep "))
            .count()
            >= 10,
        "{commands:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    inputs(dir.path());
    // `lockstep` on PATH is the binary under test.
    let bin = dir.path().join(".bin");
    std::fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_lockstep"), bin.join("lockstep")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for c in commands.iter().filter(|c| !c.starts_with("cargo ")) {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!("set -e\n{c}"))
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "README command failed: {c}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // What the commands promised.
    let d = dir.path();
    for f in [
        "notes.txt.lst",
        "notes.lst",
        "step800.lsd",
        "restored/step800.safetensors",
        "run.lstp",
        "step400.safetensors",
    ] {
        assert!(d.join(f).is_file(), "{f} was not written");
    }
    assert_eq!(
        std::fs::read(d.join("step400.safetensors")).unwrap(),
        std::fs::read(d.join("run/step400.safetensors")).unwrap()
    );
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("stats.json")).unwrap()).unwrap();
    assert!(stats["ratio"].as_f64().is_some_and(|r| r > 0.0 && r < 1.0));
}

/// The README's first two commands: `demo` must exist (it is run in full by the copied-binary
/// test in cli_unix.rs), and the CI entry point must be the xtask's.
#[test]
fn first_commands_are_still_there() {
    assert!(README.contains("cargo run --release -- demo\ncargo xtask ci\n"));
}
