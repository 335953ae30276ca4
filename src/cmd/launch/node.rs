//! The node side of `vse launch`, run by each node agent (`vse agent`): its root role opens the
//! staging listener and boots the VMs, one tool thread per VM drives V2M and the guest agent,
//! and the session role streams each rank's output and status back to the front-end. The root
//! role also samples the node (`watch`) and moves VMs when the controller says so (`move_vm`).

use super::move_vm::{self, MoveIn, NodeRelay, Running, RunningMap, Shared, Waiters, lock};
use super::watch::{NodeMonitor, Registry, Watched};
use agents::{
    agent::{Control, JobHandle},
    proto::NodeId,
    secret::JobSecret,
};
use anyhow::{Context, anyhow};
use launcher::{
    net::JobNet,
    stage::{StageOptions, StageServer},
    wire::{BarrierMsg, LaunchMsg, MigrateMsg, MonitorMsg, Stream, VmOrder, Wire},
};
use monitor::VmId;

type Event = agents::agent::Event<Wire>;
use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use v2m::{
    Plugin, PluginKind,
    qemu::{AccelPolicy, QemuConfig},
    registry::{self, Settings},
};
use vmhost::{BootOptions, CONSOLE_LINES, Nic, RunningVm, VmSpec};
use vse_guest_agent::protocol::OutStream;
use vse_guest_agent::{Barriers, ExecOutput, GuestLink, GuestNet, LinkOptions, PendingExec};
use vse_image::ImageDir;

/// Where staged images live on a node (node-local; shared by agents of one machine, which is
/// safe: images are published by atomic rename under their digest).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("VSE_IMAGE_CACHE").map_or_else(|| "/var/tmp/vse/images".into(), PathBuf::from)
}

fn run_dir() -> PathBuf {
    std::env::var_os("VSE_RUN_DIR").map_or_else(|| "/run/vse/v2m".into(), PathBuf::from)
}

/// Every running VM of this node: tearing down empties it, which stops them all.
pub(super) type Vms = Arc<Mutex<Vec<RunningVm>>>;

/// Adds a VM to the node's registry, unless the job is being torn down: teardown empties the
/// registry once, so a VM registered after it would outlive the job (dropping it stops it).
pub(super) fn register(vms: &Vms, stopping: &AtomicBool, vm: RunningVm) -> anyhow::Result<()> {
    let mut all = lock(vms);
    if stopping.load(Ordering::SeqCst) {
        return Err(anyhow!("the job is ending"));
    }
    all.push(vm);
    Ok(())
}

/// Removes the VM named `name` from the registry (to stop it, or to send it away).
pub(super) fn take_vm(vms: &Vms, name: &str) -> Option<RunningVm> {
    let mut all = lock(vms);
    let pos = all.iter().position(|v| v.name().as_str() == name)?;
    Some(all.remove(pos))
}

/// V2M settings of this node's VMs (the same for VMs booted here and VMs migrated in).
pub(super) fn settings() -> Settings {
    Settings {
        qemu: QemuConfig {
            run_root: run_dir(),
            accel: AccelPolicy::Auto,
            die_with_parent: true,
            ephemeral: true,
            ..QemuConfig::default()
        },
        libvirt: v2m::libvirt::LibvirtConfig {
            run_root: run_dir().join("libvirt"),
            ephemeral: true,
            ..Default::default()
        },
    }
}

/// Waits for the rank's command while watching its VM. `Ok(None)`: the VM migrated away and
/// the destination node reports the rank.
pub(super) fn await_rank(
    pending: &PendingExec,
    pid: u32,
    handed_off: &AtomicBool,
    on_output: &mut dyn FnMut(OutStream, &str),
) -> anyhow::Result<Option<ExecOutput>> {
    loop {
        if handed_off.load(Ordering::SeqCst) {
            // Output the guest wrote before it paused still sits here: pass it on, the rest
            // comes through the destination.
            let _ = pending.poll(Duration::ZERO, on_output);
            return Ok(None);
        }
        match pending.poll(Duration::from_millis(500), on_output)? {
            Some(out) => return Ok(Some(out)),
            // During a hand-over the source QEMU exits before the flag is set: look again.
            None if !vmhost::alive(pid) && !handed_off.load(Ordering::SeqCst) => {
                std::thread::sleep(Duration::from_millis(500));
                if !handed_off.load(Ordering::SeqCst) {
                    anyhow::bail!("the VM's hypervisor (pid {pid}) exited");
                }
            }
            None => {}
        }
    }
}

