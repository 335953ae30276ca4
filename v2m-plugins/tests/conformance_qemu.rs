//! The V2M conformance suite run against the QEMU plugin (real QEMU, TCG unless
//! `VSE_TEST_ACCEL=auto` asks for the KVM functional check).

mod common;
mod conformance;

use std::path::Path;
use std::sync::Arc;
use v2m::Plugin;
use v2m::qemu::{AccelPolicy, QemuConfig, QemuPlugin};

struct Env {
    _dir: tempfile::TempDir,
    plugin: Arc<dyn Plugin>,
}

fn env() -> Option<Env> {
    if !common::qemu_available() {
        return None;
    }
    // Short path: unix socket paths must stay below 108 bytes.
    let dir = testkit::short_tempdir("v2m");
    let accel = match std::env::var("VSE_TEST_ACCEL").as_deref() {
        Ok("auto") => AccelPolicy::Auto,
        _ => AccelPolicy::Tcg,
    };
    let cfg = QemuConfig {
        run_root: dir.path().to_path_buf(),
        accel,
        ..QemuConfig::default()
    };
    eprintln!("accelerator policy: {accel:?} (tcg unless VSE_TEST_ACCEL=auto)");
    Some(Env {
        plugin: Arc::new(QemuPlugin::new(cfg)),
        _dir: dir,
    })
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let Some(f) = common::fixture() else { return };
            let Some(e) = env() else { return };
            conformance::$name(&*e.plugin, &f);
        }
    )*};
}

conformance!(
    boot_pause_resume_stop,
    checkpoint_stop_restore,
    live_migration,
    start_twice_is_typed_error,
    migrate_stopped_vm_is_typed_error,
    destination_port_in_use,
    sigkill_mid_migration,
    sigkill_then_operate,
    vcpu_threads_are_pinned,
    agent_channel_exists,
);

#[test]
fn qemu_binary_missing() {
    let Some(f) = common::fixture() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cfg = QemuConfig {
        binary: "/nonexistent/qemu-system-x86_64".into(),
        run_root: dir.path().to_path_buf(),
        accel: AccelPolicy::Tcg,
        ..QemuConfig::default()
    };
    let plugin = QemuPlugin::new(cfg);
    assert!(!plugin.probe().is_available());
    let err = plugin
        .define(&common::profile(&f, "nobin", 256))
        .err()
        .expect("define must fail");
    assert!(matches!(err, v2m::V2mError::BinaryNotFound { .. }), "{err}");
}

#[test]
fn kvm_functional_check_decides_accelerator() {
    let Some(f) = common::fixture() else { return };
    if !common::qemu_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = v2m::qemu::find_binary(Path::new("qemu-system-x86_64")).unwrap();
    let choice = v2m::qemu::accel::choose(AccelPolicy::Auto, &bin, &f.kernel, dir.path());
    eprintln!("accelerator: {} ({})", choice.accel.as_str(), choice.reason);
    let direct = v2m::qemu::accel::kvm_usable(&bin, &f.kernel);
    // The cached verdict and a fresh check agree; both come from really booting the kernel.
    assert_eq!(
        choice.accel == v2m::qemu::Accel::Kvm,
        direct.usable,
        "{} vs {}",
        choice.detail,
        direct.detail
    );
    let again = v2m::qemu::accel::choose(AccelPolicy::Auto, &bin, &f.kernel, dir.path());
    assert!(again.detail.contains("verdict cached"), "{}", again.detail);
    assert_eq!(again.reason, choice.reason);
    assert_eq!(again.accel, choice.accel);
}

/// Every VM runs under QEMU's seccomp sandbox, and its job-network NIC is a connected
/// descriptor: another local user writing to the NIC's UDP port finds no socket that takes
/// its datagrams (the kernel answers "connection refused"), where QEMU's own `-netdev dgram`
/// socket would have passed them to the guest.
#[test]
fn sandboxed_and_the_nic_takes_no_strangers_frames() {
    let Some(f) = common::fixture() else { return };
    let Some(e) = env() else { return };
    let Some(tester) = testkit::unpriv::tester() else {
        return;
    };
    let relay = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let local = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut p = common::profile(&f, "nic", 256);
    p.network = v2m::profile::Network {
        mode: v2m::profile::NetMode::Udp,
        mac: Some("02:fb:00:00:00:09".parse().unwrap()),
        local: Some(local),
        remote: Some(relay.local_addr().unwrap()),
        ..Default::default()
    };
    let mut vm = e.plugin.define(&p).unwrap();
    vm.start().unwrap();
    let pid = vm.status().unwrap().pid.unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.contains("\nSeccomp:\t2\n"),
        "QEMU runs unsandboxed:\n{status}"
    );
    // bash's /dev/udp connects its socket, so an ICMP "port unreachable" for one datagram
    // fails a later write: the refusal is seen without waiting for anything.
    let script = format!(
        "exec 3>/dev/udp/127.0.0.1/{port}; for i in $(seq 200); do \
         printf 'forged-frame' >&3 2>/dev/null || {{ echo refused; exit 0; }}; done; echo delivered",
        port = local.port()
    );
    let out = tester
        .command("bash")
        .args(["-c", &script])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        said.trim(),
        "refused",
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    vm.stop(std::time::Duration::from_secs(5)).unwrap();
}

/// A run directory another user planted (theirs, or one anybody may write) is refused before
/// anything is created or written in it: QEMU's sockets and the VM's pid would live there.
#[test]
fn a_planted_run_directory_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let Some(f) = common::fixture() else { return };
    let Some(tester) = testkit::unpriv::tester() else {
        return;
    };
    let planted = tester.scratch("v2m-planted");
    let st = tester
        .command("chmod")
        .arg("0777")
        .arg(planted.path())
        .status()
        .unwrap();
    assert!(st.success());
    // Root's own directory inside the planted one: the tester could swap it.
    let inside = planted.path().join("sub");
    std::fs::create_dir(&inside).unwrap();
    std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o700)).unwrap();
    for (root, why) in [
        (planted.path().to_path_buf(), "owned by uid"),
        (inside.clone(), "its parent"),
    ] {
        let plugin = QemuPlugin::new(QemuConfig {
            run_root: root.clone(),
            accel: AccelPolicy::Tcg,
            ..QemuConfig::default()
        });
        let e = plugin
            .define(&common::profile(&f, "planted", 256))
            .err()
            .expect("a planted run directory was used");
        assert!(matches!(e, v2m::V2mError::Unsafe(_)), "{e}");
        assert!(e.to_string().contains(why), "{e}");
    }
    assert_eq!(
        std::fs::read_dir(&inside).unwrap().count(),
        0,
        "created in a planted dir"
    );
    // Ours, but left open to everyone: refused too.
    let own = testkit::short_tempdir("v2m-open");
    std::fs::set_permissions(own.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let plugin = QemuPlugin::new(QemuConfig {
        run_root: own.path().to_path_buf(),
        accel: AccelPolicy::Tcg,
        ..QemuConfig::default()
    });
    let e = plugin
        .define(&common::profile(&f, "open", 256))
        .err()
        .expect("a world-writable run directory was used");
    assert!(e.to_string().contains("lets other users write"), "{e}");
}
