//! `lockstep pack | append | list | diff | extract | verify | stats`: trajectory archives.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use indicatif::ProgressBar;
use lockstep::archive::{
    self, AddReport, Archive, Contents, ExtractOptions, PackOptions, Repaired, Tail,
};
use lockstep::backend::Device;
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
pub struct VerifyArgs {
    /// The archive (.lstp).
    archive: PathBuf,
    /// Most bytes to decode (e.g. 64G; default: 64 times the archive's size, at least 256M).
    #[arg(long, value_parser = parse_size)]
    max_size: Option<u64>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ListArgs {
    /// The archive (.lstp).
    archive: PathBuf,
    /// Every file and tensor of each checkpoint: dtype, shape, stored bytes, and how each is
    /// stored (anchor, delta, bytes, reused).
    #[arg(long)]
    tensors: bool,
    /// Only this checkpoint, with its files (add --tensors for its tensors).
    #[arg(long)]
    step: Option<u64>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct DiffArgs {
    /// The archive (.lstp).
    archive: PathBuf,
    /// The earlier step.
    step_a: u64,
    /// The later step.
    step_b: u64,
    /// Also decode every changed tensor at both steps and count the elements that differ
    /// (costs decoding them; without it only the index is read).
    #[arg(long)]
    elements: bool,
    /// List unchanged tensors and files too.
    #[arg(long)]
    all: bool,
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ExtractArgs {
    /// The archive (.lstp).
    archive: PathBuf,
    /// The step to restore (default: the last; refused when the archive has bytes after its
    /// last complete checkpoint, which may have held a newer one).
    #[arg(long)]
    step: Option<u64>,
    /// Most bytes to decode (e.g. 64G; default: 64 times the archive's size, at least 256M).
    #[arg(long, value_parser = parse_size)]
    max_size: Option<u64>,
    /// Output file (single-file checkpoints) or directory.
    #[arg(short, long)]
    output: PathBuf,
    /// Replace an existing output file, or an existing non-empty directory (which then holds
    /// exactly the checkpoint: other files in it are removed).
    #[arg(short, long)]
    force: bool,
    /// Only this tensor, written as a safetensors file holding just it (see --raw).
    #[arg(long, conflicts_with = "file")]
    tensor: Option<String>,
    /// With --tensor: write the tensor's bytes alone (little-endian, row-major), no header.
    #[arg(long, requires = "tensor")]
    raw: bool,
    /// Only this file of the checkpoint (its path as `list --step N` shows it).
    #[arg(long)]
    file: Option<String>,
    #[arg(long)]
    json: bool,
}

/// A byte count with an optional binary suffix: 123, 64K, 512M, 64G, 2T.
pub(crate) fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("unknown size suffix in {s:?} (K, M, G, T)")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("not a size: {s:?} (e.g. 4096, 512M, 64G)"))?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| format!("size {s:?} is too large"))
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
        "stored_as": archive::stored_as(r.keyframe, r.anchors, r.deltas),
        "input_bytes": r.input_bytes, "stored_bytes": r.stored_bytes,
        "ratio": r.stored_bytes as f64 / r.input_bytes.max(1) as f64,
        "anchors": r.anchors, "deltas": r.deltas, "reused": r.reused, "seconds": r.seconds,
    })
}

