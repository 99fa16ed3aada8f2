//! `cargo xtask bench text [--quick]`: bits per byte of `lockstep text compress` (the default
//! and each ablation) beside xz, zstd, brotli, 7-Zip PPMd and zpaq, on the fixed corpus in
//! benches/text (its README says where each file came from) plus two binary files made here:
//! a slice of the shipped model (int8 weights) and the dev prose compressed by xz. Files
//! named `heldout-*` were not looked at while the coder was tuned; their rows are summed
//! separately. Every lockstep output is decompressed again and compared (the compress itself
//! also verifies). `--quick` leaves out `--no-mix`, the ablation that runs the LM.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const CORPUS: &str = "benches/text";
const WORK: &str = "target/bench-text";

struct Peer {
    name: &'static str,
    /// Command making `out` from `input`; the size of `out` is the result.
    run: fn(&Path, &Path) -> Command,
    /// Program that must be present.
    tool: &'static str,
}

fn sh(cmd: &str, input: &Path, out: &Path) -> Command {
    let mut c = Command::new("sh");
    c.args(["-c", cmd, "sh"]).arg(input).arg(out);
    c
}

const PEERS: [Peer; 5] = [
    Peer {
        name: "xz -9e",
        run: |i, o| sh("xz -9e -c \"$1\" > \"$2\"", i, o),
        tool: "xz",
    },
    Peer {
        name: "zstd -19",
        run: |i, o| sh("zstd -q -19 -c \"$1\" > \"$2\"", i, o),
        tool: "zstd",
    },
    Peer {
        name: "brotli -q 11",
        run: |i, o| sh("brotli -q 11 -c \"$1\" > \"$2\"", i, o),
        tool: "brotli",
    },
    Peer {
        name: "PPMd o16",
        run: |i, o| {
            sh(
                "rm -f \"$2\" && 7zz a -bd -m0=PPMd:o=16:mem=256m \"$2\" \"$1\" > /dev/null",
                i,
                o,
            )
        },
        tool: "7zz",
    },
    Peer {
        name: "zpaq -m5",
        run: |i, o| {
            sh(
                "rm -f \"$2\" && zpaq a \"$2\" \"$1\" -m5 > /dev/null 2>&1",
                i,
                o,
            )
        },
        tool: "zpaq",
    },
];

/// lockstep configurations: name, extra flags, whether the LM runs.
/// (`--no-match` is measured without the LM: the LM's sequential calls are the bench's
/// whole cost, and the match model's gain shows the same beside `--no-lm`.)
const LOCKSTEP: [(&str, &[&str], bool); 4] = [
    ("lockstep", &[], true),
    ("--no-lm", &["--no-lm"], false),
    ("--no-lm --no-match", &["--no-lm", "--no-match"], false),
    ("--no-mix", &["--no-mix"], true),
];

fn size(p: &Path) -> Result<u64, String> {
    std::fs::metadata(p)
        .map(|m| m.len())
        .map_err(|e| format!("{}: {e}", p.display()))
}

fn status(mut c: Command) -> Result<(), String> {
    let s = c.status().map_err(|e| format!("{c:?}: {e}"))?;
    if s.success() {
        Ok(())
    } else {
        Err(format!("{c:?} exited with {s}"))
    }
}

