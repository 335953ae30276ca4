//! The builder's own file access inside an image root once untrusted code (maintainer
//! scripts, post-install commands) has run there: every path is resolved by the kernel with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`, so a symlink the image planted
//! (absolute, or climbing with `..`) is followed inside the root, never out of it, and
//! `/proc` magic links are refused. Removals resolve the parent that way and unlink the
//! last component itself (a symlink is removed, never followed).

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// What a directory entry or a path is (without following a final symlink).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

/// `lstat` of a path inside the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub kind: Kind,
    /// Permission bits (`0o7777`).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
}

/// An image root opened for confined access.
#[derive(Debug)]
pub struct InRoot {
    fd: OwnedFd,
    path: PathBuf,
}

fn cstr(s: &[u8]) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn kind_of(mode: libc::mode_t) -> Kind {
    match mode & libc::S_IFMT {
        libc::S_IFREG => Kind::File,
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Symlink,
        _ => Kind::Other,
    }
}

/// `(parent, name)` of a root-relative path; the name is a plain component.
fn split(rel: &str) -> io::Result<(&str, &str)> {
    let rel = rel.trim_start_matches('/').trim_end_matches('/');
    let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    if name.is_empty() || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{rel:?} names no file"),
        ));
    }
    Ok((parent, name))
}

