//! `--backend` (on every command) and `lockstep backends`.

use clap::ValueEnum;
use lockstep::backend::{self, BackendChoice};
use lockstep::Result;

#[derive(ValueEnum, Clone, Copy, Debug, Default)]
pub enum BackendArg {
    /// CUDA, then a discrete GPU through wgpu, then the CPU; a fallback is reported.
    #[default]
    Auto,
    Cpu,
    Wgpu,
    Cuda,
    /// The readable reference codec (slow; for checks).
    Reference,
}

impl BackendArg {
    pub fn choice(self) -> BackendChoice {
        match self {
            BackendArg::Auto => BackendChoice::Auto,
            BackendArg::Cpu => BackendChoice::Cpu,
            BackendArg::Wgpu => BackendChoice::Wgpu,
            BackendArg::Cuda => BackendChoice::Cuda,
            BackendArg::Reference => BackendChoice::Reference,
        }
    }
}

/// Make the chosen backend the default for this process; say so when `auto` fell back.
pub fn install(arg: BackendArg) -> Result<()> {
    let selected = backend::select(arg.choice())?;
    if let Some(note) = &selected.note {
        eprintln!("{note}");
    }
    backend::set_default(selected.backend);
    Ok(())
}

/// `lockstep backends`.
pub fn list() -> Result<()> {
    println!("{:<10} {:<7} device", "backend", "usable");
    for f in backend::available() {
        println!(
            "{:<10} {:<7} {}",
            f.name,
            if f.usable { "yes" } else { "no" },
            f.detail
        );
    }
    let auto = backend::select(BackendChoice::Auto)?;
    println!(
        "auto picks: {} ({})",
        auto.backend.name(),
        auto.backend.device()
    );
    Ok(())
}
