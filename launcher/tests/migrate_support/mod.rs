//! Shared helpers of the migration tests on real VMs: the test guest, a cluster of "nodes"
//! (one V2M QEMU run directory each, optionally one memory cgroup each), the `msgcheck`
//! program run through the guest agent. Skip-or-fail, the guest, the hog: `testkit`.
#![allow(dead_code)]

use control::migrate::BarrierServer;
use control::model::Pool;
use control::state::StateDb;
use launcher::fleet::{QemuFleet, vm_name};
use monitor::{JobId, NodeCgroup, NodeName, VmId, memory_cgroup_base};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use v2m::qemu::{AccelPolicy, QemuConfig};
use v2m::{ImageRef, MigrationParams, Profile};
use vse_guest_agent::{Barriers, LinkOptions, PendingExec};

pub fn node(s: &str) -> NodeName {
    NodeName::new(s).unwrap()
}
pub fn vid(s: &str) -> VmId {
    VmId::new(s).unwrap()
}
pub fn jid(s: &str) -> JobId {
    JobId::new(s).unwrap()
}

pub use testkit::fixture::Guest;

/// QEMU and the guest of `.ci/migrate-guest.sh` (agent as PID 1, msgcheck, console counter),
/// or `None` after skip-or-fail.
pub fn guest() -> Option<Guest> {
    if !testkit::require(
        v2m::qemu::find_binary(Path::new("qemu-system-x86_64")).is_some(),
        "qemu-system-x86_64",
        "apt-get install qemu-system-x86",
    ) {
        return None;
    }
    testkit::fixture::migrate_guest()
}

/// A short temporary directory (unix socket paths must stay below 108 bytes).
pub struct Tmp(tempfile::TempDir);

