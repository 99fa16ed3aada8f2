//! Replays every fuzz finding (`tests/fuzz_regressions/<target>/*`) and every committed seed
//! (`fuzz/seeds/<target>/*`) through the same harness the cargo-fuzz target runs
//! (`fuzz/src/lib.rs`, included here), on stable Rust: each must return (an error is fine)
//! without panicking, within a time and memory bound. See fuzz/README.md.
//!
//! `cargo test --release --test fuzz_regressions -- --ignored write_fuzz_seeds` rewrites the
//! seeds from files lockstep writes.

#[path = "../fuzz/src/lib.rs"]
mod harness;
#[path = "lm_common/random_model.rs"]
mod random_model;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Counts live heap bytes (and their peak) and refuses to go above `HEAP_LIMIT`: the
/// gigabyte allocations a hostile input can cause fail fast here instead of swapping CI.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// The most heap one replay (plus the loaded text model) may hold.
const HEAP_LIMIT: usize = 2 << 30;
/// The most wall time one replay may take.
const TIME_LIMIT: Duration = Duration::from_secs(10);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        if now > HEAP_LIMIT {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            return std::ptr::null_mut();
        }
        PEAK.fetch_max(now, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        if now > HEAP_LIMIT {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            return std::ptr::null_mut();
        }
        PEAK.fetch_max(now, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        if new_size > old {
            let grow = new_size - old;
            let now = LIVE.fetch_add(grow, Ordering::Relaxed) + grow;
            if now > HEAP_LIMIT {
                LIVE.fetch_sub(grow, Ordering::Relaxed);
                return std::ptr::null_mut();
            }
            PEAK.fetch_max(now, Ordering::Relaxed);
        } else {
            LIVE.fetch_sub(old - new_size, Ordering::Relaxed);
        }
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if p.is_null() {
            if new_size > old {
                LIVE.fetch_sub(new_size - old, Ordering::Relaxed);
            } else {
                LIVE.fetch_add(old - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// One replay at a time, so each one's time and peak memory are its own.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

/// `tests/fuzz_regressions/KNOWN_OPEN`: findings whose fix has not landed, one
/// `<target>/<file>  reason` a line. The replay skips them (saying so); `known_open` replays
/// them. Delete a line with the fix.
fn known_open() -> Vec<(String, String)> {
    let p = Path::new(ROOT).join("tests/fuzz_regressions/KNOWN_OPEN");
    let text = std::fs::read_to_string(p).unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once(char::is_whitespace) {
            Some((f, why)) => (f.to_string(), why.trim().to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect()
}

/// Replay every regression file and seed of `target` (`open`: only the known open ones).
fn replay(target: &str) {
    replay_files(target, false)
}

fn replay_files(target: &str, open: bool) {
    let f = harness::TARGETS
        .iter()
        .find(|(n, _)| *n == target)
        .expect("a known target")
        .1;
    let root = Path::new(ROOT);
    let known = known_open();
    let is_open = |p: &Path| {
        let rel = p.strip_prefix(root.join("tests/fuzz_regressions")).ok()?;
        let rel = rel.to_string_lossy().to_string();
        known
            .iter()
            .find(|(f, _)| *f == rel)
            .map(|(_, why)| why.clone())
    };
    let mut files = files_in(&root.join("tests/fuzz_regressions").join(target));
    if open {
        files.retain(|p| is_open(p).is_some());
    } else {
        files.retain(|p| match is_open(p) {
            Some(why) => {
                eprintln!("SKIP {}: open defect ({why})", p.display());
                false
            }
            None => true,
        });
        files.extend(files_in(&root.join("fuzz/seeds").join(target)));
    }
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut failures = Vec::new();
    for p in &files {
        let data = std::fs::read(p).unwrap();
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let t = Instant::now();
        let r = std::panic::catch_unwind(|| f(&data));
        let took = t.elapsed();
        let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
        let name = p.strip_prefix(root).unwrap_or(p).display().to_string();
        if let Err(e) = r {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{name}: panicked: {msg}"));
        } else if took > TIME_LIMIT {
            failures.push(format!("{name}: took {took:?} (limit {TIME_LIMIT:?})"));
        }
        eprintln!("{name}: {took:?}, peak heap {} KiB", peak >> 10);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn fuzz_blob_decode() {
    replay("blob_decode");
}

#[test]
fn fuzz_lsd_read() {
    replay("lsd_read");
}

#[test]
fn fuzz_archive_read() {
    replay("archive_read");
}

#[test]
fn fuzz_text_decode() {
    replay("text_decode");
}

#[test]
fn fuzz_model_load() {
    replay("model_load");
}

#[test]
fn fuzz_rans_decode() {
    replay("rans_decode");
}

#[test]
fn fuzz_range_decode() {
    replay("range_decode");
}

#[test]
fn fuzz_safetensors_input() {
    replay("safetensors_input");
}

/// The known open findings (KNOWN_OPEN): run by hand to check a fix, e.g.
/// `cargo test --release --test fuzz_regressions -- --ignored known_open`.
#[test]
#[ignore = "replays findings whose fix has not landed (slow or failing until then)"]
fn known_open_findings() {
    for (target, _) in harness::TARGETS {
        replay_files(target, true);
    }
}

// ---- seeds ----

use lockstep::delta::{self, EncodeOptions, LayoutChoice, TensorPair};
use lockstep::dtype::DType;

/// `reference` moved by a few units in the last place (as little-endian integers of `size`
/// bytes), every `every`-th element left alone.
fn nudged(reference: &[u8], size: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut out = reference.to_vec();
    for (i, e) in out.chunks_mut(size).enumerate() {
        if i % 3 == 0 {
            continue;
        }
        let step = (harness::splitmix(&mut s) % 7) as u8;
        let (v, carry) = e[0].overflowing_add(step);
        e[0] = v;
        if carry && size > 1 {
            e[1] = e[1].wrapping_add(1);
        }
    }
    out
}

fn write_seed(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(ROOT).join("fuzz/seeds").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// Rewrite `fuzz/seeds/`: small files of every format, as lockstep writes them.
#[test]
#[ignore = "writes the committed seed corpus; run by hand"]
fn write_fuzz_seeds() {
    let _ = std::fs::remove_dir_all(Path::new(ROOT).join("fuzz/seeds"));
    // Tensor blobs (and, for the small modeled ones, the rANS inputs).
    let cases: [(&str, DType, Vec<u64>, LayoutChoice, bool); 10] = [
        (
            "bf16_auto",
            DType::BF16,
            vec![8, 40],
            LayoutChoice::Auto,
            true,
        ),
        (
            "bf16_paper",
            DType::BF16,
            vec![8, 40],
            LayoutChoice::Paper,
            true,
        ),
        (
            "bf16_fast",
            DType::BF16,
            vec![320],
            LayoutChoice::Fast,
            true,
        ),
        (
            "bf16_no_er",
            DType::BF16,
            vec![4, 64],
            LayoutChoice::Signed,
            false,
        ),
        ("f32", DType::F32, vec![33], LayoutChoice::Auto, true),
        ("f16", DType::F16, vec![2, 48], LayoutChoice::Auto, true),
        ("f64", DType::F64, vec![40], LayoutChoice::Signed, true),
        (
            "f8e4m3",
            DType::F8E4M3,
            vec![2, 64],
            LayoutChoice::Auto,
            true,
        ),
        (
            "f8e5m2_fast",
            DType::F8E5M2,
            vec![100],
            LayoutChoice::Fast,
            true,
        ),
        ("i64", DType::I64, vec![5], LayoutChoice::Auto, true),
    ];
    for (name, dtype, shape, layout, cond) in cases {
        let n: u64 = shape.iter().product();
        let size = dtype.size();
        let reference = harness::reference_bytes(n as usize * size);
        let target = nudged(&reference, size, n);
        let opts = EncodeOptions {
            layout,
            condition_on_exponent: cond,
        };
        let pair = TensorPair {
            dtype,
            shape: &shape,
            reference: &reference,
            target: &target,
        };
        let (blob, _) =
            delta::encode_tensor(&pair, &opts, &lockstep::backend::cpu::CpuBackend).unwrap();
        assert_eq!(
            delta::decode_tensor(&blob, &reference, &lockstep::backend::cpu::CpuBackend).unwrap(),
            target
        );
        write_seed("blob_decode", &format!("{name}.lsdb"), &blob);
        if let Some(r) = harness::rans_input_from_blob(&blob) {
            write_seed("rans_decode", &format!("{name}.bin"), &r);
        }
    }
    for (name, target) in [
        ("identical", harness::reference_bytes(64)),
        ("raw", harness::reference_bytes(65)[1..].to_vec()),
    ] {
        let reference = harness::reference_bytes(64);
        let pair = TensorPair {
            dtype: DType::BF16,
            shape: &[32],
            reference: &reference,
            target: &target,
        };
        let (blob, _) = delta::encode_tensor(
            &pair,
            &Default::default(),
            &lockstep::backend::cpu::CpuBackend,
        )
        .unwrap();
        write_seed("blob_decode", &format!("{name}.lsdb"), &blob);
    }

    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // .lsd against the harness's reference checkpoint.
    let refs = harness::lsd_reference_tensors();
    let target: Vec<_> = refs
        .iter()
        .map(|(n, d, s, b)| {
            let size = DType::from_safetensors_name(d).unwrap().size();
            (*n, *d, s.clone(), nudged(b, size, 7))
        })
        .collect();
    std::fs::write(t.join("ref.safetensors"), harness::safetensors_bytes(&refs)).unwrap();
    std::fs::write(
        t.join("tgt.safetensors"),
        harness::safetensors_bytes(&target),
    )
    .unwrap();
    let ck_ref = lockstep::checkpoint::Checkpoint::open(t.join("ref.safetensors")).unwrap();
    let ck_tgt = lockstep::checkpoint::Checkpoint::open(t.join("tgt.safetensors")).unwrap();
    for (name, opts) in [
        ("default.lsd", EncodeOptions::default()),
        (
            "fast.lsd",
            EncodeOptions {
                layout: LayoutChoice::Fast,
                condition_on_exponent: true,
            },
        ),
    ] {
        let out = t.join(name);
        delta::file::encode_file(
            &ck_ref,
            &ck_tgt,
            &out,
            &opts,
            1 << 20,
            &lockstep::backend::Device::cpu(),
        )
        .unwrap();
        write_seed("lsd_read", name, &std::fs::read(&out).unwrap());
    }
    let out = t.join("self.lsd");
    delta::file::encode_file(
        &ck_ref,
        &ck_ref,
        &out,
        &Default::default(),
        1 << 20,
        &lockstep::backend::Device::cpu(),
    )
    .unwrap();
    write_seed("lsd_read", "identical.lsd", &std::fs::read(&out).unwrap());

    // Archives: three small checkpoints, keyframe interval 2 (anchor, delta, anchor).
    use lockstep::archive::{self, Archive, PackOptions};
    let mut files = Vec::new();
    for (i, seed) in [(100u64, 1u64), (200, 2), (300, 3)] {
        let tensors: Vec<_> = refs
            .iter()
            .take(3)
            .map(|(n, d, s, b)| {
                let size = DType::from_safetensors_name(d).unwrap().size();
                (*n, *d, s.clone(), nudged(b, size, seed))
            })
            .collect();
        let p = t.join(format!("step{i}.safetensors"));
        std::fs::write(&p, harness::safetensors_bytes(&tensors)).unwrap();
        files.push(p);
    }
    let srcs = archive::resolve_many(&files).unwrap();
    let opts = PackOptions {
        keyframe_interval: 2,
        ..Default::default()
    };
    let ar = t.join("run.lstp");
    archive::pack(&ar, &srcs[..2], None, &opts, &|_| {}).unwrap();
    write_seed(
        "archive_read",
        "two_steps.lstp",
        &std::fs::read(&ar).unwrap(),
    );
    archive::append(&ar, &srcs[2], None, &opts, &|_| {}).unwrap();
    let bytes = std::fs::read(&ar).unwrap();
    assert!(Archive::open(&ar).unwrap().verify(&|_| {}).unwrap().ok());
    write_seed("archive_read", "three_steps.lstp", &bytes);
    // An interrupted append's tail, and a directory checkpoint with a verbatim file.
    let mut tail = bytes.clone();
    tail.extend_from_slice(&bytes[16..200.min(bytes.len())]);
    write_seed("archive_read", "with_tail.lstp", &tail);
    let dir = t.join("checkpoint-400");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&files[0], dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("config.json"), b"{\"n_layer\": 2}\n").unwrap();
    let ar2 = t.join("dir.lstp");
    archive::pack(
        &ar2,
        &[archive::resolve(&dir).unwrap()],
        None,
        &opts,
        &|_| {},
    )
    .unwrap();
    write_seed(
        "archive_read",
        "directory.lstp",
        &std::fs::read(&ar2).unwrap(),
    );

    // Text streams with the shipped model.
    use lockstep::lm::text_codec::{compress, Options};
    let model = harness::text_model();
    let texts: [(&str, &[u8], Options); 3] = [
        (
            "hello.lst",
            b"Hello, world! The quick brown fox.",
            Options::default(),
        ),
        (
            "segments.lst",
            b"one two three four five six seven eight nine ten eleven twelve",
            Options {
                segment_tokens: Some(4),
                match_model: true,
            },
        ),
        (
            "no_match.lst",
            b"fn main() { println!(\"hi\"); }\n",
            Options {
                segment_tokens: None,
                match_model: false,
            },
        ),
    ];
    for (name, text, o) in texts {
        write_seed(
            "text_decode",
            name,
            &compress(model, text, &o, &lockstep::backend::Device::cpu()).unwrap(),
        );
    }
    write_seed(
        "text_decode",
        "empty.lst",
        &compress(
            model,
            b"",
            &Options::default(),
            &lockstep::backend::Device::cpu(),
        )
        .unwrap(),
    );

    // A tiny random model (the shipped one is 8 MB).
    let mut m = random_model::random_model(1, 8, 2, 8, 16, 1);
    let bytes = m.to_bytes();
    assert!(lockstep::format::lm::model_file::Model::from_bytes(&bytes).is_ok());
    write_seed("model_load", "tiny.lsm", &bytes);

    // Range coder: a skewed table and a flat one, with symbols.
    write_seed(
        "range_decode",
        "skewed.bin",
        &[3, 255, 1, 1, 0, 1, 0, 0, 2, 1, 0, 0, 0],
    );
    let flat: Vec<u8> = (0..120u8).map(|i| i.wrapping_mul(37)).collect();
    write_seed("range_decode", "flat.bin", &flat);

    // Checkpoints.
    write_seed(
        "safetensors_input",
        "small.safetensors",
        &harness::safetensors_bytes(&refs),
    );
    write_seed(
        "safetensors_input",
        "odd_dtypes.safetensors",
        &harness::safetensors_bytes(&[
            ("flags", "BOOL", vec![4], vec![0, 1, 1, 0]),
            ("c", "C64", vec![2], harness::reference_bytes(16)),
            ("e", "F8_E5M2", vec![3, 3], harness::reference_bytes(9)),
            ("empty", "F32", vec![0], vec![]),
        ]),
    );
    write_seed(
        "safetensors_input",
        "no_tensors.safetensors",
        &harness::safetensors_bytes(&[]),
    );
}
