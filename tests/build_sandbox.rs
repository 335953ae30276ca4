//! The build sandbox seen from inside: a spec's `post_install` probe, run by `vse build` started
//! from a terminal (its controlling terminal, as an admin's shell would be) with a descriptor
//! the caller left open. The probe reports the sandbox's own view and then fails the build,
//! so its report is the build's error and no image is written.

mod support;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

/// The probe (dash and perl-base are Essential, so in every image). Each check prints one
/// line; stderr joins stdout so that the build's error shows everything in order.
const PROBE: &str = r#"exec 2>&1
set +e
grep -E '^(CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | tr -d '\t' | sed 's/^/STATUS /'
echo "UIDMAP $(cat /proc/self/uid_map | tr -s ' ' | sed 's/^ //')"
echo "GIDMAP $(cat /proc/self/gid_map | tr -s ' ' | sed 's/^ //')"
if unshare -Ur true 2>/dev/null; then echo UNSHARE-USERNS-OK; else echo UNSHARE-USERNS-REFUSED; fi
perl -e '$|=1; my $r = syscall(56, 0x10000011, 0, 0, 0, 0); if ($r == 0) { exit 0 } if ($r > 0) { waitpid($r, 0); print "CLONE-USERNS-OK\n" } else { print "CLONE-USERNS-REFUSED $!\n" }'
perl -e 'syscall(435, 0, 0); print "CLONE3 $!\n"'
echo "TTY $(tty)"
perl -e 'if (open(my $t, "+<", "/dev/tty")) { print "DEVTTY-OPENED\n"; for my $c (split //, "echo INJECTED\n") { ioctl($t, 0x5412, $c) or do { print "DEVTTY-TIOCSTI-FAILED $!\n"; exit 0 } } print "DEVTTY-TIOCSTI-INJECTED\n" } else { print "DEVTTY-NOT-OPENED $!\n" }'
setsid -w perl -e '$|=1; $SIG{HUP}="IGNORE"; open(my $m, "+<", "/dev/ptmx") or die "ptmx: $!"; my $n = pack("I", 0); ioctl($m, 0x80045430, $n) or die "TIOCGPTN: $!"; my $z = pack("i", 0); ioctl($m, 0x40045431, $z) or die "unlock: $!"; open(my $s, "+<", "/dev/pts/" . unpack("I", $n)) or die "pts: $!"; open(my $st, "<", "/proc/self/stat"); my @f = split / /, <$st>; print "OWN-PTY-CTTY $f[6]\n"; my $c = "x"; if (ioctl($s, 0x5412, $c)) { print "OWN-PTY-TIOCSTI-OK\n" } else { print "OWN-PTY-TIOCSTI-FAILED $!\n" }'
perl -e 'syscall(250, 1, 0) < 0 ? print "KEYCTL-REFUSED $!\n" : print "KEYCTL-OK\n"'
perl -e 'for my $p (1, getppid()) { for (glob "/proc/$p/fd/*") { my ($n) = m{(\d+)$}; my $t = readlink $_; print "INHERITED-FD $p $n $t\n" if $n > 2 && $t ne "/probe.sh" } }'
ls -l /proc/self/fd | grep -q vse-leak-marker && echo MARKER-VISIBLE
grep -E '^Max (processes|file size|open files) ' /proc/self/limits | tr -s ' ' | sed 's/^/LIMIT /'
echo PROBE-DONE
exit 1
"#;

