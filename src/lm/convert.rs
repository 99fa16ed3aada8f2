//! Hugging Face GPT-2 checkpoint (`config.json` + `model.safetensors`) to the integer model.
//!
//! No floating-point arithmetic: every weight's bits are read as an integer mantissa and
//! exponent ([`ExactF32`]) and each stored integer is one exact rational rounded once, half to
//! even. The same input gives the same bytes on any machine.

use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use crate::format::lm::fixed::{round_half_even, round_scaled, ExactF32};
use crate::format::lm::model_file::*;
use crate::{Error, Result};

/// A checkpoint's tensors as exact values.
struct Checkpoint<'a> {
    st: SafeTensors<'a>,
    prefix: &'static str,
}

struct Tensor {
    shape: Vec<usize>,
    v: Vec<ExactF32>,
}

impl<'a> Checkpoint<'a> {
    fn get(&self, name: &str) -> Result<Tensor> {
        let full = format!("{}{}", self.prefix, name);
        let t = self
            .st
            .tensor(&full)
            .map_err(|_| Error::format("checkpoint", format!("missing tensor {full}")))?;
        let data = t.data();
        let bits: Vec<u32> = match t.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            // bf16 is the top half of a float32: widening is exact.
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|c| (u16::from_le_bytes(c.try_into().unwrap()) as u32) << 16)
                .collect(),
            // f16 -> f32 widening is exact; done on the bits with integers.
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|c| f16_bits_to_f32_bits(u16::from_le_bytes(c.try_into().unwrap())))
                .collect(),
            d => {
                return Err(Error::Unsupported(format!(
                    "tensor {full} has dtype {d:?} (F32, BF16, F16 supported)"
                )))
            }
        };
        let v = bits
            .into_iter()
            .map(|b| {
                ExactF32::from_bits(b)
                    .ok_or_else(|| Error::Invalid(format!("tensor {full} holds NaN or infinity")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor {
            shape: t.shape().to_vec(),
            v,
        })
    }

    fn get_shaped(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.get(name)?;
        if t.shape != shape {
            return Err(Error::Mismatch(format!(
                "tensor {name}: shape {:?}, expected {shape:?}",
                t.shape
            )));
        }
        Ok(t)
    }
}

/// Widen IEEE half-precision bits to single-precision bits (exact; integer operations only).
pub fn f16_bits_to_f32_bits(h: u16) -> u32 {
    let sign = ((h >> 15) as u32) << 31;
    let e = ((h >> 10) & 0x1f) as u32;
    let f = (h & 0x3ff) as u32;
    match e {
        0 if f == 0 => sign,
        0 => {
            // subnormal: f * 2^-24; normalize so the leading 1 is bit 10.
            let shift = f.leading_zeros() - 21; // bits to move the top set bit to position 10
            let mant = (f << shift) & 0x3ff;
            let exp = 127 - 15 + 1 - shift;
            sign | (exp << 23) | (mant << 13)
        }
        0x1f => sign | 0x7f80_0000 | (f << 13),
        _ => sign | ((e + 127 - 15) << 23) | (f << 13),
    }
}

/// Parse a JSON number's text (`1e-05`, `0.00001`, `1E-5`) into an exact rational `num / den`.
fn parse_decimal(s: &str) -> Option<(i128, i128)> {
    let s = s.trim();
    let (mant, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], s[i + 1..].parse::<i32>().ok()?),
        None => (s, 0),
    };
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let (int, frac) = match mant.find('.') {
        Some(i) => (&mant[..i], &mant[i + 1..]),
        None => (mant, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let digits = format!("{int}{frac}");
    if !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 30 {
        return None;
    }
    let mut num: i128 = digits.parse().ok()?;
    let e10 = exp - frac.len() as i32;
    if !(-30..=30).contains(&e10) {
        return None;
    }
    let mut den: i128 = 1;
    if e10 >= 0 {
        num = num.checked_mul(10i128.checked_pow(e10 as u32)?)?;
    } else {
        den = 10i128.pow((-e10) as u32);
    }
    Some((if neg { -num } else { num }, den))
}

/// Find `"key": <number>` in JSON text and return the number's text (so it never becomes a float).
fn raw_json_number<'t>(text: &'t str, key: &str) -> Option<&'t str> {
    let pat = format!("\"{key}\"");
    let i = text.find(&pat)? + pat.len();
    let rest = text[i..].trim_start().strip_prefix(':')?.trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

