//! The README's "Exit status" table, kept true: each status is provoked through the binary and
//! must be the one the table gives, and the table must list exactly the statuses the library
//! defines.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::*;
use lockstep::archive::{self, PackOptions};
use lockstep::error::{
    EXIT_DAMAGED, EXIT_FAILURE, EXIT_INCOMPLETE, EXIT_LIMIT, EXIT_OK, EXIT_USAGE,
};

/// status -> meaning, parsed from the README.
fn readme_table() -> BTreeMap<i32, String> {
    let readme = include_str!("../README.md");
    let section = readme
        .split("## Exit status")
        .nth(1)
        .expect("README has an Exit status section");
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            Some((cells.get(1)?.parse().ok()?, cells.get(2)?.to_string()))
        })
        .collect()
}

fn status(args: &[&str]) -> i32 {
    let o = Command::new(bin()).args(args).output().unwrap();
    o.status.code().expect("exited, not killed")
}

#[test]
fn the_readme_table_lists_every_status_and_each_is_what_the_binary_returns() {
    let table = readme_table();
    let defined = [
        EXIT_OK,
        EXIT_FAILURE,
        EXIT_USAGE,
        EXIT_DAMAGED,
        EXIT_INCOMPLETE,
        EXIT_LIMIT,
    ];
    assert_eq!(
        table.keys().copied().collect::<Vec<_>>(),
        defined.to_vec(),
        "the README's table and src/error.rs disagree"
    );
    assert!(table[&EXIT_DAMAGED].contains("damaged"));
    assert!(table[&EXIT_INCOMPLETE].contains("lockstep repair"));
    assert!(table[&EXIT_LIMIT].contains("--max-size"));

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = d.join("step1.safetensors");
    let b = d.join("step2.safetensors");
    write_ckpt(&a, &small_model(), 1);
    write_ckpt(&b, &small_model(), 2);
    let ar = d.join("run.lstp");
    let src = archive::resolve_many(&[a.clone(), b.clone()]).unwrap();
    archive::pack(&ar, &src, None, &PackOptions::default(), &|_| {}).unwrap();
    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let good = std::fs::read(&ar).unwrap();

    assert_eq!(status(&["verify", &s(&ar)]), EXIT_OK);
    assert_eq!(status(&["verify", "--no-such-flag", &s(&ar)]), EXIT_USAGE);
    assert_eq!(
        status(&["verify", &s(&d.join("missing.lstp"))]),
        EXIT_FAILURE
    );
    // Damage inside the data of a checkpoint (not in the tail): verify finds it.
    let mut bad = good.clone();
    bad[200] ^= 0xff;
    let damaged = d.join("damaged.lstp");
    std::fs::write(&damaged, &bad).unwrap();
    assert_eq!(status(&["verify", &s(&damaged)]), EXIT_DAMAGED);
    // Cut short: incomplete.
    let cut = d.join("cut.lstp");
    std::fs::write(&cut, &good[..good.len() - 10]).unwrap();
    assert_eq!(status(&["verify", &s(&cut)]), EXIT_INCOMPLETE);
    assert_eq!(
        status(&["extract", &s(&cut), "-o", &s(&d.join("x"))]),
        EXIT_INCOMPLETE
    );
    // Over the decode limit.
    assert_eq!(
        status(&["verify", &s(&ar), "--max-size", "100"]),
        EXIT_LIMIT
    );
}
