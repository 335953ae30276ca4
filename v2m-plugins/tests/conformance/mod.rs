//! The conformance suite, written once against `dyn Plugin` and run for every plugin that
//! probes as available. The guest prints a counter every 100 ms; each scenario checks what the
//! guest itself observed (through its serial console), not what the plugin claims.
#![allow(dead_code)]

use crate::common::{self, Fixture};
use std::time::Duration;
use testkit::fixture::{assert_consecutive, counters};
use testkit::process::{alive, kill9, qemu_processes};
use v2m::{MigrationParams, MigrationTarget, Plugin, V2mError, Vm, VmState};

const GRACE: Duration = Duration::ZERO;

fn boot(plugin: &dyn Plugin, f: &Fixture, tag: &str, mem: u64) -> Box<dyn Vm> {
    let p = common::profile(f, tag, mem);
    let mut vm = plugin.define(&p).expect("define");
    assert_eq!(vm.status().unwrap().state, VmState::Defined);
    vm.start().expect("start");
    let st = vm.status().unwrap();
    eprintln!(
        "{}: {} started, accelerator {:?}",
        plugin.kind(),
        st.name,
        st.accel
    );
    common::wait_ready(&*vm);
    vm
}

fn pid_of(vm: &mut dyn Vm) -> u32 {
    vm.status().unwrap().pid.expect("a running VM has a pid")
}

pub fn boot_pause_resume_stop(plugin: &dyn Plugin, f: &Fixture) {
    let mut vm = boot(plugin, f, "pr", 256);
    let name = vm.name().to_string();
    common::wait_counter_above(&*vm, 2);
    vm.pause().unwrap();
    assert_eq!(vm.status().unwrap().state, VmState::Paused);
    let frozen = common::last_counter(&*vm).unwrap();
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(
        common::last_counter(&*vm).unwrap(),
        frozen,
        "counter moved while paused"
    );
    vm.resume().unwrap();
    assert_eq!(vm.status().unwrap().state, VmState::Running);
    common::wait_counter_above(&*vm, frozen + 2);
    let c = counters(&vm.console_log().unwrap());
    assert_consecutive(&c, "pause/resume");
    let pid = pid_of(&mut *vm);
    vm.stop(GRACE).unwrap();
    assert_eq!(vm.status().unwrap().state, VmState::Stopped);
    assert!(!alive(pid) || qemu_processes(&name).is_empty());
    assert!(qemu_processes(&name).is_empty(), "process left after stop");
}

pub fn checkpoint_stop_restore(plugin: &dyn Plugin, f: &Fixture) {
    let mut vm = boot(plugin, f, "ck", 256);
    let profile_name = vm.name().clone();
    common::wait_counter_above(&*vm, 3);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vm.ckpt");
    let rep = vm.checkpoint(&file).unwrap();
    // QEMU keeps the VM paused; libvirt's virDomainSave stops it (documented per plugin).
    let after = vm.status().unwrap().state;
    assert!(
        matches!(after, VmState::Paused | VmState::Stopped),
        "after checkpoint: {after}"
    );
    assert!(
        rep.bytes > 1 << 20,
        "checkpoint of a 256 MiB guest is only {} bytes",
        rep.bytes
    );
    assert_eq!(std::fs::metadata(&file).unwrap().len(), rep.bytes);
    // A digest computed on the way in must be the file's.
    if let Some(sum) = &rep.sha256 {
        use sha2::Digest;
        let want: String = (sha2::Sha256::digest(std::fs::read(&file).unwrap()).iter())
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(sum, &want);
    }
    let at_checkpoint = common::last_counter(&*vm).unwrap();
    if after == VmState::Paused {
        vm.stop(GRACE).unwrap();
    }
    assert!(qemu_processes(profile_name.as_str()).is_empty());
    drop(vm);

    let mut p = common::profile(f, "ck", 256);
    p.name = profile_name.clone();
    let mut restored = plugin.restore(&p, &file).expect("restore");
    assert_eq!(restored.status().unwrap().state, VmState::Running);
    common::wait_counter_above(&*restored, at_checkpoint + 3);
    // Same VM name → the same console log, appended: the whole history must be gap-free.
    let c = counters(&restored.console_log().unwrap());
    assert_consecutive(&c, "checkpoint/restore");
    restored.stop(GRACE).unwrap();
}

