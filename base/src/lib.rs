//! Whether a directory or file vse is about to trust can be changed by someone else.
//!
//! What vse keeps in a run directory (QEMU's sockets, a VM's profile and metadata), a state
//! database or a cache decides what it boots and whom it talks to. Whoever can write there,
//! or replace a directory on the way to it, can plant a symlink, a socket or a database of
//! their own. So such a place must be owned by this user (the effective uid), writable by
//! nobody else, and every ancestor owned by root or this user and not writable by others
//! unless sticky (`/tmp`: others may add entries there but not replace ours). What vse
//! creates there it creates 0700 / 0600.
//!
//! [`read_input`] reads a file a user named, bounded and only if it is a regular file;
//! [`cache_root`] is where every cache lives.

pub mod account;
pub mod cache;
pub mod cgroup;
pub mod evict;
mod input;
pub mod pipe;
pub mod run;
pub use cache::cache_root;
pub use input::{is_users_path_error, read_input};
pub use run::run_root;

use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a place is refused; the text names it, says what is wrong and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum Unsafe {
    #[error(
        "{what} {}: owned by uid {owner}, not by this user (uid {me}); hint: use a place of your own, or `chown {me} {}`",
        .path.display(), .path.display()
    )]
    Owner {
        what: String,
        path: PathBuf,
        owner: u32,
        me: u32,
    },
    #[error(
        "{what} {}: mode {mode:04o} lets other users write to it; hint: `chmod go-w {}`",
        .path.display(), .path.display()
    )]
    Writable {
        what: String,
        path: PathBuf,
        mode: u32,
    },
    #[error(
        "{what} {}: its parent {} (uid {owner}, mode {mode:04o}) can be changed by another user, who could swap what is in it; hint: use a place under a directory owned by root or you",
        .path.display(), .ancestor.display()
    )]
    Ancestor {
        what: String,
        path: PathBuf,
        ancestor: PathBuf,
        owner: u32,
        mode: u32,
    },
    #[error("{what} {}: {source}", .path.display())]
    Io {
        what: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Unsafe {
    /// The place the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Unsafe::Owner { path, .. }
            | Unsafe::Writable { path, .. }
            | Unsafe::Ancestor { path, .. }
            | Unsafe::Io { path, .. } => path,
        }
    }
}

/// A place others can change is the caller's to fix (or to choose differently): exit code 2.
impl vse_exit::Classify for Unsafe {
    fn kind(&self) -> vse_exit::ErrorKind {
        match self {
            Unsafe::Io { .. } => vse_exit::ErrorKind::Internal,
            _ => vse_exit::ErrorKind::InvalidInput,
        }
    }
}

/// The effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn io(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> Unsafe {
    let (what, path) = (what.to_string(), path.to_path_buf());
    move |source| Unsafe::Io { what, path, source }
}

/// Creates `dir` (0700 for every component it makes) and checks it as [`check_dir`] does.
/// `what` names it in errors ("run directory", "image cache").
pub fn private_dir(dir: &Path, what: &str) -> Result<(), Unsafe> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(what, dir))?;
    check_dir(dir, what)
}

/// `dir` is owned by this user, writable by nobody else, and its ancestors are safe.
pub fn check_dir(dir: &Path, what: &str) -> Result<(), Unsafe> {
    let real = dir.canonicalize().map_err(io(what, dir))?;
    let meta = std::fs::metadata(&real).map_err(io(what, dir))?;
    owned_and_private(&meta, dir, what, &[euid()])?;
    ancestors(&real, dir, what)
}

/// Opens (creating it 0600 if missing) a file only this user (or root, `trust_root`) may
/// have written, read-only when it exists: the file is checked on the descriptor opened, and
/// the directory it is in, and that directory's ancestors, must be safe, so nobody else can
/// replace it after the check (callers that must reopen it by path, like SQLite, rely on
/// that).
pub fn private_file(path: &Path, what: &str, trust_root: bool) -> Result<std::fs::File, Unsafe> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let real_parent = parent.canonicalize().map_err(io(what, path))?;
    let me = euid();
    let owners: &[u32] = if trust_root { &[me, 0] } else { &[me] };
    let dmeta = std::fs::metadata(&real_parent).map_err(io(what, path))?;
    if !owners.contains(&dmeta.uid()) || dmeta.mode() & 0o022 != 0 && dmeta.mode() & 0o1000 == 0 {
        return Err(Unsafe::Ancestor {
            what: what.into(),
            path: path.into(),
            ancestor: real_parent,
            owner: dmeta.uid(),
            mode: dmeta.mode() & 0o7777,
        });
    }
    ancestors(&real_parent, path, what)?;
    let open = |create: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(create)
            .create_new(create)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
    };
    let f = match open(false) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => open(true),
        other => other,
    }
    .map_err(io(what, path))?;
    let meta = f.metadata().map_err(io(what, path))?;
    owned_and_private(&meta, path, what, owners)?;
    Ok(f)
}

fn owned_and_private(
    meta: &std::fs::Metadata,
    path: &Path,
    what: &str,
    owners: &[u32],
) -> Result<(), Unsafe> {
    if !owners.contains(&meta.uid()) {
        return Err(Unsafe::Owner {
            what: what.into(),
            path: path.into(),
            owner: meta.uid(),
            me: euid(),
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(Unsafe::Writable {
            what: what.into(),
            path: path.into(),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
}

/// Every ancestor of `real` (canonical) is owned by root or this user, and not writable by
/// others unless sticky.
fn ancestors(real: &Path, path: &Path, what: &str) -> Result<(), Unsafe> {
    let me = euid();
    for ancestor in real.ancestors().skip(1) {
        let m = std::fs::metadata(ancestor).map_err(io(what, path))?;
        let mode = m.mode() & 0o7777;
        let owner_ok = m.uid() == 0 || m.uid() == me;
        let shared_ok = mode & 0o022 == 0 || mode & 0o1000 != 0;
        if !owner_ok || !shared_ok {
            return Err(Unsafe::Ancestor {
                what: what.into(),
                path: path.into(),
                ancestor: ancestor.to_path_buf(),
                owner: m.uid(),
                mode,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn created_private_and_refused_when_others_may_write() {
        let t = tempfile::tempdir().unwrap();
        let run = t.path().join("a/b");
        private_dir(&run, "run directory").unwrap();
        assert_eq!(mode(&run), 0o700);
        assert_eq!(mode(&t.path().join("a")), 0o700);
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir(&run, "run directory").unwrap_err().to_string();
        assert!(e.contains("run directory") && e.contains("0777"), "{e}");
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
        let parent = t.path().join("a");
        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_dir(&run, "run directory").unwrap_err().to_string();
        assert!(e.contains("its parent"), "{e}");
    }

    #[test]
    fn files_are_created_0600_not_followed_and_checked() {
        let t = tempfile::tempdir().unwrap();
        let db = t.path().join("state.db");
        private_file(&db, "state database", false).unwrap();
        assert_eq!(mode(&db), 0o600);
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = private_file(&db, "state database", false).unwrap_err();
        assert!(matches!(e, Unsafe::Writable { .. }), "{e}");
        let link = t.path().join("link.db");
        std::os::unix::fs::symlink(&db, &link).unwrap();
        let e = private_file(&link, "state database", false).unwrap_err();
        assert!(matches!(e, Unsafe::Io { .. }), "{e}");
    }
}
