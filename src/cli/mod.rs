use clap::{Parser, Subcommand};

mod archive;
mod delta;
mod demo;
mod report;
mod text;

#[derive(Parser)]
#[command(
    name = "lockstep",
    version,
    about = "Lossless compression for checkpoint trajectories and text"
)]
pub struct Cli {
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
    /// Integer model files: convert a Hugging Face GPT-2 checkpoint.
    #[command(subcommand)]
    Model(text::ModelCmd),
    /// Create a trajectory archive from checkpoints in training order.
    Pack(archive::PackArgs),
    /// Add one checkpoint to an archive (crash-safe, nothing rewritten).
    Append(archive::AppendArgs),
    /// The checkpoints in an archive: steps, sizes, ratios.
    List(archive::ArchiveArgs),
    /// Restore one checkpoint, byte-identical, verified before it is put in place.
    Extract(archive::ExtractArgs),
    /// Decode everything and check every hash; reports damage and keeps going.
    Verify(archive::ArchiveArgs),
    /// Per-stage and per-dtype table of an archive.
    Stats(archive::ArchiveArgs),
}

pub fn run(cli: Cli) -> lockstep::Result<()> {
    match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Delta(cmd) => delta::run(cmd),
        Command::Text(cmd) => text::run_text(cmd),
        Command::Model(cmd) => text::run_model(cmd),
        Command::Pack(a) => archive::pack(a),
        Command::Append(a) => archive::append(a),
        Command::List(a) => archive::list(a),
        Command::Extract(a) => archive::extract(a),
        Command::Verify(a) => archive::verify(a),
        Command::Stats(a) => archive::stats(a),
    }
}
