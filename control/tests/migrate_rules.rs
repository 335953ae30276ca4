//! The daemon's rules over long simulated runs: healthy-but-noisy nodes never migrate, a
//! memory hog outside the job triggers exactly one plan, the guards hold.

use control::migrate::*;
use control::model::*;
use monitor::{JobId, MemInfo, NodeName, VmId};
use proptest::prelude::*;

const GIB: u64 = 1024 * 1024;

fn node(name: &str, pool: Pool, ratio: f64) -> NodeView {
    let total = 16 * GIB;
    let active = (total as f64 * ratio) as u64;
    NodeView {
        name: NodeName::new(name).unwrap(),
        pool,
        mem: Some(MemInfo {
            total_kib: total,
            active_kib: active,
            available_kib: total - active,
        }),
    }
}

fn vm(name: &str, node: &str, max: u64) -> VmView {
    VmView {
        vm: VmId::new(name).unwrap(),
        job: JobId::new("job1").unwrap(),
        node: NodeName::new(node).unwrap(),
        mem_max_kib: max,
        last_migrated_ms: None,
        migrating: false,
    }
}

/// `job` nodes n0..n{k-1} with one VM each, plus `free` free nodes.
fn cluster(ratios: &[f64], free: usize, now_ms: u64) -> ClusterView {
    let mut nodes = Vec::new();
    let mut vms = Vec::new();
    for (i, r) in ratios.iter().enumerate() {
        nodes.push(node(&format!("n{i}"), Pool::Allocated, *r));
        vms.push(vm(&format!("vm{i}"), &format!("n{i}"), 2 * GIB));
    }
    for j in 0..free {
        nodes.push(node(&format!("f{j}"), Pool::Free, 0.02));
    }
    ClusterView { now_ms, nodes, vms }
}

/// Applies a plan the way the controller would once the migration completes.
fn apply(view: &mut ClusterView, plan: &Plan, now_ms: u64) {
    for m in &plan.moves {
        let v = view.vms.iter_mut().find(|v| v.vm == m.vm).unwrap();
        v.node = m.dest.clone();
        v.last_migrated_ms = Some(now_ms);
        let d = view.nodes.iter_mut().find(|n| n.name == m.dest).unwrap();
        d.pool = Pool::Allocated;
    }
    let s = view
        .nodes
        .iter_mut()
        .find(|n| n.name == plan.source)
        .unwrap();
    match plan.source_fate {
        SourceFate::Defunct => s.pool = Pool::Defunct,
        SourceFate::Free => s.pool = Pool::Free,
        SourceFate::Keep => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Healthy nodes: a common load level (possibly above 75%), per-sample jitter, and
    /// isolated single-sample spikes (at most one per persistence window): zero migrations.
    #[test]
    fn noisy_healthy_run_never_migrates(
        nodes in 3usize..9,
        base in 0.2f64..0.9,
        jitter in prop::collection::vec(-0.02f64..0.02, 9 * 1000),
        spike_every in 5usize..40,
    ) {
        let mut d = Daemon::new(MigrationConfig::default()).unwrap();
        let m = MigrationConfig::default().failure_avoidance.persistence.m as usize;
        let spike_every = spike_every.max(m);
        for round in 0..1000 {
            let mut ratios: Vec<f64> = (0..nodes)
                .map(|i| (base + jitter[round * 9 + i]).clamp(0.0, 1.0))
                .collect();
            if round % spike_every == 0 {
                let i = round % nodes;
                ratios[i] = (ratios[i] + 0.3).min(0.99);
            }
            let plans = d.evaluate(&cluster(&ratios, 2, round as u64 * 1000));
            prop_assert!(plans.is_empty(), "round {round}: {plans:?}");
        }
    }

    /// A hog on one node of a 4-node job: exactly one plan, all its VMs to one free node,
    /// the node to the defunct pool, then silence even though the hog stays.
    #[test]
    fn hog_triggers_exactly_one_plan(
        victim in 0usize..4,
        start in 10usize..50,
        jitter in prop::collection::vec(-0.02f64..0.02, 4 * 300),
    ) {
        let mut d = Daemon::new(MigrationConfig::default()).unwrap();
        let mut view = cluster(&[0.5; 4], 2, 0);
        let mut plans = Vec::new();
        for round in 0..300 {
            view.now_ms = round as u64 * 1000;
            for (i, n) in view.nodes.iter_mut().take(4).enumerate() {
                let hog = if i == victim && round >= start { 0.4 } else { 0.0 };
                let r = (0.5 + hog + jitter[round * 4 + i]).min(0.99);
                *n = node(n.name.as_str(), n.pool, r);
            }
            for p in d.evaluate(&view) {
                prop_assert_eq!(plans.len(), 0, "second plan at round {}: {:?}", round, p);
                // Persistence: not before k rounds of the hog.
                prop_assert!(round >= start + 2, "fired at {} before persistence", round);
                let now = view.now_ms;
                apply(&mut view, &p, now);
                plans.push((round, p));
            }
        }
        prop_assert_eq!(plans.len(), 1);
        let p = &plans[0].1;
        prop_assert_eq!(p.rule.as_str(), "failure-avoidance");
        prop_assert_eq!(p.source.as_str(), format!("n{victim}"));
        prop_assert_eq!(p.source_fate, SourceFate::Defunct);
        prop_assert_eq!(p.moves.len(), 1);
        prop_assert!(p.moves[0].dest.as_str().starts_with('f'));
    }
}

#[test]
fn whole_group_over_threshold_is_not_an_outlier() {
    // All four above 75%, none an outlier: the job is just big, nothing is failing.
    let mut d = Daemon::new(MigrationConfig::default()).unwrap();
    for r in 0..50 {
        assert!(
            d.evaluate(&cluster(&[0.80, 0.82, 0.81, 0.83], 2, r * 1000))
                .is_empty()
        );
    }
}

#[test]
fn destination_must_hold_the_vm_maximum() {
    let mut d = Daemon::new(MigrationConfig::default()).unwrap();
    let mut view = cluster(&[0.5, 0.5, 0.5, 0.95], 1, 0);
    // The free node has 10 GiB available but the VM's maximum is 12 GiB: no plan.
    view.vms[3].mem_max_kib = 12 * GIB;
    view.nodes[4] = node("f0", Pool::Free, 6.0 / 16.0);
    for r in 0..20 {
        view.now_ms = r * 1000;
        assert!(d.evaluate(&view).is_empty(), "no free node can hold 12 GiB");
    }
    // A big enough free node appears: the plan goes there, after the persistence window.
    view.nodes.push(node("f1", Pool::Free, 0.05));
    let plans = d.evaluate(&view);
    assert_eq!(plans.len(), 1);
    assert_eq!(plans[0].moves[0].dest.as_str(), "f1");
}

#[test]
fn cooldown_and_concurrency_guards() {
    let mut cfg = MigrationConfig::default();
    cfg.guards.max_concurrent = 1;
    cfg.oversubscription.persistence = Persistence { k: 1, m: 1 };
    let mut d = Daemon::new(cfg).unwrap();
    // One node, three VMs, over the oversubscription threshold, three free nodes.
    let mut view = cluster(&[0.9], 3, 1_000_000);
    view.vms.push(vm("vmb", "n0", 3 * GIB));
    view.vms.push(vm("vmc", "n0", GIB));
    let p = d.evaluate(&view);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].rule, "speculative-oversubscription");
    assert_eq!(p[0].moves.len(), 1, "max_concurrent = 1");
    assert_eq!(p[0].source_fate, SourceFate::Keep);
    // That move is in flight: nothing else may start.
    let moved = p[0].moves[0].vm.clone();
    view.vms
        .iter_mut()
        .find(|v| v.vm == moved)
        .unwrap()
        .migrating = true;
    assert!(d.evaluate(&view).is_empty());
    // Done, and the VM came back to the node (say, by hand): its cool-down protects it.
    let v = view.vms.iter_mut().find(|v| v.vm == moved).unwrap();
    v.migrating = false;
    v.last_migrated_ms = Some(view.now_ms);
    let p = d.evaluate(&view);
    assert_eq!(p.len(), 1);
    assert!(p[0].moves.iter().all(|m| m.vm != moved), "cool-down: {p:?}");
}