/// The corpus files, then the binary ones made from repo files.
fn files() -> Result<Vec<PathBuf>, String> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(CORPUS)
        .map_err(|e| format!("{CORPUS}: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n != "README.md"))
        .collect();
    // Prose and logs first: their rows are the targets.
    let rank = |p: &PathBuf| {
        let n = p.file_name().unwrap_or_default().to_string_lossy();
        let n = n.trim_start_matches("heldout-").to_string();
        (!n.starts_with("prose"), !n.starts_with("log"))
    };
    v.sort_by_key(|p| (rank(p), p.clone()));
    std::fs::create_dir_all(WORK).map_err(|e| e.to_string())?;
    let model = std::fs::read("models/tinygpt2.lsm").map_err(|e| e.to_string())?;
    let weights = Path::new(WORK).join("binary-model-slice.bin");
    let from = model.len().min(1 << 20);
    let to = model.len().min(from + 20_000);
    std::fs::write(&weights, &model[from..to]).map_err(|e| e.to_string())?;
    v.push(weights);
    let xz = Path::new(WORK).join("binary-prose.xz");
    status(sh(
        "xz -9e -c \"$1\" > \"$2\"",
        &Path::new(CORPUS).join("prose-genesis.txt"),
        &xz,
    ))?;
    v.push(xz);
    Ok(v)
}

pub fn bench_text(args: &[String]) -> Result<(), String> {
    let quick = args.iter().any(|a| a == "--quick");
    status({
        let mut c = Command::new("cargo");
        c.args(["build", "--release", "--quiet"]);
        c
    })?;
    let bin = Path::new("target/release/lockstep");
    let files = files()?;
    let configs: Vec<_> = LOCKSTEP
        .iter()
        .filter(|c| !quick || c.0 == "lockstep" || !c.2)
        .collect();
    let peers: Vec<&Peer> = PEERS
        .iter()
        .filter(|p| {
            let ok = Command::new("sh")
                .args(["-c", &format!("command -v {} > /dev/null", p.tool)])
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                eprintln!("({} not installed: its column is left out)", p.name);
            }
            ok
        })
        .collect();
    let mut head = String::from("| file | bytes |");
    let mut rule = String::from("|---|---:|");
    for c in &configs {
        head += &format!(" {} |", c.0);
        rule += "---:|";
    }
    for p in &peers {
        head += &format!(" {} |", p.name);
        rule += "---:|";
    }
    println!("bits per byte (output bytes x 8 / input bytes; headers and containers included)\n");
    println!("{head}\n{rule}");
    // Sums of output bytes per column, for dev and held-out text of each kind.
    let ncol = configs.len() + peers.len();
    let mut sums: Vec<(String, u64, Vec<u64>)> = Vec::new();
    let mut speed = Vec::new();
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let n = size(f)?;
        let mut row = format!("| {name} | {n} |");
        let mut outs = Vec::with_capacity(ncol);
        for (cname, flags, _) in &configs {
            let tag = cname.replace(['-', ' '], "");
            let out = Path::new(WORK).join(format!("{name}.{tag}.lst"));
            let back = Path::new(WORK).join(format!("{name}.back"));
            let t = Instant::now();
            let mut c = Command::new(bin);
            c.args(["-q", "text", "compress", "-f"])
                .args(*flags)
                .arg(f)
                .arg("-o")
                .arg(&out);
            status(c)?;
            let tc = t.elapsed().as_secs_f64();
            // Compress has decoded its output already (its time includes that); the separate
            // decode is what a user waits for when reading the file back.
            let t = Instant::now();
            let mut c = Command::new(bin);
            c.args(["-q", "text", "decompress", "-f"])
                .arg(&out)
                .arg("-o")
                .arg(&back);
            status(c)?;
            let td = t.elapsed().as_secs_f64();
            if std::fs::read(&back).map_err(|e| e.to_string())?
                != std::fs::read(f).map_err(|e| e.to_string())?
            {
                return Err(format!("{name}: {cname} did not round-trip"));
            }
            let m = size(&out)?;
            speed.push((name.clone(), cname.to_string(), n, tc, td));
            row += &format!(" {:.3} |", m as f64 * 8.0 / n as f64);
            outs.push(m);
        }
        for p in &peers {
            let out = Path::new(WORK).join(format!("{name}.peer"));
            status((p.run)(f, &out))?;
            let m = size(&out)?;
            row += &format!(" {:.3} |", m as f64 * 8.0 / n as f64);
            outs.push(m);
        }
        println!("{row}");
        let kind = name.trim_start_matches("heldout-");
        let kind = kind.split(['-', '.']).next().unwrap_or("").to_string();
        let group = if name.starts_with("heldout-") {
            format!("held-out {kind}")
        } else {
            kind
        };
        match sums.iter_mut().find(|s| s.0 == group) {
            Some(s) => {
                s.1 += n;
                s.2.iter_mut().zip(&outs).for_each(|(a, b)| *a += b);
            }
            None => sums.push((group, n, outs)),
        }
    }
    println!("\nper kind: output bytes, and lockstep's size relative to each peer\n");
    for (group, n, outs) in &sums {
        let ours = outs[0];
        let rel: Vec<String> = peers
            .iter()
            .zip(&outs[configs.len()..])
            .map(|(p, &m)| {
                format!(
                    "{} {m} B ({:+.1}%)",
                    p.name,
                    (ours as f64 / m as f64 - 1.0) * 100.0
                )
            })
            .collect();
        println!(
            "- {group} ({n} B): lockstep {ours} B ({:.3} bpb); {}",
            ours as f64 * 8.0 / *n as f64,
            rel.join(", ")
        );
    }
    println!("\nspeed (KB/s of input, wall time; compress includes its verifying decode)\n");
    println!("| file | config | compress KB/s | decompress KB/s |\n|---|---|---:|---:|");
    for (name, c, n, tc, td) in speed {
        println!(
            "| {name} | {c} | {:.1} | {:.1} |",
            n as f64 / tc / 1e3,
            n as f64 / td / 1e3
        );
    }
    Ok(())
}