fn spec(dir: &Path) -> std::path::PathBuf {
    let base = std::fs::read_to_string(support::specs().join("minimal.vse.yaml")).unwrap();
    let mut text = base.replace("\nname: minimal", "\nname: sandbox-probe");
    text.push_str("files:\n  - path: /probe.sh\n    content: |\n");
    for l in PROBE.lines() {
        text.push_str("      ");
        text.push_str(l);
        text.push('\n');
    }
    text.push_str("post_install:\n  - sh /probe.sh\n");
    let p = dir.join("probe.vse.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

/// The arguments of `vse build SPEC` under the site policy into `out`, with the guest agent
/// vse carries (none from the environment).
fn build_args(cmd: &mut Command, spec: &Path, out: &Path) {
    cmd.arg("build")
        .arg(spec)
        .arg("--policy")
        .arg(support::specs().join("site.policy.yaml"))
        .arg("--allow-expired")
        .arg("-o")
        .arg(out)
        .env_remove("VSE_GUEST_AGENT");
}

/// A new pseudo-terminal: (master, slave), neither the test's controlling terminal.
fn pty() -> (OwnedFd, OwnedFd) {
    // SAFETY: plain libc calls; each descriptor is checked and owned once.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(m >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let mut name = [0 as libc::c_char; 64];
        assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
        let s = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NONBLOCK,
        );
        assert!(s >= 0, "open the pty: {}", std::io::Error::last_os_error());
        (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s))
    }
}

/// `vse build SPEC` in a session whose controlling terminal is `tty` (its stdin), with the
/// test's `leak` open at descriptor 9 (not close-on-exec), as `cmd` (root or the tester).
fn build_from_terminal(
    mut cmd: Command,
    spec: &Path,
    out: &Path,
    tty: &OwnedFd,
    leak: &OwnedFd,
) -> Output {
    let leak = leak.as_raw_fd();
    cmd.arg("--ctty")
        .arg("--wait")
        .arg(env!("CARGO_BIN_EXE_vse"));
    build_args(&mut cmd, spec, out);
    cmd.stdin(std::fs::File::from(tty.try_clone().unwrap()));
    // SAFETY: dup2 only, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(leak, 9) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().unwrap()
}

/// The probe's lines from the build's error.
fn probe_lines(o: &Output) -> Vec<String> {
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("vse build: {err}");
    let lines: Vec<String> = err.lines().map(|l| l.trim().to_string()).collect();
    assert!(
        lines.iter().any(|l| l == "PROBE-DONE"),
        "the probe did not run to its end: {err}"
    );
    lines
}

fn has(lines: &[String], want: &str) -> bool {
    lines.iter().any(|l| l == want)
}

fn status(lines: &[String], field: &str) -> String {
    let p = format!("STATUS {field}:");
    lines
        .iter()
        .find_map(|l| l.strip_prefix(&p))
        .unwrap_or_else(|| panic!("no {field} in {lines:?}"))
        .trim()
        .to_string()
}

/// Checks the confinement every sandbox has (root's or a user's build).
fn assert_confined(lines: &[String], injected: &[u8]) {
    let all = lines.join("\n");
    assert_eq!(status(lines, "NoNewPrivs"), "1", "{all}");
    assert_eq!(status(lines, "Seccomp"), "2", "{all}");
    assert_eq!(status(lines, "CapAmb"), "0000000000000000", "{all}");
    let bnd = u64::from_str_radix(&status(lines, "CapBnd"), 16).unwrap();
    for f in ["CapPrm", "CapEff"] {
        let v = u64::from_str_radix(&status(lines, f), 16).unwrap();
        assert_eq!(v & !bnd, 0, "{f} beyond the bounding set: {all}");
    }
    const CAP_SYS_ADMIN: u64 = 1 << 21;
    const CAP_SYS_PTRACE: u64 = 1 << 19;
    const CAP_SYS_MODULE: u64 = 1 << 16;
    assert_eq!(
        bnd & (CAP_SYS_ADMIN | CAP_SYS_PTRACE | CAP_SYS_MODULE),
        0,
        "{all}"
    );
    assert!(has(lines, "UNSHARE-USERNS-REFUSED"), "{all}");
    assert!(
        has(lines, "CLONE-USERNS-REFUSED Operation not permitted"),
        "{all}"
    );
    assert!(has(lines, "CLONE3 Function not implemented"), "{all}");
    assert!(has(lines, "TTY not a tty"), "{all}");
    assert!(
        lines.iter().any(|l| l.starts_with("DEVTTY-NOT-OPENED")),
        "the caller's terminal is reachable: {all}"
    );
    // Its own pseudo-terminal, made its controlling one: TIOCSTI is refused by the filter.
    let ctty = lines
        .iter()
        .find_map(|l| l.strip_prefix("OWN-PTY-CTTY "))
        .unwrap_or_else(|| panic!("no OWN-PTY-CTTY: {all}"));
    assert_ne!(
        ctty, "0",
        "the probe's own pty did not become its terminal: {all}"
    );
    assert!(
        has(lines, "OWN-PTY-TIOCSTI-FAILED Operation not permitted"),
        "{all}"
    );
    assert!(
        has(lines, "KEYCTL-REFUSED Operation not permitted"),
        "{all}"
    );
    let fds: Vec<_> = lines
        .iter()
        .filter(|l| l.starts_with("INHERITED-FD"))
        .collect();
    assert!(fds.is_empty(), "inherited descriptors: {fds:?}\n{all}");
    assert!(!has(lines, "MARKER-VISIBLE"), "{all}");
    for l in [
        "LIMIT Max processes 1024 1024 processes",
        "LIMIT Max file size 8589934592 8589934592 bytes",
        "LIMIT Max open files 4096 4096 files",
    ] {
        assert!(has(lines, l), "{l}: {all}");
    }
    assert!(
        injected.is_empty(),
        "input injected into the caller's terminal: {:?}",
        String::from_utf8_lossy(injected)
    );
}

