//! Process checks on `/proc`: liveness where a zombie counts as dead (it runs nothing and
//! holds no memory; only its parent's `wait` is missing), processes by command line, and
//! "every QEMU of this test has exited".

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// The process state letter from `/proc/PID/stat` (`R`, `S`, `Z`, …).
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: the state follows the last ") ".
    stat.rsplit_once(") ")?.1.chars().next()
}

/// The parent of `pid`.
pub fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()
}

/// `pid` exists and is not a zombie (or dead and not yet reaped).
pub fn alive(pid: u32) -> bool {
    state(pid).is_some_and(|s| s != 'Z' && s != 'X')
}

/// The arguments of `pid`, or `None` when it is gone (or a kernel thread).
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    if raw.is_empty() {
        return None;
    }
    Some(
        raw.strip_suffix(&[0])
            .unwrap_or(&raw)
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// Live processes whose arguments satisfy `pred`, by pid.
pub fn pids_where(pred: impl Fn(&[String]) -> bool) -> Vec<u32> {
    let mut out: Vec<u32> = std::fs::read_dir("/proc")
        .expect("/proc is mounted")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| cmdline(pid).is_some_and(|a| pred(&a)) && alive(pid))
        .collect();
    out.sort_unstable();
    out
}

/// Live processes whose command line contains every one of `words` (each within one argument).
pub fn pids_with(words: &[&str]) -> Vec<u32> {
    pids_where(|args| words.iter().all(|w| args.iter().any(|a| a.contains(w))))
}

/// Live QEMU processes of the VM named `name` (V2M passes `-name guest=NAME,…`).
pub fn qemu_processes(name: &str) -> Vec<u32> {
    let needle = format!("guest={name},");
    pids_where(|args| args.iter().any(|a| a.starts_with(&needle)))
}

/// Waits until none of `pids` is alive; the ones still alive after `within` otherwise.
pub fn wait_gone(pids: &[u32], within: Duration) -> Result<(), Vec<u32>> {
    let end = Instant::now() + within;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= end {
            return Err(left);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every QEMU whose command line names `dir` (a run directory of the test) has exited,
/// waiting up to `within` for teardown.
#[track_caller]
pub fn assert_no_qemu_left(dir: &Path, within: Duration) {
    let needle = dir.to_string_lossy().into_owned();
    let end = Instant::now() + within;
    loop {
        let left = pids_with(&["qemu", &needle]);
        if left.is_empty() {
            return;
        }
        let described: Vec<String> = left
            .iter()
            .map(|&p| format!("{p}: {}", cmdline(p).unwrap_or_default().join(" ")))
            .collect();
        assert!(
            Instant::now() < end,
            "QEMU left running under {}: {described:?}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// SIGKILL to `pid` (a process the test started or found by its own VM's name).
pub fn kill9(pid: u32) {
    // SAFETY: kill(2) has no memory-safety preconditions; a stale pid only yields ESRCH.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
}

/// A child that is killed and reaped when dropped, so a failing assertion leaves no process.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_zombie_is_dead_and_a_sleeper_is_found_by_its_arguments() {
        let mut child = Command::new("sleep").arg("31.4159").spawn().unwrap();
        let pid = child.id();
        assert!(alive(pid));
        assert_eq!(parent(pid), Some(std::process::id()));
        // Until the child has exec'd, its command line is still this test's.
        let end = Instant::now() + Duration::from_secs(5);
        while !pids_with(&["sleep", "31.4159"]).contains(&pid) {
            assert!(Instant::now() < end, "sleep not found by its arguments");
            std::thread::sleep(Duration::from_millis(10));
        }
        kill9(pid);
        // Not reaped yet: a zombie, which counts as dead.
        while alive(pid) {
            assert!(Instant::now() < end, "SIGKILLed child still alive");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(state(pid), Some('Z'));
        assert!(!pids_with(&["sleep", "31.4159"]).contains(&pid));
        assert_eq!(wait_gone(&[pid], Duration::ZERO), Ok(()));
        child.wait().unwrap();
        assert!(!alive(pid));
    }
}
