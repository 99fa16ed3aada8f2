//! The delta codec's measurement tool, one binary for what used to be a handful of examples
//! that each parsed their own arguments:
//!
//! - `table`: the speed table behind `cargo xtask bench delta` (lockstep's devices and zstd -19
//!   on byte-grouped XOR, same pairs, one run; `--paired` and `--scaling` give the rows that
//!   xtask alternates with ZipNN or across thread counts);
//! - `stages`: per-stage CPU time (histograms, lanes, whole encode, decode, blob encode and
//!   decode) of both layouts, alternating, per instruction-set level;
//! - `encode-loop`, `decode-loop`: one pipeline in a loop, for `perf record` and A/B runs;
//! - `small-tensors`: microseconds per small tensor (table building rather than coding).
//! - `contexts`: estimated sizes of richer context models for the one-symbol Joint layout,
//!   next to the real blobs (a format change weighed before it is built).
//!
//! `cargo run --release -p lockstep-measure -- <command> [options]`; `--help` lists them.
//! Every decode is compared with its target outside the timed region.

mod contexts;
mod loops;
mod stages;
mod table;

use std::time::Instant;

use lockstep::backend::cpu::{
    set_avx2_lookups, set_avx512_joint_decode, Avx2Lookups, Avx512JointDecode, CpuAt, Isa,
};
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::{LayoutChoice, TensorPair};

const USAGE: &str = "\
usage: measure <command> [options]

commands:
  table           speed table of every device and CPU level, zstd -19 in the same run
                  (--quick: one repetition; --paired: best CPU level, one thread, one
                  layout; --scaling: best CPU level, both layouts, one thread and two,
                  their passes alternating)
  stages          per-stage CPU time of both layouts, alternating, per CPU level
  encode-loop     encode every float tensor ROUNDS times, print the best pass
  decode-loop     decode every float tensor's blob ROUNDS times, print the best pass
  small-tensors   microseconds per tensor below 2^16 elements, every layout (or --layout's)
  lookups         the AVX2 neighbor form's gathers against its scalar loads, passes
                  alternating in one process (the default layout unless --layout;
                  per-pair quartiles)
  contexts        estimated sizes of richer Joint context models next to the real blobs of
                  both layouts (what a format change would gain, before building it)

options:
  --dir DIR       checkpoint folder (default ../shared/data/trajectory-gpt2)
  --dtype T       bf16 or fp32: which 600 -> 800 pair (default bf16; `table` runs both)
  --isa L         portable, neon, avx2 or avx512 (default: the best this CPU runs; `stages`
                  runs every level unless one is given)
  --layout L      fast, default, signed or fast-neighbor (default: fast; `stages` runs both unless one is given)
  --threads N     rayon threads (default 1)
  --lookups L     auto, scalar or gather: how the AVX2 neighbor form (decode, encode) looks up
                  (default auto: gathers on an Intel CPU not affected by GDS and on AMD
                  from Zen 3 on)
  --joint-decode L  auto, avx512 or avx2: which lanes decode the Joint layout (`--fast`, the
                  default's neighbor form) at the AVX-512 level (default auto: AVX2's on an
                  Intel CPU)
  --rounds N      repetitions (default per command)
";

/// The options every command shares; each reads the ones it needs.
pub struct Opts {
    pub dir: String,
    pub dtype: String,
    pub isa: Option<Isa>,
    pub layout: Option<LayoutChoice>,
    pub threads: usize,
    pub rounds: Option<usize>,
    pub quick: bool,
    pub paired: bool,
    pub scaling: bool,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Opts, String> {
        let mut o = Opts {
            dir: concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../shared/data/trajectory-gpt2"
            )
            .into(),
            dtype: "bf16".into(),
            isa: None,
            layout: None,
            threads: 1,
            rounds: None,
            quick: false,
            paired: false,
            scaling: false,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
            match a.as_str() {
                "--dir" => o.dir = value()?,
                "--dtype" => o.dtype = value()?,
                "--isa" => {
                    let v = value()?;
                    o.isa = Some(
                        Isa::ALL
                            .into_iter()
                            .find(|i| {
                                i.name()
                                    .replace('-', "")
                                    .eq_ignore_ascii_case(&v.replace('-', ""))
                            })
                            .ok_or(format!("unknown level {v} (portable, neon, avx2, avx512)"))?,
                    );
                }
                "--layout" => {
                    o.layout = Some(match value()?.as_str() {
                        "fast" => LayoutChoice::Fast,
                        "default" => LayoutChoice::Auto,
                        "signed" => LayoutChoice::Signed,
                        "fast-neighbor" => LayoutChoice::FastNeighbor,
                        v => {
                            return Err(format!(
                                "unknown layout {v} (fast, default, signed, fast-neighbor)"
                            ))
                        }
                    })
                }
                "--threads" => o.threads = number(&value()?)?,
                "--lookups" => set_avx2_lookups(match value()?.as_str() {
                    "auto" => Avx2Lookups::Auto,
                    "scalar" => Avx2Lookups::ScalarLoads,
                    "gather" => Avx2Lookups::Gathers,
                    v => return Err(format!("unknown lookups {v} (auto, scalar, gather)")),
                }),
                "--joint-decode" => set_avx512_joint_decode(match value()?.as_str() {
                    "auto" => Avx512JointDecode::Auto,
                    "avx512" => Avx512JointDecode::Avx512Lanes,
                    "avx2" => Avx512JointDecode::Avx2Lanes,
                    v => return Err(format!("unknown joint decode {v} (auto, avx512, avx2)")),
                }),
                "--rounds" => o.rounds = Some(number(&value()?)?),
                "--quick" => o.quick = true,
                "--paired" => o.paired = true,
                "--scaling" => o.scaling = true,
                _ => return Err(format!("unknown option {a}")),
            }
        }
        Ok(o)
    }

    /// The CPU at the chosen level (the best one by default).
    pub fn cpu(&self) -> Result<CpuAt, String> {
        let isa = self.isa.unwrap_or_else(Isa::detect);
        CpuAt::new(isa).ok_or(format!("{} is not available on this CPU", isa.name()))
    }

    /// The two checkpoints of the 600 -> 800 pair in `dtype`.
    pub fn open_pair(&self, dtype: &str) -> Result<(Checkpoint, Checkpoint), String> {
        let open = |step: &str| {
            let path = format!("{}/gpt2_step000{step}_{dtype}.safetensors", self.dir);
            Checkpoint::open(&path).map_err(|e| format!("{path}: {e}"))
        };
        Ok((open("600")?, open("800")?))
    }
}

