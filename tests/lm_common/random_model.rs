//! Integer models with random weights, built directly in integers: e.g. a GPT-2-small shape
//! without a 500 MB file. Test and bench code, not the library (included with `#[path]`).

use lockstep::format::lm::model_file::*;

struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
}

fn linear(r: &mut Lcg, rows: usize, k: usize) -> Linear {
    // Uniform int8 weights with a per-row scale near 2^-12 (about 0.02 standard deviation
    // after the 1/sqrt(3) of a uniform law times 127 levels), zero bias.
    let w: Vec<i8> = (0..rows * k)
        .map(|_| ((r.next() % 255) as i32 - 127) as i8)
        .collect();
    Linear {
        rows,
        k,
        row_sum: Linear::row_sums(&w, k),
        w,
        m: (0..rows)
            .map(|_| (1i64 << 30) + (r.next() as i64 & 0x3fff_ffff))
            .collect(),
        e: vec![42; rows],
        bias: vec![0; rows],
    }
}

fn ln(d: usize) -> LayerNorm {
    LayerNorm {
        gamma: vec![1 << FGAMMA; d],
        beta: vec![0; d],
    }
}

/// A random model with GPT-2's structure; `hash` is set.
pub fn random_model(
    n_layer: u32,
    n_embd: u32,
    n_head: u32,
    n_ctx: u32,
    vocab: u32,
    seed: u64,
) -> Model {
    let mut r = Lcg(seed ^ 0x9e37_79b9_7f4a_7c15);
    let d = n_embd as usize;
    let config = Config {
        n_layer,
        n_embd,
        n_head,
        n_ctx,
        vocab,
        flags: 0,
        eps_q: 10995, // round(1e-5 * 2^40)
    };
    let mut wte = linear(&mut r, vocab as usize, d);
    // Larger embeddings (scale ~2^-9) so token identity dominates the residual stream.
    wte.e.iter_mut().for_each(|e| *e = 39);
    let wpe = (0..n_ctx as usize * d)
        .map(|_| (r.next() % 81) as i32 - 40)
        .collect();
    let blocks = (0..n_layer)
        .map(|_| Block {
            ln1: ln(d),
            qkv: linear(&mut r, 3 * d, d),
            attn_proj: linear(&mut r, d, d),
            ln2: ln(d),
            fc: linear(&mut r, 4 * d, d),
            proj: linear(&mut r, d, 4 * d),
        })
        .collect();
    let mut m = Model {
        config,
        wte,
        wpe,
        blocks,
        ln_f: ln(d),
        tables: Tables::compute(n_embd / n_head),
        hash: [0; 32],
    };
    m.to_bytes();
    m
}
