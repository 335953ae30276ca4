//! Live migration between "nodes" that share no storage, with real QEMU: node A runs the VM on
//! an overlay of its copy of the base image; node B has its own copy of the image in another
//! directory, boots the incoming VM on a fresh overlay of that copy, exports it over NBD
//! (TLS-PSK) and receives the overlay's allocated clusters by QEMU's block mirror before the
//! memory. The guest's data written before the move is on B's disk afterwards; B's QEMU never
//! opens a file of A. Shared storage is detected by the source's probe, not assumed; a source
//! with the wrong key leaves no mirror behind and runs on.
//!
//! Same guest as `boot_vm.rs` (`.ci/migrate-guest.sh`, running from its initramfs, root disk
//! as /dev/vda); without QEMU or the guest the tests skip (and fail under VSE_REQUIRE_ALL=1).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use testkit::fixture::Guest;
use v2m::qemu::{AccelPolicy, QemuConfig, QemuPlugin};
use v2m::{DiskMigration, MigrationKey, MigrationParams, StorageMode};
use vmhost::{BootOptions, DestDisks, Incoming, OverlayDir, RunningVm, VmSpec};
use vse_guest_agent::{Barriers, GuestLink, LinkOptions};
use vse_image::{ImageDir, MANIFEST, Manifest, Part};

const TIMEOUT: Duration = Duration::from_secs(300);
/// Where the marker goes on the guest's disk (in 512-byte sectors): well inside the 16 MiB
/// root disk, on a cluster the overlay has not allocated before.
const MARKER_SECTOR: u64 = 8192;

fn guest() -> Option<Guest> {
    testkit::require!(testkit::tool("qemu-system-x86_64") && testkit::tool("qemu-img"));
    testkit::fixture::migrate_guest()
}

/// One node's copy of the image: kernel, initramfs, a 16 MiB raw root disk, the manifest.
fn image_dir(dir: &Path, g: &Guest) -> ImageDir {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(&g.kernel, dir.join("vmlinuz")).unwrap();
    std::fs::copy(&g.initrd, dir.join("initrd.img")).unwrap();
    std::fs::File::create(dir.join("root.raw"))
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let mut parts = BTreeMap::new();
    for (name, file) in [
        ("kernel", "vmlinuz"),
        ("initrd", "initrd.img"),
        ("root", "root.raw"),
    ] {
        let size = std::fs::metadata(dir.join(file)).unwrap().len();
        let file = file.to_string();
        parts.insert(
            name.to_string(),
            Part {
                file,
                size,
                sha256: String::new(),
            },
        );
    }
    let m = Manifest::assembled("vmhost block migration test", &g.cmdline, parts);
    std::fs::write(dir.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
    ImageDir::open(dir).unwrap()
}

/// One QEMU plugin per node, both with the accelerator V2M's functional check picks.
fn plugins(tmp: &Path, kernel: &Path) -> Vec<QemuPlugin> {
    let bin = v2m::qemu::find_binary(Path::new("qemu-system-x86_64")).unwrap();
    let cache = testkit::fixture::cache_dir().join("kvm-check");
    let choice = v2m::qemu::accel::choose(AccelPolicy::Auto, &bin, kernel, &cache);
    let accel = match choice.accel {
        v2m::qemu::Accel::Kvm => AccelPolicy::Kvm,
        v2m::qemu::Accel::Tcg => AccelPolicy::Tcg,
    };
    (0..2)
        .map(|i| {
            QemuPlugin::new(QemuConfig {
                run_root: tmp.join(format!("node{i}")),
                accel,
                qmp_timeout: Duration::from_secs(60),
                die_with_parent: true,
                ephemeral: true,
                ..QemuConfig::default()
            })
        })
        .collect()
}

fn tmp(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("vbm-{tag}-"))
        .tempdir_in("/tmp")
        .unwrap()
}

fn run(link: &GuestLink, script: &str) -> (i32, String) {
    let mut out = String::new();
    let status = link
        .run(&["sh", "-c", script], BTreeMap::new(), &mut |_, d| {
            out.push_str(d)
        })
        .unwrap();
    (status, out)
}

/// Writes `marker` onto the guest's disk, straight to the block device, synced.
fn write_marker(vm: &RunningVm, marker: &str) {
    let script = format!(
        "printf '{marker}' | dd of=/dev/vda bs=512 seek={MARKER_SECTOR} conv=fsync 2>/dev/null && sync"
    );
    let (status, out) = run(vm.link(), &script);
    assert_eq!(status, 0, "writing the marker: {out}");
}

