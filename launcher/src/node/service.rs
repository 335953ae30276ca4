//! [`NodeService`]: a node agent's side of a launch, driven by the agent's events.

use super::migrate_in::MoveIn;
use super::rank::{JobVms, VmJob};
use super::watch::NodeMonitor;
use super::{NodeState, cache_dir, checkpoint, migrate_in, migrate_out, settings};
use crate::stage::{StageOptions, StageServer};
use crate::sync::lock;
use crate::wire::{BarrierMsg, CheckpointMsg, LaunchMsg, MigrateMsg, MonitorMsg, Wire};
use agents::agent::{Control, JobHandle};
use agents::proto::NodeId;
use agents::secret::JobSecret;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

type Event = agents::agent::Event<Wire>;

/// What a worker thread of the node (a VM's, a migration's) works with.
#[derive(Clone)]
pub(crate) struct Node {
    pub h: JobHandle<Wire>,
    pub me: NodeId,
    /// This node's address on the allocation network.
    pub bind: IpAddr,
    pub state: Arc<NodeState>,
    /// The node's memory cgroup (simulation mode): its VMs' hypervisors go there.
    pub cgroup: Option<PathBuf>,
    /// The job's secret: keys of migration streams and of the VMs' network relays.
    pub secret: JobSecret,
    /// The job's switch, when the job has a network (for VMs moving in).
    pub switch: Option<SocketAddr>,
}

impl Node {
    pub fn send(&self, dst: NodeId, msg: Wire) {
        self.h.control(Control::Send { dst, msg });
    }

    /// Sends the front-end something it must never miss, again after an attach.
    pub fn tell(&self, msg: Wire) {
        self.state.told(&msg);
        self.send(NodeId(0), msg);
    }
}

/// One node agent's side of a launch. It acts on the front-end's orders and on the other
/// nodes' migration messages; [`NodeService::teardown`] stops whatever it started.
pub struct NodeService {
    id: NodeId,
    bind: IpAddr,
    secret: JobSecret,
    state: Arc<NodeState>,
    stage: Arc<Mutex<Option<StageServer>>>,
    threads: Vec<JoinHandle<()>>,
    monitor: Option<NodeMonitor>,
    job: String,
    switch: Option<SocketAddr>,
}

impl NodeService {
    pub fn new(id: NodeId, bind: IpAddr, secret: JobSecret) -> Self {
        Self {
            id,
            bind,
            secret,
            state: Arc::default(),
            stage: Arc::default(),
            threads: Vec::new(),
            monitor: None,
            job: String::new(),
            switch: None,
        }
    }

    fn node(&self, h: &JobHandle<Wire>) -> Node {
        Node {
            h: h.clone(),
            me: self.id,
            bind: self.bind,
            state: self.state.clone(),
            cgroup: self
                .monitor
                .as_ref()
                .and_then(NodeMonitor::cgroup)
                .map(Path::to_path_buf),
            secret: self.secret.clone(),
            switch: self.switch,
        }
    }

    fn spawn(&mut self, work: impl FnOnce() + Send + 'static) {
        self.threads.push(std::thread::spawn(work));
    }

    pub fn on_event(&mut self, e: &Event, h: &JobHandle<Wire>) {
        if let Event::Adopted { .. } = e {
            for msg in self.state.all_told() {
                h.send(NodeId(0), msg);
            }
            return;
        }
        let Event::Message { from, msg } = e else {
            return;
        };
        if from.0 != 0 {
            return self.on_node_message(*from, msg, h);
        }
        match msg {
            Wire::Migrate(MigrateMsg::Out {
                vm,
                dest,
                params,
                hold,
            }) => {
                let (node, vm, dest, params) = (self.node(h), vm.clone(), *dest, *params);
                // Listening before the thread starts: the front-end's `Release` may follow
                // this order at once.
                let rx = self.state.wait_for(&vm);
                let hold = *hold;
                self.spawn(move || migrate_out::migrate_out(node, rx, vm, dest, params, hold));
            }
            Wire::Migrate(MigrateMsg::Release { vm, .. }) => self.state.deliver(vm, msg.clone()),
            Wire::Checkpoint(CheckpointMsg::Pause { id }) => {
                self.state.checkpoint_started();
                let (node, id) = (self.node(h), *id);
                // Listening before the thread starts: `Save` follows as soon as every node
                // has paused.
                let rx = self.state.wait_for(&checkpoint::waiter(id));
                self.spawn(move || checkpoint::checkpoint(node, rx, id));
            }
            Wire::Checkpoint(CheckpointMsg::Save { id, .. } | CheckpointMsg::Resume { id }) => {
                self.state.deliver(&checkpoint::waiter(*id), msg.clone())
            }
            Wire::Barrier(BarrierMsg::Down { vm, conn, line }) => {
                if let Some(l) = self.state.link(vm) {
                    l.barrier_down(*conn, line);
                }
            }
            Wire::Barrier(BarrierMsg::DownClosed { vm, conn }) => {
                if let Some(l) = self.state.link(vm) {
                    l.barrier_close(*conn);
                }
            }
            Wire::Launch(LaunchMsg::Stdin {
                vm,
                offset,
                data,
                eof,
            }) => {
                // Off the message loop: the guest answers once it has written the chunk.
                if let Some(rank) = self.state.rank(vm) {
                    let (h, chunk) = (h.clone(), (*offset, data.clone(), *eof));
                    // Not kept with the node's threads: one per chunk, each bounded by its
                    // wait for the guest.
                    std::thread::spawn(move || super::report::forward_stdin(&h, &rank, chunk));
                }
            }
            Wire::Launch(LaunchMsg::Stage) => self.open_stage(h),
            Wire::Monitor(start @ MonitorMsg::Start { .. }) => self.start_monitor(start, h),
            Wire::Launch(vms @ LaunchMsg::Vms { .. }) => self.start_vms(vms, h),
            _ => {}
        }
    }

