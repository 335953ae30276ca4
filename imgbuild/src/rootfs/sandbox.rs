//! The sandbox of every command run inside an image root (maintainer scripts, groupadd and
//! useradd, post-install commands): set up in the forked child between fork and exec, with
//! raw syscalls on buffers prepared before fork (nothing here allocates or takes a lock).
//!
//! What the command gets:
//! - its own user namespace. As root, the namespace's ids 0..65535 are host ids
//!   base..base+65535 ([`super::idbase`]: no host account has them), and the image root is
//!   an idmapped mount of the build directory, so files still land on disk owned by 0..65535
//!   as the image wants, while the processes hold no host id and no host capability. As the
//!   root of a rootless build's namespace ([`crate::rootless`]), it maps that namespace's
//!   ids 0..65535 one to one (they are already the user's and its subordinate ids, so no
//!   idmapped mount is needed). As another user, it maps that user alone to 0 (`unshare -r`).
//! - PID, IPC, UTS and network namespaces: it sees only its own processes (a fresh `/proc`),
//!   the host name `vse-build`, and a loopback interface only (unless the network is allowed).
//! - a mount namespace whose root is the image (`pivot_root`; the host's tree is detached),
//!   with a minimal `/dev`: null, zero, full, random and urandom bound from the host's nodes
//!   (no `tty`: the command has no controlling terminal), its own devpts instance
//!   (`/dev/pts`, `/dev/ptmx`), a tmpfs `/dev/shm`. No host block device is reachable, and
//!   `mknod` is refused by the kernel in a user namespace.
//! - a bounding set cut to what dpkg and its scripts need ([`KEEP_CAPS`]: no
//!   `CAP_SYS_ADMIN`, so nothing can be mounted or unmounted from inside), then
//!   [`super::confine`]: its own session (no controlling terminal), a fresh session keyring,
//!   resource limits, no inherited descriptor above 2, `no_new_privs` and a seccomp filter
//!   (no new user namespace, no keyring, ptrace, BPF, mount or module syscall, no `TIOCSTI`).
//!
//! The forked child stays outside the new PID namespace, waits for the namespace's PID 1 (the
//! command) and exits with its status; both die with the builder (`PR_SET_PDEATHSIG`), and
//! the kernel kills every process of the namespace when its PID 1 ends. Every mount lives in
//! the private mount namespace only: nothing is ever left mounted on the host.

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::confine::{Confinement, FilterError, Limits};
use super::idbase::{ID_COUNT, IdBaseError};

/// The host name commands see (not the build host's).
pub const HOSTNAME: &[u8] = b"vse-build";

/// Capabilities kept in the bounding set: file ownership and modes, ids, signals to the
/// sandbox's own processes, chroot (some maintainer scripts use it), file capabilities
/// (`setcap` in postinst). Everything else (mounts, modules, raw I/O, network
/// administration, ptrace…) is dropped before exec.
pub const KEEP_CAPS: &[u32] = &[
    0,  // CAP_CHOWN
    1,  // CAP_DAC_OVERRIDE
    2,  // CAP_DAC_READ_SEARCH
    3,  // CAP_FOWNER
    4,  // CAP_FSETID
    5,  // CAP_KILL
    6,  // CAP_SETGID
    7,  // CAP_SETUID
    8,  // CAP_SETPCAP
    10, // CAP_NET_BIND_SERVICE
    18, // CAP_SYS_CHROOT
    27, // CAP_MKNOD (refused for real devices in a user namespace anyway)
    29, // CAP_AUDIT_WRITE
    31, // CAP_SETFCAP
];

/// Host device nodes bound into the sandbox's `/dev`.
const DEVICES: [(&CStr, &CStr); 5] = [
    (c"/dev/null", c"/dev/null"),
    (c"/dev/zero", c"/dev/zero"),
    (c"/dev/full", c"/dev/full"),
    (c"/dev/random", c"/dev/random"),
    (c"/dev/urandom", c"/dev/urandom"),
];

const DEV_LINKS: [(&CStr, &CStr); 5] = [
    (c"pts/ptmx", c"/dev/ptmx"),
    (c"/proc/self/fd", c"/dev/fd"),
    (c"/proc/self/fd/0", c"/dev/stdin"),
    (c"/proc/self/fd/1", c"/dev/stdout"),
    (c"/proc/self/fd/2", c"/dev/stderr"),
];

// Mount API constants (linux/mount.h), not all in the libc crate.
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Everything the forked child needs, allocated before fork.
pub(crate) struct Prep {
    root: CString,
    /// `Some`: not root; the single-id maps of the builder's own uid and gid.
    rootless: Option<(Vec<u8>, Vec<u8>)>,
    /// The uid and gid maps when root: `0 <base> ID_COUNT`, or, `nested`, this namespace's
    /// ids one to one.
    id_maps: [Vec<u8>; 2],
    /// Root of a user namespace, not of the host.
    nested: bool,
    allow_network: bool,
    confinement: Confinement,
}

