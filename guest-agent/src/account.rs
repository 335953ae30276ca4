//! The job's user inside the guest: its account is taken from the host when a command is
//! asked for, added to the image's `/etc/passwd` and `/etc/group` when the image lacks it,
//! and its home made; the command then runs with the user's ids, never as the agent's root.

use crate::protocol::GuestUser;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Component, Path};
use std::process::Command;
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error("invalid {what} {value:?} for the guest account (expected {expected})")]
    Invalid {
        what: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error(
        "the image's account {name:?} has uid {image_uid}, the job user's is {uid}: \
         rename the image's account or drop it from the spec's users"
    )]
    NameTaken {
        name: String,
        image_uid: u32,
        uid: u32,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

/// Account files are edited by one exec at a time (several may start at once).
static EDIT: Mutex<()> = Mutex::new(());

fn name_ok(s: &str) -> bool {
    (1..=32).contains(&s.len())
        && s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

fn home_ok(s: &str) -> bool {
    let p = Path::new(s);
    p.is_absolute()
        && !s.contains([':', '\n', '\0'])
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

fn validate(u: &GuestUser) -> Result<(), AccountError> {
    let bad = |what, value: &str, expected| AccountError::Invalid {
        what,
        value: value.to_string(),
        expected,
    };
    const NAME: &str = "a letter or _, then letters, digits, _ . -, at most 32";
    if !name_ok(&u.name) {
        return Err(bad("user name", &u.name, NAME));
    }
    if !name_ok(&u.group) {
        return Err(bad("group name", &u.group, NAME));
    }
    if !home_ok(&u.home) {
        return Err(bad("home", &u.home, "an absolute path without `..` or `:`"));
    }
    Ok(())
}

/// `(name, id)` of each entry of a passwd or group file.
fn entries(text: &str) -> impl Iterator<Item = (&str, Option<u32>)> {
    text.lines().filter_map(|l| {
        let mut f = l.split(':');
        let name = f.next().filter(|n| !n.is_empty())?;
        Some((name, f.nth(1).and_then(|id| id.parse().ok())))
    })
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> AccountError + '_ {
    move |source| AccountError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Appends `line` to the file at `path` (written whole to a temporary file, then renamed, so
/// a reader never sees half of it), keeping its mode.
fn append(path: &Path, text: &str, line: &str) -> Result<(), AccountError> {
    let mode = std::fs::metadata(path).map_or(0o644, |m| m.permissions().mode() & 0o7777);
    let mut out = text.to_string();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(line);
    out.push('\n');
    let tmp = path.with_extension("vse-tmp");
    std::fs::write(&tmp, out)
        .and_then(|_| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)))
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(io_err(path))
}

/// Makes sure the guest under `root` knows `u`: its uid in `etc/passwd` (added when missing;
/// an image entry with that uid is kept), its group in `etc/group`, and its home directory
/// (made the user's, mode 0700, when missing).
pub fn ensure(root: &Path, u: &GuestUser) -> Result<(), AccountError> {
    validate(u)?;
    let _one = EDIT.lock().unwrap_or_else(|e| e.into_inner());
    let passwd = root.join("etc/passwd");
    let text = std::fs::read_to_string(&passwd).unwrap_or_default();
    if !entries(&text).any(|(_, id)| id == Some(u.uid)) {
        if let Some((_, Some(image_uid))) = entries(&text).find(|(n, _)| *n == u.name) {
            return Err(AccountError::NameTaken {
                name: u.name.clone(),
                image_uid,
                uid: u.uid,
            });
        }
        let line = format!(
            "{}:x:{}:{}:vse job user:{}:/bin/sh",
            u.name, u.uid, u.gid, u.home
        );
        append(&passwd, &text, &line)?;
    }
    let group = root.join("etc/group");
    let text = std::fs::read_to_string(&group).unwrap_or_default();
    if !entries(&text).any(|(_, id)| id == Some(u.gid)) {
        // The host's name when the image does not use it for another group.
        let name = if entries(&text).any(|(n, _)| n == u.group) {
            format!("vse-{}", u.gid)
        } else {
            u.group.clone()
        };
        append(&group, &text, &format!("{name}:x:{}:", u.gid))?;
    }
    let home = root.join(u.home.trim_start_matches('/'));
    if !home.exists() {
        if let Some(parent) = home.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(io_err(parent))?;
        }
        // lchown: a link the user's earlier commands swapped in (where the home's parent is
        // theirs to write) changes hands itself, never what it points to.
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&home)
            .and_then(|_| std::os::unix::fs::lchown(&home, Some(u.uid), Some(u.gid)))
            .map_err(io_err(&home))?;
    }
    Ok(())
}

/// Starts `cmd` as `u`: its supplementary groups, group and user id (in that order: dropping
/// the user id first would forbid the others), and the variables a login would set.
pub fn run_as(cmd: &mut Command, u: &GuestUser) {
    cmd.env("HOME", &u.home)
        .env("USER", &u.name)
        .env("LOGNAME", &u.name);
    let (uid, gid, groups) = (u.uid, u.gid, u.groups.clone());
    // SAFETY: the closure runs in the child between fork and exec and only makes the
    // async-signal-safe calls geteuid, getuid, getgid, setgroups, setgid and setuid on data owned by the closure.
    unsafe {
        cmd.pre_exec(move || {
            // An agent that is not root (the host-side tests) can only run as itself.
            if libc::geteuid() != 0 {
                return if libc::getuid() == uid && libc::getgid() == gid {
                    Ok(())
                } else {
                    Err(io::Error::from_raw_os_error(libc::EPERM))
                };
            }
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(uid: u32, name: &str, home: &str) -> GuestUser {
        GuestUser {
            uid,
            gid: uid,
            groups: vec![uid, 27],
            name: name.into(),
            group: name.into(),
            home: home.into(),
        }
    }

    fn image() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("etc")).unwrap();
        std::fs::write(
            t.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/bash\ndebian:x:1000:1000::/home/debian:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(t.path().join("etc/group"), "root:x:0:\nalice:x:1000:\n").unwrap();
        t
    }

    #[test]
    fn a_missing_account_is_added_with_its_home_and_a_present_one_kept() {
        let t = image();
        let home = t.path().join("home/alice").display().to_string();
        let rel = "/home/alice";
        // Not root, the test can only give the home to itself.
        // SAFETY: geteuid(2) cannot fail.
        let uid = match unsafe { libc::geteuid() } {
            0 => 1234,
            me => me,
        };
        ensure(t.path(), &user(uid, "alice", rel)).unwrap();
        // Twice: nothing added again.
        ensure(t.path(), &user(uid, "alice", rel)).unwrap();
        let passwd = std::fs::read_to_string(t.path().join("etc/passwd")).unwrap();
        assert_eq!(
            passwd.lines().last().unwrap(),
            format!("alice:x:{uid}:{uid}:vse job user:/home/alice:/bin/sh")
        );
        assert_eq!(passwd.lines().count(), 3);
        // The image's `alice` group has another gid: the job's gets its own name.
        let group = std::fs::read_to_string(t.path().join("etc/group")).unwrap();
        assert!(group.ends_with(&format!("vse-{uid}:x:{uid}:\n")), "{group}");
        let m = std::fs::metadata(&home).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o700);
        // uid 1000 is the image's `debian`: kept as the image has it.
        ensure(t.path(), &user(1000, "bob", "/home/bob")).unwrap();
        let again = std::fs::read_to_string(t.path().join("etc/passwd")).unwrap();
        assert!(!again.contains("bob:"), "{again}");
    }

    #[test]
    fn names_and_homes_that_would_corrupt_the_files_are_refused() {
        let t = image();
        for (name, home) in [
            ("ev:il", "/home/x"),
            ("x\nroot", "/home/x"),
            ("", "/home/x"),
            ("ok", "relative"),
            ("ok", "/home/../etc"),
            ("ok", "/home/a:b"),
        ] {
            let e = ensure(t.path(), &user(4321, name, home)).unwrap_err();
            assert!(
                matches!(e, AccountError::Invalid { .. }),
                "{name:?} {home:?}: {e}"
            );
        }
        let e = ensure(t.path(), &user(4321, "debian", "/home/debian")).unwrap_err();
        assert!(
            matches!(
                e,
                AccountError::NameTaken {
                    image_uid: 1000,
                    ..
                }
            ),
            "{e}"
        );
        let passwd = std::fs::read_to_string(t.path().join("etc/passwd")).unwrap();
        assert_eq!(passwd.lines().count(), 2, "{passwd}");
    }
}
