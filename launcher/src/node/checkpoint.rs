//! A node's part of a job checkpoint: pause every VM of the job here, answer, and once the
//! front-end has heard from every node (no VM of the job runs any more: the consistent
//! point), save each VM's memory state and its disk overlay into the checkpoint's directory;
//! then run on when told, or leave the paused VMs to the teardown when the job stops.
//!
//! The VMs are out of the node's state while they are held here, so no migration can take
//! one meanwhile; if the job ends, dropping them stops them.

use super::NodeError;
use super::service::Node;
use crate::ckpt::{FileRecord, SavedVm};
use crate::wire::{CheckpointMsg, Wire};
use agents::proto::NodeId;
use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};
use vmhost::RunningVm;
use vmhost::files::{copy_sparse, hash_file};

/// The node state's waiter key of checkpoint `id` (no VM name starts with '#'): one per
/// checkpoint, so a late thread of an earlier one never takes a later one's orders.
pub(crate) fn waiter(id: u64) -> String {
    format!("#checkpoint-{id}")
}

/// A VM held paused, with what a restore needs of its rank.
struct Held {
    vm: RunningVm,
    rank: u32,
    exec_id: u64,
    first_id: u64,
    last_output: Arc<Mutex<Instant>>,
}

/// Output the guest wrote just before it paused can still be on its way out of the
/// hypervisor (it is not in the saved state any more): the checkpoint is complete once every
/// rank's output has been quiet this long.
const SETTLE: Duration = Duration::from_millis(200);
const SETTLE_AT_MOST: Duration = Duration::from_secs(3);

/// Runs checkpoint `id` on this node to its end (`rx`: the front-end's next orders).
pub(crate) fn checkpoint(node: Node, rx: mpsc::Receiver<Wire>, id: u64) {
    let (held, error) = pause_all(&node);
    let ranks = held.iter().map(|h| h.rank).collect();
    node.send(
        NodeId(0),
        Wire::Checkpoint(CheckpointMsg::Paused { id, ranks, error }),
    );
    let mut held = held;
    let key = waiter(id);
    loop {
        match node.wait(&rx, "the front-end's checkpoint order") {
            Ok(Wire::Checkpoint(CheckpointMsg::Save { dir, last, .. })) => {
                let (vms, error) = match save_all(&mut held, &dir) {
                    Ok(vms) => (vms, None),
                    Err(e) => (Vec::new(), Some(e.describe())),
                };
                // A job that runs on sends whatever is still on its way after the resume.
                if last {
                    settle(&held);
                }
                let saved = CheckpointMsg::Saved { id, vms, error };
                node.send(NodeId(0), Wire::Checkpoint(saved));
            }
            Ok(Wire::Checkpoint(CheckpointMsg::Resume { .. })) => break,
            Ok(_) => {}
            // The job ends: the held VMs stop with `held`.
            Err(NodeError::Ending) => {
                node.state.end_wait(&key);
                return;
            }
            // The front-end went silent: the VMs run on.
            Err(e) => {
                eprintln!("{}: checkpoint {id}: {e}; resuming the VMs", node.me);
                break;
            }
        }
    }
    node.state.end_wait(&key);
    for mut h in held {
        if let Err(e) = h.vm.vm_mut().resume() {
            eprintln!(
                "{}: resuming VM {} after a checkpoint: {e}",
                node.me,
                h.vm.name()
            );
        }
        // Refused only when the job is being torn down: then the VM stops here.
        let _ = node.state.register(h.vm);
    }
}

/// Pauses every VM that runs a rank here; says which could not be.
fn pause_all(node: &Node) -> (Vec<Held>, Option<String>) {
    let mut held = Vec::new();
    let mut problems = Vec::new();
    for r in node.state.ranks() {
        let name = r.id.to_string();
        let Some(mut vm) = node.state.take_vm(&name) else {
            problems.push(format!("VM {name} is moving to another node"));
            continue;
        };
        match vm.vm_mut().pause() {
            Ok(()) => held.push(Held {
                vm,
                rank: r.rank,
                exec_id: r.exec_id,
                first_id: r.link.next_request_id() + super::migrate_out::ID_ROOM,
                last_output: r.last_output.clone(),
            }),
            Err(e) => {
                problems.push(format!("pausing VM {name}: {e}"));
                let _ = node.state.register(vm);
            }
        }
    }
    let error = (!problems.is_empty()).then(|| problems.join("; "));
    (held, error)
}

/// Waits until no held rank's output moved for [`SETTLE`] (at most [`SETTLE_AT_MOST`]), so
/// that it reached the front-end before the checkpoint's answer does.
fn settle(held: &[Held]) {
    let until = Instant::now() + SETTLE_AT_MOST;
    while Instant::now() < until
        && held
            .iter()
            .any(|h| crate::sync::lock(&h.last_output).elapsed() < SETTLE)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Saves every held VM into `dir`: its state through the hypervisor (which flushes the disk),
/// then its overlay, both hashed.
fn save_all(held: &mut [Held], dir: &Path) -> Result<Vec<SavedVm>, NodeError> {
    let mut out = Vec::new();
    for h in held.iter_mut() {
        let name = h.vm.name().to_string();
        let state_file = format!("{name}.state");
        let state = dir.join(&state_file);
        let report = h.vm.vm_mut().checkpoint(&state)?;
        let (bytes, sha256) = match report.sha256 {
            Some(sum) => (report.bytes, sum),
            None => hash_file(&state).map_err(|source| NodeError::File {
                what: "reading the saved state",
                path: state.clone(),
                source,
            })?,
        };
        let overlay = (h.vm.profile().disks.first())
            .map(|d| d.path.clone())
            .ok_or_else(|| NodeError::Gone(name.clone()))?;
        let disk_file = format!("{name}.qcow2");
        let disk = dir.join(&disk_file);
        let (dbytes, dsum) = copy_sparse(&overlay, &disk).map_err(|source| NodeError::File {
            what: "copying the disk overlay to",
            path: disk.clone(),
            source,
        })?;
        out.push(SavedVm {
            rank: h.rank,
            vm: name,
            exec_id: h.exec_id,
            first_id: h.first_id,
            state: FileRecord {
                file: state_file,
                bytes,
                sha256,
            },
            disk: FileRecord {
                file: disk_file,
                bytes: dbytes,
                sha256: dsum,
            },
            // The front-end's barrier hub knows the ranks' connections.
            barrier: Vec::new(),
        });
    }
    Ok(out)
}
