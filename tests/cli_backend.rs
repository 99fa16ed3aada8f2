//! The backend-facing commands as a user runs them: `backends`, `parity`, `--backend`.

use std::process::Command;

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/demo");

fn lockstep(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn backends_lists_cpu_cuda_and_the_cuda_emulation() {
    let (ok, out, _) = lockstep(&["backends"]);
    assert!(ok);
    assert!(out.contains("cpu ") && out.contains("auto picks:"), "{out}");
    assert!(out.contains("\ncuda "), "{out}");
    if !lockstep::backend::cuda::driver::driver_present() {
        assert!(out.contains("no CUDA driver"), "{out}");
    }
    assert!(
        out.contains("host emulation on the CPU (not a GPU)"),
        "{out}"
    );
}

#[test]
fn asking_for_cuda_without_a_driver_is_a_clear_error_not_a_fallback() {
    if lockstep::backend::cuda::driver::driver_present() {
        eprintln!("SKIP: this machine has a CUDA driver");
        return;
    }
    let (ok, _, err) = lockstep(&["--backend", "cuda", "demo"]);
    assert!(!ok);
    assert!(err.contains("no CUDA driver"), "{err}");
}

#[test]
fn parity_agrees_on_the_demo_trajectory() {
    let a = format!("{DEMO}/step0600_blocks_bf16.safetensors");
    let b = format!("{DEMO}/step0800_blocks_bf16.safetensors");
    let (ok, out, err) = lockstep(&["parity", &a, &b]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("all backends agree on every stage"), "{out}");
    assert!(out.contains("reference") && out.contains("cpu"), "{out}");
}

#[test]
fn parity_needs_two_checkpoints() {
    let a = format!("{DEMO}/step0600_blocks_bf16.safetensors");
    let (ok, _, _) = lockstep(&["parity", &a]);
    assert!(!ok);
}

#[test]
fn parity_runs_the_text_codec_on_every_cpu_level() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("notes.txt");
    std::fs::write(
        &t,
        "Parity for text: the same tokens, model intervals, stream and decode under every \
         CPU instruction-set level this CPU has, so a file compressed here decodes anywhere.\n",
    )
    .unwrap();
    let (ok, out, err) = lockstep(&["parity", t.to_str().unwrap()]);
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("text codec") && out.contains("cpu-portable"),
        "{out}"
    );
    assert!(out.contains("all backends agree on every stage"), "{out}");
}
