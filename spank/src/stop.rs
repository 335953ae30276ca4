//! `vse spank stop`: the end of a step on a node, from `slurm_spank_exit` (as root). By then
//! Slurm has usually killed the step's processes already (its process tracking reaches the
//! node service and QEMU), but a hypervisor that outlived them, or a service that never got
//! its signal, is killed here; then the step's directory goes.

use crate::SpankError;
use crate::proto::PID_FILE;
use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// `<job>.<step>.<node>`: the only names this command will ever delete.
pub(crate) fn is_step_name(dir: &Path) -> bool {
    dir.is_absolute()
        && dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
            let parts: Vec<&str> = n.split('.').collect();
            parts.len() == 3
                && parts
                    .iter()
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
}

/// Pids of live processes with an argument that is `dir` or lies inside it.
pub fn processes_in(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    let inside = format!("{needle}/");
    let me = std::process::id();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && crate::node::alive(pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|b| *b == 0).any(|a| {
                    let a = String::from_utf8_lossy(a);
                    a == needle || a.contains(&inside)
                })
            })
        })
        .collect()
}

/// Kills what is left of the step (service, hypervisor, clients) and removes `dir`.
pub fn stop(dir: &Path) -> Result<(), SpankError> {
    if !is_step_name(dir) {
        return Err(SpankError::Invalid(format!(
            "{}: not a step directory (<run_dir>/<job>.<step>.<node>)",
            dir.display()
        )));
    }
    if !dir.exists() {
        return Ok(());
    }
    let service = std::fs::read_to_string(dir.join(PID_FILE))
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut left = processes_in(dir);
        // The service is named by its pid file too: its command line may not name the
        // directory once it has re-exec'd or been renamed by a debugger.
        if let Some(p) = service.filter(|p| crate::node::alive(*p) && is_service(*p)) {
            left.push(p);
        }
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            return Err(SpankError::Node(format!(
                "processes of step {} survive SIGKILL: {left:?}",
                dir.display()
            )));
        }
        for pid in left {
            // SAFETY: a plain system call; a pid that just went away is harmless (ESRCH).
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        seal(dir).map_err(SpankError::io(format!(
            "taking {} from the job",
            dir.display()
        )))?;
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(SpankError::Io {
            what: format!("removing {}", dir.display()),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Deepest directory nesting [`seal`] follows.
const MAX_DEPTH: usize = 256;

/// Makes every directory of the step root's alone (owner root, mode 0700), top down, each
/// opened without following links: the job's user can add nothing more to it, so the removal
/// that follows ends. (A process of the user that keeps planting entries, from a working
/// directory inside the step, would otherwise keep the step on disk for ever.)
fn seal(dir: &Path) -> std::io::Result<()> {
    seal_fd(open_dir(libc::AT_FDCWD, dir.as_os_str())?, 0)
}

fn seal_fd(fd: OwnedFd, depth: usize) -> std::io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(std::io::Error::other(format!(
            "directories nested deeper than {MAX_DEPTH}"
        )));
    }
    let raw = fd.as_raw_fd();
    // SAFETY: plain system calls on a descriptor this function owns.
    if unsafe { libc::fchown(raw, 0, 0) } != 0 || unsafe { libc::fchmod(raw, 0o700) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The descriptor's own directory, whatever its path names by now.
    for e in std::fs::read_dir(format!("/proc/self/fd/{raw}"))? {
        let e = e?;
        // The entry's own type: a link to a directory is not followed.
        if !e.file_type()?.is_dir() {
            continue;
        }
        match open_dir(raw, &e.file_name()) {
            Ok(sub) => seal_fd(sub, depth + 1)?,
            // Gone, or swapped for something else, since it was listed: nothing to seal.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR)
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `name` under `at`, as a directory and never through a link.
fn open_dir(at: RawFd, name: &OsStr) -> std::io::Result<OwnedFd> {
    let c = CString::new(name.as_bytes())?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `c` is NUL-terminated and outlives the call.
    let fd = unsafe { libc::openat(at, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The pid is a `vse spank node` process (pids are reused).
fn is_service(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
        let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
        args.windows(2).any(|w| w == [&b"spank"[..], &b"node"[..]])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_step_directories_are_touched() {
        assert!(is_step_name(Path::new("/run/vse/spank/12.0.1")));
        for bad in [
            "/",
            "/run",
            "/run/vse/spank",
            "relative/1.2.3",
            "/x/1.2",
            "/x/1.2.3.4",
            "/x/a.b.c",
            "/x/1..3",
        ] {
            assert!(!is_step_name(Path::new(bad)), "{bad}");
            assert!(stop(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn stop_kills_what_names_the_directory_and_removes_it() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("7.0.1");
        let other = root.path().join("7.0.10");
        std::fs::create_dir_all(dir.join("vm")).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        // A process naming a file of the step in its argv, as QEMU names its overlay.
        let named = |d: &Path| {
            use std::os::unix::process::CommandExt;
            std::process::Command::new("sleep")
                .arg0(d.join("vm/x"))
                .arg("600")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        };
        let mut inside = named(&dir);
        // A sibling whose name starts with ours is left alone.
        let mut sibling = named(&other);
        stop(&dir).unwrap();
        assert!(!dir.exists());
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(inside.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(
            sibling.try_wait().unwrap().is_none(),
            "the sibling step was killed"
        );
        assert!(other.exists());
        sibling.kill().unwrap();
        sibling.wait().unwrap();
        // Idempotent.
        stop(&dir).unwrap();
    }

    /// What the job's user made of the step is root's alone before the removal, and a link
    /// to a directory outside the step is not followed.
    #[test]
    fn seal_takes_every_directory_of_the_step_and_follows_no_link() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("VSE_REQUIRE_ALL").is_none(),
                "sealing a step needs root"
            );
            eprintln!("skipped: sealing a step needs root");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let (dir, outside) = (root.path().join("8.0.1"), root.path().join("outside"));
        std::fs::create_dir_all(dir.join("a/b/c")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("a/link")).unwrap();
        for d in [
            &dir,
            &dir.join("a"),
            &dir.join("a/b"),
            &dir.join("a/b/c"),
            &outside,
        ] {
            std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        seal(&dir).unwrap();
        for d in [&dir, &dir.join("a"), &dir.join("a/b"), &dir.join("a/b/c")] {
            let m = std::fs::metadata(d).unwrap();
            assert_eq!(
                (m.uid(), m.gid(), m.mode() & 0o7777),
                (0, 0, 0o700),
                "{}",
                d.display()
            );
        }
        let m = std::fs::metadata(&outside).unwrap();
        assert_eq!(
            (m.uid(), m.mode() & 0o7777),
            (65534, 0o777),
            "the link was followed"
        );
        stop(&dir).unwrap();
        assert!(!dir.exists() && outside.exists());
    }
}
