//! A memory cgroup that stands for one node when several node agents share one machine
//! (`vse launch --allocation local:N --node-memory MiB`, the simulation mode): `/proc/meminfo`
//! is machine-wide there, so every node would look alike and no rule could tell a failing
//! node from a healthy one. The node's MemTotal becomes the cgroup's limit and its Active
//! memory what its own processes (its VMs' hypervisors, anything started in it) use, with
//! real memory pressure. Real nodes sample `/proc`; this is never used there.
//!
//! Both hierarchies work: v1 (`memory.limit_in_bytes`) and v2 (`memory.max`, needs `+memory`
//! in the parent's `cgroup.subtree_control`).

use super::MonitorError;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The memory cgroup directory of this process, if children can be created in it, and
/// whether it is cgroup v2. Resolved through the mounts (a namespace node sees its memory
/// hierarchy mounted from its own cgroup).
pub fn memory_cgroup_base() -> Option<(PathBuf, bool)> {
    if let Some(base) = vse_base::cgroup::own_dir(Some("memory"))
        && base.join("memory.limit_in_bytes").exists()
        && writable(&base)
    {
        return Some((base, false));
    }
    let base = vse_base::cgroup::own_dir(None)?;
    let ctl = std::fs::read_to_string(base.join("cgroup.subtree_control")).unwrap_or_default();
    (ctl.split_whitespace().any(|c| c == "memory") && writable(&base)).then_some((base, true))
}

fn writable(dir: &Path) -> bool {
    let probe = dir.join(format!("vse-probe-{}", std::process::id()));
    let ok = std::fs::create_dir(&probe).is_ok();
    let _ = std::fs::remove_dir(&probe);
    ok
}

/// How old an empty node cgroup must be before another job's agent removes it.
const STALE: Duration = Duration::from_secs(600);

/// Removes the node cgroups (`vse-*`) of agents that were killed before they could remove
/// their own. The kernel refuses to remove a cgroup that still holds a process, so only empty
/// ones go, and only old ones: a fresh one may be about to receive its agent's VMs.
fn sweep_stale(base: &Path, prefix: &str, age: Duration) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let old = (e.metadata().and_then(|m| m.modified()).ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|a| a >= age);
        if old && e.file_name().to_string_lossy().starts_with(prefix) {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// A node's memory cgroup; removed on drop (once its processes are gone).
#[derive(Debug)]
pub struct NodeCgroup {
    dir: PathBuf,
}

fn io(path: &Path, source: std::io::Error) -> MonitorError {
    MonitorError::Read {
        path: path.to_path_buf(),
        source,
    }
}

impl NodeCgroup {
    /// Creates `<base>/<name>` with a memory limit of `limit_mib`. `name` must be unique on
    /// the machine (job and node in it).
    pub fn create(name: &str, limit_mib: u64) -> Result<Self, MonitorError> {
        let (base, v2) = memory_cgroup_base().ok_or_else(|| {
            io(
                Path::new("/proc/self/cgroup"),
                std::io::Error::other(
                    "no writable memory cgroup (v1 memory controller, or v2 with +memory in \
                     cgroup.subtree_control); the simulation mode needs root and cgroups",
                ),
            )
        })?;
        sweep_stale(&base, "vse-", STALE);
        let dir = base.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(&dir, e)),
        }
        let cg = Self { dir };
        let file = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        let path = cg.dir.join(file);
        std::fs::write(&path, (limit_mib << 20).to_string()).map_err(|e| io(&path, e))?;
        Ok(cg)
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for NodeCgroup {
    fn drop(&mut self) {
        // The VMs were killed just before; a zombie may still count for a moment (PID 1
        // reaps late), so retry briefly instead of leaking the directory.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_is_the_nodes_memtotal() {
        testkit::require!(
            memory_cgroup_base().is_some(),
            "a writable memory cgroup",
            "run as root with the memory controller enabled"
        );
        let name = format!("vse-unit-{}", std::process::id());
        let cg = NodeCgroup::create(&name, 300).unwrap();
        let m = super::super::cgroup_meminfo(cg.path()).unwrap();
        assert_eq!(m.total_kib, 300 * 1024);
        let dir = cg.path().to_path_buf();
        drop(cg);
        assert!(!dir.exists());
    }

    /// A killed agent's empty cgroup is swept; one holding a process is not.
    #[test]
    fn stale_empty_node_cgroups_are_swept() {
        testkit::require!(
            memory_cgroup_base().is_some(),
            "a writable memory cgroup",
            "run as root with the memory controller enabled"
        );
        let (base, _) = memory_cgroup_base().unwrap();
        // Only this test's own: other tests' fresh cgroups are empty too.
        let mine = format!("vse-unit-sweep-{}-", std::process::id());
        let (empty, busy) = (
            NodeCgroup::create(&format!("{mine}empty"), 64).unwrap(),
            NodeCgroup::create(&format!("{mine}busy"), 64).unwrap(),
        );
        let mut sleeper = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        std::fs::write(busy.path().join("cgroup.procs"), sleeper.id().to_string()).unwrap();
        sweep_stale(&base, &mine, Duration::ZERO);
        assert!(!empty.path().exists());
        assert!(busy.path().exists());
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
    }
}
