use clap::{Parser, Subcommand};

mod archive;
mod backend;
mod delta;
mod demo;
mod files;
mod parity;
mod report;
mod text;
mod ui;

#[derive(Parser)]
#[command(
    name = "lockstep",
    version,
    about = "Lossless compression for checkpoint trajectories and text"
)]
pub struct Cli {
    /// Compute device: auto is the CPU (the GPU paths are slower today); cuda or wgpu runs
    /// both codecs on a GPU (-v says which it chose and why). The bytes never depend on it.
    #[arg(long, value_enum, global = true, default_value_t = backend::BackendArg::Auto)]
    pub backend: backend::BackendArg,
    /// Run on the CPU pinned to one instruction-set level (both codecs) instead of the best
    /// this CPU runs: to compare levels on one machine, or to step around a suspected SIMD
    /// fault. Implies the CPU device. The bytes never depend on it.
    #[arg(long, value_enum, global = true, value_name = "LEVEL")]
    pub cpu_level: Option<backend::CpuLevel>,
    /// Worker threads for the work done on the CPU, at most 1024 (0: one per logical CPU).
    /// Without it, one per logical CPU, or `RAYON_NUM_THREADS` where set. The bytes never
    /// depend on it.
    // Bounded: each thread is created up front, and tens of thousands failed inside the
    // thread pool's start (a panic, then a hang) instead of giving an error.
    #[arg(short = 'T', long, global = true, value_name = "N",
          value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub threads: Option<u16>,
    /// Print nothing on stderr but errors: no summary lines, notes or progress bars.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Say more on stderr: the backend chosen and why.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Compress the trajectory embedded in the repository, verify it, print the table.
    Demo(demo::DemoArgs),
    /// Checkpoint delta codec: one checkpoint against its predecessor.
    #[command(subcommand)]
    Delta(delta::DeltaCmd),
    /// Text codec: integer GPT-2 + range coder.
    #[command(subcommand)]
    Text(text::TextCmd),
    /// Run every backend present on consecutive checkpoints; print a hash per stage per
    /// backend; exit non-zero on any difference.
    Parity(parity::ParityArgs),
    /// List the backends this build has and the devices found.
    Backends(backend::BackendsArgs),
    /// Integer model files: convert a Hugging Face GPT-2 checkpoint.
    #[command(subcommand)]
    Model(text::ModelCmd),
    /// Create a trajectory archive from checkpoints in training order.
    Pack(archive::PackArgs),
    /// Add one checkpoint to an archive (crash-safe, nothing rewritten).
    Append(archive::AppendArgs),
    /// The checkpoints in an archive: steps, sizes, ratios; with --tensors or --step, every
    /// file and tensor and how each is stored.
    List(archive::ListArgs),
    /// What changed between two steps of an archive: tensors and files changed, added,
    /// removed, and their stored sizes.
    Diff(archive::DiffArgs),
    /// Restore one checkpoint, byte-identical, verified before it is put in place.
    Extract(archive::ExtractArgs),
    /// Decode everything and check every hash; reports damage and keeps going.
    Verify(archive::VerifyArgs),
    /// Per-stage and per-dtype table of an archive.
    Stats(archive::ArchiveArgs),
    /// Complete an archive that has bytes after its last complete checkpoint (a damaged
    /// footer is rebuilt, a commit without footer gets one, an unfinished append is cut
    /// off), then verify it.
    Repair(archive::VerifyArgs),
}

pub fn run(cli: Cli) -> lockstep::Result<()> {
    ui::set_level(cli.quiet, cli.verbose);
    // `lockstep list x.lstp | head`, `lockstep text decompress -c f.lst | head`: a reader that
    // stops early ends us quietly, as it ends every Unix filter, rather than a panic in
    // println! or an error about the pipe.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: restoring the default disposition of one signal, before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    if let Some(n) = cli.threads {
        use_threads(n.into())?;
    }
    // Only the commands that compute choose a device: listing and inspecting never probe one.
    let device = || backend::choose(cli.backend, cli.cpu_level);
    let text_device = || backend::choose_for_text(cli.backend, cli.cpu_level);
    match cli.command {
        Command::Backends(args) => backend::list(args),
        Command::Parity(args) => parity::run(args),
        Command::Demo(args) => demo::run(args, &device()?),
        Command::Delta(cmd) => delta::run(cmd, &device()?),
        Command::Text(cmd) => text::run_text(cmd, &text_device()?),
        Command::Model(cmd) => text::run_model(cmd, &text_device()?),
        Command::Pack(a) => archive::pack(a, &device()?),
        Command::Append(a) => archive::append(a, &device()?),
        Command::List(a) => archive::list(a),
        Command::Diff(a) => archive::diff(a, &device()?),
        Command::Extract(a) => archive::extract(a, &device()?),
        Command::Verify(a) => archive::verify(a, &device()?),
        Command::Stats(a) => archive::stats(a),
        Command::Repair(a) => archive::repair(a, &device()?),
    }
}

/// Size the process's thread pool (rayon's global one, which every CPU path and the
/// pools made from it use) before anything runs on it. 0 is one per logical CPU, as
/// `zstd -T0` and `xz -T0` read it; RAYON_NUM_THREADS is then ignored, as any setting is
/// under an explicit `-T`.
fn use_threads(n: usize) -> lockstep::Result<()> {
    let n = match n {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .map_err(|e| lockstep::Error::Invalid(format!("--threads {n}: {e}")))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own consistency checks (conflicting short flags between the global `-q`/`-v`
    /// and a subcommand's, and the like) run only in debug builds unless asked for.
    #[test]
    fn command_line_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
