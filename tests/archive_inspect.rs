//! Looking inside archives and extracting as a user does, through the binary: `list
//! --tensors`, `diff`, `extract --tensor/--file/--force`, file modes and times, an archive
//! written before commit version 2, and `pack`'s input handling (step order, pickle files,
//! what an fp32 checkpoint after bf16 ones is listed as).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/archive_v1");

struct Run {
    ok: bool,
    code: Option<i32>,
    out: String,
    err: String,
}

fn lockstep(args: &[&str]) -> Run {
    let o = Command::new(bin())
        .args(args)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .unwrap();
    Run {
        ok: o.status.success(),
        code: o.status.code(),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Runs and must succeed.
fn ok(args: &[&str]) -> String {
    let r = lockstep(args);
    assert!(r.ok, "{args:?} failed:\n{}\n{}", r.out, r.err);
    r.out
}

fn json(args: &[&str]) -> Value {
    let out = ok(args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}\n{out}"))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[cfg(unix)]
fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[cfg(unix)]
fn set_mode(p: &Path, m: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

fn mtime(p: &Path) -> std::time::SystemTime {
    std::fs::metadata(p).unwrap().modified().unwrap()
}

fn set_mtime(p: &Path, t: std::time::SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(p)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

/// Three single-file checkpoints `step{1,2,3}.safetensors` of the small model.
fn three_steps(dir: &Path) -> Vec<PathBuf> {
    (1..=3u64)
        .map(|st| {
            let p = dir.join(format!("step{st}.safetensors"));
            write_ckpt(&p, &small_model(), st);
            p
        })
        .collect()
}

#[test]
fn golden_v1_archive_lists_verifies_extracts_and_takes_appends() {
    let dir = tempfile::tempdir().unwrap();
    let ar = dir.path().join("v1.lstp");
    std::fs::copy(Path::new(GOLDEN).join("v1.lstp"), &ar).unwrap();
    let src = Path::new(GOLDEN).join("run");

    let v = json(&["list", s(&ar), "--json"]);
    let steps: Vec<u64> = v["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [100, 200]);
    assert_eq!(v["checkpoints"][1]["stored_as"], "delta");
    assert_eq!(json(&["verify", s(&ar), "--json"])["ok"], true);
    // Version-1 commits carry no modes or times: listed as null.
    let c = json(&["list", s(&ar), "--tensors", "--step", "200", "--json"]);
    let files = c["checkpoints"][0]["files"].as_array().unwrap();
    assert!(files
        .iter()
        .all(|f| f["mode"].is_null() && f["mtime"].is_null()));
    let codings: Vec<(&str, &str)> = c["checkpoints"][0]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t["coding"].as_str().unwrap()))
        .collect();
    assert_eq!(
        codings,
        [
            ("h.0.weight", "delta"),
            ("h.0.bias", "anchor"),
            ("ln.scale", "reused")
        ]
    );
    for step in [100, 200] {
        let out = dir.path().join(format!("out{step}"));
        ok(&[
            "extract",
            s(&ar),
            "--step",
            &step.to_string(),
            "-o",
            s(&out),
        ]);
        assert!(tree(&out) == tree(&src.join(format!("checkpoint-{step}"))));
    }
    let d = json(&["diff", s(&ar), "100", "200", "--json"]);
    assert_eq!(d["tensor_counts"]["changed"], 2);
    assert_eq!(d["tensor_counts"]["same"], 1);

    // Appending to it adds a version-2 commit (with metadata) behind the version-1 ones.
    let new = dir.path().join("checkpoint-300");
    std::fs::create_dir(&new).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join("checkpoint-200").join(f), new.join(f)).unwrap();
    }
    #[cfg(unix)]
    set_mode(&new.join("config.json"), 0o600);
    ok(&["append", s(&ar), s(&new)]);
    let c = json(&["list", s(&ar), "--step", "300", "--json"]);
    let f = &c["checkpoints"][0]["files"][0];
    assert_eq!(f["path"], "config.json");
    #[cfg(unix)]
    assert_eq!(f["mode"], "600");
    assert!(f["mtime"].is_i64());
    assert_eq!(json(&["verify", s(&ar), "--json"])["ok"], true);
    let out = dir.path().join("out300");
    ok(&["extract", s(&ar), "-o", s(&out)]);
    assert!(tree(&out) == tree(&new));
    #[cfg(unix)]
    assert_eq!(mode(&out.join("config.json")), 0o600);
    // The old steps still extract, with default modes.
    let out = dir.path().join("again100");
    ok(&["extract", s(&ar), "--step", "100", "-o", s(&out)]);
    assert!(tree(&out) == tree(&src.join("checkpoint-100")));
}

#[test]
#[cfg(unix)]
fn modes_and_times_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("checkpoint-5");
    std::fs::create_dir_all(ck.join("tokenizer")).unwrap();
    write_ckpt(&ck.join("model.safetensors"), &small_model(), 5);
    std::fs::write(ck.join("secret.json"), b"{}").unwrap();
    std::fs::write(ck.join("tokenizer/run.sh"), b"#!/bin/sh\n").unwrap();
    let t = std::time::UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 123_456_789);
    for f in ["secret.json", "tokenizer/run.sh", "model.safetensors"] {
        set_mtime(&ck.join(f), t);
    }
    set_mode(&ck.join("secret.json"), 0o600);
    set_mode(&ck.join("tokenizer/run.sh"), 0o755);
    set_mode(&ck.join("model.safetensors"), 0o444);
    let ar = dir.path().join("run.lstp");
    ok(&["pack", s(&ck), "-o", s(&ar)]);
    let out = dir.path().join("out");
    ok(&["extract", s(&ar), "-o", s(&out)]);
    assert!(tree(&out) == tree(&ck));
    for (f, m) in [
        ("secret.json", 0o600),
        ("tokenizer/run.sh", 0o755),
        ("model.safetensors", 0o444),
    ] {
        assert_eq!(mode(&out.join(f)), m, "{f}");
        assert_eq!(mtime(&out.join(f)), t, "{f}");
    }
    // One file alone keeps them too.
    let one = dir.path().join("one.json");
    ok(&["extract", s(&ar), "--file", "secret.json", "-o", s(&one)]);
    assert_eq!((mode(&one), mtime(&one)), (0o600, t));
    let l = ok(&["list", s(&ar), "--step", "5"]);
    assert!(
        l.contains("600") && l.contains("2023-11-14 22:13:20"),
        "{l}"
    );
}

