//! Small safetensors fixtures for the archive tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{serialize, Dtype, TensorView};

pub const TRAJ: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../shared/data/trajectory-gpt2"
);

/// The shared trajectory file, or `None` (with a note) when the data is absent.
pub fn shared(name: &str) -> Option<PathBuf> {
    let p = Path::new(TRAJ).join(name);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipping: {} is absent", p.display());
        None
    }
}

pub fn lcg(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 11
}

/// Deterministic "weights" of tensor `name` at training step `step`: a fixed random base plus
/// a drift growing with the step, cast to bf16 or kept f32.
pub fn weights(name: &str, n: usize, step: u64, bf16: bool) -> Vec<u8> {
    let mut seed = name
        .bytes()
        .fold(17u64, |a, b| a.wrapping_mul(31).wrapping_add(b as u64));
    let mut drift_seed = seed ^ 0x9e37;
    (0..n)
        .flat_map(|_| {
            let base = ((lcg(&mut seed) % 20001) as f32 - 10000.0) * 2e-6;
            let drift = ((lcg(&mut drift_seed) % 201) as f32 - 100.0) * 1e-7 * step as f32;
            let v = base + drift;
            if bf16 {
                half::bf16::from_f32(v).to_le_bytes().to_vec()
            } else {
                v.to_le_bytes().to_vec()
            }
        })
        .collect()
}

/// One tensor spec: name, shape, bf16 (else f32).
pub type Spec<'a> = (&'a str, Vec<usize>, bool);

/// Serialize tensors at `step` to a safetensors file.
pub fn write_ckpt(path: &Path, specs: &[Spec], step: u64) {
    let data: Vec<(String, Vec<u8>, Vec<usize>, bool)> = specs
        .iter()
        .map(|(name, shape, bf16)| {
            let n = shape.iter().product();
            (
                name.to_string(),
                weights(name, n, step, *bf16),
                shape.clone(),
                *bf16,
            )
        })
        .collect();
    let views: Vec<(String, TensorView)> = data
        .iter()
        .map(|(name, bytes, shape, bf16)| {
            let dt = if *bf16 { Dtype::BF16 } else { Dtype::F32 };
            (
                name.clone(),
                TensorView::new(dt, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    std::fs::write(path, serialize(views, Some(meta)).unwrap()).unwrap();
}

/// A small model's tensors.
pub fn small_model() -> Vec<Spec<'static>> {
    vec![
        ("emb.weight", vec![64, 96], true),
        ("h.0.attn.weight", vec![96, 96], true),
        ("h.0.ln.weight", vec![96], true),
        ("h.0.ln.bias", vec![96], true),
        ("h.1.mlp.weight", vec![96, 128], true),
        ("head.scale", vec![4], false),
    ]
}

/// A save_pretrained-style sharded checkpoint directory.
pub fn write_sharded(dir: &Path, step: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let all = small_model();
    let (a, b) = all.split_at(3);
    write_ckpt(&dir.join("model-00001-of-00002.safetensors"), a, step);
    write_ckpt(&dir.join("model-00002-of-00002.safetensors"), b, step);
    let mut map = serde_json::Map::new();
    for (name, _, _) in a {
        map.insert(name.to_string(), "model-00001-of-00002.safetensors".into());
    }
    for (name, _, _) in b {
        map.insert(name.to_string(), "model-00002-of-00002.safetensors".into());
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec_pretty(&index).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join("config.json"), b"{\"n_layer\": 2}\n").unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        format!("{{\"step\": {step}}}\n"),
    )
    .unwrap();
}

/// Every regular file under `dir`, relative path → bytes.
pub fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    fn walk(root: &Path, d: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    walk(dir, dir, &mut out);
    out.sort();
    out
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_lockstep")
}
