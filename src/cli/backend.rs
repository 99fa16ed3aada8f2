//! `--backend` (on every command) and `lockstep backends`.

use clap::{Args, ValueEnum};
use lockstep::backend::{self, BackendChoice, Device};
use lockstep::Result;

#[derive(ValueEnum, Clone, Copy, Debug, Default)]
pub enum BackendArg {
    /// A CUDA GPU for checkpoints, else a discrete GPU through wgpu, else the CPU; text on
    /// the CPU (-v says which).
    #[default]
    Auto,
    Cpu,
    Wgpu,
    Cuda,
    /// The CUDA kernels run on the CPU by a host emulation (for tests; slow; not a GPU).
    CudaEmulated,
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
            BackendArg::CudaEmulated => BackendChoice::CudaEmulated,
            BackendArg::Reference => BackendChoice::Reference,
        }
    }
}

/// The chosen device, for the commands to pass on. What `auto` chose and why is said under
/// `-v`; a device asked for by name that is not there is an error (`backend::select`).
pub fn choose(arg: BackendArg) -> Result<Device> {
    let (device, note) = backend::select(arg.choice())?;
    match note {
        Some(note) => super::ui::detail(note),
        None => super::ui::detail(format!(
            "backend: {} ({})",
            device.name(),
            device.describe()
        )),
    }
    Ok(device)
}

/// The device for the text codec and model commands: the CPU's integer kernels for `auto`
/// and `cpu` (the readable ones for `reference`) without probing a GPU, and the device named
/// otherwise (the wgpu and CUDA devices run the same integers: same bytes everywhere). Under
/// `-v` it says which device the language model runs on.
pub fn choose_for_text(arg: BackendArg) -> Result<Device> {
    let device = match arg {
        BackendArg::Auto | BackendArg::Cpu => Device::cpu(),
        BackendArg::Reference => Device::reference(),
        BackendArg::Cuda | BackendArg::CudaEmulated | BackendArg::Wgpu => {
            backend::select(arg.choice())?.0
        }
    };
    if let Ok(lm) = device.lm() {
        super::ui::detail(format!(
            "language model on: {} ({})",
            device.name(),
            lm.describe()
        ));
    }
    Ok(device)
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
        let (auto, note) = backend::select(BackendChoice::Auto)?;
        super::text::print_json(&serde_json::json!({
            "backends": found,
            "auto": {"backend": auto.name(), "device": auto.describe(), "note": note},
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
    let (auto, _) = backend::select(BackendChoice::Auto)?;
    println!("auto picks: {} ({})", auto.name(), auto.describe());
    Ok(())
}