#[test]
fn extract_refuses_to_overwrite_without_force_and_force_gives_exactly_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    for st in [100u64, 200] {
        write_sharded(&run.join(format!("checkpoint-{st}")), st);
    }
    std::fs::write(run.join("checkpoint-100/extra.txt"), b"only at 100").unwrap();
    let ar = dir.path().join("run.lstp");
    ok(&["pack", s(&run), "-o", s(&ar)]);

    // A directory checkpoint over a non-empty directory: refused, nothing touched.
    let out = dir.path().join("ckpt");
    ok(&["extract", s(&ar), "--step", "100", "-o", s(&out)]);
    let before = tree(&out);
    let r = lockstep(&["extract", s(&ar), "--step", "200", "-o", s(&out)]);
    assert!(!r.ok && r.code == Some(1), "{:?} {}", r.code, r.err);
    assert!(
        r.err.contains("exists") && r.err.contains("--force"),
        "{}",
        r.err
    );
    assert!(tree(&out) == before);
    // With --force: exactly step 200 (extra.txt and a stray file are gone), nothing left over.
    std::fs::write(out.join("stray.bin"), b"x").unwrap();
    ok(&["extract", s(&ar), "--step", "200", "-o", s(&out), "--force"]);
    assert!(tree(&out) == tree(&run.join("checkpoint-200")));
    let hidden: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(hidden.is_empty(), "{hidden:?}");
    // A directory that does not exist yet, under parents that do not either.
    let deep = dir.path().join("a/b/ckpt");
    ok(&["extract", s(&ar), "--step", "100", "-o", s(&deep)]);
    assert!(tree(&deep) == tree(&run.join("checkpoint-100")));
    // An empty directory is fine without --force.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    ok(&["extract", s(&ar), "--step", "100", "-o", s(&empty)]);
    assert!(tree(&empty) == tree(&run.join("checkpoint-100")));
    // A file where the directory should go: refused, then replaced with -f.
    let file = dir.path().join("afile");
    std::fs::write(&file, b"keep me").unwrap();
    assert!(!lockstep(&["extract", s(&ar), "-o", s(&file)]).ok);
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    ok(&["extract", s(&ar), "-o", s(&file), "-f"]);
    assert!(tree(&file) == tree(&run.join("checkpoint-200")));

    // Single-file checkpoints and single files: refused over an existing file, replaced
    // with --force.
    let files = three_steps(dir.path());
    let ar1 = dir.path().join("one.lstp");
    ok(&["pack", s(&files[0]), s(&files[1]), "-o", s(&ar1)]);
    let o = dir.path().join("o.safetensors");
    std::fs::write(&o, b"old").unwrap();
    let r = lockstep(&["extract", s(&ar1), "--step", "2", "-o", s(&o)]);
    assert!(!r.ok && r.err.contains("exists"), "{}", r.err);
    assert_eq!(std::fs::read(&o).unwrap(), b"old");
    ok(&["extract", s(&ar1), "--step", "2", "-o", s(&o), "--force"]);
    assert!(std::fs::read(&o).unwrap() == std::fs::read(&files[1]).unwrap());
    let cfg = dir.path().join("config.json");
    std::fs::write(&cfg, b"old").unwrap();
    let r = lockstep(&["extract", s(&ar), "--file", "config.json", "-o", s(&cfg)]);
    assert!(!r.ok && r.err.contains("exists"), "{}", r.err);
    ok(&[
        "extract",
        s(&ar),
        "--file",
        "config.json",
        "-o",
        s(&cfg),
        "-f",
    ]);
    assert!(
        std::fs::read(&cfg).unwrap()
            == std::fs::read(run.join("checkpoint-200/config.json")).unwrap()
    );
}

