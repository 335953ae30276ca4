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
use std::collections::{HashMap, HashSet};
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
    #[error("{0}")]
    Audit(String),
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
    /// VMs whose source holds a prepared move, waiting for `Release`.
    pub(super) prepared: HashSet<String>,
    /// Reports that came while another VM's was awaited (a prepared move can fail early).
    pub(super) early: HashMap<String, Report>,
    /// Each move is recorded before it starts.
    pub(super) audit: Option<super::audit::JobAudit>,
}

impl LiveMigrator for OverlayMigrator {
    fn prepare(&mut self, vm: &VmId, from: &NodeName, to: &NodeName) {
        // A refused order is not sent: `live_migrate` then orders the move itself and reports
        // the same error.
        if let Ok((src, dest)) = self.ends(vm, from, to) {
            self.drop_stale();
            self.order(vm, src, dest, true);
            self.prepared.insert(vm.to_string());
        }
    }

    fn abandon(&mut self, vm: &VmId) {
        if self.prepared.remove(vm.as_str()) {
            self.release(vm, false);
        }
    }

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
    /// The source and destination nodes' ids, if `vm` is on `from` and both are in the job.
    fn ends(
        &self,
        vm: &VmId,
        from: &NodeName,
        to: &NodeName,
    ) -> Result<(NodeId, NodeId), OverlayMigrateError> {
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
        Ok((src, dest))
    }

    /// Drops the reports of earlier migrations that timed out or were given up, so they do
    /// not answer the next one; those of moves still prepared are kept.
    fn drop_stale(&mut self) {
        while let Ok(r) = self.reports.try_recv() {
            if self.prepared.contains(&r.0) {
                self.early.insert(r.0.clone(), r);
            }
        }
        let prepared = &self.prepared;
        self.early.retain(|v, _| prepared.contains(v));
    }

    fn order(&self, vm: &VmId, src: NodeId, dest: NodeId, hold: bool) {
        self.h.control(Control::Send {
            dst: src,
            msg: Wire::Migrate(MigrateMsg::Out {
                vm: vm.to_string(),
                dest,
                params: self.params,
                hold,
            }),
        });
    }

    /// Tells the source of `vm`'s prepared move to send it (`go`) or give it up.
    fn release(&self, vm: &VmId, go: bool) {
        let holder = lock(&self.owners).get(vm.as_str()).copied();
        if let Some(src) = holder {
            let msg = Wire::Migrate(MigrateMsg::Release {
                vm: vm.to_string(),
                go,
            });
            self.h.control(Control::Send { dst: src, msg });
        }
    }

    fn migrate(
        &mut self,
        vm: &VmId,
        from: &NodeName,
        to: &NodeName,
    ) -> Result<(), OverlayMigrateError> {
        let (src, dest) = self.ends(vm, from, to)?;
        if let Some(a) = &self.audit {
            let detail = format!("VM {vm}: {from} -> {to}");
            if let Err(e) = a.allow(vse_audit::Action::Migration, detail) {
                self.abandon(vm);
                return Err(OverlayMigrateError::Audit(e));
            }
        }
        if self.prepared.remove(vm.as_str()) {
            self.release(vm, true);
        } else {
            self.drop_stale();
            self.order(vm, src, dest, false);
        }
        let until = Instant::now() + self.timeout;
        loop {
            let report = match self.early.remove(vm.as_str()) {
                Some(r) => Ok(r),
                None => self
                    .reports
                    .recv_timeout(until.saturating_duration_since(Instant::now())),
            };
            match report {
                Ok((v, r, transfer)) if v == vm.as_str() => {
                    self.last = transfer.map(|t| (v, t));
                    return r.map_or(Ok(()), |e| Err(OverlayMigrateError::Node(e)));
                }
                Ok((v, r, t)) => {
                    self.early.insert(v.clone(), (v, r, t));
                }
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
