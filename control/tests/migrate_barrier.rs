//! The barrier channel and coordinator with ranks that speak the line protocol over the real
//! Unix socket: deadline policies, failed migrations, and a controller that goes away.

mod support;

use control::migrate::*;
use control::model::*;
use control::state::{MigrationState, StateDb};
use monitor::{JobId, NodeName, VmId};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{nm, plan, vm};

struct Rank {
    out: UnixStream,
    lines: std::io::Lines<BufReader<UnixStream>>,
}

impl Rank {
    fn connect(sock: &Path, vm: &str, rank: u32) -> Self {
        let mut out = UnixStream::connect(sock).unwrap();
        out.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        writeln!(out, "HELLO job1 {vm} {rank}").unwrap();
        let lines = BufReader::new(out.try_clone().unwrap()).lines();
        Self { out, lines }
    }
    fn next(&mut self) -> Option<String> {
        self.lines.next().map(|l| l.unwrap())
    }
}

fn setup(dir: &Path) -> (StateDb, BarrierServer, JobId) {
    let server = BarrierServer::bind(&dir.join("b.sock")).unwrap();
    let job = JobId::new("job1").unwrap();
    let mut db = StateDb::open(&dir.join("state.db")).unwrap();
    for n in ["n0", "n1", "f0"] {
        db.upsert_node(&nm(n), Pool::Free).unwrap();
    }
    db.add_vm(&job, &vm("vm0"), &nm("n0"), 1024).unwrap();
    db.add_vm(&job, &vm("vm1"), &nm("n1"), 1024).unwrap();
    (db, server, job)
}

