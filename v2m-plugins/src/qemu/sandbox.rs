//! QEMU's seccomp sandbox: every VM runs under it, so a guest that takes over its QEMU process
//! cannot fork or exec, regain privileges, or use obsolete system calls. A QEMU built without
//! seccomp (or a kernel without it) is refused rather than run unsandboxed: the sandbox is
//! what stands between a guest exploit and the job user's (or a site daemon's) account.
//!
//! `spawn=deny` rules out everything QEMU would start itself: migration `exec:` URIs (restores
//! pass a descriptor instead), the bridge helper (vse runs it, see `netfd`), `-netdev` scripts.

use crate::error::{Result, V2mError};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// The `-sandbox` option value every VM gets.
pub const SANDBOX: &str = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

type Key = (PathBuf, Option<SystemTime>);
static PROBED: Mutex<Option<HashMap<Key, std::result::Result<(), String>>>> = Mutex::new(None);

/// Ok when `binary` starts with the sandbox; probed once per binary (path and mtime).
pub fn check(binary: &Path) -> Result<()> {
    let key = (
        binary.to_path_buf(),
        std::fs::metadata(binary).and_then(|m| m.modified()).ok(),
    );
    let mut guard = PROBED.lock().unwrap_or_else(|p| p.into_inner());
    let verdict = guard
        .get_or_insert_with(HashMap::new)
        .entry(key)
        .or_insert_with(|| probe(binary))
        .clone();
    verdict.map_err(|reason| V2mError::NotAvailable {
        plugin: "qemu",
        reason: format!(
            "{} cannot run with `-sandbox {SANDBOX}` (its seccomp sandbox): {reason} \
             (hint: install a QEMU built with seccomp, such as Debian's qemu-system-x86, on a \
             kernel with CONFIG_SECCOMP_FILTER; vse does not run VMs unsandboxed)",
            binary.display()
        ),
    })
}

/// Starts `binary` with no machine and the sandbox, and quits it over QMP on stdin.
fn probe(binary: &Path) -> std::result::Result<(), String> {
    let mut child = Command::new(binary)
        .args(["-sandbox", SANDBOX, "-machine", "none", "-display", "none"])
        .args(["-nodefaults", "-no-user-config", "-S", "-qmp", "stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start it: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"quit\"}\n");
    }
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("the probe did not finish within 20 s".into());
            }
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    Err(format!("{}: {last}", out.status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_qemu_without_seccomp_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("qemu-no-seccomp");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho \"qemu: -sandbox: There is no option group 'sandbox'\" >&2\nexit 1\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = check(&fake).unwrap_err().to_string();
        assert!(e.contains("no option group 'sandbox'"), "{e}");
        assert!(e.contains("unsandboxed"), "{e}");
    }

    #[test]
    fn the_installed_qemu_runs_sandboxed() {
        testkit::require!(testkit::tool("qemu-system-x86_64"));
        let bin = crate::which::find_binary(Path::new("qemu-system-x86_64")).unwrap();
        check(&bin).unwrap();
    }
}
