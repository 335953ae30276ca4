//! The QEMU process a VM handle controls: either our child (kill-on-drop) or, after `attach`,
//! a process started by an earlier invocation that we only know by pid.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

pub enum Proc {
    Child(Child),
    Foreign(u32),
}

impl Proc {
    pub fn pid(&self) -> u32 {
        match self {
            Proc::Child(c) => c.id(),
            Proc::Foreign(p) => *p,
        }
    }

    /// `Some(description)` once the process has exited (reaped for our children; for foreign
    /// ones a zombie counts as dead, as PID 1 may reap late).
    pub fn exited(&mut self) -> Option<String> {
        match self {
            Proc::Child(c) => match c.try_wait() {
                Ok(Some(st)) => Some(st.to_string()),
                Ok(None) => None,
                Err(e) => Some(format!("unknown ({e})")),
            },
            Proc::Foreign(pid) => (!pid_alive(*pid)).then(|| "exited".to_string()),
        }
    }

    pub fn kill(&mut self) {
        match self {
            Proc::Child(c) => {
                let _ = c.kill();
                let _ = c.wait();
            }
            Proc::Foreign(pid) => {
                // SAFETY: kill(2) with a pid we recorded for this VM; no memory is involved.
                unsafe {
                    libc::kill(*pid as libc::pid_t, libc::SIGKILL);
                }
                self.wait_exit(Duration::from_secs(5));
            }
        }
    }

    /// Waits until the process is gone, up to `limit`. True if it is gone.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let start = Instant::now();
        loop {
            if self.exited().is_some() {
                return true;
            }
            if start.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3 (after the parenthesised comm) is the state; Z and X are dead.
        Ok(s) => match s.rsplit_once(") ") {
            Some((_, rest)) => !rest.starts_with('Z') && !rest.starts_with('X'),
            None => true,
        },
        Err(_) => false,
    }
}

/// The last few lines QEMU wrote to stderr, for error messages.
pub fn stderr_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    if tail.is_empty() {
        String::new()
    } else {
        format!("; stderr: {tail}")
    }
}