/// What waits in the terminal's input queue (what a TIOCSTI pushed into it).
fn pending_input(slave: &OwnedFd) -> Vec<u8> {
    let mut buf = [0u8; 256];
    // SAFETY: read(2) into a stack buffer from a non-blocking descriptor we own.
    let n = unsafe { libc::read(slave.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    buf[..n.max(0) as usize].to_vec()
}

#[test]
fn a_root_build_sandbox_is_confined_seen_from_inside() {
    if !support::host_lists()
        || !testkit::tool("setsid")
        || !testkit::require(testkit::is_root(), "root", "run as root")
    {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let spec = spec(tmp.path());
    let marker = tmp.path().join("vse-leak-marker");
    std::fs::write(&marker, b"the caller's file\n").unwrap();
    let leak = OwnedFd::from(std::fs::File::open(&marker).unwrap());
    let (_master, slave) = pty();
    // A site's own base for the sandbox's host ids.
    let base = 0x6000_0000u32;
    let mut setsid = Command::new("setsid");
    setsid.env(imgbuild::rootfs::idbase::ENV, format!("{base:#x}"));
    let o = build_from_terminal(setsid, &spec, &tmp.path().join("image"), &slave, &leak);
    assert!(!o.status.success(), "the probe fails the build");
    let lines = probe_lines(&o);
    assert!(has(&lines, &format!("UIDMAP 0 {base} 65536")), "{lines:?}");
    assert!(has(&lines, &format!("GIDMAP 0 {base} 65536")), "{lines:?}");
    assert_confined(&lines, &pending_input(&slave));
}

#[test]
fn a_sandbox_id_base_that_meets_a_host_account_is_refused() {
    if !support::host_lists() || !testkit::require(testkit::is_root(), "root", "run as root") {
        return;
    }
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let spec = spec(tmp.path());
    // The subordinate ids useradd gave the account (which it may map with newuidmap): a
    // base just below them.
    let subuid = std::fs::read_to_string("/etc/subuid").unwrap_or_default();
    let first = subuid.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() == 3 && f[0] == t.name)
            .then(|| f[1].parse::<u32>().ok())
            .flatten()
    });
    testkit::require!(
        first.is_some_and(|f| f >= 65536 + 100),
        "subordinate ids of vse-tester in /etc/subuid",
        "useradd gives them (SUB_UID_COUNT in /etc/login.defs); bash .ci/tester-up.sh"
    );
    let base = first.unwrap_or_default() - 100;
    let mut cmd = support::vse();
    build_args(&mut cmd, &spec, &tmp.path().join("image"));
    let o = (cmd.env(imgbuild::rootfs::idbase::ENV, base.to_string()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("of `{}`", t.name))
            && err.contains("/etc/subuid:")
            && err.contains("VSE_BUILD_ID_BASE"),
        "{err}"
    );
    assert!(!err.contains("PROBE-DONE"), "a command ran: {err}");
    assert!(
        !err.contains("fetching packages"),
        "refused only after work was done: {err}"
    );
}

