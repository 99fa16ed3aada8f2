use lockstep::lm::{convert, forward, freq};
use safetensors::SafeTensors;

#[test]
fn quick() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/data/tinygpt2");
    let t0 = std::time::Instant::now();
    let model = convert::convert_path(std::path::Path::new(dir), false).unwrap();
    eprintln!("convert {:?}", t0.elapsed());
    for name in ["alice29", "pydoc_textwrap", "custom64"] {
        let bytes = std::fs::read(format!("{dir}/golden/{name}.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let toks: Vec<u32> = st
            .tensor("tokens")
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
            .collect();
        let lg: Vec<f32> = st
            .tensor("logits")
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let v = 50257;
        let mut caches = vec![forward::KvCache::new(model.config.n_layer as usize)];
        let items: Vec<_> = toks
            .iter()
            .map(|&t| forward::Item {
                cache: 0,
                token: t,
                want_logits: true,
            })
            .collect();
        let t0 = std::time::Instant::now();
        let logits = forward::forward(&model, &mut caches, &items, None).unwrap();
        eprintln!("forward {:?}", t0.elapsed());
        let (mut bi, mut bf, mut agree) = (0f64, 0f64, 0);
        for i in 0..toks.len() - 1 {
            let li = &logits[i * v..(i + 1) * v];
            let f = freq::frequencies(li, &model.tables.exp40).unwrap();
            let nt = toks[i + 1] as usize;
            bi += -((f[nt] as f64) / 2f64.powi(32)).log2();
            let lf = &lg[i * v..(i + 1) * v];
            let mx = lf.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let z: f64 = lf.iter().map(|&x| ((x as f64) - mx).exp()).sum();
            bf += -(((lf[nt] as f64 - mx).exp() / z).log2());
            let ai = li
                .iter()
                .enumerate()
                .max_by_key(|(j, &x)| (x, std::cmp::Reverse(*j)))
                .unwrap()
                .0;
            let af = lf
                .iter()
                .enumerate()
                .fold((0, f32::MIN), |a, (j, &x)| if x > a.1 { (j, x) } else { a })
                .0;
            agree += (ai == af) as usize;
            if i < 3 {
                eprintln!(
                    "{i} int {:?} float {:?}",
                    &li[..5]
                        .iter()
                        .map(|&x| x as f64 / 256.0)
                        .collect::<Vec<_>>(),
                    &lf[..5]
                );
            }
        }
        eprintln!(
            "{name}: int {bi:.2} bits float {bf:.2} bits ratio {:.4} top1 {agree}/{}",
            bi / bf,
            toks.len() - 1
        );
    }
}
