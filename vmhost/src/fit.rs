//! Whether a VM fits in the memory this process may use. Inside a batch job that is the job's
//! memory cgroup (Slurm's `ConstrainRAMSpace`, a PBS cgroup hook): a VM booted past it would
//! be killed by the kernel's OOM killer mid-job, so it is refused before it starts, with the
//! numbers. Cgroup v1 and v2 are both read; the limit is the smallest along the path from
//! this process's cgroup up to its hierarchy's mount.

use std::path::Path;
use vse_base::cgroup::{mount_of, parse_cgroups};

/// An allowance for what the hypervisor process needs besides the guest's RAM (its code and
/// heap, device state, the TCG translation cache it fills): a fixed estimate, not measured
/// per VM or per hypervisor.
pub const HYPERVISOR_OVERHEAD_MIB: u64 = 96;

/// The memory bound this process runs under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimit {
    pub bytes: u64,
    /// The cgroup (as `/proc/self/cgroup` names it) whose limit it is.
    pub cgroup: String,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "a VM of {vm_mib} MiB needs {need_mib} MiB with its hypervisor ({overhead_mib} MiB), more than the {limit_mib} MiB this job may use (memory cgroup {cgroup}); ask the batch system for more memory (Slurm: --mem, --mem-per-cpu) or give the VM less",
    need_mib = vm_mib + overhead_mib,
    limit_mib = limit.bytes >> 20,
    cgroup = limit.cgroup
)]
pub struct TooLarge {
    pub vm_mib: u64,
    pub overhead_mib: u64,
    pub limit: MemoryLimit,
}

/// Refuses VMs of `vm_mib` MiB in all (several VMs of one process) that, with their
/// hypervisors, exceed this process's memory limit.
pub fn check(vm_mib: u64, hypervisors: u64) -> Result<(), TooLarge> {
    let Some(limit) = memory_limit() else {
        return Ok(());
    };
    let overhead_mib = HYPERVISOR_OVERHEAD_MIB * hypervisors.max(1);
    if (vm_mib + overhead_mib) << 20 > limit.bytes {
        return Err(TooLarge {
            vm_mib,
            overhead_mib,
            limit,
        });
    }
    Ok(())
}

/// This process's memory limit, when a cgroup sets one.
pub fn memory_limit() -> Option<MemoryLimit> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    limit_in(&cgroups, &mountinfo, &|p: &Path| {
        std::fs::read_to_string(p).ok()
    })
}

fn limit_in(
    cgroups: &str,
    mountinfo: &str,
    read: &dyn Fn(&Path) -> Option<String>,
) -> Option<MemoryLimit> {
    let lines = parse_cgroups(cgroups);
    let (line, file) = match lines
        .iter()
        .find(|l| l.controllers.iter().any(|c| c == "memory"))
    {
        Some(v1) => (v1, "memory.limit_in_bytes"),
        None => (lines.iter().find(|l| l.id == "0")?, "memory.max"),
    };
    let (point, rel) = mount_of(line, mountinfo)?;
    let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
    let mut best: Option<MemoryLimit> = None;
    // From the process's cgroup up to the mount's root; above the mount nothing is visible.
    for depth in (0..=parts.len()).rev() {
        let dir = parts[..depth].iter().fold(point.clone(), |d, p| d.join(p));
        // "max" (v2) and v1's page-rounded i64::MAX both fail or exceed the bound: no limit.
        let value = read(&dir.join(file)).and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(bytes) = value.filter(|b| *b < 1 << 62)
            && best.as_ref().is_none_or(|b| bytes < b.bytes)
        {
            let up = parts.len() - depth;
            let mut name: Vec<&str> = line.path.split('/').filter(|p| !p.is_empty()).collect();
            name.truncate(name.len().saturating_sub(up));
            best = Some(MemoryLimit {
                bytes,
                cgroup: format!("/{}", name.join("/")),
            });
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::PathBuf;

    const MOUNTS_V1: &str = "\
30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
";

    fn files(pairs: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let m: HashMap<PathBuf, String> = pairs
            .iter()
            .map(|(p, v)| (PathBuf::from(p), v.to_string()))
            .collect();
        move |p: &Path| m.get(p).cloned()
    }

    #[test]
    fn the_smallest_limit_on_the_way_up_is_the_job_s() {
        let cg = "4:memory:/slurm_n1/uid_0/job_7/step_0/task_0\n2:cpu,cpuacct:/\n";
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/slurm_n1/uid_0/job_7/step_0/task_0/memory.limit_in_bytes",
                "9223372036854771712",
            ),
            (
                "/sys/fs/cgroup/memory/slurm_n1/uid_0/job_7/step_0/memory.limit_in_bytes",
                "536870912",
            ),
            (
                "/sys/fs/cgroup/memory/slurm_n1/uid_0/job_7/memory.limit_in_bytes",
                "536870912",
            ),
            (
                "/sys/fs/cgroup/memory/slurm_n1/uid_0/memory.limit_in_bytes",
                "9223372036854771712",
            ),
            (
                "/sys/fs/cgroup/memory/slurm_n1/memory.limit_in_bytes",
                "9223372036854771712",
            ),
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712",
            ),
        ]);
        let l = limit_in(cg, MOUNTS_V1, &read).unwrap();
        assert_eq!(l.bytes, 512 << 20);
        assert_eq!(l.cgroup, "/slurm_n1/uid_0/job_7/step_0");
    }

    #[test]
    fn a_mount_of_a_sub_cgroup_is_followed_and_v2_max_means_none() {
        // A node of the namespace cluster: its memory hierarchy is bound from a sub-cgroup.
        let mounts = "40 30 0:26 /nodes/n1 /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let cg = "4:memory:/nodes/n1/slurm_n1/job_3\n";
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/slurm_n1/job_3/memory.limit_in_bytes",
                "1073741824",
            ),
            ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "3221225472"),
        ]);
        let l = limit_in(cg, mounts, &read).unwrap();
        assert_eq!(
            (l.bytes, l.cgroup.as_str()),
            (1 << 30, "/nodes/n1/slurm_n1/job_3")
        );
        let v2 = "50 25 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let read = files(&[("/sys/fs/cgroup/job/memory.max", "max")]);
        assert_eq!(limit_in("0::/job\n", v2, &read), None);
        let read = files(&[("/sys/fs/cgroup/job/memory.max", "268435456")]);
        assert_eq!(limit_in("0::/job\n", v2, &read).unwrap().bytes, 256 << 20);
    }

    #[test]
    fn a_vm_past_the_limit_is_refused_with_the_numbers() {
        let e = TooLarge {
            vm_mib: 2048,
            overhead_mib: HYPERVISOR_OVERHEAD_MIB,
            limit: MemoryLimit {
                bytes: 512 << 20,
                cgroup: "/slurm_n1/uid_0/job_7/step_0".into(),
            },
        }
        .to_string();
        assert!(
            e.contains("2048 MiB")
                && e.contains(&format!("{} MiB", 2048 + HYPERVISOR_OVERHEAD_MIB))
                && e.contains("512 MiB")
                && e.contains("job_7/step_0")
                && e.contains("--mem"),
            "{e}"
        );
    }
}