fn read_config(text: &str) -> Result<Config> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::format("config.json", e.to_string()))?;
    let int = |keys: &[&str]| -> Result<u32> {
        for k in keys {
            if let Some(v) = json.get(*k).and_then(|v| v.as_u64()) {
                return u32::try_from(v)
                    .map_err(|_| Error::format("config.json", format!("{k} too large")));
            }
        }
        Err(Error::format("config.json", format!("missing {}", keys[0])))
    };
    if let Some(act) = json.get("activation_function").and_then(|v| v.as_str()) {
        if act != "gelu_new" && act != "gelu_pytorch_tanh" {
            return Err(Error::Unsupported(format!(
                "activation_function {act} (only GPT-2's gelu_new)"
            )));
        }
    }
    if let Some(n_inner) = json.get("n_inner").and_then(|v| v.as_u64()) {
        let d = int(&["n_embd"])? as u64;
        if n_inner != 4 * d {
            return Err(Error::Unsupported(format!(
                "n_inner {n_inner} != 4 * n_embd"
            )));
        }
    }
    let eps_text = raw_json_number(text, "layer_norm_epsilon").unwrap_or("1e-5");
    let (num, den) = parse_decimal(eps_text)
        .ok_or_else(|| Error::format("config.json", format!("layer_norm_epsilon {eps_text}")))?;
    let eps_q = round_half_even(num << (2 * FR + 2 * LN_G), den);
    let config = Config {
        n_layer: int(&["n_layer"])?,
        n_embd: int(&["n_embd"])?,
        n_head: int(&["n_head"])?,
        n_ctx: int(&["n_positions", "n_ctx"])?,
        vocab: int(&["vocab_size"])?,
        flags: 0,
        eps_q: eps_q as i64,
    };
    validate_config(&config)?;
    Ok(config)
}

fn to_i32(v: i128, what: &str, max: i64) -> Result<i32> {
    if v.unsigned_abs() > max as u128 {
        return Err(Error::Unsupported(format!(
            "{what}: value {v} exceeds the integer format (|v| <= {max})"
        )));
    }
    Ok(v as i32)
}

/// Quantize a matrix given as `value(row j, column k)` (rows = outputs) with per-row scales.
fn quantize_linear(
    rows: usize,
    k: usize,
    value: impl Fn(usize, usize) -> ExactF32 + Sync,
    bias: Option<&Tensor>,
    out_frac: i32,
    what: &str,
) -> Result<Linear> {
    use rayon::prelude::*;
    // (int8 row, scale mantissa, scale exponent, bias) per output row
    type Row = (Vec<i8>, i64, i32, i32);
    let per_row: Vec<Result<Row>> = (0..rows)
        .into_par_iter()
        .map(|j| {
            let mut max = ExactF32 {
                neg: false,
                mant: 0,
                exp: 0,
            };
            for c in 0..k {
                let v = value(j, c);
                if v.abs_cmp(&max) == std::cmp::Ordering::Greater {
                    max = v;
                }
            }
            let mut q = vec![0i8; k];
            let (m, e) = if max.is_zero() {
                (0i64, 0i32)
            } else {
                let mm = max.mant as i128;
                for (c, o) in q.iter_mut().enumerate() {
                    // 127 * v / max, exactly: mant_v * 127 * 2^(e_v - e_max) / mant_max
                    *o = round_scaled(value(j, c), 127, -max.exp, mm) as i8;
                }
                // scale = max / 127 = m * 2^-e, m in [2^30, 2^31): m = mant_max * 2^(exp_max + e) / 127
                let mut sh = 37 - (31 - max.mant.leading_zeros() as i32);
                loop {
                    let m = if sh >= 0 {
                        round_half_even(mm << sh, 127)
                    } else {
                        round_half_even(mm, 127i128 << (-sh))
                    };
                    if m >= 1 << 31 {
                        sh -= 1;
                    } else if m < 1 << 30 {
                        sh += 1;
                    } else {
                        let e = sh - max.exp;
                        if !(i16::MIN as i32..=i16::MAX as i32).contains(&e) {
                            return Err(Error::Unsupported(format!("{what}: scale out of range")));
                        }
                        break (m as i64, e);
                    }
                }
            };
            let b = match bias {
                Some(b) => to_i32(round_scaled(b.v[j], 1, out_frac, 1), what, 1 << 30)?,
                None => 0,
            };
            Ok((q, m, e, b))
        })
        .collect();
    let mut lin = Linear {
        rows,
        k,
        w: Vec::with_capacity(rows * k),
        m: Vec::with_capacity(rows),
        e: Vec::with_capacity(rows),
        bias: Vec::with_capacity(rows),
        row_sum: Vec::new(),
    };
    for r in per_row {
        let (q, m, e, b) = r?;
        lin.w.extend_from_slice(&q);
        lin.m.push(m);
        lin.e.push(e);
        lin.bias.push(b);
    }
    lin.row_sum = Linear::row_sums(&lin.w, k);
    Ok(lin)
}

