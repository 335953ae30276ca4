//! Running a test's attack as an ordinary user: the accounts of `.ci/tester-up.sh`
//! (`vse-tester`, the attacker or job user; `vse-other`, another user of the site). The test
//! process is root; each command it gives a [`Tester`] runs with the account's uid, gid and
//! groups only, no capabilities, a clean environment and its own `VSE_CACHE`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// An ordinary account of the test machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tester {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

/// The attacker / job user, or None after "skipped: …" (a failure under `VSE_REQUIRE_ALL=1`).
#[track_caller]
pub fn tester() -> Option<Tester> {
    account("vse-tester")
}

/// A second ordinary user (for "another user's job" cases), as [`tester`].
#[track_caller]
pub fn other() -> Option<Tester> {
    account("vse-other")
}

#[track_caller]
fn account(name: &str) -> Option<Tester> {
    if !crate::require(
        crate::is_root(),
        "root (to act as an ordinary account)",
        "run the tests as root",
    ) {
        return None;
    }
    let t = lookup(name);
    crate::require(
        t.is_some(),
        &format!("the ordinary test account {name}"),
        "bash .ci/tester-up.sh",
    );
    t
}

fn lookup(name: &str) -> Option<Tester> {
    let out = Command::new("getent")
        .args(["passwd", name])
        .output()
        .ok()?;
    let line = String::from_utf8(out.stdout).ok()?;
    let f: Vec<&str> = line.trim_end().split(':').collect();
    if f.len() < 7 {
        return None;
    }
    Some(Tester {
        name: name.to_string(),
        uid: f[2].parse().ok()?,
        gid: f[3].parse().ok()?,
        home: PathBuf::from(f[5]),
    })
}

impl Tester {
    /// `program` as this account: real and effective ids are the account's, its only group is
    /// its own, no capability survives (set-user-id binaries still work as for any user), the
    /// environment holds only `PATH`, `HOME`, `USER`, `LOGNAME`, `LANG`, `TMPDIR` and a
    /// `VSE_CACHE` of its own (`~/.cache/vse`). Add variables with `.env(…)`.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("HOME", &self.home)
            .env("USER", &self.name)
            .env("LOGNAME", &self.name)
            .env("LANG", "C.UTF-8")
            .env("TMPDIR", "/tmp")
            .env("VSE_CACHE", self.home.join(".cache/vse"))
            .current_dir(&self.home);
        let (uid, gid) = (self.uid, self.gid);
        // SAFETY: only async-signal-safe system calls between fork and exec; `gid` is copied.
        unsafe {
            c.pre_exec(move || {
                let groups = [gid];
                if libc::setgroups(1, groups.as_ptr()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        c
    }

    /// `program` as this account (as [`command`](Self::command)) under a site directory as users
    /// meet it: in a private mount namespace, `etc` (a root-owned tree such as
    /// `vse/policy.d/…`) is laid over `/etc`, so the site is root's and only root could move it,
    /// while the host's `/etc` and `VSE_SITE_DIR` stay untouched. Needs `unshare` and `setpriv`.
    pub fn command_under_site(&self, etc: &Path, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mount = format!(
            "mount -t overlay overlay -o lowerdir={}:/etc /etc && exec setpriv --reuid={} \
             --regid={} --clear-groups -- \"$@\"",
            etc.display(),
            self.uid,
            self.gid
        );
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(mount)
            .arg("sh")
            .arg(program)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &self.home)
            .env("USER", &self.name)
            .env("LANG", "C.UTF-8")
            .env("VSE_CACHE", self.home.join(".cache/vse"))
            .current_dir(&self.home);
        c
    }

    /// A root-owned (0755) tree to lay over `/etc` with [`command_under_site`](Self::command_under_site):
    /// `vse/policy.d/10-site.policy.yaml` holding `site`, and
    /// `vse/partition.d/<name>.policy.yaml` for each of `partitions`.
    pub fn etc_site(site: &str, partitions: &[(&str, &str)]) -> tempfile::TempDir {
        let t = tempfile::tempdir().expect("a temporary directory");
        std::fs::set_permissions(
            t.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod the site tree");
        let vse = t.path().join("vse");
        let write = |p: PathBuf, text: &str| {
            std::fs::create_dir_all(p.parent().expect("a parent")).expect("mkdir");
            std::fs::write(&p, text).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
        };
        write(vse.join("policy.d/10-site.policy.yaml"), site);
        for (name, text) in partitions {
            write(vse.join(format!("partition.d/{name}.policy.yaml")), text);
        }
        t
    }

    /// A fresh directory under `/tmp` owned by this account (mode 0700), removed on drop.
    pub fn scratch(&self, tag: &str) -> tempfile::TempDir {
        let d = crate::short_tempdir(tag);
        self.chown(d.path());
        std::fs::set_permissions(
            d.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .expect("chmod the scratch directory");
        d
    }

    /// Hands `path` (not following a symlink) to this account.
    pub fn chown(&self, path: &Path) {
        std::os::unix::fs::lchown(path, Some(self.uid), Some(self.gid))
            .unwrap_or_else(|e| panic!("chown {} to {}: {e}", path.display(), self.name));
    }

    /// Writes `text` into `path` as root, then hands the file to this account.
    pub fn write(&self, path: &Path, text: impl AsRef<[u8]>) {
        std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        self.chown(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_run_without_root() {
        let Some(t) = tester() else { return };
        let o = t
            .command("sh")
            .args(["-c", "id -u; id -G; grep CapEff /proc/self/status"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{o:?}");
        let s = String::from_utf8_lossy(&o.stdout);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], t.uid.to_string());
        assert_eq!(lines[1], t.gid.to_string(), "only its own group");
        assert!(lines[2].ends_with("0000000000000000"), "{}", lines[2]);
        let d = t.scratch("unpriv");
        let o = t.command("touch").arg(d.path().join("f")).status().unwrap();
        assert!(o.success());
        let o = t.command("touch").arg("/root/vse-tester-was-here").status();
        assert!(
            !o.unwrap().success(),
            "the account must not write root's home"
        );
    }
}
