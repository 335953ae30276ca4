//! The sandbox of commands run inside an image root, on a real configured Debian root (apt's
//! choice of the required set and the cloud kernel, the host's mirror): such commands cannot
//! see or signal host processes, open a host block device or reach the network; the builder
//! does not follow a symlink they plant out of the root; and a post-install command that
//! installs a forbidden package or alters a protected file fails the build, named.

use imgbuild::build::{BuildOptions, build, builder_id};
use imgbuild::customize::{Customization, CustomizeError};
use imgbuild::deb::Records;
use imgbuild::guard::{Guard, Rule, Violation};
use imgbuild::layers::{CopyMode, LayerStore, base::configured_root};
use imgbuild::plan::BuildPlan;
use imgbuild::progress::Silent;
use imgbuild::rootfs::chroot::{ChrootError, RunOptions, base_env, run_in_root};
use sha2::{Digest, Sha256};
use std::cell::RefCell;
use std::path::{Path, PathBuf};

const EPOCH: u64 = 1_747_699_200;

fn plan() -> Option<BuildPlan> {
    if !testkit::tool("apt-get") || !testkit::require(testkit::is_root(), "root", "run as root") {
        return None;
    }
    Some(
        imgbuild::aptplan::plan_from_apt(
            &[
                imgbuild::aptplan::REQUIRED,
                "busybox-static",
                "linux-image-cloud-amd64",
            ],
            EPOCH,
        )
        .expect("apt resolves the minimal set"),
    )
}

/// A configured root of `plan` in `dir/rootfs` (from the layer store when it has it), a
/// full copy: what the commands do there reaches no kept layer.
fn root_of(plan: &BuildPlan, dir: &Path) -> (PathBuf, Records) {
    let cache = imgbuild::fetch::DebCache::open(&imgbuild::fetch::DebCache::default_root())
        .expect("download cache");
    let debs = cache
        .fetch_all(&plan.wants(), 4, &Silent)
        .expect("the packages download");
    let store = LayerStore::open(&LayerStore::default_dir()).expect("layer store");
    let root = dir.join("rootfs");
    std::fs::create_dir_all(&root).unwrap();
    let base = configured_root(
        plan,
        &builder_id(),
        Ok(&store),
        CopyMode::Full,
        &root,
        &debs,
        4 << 30,
        &Silent,
    )
    .expect("a configured root");
    (root, base.records)
}

/// Runs `script` with the image's /bin/sh in the sandbox; its status and every output line.
fn sh(root: &Path, script: &str, opts: RunOptions) -> (Result<(), ChrootError>, Vec<String>) {
    let lines = RefCell::new(Vec::new());
    let r = run_in_root(
        root,
        &["/bin/sh", "-c", script],
        &base_env(EPOCH),
        &opts,
        &|l| lines.borrow_mut().push(l.to_string()),
    );
    let lines = lines.into_inner();
    eprintln!("sandbox output: {lines:?}");
    (r, lines)
}

