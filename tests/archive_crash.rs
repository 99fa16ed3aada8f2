//! Crash safety: a process killed at any point of an append or pack leaves the previous
//! archive fully readable, and the next append recovers. Plus random damage never panics.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use lockstep::archive::{self, Archive, PackOptions, Tail};

fn setup(dir: &Path, specs: &[Spec]) -> (std::path::PathBuf, std::path::PathBuf, Vec<u8>) {
    let a = dir.join("step1.safetensors");
    let b = dir.join("step2.safetensors");
    write_ckpt(&a, specs, 1);
    write_ckpt(&b, specs, 2);
    let ar = dir.join("base.lstp");
    let src = archive::resolve(&a).unwrap();
    archive::pack(&ar, &[src], None, &PackOptions::default(), &|_| {}).unwrap();
    let base = std::fs::read(&ar).unwrap();
    (ar, b, base)
}

fn append_cli(ar: &Path, ckpt: &Path, abort_after: Option<u64>) -> bool {
    let mut c = Command::new(bin());
    c.args(["append", ar.to_str().unwrap(), ckpt.to_str().unwrap()]);
    if let Some(n) = abort_after {
        c.env(archive::writer::ABORT_ENV, n.to_string());
    }
    c.output().unwrap().status.success()
}

fn assert_readable(ar: &Path, min: usize, max: usize) -> usize {
    let a = Archive::open(ar).unwrap();
    let n = a.checkpoints.len();
    assert!((min..=max).contains(&n), "{n} checkpoints");
    let v = a.verify(&|_| {}).unwrap();
    assert!(v.damaged.is_empty(), "{:?}", v.damaged);
    n
}

fn cli(args: &[&str]) -> std::process::Output {
    Command::new(bin()).args(args).output().unwrap()
}

#[test]
fn append_killed_at_any_byte_leaves_the_archive_readable_and_recoverable() {
    let dir = tempfile::tempdir().unwrap();
    let (_, b, base) = setup(dir.path(), &small_model());
    // The bytes a complete append writes.
    let good = dir.path().join("good.lstp");
    std::fs::write(&good, &base).unwrap();
    assert!(append_cli(&good, &b, None));
    let good_bytes = std::fs::read(&good).unwrap();
    let total = (good_bytes.len() - base.len()) as u64;
    // Inside the blobs, inside the commit record, right before / inside / at the end of the footer.
    for n in [
        0,
        1,
        17,
        total / 3,
        total / 2,
        total - 41,
        total - 40,
        total - 20,
        total - 1,
    ] {
        let t = dir.path().join(format!("crash{n}.lstp"));
        std::fs::write(&t, &base).unwrap();
        assert!(
            !append_cli(&t, &b, Some(n)),
            "abort hook did not fire at {n}"
        );
        assert_eq!(std::fs::metadata(&t).unwrap().len(), base.len() as u64 + n);
        assert_readable(&t, 1, 1);
        let a = Archive::open(&t).unwrap();
        assert_eq!(a.ignored_tail(), n);
        let ts = t.to_str().unwrap();
        // `verify` passes only an archive that ends with its last footer.
        let v = cli(&["verify", ts]);
        assert_eq!(
            v.status.code(),
            Some(if n == 0 { 0 } else { 4 }),
            "verify at {n}"
        );
        if n >= total - 40 {
            // The commit record is complete: the checkpoint is all there, only its footer is
            // missing. Append refuses to cut it off; repair writes the footer.
            assert!(
                matches!(a.tail(), Tail::CommitWithoutFooter { step: 2, .. }),
                "{n}"
            );
            let before = std::fs::read(&t).unwrap();
            let r = cli(&["append", ts, b.to_str().unwrap()]);
            assert_eq!(
                r.status.code(),
                Some(4),
                "append onto a footerless commit ({n})"
            );
            assert!(String::from_utf8_lossy(&r.stderr).contains("lockstep repair"));
            assert!(
                std::fs::read(&t).unwrap() == before,
                "append changed the file ({n})"
            );
            let r = cli(&["repair", ts]);
            assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        } else {
            if n > 0 {
                assert_eq!(a.tail(), Tail::Unfinished, "{n}");
            }
            // The next append cuts the remains off and writes exactly what a clean one writes.
            assert!(append_cli(&t, &b, None), "append after a crash at {n}");
        }
        assert!(
            std::fs::read(&t).unwrap() == good_bytes,
            "recovered archive differs ({n})"
        );
    }
}

#[test]
fn repair_removes_an_unfinished_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (_, b, base) = setup(dir.path(), &small_model());
    let t = dir.path().join("cut.lstp");
    std::fs::write(&t, &base).unwrap();
    assert!(!append_cli(&t, &b, Some(100)));
    let ts = t.to_str().unwrap();
    let r = cli(&["repair", ts, "--json"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    // stdout is one JSON document: verify's, after the repair.
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["repair"]["outcome"], "tail_removed");
    assert!(v["repair"]["message"]
        .as_str()
        .unwrap()
        .contains("removed 100 B"));
    assert!(std::fs::read(&t).unwrap() == base);
}

