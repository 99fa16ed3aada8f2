//! `lockstep pack | append | list | extract | verify | stats`: trajectory archives.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use indicatif::ProgressBar;
use lockstep::archive::{self, AddReport, Archive, PackOptions};
use lockstep::delta::{EncodeOptions, LayoutChoice};
use lockstep::{Error, Result};
use serde_json::json;

/// Delta options of `pack` and `append`: the default layouts, or with `--fast` the Joint one.
fn delta_options(fast: bool) -> EncodeOptions {
    EncodeOptions {
        layout: if fast {
            LayoutChoice::Fast
        } else {
            LayoutChoice::Auto
        },
        ..EncodeOptions::default()
    }
}

#[derive(Args)]
pub struct PackArgs {
    /// Checkpoints in training order (.safetensors files, sharded checkpoints or
    /// save_pretrained directories), or one directory of checkpoints (sorted by step).
    #[arg(required = true)]
    checkpoints: Vec<PathBuf>,
    /// The archive to create (written to a temporary file, renamed into place when complete).
    #[arg(short, long)]
    output: PathBuf,
    /// A standalone keyframe every K checkpoints: restoring a step decodes at most K blobs
    /// per tensor.
    #[arg(short = 'k', long, default_value_t = archive::DEFAULT_KEYFRAME_INTERVAL)]
    keyframe_interval: u32,
    /// Steps of the checkpoints, comma-separated (default: parsed from the names).
    #[arg(long, value_delimiter = ',')]
    steps: Option<Vec<u64>>,
    /// Replace an existing archive at the output path.
    #[arg(short, long)]
    force: bool,
    /// Also code each delta tensor standalone and keep the smaller (slower).
    #[arg(long)]
    try_anchor: bool,
    /// Code deltas in the fast layout: one symbol per weight, faster to encode and extract,
    /// a few percent larger (readers need no flag: each blob records its layout).
    #[arg(long)]
    fast: bool,
    /// Batch budget in MiB (memory and speed, never the bytes).
    #[arg(long, default_value_t = 64)]
    batch_mib: u64,
    /// Print a JSON summary instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct AppendArgs {
    /// The archive (.lstp) to extend.
    archive: PathBuf,
    /// The checkpoint to add (file, sharded checkpoint or directory).
    checkpoint: PathBuf,
    /// Its step (default: parsed from the name, else one after the last).
    #[arg(long)]
    step: Option<u64>,
    /// The archive's last checkpoint as you still have it: its tensors (checked against the
    /// stored hashes) are used as references instead of decoding them from the archive.
    #[arg(long)]
    previous: Option<PathBuf>,
    /// Code deltas in the fast layout (see `pack --fast`).
    #[arg(long)]
    fast: bool,
    #[arg(long, default_value_t = 64)]
    batch_mib: u64,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ArchiveArgs {
    /// The archive (.lstp).
    archive: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ExtractArgs {
    /// The archive (.lstp).
    archive: PathBuf,
    /// The step to restore (default: the last).
    #[arg(long)]
    step: Option<u64>,
    /// Output file (single-file checkpoints) or directory.
    #[arg(short, long)]
    output: PathBuf,
    #[arg(long)]
    json: bool,
}

/// Progress on stderr in decimal units, ETA once there is a rate (see `ui::bar`).
fn bar(total: u64, hidden: bool, what: &str) -> ProgressBar {
    super::ui::bar(total, hidden, what)
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn mb_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs.max(1e-9) / 1e6
}

fn report_json(r: &AddReport) -> serde_json::Value {
    json!({
        "step": r.step, "label": r.label, "keyframe": r.keyframe,
        "input_bytes": r.input_bytes, "stored_bytes": r.stored_bytes,
        "ratio": r.stored_bytes as f64 / r.input_bytes.max(1) as f64,
        "anchors": r.anchors, "deltas": r.deltas, "reused": r.reused, "seconds": r.seconds,
    })
}

pub(crate) fn print_reports(reports: &[AddReport]) {
    println!(
        "{:>10} {:<40} {:>5} {:>14} {:>14} {:>8} {:>7} {:>7} {:>7} {:>9}",
        "step",
        "checkpoint",
        "kind",
        "input B",
        "stored B",
        "ratio",
        "anchor",
        "delta",
        "reused",
        "MB/s"
    );
    for r in reports {
        println!(
            "{:>10} {:<40} {:>5} {:>14} {:>14} {:>8.4} {:>7} {:>7} {:>7} {:>9.1}",
            r.step,
            truncate(&r.label, 40),
            if r.keyframe { "key" } else { "delta" },
            r.input_bytes,
            r.stored_bytes,
            r.stored_bytes as f64 / r.input_bytes.max(1) as f64,
            r.anchors,
            r.deltas,
            r.reused,
            mb_s(r.input_bytes, r.seconds)
        );
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let tail: String = s
            .chars()
            .rev()
            .take(n - 1)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("…{tail}")
    }
}

pub fn pack(a: PackArgs) -> Result<()> {
    let sources = archive::resolve_many(&a.checkpoints)?;
    let total: u64 = sources
        .iter()
        .flat_map(|s| &s.files)
        .map(|f| file_len(&f.path))
        .sum();
    let opts = PackOptions {
        keyframe_interval: a.keyframe_interval,
        batch_bytes: (a.batch_mib.max(1) as usize) << 20,
        overwrite: a.force,
        try_anchor: a.try_anchor,
        delta: delta_options(a.fast),
        ..Default::default()
    };
    let pb = bar(total, a.json, "pack");
    let t0 = Instant::now();
    let reports = archive::pack(&a.output, &sources, a.steps.as_deref(), &opts, &|n| {
        pb.inc(n)
    })?;
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    let out = file_len(&a.output);
    let input: u64 = reports.iter().map(|r| r.input_bytes).sum();
    if a.json {
        let v = json!({
            "archive": a.output, "checkpoints": reports.iter().map(report_json).collect::<Vec<_>>(),
            "input_bytes": input, "archive_bytes": out, "ratio": out as f64 / input.max(1) as f64,
            "seconds": secs, "mb_per_s": mb_s(input, secs),
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    } else {
        print_reports(&reports);
        println!(
            "\n{} checkpoints -> {}: input {} B, archive {} B, ratio {:.4}, {:.1} MB/s (every tensor verified by decoding)",
            reports.len(),
            a.output.display(),
            input,
            out,
            out as f64 / input.max(1) as f64,
            mb_s(input, secs)
        );
    }
    Ok(())
}

pub fn append(a: AppendArgs) -> Result<()> {
    let src = archive::resolve(&a.checkpoint)?;
    let total: u64 = src.files.iter().map(|f| file_len(&f.path)).sum();
    let opts = PackOptions {
        batch_bytes: (a.batch_mib.max(1) as usize) << 20,
        delta: delta_options(a.fast),
        ..Default::default()
    };
    let pb = bar(total, a.json, "append");
    let previous = a.previous.as_deref().map(archive::resolve).transpose()?;
    let r =
        archive::append_with_previous(&a.archive, &src, previous.as_ref(), a.step, &opts, &|n| {
            pb.inc(n)
        })?;
    pb.finish_and_clear();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report_json(&r)).unwrap()
        );
    } else {
        print_reports(std::slice::from_ref(&r));
        println!(
            "\nappended step {} to {} ({} B now)",
            r.step,
            a.archive.display(),
            file_len(&a.archive)
        );
    }
    Ok(())
}

pub fn list(a: ArchiveArgs) -> Result<()> {
    let ar = Archive::open(&a.archive)?;
    let s = ar.summaries();
    if a.json {
        let v: Vec<_> = s
            .iter()
            .map(|c| {
                json!({
                    "step": c.step, "label": c.label, "keyframe": c.keyframe, "files": c.files,
                    "tensors": c.tensors, "input_bytes": c.input_bytes, "stored_bytes": c.stored_bytes,
                    "ratio": c.stored_bytes as f64 / c.input_bytes.max(1) as f64,
                    "anchors": c.anchors, "deltas": c.deltas, "reused": c.reused,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&json!({ "archive": a.archive, "checkpoints": v, "ignored_tail_bytes": ar.ignored_tail() })).unwrap());
        return Ok(());
    }
    println!(
        "{:>10} {:<40} {:>5} {:>5} {:>7} {:>14} {:>14} {:>8} {:>7} {:>7} {:>7}",
        "step",
        "checkpoint",
        "kind",
        "files",
        "tensors",
        "input B",
        "stored B",
        "ratio",
        "anchor",
        "delta",
        "reused"
    );
    for c in &s {
        println!(
            "{:>10} {:<40} {:>5} {:>5} {:>7} {:>14} {:>14} {:>8.4} {:>7} {:>7} {:>7}",
            c.step,
            truncate(&c.label, 40),
            if c.keyframe { "key" } else { "delta" },
            c.files,
            c.tensors,
            c.input_bytes,
            c.stored_bytes,
            c.stored_bytes as f64 / c.input_bytes.max(1) as f64,
            c.anchors,
            c.deltas,
            c.reused
        );
    }
    if ar.damaged_last_footer() {
        eprintln!("warning: {}", ar.damaged_footer_error());
    } else if ar.ignored_tail() > 0 {
        println!(
            "note: {} bytes after the last commit (an interrupted append) are ignored",
            ar.ignored_tail()
        );
    }
    Ok(())
}

pub fn extract(a: ExtractArgs) -> Result<()> {
    let ar = Archive::open(&a.archive)?;
    let step = match a.step {
        Some(s) => s,
        None => {
            ar.checkpoints
                .last()
                .ok_or_else(|| Error::Invalid("the archive holds no checkpoint".into()))?
                .step
        }
    };
    let total = ar.checkpoint(step)?.input_bytes();
    let pb = bar(total, a.json, "extract");
    let t0 = Instant::now();
    let bytes = ar.extract(step, &a.output, &|n| pb.inc(n))?;
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "step": step, "output": a.output, "bytes": bytes, "seconds": secs,
                "mb_per_s": mb_s(bytes, secs), "verified": true,
            }))
            .unwrap()
        );
    } else {
        println!(
            "step {step} -> {}: {bytes} B, BLAKE3 verified, {:.1} MB/s",
            a.output.display(),
            mb_s(bytes, secs)
        );
    }
    Ok(())
}

