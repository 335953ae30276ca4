//! Controller state in SQLite: the migration journal, pools, and recovery after the
//! controller process is SIGKILLed at random points (a real child process doing the writes).

use control::model::{Move, Plan, Pool, SourceFate};
use control::state::*;
use monitor::{JobId, NodeName, VmId};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn n(s: &str) -> NodeName {
    NodeName::new(s).unwrap()
}
fn v(s: &str) -> VmId {
    VmId::new(s).unwrap()
}
fn job() -> JobId {
    JobId::new("job1").unwrap()
}

fn setup(db: &mut StateDb) {
    for (name, pool) in [
        ("a", Pool::Free),
        ("b", Pool::Free),
        ("c", Pool::Free),
        ("d", Pool::Free),
    ] {
        db.upsert_node(&n(name), pool).unwrap();
    }
    db.add_vm(&job(), &v("vm0"), &n("a"), 1024).unwrap();
    db.add_vm(&job(), &v("vm1"), &n("a"), 1024).unwrap();
    db.add_vm(&job(), &v("vm2"), &n("b"), 1024).unwrap();
}

fn plan(src: &str, fate: SourceFate, moves: &[(&str, &str)]) -> Plan {
    Plan {
        rule: "test".into(),
        job: job(),
        source: n(src),
        moves: moves
            .iter()
            .map(|(vm, d)| Move {
                vm: v(vm),
                dest: n(d),
                mem_max_kib: 1024,
            })
            .collect(),
        source_fate: fate,
        reason: "test plan".into(),
    }
}

fn pool(db: &StateDb, name: &str) -> Pool {
    db.nodes()
        .unwrap()
        .into_iter()
        .find(|x| x.name.as_str() == name)
        .unwrap()
        .pool
}

