//! `lockstep parity FILES...`: run every backend present on each consecutive pair of
//! checkpoints, print one hash per stage per backend, and fail on any difference. What a user
//! runs to trust a new machine or driver. Text files get the same treatment from the text
//! codec: every device with language-model kernels, each CPU instruction-set level this CPU
//! runs included, one hash per stage.

use std::path::PathBuf;

use clap::Args;
use lockstep::backend::{self, BackendChoice, Device, Isa};
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::file::check_compatible;
use lockstep::delta::parity::{stages, STAGE_NAMES};
use lockstep::delta::{EncodeOptions, TensorPair};
use lockstep::format::lm::model_file::Model;
use lockstep::lm::{text_codec, tokenizer};
use lockstep::{Error, Result};

#[derive(Args)]
pub struct ParityArgs {
    /// Checkpoints (.safetensors) in trajectory order, each coded against the one before,
    /// and/or text files (any other file), each compressed with the integer GPT-2.
    #[arg(required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    /// Integer model for the text files (.lsm); default: the built-in tinygpt2 model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Print one JSON document (every section's rows of stage hashes) instead of tables.
    #[arg(long)]
    json: bool,
}

/// Where the tables go: printed as they come, or gathered into one JSON document.
struct Report {
    json: bool,
    sections: Vec<serde_json::Value>,
}

/// One row: the backend or kernel, its device, its stage hashes, its seconds.
type Row = (String, String, Vec<String>, f64);

/// Every device that can run here, the reference first; the CPU's slower instruction-set
/// levels too, since their code paths differ from the default's.
fn present() -> Vec<Device> {
    let mut out = Vec::new();
    for choice in [
        BackendChoice::Reference,
        BackendChoice::Cpu,
        BackendChoice::Wgpu,
        BackendChoice::Cuda,
    ] {
        match backend::select(choice) {
            Ok((d, _)) => out.push(d),
            Err(e) => eprintln!("skipping {choice:?}: {e}"),
        }
        if choice == BackendChoice::Cpu {
            let best = Isa::detect();
            out.extend(
                Isa::ALL
                    .into_iter()
                    .filter(|&i| i < best)
                    .filter_map(Device::cpu_at),
            );
        }
    }
    out
}

pub fn run(args: ParityArgs) -> Result<()> {
    let (checkpoints, texts): (Vec<PathBuf>, Vec<PathBuf>) = args
        .files
        .into_iter()
        .partition(|f| f.extension().is_some_and(|e| e == "safetensors"));
    if checkpoints.len() == 1 {
        return Err(Error::Invalid(format!(
            "{}: a checkpoint is coded against its predecessor: give at least two .safetensors",
            checkpoints[0].display()
        )));
    }
    let mut out = Report {
        json: args.json,
        sections: Vec::new(),
    };
    let mut differences = if checkpoints.is_empty() {
        0
    } else {
        checkpoint_parity(&checkpoints, &mut out)?
    };
    if !texts.is_empty() {
        let model = super::text::load_model(args.model.as_deref())?;
        for t in &texts {
            differences += text_parity(t, &model, &mut out)?;
        }
    }
    if out.json {
        let v = serde_json::json!({ "agree": differences == 0, "differences": differences,
            "sections": out.sections });
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    }
    if differences > 0 {
        return Err(Error::Mismatch(format!(
            "{differences} stage hashes differ from the first row (marked !)"
        )));
    }
    if !out.json {
        println!("\nall backends agree on every stage");
    }
    Ok(())
}

/// Print one row of stage hashes per backend, marking those that differ from the first row
/// (or, with --json, add the section to the report); returns how many differ.
fn print_rows(out: &mut Report, title: String, label: &str, names: &[&str], rows: &[Row]) -> usize {
    let want = &rows[0].2;
    if out.json {
        let mut differences = 0;
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|(name, device, hashes, secs)| {
                let differs: Vec<&str> = names
                    .iter()
                    .zip(hashes.iter().zip(want))
                    .filter(|(_, (h, w))| h != w)
                    .map(|(n, _)| *n)
                    .collect();
                differences += differs.len();
                let stages: serde_json::Map<String, serde_json::Value> = names
                    .iter()
                    .zip(hashes)
                    .map(|(n, h)| (n.to_string(), h.clone().into()))
                    .collect();
                serde_json::json!({ label: name, "device": device, "stages": stages,
                    "differs_from_first_row": differs, "seconds": secs })
            })
            .collect();
        out.sections
            .push(serde_json::json!({ "section": title, "rows": rows }));
        return differences;
    }
    println!("\n== {title}");
    let mut differences = 0;
    print!("{label:<13}");
    for name in names {
        print!(" {name:<13}");
    }
    println!(" {:>7}  device", "secs");
    for (name, device, hashes, secs) in rows {
        print!("{name:<13}");
        for (h, w) in hashes.iter().zip(want) {
            let mark = if h == w { ' ' } else { '!' };
            if h != w {
                differences += 1;
            }
            print!(" {h}{mark}");
        }
        println!(" {secs:>7.2}  {device}");
    }
    differences
}

