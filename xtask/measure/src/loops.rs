//! One pipeline in a loop, for `perf record` and paired A/B runs of two builds: wall time of
//! the best pass, MB/s of target bytes (or µs per tensor), every output checked.

use rayon::prelude::*;

use lockstep::delta::blob::encode_unverified;
use lockstep::delta::{decode_tensor, EncodeOptions, LayoutChoice};

use crate::{best, pairs, Opts};

fn options(layout: LayoutChoice) -> EncodeOptions {
    EncodeOptions {
        layout,
        ..EncodeOptions::default()
    }
}

/// `measure encode-loop`: every float tensor encoded (`--layout`, default `--fast`) without
/// the verifying decode, tensors in parallel as `encode_batched` does; best of `--rounds`
/// (default 10).
pub fn encode(o: &Opts) -> Result<(), String> {
    let (r, t) = o.open_pair(&o.dtype)?;
    let cpu = o.cpu()?;
    let opts = options(o.layout.unwrap_or(LayoutChoice::Fast));
    let pairs = pairs(&r, &t, |_| true);
    let mb = pairs.iter().map(|p| p.target.len()).sum::<usize>() as f64 / 1e6;
    let (s, blobs) = best(o.rounds.unwrap_or(10), || {
        pairs
            .par_iter()
            .map(|p| encode_unverified(p, &opts, &cpu).map(|b| b.0))
            .collect::<lockstep::Result<Vec<_>>>()
    });
    let blobs = blobs.map_err(|e| e.to_string())?;
    // The bytes were not verified in the loop: check them once, untimed.
    for (p, b) in pairs.iter().zip(&blobs) {
        let out = decode_tensor(b, p.reference, &cpu).map_err(|e| e.to_string())?;
        assert!(out == p.target, "decoded other bytes");
    }
    println!("{} encode best {:.1} MB/s", o.dtype, mb / s);
    Ok(())
}

/// `measure decode-loop`: every float tensor encoded once (`--layout`, default `--fast`),
/// then all blobs decoded against their references, best of `--rounds` (default 20).
pub fn decode(o: &Opts) -> Result<(), String> {
    let (r, t) = o.open_pair(&o.dtype)?;
    let cpu = o.cpu()?;
    let opts = options(o.layout.unwrap_or(LayoutChoice::Fast));
    let pairs = pairs(&r, &t, |_| true);
    let blobs = pairs
        .iter()
        .map(|p| encode_unverified(p, &opts, &cpu).map(|b| b.0))
        .collect::<lockstep::Result<Vec<_>>>()
        .map_err(|e| e.to_string())?;
    let mb = pairs.iter().map(|p| p.target.len()).sum::<usize>() as f64 / 1e6;
    let mut fastest = f64::MAX;
    for _ in 0..o.rounds.unwrap_or(20) {
        let mut pass = 0.0;
        for (p, b) in pairs.iter().zip(&blobs) {
            let (s, out) = best(1, || decode_tensor(b, p.reference, &cpu));
            pass += s;
            assert!(
                out.map_err(|e| e.to_string())? == p.target,
                "decoded other bytes"
            );
        }
        fastest = fastest.min(pass);
    }
    println!("{} blob decode best {:.1} MB/s", o.dtype, mb / fastest);
    Ok(())
}

/// `measure small-tensors`: the tensors below 2^16 elements (layer norms, biases, position
/// embeddings) encoded and decoded one after another; µs per tensor for `--fast`, the
/// default layout and the neighbor form (or `--layout`'s alone, to profile one), best of `--rounds` (default 20).
/// What a checkpoint of many small tensors pays per tensor: table building and selection
/// rather than coding.
pub fn small_tensors(o: &Opts) -> Result<(), String> {
    let (r, t) = o.open_pair(&o.dtype)?;
    let cpu = o.cpu()?;
    let pairs = pairs(&r, &t, |shape| shape.iter().product::<u64>() < 1 << 16);
    let elems: usize = pairs.iter().map(|p| p.target.len() / p.dtype.size()).sum();
    for (layout, name) in [
        (LayoutChoice::Fast, "--fast"),
        (LayoutChoice::Auto, "default"),
        (LayoutChoice::FastNeighbor, "fast-neighbor"),
    ]
    .into_iter()
    .filter(|&(l, _)| o.layout.is_none_or(|want| want == l))
    {
        let opts = options(layout);
        let (mut enc, mut dec) = (f64::MAX, f64::MAX);
        for _ in 0..o.rounds.unwrap_or(20) {
            let (s, blobs) = best(1, || {
                pairs
                    .iter()
                    .map(|p| encode_unverified(p, &opts, &cpu).map(|b| b.0))
                    .collect::<lockstep::Result<Vec<_>>>()
            });
            let blobs = blobs.map_err(|e| e.to_string())?;
            enc = enc.min(s);
            let (s, outs) = best(1, || {
                pairs
                    .iter()
                    .zip(&blobs)
                    .map(|(p, b)| decode_tensor(b, p.reference, &cpu))
                    .collect::<lockstep::Result<Vec<_>>>()
            });
            dec = dec.min(s);
            let outs = outs.map_err(|e| e.to_string())?;
            assert!(outs.iter().zip(&pairs).all(|(d, p)| *d == p.target));
        }
        let us = |s: f64| s * 1e6 / pairs.len() as f64;
        println!(
            "{} {name}: {} tensors, {elems} elements: encode {:.0} µs, decode {:.0} µs per tensor",
            o.dtype,
            pairs.len(),
            us(enc),
            us(dec)
        );
    }
    Ok(())
}

