//! Real VMs through vmhost (QEMU, TCG on this kind of machine): an image directory boots on
//! its own disk overlay and runs a command through the guest agent; a VM moves to another
//! "node" (a second run directory) with vmhost's migration steps while a command runs, and a
//! new guest agent link on the destination adopts that command; a migration listener turns
//! away connections without the migration key and still takes the real source afterwards.
//!
//! The image is the guest of `.ci/migrate-guest.sh` (Debian kernel, busybox initramfs with the
//! guest agent as PID 1) in an image directory with a manifest, like `vse build` writes; it
//! runs from its initramfs, so its root disk can be small. Without QEMU or the guest the tests
//! skip (and fail under VSE_REQUIRE_ALL=1).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use testkit::fixture::Guest;
use v2m::qemu::{AccelPolicy, QemuConfig, QemuPlugin};
use vmhost::{BootOptions, Incoming, OverlayDir, VmSpec};
use vse_guest_agent::{Barriers, LinkOptions};
use vse_image::{ImageDir, MANIFEST, Manifest, Part};

fn cache() -> PathBuf {
    testkit::fixture::cache_dir()
}

/// The migration test guest, with QEMU and qemu-img.
fn guest() -> Option<Guest> {
    testkit::require!(testkit::tool("qemu-system-x86_64") && testkit::tool("qemu-img"));
    testkit::fixture::migrate_guest()
}

/// An image directory around the guest: its kernel and initramfs linked in, a small raw root
/// disk, and the manifest listing the three parts.
fn image_dir(dir: &Path, g: &Guest) -> ImageDir {
    // Copies, not symlinks: an image's parts must be regular files inside its directory.
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
        let sha256 = String::new();
        let file = file.to_string();
        parts.insert(name.to_string(), Part { file, size, sha256 });
    }
    let m = Manifest::assembled("vmhost test", &g.cmdline, parts);
    std::fs::write(dir.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
    ImageDir::open(dir).unwrap()
}

/// One QEMU plugin per "node", all with the same accelerator (both ends of a migration must
/// agree): V2M's functional KVM check, its verdict cached like the other VM tests'.
fn plugins(tmp: &Path, kernel: &Path, n: usize) -> Vec<QemuPlugin> {
    let bin = v2m::qemu::find_binary(Path::new("qemu-system-x86_64")).unwrap();
    let choice =
        v2m::qemu::accel::choose(AccelPolicy::Auto, &bin, kernel, &cache().join("kvm-check"));
    eprintln!("accelerator: {} ({})", choice.accel.as_str(), choice.reason);
    let accel = match choice.accel {
        v2m::qemu::Accel::Kvm => AccelPolicy::Kvm,
        v2m::qemu::Accel::Tcg => AccelPolicy::Tcg,
    };
    (0..n)
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

/// Short paths: unix socket paths must stay below 108 bytes.
fn tmp(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("vmh-{tag}-"))
        .tempdir_in("/tmp")
        .unwrap()
}

fn run(link: &vse_guest_agent::GuestLink, script: &str) -> (i32, String) {
    let mut out = String::new();
    let status = link
        .run(&["sh", "-c", script], BTreeMap::new(), &mut |_, d| {
            out.push_str(d)
        })
        .unwrap();
    (status, out)
}

