//! Helpers and small safetensors fixtures shared by the integration tests.
#![allow(dead_code)]

pub mod golden_cases;

use std::path::PathBuf;

/// `../shared/data/<rel>` if it exists; otherwise prints why the caller skips and returns None.
pub fn shared_data(rel: &str) -> Option<PathBuf> {
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/data")).join(rel);
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "SKIP: {} not found (the shared test data is absent on this machine)",
            p.display()
        );
        None
    }
}

/// SplitMix64: a tiny deterministic generator, so fixtures are the same on every machine.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// Roughly normal, mean 0, standard deviation 1 (sum of uniforms).
    pub fn gauss(&mut self) -> f64 {
        (0..12)
            .map(|_| (self.next() >> 11) as f64 / (1u64 << 53) as f64)
            .sum::<f64>()
            - 6.0
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// A weight-like reference tensor and a trained-a-little target, as bf16 bytes: values
/// ~N(0, 0.02), the target moved by a few ULPs with a sign that follows the reference's.
pub fn bf16_pair(n: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = Rng(seed);
    let mut r = Vec::with_capacity(2 * n);
    let mut t = Vec::with_capacity(2 * n);
    for _ in 0..n {
        let v = half::bf16::from_f64(rng.gauss() * 0.02);
        let step = (rng.gauss() * 3.0) as i32 - if v.to_f64() > 0.0 { 1 } else { 0 };
        let moved = half::bf16::from_bits((v.to_bits() as i32 + step).clamp(0, 0xffff) as u16);
        r.extend_from_slice(&v.to_bits().to_le_bytes());
        t.extend_from_slice(&moved.to_bits().to_le_bytes());
    }
    (r, t)
}

/// Write a safetensors file from (name, dtype name, shape, bytes), tensors in the given order.
pub fn write_safetensors(path: &std::path::Path, tensors: &[(&str, &str, Vec<u64>, Vec<u8>)]) {
    let mut header = String::from("{\"__metadata__\":{\"format\":\"pt\"}");
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let shape: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        header.push_str(&format!(
            ",\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            shape.join(","),
            data.len(),
            data.len() + bytes.len()
        ));
        data.extend_from_slice(bytes);
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

/// A small two-checkpoint fixture: bf16 matrices, an f32 vector and int64 position ids.
pub fn small_pair(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (r1, t1) = bf16_pair(64 * 96, 1);
    let (r2, t2) = bf16_pair(4096, 2);
    let f32r: Vec<u8> = (0..300)
        .flat_map(|i| (i as f32 * 0.01).to_le_bytes())
        .collect();
    let f32t: Vec<u8> = (0..300)
        .flat_map(|i| (i as f32 * 0.01 + 1e-6).to_le_bytes())
        .collect();
    let ids: Vec<u8> = (0..256i64).flat_map(|i| i.to_le_bytes()).collect();
    let a = dir.join("a.safetensors");
    let b = dir.join("b.safetensors");
    write_safetensors(
        &a,
        &[
            ("layer.weight", "BF16", vec![64, 96], r1),
            ("layer2.weight", "BF16", vec![4096], r2),
            ("norm", "F32", vec![300], f32r),
            ("position_ids", "I64", vec![1, 256], ids.clone()),
        ],
    );
    write_safetensors(
        &b,
        &[
            ("layer.weight", "BF16", vec![64, 96], t1),
            ("layer2.weight", "BF16", vec![4096], t2),
            ("norm", "F32", vec![300], f32t),
            ("position_ids", "I64", vec![1, 256], ids),
        ],
    );
    (a, b)
}

// ---- archive fixtures ----

use std::collections::HashMap;
use std::path::Path;

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
