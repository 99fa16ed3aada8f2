//! Every writer under failure (issue 16): a full disk (`ulimit -f 0`: every write that grows a
//! file fails with EFBIG, as on a full file system), a read-only output directory, an input
//! deleted while it is read, SIGKILL at several points, two writers racing. Each time: a
//! clear error naming the file, a non-zero exit, no half-written output, no temporary file
//! left, an existing archive byte-identical and verifiable.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;
use lockstep::archive::{self, Archive, PackOptions};

fn run(args: &[&str]) -> Output {
    Command::new(bin()).args(args).output().unwrap()
}

/// Run the binary with a file-size limit of 0 blocks and SIGXFSZ ignored, so every write that
/// would grow a file fails with EFBIG the way writes to a full disk fail with ENOSPC.
fn run_disk_full(args: &[&str]) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg("ulimit -f 0 && trap '' XFSZ && exec \"$0\" \"$@\"")
        .arg(bin())
        .args(args)
        .output()
        .unwrap()
}

fn temps_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains(".tmp-"))
        .collect()
}

struct Fixture {
    dir: tempfile::TempDir,
    a: PathBuf,
    b: PathBuf,
    archive: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("step1.safetensors");
    let b = dir.path().join("step2.safetensors");
    write_ckpt(&a, &small_model(), 1);
    write_ckpt(&b, &small_model(), 2);
    let archive = dir.path().join("run.lstp");
    archive::pack(
        &archive,
        &[archive::resolve(&a).unwrap()],
        None,
        &PackOptions::default(),
        &|_| {},
    )
    .unwrap();
    Fixture { dir, a, b, archive }
}

fn assert_failed_cleanly(what: &str, o: &Output, dir: &Path) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{what}: {err}");
    assert!(
        err.lines().any(|l| l.starts_with("error: ")),
        "{what}: {err}"
    );
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(temps_in(dir).is_empty(), "{what} left {:?}", temps_in(dir));
}

#[test]
fn a_full_disk_leaves_no_output_no_temp_file_and_the_archive_as_it_was() {
    let f = fixture();
    let d = f.dir.path();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let (a, b, ar) = (s(&f.a), s(&f.b), s(&f.archive));
    let lsd = d.join("d.lsd");
    // A delta file to decode, written while the disk had room.
    assert!(run(&[
        "delta",
        "encode",
        "--reference",
        &a,
        "--target",
        &b,
        "-o",
        &s(&lsd)
    ])
    .status
    .success());
    let text = d.join("t.txt");
    std::fs::write(&text, b"A short paragraph of text for the codec.").unwrap();
    let before = std::fs::read(&f.archive).unwrap();
    let out = |n: &str| s(&d.join(n));
    let cases: Vec<(&str, Vec<String>, PathBuf)> = vec![
        (
            "delta encode",
            vec![
                "delta".into(),
                "encode".into(),
                "--reference".into(),
                a.clone(),
                "--target".into(),
                b.clone(),
                "-o".into(),
                out("e.lsd"),
            ],
            d.join("e.lsd"),
        ),
        (
            "delta decode",
            vec![
                "delta".into(),
                "decode".into(),
                "--reference".into(),
                a.clone(),
                s(&lsd),
                "-o".into(),
                out("x.safetensors"),
            ],
            d.join("x.safetensors"),
        ),
        (
            "pack",
            vec![
                "pack".into(),
                a.clone(),
                b.clone(),
                "-o".into(),
                out("new.lstp"),
            ],
            d.join("new.lstp"),
        ),
        (
            "extract",
            vec![
                "extract".into(),
                ar.clone(),
                "-o".into(),
                out("r.safetensors"),
            ],
            d.join("r.safetensors"),
        ),
        (
            "text compress",
            vec![
                "text".into(),
                "compress".into(),
                s(&text),
                "-o".into(),
                out("t.lst"),
            ],
            d.join("t.lst"),
        ),
    ];
    for (what, args, output) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = run_disk_full(&args);
        assert_failed_cleanly(what, &o, d);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("File too large"), "{what}: {err}");
        assert!(!output.exists(), "{what} left {}", output.display());
    }
    // pack --force over an existing archive: the old one stays until the new one is complete.
    let o = run_disk_full(&["pack", &b, "-o", &ar, "--force"]);
    assert_failed_cleanly("pack --force", &o, d);
    assert!(std::fs::read(&f.archive).unwrap() == before);
    // append: nothing it wrote stays; the archive is byte-identical and verifies.
    let o = run_disk_full(&["append", &ar, &b]);
    assert_failed_cleanly("append", &o, d);
    assert!(std::fs::read(&f.archive).unwrap() == before);
    assert!(Archive::open(&f.archive)
        .unwrap()
        .verify(&|_| {})
        .unwrap()
        .ok());
    // With room again, everything works.
    assert!(run(&["append", &ar, &b]).status.success());
}