#[test]
fn an_image_boots_on_its_own_overlay_and_runs_a_command() {
    let Some(g) = guest() else { return };
    let t = tmp("boot");
    std::fs::create_dir(t.path().join("img")).unwrap();
    let image = image_dir(&t.path().join("img"), &g);
    let plugin = &plugins(t.path(), image.kernel(), 1)[0];
    let mut spec = VmSpec::new(&image, "vmh-boot".parse().unwrap(), 1, 192);
    spec.pin(&[0]).unwrap();
    let mut vm = vmhost::boot(plugin, &spec, &BootOptions::new("vmhost-test", TIMEOUT))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        !vm.link().kernel().is_empty(),
        "the agent announced its kernel"
    );
    assert!(vm.alive());
    let overlay = vm.profile().disks[0].path.clone();
    assert!(overlay.is_file(), "{}", overlay.display());
    assert_eq!(vm.profile().image.root_disk.as_deref(), Some(image.root()));
    let (status, out) = run(vm.link(), "echo hello from $(hostname); exit 7");
    assert_eq!(status, 7, "{out}");
    assert!(out.starts_with("hello from"), "{out}");
    // The overlay is the guest's first disk, the size of the image's root disk.
    let (status, size) = run(vm.link(), "cat /sys/block/vda/size");
    assert_eq!((status, size.trim()), (0, "32768"), "{size}");
    assert!(vm.console_tail(5).lines().count() <= 5);
    let pid = vm.pid();
    // The guest's memory is bound to the node of the core it is pinned to.
    let node = vmhost::numa::node_of(&[0], &vmhost::numa::host_nodes())
        .expect("core 0 is on a NUMA node with memory (/sys/devices/system/node)");
    assert_eq!(vm.profile().numa_node, Some(node));
    let maps = std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).unwrap();
    let bound = format!(" bind:{node} ");
    assert!(
        maps.lines()
            .any(|l| l.contains(&bound) && l.contains("anon=")),
        "no mapping of QEMU bound to node {node}:\n{maps}"
    );
    vm.link().shutdown(TIMEOUT).unwrap();
    vm.stop(Duration::from_secs(30)).unwrap();
    drop(vm);
    assert!(!vmhost::alive(pid), "the hypervisor process is gone");
    assert!(
        !overlay.parent().unwrap().exists(),
        "the scratch directory is gone"
    );
}

const TIMEOUT: Duration = Duration::from_secs(300);

/// The path across two node agents: the destination's link is a new one that adopts the
/// command the source's link started, by its request id.
#[test]
fn a_vm_moves_to_another_node_and_its_command_is_adopted_there() {
    let Some(g) = guest() else { return };
    let t = tmp("move");
    std::fs::create_dir(t.path().join("img")).unwrap();
    let image = image_dir(&t.path().join("img"), &g);
    let nodes = plugins(t.path(), image.kernel(), 2);
    let spec = VmSpec::new(&image, "vmh-move".parse().unwrap(), 1, 192);
    let opts = BootOptions::new("vmhost-test", TIMEOUT);
    let mut src = vmhost::boot(&nodes[0], &spec, &opts).unwrap_or_else(|e| panic!("{e}"));
    let script = "i=0; while [ $i -lt 60 ]; do i=$((i+1)); sleep 0.1; done; echo moved-and-done";
    let pending = src.link().spawn(&["sh", "-c", script], BTreeMap::new());
    let first_id = src.link().next_request_id() + 1_000_000;
    let still_running = pending.poll(Duration::ZERO, &mut |_, _| {}).unwrap();
    assert!(
        still_running.is_none(),
        "the command ended before the migration"
    );

    let key = v2m::MigrationKey::new([7; 32]);
    let incoming = Incoming::prepare(
        &nodes[1],
        src.profile(),
        "127.0.0.1".parse().unwrap(),
        None,
        Some(&key),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let report = vmhost::send(
        src.vm_mut(),
        incoming.addr(),
        &v2m::MigrationParams::default(),
        Some(&key),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("migration: {report:?}");
    let disk = src.profile().disks[0].path.clone();
    src.migrated_away();
    assert!(
        disk.is_file(),
        "the source leaves the disk to the destination"
    );
    let cancel = Arc::new(AtomicBool::new(false));
    let link = LinkOptions::new(Duration::from_secs(120))
        .barriers(Barriers::None)
        .first_id(first_id)
        .cancel(cancel);
    let mut dst = incoming
        .finish(Duration::from_secs(120))
        .and_then(|arrived| arrived.connect(&link))
        .unwrap_or_else(|e| panic!("{e}"));
    dst.set_overlay(OverlayDir::adopt(&disk));
    let adopted = dst.link().adopt_exec(pending.id());
    drop(pending);
    let out = loop {
        if let Some(out) = adopted
            .poll(Duration::from_secs(1), &mut |_, _| {})
            .unwrap()
        {
            break out;
        }
        assert!(dst.alive(), "the destination VM died");
    };
    assert_eq!((out.status, out.stdout.as_str()), (0, "moved-and-done\n"));
    let (status, _) = run(dst.link(), "true");
    assert_eq!(status, 0);
    drop(dst);
    assert!(
        !disk.parent().unwrap().exists(),
        "the destination removed the overlay"
    );
}

/// Bytes waiting to be read on `s`.
fn queued(s: &std::os::unix::net::UnixStream) -> usize {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points at `n`.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n) };
    assert_eq!(r, 0, "FIONREAD: {}", std::io::Error::last_os_error());
    n as usize
}