/// Reads the marker back from the disk itself, not from the guest's page cache.
fn read_marker(vm: &RunningVm, len: usize) -> String {
    let script = format!(
        "echo 3 > /proc/sys/vm/drop_caches; dd if=/dev/vda bs=512 skip={MARKER_SECTOR} count=1 2>/dev/null | head -c {len}"
    );
    let (status, out) = run(vm.link(), &script);
    assert_eq!(status, 0, "reading the marker: {out}");
    out
}

/// First sector of the writer's records: one 8-digit record per sector, in order.
const RECORDS_SECTOR: u64 = 16384;

/// Starts a guest process that keeps writing numbered records to the disk, each synced
/// before the next, until /tmp/stop exists; /tmp/last holds the last synced number.
fn start_writer(vm: &RunningVm) {
    let script = format!(
        "(i=0; while [ ! -e /tmp/stop ] && [ $i -lt 8000 ]; do \
           printf '%08d' $i | dd of=/dev/vda bs=512 seek=$(({RECORDS_SECTOR}+i)) conv=fsync 2>/dev/null || break; \
           echo $i > /tmp/last; i=$((i+1)); done; touch /tmp/stopped) >/dev/null 2>&1 &"
    );
    let (status, out) = run(vm.link(), &script);
    assert_eq!(status, 0, "starting the writer: {out}");
}

/// Stops the writer and checks that every record it synced, on either node, is on the disk
/// it runs on now: a write the mirror missed around the switch-over leaves a hole.
fn check_writer(vm: &RunningVm) -> u64 {
    let (status, last) = run(
        vm.link(),
        "touch /tmp/stop; while [ ! -e /tmp/stopped ]; do sleep 0.1; done; cat /tmp/last",
    );
    assert_eq!(status, 0, "stopping the writer: {last}");
    let last: u64 = last.trim().parse().unwrap();
    let script = format!(
        "echo 3 > /proc/sys/vm/drop_caches; dd if=/dev/vda bs=512 skip={RECORDS_SECTOR} count={} 2>/dev/null | tr -d '\\000'",
        last + 1
    );
    let (status, text) = run(vm.link(), &script);
    assert_eq!(status, 0, "reading the records: {text}");
    let want: String = (0..=last).map(|i| format!("{i:08}")).collect();
    assert!(
        text == want,
        "records 0..={last} are not all on the disk (first difference at byte {:?})",
        text.bytes().zip(want.bytes()).position(|(a, b)| a != b)
    );
    last
}

fn link_options() -> LinkOptions {
    LinkOptions::new(Duration::from_secs(120))
        .barriers(Barriers::None)
        .first_id(1_000_000)
        .cancel(Arc::new(AtomicBool::new(false)))
}

/// Every file QEMU process `pid` has open.
fn open_files(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .collect()
}

/// The source's half of a move to `incoming`, with `key`.
fn send(
    src: &mut RunningVm,
    incoming: &Incoming,
    key: &MigrationKey,
) -> Result<v2m::MigrationReport, vmhost::MigrateError> {
    vmhost::send_disks(
        src.vm_mut(),
        incoming.addr(),
        incoming.disks(),
        &params(),
        Some(key),
    )
}

fn params() -> MigrationParams {
    MigrationParams {
        timeout: Duration::from_secs(240),
        ..MigrationParams::default()
    }
}

