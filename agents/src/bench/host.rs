//! Hosting simulated agents in one process of a multi-process bootstrap: every agent a task
//! running the real node code over loopback sockets, each one's join (handshake with its
//! parent) stamped on the machine-wide monotonic clock so that stamps from different
//! processes compare. Children at the split level go to a worker process instead (the
//! front-end's process); everything else runs here.

use super::pool::Pool;
use crate::{
    agent::{ChildSpec, Event, SpawnError, SpawnedChild, Spawner, run_node_agent},
    proto::NodeId,
    sync::lock,
    topo::Tree,
};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the machine (what
/// `std::time::Instant` reads on Linux, but comparable across processes).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the struct we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Agents of one tree level that joined (handshaked with their parent) in this process, and
/// had their overlay links up, and when the last one of each did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LevelJoins {
    pub level: u32,
    pub joined: u32,
    pub last_ns: u64,
    pub linked: u32,
    pub linked_ns: u64,
}

/// Joins and ends of the agents hosted by one process.
#[derive(Debug, Default)]
pub struct JoinLog {
    levels: Mutex<Vec<LevelJoins>>,
    running: Mutex<u32>,
    idle: tokio::sync::Notify,
}

impl JoinLog {
    fn stamp(&self, level: u32, at: u64, overlay: bool) {
        let mut l = lock(&self.levels);
        let i = level as usize;
        if l.len() <= i {
            l.resize_with(i + 1, Default::default);
        }
        let e = &mut l[i];
        e.level = level;
        if overlay {
            e.linked += 1;
            e.linked_ns = e.linked_ns.max(at);
        } else {
            e.joined += 1;
            e.last_ns = e.last_ns.max(at);
        }
    }

    /// Per level (1 = the front-end's children), only levels with joins.
    pub fn levels(&self) -> Vec<LevelJoins> {
        lock(&self.levels)
            .iter()
            .filter(|l| l.joined > 0 || l.linked > 0)
            .copied()
            .collect()
    }

    pub fn total(&self) -> u64 {
        lock(&self.levels).iter().map(|l| u64::from(l.joined)).sum()
    }

    /// Agents of this process still running.
    pub fn running(&self) -> u32 {
        *lock(&self.running)
    }

    /// Resolves once no agent of this process runs.
    pub async fn all_ended(&self) {
        loop {
            let idle = self.idle.notified();
            if self.running() == 0 {
                return;
            }
            idle.await;
        }
    }

    fn started(&self) {
        *lock(&self.running) += 1;
    }

    fn ended(&self) {
        let mut r = lock(&self.running);
        *r -= 1;
        if *r == 0 {
            self.idle.notify_waiters();
        }
    }
}

/// Where the agents of the split level run: a worker process each.
#[derive(Debug, Clone)]
pub struct Remote {
    pub level: u32,
    pub pool: Arc<Pool>,
}

/// Starts children as tasks of this process, or, for the split level, in their worker.
#[derive(Debug)]
pub struct HostSpawner {
    pub tree: Tree,
    pub log: Arc<JoinLog>,
    pub remote: Option<Remote>,
}

struct Running(Arc<JoinLog>);
impl Drop for Running {
    fn drop(&mut self) {
        self.0.ended();
    }
}

impl Spawner for HostSpawner {
    fn spawn(&self, spec: ChildSpec) -> Result<SpawnedChild, SpawnError> {
        let level = self.tree.level(spec.id);
        if let Some(r) = self.remote.as_ref().filter(|r| r.level == level) {
            return Ok(r.pool.spawn(spec.id, spec.parent));
        }
        Ok(run_here(spec, level, self.log.clone()))
    }
}

/// The agent for `spec` as a task of this process; resolves with how it ended. Dropping the
/// task's future on a kill closes its sockets, as SIGKILL would.
pub fn run_here(spec: ChildSpec, level: u32, log: Arc<JoinLog>) -> SpawnedChild {
    log.started();
    let running = Running(log.clone());
    SpawnedChild::new(spec.id, move |mut kill| async move {
        let _running = running;
        let (tx, mut events) = tokio::sync::mpsc::unbounded_channel::<Event<()>>();
        let agent = run_node_agent(spec.config, spec.parent, tx);
        tokio::pin!(agent);
        let mut listening = true;
        loop {
            tokio::select! {
                r = &mut agent => break match r {
                    Ok(exit) => format!("agent ended: {exit}"),
                    Err(e) => format!("agent failed: {e}"),
                },
                _ = &mut kill => break "killed".to_string(),
                e = events.recv(), if listening => match e {
                    Some(Event::Linked { .. }) => log.stamp(level, mono_ns(), false),
                    Some(Event::OverlayLinked) => log.stamp(level, mono_ns(), true),
                    Some(_) => {}
                    None => listening = false,
                },
            }
        }
    })
}

/// Agent ids of the split level and their subtrees' sizes, for the worker plan.
pub fn level_roots(tree: Tree, level: u32) -> Vec<(NodeId, u32)> {
    let first = (0..level).fold(0u64, |acc, l| acc + u64::from(tree.k()).pow(l));
    let count = u64::from(tree.k()).pow(level);
    (first..first + count)
        .take_while(|i| *i < u64::from(tree.size()))
        .map(|i| {
            let id = NodeId(i as u32);
            (id, subtree_size(tree, id))
        })
        .collect()
}

/// Size of `n`'s subtree, by levels (without listing it).
pub fn subtree_size(tree: Tree, n: NodeId) -> u32 {
    let (k, size) = (u64::from(tree.k()), u64::from(tree.size()));
    let (mut lo, mut hi, mut total) = (u64::from(n.0), u64::from(n.0), 0u64);
    while lo < size {
        total += hi.min(size - 1) - lo + 1;
        lo = lo * k + 1;
        hi = hi * k + k;
    }
    total as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_and_sizes_match_the_tree() {
        for (n, k) in [(301, 8), (10_001, 8), (1001, 2), (50, 3)] {
            let t = Tree::new(n, k);
            for level in 1..=t.depth() {
                let roots = level_roots(t, level);
                assert!(roots.iter().all(|(r, _)| t.level(*r) == level));
                for (r, s) in &roots {
                    assert_eq!(*s as usize, t.subtree(*r).len(), "{r} in {n}/{k}");
                }
                let below: u32 = roots.iter().map(|(_, s)| s).sum();
                let above = (0..n).filter(|i| t.level(NodeId(*i)) < level).count() as u32;
                assert_eq!(below + above, n);
            }
        }
    }
}