/// Moves every VM, and keeps a log of what it was asked (shared with the ranks' thread).
#[derive(Default)]
struct Ok1(Arc<Mutex<Vec<String>>>);
impl Ok1 {
    fn log(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}
impl LiveMigrator for Ok1 {
    fn prepare(&mut self, vm: &VmId, from: &NodeName, to: &NodeName) {
        self.0
            .lock()
            .unwrap()
            .push(format!("prepare {vm} {from}->{to}"));
    }
    fn abandon(&mut self, vm: &VmId) {
        self.0.lock().unwrap().push(format!("abandon {vm}"));
    }
    fn live_migrate(&mut self, vm: &VmId, _: &NodeName, _: &NodeName) -> Result<(), MigrateError> {
        self.0.lock().unwrap().push(format!("migrate {vm}"));
        Ok(())
    }
}

fn wait_ranks(server: &BarrierServer, job: &JobId, n: usize) {
    let until = Instant::now() + Duration::from_secs(10);
    while server.ranks(job).values().map(Vec::len).sum::<usize>() < n {
        assert!(Instant::now() < until, "ranks did not register");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn pool(db: &StateDb, n: &str) -> Pool {
    db.nodes()
        .unwrap()
        .into_iter()
        .find(|x| x.name.as_str() == n)
        .unwrap()
        .pool
}

#[test]
fn all_ranks_of_the_vm_must_block_and_unaffected_ranks_are_not_told() {
    let dir = tempfile::tempdir().unwrap();
    let (mut db, server, job) = setup(dir.path());
    // Two ranks on the affected VM, one on another VM.
    let mut a = Rank::connect(server.path(), "vm0", 0);
    let mut b = Rank::connect(server.path(), "vm0", 1);
    let mut c = Rank::connect(server.path(), "vm1", 2);
    wait_ranks(&server, &job, 3);
    let mut mig = Ok1::default();
    let log = mig.0.clone();
    let t = std::thread::spawn(move || {
        // Rank a reaches its barrier at once, rank b only later: no migration before both.
        assert_eq!(a.next().unwrap(), "NOTICE 1");
        writeln!(a.out, "READY 1").unwrap();
        assert_eq!(b.next().unwrap(), "NOTICE 1");
        // The destination is prepared while the ranks are still on their way.
        let until = Instant::now() + Duration::from_secs(10);
        while log.lock().unwrap().is_empty() {
            assert!(Instant::now() < until, "the move was not prepared");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(*log.lock().unwrap(), ["prepare vm0 n0->f0"]);
        std::thread::sleep(Duration::from_millis(200));
        writeln!(b.out, "READY 1").unwrap();
        (a.next().unwrap(), b.next().unwrap())
    });
    let cfg = BarrierConfig {
        deadline_s: 30,
        on_deadline: DeadlineAction::Cancel,
    };
    let out = run_plan(&mut db, &server, &mut mig, &plan(&job), &cfg).unwrap();
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    let (ack_a, ack_b) = t.join().unwrap();
    assert_eq!(
        (ack_a.as_str(), ack_b.as_str()),
        ("ACK 1 migrated", "ACK 1 migrated")
    );
    // The unaffected rank received nothing.
    c.out
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    assert!(
        c.lines.next().is_some_and(|l| l.is_err()),
        "vm1's rank must not get a notice"
    );
    assert_eq!(pool(&db, "n0"), Pool::Defunct);
    assert_eq!(mig.log(), ["prepare vm0 n0->f0", "migrate vm0"]);
}

#[test]
fn deadline_cancel_policy_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let (mut db, server, job) = setup(dir.path());
    let mut a = Rank::connect(server.path(), "vm0", 0);
    wait_ranks(&server, &job, 1);
    let mut mig = Ok1::default();
    let cfg = BarrierConfig {
        deadline_s: 1,
        on_deadline: DeadlineAction::Cancel,
    };
    let out = run_plan(&mut db, &server, &mut mig, &plan(&job), &cfg).unwrap();
    let Outcome::Cancelled { id, late } = out else {
        panic!("{out:?}")
    };
    assert_eq!(late, vec![vm("vm0")]);
    // Prepared while the rank was awaited, then given up: nothing migrated.
    assert_eq!(mig.log(), ["prepare vm0 n0->f0", "abandon vm0"]);
    assert_eq!(db.migration(id).unwrap().state, MigrationState::RolledBack);
    assert_eq!(pool(&db, "f0"), Pool::Free);
    assert_eq!(pool(&db, "n0"), Pool::Allocated);
    // The rank, busy in a long computation, gets the notice and its withdrawal in order.
    assert_eq!(a.next().unwrap(), "NOTICE 1");
    assert_eq!(a.next().unwrap(), "ACK 1 cancelled");
}

#[test]
fn deadline_migrate_anyway_policy() {
    let dir = tempfile::tempdir().unwrap();
    let (mut db, server, job) = setup(dir.path());
    let _a = Rank::connect(server.path(), "vm0", 0);
    wait_ranks(&server, &job, 1);
    let mut mig = Ok1::default();
    let cfg = BarrierConfig {
        deadline_s: 1,
        on_deadline: DeadlineAction::MigrateAnyway,
    };
    let out = run_plan(&mut db, &server, &mut mig, &plan(&job), &cfg).unwrap();
    let Outcome::CompletedPastDeadline { id, late } = out else {
        panic!("{out:?}")
    };
    assert_eq!(late, vec![vm("vm0")]);
    assert_eq!(mig.log(), ["prepare vm0 n0->f0", "migrate vm0"]);
    let m = db.migration(id).unwrap();
    assert_eq!(m.state, MigrationState::Done);
    assert!(m.note.contains("ranks acknowledged"));
    assert_eq!(pool(&db, "n0"), Pool::Defunct);
}

struct Fails;
impl LiveMigrator for Fails {
    fn live_migrate(&mut self, _: &VmId, _: &NodeName, _: &NodeName) -> Result<(), MigrateError> {
        Err("destination QEMU exited".into())
    }
}

#[test]
fn failed_migration_rolls_back_and_releases_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let (mut db, server, job) = setup(dir.path());
    let mut a = Rank::connect(server.path(), "vm0", 0);
    wait_ranks(&server, &job, 1);
    let t = std::thread::spawn(move || {
        assert_eq!(a.next().unwrap(), "NOTICE 1");
        writeln!(a.out, "READY 1").unwrap();
        a.next().unwrap()
    });
    let cfg = BarrierConfig::default();
    let e = run_plan(&mut db, &server, &mut Fails, &plan(&job), &cfg).unwrap_err();
    assert!(e.to_string().contains("destination QEMU exited"), "{e}");
    assert_eq!(t.join().unwrap(), "ACK 1 failed");
    assert_eq!(db.migrations(None, true).unwrap().len(), 0);
    assert_eq!(pool(&db, "f0"), Pool::Free);
    assert_eq!(db.vms(None).unwrap()[0].node.as_str(), "n0");
}

#[test]
fn rank_blocked_on_a_dead_controller_sees_end_of_file() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, server, job) = setup(dir.path());
    let mut a = Rank::connect(server.path(), "vm0", 0);
    wait_ranks(&server, &job, 1);
    server.post_notice(7, &[vm("vm0")]);
    assert_eq!(a.next().unwrap(), "NOTICE 7");
    writeln!(a.out, "READY 7").unwrap();
    drop(server);
    assert!(a.next().is_none(), "EOF, not a hang");
}