/// Waits for the agent's new session on a fresh host end (a request that reaches the guest
/// while the agent ends its session with the previous end is dropped with that session),
/// then for its answer.
fn live_session(raw: &mut std::os::unix::net::UnixStream) {
    use std::io::{BufRead, Write};
    use vse_guest_agent::protocol::{Message, Request};
    raw.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = std::io::BufReader::new(raw.try_clone().unwrap());
    let mut line = Vec::new();
    while r.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
        let t = String::from_utf8_lossy(&line);
        let t = t.trim_matches(|c: char| c.is_whitespace() || c == '\0');
        if let Ok(Message::Ready { .. }) = serde_json::from_str(t) {
            break;
        }
        line.clear();
    }
    raw.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    for id in 1..120 {
        let mut ping = serde_json::to_vec(&Request::Sample { id }).unwrap();
        ping.push(b'\n');
        raw.write_all(&ping).unwrap();
        let mut line = Vec::new();
        while r.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            let t = String::from_utf8_lossy(&line);
            let t = t.trim_matches(|c: char| c.is_whitespace() || c == '\0');
            if let Ok(Message::Sample { id: i, .. }) = serde_json::from_str(t)
                && i == id
            {
                assert!(r.buffer().is_empty(), "nothing follows the reply");
                raw.set_read_timeout(None).unwrap();
                return;
            }
            line.clear();
        }
    }
    panic!("the guest agent never answered on the new host end");
}

/// The bytes of command `id`'s output in whole protocol lines.
fn output_of(id: u64, lines: &[u8]) -> usize {
    use vse_guest_agent::protocol::Message;
    lines
        .split(|b| *b == b'\n')
        .filter_map(|l| serde_json::from_slice::<Message>(l).ok())
        .map(|m| match m {
            Message::Output { id: i, data, .. } if i == id => data.len(),
            _ => 0,
        })
        .sum()
}

