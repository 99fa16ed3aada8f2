//! Shared test helpers: the shared-data path (skipped when absent), golden loading, and a
//! float64 reference GPT-2 forward (test code only: the codec never uses floats).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use safetensors::SafeTensors;

pub fn tinygpt2_dir() -> Option<PathBuf> {
    let p = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/data/tinygpt2"
    ));
    if p.join("model.safetensors").exists() {
        Some(p)
    } else {
        eprintln!(
            "skipped: {} is absent (shared data not mounted)",
            p.display()
        );
        None
    }
}

pub struct Golden {
    pub name: String,
    pub tokens: Vec<u32>,
    pub logits: Vec<f32>,
}

pub fn golden(dir: &std::path::Path) -> Vec<Golden> {
    ["alice29", "pydoc_textwrap", "custom64"]
        .iter()
        .map(|name| {
            let bytes = std::fs::read(dir.join(format!("golden/{name}.safetensors"))).unwrap();
            let st = SafeTensors::deserialize(&bytes).unwrap();
            let tokens = st
                .tensor("tokens")
                .unwrap()
                .data()
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
                .collect();
            let logits = st
                .tensor("logits")
                .unwrap()
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            Golden {
                name: name.to_string(),
                tokens,
                logits,
            }
        })
        .collect()
}

/// -log2 softmax(logits)[target] in float64.
pub fn float_bits(logits: &[f64], target: usize) -> f64 {
    let mx = logits.iter().cloned().fold(f64::MIN, f64::max);
    let z: f64 = logits.iter().map(|&x| (x - mx).exp()).sum();
    -((logits[target] - mx) - z.ln()) / std::f64::consts::LN_2
}

