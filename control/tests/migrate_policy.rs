//! The admin policy's `migration` section, merged by vsec from the example policies in
//! `specs/`, mapped into the daemon's configuration.

use control::migrate::{Daemon, DeadlineAction, MigrationConfig, Persistence, migration_config};
use std::path::Path;

fn effective(policies: &[&str]) -> vsec::env::EffectiveEnv {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let spec = vsec::spec::load(&root.join("specs/mpi-lammps.vse.yaml")).unwrap();
    let ps: Vec<_> = policies
        .iter()
        .map(|p| vsec::policy::load(&root.join("specs").join(p)).unwrap())
        .collect();
    vsec::merge::merge(&spec, &ps).unwrap_or_else(|d| panic!("merge: {d:?}"))
}

#[test]
fn site_policy_maps_every_migration_setting() {
    let env = effective(&["site.policy.yaml"]);
    let cfg = migration_config(&env.migration).unwrap();
    let fa = &cfg.failure_avoidance;
    assert!(fa.enabled);
    assert_eq!(fa.active_ratio, 0.75);
    assert_eq!(fa.sigma, 2.0);
    assert_eq!(fa.persistence, Persistence { k: 3, m: 5 });
    assert_eq!(cfg.oversubscription.active_ratio, 0.5);
    assert!(!cfg.consolidation.enabled);
    assert_eq!(cfg.guards.cooldown_s, 300);
    assert_eq!(cfg.guards.max_concurrent, 2);
    assert_eq!(cfg.barrier.deadline_s, 30);
    assert_eq!(cfg.barrier.on_deadline, DeadlineAction::MigrateAnyway);
    // Settings the policy language does not name keep the daemon's defaults.
    let d = MigrationConfig::default();
    assert_eq!(fa.min_gap_ratio, d.failure_avoidance.min_gap_ratio);
    assert_eq!(fa.min_group, d.failure_avoidance.min_group);
    Daemon::new(cfg).expect("a mapped policy is a valid daemon configuration");
}

#[test]
fn partition_policy_stacks_on_the_site_policy() {
    let env = effective(&["site.policy.yaml", "partition.policy.yaml"]);
    let cfg = migration_config(&env.migration).unwrap();
    assert_eq!(cfg.guards.max_concurrent, 1, "the partition's value wins");
    assert_eq!(
        cfg.failure_avoidance.persistence,
        Persistence { k: 3, m: 5 }
    );
    assert_eq!(cfg.barrier.deadline_s, 30);
}

#[test]
fn no_policy_gives_the_built_in_defaults_and_a_valid_daemon() {
    let env = effective(&[]);
    let cfg = migration_config(&env.migration).unwrap();
    assert_eq!(cfg.failure_avoidance.active_ratio, 0.75);
    Daemon::new(cfg).unwrap();
}

#[test]
fn an_inconsistent_value_names_its_policy_line() {
    let mut env = effective(&["site.policy.yaml"]);
    // vsec accepts k and m separately; k > m only shows once they meet.
    env.migration.persistence_k.value = 9;
    let e = migration_config(&env.migration).unwrap_err().to_string();
    assert!(e.contains("migration.persistence"), "{e}");
    assert!(e.contains("site.policy.yaml:54"), "{e}");
    assert!(e.contains("1 <= k <= m"), "{e}");
}