/// Conv1D weight [in, out] with per-input-channel power-of-two factors 2^c[in].
fn conv1d(
    ck: &Checkpoint,
    name: &str,
    n_in: usize,
    n_out: usize,
    out_frac: i32,
    c: Option<&[i32]>,
) -> Result<Linear> {
    let w = ck.get_shaped(&format!("{name}.weight"), &[n_in, n_out])?;
    let b = ck.get_shaped(&format!("{name}.bias"), &[n_out])?;
    quantize_linear(
        n_out,
        n_in,
        |j, k| {
            let mut v = w.v[k * n_out + j];
            if let Some(c) = c {
                v.exp += c[k];
            }
            v
        },
        Some(&b),
        out_frac,
        name,
    )
}

fn layer_norm(ck: &Checkpoint, name: &str, d: usize, c: Option<&[i32]>) -> Result<LayerNorm> {
    let g = ck.get_shaped(&format!("{name}.weight"), &[d])?;
    let b = ck.get_shaped(&format!("{name}.bias"), &[d])?;
    let ci = |i: usize| c.map_or(0, |c| c[i]);
    Ok(LayerNorm {
        gamma: (0..d)
            .map(|i| to_i32(round_scaled(g.v[i], 1, FGAMMA - ci(i), 1), name, 1 << 30))
            .collect::<Result<_>>()?,
        beta: (0..d)
            .map(|i| {
                let v = round_scaled(b.v[i], 1, FLN - ci(i), 1);
                if v.unsigned_abs() > 1 << 40 {
                    return Err(Error::Unsupported(format!("{name}: beta {v} beyond 2^40")));
                }
                Ok(v as i64)
            })
            .collect::<Result<_>>()?,
    })
}

/// Per-layer equalization exponents: `ln1[l][i]`, `ln2[l][i]` (docs §7).
#[derive(Clone, Debug, Default)]
pub struct Equalization {
    pub ln1: Vec<Vec<i32>>,
    pub ln2: Vec<Vec<i32>>,
}

/// Resolve a directory or a `.safetensors` path to (config.json, model.safetensors).
pub fn checkpoint_paths(input: &Path) -> Result<(PathBuf, PathBuf)> {
    if input.is_dir() {
        Ok((input.join("config.json"), input.join("model.safetensors")))
    } else {
        let dir = input.parent().unwrap_or(Path::new("."));
        Ok((dir.join("config.json"), input.to_path_buf()))
    }
}

/// Convert checkpoint bytes to an integer model (no equalization applied when `eq` is None).
pub fn convert_bytes(
    config_text: &str,
    st_bytes: &[u8],
    eq: Option<&Equalization>,
) -> Result<Model> {
    let mut config = read_config(config_text)?;
    let st = SafeTensors::deserialize(st_bytes)
        .map_err(|e| Error::format("model.safetensors", e.to_string()))?;
    let prefix = if st.names().iter().any(|n| n.starts_with("transformer.")) {
        "transformer."
    } else {
        ""
    };
    let ck = Checkpoint { st, prefix };
    let (d, vocab, ctx) = (
        config.n_embd as usize,
        config.vocab as usize,
        config.n_ctx as usize,
    );
    let wte_t = ck.get_shaped("wte.weight", &[vocab, d])?;
    let wte = quantize_linear(vocab, d, |j, k| wte_t.v[j * d + k], None, 0, "wte")?;
    drop(wte_t);
    let wpe_t = ck.get_shaped("wpe.weight", &[ctx, d])?;
    let wpe = wpe_t
        .v
        .iter()
        .map(|&v| to_i32(round_scaled(v, 1, FR, 1), "wpe", RES_MAX))
        .collect::<Result<Vec<_>>>()?;
    let mut blocks = Vec::new();
    for l in 0..config.n_layer as usize {
        let c1 = eq.map(|e| e.ln1[l].as_slice());
        let c2 = eq.map(|e| e.ln2[l].as_slice());
        let p = format!("h.{l}");
        blocks.push(Block {
            ln1: layer_norm(&ck, &format!("{p}.ln_1"), d, c1)?,
            qkv: conv1d(&ck, &format!("{p}.attn.c_attn"), d, 3 * d, FQKV, c1)?,
            attn_proj: conv1d(&ck, &format!("{p}.attn.c_proj"), d, d, FR, None)?,
            ln2: layer_norm(&ck, &format!("{p}.ln_2"), d, c2)?,
            fc: conv1d(&ck, &format!("{p}.mlp.c_fc"), d, 4 * d, FGELU, c2)?,
            proj: conv1d(&ck, &format!("{p}.mlp.c_proj"), 4 * d, d, FR, None)?,
        });
    }
    let ln_f = layer_norm(&ck, "ln_f", d, None)?;
    if eq.is_some() {
        config.flags |= FLAG_EQUALIZED;
    }
    let tables = Tables::compute(config.n_embd / config.n_head);
    let mut model = Model {
        config,
        wte,
        wpe,
        blocks,
        ln_f,
        tables,
        hash: [0; 32],
    };
    model.to_bytes(); // sets the hash
    Ok(model)
}

