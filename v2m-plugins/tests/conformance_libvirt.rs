//! The V2M conformance suite against the libvirt plugin and a real libvirtd (`qemu:///system`,
//! started by `.ci/libvirt-up.sh`). Scenarios libvirt cannot do on one host (live migration
//! between two domains, destinations prepared by us, killing QEMU under libvirt) are replaced by
//! a check that the plugin reports them as typed `Unsupported` errors.

mod common;
mod conformance;

use v2m::Plugin;
use v2m::libvirt::{LibvirtConfig, LibvirtPlugin};
use v2m::qemu::AccelPolicy;

struct Env {
    _dir: tempfile::TempDir,
    plugin: LibvirtPlugin,
}

fn env() -> Option<Env> {
    if !common::qemu_available() {
        return None;
    }
    let dir = testkit::short_tempdir("v2mlv");
    let plugin = LibvirtPlugin::new(LibvirtConfig {
        run_root: dir.path().to_path_buf(),
        accel: AccelPolicy::Tcg,
        ..LibvirtConfig::default()
    });
    if let v2m::Availability::NotAvailable { reason } = plugin.probe() {
        testkit::missing(
            &format!("a usable libvirtd ({reason})"),
            "apt-get install libvirt-daemon-system; bash .ci/libvirt-up.sh",
        );
        return None;
    }
    eprintln!("libvirt domains run with type='qemu' (TCG)");
    Some(Env { plugin, _dir: dir })
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let Some(f) = common::fixture() else { return };
            let Some(e) = env() else { return };
            conformance::$name(&e.plugin, &f);
        }
    )*};
}

conformance!(
    boot_pause_resume_stop,
    checkpoint_stop_restore,
    start_twice_is_typed_error,
    migrate_stopped_vm_is_typed_error,
    vcpu_threads_are_pinned,
    agent_channel_exists,
    same_host_migration_is_unsupported,
);

#[test]
fn prepared_destination_is_unsupported() {
    let Some(f) = common::fixture() else { return };
    let Some(e) = env() else { return };
    let p = common::profile(&f, "lvdst", 256);
    let err = e
        .plugin
        .prepare_incoming(
            &p,
            &v2m::MigrationTarget {
                host: "127.0.0.1".into(),
                port: 0,
                key: None,
                disks: Default::default(),
            },
        )
        .err()
        .expect("libvirt cannot prepare a bare destination");
    assert!(matches!(err, v2m::V2mError::Unsupported { .. }), "{err}");
}