#[test]
fn list_tensors_and_diff_say_what_is_stored_and_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("step1.safetensors");
    write_ckpt(&a, &small_model(), 1);
    let mut changed = small_model();
    changed.retain(|(n, _, _)| *n != "h.0.ln.bias"); // removed
    changed.push(("h.2.new.weight", vec![32, 32], true)); // added
    changed[1].1 = vec![48, 192]; // reshaped
    let b = dir.path().join("step2.safetensors");
    write_ckpt(&b, &changed, 2);
    let ar = dir.path().join("run.lstp");
    ok(&["pack", s(&a), s(&b), "-o", s(&ar)]);

    let v = json(&["list", s(&ar), "--tensors", "--json"]);
    let cks = v["checkpoints"].as_array().unwrap();
    assert_eq!(cks.len(), 2);
    let t2: Vec<&Value> = cks[1]["tensors"].as_array().unwrap().iter().collect();
    let get = |name: &str| *t2.iter().find(|t| t["name"] == name).unwrap();
    assert_eq!(get("emb.weight")["coding"], "delta");
    assert_eq!(get("emb.weight")["reference_step"], 1);
    assert_eq!(get("emb.weight")["chain"], 2);
    assert_eq!(get("h.0.attn.weight")["coding"], "anchor"); // reshaped: standalone
    assert_eq!(
        get("h.0.attn.weight")["shape"],
        serde_json::json!([48, 192])
    );
    assert_eq!(get("h.2.new.weight")["coding"], "anchor");
    assert_eq!(get("h.0.attn.weight")["dtype"], "BF16");
    assert_eq!(get("emb.weight")["bytes"], 64 * 96 * 2);
    let stored: u64 = t2.iter().map(|t| t["stored_bytes"].as_u64().unwrap()).sum();
    assert!(stored > 0 && stored < cks[1]["files"][0]["bytes"].as_u64().unwrap());
    // The table form names the tensors too.
    let table = ok(&["list", s(&ar), "--tensors", "--step", "2"]);
    assert!(
        table.contains("h.2.new.weight") && table.contains("on step 1 (chain 2)"),
        "{table}"
    );

    let d = json(&["diff", s(&ar), "1", "2", "--json"]);
    let change = |name: &str| {
        d["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .map(|t| t["change"].as_str().unwrap().to_string())
    };
    assert_eq!(change("h.0.ln.bias").as_deref(), Some("removed"));
    assert_eq!(change("h.2.new.weight").as_deref(), Some("added"));
    assert_eq!(change("h.0.attn.weight").as_deref(), Some("retyped"));
    assert_eq!(change("emb.weight").as_deref(), Some("changed"));
    assert_eq!(d["files"][0]["change"], "changed");
    assert_eq!(d["tensor_counts"]["removed"], 1);
    // --elements decodes and counts what differs; a step against itself is all the same.
    let d = json(&["diff", s(&ar), "1", "2", "--elements", "--json"]);
    let emb = d["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "emb.weight")
        .unwrap()
        .clone();
    let n = emb["changed_elements"].as_u64().unwrap();
    assert!(n > 0 && n <= 64 * 96, "{emb}");
    let same = json(&["diff", s(&ar), "2", "2", "--json"]);
    assert_eq!(same["tensor_counts"]["changed"], 0);
    assert!(same["tensors"].as_array().unwrap().is_empty());
    let text = ok(&["diff", s(&ar), "1", "2"]);
    assert!(
        text.contains("removed") && text.contains("h.0.ln.bias"),
        "{text}"
    );
    // No such step: exit 1, the steps named.
    let r = lockstep(&["diff", s(&ar), "1", "9"]);
    assert!(
        !r.ok && r.err.contains("no checkpoint at step 9"),
        "{}",
        r.err
    );
}

#[test]
fn extract_one_tensor_or_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let files = three_steps(dir.path());
    let ar = dir.path().join("run.lstp");
    ok(&["pack", s(&files[0]), s(&files[1]), "-o", s(&ar)]);
    let original = std::fs::read(&files[1]).unwrap();
    let st = safetensors::SafeTensors::deserialize(&original).unwrap();
    let want = st.tensor("h.1.mlp.weight").unwrap();

    // A one-tensor safetensors file: same name, dtype, shape and bytes.
    let o = dir.path().join("w.safetensors");
    ok(&[
        "extract",
        s(&ar),
        "--step",
        "2",
        "--tensor",
        "h.1.mlp.weight",
        "-o",
        s(&o),
    ]);
    let bytes = std::fs::read(&o).unwrap();
    let got = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(got.names(), ["h.1.mlp.weight"]);
    let t = got.tensor("h.1.mlp.weight").unwrap();
    assert_eq!(
        (t.dtype(), t.shape(), t.data()),
        (want.dtype(), want.shape(), want.data())
    );
    // --raw: the bytes alone. Over an existing file only with --force.
    let raw = dir.path().join("w.bin");
    let args = [
        "extract",
        s(&ar),
        "--step",
        "2",
        "--tensor",
        "h.1.mlp.weight",
        "--raw",
        "-o",
        s(&raw),
    ];
    ok(&args);
    assert!(std::fs::read(&raw).unwrap() == want.data());
    let r = lockstep(&args);
    assert!(!r.ok && r.err.contains("exists"), "{}", r.err);
    // Unknown names say where to look.
    let r = lockstep(&["extract", s(&ar), "--tensor", "nope", "-o", s(&o), "-f"]);
    assert!(!r.ok && r.err.contains("no tensor 'nope'"), "{}", r.err);
    let r = lockstep(&["extract", s(&ar), "--file", "nope", "-o", s(&o), "-f"]);
    assert!(
        !r.ok && r.err.contains("no file 'nope'") && r.err.contains("step2.safetensors"),
        "{}",
        r.err
    );
    // --file of a single-file checkpoint is that file; into a directory it keeps its name.
    let into = dir.path().join("into");
    std::fs::create_dir(&into).unwrap();
    ok(&[
        "extract",
        s(&ar),
        "--step",
        "1",
        "--file",
        "step1.safetensors",
        "-o",
        s(&into),
    ]);
    assert!(
        std::fs::read(into.join("step1.safetensors")).unwrap() == std::fs::read(&files[0]).unwrap()
    );
}

