//! Measure before building: would a joint symbol (b, q1, q2, sign) under one context lose
//! much against the shipped four-stage chain? Empirical conditional entropies (no table
//! cost; the occupied (context, symbol) cells are printed as a proxy for it), summed over
//! per-tensor tables, plus the raw tail bits common to all.
//!
//! `cargo run --release --example joint_gain -- REF.safetensors TARGET.safetensors`
use std::collections::HashMap;

use lockstep::checkpoint::Checkpoint;
use lockstep::delta::blob::neighbor_distance;
use lockstep::delta::symbols::{encode_element, ref_info, sign_state, Layout};

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
    // Groups of tables whose entropies add up to one candidate's cost.
    let names = [
        "shipped: b|er,m2,nb + q1|er,b + q2|er,b,q1 + s|er,b,up,rs",
        "two stages: b|er,m2,nb + (q1,q2,s)|er,b,up,rs",
        "joint (b,q1,q2,s) | er",
        "joint | er, rs",
        "joint | er, up",
        "joint | er, rs, up",
        "joint | er, nb",
        "joint | er, nb4 (none, <=b-ish classes)",
    ];
    let parts: [&[usize]; 8] = [&[0, 1, 2, 3], &[0, 4], &[5], &[6], &[7], &[8], &[9], &[10]];
    let mut totals = [0f64; 11];
    let mut cells = [0u64; 11];
    let (mut weights, mut tail_bits) = (0u64, 0u64);
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
        let d = neighbor_distance(&e.shape);
        let mut tables: Vec<HashMap<(u64, u64), u64>> = vec![HashMap::new(); 11];
        for (j, s) in syms.iter().enumerate() {
            let info = ref_info(rv[j], fl);
            let (er, m2, rs) = (info.er as u64, info.m2 as u64, info.rs as u64);
            let (nb, up) = if j >= d {
                (syms[j - d].b as u64, sign_state(&syms[j - d]) as u64)
            } else {
                (99, 0)
            };
            let b = s.b as u64;
            let (q1, q2, neg) = (s.q1 as u64, s.q2 as u64, s.neg as u64);
            let joint = ((b * 2 + q1) * 2 + q2) * 2 + neg;
            let qs = (q1 * 2 + q2) * 2 + neg;
            let mut add =
                |k: usize, ctx: u64, sym: u64| *tables[k].entry((ctx, sym)).or_default() += 1;
            add(0, (er * 100 + nb) * 4 + m2, b);
            if b >= 2 {
                add(1, er * 100 + b, q1);
            }
            if b >= 3 {
                add(2, (er * 100 + b) * 2 + q1, q2);
            }
            if b >= 1 {
                add(3, ((er * 100 + b) * 3 + up) * 2 + rs, neg);
                add(4, ((er * 100 + b) * 3 + up) * 2 + rs, qs);
            }
            add(5, er, joint);
            add(6, er * 2 + rs, joint);
            add(7, er * 3 + up, joint);
            add(8, (er * 3 + up) * 2 + rs, joint);
            add(9, er * 100 + nb, joint);
            let nb4 = match nb {
                99 => 0,
                0..=2 => 1,
                3..=5 => 2,
                _ => 3,
            };
            add(10, er * 4 + nb4, joint);
            tail_bits += b.saturating_sub(3);
        }
        for (k, tb) in tables.iter().enumerate() {
            totals[k] += entropy(tb);
            cells[k] += tb.len() as u64;
        }
        weights += syms.len() as u64;
    }
    println!(
        "{weights} weights, raw tails {:.4} bits/weight",
        tail_bits as f64 / weights as f64
    );
    for (name, p) in names.iter().zip(parts) {
        let bits: f64 = p.iter().map(|&k| totals[k]).sum();
        let c: u64 = p.iter().map(|&k| cells[k]).sum();
        println!(
            "{:<62} {:>8.4} bits/weight  {:>8} cells",
            name,
            bits / weights as f64,
            c
        );
    }
}
