//! `lockstep text ...` and `lockstep model ...`.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum TextCmd {}

#[derive(Subcommand)]
pub enum ModelCmd {}

pub fn run_text(cmd: TextCmd) -> lockstep::Result<()> {
    match cmd {}
}

pub fn run_model(cmd: ModelCmd) -> lockstep::Result<()> {
    match cmd {}
}
