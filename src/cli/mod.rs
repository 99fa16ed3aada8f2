use clap::{Parser, Subcommand};

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
    /// Text codec: integer GPT-2 + range coder.
    #[command(subcommand)]
    Text(text::TextCmd),
    /// Integer model files: convert a Hugging Face GPT-2 checkpoint.
    #[command(subcommand)]
    Model(text::ModelCmd),
}

pub fn run(cli: Cli) -> lockstep::Result<()> {
    match cli.command {
        Command::Text(cmd) => text::run_text(cmd),
        Command::Model(cmd) => text::run_model(cmd),
    }
}
