//! The barrier-coordinated migration of seed 002 §3, driven over the state database so every
//! step is journalled: (1a) notice, (1b) destination acquired, (2) affected ranks block at
//! their next barrier and report ready, (3) the VMs are live-migrated, (4) the ranks are
//! released, (5) the source takes its fate (defunct pool for failure avoidance).

use super::barrier::{AckOutcome, BarrierServer};
use super::{BarrierConfig, DeadlineAction};
use crate::model::Plan;
use crate::state::{ControllerError, MigrationId, StateDb, Transfer};
use monitor::{NodeName, VmId};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Why a live migration failed, as the implementor reports it ([`super::FleetError`] for
/// QEMU, the launch's overlay migrator's own error, ...). Boxed because the coordinator must
/// not depend on any hypervisor; the caller can still downcast it.
pub type MigrateError = Box<dyn std::error::Error + Send + Sync>;

/// Moves a running VM between nodes. The V2M QEMU plugin implements it with QMP `migrate`.
pub trait LiveMigrator {
    /// Gets the move of `vm` ready (e.g. the destination's incoming VM started) while its
    /// ranks make their way to a barrier, so that only the transfer is left once they are
    /// there. Best effort: `live_migrate` must work whether or not this ran or succeeded.
    fn prepare(&mut self, _vm: &VmId, _from: &NodeName, _to: &NodeName) {}

    /// Gives up a prepared move that will not happen (the plan was cancelled).
    fn abandon(&mut self, _vm: &VmId) {}

    fn live_migrate(
        &mut self,
        vm: &VmId,
        from: &NodeName,
        to: &NodeName,
    ) -> Result<(), MigrateError>;

    /// What the last successful move of `vm` carried, when the implementor measured it.
    fn transfer(&mut self, _vm: &VmId) -> Option<Transfer> {
        None
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error(transparent)]
    State(#[from] ControllerError),
    #[error("live migration of VM {vm} from {from} to {to} failed: {source}")]
    Migrate {
        vm: String,
        from: String,
        to: String,
        source: MigrateError,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// All VMs moved after their ranks blocked at a barrier.
    Completed { id: MigrationId },
    /// The deadline passed and the policy said migrate anyway; `late` VMs never blocked.
    CompletedPastDeadline { id: MigrationId, late: Vec<VmId> },
    /// The deadline passed and the policy said cancel.
    Cancelled { id: MigrationId, late: Vec<VmId> },
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs one plan to the end. On a migration failure the journal is rolled back, the ranks
/// are released with `failed`, and the error is returned.
pub fn run_plan(
    db: &mut StateDb,
    server: &BarrierServer,
    migrator: &mut dyn LiveMigrator,
    plan: &Plan,
    cfg: &BarrierConfig,
) -> Result<Outcome, CoordError> {
    let id = db.plan_migration(plan)?;
    let vms: Vec<VmId> = plan.moves.iter().map(|m| m.vm.clone()).collect();
    let wait = Duration::from_secs(cfg.deadline_s);
    db.post_notice(id, now_ms() + wait.as_millis() as u64)?;
    server.post_notice(id.0, &vms);
    for m in &plan.moves {
        migrator.prepare(&m.vm, &plan.source, &m.dest);
    }
    let ready = server.wait_ready(id.0, &vms, Instant::now() + wait);
    for vm in &ready {
        db.mark_ready(id, vm)?;
    }
    let late: Vec<VmId> = vms.iter().filter(|v| !ready.contains(v)).cloned().collect();
    if !late.is_empty() && cfg.on_deadline == DeadlineAction::Cancel {
        let note = format!(
            "deadline of {}s passed; cancelled by policy",
            cfg.deadline_s
        );
        for vm in &vms {
            migrator.abandon(vm);
        }
        db.roll_back(id, &note)?;
        server.ack(id.0, AckOutcome::Cancelled);
        return Ok(Outcome::Cancelled { id, late });
    }
    let note = if late.is_empty() {
        String::new()
    } else {
        format!(
            "deadline passed; migrating anyway ({} VM(s) not at a barrier)",
            late.len()
        )
    };
    db.start_migrating(id, &note)?;
    for (i, m) in plan.moves.iter().enumerate() {
        if let Err(source) = migrator.live_migrate(&m.vm, &plan.source, &m.dest) {
            for rest in &plan.moves[i + 1..] {
                migrator.abandon(&rest.vm);
            }
            db.roll_back(id, &format!("live migration of {} failed: {source}", m.vm))?;
            server.ack(id.0, AckOutcome::Failed);
            return Err(CoordError::Migrate {
                vm: m.vm.to_string(),
                from: plan.source.to_string(),
                to: m.dest.to_string(),
                source,
            });
        }
        db.mark_moved(id, &m.vm)?;
        if let Some(t) = migrator.transfer(&m.vm) {
            db.record_transfer(id, &m.vm, &t)?;
        }
    }
    db.complete(id, "ranks acknowledged")?;
    server.ack(id.0, AckOutcome::Migrated);
    Ok(if late.is_empty() {
        Outcome::Completed { id }
    } else {
        Outcome::CompletedPastDeadline { id, late }
    })
}
