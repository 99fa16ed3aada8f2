//! Profiling driver (perf record): the whole single-thread encode and decode path on the
//! bf16 600 -> 800 pair (or the two checkpoints given), five times.
use lockstep::backend::cpu::CpuBackend;
use lockstep::checkpoint::Checkpoint;
use lockstep::delta::blob::encode_unverified;
use lockstep::delta::{decode_tensor, EncodeOptions, TensorPair};

fn main() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/data/trajectory-gpt2"
    );
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (rp, tp) = match &args[..] {
        [a, b] => (a.clone(), b.clone()),
        _ => (
            format!("{dir}/gpt2_step000600_bf16.safetensors"),
            format!("{dir}/gpt2_step000800_bf16.safetensors"),
        ),
    };
    let (r, t) = (Checkpoint::open(rp).unwrap(), Checkpoint::open(tp).unwrap());
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build_global()
        .unwrap();
    let opts = EncodeOptions::default();
    for _ in 0..5 {
        for e in &t.tensors {
            let p = TensorPair {
                dtype: e.dtype,
                shape: &e.shape,
                reference: r.data(r.get(&e.name).unwrap()),
                target: t.data(e),
            };
            let (blob, _) = encode_unverified(&p, &opts, &CpuBackend).unwrap();
            decode_tensor(&blob, p.reference, &CpuBackend).unwrap();
        }
    }
}
