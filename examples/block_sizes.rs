//! What cutting the input into independently coded blocks costs in size (the price of
//! decoding blocks in lockstep): `cargo run --release --example block_sizes -- FILE...`
//! prints, per file and block length, the coded bytes of the context-mixing coder with the
//! LM (payloads only; each block restarts every model).

use lockstep::backend::Device;
use lockstep::format::lm::model_file::Model;
use lockstep::lm::cm::coder::{encode, Setup};

fn main() -> lockstep::Result<()> {
    let model = Model::from_bytes(&std::fs::read("models/tinygpt2.lsm").expect("model"))?;
    let device = Device::cpu();
    let setup = Setup {
        lm: Some((&model, device.lm()?)),
        match_model: true,
    };
    for f in std::env::args().skip(1) {
        let data = std::fs::read(&f).expect("input");
        let mut whole = 0;
        for block in [usize::MAX, 32 << 10, 16 << 10, 8 << 10, 4 << 10] {
            if block != usize::MAX && block >= data.len() {
                continue;
            }
            let mut bytes = 0;
            for part in data.chunks(block.min(data.len())) {
                bytes += encode(part, setup, &|_, _| {})?.0.len();
            }
            if block == usize::MAX {
                whole = bytes;
            }
            println!(
                "{f}\tblock {}\t{bytes} B\t{:.4} bpb\t+{:.2}%",
                if block == usize::MAX {
                    "whole".to_string()
                } else {
                    format!("{}K", block >> 10)
                },
                bytes as f64 * 8.0 / data.len() as f64,
                (bytes as f64 / whole as f64 - 1.0) * 100.0
            );
        }
    }
    Ok(())
}
