//! Trajectory archives: round trips on the shared trajectory and on small fixtures, dedup,
//! sharded and save_pretrained inputs, tensor-set changes, bad input.

mod common;

use std::path::Path;

use common::*;
use lockstep::archive::{self, Archive, PackOptions};

fn opts(k: u32) -> PackOptions {
    PackOptions {
        keyframe_interval: k,
        ..Default::default()
    }
}

fn pack_files(out: &Path, files: &[&Path], k: u32) -> Vec<archive::AddReport> {
    let srcs =
        archive::resolve_many(&files.iter().map(|p| p.to_path_buf()).collect::<Vec<_>>()).unwrap();
    archive::pack(out, &srcs, None, &opts(k), &|_| {}).unwrap()
}

fn append_file(ar: &Path, file: &Path, step: Option<u64>) -> archive::AddReport {
    archive::append(
        ar,
        &archive::resolve(file).unwrap(),
        step,
        &opts(8),
        &|_| {},
    )
    .unwrap()
}

fn assert_extracts(ar: &Path, step: u64, original: &Path, tmp: &Path) {
    let a = Archive::open(ar).unwrap();
    let out = tmp.join(format!("x{step}.safetensors"));
    a.extract(step, &out, &|_| {}).unwrap();
    assert!(
        std::fs::read(&out).unwrap() == std::fs::read(original).unwrap(),
        "step {step} differs"
    );
}

#[test]
fn shared_bf16_trajectory_pack_append_extract_verify() {
    let names = [200, 400, 600].map(|s| format!("gpt2_step000{s}_bf16.safetensors"));
    let Some(files) = names.iter().map(|n| shared(n)).collect::<Option<Vec<_>>>() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ar = dir.path().join("run.lstp");
    // K = 2: 200 is a keyframe, 400 a delta, 600 (appended) a keyframe again.
    let reports = pack_files(&ar, &[&files[0], &files[1]], 2);
    assert!(reports[0].keyframe && !reports[1].keyframe);
    assert!(reports[1].deltas > 0);
    let r = append_file(&ar, &files[2], None);
    assert_eq!(r.step, 600);
    assert!(r.keyframe && r.deltas == 0);
    let a = Archive::open(&ar).unwrap();
    assert_eq!(
        a.checkpoints.iter().map(|c| c.step).collect::<Vec<_>>(),
        [200, 400, 600]
    );
    let v = a.verify(&|_| {}).unwrap();
    assert!(v.damaged.is_empty(), "{:?}", v.damaged);
    assert_eq!(v.tensors, 3 * 52);
    for (step, f) in [200, 400, 600].iter().zip(&files) {
        assert_extracts(&ar, *step, f, dir.path());
    }
    // Compressed overall, deltas smaller than the keyframe.
    let s = a.stats();
    assert!(s.ratio() < 0.6, "ratio {}", s.ratio());
    assert!(s.checkpoints[1].stored_bytes < s.checkpoints[0].stored_bytes);
}