    /// Migration traffic between nodes (each node may be the other end of a migration).
    fn on_node_message(&mut self, from: NodeId, msg: &Wire, h: &JobHandle<Wire>) {
        match msg {
            Wire::Migrate(MigrateMsg::In {
                vm,
                rank,
                profile,
                exec_id,
                first_id,
                switch,
                digest,
                probe,
                shares,
            }) => {
                // A VM that moved here may later move on: its switch goes with it.
                self.switch = self.switch.or(*switch);
                let (node, m) = (
                    self.node(h),
                    MoveIn {
                        from,
                        vm: vm.clone(),
                        rank: *rank,
                        profile: (**profile).clone(),
                        exec_id: *exec_id,
                        first_id: *first_id,
                        switch: *switch,
                        digest: digest.clone(),
                        probe: probe.clone(),
                        shares: shares.clone(),
                    },
                );
                self.spawn(move || migrate_in::migrate_in(node, m));
            }
            Wire::Migrate(
                MigrateMsg::Listening { vm, .. }
                | MigrateMsg::Sent { vm, .. }
                | MigrateMsg::Done { vm, .. },
            ) => self.state.deliver(vm, msg.clone()),
            _ => {}
        }
    }

    fn start_monitor(&mut self, start: &MonitorMsg, h: &JobHandle<Wire>) {
        let MonitorMsg::Start {
            job,
            node,
            period_ms,
            node_memory_mib,
        } = start
        else {
            return;
        };
        self.job = job.clone();
        let period = Duration::from_millis(*period_ms);
        let state = self.state.clone();
        match NodeMonitor::start(job, node, period, *node_memory_mib, state, h.clone()) {
            Ok(m) => self.monitor = Some(m),
            Err(e) => h.control(Control::Send {
                dst: NodeId(0),
                msg: Wire::Monitor(MonitorMsg::Failed {
                    reason: e.to_string(),
                }),
            }),
        }
    }

    /// One thread per VM: it boots the VM, runs the rank and reports it.
    fn start_vms(&mut self, order: &LaunchMsg, h: &JobHandle<Wire>) {
        let LaunchMsg::Vms { vms, net, .. } = order else {
            return;
        };
        self.switch = net.as_ref().map(|n| n.switch);
        let guest_key = crate::net::guest_key(&self.secret);
        let Some(job) = JobVms::from_order(order, &cache_dir(), &self.job, guest_key) else {
            return;
        };
        if let LaunchMsg::Vms { cache, .. } = order {
            crate::stage::keep_cache_within(&cache_dir(), &job.image, *cache);
        }
        let job = Arc::new(job);
        for order in vms {
            let vm = VmJob {
                job: job.clone(),
                order: order.clone(),
                node: self.node(h),
            };
            self.spawn(move || vm.run());
        }
    }

    fn open_stage(&self, h: &JobHandle<Wire>) {
        let (id, slot, h) = (self.id, self.stage.clone(), h.clone());
        let opts = StageOptions::default();
        let key = self.secret.clone();
        StageServer::start_in_background(self.bind, id, key, cache_dir(), opts, move |r| match r {
            Ok(s) => {
                let addr = s.addr;
                *lock(&slot) = Some(s);
                h.control(Control::Send {
                    dst: NodeId(0),
                    msg: Wire::Launch(LaunchMsg::StageListening { addr }),
                });
            }
            Err(e) => {
                eprintln!("{id}: cannot open the staging listener: {e}");
                h.control(Control::Send {
                    dst: NodeId(0),
                    msg: Wire::Launch(LaunchMsg::StageRefused {
                        reason: e.to_string(),
                    }),
                });
            }
        });
    }

    /// Kills every VM still running and waits for the worker threads (after the job ended).
    /// The node's VMs, for the agent's SIGTERM fallback (see `run_node_agent`).
    pub(crate) fn state(&self) -> Arc<NodeState> {
        self.state.clone()
    }

    pub fn teardown(self) {
        drop(self.state.stop_all());
        for t in self.threads {
            let _ = t.join();
        }
        // Last: the cgroup can only go once the VMs in it are gone.
        drop(self.monitor);
        // VMs migrated in had their own run root (each VM's directory went with it).
        let _ = std::fs::remove_dir(settings().qemu.run_root.join(format!("in-{}", self.id)));
    }
}