impl InRoot {
    pub fn open(root: &Path) -> io::Result<Self> {
        let c = cstr(root.as_os_str().as_bytes())?;
        // SAFETY: open(2) on a valid C string.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(InRoot {
            // SAFETY: a fresh descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            path: root.to_path_buf(),
        })
    }

    /// The root on the host (for messages only: never open paths under it directly).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `rel` shown as a host path, for error messages.
    pub fn display(&self, rel: &str) -> PathBuf {
        self.path.join(rel.trim_start_matches('/'))
    }

    fn openat2(&self, rel: &str, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
        let rel = rel.trim_start_matches('/');
        let c = cstr(if rel.is_empty() { b"." } else { rel.as_bytes() })?;
        // SAFETY: open_how is plain data; all-zero is its empty value.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_CLOEXEC) as u64;
        if flags & libc::O_CREAT != 0 {
            how.mode = mode as u64;
        }
        how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
        loop {
            // SAFETY: openat2(2) with a valid dirfd, C string and open_how.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    self.fd.as_raw_fd(),
                    c.as_ptr(),
                    &raw const how,
                    std::mem::size_of::<libc::open_how>(),
                )
            };
            if fd >= 0 {
                // SAFETY: a fresh descriptor we own.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) });
            }
            let e = io::Error::last_os_error();
            // The kernel asks for a retry when a rename raced the resolution.
            if e.raw_os_error() != Some(libc::EAGAIN) {
                return Err(e);
            }
        }
    }

    fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
        // SAFETY: fstat(2) into a zeroed struct.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd.as_raw_fd(), &mut st) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(st)
        }
    }

    /// A regular file, for reading (a final symlink is followed inside the root).
    pub fn open_file(&self, rel: &str) -> io::Result<File> {
        // O_NONBLOCK: opening a FIFO the image planted must not hang the build.
        let fd = self.openat2(rel, libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK, 0)?;
        if kind_of(Self::fstat(&fd)?.st_mode) != Kind::File {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", self.display(rel).display()),
            ));
        }
        Ok(File::from(fd))
    }

    pub fn read(&self, rel: &str) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.open_file(rel)?.read_to_end(&mut out)?;
        Ok(out)
    }

    pub fn read_to_string(&self, rel: &str) -> io::Result<String> {
        String::from_utf8(self.read(rel)?)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Copies the regular file `rel` to `dest` on the host (created or truncated).
    pub fn copy_to(&self, rel: &str, dest: &Path) -> io::Result<u64> {
        let mut from = self.open_file(rel)?;
        let mut to = File::create(dest)?;
        io::copy(&mut from, &mut to)
    }

    /// `stat` (a final symlink followed inside the root).
    pub fn stat(&self, rel: &str) -> io::Result<Stat> {
        let fd = self.openat2(rel, libc::O_PATH, 0)?;
        Ok(to_stat(&Self::fstat(&fd)?))
    }

    pub fn is_dir(&self, rel: &str) -> bool {
        self.stat(rel).is_ok_and(|s| s.kind == Kind::Dir)
    }

    fn parent(&self, rel: &str) -> io::Result<(OwnedFd, CString)> {
        let (parent, name) = split(rel)?;
        let dir = self.openat2(parent, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        Ok((dir, cstr(name.as_bytes())?))
    }

    /// `lstat`: the parent resolved inside the root, the last component not followed.
    pub fn lstat(&self, rel: &str) -> io::Result<Stat> {
        let (dir, name) = self.parent(rel)?;
        // SAFETY: fstatat(2) on our descriptor into a zeroed struct.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstatat(
                dir.as_raw_fd(),
                name.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            ) < 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(to_stat(&st))
        }
    }

    /// The target of the symlink `rel` (as written, not resolved).
    pub fn read_link(&self, rel: &str) -> io::Result<PathBuf> {
        let (dir, name) = self.parent(rel)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize];
        // SAFETY: readlinkat(2) into a buffer of the given length.
        let n = unsafe {
            libc::readlinkat(
                dir.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(PathBuf::from(OsString::from_vec(buf)))
    }

    /// Removes the non-directory `rel` (a symlink itself, never what it points to).
    pub fn remove_file(&self, rel: &str) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?;
        // SAFETY: unlinkat(2) relative to our descriptor.
        if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Writes `data` as a new regular file at `rel` (whatever non-directory was there is
    /// removed first, so a planted symlink is replaced, not written through).
    pub fn write_new(&self, rel: &str, data: &[u8], perm: u32) -> io::Result<()> {
        match self.remove_file(rel) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let fd = self.openat2(
            rel,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            perm,
        )?;
        let mut f = File::from(fd);
        io::Write::write_all(&mut f, data)?;
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(perm))
    }

    /// Makes directory `rel` and its missing parents (mode `perm`), each resolved inside the
    /// root: a planted symlink on the way is followed inside it, never out of it.
    pub fn create_dir_all(&self, rel: &str, perm: u32) -> io::Result<()> {
        let rel = rel.trim_matches('/');
        let mut done = String::new();
        for part in rel.split('/').filter(|p| !p.is_empty() && *p != ".") {
            if !done.is_empty() {
                done.push('/');
            }
            done.push_str(part);
            if self.is_dir(&done) {
                continue;
            }
            let (dir, name) = self.parent(&done)?;
            // SAFETY: mkdirat(2) relative to our descriptor with a valid C string.
            if unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), perm) } < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::AlreadyExists || !self.is_dir(&done) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// The entries of directory `rel` (without `.` and `..`), sorted by name.
    pub fn read_dir(&self, rel: &str) -> io::Result<Vec<(OsString, Kind)>> {
        let fd = self.openat2(rel, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let mut out = Vec::new();
        // SAFETY: fdopendir takes the descriptor; readdir's entries are copied before the
        // next call; closedir releases both.
        unsafe {
            let raw = std::os::fd::IntoRawFd::into_raw_fd(fd);
            let dir = libc::fdopendir(raw);
            if dir.is_null() {
                let e = io::Error::last_os_error();
                libc::close(raw);
                return Err(e);
            }
            loop {
                let ent = libc::readdir64(dir);
                if ent.is_null() {
                    break;
                }
                let name = CStr::from_ptr((*ent).d_name.as_ptr()).to_bytes();
                if name == b"." || name == b".." {
                    continue;
                }
                let kind = match (*ent).d_type {
                    libc::DT_REG => Kind::File,
                    libc::DT_DIR => Kind::Dir,
                    libc::DT_LNK => Kind::Symlink,
                    libc::DT_UNKNOWN => {
                        let mut st: libc::stat = std::mem::zeroed();
                        let c = CString::new(name).unwrap_or_default();
                        if libc::fstatat(
                            libc::dirfd(dir),
                            c.as_ptr(),
                            &mut st,
                            libc::AT_SYMLINK_NOFOLLOW,
                        ) == 0
                        {
                            kind_of(st.st_mode)
                        } else {
                            Kind::Other
                        }
                    }
                    _ => Kind::Other,
                };
                out.push((OsStr::from_bytes(name).to_os_string(), kind));
            }
            libc::closedir(dir);
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

fn to_stat(st: &libc::stat) -> Stat {
    Stat {
        kind: kind_of(st.st_mode),
        perm: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        size: st.st_size as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planted_symlinks_resolve_inside_the_root() {
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        std::fs::write(&secret, b"host").unwrap();
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("boot")).unwrap();
        std::os::unix::fs::symlink(&secret, r.join("boot/abs")).unwrap();
        std::os::unix::fs::symlink(
            "../../../../../../".to_string() + secret.to_str().unwrap(),
            r.join("boot/up"),
        )
        .unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("logdir")).unwrap();
        std::os::unix::fs::symlink("/proc/self/root/etc/hostname", r.join("magic")).unwrap();
        let inr = InRoot::open(r).unwrap();
        for link in ["boot/abs", "boot/up"] {
            assert_eq!(
                inr.read(link).unwrap_err().kind(),
                io::ErrorKind::NotFound,
                "{link}"
            );
        }
        // The same path inside the root is what is read.
        let inside = r.join(secret.strip_prefix("/").unwrap());
        std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
        std::fs::write(&inside, b"image").unwrap();
        assert_eq!(inr.read("boot/abs").unwrap(), b"image");
        assert!(inr.read("magic").is_err());
        // Removal through a symlinked directory stays inside (removing the image's copy);
        // the link itself is removable.
        inr.remove_file("logdir/secret").unwrap();
        assert!(!inside.exists());
        assert!(inr.remove_file("logdir/secret").is_err());
        assert_eq!(std::fs::read(&secret).unwrap(), b"host");
        inr.remove_file("boot/abs").unwrap();
        assert!(secret.exists());
        // Writing replaces a planted symlink.
        inr.write_new("boot/up", b"new", 0o644).unwrap();
        assert_eq!(std::fs::read(&secret).unwrap(), b"host");
        assert_eq!(inr.lstat("boot/up").unwrap().kind, Kind::File);
        let names: Vec<_> = inr.read_dir("boot").unwrap();
        assert_eq!(names, vec![(OsString::from("up"), Kind::File)]);
    }
}
