//! A node's memory as a memory cgroup sees it, for hosts whose share of the machine is a
//! cgroup (several "nodes" on one machine in tests and benchmarks, or a partitioned host):
//! `/proc/meminfo` is machine-wide there and would make every node look alike.
//!
//! MemTotal is the cgroup's limit. Active is the anonymous memory (active + inactive: without
//! swap every anonymous page is resident and in use, and the kernel puts fresh anonymous pages
//! on the inactive list first, so `active_anon` alone lags by minutes) plus `active_file`.
//! MemAvailable is the limit minus the usage, plus the reclaimable `inactive_file`.
//! Both hierarchies are read: v2 (`memory.max`, `memory.current`) and v1
//! (`memory.limit_in_bytes`, `memory.usage_in_bytes`); `memory.stat` names agree.

use super::{MemInfo, MonitorError};
use std::path::Path;

fn read(dir: &Path, name: &str) -> Option<Result<String, MonitorError>> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(t) => Some(Ok(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => Some(Err(MonitorError::Read { path, source })),
    }
}

fn number(text: &str, path: &Path) -> Result<u64, MonitorError> {
    text.trim().parse().map_err(|_| MonitorError::Parse {
        path: path.display().to_string(),
        line: 1,
        what: format!("`{}`", text.trim()),
        expected: "a byte count (a cgroup without a memory limit cannot stand for a node)",
    })
}

/// Reads the memory view of the cgroup directory `dir`.
pub fn cgroup_meminfo(dir: &Path) -> Result<MemInfo, MonitorError> {
    let (limit_name, usage_name) = if dir.join("memory.max").exists() {
        ("memory.max", "memory.current")
    } else {
        ("memory.limit_in_bytes", "memory.usage_in_bytes")
    };
    let missing = |name: &str| MonitorError::Read {
        path: dir.join(name),
        source: std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "not a memory cgroup (no v1 or v2 memory controller files)",
        ),
    };
    let limit = number(
        &read(dir, limit_name).ok_or_else(|| missing(limit_name))??,
        &dir.join(limit_name),
    )?;
    let usage = number(
        &read(dir, usage_name).ok_or_else(|| missing(usage_name))??,
        &dir.join(usage_name),
    )?;
    let stat_path = dir.join("memory.stat");
    let stat = read(dir, "memory.stat").ok_or_else(|| missing("memory.stat"))??;
    let field = |name: &str| -> Result<u64, MonitorError> {
        for (i, line) in stat.lines().enumerate() {
            if let Some(v) = line.strip_prefix(name).and_then(|r| r.strip_prefix(' ')) {
                return v.trim().parse().map_err(|_| MonitorError::Parse {
                    path: stat_path.display().to_string(),
                    line: i + 1,
                    what: format!("`{line}`"),
                    expected: "`<name> <bytes>`",
                });
            }
        }
        Err(MonitorError::Parse {
            path: stat_path.display().to_string(),
            line: 0,
            what: format!("no `{name}` line"),
            expected: "the memory controller's statistics",
        })
    };
    let active = field("active_anon")? + field("inactive_anon")? + field("active_file")?;
    let inactive_file = field("inactive_file")?;
    Ok(MemInfo {
        total_kib: limit / 1024,
        active_kib: active / 1024,
        available_kib: (limit.saturating_sub(usage) + inactive_file) / 1024,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        for (n, t) in files {
            std::fs::write(dir.join(n), t).unwrap();
        }
    }

    #[test]
    fn v1_and_v2_layouts() {
        let stat = "active_anon 1048576\ninactive_anon 2097152\nactive_file 1048576\ninactive_file 4194304\n";
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            &[
                ("memory.limit_in_bytes", "67108864\n"),
                ("memory.usage_in_bytes", "16777216\n"),
                ("memory.stat", stat),
            ],
        );
        let m = cgroup_meminfo(d.path()).unwrap();
        assert_eq!(m.total_kib, 65536);
        assert_eq!(m.active_kib, 4096);
        assert_eq!(m.available_kib, 49152 + 4096);
        let d2 = tempfile::tempdir().unwrap();
        write(
            d2.path(),
            &[
                ("memory.max", "67108864\n"),
                ("memory.current", "16777216\n"),
                ("memory.stat", stat),
            ],
        );
        assert_eq!(cgroup_meminfo(d2.path()).unwrap(), m);
    }

    #[test]
    fn unlimited_or_foreign_dirs_are_clear_errors() {
        let d = tempfile::tempdir().unwrap();
        let e = cgroup_meminfo(d.path()).unwrap_err().to_string();
        assert!(e.contains("not a memory cgroup"), "{e}");
        write(
            d.path(),
            &[
                ("memory.max", "max\n"),
                ("memory.current", "1\n"),
                ("memory.stat", ""),
            ],
        );
        let e = cgroup_meminfo(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("memory.max:1") && e.contains("without a memory limit"),
            "{e}"
        );
    }
}
