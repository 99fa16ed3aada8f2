//! Throughput of the context-mixing text codec (stream version 2) per model, codec only (no
//! verifying decode, no file I/O): `cargo run --release --example text_speed -- FILE [BYTES]`
//! codes the first BYTES (default 16384) of FILE with the shipped tinygpt2 and with a random
//! GPT-2-small-shaped model (12 x 768, vocab 50257), and prints, per model: the adaptive
//! models alone (encode), with the LM (encode, batched), the decode of one block, the
//! decode of the same bytes cut into 4 blocks (lockstep), and the encode and decode of 4
//! strands (shared models, one range coder). A third argument, `tiny` or `small`, runs only
//! that model (for profiles).

#[path = "../tests/lm_common/random_model.rs"]
mod random_model;

use std::time::Instant;

use lockstep::backend::Device;
use lockstep::format::lm::model_file::Model;
use lockstep::lm::cm::coder::{decode, decode_blocks, encode, Setup};
use lockstep::lm::cm::strands::{decode_strands, encode_strands};

fn main() -> lockstep::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let text = std::fs::read(&args[0]).expect("input");
    let n: usize = args.get(1).map_or(16384, |a| a.parse().expect("BYTES"));
    let only = args.get(2).map(String::as_str);
    let data = &text[..n.min(text.len())];
    let device = Device::cpu();
    let tiny = Model::from_bytes(&std::fs::read("models/tinygpt2.lsm").expect("model"))?;
    let small = random_model::random_model(12, 768, 12, 1024, 50257, 1);
    println!("device: {}", device.lm()?.describe());
    for (name, model) in [("tinygpt2", &tiny), ("gpt2-small shape", &small)] {
        if only.is_some_and(|o| !name.starts_with(o) && !name.contains(o)) {
            continue;
        }
        let kb = |secs: f64| data.len() as f64 / secs / 1e3;
        let alone = Setup {
            lm: None,
            match_model: true,
        };
        let t = Instant::now();
        encode(data, alone, &|_, _| {})?;
        let alone_s = t.elapsed().as_secs_f64();
        let with = Setup {
            lm: Some((model, device.lm()?)),
            match_model: true,
        };
        let t = Instant::now();
        let (coded, tokens) = encode(data, with, &|_, _| {})?;
        let enc_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let back = decode(&coded, data.len() as u64, with, &|_, _| {})?;
        let dec_s = t.elapsed().as_secs_f64();
        assert_eq!(back, data);
        let parts: Vec<&[u8]> = data.chunks(data.len().div_ceil(4).max(1)).collect();
        let coded4: Vec<Vec<u8>> = parts
            .iter()
            .map(|p| encode(p, with, &|_, _| {}).map(|c| c.0))
            .collect::<lockstep::Result<_>>()?;
        let blocks: Vec<(&[u8], u64)> = coded4
            .iter()
            .zip(&parts)
            .map(|(c, p)| (c.as_slice(), p.len() as u64))
            .collect();
        let t = Instant::now();
        let back = decode_blocks(&blocks, with, &|_, _| {})?;
        let dec4_s = t.elapsed().as_secs_f64();
        assert_eq!(back, data);
        let size4: usize = coded4.iter().map(Vec::len).sum();
        let t = Instant::now();
        let (strands4, _) = encode_strands(data, 4, with, &|_, _| {})?;
        let enc_s4_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let back = decode_strands(&strands4, data.len() as u64, 4, with, &|_, _| {})?;
        let dec_s4_s = t.elapsed().as_secs_f64();
        assert_eq!(back, data);
        println!(
            "{name}: {} B, {tokens} LM tokens | alone {:.1} KB/s | LM encode {:.2} KB/s \
             ({:.0} tokens/s), {} B | decode 1 block {:.2} KB/s | decode 4 blocks {:.2} KB/s, \
             {size4} B | 4 strands encode {:.2} KB/s, decode {:.2} KB/s, {} B",
            data.len(),
            kb(alone_s),
            kb(enc_s),
            tokens as f64 / enc_s,
            coded.len(),
            kb(dec_s),
            kb(dec4_s),
            kb(enc_s4_s),
            kb(dec_s4_s),
            strands4.len(),
        );
    }
    Ok(())
}
