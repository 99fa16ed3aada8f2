//! Tests written once, run per device: each test file's macro instantiates its checks for
//! every device name below, and [`device`] gives the device or says why it is absent.
//!
//! `LOCKSTEP_REQUIRE` names devices that must be present (comma-separated, from
//! [`NAMES`]; for example `LOCKSTEP_REQUIRE=wgpu,avx2`): a listed device that is missing
//! fails its tests instead of skipping them. `CI=true` requires `wgpu` (CI installs Mesa's
//! lavapipe so the wgpu tests run for real).
#![allow(dead_code)]

use lockstep::backend::{Device, Isa};

/// Every device name the tests know: the readable references, each CPU instruction-set
/// level, and the GPUs.
/// `cuda_emulated` is the CUDA kernels' host emulation (present wherever it is built: it
/// checks their logic, not a GPU); `nvrtc` is the CUDA toolkit the kernel compile check
/// uses (tests/cuda_compile.rs).
pub const NAMES: [&str; 9] = [
    "reference",
    "portable",
    "neon",
    "avx2",
    "avx512",
    "wgpu",
    "cuda",
    "cuda_emulated",
    "nvrtc",
];

/// Whether `LOCKSTEP_REQUIRE` (or `CI=true`, for wgpu, the CUDA emulation and the CUDA
/// toolkit) names `name`.
pub fn required(name: &str) -> bool {
    let listed = std::env::var("LOCKSTEP_REQUIRE").unwrap_or_default();
    let mut names = listed.split(',').map(str::trim).filter(|n| !n.is_empty());
    if let Some(bad) = names.clone().find(|n| !NAMES.contains(n)) {
        panic!("LOCKSTEP_REQUIRE names '{bad}', not one of {NAMES:?}");
    }
    names.any(|n| n == name)
        || (["wgpu", "cuda_emulated", "nvrtc"].contains(&name)
            && std::env::var("CI").as_deref() == Ok("true"))
}

/// The device called `name`, or `None` with a printed reason; a missing device that
/// [`required`] names is a failure.
pub fn device(name: &str) -> Option<Device> {
    let found = match name {
        "reference" => Ok(Device::reference()),
        "portable" | "neon" | "avx2" | "avx512" => {
            let isa = Isa::ALL.into_iter().find(|i| i.tag() == name).unwrap();
            Device::cpu_at(isa).ok_or_else(|| format!("this CPU does not run {}", isa.name()))
        }
        "wgpu" => Device::wgpu(false).map_err(|e| e.to_string()),
        "cuda" => Device::cuda().map_err(|e| e.to_string()),
        "cuda_emulated" => Device::cuda_emulated().map_err(|e| e.to_string()),
        other => panic!("unknown device name {other}"),
    };
    match found {
        Ok(d) => Some(d),
        Err(why) if required(name) => {
            panic!("LOCKSTEP_REQUIRE (or CI=true) needs the {name} device, which is absent: {why}")
        }
        Err(why) => {
            eprintln!("SKIP: the {name} device is absent: {why}");
            None
        }
    }
}
