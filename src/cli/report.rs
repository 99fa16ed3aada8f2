//! Tables printed by the CLI.

use lockstep::delta::stats::{PairStats, CONFIGS, DEFAULT_CONFIG, FAST_CONFIG};
use lockstep::delta::Layout;

pub use lockstep::delta::stats::pair_stats;

pub fn print_pair_stats(s: &PairStats, per_tensor: bool) {
    for (dtype, d) in &s.by_dtype {
        let w = d.configs[0].weights;
        println!(
            "\n{dtype}: {w} weights, {} bytes. Bits per weight by stage (b, q1, q2, sign: ideal code length under the stored tables; framing: tables, headers, lane states, coder overhead):",
            d.configs[0].raw_bytes
        );
        println!(
            "  {:<18} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>10} {:>7}",
            "coder", "b", "q1", "q2", "sign", "tail", "framing", "total", "bytes", "ratio"
        );
        for (i, ((name, _, _), t)) in CONFIGS.iter().zip(&d.configs).enumerate() {
            if i == FAST_CONFIG || i == DEFAULT_CONFIG {
                // One column for b, q1, q2 and sign: `--fast` codes them as one joint
                // symbol; the default mixes that (large tensors) with stages (small ones),
                // so only its totals are one thing and the column stays empty.
                let joint = match i {
                    FAST_CONFIG => format!("{:.3}", t.bpw(t.stage_bits[0])),
                    _ => String::new(),
                };
                println!(
                    "  {:<18} {:>31} {:>7.3} {:>8.3} {:>8.3} {:>10} {:>7.4}",
                    name,
                    joint,
                    t.bpw(t.tail_bits as f64),
                    t.bpw(t.framing_bits()),
                    t.total_bpw(),
                    t.blob_bytes,
                    t.blob_bytes as f64 / t.raw_bytes.max(1) as f64
                );
                continue;
            }
            println!(
                "  {:<18} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>8.3} {:>8.3} {:>10} {:>7.4}",
                name,
                t.bpw(t.stage_bits[0]),
                t.bpw(t.stage_bits[1]),
                t.bpw(t.stage_bits[2]),
                t.bpw(t.stage_bits[3]),
                t.bpw(t.tail_bits as f64),
                t.bpw(t.framing_bits()),
                t.total_bpw(),
                t.blob_bytes,
                t.blob_bytes as f64 / t.raw_bytes.max(1) as f64
            );
        }
        if let Some(z) = d.zstd_grouped_xor {
            println!(
                "  {:<18} {:>57} {:>8.3} {:>10} {:>7.4}",
                "zstd-19 grp XOR",
                "",
                8.0 * z as f64 / w.max(1) as f64,
                z,
                z as f64 / d.configs[0].raw_bytes.max(1) as f64
            );
            let ours = d.configs[DEFAULT_CONFIG].blob_bytes as f64;
            println!(
                "  lockstep is {:.1}% smaller than zstd-19 on byte-grouped XOR",
                100.0 * (1.0 - ours / z as f64)
            );
        }
        let (paper, signed, ours) = (
            d.configs[0].blob_bytes as f64,
            d.configs[2].blob_bytes as f64,
            d.configs[DEFAULT_CONFIG].blob_bytes as f64,
        );
        println!(
            "  lockstep (default) is {:.2}% smaller than paper mode and {:.2}% smaller than the signed layout; --fast (b, q1, q2, sign as one joint symbol) is {:.2}% larger than the default",
            100.0 * (1.0 - ours / paper),
            100.0 * (1.0 - ours / signed),
            100.0 * (d.configs[FAST_CONFIG].blob_bytes as f64 / ours - 1.0)
        );
        println!(
            "  H(b) = {:.4}, I(b; e_r) = {:.4} bits/weight: e_r explains {:.1}% of H(b)",
            d.h_b,
            d.i_b_er,
            100.0 * d.i_b_er / d.h_b.max(1e-12)
        );
    }
    if per_tensor {
        println!(
            "\n  {:<44} {:>6} {:>10} {:>10} {:>10} {:>7} {:>7}",
            "tensor", "dtype", "weights", "paper B", "default B", "gain%", "sign"
        );
        for t in &s.tensors {
            // The sign's own bits, where the default coded it as a stage of its own (in the
            // Joint layout it is part of one symbol).
            let sign = match t.default.layout {
                Some(Layout::Joint) => "-".to_string(),
                _ => format!(
                    "{:.3}",
                    t.default.stage_bits[3] / t.default.n_elements.max(1) as f64
                ),
            };
            println!(
                "  {:<44} {:>6} {:>10} {:>10} {:>10} {:>7.2} {:>7}",
                t.name,
                t.dtype.to_string(),
                t.paper.n_elements,
                t.paper.blob_bytes,
                t.default.blob_bytes,
                100.0 * (1.0 - t.default.blob_bytes as f64 / t.paper.blob_bytes.max(1) as f64),
                sign
            );
        }
    }
}