pub fn verify(a: ArchiveArgs) -> Result<()> {
    verify_with(a, None)
}

/// `verify`; `repair` (a JSON object) is what `repair --json` adds to the one document.
fn verify_with(a: ArchiveArgs, repair: Option<serde_json::Value>) -> Result<()> {
    let ar = Archive::open(&a.archive)?;
    let total: u64 = ar.checkpoints.iter().map(|c| c.input_bytes()).sum();
    let pb = bar(total, a.json, "verify");
    let t0 = Instant::now();
    let r = ar.verify(&|n| pb.inc(n));
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    if a.json {
        let damaged: Vec<_> = r
            .damaged
            .iter()
            .map(|d| json!({"step": d.step, "file": d.file, "tensor": d.tensor, "error": d.error}))
            .collect();
        let mut v = json!({
            "ok": r.damaged.is_empty() && !r.damaged_footer, "checkpoints": r.checkpoints, "files": r.files,
            "tensors": r.tensors, "bytes": r.bytes, "damaged": damaged,
            "ignored_tail_bytes": r.ignored_tail, "damaged_last_footer": r.damaged_footer,
            "seconds": secs, "mb_per_s": mb_s(r.bytes, secs),
        });
        if let Some(repair) = repair {
            v["repair"] = repair;
        }
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    } else {
        for d in &r.damaged {
            println!(
                "DAMAGED step {} {}{}: {}",
                d.step,
                d.file,
                d.tensor
                    .as_ref()
                    .map(|t| format!(" tensor '{t}'"))
                    .unwrap_or_default(),
                d.error
            );
        }
        println!(
            "{} checkpoints, {} files, {} tensors, {} B decoded and checked in {:.1} s ({:.1} MB/s): {}",
            r.checkpoints,
            r.files,
            r.tensors,
            r.bytes,
            secs,
            mb_s(r.bytes, secs),
            if r.damaged.is_empty() { "all hashes match".to_string() } else { format!("{} damaged", r.damaged.len()) }
        );
        if r.ignored_tail > 0 && !r.damaged_footer {
            println!(
                "note: {} bytes after the last commit (an interrupted append) are ignored",
                r.ignored_tail
            );
        }
    }
    if r.damaged.is_empty() && r.damaged_footer {
        Err(ar.damaged_footer_error())
    } else if r.damaged.is_empty() {
        Ok(())
    } else {
        let steps: std::collections::BTreeSet<u64> = r.damaged.iter().map(|d| d.step).collect();
        Err(Error::Invalid(format!(
            "{}: damaged checkpoints at steps {:?}",
            a.archive.display(),
            steps
        )))
    }
}

