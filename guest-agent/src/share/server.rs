//! The host side of a share: answers a guest's file operations inside one host directory, as
//! the process's own user (the job's: the node service or `vse run` runs as the user, so the
//! kernel checks every access, and a guest's root writes as the user, never as root).
//!
//! The guest names files by paths relative to the share's root. Each path is walked by the
//! kernel with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` from
//! the root's descriptor, and the last component is acted on with `*at` calls that do not
//! follow it: no `..`, symlink (the guest's own, made a moment ago, included) or rename race
//! leads outside the root. Symlinks are the guest's to follow, in the guest's namespace.

use super::proto::{
    Attr, DirEntry, FsOp, FsResult, FsStat, Kind, MAX_DIR_ENTRIES, MAX_IO, SetTime,
};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// One shared host directory.
pub struct HostShare {
    root: OwnedFd,
    ro: bool,
    path: PathBuf,
}

impl HostShare {
    /// Opens `path` (a canonical path: a symlink anywhere on it is refused, so what was
    /// checked against the site's policy is what is served).
    pub fn open(path: &Path, ro: bool) -> io::Result<Self> {
        let c = cstr(path.as_os_str().as_encoded_bytes())?;
        let how = how(
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
        );
        let root = openat2(libc::AT_FDCWD, &c, &how)?;
        Ok(HostShare {
            root,
            ro,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Answers one operation. `retry`: the guest sent it before, to a host end that may have
    /// done it without the answer reaching the guest (a migration cut the channel), so "it
    /// exists" after a create and "it is gone" after a remove count as done.
    /// Answers one operation; `data` is its payload (a write's), and the answer's payload
    /// (a read's data, a link's target) comes back with it. `retry`: the guest sent it
    /// before, to a host end that may have done it without the answer reaching the guest (a
    /// migration cut the channel), so "it exists" after a create and "it is gone" after a
    /// remove count as done.
    pub fn handle(&self, op: &FsOp, data: &[u8], retry: bool) -> (FsResult, Vec<u8>) {
        if self.ro && op.writes() {
            return (FsResult::Err { errno: libc::EROFS }, Vec::new());
        }
        let mut out = Vec::new();
        let r = match self.run(op, data, &mut out) {
            Err(e) if retry => self.after_retry(op, e),
            r => r.unwrap_or_else(|e| FsResult::Err {
                errno: e.raw_os_error().unwrap_or(libc::EIO),
            }),
        };
        if !matches!(r, FsResult::Data) {
            out.clear();
        }
        (r, out)
    }

    fn after_retry(&self, op: &FsOp, e: io::Error) -> FsResult {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        let done = match (op, errno) {
            (
                FsOp::Mkdir { path, .. }
                | FsOp::Create { path, .. }
                | FsOp::Symlink { path, .. }
                | FsOp::Link { to: path, .. },
                libc::EEXIST,
            ) => return self.stat(path).unwrap_or(FsResult::Err { errno }),
            (FsOp::Unlink { .. } | FsOp::Rmdir { .. }, libc::ENOENT) => true,
            (FsOp::Rename { to, .. }, libc::ENOENT) => self.stat(to).is_ok(),
            _ => false,
        };
        if done {
            FsResult::Done
        } else {
            FsResult::Err { errno }
        }
    }

    fn run(&self, op: &FsOp, data: &[u8], out: &mut Vec<u8>) -> io::Result<FsResult> {
        match op {
            FsOp::Stat { path } => self.stat(path),
            FsOp::Setattr {
                path,
                mode,
                size,
                atime,
                mtime,
            } => self.setattr(path, *mode, *size, *atime, *mtime),
            FsOp::Readlink { path } => {
                let (dir, name) = self.parent(path)?;
                let mut buf = vec![0u8; libc::PATH_MAX as usize];
                // SAFETY: `buf` is writable for its length; `name` is a C string.
                let n = unsafe {
                    libc::readlinkat(
                        dir.as_raw_fd(),
                        name.as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    )
                };
                let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
                buf.truncate(n);
                *out = buf;
                Ok(FsResult::Data)
            }
            FsOp::Readdir { path, from } => self.readdir(path, *from),
            FsOp::Mkdir { path, mode } => {
                let (dir, name) = self.parent(path)?;
                // SAFETY: valid descriptor and C string.
                check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), *mode & 0o7777) })?;
                self.stat(path)
            }
            FsOp::Create { path, mode, excl } => {
                let (dir, name) = self.parent(path)?;
                let mut flags = libc::O_CREAT | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
                if *excl {
                    flags |= libc::O_EXCL;
                }
                // SAFETY: valid descriptor and C string; the descriptor is owned at once.
                let fd =
                    unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, *mode & 0o7777) };
                check(fd)?;
                // SAFETY: `fd` was just opened and is owned by no one else.
                drop(unsafe { OwnedFd::from_raw_fd(fd) });
                self.stat(path)
            }
            FsOp::Symlink { path, target } => {
                let (dir, name) = self.parent(path)?;
                let t = cstr(target.as_bytes())?;
                // SAFETY: valid descriptor and C strings.
                check(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })?;
                self.stat(path)
            }
            FsOp::Link { from, to } => {
                let (d1, n1) = self.parent(from)?;
                let (d2, n2) = self.parent(to)?;
                // SAFETY: valid descriptors and C strings; flags 0 links the entry itself.
                check(unsafe {
                    libc::linkat(d1.as_raw_fd(), n1.as_ptr(), d2.as_raw_fd(), n2.as_ptr(), 0)
                })?;
                self.stat(to)
            }
            FsOp::Unlink { path } | FsOp::Rmdir { path } => {
                let (dir, name) = self.parent(path)?;
                let flag = if matches!(op, FsOp::Rmdir { .. }) {
                    libc::AT_REMOVEDIR
                } else {
                    0
                };
                // SAFETY: valid descriptor and C string.
                check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flag) })?;
                Ok(FsResult::Done)
            }
            FsOp::Rename {
                from,
                to,
                noreplace,
            } => {
                let (d1, n1) = self.parent(from)?;
                let (d2, n2) = self.parent(to)?;
                let flags = if *noreplace {
                    libc::RENAME_NOREPLACE
                } else {
                    0
                };
                // SAFETY: valid descriptors and C strings.
                check(unsafe {
                    libc::renameat2(
                        d1.as_raw_fd(),
                        n1.as_ptr(),
                        d2.as_raw_fd(),
                        n2.as_ptr(),
                        flags,
                    )
                })?;
                Ok(FsResult::Done)
            }
            FsOp::Read { path, offset, size } => {
                let f = std::fs::File::from(self.open_in(path, libc::O_RDONLY)?);
                let mut buf = vec![0u8; (*size).min(MAX_IO) as usize];
                let mut got = 0;
                while got < buf.len() {
                    match std::os::unix::fs::FileExt::read_at(
                        &f,
                        &mut buf[got..],
                        offset + got as u64,
                    ) {
                        Ok(0) => break,
                        Ok(n) => got += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                buf.truncate(got);
                *out = buf;
                Ok(FsResult::Data)
            }
            FsOp::Write { path, offset } => {
                let f = std::fs::File::from(self.open_in(path, libc::O_WRONLY)?);
                std::os::unix::fs::FileExt::write_all_at(&f, data, *offset)?;
                Ok(FsResult::Written {
                    n: data.len() as u32,
                })
            }
            FsOp::Fsync { path } => {
                let f = std::fs::File::from(self.open_in(path, libc::O_RDONLY)?);
                f.sync_all()?;
                Ok(FsResult::Done)
            }
            FsOp::Statfs => {
                // SAFETY: statfs is plain integers; zero is a valid value of each.
                let mut st: libc::statfs = unsafe { std::mem::zeroed() };
                // SAFETY: `st` is written by the call; the descriptor is valid.
                check(unsafe { libc::fstatfs(self.root.as_raw_fd(), &mut st) })?;
                Ok(FsResult::Statfs(FsStat {
                    blocks: st.f_blocks,
                    bfree: st.f_bfree,
                    bavail: st.f_bavail,
                    files: st.f_files,
                    ffree: st.f_ffree,
                    bsize: st.f_bsize as u32,
                    namelen: st.f_namelen as u32,
                }))
            }
        }
    }

    fn stat(&self, path: &str) -> io::Result<FsResult> {
        let (dir, name) = self.parent_or_root(path)?;
        // SAFETY: stat is plain integers; zero is a valid value of each.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is written by the call; valid descriptor and C string.
        check(unsafe {
            libc::fstatat(
                dir.as_raw_fd(),
                name.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW | libc::AT_EMPTY_PATH,
            )
        })?;
        Ok(FsResult::Attr(attr(&st)))
    }

    fn setattr(
        &self,
        path: &str,
        mode: Option<u32>,
        size: Option<u64>,
        atime: Option<SetTime>,
        mtime: Option<SetTime>,
    ) -> io::Result<FsResult> {
        if let Some(size) = size {
            let f = std::fs::File::from(self.open_in(path, libc::O_WRONLY)?);
            f.set_len(size)?;
        }
        if mode.is_some() || atime.is_some() || mtime.is_some() {
            // The file itself, held: chmod and utimens go through its descriptor's
            // /proc/self/fd link, so a name swapped meanwhile changes nothing else.
            let f = self.open_in(path, libc::O_PATH | libc::O_NOFOLLOW)?;
            let proc = cstr(format!("/proc/self/fd/{}", f.as_raw_fd()).as_bytes())?;
            // SAFETY: stat is plain integers; zero is a valid value of each.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: `st` is written by the call; the descriptor is valid.
            check(unsafe { libc::fstat(f.as_raw_fd(), &mut st) })?;
            if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                // Linux has no mode on a symlink, and its times are not the guest's to set.
                return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
            }
            if let Some(m) = mode {
                // SAFETY: a C string naming the held file.
                check(unsafe { libc::chmod(proc.as_ptr(), m & 0o7777) })?;
            }
            if atime.is_some() || mtime.is_some() {
                let ts = [timespec(atime), timespec(mtime)];
                // SAFETY: two timespecs, a C string naming the held file.
                check(unsafe { libc::utimensat(libc::AT_FDCWD, proc.as_ptr(), ts.as_ptr(), 0) })?;
            }
        }
        self.stat(path)
    }

    fn readdir(&self, path: &str, from: u64) -> io::Result<FsResult> {
        let dir = self.open_in(path, libc::O_RDONLY | libc::O_DIRECTORY)?;
        let proc = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let mut entries = Vec::new();
        let mut more = false;
        for e in std::fs::read_dir(proc)?.skip(from as usize) {
            if entries.len() == MAX_DIR_ENTRIES {
                more = true;
                break;
            }
            let e = e?;
            // The protocol carries UTF-8 names: another could not be asked for by name, so it
            // is listed under a stand-in that finds nothing.
            let name = e
                .file_name()
                .into_string()
                .unwrap_or_else(|n| n.to_string_lossy().into_owned());
            let kind = match e.file_type() {
                Ok(t) if t.is_dir() => Kind::Dir,
                Ok(t) if t.is_symlink() => Kind::Symlink,
                Ok(t) if t.is_file() => Kind::File,
                Ok(t) => {
                    use std::os::unix::fs::FileTypeExt;
                    if t.is_fifo() {
                        Kind::Fifo
                    } else if t.is_socket() {
                        Kind::Socket
                    } else if t.is_char_device() {
                        Kind::Char
                    } else {
                        Kind::Block
                    }
                }
                Err(_) => Kind::File,
            };
            entries.push(DirEntry { name, kind });
        }
        Ok(FsResult::Entries { entries, more })
    }

    /// `path` opened beneath the root with `flags`; no component may be a symlink.
    fn open_in(&self, path: &str, flags: i32) -> io::Result<OwnedFd> {
        let rel = if path.is_empty() {
            "."
        } else {
            check_path(path)?
        };
        // openat2 refuses flags that mean nothing to an O_PATH open (O_NOCTTY among them).
        let extra = if flags & libc::O_PATH != 0 {
            0
        } else {
            libc::O_NOCTTY
        };
        let how = how(
            flags | libc::O_CLOEXEC | extra,
            0,
            libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
        );
        openat2(self.root.as_raw_fd(), &cstr(rel.as_bytes())?, &how)
    }

    /// The directory holding `path` (opened beneath the root) and the last component.
    fn parent(&self, path: &str) -> io::Result<(OwnedFd, CString)> {
        let path = check_path(path)?;
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        Ok((
            self.open_in(dir, libc::O_PATH | libc::O_DIRECTORY)?,
            cstr(name.as_bytes())?,
        ))
    }

    /// Like [`Self::parent`], but the root itself is (its descriptor, "").
    fn parent_or_root(&self, path: &str) -> io::Result<(OwnedFd, CString)> {
        if path.is_empty() {
            return Ok((self.root.try_clone()?, CString::default()));
        }
        self.parent(path)
    }
}

