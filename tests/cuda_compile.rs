//! Compile checks of the CUDA kernels without a GPU: every module of kernels/*.cu and
//! kernels/lm/*.cu, exactly as the CUDA device compiles it at run time (`cuda::kernel_sources`,
//! `cuda::lm::kernels::kernel_sources`), through NVRTC to PTX
//! for compute_90, then by `ptxas -v` to sm_90 (H100/H200) machine code. Fails on any error
//! or warning-free compile that loses a kernel; prints registers and spills per kernel.
//!
//! The toolkit comes from the package index (`.ci/run`: `pip install --target
//! target/cuda-tools nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12`), or from the folder in
//! `LOCKSTEP_CUDA_TOOLS`. Without it the test skips with the reason, unless `CI=true` or
//! `LOCKSTEP_REQUIRE` names `nvrtc`.

mod devices;

use std::path::PathBuf;
use std::process::Command;

use lockstep::backend::cuda::lm::kernels::kernel_sources as lm_kernel_sources;
use lockstep::backend::cuda::{kernel_sources, nvrtc::Nvrtc};

struct Tools {
    nvrtc: PathBuf,
    ptxas: PathBuf,
}

fn tools() -> Option<Tools> {
    let root = std::env::var_os("LOCKSTEP_CUDA_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/cuda-tools"));
    let t = Tools {
        nvrtc: root.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12"),
        ptxas: root.join("nvidia/cuda_nvcc/bin/ptxas"),
    };
    let missing: Vec<String> = [&t.nvrtc, &t.ptxas]
        .into_iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        return Some(t);
    }
    let why = format!(
        "the CUDA toolkit is absent ({} missing; pip install --target target/cuda-tools \
         nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12)",
        missing.join(", ")
    );
    if devices::required("nvrtc") {
        panic!("CI=true or LOCKSTEP_REQUIRE needs the CUDA compile check: {why}");
    }
    eprintln!("SKIP: {why}");
    None
}

#[test]
fn every_kernel_compiles_to_ptx_and_sm90() {
    let Some(t) = tools() else { return };
    let nvrtc = Nvrtc::open(Some(&t.nvrtc)).unwrap();
    let (major, minor) = nvrtc.version().unwrap();
    println!("NVRTC {major}.{minor}");
    let dir = tempfile::tempdir().unwrap();
    for (file, source, kernels) in kernel_sources().into_iter().chain(lm_kernel_sources()) {
        assert!(
            !source.contains("fast_math") && !source.contains("fast-math"),
            "{file}: fast-math must never shape bytes"
        );
        let ptx = nvrtc
            .compile(file, &source, "compute_90")
            .unwrap_or_else(|e| panic!("{e}"));
        for k in &kernels {
            assert!(
                ptx.contains(&format!(".entry {k}(")),
                "{file}: the PTX lacks kernel {k}"
            );
        }
        let file = file.replace('/', "_");
        let ptx_path = dir.path().join(format!("{file}.ptx"));
        std::fs::write(&ptx_path, &ptx).unwrap();
        let out = Command::new(&t.ptxas)
            .args(["-arch=sm_90", "-v", "-Werror", "-o"])
            .arg(dir.path().join(format!("{file}.cubin")))
            .arg(&ptx_path)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", t.ptxas.display()));
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ptxas failed on {file}:\n{log}");
        // ptxas -v: "Compiling entry function 'k'", then "Used N registers, ..." and the
        // spill line; one line per kernel here.
        let mut current = String::new();
        let mut seen = Vec::new();
        for line in log.lines() {
            if let Some(rest) = line.split("Compiling entry function '").nth(1) {
                current = rest.split('\'').next().unwrap_or_default().to_string();
            } else if line.contains("spill stores") || line.contains("Used ") {
                let what = line.split(": ").last().unwrap_or(line).trim();
                println!("{file} {current}: {what}");
                if line.contains("Used ") {
                    seen.push(current.clone());
                }
            }
        }
        for k in &kernels {
            assert!(
                seen.iter().any(|s| s == k),
                "ptxas -v reported no registers for {k}:\n{log}"
            );
        }
    }
}
