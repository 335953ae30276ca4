//! The node side of a live migration ordered by the front-end's migration daemon (issue 7).
//! Source: asks the destination node to prepare, sends the state with V2M, hands the rank
//! over. Destination: prepares an incoming VM from the same staged image and profile
//! (`-incoming`), takes over the guest agent link — the rank's command keeps running in the
//! guest, its reply now comes here under the same request id — and reports to the front-end.
//!
//! The VM's disk is its copy-on-write overlay on the source: the destination opens the same
//! path, so it must be shared storage (or the same machine, as in `local:N`); otherwise the
//! destination refuses with a clear error and the VM stays where it is.

use super::node::{Vms, await_rank, rank_output, report_rank, settings};
use super::watch::{Registry, Watched};
use crate::sync::lock;
use agents::{
    agent::{Control, JobHandle},
    proto::NodeId,
};
use anyhow::{Context, anyhow};
use launcher::{
    guest_link::{BarrierRelay, GuestLink, PendingExec},
    wire::{BarrierMsg, MigrateMsg, Wire},
};
use monitor::VmId;
use std::{
    collections::HashMap,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};
use v2m::{MigrationParams, MigrationTarget, PluginKind, Profile, Vm, registry};

/// A VM running on this node with its rank's command.
pub struct Running {
    pub rank: u32,
    pub profile: Profile,
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

    fn take_vm(&self, name: &str) -> Option<Box<dyn Vm>> {
        let mut all = lock(&self.vms);
        let pos = all.iter().position(|v| v.name().as_str() == name)?;
        Some(all.remove(pos))
    }
}

/// Routes a migration reply to the thread waiting for it.
pub fn deliver(waiters: &Waiters, vm: &str, msg: Wire) {
    if let Some(tx) = lock(waiters).get(vm) {
        let _ = tx.send(msg);
    }
}