#[test]
fn repair_on_a_full_disk_keeps_the_archive_readable() {
    let f = fixture();
    let d = f.dir.path();
    let ar = f.archive.to_str().unwrap();
    // An append killed between its commit record and its footer.
    let base = std::fs::read(&f.archive).unwrap();
    let full = {
        let t = d.join("full.lstp");
        std::fs::write(&t, &base).unwrap();
        assert!(run(&["append", t.to_str().unwrap(), f.b.to_str().unwrap()])
            .status
            .success());
        std::fs::read(&t).unwrap()
    };
    std::fs::write(&f.archive, &full[..full.len() - 40]).unwrap();
    let o = run_disk_full(&["repair", ar]);
    assert!(!o.status.success());
    assert!(temps_in(d).is_empty());
    // Still the one complete checkpoint, and the complete commit still there to repair.
    let a = Archive::open(&f.archive).unwrap();
    assert_eq!(a.checkpoints.len(), 1);
    assert!(matches!(
        a.tail(),
        archive::Tail::CommitWithoutFooter { .. }
    ));
    let o = run(&["repair", ar]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&f.archive).unwrap() == full);
}

/// Make `dir` unwritable: as root permissions do not apply, so use the immutable attribute.
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn new(dir: &Path) -> ReadOnly {
        let root = unsafe { libc_geteuid() } == 0;
        let ok = if root {
            Command::new("chattr")
                .arg("+i")
                .arg(dir)
                .status()
                .is_ok_and(|s| s.success())
        } else {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).is_ok()
        };
        assert!(ok, "could not make {} read-only", dir.display());
        ReadOnly(dir.to_path_buf())
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o755));
    }
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

#[test]
fn a_read_only_output_directory_is_reported_with_its_path() {
    let f = fixture();
    let ro = f.dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let _guard = ReadOnly::new(&ro);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let (a, b, ar) = (s(&f.a), s(&f.b), s(&f.archive));
    let target = |n: &str| s(&ro.join(n));
    for (what, args) in [
        (
            "delta encode",
            vec![
                "delta",
                "encode",
                "--reference",
                &a,
                "--target",
                &b,
                "-o",
                &target("d.lsd"),
            ],
        ),
        ("pack", vec!["pack", &a, "-o", &target("p.lstp")]),
        (
            "extract",
            vec!["extract", &ar, "-o", &target("x.safetensors")],
        ),
    ] {
        let o = run(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{what}: {err}");
        assert!(
            err.contains(ro.to_str().unwrap()),
            "{what} must name the path: {err}"
        );
        assert!(
            std::fs::read_dir(&ro).unwrap().next().is_none(),
            "{what} wrote into it"
        );
    }
}

#[test]
fn an_input_deleted_while_it_is_read_gives_a_complete_archive_or_none() {
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = vec![
        ("a.weight", vec![512, 512], true),
        ("b.weight", vec![512, 512], true),
    ];
    let inputs: Vec<PathBuf> = (1..=3)
        .map(|s| {
            let p = dir.path().join(format!("step{s}.safetensors"));
            write_ckpt(&p, &specs, s);
            p
        })
        .collect();
    let originals: Vec<Vec<u8>> = inputs.iter().map(|p| std::fs::read(p).unwrap()).collect();
    for delay in [0u64, 20, 100, 300] {
        for (p, bytes) in inputs.iter().zip(&originals) {
            std::fs::write(p, bytes).unwrap();
        }
        let out = dir.path().join(format!("run{delay}.lstp"));
        let child = Command::new(bin())
            .args(["pack", "-o", out.to_str().unwrap()])
            .args(&inputs)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay));
        for p in &inputs {
            let _ = std::fs::remove_file(p);
        }
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("panicked"), "{err}");
        if o.status.success() {
            // A file deleted after it was opened is still read whole (it is mapped).
            let a = Archive::open(&out).unwrap();
            assert_eq!(a.checkpoints.len(), 3);
            assert!(a.verify(&|_| {}).unwrap().ok());
        } else {
            assert_eq!(o.status.code(), Some(1), "{err}");
            assert!(err.contains("step"), "names the missing file: {err}");
            assert!(!out.exists());
        }
        assert!(temps_in(dir.path()).is_empty());
    }
}