/// Forwards a rank's output to the front-end chunk by chunk, while the rank runs.
pub(super) fn rank_output(h: &JobHandle<Wire>, rank: u32) -> impl Fn(OutStream, &str) + '_ {
    move |stream, data| {
        let stream = match stream {
            OutStream::Stdout => Stream::Stdout,
            OutStream::Stderr => Stream::Stderr,
        };
        h.control(Control::Send {
            dst: NodeId(0),
            msg: Wire::Launch(LaunchMsg::RankOutput {
                rank,
                stream,
                data: data.to_string(),
            }),
        });
    }
}

/// Sends a rank's output and status (or why it has none) to the front-end.
pub(super) fn report_rank(h: &JobHandle<Wire>, rank: u32, out: anyhow::Result<ExecOutput>) {
    let send = |msg| {
        h.control(Control::Send {
            dst: NodeId(0),
            msg,
        })
    };
    match out {
        Ok(out) => {
            for (stream, data) in [(Stream::Stdout, out.stdout), (Stream::Stderr, out.stderr)] {
                if !data.is_empty() {
                    send(Wire::Launch(LaunchMsg::RankOutput { rank, stream, data }));
                }
            }
            send(Wire::Launch(LaunchMsg::RankExited {
                rank,
                code: out.status,
                error: None,
            }));
        }
        Err(e) => send(Wire::Launch(LaunchMsg::RankExited {
            rank,
            code: -1,
            error: Some(format!("{e:#}")),
        })),
    }
}

pub struct NodeService {
    id: NodeId,
    bind: IpAddr,
    secret: JobSecret,
    stage: Arc<Mutex<Option<StageServer>>>,
    /// Every running VM of this node: tearing down drops them (kill-on-drop).
    vms: Vms,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// The VMs the sampler watches (pid and guest agent link).
    watched: Registry,
    monitor: Option<NodeMonitor>,
    job: String,
    /// VMs running a rank here (migration needs their profile and guest agent link).
    running: RunningMap,
    waiters: Waiters,
    stopping: Arc<AtomicBool>,
}

impl NodeService {
    pub fn new(id: NodeId, bind: IpAddr, secret: JobSecret) -> Self {
        Self {
            id,
            bind,
            secret,
            stage: Arc::default(),
            vms: Arc::default(),
            threads: Vec::new(),
            watched: Arc::default(),
            monitor: None,
            job: String::new(),
            running: Arc::default(),
            waiters: Arc::default(),
            stopping: Arc::default(),
        }
    }

