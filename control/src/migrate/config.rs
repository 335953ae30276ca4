//! Thresholds of the migration daemon, as the admin policy's `migration` section carries
//! them. Every field has a serde default, so a policy only names what it changes.

use serde::{Deserialize, Serialize};

/// "k of the last m samples": a condition must hold this often before a rule fires, so a
/// single noisy sample never moves a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Persistence {
    pub k: u32,
    pub m: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FailureAvoidanceConfig {
    pub enabled: bool,
    /// Active / MemTotal above which a node is suspect (seed 002 §4.1: 75%).
    pub active_ratio: f64,
    /// Leave-one-out z-score above which the node is an outlier in its job's group.
    pub sigma: f64,
    /// Minimum gap, as a fraction of MemTotal, between the node and the others' mean. With
    /// near-identical nodes σ is tiny and meaningless differences would look like outliers.
    pub min_gap_ratio: f64,
    /// Smallest group (nodes of the job) for which an outlier test means anything.
    pub min_group: usize,
    pub persistence: Persistence,
}

impl Default for FailureAvoidanceConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            active_ratio: 0.75,
            sigma: 2.0,
            min_gap_ratio: 0.05,
            min_group: 3,
            persistence: Persistence { k: 3, m: 5 },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OversubscriptionConfig {
    pub enabled: bool,
    /// Active / MemTotal at which a node's VMs are spread to free nodes (seed 000 §VI-A).
    pub active_ratio: f64,
    pub persistence: Persistence,
}

impl Default for OversubscriptionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            active_ratio: 0.85,
            persistence: Persistence { k: 2, m: 3 },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsolidationConfig {
    /// Off by default: packing trades application speed for nodes.
    pub enabled: bool,
    /// Nodes below this Active / MemTotal are candidates to be emptied.
    pub below_ratio: f64,
    pub persistence: Persistence,
}

impl Default for ConsolidationConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            below_ratio: 0.2,
            persistence: Persistence { k: 10, m: 10 },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GuardConfig {
    /// A VM is not moved again within this many seconds of its last migration.
    pub cooldown_s: u64,
    /// VM migrations in flight at once, cluster-wide.
    pub max_concurrent: usize,
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self {
            cooldown_s: 300,
            max_concurrent: 2,
        }
    }
}

/// What to do when affected ranks do not reach a barrier before the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeadlineAction {
    /// Live-migrate anyway: the VM keeps running, only the application loses its
    /// barrier-consistent point (fine for TCP-based MPI, which survives live migration).
    MigrateAnyway,
    /// Withdraw the notice and leave the VM where it is.
    Cancel,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BarrierConfig {
    pub deadline_s: u64,
    pub on_deadline: DeadlineAction,
}

impl Default for BarrierConfig {
    fn default() -> Self {
        Self {
            deadline_s: 60,
            on_deadline: DeadlineAction::MigrateAnyway,
        }
    }
}

/// Limits of every live migration, always set explicitly (never the hypervisor's defaults).
/// The policy language names none of them: these are the daemon's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransferConfig {
    /// Bandwidth cap of the state transfer, bytes per second.
    pub max_bandwidth_bytes_per_s: u64,
    /// Longest pause of the guest at the switch-over, milliseconds.
    pub downtime_limit_ms: u64,
    /// Give up after this many seconds; the source keeps running.
    pub timeout_s: u64,
}

impl Default for TransferConfig {
    fn default() -> Self {
        Self {
            max_bandwidth_bytes_per_s: 1 << 30,
            downtime_limit_ms: 300,
            timeout_s: 300,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MigrationConfig {
    pub failure_avoidance: FailureAvoidanceConfig,
    pub oversubscription: OversubscriptionConfig,
    pub consolidation: ConsolidationConfig,
    pub guards: GuardConfig,
    pub barrier: BarrierConfig,
    pub transfer: TransferConfig,
}

/// A setting out of its range; the message names the field and what was expected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("migration.{field} = {value}: expected a fraction between 0 and 1")]
    Ratio { field: &'static str, value: f64 },
    #[error(
        "migration.{rule}.persistence = {}/{}: expected 1 <= k <= m <= 1000",
        .persistence.k, .persistence.m
    )]
    Persistence {
        rule: &'static str,
        persistence: Persistence,
    },
    #[error("migration.failure_avoidance.sigma = {0}: expected > 0")]
    Sigma(f64),
    #[error(
        "migration.failure_avoidance.min_group = {0}: expected >= 3 (a leave-one-out standard \
         deviation needs two other nodes)"
    )]
    MinGroup(usize),
    #[error("migration.guards.max_concurrent = 0: expected >= 1")]
    MaxConcurrent,
}

impl MigrationConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let ratio = |field: &'static str, value: f64| {
            if (0.0..=1.0).contains(&value) {
                Ok(())
            } else {
                Err(ConfigError::Ratio { field, value })
            }
        };
        let persist = |rule: &'static str, p: Persistence| {
            if p.k >= 1 && p.k <= p.m && p.m <= 1000 {
                Ok(())
            } else {
                Err(ConfigError::Persistence {
                    rule,
                    persistence: p,
                })
            }
        };
        let f = &self.failure_avoidance;
        ratio("failure_avoidance.active_ratio", f.active_ratio)?;
        ratio("failure_avoidance.min_gap_ratio", f.min_gap_ratio)?;
        if !(f.sigma.is_finite() && f.sigma > 0.0) {
            return Err(ConfigError::Sigma(f.sigma));
        }
        if f.min_group < 3 {
            return Err(ConfigError::MinGroup(f.min_group));
        }
        persist("failure_avoidance", f.persistence)?;
        ratio(
            "oversubscription.active_ratio",
            self.oversubscription.active_ratio,
        )?;
        persist("oversubscription", self.oversubscription.persistence)?;
        ratio("consolidation.below_ratio", self.consolidation.below_ratio)?;
        persist("consolidation", self.consolidation.persistence)?;
        if self.guards.max_concurrent == 0 {
            return Err(ConfigError::MaxConcurrent);
        }
        Ok(())
    }
}
