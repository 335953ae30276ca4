//! A process that holds memory inside a cgroup: the "hog" of the migration tests, which makes
//! a node's Active memory cross the threshold (or, as noise, move around below it).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The helper binary (`src/bin/vse-test-hog.rs`, built by this crate's build script).
pub fn binary() -> PathBuf {
    PathBuf::from(env!("VSE_TEST_HOG_BIN"))
}

/// The running hog; killed and reaped on drop.
#[derive(Debug)]
pub struct Hog(Child);

impl Hog {
    /// Holds `mib` MiB of touched memory inside cgroup `dir`.
    #[track_caller]
    pub fn start(dir: &Path, mib: u64) -> Hog {
        Self::start_pattern(dir, &mib.to_string())
    }

    /// `pattern`: `N` (hold N MiB) or `A-B` (noise: a random size in [A, B] MiB, changing
    /// every 100-300 ms). Returns once the first block is resident in the cgroup.
    #[track_caller]
    pub fn start_pattern(dir: &Path, pattern: &str) -> Hog {
        let mut child = Command::new(binary())
            .arg(dir)
            .arg(pattern)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary().display()));
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("piped")).lines();
        let ready = lines
            .by_ref()
            .map_while(Result::ok)
            .any(|l| l.starts_with("HOG-READY"));
        if !ready {
            let _ = child.kill();
            let out = child.wait_with_output();
            let err = out
                .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                .unwrap_or_default();
            panic!("the hog did not start in {}: {err}", dir.display());
        }
        // Keep draining so the hog never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Hog(child)
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_that_is_no_cgroup_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::remove_dir(dir.path()).unwrap();
        let r = std::panic::catch_unwind(|| Hog::start(dir.path(), 1));
        let msg = r.unwrap_err();
        let msg = msg.downcast_ref::<String>().unwrap();
        assert!(msg.contains("cannot join"), "{msg}");
    }

    #[test]
    fn holds_its_memory_until_dropped() {
        // Any writable directory takes the `cgroup.procs` write; a real cgroup is the
        // callers' business (they need root).
        let dir = tempfile::tempdir().unwrap();
        let hog = Hog::start(dir.path(), 8);
        let pid = hog.pid();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let rss_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap();
        assert!(rss_kib >= 8 * 1024, "VmRSS {rss_kib} KiB");
        drop(hog);
        assert!(!crate::process::alive(pid));
    }
}
