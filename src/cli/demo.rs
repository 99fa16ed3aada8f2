//! `lockstep demo`: the README's first command. Codes each checkpoint of the trajectory shipped
//! in `demo/` against its predecessor, decodes it, checks the bytes, and prints the table.
//! The four checkpoints (6.4 MB) are built into the binary, so an installed or moved
//! `lockstep` runs it from anywhere.

use lockstep::backend::Device;
use std::path::PathBuf;

use clap::Args;
use lockstep::archive::{self, Archive, PackOptions};
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::file::{decode_file, encode_file};
use lockstep::delta::{EncodeOptions, DEFAULT_BATCH_BYTES};
use lockstep::{Error, Result};

use super::report;

#[derive(Args)]
pub struct DemoArgs {
    /// Directory of *.safetensors checkpoints, coded in name order (default: the four
    /// checkpoints of `demo/`, built into this binary).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print one JSON document (per pair: sizes, times, bits per weight by stage; the
    /// archive's sizes) instead of the tables.
    #[arg(long)]
    json: bool,
}

macro_rules! embedded {
    ($($name:literal),*) => {
        [$(($name, include_bytes!(concat!("../../demo/", $name)).as_slice())),*]
    };
}

/// `demo/` as it was at build time.
static EMBEDDED: [(&str, &[u8]); 4] = embedded!(
    "step0200_blocks_bf16.safetensors",
    "step0400_blocks_bf16.safetensors",
    "step0600_blocks_bf16.safetensors",
    "step0800_blocks_bf16.safetensors"
);

pub fn run(args: DemoArgs, device: &Device) -> Result<()> {
    let tmp = std::env::temp_dir().join(format!("lockstep-demo-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let result = list_checkpoints(args.dir.as_deref(), &tmp)
        .and_then(|files| run_in(&files, &tmp, args.json, device));
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// The checkpoints of `dir`, or the embedded ones written out into `tmp/input`.
fn list_checkpoints(dir: Option<&std::path::Path>, tmp: &std::path::Path) -> Result<Vec<PathBuf>> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => {
            let d = tmp.join("input");
            std::fs::create_dir_all(&d).map_err(|e| Error::io(&d, e))?;
            for (name, bytes) in &EMBEDDED {
                let p = d.join(name);
                std::fs::write(&p, bytes).map_err(|e| Error::io(&p, e))?;
            }
            d
        }
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| Error::io(&dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.len() < 2 {
        return Err(Error::Invalid(format!(
            "{} holds fewer than two checkpoints",
            dir.display()
        )));
    }
    Ok(files)
}

fn run_in(files: &[PathBuf], tmp: &std::path::Path, json: bool, device: &Device) -> Result<()> {
    // Tables for people, or (with --json) one document at the end.
    let say = |line: String| {
        if !json {
            println!("{line}");
        }
    };
    let mut pairs = Vec::new();
    let result = (|| {
        for pair in files.windows(2) {
            let (r, t) = (Checkpoint::open(&pair[0])?, Checkpoint::open(&pair[1])?);
            let name = |p: &PathBuf| p.file_name().unwrap().to_string_lossy().into_owned();
            say(format!("\n== {} -> {}", name(&pair[0]), name(&pair[1])));
            let lsd = tmp.join("delta.lsd");
            let start = std::time::Instant::now();
            encode_file(
                &r,
                &t,
                &lsd,
                &EncodeOptions::default(),
                DEFAULT_BATCH_BYTES,
                device,
            )?;
            let enc = start.elapsed().as_secs_f64();
            let back = tmp.join("decoded.safetensors");
            let start = std::time::Instant::now();
            decode_file(
                &r,
                &std::fs::read(&lsd).map_err(|e| Error::io(&lsd, e))?,
                &back,
                device,
            )?;
            let dec = start.elapsed().as_secs_f64();
            let same = std::fs::read(&back).map_err(|e| Error::io(&back, e))? == t.bytes();
            if !same {
                return Err(Error::Invalid(
                    "decoded file differs from the original".into(),
                ));
            }
            let size = std::fs::metadata(&lsd)
                .map_err(|e| Error::io(&lsd, e))?
                .len();
            say(format!(
                "  .lsd file: {} -> {} bytes ({:.2}%), decoded file byte-identical; encode+verify {:.0} ms, decode {:.0} ms",
                t.file_len(),
                size,
                100.0 * size as f64 / t.file_len() as f64,
                enc * 1e3,
                dec * 1e3
            ));
            let stats = report::pair_stats(&r, &t, true, device)?;
            if json {
                pairs.push(serde_json::json!({
                    "reference": name(&pair[0]), "target": name(&pair[1]),
                    "input_bytes": t.file_len(), "lsd_bytes": size, "identical": true,
                    "encode_seconds": enc, "decode_seconds": dec,
                    "stats": super::delta::stats_json(&stats),
                }));
            } else {
                report::print_pair_stats(&stats, false);
            }
        }
        archive_demo(files, tmp, json, device)
    })();
    if let (true, Ok(archive)) = (json, &result) {
        super::text::print_json(&serde_json::json!({ "pairs": pairs, "archive": archive }));
    }
    result.map(|_| ())
}

/// The product's main job on the same checkpoints: one archive for the whole run, the last
/// step restored from it and compared byte for byte.
fn archive_demo(
    files: &[PathBuf],
    tmp: &std::path::Path,
    json: bool,
    device: &Device,
) -> Result<serde_json::Value> {
    if !json {
        println!("\n== the whole run as one archive (lockstep pack)");
    }
    let sources = archive::resolve_many(files)?;
    let out = tmp.join("run.lstp");
    let reports = archive::pack(
        &out,
        &sources,
        None,
        &PackOptions {
            device: device.clone(),
            ..PackOptions::default()
        },
        &|_| {},
    )?;
    if !json {
        super::archive::print_reports(&reports);
    }
    let a = Archive::open(&out)?.on(device);
    let last = reports.last().expect("at least two checkpoints").step;
    let restored = tmp.join("restored.safetensors");
    a.extract(last, &restored, &|_| {})?;
    let original = files.last().unwrap();
    let same = std::fs::read(&restored).map_err(|e| Error::io(&restored, e))?
        == std::fs::read(original).map_err(|e| Error::io(original, e))?;
    if !same {
        return Err(Error::Invalid(
            "restored checkpoint differs from the original".into(),
        ));
    }
    let input: u64 = reports.iter().map(|r| r.input_bytes).sum();
    let size = std::fs::metadata(&out)
        .map_err(|e| Error::io(&out, e))?
        .len();
    if !json {
        println!(
            "  archive: {input} -> {size} bytes ({:.4} of the input, first checkpoint included); step {last} restored byte-identical",
            size as f64 / input as f64
        );
    }
    Ok(serde_json::json!({
        "checkpoints": reports.len(), "input_bytes": input, "archive_bytes": size,
        "ratio": size as f64 / input as f64, "restored_step": last, "identical": true,
    }))
}
