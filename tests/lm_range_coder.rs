//! Property tests of the 2^32 range coder and the frequency rule.

use lockstep::backend::cpu::lm::freq::{answer, frequencies, TOTAL};
use lockstep::backend::cpu::Isa;
use lockstep::backend::lm::Find;
use lockstep::format::lm::fixed::exp_table;
use lockstep::lm::range_coder::{Decoder, Encoder};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn range_coder_roundtrips_any_tables(
        logits in proptest::collection::vec(-40_000i32..40_000, 2..300),
        picks in proptest::collection::vec(any::<u16>(), 0..400),
    ) {
        let t = exp_table(40);
        let f = frequencies(Isa::Portable, &logits, &t).unwrap();
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            prop_assert_eq!(&frequencies(isa, &logits, &t).unwrap(), &f);
        }
        prop_assert_eq!(f.iter().sum::<u64>(), TOTAL);
        prop_assert!(f.iter().all(|&x| x >= 1));
        let syms: Vec<usize> = picks.iter().map(|&p| p as usize % logits.len()).collect();
        let mut e = Encoder::new();
        for &s in &syms {
            let c = answer(&f, Find::Symbol(s as u32)).unwrap();
            e.encode(c.cum, c.freq);
        }
        let bytes = e.finish();
        let mut d = Decoder::new(&bytes);
        for &s in &syms {
            let got = answer(&f, Find::Target(d.target())).unwrap();
            prop_assert_eq!(got.symbol as usize, s);
            d.consume(got.cum, got.freq);
        }
    }
}
