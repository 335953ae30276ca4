//! [`LiveMigrator`] over the job's control overlay: the controller asks the source node to
//! move a VM; the source has the destination node prepare an incoming VM from the same
//! staged image, sends the state with V2M, and the destination (which then runs the VM and
//! owns its rank) reports back. The controller only waits for that report.

use super::relay::Owners;
use crate::sync::lock;
use crate::wire::{MigrateMsg, Wire};
use agents::agent::{Control, JobHandle};
use agents::proto::NodeId;
use control::migrate::{LiveMigrator, MigrateError};
use control::state::Transfer;
use monitor::{NodeName, VmId};
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// A node's report on a migration: the VM, the node's reason if it failed (as it came over
/// the wire), and what the move carried if it succeeded.
pub type Report = (String, Option<String>, Option<Transfer>);

/// Why the job's overlay could not move a VM.
#[derive(Debug, thiserror::Error)]
pub enum OverlayMigrateError {
    #[error("node {0} is not part of this job")]
    NotInJob(String),
    #[error("VM {vm} is not on {node}")]
    NotOn { vm: String, node: String },
    /// The source's or destination's own account of the failure.
    #[error("{0}")]
    Node(String),
    #[error("no report from {from} or {to} within {after:?}")]
    Timeout {
        from: String,
        to: String,
        after: Duration,
    },
    #[error("the front-end ended")]
    FrontEndEnded,
}

pub struct OverlayMigrator {
    pub(super) h: JobHandle<Wire>,
    pub(super) ids: HashMap<NodeName, NodeId>,
    pub(super) owners: Owners,
    pub(super) reports: Receiver<Report>,
    /// Longest a migration may take, from the order to the destination's report.
    pub(super) timeout: Duration,
    /// The limits the source node sends the state with (the policy's migration section).
    pub(super) params: v2m::MigrationParams,
    /// What the last successful move carried, by VM (for the migration journal).
    pub(super) last: Option<(String, Transfer)>,
}

impl LiveMigrator for OverlayMigrator {
    fn live_migrate(
        &mut self,
        vm: &VmId,
        from: &NodeName,
        to: &NodeName,
    ) -> Result<(), MigrateError> {
        self.migrate(vm, from, to).map_err(MigrateError::from)
    }

    fn transfer(&mut self, vm: &VmId) -> Option<Transfer> {
        self.last
            .take()
            .filter(|(v, _)| v == vm.as_str())
            .map(|(_, t)| t)
    }
}

impl OverlayMigrator {
    fn migrate(
        &mut self,
        vm: &VmId,
        from: &NodeName,
        to: &NodeName,
    ) -> Result<(), OverlayMigrateError> {
        let id = |n: &NodeName| {
            self.ids
                .get(n)
                .copied()
                .ok_or_else(|| OverlayMigrateError::NotInJob(n.to_string()))
        };
        let (src, dest) = (id(from)?, id(to)?);
        let holder = lock(&self.owners).get(vm.as_str()).copied();
        if holder != Some(src) {
            return Err(OverlayMigrateError::NotOn {
                vm: vm.to_string(),
                node: from.to_string(),
            });
        }
        // Reports of an earlier migration that timed out must not answer this one.
        while self.reports.try_recv().is_ok() {}
        self.h.control(Control::Send {
            dst: src,
            msg: Wire::Migrate(MigrateMsg::Out {
                vm: vm.to_string(),
                dest,
                params: self.params,
            }),
        });
        let until = Instant::now() + self.timeout;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.reports.recv_timeout(left) {
                Ok((v, r, transfer)) if v == vm.as_str() => {
                    self.last = transfer.map(|t| (v, t));
                    return r.map_or(Ok(()), |e| Err(OverlayMigrateError::Node(e)));
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(OverlayMigrateError::Timeout {
                        from: from.to_string(),
                        to: to.to_string(),
                        after: self.timeout,
                    });
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(OverlayMigrateError::FrontEndEnded);
                }
            }
        }
    }
}