impl Tmp {
    pub fn new(tag: &str) -> Self {
        Tmp(testkit::short_tempdir(&format!("vm-{tag}")))
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

/// VM tests of one binary run one cluster at a time (2 cores: at most ~5 small TCG guests).
static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub struct Cluster {
    pub fleet: QemuFleet,
    pub nodes: Vec<(NodeName, QemuConfig)>,
    /// "kvm" or "tcg", from V2M's functional check.
    pub accel: String,
    // Declared last: released after the fleet (and its VMs) are gone.
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Cluster {
    /// `cgroups`: per node, the memory cgroup its VMs run in.
    pub fn new(t: &Tmp, names: &[&str], cgroups: Option<&[PathBuf]>) -> Self {
        let serial = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
        let g = guest().expect("guest checked by the caller");
        let bin = v2m::qemu::find_binary(Path::new("qemu-system-x86_64")).unwrap();
        let cache = std::env::var("VSE_CACHE").unwrap_or_else(|_| "/var/cache/vse".into());
        // One verdict for all nodes: both ends of a migration must use the same accelerator.
        let choice = v2m::qemu::accel::choose(
            AccelPolicy::Auto,
            &bin,
            &g.kernel,
            &Path::new(&cache).join("kvm-check"),
        );
        let accel = match choice.accel {
            v2m::qemu::Accel::Kvm => AccelPolicy::Kvm,
            v2m::qemu::Accel::Tcg => AccelPolicy::Tcg,
        };
        eprintln!("accelerator: {} ({})", choice.accel.as_str(), choice.reason);
        let params = MigrationParams {
            max_bandwidth_bytes_per_s: 1 << 30,
            downtime_limit_ms: 300,
            timeout: Duration::from_secs(180),
        };
        let mut fleet = QemuFleet::new(params, std::net::Ipv4Addr::LOCALHOST.into());
        let mut nodes = Vec::new();
        for (i, n) in names.iter().enumerate() {
            let cfg = QemuConfig {
                run_root: t.path(&format!("node-{n}")),
                accel,
                qmp_timeout: Duration::from_secs(60),
                die_with_parent: true,
                ..QemuConfig::default()
            };
            match cgroups {
                Some(cg) => fleet.add_node_in_cgroup(node(n), cfg.clone(), cg[i].clone()),
                None => fleet.add_node(node(n), cfg.clone()),
            }
            nodes.push((node(n), cfg));
        }
        Cluster {
            fleet,
            nodes,
            accel: choice.accel.as_str().into(),
            _serial: serial,
        }
    }

    pub fn node_configs(&self) -> Vec<(NodeName, QemuConfig)> {
        self.nodes.clone()
    }

    /// Boots `vm` on `on` with its guest agent link relaying to the barrier socket.
    pub fn boot(&mut self, g: &Guest, vm: &str, on: &str, mib: u64, t: &Tmp, barrier: &Path) {
        let mut p = Profile::new(
            vm_name(&vid(vm)).unwrap(),
            1,
            mib,
            ImageRef {
                kernel: g.kernel.clone(),
                initrd: Some(g.initrd.clone()),
                root_disk: None,
                cmdline: g.cmdline.clone(),
            },
        );
        // Source and destination append to one console log: one stream to check.
        p.console.log = Some(t.path(&format!("{vm}.console")));
        let link = LinkOptions::new(Duration::from_secs(300))
            .barriers(Barriers::Socket(barrier.to_path_buf()));
        self.fleet
            .start(vid(vm), &node(on), p, link)
            .unwrap_or_else(|e| panic!("booting {vm} with its guest agent: {e}"));
    }

    /// Starts msgcheck in the guest: `steps` checked messages, a barrier check at each.
    pub fn run_msgcheck(&self, job: &str, vm: &str, steps: u32, delay_ms: u32) -> App {
        let env: BTreeMap<String, String> = [
            (
                "VSE_BARRIER_SOCKET",
                vse_guest_agent::protocol::GUEST_BARRIER_SOCKET,
            ),
            ("VSE_JOB_ID", job),
            ("VSE_VM_ID", vm),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let pending = self.fleet.link(&vid(vm)).expect("link").spawn(
            &["/bin/msgcheck", &steps.to_string(), &delay_ms.to_string()],
            env,
        );
        App {
            pending,
            vm: vm.into(),
        }
    }
}

pub struct App {
    pending: PendingExec,
    vm: String,
}

impl App {
    /// Waits for msgcheck to end; returns its summary line (panics unless it exited 0).
    pub fn finish(self) -> String {
        let out = self
            .pending
            .wait(Duration::from_secs(900))
            .unwrap_or_else(|e| panic!("msgcheck on {}: {e}", self.vm));
        assert_eq!(
            out.status, 0,
            "msgcheck on {} failed: stdout {:?} stderr {:?}",
            self.vm, out.stdout, out.stderr
        );
        out.stdout
            .lines()
            .find(|l| l.starts_with("MSGCHECK "))
            .unwrap_or_else(|| panic!("no summary from msgcheck on {}: {:?}", self.vm, out.stdout))
            .to_string()
    }
}

/// Waits until a rank of `vm` is connected to `server` (through the guest agent relay).
pub fn wait_rank(server: &BarrierServer, job: &str, vm: &str) {
    let start = Instant::now();
    while !server.ranks(&jid(job)).contains_key(&vid(vm)) {
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "no rank of {vm} reached the barrier server through the guest agent"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn pool(db: &StateDb, name: &str) -> Pool {
    db.nodes()
        .unwrap()
        .into_iter()
        .find(|x| x.name.as_str() == name)
        .unwrap()
        .pool
}

/// The console counter (printed every 100 ms by the guest) has no gap and no repeat across
/// every migration: source and destination appended to one log.
pub fn assert_counter_continuous(console: &Path) {
    let c = testkit::fixture::counters(&std::fs::read(console).unwrap());
    assert!(
        c.len() > 10,
        "too few counter lines in {}",
        console.display()
    );
    testkit::fixture::assert_consecutive(&c, &console.display().to_string());
}

/// One memory cgroup per "node": all nodes share this machine, so `/proc/meminfo` is the
/// same for all of them; a cgroup gives each its own MemTotal (the limit) and Active (its
/// own processes' memory), with real pressure. The launcher's own [`NodeCgroup`]s (the
/// simulation mode of `vse launch`), removed on drop.
pub struct NodeCgroups {
    pub dirs: Vec<PathBuf>,
    _cgroups: Vec<NodeCgroup>,
    // Declared last, so released after the cgroups are gone.
    _serial: std::sync::MutexGuard<'static, ()>,
}

/// One scenario's node cgroups at a time in a process: under `cargo test` a binary's tests
/// run as threads, and two scenarios' hogs and limits under one memory cgroup base would
/// measure each other. (nextest runs each test in its own process; this costs it nothing.)
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl NodeCgroups {
    /// `None` (after skip-or-fail) when this machine has no writable memory cgroup.
    pub fn create(tag: &str, n: usize, limit_mib: u64) -> Option<Self> {
        if !testkit::require(
            memory_cgroup_base().is_some(),
            "a writable memory cgroup (v1 memory controller or v2 with +memory)",
            "run as root with the memory controller enabled",
        ) {
            return None;
        }
        let serial = SERIAL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let cgroups: Vec<NodeCgroup> = (0..n)
            .map(|i| {
                let name = format!("vse-{}-{tag}-{i}", std::process::id());
                NodeCgroup::create(&name, limit_mib)
                    .unwrap_or_else(|e| panic!("cgroup {name}: {e}"))
            })
            .collect();
        Some(NodeCgroups {
            dirs: cgroups.iter().map(|c| c.path().to_path_buf()).collect(),
            _cgroups: cgroups,
            _serial: serial,
        })
    }

    pub fn set_limit(&self, i: usize, mib: u64, v2: bool) {
        let (file, val) = if v2 {
            ("memory.max", (mib << 20).to_string())
        } else {
            ("memory.limit_in_bytes", (mib << 20).to_string())
        };
        std::fs::write(self.dirs[i].join(file), val).unwrap();
    }

    pub fn is_v2(&self) -> bool {
        self.dirs[0].join("memory.max").exists()
    }

    pub fn usage_mib(&self, i: usize) -> u64 {
        let f = if self.is_v2() {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        std::fs::read_to_string(self.dirs[i].join(f))
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
            >> 20
    }
}
