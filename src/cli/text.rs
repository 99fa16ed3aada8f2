//! `lockstep text ...` and `lockstep model ...`.

use std::path::{Path, PathBuf};

use clap::Subcommand;
use lockstep::lm::{convert, model_file::Model, text_codec};
use lockstep::Error;

/// The default integer model: `../shared/data/tinygpt2` converted by `lockstep model convert`.
static DEFAULT_MODEL: &[u8] = include_bytes!("../../models/tinygpt2.lsm");

#[derive(Subcommand)]
pub enum TextCmd {
    /// Compress a file (any bytes) with the integer GPT-2; verified by decompressing first.
    Compress {
        input: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        /// Integer model file (.lsm); default: the built-in tinygpt2 model.
        #[arg(long)]
        model: Option<PathBuf>,
        /// Tokens per segment (default: the model's context minus one).
        #[arg(long)]
        segment_tokens: Option<u32>,
        /// Do not mix the token match model into the model's frequencies.
        #[arg(long)]
        no_match: bool,
    },
    /// Decompress a .lst file written by `text compress`.
    Decompress {
        input: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        /// The model the stream was written with (its hash is checked).
        #[arg(long)]
        model: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub enum ModelCmd {
    /// Convert a Hugging Face GPT-2 checkpoint (directory or model.safetensors beside
    /// config.json) to an integer model file, with no floating-point arithmetic.
    Convert {
        input: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        /// Skip the per-channel outlier equalization.
        #[arg(long)]
        no_equalize: bool,
    },
}

fn read(path: &Path) -> lockstep::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::io(path, e))
}

/// Write to a temporary file beside `path`, then rename: no half-written output on failure.
fn write_atomic(path: &Path, bytes: &[u8]) -> lockstep::Result<()> {
    let mut f = lockstep::output::AtomicFile::create(path)?;
    f.write_all(bytes)?;
    f.commit()
}

pub(crate) fn load_model(path: Option<&Path>) -> lockstep::Result<Model> {
    match path {
        Some(p) => Model::from_bytes(&read(p)?)
            .map_err(|e| e.context(format!("model file {}", p.display()))),
        None => Model::from_bytes(DEFAULT_MODEL),
    }
}

pub fn run_text(cmd: TextCmd) -> lockstep::Result<()> {
    match cmd {
        TextCmd::Compress {
            input,
            output,
            model,
            segment_tokens,
            no_match,
        } => {
            let data = read(&input)?;
            let model = load_model(model.as_deref())?;
            let t = std::time::Instant::now();
            let out = text_codec::compress(
                &model,
                &data,
                &text_codec::Options {
                    segment_tokens,
                    match_model: !no_match,
                },
            )?;
            write_atomic(&output, &out)?;
            let bits = if data.is_empty() {
                0.0
            } else {
                out.len() as f64 * 8.0 / data.len() as f64
            };
            eprintln!(
                "{} -> {}: {} -> {} bytes ({bits:.3} bits/byte), verified, {:.1}s, model {}",
                input.display(),
                output.display(),
                data.len(),
                out.len(),
                t.elapsed().as_secs_f64(),
                &model.hash_hex()[..16]
            );
            Ok(())
        }
        TextCmd::Decompress {
            input,
            output,
            model,
        } => {
            let data = read(&input)?;
            let model = load_model(model.as_deref())?;
            let out = text_codec::decompress(&model, &data)
                .map_err(|e| e.context(format!("text stream {}", input.display())))?;
            write_atomic(&output, &out)?;
            eprintln!(
                "{} -> {}: {} bytes",
                input.display(),
                output.display(),
                out.len()
            );
            Ok(())
        }
    }
}

pub fn run_model(cmd: ModelCmd) -> lockstep::Result<()> {
    match cmd {
        ModelCmd::Convert {
            input,
            output,
            no_equalize,
        } => {
            let mut model = convert::convert_path(&input, !no_equalize)?;
            let bytes = model.to_bytes();
            write_atomic(&output, &bytes)?;
            eprintln!(
                "{} -> {}: {} bytes, blake3 {}",
                input.display(),
                output.display(),
                bytes.len(),
                model.hash_hex()
            );
            Ok(())
        }
    }
}