#[test]
fn full_protocol_journal() {
    let dir = tempfile::tempdir().unwrap();
    let mut db = StateDb::open(&dir.path().join("state.db")).unwrap();
    setup(&mut db);
    assert_eq!(pool(&db, "a"), Pool::Allocated);
    let id = db
        .plan_migration(&plan(
            "a",
            SourceFate::Defunct,
            &[("vm0", "c"), ("vm1", "c")],
        ))
        .unwrap();
    // A VM cannot be in two migrations.
    let e = db
        .plan_migration(&plan("a", SourceFate::Keep, &[("vm0", "d")]))
        .unwrap_err();
    assert!(e.to_string().contains("already being migrated"), "{e}");
    assert!(db.mark_ready(id, &v("vm0")).is_err(), "no notice yet");
    db.post_notice(id, 1).unwrap();
    assert_eq!(pool(&db, "c"), Pool::Allocated, "destination acquired");
    assert!(!db.mark_ready(id, &v("vm0")).unwrap());
    assert!(db.mark_ready(id, &v("vm1")).unwrap());
    assert_eq!(db.migration(id).unwrap().state, MigrationState::RanksReady);
    let view = db.cluster_view(0).unwrap();
    assert!(
        view.vms
            .iter()
            .filter(|x| x.node.as_str() == "a")
            .all(|x| x.migrating)
    );
    db.start_migrating(id, "").unwrap();
    assert!(db.complete(id, "").is_err(), "VMs not moved yet");
    db.mark_moved(id, &v("vm0")).unwrap();
    db.mark_moved(id, &v("vm1")).unwrap();
    db.complete(id, "ack").unwrap();
    assert_eq!(pool(&db, "a"), Pool::Defunct);
    let vms = db.vms(Some(&job())).unwrap();
    assert_eq!(vms.iter().filter(|x| x.node.as_str() == "c").count(), 2);
    assert!(
        vms.iter()
            .find(|x| x.vm.as_str() == "vm0")
            .unwrap()
            .last_migrated_ms
            .is_some()
    );
    let m = db.migration(id).unwrap();
    assert_eq!((m.state, m.note.as_str()), (MigrationState::Done, "ack"));
    // Every step is on record, in order, so a report can say where the time went.
    let steps: Vec<_> = m.events.iter().map(|e| e.state).collect();
    assert_eq!(
        steps,
        [
            MigrationState::Planned,
            MigrationState::NoticePosted,
            MigrationState::RanksReady,
            MigrationState::Migrating,
            MigrationState::Done
        ]
    );
    assert!(m.events.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    // Defunct nodes are never destinations nor hosts.
    let e = db
        .plan_migration(&plan("b", SourceFate::Keep, &[("vm2", "a")]))
        .unwrap_err();
    assert!(e.to_string().contains("defunct"), "{e}");
    assert!(db.add_vm(&job(), &v("vm9"), &n("a"), 1).is_err());
    assert!(
        db.add_vm(&job(), &v("vm9"), &n("zz"), 1)
            .unwrap_err()
            .to_string()
            .contains("not known")
    );
}

#[test]
fn roll_back_frees_destination() {
    let dir = tempfile::tempdir().unwrap();
    let mut db = StateDb::open(&dir.path().join("state.db")).unwrap();
    setup(&mut db);
    let id = db
        .plan_migration(&plan("b", SourceFate::Defunct, &[("vm2", "d")]))
        .unwrap();
    db.post_notice(id, 1).unwrap();
    assert_eq!(pool(&db, "d"), Pool::Allocated);
    db.roll_back(id, "deadline passed, policy cancel").unwrap();
    assert_eq!(pool(&db, "d"), Pool::Free);
    assert_eq!(pool(&db, "b"), Pool::Allocated);
    assert!(db.roll_back(id, "twice").is_err());
    assert_eq!(db.migrations(None, true).unwrap().len(), 0);
}

/// The "hypervisor" of the kill test: a VM is a file `<vm>@<node>` and migrating it is an
/// atomic rename, so the truth survives the controller's death like a running VM does.
struct FileVms(PathBuf);
impl FileVms {
    fn migrate(&self, vm: &VmId, from: &NodeName, to: &NodeName) {
        std::fs::rename(
            self.0.join(format!("{vm}@{from}")),
            self.0.join(format!("{vm}@{to}")),
        )
        .unwrap();
    }
}
impl VmLocator for FileVms {
    fn locate(&mut self, vm: &VmId) -> Result<Option<NodeName>, LocateError> {
        for e in std::fs::read_dir(&self.0)? {
            let name = e?.file_name().into_string().unwrap();
            if let Some((x, node)) = name.split_once('@')
                && x == vm.as_str()
            {
                return Ok(Some(n(node)));
            }
        }
        Ok(None)
    }
}

const CHILD_ENV: &str = "VSE_TEST_CONTROLLER_CHILD";

/// A controller that moves VMs between nodes a and b forever, printing each finished
/// migration: the process `controller_killed_at_random_points` re-executes and kills.
fn controller_child_process(dir: &str) {
    let dir = PathBuf::from(dir);
    let vms = FileVms(dir.join("vms"));
    let mut db = StateDb::open(&dir.join("state.db")).unwrap();
    for round in 0u64.. {
        let placed = db.vms(None).unwrap();
        let vm = &placed[(round % placed.len() as u64) as usize];
        let dest = if vm.node.as_str() == "a" { "b" } else { "a" };
        let p = plan(
            vm.node.as_str(),
            SourceFate::Keep,
            &[(vm.vm.as_str(), dest)],
        );
        let id = db.plan_migration(&p).unwrap();
        db.post_notice(id, 1).unwrap();
        db.mark_ready(id, &vm.vm).unwrap();
        db.start_migrating(id, "").unwrap();
        println!("migrating {}", id.0);
        // A live migration takes time: the parent kills us before or after the VM moved.
        std::thread::sleep(Duration::from_millis(200));
        vms.migrate(&vm.vm, &vm.node, &n(dest));
        println!("moved {}", id.0);
        std::thread::sleep(Duration::from_millis(200));
        db.mark_moved(id, &vm.vm).unwrap();
        db.complete(id, "").unwrap();
        println!("done {}", id.0);
    }
}

fn check_consistent(db: &StateDb, vms: &mut FileVms) {
    assert!(
        db.migrations(None, true).unwrap().is_empty(),
        "nothing left in flight"
    );
    for rec in db.vms(None).unwrap() {
        assert_eq!(
            vms.locate(&rec.vm).unwrap().as_ref(),
            Some(&rec.node),
            "DB and reality agree on {}",
            rec.vm
        );
    }
    for m in db.migrations(None, false).unwrap() {
        assert!(m.state.is_terminal());
    }
}

#[test]
fn controller_killed_at_random_points() {
    // Re-executed as the child (this same test, selected with --exact): be the controller.
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        controller_child_process(&dir);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let vmdir = dir.path().join("vms");
    std::fs::create_dir(&vmdir).unwrap();
    {
        let mut db = StateDb::open(&dir.path().join("state.db")).unwrap();
        db.upsert_node(&n("a"), Pool::Free).unwrap();
        db.upsert_node(&n("b"), Pool::Free).unwrap();
        for i in 0..3 {
            db.add_vm(&job(), &v(&format!("vm{i}")), &n("a"), 1024)
                .unwrap();
            std::fs::write(vmdir.join(format!("vm{i}@a")), b"").unwrap();
        }
    }
    let mut vms = FileVms(vmdir);
    let mut recovered_states = Vec::new();
    let mut total_done = 0;
    for cycle in 0..8u64 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "controller_killed_at_random_points",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Let it finish a few migrations, then kill it: while the VM is still on the source,
        // after it moved but before the journal knows, or at an arbitrary moment.
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let want = 1 + cycle % 2;
        let mut seen = 0;
        let kill_at = ["migrating", "moved", "done"][(cycle % 3) as usize];
        loop {
            let line = lines.next().expect("child died early").unwrap();
            if line.starts_with("done ") {
                seen += 1;
            }
            if seen >= want && line.starts_with(kill_at) {
                break;
            }
        }
        if kill_at == "done" {
            std::thread::sleep(Duration::from_millis(1 + cycle * 7 % 13));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        total_done += seen;
        let mut db = StateDb::open(&dir.path().join("state.db")).unwrap();
        for r in db.recover(&mut vms).unwrap() {
            recovered_states.push((r.was, r.now));
        }
        check_consistent(&db, &mut vms);
    }
    eprintln!("{total_done} migrations completed; recoveries: {recovered_states:?}");
    for outcome in [MigrationState::Done, MigrationState::RolledBack] {
        assert!(
            recovered_states.contains(&(MigrationState::Migrating, outcome)),
            "a kill mid-migration must have been recovered to {outcome:?}: {recovered_states:?}"
        );
    }
    let db = StateDb::open(&dir.path().join("state.db")).unwrap();
    let done = db
        .migrations(None, false)
        .unwrap()
        .iter()
        .filter(|m| m.state == MigrationState::Done)
        .count();
    assert!(done as u64 >= total_done);
}

#[test]
fn recovery_rolls_back_before_migration_and_finishes_after() {
    let dir = tempfile::tempdir().unwrap();
    let path: &Path = &dir.path().join("state.db");
    let vmdir = dir.path().join("vms");
    std::fs::create_dir(&vmdir).unwrap();
    let mut db = StateDb::open(path).unwrap();
    setup(&mut db);
    for (vm, node) in [("vm0", "a"), ("vm1", "a"), ("vm2", "b")] {
        std::fs::write(vmdir.join(format!("{vm}@{node}")), b"").unwrap();
    }
    let a = db
        .plan_migration(&plan(
            "a",
            SourceFate::Defunct,
            &[("vm0", "c"), ("vm1", "c")],
        ))
        .unwrap();
    db.post_notice(a, 1).unwrap();
    db.mark_ready(a, &v("vm0")).unwrap();
    db.mark_ready(a, &v("vm1")).unwrap();
    db.start_migrating(a, "").unwrap();
    let b = db
        .plan_migration(&plan("b", SourceFate::Keep, &[("vm2", "d")]))
        .unwrap();
    db.post_notice(b, 1).unwrap();
    // The hypervisors finished moving both VMs of `a`, but the controller died first.
    let mut vms = FileVms(vmdir);
    vms.migrate(&v("vm0"), &n("a"), &n("c"));
    vms.migrate(&v("vm1"), &n("a"), &n("c"));
    drop(db);
    let mut db = StateDb::open(path).unwrap();
    let r = db.recover(&mut vms).unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!(db.migration(a).unwrap().state, MigrationState::Done);
    assert_eq!(db.migration(b).unwrap().state, MigrationState::RolledBack);
    assert_eq!(pool(&db, "a"), Pool::Defunct);
    assert_eq!(pool(&db, "d"), Pool::Free);
    check_consistent(&db, &mut vms);
}