/// `measure lookups`: the AVX2 neighbor form's two ways of looking up ([`Avx2Lookups`]),
/// in one process, passes alternating (`--layout`, here the default layout unless given:
/// `--fast` has no neighbor form; `--rounds` passes of each, default 30; `--threads`,
/// default one): every float tensor encoded, then every one decoded. On a shared VM whose
/// speed swings from minute to minute, two binaries run one after the other read as
/// 0.87-1.36 against themselves; passes alternated in one process, as 0.96-1.07
/// (quartiles). Prints each way's best pass and the quartiles of gathers over scalar loads
/// per pair of passes: what `Avx2Lookups::Auto` should choose on this CPU.
pub fn lookups(o: &Opts) -> Result<(), String> {
    use lockstep::backend::cpu::{set_avx2_lookups, Avx2Lookups};
    let (r, t) = o.open_pair(&o.dtype)?;
    let cpu = o.cpu()?;
    let opts = options(o.layout.unwrap_or(LayoutChoice::Auto));
    let pairs = pairs(&r, &t, |_| true);
    let mb = pairs.iter().map(|p| p.target.len()).sum::<usize>() as f64 / 1e6;
    let ways = [Avx2Lookups::ScalarLoads, Avx2Lookups::Gathers];
    // Seconds per pass: [way][encode, decode][pass].
    let mut secs = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    for pass in 0..2 * o.rounds.unwrap_or(30) {
        let way = pass % 2;
        set_avx2_lookups(ways[way]);
        let (mut enc, mut dec) = (0.0, 0.0);
        let mut blobs = Vec::with_capacity(pairs.len());
        for p in &pairs {
            let (s, blob) = best(1, || encode_unverified(p, &opts, &cpu));
            blobs.push(blob.map_err(|e| e.to_string())?.0);
            enc += s;
        }
        // The decodes after every encode, as `decode-loop` runs them: none finds its
        // tensor in cache from its own encode.
        for (p, blob) in pairs.iter().zip(&blobs) {
            let (s, out) = best(1, || decode_tensor(blob, p.reference, &cpu));
            dec += s;
            assert!(
                out.map_err(|e| e.to_string())? == p.target,
                "decoded other bytes"
            );
        }
        secs[way][0].push(enc);
        secs[way][1].push(dec);
    }
    set_avx2_lookups(Avx2Lookups::Auto);
    for (k, what) in ["encode", "decode"].iter().enumerate() {
        let fastest = |v: &[f64]| mb / v.iter().copied().fold(f64::MAX, f64::min);
        // Speed of gathers over scalar loads, per pair of neighboring passes.
        let mut r: Vec<f64> = secs[0][k]
            .iter()
            .zip(&secs[1][k])
            .map(|(s, g)| s / g)
            .collect();
        r.sort_by(f64::total_cmp);
        let q = |f: f64| r[((r.len() - 1) as f64 * f).round() as usize];
        println!(
            "{} {what}: scalar loads best {:.1} MB/s, gathers best {:.1} MB/s; gathers / scalar \
             loads per pair: median {:.3}, quartiles {:.3}-{:.3} ({} pairs)",
            o.dtype,
            fastest(&secs[0][k]),
            fastest(&secs[1][k]),
            q(0.5),
            q(0.25),
            q(0.75),
            r.len()
        );
    }
    Ok(())
}
