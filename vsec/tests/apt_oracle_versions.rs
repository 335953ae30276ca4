//! dpkg version ordering, property-tested against `dpkg --compare-versions` on pairs of real
//! version strings taken from the host's Debian indices.

mod apt_oracle_common;

use apt_oracle_common::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use std::cmp::Ordering;
use std::process::Command;
use vsec::deb::DebVersion;

fn dpkg_cmp(a: &str, b: &str) -> Ordering {
    let run = |op: &str| {
        Command::new("dpkg")
            .args(["--compare-versions", a, op, b])
            .status()
            .expect("dpkg runs")
            .success()
    };
    if run("lt") {
        Ordering::Less
    } else if run("eq") {
        Ordering::Equal
    } else {
        Ordering::Greater
    }
}

/// Every distinct version string in the indices, sorted for determinism.
fn real_versions() -> Vec<String> {
    let mut v: Vec<String> = universe()
        .packages()
        .iter()
        .map(|p| p.version.to_string())
        .collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn ordering_matches_dpkg_on_real_versions() {
    testkit::require!(host_ready() && testkit::tool("dpkg"));
    let versions = real_versions();
    assert!(versions.len() > 1000, "only {} versions", versions.len());
    // Neighbours in lexical order share prefixes: the hard cases (`~`, epochs, revisions).
    let mut pairs: Vec<(String, String)> = versions
        .windows(2)
        .step_by(versions.len() / 1500)
        .map(|w| (w[0].clone(), w[1].clone()))
        .collect();
    // Plus pairs drawn at random by proptest from the whole set.
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 1500,
        ..ProptestConfig::default()
    });
    let strategy = (
        proptest::sample::select(versions.clone()),
        proptest::sample::select(versions.clone()),
    );
    let mut drawn = Vec::new();
    for _ in 0..1500 {
        drawn.push(strategy.new_tree(&mut runner).unwrap().current());
    }
    pairs.extend(drawn);
    let mut mismatches = Vec::new();
    for (a, b) in &pairs {
        let ours = DebVersion::parse(a)
            .unwrap()
            .cmp(&DebVersion::parse(b).unwrap());
        let theirs = dpkg_cmp(a, b);
        if ours != theirs {
            mismatches.push(format!("{a} vs {b}: vse {ours:?}, dpkg {theirs:?}"));
        }
    }
    eprintln!(
        "version oracle: {} pairs from {} real versions compared with dpkg, {} mismatches",
        pairs.len(),
        versions.len(),
        mismatches.len()
    );
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}