#[test]
fn host_processes_are_out_of_reach() {
    let Some(plan) = plan() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (root, _) = root_of(&plan, tmp.path());
    let me = std::process::id();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let (r, out) = sh(
        &root,
        &format!(
            "if kill -0 {me}; then echo SIGNALLED-HOST; fi; \
             echo PIDS $(ls /proc | grep -c '^[0-9]'); echo PID1 $(tr '\\0' ' ' < /proc/1/cmdline)"
        ),
        RunOptions::default(),
    );
    r.expect("the script runs");
    assert!(!out.iter().any(|l| l == "SIGNALLED-HOST"), "{out:?}");
    let pids: usize = out
        .iter()
        .find_map(|l| l.strip_prefix("PIDS "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no PIDS line: {out:?}"));
    // The shell, and the ls and grep of the pipeline: nothing of the host's.
    assert!(pids <= 4, "{pids} processes visible in /proc: {out:?}");
    assert!(
        out.iter().any(|l| l.starts_with("PID1 /bin/sh -c")),
        "the command is PID 1 of its own namespace: {out:?}"
    );
    // A failing command too; then nothing of either is mounted on the host.
    let (r, _) = sh(
        &root,
        "mount -t tmpfs x /mnt; exit 3",
        RunOptions::default(),
    );
    assert!(matches!(r, Err(ChrootError::Failed { .. })), "{r:?}");
    assert_eq!(
        std::fs::read_to_string("/proc/self/mountinfo").unwrap(),
        mounts,
        "the sandbox left a mount on the host"
    );
}

#[test]
fn host_block_devices_are_out_of_reach() {
    let Some(plan) = plan() else { return };
    // Every block device of the host, with its device number.
    let devs: Vec<(String, String)> = std::fs::read_dir("/sys/block")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let dev = std::fs::read_to_string(e.path().join("dev")).ok()?;
                    Some((name, dev.trim().replace(':', " ")))
                })
                .collect()
        })
        .unwrap_or_default();
    testkit::require!(
        !devs.is_empty(),
        "a block device in /sys/block",
        "run on a host with a disk"
    );
    let tmp = tempfile::tempdir().unwrap();
    let (root, _) = root_of(&plan, tmp.path());
    let mut script = String::from("echo DEV $(ls /dev); ");
    for (name, num) in &devs {
        script.push_str(&format!(
            "[ -e /dev/{name} ] && echo SEEN-{name}; \
             head -c 1 /dev/{name} >/dev/null 2>&1 && echo READ-{name}; \
             mknod /tmp/blk-{name} b {num} 2>/dev/null && echo MADE-{name}; \
             head -c 1 /tmp/blk-{name} >/dev/null 2>&1 && echo READ-MADE-{name}; "
        ));
    }
    script.push_str("echo DONE");
    let (r, out) = sh(&root, &script, RunOptions::default());
    r.expect("the script runs");
    assert!(out.iter().any(|l| l == "DONE"), "{out:?}");
    let reached: Vec<_> = out
        .iter()
        .filter(|l| ["SEEN-", "READ-", "MADE-"].iter().any(|p| l.starts_with(p)))
        .collect();
    assert!(
        reached.is_empty(),
        "host block devices reached: {reached:?}"
    );
    let dev = out
        .iter()
        .find_map(|l| l.strip_prefix("DEV "))
        .expect("the /dev listing");
    let names: Vec<&str> = dev.split_whitespace().collect();
    assert_eq!(
        names,
        [
            "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout",
            "urandom", "zero"
        ],
        "the sandbox's /dev is minimal"
    );
}

#[test]
fn the_network_is_loopback_only_unless_allowed() {
    let Some(plan) = plan() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let (root, _) = root_of(&plan, tmp.path());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    // bash (essential) has /dev/tcp.
    let script = format!(
        "bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' 2>/dev/null && echo CONNECTED; \
         echo IFACES $(tail -n +3 /proc/net/dev | cut -d: -f1)"
    );
    let (r, out) = sh(&root, &script, RunOptions::default());
    r.expect("the script runs");
    assert!(!out.iter().any(|l| l == "CONNECTED"), "{out:?}");
    assert!(out.iter().any(|l| l.trim() == "IFACES lo"), "{out:?}");
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "nothing reached the host's listener"
    );
    // The same command reaches it when the network is allowed: the check above can fail.
    let (r, out) = sh(
        &root,
        &script,
        RunOptions {
            allow_network: true,
        },
    );
    r.expect("the script runs");
    assert!(out.iter().any(|l| l == "CONNECTED"), "{out:?}");
}

