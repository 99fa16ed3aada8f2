//! gpu-check's timed trajectory (src/backend/cuda/trajectory.rs): encode and decode of the
//! bf16 trajectory in DIR tiled to about GB gigabytes, per stage and end to end, with the
//! floor of each stage and measured/floor.
//!
//! `cargo run --release --example cuda_trajectory -- [--dir DIR] [--gb 3] [--check-cpu N]
//! [--emulated]`: on the GPU with CUDA events; with `--emulated`, on the CUDA kernels' host
//! emulation with the CPU clock (a small size is wise: `--gb 0.001`), labelled EMULATED.
//! `--check-cpu N` compares the first N blobs with the CPU backend's bytes (default 4).
//! `--profile` also prints where the device's time went, per kernel (its marks around every
//! launch then weigh on the stage timings).

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let dir = flag("--dir").unwrap_or_else(|| "../shared/data/trajectory-gpt2".into());
    let gb: f64 = flag("--gb").map_or(3.0, |g| g.parse().expect("--gb takes a number"));
    let check: usize = flag("--check-cpu").map_or(4, |n| n.parse().expect("--check-cpu N"));
    let device = if args.iter().any(|a| a == "--emulated") {
        "cuda-emulated"
    } else {
        "cuda"
    };
    let t = std::time::Instant::now();
    match lockstep::backend::cuda::trajectory::run_on(
        device,
        std::path::Path::new(&dir),
        (gb * 1e9) as u64,
        check,
        args.iter().any(|a| a == "--profile"),
    ) {
        Ok((timing, profile)) => {
            print!("{}", timing.table());
            if let Some(p) = profile {
                print!("\n{p}");
            }
            println!(
                "(whole run, tiling included: {:.1} s wall)",
                t.elapsed().as_secs_f64()
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cuda_trajectory: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
