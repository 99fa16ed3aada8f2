use super::*;

fn roundtrip(dtype: DType, shape: &[u64], bytes: &[u8]) -> AnchorReport {
    let (blob, report) = encode(dtype, shape, bytes).unwrap();
    assert_eq!(decode(&blob).unwrap(), bytes);
    assert!(
        blob.len() <= bytes.len() + 64,
        "{dtype}: {} > {}",
        blob.len(),
        bytes.len()
    );
    report
}

fn lcg(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 11
}

#[test]
fn every_dtype_and_odd_lengths_roundtrip() {
    let mut seed = 7;
    for dtype in DType::ALL {
        for n in [0usize, 1, LANES - 1, LANES + 1, 1000, CHUNK_ELEMS + 3] {
            let bytes: Vec<u8> = (0..n * dtype.size())
                .map(|_| lcg(&mut seed) as u8)
                .collect();
            roundtrip(dtype, &[n as u64], &bytes);
            if n % 8 == 0 && n > 0 {
                roundtrip(dtype, &[(n / 8) as u64, 8], &bytes);
            }
        }
    }
}

#[test]
fn special_values_and_skewed_floats_roundtrip_and_shrink() {
    // Gaussian-ish bf16 weights around 0.02 with zeros, infinities and NaN payloads mixed in.
    let mut seed = 3;
    let mut vals: Vec<u16> = (0..50_000)
        .map(|_| {
            let s: i64 = (0..4).map(|_| (lcg(&mut seed) % 2001) as i64 - 1000).sum();
            half::bf16::from_f32(s as f32 * 1e-5).to_bits()
        })
        .collect();
    vals.extend([
        0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc1, 0xffff, 0x0001, 0x8001,
    ]);
    let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let r = roundtrip(DType::BF16, &[vals.len() as u64], &bytes);
    assert_eq!(r.mode, Some(AnchorMode::Modeled));
    assert!(r.blob_bytes < zipnn::size(DType::BF16, &bytes), "{r:?}");

    let f32s: Vec<u8> = (0..20_000u32)
        .flat_map(|i| ((i as f32 * 0.37).sin() * 0.05).to_le_bytes())
        .chain(
            [f32::NAN, f32::INFINITY, -0.0, f32::MIN_POSITIVE / 3.0]
                .iter()
                .flat_map(|v| v.to_le_bytes()),
        )
        .collect();
    let r = roundtrip(DType::F32, &[20_004], &f32s);
    assert!(r.blob_bytes < f32s.len() as u64);
    let f64s: Vec<u8> = (0..5000u32)
        .flat_map(|i| ((i as f64 * 0.11).cos() * 3.0).to_le_bytes())
        .collect();
    roundtrip(DType::F64, &[5000], &f64s);
}

#[test]
fn corrupt_and_truncated_blobs_are_errors() {
    let bytes: Vec<u8> = (0..10_000u32)
        .flat_map(|i| half::bf16::from_f32((i % 97) as f32 * 1e-3).to_le_bytes())
        .collect();
    let (blob, _) = encode(DType::BF16, &[10_000], &bytes).unwrap();
    for cut in [0, 3, 8, blob.len() / 2, blob.len() - 1] {
        assert!(decode(&blob[..cut]).is_err());
    }
    for i in (0..blob.len()).step_by(97) {
        let mut b = blob.clone();
        b[i] ^= 0x10;
        assert!(decode(&b).is_err(), "flip at {i}");
    }
    assert!(encode(DType::BF16, &[3], &[0u8; 5]).is_err());
}

#[test]
fn matrices_with_outliers_and_column_structure_roundtrip() {
    // Rows that share a per-column offset (column contexts pay) plus rare huge outliers
    // above the frequent exponents, in every float type.
    let mut seed = 11;
    for dtype in [DType::BF16, DType::F16, DType::F32, DType::F64] {
        let (rows, cols) = (300usize, 64usize);
        let offs: Vec<f64> = (0..cols).map(|c| (c as f64 - 32.0) * 0.01).collect();
        let vals: Vec<f64> = (0..rows * cols)
            .map(|j| {
                let noise = ((lcg(&mut seed) % 1001) as f64 - 500.0) * 1e-6;
                if j % 997 == 5 {
                    3.0e4
                } else {
                    offs[j % cols] + noise
                }
            })
            .collect();
        let bytes: Vec<u8> = vals
            .iter()
            .flat_map(|&v| match dtype {
                DType::BF16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
                DType::F16 => half::f16::from_f64(v).to_le_bytes().to_vec(),
                DType::F32 => (v as f32).to_le_bytes().to_vec(),
                _ => v.to_le_bytes().to_vec(),
            })
            .collect();
        let r = roundtrip(dtype, &[rows as u64, cols as u64], &bytes);
        if dtype == DType::BF16 {
            assert!(
                matches!(r.head_context, HeadContext::ColumnClass { .. }),
                "{r:?}"
            );
        }
    }
}

#[test]
fn bytes_do_not_depend_on_thread_count() {
    let mut seed = 5;
    let bytes: Vec<u8> = (0..3 * CHUNK_ELEMS + 77)
        .flat_map(|j| {
            let v = ((lcg(&mut seed) % 2001) as f32 - 1000.0) * 1e-5 + (j % 64) as f32 * 1e-3;
            half::bf16::from_f32(v).to_le_bytes()
        })
        .collect();
    let shape = [(bytes.len() / 2) as u64];
    let run = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| encode(DType::BF16, &shape, &bytes).unwrap().0)
    };
    let one = run(1);
    assert_eq!(one, run(3));
    assert_eq!(decode(&one).unwrap(), bytes);
}
