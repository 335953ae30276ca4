//! The hypervisor process seen from the host: whether it still runs, and which cgroup it
//! belongs to.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[error("moving the hypervisor process {pid} into the cgroup {}: {source}", dir.display())]
pub struct CgroupError {
    pub pid: u32,
    pub dir: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Moves process `pid` into the cgroup directory `dir` (v1 or v2): a node's share of a
/// machine that several test nodes share is a memory cgroup, and its VMs must be inside it.
pub fn enter_cgroup(dir: &Path, pid: u32) -> Result<(), CgroupError> {
    std::fs::write(dir.join("cgroup.procs"), pid.to_string()).map_err(|source| CgroupError {
        pid,
        dir: dir.to_path_buf(),
        source,
    })
}

/// A process that exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        assert!(alive(std::process::id()));
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        assert!(!alive(pid));
    }

    #[test]
    fn a_cgroup_that_is_not_one_is_an_error_naming_it() {
        let e = enter_cgroup(Path::new("/nonexistent/cg"), 1).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/cg"), "{e}");
    }
}
