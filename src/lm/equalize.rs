//! Outlier-channel equalization (docs/INTEGER_GPT2.md §7).
//!
//! GPT-2's LayerNorm outputs have a few channels far larger than the rest; per-token int8
//! quantization then spends its range on them. The converter first builds the plain integer
//! model, runs it (integers only, so deterministic) over a fixed calibration text to find each
//! LayerNorm output channel's largest magnitude, then divides that channel by a power of two
//! 2^c and multiplies the matching weight row by 2^c. Powers of two only move float32
//! exponents, so the folded model is the same real function and conversion stays exact.

use super::convert::{convert_bytes, input_channel_log2_max, Equalization};
use super::tokenizer;
use crate::backend::lm::{Item, Trace};
use crate::backend::Device;
use crate::format::lm::model_file::{Model, FLN};
use crate::Result;

/// Fixed calibration text (English prose, Python, numbers, markup).
pub const CALIBRATION_TEXT: &str = "\
The quick brown fox jumps over the lazy dog. Alice was beginning to get very tired of sitting \
by her sister on the bank, and of having nothing to do: once or twice she had peeped into the \
book her sister was reading, but it had no pictures or conversations in it.\n\n\
def wrap(text, width=70, **kwargs):\n    \"\"\"Wrap a single paragraph of text, returning a list of wrapped lines.\"\"\"\n\
    w = TextWrapper(width=width, **kwargs)\n    return w.wrap(text)\n\n\
for i in range(10):\n    print(i, i ** 2, hex(i))\n\n\
Compression is prediction: a model that assigns probability p to the next symbol can code it \
in -log2(p) bits. In 1951 Shannon estimated the entropy of English at about 1.3 bits per letter. \
Table 3: 2019-04-01 12:00:00 INFO server started on port 8080 (pid 4312)\n\
<p>See <a href=\"https://docs.python.org/3/library/textwrap.html\">textwrap</a> for details.</p>\n\
The module provides some convenience functions, as well as TextWrapper, the class that does all \
the work. If you are just wrapping or filling one or two text strings, the convenience functions \
should be good enough; otherwise, you should use an instance of TextWrapper for efficiency.\n";

/// Per-channel maxima of every LayerNorm output over the calibration text.
/// Conversion runs on the CPU: the maxima are integers every device computes alike.
pub fn calibrate(model: &Model) -> Result<Trace> {
    let d = model.config.n_embd as usize;
    let nl = model.config.n_layer as usize;
    let mut stats = Trace::new(nl, d);
    let lm = Device::cpu();
    let toks = tokenizer::encode(CALIBRATION_TEXT.as_bytes())?;
    let c = (model.config.n_ctx as usize).max(2);
    for chunk in toks.chunks(c - 1) {
        let mut session = lm.lm()?.load(model, 1, model.config.n_ctx as usize)?;
        let items: Vec<Item> = std::iter::once(tokenizer::EOT)
            .chain(chunk.iter().copied())
            .filter(|&t| t < model.config.vocab)
            .map(|t| Item {
                seq: 0,
                token: t,
                query: None,
            })
            .collect();
        session.step_traced(&items, &mut stats)?;
    }
    Ok(stats)
}

fn log2_floor(v: i64) -> Option<i32> {
    (v > 0).then(|| 63 - v.leading_zeros() as i32)
}

/// Exponents c_i = floor((r_i - median r) / 2) clamped to [-8, 8], r_i = log2(act_i) - log2(w_i).
fn exponents(act: &[i64], wlog: &[i32]) -> Vec<i32> {
    let r: Vec<Option<i32>> = act
        .iter()
        .zip(wlog)
        .map(|(&a, &w)| log2_floor(a).map(|la| la - FLN - w))
        .collect();
    let mut sorted: Vec<i32> = r.iter().flatten().copied().collect();
    if sorted.is_empty() {
        return vec![0; act.len()];
    }
    sorted.sort_unstable();
    let med = sorted[sorted.len() / 2];
    r.iter()
        .map(|x| x.map_or(0, |x| (x - med).div_euclid(2).clamp(-8, 8)))
        .collect()
}

/// Choose the equalization exponents for a checkpoint.
pub fn choose(st_bytes: &[u8], plain: &Model) -> Result<Equalization> {
    let stats = calibrate(plain)?;
    let mut eq = Equalization::default();
    for l in 0..plain.config.n_layer as usize {
        let w1 = input_channel_log2_max(st_bytes, &format!("h.{l}.attn.c_attn"))?;
        let w2 = input_channel_log2_max(st_bytes, &format!("h.{l}.mlp.c_fc"))?;
        eq.ln1.push(exponents(&stats.ln1[l], &w1));
        eq.ln2.push(exponents(&stats.ln2[l], &w2));
    }
    Ok(eq)
}

/// Convert with equalization: plain model -> calibration -> exponents -> folded model.
pub fn convert_equalized(config_text: &str, st_bytes: &[u8]) -> Result<Model> {
    let plain = convert_bytes(config_text, st_bytes, None)?;
    let eq = choose(st_bytes, &plain)?;
    convert_bytes(config_text, st_bytes, Some(&eq))
}
