//! The command line as Unix compressors taught people to use it (issue 17): `-` for standard
//! input and output, `-c`, default output names, refusal to replace a file without `-f`,
//! `-q` / `-v`, `--json` on every command (one document on stdout), missing output folders,
//! a `demo` that runs from an installed binary, and `model convert` on a sharded checkpoint.
//! Runs the built binary with std::process::Command; short texts keep the text codec quick.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const DEMO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/demo");
const TEXT: &[u8] = b"The quick brown fox jumps over the lazy dog. Pipes in, pipes out.\n";

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lockstep"));
    c.env("XDG_RUNTIME_DIR", std::env::temp_dir());
    c
}

/// Run `lockstep ARGS` in `dir`, feeding `stdin`.
fn run_in(dir: &Path, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut c = bin();
    c.current_dir(dir)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    if let Some(bytes) = stdin {
        let mut w = child.stdin.take().unwrap();
        let bytes = bytes.to_vec();
        // Written from a thread: the child may fill stdout before it has read all of stdin.
        std::thread::spawn(move || {
            let _ = w.write_all(&bytes);
        });
    }
    child.wait_with_output().unwrap()
}

fn ok(o: &Output) -> &Output {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    ok(o);
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}):\n{}",
            String::from_utf8_lossy(&o.stdout)
        )
    })
}

/// Two consecutive checkpoints of the demo trajectory as `step600.safetensors` and
/// `step800.safetensors` in `dir`.
fn checkpoints(dir: &Path) -> (PathBuf, PathBuf) {
    let (r, t) = (
        dir.join("step600.safetensors"),
        dir.join("step800.safetensors"),
    );
    std::fs::copy(format!("{DEMO}/step0600_blocks_bf16.safetensors"), &r).unwrap();
    std::fs::copy(format!("{DEMO}/step0800_blocks_bf16.safetensors"), &t).unwrap();
    (r, t)
}

#[test]
fn text_pipes_in_both_directions() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // stdin -> stdout, and back.
    let packed = ok(&run_in(d, &["text", "compress", "-"], Some(TEXT)))
        .stdout
        .clone();
    assert!(packed.starts_with(b"LSTPTXT1"));
    let plain = ok(&run_in(d, &["text", "decompress", "-"], Some(&packed)))
        .stdout
        .clone();
    assert_eq!(plain, TEXT);
    // A file to stdout with -c and with -o -; stdin to a named file.
    std::fs::write(d.join("notes.txt"), TEXT).unwrap();
    let c = ok(&run_in(d, &["text", "compress", "-c", "notes.txt"], None))
        .stdout
        .clone();
    let o = ok(&run_in(
        d,
        &["text", "compress", "notes.txt", "-o", "-"],
        None,
    ))
    .stdout
    .clone();
    assert_eq!(c, packed);
    assert_eq!(o, packed);
    ok(&run_in(
        d,
        &["text", "decompress", "-", "-o", "back.txt"],
        Some(&packed),
    ));
    assert_eq!(std::fs::read(d.join("back.txt")).unwrap(), TEXT);
    // No file named "-" is ever created.
    assert!(!d.join("-").exists());
}

