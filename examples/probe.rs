use lockstep::checkpoint::Checkpoint;
use std::collections::HashMap;
fn h_cond(pairs: impl Iterator<Item = (u64, u64)>) -> f64 {
    let mut joint: HashMap<(u64, u64), u64> = HashMap::new();
    let mut ctx: HashMap<u64, u64> = HashMap::new();
    let mut n = 0u64;
    for (c, s) in pairs {
        *joint.entry((c, s)).or_default() += 1;
        *ctx.entry(c).or_default() += 1;
        n += 1;
    }
    let mut h = 0.0;
    for ((c, _), &k) in &joint {
        h -= k as f64 * (k as f64 / ctx[c] as f64).log2();
    }
    h / n as f64
}
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let ck = Checkpoint::open(&a[1]).unwrap();
    let t = ck.get(&a[2]).unwrap();
    let d = ck.data(t);
    let cols = *t.shape.last().unwrap() as usize;
    let x: Vec<u64> = d
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]) as u64)
        .collect();
    let e: Vec<u64> = x.iter().map(|v| (v >> 7) & 0xff).collect();
    let h: Vec<u64> = x
        .iter()
        .map(|v| ((v >> 15) << 4) | ((v >> 3) & 15))
        .collect();
    let lo: Vec<u64> = x.iter().map(|v| v & 7).collect();
    let n = e.len();
    println!(
        "H(e|col) {:.3}  H(e|col,e_up) {:.3}",
        h_cond((0..n).map(|j| ((j % cols) as u64, e[j]))),
        h_cond((cols..n).map(|j| ((j % cols) as u64 * 256 + e[j - cols], e[j])))
    );
    println!(
        "H(head|e) {:.3}  H(head|col) {:.3}  H(head|col,e) {:.3}",
        h_cond((0..n).map(|j| (e[j], h[j]))),
        h_cond((0..n).map(|j| ((j % cols) as u64, h[j]))),
        h_cond((0..n).map(|j| ((j % cols) as u64 * 256 + e[j], h[j])))
    );
    println!(
        "H(lo3) {:.3} H(lo3|col,e) {:.3}",
        h_cond((0..n).map(|j| (0, lo[j]))),
        h_cond((0..n).map(|j| ((j % cols) as u64 * 256 + e[j], lo[j])))
    );
    println!(
        "H(x|col) {:.3} H(x) {:.3}",
        h_cond((0..n).map(|j| ((j % cols) as u64, x[j]))),
        h_cond((0..n).map(|j| (0, x[j])))
    );
}