/// Guest output the source's host end had not read when the VM moved: QEMU had blocked the
/// agent's port with a buffer half sent, and the destination flushes it the instant the state
/// loads. The plugin's agent channel is connected by then, so nothing is lost and the port
/// keeps going; a line the switchover cut arrives whole, its start carried from the old end.
/// (With no host end connected at the load, the port stayed blocked for good, and the new
/// link never heard the agent.)
#[test]
fn output_backed_up_at_the_switchover_arrives_whole_after_a_move() {
    use std::io::{Read, Write};
    use vse_guest_agent::protocol::Request;
    const ID: u64 = 500_000;
    const BYTES: usize = 1 << 20;
    let Some(g) = guest() else { return };
    let t = tmp("backed");
    std::fs::create_dir(t.path().join("img")).unwrap();
    let image = image_dir(&t.path().join("img"), &g);
    let nodes = plugins(t.path(), image.kernel(), 2);
    let spec = VmSpec::new(&image, "vmh-backed".parse().unwrap(), 1, 192);
    let opts = BootOptions::new("vmhost-test", TIMEOUT);
    let mut src = vmhost::boot(&nodes[0], &spec, &opts).unwrap_or_else(|e| panic!("{e}"));
    let first_id = src.link().next_request_id() + 1_000_000;
    // A host end that stops reading, in place of the link.
    assert!(src.link().detach().is_empty());
    let sock = src.vm().agent_socket().unwrap().to_path_buf();
    // The agent sees its host end go and opens a new session, whose `Ready` waits in the guest
    // for the next end: a request must not reach the guest between the two sessions.
    std::thread::sleep(Duration::from_secs(2));
    let mut raw = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    live_session(&mut raw);
    // NUL bytes travel as \u0000: each 16 KiB chunk is a 96 KiB line.
    let req = Request::ExecStream {
        id: ID,
        argv: ["sh", "-c", "dd if=/dev/zero bs=4096 count=256 2>/dev/null"]
            .map(String::from)
            .to_vec(),
        env: BTreeMap::new(),
        cwd: None,
        stdin: None,
        user: None,
        stdin_stream: false,
    };
    let mut line = serde_json::to_vec(&req).unwrap();
    line.push(b'\n');
    raw.write_all(&line).unwrap();
    // Backed up: the socket is full and stays so (QEMU has blocked the port).
    let until = std::time::Instant::now() + Duration::from_secs(120);
    let (mut last, mut since) = (0, std::time::Instant::now());
    let backed = loop {
        let n = queued(&raw);
        if n != last {
            (last, since) = (n, std::time::Instant::now());
        } else if n > 4096 && since.elapsed() > Duration::from_secs(5) {
            break n;
        }
        if std::time::Instant::now() > until {
            let mut got = vec![0; n.min(4096)];
            let _ = raw.read(&mut got);
            panic!("{n} bytes queued: {}", String::from_utf8_lossy(&got));
        }
        std::thread::sleep(Duration::from_millis(100));
    };

    let key = v2m::MigrationKey::new([9; 32]);
    let local = "127.0.0.1".parse().unwrap();
    let incoming = Incoming::prepare(&nodes[1], src.profile(), local, None, Some(&key))
        .unwrap_or_else(|e| panic!("{e}"));
    let params = v2m::MigrationParams::default();
    vmhost::send(src.vm_mut(), incoming.addr(), &params, Some(&key))
        .unwrap_or_else(|e| panic!("{e}"));
    let disk = src.profile().disks[0].path.clone();
    src.migrated_away();
    // What the old end holds: whole lines, then the start of one the switchover cut.
    raw.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut old = Vec::new();
    let _ = raw.read_to_end(&mut old);
    let whole = old.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let cut = old.split_off(whole);
    let before = output_of(ID, &old);
    eprintln!(
        "backed up {backed} bytes; the old end read {before} bytes of output and {} of a cut line",
        cut.len()
    );
    assert!(before < BYTES, "the whole output passed before the move");

    let link = LinkOptions::new(Duration::from_secs(120))
        .first_id(first_id)
        .carried(cut);
    let mut dst = incoming
        .finish(Duration::from_secs(120))
        .and_then(|arrived| arrived.connect(&link))
        .unwrap_or_else(|e| panic!("{e}"));
    dst.set_overlay(OverlayDir::adopt(&disk));
    let adopted = dst.link().adopt_exec(ID);
    let mut after = 0;
    let end = loop {
        let out = adopted.poll(Duration::from_secs(1), &mut |_, d| after += d.len());
        if let Some(end) = out.unwrap() {
            break end;
        }
        assert!(dst.alive(), "the destination VM died");
    };
    assert_eq!(end.status, 0, "{end:?}");
    assert_eq!(
        before + after,
        BYTES,
        "every byte of the output arrived once"
    );
}

