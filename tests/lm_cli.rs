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

#[test]
fn model_convert_then_use_it() {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/data/tinygpt2");
    if !std::path::Path::new(src).join("model.safetensors").exists() {
        eprintln!("skipped: {src} is absent (shared data not mounted)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.lsm");
    let st = lockstep()
        .args(["model", "convert", src, "-o"])
        .arg(&model)
        .status()
        .unwrap();
    assert!(st.success());
    // The converted file is byte-identical to the shipped default model.
    let shipped =
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/models/tinygpt2.lsm")).unwrap();
    assert!(std::fs::read(&model).unwrap() == shipped);
    let input = dir.path().join("t.txt");
    std::fs::write(
        &input,
        b"import textwrap\nprint(textwrap.fill('hello world', 5))\n",
    )
    .unwrap();
    let packed = dir.path().join("t.lst");
    let back = dir.path().join("t.out");
    for args in [
        vec![
            "text",
            "compress",
            input.to_str().unwrap(),
            "-o",
            packed.to_str().unwrap(),
        ],
        vec![
            "text",
            "decompress",
            packed.to_str().unwrap(),
            "-o",
            back.to_str().unwrap(),
        ],
    ] {
        let st = lockstep()
            .args(&args)
            .arg("--model")
            .arg(&model)
            .status()
            .unwrap();
        assert!(st.success(), "{args:?}");
    }
    assert_eq!(
        std::fs::read(&back).unwrap(),
        std::fs::read(&input).unwrap()
    );
}

#[test]
fn text_flags_choose_the_stream_and_its_models() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    let data = b"one line of a log, then the same line of a log, then the same line again\n";
    std::fs::write(&input, data).unwrap();
    // (flags, the stream version they write)
    let cases: [(&[&str], u32); 4] = [
        (&[], 2),
        (&["--no-lm"], 2),
        (&["--no-lm", "--no-match"], 2),
        (&["--no-mix", "--no-match"], 1),
    ];
    for (flags, version) in cases {
        let packed = dir.path().join("in.lst");
        let back = dir.path().join("back.txt");
        let st = lockstep()
            .args(["-q", "text", "compress", "-f"])
            .args(flags)
            .arg(&input)
            .arg("-o")
            .arg(&packed)
            .status()
            .unwrap();
        assert!(st.success(), "{flags:?}");
        let p = std::fs::read(&packed).unwrap();
        assert_eq!(&p[..8], b"LSTPTXT1");
        assert_eq!(u32::from_le_bytes(p[8..12].try_into().unwrap()), version);
        if version == 2 && p[12] == 1 {
            let lm = p[13] & 1 != 0;
            let matched = p[13] & 2 != 0;
            assert!(!lm || !flags.contains(&"--no-lm"), "{flags:?}");
            assert_eq!(matched, !flags.contains(&"--no-match"), "{flags:?}");
        }
        let st = lockstep()
            .args(["-q", "text", "decompress", "-f"])
            .arg(&packed)
            .arg("-o")
            .arg(&back)
            .status()
            .unwrap();
        assert!(st.success(), "{flags:?}");
        assert_eq!(std::fs::read(&back).unwrap(), data);
    }
    // Segments exist only in the version-1 stream; --no-lm has no meaning there.
    for bad in [&["--segment-tokens", "8"][..], &["--no-mix", "--no-lm"]] {
        let out = lockstep()
            .args(["text", "compress", "-c"])
            .args(bad)
            .arg(&input)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}
