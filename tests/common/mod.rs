//! Helpers shared by the integration tests.
#![allow(dead_code)]

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
