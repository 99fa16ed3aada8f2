//! The backend-facing commands as a user runs them: `backends`, `parity`, `--backend`.

use std::process::Command;

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/demo");

fn lockstep(args: &[&str]) -> (bool, String, String) {
    lockstep_with(args, &[])
}

/// [`lockstep`] with these environment variables set too.
fn lockstep_with(args: &[&str], envs: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lockstep"))
        .args(args)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .envs(envs.iter().copied())
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

/// `--cpu-level` at every level this CPU runs: the CPU pinned to it (`-v` says so), and the
/// same bytes as the best level, for a checkpoint delta and a text.
#[test]
fn cpu_level_pins_the_cpu_and_keeps_the_bytes() {
    use lockstep::backend::Isa;
    let dir = tempfile::tempdir().unwrap();
    let a = format!("{DEMO}/step0600_blocks_bf16.safetensors");
    let b = format!("{DEMO}/step0800_blocks_bf16.safetensors");
    let t = dir.path().join("notes.txt");
    std::fs::write(
        &t,
        "Pinned levels: one file, every instruction-set level, the same bytes.\n",
    )
    .unwrap();
    let run = |level: Option<Isa>, tag: &str| {
        let (lsd, lst) = (
            dir.path().join(format!("{tag}.lsd")),
            dir.path().join(format!("{tag}.lst")),
        );
        let mut pin = vec!["-v"];
        if let Some(isa) = level {
            pin.extend(["--cpu-level", isa.tag()]);
        }
        let delta = [
            &pin[..],
            &["delta", "encode", "--reference", &a, "--target", &b, "-o"],
        ]
        .concat();
        let (ok, out, err) = lockstep(&[&delta[..], &[lsd.to_str().unwrap()]].concat());
        assert!(ok, "{tag}: {out}\n{err}");
        if let Some(isa) = level {
            assert!(err.contains(&format!("cpu-{}", isa.tag())), "{tag}: {err}");
        }
        let text = [&pin[..], &["text", "compress", t.to_str().unwrap(), "-o"]].concat();
        let (ok, out, err) = lockstep(&[&text[..], &[lst.to_str().unwrap()]].concat());
        assert!(ok, "{tag}: {out}\n{err}");
        if let Some(isa) = level {
            assert!(
                err.contains(&format!("language model on: cpu-{}", isa.tag())),
                "{tag}: {err}"
            );
        }
        (std::fs::read(lsd).unwrap(), std::fs::read(lst).unwrap())
    };
    let best = run(None, "best");
    let levels: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.available()).collect();
    assert!(levels.contains(&Isa::Portable));
    for isa in levels {
        assert!(
            run(Some(isa), isa.tag()) == best,
            "{} gave other bytes",
            isa.name()
        );
    }
}

/// A level this CPU lacks, or `--cpu-level` beside a GPU backend, is refused with a reason
/// (never a silent run at another level or on another device).
#[test]
fn cpu_level_this_cpu_lacks_or_beside_a_gpu_backend_is_refused() {
    use lockstep::backend::Isa;
    if let Some(missing) = Isa::ALL.into_iter().find(|i| !i.available()) {
        let (ok, _, err) = lockstep(&["--cpu-level", missing.tag(), "demo"]);
        assert!(!ok);
        assert!(
            err.contains(&format!("--cpu-level {}", missing.tag())) && err.contains("does not run"),
            "{err}"
        );
    }
    for other in ["wgpu", "cuda", "reference"] {
        let (ok, _, err) = lockstep(&["--cpu-level", "portable", "--backend", other, "demo"]);
        assert!(!ok, "{other}");
        assert!(
            err.contains("cannot be combined with --backend"),
            "{other}: {err}"
        );
    }
}

/// `-T N` sizes the CPU's thread pool (the device line says so, whatever RAYON_NUM_THREADS
/// says) and never changes the bytes written; `-T 0` is one thread per logical CPU.
#[test]
fn threads_option_sizes_the_pool_and_keeps_the_bytes() {
    let device_line = |args: &[&str]| {
        let args = [args, &["backends"]].concat();
        let (ok, out, err) = lockstep_with(&args, &[("RAYON_NUM_THREADS", "5")]);
        assert!(ok, "{args:?}: {err}");
        out.lines()
            .find(|l| l.starts_with("cpu "))
            .unwrap_or_else(|| panic!("{out}"))
            .to_string()
    };
    assert!(device_line(&["-T", "1"]).contains("CPU, 1 thread, "));
    assert!(device_line(&["--threads", "3"]).contains("CPU, 3 threads, "));
    assert!(device_line(&[]).contains("CPU, 5 threads, "));
    let cores = std::thread::available_parallelism().unwrap().get();
    let phrase = lockstep::backend::threads_phrase(cores);
    assert!(device_line(&["-T", "0"]).contains(&format!("CPU, {phrase}, ")));
    // Past the bound: a usage error before any thread starts.
    let (ok, _, err) = lockstep(&["-T", "70000", "backends"]);
    assert!(!ok && err.contains("0..=1024"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let a = format!("{DEMO}/step0600_blocks_bf16.safetensors");
    let b = format!("{DEMO}/step0800_blocks_bf16.safetensors");
    let t = dir.path().join("notes.txt");
    std::fs::write(&t, "One thread or three: the same bytes.\n").unwrap();
    let run = |threads: &str| {
        let (lsd, lst) = (
            dir.path().join(format!("{threads}.lsd")),
            dir.path().join(format!("{threads}.lst")),
        );
        let (ok, out, err) = lockstep(&[
            "-T",
            threads,
            "delta",
            "encode",
            "--reference",
            &a,
            "--target",
            &b,
            "-o",
            lsd.to_str().unwrap(),
        ]);
        assert!(ok, "-T {threads}: {out}\n{err}");
        let (ok, out, err) = lockstep(&[
            "-T",
            threads,
            "text",
            "compress",
            t.to_str().unwrap(),
            "-o",
            lst.to_str().unwrap(),
        ]);
        assert!(ok, "-T {threads}: {out}\n{err}");
        (std::fs::read(lsd).unwrap(), std::fs::read(lst).unwrap())
    };
    assert!(run("1") == run("3"), "-T 1 and -T 3 wrote other bytes");
}
