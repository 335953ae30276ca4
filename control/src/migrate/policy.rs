//! The admin policy's `migration` section (merged by vsec into the effective environment,
//! with the file and line of every value) → the daemon's [`MigrationConfig`].
//!
//! The policy speaks in the papers' terms, one persistence for the failure test; settings the
//! policy language does not name keep the daemon's defaults.

use super::config::{ConfigError, DeadlineAction, MigrationConfig, Persistence};
use vsec::env::{BarrierAction, Migration, Sourced};

#[derive(Debug, thiserror::Error)]
#[error("{field} = {value} (from {origin}): {problem}")]
pub struct PolicyMapError {
    pub field: &'static str,
    pub value: String,
    pub origin: String,
    #[source]
    pub problem: ConfigError,
}

/// A policy value the daemon cannot use: the admin's input.
impl vse_exit::Classify for PolicyMapError {
    fn kind(&self) -> vse_exit::ErrorKind {
        vse_exit::ErrorKind::InvalidInput
    }
}

fn err<T: std::fmt::Debug>(
    field: &'static str,
    s: &Sourced<T>,
    problem: ConfigError,
) -> PolicyMapError {
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
        let e = match &problem {
            ConfigError::Persistence {
                rule: "failure_avoidance",
                ..
            } => err("migration.persistence", &m.persistence_k, problem),
            ConfigError::Sigma(_) => err("migration.outlier_sigma", &m.outlier_sigma, problem),
            ConfigError::Ratio {
                field: "failure_avoidance.active_ratio",
                ..
            } => err(
                "migration.active_memory_threshold",
                &m.active_memory_threshold,
                problem,
            ),
            ConfigError::Ratio { field, .. } | ConfigError::Persistence { rule: field, .. }
                if field.starts_with("oversubscription") =>
            {
                err(
                    "migration.oversubscription_threshold",
                    &m.oversubscription_threshold,
                    problem,
                )
            }
            _ => err("migration.max_concurrent", &m.max_concurrent, problem),
        };
        return Err(e);
    }
    Ok(cfg)
}
