//! What a live migration carried (storage mode, disk and memory bytes, downtime) is kept with
//! the migration's journal: the coordinator records what its migrator measured, the history
//! returns it with the move (and `vse status --json` with it), a move nobody measured has
//! none, and a database reopened later still has it.

mod support;

use control::migrate::*;
use control::model::*;
use control::state::{MigrationState, StateDb, Transfer};
use monitor::{JobId, NodeName, VmId};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;
use support::{nm, plan, vm};

/// Moves nothing, but reports what a block-copy migration of vm0 measured.
struct Measured(Option<Transfer>);
impl LiveMigrator for Measured {
    fn live_migrate(&mut self, _: &VmId, _: &NodeName, _: &NodeName) -> Result<(), MigrateError> {
        Ok(())
    }
    fn transfer(&mut self, vm: &VmId) -> Option<Transfer> {
        assert_eq!(vm.as_str(), "vm0");
        self.0.take()
    }
}

fn run(dir: &std::path::Path, measured: Option<Transfer>) -> StateDb {
    let server = BarrierServer::bind(&dir.join("b.sock")).unwrap();
    let job = JobId::new("job1").unwrap();
    let mut db = StateDb::open(&dir.join("state.db")).unwrap();
    for n in ["n0", "f0"] {
        db.upsert_node(&nm(n), Pool::Free).unwrap();
    }
    db.add_vm(&job, &vm("vm0"), &nm("n0"), 1024).unwrap();
    let mut rank = UnixStream::connect(server.path()).unwrap();
    rank.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    writeln!(rank, "HELLO job1 vm0 0").unwrap();
    let t = std::thread::spawn(move || {
        let mut lines = BufReader::new(rank.try_clone().unwrap()).lines();
        let notice = lines.next().unwrap().unwrap();
        let id = notice.strip_prefix("NOTICE ").unwrap().to_string();
        writeln!(rank, "READY {id}").unwrap();
        lines.next().unwrap().unwrap()
    });
    while server.ranks(&job).is_empty() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let plan = plan(&job);
    let cfg = BarrierConfig {
        deadline_s: 30,
        on_deadline: DeadlineAction::Cancel,
    };
    let out = run_plan(&mut db, &server, &mut Measured(measured), &plan, &cfg).unwrap();
    assert!(matches!(out, Outcome::Completed { .. }), "{out:?}");
    assert!(t.join().unwrap().starts_with("ACK"));
    db
}

#[test]
fn a_completed_migration_keeps_what_it_carried() {
    let dir = tempfile::tempdir().unwrap();
    let t = Transfer {
        storage: "block-copy".into(),
        disk_bytes: 65536,
        memory_bytes: 100 << 20,
        total_ms: 1260,
        downtime_ms: 180,
    };
    drop(run(dir.path(), Some(t.clone())));
    let db = StateDb::open(&dir.path().join("state.db")).unwrap();
    let m = &db.migrations(None, false).unwrap()[0];
    assert_eq!(m.state, MigrationState::Done);
    assert_eq!(m.moves[0].transfer.as_ref(), Some(&t));
    let json = serde_json::to_value(m).unwrap();
    assert_eq!(json["moves"][0]["transfer"]["storage"], "block-copy");
    assert_eq!(json["moves"][0]["transfer"]["disk_bytes"], 65536);
    assert_eq!(json["moves"][0]["transfer"]["downtime_ms"], 180);
}

#[test]
fn a_move_nobody_measured_has_no_transfer() {
    let dir = tempfile::tempdir().unwrap();
    let db = run(dir.path(), None);
    let m = &db.migrations(None, false).unwrap()[0];
    assert_eq!(m.state, MigrationState::Done);
    assert_eq!(m.moves[0].transfer, None);
    let json = serde_json::to_value(m).unwrap();
    assert!(json["moves"][0].get("transfer").is_none(), "{json}");
}
