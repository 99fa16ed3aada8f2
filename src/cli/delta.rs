//! `lockstep delta ...`: code one checkpoint against another.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::file::{decode_file, encode_file};
use lockstep::delta::{EncodeOptions, LayoutChoice, DEFAULT_BATCH_BYTES};
use lockstep::Result;

use super::report;

#[derive(Subcommand)]
pub enum DeltaCmd {
    /// Code TARGET against REFERENCE into a .lsd file (verified before it is written).
    Encode {
        #[arg(long)]
        reference: PathBuf,
        #[arg(long)]
        target: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        model: ModelArgs,
    },
    /// Rebuild the target checkpoint, byte for byte, from REFERENCE and a .lsd file.
    Decode {
        #[arg(long)]
        reference: PathBuf,
        /// The .lsd file.
        delta: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Bits per weight by stage, paper layout against lockstep's default, with and without
    /// reference-exponent conditioning, beside zstd -19 on byte-grouped XOR.
    Stats {
        #[arg(long)]
        reference: PathBuf,
        #[arg(long)]
        target: PathBuf,
        /// Also print one line per tensor (paper vs default bytes).
        #[arg(long)]
        per_tensor: bool,
        /// Skip the zstd -19 baseline (slow on large files).
        #[arg(long)]
        no_baseline: bool,
    },
}

#[derive(Args, Clone, Copy)]
pub struct ModelArgs {
    /// Symbol layout: auto picks the smaller per tensor; paper is the ULPack control; fast
    /// codes one joint symbol per weight (about 2.5x faster decoding, a few percent larger).
    #[arg(long, value_enum, default_value_t = LayoutArg::Auto)]
    layout: LayoutArg,
    /// Shorthand for `--layout fast`.
    #[arg(long, conflicts_with = "layout")]
    fast: bool,
    /// Drop reference-exponent conditioning (the paper's Table 10 ablation).
    #[arg(long)]
    no_exponent_context: bool,
    /// Batch budget in MiB (changes speed and memory, never the bytes).
    #[arg(long, default_value_t = (DEFAULT_BATCH_BYTES >> 20) as u64)]
    batch_mib: u64,
}

#[derive(ValueEnum, Clone, Copy)]
enum LayoutArg {
    Auto,
    Paper,
    Signed,
    Fast,
}

impl ModelArgs {
    fn options(&self) -> EncodeOptions {
        EncodeOptions {
            layout: match self.layout {
                _ if self.fast => LayoutChoice::Fast,
                LayoutArg::Fast => LayoutChoice::Fast,
                LayoutArg::Auto => LayoutChoice::Auto,
                LayoutArg::Paper => LayoutChoice::Paper,
                LayoutArg::Signed => LayoutChoice::Signed,
            },
            condition_on_exponent: !self.no_exponent_context,
        }
    }
}

pub fn run(cmd: DeltaCmd) -> Result<()> {
    match cmd {
        DeltaCmd::Encode {
            reference,
            target,
            output,
            model,
        } => {
            let (r, t) = (Checkpoint::open(&reference)?, Checkpoint::open(&target)?);
            let start = std::time::Instant::now();
            let outcomes = encode_file(
                &r,
                &t,
                &output,
                &model.options(),
                (model.batch_mib as usize) << 20,
            )?;
            let secs = start.elapsed().as_secs_f64();
            let out_len = std::fs::metadata(&output)
                .map_err(|e| lockstep::Error::io(&output, e))?
                .len();
            println!(
                "{} -> {}: {} -> {} bytes ({:.2}% of input, {:.3} bits/weight), verified, {:.1} MB/s",
                target.display(),
                output.display(),
                t.file_len(),
                out_len,
                100.0 * out_len as f64 / t.file_len() as f64,
                8.0 * out_len as f64 / outcomes.iter().map(|o| o.report.n_elements).sum::<u64>().max(1) as f64,
                t.file_len() as f64 / secs / 1e6
            );
            Ok(())
        }
        DeltaCmd::Decode {
            reference,
            delta,
            output,
        } => {
            let r = Checkpoint::open(&reference)?;
            let file = std::fs::File::open(&delta).map_err(|e| lockstep::Error::io(&delta, e))?;
            // SAFETY: read-only mapping; the .lsd file is not modified while we decode it.
            let bytes =
                unsafe { memmap2::Mmap::map(&file) }.map_err(|e| lockstep::Error::io(&delta, e))?;
            decode_file(&r, &bytes, &output)
                .map_err(|e| e.context(format!("delta file {}", delta.display())))?;
            println!(
                "{} -> {}: verified (BLAKE3 of the original matches)",
                delta.display(),
                output.display()
            );
            Ok(())
        }
        DeltaCmd::Stats {
            reference,
            target,
            per_tensor,
            no_baseline,
        } => {
            let (r, t) = (Checkpoint::open(&reference)?, Checkpoint::open(&target)?);
            let table = report::pair_stats(&r, &t, !no_baseline)?;
            report::print_pair_stats(&table, per_tensor);
            Ok(())
        }
    }
}
