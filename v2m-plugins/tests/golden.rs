//! Golden files: the exact configuration each config-generating plugin produces for the same
//! profiles (`tests/golden/`). `VSE_BLESS=1` rewrites them (refused under
//! CI); review the diff like code.
//! Formats: xl.cfg(5) for Xen, the Palacios `<vm>` XML guest configuration, and QEMU argv.

use std::path::{Path, PathBuf};
use v2m::{Disk, DiskFormat, ImageRef, NetMode, Network, Plugin, Profile, V2mError};

fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    testkit::golden::check(&path, actual);
}

/// A compute-node profile: pinned, NUMA-bound, bridged, with a per-VM overlay disk.
fn bridged(format: DiskFormat) -> Profile {
    let mut p = Profile::new(
        "job42-n3".parse().unwrap(),
        4,
        2048,
        ImageRef {
            kernel: "/var/lib/vse/images/hpc/vmlinuz".into(),
            initrd: Some("/var/lib/vse/images/hpc/initrd.img".into()),
            root_disk: Some("/var/lib/vse/images/hpc/root.qcow2".into()),
            cmdline: "console=ttyS0 root=/dev/vda ro".into(),
        },
    );
    p.cpuset = Some("2-3".parse().unwrap());
    p.numa_node = Some(0);
    p.disks = vec![
        Disk {
            path: "/var/lib/vse/overlays/job42-n3.qcow2".into(),
            format,
            readonly: false,
        },
        Disk {
            path: "/var/lib/vse/data/inputs.img".into(),
            format,
            readonly: true,
        },
    ];
    p.network = Network {
        mode: NetMode::Bridge,
        bridge: Some("vsebr0".into()),
        mac: Some("52:54:00:2a:00:03".parse().unwrap()),
        ip: Some("10.42.0.3".parse().unwrap()),
        prefix_len: Some(16),
        gateway: Some("10.42.0.1".parse().unwrap()),
        hostname: Some("job42-n3".parse().unwrap()),
        ..Network::default()
    };
    p
}

fn minimal() -> Profile {
    Profile::new(
        "tiny".parse().unwrap(),
        1,
        256,
        ImageRef {
            kernel: "/k/vmlinuz".into(),
            initrd: None,
            root_disk: None,
            cmdline: "console=ttyS0 quiet".into(),
        },
    )
}

#[test]
fn xen_xl_cfg() {
    let xen = v2m::xen::XenPlugin {
        run_root: PathBuf::from("/run/vse/xen"),
    };
    golden(
        "xen-bridged.xl.cfg",
        &xen.explain(&bridged(DiskFormat::Qcow2)).unwrap().text,
    );
    golden("xen-minimal.xl.cfg", &xen.explain(&minimal()).unwrap().text);
    let mut p = minimal();
    p.network.mode = NetMode::User;
    let e = xen.explain(&p).unwrap_err();
    assert!(
        matches!(e, V2mError::Unsupported { plugin: "xen", .. }),
        "{e}"
    );
}

#[test]
fn palacios_xml() {
    let pal = v2m::palacios::PalaciosPlugin;
    golden(
        "palacios-bridged.xml",
        &pal.explain(&bridged(DiskFormat::Raw)).unwrap().text,
    );
    // Its documented limits are typed errors, not silently dropped settings.
    let e = pal.explain(&bridged(DiskFormat::Qcow2)).unwrap_err();
    assert!(
        matches!(e, V2mError::Unsupported { .. }) && e.to_string().contains("raw"),
        "{e}"
    );
    let e = pal.explain(&minimal()).unwrap_err();
    assert!(e.to_string().contains("no direct kernel boot"), "{e}");
}

#[test]
fn qemu_argv() {
    let cfg = v2m::qemu::QemuConfig {
        binary: "/usr/bin/qemu-system-x86_64".into(),
        run_root: "/run/vse/v2m".into(),
        accel: v2m::qemu::AccelPolicy::Tcg,
        ..Default::default()
    };
    let q = v2m::qemu::QemuPlugin::new(cfg);
    golden(
        "qemu-bridged.argv",
        &q.explain(&bridged(DiskFormat::Qcow2)).unwrap().text,
    );
}

#[test]
fn config_only_plugins_report_absence_honestly() {
    for plugin in [
        &v2m::xen::XenPlugin::default() as &dyn Plugin,
        &v2m::palacios::PalaciosPlugin,
    ] {
        let probe = plugin.probe();
        eprintln!("{}: {probe:?}", plugin.kind());
        let mut p = bridged(DiskFormat::Raw);
        p.name = "absent".parse().unwrap();
        match plugin.define(&p) {
            Ok(_) => panic!("{} claimed to define a VM", plugin.kind()),
            Err(V2mError::NotAvailable { reason, .. }) => {
                assert!(!probe.is_available());
                assert!(!reason.is_empty());
            }
            Err(V2mError::Unsupported { .. }) => assert!(probe.is_available()),
            Err(other) => panic!("unexpected error {other}"),
        }
    }
}

#[cfg(feature = "libvirt")]
#[test]
fn libvirt_domain_xml() {
    let xml = v2m::libvirt::xml::domain_xml(
        &bridged(DiskFormat::Qcow2),
        Path::new("/usr/bin/qemu-system-x86_64"),
        Path::new("/run/vse/libvirt/job42-n3/console.log"),
        v2m::qemu::Accel::Tcg,
    );
    golden("libvirt-bridged.xml", &xml);
    let live = "<channel type='unix'>\n<source mode='bind' path='/var/lib/libvirt/qemu/channel/target/domain-1-x/org.vse.agent.0'/>\n<target type='virtio' name='org.vse.agent.0' state='disconnected'/>";
    assert_eq!(
        v2m::libvirt::xml::agent_socket_from_live_xml(live).as_deref(),
        Some("/var/lib/libvirt/qemu/channel/target/domain-1-x/org.vse.agent.0")
    );
}
