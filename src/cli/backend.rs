//! `--backend` (on every command) and `lockstep backends`.

use clap::{Args, ValueEnum};
use lockstep::backend::{self, BackendChoice};
use lockstep::Result;

#[derive(ValueEnum, Clone, Copy, Debug, Default)]
pub enum BackendArg {
    /// CUDA, then a discrete GPU through wgpu, then the CPU (-v says which).
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

/// Make the chosen backend the default for this process. What `auto` chose and why is said
/// under `-v`; a device asked for by name that is not there is an error (`backend::select`).
pub fn install(arg: BackendArg) -> Result<()> {
    let selected = backend::select(arg.choice())?;
    match &selected.note {
        Some(note) => super::ui::detail(note),
        None => super::ui::detail(format!(
            "backend: {} ({})",
            selected.backend.name(),
            selected.backend.device()
        )),
    }
    backend::set_default(selected.backend);
    Ok(())
}

#[derive(Args)]
pub struct BackendsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// `lockstep backends`.
pub fn list(args: BackendsArgs) -> Result<()> {
    if args.json {
        let found: Vec<_> = backend::available()
            .into_iter()
            .map(|f| serde_json::json!({"backend": f.name, "usable": f.usable, "device": f.detail}))
            .collect();
        let auto = backend::select(BackendChoice::Auto)?;
        super::text::print_json(&serde_json::json!({
            "backends": found,
            "auto": {"backend": auto.backend.name(), "device": auto.backend.device(), "note": auto.note},
        }));
        return Ok(());
    }
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