pub fn repair(a: ArchiveArgs) -> Result<()> {
    let rebuilt = lockstep::archive::repair(&a.archive)?;
    if a.json {
        // One JSON document: the repair's outcome goes into verify's.
        let v = json!({ "rebuilt_last_footer": rebuilt.is_some(), "step": rebuilt });
        return verify_with(a, Some(v));
    }
    match rebuilt {
        None => println!(
            "{}: the last footer is intact; nothing to repair",
            a.archive.display()
        ),
        Some(step) => println!(
            "{}: last footer rebuilt from its commit record; step {step} is readable again",
            a.archive.display()
        ),
    }
    // The footer only says where the commit is; the data behind it is checked in full.
    verify(a)
}

pub fn stats(a: ArchiveArgs) -> Result<()> {
    let ar = Archive::open(&a.archive)?;
    let s = ar.stats();
    if a.json {
        let stages: Vec<_> = s
            .stages
            .iter()
            .map(|r| json!({"stage": r.kind, "dtype": r.dtype, "blobs": r.blobs, "raw_bytes": r.raw_bytes, "stored_bytes": r.stored_bytes, "ratio": r.stored_bytes as f64 / r.raw_bytes.max(1) as f64}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "archive_bytes": s.archive_bytes, "input_bytes": s.input_bytes, "ratio": s.ratio(),
                "ratio_without_anchor": s.ratio_without_anchor(), "checkpoints": s.checkpoints.len(),
                "keyframe_interval": s.keyframe_interval, "dedup_refs": s.dedup_refs,
                "dedup_bytes": s.dedup_bytes, "stages": stages,
            }))
            .unwrap()
        );
        return Ok(());
    }
    println!(
        "{:<8} {:<8} {:>7} {:>14} {:>14} {:>8} {:>10}",
        "stage", "dtype", "blobs", "original B", "stored B", "ratio", "bits/B"
    );
    for r in &s.stages {
        println!(
            "{:<8} {:<8} {:>7} {:>14} {:>14} {:>8.4} {:>10.3}",
            r.kind,
            r.dtype,
            r.blobs,
            r.raw_bytes,
            r.stored_bytes,
            r.stored_bytes as f64 / r.raw_bytes.max(1) as f64,
            8.0 * r.stored_bytes as f64 / r.raw_bytes.max(1) as f64
        );
    }
    println!(
        "dedup: {} references to identical earlier blobs stand for {} B",
        s.dedup_refs, s.dedup_bytes
    );
    println!(
        "archive {} B for {} B of input in {} checkpoints (keyframe every {}): ratio {:.4}{}",
        s.archive_bytes,
        s.input_bytes,
        s.checkpoints.len(),
        s.keyframe_interval,
        s.ratio(),
        s.ratio_without_anchor()
            .map(|r| format!(", {r:.4} without the first (anchor) checkpoint"))
            .unwrap_or_default()
    );
    Ok(())
}