#[test]
fn shared_fp32_pair_roundtrips() {
    let (Some(a6), Some(a8)) = (
        shared("gpt2_step000600_fp32.safetensors"),
        shared("gpt2_step000800_fp32.safetensors"),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ar = dir.path().join("fp32.lstp");
    pack_files(&ar, &[&a6], 8);
    let r = append_file(&ar, &a8, None);
    assert!(r.deltas > 0 && r.stored_bytes < r.input_bytes * 3 / 4);
    assert_extracts(&ar, 800, &a8, dir.path());
    assert_extracts(&ar, 600, &a6, dir.path());
}

#[test]
fn append_writes_the_same_bytes_as_pack() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = (1..=3u64)
        .map(|s| {
            let p = dir.path().join(format!("step{}.safetensors", s * 100));
            write_ckpt(&p, &small_model(), s * 100);
            p
        })
        .collect();
    let packed = dir.path().join("packed.lstp");
    pack_files(
        &packed,
        &files.iter().map(|p| p.as_path()).collect::<Vec<_>>(),
        8,
    );
    let appended = dir.path().join("appended.lstp");
    pack_files(&appended, &[&files[0]], 8);
    append_file(&appended, &files[1], None);
    append_file(&appended, &files[2], None);
    assert!(std::fs::read(&packed).unwrap() == std::fs::read(&appended).unwrap());
    // The batch budget changes memory and speed, never the bytes.
    let tiny_batches = dir.path().join("tiny_batches.lstp");
    let srcs = archive::resolve_many(&files).unwrap();
    let o = PackOptions {
        batch_bytes: 1,
        ..opts(8)
    };
    archive::pack(&tiny_batches, &srcs, None, &o, &|_| {}).unwrap();
    assert!(std::fs::read(&packed).unwrap() == std::fs::read(&tiny_batches).unwrap());
    // Appending with the previous checkpoint's file as the reference source: same bytes; a
    // file that is not the last checkpoint is refused, the archive untouched.
    let with_prev = dir.path().join("with_prev.lstp");
    pack_files(
        &with_prev,
        &files[..2].iter().map(|p| p.as_path()).collect::<Vec<_>>(),
        8,
    );
    let before = std::fs::read(&with_prev).unwrap();
    let src = archive::resolve(&files[2]).unwrap();
    let wrong = archive::resolve(&files[0]).unwrap();
    let e = archive::append_with_previous(&with_prev, &src, Some(&wrong), None, &opts(8), &|_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not the archive's last checkpoint") && e.contains("different bytes"),
        "{e}"
    );
    assert!(std::fs::read(&with_prev).unwrap() == before);
    let prev = archive::resolve(&files[1]).unwrap();
    archive::append_with_previous(&with_prev, &src, Some(&prev), None, &opts(8), &|_| {}).unwrap();
    assert!(std::fs::read(&packed).unwrap() == std::fs::read(&with_prev).unwrap());
    // A run directory sorted by step gives the same archive too.
    let from_dir = dir.path().join("dir.lstp");
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    for f in files.iter().rev() {
        // The archive records each file's mode and time: copies keep the originals' times.
        let copy = run.join(f.file_name().unwrap());
        std::fs::copy(f, &copy).unwrap();
        let t = std::fs::metadata(f).unwrap().modified().unwrap();
        std::fs::File::options()
            .write(true)
            .open(&copy)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
    let srcs = archive::resolve_many(&[run]).unwrap();
    assert_eq!(
        srcs.iter().map(|s| s.step).collect::<Vec<_>>(),
        [Some(100), Some(200), Some(300)]
    );
    archive::pack(&from_dir, &srcs, None, &opts(8), &|_| {}).unwrap();
    assert!(std::fs::read(&packed).unwrap() == std::fs::read(&from_dir).unwrap());
}

#[test]
fn keyframes_bound_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = (0..7u64)
        .map(|s| {
            let p = dir.path().join(format!("step{s}.safetensors"));
            write_ckpt(&p, &small_model(), s * 10);
            p
        })
        .collect();
    let ar = dir.path().join("run.lstp");
    let reps = pack_files(
        &ar,
        &files.iter().map(|p| p.as_path()).collect::<Vec<_>>(),
        3,
    );
    let keys: Vec<bool> = reps.iter().map(|r| r.keyframe).collect();
    assert_eq!(keys, [true, false, false, true, false, false, true]);
    let a = Archive::open(&ar).unwrap();
    assert!(a.blobs.iter().all(|b| b.depth < 3));
    for (s, f) in files.iter().enumerate() {
        assert_extracts(&ar, s as u64, f, dir.path());
    }
}

#[test]
fn dedup_same_checkpoint_twice_and_tied_weights() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.safetensors");
    write_ckpt(&a, &small_model(), 5);
    let ar = dir.path().join("run.lstp");
    let srcs = archive::resolve_many(&[a.clone(), a.clone()]).unwrap();
    let reps = archive::pack(&ar, &srcs, Some(&[1, 2]), &opts(8), &|_| {}).unwrap();
    assert_eq!(reps[1].anchors + reps[1].deltas, 0);
    assert!(
        reps[1].stored_bytes < 1024,
        "a repeated checkpoint cost {} bytes",
        reps[1].stored_bytes
    );
    assert_extracts(&ar, 2, &a, dir.path());

    // Tied weights: two identical tensors in one file are stored once.
    let tied = dir.path().join("tied.safetensors");
    let w = weights("emb.weight", 64 * 96, 3, true);
    let views = vec![
        (
            "lm_head.weight",
            safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![64, 96], &w)
                .unwrap(),
        ),
        (
            "wte.weight",
            safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![64, 96], &w)
                .unwrap(),
        ),
    ];
    std::fs::write(&tied, safetensors::serialize(views, None).unwrap()).unwrap();
    let ar2 = dir.path().join("tied.lstp");
    let reps = pack_files(&ar2, &[&tied], 8);
    assert_eq!((reps[0].anchors, reps[0].reused), (1, 1));
    assert_extracts(&ar2, 0, &tied, dir.path());
}