#[test]
fn oversubscription_spreads_to_distinct_free_nodes() {
    let mut cfg = MigrationConfig::default();
    cfg.guards.max_concurrent = 8;
    let mut d = Daemon::new(cfg).unwrap();
    let mut view = cluster(&[0.95], 3, 0);
    view.vms.push(vm("vmb", "n0", GIB));
    view.vms.push(vm("vmc", "n0", GIB));
    assert!(d.evaluate(&view).is_empty(), "persistence 2 of 3");
    let p = d.evaluate(&view);
    assert_eq!(p.len(), 1);
    let mut dests: Vec<_> = p[0].moves.iter().map(|m| m.dest.clone()).collect();
    assert_eq!(dests.len(), 2, "the largest VM stays: {p:?}");
    dests.dedup();
    assert_eq!(dests.len(), 2, "spread: {p:?}");
}

#[test]
fn consolidation_off_by_default_and_packs_when_on() {
    let low = [0.1, 0.3, 0.3];
    let mut d = Daemon::new(MigrationConfig::default()).unwrap();
    for r in 0..30 {
        assert!(d.evaluate(&cluster(&low, 0, r)).is_empty());
    }
    let mut cfg = MigrationConfig::default();
    cfg.consolidation.enabled = true;
    cfg.consolidation.persistence = Persistence { k: 2, m: 2 };
    let mut d = Daemon::new(cfg).unwrap();
    assert!(d.evaluate(&cluster(&low, 0, 0)).is_empty());
    let p = d.evaluate(&cluster(&low, 0, 1));
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].source.as_str(), "n0");
    assert_eq!(p[0].source_fate, SourceFate::Free);
    assert_ne!(p[0].moves[0].dest.as_str(), "n0");
}

#[test]
fn config_defaults_and_validation() {
    let c: MigrationConfig =
        serde_json::from_str(r#"{"failure_avoidance":{"sigma":3.0}}"#).unwrap();
    assert_eq!(c.failure_avoidance.sigma, 3.0);
    assert_eq!(c.failure_avoidance.active_ratio, 0.75);
    assert_eq!(c.failure_avoidance.persistence, Persistence { k: 3, m: 5 });
    assert!(!c.consolidation.enabled);
    let bad: MigrationConfig =
        serde_json::from_str(r#"{"failure_avoidance":{"persistence":{"k":4,"m":2}}}"#).unwrap();
    let e = Daemon::new(bad).err().unwrap().to_string();
    assert!(
        e.contains("failure_avoidance.persistence") && e.contains("k <= m"),
        "{e}"
    );
    let e = serde_json::from_str::<MigrationConfig>(r#"{"guards":{"cooldown":1}}"#).unwrap_err();
    assert!(e.to_string().contains("unknown field"), "{e}");
}
