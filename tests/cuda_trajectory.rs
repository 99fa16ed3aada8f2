//! gpu-check's timed trajectory in its emulated mode: the code path the GPU run takes
//! (tiling, the staged copies, the per-stage marks, the floors, the report), on the CUDA
//! kernels' host emulation with the CPU clock. An emulation: it proves the path and the
//! bytes, not a GPU's speed, and no speed is asserted.

mod devices;

use std::path::Path;

use lockstep::backend::cuda::trajectory::run_on;

const DATA: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/data/trajectory-gpt2"
);

#[test]
fn cuda_emulated_timed_trajectory_reports_every_stage_and_the_cpu_bytes() {
    if devices::device("cuda_emulated").is_none() {
        return;
    }
    if !Path::new(DATA)
        .join("gpt2_step000400_bf16.safetensors")
        .exists()
    {
        eprintln!("SKIP: {DATA} is absent (the shared trajectory is not checked out here)");
        return;
    }
    let (t, profile) = run_on(
        "cuda-emulated",
        Path::new(DATA),
        3_000_000,
        usize::MAX,
        true,
    )
    .unwrap();
    let table = t.table();
    println!("{table}");
    // The profile names every kernel the codec launched, each with launches and a time.
    let profile = profile.expect("a profile was asked for");
    println!("{profile}");
    for k in [
        "ls_residuals",
        "ls_histogram",
        "ls_enc_lanes",
        "ls_enc_tail",
        "ls_dec_lanes",
    ] {
        let row = profile
            .lines()
            .find(|l| l.split_whitespace().next() == Some(k))
            .unwrap_or_else(|| panic!("{k} missing from the profile:\n{profile}"));
        let launches: u64 = row.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(launches > 0, "{row}");
    }
    assert!(t.emulated && t.tensors > 0 && t.copies >= 2, "{t:?}");
    // Every blob was the CPU's bytes (run_on fails otherwise) and every decode the target.
    assert_eq!(t.cpu_checked, t.tensors);
    assert!(t.target_bytes <= 3_000_000 && t.coded_bytes < t.target_bytes);
    // Every stage was timed (the marks were recorded and read), and so were the floors'
    // bandwidths.
    for (what, s) in [
        ("h2d", t.h2d_s),
        ("residuals", t.residuals_s),
        ("histograms", t.histograms_s),
        ("encode", t.encode_s),
        ("decode", t.decode_s),
        ("decode kernels", t.decode_kernels_s),
        ("encode end to end", t.encode_e2e_s),
        ("decode end to end", t.decode_e2e_s),
        ("encode, all in flight", t.encode_inflight_s),
        ("decode, all in flight", t.decode_inflight_s),
        ("device bandwidth", t.device_bw),
        ("h2d bandwidth", t.h2d_bw),
    ] {
        assert!(s > 0.0, "{what} not measured: {t:?}");
    }
    // The pass with every tensor in flight ran on the rayon pool, with at most one engine per
    // operation in flight (run_on fails unless its blobs equal the ones coded alone and its
    // decodes the targets).
    assert!(t.inflight_threads >= 1, "{t:?}");
    assert!(
        (1..=t.inflight_threads.min(t.tensors)).contains(&t.engines),
        "{t:?}"
    );
    assert!(table.contains("encode end to end, all tensors in flight ("));
    assert!(table.contains("decode end to end, all tensors in flight"));
    // Stages nest in their end-to-end spans.
    assert!(t.decode_kernels_s <= t.decode_s && t.decode_s <= t.decode_e2e_s);
    assert!(t.residuals_s + t.histograms_s + t.encode_s <= t.encode_e2e_s);
    // Labelled as what it is, on the lines with speeds, and no target judged.
    assert!(table.lines().next().unwrap().contains("EMULATED"));
    assert!(table.contains("no target is judged") && !table.contains("targets:"));
}