/// Source side of `MigrateOut`.
pub fn migrate_out(sh: Shared, vm: String, dest: NodeId) {
    let rank = lock(&sh.running).get(&vm).map(|r| r.rank);
    let r = out(&sh, &vm, dest);
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

fn out(sh: &Shared, vm: &str, dest: NodeId) -> anyhow::Result<()> {
    let (rank, profile, exec_id, first_id) = {
        let run = lock(&sh.running);
        let r = run
            .get(vm)
            .ok_or_else(|| anyhow!("VM {vm} does not run a rank on this node"))?;
        // Ids the source may still use while the state is sent, with room to spare.
        let first = r.link.next_request_id() + 1_000_000;
        (r.rank, serde_json::to_string(&r.profile)?, r.exec_id, first)
    };
    let rx = sh.waiter(vm);
    sh.send(
        dest,
        Wire::Migrate(MigrateMsg::In {
            vm: vm.to_string(),
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
    let mut source = sh
        .take_vm(vm)
        .ok_or_else(|| anyhow!("VM {vm} is no longer running here"))?;
    let params = MigrationParams {
        max_bandwidth_bytes_per_s: 1 << 30,
        downtime_limit_ms: 300,
        timeout: Duration::from_secs(300),
    };
    let target = MigrationTarget {
        host: addr.ip().to_string(),
        port: addr.port(),
    };
    match source.migrate(&target, &params) {
        Ok(_) => {
            // The rank belongs to the destination from now on.
            if let Some(r) = lock(&sh.running).remove(vm) {
                r.handed_off.store(true, Ordering::SeqCst);
            }
            if let Ok(id) = VmId::new(vm) {
                lock(&sh.watched).remove(&id);
            }
            sh.send(
                dest,
                Wire::Migrate(MigrateMsg::Sent {
                    vm: vm.to_string(),
                    ok: true,
                }),
            );
            // The source QEMU stopped itself after the handover; dropping reaps it.
            drop(source);
            Ok(())
        }
        Err(e) => {
            lock(&sh.vms).push(source);
            sh.send(
                dest,
                Wire::Migrate(MigrateMsg::Sent {
                    vm: vm.to_string(),
                    ok: false,
                }),
            );
            Err(anyhow!("sending the state: {e}"))
        }
    }
}

/// Destination side of `MigrateIn`; the VM's rank is reported from here when it ends.
pub struct Incoming {
    pub from: NodeId,
    pub vm: String,
    pub rank: u32,
    pub profile: String,
    pub exec_id: u64,
    pub first_id: u64,
}

pub fn migrate_in(sh: Shared, m: Incoming) {
    let rx = sh.waiter(&m.vm);
    let mut sent = false;
    let r = take_in(&sh, &m, &rx, &mut sent);
    lock(&sh.waiters).remove(&m.vm);
    match r {
        Ok(None) => {}
        Ok(Some((pending, pid, handed_off, scratch))) => {
            sh.send(
                NodeId(0),
                Wire::Migrate(MigrateMsg::Done {
                    vm: m.vm.clone(),
                    rank: m.rank,
                    error: None,
                }),
            );
            let out = await_rank(&pending, pid, &handed_off, &rank_output(&sh.h, m.rank));
            if let Some(out) = out.transpose() {
                finish_here(&sh, &m.vm, &scratch);
                report_rank(&sh.h, m.rank, out);
            }
        }
        Err(e) => {
            // Before the state was sent the source keeps the VM and reports; after, the VM
            // is lost with this node's failure and only the front-end can be told.
            drop(sh.take_vm(&m.vm));
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

/// The VM's rank ended here: stop the VM, forget it, remove its scratch directory.
fn finish_here(sh: &Shared, vm: &str, scratch: &Path) {
    drop(sh.take_vm(vm));
    lock(&sh.running).remove(vm);
    if let Ok(id) = VmId::new(vm) {
        lock(&sh.watched).remove(&id);
    }
    let _ = std::fs::remove_dir_all(scratch);
}

type Taken = (PendingExec, u32, Arc<AtomicBool>, PathBuf);

fn take_in(
    sh: &Shared,
    m: &Incoming,
    rx: &mpsc::Receiver<Wire>,
    sent: &mut bool,
) -> anyhow::Result<Option<Taken>> {
    let profile: Profile =
        serde_json::from_str(&m.profile).context("the VM profile from the source")?;
    for d in &profile.disks {
        if !d.path.exists() {
            return Err(anyhow!(
                "{}: the VM's disk is not visible on this node; live migration needs the \
                 source's disk overlay on shared storage (or both nodes on one machine)",
                d.path.display()
            ));
        }
    }
    let scratch = profile
        .disks
        .first()
        .and_then(|d| d.path.parent())
        .map(Path::to_path_buf)
        .unwrap_or_default();
    // Node agents sharing one machine share its run directory, where the source's VM still
    // runs under the same name: a VM migrated in lives under this agent's own directory.
    let mut settings = settings();
    settings.qemu.run_root = settings.qemu.run_root.join(format!("in-{}", sh.me));
    let plugin = registry::select(&settings, Some(PluginKind::Qemu))?;
    let listen = MigrationTarget {
        host: sh.bind.to_string(),
        port: 0,
    };
    // Killed on drop by any early return: no half-made VM outlives a failure.
    let mut incoming = plugin
        .prepare_incoming(&profile, &listen)
        .context("preparing the incoming VM")?;
    let pid = incoming
        .status()
        .ok()
        .and_then(|s| s.pid)
        .ok_or_else(|| anyhow!("the incoming VM has no pid"))?;
    if let Some(dir) = &sh.cgroup {
        std::fs::write(dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving QEMU {pid} into {}", dir.display()))?;
    }
    let t = incoming
        .incoming()
        .cloned()
        .ok_or_else(|| anyhow!("the incoming VM reports no listening address"))?;
    let addr = format!("{}:{}", t.host, t.port)
        .parse()
        .with_context(|| format!("listening address {}:{}", t.host, t.port))?;
    sh.send(
        m.from,
        Wire::Migrate(MigrateMsg::Listening {
            vm: m.vm.clone(),
            addr,
        }),
    );
    match sh.wait(rx, "state from the source")? {
        Wire::Migrate(MigrateMsg::Sent { ok: true, .. }) => *sent = true,
        // The source reports the failure; the prepared VM goes with `incoming`.
        Wire::Migrate(MigrateMsg::Sent { ok: false, .. }) => return Ok(None),
        other => return Err(anyhow!("unexpected message from the source: {other:?}")),
    }
    incoming
        .finish_incoming(Duration::from_secs(120))
        .context("the incoming VM did not take over")?;
    let sock = incoming
        .agent_socket()
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow!("the VM has no guest agent channel"))?;
    lock(&sh.vms).push(incoming);
    let relay = Arc::new(NodeRelay {
        vm: m.vm.clone(),
        h: sh.h.clone(),
    });
    let link = Arc::new(
        GuestLink::connect_relay(&sock, relay, Duration::from_secs(120), m.first_id)
            .context("reconnecting to the guest agent")?,
    );
    let pending = link.adopt_exec(m.exec_id);
    let handed_off = Arc::new(AtomicBool::new(false));
    let id = VmId::new(m.vm.clone()).map_err(|e| anyhow!("VM id: {e}"))?;
    lock(&sh.watched).insert(
        id,
        Watched {
            pid,
            link: link.clone(),
        },
    );
    lock(&sh.running).insert(
        m.vm.clone(),
        Running {
            rank: m.rank,
            profile,
            exec_id: m.exec_id,
            link,
            handed_off: handed_off.clone(),
        },
    );
    Ok(Some((pending, pid, handed_off, scratch)))
}
