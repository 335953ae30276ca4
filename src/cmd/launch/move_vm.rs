//! The node side of a live migration ordered by the front-end's migration daemon, in
//! vmhost's steps. Source: asks the destination node to prepare, sends the state within the
//! policy's limits, hands the rank over. Destination: prepares an incoming VM from the same
//! profile (`-incoming`), takes over the guest agent link with a new one — the rank's command
//! keeps running in the guest, its reply now comes here under the same request id — and
//! reports to the front-end.

use super::node::{Vms, await_rank, rank_output, register, report_rank, settings, take_vm};
use super::watch::{Registry, Watched};
use agents::{
    agent::{Control, JobHandle},
    proto::NodeId,
};
use anyhow::anyhow;
use launcher::wire::{BarrierMsg, MigrateMsg, Wire};
use monitor::VmId;
use std::{
    collections::HashMap,
    net::IpAddr,
    path::PathBuf,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};
use v2m::{MigrationParams, PluginKind, Profile, registry};
use vmhost::{Incoming, OverlayDir};
use vse_guest_agent::{BarrierRelay, Barriers, GuestLink, LinkOptions, PendingExec};

/// A VM running on this node with its rank's command.
pub struct Running {
    pub rank: u32,
    pub exec_id: u64,
    pub link: Arc<GuestLink>,
    /// Set once the VM left this node: whoever waits for the rank stops without reporting.
    pub handed_off: Arc<AtomicBool>,
}

pub type RunningMap = Arc<Mutex<HashMap<String, Running>>>;
/// Replies of the other node of a migration in flight, by VM.
pub type Waiters = Arc<Mutex<HashMap<String, mpsc::Sender<Wire>>>>;

/// Barrier lines of a VM's guest ranks, up the overlay to the front-end's controller.
pub struct NodeRelay {
    pub vm: String,
    pub h: JobHandle<Wire>,
}

impl BarrierRelay for NodeRelay {
    fn up(&self, conn: u64, line: &str) {
        self.h.control(Control::Send {
            dst: NodeId(0),
            msg: Wire::Barrier(BarrierMsg::Up {
                vm: self.vm.clone(),
                conn,
                line: line.to_string(),
            }),
        });
    }
    fn closed(&self, conn: u64) {
        self.h.control(Control::Send {
            dst: NodeId(0),
            msg: Wire::Barrier(BarrierMsg::UpClosed {
                vm: self.vm.clone(),
                conn,
            }),
        });
    }
}

/// What both ends need.
#[derive(Clone)]
pub struct Shared {
    pub h: JobHandle<Wire>,
    pub me: NodeId,
    pub bind: IpAddr,
    pub vms: Vms,
    pub running: RunningMap,
    pub watched: Registry,
    pub waiters: Waiters,
    pub cgroup: Option<PathBuf>,
    pub stopping: Arc<AtomicBool>,
}

const STEP: Duration = Duration::from_secs(600);
/// How long the destination waits for the state once the source said it was sent, and then
/// for the guest agent.
const TAKE_OVER: Duration = Duration::from_secs(120);

/// The node's maps stay usable after a panic on another thread (each update is one insert or
/// remove, never left half done).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn send(&self, dst: NodeId, msg: Wire) {
        self.h.control(Control::Send { dst, msg });
    }

    /// Waits for the other node's next message about `vm` (or the job's end).
    fn wait(&self, rx: &mpsc::Receiver<Wire>, what: &str) -> anyhow::Result<Wire> {
        let until = Instant::now() + STEP;
        while Instant::now() < until {
            if self.stopping.load(Ordering::SeqCst) {
                return Err(anyhow!("the job is ending"));
            }
            if let Ok(m) = rx.recv_timeout(Duration::from_millis(200)) {
                return Ok(m);
            }
        }
        Err(anyhow!("no {what} within {STEP:?}"))
    }

    fn waiter(&self, vm: &str) -> mpsc::Receiver<Wire> {
        let (tx, rx) = mpsc::channel();
        lock(&self.waiters).insert(vm.to_string(), tx);
        rx
    }

    /// The VM no longer runs its rank here: forget it everywhere.
    fn forget(&self, vm: &str) {
        lock(&self.running).remove(vm);
        if let Ok(id) = VmId::new(vm) {
            lock(&self.watched).remove(&id);
        }
    }
}