#[test]
fn sharded_save_pretrained_directories_roundtrip() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    for s in [100u64, 200] {
        write_sharded(&run.join(format!("checkpoint-{s}")), s);
    }
    std::fs::create_dir_all(run.join("checkpoint-200/tokenizer")).unwrap();
    std::fs::write(run.join("checkpoint-200/tokenizer/vocab.txt"), b"a\nb\n").unwrap();
    let ar = dir.path().join("run.lstp");
    let srcs = archive::resolve_many(std::slice::from_ref(&run)).unwrap();
    assert_eq!(srcs.len(), 2);
    assert_eq!(srcs[1].files.len(), 6);
    let reps = archive::pack(&ar, &srcs, None, &opts(8), &|_| {}).unwrap();
    assert!(reps[1].deltas > 0);
    assert!(reps[1].reused >= 1, "config.json is stored once");
    let a = Archive::open(&ar).unwrap();
    for s in [100u64, 200] {
        let out = dir.path().join(format!("out{s}"));
        a.extract(s, &out, &|_| {}).unwrap();
        assert!(
            tree(&out) == tree(&run.join(format!("checkpoint-{s}"))),
            "step {s}"
        );
    }
    // The index file alone names the checkpoint too; a missing shard is a clear error.
    let one = archive::resolve(&run.join("checkpoint-100/model.safetensors.index.json")).unwrap();
    assert_eq!(one.files.len(), 5);
    std::fs::remove_file(run.join("checkpoint-100/model-00002-of-00002.safetensors")).unwrap();
    let e = archive::resolve(&run.join("checkpoint-100"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("model-00002-of-00002.safetensors") && e.contains("missing"),
        "{e}"
    );
}

#[test]
fn tensor_set_changes_between_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("step1.safetensors");
    write_ckpt(&a, &small_model(), 1);
    let mut changed = small_model();
    changed.retain(|(n, _, _)| *n != "h.0.ln.bias"); // removed
    changed.push(("h.2.new.weight", vec![32, 32], true)); // added
    changed[1].1 = vec![48, 192]; // same name, new shape
    changed[4].2 = false; // same name, new dtype
    let b = dir.path().join("step2.safetensors");
    write_ckpt(&b, &changed, 2);
    let ar = dir.path().join("run.lstp");
    pack_files(&ar, &[&a], 8);
    let r = append_file(&ar, &b, None);
    // emb, ln.weight and head.scale can be deltas; the new, reshaped and retyped ones cannot.
    assert!(r.anchors >= 3, "{r:?}");
    assert!(r.deltas >= 1, "{r:?}");
    assert_extracts(&ar, 1, &a, dir.path());
    assert_extracts(&ar, 2, &b, dir.path());
    assert!(Archive::open(&ar)
        .unwrap()
        .verify(&|_| {})
        .unwrap()
        .damaged
        .is_empty());
}