/// A relative path of plain components: no `..`, `.`, empty component, leading `/` or NUL.
fn check_path(path: &str) -> io::Result<&str> {
    let ok = !path.is_empty()
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'));
    if ok {
        Ok(path)
    } else {
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    }
}

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn how(flags: i32, mode: u64, resolve: u64) -> libc::open_how {
    // SAFETY: open_how is plain integers; zero is a valid value of each.
    let mut h: libc::open_how = unsafe { std::mem::zeroed() };
    h.flags = flags as u64;
    h.mode = mode;
    h.resolve = resolve;
    h
}

fn openat2(dir: libc::c_int, path: &CString, how: &libc::open_how) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: a C string and an open_how of the size passed.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                path.as_ptr(),
                how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: a descriptor just opened, owned by no one else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        let e = io::Error::last_os_error();
        // A rename elsewhere in the tree during the walk: the kernel asks to walk again.
        if e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
    }
}

fn timespec(t: Option<SetTime>) -> libc::timespec {
    let (tv_sec, tv_nsec) = match t {
        None => (0, libc::UTIME_OMIT),
        Some(SetTime::Now) => (0, libc::UTIME_NOW),
        Some(SetTime::At { sec, nsec }) => (sec, i64::from(nsec)),
    };
    libc::timespec { tv_sec, tv_nsec }
}