/// The destination's listener is reachable by anyone who can reach the node: a stranger's
/// connection (garbage that starts like QEMU's stream) and a real QEMU source with the wrong
/// key are both turned away, the destination keeps waiting, and the source with the job's key
/// then moves the VM, which still runs its command.
#[test]
fn a_migration_listener_takes_only_the_source_with_the_key() {
    use std::io::{Read, Write};
    let Some(g) = guest() else { return };
    let t = tmp("auth");
    std::fs::create_dir(t.path().join("img")).unwrap();
    let image = image_dir(&t.path().join("img"), &g);
    let nodes = plugins(t.path(), image.kernel(), 2);
    let spec = VmSpec::new(&image, "vmh-auth".parse().unwrap(), 1, 192);
    let opts = BootOptions::new("vmhost-test", TIMEOUT);
    let mut src = vmhost::boot(&nodes[0], &spec, &opts).unwrap_or_else(|e| panic!("{e}"));
    let (status, _) = run(src.link(), "echo before > /tmp/marker");
    assert_eq!(status, 0);
    let key = v2m::MigrationKey::new([0x5a; 32]);
    let listen = "127.0.0.1".parse().unwrap();
    let incoming = Incoming::prepare(&nodes[1], src.profile(), listen, None, Some(&key))
        .unwrap_or_else(|e| panic!("{e}"));

    // A stranger: the start of a QEMU stream (magic "QEVM", version 3), then junk.
    let mut stranger = std::net::TcpStream::connect(incoming.addr()).unwrap();
    let mut junk = b"QEVM\0\0\0\x03".to_vec();
    junk.extend((0..4096u32).map(|i| (i * 31 % 256) as u8));
    let _ = stranger.write_all(&junk);
    stranger
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // The destination hangs up on it (the handshake failed) rather than loading it.
    let mut buf = [0u8; 4096];
    while matches!(stranger.read(&mut buf), Ok(n) if n > 0) {}
    drop(stranger);
    // A real source with another key fails and keeps running.
    let wrong = v2m::MigrationKey::new([0xa5; 32]);
    let params = v2m::MigrationParams {
        timeout: Duration::from_secs(120),
        ..v2m::MigrationParams::default()
    };
    let e = vmhost::send(src.vm_mut(), incoming.addr(), &params, Some(&wrong))
        .expect_err("a source with the wrong key must not migrate");
    eprintln!("wrong key: {e}");
    assert!(src.alive(), "the source stopped after a refused migration");
    assert!(
        vmhost::alive(incoming.pid()),
        "the destination died of a foreign connection"
    );

    // The real source still gets through, and the VM carries on there.
    vmhost::send(src.vm_mut(), incoming.addr(), &params, Some(&key))
        .unwrap_or_else(|e| panic!("the real migration after the strangers: {e}"));
    let disk = src.profile().disks[0].path.clone();
    src.migrated_away();
    let link = LinkOptions::new(Duration::from_secs(120))
        .barriers(Barriers::None)
        .first_id(1_000_000)
        .cancel(Arc::new(AtomicBool::new(false)));
    let mut dst = incoming
        .finish(Duration::from_secs(120))
        .and_then(|arrived| arrived.connect(&link))
        .unwrap_or_else(|e| panic!("{e}"));
    dst.set_overlay(OverlayDir::adopt(&disk));
    let (status, out) = run(dst.link(), "cat /tmp/marker");
    assert_eq!((status, out.as_str()), (0, "before\n"));
}

/// A VM on the job network: its NIC's frames go to `switch` (a socket of the test).
fn with_nic(spec: &mut VmSpec, mac: &str, switch: std::net::SocketAddr) {
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let local = port.local_addr().unwrap();
    drop(port);
    spec.nic = Some(vmhost::Nic {
        mac: mac.parse().unwrap(),
        local,
        remote: switch,
    });
}

/// An ethernet frame to `dst` (experimental ethertype), as the job switch would deliver it.
fn frame_to(dst: &str) -> Vec<u8> {
    let mut f: Vec<u8> = dst
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    f.extend([0x02, 0xfb, 0xee, 0, 0, 1, 0x88, 0xb5]);
    f.resize(60, 0x5a);
    f
}

/// The guest's received-frame count on its NIC after `frame` reached its endpoint.
fn rx_after(vm: &vmhost::RunningVm, switch: &std::net::UdpSocket, frame: &[u8]) -> u64 {
    let nic = vm.profile().network.local.unwrap();
    switch.send_to(frame, nic).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let (status, rx) = run(vm.link(), "cat /sys/class/net/eth0/statistics/rx_packets");
    assert_eq!(status, 0, "{rx}");
    rx.trim().parse().unwrap()
}

/// What makes a guest itself: 32 random bytes, machine id, hostname, NIC MAC, clock.
fn identity(vm: &vmhost::RunningVm) -> Vec<String> {
    let script = "dd if=/dev/urandom bs=32 count=1 2>/dev/null | busybox od -An -tx1 | tr -d ' \\n'; \
                  echo; cat /etc/machine-id 2>/dev/null || echo none; busybox hostname; \
                  cat /sys/class/net/eth0/address; busybox date +%s";
    let (status, out) = run(vm.link(), script);
    assert_eq!(status, 0, "{out}");
    let lines: Vec<String> = out.lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 5, "{out}");
    assert_eq!(lines[0].len(), 64, "32 random bytes in hex: {out}");
    lines
}

