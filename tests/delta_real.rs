//! The real training run in ../shared/data/trajectory-gpt2: every adjacent pair round-trips to
//! the byte through the .lsd file format, and the default coder is never larger than the paper's
//! on any tensor beyond a few bytes.

mod common;

use lockstep::checkpoint::Checkpoint;
use lockstep::delta::file::{decode_file, encode_file};
use lockstep::delta::{
    encode_tensor, EncodeOptions, LayoutChoice, TensorPair, DEFAULT_BATCH_BYTES,
};

const BF16: [u32; 4] = [200, 400, 600, 800];

fn ckpt(step: u32, kind: &str) -> Option<Checkpoint> {
    let p = common::shared_data(&format!(
        "trajectory-gpt2/gpt2_step{step:06}_{kind}.safetensors"
    ))?;
    Some(Checkpoint::open(p).unwrap())
}

fn pairs() -> Vec<(Checkpoint, Checkpoint)> {
    let mut v = Vec::new();
    for w in BF16.windows(2) {
        if let (Some(a), Some(b)) = (ckpt(w[0], "bf16"), ckpt(w[1], "bf16")) {
            v.push((a, b));
        }
    }
    if let (Some(a), Some(b)) = (ckpt(600, "fp32"), ckpt(800, "fp32")) {
        v.push((a, b));
    }
    v
}

#[test]
fn every_adjacent_pair_roundtrips_through_lsd_files() {
    let dir = tempfile::tempdir().unwrap();
    for (r, t) in pairs() {
        let lsd = dir.path().join("d.lsd");
        let out = dir.path().join("back.safetensors");
        encode_file(
            &r,
            &t,
            &lsd,
            &EncodeOptions::default(),
            DEFAULT_BATCH_BYTES,
            &lockstep::backend::Device::cpu(),
        )
        .unwrap();
        decode_file(
            &r,
            &std::fs::read(&lsd).unwrap(),
            &out,
            &lockstep::backend::Device::cpu(),
        )
        .unwrap();
        assert!(
            std::fs::read(&out).unwrap() == t.bytes(),
            "{} not byte-identical",
            t.path.display()
        );
        let size = std::fs::metadata(&lsd).unwrap().len();
        eprintln!(
            "{} -> {}: {:.4} of the file",
            r.path.display(),
            t.path.display(),
            size as f64 / t.file_len() as f64
        );
        assert!(size < t.file_len() as u64 * 3 / 4);
    }
}

#[test]
fn default_is_never_larger_than_paper_mode_per_tensor() {
    for (r, t) in pairs() {
        let (mut paper_total, mut ours_total) = (0u64, 0u64);
        for e in &t.tensors {
            let pair = TensorPair {
                dtype: e.dtype,
                shape: &e.shape,
                reference: r.data(r.get(&e.name).unwrap()),
                target: t.data(e),
            };
            let paper = EncodeOptions {
                layout: LayoutChoice::Paper,
                ..EncodeOptions::default()
            };
            let (p, _) = encode_tensor(&pair, &paper, &lockstep::backend::cpu::CpuBackend).unwrap();
            let (o, _) = encode_tensor(
                &pair,
                &EncodeOptions::default(),
                &lockstep::backend::cpu::CpuBackend,
            )
            .unwrap();
            assert!(
                o.len() <= p.len() + 8,
                "{}: default {} > paper {}",
                e.name,
                o.len(),
                p.len()
            );
            paper_total += p.len() as u64;
            ours_total += o.len() as u64;
        }
        let gain = 1.0 - ours_total as f64 / paper_total as f64;
        eprintln!(
            "{}: default is {:.2}% smaller than paper mode",
            t.path.display(),
            100.0 * gain
        );
        assert!(ours_total < paper_total);
    }
}

/// Framing (headers, tables, chunk index, lane states) stays under 0.3% of the output for
/// tensors of a million elements or more (here the 6.4M-element token embedding) in the
/// Paper and Signed layouts. The default codes such a tensor in the Joint layout's neighbor
/// form, whose tables are larger (its contexts see the row above): under 1%, and the blob
/// still smaller than the Signed layout's, so the tables pay for themselves.
#[test]
fn framing_overhead_on_the_embedding_is_under_0_3_percent() {
    for (r, t) in pairs() {
        let e = t.get("transformer.wte.weight").unwrap();
        let pair = TensorPair {
            dtype: e.dtype,
            shape: &e.shape,
            reference: r.data(r.get(&e.name).unwrap()),
            target: t.data(e),
        };
        let blob = |layout| {
            let (_, rep) = encode_tensor(
                &pair,
                &EncodeOptions {
                    layout,
                    ..EncodeOptions::default()
                },
                &lockstep::backend::cpu::CpuBackend,
            )
            .unwrap();
            let share = rep.framing_bytes() as f64 / rep.blob_bytes as f64;
            eprintln!(
                "{} {layout:?}: framing {} of {} bytes = {:.4}%",
                t.path.display(),
                rep.framing_bytes(),
                rep.blob_bytes,
                100.0 * share
            );
            (rep, share)
        };
        let (_, paper) = blob(LayoutChoice::Paper);
        let (signed, share) = blob(LayoutChoice::Signed);
        for (layout, share) in [("Paper", paper), ("Signed", share)] {
            assert!(share < 0.003, "{layout}: framing {:.4}%", 100.0 * share);
        }
        let (auto, share) = blob(LayoutChoice::Auto);
        assert!(
            auto.j_neighbor,
            "the default did not code the embedding's neighbor form"
        );
        assert!(share < 0.01, "default: framing {:.4}%", 100.0 * share);
        assert!(
            auto.blob_bytes < signed.blob_bytes,
            "default {} bytes, Signed {}",
            auto.blob_bytes,
            signed.blob_bytes
        );
    }
}
