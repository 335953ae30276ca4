//! The last steps of the sandbox before exec, after its namespaces and root are in place:
//! a session of its own (no controlling terminal, so no `TIOCSTI` into the caller's shell),
//! a fresh session keyring, resource limits, no inherited descriptor above 2, `no_new_privs`
//! and a seccomp filter. The filter is compiled before fork; in the child only raw syscalls
//! run (nothing allocates or takes a lock).
//!
//! The filter denies what a maintainer script never needs and what turns a confined root
//! into more: new user namespaces (in which it would hold every capability again), the
//! kernel keyring, `ptrace`, BPF, perf events, `userfaultfd`, io_uring, mounting, module
//! loading, kexec, and the terminal ioctls that inject input (`TIOCSTI`, `TIOCLINUX`).
//!
//! Flushes to disk (`fsync` and its kin) succeed without flushing: everything a command
//! writes lands in the build's scratch tree, which is only ever read back (the root disk's
//! writer, a layer's copy) or thrown away, never trusted across a crash. dpkg alone made
//! over 500 of them while configuring a minimal image: a tenth of a clean build.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, sock_filter,
};
use std::collections::BTreeMap;
use std::io;

/// Resource limits of every command in the sandbox (soft = hard, so they cannot be raised).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Processes of the sandbox's user (`RLIMIT_NPROC`): dpkg and a maintainer script's
    /// pipelines need tens; a fork bomb stops here.
    pub processes: u64,
    /// Largest file a command may write (`RLIMIT_FSIZE`), in bytes.
    pub file_size: u64,
    /// Open descriptors per process (`RLIMIT_NOFILE`).
    pub open_files: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            processes: 1024,
            file_size: 8 << 30,
            open_files: 4096,
        }
    }
}

const CLONE_NEWUSER: u64 = libc::CLONE_NEWUSER as u64;
// The ioctl numbers' type differs between C libraries (unsigned long, int).
#[allow(clippy::unnecessary_cast)]
const TIOCSTI: u64 = libc::TIOCSTI as u64;
#[allow(clippy::unnecessary_cast)]
const TIOCLINUX: u64 = libc::TIOCLINUX as u64;
const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 4;

/// Syscalls denied whatever their arguments.
const DENIED: &[libc::c_long] = &[
    libc::SYS_setns,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fsconfig,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
];

#[derive(Debug, thiserror::Error)]
#[error("compiling the sandbox's seccomp filter: {0}")]
pub struct FilterError(String);

/// The compiled filters, installed in order (the kernel runs every one; the strictest
/// verdict wins).
#[derive(Debug)]
pub(crate) struct Confinement {
    filters: Vec<BpfProgram>,
    limits: Limits,
}

fn flag_set(arg: u8, flag: u64) -> Result<SeccompRule, seccompiler::BackendError> {
    // Dword: the kernel reads these arguments as 32-bit values, so high bits set by the
    // caller cannot hide the flag from the filter.
    SeccompRule::new(vec![SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(flag),
        flag,
    )?])
}

fn arg_is(arg: u8, value: u64) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(vec![SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Eq,
        value,
    )?])
}

fn arch() -> Result<seccompiler::TargetArch, FilterError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e: seccompiler::BackendError| FilterError(e.to_string()))
}

/// Everything denied with `EPERM` (a syscall of another architecture kills the process).
fn deny_filter() -> Result<BpfProgram, FilterError> {
    let err = |e: seccompiler::BackendError| FilterError(e.to_string());
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|&nr| (nr, vec![])).collect();
    rules.insert(
        libc::SYS_unshare,
        vec![flag_set(0, CLONE_NEWUSER).map_err(err)?],
    );
    rules.insert(
        libc::SYS_clone,
        vec![flag_set(0, CLONE_NEWUSER).map_err(err)?],
    );
    rules.insert(
        libc::SYS_ioctl,
        vec![
            arg_is(1, TIOCSTI).map_err(err)?,
            arg_is(1, TIOCLINUX).map_err(err)?,
        ],
    );
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )
    .map_err(err)?;
    f.try_into().map_err(err)
}

