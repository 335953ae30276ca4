//! Simulation harness: every agent a task of this process (real sockets, real protocol), with
//! faults injected on chosen agents. Used by the benchmarks and the in-process tests.

use super::{ChildSpec, SpawnError, SpawnedChild, Spawner};
use crate::proto::NodeId;
use crate::sync::lock;
use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};
use std::{future::Future, pin::Pin};
use tokio::sync::oneshot;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// Never starts: its parent's handshake deadline expires.
    NoShow,
    /// Dropped when triggered: sockets close as on SIGKILL.
    Crash,
    /// Stops being polled when triggered: sockets stay open, heartbeats stop.
    Freeze,
}

#[derive(Debug, Default)]
pub struct SimSpawner {
    pub faults: HashMap<NodeId, Fault>,
    triggers: Mutex<HashMap<NodeId, oneshot::Sender<()>>>,
    pub alive: Arc<Mutex<HashSet<NodeId>>>,
    /// Crashed agents: like a SIGKILLed process, they take no children down with them.
    crashed: Arc<Mutex<HashSet<NodeId>>>,
}

impl SimSpawner {
    pub fn trigger(&self, id: NodeId) {
        lock(&self.crashed).insert(id);
        let t = lock(&self.triggers)
            .remove(&id)
            .expect("agent with a trigger");
        let _ = t.send(());
    }
}

struct AliveGuard(Arc<Mutex<HashSet<NodeId>>>, NodeId);
impl Drop for AliveGuard {
    fn drop(&mut self) {
        lock(&self.0).remove(&self.1);
    }
}

impl Spawner for SimSpawner {
    fn spawn(&self, spec: ChildSpec) -> Result<SpawnedChild, SpawnError> {
        let id = spec.id;
        let fault = self.faults.get(&id).copied();
        let (trig_tx, trig) = oneshot::channel::<()>();
        if fault.is_some() {
            lock(&self.triggers).insert(id, trig_tx);
        }
        lock(&self.alive).insert(id);
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
                    let orphaned = lock(&crashed).contains(&parent);
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

impl SimSpawner {
    pub fn with_faults(faults: impl IntoIterator<Item = (NodeId, Fault)>) -> Self {
        Self {
            faults: faults.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Marks `id` as crashed: its children outlive it, as a SIGKILLed process's would (for
    /// the front-end, which the spawner did not start).
    pub fn mark_crashed(&self, id: NodeId) {
        lock(&self.crashed).insert(id);
    }

    /// Agents currently running.
    pub fn alive(&self) -> HashSet<NodeId> {
        lock(&self.alive).clone()
    }
}

/// The agent for `spec`, run as a task of this process with real sockets (the simulation of
/// benchmarks and tests); resolves with how it ended. A bare agent: it carries no
/// application payload.
fn run_child(spec: ChildSpec) -> Pin<Box<dyn Future<Output = String> + Send>> {
    Box::pin(async move {
        let (events, _) = tokio::sync::mpsc::unbounded_channel::<super::Event<()>>();
        match super::node::run(spec.config, Some(spec.parent), None, events).await {
            Ok(r) => format!("agent ended: {r}"),
            Err(e) => format!("agent failed: {e}"),
        }
    })
}