#[test]
fn text_default_names_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("notes.txt"), TEXT).unwrap();
    ok(&run_in(d, &["text", "compress", "notes.txt"], None));
    let packed = std::fs::read(d.join("notes.txt.lst")).unwrap();
    // The input is kept; a second run refuses to replace the output and names it.
    assert_eq!(std::fs::read(d.join("notes.txt")).unwrap(), TEXT);
    let again = run_in(d, &["text", "compress", "notes.txt"], None);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("notes.txt.lst") && stderr(&again).contains("-f"),
        "{}",
        stderr(&again)
    );
    // Decompressing onto the existing original is refused too, then allowed with -f / --force.
    std::fs::write(d.join("notes.txt"), b"something else").unwrap();
    let refused = run_in(d, &["text", "decompress", "notes.txt.lst"], None);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("notes.txt"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(
        std::fs::read(d.join("notes.txt")).unwrap(),
        b"something else"
    );
    ok(&run_in(
        d,
        &["text", "decompress", "-f", "notes.txt.lst"],
        None,
    ));
    assert_eq!(std::fs::read(d.join("notes.txt")).unwrap(), TEXT);
    ok(&run_in(
        d,
        &["text", "compress", "--force", "notes.txt"],
        None,
    ));
    assert_eq!(std::fs::read(d.join("notes.txt.lst")).unwrap(), packed);
    // A name without the suffix has no default output: a clear error, nothing written.
    std::fs::copy(d.join("notes.txt.lst"), d.join("packed.bin")).unwrap();
    let bad = run_in(d, &["text", "decompress", "packed.bin"], None);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains(".lst"), "{}", stderr(&bad));
    // Missing output folders are created, as `extract` does.
    ok(&run_in(
        d,
        &["text", "compress", "notes.txt", "-o", "a/b/c/notes.lst"],
        None,
    ));
    assert!(d.join("a/b/c/notes.lst").is_file());
}

#[test]
fn delta_pipes_and_default_names() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_, t) = checkpoints(d);
    let original = std::fs::read(&t).unwrap();
    let args = [
        "delta",
        "encode",
        "--reference",
        "step600.safetensors",
        "--target",
        "step800.safetensors",
    ];
    ok(&run_in(d, &args, None));
    let lsd = std::fs::read(d.join("step800.lsd")).unwrap();
    let again = run_in(d, &args, None);
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("step800.lsd"), "{}", stderr(&again));
    ok(&run_in(d, &[&args[..], &["-f"]].concat(), None));
    // Target from stdin, .lsd to stdout: the same bytes.
    let piped = ok(&run_in(
        d,
        &[
            "delta",
            "encode",
            "--reference",
            "step600.safetensors",
            "--target",
            "-",
        ],
        Some(&original),
    ))
    .stdout
    .clone();
    assert_eq!(piped, lsd);
    // .lsd from stdin, checkpoint to stdout.
    let back = ok(&run_in(
        d,
        &["delta", "decode", "--reference", "step600.safetensors", "-"],
        Some(&lsd),
    ))
    .stdout
    .clone();
    assert!(back == original);
    // step800.lsd -> step800.safetensors: refused while the original is there, then written.
    let dec = [
        "delta",
        "decode",
        "--reference",
        "step600.safetensors",
        "step800.lsd",
    ];
    assert_eq!(run_in(d, &dec, None).status.code(), Some(1));
    std::fs::remove_file(&t).unwrap();
    ok(&run_in(d, &dec, None));
    assert!(std::fs::read(&t).unwrap() == original);
    // -c writes to stdout.
    let c = ok(&run_in(d, &[&dec[..], &["-c"]].concat(), None))
        .stdout
        .clone();
    assert!(c == original);
    // No suffix, no default name.
    std::fs::copy(d.join("step800.lsd"), d.join("delta.bin")).unwrap();
    let bad = run_in(
        d,
        &[
            "delta",
            "decode",
            "--reference",
            "step600.safetensors",
            "delta.bin",
        ],
        None,
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains(".lsd"), "{}", stderr(&bad));
}