#[test]
fn append_sigkilled_at_intervals_leaves_a_readable_archive() {
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = vec![
        ("a.weight", vec![384, 512], true),
        ("b.weight", vec![384, 512], true),
        ("c.weight", vec![512, 256], false),
    ];
    let (_, b, base) = setup(dir.path(), &specs);
    let mut outcomes = Vec::new();
    for (i, ms) in [0u64, 5, 50, 200, 800, 3000].iter().enumerate() {
        let t = dir.path().join(format!("kill{i}.lstp"));
        std::fs::write(&t, &base).unwrap();
        let mut child = Command::new(bin())
            .args(["append", t.to_str().unwrap(), b.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(*ms));
        let _ = child.kill(); // SIGKILL; may come after it finished
        let _ = child.wait();
        // Whenever it died, the archive holds the old state or the new one, never less.
        let n = assert_readable(&t, 1, 2);
        outcomes.push(n);
        if n == 1 {
            // Killed between its commit and its footer, the append is finished by repair.
            if !append_cli(&t, &b, None) {
                assert!(cli(&["repair", t.to_str().unwrap()]).status.success());
            }
            assert_readable(&t, 2, 2);
        }
    }
    eprintln!("checkpoints after each kill: {outcomes:?}");
}

#[test]
fn pack_killed_leaves_no_output_and_keeps_an_existing_archive() {
    let dir = tempfile::tempdir().unwrap();
    let (ar, b, base) = setup(dir.path(), &small_model());
    for n in [0u64, 100, 5000] {
        let out = dir.path().join("new.lstp");
        let st = Command::new(bin())
            .args(["pack", b.to_str().unwrap(), "-o", out.to_str().unwrap()])
            .env(archive::writer::ABORT_ENV, n.to_string())
            .output()
            .unwrap();
        assert!(!st.status.success());
        assert!(!out.exists());
        // --force over an existing archive: it stays as it was until the new one is complete.
        let st = Command::new(bin())
            .args([
                "pack",
                b.to_str().unwrap(),
                "-o",
                ar.to_str().unwrap(),
                "--force",
            ])
            .env(archive::writer::ABORT_ENV, n.to_string())
            .output()
            .unwrap();
        assert!(!st.status.success());
        assert!(std::fs::read(&ar).unwrap() == base);
    }
}

#[test]
fn a_second_writer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (ar, b, base) = setup(dir.path(), &small_model());
    let held = std::fs::OpenOptions::new().write(true).open(&ar).unwrap();
    held.lock().unwrap();
    let e = archive::append(
        &ar,
        &archive::resolve(&b).unwrap(),
        None,
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("another process"), "{e}");
    drop(held);
    assert!(std::fs::read(&ar).unwrap() == base);
}

#[test]
fn random_damage_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let (ar, b, _) = setup(dir.path(), &small_model());
    assert!(append_cli(&ar, &b, None));
    let good = std::fs::read(&ar).unwrap();
    let mut seed = 99u64;
    let t = dir.path().join("fuzz.lstp");
    let mut outcomes = [0usize; 3];
    for i in 0..60 {
        let mut bytes = good.clone();
        if i % 3 == 0 {
            bytes.truncate((lcg(&mut seed) % good.len() as u64) as usize);
        } else {
            for _ in 0..1 + i % 4 {
                let k = (lcg(&mut seed) % bytes.len() as u64) as usize;
                bytes[k] ^= 1 << (lcg(&mut seed) % 8);
            }
        }
        std::fs::write(&t, &bytes).unwrap();
        match Archive::open(&t) {
            Err(e) => {
                assert!(!e.to_string().is_empty());
                outcomes[0] += 1;
            }
            Ok(a) => {
                let v = a.verify(&|_| {}).unwrap();
                outcomes[if v.ok() { 1 } else { 2 }] += 1;
                for c in &a.checkpoints {
                    let _ = a.extract(c.step, &dir.path().join("fuzz-out"), &|_| {});
                }
            }
        }
    }
    eprintln!("open errors / clean / damage reported: {outcomes:?}");
    assert_eq!(outcomes.iter().sum::<usize>(), 60);
}

#[test]
fn a_damaged_last_footer_is_reported_append_keeps_the_data_and_repair_restores_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_, b, base) = setup(dir.path(), &small_model());
    let good = dir.path().join("good.lstp");
    std::fs::write(&good, &base).unwrap();
    assert!(append_cli(&good, &b, None));
    let good_bytes = std::fs::read(&good).unwrap();
    let n = good_bytes.len();
    // One flipped bit in the start marker, the commit offset, the CRC, the end marker.
    for at in [n - 40, n - 30, n - 6, n - 1] {
        let mut bytes = good_bytes.clone();
        bytes[at] ^= 0x10;
        let t = dir.path().join(format!("flip{at}.lstp"));
        std::fs::write(&t, &bytes).unwrap();
        let a = Archive::open(&t).unwrap();
        assert_eq!(a.checkpoints.len(), 1, "earlier checkpoints stay readable");
        assert!(a.damaged_last_footer(), "flip at {}", n - at);
        assert_eq!(a.verify(&|_| {}).unwrap().tail, Tail::DamagedFooter);
        let v = Command::new(bin())
            .args(["verify", t.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!v.status.success());
        let err = String::from_utf8_lossy(&v.stderr);
        assert!(err.contains("last footer is damaged"), "{err}");
        // Appending would cut the damaged segment off: refused, the file untouched.
        assert!(!append_cli(&t, &b, None));
        assert!(std::fs::read(&t).unwrap() == bytes);
        // `repair` rebuilds the footer from the commit record: the original bytes again.
        let r = Command::new(bin())
            .args(["repair", t.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        assert!(
            std::fs::read(&t).unwrap() == good_bytes,
            "flip at {}",
            n - at
        );
    }
    // On an intact archive it changes nothing.
    let r = Command::new(bin())
        .args(["repair", good.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("nothing to repair"));
    assert!(std::fs::read(&good).unwrap() == good_bytes);
    // An interrupted append is still what it was: ignored remains, no damage reported.
    let t = dir.path().join("torn.lstp");
    std::fs::write(&t, &good_bytes[..n - 1]).unwrap();
    let a = Archive::open(&t).unwrap();
    assert!(!a.damaged_last_footer());
    assert!(matches!(a.tail(), Tail::CommitWithoutFooter { .. }));
}
