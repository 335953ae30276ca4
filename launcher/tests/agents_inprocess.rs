//! The agent runtime with every agent a task of this process (real sockets, real protocol):
//! bootstrap, overlay, and the failure detectors, driven by a spawner that can crash or freeze
//! chosen agents.

use launcher::{
    agent::{
        AgentConfig, ChildSpec, Control, Event, Exit, HostEntry, Job, OnFailure, SpawnError,
        SpawnedChild, Spawner, Timing, run_child,
    },
    proto::{Msg, NodeId},
    secret::JobSecret,
    topo::Tree,
};
use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::sync::oneshot;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// Never starts: its parent's handshake deadline expires.
    NoShow,
    /// Dropped when triggered: sockets close as on SIGKILL.
    Crash,
    /// Stops being polled when triggered: sockets stay open, heartbeats stop.
    Freeze,
}

#[derive(Debug, Default)]
struct FaultySpawner {
    faults: HashMap<NodeId, Fault>,
    triggers: Mutex<HashMap<NodeId, oneshot::Sender<()>>>,
    alive: Arc<Mutex<HashSet<NodeId>>>,
    /// Crashed agents: like a SIGKILLed process, they take no children down with them.
    crashed: Arc<Mutex<HashSet<NodeId>>>,
}

impl FaultySpawner {
    fn trigger(&self, id: NodeId) {
        self.crashed.lock().unwrap().insert(id);
        let t = self
            .triggers
            .lock()
            .unwrap()
            .remove(&id)
            .expect("agent with a trigger");
        t.send(()).unwrap();
    }
}

struct AliveGuard(Arc<Mutex<HashSet<NodeId>>>, NodeId);
impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.lock().unwrap().remove(&self.1);
    }
}

impl Spawner for FaultySpawner {
    fn spawn(&self, spec: ChildSpec) -> Result<SpawnedChild, SpawnError> {
        let id = spec.id;
        let fault = self.faults.get(&id).copied();
        let (trig_tx, trig) = oneshot::channel::<()>();
        if fault.is_some() {
            self.triggers.lock().unwrap().insert(id, trig_tx);
        }
        self.alive.lock().unwrap().insert(id);
        let guard = AliveGuard(self.alive.clone(), id);
        let crashed = self.crashed.clone();
        let parent = spec.config.tree.parent(id).expect("children have parents");
        Ok(SpawnedChild::new(id, move |kill| async move {
            if fault == Some(Fault::NoShow) {
                let _guard = guard;
                let _ = kill.await;
                return "never started".into();
            }
            let mut agent = run_child(spec);
            let mut kill = kill;
            tokio::select! {
                s = &mut agent => {
                    drop(guard);
                    s
                }
                _ = &mut kill => {
                    let orphaned = crashed.lock().unwrap().contains(&parent);
                    if orphaned {
                        // The parent "died": keep running on our own, as a real orphan would.
                        tokio::spawn(async move {
                            let _guard = guard;
                            agent.await
                        });
                        return "detached".into();
                    }
                    drop(guard);
                    "killed".into()
                }
                _ = trig, if fault.is_some() => {
                    if fault == Some(Fault::Freeze) {
                        let _ = kill.await; // hold the agent, unpolled, until its parent kills it
                    }
                    drop(agent);
                    drop(guard);
                    "crashed".into()
                }
            }
        }))
    }
}

fn config(n: u32, k: u32, spawner: Arc<FaultySpawner>, on_failure: OnFailure) -> AgentConfig {
    let hosts = (1..=n).map(|i| HostEntry {
        host: format!("sim{i}"),
        addr: "127.0.0.1".parse().unwrap(),
    });
    AgentConfig {
        id: NodeId(0),
        tree: Tree::new(n + 1, k),
        secret: JobSecret::generate().unwrap(),
        bind: "127.0.0.1".parse().unwrap(),
        hosts: Arc::new(hosts.collect()),
        timing: Timing {
            handshake: Duration::from_secs(2),
            heartbeat: Duration::from_millis(100),
            timeout: Duration::from_millis(600),
        },
        on_failure,
        overlay: true,
        spawner,
    }
}

async fn until<F: FnMut(&Event) -> bool>(job: &mut Job, mut f: F) -> Vec<Event> {
    let mut seen = Vec::new();
    loop {
        let e = tokio::time::timeout(Duration::from_secs(30), job.next_event())
            .await
            .expect("event within 30 s")
            .expect("front-end still running");
        eprintln!("event: {e:?}");
        let done = f(&e);
        seen.push(e);
        if done {
            return seen;
        }
    }
}