#[test]
fn a_vm_moves_with_its_disk_to_a_node_that_shares_no_storage() {
    let Some(g) = guest() else { return };
    let t = tmp("copy");
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let image_a = image_dir(&a, &g);
    let image_b = image_dir(&b, &g);
    let nodes = plugins(t.path(), image_a.kernel());
    let spec = VmSpec::new(&image_a, "vbm-copy".parse().unwrap(), 1, 192);
    let opts = BootOptions::new("vbm-src", TIMEOUT);
    let mut src = vmhost::boot(&nodes[0], &spec, &opts).unwrap_or_else(|e| panic!("{e}"));
    let marker = "vse-block-copy-marker-0123456789";
    write_marker(&src, marker);
    // Writes go on while the disk is mirrored and the memory moves.
    start_writer(&src);
    let src_disk = src.profile().disks[0].path.clone();
    let src_dir = src_disk.parent().unwrap().to_path_buf();
    let src_pid = src.pid();

    // B never looks at A's paths: its profile is rebased on its own image copy.
    let profile = vmhost::on_local_image(src.profile(), &image_b);
    let key = MigrationKey::new([0x42; 32]);
    let listen = "127.0.0.1".parse().unwrap();
    let copy = DestDisks::Copy {
        scratch_prefix: "vbm-dst",
    };
    let incoming = Incoming::prepare_with(&nodes[1], &profile, listen, None, Some(&key), copy)
        .unwrap_or_else(|e| panic!("{e}"));
    let dst_profile = incoming.profile().clone();
    let dst_disk = dst_profile.disks[0].path.clone();
    let mut paths = vec![dst_profile.image.kernel.clone(), dst_disk.clone()];
    paths.extend(dst_profile.image.initrd.clone());
    paths.extend(dst_profile.image.root_disk.clone());
    for p in &paths {
        assert!(
            !p.starts_with(&a) && !p.starts_with(&src_dir),
            "the destination uses a path of the source: {}",
            p.display()
        );
    }
    assert!(dst_profile.image.root_disk.as_deref() == Some(image_b.root()));
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", incoming.pid())).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(
        !cmdline.contains(a.to_str().unwrap()) && !cmdline.contains(src_dir.to_str().unwrap()),
        "{cmdline}"
    );
    assert!(cmdline.contains(dst_disk.to_str().unwrap()), "{cmdline}");
    let DiskMigration::Copy { port } = incoming.disks() else {
        panic!("the destination announced no disk export")
    };
    assert_ne!(port, 0);

    let report = send(&mut src, &incoming, &key).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "block-copy migration: disk {} B, memory {} B, total {} ms, downtime {} ms ({report:?})",
        report.disk_bytes, report.transferred_bytes, report.total_time_ms, report.downtime_ms
    );
    assert_eq!(report.storage, StorageMode::BlockCopy);
    assert!(report.disk_bytes > 0, "{report:?}");
    assert!(report.transferred_bytes > 0, "{report:?}");
    // The source's copy is not needed any more: its VM and overlay go.
    drop(src);
    assert!(!vmhost::alive(src_pid), "the source QEMU is still running");
    assert!(!src_dir.exists(), "the source's overlay was left behind");

    let dst = incoming
        .finish(Duration::from_secs(120))
        .and_then(|arrived| arrived.connect(&link_options()))
        .unwrap_or_else(|e| panic!("{e}"));
    // The export lived only for the copy: nothing listens on its port any more.
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the destination's NBD server outlived the migration"
    );
    let open = open_files(dst.pid());
    assert!(
        open.contains(&dst_disk),
        "B's overlay is not open: {open:?}"
    );
    for f in &open {
        assert!(
            !f.starts_with(&a) && !f.starts_with(&src_dir),
            "the destination opened {}",
            f.display()
        );
    }
    assert_eq!(read_marker(&dst, marker.len()), marker);
    let records = check_writer(&dst);
    eprintln!("the guest synced records 0..={records} across the move; all are on B's disk");
    // The destination's overlay holds the copied cluster itself (not only its base).
    let map = std::process::Command::new("qemu-img")
        .args(["map", "-U", "--output=json"])
        .arg(&dst_disk)
        .output()
        .unwrap();
    let map: serde_json::Value = serde_json::from_slice(&map.stdout).unwrap();
    let at = MARKER_SECTOR * 512;
    let copied = map.as_array().unwrap().iter().any(|e| {
        let (start, len) = (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap());
        e["depth"] == 0 && e["data"] == true && start <= at && at < start + len
    });
    assert!(copied, "the marker's cluster is not in B's overlay: {map}");
    let (dst_pid, dst_dir) = (dst.pid(), dst_disk.parent().unwrap().to_path_buf());
    drop(dst);
    assert!(!vmhost::alive(dst_pid));
    assert!(
        !dst_dir.exists(),
        "the destination's overlay was left behind"
    );
}

