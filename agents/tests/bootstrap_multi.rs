//! The bootstrap split across worker processes (what `vse bench launch` runs for 10,000
//! agents): every agent up and handshaked over the real protocol, every worker reaped, and a
//! worker that dies made a clear error. The workers are this test binary, re-run filtered to
//! one of its tests with the worker variable set: every test first checks whether it is a
//! worker (then it serves and ends).

use agents::bench::{BenchError, WorkerCommand, multi, worker};
use agents::{proto::NodeId, topo::Tree};
use std::path::Path;

const WORKER_ENV: &str = "VSE_TEST_SIM_WORKER";

fn workers(mode: &str) -> WorkerCommand {
    WorkerCommand {
        program: std::env::current_exe().expect("test binary"),
        args: [
            "three_hundred_agents_across_three_worker_processes_all_handshake",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ]
        .map(String::from)
        .to_vec(),
        env: vec![(WORKER_ENV.into(), mode.into())],
    }
}

/// In a worker process the tests below started: serves as a worker, and the test it was run
/// as ends there (true). In the test run itself: false.
fn as_worker() -> bool {
    let Ok(mode) = std::env::var(WORKER_ENV) else {
        return false;
    };
    if mode == "die" {
        // Ends on its own while the front-end still counts on it.
        std::thread::spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            std::process::exit(7);
        });
    }
    worker::serve().expect("worker");
    true
}

/// Children of this process still running (every thread's).
fn own_children() -> Vec<u32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").expect("/proc") {
        let p = t.expect("task").path().join("children");
        let s = std::fs::read_to_string(p).unwrap_or_default();
        out.extend(s.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
    }
    out
}

fn assert_none_left(pids: &[u32]) {
    let children = own_children();
    for pid in pids {
        assert!(!children.contains(pid), "worker {pid} is still a child");
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "worker {pid} is still there"
        );
    }
}

#[test]
fn three_hundred_agents_across_three_worker_processes_all_handshake() {
    if as_worker() {
        return;
    }
    let f = multi::bootstrap(300, 8, Some(3), &workers("serve")).expect("bootstrap");
    assert_eq!(f.agents, 300);
    assert_eq!(f.processes, 4);
    assert_eq!(f.worker_pids.len(), 3);
    // Every agent handshaked with its parent and linked up its overlay, in whichever process.
    assert_eq!(f.handshaked, 300);
    assert_eq!(f.overlay_linked, 300);
    let tree = Tree::new(301, 8);
    assert_eq!(f.depth, tree.depth());
    assert_eq!(f.levels.len() as u32, tree.depth());
    for l in &f.levels {
        let expect = (1..=300)
            .filter(|i| tree.level(NodeId(*i)) == l.level)
            .count() as u32;
        assert_eq!(l.agents, expect, "level {}", l.level);
        // Each agent's overlay comes after its handshake.
        assert!(l.up_s > 0.0 && l.overlay_s >= l.up_s, "{l:?} in {f:?}");
    }
    assert!(f.split_level >= 1 && f.split_level <= f.depth);
    // The tree reported before the overlay was built on it.
    assert!(f.bootstrap_s <= f.overlay_s);
    assert_none_left(&f.worker_pids);
}

#[test]
fn a_worker_that_dies_is_a_clear_error_and_leaves_nothing() {
    if as_worker() {
        return;
    }
    let before = own_children();
    let err = multi::bootstrap(300, 8, Some(3), &workers("die")).expect_err("a worker died");
    let msg = err.to_string();
    assert!(matches!(err, BenchError::Run(_)), "{msg}");
    // Whichever phase it hit (set-up, bootstrap, overlay, the end), the error names the
    // worker and how it ended.
    assert!(msg.contains("bootstrap worker"), "{msg}");
    assert!(msg.contains("exit status: 7"), "{msg}");
    let after: Vec<u32> = own_children()
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert!(after.is_empty(), "left behind: {after:?}");
}

#[test]
fn a_worker_program_that_is_not_one_is_refused_clearly() {
    if as_worker() {
        return;
    }
    let cmd = WorkerCommand {
        program: "/bin/sh".into(),
        args: vec!["-c".into(), "echo not a worker >&2; exit 3".into()],
        env: vec![],
    };
    let before = own_children();
    let msg = multi::bootstrap(300, 8, Some(3), &cmd)
        .expect_err("not a worker")
        .to_string();
    assert!(msg.contains("bootstrap worker"), "{msg}");
    // Its own words, from its stderr.
    assert!(msg.contains("not a worker"), "{msg}");
    let after: Vec<u32> = own_children()
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert!(after.is_empty(), "left behind: {after:?}");
}