fn short(h: &blake3::Hasher) -> String {
    h.finalize().to_hex()[..12].to_string()
}

/// The text codec on `path` on every CPU instruction-set level this CPU runs (each runs its
/// own matmul, rescale and attention kernels): the tokens, the coder's intervals (the integer
/// model's output through its frequency table: everything the kernels compute), the
/// compressed stream, and its decode, which must be the input.
fn text_parity(path: &std::path::Path, model: &Model, out: &mut Report) -> Result<usize> {
    let data = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let opts = text_codec::Options::default();
    let seg_len = model.config.n_ctx.saturating_sub(1).max(1) as usize;
    let mut rows = Vec::new();
    let mut title = String::new();
    for isa in Isa::ALL {
        let Some(device) = Device::cpu_at(isa) else {
            eprintln!(
                "skipping the {} level: this CPU does not run it",
                isa.name()
            );
            continue;
        };
        let start = std::time::Instant::now();
        let result = (|| {
            let tokens = tokenizer::encode(&data)?;
            let mut h: [blake3::Hasher; 4] = Default::default();
            for t in &tokens {
                h[0].update(&t.to_le_bytes());
            }
            let mut session = device.lm()?.load(model, 1, model.config.n_ctx as usize)?;
            for seg in tokens.chunks(seg_len) {
                let iv =
                    text_codec::segment_intervals(session.as_mut(), model, seg, opts.match_model)?;
                for (cum, f) in iv {
                    h[1].update(&cum.to_le_bytes());
                    h[1].update(&f.to_le_bytes());
                }
            }
            let stream = text_codec::compress_unverified(model, &data, &opts, &device)?;
            h[2].update(&stream);
            let back = text_codec::decompress(model, &stream, &device)?;
            if back != data {
                return Err(Error::Mismatch(format!(
                    "{}: the stream of {} does not decode to the input",
                    path.display(),
                    device.name()
                )));
            }
            h[3].update(&back);
            Ok((tokens.len(), h))
        })();
        let (n_tokens, h) = result?;
        if rows.is_empty() {
            title = format!(
                "{} ({} bytes, {n_tokens} tokens, text codec)",
                path.display(),
                data.len()
            );
        }
        rows.push((
            device.name().to_string(),
            device.describe(),
            h.iter().map(short).collect(),
            start.elapsed().as_secs_f64(),
        ));
    }
    Ok(print_rows(
        out,
        title,
        "device",
        &["tokens", "intervals", "stream", "decoded"],
        &rows,
    ))
}

/// Every backend on each consecutive pair of checkpoints; returns how many hashes differ.
fn checkpoint_parity(files: &[PathBuf], out: &mut Report) -> Result<usize> {
    let backends = present();
    let opts = EncodeOptions::default();
    let mut differences = 0;
    for pair in files.windows(2) {
        let (r, t) = (Checkpoint::open(&pair[0])?, Checkpoint::open(&pair[1])?);
        check_compatible(&r, &t)?;
        let title = format!("{} -> {}", pair[0].display(), pair[1].display());
        let mut rows = Vec::new();
        for device in &backends {
            let b = device.delta()?;
            let start = std::time::Instant::now();
            let mut hashers: [blake3::Hasher; 6] = Default::default();
            for e in &t.tensors {
                let p = TensorPair {
                    dtype: e.dtype,
                    shape: &e.shape,
                    reference: r.data(r.get(&e.name).unwrap()),
                    target: t.data(e),
                };
                let s = stages(b, &p, &opts).map_err(|err| {
                    Error::Invalid(format!("{} on '{}': {err}", b.name(), e.name))
                })?;
                if let Some(s) = s {
                    if s.decoded != p.target || s.fast_decoded != p.target {
                        return Err(Error::Invalid(format!(
                            "{} did not decode '{}' to the target",
                            b.name(),
                            e.name
                        )));
                    }
                    s.hash_into(&mut hashers);
                }
            }
            let hashes: Vec<String> = hashers
                .iter()
                .map(|h| h.finalize().to_hex()[..12].to_string())
                .collect();
            rows.push((
                device.name().to_string(),
                device.describe(),
                hashes,
                start.elapsed().as_secs_f64(),
            ));
        }
        differences += print_rows(out, title, "backend", &STAGE_NAMES, &rows);
    }
    Ok(differences)
}
