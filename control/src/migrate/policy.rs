//! The admin policy's `migration` section (merged by vsec into the effective environment,
//! with the file and line of every value) → the daemon's [`MigrationConfig`].
//!
//! The policy speaks in the papers' terms, one persistence for the failure test; settings the
//! policy language does not name keep the daemon's defaults.

use super::config::{DeadlineAction, MigrationConfig, Persistence};
use vsec::env::{BarrierAction, Migration, Sourced};

#[derive(Debug, thiserror::Error)]
#[error("{field} = {value} (from {origin}): {problem}")]
pub struct PolicyMapError {
    pub field: &'static str,
    pub value: String,
    pub origin: String,
    pub problem: String,
}

fn err<T: std::fmt::Debug>(field: &'static str, s: &Sourced<T>, problem: String) -> PolicyMapError {
    PolicyMapError {
        field,
        value: format!("{:?}", s.value),
        origin: s.from.to_string(),
        problem,
    }
}

/// Maps and validates; an error names the policy file and line the bad value came from.
pub fn migration_config(m: &Migration) -> Result<MigrationConfig, PolicyMapError> {
    let mut cfg = MigrationConfig::default();
    let fa = &mut cfg.failure_avoidance;
    fa.active_ratio = m.active_memory_threshold.value;
    fa.sigma = m.outlier_sigma.value;
    fa.persistence = Persistence {
        k: m.persistence_k.value,
        m: m.persistence_m.value,
    };
    cfg.oversubscription.active_ratio = m.oversubscription_threshold.value;
    cfg.consolidation.enabled = m.consolidation.value;
    cfg.guards.cooldown_s = m.cooldown.value.get();
    cfg.guards.max_concurrent = m.max_concurrent.value as usize;
    cfg.barrier.deadline_s = m.barrier_deadline.value.get();
    cfg.barrier.on_deadline = match m.barrier_action.value {
        BarrierAction::Migrate => DeadlineAction::MigrateAnyway,
        BarrierAction::Cancel => DeadlineAction::Cancel,
    };
    if let Err(problem) = cfg.validate() {
        // Name the policy value the daemon's check is about.
        let e = if problem.contains("failure_avoidance.persistence") {
            err("migration.persistence", &m.persistence_k, problem)
        } else if problem.contains("failure_avoidance.sigma") {
            err("migration.outlier_sigma", &m.outlier_sigma, problem)
        } else if problem.contains("failure_avoidance.active_ratio") {
            err(
                "migration.active_memory_threshold",
                &m.active_memory_threshold,
                problem,
            )
        } else if problem.contains("oversubscription") {
            err(
                "migration.oversubscription_threshold",
                &m.oversubscription_threshold,
                problem,
            )
        } else {
            err("migration.max_concurrent", &m.max_concurrent, problem)
        };
        return Err(e);
    }
    Ok(cfg)
}
