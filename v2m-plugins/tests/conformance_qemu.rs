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