pub(crate) fn print_reports(reports: &[AddReport]) {
    println!(
        "{:>10} {:<40} {:>6} {:>14} {:>14} {:>8} {:>7} {:>7} {:>7} {:>9}",
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
            "{:>10} {:<40} {:>6} {:>14} {:>14} {:>8.4} {:>7} {:>7} {:>7} {:>9.1}",
            r.step,
            truncate(&r.label, 40),
            archive::stored_as(r.keyframe, r.anchors, r.deltas),
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

pub fn pack(a: PackArgs, device: &Device) -> Result<()> {
    let mut sources = archive::resolve_many(&a.checkpoints)?;
    // A shell glob sorts step1000 before step200: put named steps in order (--steps keeps
    // the order given, as its values follow it).
    if a.steps.is_none() && archive::sort_by_step(&mut sources) {
        let order: Vec<String> = sources.iter().map(|s| s.label.clone()).collect();
        eprintln!(
            "note: packing in the order of the steps in the names, not the order given: {}",
            order.join(", ")
        );
    }
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
        device: device.clone(),
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

pub fn append(a: AppendArgs, device: &Device) -> Result<()> {
    let src = archive::resolve(&a.checkpoint)?;
    let total: u64 = src.files.iter().map(|f| file_len(&f.path)).sum();
    let opts = PackOptions {
        batch_bytes: (a.batch_mib.max(1) as usize) << 20,
        delta: delta_options(a.fast),
        device: device.clone(),
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

pub fn list(a: ListArgs) -> Result<()> {
    let ar = Archive::open(&a.archive)?;
    if a.tensors || a.step.is_some() {
        return list_contents(&ar, &a);
    }
    let s = ar.summaries();
    if a.json {
        let v: Vec<_> = s
            .iter()
            .map(|c| {
                json!({
                    "step": c.step, "label": c.label, "keyframe": c.keyframe,
                    "stored_as": c.stored_as(), "files": c.files,
                    "tensors": c.tensors, "input_bytes": c.input_bytes, "stored_bytes": c.stored_bytes,
                    "ratio": c.stored_bytes as f64 / c.input_bytes.max(1) as f64,
                    "anchors": c.anchors, "deltas": c.deltas, "reused": c.reused,
                })
            })
            .collect();
        let tail = ar.tail_error().map(|e| e.to_string());
        println!("{}", serde_json::to_string_pretty(&json!({ "archive": a.archive, "checkpoints": v, "ignored_tail_bytes": ar.ignored_tail(), "complete": tail.is_none(), "warning": tail })).unwrap());
        return Ok(());
    }
    println!(
        "{:>10} {:<40} {:>6} {:>5} {:>7} {:>14} {:>14} {:>8} {:>7} {:>7} {:>7}",
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
            "{:>10} {:<40} {:>6} {:>5} {:>7} {:>14} {:>14} {:>8.4} {:>7} {:>7} {:>7}",
            c.step,
            truncate(&c.label, 40),
            c.stored_as(),
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
    warn_tail(&ar);
    Ok(())
}

/// How many checkpoints were stored as each of key, delta, anchor, reused.
fn stored_as_counts(
    cs: &[archive::CheckpointSummary],
) -> serde_json::Map<String, serde_json::Value> {
    ["key", "delta", "anchor", "reused"]
        .iter()
        .map(|k| {
            let n = cs.iter().filter(|c| c.stored_as() == *k).count();
            (k.to_string(), json!(n))
        })
        .collect()
}

fn warn_tail(ar: &Archive) {
    if let Some(e) = ar.tail_error() {
        eprintln!("warning: {e}");
    }
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of seconds since the Unix epoch.
fn utc(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn hex8(h: &[u8; 32]) -> String {
    h[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn contents_json(c: &Contents, tensors: bool) -> serde_json::Value {
    let files: Vec<_> = c
        .files
        .iter()
        .map(|f| {
            json!({
                "path": f.path, "kind": f.kind, "bytes": f.len, "stored_bytes": f.stored_bytes,
                (if f.kind == "verbatim" { "coding" } else { "header_coding" }): f.coding.name(),
                "tensors": f.tensors,
                "blake3": f.hash.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                "mode": f.meta.map(|m| format!("{:o}", m.permissions())),
                "mtime": f.meta.map(|m| m.mtime_s), "mtime_ns": f.meta.map(|m| m.mtime_ns),
            })
        })
        .collect();
    let mut v = json!({
        "step": c.step, "label": c.label, "keyframe": c.keyframe,
        "layout": match c.layout { archive::Layout::SingleFile => "file", archive::Layout::Directory => "directory" },
        "files": files,
    });
    if tensors {
        v["tensors"] = c
            .tensors
            .iter()
            .map(|t| {
                json!({
                    "file": t.file, "name": t.name, "dtype": t.dtype.to_string(), "shape": t.shape,
                    "bytes": t.raw_bytes, "stored_bytes": t.stored_bytes, "coding": t.coding.name(),
                    "stored_at_step": t.stored_at, "reference_step": t.reference_step,
                    "chain": t.chain,
                })
            })
            .collect();
    }
    v
}

fn list_contents(ar: &Archive, a: &ListArgs) -> Result<()> {
    let steps: Vec<u64> = match a.step {
        Some(s) => vec![ar.checkpoint(s)?.step],
        None => ar.checkpoints.iter().map(|c| c.step).collect(),
    };
    let all: Vec<Contents> = steps
        .iter()
        .map(|&s| ar.contents(s))
        .collect::<Result<_>>()?;
    if a.json {
        let v: Vec<_> = all.iter().map(|c| contents_json(c, a.tensors)).collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "archive": a.archive, "checkpoints": v }))
                .unwrap()
        );
        return Ok(());
    }
    let summaries = ar.summaries();
    for c in &all {
        let s = summaries.iter().find(|s| s.step == c.step).expect("listed");
        println!(
            "step {} {} ({}; {} files, {} tensors, {} B stored for {} B)",
            c.step,
            c.label,
            s.stored_as(),
            c.files.len(),
            c.tensors.len(),
            s.stored_bytes,
            s.input_bytes
        );
        println!(
            "  {:<44} {:<11} {:>12} {:>12} {:<7} {:>5} {:<19} blake3",
            "file", "kind", "bytes", "stored B", "coding", "mode", "modified (UTC)"
        );
        for f in &c.files {
            println!(
                "  {:<44} {:<11} {:>12} {:>12} {:<7} {:>5} {:<19} {}",
                truncate(&f.path, 44),
                f.kind,
                f.len,
                f.stored_bytes,
                // A safetensors file's tensors have their own rows; its header is minor.
                if f.kind == "verbatim" {
                    f.coding.name()
                } else {
                    "-"
                },
                f.meta
                    .map_or("-".into(), |m| format!("{:o}", m.permissions())),
                f.meta.map_or("-".into(), |m| utc(m.mtime_s)),
                hex8(&f.hash)
            );
        }
        if a.tensors && !c.tensors.is_empty() {
            println!(
                "  {:<44} {:<7} {:<16} {:>12} {:>12} {:<7} from",
                "tensor", "dtype", "shape", "bytes", "stored B", "coding"
            );
            for t in &c.tensors {
                let shape = format!(
                    "[{}]",
                    t.shape
                        .iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                );
                let from = match (t.coding, t.reference_step) {
                    (archive::Coding::Reused, _) => format!("= step {}", t.stored_at),
                    (archive::Coding::Delta, Some(r)) => {
                        format!("on step {r} (chain {})", t.chain)
                    }
                    _ => String::new(),
                };
                println!(
                    "  {:<44} {:<7} {:<16} {:>12} {:>12} {:<7} {}",
                    truncate(&t.name, 44),
                    t.dtype.to_string(),
                    shape,
                    t.raw_bytes,
                    t.stored_bytes,
                    t.coding.name(),
                    from
                );
            }
        }
    }
    warn_tail(ar);
    Ok(())
}

pub fn diff(a: DiffArgs, device: &Device) -> Result<()> {
    use archive::Change;
    let ar = Archive::open(&a.archive)?.on(device);
    let d = ar.diff(a.step_a, a.step_b, a.elements)?;
    let fmt_shape = |x: &Option<(lockstep::dtype::DType, Vec<u64>)>| match x {
        None => "-".to_string(),
        Some((t, s)) => format!(
            "{t}[{}]",
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ),
    };
    if a.json {
        let tensors: Vec<_> = d
            .tensors
            .iter()
            .filter(|t| a.all || t.change != Change::Same)
            .map(|t| {
                json!({
                    "name": t.name, "change": t.change.name(),
                    "a": t.a.as_ref().map(|(ty, s)| json!({"dtype": ty.to_string(), "shape": s})),
                    "b": t.b.as_ref().map(|(ty, s)| json!({"dtype": ty.to_string(), "shape": s})),
                    "bytes": t.raw_bytes, "stored_bytes": t.stored_bytes,
                    "elements": t.elements, "changed_elements": t.changed_elements,
                })
            })
            .collect();
        let files: Vec<_> = d
            .files
            .iter()
            .filter(|f| a.all || f.change != Change::Same || f.mode_changed)
            .map(|f| {
                json!({"path": f.path, "change": f.change.name(), "bytes_a": f.len_a,
                       "bytes_b": f.len_b, "mode_changed": f.mode_changed})
            })
            .collect();
        let counts: serde_json::Map<String, serde_json::Value> = [
            Change::Same,
            Change::Changed,
            Change::Retyped,
            Change::Added,
            Change::Removed,
        ]
        .iter()
        .map(|&c| (c.name().to_string(), json!(d.count(c))))
        .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "step_a": d.step_a, "step_b": d.step_b, "tensor_counts": counts,
                "tensors": tensors, "files": files,
            }))
            .unwrap()
        );
        return Ok(());
    }
    println!("step {} -> step {}", d.step_a, d.step_b);
    println!(
        "  {:<8} {:<44} {:>10} {:>10}",
        "file", "path", "bytes A", "bytes B"
    );
    for f in d
        .files
        .iter()
        .filter(|f| a.all || f.change != Change::Same || f.mode_changed)
    {
        println!(
            "  {:<8} {:<44} {:>10} {:>10}{}",
            f.change.name(),
            truncate(&f.path, 44),
            f.len_a.map_or("-".into(), |n| n.to_string()),
            f.len_b.map_or("-".into(), |n| n.to_string()),
            if f.mode_changed {
                "  (mode changed)"
            } else {
                ""
            }
        );
    }
    println!(
        "  {:<8} {:<44} {:<18} {:<18} {:>12} {:>12}{}",
        "tensor",
        "name",
        "A",
        "B",
        "bytes",
        "stored B",
        if a.elements { "  changed elements" } else { "" }
    );
    for t in d
        .tensors
        .iter()
        .filter(|t| a.all || t.change != Change::Same)
    {
        let (sa, sb) = (fmt_shape(&t.a), fmt_shape(&t.b));
        println!(
            "  {:<8} {:<44} {:<18} {:<18} {:>12} {:>12}{}",
            t.change.name(),
            truncate(&t.name, 44),
            if t.a == t.b { "".to_string() } else { sa },
            sb,
            t.raw_bytes,
            t.stored_bytes,
            t.changed_elements.map_or(String::new(), |n| format!(
                "  {n} of {} ({:.2}%)",
                t.elements,
                100.0 * n as f64 / t.elements.max(1) as f64
            ))
        );
    }
    println!(
        "tensors: {} changed, {} same, {} retyped, {} added, {} removed (compared by BLAKE3{})",
        d.count(Change::Changed),
        d.count(Change::Same),
        d.count(Change::Retyped),
        d.count(Change::Added),
        d.count(Change::Removed),
        if a.elements {
            "; changed ones decoded and compared element by element"
        } else {
            "; --elements counts the elements that differ"
        }
    );
    Ok(())
}

pub fn extract(a: ExtractArgs, device: &Device) -> Result<()> {
    let ar = Archive::open(&a.archive)?
        .with_max_size(a.max_size)
        .on(device);
    let step = match (a.step, ar.tail_error()) {
        (Some(s), None) => s,
        (Some(s), Some(e)) => {
            // The step asked for is complete and checked by its hashes; the archive is not.
            ar.checkpoint(s)?;
            eprintln!("warning: {e}");
            s
        }
        // The newest complete checkpoint may not be the newest one written: never hand out an
        // older step as "the last" without a word.
        (None, Some(e)) => {
            let hint = match ar.checkpoints.last() {
                Some(c) => format!(
                    "the last complete checkpoint is step {}: pass --step {} to extract it",
                    c.step, c.step
                ),
                None => "no checkpoint is complete".into(),
            };
            return Err(e.context(format!("not extracting the last step ({hint})")));
        }
        (None, None) => {
            ar.checkpoints
                .last()
                .ok_or_else(|| Error::Invalid("the archive holds no checkpoint".into()))?
                .step
        }
    };
    let opts = ExtractOptions { force: a.force };
    let t0 = Instant::now();
    let (bytes, what) = if let Some(name) = &a.tensor {
        let n = ar.extract_tensor(step, name, &a.output, a.raw, &opts)?;
        let form = if a.raw { "raw bytes" } else { "safetensors" };
        (n, format!("tensor '{name}' of step {step} ({form})"))
    } else if let Some(path) = &a.file {
        let ck = ar.checkpoint(step)?;
        let total = ck
            .files
            .iter()
            .find(|f| f.path() == path)
            .map_or(0, |f| f.len());
        let pb = bar(total, a.json, "extract");
        let n = ar.extract_file(step, path, &a.output, &opts, &|n| pb.inc(n))?;
        pb.finish_and_clear();
        (n, format!("{path} of step {step}"))
    } else {
        let total = ar.checkpoint(step)?.input_bytes();
        let pb = bar(total, a.json, "extract");
        let n = ar.extract_with(step, &a.output, &opts, &|n| pb.inc(n))?;
        pb.finish_and_clear();
        (n, format!("step {step}"))
    };
    let secs = t0.elapsed().as_secs_f64();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "step": step, "tensor": a.tensor, "file": a.file, "output": a.output,
                "bytes": bytes, "seconds": secs,
                "mb_per_s": mb_s(bytes, secs), "verified": true,
            }))
            .unwrap()
        );
    } else {
        println!(
            "{what} -> {}: {bytes} B, BLAKE3 verified, {:.1} MB/s",
            a.output.display(),
            mb_s(bytes, secs)
        );
    }
    Ok(())
}