/// The destination sees the source's probe next to the overlay: it opens the source's disk
/// in place, and nothing is copied. A probe that does not hold the token is not taken.
#[test]
fn shared_storage_is_detected_by_the_probe_and_used_in_place() {
    let Some(g) = guest() else { return };
    let t = tmp("shared");
    let image = image_dir(&t.path().join("img"), &g);
    let nodes = plugins(t.path(), image.kernel());
    let spec = VmSpec::new(&image, "vbm-shared".parse().unwrap(), 1, 192);
    let opts = BootOptions::new("vbm-shared", TIMEOUT);
    let mut src = vmhost::boot(&nodes[0], &spec, &opts).unwrap_or_else(|e| panic!("{e}"));
    let marker = "vse-shared-marker";
    write_marker(&src, marker);
    let disk = src.profile().disks[0].path.clone();
    let file = vmhost::leave_probe(&disk).unwrap();
    let probe = file.probe().clone();
    let mut forged = probe.clone();
    forged.token = "0".repeat(32);
    assert!(!forged.visible_with(&disk), "a wrong token was taken");
    let mut elsewhere = probe.clone();
    elsewhere.path = t.path().join(probe.path.file_name().unwrap());
    std::fs::write(&elsewhere.path, &probe.token).unwrap();
    assert!(
        !elsewhere.visible_with(&disk),
        "a probe away from the disk was taken"
    );
    assert!(
        probe.visible_with(&disk),
        "the probe next to the disk is not visible"
    );
    let disks = DestDisks::Shared;

    let key = MigrationKey::new([0x24; 32]);
    let listen = "127.0.0.1".parse().unwrap();
    let incoming =
        Incoming::prepare_with(&nodes[1], src.profile(), listen, None, Some(&key), disks)
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(incoming.disks(), DiskMigration::Shared);
    assert_eq!(incoming.profile().disks[0].path, disk);
    let report = send(&mut src, &incoming, &key).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (report.storage, report.disk_bytes),
        (StorageMode::Shared, 0)
    );
    drop(file);
    assert!(
        !probe.path.exists(),
        "the probe file outlived the migration"
    );
    src.migrated_away();
    let mut dst = incoming
        .finish(Duration::from_secs(120))
        .and_then(|arrived| arrived.connect(&link_options()))
        .unwrap_or_else(|e| panic!("{e}"));
    dst.set_overlay(OverlayDir::adopt(&disk));
    assert!(open_files(dst.pid()).contains(&disk), "not opened in place");
    assert_eq!(read_marker(&dst, marker.len()), marker);
}

/// A destination prepared with another key: the source's NBD client fails the TLS handshake,
/// the migration fails, the source runs on with its disk, and the dropped destination leaves
/// no process or overlay. The same source then moves to a destination with the right key,
/// so no mirror job or NBD client of the failed attempt was left in it.
#[test]
fn a_disk_copy_refused_by_the_destination_leaves_the_source_running() {
    let Some(g) = guest() else { return };
    let t = tmp("refuse");
    let image_a = image_dir(&t.path().join("a"), &g);
    let image_b = image_dir(&t.path().join("b"), &g);
    let nodes = plugins(t.path(), image_a.kernel());
    let spec = VmSpec::new(&image_a, "vbm-refuse".parse().unwrap(), 1, 192);
    let opts = BootOptions::new("vbm-refuse", TIMEOUT);
    let mut src = vmhost::boot(&nodes[0], &spec, &opts).unwrap_or_else(|e| panic!("{e}"));
    let marker = "vse-refused-marker";
    write_marker(&src, marker);
    let profile = vmhost::on_local_image(src.profile(), &image_b);
    let listen = "127.0.0.1".parse().unwrap();
    let copy = DestDisks::Copy {
        scratch_prefix: "vbm-refuse-dst",
    };
    let key = MigrationKey::new([0x11; 32]);
    let wrong = MigrationKey::new([0x99; 32]);

    let incoming = Incoming::prepare_with(&nodes[1], &profile, listen, None, Some(&key), copy)
        .unwrap_or_else(|e| panic!("{e}"));
    let (dst_pid, dst_dir) = (
        incoming.pid(),
        incoming.profile().disks[0]
            .path
            .parent()
            .unwrap()
            .to_path_buf(),
    );
    let e = send(&mut src, &incoming, &wrong)
        .expect_err("a source with the wrong key must not reach the disk export");
    eprintln!("wrong key: {e}");
    assert!(src.alive(), "the source stopped after a refused migration");
    assert_eq!(read_marker(&src, marker.len()), marker);
    drop(incoming);
    assert!(
        !vmhost::alive(dst_pid),
        "the destination QEMU was left behind"
    );
    assert!(
        !dst_dir.exists(),
        "the destination's overlay was left behind"
    );

    let incoming = Incoming::prepare_with(&nodes[1], &profile, listen, None, Some(&key), copy)
        .unwrap_or_else(|e| panic!("{e}"));
    let report = send(&mut src, &incoming, &key)
        .unwrap_or_else(|e| panic!("after the refused attempt: {e}"));
    assert!(report.disk_bytes > 0, "{report:?}");
    drop(src);
    let dst = incoming
        .finish(Duration::from_secs(120))
        .and_then(|arrived| arrived.connect(&link_options()))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(read_marker(&dst, marker.len()), marker);
}
