//! Running a command inside the rootfs.
//!
//! The child enters a private mount namespace, mounts `/proc` and binds `/dev` into the
//! rootfs, then `chroot`s. The mounts live only in that namespace, so they disappear with the
//! child on every path (success, error, kill): nothing is ever left mounted on the host.
//!
//! Modes: as root, a mount namespace is enough. As another user, the child first enters a
//! new user namespace mapping itself to uid/gid 0 (a single-id map: files a script chowns to
//! another user fail; the spec's ownerships are applied by the image writer instead, which
//! needs no privilege), and binds the host's `/proc` (a fresh procfs needs a PID namespace
//! of its own).

use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
pub enum ChrootError {
    #[error("cannot start {what} in the rootfs: {source}")]
    Spawn {
        what: String,
        source: std::io::Error,
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

/// Runs `argv` chrooted into `root`; each output line goes to `on_line`.
pub fn run_in_root(
    root: &Path,
    argv: &[&str],
    env: &[(String, String)],
    on_line: &dyn Fn(&str),
) -> Result<(), ChrootError> {
    let what = argv.join(" ");
    let prep = Prep::new(root);
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

/// Why a maintainer script may fail only when building as a normal user.
const UNPRIVILEGED_HINT: &str = "\nhint: as a non-root user the build maps only your own uid into the \
rootfs, so maintainer scripts that chown to system users or groups (base-files, passwd, …) fail; \
build as root (e.g. in the batch system's prolog). Subordinate-id mapping (newuidmap) is not \
implemented yet.";

/// Everything the forked child needs, allocated before fork.
struct Prep {
    root: CString,
    proc_: CString,
    dev: CString,
    slash: CString,
    proc_fs: CString,
    host_dev: CString,
    host_proc: CString,
    uid_map: Option<(Vec<u8>, Vec<u8>)>,
}

impl Prep {
    fn new(root: &Path) -> Self {
        let c = |p: PathBuf| CString::new(p.as_os_str().as_bytes()).unwrap_or_default();
        // SAFETY: geteuid/getegid cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Prep {
            root: c(root.to_path_buf()),
            proc_: c(root.join("proc")),
            dev: c(root.join("dev")),
            slash: CString::new("/").unwrap_or_default(),
            proc_fs: CString::new("proc").unwrap_or_default(),
            host_dev: CString::new("/dev").unwrap_or_default(),
            host_proc: CString::new("/proc").unwrap_or_default(),
            uid_map: (uid != 0).then(|| {
                (
                    format!("0 {uid} 1\n").into_bytes(),
                    format!("0 {gid} 1\n").into_bytes(),
                )
            }),
        }
    }

    /// Runs in the child between fork and exec.
    fn enter(&self) -> std::io::Result<()> {
        let check = |r: libc::c_int| {
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        // SAFETY: plain syscalls on NUL-terminated buffers owned by `self`.
        unsafe {
            if let Some((umap, gmap)) = &self.uid_map {
                check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS))?;
                write_file(c"/proc/self/setgroups", b"deny")?;
                write_file(c"/proc/self/uid_map", umap)?;
                write_file(c"/proc/self/gid_map", gmap)?;
            } else {
                check(libc::unshare(libc::CLONE_NEWNS))?;
            }
            let null = std::ptr::null();
            check(libc::mount(
                null,
                self.slash.as_ptr(),
                null,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            libc::mkdir(self.proc_.as_ptr(), 0o755);
            libc::mkdir(self.dev.as_ptr(), 0o755);
            if self.uid_map.is_some() {
                // A new procfs may only be mounted by the owner of a PID namespace; a
                // recursive bind of the host's /proc is what an unprivileged user may do.
                check(libc::mount(
                    self.host_proc.as_ptr(),
                    self.proc_.as_ptr(),
                    null,
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
            } else {
                check(libc::mount(
                    self.proc_fs.as_ptr(),
                    self.proc_.as_ptr(),
                    self.proc_fs.as_ptr(),
                    0,
                    std::ptr::null(),
                ))?;
            }
            check(libc::mount(
                self.host_dev.as_ptr(),
                self.dev.as_ptr(),
                null,
                libc::MS_BIND | libc::MS_REC,
                std::ptr::null(),
            ))?;
            check(libc::chroot(self.root.as_ptr()))?;
            check(libc::chdir(self.slash.as_ptr()))?;
        }
        Ok(())
    }
}

/// SAFETY: async-signal-safe (open/write/close only).
unsafe fn write_file(path: &std::ffi::CStr, data: &[u8]) -> std::io::Result<()> {
    // SAFETY: valid C string and buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        libc::close(fd);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
