//! The spec's and policy's changes on top of the installed packages, in this order: files,
//! groups and users ([`crate::accounts`]), environment, post-install commands,
//! and the policy's required files last (so nothing in the spec can override them). After
//! each post-install command the policy's protected files and forbidden packages are checked
//! again ([`crate::guard`]): a command that broke them fails the build, named.

use crate::deb::{Kind, Meta, PathError, Records, RelPath, path::resolve_dir};
use crate::guard::{Guard, Violation};
use crate::progress::{Event, Progress};
use crate::rootfs::chroot::{ChrootError, RunOptions, base_env, run_in_root};
use crate::rootfs::inroot::InRoot;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum CustomizeError {
    #[error("file {path}: {source}")]
    Path { path: String, source: PathError },
    #[error("file {path}: must be an absolute path inside the image")]
    Relative { path: String },
    #[error("writing {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Chroot(#[from] ChrootError),
    #[error(transparent)]
    Accounts(#[from] crate::accounts::AccountError),
    #[error("before the post-install commands: {0}")]
    Guard(Box<Violation>),
    #[error(
        "post-install command {index} (`{command}`) {violation}; hint: remove the command from the spec, or ask your admin"
    )]
    PolicyViolated {
        /// 1-based, as in the manifest's steps.
        index: usize,
        command: String,
        violation: Box<Violation>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileEntry {
    /// Absolute path in the image.
    pub path: String,
    pub content: Vec<u8>,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

pub use crate::accounts::{GroupEntry, UserEntry};

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Customization {
    pub files: Vec<FileEntry>,
    pub groups: Vec<GroupEntry>,
    pub users: Vec<UserEntry>,
    pub env: BTreeMap<String, String>,
    pub post_install: Vec<String>,
    pub required_files: Vec<FileEntry>,
    /// The policy rules checked again after each post-install command.
    #[serde(default, skip_serializing_if = "Guard::is_empty")]
    pub guard: Guard,
    /// Post-install commands share the host's network (a policy must allow it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_network: bool,
}

impl Customization {
    /// Part of the image's identity: a changed spec is a rebuild even with the same lock.
    pub fn hash(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        format!("sha256:{}", hex::encode(Sha256::digest(json)))
    }

    /// Every step [`Customization::apply`] takes, in order, with the SHA256 of what it writes
    /// or runs (for the manifest); the builder writes the guest agent first.
    pub fn steps(&self, agent_sha256: &str) -> Vec<vse_image::manifest::Step> {
        let sha = |b: &[u8]| hex::encode(Sha256::digest(b));
        let step = |what: String, sha256: String| vse_image::manifest::Step { what, sha256 };
        let file = |f: &FileEntry| {
            let meta = format!("{:o} {}:{}\n", f.mode, f.uid, f.gid);
            sha(&[meta.as_bytes(), &f.content].concat())
        };
        let mut out = vec![step("guest agent".into(), agent_sha256.to_string())];
        out.extend(
            self.files
                .iter()
                .map(|f| step(format!("file {}", f.path), file(f))),
        );
        out.extend(self.groups.iter().map(|g| {
            let json = serde_json::to_vec(g).unwrap_or_default();
            step(format!("group {} gid {}", g.name, g.gid), sha(&json))
        }));
        out.extend(self.users.iter().map(|u| {
            let json = serde_json::to_vec(u).unwrap_or_default();
            step(format!("user {} uid {}", u.name, u.uid), sha(&json))
        }));
        if !self.env.is_empty() {
            let json = serde_json::to_vec(&self.env).unwrap_or_default();
            out.push(step("environment".into(), sha(&json)));
        }
        out.extend(
            self.post_install
                .iter()
                .enumerate()
                .map(|(i, c)| step(format!("post-install {}", i + 1), sha(c.as_bytes()))),
        );
        out.extend(
            self.required_files
                .iter()
                .map(|f| step(format!("policy file {}", f.path), file(f))),
        );
        out
    }

    pub fn apply(
        &self,
        root: &Path,
        records: &mut Records,
        epoch: u64,
        progress: &dyn Progress,
    ) -> Result<(), CustomizeError> {
        for f in &self.files {
            write_file(root, records, f)?;
        }
        let env = base_env(epoch);
        let out = |l: &str| progress.event(Event::ScriptOutput(l.to_string()));
        crate::accounts::apply(root, &self.groups, &self.users, &env, &out)?;
        if !self.env.is_empty() {
            let mut text = String::new();
            for (k, v) in &self.env {
                // Read back by the guest agent for every command it runs.
                let v = v.replace('\\', "\\\\").replace('"', "\\\"");
                text.push_str(&format!("{k}=\"{v}\"\n"));
            }
            write_file(
                root,
                records,
                &FileEntry {
                    path: "/etc/environment".into(),
                    content: text.into_bytes(),
                    mode: 0o644,
                    uid: 0,
                    gid: 0,
                },
            )?;
        }
        self.post_install(root, &env, &out)?;
        for f in &self.required_files {
            write_file(root, records, f)?;
        }
        crate::rootfs::scrub(root);
        Ok(())
    }

    /// Each post-install command in the sandbox, the policy checked again after each.
    fn post_install(
        &self,
        root: &Path,
        env: &[(String, String)],
        out: &dyn Fn(&str),
    ) -> Result<(), CustomizeError> {
        if self.post_install.is_empty() {
            return Ok(());
        }
        let opts = RunOptions {
            allow_network: self.allow_network,
        };
        let image = InRoot::open(root).map_err(|source| CustomizeError::Io {
            path: root.display().to_string(),
            source,
        })?;
        let before = self
            .guard
            .snapshot(&image)
            .map_err(|v| CustomizeError::Guard(Box::new(v)))?;
        for (i, cmd) in self.post_install.iter().enumerate() {
            run_in_root(root, &["/bin/sh", "-ec", cmd], env, &opts, out)?;
            self.guard.check(&image, &before).map_err(|violation| {
                CustomizeError::PolicyViolated {
                    index: i + 1,
                    command: cmd.clone(),
                    violation: Box::new(violation),
                }
            })?;
        }
        Ok(())
    }
}

/// The bytes of `rel`, a spec's `files: source:`, read beneath `dir` through one descriptor:
/// the kernel resolves `rel` from `dir` and refuses any symlink, `..` or absolute path on
/// the way (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), and what is read is the file that was
/// opened. A root build thus copies nothing from outside the spec's directory into an
/// image, whatever its owner swaps in while the build runs.
pub fn read_source(dir: &Path, rel: &str) -> std::io::Result<Vec<u8>> {
    use std::io::{Error, ErrorKind, Read};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let cstr =
        |b: &[u8]| std::ffi::CString::new(b).map_err(|_| Error::from(ErrorKind::InvalidInput));
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let d = cstr(dir.as_os_str().as_bytes())?;
    // SAFETY: open(2) on a valid C string.
    let dfd = unsafe {
        libc::open(
            d.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dfd < 0 {
        return Err(Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let dfd = unsafe { OwnedFd::from_raw_fd(dfd) };
    let name = cstr(rel.as_bytes())?;
    // SAFETY: open_how is plain data; all-zero is its empty value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    // O_NONBLOCK: a FIFO planted in place of the file must not hang the build.
    how.flags = (libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    let fd = loop {
        // SAFETY: openat2(2) with our descriptor, a C string and open_how.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dfd.as_raw_fd(),
                name.as_ptr(),
                &raw const how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: a fresh descriptor we own.
            break unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        }
        let e = Error::last_os_error();
        // The kernel asks for a retry when a rename raced the resolution.
        if e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(match e.raw_os_error() {
                Some(libc::ELOOP) => Error::new(
                    ErrorKind::InvalidInput,
                    "a symlink on the way (a spec's sources are read without following any)",
                ),
                Some(libc::EXDEV) => Error::new(
                    ErrorKind::InvalidInput,
                    "the path leads outside the spec's directory",
                ),
                _ => e,
            });
        }
    };
    let mut f = std::fs::File::from(fd);
    if !f.metadata()?.is_file() {
        return Err(Error::new(ErrorKind::InvalidInput, "not a regular file"));
    }
    let mut out = Vec::new();
    f.read_to_end(&mut out)?;
    Ok(out)
}

/// Writes one file path-safely (symlinks resolve inside the rootfs) and records its owner.
pub fn write_file(root: &Path, records: &mut Records, f: &FileEntry) -> Result<(), CustomizeError> {
    let rel_s = f
        .path
        .strip_prefix('/')
        .ok_or_else(|| CustomizeError::Relative {
            path: f.path.clone(),
        })?;
    let perr = |source| CustomizeError::Path {
        path: f.path.clone(),
        source,
    };
    let rel = RelPath::parse(rel_s.as_bytes()).map_err(perr)?;
    let (parent, name) = rel.split_last().ok_or_else(|| CustomizeError::Relative {
        path: f.path.clone(),
    })?;
    let dir = resolve_dir(root, &parent, true).map_err(perr)?;
    let host = dir.join(name);
    let io = |source| CustomizeError::Io {
        path: f.path.clone(),
        source,
    };
    // Always a new file: what was there may be a symlink, or a file shared with a kept
    // layer (hard links), which must not change.
    if std::fs::symlink_metadata(&host).is_ok_and(|m| !m.is_dir()) {
        std::fs::remove_file(&host).map_err(io)?;
    }
    std::fs::write(&host, &f.content).map_err(io)?;
    std::fs::set_permissions(
        &host,
        std::fs::Permissions::from_mode(f.mode & 0o777 | 0o600),
    )
    .map_err(io)?;
    records.insert(
        rel.image_path(),
        Meta {
            kind: Kind::File,
            perm: f.mode & 0o7777,
            uid: f.uid,
            gid: f.gid,
        },
    );
    Ok(())
}
