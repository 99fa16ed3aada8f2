//! The golden cases: inputs whose encodings are frozen in tests/golden/*.lsdb. Shared by
//! tests/golden.rs (the default backend) and tests/backend_parity.rs (every backend).

use super::{bf16_pair, Rng};
use lockstep::delta::{EncodeOptions, LayoutChoice};
use lockstep::dtype::DType;

pub struct Case {
    pub name: &'static str,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub reference: Vec<u8>,
    pub target: Vec<u8>,
    pub opts: EncodeOptions,
}

fn near(dtype: DType, n: usize, seed: u64, spread: i64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = Rng(seed);
    let size = dtype.size();
    let w = dtype.float_layout().unwrap().width;
    let (mut r, mut t) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let rv = rng.next() & if w == 64 { u64::MAX } else { (1 << w) - 1 };
        let d = (rng.below(2 * spread as u64 + 1) as i64 - spread) / (1 + rng.below(4) as i64);
        let tv = lockstep::float::apply_displacement(rv, d, w);
        r.extend_from_slice(&rv.to_le_bytes()[..size]);
        t.extend_from_slice(&tv.to_le_bytes()[..size]);
    }
    (r, t)
}

pub fn cases() -> Vec<Case> {
    let paper = EncodeOptions {
        layout: LayoutChoice::Paper,
        ..EncodeOptions::default()
    };
    let signed = EncodeOptions {
        layout: LayoutChoice::Signed,
        ..EncodeOptions::default()
    };
    let no_er = EncodeOptions {
        condition_on_exponent: false,
        ..signed
    };
    let mut v = Vec::new();
    let (r, t) = bf16_pair(64 * 64, 100);
    v.push(Case {
        name: "bf16_signed",
        dtype: DType::BF16,
        shape: vec![64, 64],
        reference: r.clone(),
        target: t.clone(),
        opts: signed,
    });
    v.push(Case {
        name: "bf16_paper",
        dtype: DType::BF16,
        shape: vec![64, 64],
        reference: r.clone(),
        target: t.clone(),
        opts: paper,
    });
    v.push(Case {
        name: "bf16_no_er",
        dtype: DType::BF16,
        shape: vec![64, 64],
        reference: r.clone(),
        target: t,
        opts: no_er,
    });
    let fast = EncodeOptions {
        layout: LayoutChoice::Fast,
        ..EncodeOptions::default()
    };
    v.push(Case {
        name: "bf16_fast",
        dtype: DType::BF16,
        shape: vec![64, 64],
        reference: r.clone(),
        target: bf16_pair(64 * 64, 100).1,
        opts: fast,
    });
    v.push(Case {
        name: "bf16_identical",
        dtype: DType::BF16,
        shape: vec![64, 64],
        reference: r.clone(),
        target: r,
        opts: signed,
    });
    for (name, dtype, spread) in [
        ("f32", DType::F32, 5000),
        ("f16", DType::F16, 50),
        ("f64", DType::F64, 1 << 30),
        ("f8e4m3", DType::F8E4M3, 3),
        ("f8e5m2", DType::F8E5M2, 3),
    ] {
        let (r, t) = near(dtype, 2000, dtype.code() as u64, spread);
        v.push(Case {
            name,
            dtype,
            shape: vec![40, 50],
            reference: r,
            target: t,
            opts: EncodeOptions::default(),
        });
    }
    // The fast layout at the widest float it is defined for, and at 8 bits.
    for (name, dtype, spread) in [
        ("f32_fast", DType::F32, 5000),
        ("f8e4m3_fast", DType::F8E4M3, 3),
    ] {
        let (r, t) = near(dtype, 2000, 7 + dtype.code() as u64, spread);
        v.push(Case {
            name,
            dtype,
            shape: vec![40, 50],
            reference: r,
            target: t,
            opts: fast,
        });
    }
    let mut rng = Rng(5);
    let (r, t) = (rng.bytes(200), rng.bytes(200));
    v.push(Case {
        name: "bf16_raw",
        dtype: DType::BF16,
        shape: vec![100],
        reference: r,
        target: t,
        opts: signed,
    });
    let ids: Vec<u8> = (0..512i64).flat_map(|i| i.to_le_bytes()).collect();
    let ids2: Vec<u8> = (0..512i64).flat_map(|i| (i * 2).to_le_bytes()).collect();
    v.push(Case {
        name: "i64_generic",
        dtype: DType::I64,
        shape: vec![1, 512],
        reference: ids,
        target: ids2,
        opts: signed,
    });
    v
}