/// Why the sandbox cannot be prepared (before any process is started).
#[derive(Debug, thiserror::Error)]
pub enum PrepError {
    #[error(transparent)]
    IdBase(#[from] IdBaseError),
    #[error(transparent)]
    Filter(#[from] FilterError),
}

fn check(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl Prep {
    pub(crate) fn new(root: &Path, allow_network: bool) -> Result<Self, PrepError> {
        let root = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
        // SAFETY: geteuid/getegid cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let nested = match uid {
            0 => super::idbase::namespace_maps()?,
            _ => None,
        };
        let id_maps = match (&nested, uid) {
            (Some(maps), _) => maps.clone().map(String::into_bytes),
            (None, 0) => {
                let map = format!("0 {} {ID_COUNT}\n", super::idbase::id_base()?);
                [map.clone().into_bytes(), map.into_bytes()]
            }
            (None, _) => [vec![], vec![]],
        };
        Ok(Prep {
            root: CString::new(root.as_os_str().as_bytes()).unwrap_or_default(),
            rootless: (uid != 0).then(|| {
                (
                    format!("0 {uid} 1\n").into_bytes(),
                    format!("0 {gid} 1\n").into_bytes(),
                )
            }),
            id_maps,
            nested: nested.is_some(),
            allow_network,
            confinement: Confinement::new(Limits::default())?,
        })
    }

    /// Runs in the forked child: namespaces, then a fork whose child (PID 1 of the new PID
    /// namespace) returns to exec the command while this process waits for it.
    pub(crate) fn enter(&self) -> io::Result<()> {
        // SAFETY: raw syscalls on buffers owned by `self` or on the stack.
        unsafe {
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0).into())?;
            let tree = match &self.rootless {
                None => {
                    let userns = self.mapped_userns()?;
                    let tree = if self.nested {
                        Ok(None)
                    } else {
                        idmapped_tree(&self.root, userns).map(Some)
                    };
                    let joined = check(libc::setns(userns, libc::CLONE_NEWUSER).into());
                    libc::close(userns);
                    joined?;
                    tree?
                }
                Some((umap, gmap)) => {
                    check(libc::unshare(libc::CLONE_NEWUSER).into())?;
                    write_file(c"/proc/self/setgroups", b"deny")?;
                    write_file(c"/proc/self/uid_map", umap)?;
                    write_file(c"/proc/self/gid_map", gmap)?;
                    None
                }
            };
            let mut flags =
                libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
            if !self.allow_network {
                flags |= libc::CLONE_NEWNET;
            }
            check(libc::unshare(flags).into())?;
            let null = std::ptr::null();
            check(
                libc::mount(
                    null,
                    c"/".as_ptr(),
                    null,
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                )
                .into(),
            )?;
            let pid = check(libc::fork().into())?;
            if pid > 0 {
                supervise(pid as libc::pid_t);
            }
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0).into())?;
            self.enter_root(tree)?;
            self.finish()
        }
    }

    /// A user namespace with the sandbox's id range. Its maps must be written by a process
    /// privileged in the parent namespace, so a short-lived helper creates it and this
    /// process (root of the parent namespace) writes them, then keeps the namespace by fd.
    unsafe fn mapped_userns(&self) -> io::Result<libc::c_int> {
        // SAFETY: pipes, fork and plain reads/writes on stack buffers.
        unsafe {
            let (mut ready, mut hold) = ([0; 2], [0; 2]);
            check(libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC).into())?;
            check(libc::pipe2(hold.as_mut_ptr(), libc::O_CLOEXEC).into())?;
            let pid = libc::fork();
            if pid == 0 {
                libc::close(ready[0]);
                libc::close(hold[1]);
                if libc::unshare(libc::CLONE_NEWUSER) == 0 {
                    libc::write(ready[1], b"u".as_ptr().cast(), 1);
                }
                let mut b = 0u8;
                libc::read(hold[0], (&raw mut b).cast(), 1);
                libc::_exit(0);
            }
            libc::close(ready[1]);
            libc::close(hold[0]);
            let result = if pid < 0 {
                Err(io::Error::last_os_error())
            } else {
                let mut b = 0u8;
                if libc::read(ready[0], (&raw mut b).cast(), 1) == 1 {
                    self.write_maps(pid)
                } else {
                    Err(io::Error::from_raw_os_error(libc::EPERM))
                }
            };
            libc::close(hold[1]);
            libc::close(ready[0]);
            if pid > 0 {
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            result
        }
    }

    unsafe fn write_maps(&self, pid: libc::pid_t) -> io::Result<libc::c_int> {
        let mut buf = [0u8; 64];
        // SAFETY: NUL-terminated stack buffers.
        unsafe {
            write_file(proc_path(&mut buf, pid, b"uid_map"), &self.id_maps[0])?;
            write_file(proc_path(&mut buf, pid, b"gid_map"), &self.id_maps[1])?;
            let ns = proc_path(&mut buf, pid, b"ns/user");
            Ok(check(libc::open(ns.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC).into())? as i32)
        }
    }

    /// In PID 1 of the new namespace: the image root becomes `/`, the host's tree is
    /// detached, and `/proc` and `/dev` are the sandbox's own.
    unsafe fn enter_root(&self, tree: Option<libc::c_int>) -> io::Result<()> {
        let null = std::ptr::null();
        // SAFETY: raw syscalls on C strings owned by `self` or static.
        unsafe {
            match tree {
                Some(t) => move_mount(t, &self.root)?,
                None => {
                    check(
                        libc::mount(
                            self.root.as_ptr(),
                            self.root.as_ptr(),
                            null,
                            libc::MS_BIND | libc::MS_REC,
                            std::ptr::null(),
                        )
                        .into(),
                    )?;
                }
            }
            // Taken while the host's tree is still there: its device nodes, and a procfs of
            // this PID namespace (the kernel refuses one once no procfs is visible).
            let mut devs = [-1; DEVICES.len()];
            for (fd, (host, _)) in devs.iter_mut().zip(DEVICES) {
                *fd = check(libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    host.as_ptr(),
                    OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
                ))? as libc::c_int;
            }
            let proc_fd = new_fs(
                c"proc",
                MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            )?;
            check(libc::chdir(self.root.as_ptr()).into())?;
            check(libc::syscall(
                libc::SYS_pivot_root,
                c".".as_ptr(),
                c".".as_ptr(),
            ))?;
            check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH).into())?;
            check(libc::chdir(c"/".as_ptr()).into())?;
            if tree.is_some() || self.nested {
                // From the host's root (unmapped here) to the namespace's root; nested, the
                // same ids, but no group of the outer namespace is kept.
                check(libc::setgroups(0, std::ptr::null()).into())?;
                check(libc::setresgid(0, 0, 0).into())?;
                check(libc::setresuid(0, 0, 0).into())?;
            }
            libc::mkdir(c"/proc".as_ptr(), 0o555);
            move_mount(proc_fd, c"/proc")?;
            libc::mkdir(c"/dev".as_ptr(), 0o755);
            mount_fs(
                c"tmpfs",
                c"/dev",
                libc::MS_NOSUID | libc::MS_NOEXEC,
                c"mode=0755,size=1m",
            )?;
            for (fd, (_, inside)) in devs.into_iter().zip(DEVICES) {
                let f = check(
                    libc::open(
                        inside.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o666,
                    )
                    .into(),
                )?;
                libc::close(f as libc::c_int);
                move_mount(fd, inside)?;
                libc::close(fd);
            }
            libc::mkdir(c"/dev/pts".as_ptr(), 0o755);
            mount_fs(
                c"devpts",
                c"/dev/pts",
                libc::MS_NOSUID | libc::MS_NOEXEC,
                c"newinstance,ptmxmode=0666,mode=0620",
            )?;
            libc::mkdir(c"/dev/shm".as_ptr(), 0o1777);
            mount_fs(
                c"tmpfs",
                c"/dev/shm",
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=1777",
            )?;
            for (target, link) in DEV_LINKS {
                check(libc::symlink(target.as_ptr(), link.as_ptr()).into())?;
            }
        }
        Ok(())
    }

    /// Host name, loopback, capabilities, then the confinement: the last steps before exec.
    unsafe fn finish(&self) -> io::Result<()> {
        // SAFETY: raw syscalls on static and stack buffers.
        unsafe {
            check(libc::sethostname(HOSTNAME.as_ptr().cast(), HOSTNAME.len()).into())?;
            if !self.allow_network {
                loopback_up()?;
            }
            for cap in 0..64u32 {
                if !KEEP_CAPS.contains(&cap)
                    && libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) < 0
                    && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
                {
                    return Err(io::Error::last_os_error());
                }
            }
            self.confinement.apply()
        }
    }
}