pub fn verify(a: VerifyArgs, device: &Device) -> Result<()> {
    verify_with(a, None, device)
}

/// `verify`; `repair` (a JSON object) is what `repair --json` adds to the one document.
fn verify_with(a: VerifyArgs, repair: Option<serde_json::Value>, device: &Device) -> Result<()> {
    let ar = Archive::open(&a.archive)?
        .with_max_size(a.max_size)
        .on(device);
    let total: u64 = ar.checkpoints.iter().map(|c| c.input_bytes()).sum();
    let pb = bar(total, a.json, "verify");
    let t0 = Instant::now();
    let r = ar.verify(&|n| pb.inc(n))?;
    let tail = ar.tail_error();
    pb.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    if a.json {
        let damaged: Vec<_> = r
            .damaged
            .iter()
            .map(|d| json!({"step": d.step, "file": d.file, "tensor": d.tensor, "error": d.error}))
            .collect();
        let mut v = json!({
            "ok": r.ok(), "checkpoints": r.checkpoints, "files": r.files,
            "tensors": r.tensors, "bytes": r.bytes, "damaged": damaged,
            "last_step": ar.checkpoints.last().map(|c| c.step),
            "ignored_tail_bytes": r.ignored_tail, "tail": tail_name(&r.tail),
            "tail_error": tail.as_ref().map(|e| e.to_string()),
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
            match (r.damaged.is_empty(), tail.is_some()) {
                (true, false) => "all hashes match".to_string(),
                // Never a line that reads as "fine" for an archive that is not.
                (true, true) => "the complete checkpoints are intact, but the archive is INCOMPLETE (below)".to_string(),
                (false, _) => format!("{} damaged", r.damaged.len()),
            }
        );
        if let Some(c) = ar.checkpoints.last() {
            println!(
                "last complete checkpoint: step {} ({} of {} B of the file)",
                c.step,
                ar.valid_end,
                ar.read_len()
            );
        }
    }
    if !r.damaged.is_empty() {
        let steps: std::collections::BTreeSet<u64> = r.damaged.iter().map(|d| d.step).collect();
        let e = Error::format(
            format!("archive {}", a.archive.display()),
            format!("damaged checkpoints at steps {steps:?}"),
        );
        if let Some(t) = tail {
            eprintln!("error: {t}");
        }
        return Err(e);
    }
    match tail {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn tail_name(t: &Tail) -> &'static str {
    match t {
        Tail::None => "none",
        Tail::DamagedFooter => "damaged_footer",
        Tail::CommitWithoutFooter { .. } => "commit_without_footer",
        Tail::Unfinished => "unfinished",
    }
}

pub fn repair(a: VerifyArgs, device: &Device) -> Result<()> {
    let repaired = lockstep::archive::repair(&a.archive)?;
    let what = match repaired {
        Repaired::Nothing => "the archive ends with its last footer; nothing to repair".into(),
        Repaired::FooterRebuilt { step } => {
            format!("last footer rebuilt from its commit record; step {step} is readable again")
        }
        Repaired::FooterWritten { step } => {
            format!(
                "footer written after the complete commit record of step {step}; it is readable"
            )
        }
        Repaired::TailRemoved { bytes } => {
            format!("removed {bytes} B after the last complete checkpoint that no commit covered")
        }
    };
    // The footer only says where the commit is; the data behind it is checked in full.
    if a.json {
        // One JSON document: the repair's outcome goes into verify's.
        let v = json!({ "outcome": repaired_name(&repaired), "message": what });
        return verify_with(a, Some(v), device);
    }
    super::ui::note(format!("{}: {what}", a.archive.display()));
    verify(a, device)
}

fn repaired_name(r: &Repaired) -> &'static str {
    match r {
        Repaired::Nothing => "nothing",
        Repaired::FooterRebuilt { .. } => "footer_rebuilt",
        Repaired::FooterWritten { .. } => "footer_written",
        Repaired::TailRemoved { .. } => "tail_removed",
    }
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
                "stored_as": stored_as_counts(&s.checkpoints),
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
    let counts = stored_as_counts(&s.checkpoints);
    let kinds: Vec<String> = ["key", "delta", "anchor", "reused"]
        .iter()
        .filter(|k| counts[**k].as_u64() != Some(0))
        .map(|k| format!("{} {k}", counts[*k]))
        .collect();
    println!(
        "checkpoints stored as: {}{}",
        kinds.join(", "),
        if counts["anchor"].as_u64() != Some(0) {
            " (anchor: not a keyframe, yet every new tensor coded standalone)"
        } else {
            ""
        }
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
