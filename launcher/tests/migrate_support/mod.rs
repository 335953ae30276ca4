//! Shared helpers of the migration tests on real VMs: the test guest, a cluster of "nodes"
//! (one V2M QEMU run directory each, optionally one memory cgroup each), the `msgcheck`
//! program run through the guest agent, and skip/require logic.
#![allow(dead_code)]

use launcher::controller::StateDb;
use launcher::migrate::{BarrierServer, Pool, QemuFleet, vm_name};
use launcher::monitor::{JobId, NodeName, VmId};
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

/// `VSE_REQUIRE_ALL=1` (CI) turns a missing component into a failure instead of a skip.
pub fn skip_or_fail(why: &str) {
    if std::env::var("VSE_REQUIRE_ALL").as_deref() == Ok("1") {
        panic!("required component missing (VSE_REQUIRE_ALL=1): {why}");
    }
    eprintln!("skipped: {why}");
}

pub struct Guest {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub cmdline: String,
}

/// The guest of `.ci/migrate-guest.sh` (agent as PID 1, msgcheck, console counter).
pub fn guest() -> Option<Guest> {
    if v2m::qemu::find_binary(Path::new("qemu-system-x86_64")).is_none() {
        skip_or_fail("qemu-system-x86_64 not installed");
        return None;
    }
    let cache = std::env::var("VSE_CACHE").unwrap_or_else(|_| "/var/cache/vse".into());
    let env = Path::new(&cache).join("fixtures/migrate.env");
    let Ok(text) = std::fs::read_to_string(&env) else {
        skip_or_fail(&format!(
            "no migration test guest at {} (run .ci/migrate-guest.sh)",
            env.display()
        ));
        return None;
    };
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(|v| v.trim_matches('"').to_string())
    };
    let g = Guest {
        kernel: get("VSE_MIGRATE_KERNEL")?.into(),
        initrd: get("VSE_MIGRATE_INITRD")?.into(),
        cmdline: get("VSE_MIGRATE_CMDLINE")?,
    };
    if !g.kernel.is_file() || !g.initrd.is_file() {
        skip_or_fail("migration guest files missing (run .ci/migrate-guest.sh)");
        return None;
    }
    Some(g)
}

/// A short temporary directory (unix socket paths must stay below 108 bytes).
pub struct Tmp(tempfile::TempDir);

impl Tmp {
    pub fn new(tag: &str) -> Self {
        Tmp(tempfile::Builder::new()
            .prefix(&format!("vm-{tag}-"))
            .tempdir_in("/tmp")
            .unwrap())
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
    let log = std::fs::read(console).unwrap();
    let c: Vec<u64> = String::from_utf8_lossy(&log)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("VSE-COUNT ")?.trim().parse().ok())
        .collect();
    assert!(
        c.len() > 10,
        "too few counter lines in {}",
        console.display()
    );
    for w in c.windows(2) {
        assert_eq!(w[1], w[0] + 1, "counter jumps from {} to {}", w[0], w[1]);
    }
}

/// One memory cgroup per "node": all nodes share this machine, so `/proc/meminfo` is the
/// same for all of them; a cgroup gives each its own MemTotal (the limit) and Active (its
/// own processes' memory), with real pressure. Removed on drop (after its processes died).
pub struct NodeCgroups {
    pub dirs: Vec<PathBuf>,
}

impl NodeCgroups {
    /// `None` (after skip_or_fail) when this machine has no writable memory cgroup.
    pub fn create(tag: &str, n: usize, limit_mib: u64) -> Option<Self> {
        let Some((base, v2)) = launcher::monitor::memory_cgroup_base() else {
            skip_or_fail("no writable memory cgroup (v1 memory controller or v2 with +memory)");
            return None;
        };
        let mut dirs = Vec::new();
        for i in 0..n {
            let d = base.join(format!("vse-{}-{tag}-{i}", std::process::id()));
            let _ = std::fs::remove_dir(&d);
            if let Err(e) = std::fs::create_dir(&d) {
                skip_or_fail(&format!("cannot create cgroup {}: {e}", d.display()));
                return None;
            }
            dirs.push(d);
        }
        let cg = NodeCgroups { dirs };
        for i in 0..n {
            cg.set_limit(i, limit_mib, v2);
        }
        Some(cg)
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

impl Drop for NodeCgroups {
    fn drop(&mut self) {
        for d in &self.dirs {
            // Processes of the test are gone by now (kill-on-drop); a zombie may linger a
            // moment (PID 1 reaps late), so retry briefly.
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

pub const HOG_ENV: &str = "VSE_TEST_HOG";

/// A process that holds `mib` MiB of touched anonymous memory inside cgroup `dir`, re-touching
/// it so it stays in use; killed on drop. It is this test binary re-executed into the
/// `hog_child_process` test of the calling file.
pub struct Hog(std::process::Child);

impl Hog {
    pub fn start(test_name: &str, dir: &Path, mib: u64) -> Self {
        Self::start_pattern(test_name, dir, &mib.to_string())
    }

    /// `pattern`: `N` (hold N MiB) or `A-B` (noise: a random size in [A, B] MiB, changing
    /// every 100-300 ms).
    pub fn start_pattern(test_name: &str, dir: &Path, pattern: &str) -> Self {
        use std::io::BufRead;
        let exe = std::env::current_exe().unwrap();
        let mut child = std::process::Command::new(exe)
            .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
            .env(HOG_ENV, format!("{}|{pattern}", dir.display()))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let mut lines = std::io::BufReader::new(out).lines();
        loop {
            match lines.next() {
                Some(Ok(l)) if l.contains("HOG-READY") => break,
                Some(Ok(_)) => continue,
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("hog child failed to start in {}", dir.display());
                }
            }
        }
        // Keep draining so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Hog(child)
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The body of the hog child; call it from a `#[test] fn hog_child_process()` that does
/// nothing unless [`HOG_ENV`] is set.
pub fn hog_main() {
    let Ok(spec) = std::env::var(HOG_ENV) else {
        return;
    };
    let (dir, pattern) = spec.split_once('|').unwrap();
    std::fs::write(
        Path::new(dir).join("cgroup.procs"),
        std::process::id().to_string(),
    )
    .unwrap();
    let (lo, hi) = match pattern.split_once('-') {
        Some((a, b)) => (a.parse::<usize>().unwrap(), b.parse::<usize>().unwrap()),
        None => {
            let n = pattern.parse::<usize>().unwrap();
            (n, n)
        }
    };
    let mut seed = std::process::id() as u64 | 1;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut held: Vec<u8> = Vec::new();
    let mut first = true;
    loop {
        let mib = lo + (rand() as usize % (hi - lo + 1));
        // Free the old block first (a large allocation goes back to the kernel at once).
        drop(std::mem::take(&mut held));
        held.resize(mib << 20, 0);
        // Touch every page with non-zero data: real, resident memory.
        for i in (0..held.len()).step_by(4096) {
            held[i] = (i >> 12) as u8 | 1;
        }
        if first {
            println!("HOG-READY {mib}");
            first = false;
        }
        let pause = if lo == hi { 200 } else { 100 + rand() % 200 };
        for _ in 0..(if lo == hi { u64::MAX } else { 1 }) {
            std::thread::sleep(Duration::from_millis(pause));
            for i in (0..held.len()).step_by(4096) {
                held[i] = held[i].wrapping_add(2) | 1;
            }
        }
    }
}