pub fn live_migration(plugin: &dyn Plugin, f: &Fixture) {
    let mut src = boot(plugin, f, "msrc", 256);
    let src_name = src.name().to_string();
    common::wait_counter_above(&*src, 3);
    let dst_profile = common::profile(f, "mdst", 256);
    let listen = MigrationTarget {
        host: "127.0.0.1".into(),
        port: 0,
        key: None,
        disks: Default::default(),
    };
    let mut dst = plugin
        .prepare_incoming(&dst_profile, &listen)
        .expect("prepare destination");
    assert_eq!(dst.status().unwrap().state, VmState::Migrating);
    let target = dst
        .incoming()
        .cloned()
        .expect("destination reports its address");
    assert_ne!(target.port, 0);
    let params = MigrationParams {
        max_bandwidth_bytes_per_s: 1 << 30,
        downtime_limit_ms: 300,
        timeout: Duration::from_secs(120),
    };
    let report = src.migrate(&target, &params).expect("migrate");
    eprintln!("migration: {report:?}");
    assert!(report.transferred_bytes > 1 << 20, "{report:?}");
    assert!(report.total_time_ms > 0, "{report:?}");
    dst.finish_incoming(Duration::from_secs(60))
        .expect("finish");
    assert_eq!(dst.status().unwrap().state, VmState::Running);
    assert_eq!(src.status().unwrap().state, VmState::Stopped);
    assert!(
        qemu_processes(&src_name).is_empty(),
        "source still running after migration"
    );
    let src_log = src.console_log().unwrap();
    let src_last = *counters(&src_log).last().unwrap();
    common::wait_counter_above(&*dst, src_last + 3);
    // A line may be split between the two logs at the switch-over: judge the joined stream.
    let mut all = src_log.clone();
    all.extend(dst.console_log().unwrap());
    let c = counters(&all);
    assert_consecutive(&c, "live migration");
    let dst_first = counters(&dst.console_log().unwrap())[0];
    assert!(
        dst_first <= src_last + 1,
        "gap: source ended at {src_last}, destination began at {dst_first}"
    );
    dst.stop(GRACE).unwrap();
}

pub fn start_twice_is_typed_error(plugin: &dyn Plugin, f: &Fixture) {
    let mut vm = boot(plugin, f, "st2", 256);
    let e = vm.start().unwrap_err();
    assert!(
        matches!(
            e,
            V2mError::InvalidTransition {
                from: VmState::Running,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        vm.status().unwrap().state,
        VmState::Running,
        "a refused start must not disturb the VM"
    );
    vm.stop(GRACE).unwrap();
}

pub fn migrate_stopped_vm_is_typed_error(plugin: &dyn Plugin, f: &Fixture) {
    let mut vm = boot(plugin, f, "mstop", 256);
    vm.stop(GRACE).unwrap();
    let t = MigrationTarget {
        host: "127.0.0.1".into(),
        port: 1,
        key: None,
        disks: Default::default(),
    };
    let e = vm.migrate(&t, &MigrationParams::default()).unwrap_err();
    assert!(
        matches!(
            e,
            V2mError::InvalidTransition {
                from: VmState::Stopped,
                ..
            }
        ),
        "{e}"
    );
    let e = vm.stop(GRACE).unwrap_err();
    assert!(matches!(e, V2mError::InvalidTransition { .. }), "{e}");
}

pub fn destination_port_in_use(plugin: &dyn Plugin, f: &Fixture) {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let p = common::profile(f, "busy", 256);
    let e = plugin
        .prepare_incoming(
            &p,
            &MigrationTarget {
                host: "127.0.0.1".into(),
                port,
                key: None,
                disks: Default::default(),
            },
        )
        .err()
        .expect("binding a busy port must fail");
    assert!(matches!(e, V2mError::PortInUse { .. }), "{e}");
    assert!(
        qemu_processes(p.name.as_str()).is_empty(),
        "destination process left behind"
    );
}

pub fn sigkill_mid_migration(plugin: &dyn Plugin, f: &Fixture) {
    let mut src = boot(plugin, f, "ksrc", 256);
    let src_name = src.name().to_string();
    let dst_profile = common::profile(f, "kdst", 256);
    let mut dst = plugin
        .prepare_incoming(
            &dst_profile,
            &MigrationTarget {
                host: "127.0.0.1".into(),
                port: 0,
                key: None,
                disks: Default::default(),
            },
        )
        .unwrap();
    let target = dst.incoming().cloned().unwrap();
    let pid = pid_of(&mut *src);
    // 2 MiB/s: 256 MiB cannot finish before the kill lands.
    let params = MigrationParams {
        max_bandwidth_bytes_per_s: 2 << 20,
        downtime_limit_ms: 300,
        timeout: Duration::from_secs(120),
    };
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        kill9(pid);
    });
    let e = src.migrate(&target, &params).unwrap_err();
    killer.join().unwrap();
    assert!(matches!(e, V2mError::ProcessDied { .. }), "{e}");
    assert_eq!(src.status().unwrap().state, VmState::Stopped);
    assert!(qemu_processes(&src_name).is_empty());
    // The destination lost its stream: it must report that, not hang or pretend success.
    let e = dst.finish_incoming(Duration::from_secs(30)).unwrap_err();
    assert!(
        matches!(
            e,
            V2mError::ProcessDied { .. } | V2mError::MigrationFailed { .. }
        ),
        "{e}"
    );
    assert!(qemu_processes(dst_profile.name.as_str()).is_empty());
    assert!(src.agent_socket().is_none());
}

