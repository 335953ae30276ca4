//! One rank on its node: boot its VM on an overlay of the staged image, configure the
//! guest's job network, run the rank's command through the guest agent and report it.

use super::report::{NodeRelay, await_rank, rank_output, report_rank};
use super::service::Node;
use super::state::Rank;
use super::{NodeError, settings};
use crate::net::{JobNet, NetKey, Relay};
use crate::wire::{LaunchMsg, RankTimes, RestoreVm, VmOrder, Wire};
use monitor::VmId;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use v2m::{Plugin, PluginKind, VmName, registry};
use vmhost::{BootOptions, CONSOLE_LINES, Nic, RunningVm, Templates, VmSpec};
use vse_guest_agent::protocol::GuestUser;
use vse_guest_agent::share::server::{ShareSet, Shared};
use vse_guest_agent::{Barriers, ExecOutput, GuestLink, GuestNet, LinkOptions, PendingExec};
use vse_image::ImageDir;

/// What every VM of the job on this node shares (the front-end's `Vms` order).
pub(crate) struct JobVms {
    pub(crate) image: PathBuf,
    /// Total number of ranks.
    size: u32,
    /// Every VM's name, by rank.
    hosts: Vec<String>,
    /// Every guest's hostname, by rank.
    hostnames: Vec<String>,
    argv: Vec<String>,
    memory_mib: u64,
    hypervisor: Option<PluginKind>,
    job: String,
    net: Option<JobNet>,
    mpi: bool,
    pin: bool,
    /// Key of the guests' rsh service (hex), derived from the job secret on every node.
    guest_key: String,
    /// The node's boot templates, when the job may use them.
    templates: Option<Templates>,
    /// Who the command runs as in the guest: this node agent's user (the job's), or root.
    user: GuestUser,
    /// Rank 0's command reads the front-end's standard input.
    stdin: bool,
    /// Host directories the VMs mount, and where the command starts.
    shares: Vec<Shared>,
    cwd: Option<String>,
}

impl JobVms {
    pub fn from_order(
        order: &LaunchMsg,
        cache: &Path,
        job: &str,
        guest_key: String,
    ) -> Option<Self> {
        let LaunchMsg::Vms {
            digest,
            size,
            hosts,
            hostnames,
            argv,
            memory_mib,
            hypervisor,
            net,
            mpi,
            pin,
            boot_templates,
            guest_root,
            stdin,
            shares,
            cwd,
            ..
        } = order
        else {
            return None;
        };
        Some(Self {
            image: cache.join(digest),
            size: *size,
            hosts: hosts.clone(),
            hostnames: hostnames.clone(),
            argv: argv.clone(),
            memory_mib: *memory_mib,
            hypervisor: *hypervisor,
            job: job.to_string(),
            net: net.clone(),
            mpi: *mpi,
            pin: *pin,
            guest_key,
            templates: boot_templates.then(|| Templates::in_cache(cache)),
            stdin: *stdin,
            shares: shares.clone(),
            cwd: cwd.clone(),
            user: if *guest_root {
                GuestUser::root()
            } else {
                GuestUser::current()
            },
        })
    }
}

/// One VM of the job on this node, and its rank.
pub(crate) struct VmJob {
    pub job: Arc<JobVms>,
    pub order: VmOrder,
    pub node: Node,
}

impl VmJob {
    fn name(&self) -> &str {
        &self.job.hosts[self.order.rank as usize]
    }

    pub fn run(self) {
        let mut times = None;
        // None: the VM migrated away; the destination reports the rank.
        if let Some(out) = self.boot_and_exec(&mut times).transpose() {
            report_rank(&self.node, self.order.rank, out, times);
        }
    }

    /// Boots, runs and stops the rank's VM; `times` says where the time went once the VM ran.
    fn boot_and_exec(
        &self,
        times: &mut Option<RankTimes>,
    ) -> Result<Option<ExecOutput>, NodeError> {
        let ms = |d: Duration| d.as_millis() as u64;
        let ordered = Instant::now();
        let plugin = registry::select(&settings(), self.job.hypervisor)?;
        // The relay carries the VM's frames while the VM runs here: it lives as long as this.
        let (vm, _relay) = self.start(&*plugin)?;
        let (booted, guest) = (ordered.elapsed(), vm.guest_wait());
        let boot = match self.order.restore {
            Some(_) => crate::wire::RankBoot::Restored,
            None => vm.boot_kind().into(),
        };
        let (link, pid) = (vm.link().clone(), vm.pid());
        self.node.state.register(vm)?;
        let handed_off = Arc::new(AtomicBool::new(false));
        let ran = Instant::now();
        let out = self.exec(&link, pid, &handed_off);
        let (run, stopping) = (ran.elapsed(), Instant::now());
        if handed_off.load(Ordering::SeqCst) {
            // The destination runs the VM (on this disk overlay) and reports the rank.
            return Ok(None);
        }
        // Stop our VM whatever happened (it may already be gone if the job was torn down).
        let out = match (out, self.node.state.remove(self.name())) {
            (Err(e), Some(vm)) => Err(NodeError::WithConsole {
                console: vm.console_tail(CONSOLE_LINES),
                source: Box::new(e),
            }),
            (out, vm) => {
                drop(vm);
                out.map(Some)
            }
        };
        *times = Some(RankTimes {
            vm_start_ms: ms(booted.saturating_sub(guest)),
            guest_ms: ms(guest),
            run_ms: ms(run),
            stop_ms: ms(stopping.elapsed()),
            boot,
        });
        out
    }

