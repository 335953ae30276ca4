//! Bootstrap of many simulated agents split across processes, so that no process comes near
//! its open-file limit: this process runs the front-end and the top levels of the tree; each
//! worker process (started and set up before the clock starts, then waiting, as nodes wait for
//! srun) hosts a contiguous block of subtrees rooted at the split level and starts each root
//! when its parent's spawn order arrives. Every agent runs the real node code over loopback:
//! authenticated frames, the tree, the directory, the binomial-graph overlay.

use super::host::{HostSpawner, JoinLog, LevelJoins, Remote, level_roots, mono_ns};
use super::pool::{Block, Pool, WorkerCommand};
use super::worker::{Setup, base_config};
use super::{BenchError, raise_fd_limit, runtime};
use crate::{
    agent::{Control, Event, Job},
    secret::JobSecret,
    topo::{Bmg, Tree},
};
use serde::Serialize;
use std::{sync::Arc, time::Duration, time::Instant};

/// Descriptors per agent beyond its overlay links: its listener and its tree links' ends.
const TREE_FDS: u64 = 3;
/// Descriptors of a process besides its agents' (runtime, pipes, the binary's own).
const SLACK_FDS: u64 = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub agents: u32,
    pub k: u32,
    /// Agents of this level and their subtrees run in the workers; those above, here.
    pub level: u32,
    pub blocks: Vec<Block>,
    /// Descriptors the busiest worker needs (an estimate with margin).
    pub worker_fds: u64,
    /// Descriptors this process needs.
    pub front_fds: u64,
}

/// Descriptors one agent holds once its overlay is up.
fn fds_per_agent(tree: Tree) -> u64 {
    let deg = Bmg::new(tree.size())
        .neighbours(crate::proto::NodeId(0))
        .len() as u64;
    deg + TREE_FDS
}

/// Splits `agents` over `workers` processes (default: as many as keep each one below half of
/// `fd_limit`).
pub fn plan(agents: u32, k: u32, workers: Option<u32>, fd_limit: u64) -> Result<Plan, BenchError> {
    let tree = Tree::new(agents + 1, k);
    let per = fds_per_agent(tree);
    let budget = (fd_limit / 2).max(2 * SLACK_FDS);
    if let Some(w) = workers {
        return split(tree, per, w);
    }
    let mut want = (u64::from(agents) * per)
        .div_ceil(budget - SLACK_FDS)
        .max(1) as u32;
    loop {
        let p = split(tree, per, want)?;
        // Blocks are whole subtrees, so the busiest may be above the average.
        if p.worker_fds <= budget || want >= agents {
            return Ok(p);
        }
        want += 1;
    }
}

fn split(tree: Tree, per: u64, want: u32) -> Result<Plan, BenchError> {
    let (agents, k) = (tree.size() - 1, tree.k());
    let depth = tree.depth().max(1);
    // The split level: the first with a few roots per worker, so blocks come out even.
    let level = (1..=depth)
        .find(|l| level_roots(tree, *l).len() as u64 >= 4 * u64::from(want))
        .unwrap_or(depth);
    let roots = level_roots(tree, level);
    if want == 0 || roots.len() < want as usize {
        return Err(BenchError::Run(format!(
            "cannot split {agents} agents (k={k}) over {want} worker processes: level {level} has {} agents",
            roots.len()
        )));
    }
    let total: u64 = roots.iter().map(|(_, s)| u64::from(*s)).sum();
    let mut blocks: Vec<Block> = Vec::new();
    let mut next = 0usize;
    let mut done = 0u64;
    for w in 0..want as usize {
        let target = total * (w as u64 + 1) / u64::from(want);
        // At least one root, and one left for each later worker.
        let mut end = next + 1;
        let mut sum = done + u64::from(roots[next].1);
        while end < roots.len() - (want as usize - w - 1) {
            let with = sum + u64::from(roots[end].1);
            // Cut where the block's end comes closest to its share.
            if with.abs_diff(target) > sum.abs_diff(target) {
                break;
            }
            sum = with;
            end += 1;
        }
        if w + 1 == want as usize {
            end = roots.len();
            sum = total;
        }
        blocks.push(Block {
            first: roots[next].0.0,
            last: roots[end - 1].0.0,
            agents: (sum - done) as u32,
        });
        done = sum;
        next = end;
    }
    let busiest = blocks
        .iter()
        .map(|b| u64::from(b.agents))
        .max()
        .unwrap_or(0);
    let front = u64::from(agents) + 1 - total;
    Ok(Plan {
        agents,
        k,
        level,
        blocks,
        worker_fds: busiest * per + SLACK_FDS,
        front_fds: front * per + SLACK_FDS + 4 * u64::from(want),
    })
}

