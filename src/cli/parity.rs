//! `lockstep parity FILES...`: run every backend present on each consecutive pair of
//! checkpoints, print one hash per stage per backend, and fail on any difference. What a user
//! runs to trust a new machine or driver.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use lockstep::backend::cpu::{CpuAt, Isa};
use lockstep::backend::parity::{stages, STAGE_NAMES};
use lockstep::backend::{self, Backend, BackendChoice};
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::file::check_compatible;
use lockstep::delta::{EncodeOptions, TensorPair};
use lockstep::{Error, Result};

#[derive(Args)]
pub struct ParityArgs {
    /// Checkpoints (.safetensors) in trajectory order; each is coded against the one before.
    #[arg(required = true, num_args = 2..)]
    files: Vec<PathBuf>,
}

/// Every backend that can run here, the reference first.
fn present() -> Vec<Arc<dyn Backend>> {
    let mut out = Vec::new();
    for choice in [
        BackendChoice::Reference,
        BackendChoice::Cpu,
        BackendChoice::Wgpu,
        BackendChoice::Cuda,
    ] {
        match backend::select(choice) {
            Ok(s) => out.push(s.backend),
            Err(e) => eprintln!("skipping {choice:?}: {e}"),
        }
        if choice == BackendChoice::Cpu {
            // The slower instruction-set levels this CPU also runs: their code paths differ
            // from the default's, so a new machine should check them too.
            let best = Isa::detect();
            for isa in Isa::ALL.into_iter().filter(|&i| i < best) {
                if let Some(b) = CpuAt::new(isa) {
                    out.push(Arc::new(b));
                }
            }
        }
    }
    out
}

pub fn run(args: ParityArgs) -> Result<()> {
    let backends = present();
    let opts = EncodeOptions::default();
    let mut differences = 0;
    for pair in args.files.windows(2) {
        let (r, t) = (Checkpoint::open(&pair[0])?, Checkpoint::open(&pair[1])?);
        check_compatible(&r, &t)?;
        println!("\n== {} -> {}", pair[0].display(), pair[1].display());
        let mut rows = Vec::new();
        for b in &backends {
            let start = std::time::Instant::now();
            let mut hashers: [blake3::Hasher; 6] = Default::default();
            for e in &t.tensors {
                let p = TensorPair {
                    dtype: e.dtype,
                    shape: &e.shape,
                    reference: r.data(r.get(&e.name).unwrap()),
                    target: t.data(e),
                };
                let s = stages(b.as_ref(), &p, &opts).map_err(|err| {
                    Error::Invalid(format!("{} on '{}': {err}", b.name(), e.name))
                })?;
                if let Some(s) = s {
                    if s.decoded != p.target {
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
            rows.push((b.name(), b.device(), hashes, start.elapsed().as_secs_f64()));
        }
        print!("{:<13}", "backend");
        for name in STAGE_NAMES {
            print!(" {name:<13}");
        }
        println!(" {:>7}  device", "secs");
        let want = &rows[0].2;
        for (name, device, hashes, secs) in &rows {
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
    }
    if differences > 0 {
        return Err(Error::Mismatch(format!(
            "{differences} stage hashes differ from the reference (marked !)"
        )));
    }
    println!("\nall backends agree on every stage");
    Ok(())
}