    /// Boots the rank's VM on its overlay of the staged image (or restores it from a
    /// checkpoint), pinned to the planned cores, with its NIC on the job network, its
    /// hypervisor in the node's cgroup (simulation mode) and its guest agent answering.
    fn start(&self, plugin: &dyn Plugin) -> Result<(RunningVm, Option<Relay>), NodeError> {
        let image = ImageDir::open(&self.job.image).map_err(NodeError::Image)?;
        let rank = self.order.rank;
        let name: VmName = self.name().parse().map_err(NodeError::VmName)?;
        let vcpus = self.order.cpus.len() as u32;
        let mut spec = VmSpec::new(&image, name.clone(), vcpus, self.job.memory_mib);
        if self.job.pin {
            spec.pin(&self.order.cpus)?;
        }
        let mut nic_relay = None;
        if let Some(net) = &self.job.net {
            let r = open_relay(&self.node, net.switch, rank)?;
            announce_relay(&self.node, rank, &r);
            let mac = net.rank(rank).mac_string();
            spec.nic = Some(Nic {
                mac: mac
                    .parse()
                    .map_err(|source| NodeError::Mac { mac, source })?,
                local: r.vm,
                remote: r.relay,
            });
            nic_relay = Some(r);
        }
        let relay = Arc::new(NodeRelay {
            vm: name.to_string(),
            h: self.node.h.clone(),
        });
        let shares = ShareSet::open(&self.job.shares).map_err(NodeError::Shares)?;
        let mut agent = LinkOptions::new(Duration::from_secs(300))
            .barriers(Barriers::Relay(relay))
            .cancel(self.node.state.stopping().clone())
            .shares(Some(Arc::new(shares)));
        if let Some(saved) = &self.order.restore {
            agent = agent.first_id(saved.first_id);
        }
        let opts = BootOptions {
            scratch_prefix: format!("launch-{name}"),
            scratch_parent: None,
            cgroup: self.node.cgroup.clone(),
            agent,
            templates: self.job.templates.clone(),
        };
        let vm = match &self.order.restore {
            Some(saved) => restore_vm(plugin, &spec, saved, &opts)?,
            None => vmhost::boot(plugin, &spec, &opts)?,
        };
        Ok((vm, nic_relay))
    }

    /// Runs the rank through the VM's guest agent link, which the sampler shares (a guest
    /// agent channel takes one connection); a restored VM's rank runs already, its command is
    /// adopted.
    fn exec(
        &self,
        link: &Arc<GuestLink>,
        pid: u32,
        handed_off: &Arc<AtomicBool>,
    ) -> Result<ExecOutput, NodeError> {
        let rank = self.order.rank;
        let vm = self.name();
        let id = VmId::new(vm).map_err(NodeError::VmId)?;
        let pending = match &self.order.restore {
            Some(saved) => {
                let p = link.adopt_exec(saved.exec_id);
                // Ranks saved waiting at a barrier go on now that the command is adopted.
                for (conn, line) in &saved.barrier_lines {
                    link.barrier_down(*conn, line);
                }
                p
            }
            None => self.spawn_rank(link)?,
        };
        let running = Rank {
            rank,
            exec_id: pending.id(),
            id,
            pid,
            link: link.clone(),
            handed_off: handed_off.clone(),
            last_output: Arc::new(std::sync::Mutex::new(std::time::Instant::now())),
        };
        let seen = running.last_output.clone();
        self.node.state.start_rank(vm, running);
        let out = await_rank(
            &pending,
            pid,
            handed_off,
            &mut rank_output(&self.node.h, rank, &seen),
        )?;
        out.ok_or(NodeError::MigratedAway)
    }

