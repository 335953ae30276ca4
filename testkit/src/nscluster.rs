//! The Slurm cluster of namespace nodes (`.ci/nscluster-up.sh`): node `nI` is network
//! namespace `vsnI` with address 10.77.0.I, its own hostname, and a private `/var/tmp`, `/tmp`
//! and `/run/vse` (host paths under `/var/tmp/vse-nscluster/nI`). [`NsCluster::up`] starts it
//! (idempotent) or reports it [`missing`](crate::missing); the rest finds a process's node
//! by its network namespace, and a node's private files from the host.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A running namespace cluster, as its env file describes it.
#[derive(Debug, Clone)]
pub struct NsCluster {
    /// `SLURM_CONF` of this cluster (not the loopback cluster's).
    pub conf: PathBuf,
    /// Host directory with one sub-directory per node (`n1`, `n2`, …).
    pub nodes_dir: PathBuf,
    /// Network namespace name prefix: node `nI` is namespace `<prefix>I`.
    pub prefix: String,
    /// The host's address on the nodes' bridge.
    pub frontend: std::net::IpAddr,
}

impl NsCluster {
    /// Starts the cluster (`.ci/nscluster-up.sh`, a no-op when it runs) and reads its env file;
    /// `None` after reporting it missing (needs root, Slurm, munge, iproute2).
    #[track_caller]
    pub fn up() -> Option<NsCluster> {
        let hint = "bash .ci/nscluster-up.sh (as root, with slurmd, slurmctld, munge, iproute2)";
        if !crate::require(crate::is_root(), "root (namespace cluster)", hint) {
            return None;
        }
        let script = ci_script("nscluster-up.sh");
        let out = Command::new("sh").arg(&script).output();
        let out = match out {
            Ok(o) if o.status.success() => o,
            Ok(o) => {
                let why = String::from_utf8_lossy(&o.stderr).into_owned();
                crate::missing(&format!("the namespace Slurm cluster ({why})"), hint);
                return None;
            }
            Err(e) => {
                crate::missing(&format!("{} ({e})", script.display()), hint);
                return None;
            }
        };
        let env_path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let env = crate::fixture::EnvFile::load_from(&env_path, "nscluster-up.sh")?;
        Some(NsCluster {
            conf: env.get("SLURM_CONF")?.into(),
            nodes_dir: env.get("VSE_NSCLUSTER_NODES")?.into(),
            prefix: env.get("VSE_NSCLUSTER_PREFIX")?,
            frontend: env.get("VSE_NSCLUSTER_FRONTEND")?.parse().ok()?,
        })
    }

    /// What node `host` (`nI`) sees as `path` (absolute; under `/var/tmp`, `/tmp` or `/run/vse`),
    /// from the host.
    pub fn node_path(&self, host: &str, path: &Path) -> PathBuf {
        let (private, rest) = if let Ok(rest) = path.strip_prefix("/var/tmp") {
            ("var-tmp", rest)
        } else if let Ok(rest) = path.strip_prefix("/tmp") {
            ("tmp", rest)
        } else if let Ok(rest) = path.strip_prefix("/run/vse") {
            ("run-vse", rest)
        } else {
            panic!(
                "{} is not node-local in the namespace cluster",
                path.display()
            )
        };
        self.nodes_dir.join(host).join(private).join(rest)
    }

    /// The node (`nI`) whose network namespace `pid` runs in, if any.
    pub fn node_of(&self, pid: u32) -> Option<String> {
        let ns = std::fs::metadata(format!("/proc/{pid}/ns/net")).ok()?.ino();
        let dir = std::fs::read_dir("/run/netns").ok()?;
        dir.flatten().find_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let i = name.strip_prefix(&self.prefix)?;
            i.parse::<u32>().ok()?;
            (e.metadata().ok()?.ino() == ns).then(|| format!("n{i}"))
        })
    }

    /// Mounts a tmpfs of `size` (e.g. `448k`) over `path` in node `host`'s mount namespace
    /// (the one its slurmd and every job step on it share), until the guard drops: a node
    /// whose disk is (nearly) full.
    #[track_caller]
    pub fn small_disk(&self, host: &str, path: &str, size: &str) -> SmallDisk {
        let pid_file = self.conf.with_file_name(format!("slurmd-{host}.pid"));
        let pid = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()));
        let pid = pid.trim().to_string();
        let ok = Command::new("nsenter")
            .args(["-t", &pid, "-m", "mount", "-t", "tmpfs", "-o"])
            .arg(format!("size={size}"))
            .args(["vse-small-disk", path])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "cannot mount a tmpfs over {path} on {host}");
        SmallDisk {
            pid,
            path: path.into(),
        }
    }

    /// Live processes inside a node's namespace whose command line satisfies `pred`, with the
    /// node they run on.
    pub fn processes_where(&self, pred: impl Fn(&[String]) -> bool) -> Vec<(u32, String)> {
        crate::process::pids_where(pred)
            .into_iter()
            .filter_map(|p| Some((p, self.node_of(p)?)))
            .collect()
    }
}

/// A tmpfs mounted over a node's directory; unmounted on drop.
#[derive(Debug)]
pub struct SmallDisk {
    pid: String,
    path: String,
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazily: a process of the node may still hold a file there.
        let _ = Command::new("nsenter")
            .args(["-t", &self.pid, "-m", "umount", "-l", &self.path])
            .status();
    }
}

/// `.ci/<name>` of the checkout whose tests run: found from the test's own package directory
/// (cargo and nextest set it when they run a test), not from where this crate was compiled:
/// a build shared by two checkouts would otherwise run the other's script.
fn ci_script(name: &str) -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let from = std::env::var_os("CARGO_MANIFEST_DIR").map_or(built.clone(), PathBuf::from);
    (from.ancestors())
        .map(|d| d.join(".ci").join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| built.join(".ci").join(name))
}