#[test]
fn bad_input_gets_clear_errors_and_leaves_the_archive_alone() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("step1.safetensors");
    write_ckpt(&a, &small_model(), 1);
    let ar = dir.path().join("run.lstp");
    pack_files(&ar, &[&a], 8);
    let before = std::fs::read(&ar).unwrap();

    // Not a checkpoint.
    let txt = dir.path().join("notes.txt");
    std::fs::write(&txt, b"hello").unwrap();
    assert!(archive::resolve(&txt)
        .unwrap_err()
        .to_string()
        .contains("not a checkpoint"));
    // A broken safetensors file.
    let broken = dir.path().join("step9.safetensors");
    std::fs::write(&broken, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}").unwrap();
    let src = archive::resolve(&broken).unwrap();
    let e = archive::append(&ar, &src, None, &opts(8), &|_| {}).unwrap_err();
    assert!(e.to_string().contains("safetensors"), "{e}");
    // A step that is not after the last one.
    let e = archive::append(
        &ar,
        &archive::resolve(&a).unwrap(),
        Some(1),
        &opts(8),
        &|_| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("not after"), "{e}");
    assert!(std::fs::read(&ar).unwrap() == before, "archive changed");
    // A file that vanishes after the blobs before it were written: error, archive unchanged.
    let d2 = dir.path().join("checkpoint-2");
    std::fs::create_dir(&d2).unwrap();
    write_ckpt(&d2.join("model.safetensors"), &small_model(), 2);
    std::fs::write(d2.join("zz_notes.txt"), b"notes").unwrap();
    let src = archive::resolve(&d2).unwrap();
    std::fs::remove_file(d2.join("zz_notes.txt")).unwrap();
    let e = archive::append(&ar, &src, None, &opts(8), &|_| {}).unwrap_err();
    assert!(e.to_string().contains("zz_notes.txt"), "{e}");
    assert!(std::fs::read(&ar).unwrap() == before, "archive changed");
    // Out-of-order checkpoints and duplicate steps in a run directory: errors before any work.
    let b = dir.path().join("step2.safetensors");
    write_ckpt(&b, &small_model(), 2);
    let srcs = archive::resolve_many(&[b.clone(), a.clone()]).unwrap();
    let out = dir.path().join("order.lstp");
    let e = archive::pack(&out, &srcs, None, &opts(8), &|_| {}).unwrap_err();
    assert!(e.to_string().contains("does not come after"), "{e}");
    assert!(!out.exists());
    let run = dir.path().join("dups");
    std::fs::create_dir(&run).unwrap();
    std::fs::copy(&a, run.join("ckpt_step5_a.safetensors")).unwrap();
    std::fs::copy(&a, run.join("ckpt_step5_b.safetensors")).unwrap();
    let e = archive::resolve_many(&[run]).unwrap_err().to_string();
    assert!(e.contains("both step 5"), "{e}");
    // pack refuses to overwrite without --force.
    let e = archive::pack(
        &ar,
        &[archive::resolve(&a).unwrap()],
        None,
        &opts(8),
        &|_| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("exists"), "{e}");
    // No such step.
    let e = Archive::open(&ar)
        .unwrap()
        .extract(7, &dir.path().join("o.safetensors"), &|_| {})
        .unwrap_err();
    assert!(e.to_string().contains("no checkpoint at step 7"), "{e}");
    assert!(!dir.path().join("o.safetensors").exists());

    // Foreign files and truncations: errors, never panics.
    let e = Archive::open(&a).err().unwrap().to_string();
    assert!(e.contains("not a lockstep trajectory archive"), "{e}");
    let e = Archive::open(dir.path().join("missing.lstp"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("missing.lstp"), "{e}");
    for cut in [0, 5, 16, 100, before.len() / 2, before.len() - 1] {
        let t = dir.path().join(format!("cut{cut}.lstp"));
        std::fs::write(&t, &before[..cut]).unwrap();
        let e = Archive::open(&t)
            .err()
            .expect("truncated archive opened")
            .to_string();
        assert!(e.contains("archive"), "{cut}: {e}");
    }
}

#[test]
fn damaged_blobs_are_reported_per_tensor_and_verify_keeps_going() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = (1..=3u64)
        .map(|s| {
            let p = dir.path().join(format!("step{s}.safetensors"));
            write_ckpt(&p, &small_model(), s);
            p
        })
        .collect();
    let ar = dir.path().join("run.lstp");
    pack_files(
        &ar,
        &files.iter().map(|p| p.as_path()).collect::<Vec<_>>(),
        8,
    );
    // Flip a byte inside the blob of h.1.mlp.weight at step 2.
    let a = Archive::open(&ar).unwrap();
    let t = a.checkpoints[1]
        .tensors()
        .find(|t| t.name == "h.1.mlp.weight")
        .unwrap();
    let b = &a.blobs[t.blob as usize];
    assert_eq!(b.kind, archive::BlobKind::Delta);
    let mut bytes = std::fs::read(&ar).unwrap();
    bytes[(b.offset + b.len / 2) as usize] ^= 0x40;
    drop(a);
    std::fs::write(&ar, &bytes).unwrap();

    let a = Archive::open(&ar).unwrap();
    let v = a.verify(&|_| {}).unwrap();
    let damaged: Vec<(u64, Option<String>)> = v
        .damaged
        .iter()
        .map(|d| (d.step, d.tensor.clone()))
        .collect();
    // Step 2's tensor is damaged, and step 3's delta on top of it; step 1 and the other
    // tensors are fine.
    assert!(
        damaged.contains(&(2, Some("h.1.mlp.weight".into()))),
        "{damaged:?}"
    );
    assert!(
        damaged
            .iter()
            .all(|(s, t)| *s >= 2 && t.as_deref() == Some("h.1.mlp.weight")),
        "{damaged:?}"
    );
    assert_eq!(v.checkpoints, 3);
    let out = dir.path().join("o.safetensors");
    assert!(a.extract(2, &out, &|_| {}).is_err());
    assert!(!out.exists(), "no half-written output");
    assert_extracts(&ar, 1, &files[0], dir.path());
}