    /// Configures the guest's network and starts the rank's command.
    fn spawn_rank(&self, link: &GuestLink) -> Result<PendingExec, NodeError> {
        link.mount_shares(Duration::from_secs(120))?;
        if let Some(net) = &self.job.net {
            self.net_config(link, net)?;
        }
        let (argv, env) = match (&self.job.net, self.job.mpi, self.order.rank) {
            (Some(net), true, 0) => {
                let (hosts, slots) = (&self.job.hostnames, self.order.cpus.len());
                crate::launch::mpirun_command(&self.job.argv, hosts, slots, net, self.env())
            }
            // Hosts MPI processes for rank 0's mpirun until the job ends (teardown stops the
            // VM; the job's status is mpirun's). A command of its own makes the VM a rank like
            // any other: it migrates, and its new node takes over, the same way.
            (_, true, _) => (
                crate::launch::HOLD.iter().map(|s| s.to_string()).collect(),
                self.env(),
            ),
            _ => (self.job.argv.clone(), self.env()),
        };
        let args: Vec<&str> = argv.iter().map(String::as_str).collect();
        let stdin = self.job.stdin && self.order.rank == 0;
        let (user, cwd) = (self.job.user.clone(), self.job.cwd.clone());
        Ok(link.spawn_stream_as(&args, env, user, cwd, stdin))
    }

    /// The rank's environment: who it is, who the others are, where its barrier goes.
    fn env(&self) -> BTreeMap<String, String> {
        let mut env = self.barrier_env();
        for (k, v) in [
            ("VSE_RANK", self.order.rank.to_string()),
            ("VSE_SIZE", self.job.size.to_string()),
            ("VSE_HOSTS", self.job.hostnames.join(",")),
        ] {
            env.insert(k.to_string(), v);
        }
        env
    }

    /// Where a process in this VM reaches the controller's barrier (through the guest agent),
    /// and as which VM: for the rank, and under MPI for every process the rsh service starts.
    fn barrier_env(&self) -> BTreeMap<String, String> {
        [
            (
                "VSE_BARRIER_SOCKET",
                vse_guest_agent::protocol::GUEST_BARRIER_SOCKET.to_string(),
            ),
            ("VSE_JOB_ID", self.job.job.clone()),
            ("VSE_VM_ID", self.name().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The guest's address on the job network, its hosts file, and with MPI its rsh service.
    fn net_config(&self, link: &GuestLink, net: &JobNet) -> Result<(), NodeError> {
        let me = net.rank(self.order.rank);
        let hosts: Vec<(String, std::net::Ipv4Addr)> = (self.job.hostnames.iter().enumerate())
            .map(|(r, h)| (h.clone(), net.rank(r as u32).ip))
            .collect();
        let cfg = GuestNet {
            mac: &me.mac_string(),
            ip: me.ip,
            prefix: me.prefix,
            hostname: &self.job.hostnames[self.order.rank as usize],
            hosts: &hosts,
            rsh_key: self.job.mpi.then_some(self.job.guest_key.as_str()),
            rsh_env: if self.job.mpi {
                self.barrier_env()
            } else {
                BTreeMap::new()
            },
            run_as: self.job.user.clone(),
        };
        link.net_config(cfg, Duration::from_secs(60))
            .map_err(NodeError::NetConfig)
    }
}

/// Rank `rank`'s relay to the job's switch, announced to the front-end for the switch to
/// admit. Announced before the guest can send: its NIC is configured only after boot (or, for
/// a VM that moved here, the announcement follows the move and its first frames may be lost,
/// as on a real network while a port is relearned).
pub(crate) fn open_relay(
    node: &Node,
    switch: std::net::SocketAddr,
    rank: u32,
) -> Result<Relay, NodeError> {
    let key = NetKey::derive(&node.secret);
    let r = Relay::start(node.bind, switch, key, rank).map_err(NodeError::Relay)?;
    Ok(r)
}

/// Tells the front-end where rank `rank`'s relay is, for the switch to admit it.
pub(crate) fn announce_relay(node: &Node, rank: u32, r: &Relay) {
    let endpoint = LaunchMsg::VmEndpoint {
        rank,
        addr: r.uplink,
        session: r.session,
    };
    node.tell(Wire::Launch(endpoint));
}

/// A VM from a job checkpoint: its saved disk copied (and checked against the manifest's
/// digest) into a fresh scratch directory, then its state loaded.
fn restore_vm(
    plugin: &dyn Plugin,
    spec: &VmSpec,
    saved: &RestoreVm,
    opts: &BootOptions,
) -> Result<RunningVm, NodeError> {
    let overlay =
        vmhost::OverlayDir::create(&opts.scratch_prefix).map_err(|source| NodeError::File {
            what: "creating a scratch directory for",
            path: saved.disk.clone(),
            source,
        })?;
    let disk = overlay.path().join(vmhost::OVERLAY_FILE);
    let (_, sum) =
        vmhost::files::copy_sparse(&saved.disk, &disk).map_err(|source| NodeError::File {
            what: "copying the saved disk",
            path: saved.disk.clone(),
            source,
        })?;
    if sum != saved.disk_sha256 {
        return Err(NodeError::Tampered(saved.disk.clone()));
    }
    Ok(vmhost::restore(plugin, spec, &saved.state, overlay, opts)?)
}
