//! `lockstep text` / `lockstep model` end to end through the binary, with the built-in model.

use std::process::Command;

fn lockstep() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lockstep"))
}

#[test]
fn text_compress_decompress_with_the_default_model() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    let packed = dir.path().join("in.lst");
    let back = dir.path().join("back.txt");
    let data = b"Hello, world! The quick brown fox jumps over the lazy dog.\n\xff\xfe binary tail";
    std::fs::write(&input, data).unwrap();
    let st = lockstep()
        .args(["text", "compress"])
        .arg(&input)
        .arg("-o")
        .arg(&packed)
        .status()
        .unwrap();
    assert!(st.success());
    let st = lockstep()
        .args(["text", "decompress"])
        .arg(&packed)
        .arg("-o")
        .arg(&back)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(std::fs::read(&back).unwrap(), data);
}

#[test]
fn failures_leave_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.lst");
    std::fs::write(&junk, b"LSTPTXT1 not really").unwrap();
    let out = dir.path().join("out.txt");
    let o = lockstep()
        .args(["text", "decompress"])
        .arg(&junk)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("error"));
    assert!(!out.exists());
    // A model file that is not one.
    let o = lockstep()
        .args(["text", "compress"])
        .arg(&junk)
        .arg("-o")
        .arg(&out)
        .arg("--model")
        .arg(&junk)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(!out.exists());
    // Only the outputs we asked for, no temporary files left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}
