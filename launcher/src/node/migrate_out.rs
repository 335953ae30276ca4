//! The source side of a live migration ordered by the front-end's migration daemon, in
//! vmhost's steps: the destination node prepares an incoming VM from the same profile, this
//! node sends the state within the policy's limits (`MigrateMsg::Out { params }`) and hands
//! the rank over. The disk goes the way the destination found: in place when it saw this
//! node's probe next to the overlay (shared storage), else copied by QEMU's block mirror to
//! the destination's own overlay. On any failure the VM keeps running here and the
//! front-end is told.

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
pub(crate) const ID_ROOM: u64 = 1_000_000;

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
pub(crate) fn migrate_out(
    node: Node,
    rx: mpsc::Receiver<Wire>,
    vm: String,
    dest: NodeId,
    params: MigrationParams,
    hold: bool,
) {
    let rank = node.state.rank(&vm).map(|r| r.rank);
    let r = send_vm(&node, &rx, &vm, dest, &params, hold);
    node.state.end_wait(&vm);
    if let Err(e) = r {
        let done = MigrateMsg::Done {
            vm,
            rank: rank.unwrap_or(u32::MAX),
            error: Some(e.describe()),
            transfer: None,
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
    hold: bool,
) -> Result<(), NodeError> {
    let r = node
        .state
        .rank(vm)
        .ok_or_else(|| NodeError::NoRank(vm.to_string()))?;
    let first_id = r.link.next_request_id() + ID_ROOM;
    let gone = || NodeError::Gone(vm.to_string());
    let profile = Box::new(node.state.profile(vm).ok_or_else(gone)?);
    // Removed (by drop) once the destination answered: it has looked by then.
    let probe = profile
        .disks
        .first()
        .and_then(|d| vmhost::leave_probe(&d.path).ok());
    let take = MigrateMsg::In {
        vm: vm.to_string(),
        rank: r.rank,
        digest: image_digest(&profile),
        probe: probe.as_ref().map(|p| p.probe().clone()),
        profile,
        exec_id: r.exec_id,
        first_id,
        switch: node.switch,
        shares: r.link.shares().map(|s| s.list()).unwrap_or_default(),
    };
    node.send(dest, Wire::Migrate(take));
    // A held move may be released (or called off) before the destination is ready.
    let mut release = (!hold).then_some(true);
    let answer = loop {
        match node.wait(rx, "answer from the destination")? {
            Wire::Migrate(MigrateMsg::Release { go, .. }) => release = Some(go),
            answer => break answer,
        }
    };
    drop(probe);
    let (addr, disks) = match answer {
        Wire::Migrate(MigrateMsg::Listening { addr, disks, .. }) => (addr, disks),
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
    let sent = |ok, report, cut| {
        Wire::Migrate(MigrateMsg::Sent {
            vm: vm.to_string(),
            ok,
            report,
            cut,
        })
    };
    let go = match release {
        Some(go) => go,
        None => released(node, rx)?,
    };
    if !go {
        node.send(dest, sent(false, None, String::new()));
        return Err(NodeError::Refused("the move was called off".into()));
    }
    let mut source = node.state.take_vm(vm).ok_or_else(gone)?;
    let key = super::migration_key(&node.secret, vm);
    let report = match vmhost::send_disks(source.vm_mut(), addr, disks, params, Some(&key)) {
        Ok(report) => report,
        Err(e) => {
            // The VM keeps running here (unless the job ended meanwhile: then it stops).
            let _ = node.state.register(source);
            node.send(dest, sent(false, None, String::new()));
            return Err(e.into());
        }
    };
    // The rank belongs to the destination from now on.
    node.state.hand_off(vm);
    let cut = carried_cut(vm, source.link().detach());
    node.send(dest, sent(true, Some(report), cut));
    match disks {
        // The source QEMU stopped itself after the handover; the destination runs on its disk.
        v2m::DiskMigration::Shared => source.migrated_away(),
        // The destination runs on its own copy: this node's overlay goes with the handle.
        v2m::DiskMigration::Copy { .. } => drop(source),
    }
    Ok(())
}

/// The start of a line the switchover cut, hex for the wire; one that would not fit a frame
/// (only a whole-output `exec` reply can be that long) is dropped, and its command's waiter
/// on the destination times out.
fn carried_cut(vm: &str, start: Vec<u8>) -> String {
    const MOST: usize = agents::proto::MAX_BLOB / 4;
    if start.len() > MOST {
        eprintln!(
            "vse: {vm}: {} bytes of a guest agent line cut at the switchover are too many to carry; dropped",
            start.len()
        );
        return String::new();
    }
    hex::encode(start)
}

/// Waits for the front-end's word on a prepared move: true to send it.
fn released(node: &Node, rx: &mpsc::Receiver<Wire>) -> Result<bool, NodeError> {
    match node.wait(rx, "the front-end's release of a prepared move")? {
        Wire::Migrate(MigrateMsg::Release { go, .. }) => Ok(go),
        other => Err(NodeError::Unexpected {
            from: "the front-end, about a prepared move",
            msg: format!("{other:?}"),
        }),
    }
}

/// The digest the VM's image is staged under on this node: the name of the cache directory
/// holding its kernel (every node stages an image under the same digest).
fn image_digest(profile: &v2m::Profile) -> Option<String> {
    let dir = profile.image.kernel.parent()?;
    (dir.parent()? == super::cache_dir()).then_some(())?;
    dir.file_name()?.to_str().map(str::to_owned)
}
