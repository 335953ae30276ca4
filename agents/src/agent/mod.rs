//! The agent runtime: one process (or task) per node, with the roles of [`role`]; agent 0 is
//! the front-end. Bootstrap follows the k-ary tree, then agents link up along the BMG overlay
//! and watch each other (connection closed, heartbeat, child exit).

mod bootstrap;
mod config;
mod job;
mod links;
mod node;
mod orphan;
mod role;
#[cfg(feature = "sim")]
pub mod sim;
mod spawn;

pub use config::{AgentConfig, HostEntry, HostsError, OnFailure, Timing, parse_hosts};
pub use job::{Control, Event, Exit, Failure, Job, JobHandle};
pub use spawn::{
    ChildSpec, ProcessSpawner, Remote, SharedSpawner, SpawnError, SpawnedChild, Spawner,
    UnknownRemote,
};

use crate::proto::Payload;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum AgentError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::IpAddr,
        source: std::io::Error,
    },
    #[error("bootstrap failed: {0}")]
    Bootstrap(String),
    #[error("bootstrap failed: {0}")]
    Dial(#[source] links::DialError),
    #[error("agent id {id} is outside the job (size {size})")]
    BadId { id: u32, size: u32 },
    #[error("the front-end task panicked or was cancelled: {0}")]
    Lost(String),
}

/// Runs one node agent until the job ends (what `vse agent` does in each process).
pub async fn run_node_agent<A: Payload>(
    cfg: AgentConfig,
    parent: std::net::SocketAddr,
    events: tokio::sync::mpsc::UnboundedSender<Event<A>>,
) -> Result<Exit, AgentError> {
    if cfg.id.0 == 0 || cfg.id.0 >= cfg.tree.size() {
        return Err(AgentError::BadId {
            id: cfg.id.0,
            size: cfg.tree.size(),
        });
    }
    node::run(cfg, Some(parent), None, events).await
}

/// Blocking wrapper for a process that is one agent: builds the runtime, runs the agent (or the
/// front-end when `parent` is None), and hands every event to `on_event` as it happens.
pub fn run_blocking<A: Payload>(
    cfg: AgentConfig,
    parent: Option<std::net::SocketAddr>,
    mut on_event: impl FnMut(&Event<A>),
    mut ready: impl FnMut(&Job<A>) + Send,
) -> Result<Exit, AgentError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| AgentError::Lost(format!("cannot build the async runtime: {e}")))?;
    rt.block_on(async move {
        match parent {
            Some(parent) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let agent = tokio::spawn(run_node_agent(cfg, parent, tx));
                while let Some(e) = rx.recv().await {
                    on_event(&e);
                }
                agent.await.map_err(|e| AgentError::Lost(e.to_string()))?
            }
            None => {
                let mut job = Job::start(cfg);
                while let Some(e) = job.next_event().await {
                    on_event(&e);
                    if matches!(e, Event::Ready { .. }) {
                        ready(&job);
                    }
                }
                job.wait().await
            }
        }
    })
}

/// Blocking wrapper for a node agent that acts on orders: `on_event` sees every event (orders
/// from the front-end arrive as [`Event::Message`]) with a handle to answer through the overlay
/// (`Control::Send { dst: NodeId(0), .. }`). Runs inside the runtime, so it may `tokio::spawn`.
pub fn run_node_blocking<A: Payload>(
    cfg: AgentConfig,
    parent: std::net::SocketAddr,
    mut on_event: impl FnMut(&Event<A>, &JobHandle<A>) + Send,
) -> Result<Exit, AgentError> {
    if cfg.id.0 == 0 || cfg.id.0 >= cfg.tree.size() {
        return Err(AgentError::BadId {
            id: cfg.id.0,
            size: cfg.tree.size(),
        });
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| AgentError::Lost(format!("cannot build the async runtime: {e}")))?;
    rt.block_on(async move {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (ctl, ctl_rx) = tokio::sync::mpsc::unbounded_channel();
        let handle = JobHandle::new(ctl);
        let agent = tokio::spawn(node::run(cfg, Some(parent), Some(ctl_rx), tx));
        while let Some(e) = rx.recv().await {
            on_event(&e, &handle);
        }
        agent.await.map_err(|e| AgentError::Lost(e.to_string()))?
    })
}