#[test]
fn quiet_is_silent_and_verbose_names_the_backend() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    checkpoints(d);
    std::fs::write(d.join("notes.txt"), TEXT).unwrap();
    let enc = [
        "delta",
        "encode",
        "--reference",
        "step600.safetensors",
        "--target",
        "step800.safetensors",
    ];
    for args in [
        &["-q", "text", "compress", "notes.txt"][..],
        &[
            "text",
            "decompress",
            "notes.txt.lst",
            "-o",
            "back.txt",
            "-q",
        ][..],
        &[&enc[..], &["-q"]].concat()[..],
        &[
            "delta",
            "decode",
            "--reference",
            "step600.safetensors",
            "step800.lsd",
        ]
        .iter()
        .chain(&["-o", "back.safetensors", "--quiet"])
        .copied()
        .collect::<Vec<_>>()[..],
    ] {
        let o = run_in(d, args, None);
        ok(&o);
        assert!(o.stderr.is_empty(), "{args:?}: {}", stderr(&o));
    }
    // The default says what was done, and nothing about backends.
    let o = run_in(d, &[&enc[..], &["-f"]].concat(), None);
    ok(&o);
    assert!(stderr(&o).contains("step800.lsd"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("auto:") && !stderr(&o).contains("backend"));
    // stderr is a pipe here: one summary line, no progress bar drawn into it.
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    // -v names the backend.
    let o = run_in(d, &[&["-v"][..], &enc[..], &["-f"]].concat(), None);
    ok(&o);
    assert!(
        stderr(&o).contains("auto:") || stderr(&o).contains("backend:"),
        "{}",
        stderr(&o)
    );
    // -q and -v together make no sense.
    assert_eq!(
        run_in(d, &[&["-q", "-v"][..], &enc[..]].concat(), None)
            .status
            .code(),
        Some(2)
    );
}

#[test]
fn json_is_one_document_on_stdout_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    checkpoints(d);
    std::fs::write(d.join("notes.txt"), TEXT).unwrap();
    let r = "step600.safetensors";
    let t = "step800.safetensors";
    let v = json(&run_in(
        d,
        &["delta", "encode", "--reference", r, "--target", t, "--json"],
        None,
    ));
    assert!(v["output_bytes"].as_u64().unwrap() > 0);
    assert_eq!(v["output"], "step800.lsd");
    let v = json(&run_in(d, &["parity", r, t, "--json"], None));
    assert_eq!(v["agree"], true, "{v}");
    assert!(
        v["sections"][0]["rows"].as_array().unwrap().len() >= 2,
        "{v}"
    );
    let v = json(&run_in(
        d,
        &[
            "delta",
            "decode",
            "--reference",
            r,
            "step800.lsd",
            "-o",
            "x.safetensors",
            "--json",
        ],
        None,
    ));
    assert_eq!(v["verified"], true);
    let v = json(&run_in(
        d,
        &[
            "delta",
            "stats",
            "--reference",
            r,
            "--target",
            t,
            "--no-baseline",
            "--json",
        ],
        None,
    ));
    assert!(v["by_dtype"].as_array().is_some_and(|a| !a.is_empty()));
    let v = json(&run_in(
        d,
        &["text", "compress", "notes.txt", "--json"],
        None,
    ));
    assert_eq!(v["input_bytes"], TEXT.len());
    let v = json(&run_in(
        d,
        &[
            "text",
            "decompress",
            "notes.txt.lst",
            "-o",
            "n.txt",
            "--json",
        ],
        None,
    ));
    assert_eq!(v["output_bytes"], TEXT.len());
    let v = json(&run_in(d, &["model", "info", "--json"], None));
    assert!(v["blake3"].is_string());
    let v = json(&run_in(d, &["backends", "--json"], None));
    assert!(v["backends"].as_array().is_some_and(|a| !a.is_empty()));
    // The archive commands had --json already; repair printed a line before its document.
    std::fs::create_dir(d.join("run")).unwrap();
    for s in ["0200", "0400"] {
        std::fs::copy(
            format!("{DEMO}/step{s}_blocks_bf16.safetensors"),
            d.join(format!("run/step{s}.safetensors")),
        )
        .unwrap();
    }
    let v = json(&run_in(d, &["demo", "--dir", "run", "--json"], None));
    assert_eq!(v["archive"]["identical"], true, "{v}");
    json(&run_in(
        d,
        &["pack", "run", "-o", "run.lstp", "--json"],
        None,
    ));
    json(&run_in(d, &["append", "run.lstp", r, "--json"], None));
    for cmd in ["list", "verify", "stats", "repair"] {
        let v = json(&run_in(d, &[cmd, "run.lstp", "--json"], None));
        if cmd == "repair" {
            assert_eq!(v["repair"]["outcome"], "nothing", "{v}");
            assert_eq!(v["ok"], true, "{v}");
        }
    }
    json(&run_in(
        d,
        &[
            "extract",
            "run.lstp",
            "--step",
            "400",
            "-o",
            "e.safetensors",
            "--json",
        ],
        None,
    ));
    // --json and data on stdout cannot share it.
    let o = run_in(d, &["text", "compress", "notes.txt", "-c", "--json"], None);
    assert_eq!(o.status.code(), Some(1));
    // model convert, where the shared model is present.
    if let Some(src) = common::shared_data("tinygpt2") {
        let v = json(&run_in(
            d,
            &[
                "model",
                "convert",
                src.to_str().unwrap(),
                "-o",
                "m.lsm",
                "--json",
            ],
            None,
        ));
        assert!(v["blake3"].is_string());
    }
}

