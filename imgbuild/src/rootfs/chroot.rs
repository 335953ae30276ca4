//! Running a command inside the rootfs, in the sandbox of [`super::sandbox`] (user, PID,
//! network, IPC, UTS and mount namespaces, `pivot_root` into the image, a minimal `/dev`,
//! bounded capabilities, `no_new_privs`). The namespaces die with the command on every path
//! (success, error, kill): nothing is ever left mounted on the host, and no process the
//! command started outlives it.
//!
//! As root, the sandbox's root is an unprivileged host id range over an idmapped mount of the
//! image; in a rootless build's user namespace, that namespace's own ids. A process that is
//! neither maps only its own uid to 0 (files a script chowns to another user then fail).

use super::sandbox::{Prep, PrepError};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
pub enum ChrootError {
    #[error(
        "cannot start {what} in the rootfs sandbox: {source}; hint: the sandbox needs user namespaces (sysctl user.max_user_namespaces > 0) and, when building as root, a file system that supports idmapped mounts (ext4, xfs, btrfs, tmpfs) for the build directory"
    )]
    Spawn {
        what: String,
        source: std::io::Error,
    },
    #[error("cannot prepare the rootfs sandbox for {what}: {source}")]
    Prepare {
        what: String,
        source: Box<PrepError>,
    },
    #[error("{what} failed in the rootfs ({status}); last output:\n{tail}{hint}")]
    Failed {
        what: String,
        status: String,
        tail: String,
        hint: &'static str,
    },
}

/// The environment every command in the rootfs gets (nothing from the host leaks in).
pub fn base_env(epoch: u64) -> Vec<(String, String)> {
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", "/root"),
        ("LC_ALL", "C"),
        ("DEBIAN_FRONTEND", "noninteractive"),
        ("DEBCONF_NONINTERACTIVE_SEEN", "true"),
        // Kernel postinst hooks: the builder makes its own initramfs.
        ("INITRD", "No"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([("SOURCE_DATE_EPOCH".to_string(), epoch.to_string())])
    .collect()
}

/// How the sandbox of [`run_in_root`] may differ from its default (no network).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Share the host's network namespace instead of a loopback-only one of its own. Only
    /// when the policy allows it: packages come from local `.deb`s, so dpkg and apt need none.
    pub allow_network: bool,
}

/// Runs `argv` inside `root`, sandboxed; each output line goes to `on_line`.
pub fn run_in_root(
    root: &Path,
    argv: &[&str],
    env: &[(String, String)],
    opts: &RunOptions,
    on_line: &dyn Fn(&str),
) -> Result<(), ChrootError> {
    let what = argv.join(" ");
    let prep = Prep::new(root, opts.allow_network).map_err(|e| ChrootError::Prepare {
        what: what.clone(),
        source: Box::new(e),
    })?;
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure only makes raw syscalls on buffers prepared before fork.
    unsafe {
        cmd.pre_exec(move || prep.enter());
    }
    let mut child = cmd.spawn().map_err(|source| ChrootError::Spawn {
        what: what.clone(),
        source,
    })?;
    let stderr = child.stderr.take().expect("piped");
    let err_thread = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    let mut tail: Vec<String> = Vec::new();
    for line in BufReader::new(child.stdout.take().expect("piped"))
        .lines()
        .map_while(Result::ok)
    {
        on_line(&line);
        tail.push(line);
    }
    let errs = err_thread.join().unwrap_or_default();
    for l in &errs {
        on_line(l);
    }
    tail.extend(errs);
    let status = child.wait().map_err(|source| ChrootError::Spawn {
        what: what.clone(),
        source,
    })?;
    if !status.success() {
        let start = tail.len().saturating_sub(20);
        return Err(ChrootError::Failed {
            what,
            status: status.to_string(),
            tail: tail[start..].join("\n"),
            // SAFETY: geteuid cannot fail.
            hint: if unsafe { libc::geteuid() } != 0 {
                UNPRIVILEGED_HINT
            } else {
                ""
            },
        });
    }
    Ok(())
}

/// Why a maintainer script may fail only when run outside a build's id range.
const UNPRIVILEGED_HINT: &str = "\nhint: this process is not root and not in a rootless build's \
user namespace, so only its own uid is mapped into the rootfs and maintainer scripts that chown \
to system users or groups (base-files, passwd, …) fail; `vse build` as an ordinary user maps its \
subordinate ids (/etc/subuid, /etc/subgid) instead.";