/// Routes a migration reply to the thread waiting for it.
pub fn deliver(waiters: &Waiters, vm: &str, msg: Wire) {
    if let Some(tx) = lock(waiters).get(vm) {
        let _ = tx.send(msg);
    }
}

/// Source side of `MigrateOut`.
pub fn migrate_out(sh: Shared, vm: String, dest: NodeId, params: MigrationParams) {
    let rank = lock(&sh.running).get(&vm).map(|r| r.rank);
    let r = out(&sh, &vm, dest, &params);
    lock(&sh.waiters).remove(&vm);
    if let Err(e) = r {
        sh.send(
            NodeId(0),
            Wire::Migrate(MigrateMsg::Done {
                vm,
                rank: rank.unwrap_or(u32::MAX),
                error: Some(format!("{e:#}")),
            }),
        );
    }
}

fn out(sh: &Shared, vm: &str, dest: NodeId, params: &MigrationParams) -> anyhow::Result<()> {
    let (rank, exec_id, first_id) = {
        let run = lock(&sh.running);
        let r = run
            .get(vm)
            .ok_or_else(|| anyhow!("VM {vm} does not run a rank on this node"))?;
        // Ids the source may still use while the state is sent, with room to spare.
        (r.rank, r.exec_id, r.link.next_request_id() + 1_000_000)
    };
    let profile = lock(&sh.vms)
        .iter()
        .find(|v| v.name().as_str() == vm)
        .map(|v| Box::new(v.profile().clone()))
        .ok_or_else(|| anyhow!("VM {vm} is no longer running here"))?;
    let rx = sh.waiter(vm);
    let vm_ = vm.to_string();
    sh.send(
        dest,
        Wire::Migrate(MigrateMsg::In {
            vm: vm_.clone(),
            rank,
            profile,
            exec_id,
            first_id,
        }),
    );
    let addr = match sh.wait(&rx, "answer from the destination")? {
        Wire::Migrate(MigrateMsg::Listening { addr, .. }) => addr,
        Wire::Migrate(MigrateMsg::Done { error: Some(e), .. }) => {
            return Err(anyhow!("the destination cannot take the VM: {e}"));
        }
        other => return Err(anyhow!("unexpected answer from the destination: {other:?}")),
    };
    let mut source =
        take_vm(&sh.vms, vm).ok_or_else(|| anyhow!("VM {vm} is no longer running here"))?;
    let sent = vmhost::send(source.vm_mut(), addr, params);
    if let Err(e) = sent {
        lock(&sh.vms).push(source);
        sh.send(dest, Wire::Migrate(MigrateMsg::Sent { vm: vm_, ok: false }));
        return Err(e.into());
    }
    // The rank belongs to the destination from now on.
    if let Some(r) = lock(&sh.running).get(vm) {
        r.handed_off.store(true, Ordering::SeqCst);
    }
    sh.forget(vm);
    sh.send(dest, Wire::Migrate(MigrateMsg::Sent { vm: vm_, ok: true }));
    // The source QEMU stopped itself after the handover; the destination runs on its disk.
    source.migrated_away();
    Ok(())
}

/// Destination side of `MigrateIn`; the VM's rank is reported from here when it ends.
pub struct MoveIn {
    pub from: NodeId,
    pub vm: String,
    pub rank: u32,
    pub profile: Profile,
    pub exec_id: u64,
    pub first_id: u64,
}

