//! The migration loop on real QEMU VMs (TCG on this kind of machine): the guest agent relays
//! the barrier notice to a program inside the guest, `run_plan` live-migrates the VM through
//! V2M's QEMU plugin between two "nodes" (run directories on one machine), and a controller
//! that dies mid-migration is recovered from its SQLite journal by asking the hypervisors.
//!
//! Needs qemu-system-x86_64 and the guest of `.ci/migrate-guest.sh`; without them the tests
//! print "skipped: …" (and fail under VSE_REQUIRE_ALL=1).

mod migrate_support;

use control::migrate::{
    BarrierConfig, BarrierServer, DeadlineAction, LiveMigrator, MigrateError, Outcome, run_plan,
};
use control::model::{Move, Plan, Pool, SourceFate};
use control::state::{MigrationState, StateDb};
use migrate_support::*;
use std::time::Duration;

fn plan(job: &str, vm: &str, from: &str, to: &str, fate: SourceFate) -> Plan {
    Plan {
        rule: "test".into(),
        job: jid(job),
        source: node(from),
        moves: vec![Move {
            vm: vid(vm),
            dest: node(to),
            mem_max_kib: 192 * 1024,
        }],
        source_fate: fate,
        reason: "scenario test".into(),
    }
}

const STRICT: BarrierConfig = BarrierConfig {
    deadline_s: 120,
    on_deadline: DeadlineAction::Cancel,
};

#[test]
fn guest_rank_blocks_at_barrier_while_its_vm_is_live_migrated() {
    let Some(g) = guest() else { return };
    let t = Tmp::new("bar");
    let mut cl = Cluster::new(&t, &["a", "b"], None);
    let mut db = StateDb::open(&t.path("state.db")).unwrap();
    for n in ["a", "b"] {
        db.upsert_node(&node(n), Pool::Free).unwrap();
    }
    db.add_vm(&jid("j1"), &vid("vm1"), &node("a"), 192 * 1024)
        .unwrap();
    let server = BarrierServer::bind(&t.path("barrier.sock")).unwrap();
    cl.boot(&g, "vm1", "a", 192, &t, server.path());
    let app = cl.run_msgcheck("j1", "vm1", 120, 40);
    wait_rank(&server, "j1", "vm1");

    let out = run_plan(
        &mut db,
        &server,
        &mut cl.fleet,
        &plan("j1", "vm1", "a", "b", SourceFate::Defunct),
        &STRICT,
    )
    .expect("run_plan");
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    let rec = &cl.fleet.records()[0];
    eprintln!(
        "accelerator: {}; QEMU migration {} ms (downtime {} ms), request to running {} ms",
        cl.accel, rec.report.total_time_ms, rec.report.downtime_ms, rec.wall_ms
    );
    let summary = app.finish();
    assert!(
        summary.contains("received=120 bad=0 migrated=1"),
        "{summary}"
    );
    assert_eq!(cl.fleet.node_of(&vid("vm1")).unwrap(), &node("b"));
    let vms = db.vms(None).unwrap();
    assert_eq!(vms[0].node, node("b"));
    assert_eq!(pool(&db, "a"), Pool::Defunct);
    assert_counter_continuous(&t.path("vm1.console"));
    // The agent kept working across the switch: the guest view still answers.
    let (mem, _) = cl
        .fleet
        .link(&vid("vm1"))
        .unwrap()
        .sample(Duration::from_secs(30))
        .unwrap();
    assert!(mem.contains("MemTotal:"));
}

/// A migrator standing for a controller process that dies: before the hypervisor moved the
/// VM, or right after it did but before the journal says so.
struct Crash<'a> {
    fleet: &'a mut launcher::fleet::QemuFleet,
    after_move: bool,
}

impl LiveMigrator for Crash<'_> {
    fn live_migrate(
        &mut self,
        vm: &monitor::VmId,
        from: &monitor::NodeName,
        to: &monitor::NodeName,
    ) -> Result<(), MigrateError> {
        if self.after_move {
            self.fleet.live_migrate(vm, from, to)?;
        }
        std::panic::panic_any(CrashMarker);
    }
}

struct CrashMarker;

fn crash_run(
    db_path: &std::path::Path,
    server: BarrierServer,
    fleet: &mut launcher::fleet::QemuFleet,
    p: &Plan,
    after_move: bool,
) {
    let mut db = StateDb::open(db_path).unwrap();
    // The panic unwinds like a killed process: nothing after it runs, the SQLite file keeps
    // what was committed, and the dropped barrier server closes every rank connection.
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let server = server;
        let mut m = Crash { fleet, after_move };
        let _ = run_plan(&mut db, &server, &mut m, p, &STRICT);
    }));
    std::panic::set_hook(prev);
    assert!(
        r.is_err_and(|e| e.is::<CrashMarker>()),
        "the simulated crash did not happen"
    );
}