#[test]
fn pack_orders_named_steps_and_explains_pickle_files() {
    let dir = tempfile::tempdir().unwrap();
    // What `run/step*.safetensors` expands to: step1000 before step200.
    let (a, b) = (
        dir.path().join("step1000.safetensors"),
        dir.path().join("step200.safetensors"),
    );
    write_ckpt(&a, &small_model(), 1000);
    write_ckpt(&b, &small_model(), 200);
    let ar = dir.path().join("run.lstp");
    let r = lockstep(&["pack", s(&a), s(&b), "-o", s(&ar)]);
    assert!(r.ok, "{}", r.err);
    assert!(r.err.contains("order of the steps"), "{}", r.err);
    let v = json(&["list", s(&ar), "--json"]);
    assert_eq!(v["checkpoints"][0]["step"], 200);
    assert_eq!(v["checkpoints"][1]["step"], 1000);
    // --steps keeps the order given.
    let ar2 = dir.path().join("given.lstp");
    ok(&["pack", s(&a), s(&b), "-o", s(&ar2), "--steps", "1,2"]);
    assert_eq!(
        json(&["list", s(&ar2), "--json"])["checkpoints"][0]["label"],
        "step1000.safetensors"
    );

    // Pickle checkpoints: said so, with what to do.
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    std::fs::write(hf.join("pytorch_model.bin"), b"not read").unwrap();
    std::fs::write(hf.join("config.json"), b"{}").unwrap();
    for target in [hf.clone(), hf.join("pytorch_model.bin")] {
        let r = lockstep(&["pack", s(&target), "-o", s(&dir.path().join("x.lstp"))]);
        assert!(!r.ok);
        assert!(
            r.err.contains("pytorch_model.bin")
                && r.err.contains("not read")
                && r.err.contains("safetensors"),
            "{}",
            r.err
        );
    }
    let run = dir.path().join("run");
    std::fs::create_dir_all(run.join("checkpoint-1")).unwrap();
    std::fs::write(run.join("checkpoint-1/model.pt"), b"x").unwrap();
    let r = lockstep(&["pack", s(&run), "-o", s(&dir.path().join("y.lstp"))]);
    assert!(
        !r.ok && r.err.contains("checkpoint-1/model.pt") && r.err.contains("not read"),
        "{}",
        r.err
    );
}