#[test]
fn pack_takes_f_as_well_as_force() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    checkpoints(d);
    let pack = [
        "pack",
        "step600.safetensors",
        "step800.safetensors",
        "-o",
        "a.lstp",
    ];
    ok(&run_in(d, &pack, None));
    let o = run_in(d, &pack, None);
    assert!(!o.status.success());
    ok(&run_in(d, &[&pack[..], &["-f"]].concat(), None));
}

#[test]
fn demo_runs_from_a_copied_binary_in_another_directory() {
    let dir = tempfile::tempdir().unwrap();
    let installed = dir.path().join("bin/lockstep");
    std::fs::create_dir_all(installed.parent().unwrap()).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_lockstep"), &installed).unwrap();
    let cwd = dir.path().join("elsewhere");
    std::fs::create_dir_all(&cwd).unwrap();
    let o = Command::new(&installed)
        .arg("demo")
        .current_dir(&cwd)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .unwrap();
    ok(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("restored byte-identical"), "{out}");
    // Nothing left behind where it ran.
    assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 0);
}

/// A sharded Hugging Face checkpoint (two shards + model.safetensors.index.json) converts to
/// the same integer model as the single file it was split from.
#[test]
fn model_convert_reads_a_sharded_checkpoint() {
    let Some(src) = common::shared_data("tinygpt2") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sharded = dir.path().join("sharded");
    std::fs::create_dir(&sharded).unwrap();
    std::fs::copy(src.join("config.json"), sharded.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = st.names();
    names.sort();
    let half = names.len() / 2;
    let mut weight_map = serde_json::Map::new();
    for (i, part) in [&names[..half], &names[half..]].iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let tensors: Vec<_> = part
            .iter()
            .map(|n| (n.to_string(), st.tensor(n).unwrap()))
            .collect();
        for n in part.iter() {
            weight_map.insert(n.to_string(), file.clone().into());
        }
        safetensors::serialize_to_file(tensors, None, &sharded.join(&file)).unwrap();
    }
    std::fs::write(
        sharded.join("model.safetensors.index.json"),
        serde_json::to_vec(&serde_json::json!({"metadata": {}, "weight_map": weight_map})).unwrap(),
    )
    .unwrap();
    ok(&run_in(
        dir.path(),
        &["model", "convert", "sharded", "-o", "sharded.lsm"],
        None,
    ));
    let shipped =
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/models/tinygpt2.lsm")).unwrap();
    assert!(std::fs::read(dir.path().join("sharded.lsm")).unwrap() == shipped);
    // The index file itself names the checkpoint too.
    ok(&run_in(
        dir.path(),
        &[
            "model",
            "convert",
            "sharded/model.safetensors.index.json",
            "-o",
            "index.lsm",
        ],
        None,
    ));
    assert!(std::fs::read(dir.path().join("index.lsm")).unwrap() == shipped);
    // model convert refuses to replace its output without -f.
    let o = run_in(
        dir.path(),
        &["model", "convert", "sharded", "-o", "sharded.lsm"],
        None,
    );
    assert_eq!(o.status.code(), Some(1));
}

