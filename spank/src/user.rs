//! Acting as the job's user. The node service starts as root (slurmstepd's privileges), and
//! whatever the user named is read with the user's own: an image by a service that has
//! dropped to the user for good, a spec and the user's policies by a child process running
//! as the user (the service then builds from its own copies, as root).

use crate::{ReadArgs, SpankError};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobUser {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

fn os_err(what: &str) -> SpankError {
    SpankError::Io {
        what: what.into(),
        source: std::io::Error::last_os_error(),
    }
}

impl JobUser {
    pub fn new(uid: u32, gid: u32, groups: &str) -> Result<Self, SpankError> {
        let groups = groups
            .split(',')
            .filter(|g| !g.is_empty())
            .map(|g| {
                g.parse()
                    .map_err(|_| SpankError::Invalid(format!("--groups: bad group id {g:?}")))
            })
            .collect::<Result<Vec<u32>, _>>()?;
        Ok(JobUser { uid, gid, groups })
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Drops this process to the user for good (glibc applies it to every thread).
    pub fn become_user(&self) -> Result<(), SpankError> {
        if self.is_root() {
            return Ok(());
        }
        // SAFETY: plain system calls on plain integers; `groups` outlives the call.
        unsafe {
            if libc::setgroups(self.groups.len(), self.groups.as_ptr()) != 0 {
                return Err(os_err("setgroups"));
            }
            if libc::setgid(self.gid) != 0 {
                return Err(os_err("setgid"));
            }
            if libc::setuid(self.uid) != 0 {
                return Err(os_err("setuid"));
            }
            // Root must be out of reach for good.
            if libc::setuid(0) == 0 {
                return Err(SpankError::Node("could not drop root privileges".into()));
            }
        }
        Ok(())
    }

    /// `f` on a thread of its own whose file-system ids and groups are the user's: what it
    /// opens is what the user could open, and the descriptors outlive the thread (with its
    /// credentials). The rest of the process keeps root's.
    pub fn as_user<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, SpankError> {
        if self.is_root() {
            return Ok(f());
        }
        let (uid, gid, groups) = (self.uid, self.gid, &self.groups);
        std::thread::scope(|s| {
            s.spawn(move || {
                // Raw system calls: glibc's setgroups would change every thread's groups;
                // these change only this thread's, which ends with the scope.
                // SAFETY: plain system calls on integers and a live slice of gid_t.
                unsafe {
                    let n = groups.len();
                    if libc::syscall(libc::SYS_setgroups, n, groups.as_ptr()) != 0 {
                        return Err(os_err("setgroups (this thread)"));
                    }
                    libc::syscall(libc::SYS_setfsgid, gid);
                    libc::syscall(libc::SYS_setfsuid, uid);
                    // Each returns the previous id: asking again shows whether it took.
                    let fsuid = libc::syscall(libc::SYS_setfsuid, u32::MAX);
                    let fsgid = libc::syscall(libc::SYS_setfsgid, u32::MAX);
                    if fsuid != i64::from(uid) || fsgid != i64::from(gid) {
                        return Err(SpankError::Node(
                            "could not take the job user's file-system ids".into(),
                        ));
                    }
                }
                Ok(f())
            })
            .join()
            .map_err(|_| SpankError::Node("the thread acting as the job user panicked".into()))?
        })
    }

    /// The texts of `files`, read by `exe spank read` running as the user.
    pub fn read_files(&self, exe: &Path, files: &[PathBuf]) -> Result<Vec<String>, SpankError> {
        let mut cmd = Command::new(exe);
        cmd.args(["spank", "read", "--"])
            .args(files)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !self.is_root() {
            vse_base::account::exec_as_ids(&mut cmd, self.uid, self.gid, self.groups.clone());
        }
        let out = cmd.output().map_err(SpankError::io(format!(
            "running {} spank read",
            exe.display()
        )))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let msg = err.trim().trim_start_matches("error: ");
            return Err(SpankError::Invalid(msg.to_string()));
        }
        serde_json::from_slice(&out.stdout)
            .map_err(|e| SpankError::Node(format!("reading the user's files: {e}")))
    }
}

/// `vse spank read`: the files as one JSON array of strings, each at most `max_bytes`.
pub fn read_here(a: &ReadArgs) -> Result<String, SpankError> {
    let mut texts = Vec::new();
    for f in &a.files {
        let cant =
            |e: std::io::Error| SpankError::Invalid(format!("cannot read {}: {e}", f.display()));
        let mut text = String::new();
        let n = std::fs::File::open(f)
            .and_then(|h| h.take(a.max_bytes + 1).read_to_string(&mut text))
            .map_err(cant)?;
        if n as u64 > a.max_bytes {
            return Err(SpankError::Invalid(format!(
                "{}: larger than {} bytes",
                f.display(),
                a.max_bytes
            )));
        }
        texts.push(text);
    }
    serde_json::to_string(&texts).map_err(|e| SpankError::Node(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_parse() {
        assert_eq!(JobUser::new(5, 6, "").unwrap().groups, Vec::<u32>::new());
        assert_eq!(JobUser::new(5, 6, "1,2").unwrap().groups, vec![1, 2]);
        assert!(JobUser::new(5, 6, "x").is_err());
    }

    #[test]
    fn read_refuses_large_and_missing_files() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("a.yaml");
        std::fs::write(&f, "0123456789").unwrap();
        let ok = read_here(&ReadArgs {
            max_bytes: 10,
            files: vec![f.clone()],
        })
        .unwrap();
        assert_eq!(ok, "[\"0123456789\"]");
        let big = read_here(&ReadArgs {
            max_bytes: 9,
            files: vec![f],
        });
        assert!(big.unwrap_err().to_string().contains("larger than 9"));
        let missing = read_here(&ReadArgs {
            max_bytes: 9,
            files: vec![d.path().join("nope")],
        });
        assert!(missing.unwrap_err().to_string().contains("cannot read"));
    }
}
