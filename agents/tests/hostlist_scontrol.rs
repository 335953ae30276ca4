//! Property test: our hostlist expansion equals `scontrol show hostnames` (Slurm's own parser).

use agents::alloc::expand_hostlist;
use proptest::prelude::*;
use std::process::Command;

fn scontrol_conf() -> Option<tempfile::TempDir> {
    testkit::require!(testkit::tool("scontrol"));
    // `scontrol show hostnames` is purely local but insists on a config file to exist.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("slurm.conf"),
        "ClusterName=hl\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n",
    )
    .unwrap();
    Some(dir)
}

fn scontrol_expand(conf: &std::path::Path, expr: &str) -> Vec<String> {
    let out = Command::new("scontrol")
        .args(["show", "hostnames", expr])
        .env("SLURM_CONF", conf.join("slurm.conf"))
        .output()
        .unwrap();
    assert!(out.status.success(), "scontrol failed on {expr}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A range as written: lower bound zero-padded to `width`, upper bound >= lower.
fn range() -> impl Strategy<Value = String> {
    (0u32..120, 0u32..15, 0usize..4, any::<bool>()).prop_map(|(lo, span, pad, single)| {
        let lo_s = format!("{lo:0w$}", w = pad.max(1));
        if single {
            lo_s
        } else {
            format!("{lo_s}-{}", lo + span)
        }
    })
}

fn group() -> impl Strategy<Value = String> {
    prop::collection::vec(range(), 1..4).prop_map(|r| format!("[{}]", r.join(",")))
}

fn name() -> impl Strategy<Value = String> {
    (
        "[a-z]{1,3}",
        prop::option::of(group()),
        prop::option::of(("[a-z]{1,2}", group())),
    )
        .prop_map(|(p, g1, g2)| {
            let mut s = p;
            if let Some(g) = g1 {
                s.push_str(&g);
            }
            if let Some((lit, g)) = g2 {
                s.push_str(&lit);
                s.push_str(&g);
            }
            s
        })
}

#[test]
fn expansion_matches_scontrol() {
    let Some(conf) = scontrol_conf() else { return };
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &prop::collection::vec(name(), 1..4).prop_map(|v| v.join(",")),
            |expr| {
                let ours = expand_hostlist(&expr).expect("generated expression parses");
                prop_assert_eq!(ours, scontrol_expand(conf.path(), &expr), "expr {}", expr);
                Ok(())
            },
        )
        .unwrap();
}