    fn shared(&self, h: &JobHandle<Wire>) -> Shared {
        Shared {
            h: h.clone(),
            me: self.id,
            bind: self.bind,
            vms: self.vms.clone(),
            running: self.running.clone(),
            watched: self.watched.clone(),
            waiters: self.waiters.clone(),
            cgroup: self
                .monitor
                .as_ref()
                .and_then(|m| m.cgroup())
                .map(Path::to_path_buf),
            stopping: self.stopping.clone(),
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
            }) => {
                let (sh, m) = (
                    self.shared(h),
                    MoveIn {
                        from,
                        vm: vm.clone(),
                        rank: *rank,
                        profile: (**profile).clone(),
                        exec_id: *exec_id,
                        first_id: *first_id,
                    },
                );
                self.threads
                    .push(std::thread::spawn(move || move_vm::migrate_in(sh, m)));
            }
            Wire::Migrate(MigrateMsg::Listening { vm, .. })
            | Wire::Migrate(MigrateMsg::Sent { vm, .. })
            | Wire::Migrate(MigrateMsg::Done { vm, .. }) => {
                move_vm::deliver(&self.waiters, vm, msg.clone())
            }
            _ => {}
        }
    }

    fn link(&self, vm: &str) -> Option<Arc<GuestLink>> {
        lock(&self.running).get(vm).map(|r| r.link.clone())
    }

    pub fn on_event(&mut self, e: &Event, h: &JobHandle<Wire>) {
        let Event::Message { from, msg } = e else {
            return;
        };
        if from.0 != 0 {
            return self.on_node_message(*from, msg, h);
        }
        match msg {
            Wire::Migrate(MigrateMsg::Out { vm, dest, params }) => {
                let (sh, vm, dest, params) = (self.shared(h), vm.clone(), *dest, *params);
                self.threads.push(std::thread::spawn(move || {
                    move_vm::migrate_out(sh, vm, dest, params)
                }));
            }
            Wire::Barrier(BarrierMsg::Down { vm, conn, line }) => {
                if let Some(l) = self.link(vm) {
                    l.barrier_down(*conn, line);
                }
            }
            Wire::Barrier(BarrierMsg::DownClosed { vm, conn }) => {
                if let Some(l) = self.link(vm) {
                    l.barrier_close(*conn);
                }
            }
            Wire::Launch(LaunchMsg::Stage) => self.open_stage(h),
            Wire::Monitor(MonitorMsg::Start {
                job,
                node,
                period_ms,
                node_memory_mib,
            }) => {
                self.job = job.clone();
                match NodeMonitor::start(
                    job,
                    node,
                    Duration::from_millis(*period_ms),
                    *node_memory_mib,
                    self.watched.clone(),
                    h.clone(),
                ) {
                    Ok(m) => self.monitor = Some(m),
                    Err(reason) => h.control(Control::Send {
                        dst: NodeId(0),
                        msg: Wire::Monitor(MonitorMsg::Failed { reason }),
                    }),
                }
            }
            Wire::Launch(LaunchMsg::Vms {
                digest,
                size,
                hosts,
                argv,
                vms,
                memory_mib,
                hypervisor,
                net,
                mpi,
            }) => {
                let image = cache_dir().join(digest);
                for order in vms {
                    let job = VmJob {
                        image: image.clone(),
                        order: order.clone(),
                        size: *size,
                        hosts: hosts.clone(),
                        argv: argv.clone(),
                        memory_mib: *memory_mib,
                        hypervisor: hypervisor.clone(),
                        job: self.job.clone(),
                        cgroup: self
                            .monitor
                            .as_ref()
                            .and_then(|m| m.cgroup())
                            .map(Path::to_path_buf),
                        watched: self.watched.clone(),
                        running: self.running.clone(),
                        stopping: self.stopping.clone(),
                        net: net.clone(),
                        bind: self.bind,
                        mpi: *mpi,
                        guest_key: launcher::net::guest_key(&self.secret),
                    };
                    let (h, vms) = (h.clone(), self.vms.clone());
                    self.threads
                        .push(std::thread::spawn(move || job.run(&h, &vms)));
                }
            }
            _ => {}
        }
    }

    fn open_stage(&self, h: &JobHandle<Wire>) {
        let (bind, id, key, slot, h) = (
            self.bind,
            self.id,
            self.secret.clone(),
            self.stage.clone(),
            h.clone(),
        );
        StageServer::start_in_background(
            bind,
            id,
            key,
            cache_dir(),
            StageOptions::default(),
            move |r| match r {
                Ok(s) => {
                    let addr = s.addr;
                    *slot.lock().expect("stage lock") = Some(s);
                    h.control(Control::Send {
                        dst: NodeId(0),
                        msg: Wire::Launch(LaunchMsg::StageListening { addr }),
                    });
                }
                Err(e) => eprintln!("{id}: cannot open the staging listener: {e}"),
            },
        );
    }

    /// Kills every VM still running and waits for the tool threads (after the job ended).
    pub fn teardown(self) {
        self.stopping.store(true, Ordering::SeqCst);
        lock(&self.vms).clear();
        for t in self.threads {
            let _ = t.join();
        }
        // Last: the cgroup can only go once the VMs in it are gone.
        drop(self.monitor);
        // VMs migrated in had their own run root (each VM's directory went with it).
        let _ = std::fs::remove_dir(settings().qemu.run_root.join(format!("in-{}", self.id)));
    }
}

