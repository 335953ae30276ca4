//! `vse lock` (no index cache, cold cache, warm cache) and `apt-get install -s` of the same
//! roots, as whole processes; warm runs are interleaved pairs so both see the same load.

use super::ResolveBench;
use crate::BenchError;
use crate::measure::{Measured, median_of, run_measured, self_max_rss_kib};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use vsec::lock::Reason;
use vsec::resolve::apt::AptSandbox;

#[derive(Debug, serde::Serialize)]
pub struct Process {
    pub request: String,
    pub packages: usize,
    pub apt_packages: usize,
    /// apt would install exactly the locked packages.
    pub same_packages: bool,
    /// Medians over the runs.
    pub vse_lock_no_cache: Measured,
    pub vse_lock_cold: Measured,
    pub vse_lock_warm: Measured,
    pub apt_get_s_cold: Measured,
    pub apt_get_s_warm: Measured,
    pub warm_speedup_vs_apt_warm: f64,
    pub cold_vs_no_cache: f64,
    pub warm_rss_vs_apt_warm: f64,
    pub goal_warm_10x_apt: bool,
    pub goal_warm_rss_below_apt: bool,
    /// This benchmark's own peak resident set when it started the children: the kernel
    /// reports no child peak below it (exec keeps the parent's high-water mark).
    pub rss_floor_kib: u64,
}

pub(super) fn whole_process(
    b: &ResolveBench,
    vse: &Path,
    runs: u32,
    scratch: &Path,
) -> Result<Process, BenchError> {
    let dir = scratch.join("process");
    std::fs::create_dir_all(&dir)?;
    let spec = write_spec(b, &dir)?;
    let cache = dir.join("cache");
    let lock_path = dir.join("bench.lock");
    let vse_lock = |cache: &Path| -> Result<Measured, BenchError> {
        let mut c = Command::new(vse);
        c.env("VSE_CACHE", cache)
            .arg("lock")
            .arg(&spec)
            .arg("-o")
            .arg(&lock_path)
            .arg("--quiet");
        if b.allow_expired {
            c.arg("--allow-expired");
        }
        run_measured(c, &dir.join("vse.out"))
    };
    // Today's behaviour: a cache root that cannot hold the index cache.
    let blocker = dir.join("no-cache");
    std::fs::write(&blocker, b"")?;
    let (mut none, mut cold, mut warm) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        none.push(vse_lock(&blocker)?);
        let _ = std::fs::remove_dir_all(&cache);
        cold.push(vse_lock(&cache)?);
        // The cache file is written in the background after the lock: the next run (and
        // the warm ones) start once it is there, not while it is being written.
        cache_written(&cache)?;
    }
    let lock = vsec::lock::Lockfile::read(&lock_path)?;
    let roots: Vec<String> = lock
        .packages
        .iter()
        .filter(|p| !matches!(p.reason, Reason::Dependency { .. }))
        .map(|p| p.name.to_string())
        .collect();
    let (sandbox, empty) = apt_sandbox(&dir)?;
    let apt = || {
        let mut c = sandbox.command(&empty);
        c.arg("-s").arg("install").args(&roots);
        run_measured(c, &dir.join("apt.out"))
    };
    let apt_cold = apt()?;
    let apt_names = installed_by_apt(&std::fs::read_to_string(dir.join("apt.out"))?);
    let mut apt_warm = Vec::new();
    for _ in 0..runs {
        warm.push(vse_lock(&cache)?);
        apt_warm.push(apt()?);
    }
    let vse_names: BTreeSet<String> = lock.packages.iter().map(|p| p.name.to_string()).collect();
    let (none, cold, warm, apt_warm) = (
        median_of(&none),
        median_of(&cold),
        median_of(&warm),
        median_of(&apt_warm),
    );
    let speedup = apt_warm.wall_ms / warm.wall_ms.max(1e-3);
    let rss_ratio = warm.max_rss_kib as f64 / apt_warm.max_rss_kib.max(1) as f64;
    Ok(Process {
        request: b.lock_request.clone(),
        packages: vse_names.len(),
        apt_packages: apt_names.len(),
        same_packages: vse_names == apt_names,
        vse_lock_no_cache: none,
        vse_lock_cold: cold,
        vse_lock_warm: warm,
        apt_get_s_cold: apt_cold,
        apt_get_s_warm: apt_warm,
        warm_speedup_vs_apt_warm: speedup,
        cold_vs_no_cache: cold.wall_ms / none.wall_ms.max(1e-3),
        warm_rss_vs_apt_warm: rss_ratio,
        goal_warm_10x_apt: speedup >= 10.0,
        goal_warm_rss_below_apt: rss_ratio < 1.0,
        rss_floor_kib: self_max_rss_kib(),
    })
}

/// A spec asking for the `--lock-request` packages on the base variant.
/// Waits (at most a minute) for the index cache file under `cache`.
fn cache_written(cache: &Path) -> Result<(), BenchError> {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let index = cache.join("index");
    loop {
        let done = std::fs::read_dir(&index).is_ok_and(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".vsei"))
        });
        if done {
            return Ok(());
        }
        if std::time::Instant::now() > end {
            return Err(BenchError::Failed(format!(
                "no index cache file in {} a minute after the cold lock",
                index.display()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn write_spec(b: &ResolveBench, dir: &Path) -> Result<PathBuf, BenchError> {
    let names: Vec<&str> = b.lock_request.split_whitespace().collect();
    let spec = dir.join("bench.vse.yaml");
    std::fs::write(
        &spec,
        format!(
            "version: 1\nname: bench-lock\nbase:\n  distribution: debian\n  suite: bookworm\n  architecture: amd64\n  components: [main]\n  variant: {}\nkernel: linux-image-cloud-amd64\npackages: [{}]\n",
            b.variant,
            names.join(", ")
        ),
    )?;
    Ok(spec)
}

/// apt's sandbox under `dir` and an empty dpkg status (nothing installed).
fn apt_sandbox(dir: &Path) -> Result<(AptSandbox, PathBuf), BenchError> {
    let sandbox = AptSandbox {
        dir: dir.join("apt"),
    };
    let empty = sandbox.dir.join("empty-status");
    std::fs::create_dir_all(&sandbox.dir)?;
    std::fs::write(&empty, "")?;
    Ok((sandbox, empty))
}

/// The packages `apt-get -s install` would install (its `Inst NAME …` lines).
fn installed_by_apt(out: &str) -> BTreeSet<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("Inst "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn apt_simulation_lines_name_the_installed_packages() {
        let out = "NOTE: simulation\nInst libc6 (2.36 Debian:12) [amd64]\nConf libc6 (2.36)\nInst tree (2.1 Debian:12)\n";
        let names = super::installed_by_apt(out);
        assert_eq!(names.into_iter().collect::<Vec<_>>(), ["libc6", "tree"]);
    }
}
