//! Framing overhead on a synthetic million-element tensor (no shared data needed).

mod common;

use lockstep::delta::{encode_tensor, EncodeOptions, LayoutChoice, TensorPair};
use lockstep::dtype::DType;

#[test]
fn framing_is_under_0_3_percent_at_a_million_elements() {
    let n = 1 << 20;
    let (r, t) = common::bf16_pair(n, 42);
    let pair = TensorPair {
        dtype: DType::BF16,
        shape: &[1024, 1024],
        reference: &r,
        target: &t,
    };
    for layout in [
        LayoutChoice::Paper,
        LayoutChoice::Signed,
        LayoutChoice::Auto,
    ] {
        let (blob, rep) = encode_tensor(
            &pair,
            &EncodeOptions {
                layout,
                ..EncodeOptions::default()
            },
            &lockstep::backend::cpu::CpuBackend,
        )
        .unwrap();
        let share = rep.framing_bytes() as f64 / blob.len() as f64;
        eprintln!(
            "{layout:?}: {} bytes, framing {} ({:.4}%), tables {}",
            blob.len(),
            rep.framing_bytes(),
            100.0 * share,
            rep.table_bytes
        );
        // The default coder's promise; the paper-mode control is reported, not bound.
        if layout != LayoutChoice::Paper {
            assert!(share < 0.003, "{layout:?}: framing {:.4}%", 100.0 * share);
        }
    }
}
