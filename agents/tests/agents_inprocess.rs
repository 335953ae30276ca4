//! The agent runtime with every agent a task of this process (real sockets, real protocol):
//! bootstrap, overlay, and the failure detectors, driven by a spawner that can crash or freeze
//! chosen agents.

use agents::{
    agent::{
        AgentConfig, Control, Exit, HostEntry, OnFailure, Timing,
        sim::{Fault, SimSpawner},
    },
    proto::NodeId,
    secret::JobSecret,
    topo::Tree,
};
use std::{sync::Arc, time::Duration};

fn config(n: u32, k: u32, spawner: Arc<SimSpawner>, on_failure: OnFailure) -> AgentConfig {
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
        orphan_grace: Duration::ZERO,
    }
}

/// The runtime's tests run bare agents: no application payload.
type Job = agents::agent::Job<()>;
type Event = agents::agent::Event<()>;

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

async fn no_agents_left(sp: &SimSpawner) {
    for _ in 0..100 {
        if sp.alive().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("agents still running: {:?}", sp.alive());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_overlay_and_clean_shutdown() {
    let sp = Arc::new(SimSpawner::default());
    let mut job = Job::start(config(20, 3, sp.clone(), OnFailure::Abort));
    let ev = until(&mut job, |e| matches!(e, Event::Ready { .. })).await;
    assert!(ev.iter().any(|e| matches!(e, Event::Bootstrapped { up: 21, failed, depth: 3, .. } if failed.is_empty())), "{ev:?}");
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::Ready { agents: 21, .. }))
    );
    assert_eq!(sp.alive().len(), 20);
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
    no_agents_left(&sp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_subtree_is_reported_and_job_goes_on_with_fewer() {
    let sp = Arc::new(SimSpawner::with_faults([(NodeId(2), Fault::NoShow)]));
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
    no_agents_left(&sp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_failure_aborts_by_default() {
    let sp = Arc::new(SimSpawner::with_faults([(NodeId(3), Fault::NoShow)]));
    let job = Job::start(config(6, 2, sp.clone(), OnFailure::Abort));
    let exit = job.wait().await.unwrap();
    assert!(!exit.clean);
    assert_eq!(
        exit.failures.iter().map(|f| f.node).collect::<Vec<_>>(),
        [NodeId(3)]
    );
    no_agents_left(&sp).await;
}

/// Crash (connections close) or freeze (heartbeats stop) an interior agent or a leaf after the
/// job is up: the front-end learns which agent died and, by default, terminates the rest.
async fn fault_after_ready(victim: NodeId, fault: Fault, want_reason: &[&str]) {
    let sp = Arc::new(SimSpawner::with_faults([(victim, fault)]));
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
    no_agents_left(&sp).await;
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
    let sp = Arc::new(SimSpawner::with_faults([(NodeId(1), Fault::Crash)]));
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
    let alive = sp.alive();
    assert!(!alive.contains(&NodeId(1)));
    assert_eq!(alive.len(), 13, "{alive:?}");
    // Still controllable: a routed message reaches agent 3 and its answer comes back.
    for dst in [3, 7, 10] {
        job.control(Control::Ping {
            dst: NodeId(dst),
            seq: 77,
        });
        until(
            &mut job,
            |e| matches!(e, Event::Pong { from, seq: 77 } if *from == NodeId(dst)),
        )
        .await;
    }
    job.control(Control::Shutdown {
        reason: "done".into(),
    });
    let exit = job.wait().await.unwrap();
    assert_eq!(exit.failures.len(), 1, "{exit}");
    no_agents_left(&sp).await;
}

/// The front-end dies (its task dropped, its children left running as a SIGKILLed process's
/// are) with a grace period set: every node agent stays, and a new front-end attaches through
/// the old one's peers only. Agents that were neither its tree children nor its overlay
/// neighbours learn of it over the overlay; each answers a ping, and the job shuts down clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_front_end_reaches_every_agent_after_the_old_one_died() {
    let sp = Arc::new(SimSpawner::default());
    let mut cfg = config(20, 3, sp.clone(), OnFailure::Continue);
    cfg.orphan_grace = Duration::from_secs(20);
    let mut job = Job::start(cfg.clone());
    let ev = until(&mut job, |e| matches!(e, Event::Ready { .. })).await;
    let directory = ev
        .iter()
        .find_map(|e| match e {
            Event::Ready { directory, .. } => Some(directory.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(directory.len(), 20);
    let mut peers = cfg.tree.children(NodeId(0));
    peers.extend(agents::topo::Bmg::new(21).neighbours(NodeId(0)));
    peers.sort();
    peers.dedup();
    assert!(
        peers.len() < 20,
        "some agents must be reachable only through others: {peers:?}"
    );
    sp.mark_crashed(NodeId(0));
    job.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        sp.alive().len(),
        20,
        "every node agent outlives the front-end"
    );
    let mut job = Job::attach(cfg, directory);
    let ev = until(&mut job, |e| matches!(e, Event::Ready { .. })).await;
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::Ready { agents: 21, .. })),
        "{ev:?}"
    );
    for dst in 1..=20 {
        job.control(Control::Ping {
            dst: NodeId(dst),
            seq: u64::from(dst),
        });
    }
    let mut answered = std::collections::BTreeSet::new();
    until(&mut job, |e| {
        if let Event::Pong { from, seq } = e {
            assert_eq!(u64::from(from.0), *seq);
            answered.insert(from.0);
        }
        answered.len() == 20
    })
    .await;
    job.control(Control::Shutdown {
        reason: "done".into(),
    });
    let exit = job.wait().await.unwrap();
    assert!(exit.failures.is_empty(), "{exit:?}");
    no_agents_left(&sp).await;
}

/// Without a new front-end, every node agent ends once the grace period is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphaned_agents_end_after_the_grace_period() {
    let sp = Arc::new(SimSpawner::default());
    let mut cfg = config(12, 2, sp.clone(), OnFailure::Continue);
    cfg.orphan_grace = Duration::from_secs(1);
    let mut job = Job::start(cfg);
    until(&mut job, |e| matches!(e, Event::Ready { .. })).await;
    sp.mark_crashed(NodeId(0));
    job.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sp.alive().len(), 12, "they wait for a new front-end first");
    no_agents_left(&sp).await;
}
