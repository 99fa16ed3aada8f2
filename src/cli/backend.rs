//! `--backend` (on every command) and `lockstep backends`.

use clap::{Args, ValueEnum};
use lockstep::backend::{self, BackendChoice, Device, Isa};
use lockstep::{Error, Result};

#[derive(ValueEnum, Clone, Copy, Debug, Default)]
pub enum BackendArg {
    /// The CPU, for both codecs (faster than this build's GPU paths where measured; -v says
    /// so); cuda or wgpu asks for a GPU.
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

/// `--cpu-level`: the CPU's instruction-set levels ([`Isa`]).
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum CpuLevel {
    /// Plain Rust, no explicit SIMD (what any CPU of the target runs).
    Portable,
    /// aarch64 NEON.
    Neon,
    /// x86-64 AVX2 (with BMI1/2, LZCNT, POPCNT, PCLMULQDQ; AVX-VNNI where present).
    Avx2,
    /// x86-64 AVX-512 F/BW/VL/CD (VNNI and AMX-INT8 where present).
    Avx512,
}

impl CpuLevel {
    fn isa(self) -> Isa {
        match self {
            CpuLevel::Portable => Isa::Portable,
            CpuLevel::Neon => Isa::Neon,
            CpuLevel::Avx2 => Isa::Avx2,
            CpuLevel::Avx512 => Isa::Avx512,
        }
    }
}

/// The CPU at `level`: an error where this CPU does not run it, or where `--backend` names a
/// device other than the CPU (the level would silently not apply).
fn cpu_at(arg: BackendArg, level: CpuLevel) -> Result<Device> {
    let isa = level.isa();
    if !matches!(arg, BackendArg::Auto | BackendArg::Cpu) {
        return Err(Error::Invalid(format!(
            "--cpu-level {} runs the CPU; it cannot be combined with --backend {}",
            isa.tag(),
            arg.to_possible_value()
                .map_or("?".into(), |v| v.get_name().to_string())
        )));
    }
    Device::cpu_at(isa).ok_or_else(|| {
        Error::Unsupported(format!(
            "--cpu-level {}: this CPU does not run the {} level (the best it runs is {})",
            isa.tag(),
            isa.name(),
            Isa::detect().tag()
        ))
    })
}

/// The chosen device, for the commands to pass on. What `auto` chose and why is said under
/// `-v`; a device asked for by name that is not there is an error (`backend::select`), as is
/// a `--cpu-level` this CPU does not run.
pub fn choose(arg: BackendArg, level: Option<CpuLevel>) -> Result<Device> {
    let (device, note) = match level {
        Some(level) => (cpu_at(arg, level)?, None),
        None => backend::select(arg.choice())?,
    };
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
pub fn choose_for_text(arg: BackendArg, level: Option<CpuLevel>) -> Result<Device> {
    let device = match (arg, level) {
        (_, Some(level)) => cpu_at(arg, level)?,
        (arg, None) => match arg {
            BackendArg::Auto | BackendArg::Cpu => Device::cpu(),
            BackendArg::Reference => Device::reference(),
            BackendArg::Cuda | BackendArg::CudaEmulated | BackendArg::Wgpu => {
                backend::select(arg.choice())?.0
            }
        },
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
