//! What a node knows about its VMs, behind one lock.
//!
//! The locking rule: one mutex guards every map of [`State`]; each method of [`NodeState`]
//! holds it for a few map operations and never while it calls a guest agent, sends a message
//! or stops a VM. A VM taken out of the state is stopped by dropping it, which the caller
//! does after the lock is released.

use super::NodeError;
use crate::sync::lock;
use crate::wire::Wire;
use monitor::VmId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;
use v2m::Profile;
use vmhost::RunningVm;
use vse_guest_agent::GuestLink;

/// A rank's command running in one of this node's VMs.
#[derive(Clone)]
pub(crate) struct Rank {
    pub rank: u32,
    /// The command's guest agent request id: a migration hands it to the destination.
    pub exec_id: u64,
    pub id: VmId,
    /// The VM's hypervisor process (the sampler's host view of the VM).
    pub pid: u32,
    /// Shared by the rank's waiter, the sampler and the barrier relay: a guest agent channel
    /// takes one connection.
    pub link: Arc<GuestLink>,
    /// Set once the VM left this node: whoever waits for the rank stops without reporting.
    pub handed_off: Arc<AtomicBool>,
    /// When the rank's last output went to the front-end (a checkpoint waits for the output
    /// that was on its way when the VM paused).
    pub last_output: Arc<Mutex<Instant>>,
}

#[derive(Default)]
struct State {
    /// Every VM running here, by name; dropping one stops it. A VM being sent to another
    /// node is out of this map (its sender holds it) while its rank stays in `ranks`.
    vms: HashMap<String, RunningVm>,
    /// The ranks these VMs run, by VM name: the VMs the sampler watches, barrier lines reach
    /// and migrations move.
    ranks: HashMap<String, Rank>,
    /// The threads waiting for the other node of a migration in flight, by VM.
    waiters: HashMap<String, mpsc::Sender<Wire>>,
    /// What the front-end was told of this node's ranks that it must never miss (their
    /// relays on the job network, their statuses): said again to a front-end that attaches,
    /// since what was on its way into a front-end that died is lost.
    told: Vec<Wire>,
}

/// A node's VMs, their ranks and the migrations in flight (see the module's locking rule).
pub struct NodeState {
    state: Mutex<State>,
    /// Set once, when the job is torn down; guest agent links share it (a VM still booting
    /// gives up). `teardown` sets it before it takes the lock and `register` reads it under
    /// the lock, so no VM is registered after teardown emptied the node.
    stopping: Arc<AtomicBool>,
    /// Set when the front-end asks for a checkpoint: the batch system's SIGTERM then waits
    /// for it instead of ending the node's VMs.
    checkpointing: AtomicBool,
}

impl Default for NodeState {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeState {
    pub fn new() -> Self {
        Self {
            state: Mutex::default(),
            stopping: Arc::default(),
            checkpointing: AtomicBool::new(false),
        }
    }

    pub(crate) fn checkpoint_started(&self) {
        self.checkpointing.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_checkpointing(&self) -> bool {
        self.checkpointing.load(Ordering::SeqCst)
    }

    pub(crate) fn stopping(&self) -> &Arc<AtomicBool> {
        &self.stopping
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Adds a VM, unless the job is being torn down: teardown empties the node once, so a VM
    /// added after it would outlive the job (the refused VM is stopped).
    pub(crate) fn register(&self, vm: RunningVm) -> Result<(), NodeError> {
        let mut s = lock(&self.state);
        if self.is_stopping() {
            drop(s);
            drop(vm);
            return Err(NodeError::Ending);
        }
        s.vms.insert(vm.name().to_string(), vm);
        Ok(())
    }

    /// Takes the VM `name` out (to send it away); its rank stays until [`Self::hand_off`].
    pub(crate) fn take_vm(&self, name: &str) -> Option<RunningVm> {
        lock(&self.state).vms.remove(name)
    }

    /// The VM `name` runs its rank here from now on.
    pub(crate) fn start_rank(&self, name: &str, rank: Rank) {
        lock(&self.state).ranks.insert(name.to_string(), rank);
    }

    pub(crate) fn rank(&self, name: &str) -> Option<Rank> {
        lock(&self.state).ranks.get(name).cloned()
    }

    /// Every rank running here.
    pub(crate) fn ranks(&self) -> Vec<Rank> {
        lock(&self.state).ranks.values().cloned().collect()
    }

    pub(crate) fn link(&self, name: &str) -> Option<Arc<GuestLink>> {
        lock(&self.state).ranks.get(name).map(|r| r.link.clone())
    }

    /// The profile the VM `name` runs with (a destination prepares the same).
    pub(crate) fn profile(&self, name: &str) -> Option<Profile> {
        lock(&self.state).vms.get(name).map(|v| v.profile().clone())
    }

    /// The destination runs the VM `name` and its rank now: whoever waits for the rank here
    /// stops without reporting, and the node forgets it.
    pub(crate) fn hand_off(&self, name: &str) {
        if let Some(r) = lock(&self.state).ranks.remove(name) {
            r.handed_off.store(true, Ordering::SeqCst);
        }
    }

    /// The rank of `name` ended here (or the VM could not run it): forgets the rank and takes
    /// the VM out, for the caller to stop.
    pub(crate) fn remove(&self, name: &str) -> Option<RunningVm> {
        let mut s = lock(&self.state);
        s.ranks.remove(name);
        s.vms.remove(name)
    }

    /// Every watched VM: its id, hypervisor pid and guest agent link.
    pub(crate) fn watched(&self) -> Vec<(VmId, u32, Arc<GuestLink>)> {
        lock(&self.state)
            .ranks
            .values()
            .map(|r| (r.id.clone(), r.pid, r.link.clone()))
            .collect()
    }

    /// Where the other node's next messages about `vm` go, until [`Self::end_wait`].
    pub(crate) fn wait_for(&self, vm: &str) -> mpsc::Receiver<Wire> {
        let (tx, rx) = mpsc::channel();
        lock(&self.state).waiters.insert(vm.to_string(), tx);
        rx
    }

    pub(crate) fn end_wait(&self, vm: &str) {
        lock(&self.state).waiters.remove(vm);
    }

    /// Routes a migration message to the thread waiting for it (dropped when none waits).
    pub(crate) fn deliver(&self, vm: &str, msg: Wire) {
        let tx = lock(&self.state).waiters.get(vm).cloned();
        if let Some(tx) = tx {
            let _ = tx.send(msg);
        }
    }

    /// Records `msg` as told to the front-end (see `State::told`).
    pub(crate) fn told(&self, msg: &Wire) {
        lock(&self.state).told.push(msg.clone());
    }

    /// Everything [`NodeState::told`] recorded, in order.
    pub(crate) fn all_told(&self) -> Vec<Wire> {
        lock(&self.state).told.clone()
    }

    /// Marks the job as ending and takes every VM out, for the caller to stop.
    pub(crate) fn stop_all(&self) -> Vec<RunningVm> {
        self.stopping.store(true, Ordering::SeqCst);
        let mut s = lock(&self.state);
        s.ranks.clear();
        s.vms.drain().map(|(_, vm)| vm).collect()
    }
}