/// Whether `p` is still what it was made as: a named pipe, a character device, a socket.
fn kind_of(p: &Path) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::symlink_metadata(p).unwrap().file_type();
    match () {
        _ if t.is_fifo() => "fifo",
        _ if t.is_char_device() => "char device",
        _ if t.is_socket() => "socket",
        _ if t.is_dir() => "directory",
        _ => "file",
    }
}

/// `lockstep delta encode` of `target` against `reference` into `out`, in `dir`.
fn encode_to(dir: &Path, reference: &str, target: &str, out: &str) {
    ok(&run_in(
        dir,
        &[
            "delta",
            "encode",
            "--reference",
            reference,
            "--target",
            target,
            "-o",
            out,
        ],
        None,
    ));
}

/// Run `lockstep ARGS` in `dir` while a thread reads the named pipe `fifo` to its end;
/// returns the run and the bytes that came through the pipe.
fn through_fifo(dir: &Path, args: &[&str], fifo: &Path) -> (Output, Vec<u8>) {
    let f = fifo.to_path_buf();
    // Opening a pipe for reading waits for its writer: on a thread, before the run.
    let reader = std::thread::spawn(move || std::fs::read(f).unwrap());
    let o = run_in(dir, args, None);
    if !o.status.success() {
        // Unblock the reader so the test reports the run's failure, not a hang.
        let _ = std::fs::OpenOptions::new().write(true).open(fifo);
    }
    (o, reader.join().unwrap())
}

/// A named pipe given as `-o` is written in place, without `-f`: the bytes come through
/// it and it is still a pipe afterwards (a rename would have put a file in its place).
#[test]
fn output_to_a_named_pipe_streams_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("notes.txt"), TEXT).unwrap();
    let (r, t) = checkpoints(d);
    let fifo = d.join("pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);

    ok(&run_in(
        d,
        &["text", "compress", "notes.txt", "-o", "notes.lst"],
        None,
    ));
    let (o, got) = through_fifo(d, &["text", "compress", "notes.txt", "-o", "pipe"], &fifo);
    ok(&o);
    assert_eq!(got, std::fs::read(d.join("notes.lst")).unwrap());
    assert_eq!(kind_of(&fifo), "fifo");

    let (r, t) = (r.to_str().unwrap(), t.to_str().unwrap());
    encode_to(d, r, t, "s.lsd");
    let (o, got) = through_fifo(
        d,
        &["delta", "decode", "--reference", r, "s.lsd", "-o", "pipe"],
        &fifo,
    );
    ok(&o);
    assert!(
        got == std::fs::read(t).unwrap(),
        "the decode through the pipe"
    );
    assert_eq!(kind_of(&fifo), "fifo");
}