fn sha256(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

#[test]
fn the_builder_follows_no_symlink_planted_by_post_install() {
    let Some(plan) = plan() else { return };
    let Some(agent) = testkit::fixture::env_file("VSE_GUEST_AGENT", "guest-agent.sh") else {
        return;
    };
    let host = testkit::short_tempdir("sandbox-host");
    let secret = host.path().join("kernel");
    std::fs::write(&secret, b"host file, not a kernel\n").unwrap();
    let logs = host.path().join("log");
    std::fs::create_dir(&logs).unwrap();
    for f in ["dpkg.log", "alternatives.log"] {
        std::fs::write(logs.join(f), b"host log\n").unwrap();
    }
    let (secret_s, logs_s) = (secret.display(), logs.display());
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = BuildOptions::new(tmp.path().join("image"), agent);
    opts.customization = Customization {
        post_install: vec![
            // The kernel the builder copies points at a host path (which, inside the
            // image, is the image's own file).
            format!(
                "mkdir -p {dir} && echo image kernel > {secret_s} && \
                 for k in /boot/vmlinuz-*; do ln -sf {secret_s} $k; done",
                dir = host.path().display()
            ),
            // The logs the builder scrubs are under a directory linked to a host one.
            format!("rm -rf /var/log && ln -s {logs_s} /var/log"),
        ],
        ..Customization::default()
    };
    let built = build(&plan, &opts, &Silent).expect("the build");
    assert_eq!(
        built.manifest.parts["kernel"].sha256,
        sha256(b"image kernel\n"),
        "the kernel was read inside the image"
    );
    assert_eq!(
        std::fs::read(&secret).unwrap(),
        b"host file, not a kernel\n"
    );
    for f in ["dpkg.log", "alternatives.log"] {
        assert_eq!(
            std::fs::read(logs.join(f)).ok().as_deref(),
            Some(&b"host log\n"[..]),
            "{f} on the host"
        );
    }
}

/// Applies `custom` to a configured root of `plan`.
fn apply(plan: &BuildPlan, custom: &Customization) -> Result<(), CustomizeError> {
    let tmp = tempfile::tempdir().unwrap();
    let (root, mut records) = root_of(plan, tmp.path());
    custom.apply(&root, &mut records, EPOCH, &Silent)
}

fn rule(value: &str) -> Rule {
    Rule {
        value: value.into(),
        origin: "site.policy.yaml:4:7".into(),
    }
}

#[test]
fn post_install_that_alters_a_protected_file_fails_named() {
    let Some(plan) = plan() else { return };
    let custom = Customization {
        post_install: vec![
            "echo harmless > /root/note".into(),
            "echo 99 > /etc/debian_version".into(),
        ],
        guard: Guard {
            protected: vec![rule("/etc/debian_version"), rule("/etc/apt")],
            forbidden: vec![],
        },
        ..Customization::default()
    };
    let e = apply(&plan, &custom).expect_err("the command breaks the policy");
    let CustomizeError::PolicyViolated {
        index: 2,
        command,
        violation,
    } = &e
    else {
        panic!("expected a violation by command 2, got {e}");
    };
    assert_eq!(command, "echo 99 > /etc/debian_version");
    match &**violation {
        Violation::Protected { path, change, rule } => {
            assert_eq!((path.as_str(), *change), ("/etc/debian_version", "changed"));
            assert_eq!(rule.value, "/etc/debian_version");
        }
        other => panic!("expected a protected-file violation, got {other}"),
    }
    let text = e.to_string();
    assert!(text.contains("post-install command 2") && text.contains("site.policy.yaml:4:7"));

    // A file added under a protected directory, too.
    let custom = Customization {
        post_install: vec![
            "echo 'deb http://mirror.example.org/debian x main' > /etc/apt/sources.list.d/x.list"
                .into(),
        ],
        ..custom
    };
    match apply(&plan, &custom) {
        Err(CustomizeError::PolicyViolated {
            index: 1,
            violation,
            ..
        }) => match *violation {
            Violation::Protected {
                path,
                change: "added",
                ..
            } => assert_eq!(path, "/etc/apt/sources.list.d/x.list"),
            other => panic!("expected an added protected file, got {other}"),
        },
        other => panic!("expected a violation by command 1, got {other:?}"),
    }
}

#[test]
fn post_install_that_installs_a_forbidden_package_fails_named() {
    let Some(plan) = plan() else { return };
    // A package made and installed offline from inside the image.
    let make = "mkdir -p /tmp/p/DEBIAN /tmp/p/usr/share/vse-demo && \
        printf 'Package: vse-forbidden-demo\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: t <t@example.org>\\nDescription: demo\\n' > /tmp/p/DEBIAN/control && \
        echo x > /tmp/p/usr/share/vse-demo/x && dpkg-deb --build /tmp/p /tmp/demo.deb";
    let install = "dpkg -i /tmp/demo.deb";
    let custom = Customization {
        post_install: vec![make.into(), install.into()],
        guard: Guard {
            protected: vec![],
            forbidden: vec![rule("vse-forbidden-*")],
        },
        ..Customization::default()
    };
    let e = apply(&plan, &custom).expect_err("the command breaks the policy");
    let CustomizeError::PolicyViolated {
        index: 2,
        command,
        violation,
    } = &e
    else {
        panic!("expected a violation by command 2, got {e}");
    };
    assert_eq!(command, install);
    match &**violation {
        Violation::Forbidden { package, rule, .. } => {
            assert_eq!(package, "vse-forbidden-demo");
            assert_eq!(rule.value, "vse-forbidden-*");
        }
        other => panic!("expected a forbidden package, got {other}"),
    }
}