/// One level of the tree: its agents, when the last of them was up (handshaked with its
/// parent) and when the last had its overlay links, seconds after the front-end started.
#[derive(Debug, Clone, Serialize)]
pub struct LevelFigures {
    pub level: u32,
    pub agents: u32,
    pub up_s: f64,
    pub overlay_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MultiFigures {
    pub agents: u32,
    pub fanout: u32,
    pub depth: u32,
    /// Every process of the run: this one (front-end and the levels above the split) and the
    /// workers.
    pub processes: u32,
    pub split_level: u32,
    /// Starting the workers and their setup, before the clock (srun's part on a cluster).
    pub workers_start_s: f64,
    /// Front-end start to every agent's subtree reported up (the tree bootstrap).
    pub bootstrap_s: f64,
    /// Front-end start to every agent's overlay linked (directory, binomial graph, all
    /// reported ready).
    pub overlay_s: f64,
    /// Agents that handshaked with their parent (every one, or the run is an error).
    pub handshaked: u64,
    /// Agents that had their overlay links up (every one, or the run is an error).
    pub overlay_linked: u64,
    pub levels: Vec<LevelFigures>,
    pub max_fds_per_process: u64,
    /// The workers' process ids, all reaped by the time the figures exist.
    #[serde(skip)]
    pub worker_pids: Vec<u32>,
}

/// Runs the bootstrap of `agents` agents with fan-out `k` across worker processes started
/// with `cmd`; `workers`: their number (default: from the open-file limit). Blocking; call it
/// from a thread that outlives the run (the workers die with the thread that started them).
pub fn bootstrap(
    agents: u32,
    k: u32,
    workers: Option<u32>,
    cmd: &WorkerCommand,
) -> Result<MultiFigures, BenchError> {
    let limit = raise_fd_limit(u64::MAX);
    let plan = plan(agents, k, workers, limit)?;
    for need in [plan.worker_fds, plan.front_fds] {
        if need > limit {
            return Err(BenchError::FdLimit {
                agents,
                need,
                limit,
            });
        }
    }
    let secret = JobSecret::generate()?;
    let setup = Setup {
        agents,
        k,
        overlay: true,
        handshake_ms: 60_000,
        // Heartbeats start on each agent once its overlay is up. Every agent of the run shares
        // this machine's cores, so at the default period they would cost N times what one
        // node bears and slow the rest of the bootstrap: here they start after it.
        heartbeat_ms: 60_000,
        timeout_ms: 240_000,
        fds: plan.worker_fds,
    };
    let t = Instant::now();
    let pool = Arc::new(Pool::start(cmd, plan.blocks.clone(), &secret, &setup)?);
    let workers_start_s = t.elapsed().as_secs_f64();
    let pids = pool.pids();
    let log = Arc::new(JoinLog::default());
    let spawner = Arc::new(HostSpawner {
        tree: Tree::new(agents + 1, k),
        log: log.clone(),
        remote: Some(Remote {
            level: plan.level,
            pool: pool.clone(),
        }),
    });
    let cfg = base_config(secret, &setup, spawner);
    let run = runtime()?.block_on(async {
        let r = tokio::time::timeout(Duration::from_secs(600), drive(cfg)).await;
        // Whatever happened, the agents of this process end before the workers are reaped.
        let _ = tokio::time::timeout(Duration::from_secs(10), log.all_ended()).await;
        r.map_err(|_| BenchError::Run("the bootstrap did not end within 600 s".into()))?
    });
    let reports = pool.finish();
    drop(pool);
    let ((t0, bootstrap_s, overlay_s), reports) = match (run, reports) {
        (Ok(r), Ok(w)) => (r, w),
        // A worker that ended badly is the likelier cause of whatever went wrong here.
        (Err(e), Err(BenchError::Run(w))) => {
            let e = match e {
                BenchError::Run(m) => m,
                e => e.to_string(),
            };
            return Err(BenchError::Run(format!("{w}; meanwhile: {e}")));
        }
        (Err(e), _) | (_, Err(e)) => return Err(e),
    };
    let mut joins = log.levels();
    for (_, levels) in reports {
        joins.extend(levels);
    }
    let figures = figures(
        &plan,
        joins,
        t0,
        workers_start_s,
        bootstrap_s,
        overlay_s,
        pids,
    );
    if figures.handshaked != u64::from(agents) || figures.overlay_linked != u64::from(agents) {
        return Err(BenchError::Run(format!(
            "of {agents} agents, {} handshaked with their parent and {} linked the overlay",
            figures.handshaked, figures.overlay_linked
        )));
    }
    Ok(figures)
}

/// The front-end's run: start, bootstrap, overlay, shutdown. Returns the clock's start on the
/// machine-wide clock and the two figures.
async fn drive(cfg: crate::agent::AgentConfig) -> Result<(u64, f64, f64), BenchError> {
    let agents = cfg.tree.size() as usize;
    let t0 = mono_ns();
    let mut job = Job::<()>::start(cfg);
    let (mut boot, mut ready) = (None, None);
    while let Some(e) = job.next_event().await {
        match e {
            Event::Bootstrapped {
                up,
                failed,
                elapsed,
                ..
            } => {
                if !failed.is_empty() || up != agents {
                    job.control(Control::Shutdown {
                        reason: "bootstrap incomplete".into(),
                    });
                    let _ = job.wait().await;
                    return Err(BenchError::Run(format!(
                        "{up} of {agents} agents up, {} failed to bootstrap",
                        failed.len()
                    )));
                }
                boot = Some(elapsed.as_secs_f64());
            }
            Event::Ready {
                agents: n, elapsed, ..
            } => {
                ready = Some((n, elapsed.as_secs_f64()));
                job.control(Control::Shutdown {
                    reason: "benchmark done".into(),
                });
            }
            Event::NodeFailed { node, reason, .. } if ready.is_none() => {
                job.control(Control::Shutdown {
                    reason: "an agent failed".into(),
                });
                let _ = job.wait().await;
                return Err(BenchError::Run(format!("{node} failed: {reason}")));
            }
            _ => {}
        }
    }
    job.wait().await?;
    match (boot, ready) {
        (Some(b), Some((n, r))) if n == agents => Ok((t0, b, r)),
        (Some(_), Some((n, _))) => Err(BenchError::Run(format!(
            "overlay ready with {n} of {agents} agents"
        ))),
        _ => Err(BenchError::Run(
            "the front-end ended before the overlay was ready".into(),
        )),
    }
}

fn figures(
    plan: &Plan,
    joins: Vec<LevelJoins>,
    t0: u64,
    workers_start_s: f64,
    bootstrap_s: f64,
    overlay_s: f64,
    worker_pids: Vec<u32>,
) -> MultiFigures {
    let tree = Tree::new(plan.agents + 1, plan.k);
    let mut levels: Vec<LevelFigures> = (1..=tree.depth())
        .map(|level| LevelFigures {
            level,
            agents: 0,
            up_s: 0.0,
            overlay_s: 0.0,
        })
        .collect();
    let (mut handshaked, mut overlay_linked) = (0u64, 0u64);
    for j in joins {
        handshaked += u64::from(j.joined);
        overlay_linked += u64::from(j.linked);
        if let Some(l) = levels.get_mut(j.level as usize - 1) {
            l.agents += j.joined;
            l.up_s = l.up_s.max(j.last_ns.saturating_sub(t0) as f64 / 1e9);
            l.overlay_s = l.overlay_s.max(j.linked_ns.saturating_sub(t0) as f64 / 1e9);
        }
    }
    MultiFigures {
        agents: plan.agents,
        fanout: plan.k,
        depth: tree.depth(),
        processes: plan.blocks.len() as u32 + 1,
        split_level: plan.level,
        workers_start_s,
        bootstrap_s,
        overlay_s,
        handshaked,
        overlay_linked,
        levels,
        max_fds_per_process: plan.worker_fds.max(plan.front_fds),
        worker_pids,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_cover_every_agent_once_within_the_limit() {
        for (n, k, w, limit) in [
            (10_000, 8, None, 20_000),
            (1000, 8, None, 20_000),
            (300, 8, Some(3), 20_000),
            (10_000, 2, None, 20_000),
        ] {
            let p = plan(n, k, w, limit).unwrap();
            let tree = Tree::new(n + 1, k);
            let above = (0..=n)
                .filter(|i| tree.level(crate::proto::NodeId(*i)) < p.level)
                .count() as u32;
            let below: u32 = p.blocks.iter().map(|b| b.agents).sum();
            assert_eq!(above + below, n + 1, "{n}/{k}");
            for pair in p.blocks.windows(2) {
                assert_eq!(pair[0].last + 1, pair[1].first);
            }
            if let Some(w) = w {
                assert_eq!(p.blocks.len(), w as usize);
            }
            if w.is_none() {
                assert!(p.worker_fds <= limit / 2, "{p:?}");
            }
            assert!(p.front_fds <= limit / 2, "{p:?}");
        }
        assert!(plan(300, 8, Some(400), 20_000).is_err());
    }
}
