//! Choosing KVM or TCG. `/dev/kvm` existing proves nothing (on a nested, software-only KVM a
//! Debian kernel aborts or crawls), so KVM is used only after a functional check: boot the
//! very kernel we are about to run, without a root file system, and wait for it to reach the
//! "cannot mount root" panic within a deadline. The verdict is cached per (QEMU, kernel).

use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
    pub(crate) fn qemu_arg(self, vcpus: u32) -> &'static str {
        match (self, vcpus) {
            (Accel::Kvm, _) => "kvm",
            // One host thread per vCPU: needed for per-vCPU pinning and real parallelism.
            (Accel::Tcg, 2..) => "tcg,thread=multi",
            (Accel::Tcg, _) => "tcg",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccelPolicy {
    /// KVM when the functional check passes, else TCG.
    #[default]
    Auto,
    Kvm,
    Tcg,
}

/// The outcome of the choice: `reason` in words for users, `detail` for `-v` and logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccelChoice {
    pub accel: Accel,
    pub reason: String,
    #[serde(default)]
    pub detail: String,
}

impl AccelChoice {
    /// The line a command prints once when it did not get KVM by its own choice.
    pub fn notice(&self) -> Option<String> {
        (self.accel == Accel::Tcg && self.reason != TCG_REQUESTED)
            .then(|| format!("{}; running under TCG, slower", self.reason))
    }
}

const TCG_REQUESTED: &str = "TCG requested";

/// A functional KVM check's verdict.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KvmVerdict {
    pub usable: bool,
    pub reason: String,
    pub detail: String,
}

#[derive(Serialize, Deserialize)]
struct Cached {
    key: String,
    verdict: KvmVerdict,
}

const DEADLINE: Duration = Duration::from_secs(8);

pub fn choose(policy: AccelPolicy, qemu: &Path, kernel: &Path, cache_dir: &Path) -> AccelChoice {
    match policy {
        AccelPolicy::Tcg => AccelChoice {
            accel: Accel::Tcg,
            reason: TCG_REQUESTED.into(),
            detail: String::new(),
        },
        AccelPolicy::Kvm => AccelChoice {
            accel: Accel::Kvm,
            reason: "KVM requested (no check)".into(),
            detail: String::new(),
        },
        AccelPolicy::Auto => {
            let v = kvm_usable_cached(qemu, kernel, cache_dir);
            AccelChoice {
                accel: if v.usable { Accel::Kvm } else { Accel::Tcg },
                reason: v.reason,
                detail: v.detail,
            }
        }
    }
}

fn cache_key(qemu: &Path, kernel: &Path) -> String {
    let stamp = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| format!("{}:{:?}", m.len(), m.modified().ok()))
            .unwrap_or_default()
    };
    format!(
        "{}|{}|{}|{}",
        qemu.display(),
        stamp(qemu),
        kernel.display(),
        stamp(kernel)
    )
}

fn kvm_usable_cached(qemu: &Path, kernel: &Path, cache_dir: &Path) -> KvmVerdict {
    // A verdict is trusted, and kept, only in a run directory of this user's own (0700).
    if vse_base::private_dir(cache_dir, "VM run directory").is_err() {
        return kvm_usable(qemu, kernel);
    }
    let file = cache_dir.join(".kvm-check.json");
    let key = cache_key(qemu, kernel);
    if let Ok(text) = std::fs::read_to_string(&file)
        && let Ok(c) = serde_json::from_str::<Cached>(&text)
        && c.key == key
    {
        let mut v = c.verdict;
        v.detail = format!("{} (verdict cached in {})", v.detail, file.display());
        return v;
    }
    let verdict = kvm_usable(qemu, kernel);
    // Only a completed check is cached; write via rename so parallel checks never see half a file.
    {
        let tmp = cache_dir.join(format!(".kvm-check.json.{}", std::process::id()));
        let c = Cached {
            key,
            verdict: verdict.clone(),
        };
        if let Ok(text) = serde_json::to_string(&c)
            && std::fs::write(&tmp, text).is_ok()
        {
            let _ = std::fs::rename(&tmp, &file);
        }
    }
    verdict
}

fn unusable(reason: &str, detail: String) -> KvmVerdict {
    KvmVerdict {
        usable: false,
        reason: format!("KVM is not usable here: {reason}"),
        detail,
    }
}

/// Boots `kernel` under KVM with no root device; success = the kernel got to mounting root.
pub fn kvm_usable(qemu: &Path, kernel: &Path) -> KvmVerdict {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        return unusable("/dev/kvm cannot be opened", format!("/dev/kvm: {e}"));
    }
    let child = Command::new(qemu)
        .args([
            "-machine",
            "pc",
            "-accel",
            "kvm",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
        ])
        .args([
            "-no-reboot",
            "-m",
            "128M",
            "-serial",
            "stdio",
            "-append",
            "console=ttyS0 panic=-1",
        ])
        .arg("-kernel")
        .arg(kernel)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            return unusable(
                "the KVM check could not start QEMU",
                format!("{}: {e}", qemu.display()),
            );
        }
    };
    let mut out = child.stdout.take().expect("stdout is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    // A reader thread so the deadline holds even when the guest prints nothing.
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut seen = String::new();
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            if seen.contains("VFS: Unable to mount root") || seen.contains("Kernel panic") {
                let _ = tx.send(true);
                return;
            }
            if seen.len() > 1 << 20 {
                seen.drain(..1 << 19);
            }
        }
        let _ = tx.send(false);
    });
    let start = Instant::now();
    let ok = rx.recv_timeout(DEADLINE).unwrap_or(false);
    let _ = child.kill();
    let status = child.wait();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let exit = match status {
        Ok(s) => describe_exit(s),
        Err(e) => format!("not reaped: {e}"),
    };
    if ok {
        return KvmVerdict {
            usable: true,
            reason: "KVM works".into(),
            detail: format!(
                "KVM booted {} in {:.1} s",
                kernel.display(),
                start.elapsed().as_secs_f64()
            ),
        };
    }
    let last = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_string();
    let why = if last.is_empty() || last.contains("terminating on signal") {
        format!("the kernel did not finish booting within {DEADLINE:?}")
    } else {
        last
    };
    unusable(
        "a test boot under KVM failed",
        format!("KVM functional check: {why}; QEMU {exit}"),
    )
}

fn describe_exit(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(sig)) => format!("was stopped by signal {sig}"),
        _ => "ended".into(),
    }
}