#[test]
fn cli_pack_list_stats_extract_verify_json() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = (1..=2u64)
        .map(|s| {
            let p = dir.path().join(format!("step{s}.safetensors"));
            write_ckpt(&p, &small_model(), s);
            p
        })
        .collect();
    let ar = dir.path().join("run.lstp");
    let run = |args: &[&str]| {
        let o = std::process::Command::new(bin())
            .args(args)
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (ok, out, err) = run(&[
        "pack",
        files[0].to_str().unwrap(),
        "-o",
        ar.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["checkpoints"][0]["step"], 1);
    let (ok, _, err) = run(&["append", ar.to_str().unwrap(), files[1].to_str().unwrap()]);
    assert!(ok, "{err}");
    let (ok, out, _) = run(&["list", ar.to_str().unwrap(), "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["checkpoints"].as_array().unwrap().len(), 2);
    let (ok, out, _) = run(&["stats", ar.to_str().unwrap(), "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["ratio"].as_f64().unwrap() < 1.0);
    let o = dir.path().join("o.safetensors");
    let (ok, _, err) = run(&[
        "extract",
        ar.to_str().unwrap(),
        "--step",
        "2",
        "-o",
        o.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(std::fs::read(&o).unwrap() == std::fs::read(&files[1]).unwrap());
    let (ok, out, _) = run(&["verify", ar.to_str().unwrap(), "--json"]);
    assert!(ok);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["ok"],
        true
    );
    // Errors: non-zero exit, a message naming the problem.
    let (ok, _, err) = run(&["list", files[0].to_str().unwrap()]);
    assert!(
        !ok && err.contains("not a lockstep trajectory archive"),
        "{err}"
    );
    let (ok, _, err) = run(&[
        "extract",
        ar.to_str().unwrap(),
        "--step",
        "9",
        "-o",
        o.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("no checkpoint at step 9"), "{err}");
}

#[test]
fn cli_fast_layout_pack_append_extract() {
    // Real deltas, so the layout choice shows in the sizes.
    let names = [400, 600].map(|s| format!("gpt2_step000{s}_bf16.safetensors"));
    let Some(files) = names.iter().map(|n| shared(n)).collect::<Option<Vec<_>>>() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let o = std::process::Command::new(bin())
            .args(args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let (f0, f1) = (files[0].to_str().unwrap(), files[1].to_str().unwrap());
    let fast = dir.path().join("fast.lstp");
    let fast_s = fast.to_str().unwrap();
    run(&["pack", f0, "-o", fast_s, "--fast"]);
    run(&["append", fast_s, f1, "--fast"]);
    let small = dir.path().join("default.lstp");
    run(&["pack", f0, f1, "-o", small.to_str().unwrap()]);
    // Same keyframe; the fast delta is larger, by a few percent of the delta.
    let (a_fast, a_small) = (
        Archive::open(&fast).unwrap(),
        Archive::open(&small).unwrap(),
    );
    let (s_fast, s_small) = (a_fast.stats(), a_small.stats());
    assert_eq!(
        s_fast.checkpoints[0].stored_bytes,
        s_small.checkpoints[0].stored_bytes
    );
    let (d_fast, d_small) = (
        s_fast.checkpoints[1].stored_bytes as f64,
        s_small.checkpoints[1].stored_bytes as f64,
    );
    assert!(
        d_fast > d_small && d_fast < 1.2 * d_small,
        "{d_fast} vs {d_small}"
    );
    assert!(a_fast.verify(&|_| {}).unwrap().damaged.is_empty());
    assert_extracts(&fast, 600, &files[1], dir.path());
    // --fast and an explicit --layout are one choice, not two.
    let o = std::process::Command::new(bin())
        .args([
            "delta",
            "encode",
            "--reference",
            f0,
            "--target",
            f1,
            "--output",
        ])
        .arg(dir.path().join("x.lsd"))
        .args(["--fast", "--layout", "paper"])
        .output()
        .unwrap();
    assert!(!o.status.success());
}