async fn no_agents_left(alive: &Mutex<HashSet<NodeId>>) {
    for _ in 0..100 {
        if alive.lock().unwrap().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("agents still running: {:?}", alive.lock().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_overlay_and_clean_shutdown() {
    let sp = Arc::new(FaultySpawner::default());
    let mut job = Job::start(config(20, 3, sp.clone(), OnFailure::Abort));
    let ev = until(&mut job, |e| matches!(e, Event::Ready { .. })).await;
    assert!(ev.iter().any(|e| matches!(e, Event::Bootstrapped { up: 21, failed, depth: 3, .. } if failed.is_empty())), "{ev:?}");
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::Ready { agents: 21, .. }))
    );
    assert_eq!(sp.alive.lock().unwrap().len(), 20);
    job.control(Control::Shutdown {
        reason: "done".into(),
    });
    let exit = job.wait().await.unwrap();
    assert_eq!(
        exit,
        Exit {
            reason: "done".into(),
            failures: vec![],
            clean: true
        }
    );
    no_agents_left(&sp.alive).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_subtree_is_reported_and_job_goes_on_with_fewer() {
    let sp = Arc::new(FaultySpawner {
        faults: [(NodeId(2), Fault::NoShow)].into(),
        ..Default::default()
    });
    let mut job = Job::start(config(12, 2, sp.clone(), OnFailure::Continue));
    let ev = until(&mut job, |e| matches!(e, Event::Ready { .. })).await;
    // agent 2's subtree in a binary tree of 13: 2, 5, 6, 11, 12
    let boot = ev.iter().find_map(|e| match e {
        Event::Bootstrapped { up, failed, .. } => Some((*up, failed.clone())),
        _ => None,
    });
    let (up, mut failed) = boot.unwrap();
    failed.sort();
    assert_eq!(failed, [2, 5, 6, 11, 12].map(NodeId));
    assert_eq!(up, 13 - 5);
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::Ready { agents: 8, .. })),
        "{ev:?}"
    );
    job.control(Control::Shutdown {
        reason: "done".into(),
    });
    let exit = job.wait().await.unwrap();
    assert_eq!(exit.failures.len(), 5);
    no_agents_left(&sp.alive).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_failure_aborts_by_default() {
    let sp = Arc::new(FaultySpawner {
        faults: [(NodeId(3), Fault::NoShow)].into(),
        ..Default::default()
    });
    let job = Job::start(config(6, 2, sp.clone(), OnFailure::Abort));
    let exit = job.wait().await.unwrap();
    assert!(!exit.clean);
    assert_eq!(
        exit.failures.iter().map(|f| f.node).collect::<Vec<_>>(),
        [NodeId(3)]
    );
    no_agents_left(&sp.alive).await;
}

/// Crash (connections close) or freeze (heartbeats stop) an interior agent or a leaf after the
/// job is up: the front-end learns which agent died and, by default, terminates the rest.
async fn fault_after_ready(victim: NodeId, fault: Fault, want_reason: &[&str]) {
    let sp = Arc::new(FaultySpawner {
        faults: [(victim, fault)].into(),
        ..Default::default()
    });
    let mut job = Job::start(config(14, 2, sp.clone(), OnFailure::Abort));
    until(&mut job, |e| matches!(e, Event::Ready { .. })).await;
    sp.trigger(victim);
    let ev = until(&mut job, |e| matches!(e, Event::NodeFailed { .. })).await;
    let Some(Event::NodeFailed { node, reason, .. }) = ev.last() else {
        unreachable!()
    };
    assert_eq!(*node, victim);
    assert!(want_reason.iter().any(|w| reason.contains(w)), "{reason}");
    let exit = job.wait().await.unwrap();
    assert!(!exit.clean);
    assert_eq!(exit.failures[0].node, victim);
    no_agents_left(&sp.alive).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interior_crash_is_detected_by_closed_connections() {
    // Agent 3 has a parent (1) and children (7, 8): its parent may see the exit (SIGCHLD
    // detector) before any neighbour sees a connection close.
    fault_after_ready(NodeId(3), Fault::Crash, &["connection closed", "crashed"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaf_freeze_is_detected_by_heartbeat() {
    fault_after_ready(NodeId(13), Fault::Freeze, &["no heartbeat"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survivors_stay_controllable_after_an_interior_failure() {
    let sp = Arc::new(FaultySpawner {
        faults: [(NodeId(1), Fault::Crash)].into(),
        ..Default::default()
    });
    let mut job = Job::start(config(14, 2, sp.clone(), OnFailure::Continue));
    until(&mut job, |e| matches!(e, Event::Ready { .. })).await;
    sp.trigger(NodeId(1));
    until(&mut job, |e| {
        matches!(
            e,
            Event::NodeFailed {
                node: NodeId(1),
                ..
            }
        )
    })
    .await;
    // 3 and 4 (children of 1) and 7..=10 below them lost their tree parent, not the overlay.
    let alive = sp.alive.lock().unwrap().clone();
    assert!(!alive.contains(&NodeId(1)));
    assert_eq!(alive.len(), 13, "{alive:?}");
    // Still controllable: a routed message reaches agent 3 and its answer comes back.
    for dst in [3, 7, 10] {
        job.control(Control::Send {
            dst: NodeId(dst),
            msg: Msg::Ping { seq: 77 },
        });
        until(&mut job, |e| matches!(e, Event::Message { from, msg: Msg::Pong { seq: 77 } } if *from == NodeId(dst))).await;
    }
    job.control(Control::Shutdown {
        reason: "done".into(),
    });
    let exit = job.wait().await.unwrap();
    assert_eq!(exit.failures.len(), 1, "{exit}");
    no_agents_left(&sp.alive).await;
}