/// `-o /dev/null` as root users type it: a character device is written in place, by every
/// command that writes one file, and nothing puts a file or a directory in its place (a
/// rename did, and `extract --force` of a directory checkpoint then deleted the device). A
/// private device node (the same major/minor as /dev/null) stands in for /dev/null, so a
/// defect cannot break the machine's; making one needs root.
#[test]
fn output_to_a_character_device_is_written_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let dev = d.join("null");
    let c = std::ffi::CString::new(dev.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; makedev(1, 3) is /dev/null's number.
    if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } != 0 {
        eprintln!(
            "SKIP: cannot make a character device here ({}): needs root",
            std::io::Error::last_os_error()
        );
        return;
    }
    std::fs::write(d.join("notes.txt"), TEXT).unwrap();
    let (r, t) = checkpoints(d);
    let (r, t) = (r.to_str().unwrap(), t.to_str().unwrap());
    let null = dev.to_str().unwrap();
    // Without -f: nothing is replaced.
    ok(&run_in(
        d,
        &["text", "compress", "notes.txt", "-o", null],
        None,
    ));
    ok(&run_in(
        d,
        &["text", "compress", "-f", "notes.txt", "-o", null],
        None,
    ));
    encode_to(d, r, t, "s.lsd");
    ok(&run_in(
        d,
        &["delta", "decode", "--reference", r, "s.lsd", "-o", null],
        None,
    ));
    assert_eq!(kind_of(&dev), "char device");

    // Archives: a single-file step and a tensor extract in place; a directory checkpoint
    // and the archive itself are refused, the device left alone.
    ok(&run_in(d, &["pack", r, t, "-o", "run.lstp"], None));
    ok(&run_in(
        d,
        &["extract", "run.lstp", "--step", "800", "-o", null],
        None,
    ));
    ok(&run_in(
        d,
        &[
            "extract",
            "run.lstp",
            "--step",
            "800",
            "--tensor",
            "transformer.h.0.attn.c_attn.weight",
            "-o",
            null,
        ],
        None,
    ));
    let run = d.join("run");
    for (step, src) in [("step100", r), ("step200", t)] {
        std::fs::create_dir_all(run.join(step)).unwrap();
        std::fs::copy(src, run.join(step).join("model.safetensors")).unwrap();
        std::fs::write(run.join(step).join("config.json"), "{}").unwrap();
    }
    ok(&run_in(d, &["pack", "run", "-o", "dirs.lstp"], None));
    for force in [false, true] {
        let mut args = vec!["extract", "dirs.lstp", "--step", "200", "-o", null];
        if force {
            args.push("--force");
        }
        let o = run_in(d, &args, None);
        assert!(!o.status.success(), "{args:?}");
        assert!(
            stderr(&o).contains("directory checkpoint"),
            "{}",
            stderr(&o)
        );
        assert_eq!(kind_of(&dev), "char device", "{args:?}");
    }
    let o = run_in(d, &["pack", r, t, "-f", "-o", null], None);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("must be a file"), "{}", stderr(&o));
    assert_eq!(kind_of(&dev), "char device");
}

/// A socket (or a block device) as `-o` is refused with what it is, even with `-f`, and left.
#[test]
fn output_to_a_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("notes.txt"), TEXT).unwrap();
    let sock = d.join("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let o = run_in(
        d,
        &["text", "compress", "-f", "notes.txt", "-o", "sock"],
        None,
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("is a socket"), "{}", stderr(&o));
    assert_eq!(kind_of(&sock), "socket");
}

/// Make the named pipe `p`.
fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Run `lockstep ARGS` in `dir` while a thread writes `bytes` into the named pipe `fifo`
/// (what `<(cat file)` gives a command).
fn from_fifo(dir: &Path, args: &[&str], fifo: &Path, bytes: Vec<u8>) -> Output {
    let f = fifo.to_path_buf();
    // Opening a pipe for writing waits for its reader: on a thread, before the run.
    let writer = std::thread::spawn(move || {
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .open(f)
            .and_then(|mut w| w.write_all(&bytes));
    });
    let o = run_in(dir, args, None);
    if !writer.is_finished() {
        // The run never read the pipe: open it for reading so the writer ends.
        let _ = std::fs::read(fifo);
    }
    writer.join().unwrap();
    o
}

