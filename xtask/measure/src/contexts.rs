//! `measure contexts`: what a format change would weigh before it is built. Estimates, per
//! checkpoint pair, the payload of one-symbol-per-element (Joint) context models richer than
//! the Joint layout's `er·2 + rs`, next to the real blobs of the fast and default layouts.
//!
//! Why: the default layout is 6% smaller than `--fast` on bf16 but codes four rANS symbols
//! per element (B, Q1, Q2, S) where `--fast` codes one, which is what keeps its speed at a
//! third of ZipNN's (issue 19). If the Joint symbol with the default's neighbor contexts
//! came close to the default's size, one layout could have both.
//!
//! The estimator is the same for every model, so that models compare with each other: per
//! context its own row (data at 12-bit precision plus the row's bytes and a byte of id) or
//! its group's pooled row, whichever is cheaper, as table selection prices them (without
//! the coarser row precisions); plus the raw tails. The "Joint" model's estimate next to
//! the real `--fast` blobs says how far the estimator is from the encoder.

use lockstep::delta::blob::encode_unverified;
use lockstep::delta::{EncodeOptions, LayoutChoice, TensorPair};
use lockstep::entropy::freq::{cost, normalize_to, COST_ONE_BIT, PROB_BITS};
use lockstep::format::chunk::{CHUNK_ELEMS, LANES};
use lockstep::format::symbols::{
    encode_element, joint_alphabet, joint_symbol, ref_info, sign_state, Layout, Sym,
};
use lockstep::format::tables::row_bytes;

use crate::{pairs, Opts};

/// A context model of the Joint symbol: the context of an element from its reference facts
/// and its neighbor's symbol (None: no neighbor in the chunk), and its backoff group.
struct Model {
    name: &'static str,
    ctx: fn(er: usize, rs: usize, m2: usize, nb: Option<&Sym>, w1: usize) -> usize,
}

/// The neighbor's bit-length class: 0 ..= w, w + 1 where there is none.
fn nb_class(nb: Option<&Sym>, w1: usize) -> usize {
    nb.map_or(w1, |s| s.b as usize)
}

const MODELS: [Model; 5] = [
    Model {
        name: "Joint: er, rs (the --fast layout)",
        ctx: |er, rs, _, _, _| er * 2 + rs,
    },
    Model {
        name: "Joint + neighbor b",
        ctx: |er, rs, _, nb, w1| (nb_class(nb, w1) * 256 + er) * 2 + rs,
    },
    Model {
        name: "Joint + neighbor sign state",
        ctx: |er, rs, _, nb, _| (nb.map_or(0, sign_state) as usize * 256 + er) * 2 + rs,
    },
    Model {
        name: "Joint + neighbor b and sign state",
        ctx: |er, rs, _, nb, w1| {
            ((nb_class(nb, w1) * 3 + nb.map_or(0, sign_state) as usize) * 256 + er) * 2 + rs
        },
    },
    Model {
        name: "Joint + neighbor b, sign state, m2",
        ctx: |er, rs, m2, nb, w1| {
            (((m2 * (w1 + 1) + nb_class(nb, w1)) * 3 + nb.map_or(0, sign_state) as usize) * 256
                + er)
                * 2
                + rs
        },
    },
];

/// The backoff group of every model's context: `er·2 + rs` (its low 9 bits).
const GROUPS: usize = 512;

/// Estimated bits (COST_ONE_BIT units) of the rows and data of `rows` (context -> counts).
fn estimate(rows: &std::collections::BTreeMap<usize, Vec<u64>>, a: usize) -> (u64, usize) {
    let own_row = |counts: &[u64]| {
        let f = normalize_to(counts, PROB_BITS);
        (cost(counts, &f), row_bytes(&f) as u64)
    };
    let mut group = vec![vec![0u64; a]; GROUPS];
    for (ctx, counts) in rows {
        for (g, c) in group[ctx % GROUPS].iter_mut().zip(counts) {
            *g += c;
        }
    }
    let group_f: Vec<Vec<u32>> = group
        .iter()
        .map(|g| {
            if g.iter().any(|&c| c > 0) {
                normalize_to(g, PROB_BITS)
            } else {
                Vec::new()
            }
        })
        .collect();
    let (mut total, mut kept) = (0, 0);
    let mut rest = vec![vec![0u64; a]; GROUPS];
    for (ctx, counts) in rows {
        let (data, bytes) = own_row(counts);
        let own = data + 8 * (bytes + 1) * COST_ONE_BIT;
        if own < cost(counts, &group_f[ctx % GROUPS]) {
            total += own;
            kept += 1;
        } else {
            for (r, c) in rest[ctx % GROUPS].iter_mut().zip(counts) {
                *r += c;
            }
        }
    }
    for r in rest.iter().filter(|r| r.iter().any(|&c| c > 0)) {
        let (data, bytes) = own_row(r);
        total += data + 8 * (bytes + 1) * COST_ONE_BIT;
        kept += 1;
    }
    (total, kept)
}

