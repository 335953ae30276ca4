//! The node side of `vse launch`, run by each node agent (`vse agent`): its root role opens the
//! staging listener and boots the VMs, one tool thread per VM drives V2M and the guest agent,
//! and the session role streams each rank's output and status back to the front-end.

use launcher::{
    agent::{Control, Event, JobHandle},
    net::JobNet,
    proto::{Msg, NodeId, Stream, VmOrder},
    secret::JobSecret,
    stage::{StageOptions, StageServer},
};
use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};
use v2m::{
    Disk, DiskFormat, ImageRef, PluginKind, Profile, Vm, VmName,
    overlay::{OverlayRequest, create_overlays},
    qemu::{AccelPolicy, QemuConfig, find_binary},
    registry::{self, Settings},
};

/// Where staged images live on a node (node-local; shared by agents of one machine, which is
/// safe: images are published by atomic rename under their digest).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("VSE_IMAGE_CACHE").map_or_else(|| "/var/tmp/vse/images".into(), PathBuf::from)
}

fn run_dir() -> PathBuf {
    std::env::var_os("VSE_RUN_DIR").map_or_else(|| "/run/vse/v2m".into(), PathBuf::from)
}

type Vms = Arc<Mutex<Vec<Box<dyn Vm>>>>;

pub struct NodeService {
    id: NodeId,
    bind: IpAddr,
    secret: JobSecret,
    stage: Arc<Mutex<Option<StageServer>>>,
    /// Every running VM of this node: tearing down drops them (kill-on-drop).
    vms: Vms,
    threads: Vec<std::thread::JoinHandle<()>>,
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
        }
    }

    pub fn on_event(&mut self, e: &Event, h: &JobHandle) {
        let Event::Message { from, msg } = e else {
            return;
        };
        if from.0 != 0 {
            return;
        }
        match msg {
            Msg::LaunchStage => self.open_stage(h),
            Msg::LaunchVms {
                digest,
                size,
                hosts,
                argv,
                vms,
                memory_mib,
                hypervisor,
                net,
                mpi,
            } => {
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

    fn open_stage(&self, h: &JobHandle) {
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
                        msg: Msg::StageListening { addr },
                    });
                }
                Err(e) => eprintln!("{id}: cannot open the staging listener: {e}"),
            },
        );
    }

    /// Kills every VM still running and waits for the tool threads (after the job ended).
    pub fn teardown(self) {
        self.vms.lock().map(|mut v| v.clear()).ok();
        for t in self.threads {
            let _ = t.join();
        }
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
    net: Option<JobNet>,
    /// This node's address on the allocation network (the VM's UDP endpoint goes there).
    bind: IpAddr,
    mpi: bool,
    /// Key of the guests' rsh service (hex), derived from the job secret on every node.
    guest_key: String,
}

impl VmJob {
    fn run(self, h: &JobHandle, vms: &Vms) {
        let rank = self.order.rank;
        let send = |msg| {
            h.control(Control::Send {
                dst: NodeId(0),
                msg,
            })
        };
        // Output goes to the front-end chunk by chunk while the rank runs.
        let on_output = |stream, data: &str| {
            send(Msg::RankOutput {
                rank,
                stream,
                data: data.to_string(),
            })
        };
        let announce = |addr| send(Msg::VmEndpoint { rank, addr });
        match self.boot_and_exec(vms, &on_output, &announce) {
            Ok(code) => send(Msg::RankExited {
                rank,
                code,
                error: None,
            }),
            Err(e) => send(Msg::RankExited {
                rank,
                code: -1,
                error: Some(format!("{e:#}")),
            }),
        }
    }

