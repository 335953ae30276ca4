//! The skip-or-fail rule for missing components.

use std::path::{Path, PathBuf};

/// `VSE_REQUIRE_ALL=1` (set by `.ci/run`): a missing component fails its test.
pub fn require_all() -> bool {
    std::env::var("VSE_REQUIRE_ALL").as_deref() == Ok("1")
}

/// Reports a missing component: panics under `VSE_REQUIRE_ALL=1`, else prints
/// `skipped: …` (the caller then returns). `hint` says how to get it, e.g.
/// `apt-get install qemu-system-x86` or `run .ci/fixtures.sh`.
#[track_caller]
pub fn missing(what: &str, hint: &str) {
    if require_all() {
        panic!("required component missing: {what} ({hint}); VSE_REQUIRE_ALL=1 allows no skip");
    }
    eprintln!("skipped: {what} is missing ({hint})");
}

/// `ok`, after reporting the component as [`missing`] when it is not.
#[track_caller]
pub fn require(ok: bool, what: &str, hint: &str) -> bool {
    if !ok {
        missing(what, hint);
    }
    ok
}

/// Returns from the calling test (with `Default::default()`) unless a component is there.
///
/// `require!(cond, what, hint)` reports through [`require`](fn@crate::require);
/// `require!(check)` takes a check that reports itself, such as [`tool`] or
/// [`apt::require_suite`](crate::apt::require_suite).
#[macro_export]
macro_rules! require {
    ($ok:expr, $what:expr, $hint:expr $(,)?) => {
        if !$crate::require($ok, $what, $hint) {
            return ::core::default::Default::default();
        }
    };
    ($check:expr $(,)?) => {
        if !$check {
            return ::core::default::Default::default();
        }
    };
}

/// The Debian package that provides a command the tests use.
pub fn package_of(cmd: &str) -> Option<&'static str> {
    const PROVIDERS: &[(&str, &str)] = &[
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("qemu-img", "qemu-utils"),
        ("mke2fs", "e2fsprogs"),
        ("cpio", "cpio"),
        ("scontrol", "slurm-client"),
        ("salloc", "slurm-client"),
        ("srun", "slurm-client"),
        ("mpirun", "openmpi-bin"),
        ("mpicc", "libopenmpi-dev"),
        ("perl", "perl-base"),
        ("ip", "iproute2"),
        ("dpkg", "dpkg"),
        ("dpkg-query", "dpkg"),
        ("dpkg-deb", "dpkg"),
        ("apt-get", "apt"),
        ("apt-config", "apt"),
        ("virsh", "libvirt-clients"),
        ("libvirtd", "libvirt-daemon-system"),
        ("busybox", "busybox-static"),
        ("zstd", "zstd"),
        ("mmdebstrap", "mmdebstrap"),
        ("umoci", "umoci"),
        ("skopeo", "skopeo"),
        ("chromium", "chromium"),
    ];
    PROVIDERS.iter().find(|(c, _)| *c == cmd).map(|(_, p)| *p)
}

/// The executable `cmd` would run as: a path with a slash as is, else the first match on
/// `PATH` (what `Command::new(cmd)` runs).
pub fn on_path(cmd: &str) -> Option<PathBuf> {
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if cmd.contains('/') {
        let p = PathBuf::from(cmd);
        return executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(cmd))
        .find(|p| executable(p))
}

/// `cmd` is on `PATH` (no report: for tests that branch on it).
pub fn have(cmd: &str) -> bool {
    on_path(cmd).is_some()
}

/// `cmd` is on `PATH`, or it is reported [`missing`] with the package that provides it.
#[track_caller]
pub fn tool(cmd: &str) -> bool {
    let hint = match package_of(cmd) {
        Some(p) => format!("apt-get install {p}"),
        None => "install the package that provides it".to_string(),
    };
    require(have(cmd), &format!("`{cmd}` on PATH"), &hint)
}

/// The tests run as root (namespaces, cgroups, the Slurm test cluster need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_commands_like_exec_does() {
        assert!(have("sh"));
        assert!(!have("vse-no-such-command"));
        assert_eq!(on_path("/bin/sh"), Some(PathBuf::from("/bin/sh")));
        assert_eq!(package_of("qemu-img"), Some("qemu-utils"));
    }

    fn skipping() -> bool {
        crate::require!(false, "a component", "a hint");
        true
    }

    #[test]
    fn require_returns_from_the_caller_unless_everything_is_required() {
        if require_all() {
            let r = std::panic::catch_unwind(skipping);
            let msg = r.unwrap_err();
            let msg = msg.downcast_ref::<String>().unwrap();
            assert!(msg.contains("a component (a hint)"), "{msg}");
        } else {
            assert!(!skipping());
        }
    }
}