#[test]
fn controller_dying_mid_migration_is_recovered_and_the_job_completes() {
    let Some(g) = guest() else { return };
    let t = Tmp::new("crash");
    let mut cl = Cluster::new(&t, &["a", "b"], None);
    let db_path = t.path("state.db");
    {
        let mut db = StateDb::open(&db_path).unwrap();
        for n in ["a", "b"] {
            db.upsert_node(&node(n), Pool::Free).unwrap();
        }
        db.add_vm(&jid("j1"), &vid("vm1"), &node("a"), 192 * 1024)
            .unwrap();
    }
    let sock = t.path("barrier.sock");
    // Ranks reach the controller's socket path; a restarted controller binds it again.
    cl.boot(&g, "vm1", "a", 192, &t, &sock);
    let p = plan("j1", "vm1", "a", "b", SourceFate::Defunct);

    // 1. Dies while the ranks are blocked, before anything moved: rolled back, VM stays,
    //    the blocked rank is released by the lost connection and the program goes on.
    let server = BarrierServer::bind(&sock).unwrap();
    let app = cl.run_msgcheck("j1", "vm1", 80, 40);
    wait_rank(&server, "j1", "vm1");
    crash_run(&db_path, server, &mut cl.fleet, &p, false);
    let mut db = StateDb::open(&db_path).unwrap();
    // The node agents (the fleet's handles) outlived the controller: they say where VMs run.
    let rec = db.recover(&mut cl.fleet).unwrap();
    assert_eq!(rec.len(), 1, "{rec:?}");
    assert_eq!(rec[0].now, MigrationState::RolledBack, "{rec:?}");
    assert_eq!(db.vms(None).unwrap()[0].node, node("a"));
    assert_eq!(pool(&db, "a"), Pool::Allocated);
    drop(db);
    let summary = app.finish();
    assert!(
        summary.contains("received=80 bad=0 migrated=0 released=1"),
        "{summary}"
    );

    // 2. Dies after QEMU moved the VM, before the journal recorded it: recovery finds the VM
    //    on the destination and completes the migration, source to the defunct pool.
    let server = BarrierServer::bind(&sock).unwrap();
    let app = cl.run_msgcheck("j1", "vm1", 80, 40);
    wait_rank(&server, "j1", "vm1");
    crash_run(&db_path, server, &mut cl.fleet, &p, true);
    let mut db = StateDb::open(&db_path).unwrap();
    let rec = db.recover(&mut cl.fleet).unwrap();
    assert_eq!(rec.len(), 1, "{rec:?}");
    assert_eq!(rec[0].now, MigrationState::Done, "{rec:?}");
    assert_eq!(db.vms(None).unwrap()[0].node, node("b"));
    assert_eq!(pool(&db, "a"), Pool::Defunct);
    let summary = app.finish();
    assert!(
        summary.contains("received=80 bad=0 migrated=0 released=1"),
        "{summary}"
    );
    assert_eq!(cl.fleet.node_of(&vid("vm1")).unwrap(), &node("b"));
    assert_counter_continuous(&t.path("vm1.console"));
}

#[test]
fn run_dir_locator_finds_a_detached_vm_by_asking_each_node() {
    use v2m::Plugin;
    let Some(g) = guest() else { return };
    let t = Tmp::new("loc");
    let cl = Cluster::new(&t, &["a", "b"], None);
    let nodes = cl.node_configs();
    let plugin = v2m::qemu::QemuPlugin::new(nodes[1].1.clone());
    let profile = v2m::Profile::new(
        launcher::fleet::vm_name(&vid("lone")).unwrap(),
        1,
        128,
        v2m::ImageRef {
            kernel: g.kernel.clone(),
            initrd: Some(g.initrd.clone()),
            root_disk: None,
            cmdline: g.cmdline.clone(),
        },
    );
    let mut vm = plugin.define(&profile).unwrap();
    vm.start().unwrap();
    // No handle survives (like a controller that died); the run directories still tell.
    vm.detach();
    let mut loc = launcher::fleet::RunDirLocator::new(nodes);
    use control::state::VmLocator;
    assert_eq!(loc.locate(&vid("lone")).unwrap(), Some(node("b")));
    assert_eq!(loc.locate(&vid("nowhere")).unwrap(), None);
    let mut h = plugin.attach(&profile.name).unwrap();
    h.stop(Duration::from_secs(2)).unwrap();
    assert_eq!(loc.locate(&vid("lone")).unwrap(), None);
}