/// The waiting half: keeps no descriptor (so the spawner sees exec happen in the child), waits
/// for the namespace's PID 1 and ends as it did.
unsafe fn supervise(child: libc::pid_t) -> ! {
    // SAFETY: close_range/waitpid/kill/_exit only.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3, libc::c_uint::MAX, 0);
        let mut status = 0;
        loop {
            let r = libc::waitpid(child, &mut status, 0);
            if r == child {
                break;
            }
            if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                libc::_exit(127);
            }
        }
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status));
    }
}

/// A detached copy of the mount of `root`, idmapped through `userns`: the sandbox's ids
/// 0..65535 read and write the files' on-disk ids 0..65535.
unsafe fn idmapped_tree(root: &CStr, userns: libc::c_int) -> io::Result<libc::c_int> {
    // SAFETY: raw syscalls on a C string and a stack struct.
    unsafe {
        let tree = check(libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            root.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        ))? as libc::c_int;
        let attr = MountAttr {
            attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID,
            attr_clr: 0,
            propagation: 0,
            userns_fd: userns as u64,
        };
        if let Err(e) = check(libc::syscall(
            libc::SYS_mount_setattr,
            tree,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &raw const attr,
            std::mem::size_of::<MountAttr>(),
        )) {
            libc::close(tree);
            return Err(e);
        }
        Ok(tree)
    }
}