#[test]
fn rank_connecting_after_the_notice_still_gets_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, server, _job) = setup(dir.path());
    server.post_notice(3, &[vm("vm1")]);
    let mut late = Rank::connect(server.path(), "vm1", 5);
    assert_eq!(late.next().unwrap(), "NOTICE 3");
    let mut bad = UnixStream::connect(server.path()).unwrap();
    writeln!(bad, "HELLO job1 vm\"x 1").unwrap();
    let mut l = String::new();
    BufReader::new(bad).read_line(&mut l).unwrap();
    assert!(l.starts_with("ERR expected"), "{l}");
}

#[test]
fn a_checkpoint_and_a_migration_never_hold_the_same_vm() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, server, job) = setup(dir.path());
    let mut a = Rank::connect(server.path(), "vm0", 0);
    let mut b = Rank::connect(server.path(), "vm1", 1);
    wait_ranks(&server, &job, 2);
    // A migration holds vm0: a checkpoint's notice for both VMs is refused whole.
    server.post_notice(4, &[vm("vm0")]);
    assert_eq!(a.next().unwrap(), "NOTICE 4");
    assert!(!server.try_post_notice(9001, &[vm("vm0"), vm("vm1")]));
    server.ack(4, AckOutcome::Cancelled);
    assert_eq!(a.next().unwrap(), "ACK 4 cancelled");
    // Free again: the checkpoint holds both, and a migration posted meanwhile leaves them be.
    assert!(server.try_post_notice(9001, &[vm("vm0"), vm("vm1")]));
    assert_eq!(a.next().unwrap(), "NOTICE 9001");
    assert_eq!(b.next().unwrap(), "NOTICE 9001");
    server.post_notice(5, &[vm("vm1")]);
    writeln!(a.out, "READY 9001").unwrap();
    writeln!(b.out, "READY 9001").unwrap();
    let all = [vm("vm0"), vm("vm1")];
    let far = Instant::now() + Duration::from_secs(30);
    assert_eq!(server.wait_ready(9001, &all, far).len(), 2);
    assert!(
        server
            .wait_ready(5, &[vm("vm1")], Instant::now())
            .is_empty()
    );
    server.ack(9001, AckOutcome::Checkpointed);
    assert_eq!(a.next().unwrap(), ack_line(9001, AckOutcome::Checkpointed));
    assert_eq!(b.next().unwrap(), "ACK 9001 checkpointed");
    assert_eq!(
        parse_hello(&hello_line(&job, &vm("vm1"), 1)),
        Some((job, vm("vm1"), 1))
    );
}
