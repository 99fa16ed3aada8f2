//! Validation against the float32 golden logits of tinygpt2 (PyTorch), a float64 reference
//! forward that localizes the integer model's error layer by layer, outlier handling, and the
//! pinned hash of the converted model. Skips (with a message) when ../shared/data is absent.

mod lm_common;

use std::sync::OnceLock;

use lm_common::*;
use lockstep::backend::lm::{Find, Item, Query, Trace};
use lockstep::backend::Device;
use lockstep::format::lm::model_file::{Model, FR};
use lockstep::lm::{convert, equalize};

/// blake3 of `lockstep model convert ../shared/data/tinygpt2` (equalized, the default).
const TINYGPT2_HASH: &str = "50f467f58ceabd9b69354acbd0c2cbb16ad4cd4772b68e8a9dcc8ecd1f4beeb6";

struct Data {
    config: String,
    st: Vec<u8>,
    golden: Vec<Golden>,
}

fn data() -> Option<&'static Data> {
    static D: OnceLock<Option<Data>> = OnceLock::new();
    D.get_or_init(|| {
        let dir = tinygpt2_dir()?;
        Some(Data {
            config: std::fs::read_to_string(dir.join("config.json")).unwrap(),
            st: std::fs::read(dir.join("model.safetensors")).unwrap(),
            golden: golden(&dir),
        })
    })
    .as_ref()
}

fn equalized() -> Option<&'static Model> {
    static M: OnceLock<Option<Model>> = OnceLock::new();
    M.get_or_init(|| {
        let d = data()?;
        Some(equalize::convert_equalized(&d.config, &d.st).unwrap())
    })
    .as_ref()
}

/// One item per token, each asking about the token after it (the last about token 0): the
/// trace then holds every position's logits and frequency table.
fn every_position(tokens: &[u32]) -> Vec<Item> {
    tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| Item {
            seq: 0,
            token: t,
            query: Some(Query {
                find: Find::Symbol(tokens.get(i + 1).copied().unwrap_or(0)),
                mix: None,
            }),
        })
        .collect()
}

/// Integer bits (from the coder's frequencies), float bits (from the golden logits), top-1
/// agreement, over every prediction of every golden file.
fn score(model: &Model, g: &Golden) -> (f64, f64, usize, usize) {
    let v = model.config.vocab as usize;
    let items = every_position(&g.tokens);
    let mut trace = Trace::default();
    let dev = Device::cpu();
    let mut lm = dev
        .lm()
        .unwrap()
        .load(model, 1, model.config.n_ctx as usize)
        .unwrap();
    lm.step_traced(&items, &mut trace).unwrap();
    let (mut bi, mut bf, mut agree) = (0.0, 0.0, 0);
    let n = g.tokens.len() - 1;
    for i in 0..n {
        let li = &trace.logits[i * v..(i + 1) * v];
        let f = &trace.freqs[i];
        let next = g.tokens[i + 1] as usize;
        bi += -(f[next] as f64 / 2f64.powi(32)).log2();
        let lf: Vec<f64> = g.logits[i * v..(i + 1) * v]
            .iter()
            .map(|&x| x as f64)
            .collect();
        bf += float_bits(&lf, next);
        // integer argmax: lowest id among the maxima, like the coder's tie rule
        agree += (argmax(li) == argmax(&lf)) as usize;
    }
    (bi, bf, agree, n)
}

#[test]
fn integer_cross_entropy_within_2_percent_of_float() {
    let (Some(d), Some(m)) = (data(), equalized()) else {
        return;
    };
    let (mut ti, mut tf, mut ta, mut tn) = (0.0, 0.0, 0, 0);
    for g in &d.golden {
        let (bi, bf, agree, n) = score(m, g);
        eprintln!(
            "{}: integer {:.2} bits, float {:.2} bits, ratio {:.4}, top-1 agreement {agree}/{n}",
            g.name,
            bi,
            bf,
            bi / bf
        );
        assert!(bi <= bf * 1.02, "{}: integer {bi} vs float {bf}", g.name);
        (ti, tf, ta, tn) = (ti + bi, tf + bf, ta + agree, tn + n);
    }
    eprintln!(
        "all: integer {ti:.2} bits, float {tf:.2} bits, ratio {:.4}, top-1 {ta}/{tn}",
        ti / tf
    );
    assert!(ta * 10 >= tn * 9, "top-1 agreement {ta}/{tn} below 90%");
}

