//! `lockstep delta ...`: code one checkpoint against another.

use lockstep::backend::Device;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::file::{decode_to, decoded_len, encode_to};
use lockstep::delta::{EncodeOptions, LayoutChoice, DEFAULT_BATCH_BYTES};
use lockstep::memory::FileBytes;
use lockstep::Result;
use serde_json::json;

use super::files::{self, OutArgs};
use super::text::print_json;
use super::{report, ui};

#[derive(Subcommand)]
pub enum DeltaCmd {
    /// Code TARGET against REFERENCE into a .lsd file (verified before it is written):
    /// step800.safetensors becomes step800.lsd unless told otherwise.
    Encode {
        #[arg(long)]
        reference: PathBuf,
        /// The checkpoint to code; `-` reads standard input (and writes to standard output
        /// unless -o names a file).
        #[arg(long)]
        target: PathBuf,
        #[command(flatten)]
        out: OutArgs,
        #[command(flatten)]
        model: ModelArgs,
        /// Print a JSON report on standard output (the data must go to a file).
        #[arg(long)]
        json: bool,
    },
    /// Rebuild the target checkpoint, byte for byte, from REFERENCE and a .lsd file:
    /// step800.lsd becomes step800.safetensors unless told otherwise.
    Decode {
        #[arg(long)]
        reference: PathBuf,
        /// The .lsd file; `-` reads standard input (and writes to standard output unless -o
        /// names a file).
        delta: PathBuf,
        #[command(flatten)]
        out: OutArgs,
        /// Print a JSON report on standard output (the data must go to a file).
        #[arg(long)]
        json: bool,
    },
    /// Bits per weight by stage, the paper's layout against lockstep's, with and without
    /// reference-exponent conditioning, and the default's total, beside zstd -19 on
    /// byte-grouped XOR.
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
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Clone, Copy)]
pub struct ModelArgs {
    /// Symbol layout; readers need no flag (each tensor records its own). fast decodes about
    /// 2.5x faster than signed for a few percent more bytes; fast-neighbor is smaller than
    /// signed on large tensors and faster to decode.
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
    /// Large tensors (2^20 elements or more) in fast-neighbor, small ones in the smaller of
    /// signed and paper.
    Auto,
    /// The ULPack paper's layout and models (the measured control).
    Paper,
    /// Bit length, refinement bits and sign as stages of their own, with the weight one row
    /// up as context where it pays.
    Signed,
    /// One joint symbol per weight under the reference's exponent and sign.
    Fast,
    /// The joint symbol under the weight one row up too.
    #[value(name = "fast-neighbor")]
    FastNeighbor,
}

impl ModelArgs {
    fn options(&self) -> EncodeOptions {
        EncodeOptions {
            layout: match self.layout {
                _ if self.fast => LayoutChoice::Fast,
                LayoutArg::Fast => LayoutChoice::Fast,
                LayoutArg::FastNeighbor => LayoutChoice::FastNeighbor,
                LayoutArg::Auto => LayoutChoice::Auto,
                LayoutArg::Paper => LayoutChoice::Paper,
                LayoutArg::Signed => LayoutChoice::Signed,
            },
            condition_on_exponent: !self.no_exponent_context,
        }
    }
}

/// The suffix of `delta encode` output, and the one `delta decode` restores.
const DELTA_SUFFIX: &str = ".lsd";
const CHECKPOINT_SUFFIX: &str = ".safetensors";

fn open_checkpoint(p: &Path) -> Result<Checkpoint> {
    if files::is_stdio(p) {
        Checkpoint::from_bytes("(stdin)", files::read_input(p)?)
    } else {
        Checkpoint::open(p)
    }
}

/// Bits per weight by stage, one object per dtype (the table `delta stats` prints).
pub(crate) fn stats_json(s: &lockstep::delta::stats::PairStats) -> serde_json::Value {
    use lockstep::delta::stats::CONFIGS;
    let by_dtype: Vec<_> = s
        .by_dtype
        .iter()
        .map(|(dtype, d)| {
            let coders: Vec<_> = CONFIGS
                .iter()
                .zip(&d.configs)
                .map(|((name, _, _), t)| {
                    json!({
                        "coder": name, "b": t.bpw(t.stage_bits[0]), "q1": t.bpw(t.stage_bits[1]),
                        "q2": t.bpw(t.stage_bits[2]), "sign": t.bpw(t.stage_bits[3]),
                        "tail": t.bpw(t.tail_bits as f64), "framing": t.bpw(t.framing_bits()),
                        "bits_per_weight": t.total_bpw(), "bytes": t.blob_bytes,
                        "ratio": t.blob_bytes as f64 / t.raw_bytes.max(1) as f64,
                    })
                })
                .collect();
            json!({
                "dtype": dtype.to_string(), "weights": d.configs[0].weights,
                "bytes": d.configs[0].raw_bytes, "coders": coders,
                "zstd19_grouped_xor_bytes": d.zstd_grouped_xor, "h_b": d.h_b, "i_b_er": d.i_b_er,
            })
        })
        .collect();
    let tensors: Vec<_> = s
        .tensors
        .iter()
        .map(|t| {
            json!({
                "tensor": t.name, "dtype": t.dtype.to_string(), "weights": t.paper.n_elements,
                "paper_bytes": t.paper.blob_bytes, "default_bytes": t.default.blob_bytes,
            })
        })
        .collect();
    json!({ "by_dtype": by_dtype, "tensors": tensors })
}