pub fn sigkill_then_operate(plugin: &dyn Plugin, f: &Fixture) {
    let mut vm = boot(plugin, f, "kill", 256);
    let name = vm.name().to_string();
    let pid = pid_of(&mut *vm);
    kill9(pid);
    let e = vm.pause().unwrap_err();
    assert!(matches!(e, V2mError::ProcessDied { .. }), "{e}");
    assert_eq!(vm.status().unwrap().state, VmState::Stopped);
    assert!(qemu_processes(&name).is_empty());
    let e = vm.resume().unwrap_err();
    assert!(matches!(e, V2mError::InvalidTransition { .. }), "{e}");
}

pub fn vcpu_threads_are_pinned(plugin: &dyn Plugin, f: &Fixture) {
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut p = common::profile(f, "pin", 256);
    p.vcpus = 2;
    p.cpuset = Some(v2m::CpuSet::new((0..ncpu.min(2)).collect()).unwrap());
    p.numa_node = Some(0);
    let mut vm = plugin.define(&p).unwrap();
    vm.start().unwrap();
    common::wait_ready(&*vm);
    let threads = vm.vcpu_threads().unwrap();
    assert_eq!(threads.len(), 2);
    let cpus = p.cpuset.as_ref().unwrap().cpus();
    for t in &threads {
        let want = cpus[t.index as usize % cpus.len()];
        assert_eq!(
            t.affinity,
            vec![want],
            "vCPU {} (tid {})",
            t.index,
            t.thread_id
        );
    }
    assert_ne!(threads[0].thread_id, threads[1].thread_id);
    // The guest's memory is bound to node 0 (the numa_maps of a thread are its process's).
    let maps = std::fs::read_to_string(format!("/proc/{}/numa_maps", threads[0].thread_id))
        .expect("numa_maps of the vCPU thread");
    assert!(
        maps.lines()
            .any(|l| l.contains(" bind:0 ") && l.contains("anon=")),
        "no mapping bound to node 0:\n{maps}"
    );
    vm.stop(GRACE).unwrap();
}

pub fn agent_channel_exists(plugin: &dyn Plugin, f: &Fixture) {
    use std::os::unix::fs::FileTypeExt;
    let mut vm = boot(plugin, f, "agent", 256);
    let sock = vm.agent_socket().expect("agent socket").to_path_buf();
    let ft = std::fs::metadata(&sock).unwrap().file_type();
    assert!(ft.is_socket(), "{} is not a socket", sock.display());
    // The host end accepts a connection (the guest side is the virtio port org.vse.agent.0).
    std::os::unix::net::UnixStream::connect(&sock).expect("agent socket accepts");
    vm.stop(GRACE).unwrap();
    assert!(vm.agent_socket().is_none());
}

/// Plugins that cannot migrate between two VMs on one host must say so with a typed error and
/// leave the VM running undisturbed.
pub fn same_host_migration_is_unsupported(plugin: &dyn Plugin, f: &Fixture) {
    let mut vm = boot(plugin, f, "nomig", 256);
    common::wait_counter_above(&*vm, 1);
    let t = MigrationTarget {
        host: "127.0.0.1".into(),
        port: 0,
        key: None,
        disks: Default::default(),
    };
    let e = vm.migrate(&t, &MigrationParams::default()).unwrap_err();
    eprintln!("{}: same-host migration: {e}", plugin.kind());
    assert!(matches!(e, V2mError::Unsupported { .. }), "{e}");
    assert_eq!(vm.status().unwrap().state, VmState::Running);
    let last = common::last_counter(&*vm).unwrap();
    common::wait_counter_above(&*vm, last + 2);
    vm.stop(GRACE).unwrap();
}