struct VmJob {
    image: PathBuf,
    order: VmOrder,
    size: u32,
    hosts: Vec<String>,
    argv: Vec<String>,
    memory_mib: u64,
    hypervisor: String,
    job: String,
    /// The node's memory cgroup (simulation mode): the VM's hypervisor goes there.
    cgroup: Option<PathBuf>,
    watched: Registry,
    running: RunningMap,
    /// Set when the job is torn down: a VM still booting gives up.
    stopping: Arc<AtomicBool>,
    net: Option<JobNet>,
    /// This node's address on the allocation network (the VM's UDP endpoint goes there).
    bind: IpAddr,
    mpi: bool,
    /// Key of the guests' rsh service (hex), derived from the job secret on every node.
    guest_key: String,
}

impl VmJob {
    fn run(self, h: &JobHandle<Wire>, vms: &Vms) {
        // None: the VM migrated away; the destination reports the rank.
        if let Some(out) = self.boot_and_exec(h, vms).transpose() {
            report_rank(h, self.order.rank, out);
        }
    }

    fn boot_and_exec(&self, h: &JobHandle<Wire>, vms: &Vms) -> anyhow::Result<Option<ExecOutput>> {
        let name = &self.hosts[self.order.rank as usize];
        let wanted = match self.hypervisor.as_str() {
            "auto" => None,
            k => Some(k.parse::<PluginKind>().map_err(|e| anyhow!(e))?),
        };
        let plugin = registry::select(&settings(), wanted)?;
        let vm = self.boot(h, &*plugin)?;
        let (link, pid) = (vm.link().clone(), vm.pid());
        register(vms, &self.stopping, vm)?;
        let handed_off = Arc::new(AtomicBool::new(false));
        let out = self.exec(h, &link, pid, &handed_off);
        if handed_off.load(Ordering::SeqCst) {
            // The destination runs the VM (on this disk overlay) and reports the rank.
            return Ok(None);
        }
        lock(&self.running).remove(name);
        // Stop our VM whatever happened (it may already be gone if the job was torn down).
        match (out, take_vm(vms, name)) {
            (Err(e), Some(vm)) => Err(e.context(format!(
                "guest console (last lines):\n{}",
                vm.console_tail(CONSOLE_LINES)
            ))),
            (out, _) => out.map(Some),
        }
    }

    /// Boots the rank's VM on its overlay of the staged image, pinned to the planned cores,
    /// with its NIC on the job network, its hypervisor in the node's cgroup (simulation
    /// mode) and its guest agent answering.
    fn boot(&self, h: &JobHandle<Wire>, plugin: &dyn Plugin) -> anyhow::Result<RunningVm> {
        let image = ImageDir::open(&self.image).context("the staged image")?;
        let rank = self.order.rank;
        let name: v2m::VmName = self.hosts[rank as usize]
            .parse()
            .map_err(|e| anyhow!("VM name: {e}"))?;
        let vcpus = self.order.cpus.len() as u32;
        let mut spec = VmSpec::new(&image, name.clone(), vcpus, self.memory_mib);
        spec.pin(&self.order.cpus)?;
        if let Some(net) = &self.net {
            let local = free_udp_endpoint(self.bind)?;
            // The switch admits the endpoint before the guest can send from it: the guest's
            // NIC is configured only after boot, long after this message.
            h.control(Control::Send {
                dst: NodeId(0),
                msg: Wire::Launch(LaunchMsg::VmEndpoint { rank, addr: local }),
            });
            let mac = net.rank(rank).mac_string();
            spec.nic = Some(Nic {
                mac: mac.parse().map_err(|e| anyhow!("MAC {mac}: {e}"))?,
                local,
                remote: net.switch,
            });
        }
        let relay = Arc::new(NodeRelay {
            vm: name.to_string(),
            h: h.clone(),
        });
        let opts = BootOptions {
            scratch_prefix: format!("launch-{name}"),
            cgroup: self.cgroup.clone(),
            agent: LinkOptions::new(Duration::from_secs(300))
                .barriers(Barriers::Relay(relay))
                .cancel(self.stopping.clone()),
        };
        Ok(vmhost::boot(plugin, &spec, &opts)?)
    }