/// The element of `bytes` at `i`, little-endian, `size` bytes.
fn word(bytes: &[u8], i: usize, size: usize) -> u64 {
    let mut v = [0u8; 8];
    v[..size].copy_from_slice(&bytes[i * size..][..size]);
    u64::from_le_bytes(v)
}

/// Per model, the estimated payload bytes of `p` (tables, symbols and raw tails) and the
/// number of rows its tables would hold.
fn tensor_estimates(p: &TensorPair) -> Vec<(u64, usize)> {
    let fl = p.dtype.float_layout().expect("float tensors only");
    let (w, size) = (fl.width, p.dtype.size());
    let w1 = w as usize + 1;
    let a = joint_alphabet(w);
    let n = p.target.len() / size;
    let last = *p.shape.last().unwrap_or(&1) as usize;
    let distance = if p.shape.len() >= 2 && last >= LANES {
        last
    } else {
        LANES
    };
    let mut rows = vec![std::collections::BTreeMap::<usize, Vec<u64>>::new(); MODELS.len()];
    let mut tail_bits = 0u64;
    for start in (0..n).step_by(CHUNK_ELEMS) {
        let end = (start + CHUNK_ELEMS).min(n);
        let syms: Vec<Sym> = (start..end)
            .map(|i| {
                let (r, x) = (word(p.reference, i, size), word(p.target, i, size));
                encode_element(r, x, w, Layout::Joint)
            })
            .collect();
        for (j, s) in syms.iter().enumerate() {
            let ri = ref_info(word(p.reference, start + j, size), fl);
            let nb = (j >= distance).then(|| &syms[j - distance]);
            let sym = joint_symbol(s);
            for (m, rows) in MODELS.iter().zip(rows.iter_mut()) {
                let ctx = (m.ctx)(ri.er as usize, ri.rs as usize, ri.m2 as usize, nb, w1);
                rows.entry(ctx).or_insert_with(|| vec![0; a])[sym] += 1;
            }
            tail_bits += (s.b as u64).saturating_sub(3);
        }
    }
    rows.iter()
        .map(|r| {
            let (bits, kept) = estimate(r, a);
            ((bits / COST_ONE_BIT + tail_bits).div_ceil(8), kept)
        })
        .collect()
}

pub fn run(o: &Opts) -> Result<(), String> {
    for dtype in ["bf16", "fp32"] {
        let (r, t) = o.open_pair(dtype)?;
        let pairs = pairs(&r, &t, |_| true);
        let raw: usize = pairs.iter().map(|p| p.target.len()).sum();
        let blobs = |layout| -> Result<usize, String> {
            let opts = EncodeOptions {
                layout,
                ..EncodeOptions::default()
            };
            let cpu = o.cpu()?;
            pairs
                .iter()
                .map(|p| {
                    encode_unverified(p, &opts, &cpu)
                        .map(|b| b.0.len())
                        .map_err(|e| e.to_string())
                })
                .sum()
        };
        let (fast, default) = (blobs(LayoutChoice::Fast)?, blobs(LayoutChoice::Auto)?);
        let fast_neighbor = blobs(LayoutChoice::FastNeighbor)?;
        let mut est = vec![0u64; MODELS.len()];
        // Rows: in all, and the most any one tensor has (decoders build a slot table per row).
        let mut rows = vec![(0usize, 0usize); MODELS.len()];
        for p in &pairs {
            for ((e, r), (t, k)) in est.iter_mut().zip(rows.iter_mut()).zip(tensor_estimates(p)) {
                *e += t;
                *r = (r.0 + k, r.1.max(k));
            }
        }
        println!(
            "\n{dtype} 600 -> 800: {} float tensors, {raw} bytes",
            pairs.len()
        );
        println!("| coder | bytes | ratio | vs default | rows: all, most in a tensor |");
        println!("|---|---|---|---|---|");
        let line = |name: &str, bytes: u64, rows: Option<(usize, usize)>| {
            println!(
                "| {name} | {bytes} | {:.4} | {:+.2}% | {} |",
                bytes as f64 / raw as f64,
                100.0 * (bytes as f64 / default as f64 - 1.0),
                rows.map_or(String::new(), |(all, most)| format!("{all}, {most}"))
            )
        };
        line("blobs, default layout (real)", default as u64, None);
        line("blobs, --fast (real)", fast as u64, None);
        line("blobs, fast-neighbor (real)", fast_neighbor as u64, None);
        for ((m, e), r) in MODELS.iter().zip(est).zip(rows) {
            line(&format!("estimate, {}", m.name), e, Some(r));
        }
    }
    Ok(())
}