fn number(v: &str) -> Result<usize, String> {
    v.parse().map_err(|_| format!("{v} is not a number"))
}

/// Every float tensor of `t` with its reference in `r`, optionally only those `keep` accepts.
pub fn pairs<'a>(
    r: &'a Checkpoint,
    t: &'a Checkpoint,
    keep: impl Fn(&[u64]) -> bool,
) -> Vec<TensorPair<'a>> {
    t.tensors
        .iter()
        .filter(|e| e.dtype.is_float() && keep(&e.shape))
        .map(|e| TensorPair {
            dtype: e.dtype,
            shape: &e.shape,
            reference: r.data(r.get(&e.name).expect("reference lacks a tensor")),
            target: t.data(e),
        })
        .collect()
}

/// Best of `reps` wall times of `f`, and its last result.
pub fn best<T>(reps: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut out = None;
    let mut best = f64::MAX;
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        let v = f();
        best = best.min(start.elapsed().as_secs_f64());
        out = Some(v);
    }
    (best, out.unwrap())
}

fn main() {
    // As the `lockstep` binary does (src/main.rs).
    lockstep::memory::reuse_freed_memory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(command) = args.first() else {
        eprint!("{USAGE}");
        std::process::exit(2);
    };
    if command == "--help" || command == "-h" {
        print!("{USAGE}");
        return;
    }
    let result = Opts::parse(&args[1..]).and_then(|o| {
        if command == "table" {
            // Builds its pools per row (one thread, then two).
            return table::run(&o);
        }
        // Run on the pool's own thread, as `table` does: called from outside it, every
        // parallel loop of a decode handed its work to a pool thread and waited to be woken
        // (a tenth of a bf16 `decode-loop` went to these hand-offs on the Zen 5 VM, about 30
        // µs per small tensor in its table building alone).
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(o.threads)
            .build()
            .map_err(|e| e.to_string())?;
        pool.install(|| match command.as_str() {
            "stages" => stages::run(&o),
            "encode-loop" => loops::encode(&o),
            "decode-loop" => loops::decode(&o),
            "small-tensors" => loops::small_tensors(&o),
            "lookups" => loops::lookups(&o),
            "contexts" => contexts::run(&o),
            c => Err(format!("unknown command {c}\n{USAGE}")),
        })
    });
    if let Err(e) = result {
        eprintln!("measure: {e}");
        std::process::exit(1);
    }
}
