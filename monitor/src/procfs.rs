//! Parsers for the three `/proc` files the sampler reads. They take text (not paths) so the
//! same code parses the guest agent's copies of the guest's `/proc` files.

use super::MonitorError;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The three `/proc/meminfo` fields the rules need, in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemInfo {
    pub total_kib: u64,
    pub active_kib: u64,
    pub available_kib: u64,
}

impl MemInfo {
    /// Active memory as a fraction of MemTotal (seed 002 §4.1 uses Active, not Used).
    pub fn active_ratio(&self) -> f64 {
        if self.total_kib == 0 {
            return 0.0;
        }
        self.active_kib as f64 / self.total_kib as f64
    }
}

/// Cumulative jiffies per core from `/proc/stat` (`cpuN` lines only, not the `cpu` total).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuTimes {
    /// (busy, total) per core, in clock ticks.
    pub per_core: Vec<(u64, u64)>,
}

impl CpuTimes {
    /// Per-core utilisation in [0, 1] between `earlier` and `self`. A core whose counters did
    /// not move (or went backwards after a CPU hot-unplug) reads as idle rather than NaN.
    pub fn utilisation_since(&self, earlier: &CpuTimes) -> Vec<f64> {
        self.per_core
            .iter()
            .enumerate()
            .map(|(i, &(busy, total))| {
                let (b0, t0) = earlier.per_core.get(i).copied().unwrap_or((0, 0));
                let dt = total.saturating_sub(t0);
                if dt == 0 {
                    0.0
                } else {
                    (busy.saturating_sub(b0) as f64 / dt as f64).clamp(0.0, 1.0)
                }
            })
            .collect()
    }
}

fn parse_err(path: &str, line: usize, what: String, expected: &'static str) -> MonitorError {
    MonitorError::Parse {
        path: path.to_string(),
        line,
        what,
        expected,
    }
}

/// Parses `/proc/meminfo` text. `origin` names the source in errors.
pub fn parse_meminfo(text: &str, origin: &str) -> Result<MemInfo, MonitorError> {
    let (mut total, mut active, mut avail) = (None, None, None);
    for (i, line) in text.lines().enumerate() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let slot = match key {
            "MemTotal" => &mut total,
            "Active" => &mut active,
            "MemAvailable" => &mut avail,
            _ => continue,
        };
        let num = rest.split_whitespace().next().unwrap_or("");
        let value = num.parse::<u64>().map_err(|_| {
            parse_err(
                origin,
                i + 1,
                format!("`{key}` has value `{num}`"),
                "a number of kB",
            )
        })?;
        *slot = Some(value);
    }
    let missing = |name: &str| {
        parse_err(
            origin,
            text.lines().count(),
            format!("no `{name}` line"),
            "MemTotal, Active and MemAvailable lines (Linux >= 3.14)",
        )
    };
    Ok(MemInfo {
        total_kib: total.ok_or_else(|| missing("MemTotal"))?,
        active_kib: active.ok_or_else(|| missing("Active"))?,
        available_kib: avail.ok_or_else(|| missing("MemAvailable"))?,
    })
}

/// Parses the per-core `cpuN` lines of `/proc/stat`.
pub fn parse_cpu_times(text: &str, origin: &str) -> Result<CpuTimes, MonitorError> {
    let mut per_core = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut fields = line.split_whitespace();
        let Some(label) = fields.next() else { continue };
        let Some(idx) = label.strip_prefix("cpu").filter(|s| !s.is_empty()) else {
            continue;
        };
        let idx: usize = idx
            .parse()
            .map_err(|_| parse_err(origin, i + 1, format!("label `{label}`"), "cpuN"))?;
        // user nice system idle iowait irq softirq steal; guest time is already in user.
        let nums: Vec<u64> = fields
            .take(8)
            .map(|f| f.parse::<u64>())
            .collect::<Result<_, _>>()
            .map_err(|_| parse_err(origin, i + 1, format!("`{line}`"), "numeric jiffy counters"))?;
        if nums.len() < 4 {
            return Err(parse_err(
                origin,
                i + 1,
                format!("only {} counters", nums.len()),
                "at least user nice system idle",
            ));
        }
        let total: u64 = nums.iter().sum();
        let idle = nums[3] + nums.get(4).copied().unwrap_or(0);
        if per_core.len() <= idx {
            per_core.resize(idx + 1, (0, 0));
        }
        per_core[idx] = (total - idle, total);
    }
    if per_core.is_empty() {
        return Err(parse_err(
            origin,
            1,
            "no `cpuN` lines".into(),
            "per-core lines",
        ));
    }
    Ok(CpuTimes { per_core })
}

/// Resource use of one process (the hypervisor of a VM), all threads included: the kernel
/// sums every thread's time into `/proc/PID/stat` and RSS is per address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessStat {
    pub rss_kib: u64,
    /// utime + stime in clock ticks.
    pub cpu_ticks: u64,
}

fn read(path: &Path) -> Result<String, MonitorError> {
    std::fs::read_to_string(path).map_err(|source| MonitorError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads `/proc/PID/stat` and `/proc/PID/status`.
pub fn read_process(proc_root: &Path, pid: u32) -> Result<ProcessStat, MonitorError> {
    let stat_path = proc_root.join(pid.to_string()).join("stat");
    let stat = read(&stat_path)?;
    let origin = stat_path.display().to_string();
    // comm may contain spaces and parentheses: fields start after the last ')'.
    let after = stat
        .rfind(')')
        .map(|p| &stat[p + 1..])
        .ok_or_else(|| parse_err(&origin, 1, "no `)`".into(), "pid (comm) state ..."))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After comm: field 3 (state) is index 0, so utime (14) is 11 and stime (15) is 12.
    let tick = |i: usize| -> Result<u64, MonitorError> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| parse_err(&origin, 1, format!("field {}", i + 3), "utime/stime"))
    };
    let cpu_ticks = tick(11)? + tick(12)?;
    let status_path = proc_root.join(pid.to_string()).join("status");
    let status = read(&status_path)?;
    // Kernel threads and zombies have no VmRSS line: they hold no user memory.
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .map(|v| v.parse::<u64>())
        .transpose()
        .map_err(|_| {
            parse_err(
                &status_path.display().to_string(),
                1,
                "VmRSS is not a number".into(),
                "VmRSS: <n> kB",
            )
        })?
        .unwrap_or(0);
    Ok(ProcessStat { rss_kib, cpu_ticks })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_and_errors() {
        let t = "MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable: 500 kB\nActive: 750 kB\n";
        let m = parse_meminfo(t, "x").unwrap();
        assert_eq!(
            (m.total_kib, m.active_kib, m.available_kib),
            (1000, 750, 500)
        );
        assert_eq!(m.active_ratio(), 0.75);
        let e = parse_meminfo("MemTotal: 1 kB\n", "guest")
            .unwrap_err()
            .to_string();
        assert!(e.contains("guest") && e.contains("Active"), "{e}");
        let e = parse_meminfo("MemTotal: x kB\n", "f")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("f:1:"), "{e}");
    }

    #[test]
    fn cpu_deltas() {
        let a = parse_cpu_times("cpu 1 1 1 1\ncpu0 10 0 0 90 0\ncpu1 0 0 0 100 0\n", "a").unwrap();
        let b = parse_cpu_times("cpu0 60 0 0 140 0\ncpu1 0 0 0 200 0\n", "b").unwrap();
        assert_eq!(b.utilisation_since(&a), vec![0.5, 0.0]);
        assert!(parse_cpu_times("intr 1\n", "s").is_err());
    }
}