    fn boot_and_exec(
        &self,
        vms: &Vms,
        on_output: &dyn Fn(Stream, &str),
        announce: &dyn Fn(std::net::SocketAddr),
    ) -> anyhow::Result<i32> {
        use anyhow::{Context, anyhow};
        let m = imgbuild::manifest::Manifest::read(&self.image)
            .filter(|m| m.parts_present(&self.image))
            .ok_or_else(|| anyhow!("{}: no complete staged image", self.image.display()))?;
        let part = |p: &str| {
            m.part_path(&self.image, p)
                .ok_or_else(|| anyhow!("image manifest has no {p} part"))
        };
        let (kernel, initrd, root) = (part("kernel")?, part("initrd")?, part("root")?);
        let rank = self.order.rank;
        let name: VmName = self.hosts[rank as usize]
            .parse()
            .map_err(|e| anyhow!("VM name: {e}"))?;
        let scratch = tempfile::Builder::new()
            .prefix(&format!("vse-launch-{name}-"))
            .tempdir()
            .context("creating the VM's scratch directory")?;
        let qemu_img =
            find_binary(Path::new("qemu-img")).ok_or_else(|| anyhow!("qemu-img not found"))?;
        let overlay = scratch.path().join("root.qcow2");
        create_overlays(
            &qemu_img,
            &[OverlayRequest {
                base: root.clone(),
                base_format: DiskFormat::Raw,
                path: overlay.clone(),
            }],
        )?;
        let mut profile = Profile::new(
            name.clone(),
            self.order.cpus.len() as u32,
            self.memory_mib,
            ImageRef {
                kernel,
                initrd: Some(initrd),
                root_disk: Some(root),
                cmdline: m.kernel_cmdline.clone(),
            },
        );
        // A test cluster may declare more CPUs than this machine has (Slurm's
        // config_overrides): fold the plan onto the cores that exist rather than fail to pin.
        let host = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpus: Vec<usize> = self.order.cpus.iter().map(|c| c % host).collect();
        profile.cpuset = Some(v2m::CpuSet::new(cpus).map_err(|e| anyhow!("cpuset: {e}"))?);
        profile.disks.push(Disk {
            path: overlay,
            format: DiskFormat::Qcow2,
            readonly: false,
        });
        if let Some(net) = &self.net {
            let local = free_udp_endpoint(self.bind)?;
            // The switch admits the endpoint before the guest can send from it: the guest's
            // NIC is configured only after boot, long after this message.
            announce(local);
            profile.network = v2m::Network {
                mode: v2m::NetMode::Udp,
                mac: Some(
                    net.rank(rank)
                        .mac_string()
                        .parse()
                        .map_err(|e| anyhow!("MAC: {e}"))?,
                ),
                local: Some(local),
                remote: Some(net.switch),
                ..v2m::Network::default()
            };
        }
        let wanted = match self.hypervisor.as_str() {
            "auto" => None,
            k => Some(k.parse::<PluginKind>().map_err(|e| anyhow!(e))?),
        };
        let settings = Settings {
            qemu: QemuConfig {
                run_root: run_dir(),
                accel: AccelPolicy::Auto,
                die_with_parent: true,
                ..QemuConfig::default()
            },
            libvirt: v2m::libvirt::LibvirtConfig {
                run_root: run_dir().join("libvirt"),
                ..Default::default()
            },
        };
        let plugin = registry::select(&settings, wanted)?;
        let mut vm = plugin.define(&profile)?;
        vm.start().context("starting the VM")?;
        let sock = vm
            .agent_socket()
            .map(Path::to_path_buf)
            .ok_or_else(|| anyhow!("the VM has no guest agent channel"))?;
        let idx = {
            let mut all = vms.lock().map_err(|_| anyhow!("VM registry poisoned"))?;
            all.push(vm);
            all.len() - 1
        };
        let out = self.exec(&sock, on_output);
        // Stop our VM whatever happened (it may already be gone if the job was torn down).
        let vm = vms.lock().ok().and_then(|mut all| {
            let pos = all.iter().position(|v| *v.name() == name).or(Some(idx))?;
            (pos < all.len()).then(|| all.remove(pos))
        });
        let out = match (out, vm) {
            (Err(e), Some(vm)) => {
                let log = vm.console_log().unwrap_or_default();
                let tail =
                    String::from_utf8_lossy(&log[log.len().saturating_sub(1500)..]).into_owned();
                Err(e.context(format!("guest console (last lines):\n{tail}")))
            }
            (out, _) => out,
        };
        drop(scratch);
        out
    }

    fn exec(&self, sock: &Path, on_output: &dyn Fn(Stream, &str)) -> anyhow::Result<i32> {
        use anyhow::Context;
        use vse_guest_agent::protocol::OutStream;
        let mut client = crate::cmd::run::connect_agent(sock, Duration::from_secs(300))?;
        let rank = self.order.rank;
        let env = [
            ("VSE_RANK", rank.to_string()),
            ("VSE_SIZE", self.size.to_string()),
            ("VSE_HOSTS", self.hosts.join(",")),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if let Some(net) = &self.net {
            let me = net.rank(rank);
            let hosts: Vec<(String, std::net::Ipv4Addr)> = self
                .hosts
                .iter()
                .enumerate()
                .map(|(r, h)| (h.clone(), net.rank(r as u32).ip))
                .collect();
            client
                .net_config(
                    &me.mac_string(),
                    me.ip,
                    me.prefix,
                    &self.hosts[rank as usize],
                    &hosts,
                    self.mpi.then_some(self.guest_key.as_str()),
                )
                .context(
                    "configuring the guest's job network (an image whose guest agent predates \
                     VM networking needs `vse build` again; or launch with --no-network)",
                )?;
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
                // Hosts MPI processes for rank 0's mpirun until the job ends (teardown
                // stops the VM, which closes the channel).
                client.wait_closed();
                return Ok(0);
            }
            _ => (self.argv.clone(), env),
        };
        let args: Vec<&str> = argv.iter().map(String::as_str).collect();
        let code = client
            .exec_stream(&args, &env, |s, d| {
                let s = match s {
                    OutStream::Stdout => Stream::Stdout,
                    OutStream::Stderr => Stream::Stderr,
                };
                on_output(s, d)
            })
            .with_context(|| format!("running {:?} in the guest", self.argv))?;
        let _ = client.shutdown();
        Ok(code)
    }
}

/// A UDP port of `ip` free right now, for QEMU to bind (QEMU cannot report one it picked).
fn free_udp_endpoint(ip: IpAddr) -> anyhow::Result<std::net::SocketAddr> {
    use anyhow::Context;
    let s = std::net::UdpSocket::bind((ip, 0))
        .with_context(|| format!("finding a free UDP port on {ip} for the VM's NIC"))?;
    Ok(s.local_addr()?)
}