    /// Runs the rank through the VM's guest agent link, which the sampler shares (a guest
    /// agent channel takes one connection).
    fn exec(
        &self,
        h: &JobHandle<Wire>,
        link: &Arc<GuestLink>,
        pid: u32,
        handed_off: &Arc<AtomicBool>,
    ) -> anyhow::Result<ExecOutput> {
        let rank = self.order.rank;
        let vm = &self.hosts[rank as usize];
        let vm_id = VmId::new(vm.clone()).map_err(|e| anyhow!("VM id: {e}"))?;
        let env = [
            ("VSE_RANK", rank.to_string()),
            ("VSE_SIZE", self.size.to_string()),
            ("VSE_HOSTS", self.hosts.join(",")),
            // The barrier library reaches the controller through the guest agent.
            (
                "VSE_BARRIER_SOCKET",
                vse_guest_agent::protocol::GUEST_BARRIER_SOCKET.to_string(),
            ),
            ("VSE_JOB_ID", self.job.clone()),
            ("VSE_VM_ID", vm.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if let Some(net) = &self.net {
            self.net_config(link, net, vm)?;
        }
        let (argv, env) = match (&self.net, self.mpi, rank) {
            (Some(net), true, 0) => launcher::launch::mpirun_command(
                &self.argv,
                &self.hosts,
                self.order.cpus.len(),
                net,
                env,
            ),
            (_, true, _) => {
                // Hosts MPI processes for rank 0's mpirun until the job ends (teardown stops
                // the VM); the job's status is mpirun's.
                while vmhost::alive(pid) {
                    std::thread::sleep(Duration::from_millis(200));
                }
                return Ok(ExecOutput {
                    status: 0,
                    stdout: String::new(),
                    stderr: String::new(),
                });
            }
            _ => (self.argv.clone(), env),
        };
        let args: Vec<&str> = argv.iter().map(String::as_str).collect();
        let pending: PendingExec = link.spawn_stream(&args, env);
        let running = Running {
            rank,
            exec_id: pending.id(),
            link: link.clone(),
            handed_off: handed_off.clone(),
        };
        lock(&self.running).insert(vm.clone(), running);
        let watched = Watched {
            pid,
            link: link.clone(),
        };
        lock(&self.watched).insert(vm_id.clone(), watched);
        let out = await_rank(&pending, pid, handed_off, &mut rank_output(h, rank));
        if !handed_off.load(Ordering::SeqCst) {
            lock(&self.watched).remove(&vm_id);
        }
        out?.ok_or_else(|| anyhow!("the VM migrated to another node"))
            .with_context(|| format!("running {:?} in the guest", self.argv))
    }

    /// The guest's address on the job network, its hosts file, and with MPI its rsh service.
    fn net_config(&self, link: &GuestLink, net: &JobNet, vm: &str) -> anyhow::Result<()> {
        let me = net.rank(self.order.rank);
        let hosts: Vec<(String, std::net::Ipv4Addr)> = self
            .hosts
            .iter()
            .enumerate()
            .map(|(r, h)| (h.clone(), net.rank(r as u32).ip))
            .collect();
        let cfg = GuestNet {
            mac: &me.mac_string(),
            ip: me.ip,
            prefix: me.prefix,
            hostname: vm,
            hosts: &hosts,
            rsh_key: self.mpi.then_some(self.guest_key.as_str()),
        };
        link.net_config(cfg, Duration::from_secs(60)).context(
            "configuring the guest's job network (an image whose guest agent predates \
             VM networking needs `vse build` again; or launch with --no-network)",
        )
    }
}

/// A UDP port of `ip` free right now, for QEMU to bind (QEMU cannot report one it picked).
fn free_udp_endpoint(ip: IpAddr) -> anyhow::Result<std::net::SocketAddr> {
    let s = std::net::UdpSocket::bind((ip, 0))
        .with_context(|| format!("finding a free UDP port on {ip} for the VM's NIC"))?;
    Ok(s.local_addr()?)
}
