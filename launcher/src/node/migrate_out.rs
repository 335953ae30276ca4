//! The source side of a live migration ordered by the front-end's migration daemon, in
//! vmhost's steps: the destination node prepares an incoming VM from the same profile, this
//! node sends the state within the policy's limits (`MigrateMsg::Out { params }`) and hands
//! the rank over. On any failure the VM keeps running here and the front-end is told.

use super::NodeError;
use super::service::Node;
use crate::wire::{MigrateMsg, Wire};
use agents::proto::NodeId;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use v2m::MigrationParams;

/// The longest the other node of a migration may take to answer.
const STEP: Duration = Duration::from_secs(600);

/// Room above the source link's last request id for the ids it may still use while the state
/// is sent: the destination's new link starts above it.
const ID_ROOM: u64 = 1_000_000;

impl Node {
    /// Waits for the other node's next message about a VM (or the job's end).
    pub(crate) fn wait(
        &self,
        rx: &mpsc::Receiver<Wire>,
        what: &'static str,
    ) -> Result<Wire, NodeError> {
        let until = Instant::now() + STEP;
        while Instant::now() < until {
            if self.state.is_stopping() {
                return Err(NodeError::Ending);
            }
            if let Ok(m) = rx.recv_timeout(Duration::from_millis(200)) {
                return Ok(m);
            }
        }
        Err(NodeError::NoReply { what, after: STEP })
    }
}

/// Source side of `MigrateMsg::Out`.
pub(crate) fn migrate_out(node: Node, vm: String, dest: NodeId, params: MigrationParams) {
    let rank = node.state.rank(&vm).map(|r| r.rank);
    let rx = node.state.wait_for(&vm);
    let r = send_vm(&node, &rx, &vm, dest, &params);
    node.state.end_wait(&vm);
    if let Err(e) = r {
        let done = MigrateMsg::Done {
            vm,
            rank: rank.unwrap_or(u32::MAX),
            error: Some(e.describe()),
        };
        node.send(NodeId(0), Wire::Migrate(done));
    }
}

fn send_vm(
    node: &Node,
    rx: &mpsc::Receiver<Wire>,
    vm: &str,
    dest: NodeId,
    params: &MigrationParams,
) -> Result<(), NodeError> {
    let r = node
        .state
        .rank(vm)
        .ok_or_else(|| NodeError::NoRank(vm.to_string()))?;
    let first_id = r.link.next_request_id() + ID_ROOM;
    let gone = || NodeError::Gone(vm.to_string());
    let profile = Box::new(node.state.profile(vm).ok_or_else(gone)?);
    let take = MigrateMsg::In {
        vm: vm.to_string(),
        rank: r.rank,
        profile,
        exec_id: r.exec_id,
        first_id,
        switch: node.switch,
    };
    node.send(dest, Wire::Migrate(take));
    let addr = match node.wait(rx, "answer from the destination")? {
        Wire::Migrate(MigrateMsg::Listening { addr, .. }) => addr,
        Wire::Migrate(MigrateMsg::Done { error: Some(e), .. }) => {
            return Err(NodeError::Refused(e));
        }
        other => {
            return Err(NodeError::Unexpected {
                from: "answer from the destination",
                msg: format!("{other:?}"),
            });
        }
    };
    let mut source = node.state.take_vm(vm).ok_or_else(gone)?;
    let sent = |ok| {
        Wire::Migrate(MigrateMsg::Sent {
            vm: vm.to_string(),
            ok,
        })
    };
    let key = super::migration_key(&node.secret, vm);
    if let Err(e) = vmhost::send(source.vm_mut(), addr, params, Some(&key)) {
        // The VM keeps running here (unless the job ended meanwhile: then it stops).
        let _ = node.state.register(source);
        node.send(dest, sent(false));
        return Err(e.into());
    }
    // The rank belongs to the destination from now on.
    node.state.hand_off(vm);
    node.send(dest, sent(true));
    // The source QEMU stopped itself after the handover; the destination runs on its disk.
    source.migrated_away();
    Ok(())
}
