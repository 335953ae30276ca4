//! A worker process of the multi-process bootstrap: hosts the subtrees of the agents the
//! front-end's process asks it to start, as srun would start agents on their nodes. It talks
//! JSON lines: orders on stdin (the job secret first, never in argv or the environment),
//! answers on stdout, each prefixed with [`PREFIX`] so that anything else a host binary prints
//! there (a test harness's banner) is ignored. It ends when its stdin closes: the agents still
//! running are killed, and the last line is its report.

use super::host::{HostSpawner, JoinLog, LevelJoins, run_here};
use super::{BenchError, raise_fd_limit, sim_hosts};
use crate::{
    agent::{AgentConfig, ChildSpec, OnFailure, SpawnedChild, Timing},
    proto::NodeId,
    secret::JobSecret,
    topo::Tree,
};
use serde::{Deserialize, Serialize};
use std::{
    collections::HashMap,
    io::{BufRead, Write},
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::sync::mpsc;

/// Marks the worker's protocol lines on its stdout.
pub const PREFIX: &str = "@vse-sim-worker ";

/// The job every agent of the run shares (the secret travels on the line before it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Setup {
    pub agents: u32,
    pub k: u32,
    pub overlay: bool,
    pub handshake_ms: u64,
    pub heartbeat_ms: u64,
    pub timeout_ms: u64,
    /// Descriptors the worker should be able to open.
    pub fds: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "order", rename_all = "snake_case")]
pub enum Order {
    /// Start agent `id` (a root of this worker's block), whose parent listens at `parent`.
    Spawn {
        id: u32,
        parent: SocketAddr,
    },
    Kill {
        id: u32,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Answer {
    /// Set up, waiting for orders; `fds`: its open-file limit.
    Ready { fds: u64 },
    /// A root agent this worker started has ended.
    Exit { id: u32, how: String },
    /// The last line: joins per level of every agent this worker hosted.
    Report {
        levels: Vec<LevelJoins>,
        still_running: u32,
    },
}

/// The shared configuration of the run's agents (id and spawner set per process).
pub fn base_config(secret: JobSecret, s: &Setup, spawner: Arc<HostSpawner>) -> AgentConfig {
    let lo: std::net::IpAddr = "127.0.0.1".parse().expect("literal");
    AgentConfig {
        id: NodeId(0),
        tree: Tree::new(s.agents + 1, s.k),
        secret,
        bind: lo,
        hosts: sim_hosts(s.agents),
        timing: Timing {
            handshake: Duration::from_millis(s.handshake_ms),
            heartbeat: Duration::from_millis(s.heartbeat_ms),
            timeout: Duration::from_millis(s.timeout_ms),
        },
        // A benchmark run with a failed agent is void: end it at once.
        on_failure: OnFailure::Abort,
        overlay: s.overlay,
        spawner,
        orphan_grace: Duration::ZERO,
    }
}

fn say(out: &Mutex<std::io::Stdout>, a: &Answer) {
    let line = serde_json::to_string(a).expect("answers serialise");
    let mut o = crate::sync::lock(out);
    // The front-end gone means this worker's end is near (stdin closes): nothing to do here.
    let _ = writeln!(o, "{PREFIX}{line}");
    let _ = o.flush();
}

fn read_line(input: &mut impl BufRead) -> Result<String, BenchError> {
    let mut s = String::new();
    match input.read_line(&mut s) {
        Ok(0) => Err(BenchError::Run(
            "worker: stdin closed before the setup".into(),
        )),
        Ok(_) => Ok(s),
        Err(e) => Err(BenchError::Run(format!("worker: reading stdin: {e}"))),
    }
}

/// Runs a worker on this process's stdin and stdout until stdin closes.
pub fn serve() -> Result<(), BenchError> {
    let mut input = std::io::BufReader::new(std::io::stdin());
    let secret = JobSecret::from_hex(&read_line(&mut input)?)?;
    let setup: Setup = serde_json::from_str(&read_line(&mut input)?)
        .map_err(|e| BenchError::Run(format!("worker: bad setup line: {e}")))?;
    let fds = raise_fd_limit(setup.fds);
    let (tx, orders) = mpsc::unbounded_channel::<Result<Order, String>>();
    std::thread::spawn(move || {
        for line in input.lines() {
            let order = match line {
                Ok(l) => serde_json::from_str(&l).map_err(|e| format!("bad order `{l}`: {e}")),
                Err(e) => Err(format!("reading stdin: {e}")),
            };
            if tx.send(order).is_err() {
                break;
            }
        }
    });
    // One thread per worker: the machine's cores are shared by all the workers.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(BenchError::Runtime)?;
    let out = Arc::new(Mutex::new(std::io::stdout()));
    rt.block_on(run(secret, setup, fds, orders, out))
}

async fn run(
    secret: JobSecret,
    setup: Setup,
    fds: u64,
    mut orders: mpsc::UnboundedReceiver<Result<Order, String>>,
    out: Arc<Mutex<std::io::Stdout>>,
) -> Result<(), BenchError> {
    let log = Arc::new(JoinLog::default());
    let tree = Tree::new(setup.agents + 1, setup.k);
    let spawner = Arc::new(HostSpawner {
        tree,
        log: log.clone(),
        remote: None,
    });
    let base = base_config(secret, &setup, spawner);
    let mut roots: HashMap<u32, SpawnedChild> = HashMap::new();
    say(&out, &Answer::Ready { fds });
    let mut failure = None;
    while let Some(order) = orders.recv().await {
        match order {
            Ok(Order::Spawn { id, parent }) => {
                if id == 0 || id >= tree.size() {
                    failure = Some(format!("spawn order for {id}, outside the job"));
                    break;
                }
                let spec = ChildSpec {
                    id: NodeId(id),
                    parent,
                    config: base.for_child(NodeId(id)),
                };
                let mut child = run_here(spec, tree.level(NodeId(id)), log.clone());
                if let Some(exit) = child.take_exit() {
                    let out = out.clone();
                    tokio::spawn(async move {
                        let how = exit.await.unwrap_or_else(|_| "lost".into());
                        say(&out, &Answer::Exit { id, how });
                    });
                }
                roots.insert(id, child);
            }
            Ok(Order::Kill { id }) => {
                if let Some(c) = roots.remove(&id) {
                    tokio::spawn(c.kill());
                }
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    // Stdin closed (or garbage on it): nothing of this worker may outlive it.
    for (_, c) in roots.drain() {
        c.kill().await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), log.all_ended()).await;
    say(
        &out,
        &Answer::Report {
            levels: log.levels(),
            still_running: log.running(),
        },
    );
    match failure {
        Some(e) => Err(BenchError::Run(format!("worker: {e}"))),
        None => Ok(()),
    }
}