pub fn run(cmd: DeltaCmd, device: &Device) -> Result<()> {
    match cmd {
        DeltaCmd::Encode {
            reference,
            target,
            out,
            model,
            json,
        } => {
            let dest = files::destination(&target, &out, |p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                let stem = name.strip_suffix(CHECKPOINT_SUFFIX).unwrap_or(name);
                Ok(p.with_file_name(format!("{stem}{DELTA_SUFFIX}")))
            })?;
            files::prepare(&dest, out.force, true, json)?;
            let (r, t) = (open_checkpoint(&reference)?, open_checkpoint(&target)?);
            let start = std::time::Instant::now();
            let pb = ui::bar(t.file_len() as u64, json, "encode");
            let mut sink = files::Counting::new(files::Sink::open(&dest)?);
            let outcomes = encode_to(
                &r,
                &t,
                &mut sink,
                &dest.path(),
                &model.options(),
                (model.batch_mib as usize) << 20,
                device,
                &|n| pb.inc(n),
            );
            pb.finish_and_clear();
            let outcomes = outcomes?;
            let out_len = sink.count;
            sink.inner.finish()?;
            let secs = start.elapsed().as_secs_f64();
            let weights = outcomes.iter().map(|o| o.report.n_elements).sum::<u64>();
            if json {
                print_json(&json!({
                    "target": target, "output": dest.json(), "input_bytes": t.file_len(),
                    "output_bytes": out_len, "weights": weights,
                    "bits_per_weight": 8.0 * out_len as f64 / weights.max(1) as f64,
                    "verified": true, "seconds": secs,
                    "mb_per_s": t.file_len() as f64 / secs / 1e6,
                }));
            } else {
                ui::note(format!(
                    "{} -> {}: {} -> {} bytes ({:.2}% of input, {:.3} bits/weight), verified, {:.1} MB/s",
                    files::shown(&target),
                    dest.shown(),
                    t.file_len(),
                    out_len,
                    100.0 * out_len as f64 / t.file_len() as f64,
                    8.0 * out_len as f64 / weights.max(1) as f64,
                    t.file_len() as f64 / secs / 1e6
                ));
            }
            Ok(())
        }
        DeltaCmd::Decode {
            reference,
            delta,
            out,
            json,
        } => {
            let dest = files::destination(&delta, &out, |p| {
                files::strip_suffix(p, DELTA_SUFFIX, CHECKPOINT_SUFFIX)
            })?;
            files::prepare(&dest, out.force, false, json)?;
            let r = open_checkpoint(&reference)?;
            let bytes = if files::is_stdio(&delta) {
                FileBytes::Owned(files::read_input(&delta)?)
            } else {
                let file =
                    std::fs::File::open(&delta).map_err(|e| lockstep::Error::io(&delta, e))?;
                FileBytes::of(&delta, &file)?
            };
            let start = std::time::Instant::now();
            let pb = ui::bar(decoded_len(&bytes).unwrap_or(0), json, "decode");
            let mut sink = files::Sink::open(&dest)?;
            let written = std::cell::Cell::new(0u64);
            let res = decode_to(&r, &bytes, &mut sink, &dest.path(), device, &|n| {
                written.set(written.get() + n);
                pb.inc(n)
            });
            pb.finish_and_clear();
            res.map_err(|e| e.context(format!("delta file {}", files::shown(&delta))))?;
            sink.finish()?;
            let secs = start.elapsed().as_secs_f64();
            if json {
                print_json(&json!({
                    "delta": delta, "output": dest.json(), "input_bytes": bytes.len(),
                    "output_bytes": written.get(), "verified": true, "seconds": secs,
                    "mb_per_s": written.get() as f64 / secs / 1e6,
                }));
            } else {
                ui::note(format!(
                    "{} -> {}: {} bytes, verified (BLAKE3 of the original matches)",
                    files::shown(&delta),
                    dest.shown(),
                    written.get()
                ));
            }
            Ok(())
        }
        DeltaCmd::Stats {
            reference,
            target,
            per_tensor,
            no_baseline,
            json,
        } => {
            let (r, t) = (open_checkpoint(&reference)?, open_checkpoint(&target)?);
            let table = report::pair_stats(&r, &t, !no_baseline, device)?;
            if json {
                print_json(&stats_json(&table));
            } else {
                report::print_pair_stats(&table, per_tensor);
            }
            Ok(())
        }
    }
}