#[test]
fn an_fp32_checkpoint_after_bf16_ones_is_listed_as_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let bf = dir.path().join("step1.safetensors");
    write_ckpt(&bf, &small_model(), 1);
    let fp32: Vec<Spec> = small_model()
        .into_iter()
        .map(|(n, s, _)| (n, s, false))
        .collect();
    let fp = dir.path().join("step2.safetensors");
    write_ckpt(&fp, &fp32, 2);
    let ar = dir.path().join("run.lstp");
    ok(&["pack", s(&bf), "-o", s(&ar)]);
    let v = json(&["append", s(&ar), s(&fp), "--json"]);
    assert_eq!(v["stored_as"], "anchor");
    assert_eq!(v["deltas"], 0);
    let l = json(&["list", s(&ar), "--json"]);
    assert_eq!(l["checkpoints"][1]["keyframe"], false);
    assert_eq!(l["checkpoints"][1]["stored_as"], "anchor");
    let table = ok(&["list", s(&ar)]);
    let row = table.lines().find(|l| l.contains("step2")).unwrap();
    assert!(row.contains("anchor") && !row.contains("delta"), "{row}");
    let st = json(&["stats", s(&ar), "--json"]);
    assert_eq!(st["stored_as"]["anchor"], 1);
    assert_eq!(st["stored_as"]["delta"], 0);
    // The same checkpoint again stores nothing new.
    let again = dir.path().join("step3.safetensors");
    std::fs::copy(&fp, &again).unwrap();
    assert_eq!(
        json(&["append", s(&ar), s(&again), "--json"])["stored_as"],
        "reused"
    );
}