/// Largest |W[i][j]| per input channel i of a Conv1D weight, as floor(log2).
pub fn input_channel_log2_max(st_bytes: &[u8], name: &str) -> Result<Vec<i32>> {
    let st = SafeTensors::deserialize(st_bytes)
        .map_err(|e| Error::format("model.safetensors", e.to_string()))?;
    let prefix = if st.names().iter().any(|n| n.starts_with("transformer.")) {
        "transformer."
    } else {
        ""
    };
    let ck = Checkpoint { st, prefix };
    let t = ck.get(&format!("{name}.weight"))?;
    if t.shape.len() != 2 {
        return Err(Error::format(
            "checkpoint",
            format!("{name} is not a matrix"),
        ));
    }
    let (n_in, n_out) = (t.shape[0], t.shape[1]);
    Ok((0..n_in)
        .map(|i| {
            t.v[i * n_out..(i + 1) * n_out]
                .iter()
                .filter(|v| !v.is_zero())
                .map(|v| v.log2_floor())
                .max()
                .unwrap_or(-200)
        })
        .collect())
}

/// Whether `input` is a sharded Hugging Face checkpoint: a `*.safetensors.index.json`, or a
/// directory with one and no `model.safetensors`.
fn is_sharded(input: &Path) -> bool {
    let is_index = |p: &Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(".safetensors.index.json"))
    };
    if input.is_dir() {
        !input.join("model.safetensors").exists()
            && std::fs::read_dir(input)
                .map(|d| d.flatten().any(|e| is_index(&e.path())))
                .unwrap_or(false)
    } else {
        is_index(input)
    }
}

/// The tensors of a sharded checkpoint as one safetensors buffer (what `convert_bytes`
/// reads). The shards are found and checked by the archive's input resolver.
fn merge_shards(input: &Path) -> Result<Vec<u8>> {
    let src = crate::archive::resolve(input)?;
    let files: Vec<_> = src.files.iter().filter(|f| f.safetensors).collect();
    let data: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(&f.path).map_err(|e| Error::io(&f.path, e)))
        .collect::<Result<_>>()?;
    let mut tensors = Vec::new();
    for (f, bytes) in files.iter().zip(&data) {
        let st = SafeTensors::deserialize(bytes)
            .map_err(|e| Error::format(f.path.display().to_string(), e.to_string()))?;
        tensors.extend(st.tensors());
    }
    safetensors::serialize(tensors, None)
        .map_err(|e| Error::format(input.display().to_string(), e.to_string()))
}

/// Read a checkpoint from disk (one `model.safetensors`, or the shards of a sharded one) and
/// convert it.
pub fn convert_path(input: &Path, equalize: bool) -> Result<Model> {
    let (cfg, bytes) = if is_sharded(input) {
        let dir = if input.is_dir() {
            input
        } else {
            input.parent().unwrap_or(Path::new("."))
        };
        (dir.join("config.json"), merge_shards(input)?)
    } else {
        let (cfg, st) = checkpoint_paths(input)?;
        let bytes = std::fs::read(&st).map_err(|e| Error::io(&st, e))?;
        (cfg, bytes)
    };
    let cfg_text = std::fs::read_to_string(&cfg).map_err(|e| Error::io(&cfg, e))?;
    if equalize {
        super::equalize::convert_equalized(&cfg_text, &bytes)
    } else {
        convert_bytes(&cfg_text, &bytes, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_widening_matches_the_half_crate() {
        for h in (0..=u16::MAX)
            .step_by(7)
            .chain([0, 1, 0x3ff, 0x400, 0x7bff, 0x8001])
        {
            let ours = f16_bits_to_f32_bits(h);
            let theirs = half::f16::from_bits(h).to_f32().to_bits();
            if half::f16::from_bits(h).is_nan() {
                assert!(f32::from_bits(ours).is_nan());
            } else {
                assert_eq!(ours, theirs, "{h:#x}");
            }
        }
    }

    #[test]
    fn decimal_parsing_is_exact() {
        assert_eq!(parse_decimal("1e-05"), Some((1, 100000)));
        assert_eq!(parse_decimal("0.00001"), Some((1, 100000)));
        assert_eq!(parse_decimal("2.5E1"), Some((25, 1)));
        assert_eq!(parse_decimal("abc"), None);
        let t = r#"{"layer_norm_epsilon": 1e-05, "x": 1}"#;
        assert_eq!(raw_json_number(t, "layer_norm_epsilon"), Some("1e-05"));
    }
}
