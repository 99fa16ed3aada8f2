//! Text codec speed: compress (without the verifying decode) and decompress, for the shipped
//! tinygpt2 model and a GPT-2-small-shaped model with random integer weights (n_layer 12,
//! n_embd 768, vocab 50257, built in memory). Throughput is in bytes of text; the token count
//! of each input is printed so tokens/s follow.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lockstep::format::lm::model_file::Model;
use lockstep::lm::equalize::CALIBRATION_TEXT;
#[path = "../tests/lm_common/random_model.rs"]
mod random_model;
use lockstep::lm::text_codec::{compress_unverified, decompress, Options};
use lockstep::lm::tokenizer;
use random_model::random_model;

fn bench_model(c: &mut Criterion, name: &str, model: &Model, text: &[u8], seg: u32) {
    let opts = Options {
        segment_tokens: Some(seg),
        ..Default::default()
    };
    let tokens = tokenizer::encode(text).unwrap().len();
    eprintln!(
        "{name}: {} bytes, {tokens} tokens, segments of {seg} tokens",
        text.len()
    );
    let packed =
        compress_unverified(model, text, &opts, &lockstep::backend::Device::cpu()).unwrap();
    assert_eq!(
        decompress(model, &packed, &lockstep::backend::Device::cpu()).unwrap(),
        text
    );
    let mut g = c.benchmark_group(format!("text/{name}"));
    g.sample_size(10);
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("compress", |b| {
        b.iter(|| {
            compress_unverified(model, text, &opts, &lockstep::backend::Device::cpu()).unwrap()
        })
    });
    g.bench_function("decompress", |b| {
        b.iter(|| decompress(model, &packed, &lockstep::backend::Device::cpu()).unwrap())
    });
    g.finish();
}

fn text(c: &mut Criterion) {
    let tiny = Model::from_bytes(include_bytes!("../models/tinygpt2.lsm")).unwrap();
    let t = CALIBRATION_TEXT.as_bytes().repeat(8);
    bench_model(c, "tinygpt2", &tiny, &t, 255);
    let small = random_model(12, 768, 12, 1024, 50257, 1);
    let t = CALIBRATION_TEXT.as_bytes().repeat(2);
    bench_model(c, "gpt2-small-random", &small, &t, 255);
}

criterion_group!(benches, text);
criterion_main!(benches);