fn attr(st: &libc::stat) -> Attr {
    Attr {
        kind: Kind::from_mode(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        atime: (st.st_atime, st.st_atime_nsec as u32),
        mtime: (st.st_mtime, st.st_mtime_nsec as u32),
        ctime: (st.st_ctime, st.st_ctime_nsec as u32),
    }
}

/// One share as the host knows it: the directory (canonical, resolved under the site's
/// policy by the job's front-end), where the guest mounts it, and whether it is read-only.
/// A guest's shares travel in this form to every node that serves them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shared {
    pub host: PathBuf,
    pub guest: String,
    #[serde(default)]
    pub ro: bool,
    /// A share every job gets unasked: a node that cannot open it leaves it out (its guest
    /// path stays the guest's own) rather than failing the job.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// The shares of one guest, by id (their index), as a host end serves them: each as asked
/// for, and opened here (an optional one this node cannot see is not).
pub struct ShareSet {
    shares: Vec<(Shared, Option<HostShare>)>,
}

impl std::fmt::Debug for ShareSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.shares.iter().map(|(s, h)| (s, h.is_some())))
            .finish()
    }
}

impl ShareSet {
    /// Opens each share, as this process's user; ids follow the order.
    pub fn open(list: &[Shared]) -> io::Result<Self> {
        let mut shares = Vec::new();
        for s in list {
            let opened = match HostShare::open(&s.host, s.ro) {
                Ok(h) => Some(h),
                Err(e) if s.optional => {
                    eprintln!(
                        "vse: share {} is not here ({e}); left out",
                        s.host.display()
                    );
                    None
                }
                Err(e) => {
                    let what = format!("share {}: {e}", s.host.display());
                    return Err(io::Error::new(e.kind(), what));
                }
            };
            shares.push((s.clone(), opened));
        }
        Ok(ShareSet { shares })
    }

