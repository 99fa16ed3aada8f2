//! Bits per byte of the context-mixing coder per component, on files given as arguments:
//! `cargo run --release --example cm_gains -- [--lm] FILE...` (measure before building on).

use lockstep::backend::Device;
use lockstep::format::lm::model_file::Model;
use lockstep::lm::cm::coder::{encode, Setup};

fn main() -> lockstep::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let with_lm = args.iter().any(|a| a == "--lm");
    let model = Model::from_bytes(&std::fs::read("models/tinygpt2.lsm").expect("model"))?;
    let device = Device::cpu();
    for f in args.iter().filter(|a| !a.starts_with("--")) {
        let data = std::fs::read(f).expect("input");
        let mut setups = vec![
            (
                "cm",
                Setup {
                    lm: None,
                    match_model: true,
                },
            ),
            (
                "cm-nomatch",
                Setup {
                    lm: None,
                    match_model: false,
                },
            ),
        ];
        if with_lm {
            setups.push((
                "cm+lm",
                Setup {
                    lm: Some((&model, device.lm()?)),
                    match_model: true,
                },
            ));
        }
        for (name, s) in setups {
            let t = std::time::Instant::now();
            let (out, toks) = encode(&data, s, &|_, _| {})?;
            let secs = t.elapsed().as_secs_f64();
            println!(
                "{f}\t{name}\t{} B\t{:.4} bpb\t{:.1} KB/s\t{toks} tokens",
                out.len(),
                out.len() as f64 * 8.0 / data.len() as f64,
                data.len() as f64 / secs / 1e3
            );
        }
    }
    Ok(())
}