/// `lockstep ARGS` in `dir`, killed (and the test failed) if it runs for a minute: a
/// command that waits on a pipe forever must fail this test, not hang the suite.
fn within_a_minute(dir: &Path, args: &[&str]) -> Output {
    let mut child = bin()
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("{args:?} still running after a minute");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Inputs given as named pipes (`<(ssh host cat run.lsa)`, `<(zstd -dc x.zst)`) are read
/// whole, as standard input is: mapping one failed with "No such device (os error 19)".
#[test]
fn inputs_from_named_pipes_are_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (r, t) = checkpoints(d);
    let (r, t) = (r.to_str().unwrap(), t.to_str().unwrap());
    let fifo = d.join("pipe");
    mkfifo(&fifo);
    ok(&run_in(d, &["pack", "-o", "a.lsa", r, t], None));
    let archive = std::fs::read(d.join("a.lsa")).unwrap();
    let o = from_fifo(d, &["list", "pipe"], &fifo, archive.clone());
    assert!(String::from_utf8_lossy(&ok(&o).stdout).contains("step800"));
    let o = from_fifo(d, &["verify", "pipe"], &fifo, archive.clone());
    let out = String::from_utf8_lossy(&ok(&o).stdout).into_owned();
    assert!(out.contains("all hashes match"), "{out}");
    // The file's length is the bytes read, not the pipe's 0 on disk.
    let len = archive.len();
    assert!(
        out.contains(&format!("({len} of {len} B of the file)")),
        "{out}"
    );
    let args = ["extract", "pipe", "--step", "800", "-o", "x.safetensors"];
    ok(&from_fifo(d, &args, &fifo, archive));
    assert!(std::fs::read(d.join("x.safetensors")).unwrap() == std::fs::read(t).unwrap());

    encode_to(d, r, t, "s.lsd");
    let lsd = std::fs::read(d.join("s.lsd")).unwrap();
    let args = [
        "delta",
        "decode",
        "--reference",
        r,
        "pipe",
        "-o",
        "y.safetensors",
    ];
    ok(&from_fifo(d, &args, &fifo, lsd.clone()));
    assert!(std::fs::read(d.join("y.safetensors")).unwrap() == std::fs::read(t).unwrap());
    let args = [
        "delta",
        "encode",
        "--reference",
        "pipe",
        "--target",
        t,
        "-o",
        "p.lsd",
    ];
    ok(&from_fifo(d, &args, &fifo, std::fs::read(r).unwrap()));
    assert!(std::fs::read(d.join("p.lsd")).unwrap() == lsd);

    std::fs::write(d.join("notes.txt"), TEXT).unwrap();
    ok(&run_in(
        d,
        &["text", "compress", "notes.txt", "-o", "f.lst"],
        None,
    ));
    let args = ["text", "compress", "pipe", "-o", "p.lst"];
    ok(&from_fifo(d, &args, &fifo, TEXT.to_vec()));
    assert_eq!(
        std::fs::read(d.join("p.lst")).unwrap(),
        std::fs::read(d.join("f.lst")).unwrap()
    );
    assert_eq!(kind_of(&fifo), "fifo");
}

/// An archive argument that is a directory, a character device or (for the commands that
/// change it in place) a named pipe is refused by name, promptly and with nothing changed:
/// mapping them said "No such device (os error 19)", and `append` to a pipe would have
/// waited on itself. So is a device as the text to compress (`/dev/zero` would have been
/// read until memory ran out).
#[test]
fn archives_that_are_not_files_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_, t) = checkpoints(d);
    let t = t.to_str().unwrap();
    std::fs::create_dir(d.join("folder")).unwrap();
    let fifo = d.join("pipe");
    mkfifo(&fifo);
    for (archive, what) in [
        ("folder", "a directory, not a file"),
        ("/dev/null", "a character device, not a file"),
    ] {
        for args in [
            vec!["list", archive],
            vec!["verify", archive],
            vec!["stats", archive],
            vec!["repair", archive],
            vec!["append", archive, t],
        ] {
            let o = run_in(d, &args, None);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
            assert!(stderr(&o).contains(what), "{args:?}: {}", stderr(&o));
        }
    }
    assert_eq!(kind_of(Path::new("/dev/null")), "char device");
    // A device as the input to compress: refused, not read until memory runs out.
    let o = within_a_minute(d, &["text", "compress", "/dev/zero", "-o", "z.lst"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("/dev/zero: a character device, not a file"));
    assert!(!d.join("z.lst").exists());
    // A checkpoint to pack or append that is not a file or a directory: refused by name
    // (it was "Not a directory (os error 20)"), no archive made.
    for args in [
        vec!["pack", "-o", "new.lsa", "pipe"],
        vec!["pack", "-o", "new.lsa", "/dev/null"],
    ] {
        let o = within_a_minute(d, &args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("not a file; pack and append read checkpoints"));
        assert!(!d.join("new.lsa").exists());
    }
    for args in [vec!["append", "pipe", t], vec!["repair", "pipe"]] {
        let o = within_a_minute(d, &args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("a named pipe, not a file"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    assert_eq!(kind_of(&fifo), "fifo");
}