/// Attaches the detached mount `fd` at `target`.
unsafe fn move_mount(fd: libc::c_int, target: &CStr) -> io::Result<()> {
    // SAFETY: raw syscall on C strings.
    unsafe {
        check(libc::syscall(
            libc::SYS_move_mount,
            fd,
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        ))?;
    }
    Ok(())
}

/// A new, detached instance of file system `fs` (new mount API).
unsafe fn new_fs(fs: &CStr, attrs: u64) -> io::Result<libc::c_int> {
    // SAFETY: raw syscalls on C strings.
    unsafe {
        let ctx = check(libc::syscall(libc::SYS_fsopen, fs.as_ptr(), FSOPEN_CLOEXEC))? as i32;
        let made = check(libc::syscall(
            libc::SYS_fsconfig,
            ctx,
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        ))
        .and_then(|_| {
            check(libc::syscall(
                libc::SYS_fsmount,
                ctx,
                FSMOUNT_CLOEXEC,
                attrs,
            ))
        });
        libc::close(ctx);
        Ok(made? as libc::c_int)
    }
}

unsafe fn mount_fs(fs: &CStr, target: &CStr, flags: libc::c_ulong, data: &CStr) -> io::Result<()> {
    // SAFETY: raw syscall on C strings.
    unsafe {
        check(
            libc::mount(
                fs.as_ptr(),
                target.as_ptr(),
                fs.as_ptr(),
                flags,
                data.as_ptr().cast(),
            )
            .into(),
        )?;
    }
    Ok(())
}

/// Brings `lo` up in the new network namespace (apt and scripts may use 127.0.0.1).
unsafe fn loopback_up() -> io::Result<()> {
    // SAFETY: socket/ioctl on a zeroed, stack-allocated ifreq.
    unsafe {
        let s = check(libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0).into())?
            as libc::c_int;
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (d, s) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
            *d = *s as libc::c_char;
        }
        let mut r = libc::ioctl(s, libc::SIOCGIFFLAGS, &raw mut ifr);
        if r == 0 {
            ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            r = libc::ioctl(s, libc::SIOCSIFFLAGS, &raw const ifr);
        }
        let err = io::Error::last_os_error();
        libc::close(s);
        if r < 0 {
            return Err(err);
        }
    }
    Ok(())
}

/// `/proc/<pid>/<leaf>` in `buf`, NUL-terminated (no allocation).
fn proc_path<'a>(buf: &'a mut [u8; 64], pid: libc::pid_t, leaf: &[u8]) -> &'a CStr {
    let mut digits = [0u8; 12];
    let mut n = pid.unsigned_abs();
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut at = 0;
    for part in [&b"/proc/"[..], &digits[i..], b"/", leaf, b"\0"] {
        buf[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    CStr::from_bytes_until_nul(&buf[..at]).unwrap_or(c"")
}

/// SAFETY: async-signal-safe (open/write/close only).
unsafe fn write_file(path: &CStr, data: &[u8]) -> io::Result<()> {
    // SAFETY: valid C string and buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        let err = io::Error::last_os_error();
        libc::close(fd);
        if n < 0 {
            return Err(err);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn proc_paths_are_formatted_without_allocation() {
        let mut buf = [0u8; 64];
        assert_eq!(
            super::proc_path(&mut buf, 4_194_304, b"uid_map").to_bytes(),
            b"/proc/4194304/uid_map"
        );
        assert_eq!(
            super::proc_path(&mut buf, 7, b"ns/user").to_bytes(),
            b"/proc/7/ns/user"
        );
    }
}