#[test]
fn a_spec_source_reached_through_a_symlink_fails_the_build_with_exit_2() {
    if !support::host_lists() {
        return;
    }
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    // The account's spec names a file of its directory that it has made a symlink (inside the
    // directory, so the spec's own check passes): the root build refuses it at the read.
    let scratch = t.scratch("source-link");
    let dir = scratch.path();
    let base = std::fs::read_to_string(support::specs().join("minimal.vse.yaml")).unwrap();
    t.write(
        &dir.join("job.vse.yaml"),
        format!("{base}files:\n  - path: /etc/stolen\n    source: data.txt\n"),
    );
    t.write(&dir.join("real.txt"), "inside\n");
    let s = t
        .command("ln")
        .args(["-s", "real.txt"])
        .arg(dir.join("data.txt"))
        .status()
        .unwrap();
    assert!(s.success());
    let out = tempfile::tempdir().unwrap();
    let mut cmd = support::vse();
    build_args(
        &mut cmd,
        &dir.join("job.vse.yaml"),
        &out.path().join("image"),
    );
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("/etc/stolen") && err.contains("symlink") && err.contains("hint:"),
        "{err}"
    );
    assert!(!out.path().join("image").exists());
}

/// No scratch directory of a build is left next to `out`'s parent (a finished build removes
/// its own in the background, so this waits up to a minute).
fn no_scratch_left(dir: &Path) {
    let scratch = || -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".vse-build-"))
            .collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !scratch().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(scratch(), Vec::<String>::new(), "left in {}", dir.display());
}

#[test]
fn a_rootless_build_sandbox_maps_the_user_s_subordinate_ids_and_is_confined() {
    if !support::host_lists() || !testkit::tool("setsid") || !testkit::tool("newuidmap") {
        return;
    }
    let Some(t) = testkit::unpriv::tester() else {
        return;
    };
    let scratch = t.scratch("rootless-probe");
    let dir = scratch.path();
    let spec = spec(dir);
    t.chown(&spec);
    let marker = dir.join("vse-leak-marker");
    t.write(&marker, b"the caller's file\n");
    let leak = OwnedFd::from(std::fs::File::open(&marker).unwrap());
    let (_master, slave) = pty();
    let o = build_from_terminal(
        t.command("setsid"),
        &spec,
        &dir.join("image"),
        &slave,
        &leak,
    );
    assert!(!o.status.success(), "the probe fails the build");
    let lines = probe_lines(&o);
    // The user's namespace is the user at 0 and its subordinate ids at 1..65535; the
    // sandbox maps them one to one, a line for each line of the user's map.
    for map in ["UIDMAP", "GIDMAP"] {
        assert!(has(&lines, &format!("{map} 0 0 1")), "{lines:?}");
    }
    assert!(has(&lines, "1 1 65535"), "{lines:?}");
    assert_confined(&lines, &pending_input(&slave));
    // Its files belong to subordinate ids, which the user could not remove: the build did.
    no_scratch_left(dir);
}

#[test]
fn a_user_without_subordinate_ids_is_told_the_fix_before_any_download() {
    if !support::host_lists() || !testkit::require(testkit::is_root(), "root", "run as root") {
        return;
    }
    // An id with no account and no range in /etc/subuid.
    let id = 4242;
    let scratch = testkit::short_tempdir("nosubid");
    let dir = scratch.path();
    std::os::unix::fs::chown(dir, Some(id), Some(id)).unwrap();
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=4242", "--regid=4242", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_vse"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .env("VSE_CACHE", dir.join("cache"))
        .current_dir(dir);
    build_args(
        &mut cmd,
        &support::specs().join("minimal.vse.yaml"),
        &dir.join("image"),
    );
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for want in ["/etc/subuid", "`4242`", "usermod --add-subuids", "uidmap"] {
        assert!(err.contains(want), "{want}: {err}");
    }
    assert!(!dir.join("cache/debs").exists(), "downloads began: {err}");
}