pub fn migrate_in(sh: Shared, m: MoveIn) {
    let rx = sh.waiter(&m.vm);
    let mut sent = false;
    let r = take_in(&sh, &m, &rx, &mut sent);
    lock(&sh.waiters).remove(&m.vm);
    match r {
        Ok(None) => {}
        Ok(Some((pending, pid, handed_off))) => {
            sh.send(
                NodeId(0),
                Wire::Migrate(MigrateMsg::Done {
                    vm: m.vm.clone(),
                    rank: m.rank,
                    error: None,
                }),
            );
            let mut output = rank_output(&sh.h, m.rank);
            let out = await_rank(&pending, pid, &handed_off, &mut output);
            if let Some(out) = out.transpose() {
                // The rank ended here: stop the VM (its overlay goes with it) and forget it.
                drop(take_vm(&sh.vms, &m.vm));
                sh.forget(&m.vm);
                report_rank(&sh.h, m.rank, out);
            }
        }
        Err(e) => {
            // Before the state was sent the source keeps the VM and reports; after, the VM
            // is lost with this node's failure and only the front-end can be told.
            drop(take_vm(&sh.vms, &m.vm));
            sh.send(
                if sent { NodeId(0) } else { m.from },
                Wire::Migrate(MigrateMsg::Done {
                    vm: m.vm.clone(),
                    rank: m.rank,
                    error: Some(format!("{e:#}")),
                }),
            );
        }
    }
}

type Taken = (PendingExec, u32, Arc<AtomicBool>);

fn take_in(
    sh: &Shared,
    m: &MoveIn,
    rx: &mpsc::Receiver<Wire>,
    sent: &mut bool,
) -> anyhow::Result<Option<Taken>> {
    // Node agents sharing one machine share its run directory, where the source's VM still
    // runs under the same name: a VM migrated in lives under this agent's own directory.
    let mut settings = settings();
    settings.qemu.run_root = settings.qemu.run_root.join(format!("in-{}", sh.me));
    let plugin = registry::select(&settings, Some(PluginKind::Qemu))?;
    // Killed on drop by any early return: no half-made VM outlives a failure.
    let incoming = Incoming::prepare(&*plugin, &m.profile, sh.bind, sh.cgroup.as_deref())?;
    sh.send(
        m.from,
        Wire::Migrate(MigrateMsg::Listening {
            vm: m.vm.clone(),
            addr: incoming.addr(),
        }),
    );
    match sh.wait(rx, "state from the source")? {
        Wire::Migrate(MigrateMsg::Sent { ok: true, .. }) => *sent = true,
        // The source reports the failure; the prepared VM goes with `incoming`.
        Wire::Migrate(MigrateMsg::Sent { ok: false, .. }) => return Ok(None),
        other => return Err(anyhow!("unexpected message from the source: {other:?}")),
    }
    let relay = Arc::new(NodeRelay {
        vm: m.vm.clone(),
        h: sh.h.clone(),
    });
    let link = LinkOptions::new(TAKE_OVER)
        .barriers(Barriers::Relay(relay))
        .first_id(m.first_id)
        .cancel(sh.stopping.clone());
    let mut vm = incoming.finish(TAKE_OVER)?.connect(&link)?;
    // The source left its disk overlay to this node, which removes it when the VM ends here.
    vm.set_overlay(
        m.profile
            .disks
            .first()
            .and_then(|d| OverlayDir::adopt(&d.path)),
    );
    let (link, pid) = (vm.link().clone(), vm.pid());
    let pending = link.adopt_exec(m.exec_id);
    register(&sh.vms, &sh.stopping, vm)?;
    let handed_off = Arc::new(AtomicBool::new(false));
    let id = VmId::new(m.vm.clone()).map_err(|e| anyhow!("VM id: {e}"))?;
    let watched = Watched {
        pid,
        link: link.clone(),
    };
    lock(&sh.watched).insert(id, watched);
    let running = Running {
        rank: m.rank,
        exec_id: m.exec_id,
        link,
        handed_off: handed_off.clone(),
    };
    lock(&sh.running).insert(m.vm.clone(), running);
    Ok(Some((pending, pid, handed_off)))
}
