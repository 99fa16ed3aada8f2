//! `cargo xtask bench delta --cli [DIR] [--rounds N]`: the delta codec as a user runs it, one
//! process per file: `lockstep delta encode` (which verifies by decoding before it writes)
//! and `lockstep delta decode` on each trajectory pair, beside `zstd -3` compressing and
//! decompressing the same target in the same rounds. The paired tables time passes inside
//! one process, whose buffers are reused from pass to pass; a one-shot run pays for every
//! page it touches (its start-up, the mapped inputs, fresh buffers), and this is where that
//! shows. Per command: the median wall time as MB/s of the target checkpoint (quartiles
//! beside it), the median user and system CPU seconds and minor page faults (the children's
//! `getrusage`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use super::{median, run, PAIRS};

/// One child's wall seconds, user and system CPU seconds, and minor page faults.
struct Usage {
    wall: f64,
    user: f64,
    sys: f64,
    faults: f64,
}

/// The resources of the children waited for so far (`RUSAGE_CHILDREN` accumulates them).
fn children() -> (f64, f64, f64) {
    // SAFETY: `getrusage` fills the struct it is given; a zeroed `rusage` is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_CHILDREN is a valid `who`.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    (secs(u.ru_utime), secs(u.ru_stime), u.ru_minflt as f64)
}

/// Run `cmd args` to completion (its output discarded), timed.
fn timed(cmd: &str, args: &[&str]) -> Result<Usage, String> {
    let before = children();
    let start = Instant::now();
    let status = Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| format!("could not start {cmd}: {e}"))?;
    let wall = start.elapsed().as_secs_f64();
    if !status.success() {
        return Err(format!("`{cmd} {}` exited with {status}", args.join(" ")));
    }
    let after = children();
    Ok(Usage {
        wall,
        user: after.0 - before.0,
        sys: after.1 - before.1,
        faults: after.2 - before.2,
    })
}

/// The first and third quartiles of `v` (nearest rank).
fn quartiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.25), at(0.75))
}

pub fn bench_cli(dir: &str, rounds: usize) -> Result<(), String> {
    run(
        "cargo",
        &["build", "--release", "--quiet", "--bin", "lockstep"],
    )?;
    let bin = "target/release/lockstep";
    let zstd = super::have("zstd", "--version");
    if !zstd {
        eprintln!("(zstd not found: its rows are left out)");
    }
    let tmp = std::env::temp_dir().join(format!("lockstep-bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let path = |name: &str| tmp.join(name).to_string_lossy().into_owned();
    println!(
        "one process per file, {rounds} rounds alternating the commands; MB/s of the target \
         checkpoint by median wall time (quartiles), median user / system CPU seconds and \
         minor page faults"
    );
    for (a, b) in PAIRS {
        let (reference, target) = (format!("{dir}/{a}"), format!("{dir}/{b}"));
        let mb = std::fs::metadata(&target)
            .map_err(|e| format!("{target}: {e}"))?
            .len() as f64
            / 1e6;
        let (lsd, back) = (path("t.lsd"), path("t.safetensors"));
        let (zst, unz) = (path("t.zst"), path("t.unzst"));
        let mut rows: Vec<(String, Vec<Usage>)> = Vec::new();
        let mut add = |name: &str, u: Usage| match rows.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => v.push(u),
            None => rows.push((name.to_string(), vec![u])),
        };
        for _ in 0..rounds {
            let q = ["-q", "-f"];
            let enc = [
                &["delta", "encode", "--reference", &reference],
                &["--target", target.as_str(), "-o", &lsd][..],
                &q[..],
            ]
            .concat();
            add("lockstep delta encode", timed(bin, &enc)?);
            let dec = [
                &[
                    "delta",
                    "decode",
                    "--reference",
                    &reference,
                    &lsd,
                    "-o",
                    &back,
                ][..],
                &q[..],
            ]
            .concat();
            add("lockstep delta decode", timed(bin, &dec)?);
            if zstd {
                add(
                    "zstd -3",
                    timed("zstd", &["-3", "-q", "-f", &target, "-o", &zst])?,
                );
                add(
                    "zstd -d",
                    timed("zstd", &["-d", "-q", "-f", &zst, "-o", &unz])?,
                );
            }
        }
        if std::fs::read(&back).ok() != std::fs::read(&target).ok() {
            return Err(format!("{back} is not {target}"));
        }
        println!(
            "\n{a} -> {b} ({mb:.1} MB target), lockstep {} bytes, zstd -3 {} bytes:",
            size(&lsd),
            size(&zst)
        );
        println!("| command | MB/s (quartiles) | user s | system s | minor faults |");
        println!("|---|---|---|---|---|");
        for (name, v) in &rows {
            let speeds: Vec<f64> = v.iter().map(|u| mb / u.wall).collect();
            let (q1, q3) = quartiles(speeds.clone());
            let med = |f: fn(&Usage) -> f64| median(v.iter().map(f).collect());
            println!(
                "| {name} | {:.1} ({q1:.1}-{q3:.1}) | {:.3} | {:.3} | {:.0} |",
                median(speeds),
                med(|u| u.user),
                med(|u| u.sys),
                med(|u| u.faults)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

fn size(p: &str) -> String {
    Path::new(p)
        .metadata()
        .map(|m| m.len().to_string())
        .unwrap_or_else(|_| "-".into())
}