pub fn argmax<T: PartialOrd + Copy>(v: &[T]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Float64 reference GPT-2 (Hugging Face layout, gelu_new, eps 1e-5).
pub struct RefModel {
    pub n_layer: usize,
    pub d: usize,
    pub n_head: usize,
    pub vocab: usize,
    t: HashMap<String, Vec<f64>>,
}

impl RefModel {
    pub fn load(config: &str, st_bytes: &[u8]) -> RefModel {
        let cfg: serde_json::Value = serde_json::from_str(config).unwrap();
        let st = SafeTensors::deserialize(st_bytes).unwrap();
        let mut t = HashMap::new();
        for (name, view) in st.tensors() {
            let v: Vec<f64> = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect();
            t.insert(name.trim_start_matches("transformer.").to_string(), v);
        }
        RefModel {
            n_layer: cfg["n_layer"].as_u64().unwrap() as usize,
            d: cfg["n_embd"].as_u64().unwrap() as usize,
            n_head: cfg["n_head"].as_u64().unwrap() as usize,
            vocab: cfg["vocab_size"].as_u64().unwrap() as usize,
            t,
        }
    }

    fn g(&self, n: &str) -> &[f64] {
        &self.t[n]
    }

    fn ln(&self, x: &[f64], name: &str) -> Vec<f64> {
        let (w, b) = (
            self.g(&format!("{name}.weight")),
            self.g(&format!("{name}.bias")),
        );
        let d = self.d;
        let mut out = vec![0.0; x.len()];
        for (row, o) in x.chunks(d).zip(out.chunks_mut(d)) {
            let mean = row.iter().sum::<f64>() / d as f64;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
            let inv = 1.0 / (var + 1e-5).sqrt();
            for i in 0..d {
                o[i] = (row[i] - mean) * inv * w[i] + b[i];
            }
        }
        out
    }

    fn conv1d(&self, x: &[f64], name: &str, n_in: usize, n_out: usize) -> Vec<f64> {
        let (w, b) = (
            self.g(&format!("{name}.weight")),
            self.g(&format!("{name}.bias")),
        );
        let n = x.len() / n_in;
        let mut out = vec![0.0; n * n_out];
        for t in 0..n {
            let o = &mut out[t * n_out..(t + 1) * n_out];
            o.copy_from_slice(b);
            for k in 0..n_in {
                let xv = x[t * n_in + k];
                for (oj, wj) in o.iter_mut().zip(&w[k * n_out..(k + 1) * n_out]) {
                    *oj += xv * wj;
                }
            }
        }
        out
    }

    /// Logits (T x vocab) and the residual stream after each block.
    pub fn forward(&self, toks: &[u32]) -> (Vec<f64>, Vec<Vec<f64>>) {
        let (d, n) = (self.d, toks.len());
        let (wte, wpe) = (self.g("wte.weight"), self.g("wpe.weight"));
        let mut h = vec![0.0; n * d];
        for (p, &t) in toks.iter().enumerate() {
            for i in 0..d {
                h[p * d + i] = wte[t as usize * d + i] + wpe[p * d + i];
            }
        }
        let hd = d / self.n_head;
        let mut resid = Vec::new();
        for l in 0..self.n_layer {
            let x = self.ln(&h, &format!("h.{l}.ln_1"));
            let qkv = self.conv1d(&x, &format!("h.{l}.attn.c_attn"), d, 3 * d);
            let mut att = vec![0.0; n * d];
            for hh in 0..self.n_head {
                for t in 0..n {
                    let q = &qkv[t * 3 * d + hh * hd..t * 3 * d + hh * hd + hd];
                    let sc: Vec<f64> = (0..=t)
                        .map(|s| {
                            let k = &qkv[s * 3 * d + d + hh * hd..s * 3 * d + d + hh * hd + hd];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = sc.iter().map(|s| (s - mx).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (s, es) in e.iter().enumerate() {
                        let v = &qkv[s * 3 * d + 2 * d + hh * hd..s * 3 * d + 2 * d + hh * hd + hd];
                        for i in 0..hd {
                            att[t * d + hh * hd + i] += es / z * v[i];
                        }
                    }
                }
            }
            let a = self.conv1d(&att, &format!("h.{l}.attn.c_proj"), d, d);
            h.iter_mut().zip(&a).for_each(|(x, y)| *x += y);
            let x = self.ln(&h, &format!("h.{l}.ln_2"));
            let mut f = self.conv1d(&x, &format!("h.{l}.mlp.c_fc"), d, 4 * d);
            for v in f.iter_mut() {
                let u = (2.0 / std::f64::consts::PI).sqrt() * (*v + 0.044715 * *v * *v * *v);
                *v = 0.5 * *v * (1.0 + u.tanh());
            }
            let p = self.conv1d(&f, &format!("h.{l}.mlp.c_proj"), 4 * d, d);
            h.iter_mut().zip(&p).for_each(|(x, y)| *x += y);
            resid.push(h.clone());
        }
        let x = self.ln(&h, "ln_f");
        let mut logits = vec![0.0; n * self.vocab];
        for t in 0..n {
            for j in 0..self.vocab {
                logits[t * self.vocab + j] = x[t * d..(t + 1) * d]
                    .iter()
                    .zip(&wte[j * d..(j + 1) * d])
                    .map(|(a, b)| a * b)
                    .sum();
            }
        }
        (logits, resid)
    }
}

/// A copy of a checkpoint with power-of-two outlier channels injected: LayerNorm γ and β of
/// `channels` multiplied by 2^`shift` and the consuming weight rows divided by 2^`shift`.
/// Scaling by a power of two is exact in float32, so the float model computes the same
/// function (the golden logits still hold) while its LayerNorm outputs now have outliers.
pub fn with_outliers(st_bytes: &[u8], n_layer: usize, channels: &[usize], shift: i32) -> Vec<u8> {
    use safetensors::tensor::TensorView;
    let st = SafeTensors::deserialize(st_bytes).unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        let mut data = view.data().to_vec();
        let short = name.trim_start_matches("transformer.").to_string();
        let scale = |data: &mut [u8], idx: usize, by: i32| {
            let b = u32::from_le_bytes(data[idx * 4..idx * 4 + 4].try_into().unwrap());
            let e = ((b >> 23) & 0xff) as i32;
            if e != 0 && e != 0xff {
                let nb = (b & !(0xff << 23)) | (((e + by) as u32 & 0xff) << 23);
                data[idx * 4..idx * 4 + 4].copy_from_slice(&nb.to_le_bytes());
            }
        };
        for l in 0..n_layer {
            for (ln, mat) in [("ln_1", "attn.c_attn"), ("ln_2", "mlp.c_fc")] {
                if short == format!("h.{l}.{ln}.weight") || short == format!("h.{l}.{ln}.bias") {
                    for &c in channels {
                        scale(&mut data, c, shift);
                    }
                }
                if short == format!("h.{l}.{mat}.weight") {
                    let n_out = view.shape()[1];
                    for &c in channels {
                        for j in 0..n_out {
                            scale(&mut data, c * n_out + j, -shift);
                        }
                    }
                }
            }
        }
        owned.push((name.to_string(), view.dtype(), view.shape().to_vec(), data));
    }
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, dt, sh, d)| (n.clone(), TensorView::new(*dt, sh.clone(), d).unwrap()))
        .collect();
    safetensors::serialize(views, None).unwrap()
}

/// A copy of a checkpoint in the `openai-community/gpt2` naming: no `transformer.` prefix,
/// plus the `h.N.attn.bias` causal-mask buffers that file carries (ignored by the converter).
pub fn as_openai_layout(st_bytes: &[u8], n_layer: usize, n_ctx: usize) -> Vec<u8> {
    use safetensors::tensor::TensorView;
    let st = SafeTensors::deserialize(st_bytes).unwrap();
    let mask: Vec<u8> = (0..n_ctx * n_ctx)
        .flat_map(|i| if i % n_ctx <= i / n_ctx { 1f32 } else { 0f32 }.to_le_bytes())
        .collect();
    let mut views: Vec<(String, TensorView)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n.trim_start_matches("transformer.").to_string(), v))
        .collect();
    for l in 0..n_layer {
        views.push((
            format!("h.{l}.attn.bias"),
            TensorView::new(safetensors::Dtype::F32, vec![1, 1, n_ctx, n_ctx], &mask).unwrap(),
        ));
    }
    safetensors::serialize(views, None).unwrap()
}
