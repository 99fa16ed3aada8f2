//! The strand encoder's tables computed ahead (`cm::strand_tables::Ahead`, docs/INTEGER_GPT2.md
//! §13.5) against the decoder's, computed round by round (`PerRound`): the same integers for
//! every call, with contexts that restart inside a batch (with spare sequences, and with none
//! left), and a call that differs from the plan refused.

use lockstep::backend::Device;
use lockstep::lm::cm::lm_bits::{calls, Call, Table};
use lockstep::lm::cm::strand_tables::{Ahead, PerRound, Tables};

#[path = "lm_common/models.rs"]
mod models;
#[path = "lm_common/random_model.rs"]
mod random_model;
use models::small;

fn prose() -> Vec<u8> {
    std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/text/prose-genesis.txt"
    ))
    .unwrap()
}

fn copy(c: &Call) -> Call {
    Call {
        restart: c.restart,
        run: c.run.clone(),
    }
}

/// Feed both sources the schedule's rounds (round k: call k of every strand that has one,
/// as the strand loop asks) and compare every table.
fn same_tables(strands: &[&[u8]], most: usize) {
    let m = small();
    let cpu = Device::cpu();
    let kernels = cpu.lm().unwrap();
    // A strand's calls: all but the one its last byte would make (never answered).
    let plans: Vec<Vec<Call>> = strands
        .iter()
        .map(|d| match d.split_last() {
            Some((_, head)) => calls(m, head).unwrap(),
            None => Vec::new(),
        })
        .collect();
    assert!(
        plans.iter().flatten().filter(|c| c.restart).count() > 4 * strands.len(),
        "the input should restart each context several times"
    );
    let mut ahead = Ahead::new(m, kernels, strands, most).unwrap();
    let mut per_round = PerRound::new(m, kernels, strands.len()).unwrap();
    let rounds = plans.iter().map(Vec::len).max().unwrap();
    for k in 0..rounds {
        let waiting: Vec<(usize, Call)> = plans
            .iter()
            .enumerate()
            .filter_map(|(s, p)| p.get(k).map(|c| (s, copy(c))))
            .collect();
        let a = ahead.answer(&waiting).unwrap();
        let b = per_round.answer(&waiting).unwrap();
        assert_eq!(a.len(), waiting.len());
        assert_eq!(b.len(), waiting.len());
        // Ahead gives the sums its strands read, PerRound whole tables: the same integers.
        for (x, y) in a.iter().zip(&b) {
            let Table::Whole(whole) = y else {
                panic!("round {k}: the decoder's source gives whole tables")
            };
            assert!(
                matches!(x, Table::At { at, .. } if !at.is_empty()) && x.agrees_with(whole),
                "round {k}: the tables computed ahead differ"
            );
        }
    }
}

#[test]
fn tables_ahead_equal_tables_per_round() {
    let text = prose();
    let t = &text[..3000];
    let three: [&[u8]; 3] = [&t[..1000], &t[1000..1900], &t[1900..]];
    // Up to 4 spare sequences (a 64-call batch holds more restarts than that, so some
    // batches also end early), then none (every restart after a strand's first call in a
    // batch ends the batch).
    same_tables(&three, 64);
    same_tables(&three, 3);
    // Strands of different lengths and an empty one: finished strands drop out of rounds.
    let uneven: [&[u8]; 4] = [&t[..200], &[], &t[200..2600], &t[2600..2700]];
    same_tables(&uneven, 64);
}

#[test]
fn a_call_other_than_planned_is_refused() {
    let m = small();
    let cpu = Device::cpu();
    let text = prose();
    let strands: [&[u8]; 2] = [&text[..300], &text[300..600]];
    let mut ahead = Ahead::new(m, cpu.lm().unwrap(), &strands, 64).unwrap();
    let first = calls(m, &strands[0][..1]).unwrap();
    let mut wrong = copy(&first[0]);
    wrong.run.push(11);
    let e = ahead.answer(&[(0, wrong)]).unwrap_err();
    assert!(e.to_string().contains("differs from the planned"), "{e}");
}