    /// The shares as they travel to the next node that serves them.
    pub fn list(&self) -> Vec<Shared> {
        self.shares.iter().map(|(s, _)| s.clone()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.shares.is_empty()
    }

    /// What the guest is asked to mount: the shares opened here.
    pub fn mounts(&self) -> Vec<super::proto::MountShare> {
        (self.shares.iter().enumerate())
            .filter(|(_, (_, h))| h.is_some())
            .map(|(i, (s, _))| super::proto::MountShare {
                id: i as u32,
                guest: s.guest.clone(),
                ro: s.ro,
            })
            .collect()
    }

    pub fn handle(&self, share: u32, op: &FsOp, data: &[u8], retry: bool) -> (FsResult, Vec<u8>) {
        match self.shares.get(share as usize) {
            Some((_, Some(h))) => h.handle(op, data, retry),
            _ => (
                FsResult::Err {
                    errno: libc::ENODEV,
                },
                Vec::new(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(ro: bool) -> (tempfile::TempDir, tempfile::TempDir, HostShare) {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        let s = HostShare::open(root.path(), ro).unwrap();
        (root, outside, s)
    }

    fn errno(r: FsResult) -> i32 {
        match r {
            FsResult::Err { errno } => errno,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[test]
    fn no_path_the_guest_sends_leaves_the_root() {
        let (root, outside, s) = share(false);
        let secret = outside.path().join("secret");
        std::os::unix::fs::symlink(outside.path(), root.path().join("out")).unwrap();
        std::os::unix::fs::symlink(&secret, root.path().join("f")).unwrap();
        let read = |path: &str| FsOp::Read {
            path: path.into(),
            offset: 0,
            size: 10,
        };
        for p in ["../x", "/etc/passwd", "a/../../x", "", "./f", "a//b"] {
            if !p.is_empty() {
                assert_eq!(
                    errno(s.handle(&read(p), b"A", false).0),
                    libc::EINVAL,
                    "{p}"
                );
            }
        }
        assert_eq!(
            errno(s.handle(&read("out/secret"), b"A", false).0),
            libc::ELOOP
        );
        assert_eq!(errno(s.handle(&read("f"), b"A", false).0), libc::ELOOP);
        let write = FsOp::Write {
            path: "f".into(),
            offset: 0,
        };
        assert_eq!(errno(s.handle(&write, b"A", false).0), libc::ELOOP);
        let chmod = FsOp::Setattr {
            path: "f".into(),
            mode: Some(0o777),
            size: None,
            atime: None,
            mtime: None,
        };
        assert_eq!(errno(s.handle(&chmod, b"A", false).0), libc::EOPNOTSUPP);
        let create = FsOp::Create {
            path: "out/new".into(),
            mode: 0o644,
            excl: true,
        };
        assert_eq!(errno(s.handle(&create, b"A", false).0), libc::ELOOP);
        assert_eq!(std::fs::read(&secret).unwrap(), b"s");
        assert!(!outside.path().join("new").exists());
        // The link itself is the guest's to read.
        let (r, target) = s.handle(&FsOp::Readlink { path: "f".into() }, &[], false);
        assert_eq!(r, FsResult::Data);
        assert_eq!(target, secret.as_os_str().as_encoded_bytes());
    }

    #[test]
    fn a_read_only_share_refuses_every_change() {
        let (root, _o, s) = share(true);
        std::fs::write(root.path().join("a"), b"x").unwrap();
        for op in [
            FsOp::Write {
                path: "a".into(),
                offset: 0,
            },
            FsOp::Unlink { path: "a".into() },
            FsOp::Mkdir {
                path: "d".into(),
                mode: 0o755,
            },
        ] {
            assert_eq!(errno(s.handle(&op, b"A", false).0), libc::EROFS, "{op:?}");
        }
        assert!(matches!(
            s.handle(&FsOp::Stat { path: "a".into() }, b"A", false).0,
            FsResult::Attr(_)
        ));
    }

    #[test]
    fn an_operation_sent_again_after_it_was_done_counts_as_done() {
        let (root, _o, s) = share(false);
        let mk = FsOp::Create {
            path: "n".into(),
            mode: 0o644,
            excl: true,
        };
        assert!(matches!(s.handle(&mk, b"A", false).0, FsResult::Attr(_)));
        assert_eq!(errno(s.handle(&mk, b"A", false).0), libc::EEXIST);
        assert!(matches!(s.handle(&mk, b"A", true).0, FsResult::Attr(_)));
        let mv = FsOp::Rename {
            from: "n".into(),
            to: "m".into(),
            noreplace: false,
        };
        assert_eq!(s.handle(&mv, b"A", false).0, FsResult::Done);
        assert_eq!(s.handle(&mv, b"A", true).0, FsResult::Done);
        let rm = FsOp::Unlink { path: "m".into() };
        assert_eq!(s.handle(&rm, b"A", false).0, FsResult::Done);
        assert_eq!(s.handle(&rm, b"A", true).0, FsResult::Done);
        assert_eq!(errno(s.handle(&rm, b"A", false).0), libc::ENOENT);
        assert!(std::fs::read_dir(root.path()).unwrap().next().is_none());
    }
}