/// Flushes to disk that return success at once (see the module's documentation).
const NO_FLUSH: &[libc::c_long] = &[
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_sync,
    libc::SYS_syncfs,
    libc::SYS_sync_file_range,
];

/// [`NO_FLUSH`] answered with 0 (an "errno" of 0 is a success the syscall never ran for).
fn no_flush_filter() -> Result<BpfProgram, FilterError> {
    let err = |e: seccompiler::BackendError| FilterError(e.to_string());
    let rules = NO_FLUSH.iter().map(|&nr| (nr, vec![])).collect();
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(0),
        arch()?,
    )
    .map_err(err)?;
    f.try_into().map_err(err)
}

/// `clone3` passes its flags in memory, out of the filter's reach: it is refused with
/// `ENOSYS`, so the C library falls back to `clone`, whose flags the filter sees.
fn clone3_filter() -> Result<BpfProgram, FilterError> {
    let err = |e: seccompiler::BackendError| FilterError(e.to_string());
    let rules = BTreeMap::from([(libc::SYS_clone3, vec![])]);
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch()?,
    )
    .map_err(err)?;
    f.try_into().map_err(err)
}

/// x32 syscalls carry the x86-64 audit architecture with bit 30 set in their number: a
/// filter keyed on x86-64 numbers would let them all through, so they are refused as a whole.
#[cfg(target_arch = "x86_64")]
fn x32_filter() -> BpfProgram {
    const X32_BIT: u32 = 0x4000_0000;
    let stmt = |code: u16, k: u32| sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    vec![
        // A = seccomp_data.nr
        stmt((libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16, 0),
        sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: X32_BIT,
        },
        stmt(
            (libc::BPF_RET | libc::BPF_K) as u16,
            libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        ),
        stmt(
            (libc::BPF_RET | libc::BPF_K) as u16,
            libc::SECCOMP_RET_ALLOW,
        ),
    ]
}

impl Confinement {
    pub(crate) fn new(limits: Limits) -> Result<Self, FilterError> {
        #[allow(unused_mut)]
        let mut filters = vec![deny_filter()?, clone3_filter()?, no_flush_filter()?];
        #[cfg(target_arch = "x86_64")]
        filters.push(x32_filter());
        Ok(Confinement { filters, limits })
    }

    /// In the sandbox's PID 1, right before exec.
    ///
    /// # Safety
    /// Only between fork and exec: makes raw syscalls on memory prepared before fork.
    pub(crate) unsafe fn apply(&self) -> io::Result<()> {
        let check = |r: libc::c_long| {
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        // SAFETY: raw syscalls on stack values and on the filters owned by `self`.
        unsafe {
            // A new session without a controlling terminal: `/dev/tty` names none, and no
            // terminal of the caller's can be made this session's.
            check(libc::setsid().into())?;
            // The caller's keys (a root builder's session keyring) stay out of reach.
            check(libc::syscall(
                libc::SYS_keyctl,
                KEYCTL_JOIN_SESSION_KEYRING,
                std::ptr::null::<libc::c_char>(),
            ))?;
            for (res, n) in [
                (libc::RLIMIT_NPROC, self.limits.processes),
                (libc::RLIMIT_FSIZE, self.limits.file_size),
                (libc::RLIMIT_NOFILE, self.limits.open_files),
            ] {
                let lim = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                check(libc::setrlimit(res, &lim).into())?;
            }
            // Marked close-on-exec rather than closed: the spawner's own exec-status pipe
            // still reports a failed exec, and nothing the builder's process held survives
            // the exec.
            check(libc::syscall(
                libc::SYS_close_range,
                3 as libc::c_uint,
                libc::c_uint::MAX,
                CLOSE_RANGE_CLOEXEC,
            ))?;
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into())?;
            for f in &self.filters {
                let prog = libc::sock_fprog {
                    len: f.len() as libc::c_ushort,
                    filter: f.as_ptr().cast_mut().cast(),
                };
                check(libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0 as libc::c_uint,
                    &raw const prog,
                ))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_compile_for_this_architecture() {
        let c = Confinement::new(Limits::default()).unwrap();
        assert!(c.filters.len() >= 2);
        assert!(c.filters.iter().all(|f| !f.is_empty() && f.len() < 4096));
    }
}
