//! `lockstep text ...` and `lockstep model ...`.

use lockstep::backend::Device;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use lockstep::format::lm::model_file::Model;
use lockstep::lm::{cm, convert, text_codec};
use lockstep::Error;
use serde_json::json;

use super::files::{self, OutArgs};
use super::ui;

/// The default integer model: `../shared/data/tinygpt2` converted by `lockstep model convert`.
static DEFAULT_MODEL: &[u8] = include_bytes!("../../models/tinygpt2.lsm");

#[derive(Subcommand)]
pub enum TextCmd {
    /// Compress a file (any bytes): context mixing of adaptive models with the integer GPT-2
    /// (or the input stored, when that is smaller); verified by decompressing first.
    /// Writes INPUT.lst unless told otherwise; the input is kept.
    Compress {
        /// The file to compress; `-` reads standard input (and writes to standard output
        /// unless -o names a file).
        input: PathBuf,
        #[command(flatten)]
        out: OutArgs,
        /// Integer model file (.lsm); default: the built-in tinygpt2 model.
        #[arg(long)]
        model: Option<PathBuf>,
        /// Tokens per segment (with --no-mix; default: the model's context minus one).
        #[arg(long, requires = "no_mix")]
        segment_tokens: Option<u32>,
        /// Leave the match model out (with --no-mix: the token match model).
        #[arg(long)]
        no_match: bool,
        /// The model alone, no context mixing: independent segments of tokens, the version-1
        /// stream (faster to decompress in parallel; larger).
        #[arg(long)]
        no_mix: bool,
        /// Context mixing without the language model (much faster; larger on prose).
        #[arg(long, conflicts_with = "no_mix")]
        no_lm: bool,
        /// With the language model, code the input in independent blocks of this size (e.g.
        /// 256K) instead of strands, which decompress together in lockstep: smaller blocks
        /// decode faster on large inputs and cost size (each relearns the file); `--block-size
        /// 4G` keeps any input one block.
        #[arg(long, value_parser = parse_block_size, conflicts_with_all = ["no_mix", "no_lm", "strands"])]
        block_size: Option<u32>,
        /// With the language model, code the input as this many strands (1 to 64, fewer for
        /// large models) that share the adaptive models, so that decompression batches the
        /// model's calls; default: one per 1 KiB of input, at most 32; 1 codes in order.
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64), conflicts_with_all = ["no_mix", "no_lm"])]
        strands: Option<u16>,
        /// Print a JSON report on standard output (the data must go to a file).
        #[arg(long)]
        json: bool,
    },
    /// Decompress a .lst file written by `text compress`: FILE.lst becomes FILE unless told
    /// otherwise.
    Decompress {
        /// The .lst file; `-` reads standard input (and writes to standard output unless -o
        /// names a file).
        input: PathBuf,
        #[command(flatten)]
        out: OutArgs,
        /// The model the stream was written with (its hash is checked).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Most bytes of text to decode (e.g. 64M; default: 64 times the stream's size, at
        /// least 16K), so a small damaged or forged file cannot ask for hours of model work.
        #[arg(long, value_parser = super::archive::parse_size)]
        max_size: Option<u64>,
        /// Print a JSON report on standard output (the data must go to a file).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum ModelCmd {
    /// Convert a Hugging Face GPT-2 checkpoint (directory with config.json and
    /// model.safetensors, or a sharded one with model.safetensors.index.json; or a
    /// .safetensors file beside config.json) to an integer model file, with no floating-point
    /// arithmetic.
    Convert {
        input: PathBuf,
        /// The .lsm file to write (`-` for standard output).
        #[arg(short, long)]
        output: PathBuf,
        /// Replace an existing output file.
        #[arg(short, long)]
        force: bool,
        /// Skip the per-channel outlier equalization.
        #[arg(long)]
        no_equalize: bool,
        /// Print a JSON report on standard output.
        #[arg(long)]
        json: bool,
    },
    /// Describe an integer model file (default: the built-in model): shape and hash.
    Info {
        /// The .lsm file (default: the built-in tinygpt2 model).
        model: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The suffix of `text compress` output.
const TEXT_SUFFIX: &str = ".lst";

pub(crate) fn load_model(path: Option<&Path>) -> lockstep::Result<Model> {
    match path {
        Some(p) => Model::from_bytes(&std::fs::read(p).map_err(|e| Error::io(p, e))?)
            .map_err(|e| e.context(format!("model file {}", p.display()))),
        None => Model::from_bytes(DEFAULT_MODEL),
    }
}

/// A block size: 1 byte up to 4 GiB - 1 (`4G` is taken as the largest).
fn parse_block_size(s: &str) -> std::result::Result<u32, String> {
    let n = super::archive::parse_size(s)?;
    if n == 0 {
        return Err("the block size must be at least 1 byte".into());
    }
    Ok(n.min(u32::MAX as u64) as u32)
}

/// Moves a bar over the input's bytes by the codec's token counts.
fn progress_of(
    pb: &indicatif::ProgressBar,
    bytes: u64,
) -> impl Fn(text_codec::Pass, u64, u64) + '_ {
    let last = std::cell::Cell::new(text_codec::Pass::Compress);
    move |pass, done, total| {
        if pass != last.get() {
            last.set(pass);
            pb.reset();
            pb.set_message(match pass {
                text_codec::Pass::Compress => "compress",
                text_codec::Pass::Verify => "verify",
                text_codec::Pass::Decompress => "decompress",
            });
        }
        pb.set_position((bytes as u128 * done as u128 / total.max(1) as u128) as u64);
    }
}

pub fn run_text(cmd: TextCmd, device: &Device) -> lockstep::Result<()> {
    match cmd {
        TextCmd::Compress {
            input,
            out,
            model,
            segment_tokens,
            no_match,
            no_mix,
            no_lm,
            block_size,
            strands,
            json,
        } => {
            let dest = files::destination(&input, &out, |p| Ok(files::add_suffix(p, TEXT_SUFFIX)))?;
            files::prepare(&dest, out.force, true, json)?;
            let data = files::read_input(&input)?;
            let model = load_model(model.as_deref())?;
            let t = std::time::Instant::now();
            let pb = ui::bar(data.len() as u64, json, "compress");
            let progress = progress_of(&pb, data.len() as u64);
            let packed = if no_mix {
                text_codec::compress_with(
                    &model,
                    &data,
                    &text_codec::Options {
                        segment_tokens,
                        match_model: !no_match,
                    },
                    device,
                    &progress,
                )
            } else {
                cm::stream::compress(
                    &model,
                    &data,
                    &cm::stream::Options {
                        lm: !no_lm,
                        match_model: !no_match,
                        block_len: block_size.unwrap_or(cm::stream::BLOCK_LEN),
                        // Blocks asked for: one strand, cut into blocks.
                        strands: if block_size.is_some() {
                            Some(1)
                        } else {
                            strands.map(usize::from)
                        },
                    },
                    device,
                    &progress,
                )
            };
            pb.finish_and_clear();
            let packed = packed?;
            files::write_all(&dest, &packed)?;
            let secs = t.elapsed().as_secs_f64();
            let bits = if data.is_empty() {
                0.0
            } else {
                packed.len() as f64 * 8.0 / data.len() as f64
            };
            if json {
                print_json(&json!({
                    "input": input, "output": dest.json(), "input_bytes": data.len(),
                    "output_bytes": packed.len(), "bits_per_byte": bits, "verified": true,
                    "seconds": secs, "model": model.hash_hex(), "device": lm_device(device),
                }));
            } else {
                ui::note(format!(
                    "{} -> {}: {} -> {} bytes ({bits:.3} bits/byte), verified, {secs:.1}s, model {}, on {}",
                    files::shown(&input),
                    dest.shown(),
                    data.len(),
                    packed.len(),
                    &model.hash_hex()[..16],
                    lm_device(device)
                ));
            }
            Ok(())
        }
        TextCmd::Decompress {
            input,
            out,
            model,
            max_size,
            json,
        } => {
            let dest =
                files::destination(&input, &out, |p| files::strip_suffix(p, TEXT_SUFFIX, ""))?;
            files::prepare(&dest, out.force, false, json)?;
            let data = files::read_input(&input)?;
            let model = load_model(model.as_deref())?;
            let t = std::time::Instant::now();
            let len = text_codec::declared_len(&data);
            let pb = ui::bar(len, json, "decompress");
            let limit = max_size.unwrap_or(text_codec::default_max_output(data.len() as u64));
            let plain =
                text_codec::decompress_with(&model, &data, limit, device, &progress_of(&pb, len));
            pb.finish_and_clear();
            let plain =
                plain.map_err(|e| e.context(format!("text stream {}", files::shown(&input))))?;
            files::write_all(&dest, &plain)?;
            let secs = t.elapsed().as_secs_f64();
            if json {
                print_json(&json!({
                    "input": input, "output": dest.json(), "input_bytes": data.len(),
                    "output_bytes": plain.len(), "verified": true, "seconds": secs,
                    "model": model.hash_hex(), "device": lm_device(device),
                }));
            } else {
                ui::note(format!(
                    "{} -> {}: {} bytes, verified, {secs:.1}s, on {}",
                    files::shown(&input),
                    dest.shown(),
                    plain.len(),
                    lm_device(device)
                ));
            }
            Ok(())
        }
    }
}

/// The device the language model ran on (or why there is none), for people.
fn lm_device(device: &Device) -> String {
    device
        .lm()
        .map_or_else(|e| format!("none ({e})"), |k| k.describe())
}

pub(crate) fn print_json(v: &serde_json::Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("JSON values serialize")
    );
}

