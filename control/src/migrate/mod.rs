//! The migration daemon (seed 000 §VI, seed 002 §3-4): pluggable rules evaluated over the
//! latest samples and the controller's view of the cluster, guards that keep migrations safe,
//! and the barrier-coordinated migration protocol.

mod barrier;
mod config;
mod coordinator;
mod daemon;
mod evacuate;
mod policy;
mod rules;
mod stats;

pub use barrier::{AckOutcome, BarrierError, BarrierServer, ack_line, hello_line, parse_hello};
pub use config::{
    BarrierConfig, ConfigError, ConsolidationConfig, DeadlineAction, FailureAvoidanceConfig,
    GuardConfig, MigrationConfig, OversubscriptionConfig, Persistence, TransferConfig,
};
pub use coordinator::{CoordError, LiveMigrator, MigrateError, Outcome, run_plan};
pub use daemon::Daemon;
pub use evacuate::{EVACUATE_RULE, EvacuateError, evacuation_plan};
pub use policy::{PolicyMapError, migration_config};
pub use rules::{Consolidation, FailureAvoidance, Rule, SpeculativeOversubscription, Trigger};
pub use stats::{leave_one_out, loo_outlier};