#[test]
fn extract_killed_leaves_no_output_and_the_next_run_removes_its_temp_file() {
    let f = fixture();
    let ar = f.archive.to_str().unwrap();
    let out = f.dir.path().join("out.safetensors");
    let mut left = 0;
    for ms in [0u64, 2, 10, 40, 150] {
        let _ = std::fs::remove_file(&out);
        let mut child = Command::new(bin())
            .args(["extract", ar, "-o", out.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(ms));
        let _ = child.kill();
        let _ = child.wait();
        // Either the whole verified file or nothing under its name.
        if out.exists() {
            assert!(std::fs::read(&out).unwrap() == std::fs::read(&f.a).unwrap());
        }
        left += temps_in(f.dir.path()).len();
        // The next writer of the same output removes what a killed one left.
        let o = run(&["extract", ar, "-o", out.to_str().unwrap(), "--force"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(temps_in(f.dir.path()).is_empty());
    }
    eprintln!("temp files left by killed extracts (then removed): {left}");
}

#[test]
fn stale_temp_files_are_removed_and_live_ones_kept() {
    let f = fixture();
    let d = f.dir.path();
    let out = d.join("d.lsd");
    // One left by a process that died (nobody holds its lock) and one a live writer holds.
    let dead = d.join(".d.lsd.tmp-4000000");
    let live = d.join(".d.lsd.tmp-4000001");
    std::fs::write(&dead, b"remains").unwrap();
    std::fs::write(&live, b"in use").unwrap();
    let held = std::fs::File::open(&live).unwrap();
    held.lock().unwrap();
    let o = run(&[
        "delta",
        "encode",
        "--reference",
        f.a.to_str().unwrap(),
        "--target",
        f.b.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("left by a run that was killed"));
    assert!(!dead.exists());
    assert!(
        live.exists(),
        "a temp file whose writer is alive is not touched"
    );
    drop(held);
}

#[test]
fn repair_killed_at_any_point_can_be_run_again() {
    let f = fixture();
    let ar = f.archive.to_str().unwrap();
    let base = std::fs::read(&f.archive).unwrap();
    assert!(run(&["append", ar, f.b.to_str().unwrap()]).status.success());
    let full = std::fs::read(&f.archive).unwrap();
    for (i, ms) in [0u64, 1, 3, 10, 50].iter().enumerate() {
        // Footer missing, or footer damaged.
        let mut bytes = full.clone();
        if i % 2 == 0 {
            bytes.truncate(full.len() - 40);
        } else {
            let n = bytes.len();
            bytes[n - 20] ^= 0x40;
        }
        std::fs::write(&f.archive, &bytes).unwrap();
        let mut child = Command::new(bin())
            .args(["repair", ar])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(*ms));
        let _ = child.kill();
        let _ = child.wait();
        // Whatever state it died in, the first checkpoint reads and repair finishes the job.
        let a = Archive::open(&f.archive).unwrap();
        assert!(!a.checkpoints.is_empty());
        assert!(run(&["repair", ar]).status.success());
        assert!(
            std::fs::read(&f.archive).unwrap() == full,
            "kill after {ms} ms"
        );
    }
    assert!(full.starts_with(&base));
}

#[test]
fn two_appends_racing_one_wins_the_other_is_refused() {
    let f = fixture();
    let ar = f.archive.to_str().unwrap();
    let c = f.dir.path().join("step3.safetensors");
    write_ckpt(&c, &small_model(), 3);
    let spawn = |p: &Path| {
        Command::new(bin())
            .args(["append", ar, p.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (x, y) = (spawn(&f.b), spawn(&c));
    let (x, y) = (x.wait_with_output().unwrap(), y.wait_with_output().unwrap());
    let wins = [&x, &y].iter().filter(|o| o.status.success()).count();
    assert!(wins >= 1);
    for o in [&x, &y] {
        if !o.status.success() {
            let err = String::from_utf8_lossy(&o.stderr);
            // Refused by the lock, or (if it came second) by the step order.
            assert!(
                err.contains("another process is writing") || err.contains("is not after"),
                "{err}"
            );
        }
    }
    let a = Archive::open(&f.archive).unwrap();
    assert_eq!(a.checkpoints.len(), 1 + wins);
    assert!(a.verify(&|_| {}).unwrap().ok());
}