#[test]
fn float64_reference_matches_golden_and_localizes_error() {
    let (Some(d), Some(m)) = (data(), equalized()) else {
        return;
    };
    let r = RefModel::load(&d.config, &d.st);
    let g = &d.golden[2]; // custom64
    let toks = &g.tokens[..24];
    let (ref_logits, ref_resid) = r.forward(toks);
    let max_diff = ref_logits
        .iter()
        .zip(&g.logits)
        .map(|(a, &b)| (a - b as f64).abs())
        .fold(0.0, f64::max);
    eprintln!("float64 reference vs PyTorch float32 golden: max |logit diff| {max_diff:.2e}");
    assert!(max_diff < 1e-3);
    let mut stats = Trace::default();
    let dev = Device::cpu();
    let mut lm = dev
        .lm()
        .unwrap()
        .load(m, 1, m.config.n_ctx as usize)
        .unwrap();
    lm.step_traced(&every_position(toks), &mut stats).unwrap();
    let logits = &stats.logits;
    for (l, (hi, hr)) in stats.resid.iter().zip(&ref_resid).enumerate() {
        let (mut err, mut norm) = (0.0, 0.0);
        for (&a, &b) in hi.iter().zip(hr) {
            let x = a as f64 / (1u64 << FR) as f64;
            err += (x - b) * (x - b);
            norm += b * b;
        }
        let rel = (err / norm).sqrt();
        eprintln!("layer {l}: residual relative RMS error {rel:.2e}");
        assert!(rel < 0.05, "layer {l}: {rel}");
    }
    let (mut err, mut norm) = (0.0, 0.0);
    for (&a, &b) in logits.iter().zip(&ref_logits) {
        let x = a as f64 / 256.0;
        err += (x - b) * (x - b);
        norm += b * b;
    }
    eprintln!("logits: relative RMS error {:.2e}", (err / norm).sqrt());
    assert!((err / norm).sqrt() < 0.05);
}

#[test]
fn outlier_channels_are_equalized() {
    let Some(d) = data() else {
        return;
    };
    // Outliers of 2^11 = 2048x on three channels of every LayerNorm output.
    let st = with_outliers(&d.st, 4, &[5, 77, 100], 11);
    let plain = convert::convert_bytes(&d.config, &st, None).unwrap();
    let eq = equalize::convert_equalized(&d.config, &st).unwrap();
    let ratio = |m: &Model| {
        let (mut bi, mut bf) = (0.0, 0.0);
        for g in &d.golden {
            let (a, b, _, _) = score(m, g);
            bi += a;
            bf += b;
        }
        bi / bf
    };
    let (rp, re) = (ratio(&plain), ratio(&eq));
    eprintln!(
        "injected 2048x outlier channels: integer/float bits {rp:.4} without equalization, {re:.4} with"
    );
    assert!(re <= 1.02, "equalized ratio {re}");
    assert!(re < rp, "equalization did not help: {re} vs {rp}");
}

#[test]
fn conversion_is_pinned_and_matches_the_shipped_model() {
    let Some(m) = equalized() else {
        return;
    };
    assert_eq!(m.hash_hex(), TINYGPT2_HASH);
    let shipped =
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/models/tinygpt2.lsm")).unwrap();
    let mut m2 = m.clone();
    assert!(
        m2.to_bytes() == shipped,
        "models/tinygpt2.lsm differs from a fresh conversion"
    );
    assert_eq!(Model::from_bytes(&shipped).unwrap().hash, m.hash);
}

#[test]
fn openai_gpt2_layout_converts_to_the_same_model() {
    let (Some(d), Some(m)) = (data(), equalized()) else {
        return;
    };
    let st = as_openai_layout(&d.st, 4, 256);
    let m2 = equalize::convert_equalized(&d.config, &st).unwrap();
    assert_eq!(m2.hash, m.hash);
}
