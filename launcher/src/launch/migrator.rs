//! [`LiveMigrator`] over the job's control overlay: the controller asks the source node to
//! move a VM; the source has the destination node prepare an incoming VM from the same
//! staged image, sends the state with V2M, and the destination (which then runs the VM and
//! owns its rank) reports back. The controller only waits for that report.

use super::relay::Owners;
use crate::agent::{Control, JobHandle};
use crate::migrate::LiveMigrator;
use crate::monitor::{NodeName, VmId};
use crate::proto::{Msg, NodeId};
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// A node's report on a migration: (vm, Err(reason) or Ok(())).
pub type Report = (String, Result<(), String>);

pub struct OverlayMigrator {
    pub(super) h: JobHandle,
    pub(super) ids: HashMap<NodeName, NodeId>,
    pub(super) owners: Owners,
    pub(super) reports: Receiver<Report>,
    /// Longest a migration may take, from the order to the destination's report.
    pub(super) timeout: Duration,
    /// The limits the source node sends the state with (the policy's migration section).
    pub(super) params: v2m::MigrationParams,
}

impl LiveMigrator for OverlayMigrator {
    fn live_migrate(&mut self, vm: &VmId, from: &NodeName, to: &NodeName) -> Result<(), String> {
        let id = |n: &NodeName| {
            self.ids
                .get(n)
                .copied()
                .ok_or_else(|| format!("node {n} is not part of this job"))
        };
        let (src, dest) = (id(from)?, id(to)?);
        let holder = self
            .owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(vm.as_str())
            .copied();
        if holder != Some(src) {
            return Err(format!("VM {vm} is not on {from}"));
        }
        // Reports of an earlier migration that timed out must not answer this one.
        while self.reports.try_recv().is_ok() {}
        self.h.control(Control::Send {
            dst: src,
            msg: Msg::MigrateOut {
                vm: vm.to_string(),
                dest,
                params: self.params,
            },
        });
        let until = Instant::now() + self.timeout;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.reports.recv_timeout(left) {
                Ok((v, r)) if v == vm.as_str() => return r,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "no report from {from} or {to} within {:?}",
                        self.timeout
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err("the front-end ended".into());
                }
            }
        }
    }
}