pub fn run_model(cmd: ModelCmd, _device: &Device) -> lockstep::Result<()> {
    match cmd {
        ModelCmd::Convert {
            input,
            output,
            force,
            no_equalize,
            json,
        } => {
            let dest = if files::is_stdio(&output) {
                files::Dest::Stdout
            } else {
                files::Dest::File(output)
            };
            files::prepare(&dest, force, true, json)?;
            let mut model = convert::convert_path(&input, !no_equalize)?;
            let bytes = model.to_bytes();
            files::write_all(&dest, &bytes)?;
            if json {
                print_json(&json!({
                    "input": input, "output": dest.json(), "bytes": bytes.len(),
                    "blake3": model.hash_hex(), "equalized": !no_equalize,
                }));
            } else {
                ui::note(format!(
                    "{} -> {}: {} bytes, blake3 {}",
                    input.display(),
                    dest.shown(),
                    bytes.len(),
                    model.hash_hex()
                ));
            }
            Ok(())
        }
        ModelCmd::Info { model, json } => {
            let m = load_model(model.as_deref())?;
            let c = &m.config;
            let name = model
                .as_ref()
                .map_or("(built-in tinygpt2)".to_string(), |p| {
                    p.display().to_string()
                });
            if json {
                print_json(&json!({
                    "model": name, "blake3": m.hash_hex(), "n_layer": c.n_layer,
                    "n_embd": c.n_embd, "n_head": c.n_head, "n_ctx": c.n_ctx, "vocab": c.vocab,
                    "flags": c.flags,
                }));
            } else {
                println!(
                    "{name}: {} layers, {} wide, {} heads, context {}, vocabulary {}, blake3 {}",
                    c.n_layer,
                    c.n_embd,
                    c.n_head,
                    c.n_ctx,
                    c.vocab,
                    m.hash_hex()
                );
            }
            Ok(())
        }
    }
}