/// Boot templates: a damaged template in the way is discarded and the first VM boots cold
/// and saves its state; two VMs then start from that template, each with its own random
/// bytes, machine id, hostname, clock and NIC MAC (the saved state carries the template VM's:
/// the hypervisor must filter frames by the new one), and the template VM still runs and
/// writes to its disk after the save.
#[test]
fn vms_from_one_template_have_their_own_identity() {
    let Some(g) = guest() else { return };
    let t = tmp("tpl");
    std::fs::create_dir(t.path().join("img")).unwrap();
    let image = image_dir(&t.path().join("img"), &g);
    let plugin = &plugins(t.path(), image.kernel(), 1)[0];
    let switch = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let sw = switch.local_addr().unwrap();
    let templates = vmhost::Templates::new(t.path().join("templates"));
    let mut opts = BootOptions::new("vmhost-test", TIMEOUT);
    opts.templates = Some(templates.clone());
    let spec = |name: &str, mac: &str| {
        let mut s = VmSpec::new(&image, name.parse().unwrap(), 1, 192);
        with_nic(&mut s, mac, sw);
        s
    };
    let first = spec("vmh-tpl-0", "02:fb:00:00:00:10");
    // Damaged: the boot must see it, discard it and boot cold.
    let key = vmhost::TemplateInputs::of(plugin, &first).unwrap().key();
    std::fs::create_dir_all(templates.path(&key)).unwrap();
    std::fs::write(templates.path(&key).join("meta.json"), b"{\"key\":").unwrap();

    let origin = vmhost::boot(plugin, &first, &opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(origin.boot_kind(), vmhost::BootKind::SavedTemplate);
    assert!(templates.path(&key).join("state").is_file());
    let (status, out) = run(
        origin.link(),
        "dd if=/dev/zero of=/dev/vda bs=4096 count=1 conv=fsync 2>&1",
    );
    assert_eq!(
        status, 0,
        "the template VM writes to its disk after the save: {out}"
    );

    let macs = ["02:fb:00:00:00:11", "02:fb:00:00:00:12"];
    let copies: Vec<_> = (1..=2)
        .map(|i| {
            let s = spec(&format!("vmh-tpl-{i}"), macs[i - 1]);
            vmhost::boot(plugin, &s, &opts).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let host_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let ids: Vec<Vec<String>> = std::iter::once(&origin)
        .chain(&copies)
        .map(identity)
        .collect();
    eprintln!("identities (random, machine id, hostname, MAC, clock): {ids:?}");
    for (i, vm) in copies.iter().enumerate() {
        assert!(vm.from_template(), "VM {i} was restored from the template");
        let id = &ids[i + 1];
        assert_eq!(id[1].len(), 32, "a machine id: {id:?}");
        assert_eq!(id[2], format!("vmh-tpl-{}", i + 1), "its own hostname");
        assert_eq!(id[3], macs[i], "the MAC the host asked for");
        let clock: i64 = id[4].parse().unwrap();
        assert!(
            (clock - host_now).abs() < 120,
            "the host's clock: {clock} vs {host_now}"
        );
    }
    for field in [0, 1] {
        let vals: std::collections::BTreeSet<_> = ids.iter().map(|id| &id[field]).collect();
        assert_eq!(
            vals.len(),
            3,
            "field {field} differs between all three VMs: {ids:?}"
        );
    }
    // The hypervisor learned the new MAC: a frame to it arrives, one to the template's not.
    let vm = &copies[0];
    let (status, out) = run(vm.link(), "busybox ifconfig eth0 up && sleep 1");
    assert_eq!(status, 0, "{out}");
    let (_, rx) = run(vm.link(), "cat /sys/class/net/eth0/statistics/rx_packets");
    let start: u64 = rx.trim().parse().unwrap();
    let to_old = rx_after(vm, &switch, &frame_to("02:fb:00:00:00:10"));
    let to_new = rx_after(vm, &switch, &frame_to(macs[0]));
    assert_eq!(
        (to_old, to_new),
        (start, start + 1),
        "only the frame to the new MAC reached the guest"
    );
    drop(copies);
    drop(origin);
    let left: Vec<_> = std::fs::read_dir(templates.dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".lock-"))
        .collect();
    assert_eq!(
        left,
        [key],
        "one template, nothing half-written or discarded left"
    );
}
