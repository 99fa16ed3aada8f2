//! Measure before building: empirical conditional entropies of the coded stages under candidate
//! contexts, summed per tensor (contexts are per-tensor tables), on a real checkpoint pair.
//!
//! `cargo run --release --example context_gains -- REF.safetensors TARGET.safetensors`
//!
//! Prints bits per weight for each candidate. Entropies ignore table cost, so a candidate must
//! beat its baseline by clearly more than its extra rows cost before it is worth building.

use std::collections::HashMap;

use lockstep::checkpoint::Checkpoint;
use lockstep::format::symbols::{encode_element, ref_info, sign_state, Layout};

fn entropy(counts: &HashMap<(u64, u64), u64>) -> f64 {
    let mut ctx_tot: HashMap<u64, u64> = HashMap::new();
    for (&(c, _), &n) in counts {
        *ctx_tot.entry(c).or_default() += n;
    }
    counts
        .iter()
        .map(|(&(c, _), &n)| -(n as f64) * (n as f64 / ctx_tot[&c] as f64).log2())
        .sum()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (r, t) = (
        Checkpoint::open(&args[0]).unwrap(),
        Checkpoint::open(&args[1]).unwrap(),
    );
    let names = [
        "b | er (paper)",
        "b | er, top-2 mantissa bits of r",
        "b | er, b of the element one row up",
        "b | er, b of the same lane's previous element",
        "b | er, b one row up, top-2 mantissa bits of r",
        "q1 | er, b (paper)",
        "q1 | er, b, b one row up",
        "sign | rs, er, b, up (shipped)",
        "sign | rs, er, b, up, sign of the same lane's previous element",
        "sign | rs, er, b, up, top mantissa bit of r",
    ];
    let mut totals = vec![0f64; names.len()];
    let mut weights = 0u64;
    for e in &t.tensors {
        let Some(fl) = e.dtype.float_layout() else {
            continue;
        };
        let size = e.dtype.size();
        let load = |c: &[u8]| {
            let mut v = [0u8; 8];
            v[..size].copy_from_slice(c);
            u64::from_le_bytes(v)
        };
        let rv: Vec<u64> = r
            .data(r.get(&e.name).unwrap())
            .chunks_exact(size)
            .map(load)
            .collect();
        let tv: Vec<u64> = t.data(e).chunks_exact(size).map(load).collect();
        let syms: Vec<_> = rv
            .iter()
            .zip(&tv)
            .map(|(&a, &b)| encode_element(a, b, fl.width, Layout::Signed))
            .collect();
        let cols = if e.shape.len() >= 2 {
            *e.shape.last().unwrap() as usize
        } else {
            32
        };
        let mut tables: Vec<HashMap<(u64, u64), u64>> = vec![HashMap::new(); names.len()];
        for (j, s) in syms.iter().enumerate() {
            let info = ref_info(rv[j], fl);
            let er = info.er as u64;
            let m2 = (rv[j] >> fl.mantissa_bits.saturating_sub(2)) & 3;
            let up_b = if j >= cols {
                syms[j - cols].b as u64
            } else {
                99
            };
            let prev_b = if j >= 32 { syms[j - 32].b as u64 } else { 99 };
            let b = s.b as u64;
            let mut add =
                |k: usize, ctx: u64, sym: u64| *tables[k].entry((ctx, sym)).or_default() += 1;
            add(0, er, b);
            add(1, er * 4 + m2, b);
            add(2, er * 100 + up_b, b);
            add(3, er * 100 + prev_b, b);
            add(4, (er * 100 + up_b) * 4 + m2, b);
            if s.b >= 2 {
                add(5, er * 100 + b, s.q1 as u64);
                add(6, (er * 100 + b) * 100 + up_b, s.q1 as u64);
            }
            if s.b > 0 {
                let up = if j >= cols {
                    sign_state(&syms[j - cols])
                } else {
                    0
                } as u64;
                let prev = if j >= 32 {
                    sign_state(&syms[j - 32])
                } else {
                    0
                } as u64;
                let base = ((er * 70 + b) * 3 + up) * 2 + info.rs as u64;
                let m1 = (rv[j] >> (fl.mantissa_bits - 1)) & 1;
                add(7, base, s.neg as u64);
                add(8, base * 3 + prev, s.neg as u64);
                add(9, base * 2 + m1, s.neg as u64);
            }
        }
        for (k, tb) in tables.iter().enumerate() {
            totals[k] += entropy(tb);
        }
        weights += syms.len() as u64;
    }
    for (name, bits) in names.iter().zip(&totals) {
        println!("{:<66} {:>8.4} bits/weight", name, bits / weights as f64);
    }
}
